//! The port proxy against the servers a sandbox runs (`attacks/port_floods.py`): a header
//! line that never ends, 200,000 header lines, bytes that are not HTTP, a body of zeros that
//! never ends (read by a client that then stops reading), a `101` to a request that asked
//! for no upgrade. Each must cost the host a bounded amount (memory, the sandbox's connection
//! slots, time), every slot must come back, and the other tenant is served meanwhile.

use std::io::{Read, Write};
use std::net::TcpStream;

use super::*;

const FLOODS: &str = include_str!("../attacks/port_floods.py");
/// Few connections and a short idle limit, as the other port tests.
const PORTS_CONFIG: &str = "[ports]\nmax_connections_per_sandbox = 4\nidle_timeout_s = 3\n";

/// Sends a GET for `port` of sandbox `id` and reads at most `limit` bytes of the answer (or
/// until it ends, or 20 s pass): the status, the bytes read, and the open connection.
fn fetch(s: &Server, key: &str, id: &str, port: u16, limit: usize) -> (u16, usize, TcpStream) {
    let address = s.url.trim_start_matches("http://");
    let mut conn = TcpStream::connect(address).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write!(
        conn,
        "GET /v1/sandboxes/{id}/ports/{port}/ HTTP/1.1\r\nHost: {address}\r\n\
         Authorization: Bearer {key}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 65536];
    while seen.len() < limit {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
    let status = std::str::from_utf8(&seen[..seen.len().min(12)])
        .ok()
        .and_then(|h| h.strip_prefix("HTTP/1.1 "))
        .and_then(|h| h.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, seen.len(), conn)
}

#[test]
fn hostile_servers_behind_a_port_leave_the_host_bounded() {
    let _g = shared();
    let s = Server::start_with(1, PORTS_CONFIG);
    s.wait_pool(1);
    let (key_a, key_b) = (s.key("A"), s.key("B"));
    let a = s.session(&key_a, &json!({}));
    let b = s.session(&key_b, &json!({}));
    let o = s.exec(&key_a, &a, FLOODS);
    assert!(o.stdout().contains("READY"), "{}", o.dump());
    let server = s.pid();
    let rss_before = rss_kib(server);
    let mut found = Vec::new();

    // Answers that are no HTTP the proxy can pass on: 502, within the connect and idle
    // bounds, whatever the server goes on sending.
    for (port, what) in [
        (8010, "a header line that never ends"),
        (8013, "bytes that are not HTTP"),
        (8014, "200,000 header lines"),
    ] {
        let started = Instant::now();
        let (status, _, _) = fetch(&s, &key_a, &a, port, 1 << 20);
        if status != 502 || started.elapsed() > Duration::from_secs(15) {
            found.push(format!(
                "{what} (port {port}): {status} after {:?}",
                started.elapsed()
            ));
        }
    }
    // A 101 the client did not ask for is no answer the proxy can pass on either.
    let started = Instant::now();
    let (status, read, _) = fetch(&s, &key_a, &a, 8012, 1 << 20);
    if status != 502 || started.elapsed() > Duration::from_secs(15) {
        found.push(format!(
            "an unasked upgrade (port 8012): {status}, {read} bytes after {:?}",
            started.elapsed()
        ));
    }

    // Bodies that never end, read a little and then not at all, on every slot at once: the
    // server holds a bounded amount, and the other tenant's sandbox answers meanwhile.
    let held: Vec<TcpStream> = (0..4)
        .map(|_| {
            let (status, read, conn) = fetch(&s, &key_a, &a, 8011, 1 << 20);
            assert_eq!(status, 200, "an endless body: {status} ({read} bytes)");
            conn
        })
        .collect();
    let (status, _, _) = fetch(&s, &key_a, &a, 8011, 1 << 10);
    if status != 429 {
        found.push(format!("a fifth connection with four held: {status}"));
    }
    thread::sleep(Duration::from_secs(5));
    let o = s.exec(&key_b, &b, "print(6 * 7)");
    assert_eq!(o.stdout(), "42\n", "{}", o.dump());
    let rss_during = rss_kib(server);
    if rss_during > rss_before + 64 * 1024 {
        found.push(format!(
            "the server grew from {rss_before} KiB to {rss_during} KiB"
        ));
    }
    drop(held);
    // Every slot comes back: four connections at once again, and the control answers.
    let back = wait_until(Duration::from_secs(15), || {
        let conns: Vec<_> = (0..4)
            .map(|_| fetch(&s, &key_a, &a, 8011, 1 << 10))
            .collect();
        conns.iter().all(|(status, _, _)| *status == 200)
    });
    if !back {
        found.push("the slots of the hostile connections never came back".into());
    }
    // The four connections' places are given back as their streams close, a moment after
    // their answers: the control server answers once they are.
    let mut control = 0;
    let answered = wait_until(Duration::from_secs(5), || {
        control = fetch(&s, &key_a, &a, 8000, 1 << 10).0;
        control == 200
    });
    assert!(answered, "the control server: {control}");
    let host = s.stop();
    verdict(
        "a hostile server behind a port held the host",
        &found,
        &host,
    );
}
