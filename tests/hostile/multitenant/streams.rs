//! Output streams of a sandbox's programs (native `…/processes` and `…/processes/{pid}/output`,
//! E2B `process.Process/Start` and `Connect`) held open by one tenant. A program may have 4
//! subscribers and a sandbox 32 programs: 128 streams a sandbox, 512 with 4 sandboxes, which a
//! key may have 100 of. Each stream used to keep one of the server's blocking threads (tokio's
//! pool: 512, shared by every key's uploads, creations, executions and file calls) for as long
//! as its client kept it open, so one key with 4 sandboxes of silent programs stopped every
//! other key's work. A stream now waits for its program's output without a thread.

use std::io::{Read, Write};
use std::net::TcpStream;

use super::*;

/// Streams of the attack: 4 sandboxes x 32 programs x 4 subscribers.
const SANDBOXES: usize = 4;

/// The server's threads now.
fn threads(pid: i32) -> usize {
    fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

/// Sends a request on a connection of its own and reads until its stream has begun (the
/// `start` of a native stream or of a Connect one): the open connection, or why not.
pub(super) fn open_stream(
    s: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<TcpStream, String> {
    open_stream_within(s, method, path, headers, body, Duration::from_secs(15))
}

/// Sends a request on a connection of its own, without reading its answer.
pub(super) fn send_request(
    s: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<TcpStream, String> {
    let address = s.url.trim_start_matches("http://");
    let mut conn = TcpStream::connect(address).map_err(|e| e.to_string())?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes())
        .and_then(|()| conn.write_all(body))
        .map_err(|e| e.to_string())?;
    Ok(conn)
}

/// [`open_stream`], waiting up to `patience` for the stream to begin.
pub(super) fn open_stream_within(
    s: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    patience: Duration,
) -> Result<TcpStream, String> {
    let mut conn = send_request(s, method, path, headers, body)?;
    conn.set_read_timeout(Some(patience))
        .map_err(|e| e.to_string())?;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !contains(&seen, b"\"start\"") {
        match conn.read(&mut buf) {
            Ok(0) => {
                return Err(format!(
                    "closed: {}",
                    String::from_utf8_lossy(&seen)
                        .chars()
                        .take(300)
                        .collect::<String>()
                ))
            }
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e) => return Err(format!("no start within {patience:?} ({e})")),
        }
        if !seen.starts_with(b"HTTP/1.1 200") && seen.len() >= 12 {
            return Err(String::from_utf8_lossy(&seen).chars().take(300).collect());
        }
    }
    Ok(conn)
}

/// A Connect envelope of JSON `value` (flags 0, big-endian length).
pub(super) fn envelope(value: &Value) -> Vec<u8> {
    let json = value.to_string().into_bytes();
    let mut out = vec![0u8];
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(&json);
    out
}

/// A sandbox of tenant `key` made through the E2B face: its id and access token.
pub(super) fn e2b_sandbox(s: &Server, key: &str) -> (String, String) {
    let response = s
        .agent
        .post(&format!("{}/v2/sandboxes", s.url))
        .set("X-API-KEY", key)
        .set("Content-Type", "application/json")
        .send_string(r#"{"templateID":"base"}"#)
        .unwrap_or_else(|e| panic!("E2B create: {e}\n{}", s.log_text()));
    let v: Value = response.into_json().unwrap();
    (
        v["sandboxID"].as_str().unwrap().to_string(),
        v["envdAccessToken"].as_str().unwrap().to_string(),
    )
}

/// B's execution, answered within `limit` or not at all.
pub(super) fn exec_within(
    s: &Server,
    key: &str,
    id: &str,
    limit: Duration,
) -> Result<Value, String> {
    let agent = ureq::AgentBuilder::new().timeout(limit).build();
    agent
        .post(&format!("{}/v1/sandboxes/{id}/execute", s.url))
        .set("Authorization", &format!("Bearer {key}"))
        .set("Accept", "application/json")
        .set("Content-Type", "application/json")
        .send_string(&json!({"code": "6 * 7"}).to_string())
        .map_err(|e| e.to_string())?
        .into_json()
        .map_err(|e| e.to_string())
}

/// Tenant A holds 512 output streams of silent programs open (native and E2B, a start and
/// three more subscribers for each of 32 programs in each of 4 sandboxes); tenant B's
/// sandbox must still answer at once, the server must not have a thread per stream, and
/// every stream must end with its connection, leaving the programs running.
#[test]
fn held_output_streams_do_not_starve_other_tenants() {
    let _g = shared();
    let s = Server::start(1);
    s.wait_pool(1);
    let (key_a, key_b) = (s.key("A"), s.key("B"));
    let b = s.session(&key_b, &json!({}));
    let server = s.pid();
    let threads_before = threads(server);
    let rss_before = rss_kib(server);

    let bearer = format!("Bearer {key_a}");
    let mut held = Vec::new();
    let mut failed: Option<String> = None;
    let mut native = Vec::new();
    'attack: for n in 0..SANDBOXES {
        // Half the sandboxes through the native API, half through the E2B face.
        let e2b = n % 2 == 1;
        let (id, token) = if e2b {
            e2b_sandbox(&s, &key_a)
        } else {
            (s.session(&key_a, &json!({})), String::new())
        };
        if !e2b {
            native.push(id.clone());
        }
        for p in 0..32 {
            let tag = format!("held-{n}-{p}");
            let opened = if e2b {
                let plane = [
                    ("E2b-Sandbox-Id", id.as_str()),
                    ("X-Access-Token", token.as_str()),
                    ("Content-Type", "application/connect+json"),
                ];
                let start = envelope(&json!({
                    "process": {"cmd": "sleep", "args": ["600"]}, "tag": tag
                }));
                let mut opened = vec![open_stream(
                    &s,
                    "POST",
                    "/process.Process/Start",
                    &plane,
                    &start,
                )];
                for _ in 0..3 {
                    let connect = envelope(&json!({"process": {"tag": tag}}));
                    opened.push(open_stream(
                        &s,
                        "POST",
                        "/process.Process/Connect",
                        &plane,
                        &connect,
                    ));
                }
                opened
            } else {
                let auth = [
                    ("Authorization", bearer.as_str()),
                    ("Content-Type", "application/json"),
                ];
                let body = json!({"cmd": "sleep", "args": ["600"], "tag": tag}).to_string();
                let start = open_stream(
                    &s,
                    "POST",
                    &format!("/v1/sandboxes/{id}/processes"),
                    &auth,
                    body.as_bytes(),
                );
                let mut opened = vec![start];
                let pid = *s.processes(&key_a, &id).iter().max().unwrap();
                for _ in 0..3 {
                    opened.push(open_stream(
                        &s,
                        "GET",
                        &format!("/v1/sandboxes/{id}/processes/{pid}/output"),
                        &auth[..1],
                        b"",
                    ));
                }
                opened
            };
            for stream in opened {
                match stream {
                    Ok(conn) => held.push(conn),
                    Err(e) => {
                        failed = Some(format!("stream {} of A: {e}", held.len() + 1));
                        break 'attack;
                    }
                }
            }
        }
    }
    // B's work goes on while A's streams are open.
    let answer = exec_within(&s, &key_b, &b, Duration::from_secs(20));
    let threads_during = threads(server);
    let rss_during = rss_kib(server);
    assert!(
        failed.is_none(),
        "A could not open its streams: {failed:?} (the server has {threads_during} threads)\n{}",
        s.log_text()
    );
    assert_eq!(held.len(), SANDBOXES * 32 * 4);
    match answer {
        Ok(v) => assert_eq!(v["results"][0]["text"], "42", "{v}"),
        Err(e) => panic!(
            "B's execution did not answer within 20 s while A held {} streams: {e} (the \
             server has {threads_during} threads)",
            held.len()
        ),
    }
    assert!(
        threads_during < threads_before + 128,
        "the server went from {threads_before} to {threads_during} threads for {} streams",
        held.len()
    );
    assert!(
        rss_during < rss_before + 128 * 1024,
        "the server grew from {rss_before} KiB to {rss_during} KiB for {} streams",
        held.len()
    );

    // A's clients go away: the streams end, the programs run on.
    drop(held);
    assert!(
        wait_until(Duration::from_secs(30), || threads(server)
            < threads_before + 32),
        "the server kept {} threads (it had {threads_before})",
        threads(server)
    );
    for id in &native {
        assert_eq!(s.processes(&key_a, id).len(), 32, "A's programs are gone");
    }
    let answer = exec_within(&s, &key_b, &b, Duration::from_secs(20)).expect("B executes");
    assert_eq!(answer["results"][0]["text"], "42", "{answer}");
    let left = s.stop();
    assert!(left.is_empty(), "{left:?}");
}
