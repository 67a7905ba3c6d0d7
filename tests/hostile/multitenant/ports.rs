//! The port proxy (crates/corral-server/src/ports.rs) under attack, from the three sides:
//! tenant B tries A's ports (native and host-routed), a sandbox tries to use its ports to
//! reach the host's server or another sandbox, and a client holds connections open and
//! talks to a server that never answers. Ports of a paused or deleted sandbox answer at once.
//! Each scenario runs with sessions forked from the warm pool and with sessions that are
//! sandboxes of their own (no pool), whose init answers the connection requests in each case.

use std::io::{Read, Write};
use std::net::TcpStream;

use super::*;

const SERVERS: &str = include_str!("../attacks/port_servers.py");
/// The server's `[ports]` for these tests: few connections, a short idle limit.
const PORTS_CONFIG: &str = "[ports]\nmax_connections_per_sandbox = 4\nidle_timeout_s = 3\n";

/// A raw HTTP/1.1 exchange with the server (`Connection: close`): status, head, body.
fn raw(s: &Server, head: &str, body: &[u8]) -> (u16, String, Vec<u8>) {
    let address = s.url.trim_start_matches("http://");
    let mut conn = TcpStream::connect(address).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(b"Connection: close\r\n\r\n").unwrap();
    conn.write_all(body).unwrap();
    let mut answer = Vec::new();
    let _ = conn.read_to_end(&mut answer);
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP answer: {:?}", String::from_utf8_lossy(&answer)));
    let head = String::from_utf8_lossy(&answer[..split]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut body = answer[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    (status, head, body)
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(end) = data.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(std::str::from_utf8(&data[..end]).unwrap().trim(), 16)
            .unwrap_or(0);
        if size == 0 {
            break;
        }
        out.extend_from_slice(&data[end + 2..end + 2 + size]);
        data = &data[end + 2 + size + 2..];
    }
    out
}

/// GET `path` on `host` with `key` (none: no credential).
fn get(s: &Server, host: &str, path: &str, key: Option<&str>) -> (u16, String, Vec<u8>) {
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    raw(
        s,
        &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}"),
        b"",
    )
}

fn server_port(s: &Server) -> u16 {
    s.url.rsplit(':').next().unwrap().parse().unwrap()
}

/// Starts the servers of `attacks/port_servers.py` in session `id`.
fn start_servers(s: &Server, key: &str, id: &str) {
    let o = s.exec(key, id, SERVERS);
    assert!(o.stdout().contains("READY"), "{}", o.dump());
}

/// An upgrade through the native route: 101, then bytes both ways. The connection stays open
/// (returned) until dropped.
fn upgrade(s: &Server, key: &str, id: &str) -> Result<TcpStream, String> {
    let address = s.url.trim_start_matches("http://");
    let mut conn = TcpStream::connect(address).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write!(
        conn,
        "GET /v1/sandboxes/{id}/ports/8001/ws HTTP/1.1\r\nHost: {address}\r\n\
         Authorization: Bearer {key}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match conn.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    if !head.starts_with("HTTP/1.1 101") {
        // The answer's body, by its length (the server keeps the connection open).
        let length = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0);
        let mut rest = vec![0u8; length];
        let _ = conn.read_exact(&mut rest);
        return Err(format!("{head}{}", String::from_utf8_lossy(&rest)));
    }
    for message in [
        &b"ping"[..],
        &[0u8, 255, 10, 13, 0][..],
        &[7u8; 100_000][..],
    ] {
        conn.write_all(message).unwrap();
        let mut echoed = vec![0u8; message.len()];
        conn.read_exact(&mut echoed).unwrap();
        assert_eq!(echoed, message, "the upgraded connection did not echo");
    }
    Ok(conn)
}

