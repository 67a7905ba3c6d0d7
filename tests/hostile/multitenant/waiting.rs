//! Calls piled on one busy sandbox. Executions (and commands, restarts, resumes) of one
//! session are serialized; each call that waits for its turn holds one of the server's
//! blocking threads (tokio's pool: 512, shared by every key). Tenant A keeps its session
//! busy and sends it 600 more executions at once: at most `MAX_WAITING` (4) may wait, the
//! rest must be refused at once (503 `sandbox_busy`, or 429 `key_busy` past the key's share
//! of the server's threads; `Retry-After`), and tenant B's sandbox must answer meanwhile.

use std::io::{Read, Write};
use std::net::TcpStream;

use super::*;

const PILED: usize = 600;

/// Sends an execution of `code` to session `id` without waiting for its answer.
pub(super) fn send_execute(
    s: &Server,
    key: &str,
    id: &str,
    code: &str,
    timeout_s: u64,
) -> TcpStream {
    let address = s.url.trim_start_matches("http://");
    let mut conn = TcpStream::connect(address).unwrap();
    let body = json!({"code": code, "timeout_s": timeout_s}).to_string();
    write!(
        conn,
        "POST /v1/sandboxes/{id}/execute HTTP/1.1\r\nHost: {address}\r\n\
         Authorization: Bearer {key}\r\nAccept: application/json\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    conn
}

/// The start of the answer on `conn` within `limit` (empty: none came).
pub(super) fn answer_within(conn: &mut TcpStream, limit: Duration) -> String {
    conn.set_read_timeout(Some(limit)).unwrap();
    let mut buf = vec![0u8; 4096];
    match conn.read(&mut buf) {
        Ok(n) => String::from_utf8_lossy(&buf[..n]).into_owned(),
        Err(_) => String::new(),
    }
}

#[test]
fn calls_piled_on_a_busy_sandbox_do_not_starve_other_tenants() {
    let _g = shared();
    let s = Server::start(1);
    s.wait_pool(1);
    let (key_a, key_b) = (s.key("A"), s.key("B"));
    let a = s.session(&key_a, &json!({"limits": {"timeout_s": 300}}));
    let b = s.session(&key_b, &json!({}));
    let server = s.pid();

    // A's session is busy for a minute.
    let busy = send_execute(&s, &key_a, &a, "import time; time.sleep(60)", 120);
    thread::sleep(Duration::from_secs(2));
    let mut piled: Vec<TcpStream> = (0..PILED)
        .map(|_| send_execute(&s, &key_a, &a, "1", 120))
        .collect();
    thread::sleep(Duration::from_secs(2));

    // B's sandbox answers while A's calls are piled up.
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(20))
        .build();
    let answer = agent
        .post(&format!("{}/v1/sandboxes/{b}/execute", s.url))
        .set("Authorization", &format!("Bearer {key_b}"))
        .set("Accept", "application/json")
        .set("Content-Type", "application/json")
        .send_string(&json!({"code": "6 * 7"}).to_string());
    let threads = fs::read_dir(format!("/proc/{server}/task")).map_or(0, |d| d.count());
    match answer {
        Ok(r) => {
            let v: Value = r.into_json().unwrap();
            assert_eq!(v["results"][0]["text"], "42", "{v}");
        }
        Err(e) => panic!(
            "B's execution did not answer within 20 s while A piled {PILED} calls on its busy \
             sandbox: {e} (the server has {threads} threads)"
        ),
    }

    // All but a few of A's piled calls were refused at once, saying why.
    let mut refused = 0;
    let mut waiting = 0;
    for conn in &mut piled {
        let head = answer_within(conn, Duration::from_secs(2));
        // 503 `sandbox_busy` from the session, or 429 `key_busy` from the key's share of the
        // server's threads (docs/threat-model.md §11) for calls that arrive all at once.
        if head.starts_with("HTTP/1.1 503") || head.starts_with("HTTP/1.1 429") {
            assert!(
                head.contains("sandbox_busy") || head.contains("key_busy"),
                "{head}"
            );
            assert!(head.to_ascii_lowercase().contains("retry-after"), "{head}");
            refused += 1;
        } else {
            assert!(head.is_empty(), "a piled call: {head}");
            waiting += 1;
        }
    }
    assert!(
        waiting <= 4 && refused + waiting == PILED,
        "{waiting} calls wait, {refused} were refused"
    );
    drop(piled);
    drop(busy);
    s.delete(&key_a, &a);
    let left = s.stop();
    assert!(left.is_empty(), "{left:?}");
}