fn ports_scenario(pool_size: usize) {
    let _g = shared();
    let s = Server::start_with(pool_size, PORTS_CONFIG);
    if pool_size > 0 {
        s.wait_pool(pool_size);
    }
    let (key_a, key_b) = (s.key("A"), s.key("B"));
    let a = s.session(&key_a, &json!({}));
    let b = s.session(&key_b, &json!({}));
    start_servers(&s, &key_a, &a);
    let local = format!("127.0.0.1:{}", server_port(&s));
    let routed = format!("8000-{a}.localhost:{}", server_port(&s));
    let mut found = Vec::new();

    // The owner reaches its port, natively and by host name; its key is not passed on.
    let native = format!("/v1/sandboxes/{a}/ports/8000/some/path?x=1&y=%2F");
    let (status, _, body) = get(&s, &local, &native, Some(&key_a));
    let echo: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(echo["path"], "/some/path?x=1&y=%2F", "{echo}");
    let (status, _, body) = get(&s, &routed, "/routed?z", Some(&key_a));
    let routed_echo: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(routed_echo["path"], "/routed?z", "{routed_echo}");
    for e in [&echo, &routed_echo] {
        if e.to_string().contains(&key_a) {
            found.push(format!("the sandbox's server saw the owner's API key: {e}"));
        }
    }
    // A streamed body (chunked, 3 MiB) arrives whole.
    let big: Vec<u8> = (0..3u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
    let mut chunked = Vec::new();
    for chunk in big.chunks(100_000) {
        chunked.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        chunked.extend_from_slice(chunk);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let (status, _, body) = raw(
        &s,
        &format!(
            "POST /v1/sandboxes/{a}/ports/8000/upload HTTP/1.1\r\nHost: {local}\r\n\
             Authorization: Bearer {key_a}\r\nTransfer-Encoding: chunked\r\n"
        ),
        &chunked,
    );
    let posted: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(posted["body_len"], big.len(), "{posted}");
    let (status, _, body) = raw(
        &s,
        &format!(
            "PUT /v1/sandboxes/{a}/ports/8000/upload HTTP/1.1\r\nHost: {local}\r\n\
             Authorization: Bearer {key_a}\r\nContent-Length: {}\r\n",
            big.len()
        ),
        &big,
    );
    let put: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    assert_eq!(status, 200, "{put}");
    assert_eq!(put["body_len"], big.len(), "{put}");

    // WebSocket-style upgrade: 101 and bytes both ways.
    let held = upgrade(&s, &key_a, &a).unwrap_or_else(|e| panic!("upgrade failed: {e}"));
    drop(held);

    // Tenant B: neither route, with its key or with none; never the answer of A's server.
    for (what, host, path, key) in [
        (
            "B's key, native",
            &local,
            native.as_str(),
            Some(key_b.as_str()),
        ),
        ("B's key, host-routed", &routed, "/", Some(key_b.as_str())),
        ("no key, native", &local, native.as_str(), None),
        ("no key, host-routed", &routed, "/", None),
    ] {
        let (status, head, body) = get(&s, host, path, key);
        let text = String::from_utf8_lossy(&body);
        if !(status == 404 || status == 401 || status == 403) || text.contains("\"method\"") {
            found.push(format!("{what}: {status} {head} {text}"));
        }
    }
    // B's sandbox cannot reach A's server on its own loopback, nor the host's server.
    let probe = format!(
        "import socket\nfor port in (8000, {}):\n    try:\n        socket.create_connection(('127.0.0.1', port), timeout=2).close()\n        print('REACHED', port)\n    except OSError as e:\n        print('BLOCKED', port, e)\n",
        server_port(&s)
    );
    let o = s.exec(&key_b, &b, &probe);
    if o.stdout().contains("REACHED") {
        found.push(format!("B's sandbox reached a listener: {}", o.stdout()));
    }
    // A port number that is the host's own listener names only the sandbox's (nothing there).
    let (status, _, body) = get(
        &s,
        &local,
        &format!("/v1/sandboxes/{a}/ports/{}/healthz", server_port(&s)),
        Some(&key_a),
    );
    if status != 502 {
        found.push(format!(
            "the host's own port through A's port route: {status} {}",
            String::from_utf8_lossy(&body)
        ));
    }
    // B's port route cannot name A's server either (B's own sandbox has none on 8000).
    let (status, _, body) = get(
        &s,
        &local,
        &format!("/v1/sandboxes/{b}/ports/8000/"),
        Some(&key_b),
    );
    if status != 502 || String::from_utf8_lossy(&body).contains("\"method\"") {
        found.push(format!(
            "B's port 8000: {status} {}",
            String::from_utf8_lossy(&body)
        ));
    }

    // Bounds: the connections of one sandbox (4 here) are bounded, refused at once beyond.
    let held: Vec<TcpStream> = (0..4)
        .map(|_| upgrade(&s, &key_a, &a).unwrap_or_else(|e| panic!("upgrade failed: {e}")))
        .collect();
    let started = Instant::now();
    match upgrade(&s, &key_a, &a) {
        Ok(_) => found.push("a fifth connection to a sandbox limited to 4 was made".into()),
        Err(answer) if !answer.contains(" 429 ") || started.elapsed() > Duration::from_secs(5) => {
            found.push(format!(
                "the fifth connection, after {:?}: {answer}",
                started.elapsed()
            ))
        }
        Err(_) => {}
    }
    // B is not held up by A's connections.
    assert_eq!(
        get(
            &s,
            &local,
            &format!("/v1/sandboxes/{b}/ports/8000/"),
            Some(&key_b)
        )
        .0,
        502
    );
    drop(held);
    // The held connections are closed once idle (3 s): the slots come back.
    let back = wait_until(Duration::from_secs(15), || upgrade(&s, &key_a, &a).is_ok());
    if !back {
        found.push("the slots of idle connections never came back".into());
    }
    // A server that accepts and never answers costs the client the idle limit, no more.
    let started = Instant::now();
    let (status, _, _) = get(
        &s,
        &local,
        &format!("/v1/sandboxes/{a}/ports/8002/"),
        Some(&key_a),
    );
    if status != 502 || started.elapsed() > Duration::from_secs(15) {
        found.push(format!(
            "a silent server: {status} after {:?}",
            started.elapsed()
        ));
    }

    // Paused: 409 at once, both routes; resumed: served again. Pausing needs the sandbox's
    // cgroup (the freezer): where the host gives this user none (rootless on cgroup v1), the
    // pause itself is refused as documented, and no paused sandbox's port can exist.
    let (status, paused) = s.call("POST", &format!("/v1/sandboxes/{a}/pause"), &key_a, None);
    let pausable = status == 200;
    if !pausable {
        assert!(
            status == 409
                && paused["error"]["code"] == "pause_unsupported"
                && (!nix::unistd::geteuid().is_root() || corral_sandbox::cgroup_layout().is_none()),
            "pause: {status} {paused}"
        );
    }
    for (host, path) in [(&local, native.as_str()), (&routed, "/")]
        .into_iter()
        .filter(|_| pausable)
    {
        let started = Instant::now();
        let (status, _, body) = get(&s, host, path, Some(&key_a));
        if status != 409
            || !String::from_utf8_lossy(&body).contains("sandbox_paused")
            || started.elapsed() > Duration::from_secs(5)
        {
            found.push(format!(
                "a paused sandbox's port: {status} after {:?}: {}",
                started.elapsed(),
                String::from_utf8_lossy(&body)
            ));
        }
    }
    if pausable {
        let (status, resumed) = s.call("POST", &format!("/v1/sandboxes/{a}/resume"), &key_a, None);
        assert_eq!(status, 200, "resume: {resumed}");
    }
    assert_eq!(get(&s, &local, &native, Some(&key_a)).0, 200);

    // Deleted: 404 at once.
    s.delete(&key_a, &a);
    for (host, path) in [(&local, native.as_str()), (&routed, "/")] {
        let started = Instant::now();
        let (status, _, body) = get(&s, host, path, Some(&key_a));
        if status != 404 || started.elapsed() > Duration::from_secs(5) {
            found.push(format!(
                "a deleted sandbox's port: {status} after {:?}: {}",
                started.elapsed(),
                String::from_utf8_lossy(&body)
            ));
        }
    }

    let host = s.stop();
    verdict("the port proxy let an attack through", &found, &host);
}

#[test]
fn ports_of_forked_sessions() {
    ports_scenario(2);
}

#[test]
fn ports_of_sessions_in_sandboxes_of_their_own() {
    ports_scenario(0);
}

/// Issue 31: a sandbox's page served through the path-based port route shares the API's
/// origin. Whatever headers its server sends, Corral's win: a policy that runs its scripts in
/// an opaque origin of their own, none of the headers by which it could act on the origin
/// (service worker scope, cookies, site data, CORS), and no service worker's script at all.
/// On its own origin (`{port}-{id}.{domain}`) the page keeps its headers. And a keyless
/// loopback server takes requests from no page but the console: another origin, an opaque one
/// or a browser's cross-site mark is refused, while the console's own origin and programs
/// without an `Origin` are served.
#[test]
fn a_sandboxs_page_never_acts_in_the_apis_origin() {
    let _g = shared();
    let s = Server::start_with(1, PORTS_CONFIG);
    s.wait_pool(1);
    let key_a = s.key("A");
    let a = s.session(&key_a, &json!({}));
    start_servers(&s, &key_a, &a);
    let local = format!("127.0.0.1:{}", server_port(&s));
    let page = format!("/v1/sandboxes/{a}/ports/8000/hostile-page");
    let mut found = Vec::new();

    let (status, head, body) = get(&s, &local, &page, Some(&key_a));
    assert_eq!(status, 200, "{head}");
    assert!(
        String::from_utf8_lossy(&body).contains("<script>"),
        "the page itself arrives"
    );
    let head_lc = head.to_ascii_lowercase();
    let policies: Vec<&str> = head_lc
        .lines()
        .filter_map(|l| l.strip_prefix("content-security-policy:"))
        .map(str::trim)
        .collect();
    if policies.len() != 1
        || !policies[0].starts_with("sandbox allow-scripts")
        || policies[0].contains("allow-same-origin")
    {
        found.push(format!(
            "the page's policy is not Corral's opaque-origin one: {policies:?}"
        ));
    }
    for name in [
        "service-worker-allowed:",
        "set-cookie:",
        "clear-site-data:",
        "access-control-allow-origin:",
        "unsafe-inline",
    ] {
        if head_lc.contains(name) {
            found.push(format!(
                "the sandbox's `{name}` reached the API's origin:\n{head}"
            ));
        }
    }
    // A browser fetching a service worker's script from the path route is refused.
    let (status, head, _) = raw(
        &s,
        &format!(
            "GET {page} HTTP/1.1\r\nHost: {local}\r\nAuthorization: Bearer {key_a}\r\n\
             Service-Worker: script\r\n"
        ),
        b"",
    );
    if status != 403 {
        found.push(format!(
            "a service worker's script was served: {status}\n{head}"
        ));
    }
    // On the page's own origin its headers stand: they act on that origin alone.
    let routed = format!("8000-{a}.localhost:{}", server_port(&s));
    let (status, head, _) = get(&s, &routed, "/hostile-page", Some(&key_a));
    assert_eq!(status, 200, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("service-worker-allowed: /"),
        "the host-routed page keeps its own headers\n{head}"
    );

    // The keyless loopback server and browsers.
    let list = |extra: &str| {
        raw(
            &s,
            &format!("GET /v1/sandboxes HTTP/1.1\r\nHost: {local}\r\n{extra}"),
            b"",
        )
        .0
    };
    let other = format!("http://127.0.0.1:{}", server_port(&s) + 1);
    for (extra, want) in [
        (String::new(), 200),
        (
            format!("Origin: http://{local}\r\nSec-Fetch-Site: same-origin\r\n"),
            200,
        ),
        (format!("Origin: {other}\r\n"), 403),
        ("Origin: null\r\n".to_string(), 403),
        (format!("Origin: http://{routed}\r\n"), 403),
        ("Sec-Fetch-Site: cross-site\r\n".to_string(), 403),
        ("Sec-Fetch-Site: same-site\r\n".to_string(), 403),
    ] {
        let got = list(&extra);
        if got != want {
            found.push(format!(
                "keyless GET /v1/sandboxes with {extra:?}: {got}, not {want}"
            ));
        }
    }
    s.delete(&key_a, &a);
    assert!(found.is_empty(), "{}", found.join("\n"));
}
