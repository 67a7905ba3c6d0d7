//! `corral serve` end to end: a real server process, real sandboxes, hostile clients, tenancy,
//! shutdown and crash recovery. Sessions use the `host` image (nothing to build).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_corral");

struct Server {
    child: Child,
    url: String,
    db: PathBuf,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Server {
    /// Starts `corral serve` on a loopback port with a fresh database and `config` (TOML;
    /// without a warm pool unless it sets `pool_size`).
    fn start(config: &str) -> Server {
        let dir = tempfile::tempdir().unwrap();
        Self::start_in(dir, config)
    }

    fn start_in(dir: tempfile::TempDir, config: &str) -> Server {
        Self::start_on("127.0.0.1", dir, config)
    }

    /// As [`Server::start`], listening on `host` (requests still go to loopback).
    fn start_on(host: &str, dir: tempfile::TempDir, config: &str) -> Server {
        let db = dir.path().join("corral.db");
        Self::start_with(host, dir, db, config)
    }

    /// As [`Server::start_in`], on the database `db` (anywhere), its config file beside it.
    fn start_on_db(dir: tempfile::TempDir, db: PathBuf, config: &str) -> Server {
        Self::start_with("127.0.0.1", dir, db, config)
    }

    fn start_with(host: &str, dir: tempfile::TempDir, db: PathBuf, config: &str) -> Server {
        let port = free_port();
        let config_path = db.with_extension("toml");
        let pool = if config.contains("pool_size") {
            ""
        } else {
            "pool_size = 0\n"
        };
        std::fs::write(&config_path, format!("{pool}{config}")).unwrap();
        let child = Command::new(BIN)
            .args(["serve", "--listen", &format!("{host}:{port}"), "--db"])
            .arg(&db)
            .arg("--config")
            .arg(&config_path)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let mut server = Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
            db,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while ureq::get(&format!("{}/healthz", server.url))
            .call()
            .is_err()
        {
            assert!(Instant::now() < deadline, "the server did not come up");
            if let Some(status) = server.child.try_wait().unwrap() {
                panic!("the server exited: {status}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// SIGTERM, and the server exits 0 (paused sandboxes saved).
    fn stop_gracefully(&mut self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid()),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        assert!(self.child.wait().unwrap().success());
    }

    /// The server stopped gracefully and started again on its database with `config`.
    fn restarted(mut self, config: &str) -> Server {
        self.stop_gracefully();
        self.started_again(config)
    }

    /// A server stopped, started again on its database with `config`.
    fn started_again(mut self, config: &str) -> Server {
        let dir = std::mem::replace(&mut self._dir, tempfile::tempdir().unwrap());
        let db = self.db.clone();
        drop(self);
        Self::start_on_db(dir, db, config)
    }

    fn key(&self, name: &str) -> String {
        self.make_key(&["--name", name])
    }

    /// An operator key (`corral key create --operator`) in the server's database: its secret.
    fn operator_key(&self) -> String {
        self.make_key(&["--name", "ops", "--operator"])
    }

    fn make_key(&self, args: &[&str]) -> String {
        let out = Command::new(BIN)
            .args(["key", "create"])
            .args(args)
            .arg("--db")
            .arg(&self.db)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    /// (status, JSON body) of a request; `key` as a bearer token.
    fn call(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<&str>,
    ) -> (u16, Value) {
        let (status, bytes) = self.raw(method, path, key, body.map(str::as_bytes));
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, value)
    }

    fn raw(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<&[u8]>,
    ) -> (u16, Vec<u8>) {
        let mut req =
            ureq::request(method, &format!("{}{path}", self.url)).set("Accept", "application/json");
        if let Some(k) = key {
            req = req.set("Authorization", &format!("Bearer {k}"));
        }
        let response = match body {
            Some(b) => req.send_bytes(b),
            None => req.call(),
        };
        let response = match response {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{method} {path}: {e}"),
        };
        let status = response.status();
        let mut bytes = Vec::new();
        response.into_reader().read_to_end(&mut bytes).unwrap();
        (status, bytes)
    }

    fn create(&self, key: Option<&str>) -> String {
        let (status, info) = self.call("POST", "/v1/sandboxes", key, Some(r#"{"image":"host"}"#));
        assert_eq!(status, 201, "{info}");
        info["id"].as_str().unwrap().to_string()
    }

    fn execute(&self, id: &str, key: Option<&str>, code: &str) -> (u16, Value) {
        let body = json!({ "code": code }).to_string();
        self.call(
            "POST",
            &format!("/v1/sandboxes/{id}/execute"),
            key,
            Some(&body),
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("<no error code>")
}

/// Every process whose parent chain leads to `root` (not `root` itself).
fn descendants(root: i32) -> Vec<(i32, u64)> {
    let mut parent = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Some((ppid, start)) = stat(pid) {
            parent.insert(pid, (ppid, start));
        }
    }
    let mut out = Vec::new();
    for (&pid, &(_, start)) in &parent {
        let mut p = pid;
        while let Some(&(pp, _)) = parent.get(&p) {
            if pp == root {
                out.push((pid, start));
                break;
            }
            if pp <= 1 {
                break;
            }
            p = pp;
        }
    }
    out
}

/// (ppid, start time) from /proc/PID/stat.
fn stat(pid: i32) -> Option<(i32, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    Some((fields[1].parse().ok()?, fields[19].parse().ok()?))
}

fn alive(pid: i32, start: u64) -> bool {
    stat(pid).is_some_and(|(_, s)| s == start)
}

/// Cgroup directories of sandboxes owned by process `pid`, on any hierarchy.
fn cgroups_of(pid: i32) -> Vec<PathBuf> {
    let prefix = format!("{pid}-");
    let mut found = Vec::new();
    for base in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        for dir in [base.path().join("corral"), base.path()] {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if entry.file_name().to_string_lossy().starts_with(&prefix) {
                    found.push(entry.path());
                }
            }
        }
    }
    found
}

fn wait_until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn malformed_requests_get_clear_json_errors_and_the_server_stays_up() {
    let s = Server::start("max_json_bytes = 65536\nmax_body_bytes = 1048576");
    let cases: &[(&str, &str, &str, u16, &str)] = &[
        ("POST", "/v1/run", "{not json", 400, "bad_request"),
        ("POST", "/v1/run", r#"{"code": 1}"#, 400, "bad_request"),
        (
            "POST",
            "/v1/run",
            r#"{"code": "1", "colour": "red"}"#,
            400,
            "bad_request",
        ),
        (
            "POST",
            "/v1/run",
            r#"{"code": "1", "image": "nosuch"}"#,
            422,
            "unknown_image",
        ),
        (
            "POST",
            "/v1/run",
            r#"{"code": "1", "image": "host", "language": "cobol"}"#,
            422,
            "unsupported_language",
        ),
        (
            "POST",
            "/v1/run",
            r#"{"code": "1", "limits": {"memory_mb": 0}}"#,
            400,
            "bad_request",
        ),
        (
            "POST",
            "/v1/sandboxes",
            r#"{"idle_timeout_s": -1}"#,
            400,
            "bad_request",
        ),
        ("GET", "/v1/sandboxes/sbx-nosuch", "", 404, "not_found"),
        (
            "POST",
            "/v1/sandboxes/sbx-nosuch/execute",
            r#"{"code": "1"}"#,
            404,
            "not_found",
        ),
        ("GET", "/v1/nowhere", "", 404, "not_found"),
        ("DELETE", "/v1/run", "", 405, "method_not_allowed"),
        ("PATCH", "/v1/sandboxes", "", 405, "method_not_allowed"),
        (
            "PUT",
            "/v1/sandboxes/sbx-nosuch/files/",
            "x",
            400,
            "invalid_path",
        ),
        (
            "GET",
            "/v1/sandboxes/sbx-nosuch/files/",
            "",
            400,
            "invalid_path",
        ),
    ];
    for (method, path, body, status, code) in cases {
        let (got, answer) = s.call(method, path, None, (!body.is_empty()).then_some(*body));
        assert_eq!(
            (got, error_code(&answer)),
            (*status, *code),
            "{method} {path} {body}: {answer}"
        );
        assert!(!answer["error"]["message"].as_str().unwrap().is_empty());
    }
    let (_, unknown) = s.call(
        "POST",
        "/v1/run",
        None,
        Some(r#"{"code": "1", "colour": "red"}"#),
    );
    assert!(
        unknown["error"]["message"]
            .as_str()
            .unwrap()
            .contains("colour"),
        "{unknown}"
    );
    // A value of the wrong type: the message names the field's path.
    for (path, body, field) in [
        ("/v1/run", r#"{"code": 5}"#, "`code`"),
        (
            "/v1/run",
            r#"{"code": "1", "limits": {"timeout_s": "x"}}"#,
            "`limits.timeout_s`",
        ),
        ("/v1/sandboxes", r#"{"env": {"K": 1}}"#, "`env.K`"),
        (
            "/v1/run",
            r#"{"code": "1", "files": [{"path": 3}]}"#,
            "`files[0].path`",
        ),
    ] {
        let (status, answer) = s.call("POST", path, None, Some(body));
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(message.contains(field), "{body}: {message}");
    }

    // A web page cannot drive a keyless loopback server.
    match ureq::post(&format!("{}/v1/run", s.url))
        .set("Origin", "https://evil.example")
        .send_string(r#"{"code":"print(1)","image":"host"}"#)
    {
        Err(ureq::Error::Status(403, r)) => {
            assert!(r.into_string().unwrap().contains("forbidden"))
        }
        other => panic!("expected 403, got {other:?}"),
    }

    // Over the JSON body limit, and over the upload limit: 413 in the API's format, refused
    // from the announced length.
    let addr = s.url.trim_start_matches("http://").to_string();
    let answer = oversized(&addr, "POST", "/v1/run", 100_000);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains(r#""code":"payload_too_large""#), "{answer}");
    let id = s.create(None);
    let answer = oversized(
        &addr,
        "PUT",
        &format!("/v1/sandboxes/{id}/files/big.bin"),
        2 << 20,
    );
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let (status, _) = s.call(
        "GET",
        &format!("/v1/sandboxes/{id}/files/big.bin"),
        None,
        None,
    );
    assert_eq!(status, 404, "nothing of the refused upload was written");

    let (status, result) = s.call(
        "POST",
        "/v1/run",
        None,
        Some(r#"{"code": "print(6*7)", "image": "host"}"#),
    );
    assert_eq!(status, 200);
    assert_eq!(result["stdout"], "42\n", "{result}");
}

#[test]
fn files_api_never_leaves_the_workspace() {
    let s = Server::start("");
    let id = s.create(None);
    let secret_dir = tempfile::tempdir().unwrap();
    let secret = secret_dir.path().join("host-secret.txt");
    std::fs::write(&secret, "HOST-SECRET").unwrap();
    let f = |p: &str| format!("/v1/sandboxes/{id}/files/{p}");

    let (status, entry) = s.call("PUT", &f("dir/a.txt"), None, Some("hello"));
    assert_eq!((status, entry["size"].as_u64()), (201, Some(5)), "{entry}");
    assert_eq!(
        s.raw("GET", &f("dir/a.txt"), None, None),
        (200, b"hello".to_vec())
    );
    let (_, listing) = s.call(
        "GET",
        &format!("/v1/sandboxes/{id}/files?dir=dir"),
        None,
        None,
    );
    assert_eq!(listing["files"], json!([{"path": "dir/a.txt", "size": 5}]));

    // The sandbox plants links to a host file and to the host's root.
    let plant = format!(
        "import os\nos.symlink({0:?}, 'link')\nos.symlink('/', 'root')\nos.mkdir('d')\nos.symlink({0:?}, 'd/inner')\nprint('planted')",
        secret.display().to_string()
    );
    let (_, planted) = s.execute(&id, None, &plant);
    assert_eq!(planted["stdout"], "planted\n", "{planted}");

    // A link on the way is refused with a message that says why.
    for path in ["link", "root/etc/passwd", "d/inner"] {
        let (status, answer) = s.call("GET", &f(path), None, None);
        assert_eq!(
            (status, error_code(&answer)),
            (400, "invalid_path"),
            "{path}: {answer}"
        );
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("Corral never follows links"),
            "{path}: {message}"
        );
    }
    for path in [
        "link",
        "root/etc/passwd",
        "d/inner",
        "..%2F..%2Fetc%2Fpasswd",
        "%2Fetc%2Fpasswd",
        "dir/..%2F..%2Fx",
    ] {
        let (status, body) = s.raw("GET", &f(path), None, None);
        assert!(status == 400 || status == 404, "GET {path}: {status}");
        let text = String::from_utf8_lossy(&body);
        assert!(
            !text.contains("HOST-SECRET") && !text.contains("root:"),
            "GET {path} leaked: {text}"
        );
        let (status, _) = s.call("PUT", &f(path), None, Some("OVERWRITTEN"));
        assert!(status == 400 || status == 404, "PUT {path}: {status}");
        let (status, _) = s.call("DELETE", &f(path), None, None);
        assert!(status == 400 || status == 404, "DELETE {path}: {status}");
    }
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "HOST-SECRET");
    assert!(Path::new("/etc/passwd").exists());

    let (status, _) = s.call("DELETE", &f("dir/a.txt"), None, None);
    assert_eq!(status, 204);
    // A missing file is told apart from a missing sandbox (MCP keeps its session on one).
    let (status, body) = s.call("GET", &f("dir/a.txt"), None, None);
    assert_eq!((status, error_code(&body)), (404, "file_not_found"));
}

/// Sandboxes are a pool keys share: a key's share (`max_sessions_per_key`), the server's
/// (`max_sessions`), and one sandbox every key gets whatever the others hold, out of a reserve
/// above `max_sessions` (a sixteenth, at least one), so that two keys filling the server leave
/// a third one sandbox, and the reserve bounds what those floors take.
#[test]
fn keys_that_fill_the_server_leave_every_other_key_a_sandbox() {
    let s = Server::start("max_sessions = 4\nmax_sessions_per_key = 2");
    let (a, b, c, d) = (s.key("a"), s.key("b"), s.key("c"), s.key("d"));
    for key in [&a, &a, &b, &b] {
        s.create(Some(key));
    }
    let refused = |key: &str| {
        let (status, body) = s.call(
            "POST",
            "/v1/sandboxes",
            Some(key),
            Some(r#"{"image":"host"}"#),
        );
        assert_eq!(
            (status, error_code(&body)),
            (429, "too_many_sandboxes"),
            "{body}"
        );
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert!(refused(&a).contains("this key has its maximum of 2"));
    // The server holds its 4: c gets its floor of one out of the reserve, and no more.
    let floor = s.create(Some(&c));
    assert!(refused(&c).contains("the server runs its maximum of 4"));
    // The reserve (one sandbox) is taken: d must wait for a sandbox to go.
    refused(&d);
    let (status, _) = s.call("DELETE", &format!("/v1/sandboxes/{floor}"), Some(&c), None);
    assert_eq!(status, 204);
    s.create(Some(&d));
}

#[test]
fn one_key_never_sees_another_keys_sandboxes() {
    // Listening on loopback, keys are optional but checked when given.
    let s = Server::start("max_sessions_per_key = 2");
    let (a, b) = (s.key("a"), s.key("b"));
    let id = s.create(Some(&a));
    let (_, mine) = s.execute(&id, Some(&a), "x = 7\nx");
    assert_eq!(mine["results"][0]["text"], "7", "{mine}");

    for key in [Some(b.as_str()), None] {
        for (method, path, body) in [
            ("GET", format!("/v1/sandboxes/{id}"), None),
            (
                "POST",
                format!("/v1/sandboxes/{id}/execute"),
                Some(r#"{"code":"x"}"#),
            ),
            (
                "POST",
                format!("/v1/sandboxes/{id}/commands"),
                Some(r#"{"cmd":"true"}"#),
            ),
            ("GET", format!("/v1/sandboxes/{id}/files"), None),
            ("PUT", format!("/v1/sandboxes/{id}/files/x"), Some("x")),
            ("POST", format!("/v1/sandboxes/{id}/pause"), None),
            ("POST", format!("/v1/sandboxes/{id}/resume"), None),
            ("DELETE", format!("/v1/sandboxes/{id}"), None),
        ] {
            let (status, answer) = s.call(method, &path, key, body);
            assert_eq!(
                (status, error_code(&answer)),
                (404, "not_found"),
                "{method} {path} as {key:?}"
            );
        }
        let (_, list) = s.call("GET", "/v1/sandboxes", key, None);
        assert_eq!(list["sandboxes"], json!([]));
    }
    let (_, list) = s.call("GET", "/v1/sandboxes", Some(&a), None);
    assert_eq!(list["sandboxes"][0]["id"], json!(id));
    // Another key could neither pause nor resume it: it still runs, with its state.
    let (_, mine) = s.execute(&id, Some(&a), "x");
    assert_eq!(mine["results"][0]["text"], "7", "{mine}");

    let (status, answer) = s.call("GET", "/v1/sandboxes", Some("crl_not_a_key"), None);
    assert_eq!((status, error_code(&answer)), (401, "unauthorized"));

    // Per-key limit: a third session for `a` is refused with Retry-After; `b` is unaffected.
    s.create(Some(&a));
    let response = ureq::post(&format!("{}/v1/sandboxes", s.url))
        .set("Authorization", &format!("Bearer {a}"))
        .send_string(r#"{"image":"host"}"#);
    match response {
        Err(ureq::Error::Status(429, r)) => assert!(r.header("Retry-After").is_some()),
        other => panic!("expected 429, got {other:?}"),
    }
    s.create(Some(&b));

    // A revoked key is refused.
    let out = Command::new(BIN)
        .args(["key", "ls", "--db"])
        .arg(&s.db)
        .output()
        .unwrap();
    let listing = String::from_utf8(out.stdout).unwrap();
    let b_id = listing
        .lines()
        .find(|l| l.contains("  b  "))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap();
    assert!(Command::new(BIN)
        .args(["key", "revoke", b_id, "--db"])
        .arg(&s.db)
        .status()
        .unwrap()
        .success());
    let (status, _) = s.call("GET", "/v1/sandboxes", Some(&b), None);
    assert_eq!(status, 401);
    assert!(!listing.contains(&b), "key ls must never print a secret");
}

#[test]
fn execution_streams_events_and_a_disconnected_client_interrupts_it() {
    let s = Server::start("");
    let id = s.create(None);
    let addr = s.url.trim_start_matches("http://").to_string();

    // A streamed execution: NDJSON lines, no blank line, `end` last.
    let body =
        json!({"code": "print('a')\nimport sys; print('b', file=sys.stderr)\n6*7"}).to_string();
    let lines = ndjson(&addr, &format!("/v1/sandboxes/{id}/execute"), &body);
    let mut types: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    types.dedup(); // output may come in several chunks
    assert_eq!(types, ["stdout", "stderr", "result", "end"], "{lines:?}");
    let result = lines.iter().find(|l| l["type"] == "result").unwrap();
    assert_eq!(result["text"], "42");
    assert_eq!(lines.last().unwrap()["status"], "success");

    // Commands stream too and end with the exit code.
    let body = json!({"cmd": "echo out; echo err >&2; exit 3"}).to_string();
    let lines = ndjson(&addr, &format!("/v1/sandboxes/{id}/commands"), &body);
    let last = lines.last().unwrap();
    assert_eq!(
        (last["type"].as_str(), last["exit_code"].as_i64()),
        (Some("end"), Some(3)),
        "{lines:?}"
    );
    assert!(lines
        .iter()
        .any(|l| l["type"] == "stdout" && l["text"] == "out\n"));

    // A client that goes away mid-execution: the execution is interrupted, state is kept.
    s.execute(&id, None, "kept = 'yes'");
    let mut stream = TcpStream::connect(&addr).unwrap();
    let body =
        json!({"code": "import time\nprint('started', flush=True)\ntime.sleep(600)"}).to_string();
    write!(
        stream,
        "POST /v1/sandboxes/{id}/execute HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    while !line.contains("started") {
        line.clear();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "stream ended early"
        );
    }
    drop(reader);
    stream.shutdown(std::net::Shutdown::Both).unwrap();
    let started = Instant::now();
    let (status, after) = s.execute(&id, None, "kept");
    assert_eq!(status, 200);
    assert_eq!(after["results"][0]["text"], "'yes'", "{after}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the abandoned execution kept running"
    );
}

/// Issue 32: every call of a key goes through one admission, and work is not checked twice. A
/// streamed execution, a streamed command, a folded execution and a program's start each
/// take exactly one admission (one blocking thread of the key's budget) and one check that
/// the sandbox is the key's. The streams took two admissions and four checks before.
#[test]
fn an_execution_and_a_process_start_take_one_admission_and_one_ownership_check() {
    let s = Server::start("");
    let id = s.create(None);
    let addr = s.url.trim_start_matches("http://").to_string();
    let counts = || {
        let of = |name| metric(&s, name).unwrap_or_else(|| panic!("no {name} in /metrics"));
        (
            of("corral_calls_admitted_total"),
            of("corral_ownership_checks_total"),
        )
    };
    let taken = |before: (f64, f64)| {
        let after = counts();
        (after.0 - before.0, after.1 - before.1)
    };

    let before = counts();
    let body = json!({"code": "6*7"}).to_string();
    let lines = ndjson(&addr, &format!("/v1/sandboxes/{id}/execute"), &body);
    assert_eq!(lines.last().unwrap()["status"], "success", "{lines:?}");
    assert_eq!(taken(before), (1.0, 1.0), "a streamed execution");

    let before = counts();
    let body = json!({"cmd": "exit 3"}).to_string();
    let lines = ndjson(&addr, &format!("/v1/sandboxes/{id}/commands"), &body);
    assert_eq!(lines.last().unwrap()["exit_code"], 3, "{lines:?}");
    assert_eq!(taken(before), (1.0, 1.0), "a streamed command");

    let before = counts();
    let (status, answer) = s.execute(&id, None, "6*7");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(taken(before), (1.0, 1.0), "a folded execution");

    let before = counts();
    assert_eq!(run_process(&s, None, &id, "true", &[]).0, 0);
    assert_eq!(taken(before), (1.0, 1.0), "a program's start");
}

/// Sends a streamed POST of `body` to `path` on a connection of its own; its reader.
fn post_stream(addr: &str, path: &str, body: &str) -> (TcpStream, BufReader<TcpStream>) {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let reader = BufReader::new(stream.try_clone().unwrap());
    (stream, reader)
}

/// Reads lines until one contains `what`; all that was read.
fn read_until(reader: &mut BufReader<TcpStream>, what: &str) -> String {
    let mut read = String::new();
    while !read.contains(what) {
        assert!(
            reader.read_line(&mut read).unwrap() > 0,
            "the stream ended before {what:?}: {read}"
        );
    }
    read
}

/// A client that goes away from a command's stream stops that command and nothing else of
/// its session: not the execution the command waits for, and the command never runs.
#[test]
fn a_client_that_leaves_a_waiting_command_stops_only_that_command() {
    let s = Server::start("");
    let id = s.create(None);
    let addr = s.url.trim_start_matches("http://").to_string();
    let code = "import time\nprint('started', flush=True)\ntime.sleep(3)\nprint('done')";
    let (_execution, mut execution_reader) = post_stream(
        &addr,
        &format!("/v1/sandboxes/{id}/execute"),
        &json!({ "code": code }).to_string(),
    );
    read_until(&mut execution_reader, "started");

    // A command waiting for the session; its client leaves once the stream has begun.
    let (command, mut command_reader) = post_stream(
        &addr,
        &format!("/v1/sandboxes/{id}/commands"),
        &json!({"cmd": "touch never.txt"}).to_string(),
    );
    read_until(&mut command_reader, "HTTP/1.1 200");
    drop(command_reader);
    command.shutdown(std::net::Shutdown::Both).unwrap();

    let rest = read_until(&mut execution_reader, "\"type\":\"end\"");
    assert!(rest.contains("done"), "the execution was cut short: {rest}");
    assert!(rest.contains("\"status\":\"success\""), "{rest}");
    let (status, body) = s.call(
        "GET",
        &format!("/v1/sandboxes/{id}/files/never.txt"),
        None,
        None,
    );
    assert_eq!(
        (status, error_code(&body)),
        (404, "file_not_found"),
        "the abandoned command ran"
    );
    let (status, after) = s.execute(&id, None, "print('next')");
    assert_eq!(
        (status, after["stdout"].as_str()),
        (200, Some("next\n")),
        "{after}"
    );
}

/// A streamed execution whose rich results go over the per-execution bound ends with the same
/// `warnings` as its folded result object; so does a streamed command.
#[test]
fn the_end_event_carries_the_results_warnings() {
    let s = Server::start("");
    let id = s.create(None);
    let addr = s.url.trim_start_matches("http://").to_string();
    let code = "from IPython.display import display\nfor i in range(300):\n    display(i)";
    let body = json!({ "code": code }).to_string();

    let lines = ndjson(&addr, &format!("/v1/sandboxes/{id}/execute"), &body);
    let end = lines.last().unwrap();
    assert_eq!(end["type"], "end", "{end}");
    let results = lines.iter().filter(|l| l["type"] == "result").count();
    assert_eq!(results, 256, "{end}");
    let warnings = end["warnings"]
        .as_array()
        .expect("the end event has warnings");
    assert!(
        warnings
            .iter()
            .any(|w| w.as_str().unwrap().contains("rich results over the")),
        "{end}"
    );
    let (status, folded) = s.execute(&id, None, code);
    assert_eq!(status, 200, "{folded}");
    assert_eq!(end["warnings"], folded["warnings"], "{folded}");

    let body = json!({"cmd": "true"}).to_string();
    let lines = ndjson(&addr, &format!("/v1/sandboxes/{id}/commands"), &body);
    let end = lines.last().unwrap();
    let (status, info) = s.call("GET", &format!("/v1/sandboxes/{id}"), None, None);
    assert_eq!(status, 200, "{info}");
    assert_eq!(end["warnings"], info["warnings"], "{end}");
}

/// What the caller got wrong is answered with its status before any stream starts, as for a
/// folded result, not as a `sandbox_error` inside a 200 stream: an `env` for a bash session
/// (400), an unknown code context (404); a well-formed streamed execution's last line is its
/// `end`, with the fields of the folded result.
#[test]
fn a_callers_mistake_is_answered_with_its_status_before_the_stream() {
    let s = Server::start("");
    let bash = bash_session(&s, 256, 64);
    let python = s.create(None);
    let streamed = |id: &str, body: Value| -> (u16, Value, Option<String>) {
        let url = format!("{}/v1/sandboxes/{id}/execute", s.url);
        match ureq::post(&url).send_string(&body.to_string()) {
            Ok(r) => {
                let kind = r.header("Content-Type").map(str::to_string);
                let text = r.into_string().unwrap();
                let last = text
                    .lines()
                    .last()
                    .map(|l| serde_json::from_str(l).unwrap());
                (200, last.unwrap_or(Value::Null), kind)
            }
            Err(ureq::Error::Status(code, r)) => {
                let kind = r.header("Content-Type").map(str::to_string);
                (code, r.into_json().unwrap_or(Value::Null), kind)
            }
            Err(e) => panic!("{e}"),
        }
    };
    let cases = [
        (
            &bash,
            json!({"code": "echo $A", "env": {"A": "1"}}),
            400,
            "bad_request",
        ),
        (
            &python,
            json!({"code": "1", "context": "ctx-none"}),
            404,
            "not_found",
        ),
        (
            &python,
            json!({"code": "1", "env": {"A=B": "1"}}),
            400,
            "bad_request",
        ),
    ];
    for (id, body, want, code) in cases {
        for folded in [false, true] {
            let (status, answer, kind) = if folded {
                let (status, answer) = s.call(
                    "POST",
                    &format!("/v1/sandboxes/{id}/execute"),
                    None,
                    Some(&body.to_string()),
                );
                (status, answer, None)
            } else {
                streamed(id, body.clone())
            };
            assert_eq!(
                (status, error_code(&answer)),
                (want, code),
                "{body} (folded: {folded}): {answer} {kind:?}"
            );
        }
    }
    // Each sandbox still runs code, and a stream still ends with its `end`.
    let (status, end, kind) = streamed(&python, json!({"code": "print(1)"}));
    assert_eq!(
        (status, kind.as_deref()),
        (200, Some("application/x-ndjson"))
    );
    assert_eq!(
        (end["type"].as_str(), end["status"].as_str()),
        (Some("end"), Some("success")),
        "{end}"
    );
    let (status, end, _) = streamed(&bash, json!({"code": "echo 1"}));
    assert_eq!(
        (status, end["status"].as_str()),
        (200, Some("success")),
        "{end}"
    );
}

/// Sends `len` bytes to `path`; the whole answer.
fn oversized(addr: &str, method: &str, path: &str, len: usize) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
    )
    .unwrap();
    let mut writer = stream.try_clone().unwrap();
    // The server may answer before it has read everything: a broken pipe here is fine.
    let sender = std::thread::spawn(move || {
        let _ = writer.write_all(&vec![b' '; len]);
    });
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    sender.join().unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// A keyless POST that says its body is `length` bytes and never sends it: the answer's head
/// (lowercase), and whether the server then closed the connection.
fn post_without_its_body(addr: &str, path: &str, length: usize) -> (String, bool) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {length}\r\n\r\n"
    )
    .unwrap();
    let mut answer = Vec::new();
    let closed = stream.read_to_end(&mut answer).is_ok();
    let answer = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    let head = answer
        .split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_string();
    (head, closed)
}

/// A kept-alive POST of `body` whose header goes first and body a moment later (as a client
/// that writes them apart does): the answer's head (lowercase), and whether the connection
/// then still carries a second request.
fn keep_alive_post(addr: &str, path: &str, key: Option<&str>, body: &str) -> (String, bool) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let _ = stream.write_all(body.as_bytes());
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut head = String::new();
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.to_ascii_lowercase();
        if let Some(n) = line.strip_prefix("content-length:") {
            length = n.trim().parse().unwrap();
        }
        if line == "\r\n" || line.is_empty() {
            break;
        }
        head.push_str(&line);
    }
    let mut answer = vec![0; length];
    reader.read_exact(&mut answer).unwrap();
    let second = write!(stream, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    let mut status = String::new();
    let open = second.is_ok() && reader.read_line(&mut status).is_ok_and(|n| n > 0);
    (head, open)
}

/// One GET of `path` with exactly the header lines given (raw bytes, so that they can be
/// malformed), on a connection of its own: the status and the body, parsed as JSON when it is.
fn get_with(addr: &str, path: &str, headers: &[&[u8]]) -> (u16, Value, String) {
    let (status, _, body) = get_head(addr, path, headers);
    let json = serde_json::from_str(&body).unwrap_or(Value::Null);
    (status, json, body)
}

/// A GET of `path` with `headers`: the status, the head (lowercased) and the body.
fn get_head(addr: &str, path: &str, headers: &[&[u8]]) -> (u16, String, String) {
    let mut request = format!("GET {path} HTTP/1.1\r\nConnection: close\r\n").into_bytes();
    for h in headers {
        request.extend_from_slice(h);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"\r\n");
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(&request).unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {answer:?}"));
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (status, head.to_ascii_lowercase(), body.to_string())
}

/// The values of header `name` (lowercase) in a lowercased head.
fn header_values<'a>(head: &'a str, name: &str) -> Vec<&'a str> {
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| n.trim() == name)
        .map(|(_, v)| v.trim())
        .collect()
}

/// A workspace file, whatever its name and bytes, is downloaded as an inert attachment by the
/// native route and by E2B's envd route: Corral's type, policy and `nosniff`, and
/// `Content-Disposition: attachment`, so a page the sandbox wrote is never shown as a page of
/// the API's origin.
#[test]
fn workspace_files_download_as_inert_attachments() {
    let s = Server::start("");
    let id = s.create(None);
    let page = "<!doctype html><script>document.title = 'ran'</script>";
    let (status, _) = s.call(
        "PUT",
        &format!("/v1/sandboxes/{id}/files/page.html"),
        None,
        Some(page),
    );
    assert_eq!(status, 201);
    let (status, described) = s.call("POST", &format!("/v2/sandboxes/{id}/connect"), None, None);
    assert_eq!(status, 200, "{described}");
    let token = described["envdAccessToken"].as_str().unwrap().to_string();
    let addr = s.url.trim_start_matches("http://").to_string();
    let host = format!("Host: {addr}");
    let (sandbox, token) = (
        format!("E2b-Sandbox-Id: {id}"),
        format!("X-Access-Token: {token}"),
    );
    for (path, headers) in [
        (
            format!("/v1/sandboxes/{id}/files/page.html"),
            vec![host.as_bytes()],
        ),
        (
            "/files?path=page.html".to_string(),
            vec![host.as_bytes(), sandbox.as_bytes(), token.as_bytes()],
        ),
    ] {
        let (status, head, body) = get_head(&addr, &path, &headers);
        assert_eq!(status, 200, "{path}: {head}");
        assert!(body.contains(page), "{path}: {body}");
        assert_eq!(
            header_values(&head, "content-type"),
            ["application/octet-stream"],
            "{path}"
        );
        assert_eq!(
            header_values(&head, "content-disposition"),
            ["attachment"],
            "{path}"
        );
        assert_eq!(
            header_values(&head, "content-security-policy"),
            [corral_server::console::API_CSP
                .to_ascii_lowercase()
                .as_str()],
            "{path}"
        );
        assert_eq!(header_values(&head, "x-content-type-options"), ["nosniff"]);
    }
}

/// A connection that sends no request, a head that never ends, or stays idle after an answer
/// is closed once `header_timeout_s` passes: a client cannot hold the server's connections by
/// opening them and sending nothing.
#[test]
fn connections_that_send_no_request_head_are_closed() {
    let s = Server::start("header_timeout_s = 1\n");
    let addr = s.url.trim_start_matches("http://").to_string();
    let open = |text: &[u8]| {
        let mut stream = TcpStream::connect(&addr).unwrap();
        stream.write_all(text).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream
    };
    let closed = |stream: &mut TcpStream| {
        let mut answer = Vec::new();
        let read = stream.read_to_end(&mut answer);
        (read.is_ok(), String::from_utf8_lossy(&answer).into_owned())
    };
    for text in [&b""[..], b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"] {
        let (closed, answer) = closed(&mut open(text));
        assert!(closed, "still open after 10 s: {answer:?}");
        assert!(!answer.contains(" 200 "), "{answer}");
    }
    let (closed, answer) = closed(&mut open(
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    ));
    assert!(
        closed,
        "the idle connection is still open after 10 s: {answer:?}"
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// Keyless access to a loopback server fails closed: only a request whose `Host` parses to a
/// loopback name or address, and whose `Origin`, if any, is the server's own (the console's:
/// `http` and the same authority; another loopback page's is refused since issue 31), acts as the local user; anything unparsable is refused, and so is an `Authorization` header that is
/// not `Bearer KEY`. `/metrics` follows the API's rule; `/healthz` stays open.
#[test]
fn keyless_loopback_access_fails_closed() {
    let s = Server::start("");
    let addr = s.url.trim_start_matches("http://").to_string();
    let port = addr.rsplit(':').next().unwrap().to_string();
    let host = format!("Host: 127.0.0.1:{port}");
    // Every answer that breaks the rule, so that a failure lists all of them.
    let mut wrong = Vec::new();

    for path in ["/v1/sandboxes", "/metrics"] {
        let ok_hosts = [
            format!("127.0.0.1:{port}"),
            "127.0.0.1".to_string(),
            format!("localhost:{port}"),
            "LocalHost".to_string(),
            format!("[::1]:{port}"),
            "[::1]".to_string(),
            "127.3.4.5:80".to_string(),
        ];
        for ok in &ok_hosts {
            let (status, _, body) = get_with(&addr, path, &[format!("Host: {ok}").as_bytes()]);
            if status != 200 {
                wrong.push(format!("{path} Host: {ok}: {status} {body}"));
            }
        }
        {
            let origin = format!("Origin: http://127.0.0.1:{port}");
            let (status, _, body) = get_with(&addr, path, &[host.as_bytes(), origin.as_bytes()]);
            if status != 200 {
                wrong.push(format!("{path} {origin}: {status} {body}"));
            }
        }
        for origin in [
            "http://localhost:3000".to_string(),
            "https://127.0.0.1".to_string(),
            "http://[::1]:8080".to_string(),
            // The server's own authority in a scheme it does not serve: another origin.
            format!("https://127.0.0.1:{port}"),
            format!("ws://127.0.0.1:{port}"),
        ] {
            let origin = format!("Origin: {origin}");
            let (status, _, body) = get_with(&addr, path, &[host.as_bytes(), origin.as_bytes()]);
            if status != 403 {
                wrong.push(format!(
                    "{path} another loopback page's {origin}: {status} {body}"
                ));
            }
        }

        let refused: Vec<(&str, Vec<Vec<u8>>)> = vec![
            ("no Host", vec![]),
            ("an empty Host", vec![b"Host: ".to_vec()]),
            ("a foreign Host", vec![b"Host: evil.example".to_vec()]),
            (
                "a rebound name",
                vec![b"Host: 127.0.0.1.evil.example".to_vec()],
            ),
            (
                "a Host that is not UTF-8",
                vec![b"Host: 127.0.0.1\xff".to_vec()],
            ),
            (
                "a port that is not a number",
                vec![b"Host: 127.0.0.1:http".to_vec()],
            ),
            (
                "a port out of range",
                vec![b"Host: localhost:99999".to_vec()],
            ),
            (
                "a Host with a path",
                vec![b"Host: localhost:8420/x".to_vec()],
            ),
            ("an unclosed IPv6 literal", vec![b"Host: [::1".to_vec()]),
            ("a bare IPv6 address", vec![b"Host: ::1".to_vec()]),
            (
                "two Hosts",
                vec![host.as_bytes().to_vec(), b"Host: evil.example".to_vec()],
            ),
            (
                "a foreign Origin",
                vec![
                    host.as_bytes().to_vec(),
                    b"Origin: https://evil.example".to_vec(),
                ],
            ),
            (
                "an Origin that is not UTF-8",
                vec![
                    host.as_bytes().to_vec(),
                    b"Origin: http://localhost\xff".to_vec(),
                ],
            ),
            (
                "an Origin with a path",
                vec![
                    host.as_bytes().to_vec(),
                    b"Origin: http://localhost:3000/x".to_vec(),
                ],
            ),
            (
                "an Origin with user information",
                vec![
                    host.as_bytes().to_vec(),
                    b"Origin: http://localhost:3000@evil.example".to_vec(),
                ],
            ),
            (
                "an Origin without a scheme",
                vec![host.as_bytes().to_vec(), b"Origin: localhost:3000".to_vec()],
            ),
            (
                "an opaque Origin",
                vec![host.as_bytes().to_vec(), b"Origin: null".to_vec()],
            ),
        ];
        for (what, headers) in &refused {
            let headers: Vec<&[u8]> = headers.iter().map(Vec::as_slice).collect();
            let (status, json, body) = get_with(&addr, path, &headers);
            if !(matches!(status, 401 | 403) && json["error"]["code"].is_string()) {
                wrong.push(format!("{path} with {what}: {status} {body}"));
            }
        }

        for authorization in [
            &b"Authorization: Basic dXNlcjo="[..],
            b"Authorization: Bearer",
            b"Authorization: Bearer ",
            b"Authorization: Token abc",
            b"Authorization: Bearer \xff",
        ] {
            let (status, json, body) = get_with(&addr, path, &[host.as_bytes(), authorization]);
            if (status, error_code(&json)) != (401, "unauthorized") {
                let authorization = String::from_utf8_lossy(authorization);
                wrong.push(format!("{path} with {authorization}: {status} {body}"));
            }
        }
        let key = s.key(&format!("fails-closed{}", path.len()));
        let bearer = format!("Authorization: Bearer {key}");
        let (status, _, body) = get_with(&addr, path, &[b"Host: evil.example", bearer.as_bytes()]);
        assert_eq!(
            status, 200,
            "{path}: a valid key is enough anywhere: {body}"
        );
    }

    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    let (status, json, body) = get_with(&addr, "/healthz", &[b"Host: evil.example"]);
    assert_eq!((status, &json["status"]), (200, &json!("ok")), "{body}");
    let (status, _, body) = get_with(&addr, "/healthz", &[]);
    assert_eq!(status, 200, "{body}");
}

/// POSTs `body` and reads the NDJSON answer to its end.
fn ndjson(addr: &str, path: &str, body: &str) -> Vec<Value> {
    ndjson_as(addr, path, None, body)
}

/// [`ndjson`] with `key`'s credentials.
fn ndjson_as(addr: &str, path: &str, key: Option<&str>, body: &str) -> Vec<Value> {
    let mut request = ureq::post(&format!("http://{addr}{path}"));
    if let Some(key) = key {
        request = request.set("Authorization", &format!("Bearer {key}"));
    }
    let response = request.send_string(body).unwrap();
    assert_eq!(
        response.header("Content-Type"),
        Some("application/x-ndjson")
    );
    let mut text = String::new();
    response.into_reader().read_to_string(&mut text).unwrap();
    assert!(!text.contains("\n\n") && text.ends_with('\n'), "{text:?}");
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn sigterm_finishes_running_work_then_tears_every_sandbox_down() {
    let s = Server::start("shutdown_grace_s = 3");
    let id = s.create(None);
    s.create(None);
    wait_until("the sessions run", Duration::from_secs(10), || {
        !descendants(s.pid()).is_empty()
    });
    let procs = descendants(s.pid());
    let (url, busy) = (s.url.clone(), id.clone());
    let running = std::thread::spawn(move || {
        ureq::post(&format!("{url}/v1/sandboxes/{busy}/execute"))
            .set("Accept", "application/json")
            .send_string(r#"{"code":"import time\ntime.sleep(1)\nprint('finished')"}"#)
            .map(|r| r.into_json::<Value>().unwrap())
            .map_err(|e| e.to_string())
    });
    std::thread::sleep(Duration::from_millis(300));
    let pid = s.pid();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    // A stopping server takes no new connection (docs/api.md, 503 `shutting_down`), while
    // the execution it is running goes on.
    let addr = s.url.trim_start_matches("http://").to_string();
    wait_until(
        "new connections are refused",
        Duration::from_secs(2),
        || std::net::TcpStream::connect(&addr).is_err(),
    );
    let finished = running
        .join()
        .unwrap()
        .expect("the running execution is allowed to finish");
    assert_eq!(finished["stdout"], "finished\n");
    let mut s = s;
    let status = s.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    for (p, start) in procs {
        assert!(
            !alive(p, start),
            "sandbox process {p} survived the shutdown"
        );
    }
    assert_eq!(cgroups_of(pid), Vec::<PathBuf>::new());
}

#[test]
fn after_kill_9_a_restart_leaves_nothing_of_the_old_server() {
    let dir = tempfile::tempdir().unwrap();
    let db_dir = dir.path().to_path_buf();
    let mut s = Server::start_in(dir, "");
    let ids = [s.create(None), s.create(None)];
    s.execute(&ids[0], None, "import time");
    wait_until("the sessions run", Duration::from_secs(10), || {
        descendants(s.pid()).len() >= 2
    });
    // One is paused: on cgroup v1 its frozen processes could not die until thawed.
    let (status, _) = s.call(
        "POST",
        &format!("/v1/sandboxes/{}/pause", ids[1]),
        None,
        None,
    );
    assert_eq!(status, 200);
    let procs = descendants(s.pid());
    let pid = s.pid();
    assert!(!cgroups_of(pid).is_empty(), "sessions have cgroups");
    s.child.kill().unwrap();
    s.child.wait().unwrap();

    // The sandboxes die with their lifeline to the server, the paused one too.
    wait_until(
        "the orphaned sandboxes are gone",
        Duration::from_secs(10),
        || procs.iter().all(|&(p, start)| !alive(p, start)),
    );
    // The next server marks the sessions dead and removes the cgroups.
    let dir = std::mem::replace(&mut s._dir, tempfile::tempdir().unwrap());
    drop(s);
    let again = Server::start_in(dir, "");
    wait_until("stale cgroups are removed", Duration::from_secs(10), || {
        cgroups_of(pid).is_empty()
    });
    let db = corral_service::db::Db::open(&db_dir.join("corral.db")).unwrap();
    for id in &ids {
        let reason = db.session_end_reason(id).unwrap();
        assert!(
            reason.as_deref().is_some_and(|r| r.starts_with("orphaned")),
            "{id}: {reason:?}"
        );
        let (status, _) = again.call("GET", &format!("/v1/sandboxes/{id}"), None, None);
        assert_eq!(status, 404);
    }
}

#[test]
fn off_loopback_every_request_needs_a_key() {
    let s = Server::start_on("0.0.0.0", tempfile::tempdir().unwrap(), "");
    let (status, answer) = s.call("GET", "/v1/sandboxes", None, None);
    assert_eq!((status, error_code(&answer)), (401, "unauthorized"));
    let (status, answer) = s.call("POST", "/v1/run", None, Some(r#"{"code":"1"}"#));
    assert_eq!((status, error_code(&answer)), (401, "unauthorized"));
    let (status, _) = s.call("GET", "/healthz", None, None);
    assert_eq!(status, 200, "health needs no key");
    // Refused before its body was read: a small body that comes soon is read and dropped
    // after the answer, and the kept-alive connection goes on (closed with those bytes unread,
    // the reset could destroy the answer); a body over 64 KiB, or one that does not come
    // within a second, is not waited for, and the answer says the connection closes, so that
    // a client never sends its next request onto it. One whose body was read stays open.
    let addr = s.url.trim_start_matches("http://").to_string();
    let (head, open) = keep_alive_post(&addr, "/v1/run", None, r#"{"code":"1"}"#);
    assert!(head.starts_with("http/1.1 401"), "{head}");
    assert!(!head.contains("connection: close") && open, "{head}");
    for length in [64 * 1024 + 1, 10] {
        let (head, closed) = post_without_its_body(&addr, "/v1/run", length);
        assert!(head.starts_with("http/1.1 401"), "{length}: {head}");
        assert!(
            head.contains("connection: close") && closed,
            "{length}: {head}"
        );
    }
    let key = s.key("remote");
    let (head, open) = keep_alive_post(&addr, "/v1/run", Some(&key), "{not json");
    assert!(head.starts_with("http/1.1 400"), "{head}");
    assert!(!head.contains("connection: close") && open, "{head}");
    let (status, answer) = s.call("GET", "/metrics", None, None);
    assert_eq!((status, error_code(&answer)), (401, "unauthorized"));
    let (status, list) = s.call("GET", "/v1/sandboxes", Some(&key), None);
    assert_eq!((status, &list["sandboxes"]), (200, &json!([])));
    let (status, _) = s.raw("GET", "/metrics", Some(&key), None);
    assert_eq!(status, 200, "metrics with a key");
    // The API's description is public (docs/api.md): it holds no tenant's data.
    for path in ["/openapi.json", "/docs"] {
        let (status, _) = s.raw("GET", path, None, None);
        assert_eq!(status, 200, "{path} needs no key");
    }
}

/// Off loopback the console's page and files need no key (they hold no tenant's data), and
/// the routes behind it do: who one is, the audit log, and the operator routes, which a plain
/// key is refused (403) and an operator key (`corral key create --operator`) is given.
#[test]
fn off_loopback_the_console_is_public_and_operators_need_their_key() {
    let s = Server::start_on("0.0.0.0", tempfile::tempdir().unwrap(), "");
    for path in ["/", "/console/app.js", "/console/console.css"] {
        let (status, _) = s.raw("GET", path, None, None);
        assert_eq!(status, 200, "{path} needs no key");
    }
    for path in [
        "/v1/whoami",
        "/v1/audit",
        "/v1/keys",
        "/v1/operator/sandboxes",
    ] {
        let (status, answer) = s.call("GET", path, None, None);
        assert_eq!(
            (status, error_code(&answer)),
            (401, "unauthorized"),
            "{path}"
        );
    }
    let plain = s.key("plain");
    let operator = s.operator_key();
    for path in ["/v1/keys", "/v1/operator/sandboxes"] {
        let (status, answer) = s.call("GET", path, Some(&plain), None);
        assert_eq!((status, error_code(&answer)), (403, "forbidden"), "{path}");
        let (status, _) = s.call("GET", path, Some(&operator), None);
        assert_eq!(status, 200, "{path} for the operator");
    }
    let (status, me) = s.call("GET", "/v1/whoami", Some(&operator), None);
    assert_eq!((status, &me["operator"]), (200, &json!(true)));
    let (status, me) = s.call("GET", "/v1/whoami", Some(&plain), None);
    assert_eq!((status, &me["operator"]), (200, &json!(false)));
    // The key list names both, and never a secret.
    let (_, keys) = s.call("GET", "/v1/keys", Some(&operator), None);
    let text = keys.to_string();
    assert!(
        !text.contains(&plain) && !text.contains(&operator),
        "{text}"
    );
    assert_eq!(keys["keys"].as_array().unwrap().len(), 2);
}

#[test]
fn idle_sessions_expire_and_are_recorded() {
    let s = Server::start("");
    let (status, info) = s.call(
        "POST",
        "/v1/sandboxes",
        None,
        Some(r#"{"image":"host","idle_timeout_s":1}"#),
    );
    assert_eq!(status, 201, "{info}");
    let id = info["id"].as_str().unwrap().to_string();
    wait_until("the idle session expires", Duration::from_secs(15), || {
        s.call("GET", &format!("/v1/sandboxes/{id}"), None, None).0 == 404
    });
    let db = corral_service::db::Db::open(&s.db).unwrap();
    wait_until("its end is recorded", Duration::from_secs(5), || {
        db.session_end_reason(&id)
            .unwrap()
            .is_some_and(|r| r.starts_with("expired"))
    });
}

/// A server that keeps 20 audit lines: however many executions a key makes, the log never
/// holds more than 20 + the rows added between two passes (2 here), the newest are the ones
/// kept, `GET /v1/audit` pages over exactly them, and `/metrics` counts what was removed.
#[test]
fn the_audit_log_is_held_to_its_bound_and_keeps_the_newest_lines() {
    use corral_service::db::{Log, Retention};
    let s = Server::start("audit_max_rows = 20");
    let key = s.key("busy");
    let bound = Retention {
        max_rows: 20,
        ..Default::default()
    }
    .bound();
    assert_eq!(bound, 21);
    let id = s.create(Some(&key));
    let db = corral_service::db::Db::open(&s.db).unwrap();
    for n in 1..=60 {
        let (status, answer) = s.execute(&id, Some(&key), &format!("{n}"));
        assert_eq!(status, 200, "{answer}");
        let rows = db.rows(Log::Executions).unwrap();
        assert!(rows <= bound, "{rows} audit lines after {n} executions");
    }
    let mut ids = Vec::new();
    let mut before: Option<i64> = None;
    loop {
        let mut path = "/v1/audit?limit=7".to_string();
        if let Some(b) = before {
            path += &format!("&before={b}");
        }
        let (status, page) = s.call("GET", &path, Some(&key), None);
        assert_eq!(status, 200, "{page}");
        ids.extend(
            page["entries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["id"].as_i64().unwrap()),
        );
        match page["next"].as_i64() {
            Some(next) => before = Some(next),
            None => break,
        }
    }
    assert_eq!(ids, (41..=60).rev().collect::<Vec<i64>>());
    assert_eq!(
        metric(&s, "corral_audit_rows_pruned_total{table=\"executions\"}"),
        Some(40.0)
    );
}

/// An operator's list of every key's sandboxes pages over all of them (it stopped at the
/// first 1000 of each key): pages of two across two keys hold each sandbox once, in creation
/// order, with its key; the key filter pages the same way.
#[test]
fn the_operator_list_pages_over_every_keys_sandboxes() {
    let s = Server::start("");
    let (a, b) = (s.key("a"), s.key("b"));
    let operator = s.operator_key();
    let (_, who_a) = s.call("GET", "/v1/whoami", Some(&a), None);
    let (_, who_b) = s.call("GET", "/v1/whoami", Some(&b), None);
    let (key_a, key_b) = (who_a["key_id"].clone(), who_b["key_id"].clone());
    let mut made = Vec::new();
    for key in [&a, &b, &a, &b, &a] {
        made.push(s.create(Some(key)));
    }
    let pages = |query: &str| {
        let mut seen: Vec<(String, Value)> = Vec::new();
        let mut after: Option<String> = None;
        for _ in 0..10 {
            let mut path = format!("/v1/operator/sandboxes?limit=2{query}");
            if let Some(after) = &after {
                path += &format!("&after={after}");
            }
            let (status, page) = s.call("GET", &path, Some(&operator), None);
            assert_eq!(status, 200, "{page}");
            let rows = page["sandboxes"].as_array().unwrap();
            assert!(rows.len() <= 2, "{page}");
            seen.extend(
                rows.iter()
                    .map(|r| (r["id"].as_str().unwrap().to_string(), r["key_id"].clone())),
            );
            after = page["next"].as_str().map(str::to_string);
            if after.is_none() {
                return seen;
            }
        }
        panic!("the pages do not end: {seen:?}");
    };
    let owners = [&key_a, &key_b, &key_a, &key_b, &key_a];
    let every: Vec<(String, Value)> = made
        .iter()
        .zip(owners)
        .map(|(id, key)| (id.clone(), key.clone()))
        .collect();
    assert_eq!(pages(""), every);
    let only_a: Vec<(String, Value)> = every.iter().filter(|(_, k)| *k == key_a).cloned().collect();
    assert_eq!(pages(&format!("&key={}", key_a.as_str().unwrap())), only_a);
    for bad in ["limit=0", "limit=1001"] {
        let (status, answer) = s.call(
            "GET",
            &format!("/v1/operator/sandboxes?{bad}"),
            Some(&operator),
            None,
        );
        assert_eq!((status, error_code(&answer)), (400, "bad_request"), "{bad}");
    }
}

/// The full (`lean` false) or lean zygotes below `server`: the processes running
/// `corral_zygote.py` (with the argument `lean` for a lean one) in a pid namespace one below
/// the server's, whose parent (their sandbox's init) does not run it. The sessions and runs
/// they fork run the same program, a namespace further down, and the short-lived children
/// that set them up are the zygote's own.
fn zygotes(server: i32, lean: bool) -> Vec<(i32, u64)> {
    let depth = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .map(|l| l.split_whitespace().count())
    };
    let cmdline = |pid: i32| std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let runs_zygote =
        |pid: i32| String::from_utf8_lossy(&cmdline(pid)).contains("corral_zygote.py");
    let is_lean = |pid: i32| cmdline(pid).ends_with(b"corral_zygote.py\0lean\0");
    let zygote_depth = depth(server).map(|d| d + 1);
    descendants(server)
        .into_iter()
        .filter(|&(pid, _)| {
            runs_zygote(pid)
                && is_lean(pid) == lean
                && depth(pid) == zygote_depth
                && stat(pid).is_some_and(|(parent, _)| !runs_zygote(parent))
        })
        .collect()
}

/// Signals `pid`, which may have exited meanwhile (a replacement zygote caught mid-start).
fn signal(pid: i32, signal: nix::sys::signal::Signal) {
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => panic!("signalling {pid}: {e}"),
    }
}

/// What one client saw of one creation (and of `print(1)` in the session it got).
#[derive(Debug)]
struct Attempt {
    started: Instant,
    /// When the creation was answered.
    answered: Instant,
    status: u16,
    retry_after: Option<String>,
    code: String,
    /// Status and stdout of the execution, when the creation succeeded.
    executed: Option<(u16, Value)>,
}

/// Creates a session, runs `print(1)` in it and deletes it.
fn attempt(url: &str) -> Attempt {
    let started = Instant::now();
    let response = ureq::post(&format!("{url}/v1/sandboxes"))
        .set("Accept", "application/json")
        .send_string(r#"{"image":"host"}"#);
    let response = match response {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("POST /v1/sandboxes: {e}"),
    };
    let answered = Instant::now();
    let status = response.status();
    let retry_after = response.header("Retry-After").map(String::from);
    let body: Value = response.into_json().unwrap_or(Value::Null);
    let mut executed = None;
    if status == 201 {
        let id = body["id"].as_str().unwrap();
        let result = ureq::post(&format!("{url}/v1/sandboxes/{id}/execute"))
            .set("Accept", "application/json")
            .send_string(r#"{"code":"print(1)"}"#);
        let result = match result {
            Ok(r) | Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("execute: {e}"),
        };
        executed = Some((result.status(), result.into_json().unwrap_or(Value::Null)));
        let _ = ureq::delete(&format!("{url}/v1/sandboxes/{id}")).call();
    }
    Attempt {
        started,
        answered,
        status,
        retry_after,
        code: error_code(&body).to_string(),
        executed,
    }
}

fn metric(s: &Server, name: &str) -> Option<f64> {
    let (_, text) = s.raw("GET", "/metrics", None, None);
    String::from_utf8(text)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// `kill -9` of the warm pool's zygote while clients keep creating sessions: it is replaced,
/// creations in the gap wait for the new one or get 503 with `Retry-After` (never a 500),
/// and nothing of the old one is left. The replacement is held stopped for longer than a
/// creation waits, so the gap is long enough for 503s.
#[test]
fn a_killed_zygote_is_replaced_and_creations_in_the_gap_get_503_with_retry_after() {
    use nix::sys::signal::Signal;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    let s = Server::start("pool_size = 2\ndefault_image = \"host\"");
    let (_, health) = s.call("GET", "/healthz", None, None);
    assert_eq!(
        health,
        json!({"status": "ok", "pools": [{"image": "host", "zygote_alive": true, "zygote_restarts": 0,
                                           "lean_zygote_alive": true, "lean_zygote_restarts": 0}]})
    );
    let old = zygotes(s.pid(), false);
    assert_eq!(old.len(), 1, "one zygote: {old:?}");
    let (old_pid, old_start) = old[0];
    let old_init = stat(old_pid).unwrap().0;
    let old_init_start = stat(old_init).unwrap().1;

    let attempts = Arc::new(Mutex::new(Vec::<Attempt>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (url, attempts, stop) = (s.url.clone(), attempts.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let a = attempt(&url);
                    let failed = a.status != 201;
                    attempts.lock().unwrap().push(a);
                    if failed {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            })
        })
        .collect();
    let succeeded = |since: Instant| {
        attempts
            .lock()
            .unwrap()
            .iter()
            .filter(|a| a.started >= since && a.status == 201)
            .count()
    };
    let begin = Instant::now();
    wait_until("sessions are created", Duration::from_secs(30), || {
        succeeded(begin) >= 4
    });

    // The old generation: the zygote's sandbox and everything in it.
    let old_generation: Vec<(i32, u64)> = descendants(old_init)
        .into_iter()
        .chain([(old_init, old_init_start)])
        .collect();
    assert!(alive(old_pid, old_start));
    signal(old_pid, Signal::SIGKILL);
    let killed = Instant::now();

    // Hold the replacement stopped before it is ready.
    let mut replacement = None;
    wait_until(
        "a replacement zygote starts",
        Duration::from_secs(20),
        || {
            // (An orphan of the old zygote, not yet killed, has the old init for its parent.)
            replacement = zygotes(s.pid(), false).into_iter().find(|&(p, _)| {
                p != old_pid && stat(p).is_some_and(|(parent, _)| parent != old_init)
            });
            replacement.is_some()
        },
    );
    let (new_pid, _) = replacement.unwrap();
    signal(new_pid, Signal::SIGSTOP);
    std::thread::sleep(Duration::from_secs(11));
    let (_, health) = s.call("GET", "/healthz", None, None);
    // Unless it was ready before it was stopped, creations have waited out the gap by now.
    let caught = health["pools"][0]["zygote_alive"] == false;
    if caught {
        assert_eq!(health["status"], "degraded", "{health}");
        assert_eq!(
            metric(&s, "corral_zygote_up{image=\"host\",zygote=\"full\"}"),
            Some(0.0)
        );
    }
    signal(new_pid, Signal::SIGCONT);
    let resumed = Instant::now();

    wait_until(
        "the new zygote is up and creations succeed again",
        Duration::from_secs(20),
        || {
            let (_, health) = s.call("GET", "/healthz", None, None);
            health["status"] == "ok" && succeeded(resumed) >= 2
        },
    );
    let recovered = Instant::now();
    wait_until("creations keep succeeding", Duration::from_secs(20), || {
        succeeded(recovered) >= 4
    });
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }

    let attempts = attempts.lock().unwrap();
    let (mut unavailable, mut lost) = (0, 0);
    for a in attempts.iter() {
        match a.status {
            201 => {
                let (status, result) = a.executed.as_ref().unwrap();
                // A session handed out before the kill may die with its zygote, where the
                // engine has it die (409, or a result with a sandbox_error status); never a
                // server error.
                assert!(*status < 500, "execute: {status} {result}");
                lost += usize::from(result["stdout"] != "1\n");
                if a.started >= recovered {
                    assert_eq!((*status, &result["stdout"]), (200, &json!("1\n")), "{a:?}");
                }
            }
            503 => {
                unavailable += 1;
                assert_eq!(a.code, "zygote_restarting", "{a:?}");
                let retry: u64 = a.retry_after.as_deref().unwrap_or("").parse().unwrap_or(0);
                assert!(retry >= 1, "a 503 without Retry-After: {a:?}");
                assert!(a.answered > killed && a.started < recovered, "{a:?}");
            }
            _ => panic!("a creation failed other than with 503: {a:?}"),
        }
    }
    if caught {
        assert!(unavailable > 0, "creations outlasting the wait get 503");
    }
    eprintln!(
        "{} creations, {unavailable} answered 503, {lost} sessions lost with the old zygote; \
         caught the replacement: {caught}",
        attempts.len()
    );
    assert_eq!(
        metric(
            &s,
            "corral_zygote_restarts_total{image=\"host\",zygote=\"full\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(&s, "corral_zygote_up{image=\"host\",zygote=\"full\"}"),
        Some(1.0)
    );
    let (_, health) = s.call("GET", "/healthz", None, None);
    assert_eq!(
        health,
        json!({"status": "ok", "pools": [{"image": "host", "zygote_alive": true, "zygote_restarts": 1,
                                           "lean_zygote_alive": true, "lean_zygote_restarts": 0}]})
    );
    // Every session is closed by now: nothing of the old generation is left (its sandbox's
    // init reaped too), and the one zygote is the replacement.
    wait_until(
        "the old zygote's processes are gone",
        Duration::from_secs(10),
        || old_generation.iter().all(|&(p, start)| !alive(p, start)),
    );
    // A session child the pool is forking right now runs the zygote's program too, for a
    // moment: the one zygote is what stays.
    // Exactly one zygote is left, and not one of the old generation. (Which start it came
    // from is not asserted: a replacement caught mid-start may itself be superseded.)
    wait_until(
        "exactly one new zygote runs",
        Duration::from_secs(5),
        || {
            let now = zygotes(s.pid(), false);
            now.len() == 1 && !old_generation.contains(&now[0])
        },
    );
}

/// `kill -9` of the warm pool's lean zygote, which forks one-shot runs that do not import the
/// data stack: runs keep succeeding, forked from the full zygote while the lean one is
/// replaced (the replacement is held stopped meanwhile), then from the new lean zygote;
/// nothing of the old one is left.
#[test]
fn a_killed_lean_zygote_is_replaced_and_runs_in_the_gap_are_forked_from_the_full_one() {
    use nix::sys::signal::Signal;

    let s = Server::start("pool_size = 1\ndefault_image = \"host\"");
    let forked = |zygote: &str| {
        metric(
            &s,
            &format!("corral_runs_forked_total{{zygote=\"{zygote}\"}}"),
        )
        .unwrap()
    };
    let run = || {
        let body = json!({"code": "print(1)"}).to_string();
        let (status, r) = s.call("POST", "/v1/run", None, Some(&body));
        assert_eq!((status, &r["stdout"]), (200, &json!("1\n")), "{r}");
        r
    };
    let forkable = !run()["warnings"]
        .to_string()
        .contains("cgroups unavailable");
    let expected = |full: f64, lean: f64| {
        if forkable {
            (full, lean)
        } else {
            (0.0, 0.0)
        }
    };
    assert_eq!((forked("full"), forked("lean")), expected(0.0, 1.0));
    let old = zygotes(s.pid(), true);
    assert_eq!(old.len(), 1, "one lean zygote: {old:?}");
    let (old_pid, _) = old[0];
    let old_init = stat(old_pid).unwrap().0;
    let old_generation: Vec<(i32, u64)> = descendants(old_init)
        .into_iter()
        .chain([(old_init, stat(old_init).unwrap().1)])
        .collect();
    signal(old_pid, Signal::SIGKILL);

    // The run right after the kill finds it dead and is forked from the full zygote.
    run();
    assert_eq!((forked("full"), forked("lean")), expected(1.0, 1.0));
    let mut replacement = None;
    wait_until(
        "a replacement lean zygote starts",
        Duration::from_secs(20),
        || {
            replacement = zygotes(s.pid(), true).into_iter().find(|&(p, _)| {
                p != old_pid && stat(p).is_some_and(|(parent, _)| parent != old_init)
            });
            replacement.is_some()
        },
    );
    let (new_pid, _) = replacement.unwrap();
    signal(new_pid, Signal::SIGSTOP);
    let (_, health) = s.call("GET", "/healthz", None, None);
    // Unless it was ready before it was stopped, runs meanwhile are forked from the full one.
    let caught = health["pools"][0]["lean_zygote_alive"] == false;
    if caught {
        assert_eq!(health["status"], "degraded", "{health}");
        assert_eq!(
            metric(&s, "corral_zygote_up{image=\"host\",zygote=\"lean\"}"),
            Some(0.0)
        );
        for _ in 0..3 {
            run();
        }
        assert_eq!((forked("full"), forked("lean")), expected(4.0, 1.0));
    }
    eprintln!("caught the replacement of the lean zygote before it was ready: {caught}");
    signal(new_pid, Signal::SIGCONT);
    wait_until("the new lean zygote is up", Duration::from_secs(20), || {
        let (_, health) = s.call("GET", "/healthz", None, None);
        health["status"] == "ok"
    });
    let (full_before, lean_before) = (forked("full"), forked("lean"));
    run();
    assert_eq!(
        (forked("full"), forked("lean")),
        if forkable {
            (full_before, lean_before + 1.0)
        } else {
            (0.0, 0.0)
        },
        "forked from the new lean zygote"
    );
    let (_, health) = s.call("GET", "/healthz", None, None);
    assert_eq!(
        health,
        json!({"status": "ok", "pools": [{"image": "host", "zygote_alive": true, "zygote_restarts": 0,
                                           "lean_zygote_alive": true, "lean_zygote_restarts": 1}]})
    );
    assert_eq!(
        metric(
            &s,
            "corral_zygote_restarts_total{image=\"host\",zygote=\"lean\"}"
        ),
        Some(1.0)
    );
    wait_until(
        "the old lean zygote's processes are gone",
        Duration::from_secs(10),
        || old_generation.iter().all(|&(p, start)| !alive(p, start)),
    );
    let now = zygotes(s.pid(), true);
    assert_eq!(now.len(), 1, "one lean zygote: {now:?}");
    assert!(!old_generation.contains(&now[0]));
    assert_eq!(zygotes(s.pid(), false).len(), 1, "one full zygote");
}

// ---- admission control: fair share of one-shot runs, the host's memory budget, limits ----

/// (status, body, Retry-After, seconds taken) of one `POST /v1/run` as `key`; answers slower
/// than `limit` are a failure.
fn run_as(
    url: &str,
    key: &str,
    body: &Value,
    limit: Duration,
) -> (u16, Value, Option<String>, f64) {
    let agent = ureq::AgentBuilder::new().timeout(limit).build();
    let started = Instant::now();
    let response = agent
        .post(&format!("{url}/v1/run"))
        .set("Authorization", &format!("Bearer {key}"))
        .send_string(&body.to_string());
    let response = match response {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("POST /v1/run {body} got no answer within {limit:?}: {e}"),
    };
    let (status, retry) = (
        response.status(),
        response.header("Retry-After").map(str::to_string),
    );
    let body = response.into_json().unwrap_or(Value::Null);
    (status, body, retry, started.elapsed().as_secs_f64())
}

/// Key A fills its share of the one-shot slots with long runs: key B's run is still admitted
/// at once, and A's next run gets 429 with `Retry-After` after the bounded wait, never an
/// unbounded one.
#[test]
fn one_key_cannot_take_every_run_slot_and_waits_are_bounded() {
    let s = Server::start("max_runs = 4\nmax_runs_per_key = 2\nadmission_wait_s = 1");
    let (a, b) = (s.key("a"), s.key("b"));
    let long = json!({"code": "import time; time.sleep(30)", "image": "host",
                      "limits": {"timeout_s": 30}});
    // A's runs end with the server (dropped at the end of the test), not in 30 s.
    for _ in 0..2 {
        let (url, a, long) = (s.url.clone(), a.clone(), long.clone());
        std::thread::spawn(move || {
            let _ = ureq::post(&format!("{url}/v1/run"))
                .set("Authorization", &format!("Bearer {a}"))
                .send_string(&long.to_string());
        });
    }
    wait_until(
        "key A's two runs are in flight",
        Duration::from_secs(15),
        || metric(&s, "corral_runs_in_flight") == Some(2.0),
    );

    let quick = json!({"code": "print(1)", "image": "host"});
    let (status, result, _, took) = run_as(&s.url, &b, &quick, Duration::from_secs(20));
    assert_eq!(
        (status, &result["stdout"]),
        (200, &json!("1\n")),
        "{result}"
    );
    assert!(took < 10.0, "key B's run took {took:.1} s");

    let (status, answer, retry, took) = run_as(&s.url, &a, &quick, Duration::from_secs(10));
    assert_eq!(
        (status, error_code(&answer)),
        (429, "too_many_sandboxes"),
        "{answer}"
    );
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_runs_per_key")),
        "{answer}"
    );
    assert!(retry
        .and_then(|r| r.parse::<u64>().ok())
        .is_some_and(|r| r >= 1));
    assert!(
        (0.9..5.0).contains(&took),
        "refused after {took:.1} s, not after the 1 s wait"
    );
    assert_eq!(metric(&s, "corral_runs_in_flight"), Some(2.0));
}

/// Sessions and runs are promised memory (memory + 2 × disk); beyond the budget a creation
/// gets 503 with `Retry-After`, and the memory comes back when a session is closed or dies.
#[test]
fn the_host_memory_budget_refuses_what_it_cannot_hold_and_recovers() {
    // 2.5 GiB: two sessions of 512 MiB memory + 2 × 256 MiB disk (1 GiB each) fit, a third
    // does not.
    // One key holds the whole budget here (its share is set to all of it): the per-key
    // share has its own test (admission.rs).
    let s = Server::start(
        "memory_budget_bytes = 2684354560\nmemory_budget_per_key = 2684354560\nadmission_wait_s = 1",
    );
    let key = s.key("a");
    let session = r#"{"image": "host", "limits": {"memory_mb": 512, "disk_mb": 256}}"#;
    let create = || s.call("POST", "/v1/sandboxes", Some(&key), Some(session));
    let (first, second) = (create(), create());
    assert_eq!((first.0, second.0), (201, 201), "{first:?} {second:?}");
    assert_eq!(
        metric(&s, "corral_memory_committed_bytes"),
        Some(2.0 * 1073741824.0)
    );
    assert_eq!(metric(&s, "corral_memory_budget_bytes"), Some(2684354560.0));

    let refused = ureq::post(&format!("{}/v1/sandboxes", s.url))
        .set("Authorization", &format!("Bearer {key}"))
        .send_string(session);
    match refused {
        Err(ureq::Error::Status(503, r)) => {
            assert!(r
                .header("Retry-After")
                .is_some_and(|v| v.parse::<u64>().is_ok()));
            let body: Value = r.into_json().unwrap();
            assert_eq!(error_code(&body), "memory_budget_committed", "{body}");
            let message = body["error"]["message"].as_str().unwrap();
            assert!(
                message.contains("memory budget is committed: 2 of 2.5 GiB promised"),
                "{message}"
            );
        }
        other => panic!("expected 503, got {other:?}"),
    }
    // One-shot runs count too: refused after the bounded wait.
    let run = json!({"code": "print(1)", "image": "host",
                     "limits": {"memory_mb": 512, "disk_mb": 256}});
    let (status, answer, retry, _) = run_as(&s.url, &key, &run, Duration::from_secs(10));
    assert_eq!(
        (status, error_code(&answer)),
        (503, "memory_budget_committed"),
        "{answer}"
    );
    assert!(retry.is_some());
    // What could never fit is a bad request, not "retry later".
    let (status, answer) = s.call(
        "POST",
        "/v1/sandboxes",
        Some(&key),
        Some(r#"{"image": "host", "limits": {"memory_mb": 4096}}"#),
    );
    assert_eq!(
        (status, error_code(&answer)),
        (400, "bad_request"),
        "{answer}"
    );

    // Closing a session gives its memory back.
    let id = first.1["id"].as_str().unwrap();
    let (status, _) = s.call("DELETE", &format!("/v1/sandboxes/{id}"), Some(&key), None);
    assert_eq!(status, 204);
    let third = create();
    assert_eq!(third.0, 201, "{third:?}");

    // A session whose kernel died keeps only its workspace (256 MiB) promised: with the
    // third session that is 1.25 GiB, and a fourth fits in 2.5.
    let id = second.1["id"].as_str().unwrap();
    let (_, died) = s.execute(id, Some(&key), "import os; os.kill(os.getpid(), 9)");
    assert_ne!(died["status"], "success", "{died}");
    wait_until(
        "the dead session's memory is given back",
        Duration::from_secs(5),
        || metric(&s, "corral_memory_committed_bytes") == Some(1.25 * 1073741824.0),
    );
    let fourth = create();
    assert_eq!(fourth.0, 201, "{fourth:?}");
    let (status, result) = s.call(
        "POST",
        "/v1/run",
        Some(&key),
        Some(
            r#"{"code": "print(1)", "image": "host", "limits": {"memory_mb": 64, "disk_mb": 16}}"#,
        ),
    );
    assert_eq!(
        (status, &result["stdout"]),
        (200, &json!("1\n")),
        "{result}"
    );
    assert_eq!(
        metric(&s, "corral_memory_committed_bytes"),
        Some(2.25 * 1073741824.0)
    );
}

/// `corral run` and the API refuse the same out-of-range limits with the same words, naming
/// the field each knows it by.
#[test]
fn the_cli_and_the_api_check_limits_alike() {
    let s = Server::start("");
    let cases = [
        (
            "--memory",
            "100G",
            "memory_mb",
            json!(102400),
            "must be between 4 MiB and 64 GiB",
        ),
        (
            "--disk",
            "65G",
            "disk_mb",
            json!(66560),
            "must be between 1 MiB and 64 GiB",
        ),
        (
            "--pids",
            "40000",
            "pids",
            json!(40000),
            "must be between 1 and 32768",
        ),
        (
            "--cpus",
            "65",
            "cpus",
            json!(65),
            "must be more than 0 and at most 64",
        ),
        (
            "--timeout",
            "90000",
            "timeout_s",
            json!(90000),
            "must be more than 0 and at most 86400 seconds",
        ),
        (
            "--result-bytes",
            "2G",
            "result_mb",
            json!(2048),
            "must be between 0 bytes and 1 GiB",
        ),
        (
            "--result-count",
            "5000",
            "result_count",
            json!(5000),
            "must be between 0 and 4096",
        ),
    ];
    for (flag, value, field, api_value, requirement) in cases {
        let out = Command::new(BIN)
            .args(["run", "--image", "host", flag, value, "-c", "1"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{flag} {value}: {stderr}");
        assert!(
            stderr.contains(&format!("{flag} {requirement}")),
            "{flag} {value}: {stderr}"
        );
        for path in ["/v1/run", "/v1/sandboxes"] {
            let body = json!({"code": "1", "image": "host", "limits": {field: api_value}});
            let mut body = body;
            if path == "/v1/sandboxes" {
                body.as_object_mut().unwrap().remove("code");
            }
            let (status, answer) = s.call("POST", path, None, Some(&body.to_string()));
            assert_eq!(
                (status, error_code(&answer)),
                (400, "bad_request"),
                "{path} {body}"
            );
            let message = answer["error"]["message"].as_str().unwrap();
            assert!(
                message.contains(&format!("limits.{field} {requirement}")),
                "{path}: {message}"
            );
        }
    }
}

// ---- uploads (issue 19 item 4, issue 20 item 4) ---------------------------------------------

const MIB: u64 = 1 << 20;

/// A session of `key`'s (or keyless) from `limits`, running bash (a kernel of a few MiB, so
/// that what the sandbox's memory holds is mostly what is uploaded).
fn bash_session(s: &Server, memory_mb: u64, disk_mb: u64) -> String {
    let body = json!({"image": "host", "language": "bash",
                      "limits": {"memory_mb": memory_mb, "disk_mb": disk_mb}});
    let (status, info) = s.call("POST", "/v1/sandboxes", None, Some(&body.to_string()));
    assert_eq!(status, 201, "{info}");
    info["id"].as_str().unwrap().to_string()
}

/// The memory cgroup directory of the server's only sandbox.
fn memory_cgroup(server: i32) -> PathBuf {
    let dirs: Vec<PathBuf> = cgroups_of(server)
        .into_iter()
        .filter(|d| d.join("memory.stat").exists())
        .collect();
    assert_eq!(dirs.len(), 1, "one sandbox's memory cgroup: {dirs:?}");
    dirs.into_iter().next().unwrap()
}

/// Bytes of tmpfs (shared memory) charged to a memory cgroup (v1 and v2 alike).
fn charged_shmem(cgroup: &Path) -> u64 {
    std::fs::read_to_string(cgroup.join("memory.stat"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("shmem ")?.trim().parse().ok())
        .expect("memory.stat has a shmem line")
}

/// A field of /proc/PID/status in bytes (VmHWM, VmRSS).
fn status_bytes(pid: i32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = text
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .strip_prefix(':')?
                .trim()
                .strip_suffix(" kB")
        })
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    kib * 1024
}

/// Bytes process `pid` caused to be written to storage (`write_bytes` of /proc/PID/io).
fn storage_writes(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("write_bytes: ")?.trim().parse().ok())
        .unwrap()
}

/// Host memory and disk around some uploads: the server's peak resident size and what it
/// wrote to storage, before and after.
struct HostUse {
    pid: i32,
    peak: u64,
    written: u64,
}

impl HostUse {
    fn now(pid: i32) -> HostUse {
        HostUse {
            pid,
            peak: status_bytes(pid, "VmHWM"),
            written: storage_writes(pid),
        }
    }

    /// Fails unless the server's peak grew by less than `max_growth` and it spooled nothing
    /// to disk (less than 1 MiB: its database).
    fn assert_small(&self, max_growth: u64, uploaded: u64) {
        let after = HostUse::now(self.pid);
        let growth = after.peak.saturating_sub(self.peak);
        assert!(
            growth < max_growth,
            "the server's peak resident size grew by {} MiB for {} MiB uploaded (from {} MiB)",
            growth / MIB,
            uploaded / MIB,
            self.peak / MIB
        );
        let written = after.written.saturating_sub(self.written);
        assert!(
            written < MIB,
            "the server wrote {written} bytes to storage for {} MiB uploaded",
            uploaded / MIB
        );
    }
}

/// A reader of `len` bytes of `byte`, which ureq sends chunked (no Content-Length): the
/// server learns the size only by reading.
struct Filler {
    left: u64,
    byte: u8,
}

impl Read for Filler {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.left as usize);
        buf[..n].fill(self.byte);
        self.left -= n as u64;
        Ok(n)
    }
}

/// (status, JSON body) of a chunked upload of `len` bytes.
fn upload_chunked(url: &str, len: u64) -> (u16, Value) {
    let response = ureq::put(url)
        .set("Accept", "application/json")
        .send(Filler {
            left: len,
            byte: b'u',
        });
    match response {
        Ok(r) | Err(ureq::Error::Status(_, r)) => {
            (r.status(), r.into_json().unwrap_or(Value::Null))
        }
        Err(e) => panic!("PUT {url}: {e}"),
    }
}

/// Every name in the session's workspace, hidden ones included, as `ls -A` shows them.
fn workspace_names(s: &Server, id: &str) -> String {
    let (status, listed) = s.execute(id, None, "ls -A /workspace");
    assert_eq!(status, 200, "{listed}");
    listed["stdout"].as_str().unwrap().to_string()
}

#[test]
fn uploads_are_charged_to_the_sandbox_and_one_over_its_memory_fails_cleanly() {
    let s = Server::start("");
    let id = bash_session(&s, 64, 256);
    let cgroup = memory_cgroup(s.pid());
    let charged = charged_shmem(&cgroup);
    let host = HostUse::now(s.pid());
    let data = vec![b'x'; (20 * MIB) as usize];
    for name in ["a.bin", "b.bin"] {
        let (status, entry) = s.raw(
            "PUT",
            &format!("/v1/sandboxes/{id}/files/{name}"),
            None,
            Some(&data),
        );
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&entry));
    }
    let grown = charged_shmem(&cgroup) - charged;
    assert!(
        (40 * MIB..44 * MIB).contains(&grown),
        "40 MiB uploaded, {} KiB charged to the sandbox",
        grown / 1024
    );
    host.assert_small(16 * MIB, 40 * MIB);

    // 30 MiB more would take the sandbox past its 64 MiB: refused, and nothing of it stays.
    let big = vec![b'y'; (30 * MIB) as usize];
    let (status, answer) = s.raw(
        "PUT",
        &format!("/v1/sandboxes/{id}/files/c.bin"),
        None,
        Some(&big),
    );
    let answer: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
    assert_eq!(
        (status, error_code(&answer)),
        (507, "insufficient_storage"),
        "{answer}"
    );
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("memory limit"), "{message}");
    assert_eq!(workspace_names(&s, &id), "a.bin\nb.bin\n");
    let after = charged_shmem(&cgroup) - charged;
    assert!(after < 44 * MIB, "{} KiB still charged", after / 1024);
    // The session lives on and runs code.
    let (status, result) = s.execute(&id, None, "echo alive");
    assert_eq!(
        (status, &result["status"], &result["stdout"]),
        (200, &json!("success"), &json!("alive\n")),
        "{result}"
    );
    host.assert_small(16 * MIB, 70 * MIB);
    // The writer's death is not the kernel's: a kernel that dies later of something else is
    // not said to have hit the memory limit.
    s.execute(&id, None, "kill -9 $PPID");
    let (_, info) = s.call("GET", &format!("/v1/sandboxes/{id}"), None, None);
    let death = info["death"].as_str().unwrap_or_default();
    assert!(!death.is_empty() && !death.contains("memory"), "{info}");
}

#[test]
fn parallel_uploads_stream_and_the_server_stays_small() {
    let s = Server::start("");
    let id = bash_session(&s, 1024, 512);
    let cgroup = memory_cgroup(s.pid());
    let charged = charged_shmem(&cgroup);
    let host = HostUse::now(s.pid());
    let data = std::sync::Arc::new(vec![b'p'; (24 * MIB) as usize]);
    let uploads: Vec<_> = (0..16)
        .map(|i| {
            let url = format!("{}/v1/sandboxes/{id}/files/p{i:02}.bin", s.url);
            let data = data.clone();
            std::thread::spawn(move || match ureq::put(&url).send_bytes(&data) {
                Ok(r) => r.status(),
                Err(ureq::Error::Status(code, r)) => {
                    panic!("{code} {}", r.into_string().unwrap_or_default())
                }
                Err(e) => panic!("{e}"),
            })
        })
        .collect();
    for upload in uploads {
        assert_eq!(upload.join().unwrap(), 201);
    }
    let (_, listing) = s.call("GET", &format!("/v1/sandboxes/{id}/files"), None, None);
    let files = listing["files"].as_array().unwrap();
    assert_eq!(files.len(), 16, "{listing}");
    assert!(files.iter().all(|f| f["size"] == 24 * MIB), "{listing}");
    let grown = charged_shmem(&cgroup) - charged;
    assert!(
        (384 * MIB..390 * MIB).contains(&grown),
        "384 MiB uploaded, {} KiB charged to the sandbox",
        grown / 1024
    );
    host.assert_small(64 * MIB, 384 * MIB);
}

#[test]
fn an_upload_over_the_disk_limit_leaves_nothing_behind() {
    let s = Server::start("");
    let id = bash_session(&s, 256, 16);
    let f = |p: &str| format!("/v1/sandboxes/{id}/files/{p}");
    let (status, _) = s.call("PUT", &f("keep.txt"), None, Some("original"));
    assert_eq!(status, 201);
    let (_, planted) = s.execute(
        &id,
        None,
        "mkfifo fifo && ln -s /etc/hostname link && mkdir dir && echo planted",
    );
    assert_eq!(planted["stdout"], "planted\n", "{planted}");
    let host = HostUse::now(s.pid());

    // Announced larger than the whole workspace: refused before a byte is read.
    let addr = s.url.trim_start_matches("http://").to_string();
    let answer = oversized(&addr, "PUT", &f("keep.txt"), (20 * MIB) as usize);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains(r#""code":"payload_too_large""#), "{answer}");
    // Unannounced (chunked): cut off where the workspace is full.
    let (status, answer) = upload_chunked(&format!("{}{}", s.url, f("keep.txt")), 20 * MIB);
    assert_eq!(
        (status, error_code(&answer)),
        (507, "insufficient_storage"),
        "{answer}"
    );
    // Fitting the disk limit but not the room left.
    let (status, _) = s.raw(
        "PUT",
        &f("fill.bin"),
        None,
        Some(&vec![0u8; (10 * MIB) as usize]),
    );
    assert_eq!(status, 201);
    let (status, answer) = upload_chunked(&format!("{}{}", s.url, f("keep.txt")), 8 * MIB);
    assert_eq!((status, error_code(&answer)), (507, "insufficient_storage"));
    let (status, answer) = upload_chunked(&format!("{}{}", s.url, f("new/deep.txt")), 8 * MIB);
    assert_eq!((status, error_code(&answer)), (507, "insufficient_storage"));
    host.assert_small(16 * MIB, 56 * MIB);

    // No partial file, no temporary name left; the existing file is unchanged.
    assert_eq!(
        workspace_names(&s, &id),
        "dir\nfifo\nfill.bin\nkeep.txt\nlink\nnew\n"
    );
    let (_, listed) = s.execute(&id, None, "ls -A new | wc -l");
    assert_eq!(listed["stdout"], "0\n", "{listed}");
    assert_eq!(
        s.raw("GET", &f("keep.txt"), None, None),
        (200, b"original".to_vec())
    );

    // A link, a FIFO or a directory at the target is refused, and stays what it was.
    for target in ["link", "fifo", "dir"] {
        let (status, answer) = s.call("PUT", &f(target), None, Some("x"));
        assert_eq!(
            (status, error_code(&answer)),
            (400, "invalid_path"),
            "PUT {target}: {answer}"
        );
    }
    let (_, checked) = s.execute(
        &id,
        None,
        "readlink link; test -p fifo && echo fifo; test -d dir && echo dir",
    );
    assert_eq!(checked["stdout"], "/etc/hostname\nfifo\ndir\n", "{checked}");

    // Within the room left, it replaces the file, owned by the sandbox's user.
    let (status, entry) = s.call("PUT", &f("keep.txt"), None, Some("replaced"));
    assert_eq!((status, &entry["size"]), (201, &json!(8)), "{entry}");
    assert_eq!(
        s.raw("GET", &f("keep.txt"), None, None),
        (200, b"replaced".to_vec())
    );
    let (_, owner) = s.execute(
        &id,
        None,
        "[ $(stat -c %u keep.txt) = $(id -u) ] && echo mine",
    );
    assert_eq!(owner["stdout"], "mine\n", "{owner}");
}

/// The body of a multipart upload of `len` bytes in one `file` part, streamed (chunked).
fn multipart_upload(url: &str, sandbox: &str, token: &str, len: u64) -> (u16, Value) {
    let boundary = "corral-test-boundary";
    let head = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    );
    let tail = format!("\r\n--{boundary}--\r\n");
    let body = std::io::Cursor::new(head.into_bytes())
        .chain(Filler {
            left: len,
            byte: b'm',
        })
        .chain(std::io::Cursor::new(tail.into_bytes()));
    let response = ureq::post(url)
        .set("E2b-Sandbox-Id", sandbox)
        .set("X-Access-Token", token)
        .set(
            "Content-Type",
            &format!("multipart/form-data; boundary={boundary}"),
        )
        .send(body);
    match response {
        Ok(r) | Err(ureq::Error::Status(_, r)) => {
            (r.status(), r.into_json().unwrap_or(Value::Null))
        }
        Err(e) => panic!("POST {url}: {e}"),
    }
}

#[test]
fn e2b_multipart_uploads_stream_and_are_charged_alike() {
    let s = Server::start("");
    let id = bash_session(&s, 128, 32);
    let (status, described) = s.call("POST", &format!("/v2/sandboxes/{id}/connect"), None, None);
    assert_eq!(status, 200, "{described}");
    let token = described["envdAccessToken"].as_str().unwrap().to_string();
    let cgroup = memory_cgroup(s.pid());
    let charged = charged_shmem(&cgroup);
    let host = HostUse::now(s.pid());

    let url = |path: &str| format!("{}/files?path={path}", s.url);
    let (status, written) = multipart_upload(&url("/home/user/a.bin"), &id, &token, 20 * MIB);
    assert_eq!(status, 200, "{written}");
    assert_eq!(written[0]["path"], "/workspace/a.bin", "{written}");
    let grown = charged_shmem(&cgroup) - charged;
    assert!(
        (20 * MIB..22 * MIB).contains(&grown),
        "20 MiB uploaded, {} KiB charged to the sandbox",
        grown / 1024
    );
    // Past the 32 MiB disk limit: refused, nothing left.
    let (status, answer) = multipart_upload(&url("b.bin"), &id, &token, 20 * MIB);
    assert_eq!(status, 507, "{answer}");
    assert!(
        answer["message"].as_str().unwrap().contains("full"),
        "{answer}"
    );
    assert_eq!(workspace_names(&s, &id), "a.bin\n");
    host.assert_small(16 * MIB, 40 * MIB);
}

/// Sends a folded-answer request (`Accept: application/json`) on a connection of its own and
/// returns it unread.
fn send_unread(addr: &str, path: &str, key: &str, body: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n\
         Accept: application/json\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    stream
}

/// (status, JSON body) of the answer on `stream`, read now.
fn read_answer(mut stream: TcpStream) -> (u16, Value) {
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes).unwrap();
    let split = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP answer");
    let head = String::from_utf8_lossy(&bytes[..split]).to_string();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let body = serde_json::from_slice(&bytes[split + 4..]).unwrap_or(Value::Null);
    (status, body)
}

/// Sessions of two keys flood rich results and their clients leave the answers unread: the
/// server holds at most `max_result_bytes_in_flight` of them (twice their size: decoded, and
/// as the answer), drops the rest with a warning that names the budget, keeps holding the
/// room of an unread answer until it is read, still answers a well-behaved client's small
/// result, and is healthy afterwards.
#[test]
fn rich_results_held_at_once_are_bounded_server_wide() {
    let budget = 32 * MIB;
    let s = Server::start(&format!(
        "max_result_bytes_in_flight = {budget}\nmax_result_bytes_in_flight_per_key = {}\n",
        24 * MIB
    ));
    let addr = s.url.trim_start_matches("http://").to_string();
    let keys = [s.key("flood-a"), s.key("flood-b")];
    let good = s.key("good");
    let flooders: Vec<(String, String)> = keys
        .iter()
        .flat_map(|key| [0, 1].map(|_| (key.clone(), s.create(Some(key)))))
        .collect();
    let good_id = s.create(Some(&good));
    let held = || metric(&s, "corral_result_bytes_held").expect("the metric") as u64;
    let peak_before = status_bytes(s.pid(), "VmHWM");

    // 96 results of 1 MiB each, over the 64 MiB per execution too; then a mark that it ended.
    let flood = "from IPython.display import display, HTML\n\
                 for i in range(96): display(HTML('x' * (1 << 20)))\n\
                 open('/workspace/flooded', 'w').close()";
    let body = json!({ "code": flood, "timeout_s": 100 }).to_string();
    let unread: Vec<TcpStream> = flooders
        .iter()
        .map(|(key, id)| send_unread(&addr, &format!("/v1/sandboxes/{id}/execute"), key, &body))
        .collect();
    // A well-behaved client's small result arrives, whole, during the flood.
    std::thread::sleep(Duration::from_secs(1));
    let (status, small) = s.execute(&good_id, Some(&good), "1+1");
    assert_eq!(status, 200, "{small}");
    assert_eq!(small["results"][0]["text"], "2", "{small}");
    let dropped = |answer: &Value| {
        answer["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().starts_with("rich results"))
    };
    assert!(!dropped(&small), "{small}");
    wait_until("every flood ends", Duration::from_secs(120), || {
        flooders.iter().all(|(key, id)| {
            s.raw(
                "GET",
                &format!("/v1/sandboxes/{id}/files/flooded"),
                Some(key),
                None,
            )
            .0 == 200
        })
    });
    // The answers are unread: they hold their results' room, within the budget.
    std::thread::sleep(Duration::from_secs(1));
    let held_unread = held();
    assert!(
        held_unread > 0 && held_unread <= budget,
        "{held_unread} bytes held"
    );
    let answers: Vec<Value> = unread
        .into_iter()
        .map(|stream| {
            let (status, answer) = read_answer(stream);
            assert_eq!(status, 200, "{answer}");
            assert_eq!(answer["status"], "success", "{answer}");
            answer
        })
        .collect();
    let kept: u64 = answers
        .iter()
        .map(|a| a["results"].as_array().unwrap().len() as u64)
        .sum();
    // Each kept result takes twice its size of the budget while the server holds it. An
    // answer that fits in the kernel's socket buffers is written, and its room given back,
    // although its client has not read it yet: so a little more than budget / 2 MiB may be
    // kept in all, never the whole flood.
    assert!(
        (1..=budget / MIB).contains(&kept),
        "{kept} results of 1 MiB kept in all"
    );
    let warnings: Vec<&str> = answers
        .iter()
        .flat_map(|a| a["warnings"].as_array().unwrap())
        .map(|w| w.as_str().unwrap())
        .collect();
    let named = |what: &str| {
        warnings
            .iter()
            .any(|w| w.starts_with("rich results were dropped") && w.contains(what))
    };
    assert!(
        named("the server's budget of 32 MiB for rich results held at once (max_result_bytes_in_flight) was full"),
        "{warnings:?}"
    );
    // The server's peak resident size grew by the budget at most, and a little more.
    let grown = status_bytes(s.pid(), "VmHWM").saturating_sub(peak_before);
    assert!(
        grown < budget + 16 * MIB,
        "the server's peak resident size grew by {} MiB with a budget of {} MiB",
        grown / MIB,
        budget / MIB
    );

    // Read, the answers gave their room back: the server is healthy and a session of a
    // flooding key gets all of a result that fits in its share.
    wait_until(
        "the answers give their room back",
        Duration::from_secs(5),
        || held() == 0,
    );
    let (status, health) = s.call("GET", "/healthz", None, None);
    assert_eq!((status, &health["status"]), (200, &json!("ok")), "{health}");
    let (key, id) = &flooders[0];
    let (status, again) = s.execute(
        id,
        Some(key),
        "from IPython.display import display, HTML\n\
         for i in range(8): display(HTML('y' * (1 << 20)))",
    );
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["results"].as_array().unwrap().len(), 8, "{again}");
    assert!(!dropped(&again), "{again}");
}

/// What a program can observe of the interpreter it runs in, printed as JSON: a one-shot run
/// served from a fork must be indistinguishable from one in a fresh interpreter.
const PROBE: &str = r#"
import builtins, json, os, resource, signal, sys
print(json.dumps({
    "argv": sys.argv, "path": sys.path, "cwd": os.getcwd(), "file": __file__,
    "env": sorted(os.environ.items()), "builtins": sorted(vars(builtins)),
    "main": sorted(globals()), "modules_main": sys.modules["__main__"].__name__,
    "signals": [str(signal.getsignal(s)) for s in signal.valid_signals()
                if s not in (signal.SIGKILL, signal.SIGSTOP) and s < signal.SIGRTMIN],
    "rlimits": [resource.getrlimit(getattr(resource, n)) for n in sorted(dir(resource))
                if n.startswith("RLIMIT_")],
    "ids": [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), os.getgroups()],
    "umask": os.umask(0o22), "pid": os.getpid(), "ppid": os.getppid(),
    "hooks": [repr(sys.excepthook), repr(sys.displayhook), repr(sys.breakpointhook)],
    "stdio": [sys.stdout.line_buffering, sys.stdout.encoding, sys.stderr.encoding,
              sys.stdin.read(), sorted(os.listdir("/proc/self/fd"))],
    "status": [l for l in open("/proc/self/status") if l.split(":")[0] in
               ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")],
    "program": [oct(os.stat(__file__).st_mode), open(__file__).read() == open(sys.argv[0]).read()],
    "hostname": os.uname().nodename, "get_ipython": "get_ipython" in dir(builtins),
}, sort_keys=True))
"#;

/// `POST /v1/run` of Python on the warm pool's image is served from a fork of one of its
/// zygotes (the full one when the program imports a module outside the standard library, else
/// the lean one), with exactly the result a fresh interpreter gives: the same programs through
/// a server with a pool and one without give the same result, field by field (but the timings
/// and the memory used, which the fork shares with its zygote).
#[test]
fn runs_served_from_forks_give_the_results_of_fresh_interpreters() {
    let forks = Server::start("pool_size = 1\ndefault_image = \"host\"");
    let fresh = Server::start("default_image = \"host\"");
    let programs: Vec<Value> = vec![
        json!({"code": "print(1)"}),
        json!({"code": PROBE}),
        json!({"code": "import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)"}),
        json!({"code": "import sys\nsys.exit('bye')"}),
        json!({"code": "def f():\n    raise ValueError('bad')\n\nf()"}),
        json!({"code": "def (:\n"}),
        json!({"code": "raise KeyboardInterrupt"}),
        json!({"code": "x = 40\nx + 2"}),
        json!({"code": concat!(
            "class A:\n    def __repr__(self):\n        return 'A()'\n\n",
            "    def _repr_html_(self):\n        return '<b>a</b>'\n\nA()"
        )}),
        json!({"code": "display(1)"}),
        json!({"code": "import atexit\natexit.register(print, 'at exit')\nprint('main')"}),
        json!({"code": "import threading, time\n\
                        threading.Thread(target=lambda: (time.sleep(0.3), print('late'))).start()"}),
        json!({"code": "import time\nprint('before', flush=True)\ntime.sleep(30)",
               "limits": {"timeout_s": 1}}),
        json!({"code": "b = bytearray(512 << 20)\nprint(len(b))", "limits": {"memory_mb": 64}}),
        json!({"code": "print('x' * (2 << 20))"}),
        json!({"code": "import os\nprint(open('data/in.txt').read(), os.environ['GREETING'])\n\
                        open('out.txt', 'w').write('done')",
               "env": {"GREETING": "hi"},
               "files": [{"path": "data/in.txt", "content": "hello"}]}),
        // What the lean zygote has imported, and what it has not.
        json!({"code": "import random, dataclasses, statistics, asyncio\n\
                        print(statistics.mean([random.random() < 2, 1]), asyncio.run(asyncio.sleep(0, 'ok')))"}),
        // From the full zygote: modules outside the standard library.
        json!({"code": "import IPython\nprint(IPython.get_ipython())\ndisplay(1)"}),
        json!({"code": "import numpy as np\nnp.arange(4).sum()"}),
        json!({"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nprint(plt.get_backend())"}),
    ];
    // The last three import modules outside the standard library.
    let full = 3;
    let mut served = Vec::new();
    for program in &programs {
        let body = program.to_string();
        let (s1, a) = forks.call("POST", "/v1/run", None, Some(&body));
        let (s2, b) = fresh.call("POST", "/v1/run", None, Some(&body));
        assert_eq!((s1, s2), (200, 200), "{program}: {a} {b}");
        for field in [
            "status",
            "exit_code",
            "signal",
            "stdout",
            "stderr",
            "stdout_truncated",
            "stderr_truncated",
            "results",
            "error",
            "files",
            "error_message",
            "warnings",
        ] {
            assert_eq!(
                a[field], b[field],
                "{program}: {field}\nfork: {a}\nfresh: {b}"
            );
        }
        served.push(a);
    }
    // What they agree on is what a fresh interpreter does.
    let summary: Vec<(&Value, &Value)> = served
        .iter()
        .map(|r| (&r["status"], &r["exit_code"]))
        .collect();
    assert_eq!(summary[2], (&json!("error"), &json!(3)));
    assert_eq!(served[4]["error"]["name"], "ValueError");
    assert_eq!(served[8]["results"][0]["html"], "<b>a</b>");
    assert_eq!(
        served[9]["error"]["name"], "NameError",
        "no IPython display()"
    );
    assert_eq!(served[10]["stdout"], "main\nat exit\n");
    assert_eq!(served[11]["stdout"], "late\n");
    assert_eq!(served[12]["status"], "timeout");
    assert!(
        matches!(
            served[13]["status"].as_str(),
            Some("memory_limit" | "error")
        ),
        "{}",
        served[13]
    );
    assert_eq!(served[15]["stdout"], "hello hi\n");
    assert_eq!(served[16]["stdout"], "1 ok\n");
    assert_eq!(served[17]["stdout"], "None\n");
    assert_eq!(
        served[17]["error"]["name"], "NameError",
        "no IPython display()"
    );
    assert_eq!(served[18]["results"][0]["text"], "6");
    assert_eq!(
        served[19]["results"].as_array().unwrap().len(),
        1,
        "the figure"
    );
    // Rootless without cgroups a fork cannot measure memory as a fresh interpreter's rusage
    // does: runs then get fresh interpreters.
    let forkable = !served[0]["warnings"]
        .to_string()
        .contains("cgroups unavailable");
    let forked = |s: &Server, zygote: &str| {
        metric(
            s,
            &format!("corral_runs_forked_total{{zygote=\"{zygote}\"}}"),
        )
    };
    let expected = |n: usize| Some(if forkable { n as f64 } else { 0.0 });
    assert_eq!(
        (forked(&forks, "full"), forked(&forks, "lean")),
        (expected(full), expected(programs.len() - full)),
        "every run was served from a fork where cgroups are available, from the lean zygote \
         unless it imports a module outside the standard library"
    );
    assert_eq!(
        (forked(&fresh, "full"), forked(&fresh, "lean")),
        (Some(0.0), Some(0.0))
    );
    // Every fork has random streams of its own.
    let draws: Vec<Value> = (0..2)
        .map(|_| {
            let body = json!({"code": "import random\nprint(random.getrandbits(64))"});
            forks
                .call("POST", "/v1/run", None, Some(&body.to_string()))
                .1["stdout"]
                .clone()
        })
        .collect();
    assert_ne!(draws[0], draws[1]);
}

/// The bounds on rich results are settable per run and per session (`limits.result_mb`,
/// `limits.result_count`), and per server (`[default_limits]` in the config, for what a
/// request leaves out); what they drop is named in `warnings`.
#[test]
fn result_limits_are_set_per_run_per_session_and_per_server() {
    let three_plots = "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n\
                       for i in range(3):\n    plt.figure(); plt.plot([i, 1])\n";
    let dropped = |r: &Value| {
        r["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().starts_with("rich results"))
    };
    // Per server: one result kept unless a request says otherwise.
    let s = Server::start("default_image = \"host\"\n[default_limits]\nresult_count = 1\n");
    let (status, r) = s.call(
        "POST",
        "/v1/run",
        None,
        Some(&json!({ "code": three_plots }).to_string()),
    );
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["results"].as_array().unwrap().len(), 1, "{r}");
    assert!(dropped(&r), "{r}");
    // Per run: the request's own bound.
    let (_, r) = s.call(
        "POST",
        "/v1/run",
        None,
        Some(&json!({ "code": three_plots, "limits": {"result_count": 3} }).to_string()),
    );
    assert_eq!(r["results"].as_array().unwrap().len(), 3, "{r}");
    assert!(!dropped(&r), "{r}");
    let (_, r) = s.call(
        "POST",
        "/v1/run",
        None,
        Some(
            &json!({ "code": three_plots, "limits": {"result_mb": 0, "result_count": 3} })
                .to_string(),
        ),
    );
    assert_eq!(r["results"].as_array().unwrap().len(), 0, "{r}");
    assert!(dropped(&r), "{r}");
    // Per session.
    let (status, info) = s.call(
        "POST",
        "/v1/sandboxes",
        None,
        Some(&json!({"limits": {"result_count": 2}}).to_string()),
    );
    assert_eq!(status, 201, "{info}");
    let id = info["id"].as_str().unwrap().to_string();
    let three_tables = "from IPython.display import display, HTML\n\
                        for i in range(3): display(HTML(f'<b>{i}</b>'))";
    let (_, r) = s.execute(&id, None, three_tables);
    assert_eq!(r["results"].as_array().unwrap().len(), 2, "{r}");
    assert!(dropped(&r), "{r}");
}

/// The code policy through the API (docs/code-policy.md): the server's `[code_policy]` for
/// every key, `[key_code_policy.NAME]` instead of it for keys named NAME, and a request's
/// `policy` that can only narrow its key's (403 otherwise); runs and every execution of a
/// session are held to the result.
#[test]
fn a_keys_code_policy_holds_and_requests_can_only_narrow_it() {
    let s = Server::start(
        "default_image = \"host\"\npool_size = 1\n\
         [code_policy]\ndenied_modules = [\"socket\"]\nmax_code_bytes = 4096\n\
         [key_code_policy.analyst]\nallowed_modules = [\"json\", \"math\", \"numpy\"]\n",
    );
    let analyst = s.key("analyst");
    let other = s.key("other");
    let run =
        |key: Option<&str>, body: Value| s.call("POST", "/v1/run", key, Some(&body.to_string()));
    let violations = |r: &Value| r["error"]["violations"].clone();

    // The server's policy, for keyless use and for keys without one of their own.
    for key in [None, Some(other.as_str())] {
        let (status, r) = run(key, json!({"code": "print('ran')\nimport socket"}));
        assert_eq!(status, 200, "{r}");
        assert_eq!(
            (r["status"].as_str(), r["stdout"].as_str()),
            (Some("error"), Some(""))
        );
        assert_eq!(r["error"]["name"], "PolicyViolation");
        assert_eq!(
            violations(&r),
            json!([{"rule": "denied", "line": 2, "module": "socket"}])
        );
        let (_, r) = run(key, json!({"code": "#".repeat(4097)}));
        assert_eq!(
            violations(&r),
            json!([{"rule": "max_code_bytes", "line": null, "module": null}]),
            "{r}"
        );
    }
    // The analyst key's own policy instead: an allow-list (and no denied socket).
    let (_, r) = run(Some(&analyst), json!({"code": "import math, os"}));
    assert_eq!(
        violations(&r),
        json!([{"rule": "not_allowed", "line": 1, "module": "os"}]),
        "{r}"
    );
    let (_, r) = run(
        Some(&analyst),
        json!({"code": "import json\nprint(json.dumps(2))"}),
    );
    assert_eq!(
        (r["status"].as_str(), r["stdout"].as_str()),
        (Some("success"), Some("2\n"))
    );

    // A request narrows…
    let narrower = json!({"code": "import math", "policy": {"allowed_modules": ["json"]}});
    let (status, r) = run(Some(&analyst), narrower);
    assert_eq!(status, 200);
    assert_eq!(violations(&r)[0]["module"], "math", "{r}");
    // …never widens, and says what it would widen.
    for (key, policy, said) in [
        (
            Some(analyst.as_str()),
            json!({"allowed_modules": ["json", "requests"]}),
            "`requests` is not allowed by the policy in force (it allows only: json, math, numpy)",
        ),
        (
            None,
            json!({"allowed_modules": ["socket"]}),
            "`socket` is denied",
        ),
        (
            None,
            json!({"max_code_bytes": 5000}),
            "5000 is more than the 4096",
        ),
    ] {
        let (status, e) = run(key, json!({"code": "1", "policy": policy}));
        assert_eq!((status, error_code(&e)), (403, "forbidden"), "{e}");
        let message = e["error"]["message"].as_str().unwrap();
        assert!(message.contains(said), "{message}");
        assert!(
            message.starts_with("policy.allowed_modules")
                || message.starts_with("policy.max_code_bytes"),
            "{message}"
        );
    }
    // What cannot be a policy is a bad request naming the field.
    for (policy, said) in [
        (
            json!({"allowed_modules": ["os/path"]}),
            "policy.allowed_modules: \"os/path\" is not a module name",
        ),
        (json!({"denied_modules": [""]}), "policy.denied_modules"),
        (
            json!({"max_code_bytes": 0}),
            "policy.max_code_bytes must be between 1",
        ),
        (json!({"allowed": ["json"]}), "unknown field `allowed`"),
    ] {
        let (status, e) = run(None, json!({"code": "1", "policy": policy}));
        assert_eq!((status, error_code(&e)), (400, "bad_request"), "{e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(said),
            "{e}"
        );
    }
    // Bash has no modules: a request's module rules are refused, the key's do not apply.
    let (status, e) = run(
        None,
        json!({"code": "true", "language": "bash", "policy": {"denied_modules": ["x"]}}),
    );
    assert_eq!((status, error_code(&e)), (400, "bad_request"), "{e}");
    let (_, r) = run(
        Some(&analyst),
        json!({"code": "echo ok", "language": "bash"}),
    );
    assert_eq!(r["stdout"], "ok\n", "{r}");

    // A session: its policy is shown, and holds for every execution.
    let (status, info) = s.call(
        "POST",
        "/v1/sandboxes",
        Some(&analyst),
        Some(&json!({"policy": {"denied_modules": ["numpy"], "max_code_bytes": 64}}).to_string()),
    );
    assert_eq!(status, 201, "{info}");
    assert_eq!(
        info["policy"],
        json!({"allowed_modules": ["json", "math", "numpy"], "denied_modules": ["numpy"], "max_code_bytes": 64})
    );
    let id = info["id"].as_str().unwrap();
    assert_eq!(
        s.execute(id, Some(&analyst), "x = 1").1["status"],
        "success"
    );
    let (_, r) = s.execute(id, Some(&analyst), "x = 2\nimport numpy");
    assert_eq!(
        violations(&r),
        json!([{"rule": "denied", "line": 2, "module": "numpy"}]),
        "{r}"
    );
    let streamed = ureq::post(&format!("{}/v1/sandboxes/{id}/execute", s.url))
        .set("Authorization", &format!("Bearer {analyst}"))
        .send_string(&json!({"code": "print(x)\n__import__('nu' + 'mpy')"}).to_string())
        .unwrap()
        .into_string()
        .unwrap();
    let events: Vec<Value> = streamed
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let stdout: String = events
        .iter()
        .filter(|e| e["type"] == "stdout")
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    assert_eq!(stdout, "1\n", "x is still 1");
    let error = events.iter().find(|e| e["type"] == "error").unwrap();
    assert_eq!(
        error["violations"],
        json!([{"rule": "denied", "line": 2, "module": "numpy"}])
    );
    let (status, e) = s.call(
        "POST",
        "/v1/sandboxes",
        None,
        Some(&json!({"policy": {"max_code_bytes": 1_000_000}}).to_string()),
    );
    assert_eq!((status, error_code(&e)), (403, "forbidden"), "{e}");
    // The E2B face, whose SDKs have no policy field: the key's, as it is.
    let (status, made) = s.call("POST", "/v2/sandboxes", Some(&analyst), Some("{}"));
    assert_eq!(status, 201, "{made}");
    let id = made["sandboxID"].as_str().unwrap();
    let (_, info) = s.call("GET", &format!("/v1/sandboxes/{id}"), Some(&analyst), None);
    assert_eq!(
        info["policy"],
        json!({"allowed_modules": ["json", "math", "numpy"], "denied_modules": [], "max_code_bytes": null})
    );
}

/// Pause freezes every process of a session (a thread that ticks every 10 ms sees a gap as
/// long as the pause), refuses everything but inspecting, resuming and killing meanwhile, and
/// resume gives the session back with its state; a paused session is killed like any other.
/// For a Python session forked from the warm pool and a bash session in a sandbox of its own.
#[test]
fn pause_freezes_a_session_and_resume_gives_it_back() {
    let s = Server::start("pool_size = 1\ndefault_image = \"host\"");
    let path = |id: &str, rest: &str| format!("/v1/sandboxes/{id}{rest}");

    // Python: state kept across the pause, and no tick while paused.
    let id = s.create(None);
    let (status, r) = s.execute(
        &id,
        None,
        "import threading, time\n\
         gaps = [0.0]\n\
         def tick():\n\
         \x20   last = time.monotonic()\n\
         \x20   while True:\n\
         \x20       time.sleep(0.01)\n\
         \x20       now = time.monotonic()\n\
         \x20       gaps[0] = max(gaps[0], now - last)\n\
         \x20       last = now\n\
         threading.Thread(target=tick, daemon=True).start()\n\
         x = 41",
    );
    assert_eq!(
        (status, r["status"].as_str()),
        (200, Some("success")),
        "{r}"
    );
    let (status, info) = s.call("POST", &path(&id, "/pause"), None, None);
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["state"], "paused");
    assert!(info["paused_at"].is_string(), "{info}");
    let paused_at = Instant::now();

    // Meanwhile: inspecting works, everything else is 409 `sandbox_paused`.
    let (status, got) = s.call("GET", &path(&id, ""), None, None);
    assert_eq!((status, got["state"].as_str()), (200, Some("paused")));
    let (status, body) = s.execute(&id, None, "x");
    assert_eq!(
        (status, error_code(&body)),
        (409, "sandbox_paused"),
        "{body}"
    );
    let (status, body) = s.call(
        "POST",
        &path(&id, "/commands"),
        None,
        Some(r#"{"cmd":"true"}"#),
    );
    assert_eq!(
        (status, error_code(&body)),
        (409, "sandbox_paused"),
        "{body}"
    );
    let (status, body) = s.call("PUT", &path(&id, "/files/a.txt"), None, Some("a"));
    assert_eq!(
        (status, error_code(&body)),
        (409, "sandbox_paused"),
        "{body}"
    );
    let (status, body) = s.call("GET", &path(&id, "/files"), None, None);
    assert_eq!(
        (status, error_code(&body)),
        (409, "sandbox_paused"),
        "{body}"
    );
    let (status, body) = s.call("POST", &path(&id, "/pause"), None, None);
    assert_eq!(
        (status, error_code(&body)),
        (409, "sandbox_paused"),
        "{body}"
    );

    std::thread::sleep(Duration::from_millis(1000).saturating_sub(paused_at.elapsed()));
    let (status, info) = s.call("POST", &path(&id, "/resume"), None, None);
    let paused_for = paused_at.elapsed().as_secs_f64();
    assert_eq!(
        (status, info["state"].as_str()),
        (200, Some("running")),
        "{info}"
    );
    assert!(info.get("paused_at").is_none(), "{info}");
    let (status, r) = s.execute(&id, None, "print(x + 1, gaps[0])");
    assert_eq!(status, 200, "{r}");
    let out = r["stdout"].as_str().unwrap();
    let (answer, gap) = out.trim().split_once(' ').unwrap();
    assert_eq!(answer, "42", "{r}");
    let gap: f64 = gap.parse().unwrap();
    assert!(
        // Frozen for the whole pause (a loaded host may stretch the gap, never shorten it).
        gap >= 0.9 && gap <= paused_for + 3.0,
        "the ticking thread's longest gap was {gap:.3} s around a pause of {paused_for:.3} s"
    );
    let (status, body) = s.call("POST", &path(&id, "/resume"), None, None);
    assert_eq!(
        (status, error_code(&body)),
        (409, "sandbox_not_paused"),
        "{body}"
    );

    // A pause while an execution runs is refused; the execution is not disturbed.
    let (url, busy) = (s.url.clone(), id.clone());
    let running = std::thread::spawn(move || {
        ureq::post(&format!("{url}/v1/sandboxes/{busy}/execute"))
            .set("Accept", "application/json")
            .send_string(r#"{"code":"import time\ntime.sleep(1.5)\nprint('done')"}"#)
            .map(|r| r.into_json::<Value>().unwrap())
            .map_err(|e| e.to_string())
    });
    std::thread::sleep(Duration::from_millis(500));
    let (status, body) = s.call("POST", &path(&id, "/pause"), None, None);
    assert_eq!((status, error_code(&body)), (409, "sandbox_busy"), "{body}");
    assert_eq!(running.join().unwrap().unwrap()["stdout"], "done\n");

    // Bash, a sandbox of its own; killed while paused, nothing of it is left.
    let (status, info) = s.call(
        "POST",
        "/v1/sandboxes",
        None,
        Some(r#"{"image":"host","language":"bash"}"#),
    );
    assert_eq!(status, 201, "{info}");
    let bash = info["id"].as_str().unwrap().to_string();
    let (status, r) = s.execute(
        &bash,
        None,
        "v=7; cp /bin/sleep /tmp/pausedsh && /tmp/pausedsh 1000 &",
    );
    assert_eq!(status, 200, "{r}");
    let (status, info) = s.call("POST", &path(&bash, "/pause"), None, None);
    assert_eq!(
        (status, info["state"].as_str()),
        (200, Some("paused")),
        "{info}"
    );
    let (status, info) = s.call("POST", &path(&bash, "/resume"), None, None);
    assert_eq!(status, 200, "{info}");
    let (status, r) = s.execute(&bash, None, "echo $v");
    assert_eq!((status, r["stdout"].as_str()), (200, Some("7\n")), "{r}");

    // Killed while paused: nothing of either session is left (each named a process of its own
    // to be found by on the host).
    let (status, r) = s.execute(
        &id,
        None,
        "import ctypes\nprint(ctypes.CDLL(None).prctl(15, b'pausedpy', 0, 0, 0))",
    );
    assert_eq!((status, r["stdout"].as_str()), (200, Some("0\n")), "{r}");
    let named = || -> Vec<(i32, u64)> {
        descendants(s.pid())
            .into_iter()
            .filter(|(p, _)| {
                std::fs::read_to_string(format!("/proc/{p}/comm"))
                    .is_ok_and(|c| c.trim() == "pausedpy" || c.trim() == "pausedsh")
            })
            .collect()
    };
    // The bash job copies its program first: on a busy machine it may not have started yet.
    let mut marked = Vec::new();
    wait_until(
        "both sessions' named processes run",
        Duration::from_secs(30),
        || {
            marked = named();
            marked.len() == 2
        },
    );
    for id in [&id, &bash] {
        let (status, info) = s.call("POST", &path(id, "/pause"), None, None);
        assert_eq!(status, 200, "{info}");
        let (status, _) = s.call("DELETE", &path(id, ""), None, None);
        assert_eq!(status, 204);
    }
    wait_until(
        "the paused sessions' processes are gone",
        Duration::from_secs(5),
        || marked.iter().all(|(p, start)| !alive(*p, *start)),
    );
}

/// Listing filters by state, image and metadata and pages through the rest; metadata is kept
/// and bounded; metrics sample the session's own cgroup and workspace.
#[test]
fn sessions_are_listed_by_state_and_metadata_and_report_their_usage() {
    let s = Server::start("");
    let (a, b) = (s.key("a"), s.key("b"));
    let create = |key: &str, metadata: Value| {
        let body = json!({"image": "host", "metadata": metadata}).to_string();
        let (status, info) = s.call("POST", "/v1/sandboxes", Some(key), Some(&body));
        assert_eq!(status, 201, "{info}");
        assert_eq!(info["metadata"], metadata);
        info["id"].as_str().unwrap().to_string()
    };
    let one = create(&a, json!({"team": "data", "run": "1"}));
    let two = create(&a, json!({"team": "data", "run": "2"}));
    let three = create(&a, json!({"team": "web"}));
    create(&b, json!({"team": "data"}));
    let (status, _) = s.call(
        "POST",
        &format!("/v1/sandboxes/{two}/pause"),
        Some(&a),
        None,
    );
    assert_eq!(status, 200);

    let ids = |query: &str| -> (Vec<String>, Option<String>) {
        let (status, list) = s.call("GET", &format!("/v1/sandboxes{query}"), Some(&a), None);
        assert_eq!(status, 200, "{query}: {list}");
        let ids = list["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["id"].as_str().unwrap().to_string())
            .collect();
        (ids, list["next"].as_str().map(str::to_string))
    };
    assert_eq!(
        ids(""),
        (vec![one.clone(), two.clone(), three.clone()], None)
    );
    assert_eq!(ids("?metadata.team=data").0, [one.clone(), two.clone()]);
    assert_eq!(
        ids("?metadata.team=data&metadata.run=2").0,
        vec![two.clone()]
    );
    assert_eq!(ids("?state=paused").0, vec![two.clone()]);
    assert_eq!(ids("?state=running,dead").0, [one.clone(), three.clone()]);
    assert_eq!(ids("?image=host").0.len(), 3);
    assert_eq!(ids("?image=default").0, Vec::<String>::new());
    // Pages, each naming the next.
    let (page, next) = ids("?limit=2");
    assert_eq!(page, [one.clone(), two.clone()]);
    let next = next.expect("a second page");
    assert_eq!(
        ids(&format!("?limit=2&after={next}")),
        (vec![three.clone()], None)
    );
    for bad in [
        "?limit=0",
        "?limit=1001",
        "?limit=x",
        "?state=gone",
        "?colour=red",
    ] {
        let (status, body) = s.call("GET", &format!("/v1/sandboxes{bad}"), Some(&a), None);
        assert_eq!(
            (status, error_code(&body)),
            (400, "bad_request"),
            "{bad}: {body}"
        );
    }

    // Metadata is bounded.
    let many: serde_json::Map<String, Value> =
        (0..65).map(|i| (format!("k{i}"), json!("v"))).collect();
    for metadata in [
        Value::Object(many),
        json!({"": "v"}),
        json!({"k".repeat(129): "v"}),
        json!({"k": "v".repeat(1025)}),
    ] {
        let body = json!({"image": "host", "metadata": metadata}).to_string();
        let (status, answer) = s.call("POST", "/v1/sandboxes", Some(&a), Some(&body));
        assert_eq!(
            (status, error_code(&answer)),
            (400, "bad_request"),
            "{answer}"
        );
    }

    // Metrics: the session's own usage, the latest sample taken now.
    let (status, r) = s.execute(
        &one,
        Some(&a),
        "open('/workspace/blob', 'wb').write(b'x' * (8 << 20))\nkeep = bytearray(64 << 20)",
    );
    assert_eq!(status, 200, "{r}");
    let (status, m) = s.call(
        "GET",
        &format!("/v1/sandboxes/{one}/metrics"),
        Some(&a),
        None,
    );
    assert_eq!(status, 200, "{m}");
    let last = m["metrics"].as_array().unwrap().last().unwrap().clone();
    assert!(
        last["memory_used_bytes"].as_u64().unwrap() >= 64 << 20,
        "{last}"
    );
    assert_eq!(last["memory_limit_bytes"], 512u64 << 20);
    assert!(
        last["disk_used_bytes"].as_u64().unwrap() >= 8 << 20,
        "{last}"
    );
    assert_eq!(last["disk_total_bytes"], 256u64 << 20);
    assert_eq!(last["cpu_count"], 1);
    let (status, _) = s.call(
        "GET",
        &format!("/v1/sandboxes/{one}/metrics"),
        Some(&b),
        None,
    );
    assert_eq!(status, 404);
}

/// The network of `/v1/run`, sessions and the E2B face: a request within the operator's
/// `[network]` reaches its names through the sandbox's proxy and the result, the session's info,
/// the audit log and the metrics say what went through; one outside is 403
/// `network_not_allowed` naming the item; E2B's `allow_internet_access` takes the server's
/// default. The upstream is a server of the test's on loopback, which the operator opts in.
#[test]
fn network_requests_are_bounded_by_the_operator_and_audited() {
    let port = hello_upstream();
    let config = format!(
        "[network]\nallow = [\"localhost:{port}\", \"*.example.org\"]\n\
         allow_private = [\"localhost\"]\ndefault = [\"localhost:{port}\"]\n"
    );
    let server = Server::start(&config);
    let key = server.key("net");
    let fetch = format!(
        "import os, urllib.request\n\
         for k in ('NO_PROXY', 'no_proxy'): os.environ.pop(k)\n\
         print(urllib.request.urlopen('http://localhost:{port}/').read().decode())"
    );
    let body = json!({"code": fetch, "image": "host",
                      "network": {"allow": [format!("localhost:{port}")]}});
    let (status, r) = server.call("POST", "/v1/run", Some(&key), Some(&body.to_string()));
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdout"], "hello\n", "{r}");
    assert_eq!(r["network"]["connections"], 1, "{r}");

    // Outside the operator's list: refused before anything runs, naming the item.
    for network in [
        json!({"allow": ["evil.com"]}),
        json!({"allow": ["localhost:1"]}),
        json!({"cidrs": ["127.0.0.1/32"]}),
    ] {
        let body = json!({"code": "1", "image": "host", "network": network});
        let (status, e) = server.call("POST", "/v1/run", Some(&key), Some(&body.to_string()));
        assert_eq!(
            (status, error_code(&e)),
            (403, "network_not_allowed"),
            "{e}"
        );
    }
    let body = json!({"code": "1", "image": "host", "network": {"allow": ["10.0.0.1"]}});
    let (status, e) = server.call("POST", "/v1/run", Some(&key), Some(&body.to_string()));
    assert_eq!((status, error_code(&e)), (400, "bad_request"), "{e}");

    // A session with the default policy: its executions and its info report egress.
    let body = json!({"image": "host", "network": {"default": true}});
    let (status, info) = server.call("POST", "/v1/sandboxes", Some(&key), Some(&body.to_string()));
    assert_eq!(status, 201, "{info}");
    let id = info["id"].as_str().unwrap();
    let (_, r) = server.execute(id, Some(&key), &fetch);
    assert_eq!(r["stdout"], "hello\n", "{r}");
    assert_eq!(r["network"]["connections"], 1, "{r}");
    let (_, r) = server.execute(
        id,
        Some(&key),
        "import urllib.request\ntry:\n    urllib.request.urlopen('http://a.example.org/')\nexcept Exception as e:\n    print(e)",
    );
    assert!(
        r["stdout"]
            .as_str()
            .unwrap()
            .contains("is not on this sandbox's network allow-list"),
        "{r}"
    );
    assert_eq!(r["network"]["denied"], 1, "{r}");
    let (_, info) = server.call("GET", &format!("/v1/sandboxes/{id}"), Some(&key), None);
    assert_eq!(info["network"]["connections"], 1, "{info}");
    assert_eq!(info["network"]["denied"], 1, "{info}");
    let (_, plain) = server.call(
        "POST",
        "/v1/sandboxes",
        Some(&key),
        Some(r#"{"image":"host"}"#),
    );
    assert_eq!(plain["network"], Value::Null, "{plain}");

    // E2B: allow_internet_access takes the default; allowOut outside the list is refused.
    let e2b = |body: Value| {
        ureq::post(&format!("{}/v2/sandboxes", server.url))
            .set("X-API-Key", &key)
            .send_string(&body.to_string())
            .map(|r| r.status())
            .unwrap_or_else(|e| match e {
                ureq::Error::Status(s, _) => s,
                e => panic!("{e}"),
            })
    };
    assert_eq!(
        e2b(json!({"templateID": "host", "allow_internet_access": true})),
        201
    );
    let deny_all = json!(["0.0.0.0/0"]);
    assert_eq!(
        e2b(json!({"templateID": "host",
                   "network": {"allowOut": ["evil.com"], "denyOut": deny_all}})),
        403
    );
    // allowOut alone leaves all other traffic allowed on E2B: more than an allow-list gives.
    assert_eq!(
        e2b(json!({"templateID": "host", "network": {"allowOut": ["a.example.org"]}})),
        400
    );

    // Every decision is in the audit log (`GET /v1/audit/egress`, newest first) and the
    // metrics.
    let (status, page) = server.call("GET", "/v1/audit/egress", Some(&key), None);
    assert_eq!(status, 200, "{page}");
    let decisions: Vec<(&str, u64, &str, &str)> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["host"].as_str().unwrap(),
                e["port"].as_u64().unwrap(),
                e["decision"].as_str().unwrap(),
                e["reason"].as_str().unwrap(),
            )
        })
        .collect();
    let port = u64::from(port);
    assert_eq!(
        decisions,
        [
            ("a.example.org", 80, "denied", "not_allowed"),
            ("localhost", port, "allowed", ""),
            ("localhost", port, "allowed", ""),
        ],
        "{page}"
    );
    let session = page["entries"][0]["session_id"].as_str();
    assert_eq!(session, Some(id), "{page}");
    assert_eq!(
        page["entries"][2]["session_id"],
        Value::Null,
        "a one-shot run: {page}"
    );
    // Filtered by decision; another key sees none of them, and may not ask for this key's.
    let (_, denied) = server.call("GET", "/v1/audit/egress?decision=denied", Some(&key), None);
    assert_eq!(denied["entries"].as_array().unwrap().len(), 1, "{denied}");
    let other = server.key("other");
    let (status, theirs) = server.call("GET", "/v1/audit/egress", Some(&other), None);
    assert_eq!((status, &theirs["entries"]), (200, &json!([])), "{theirs}");
    let tenant = page["entries"][0]["key_id"].as_str().unwrap();
    let (status, _) = server.call(
        "GET",
        &format!("/v1/audit/egress?key={tenant}"),
        Some(&other),
        None,
    );
    assert_eq!(status, 403);
    let metrics = ureq::get(&format!("{}/metrics", server.url))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(
        metrics.contains("corral_egress_decisions_total{decision=\"allowed\",reason=\"\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("corral_egress_bytes_total{direction=\"down\"}"),
        "{metrics}"
    );
}

/// A server on the host's loopback that answers every request `200 hello`: its port.
fn hello_upstream() -> u16 {
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = upstream.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in upstream.incoming().flatten() {
            let mut conn = conn;
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
        }
    });
    port
}

/// `[key_network.NAME]` bounds the keys named NAME instead of `[network]`: key a (no table of
/// its own) reaches the upstream, key b (whose table names only `*.example.org`) is refused it
/// with 403 naming the host, before anything runs. The streamed `end` of an execution and of a
/// command carries the egress totals, as the folded result does.
#[test]
fn a_keys_network_table_bounds_that_key_and_streams_end_with_egress_totals() {
    let port = hello_upstream();
    let config = format!(
        "[network]\nallow = [\"localhost:{port}\", \"*.example.org\"]\n\
         allow_private = [\"localhost\"]\n\
         [key_network.b]\nallow = [\"*.example.org\"]\n"
    );
    let server = Server::start(&config);
    let (a, b) = (server.key("a"), server.key("b"));
    let fetch = format!(
        "import os, urllib.request\n\
         for k in ('NO_PROXY', 'no_proxy'): os.environ.pop(k, None)\n\
         print(urllib.request.urlopen('http://localhost:{port}/').read().decode())"
    );
    let run = |key: &str, allow: &str| {
        let body = json!({"code": fetch, "image": "host", "network": {"allow": [allow]}});
        server.call("POST", "/v1/run", Some(key), Some(&body.to_string()))
    };
    let upstream = format!("localhost:{port}");
    let (status, r) = run(&a, &upstream);
    assert_eq!(
        (status, r["stdout"].as_str()),
        (200, Some("hello\n")),
        "{r}"
    );
    let (status, e) = run(&b, &upstream);
    assert_eq!(
        (status, error_code(&e)),
        (403, "network_not_allowed"),
        "{e}"
    );
    let message = e["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("localhost") && message.contains("[key_network.b]"),
        "{message}"
    );
    // Key b's own table holds: within it, a session is made.
    let body = json!({"image": "host", "network": {"allow": ["api.example.org:443"]}});
    let (status, info) = server.call("POST", "/v1/sandboxes", Some(&b), Some(&body.to_string()));
    assert_eq!(status, 201, "{info}");
    // A session of key b's asking for the upstream is refused too.
    let body = json!({"image": "host", "network": {"allow": [upstream]}});
    let (status, e) = server.call("POST", "/v1/sandboxes", Some(&b), Some(&body.to_string()));
    assert_eq!(
        (status, error_code(&e)),
        (403, "network_not_allowed"),
        "{e}"
    );

    // Streamed: the end event of an execution and of a command says what went through.
    let body = json!({"image": "host", "network": {"allow": [upstream]}});
    let (status, info) = server.call("POST", "/v1/sandboxes", Some(&a), Some(&body.to_string()));
    assert_eq!(status, 201, "{info}");
    let id = info["id"].as_str().unwrap();
    let addr = server.url.trim_start_matches("http://");
    let stream = |path: &str, body: Value| {
        let path = format!("/v1/sandboxes/{id}/{path}");
        ndjson_as(addr, &path, Some(&a), &body.to_string())
    };
    let code = format!("open('fetch.py', 'w').write({fetch:?})\n{fetch}");
    let events = stream("execute", json!({ "code": code }));
    let end = events.last().unwrap();
    assert_eq!(end["type"], "end", "{events:?}");
    assert_eq!(end["network"]["connections"], 1, "{end}");
    assert!(end["network"]["bytes_down"].as_u64().unwrap() > 0, "{end}");
    let events = stream("commands", json!({"cmd": "python3 fetch.py"}));
    let end = events.last().unwrap();
    assert_eq!(
        (&end["type"], &end["exit_code"]),
        (&json!("end"), &json!(0)),
        "{events:?}"
    );
    assert_eq!(end["network"]["connections"], 1, "{end}");
    // A session without a network policy ends its stream with `network: null`.
    let plain = server.create(Some(&a));
    let path = format!("/v1/sandboxes/{plain}/execute");
    let events = ndjson_as(addr, &path, Some(&a), r#"{"code": "1"}"#);
    let end = events.last().unwrap();
    assert_eq!(
        (&end["type"], &end["network"]),
        (&json!("end"), &Value::Null),
        "{end}"
    );
}

/// A `filesystem.Filesystem` Connect call (unary, JSON) on the E2B sandbox plane.
fn filesystem_rpc(s: &Server, method: &str, id: &str, token: &str, body: Value) -> (u16, Value) {
    let response = ureq::post(&format!("{}/filesystem.Filesystem/{method}", s.url))
        .set("E2b-Sandbox-Id", id)
        .set("X-Access-Token", token)
        .set("Content-Type", "application/json")
        .send_string(&body.to_string());
    match response {
        Ok(r) | Err(ureq::Error::Status(_, r)) => {
            (r.status(), r.into_json().unwrap_or(Value::Null))
        }
        Err(e) => panic!("{method}: {e}"),
    }
}

#[test]
fn e2b_filesystem_calls_stay_with_their_key_and_in_the_workspace() {
    let s = Server::start("max_sessions_per_key = 2");
    let (a, b) = (s.key("a"), s.key("b"));
    let id = s.create(Some(&a));
    let connect = |id: &str, key: &str| {
        s.call(
            "POST",
            &format!("/v2/sandboxes/{id}/connect"),
            Some(key),
            None,
        )
    };
    let (status, described) = connect(&id, &a);
    assert_eq!(status, 200, "{described}");
    let token = described["envdAccessToken"].as_str().unwrap().to_string();

    // Another key cannot get the sandbox's token, and its own token does not open it.
    let (status, _) = connect(&id, &b);
    assert_eq!(status, 404);
    let other = s.create(Some(&b));
    let (_, theirs) = connect(&other, &b);
    let other_token = theirs["envdAccessToken"].as_str().unwrap().to_string();
    let _ = s.execute(&id, Some(&a), "open('mine.txt', 'w').write('mine')");
    for (method, body) in [
        ("Stat", json!({"path": "mine.txt"})),
        ("ListDir", json!({"path": "/home/user"})),
        ("MakeDir", json!({"path": "theirs"})),
        (
            "Move",
            json!({"source": "mine.txt", "destination": "taken.txt"}),
        ),
        ("Remove", json!({"path": "mine.txt"})),
        ("CreateWatcher", json!({"path": "."})),
    ] {
        for presented in [other_token.as_str(), "", "x"] {
            let (status, answer) = filesystem_rpc(&s, method, &id, presented, body.clone());
            assert_eq!(status, 502, "{method}: {answer}");
        }
    }
    // A watcher of one sandbox is not found through another.
    let (status, made) = filesystem_rpc(&s, "CreateWatcher", &id, &token, json!({"path": "."}));
    assert_eq!(status, 200, "{made}");
    let watcher = made["watcherId"].clone();
    for method in ["GetWatcherEvents", "RemoveWatcher"] {
        let (status, answer) = filesystem_rpc(
            &s,
            method,
            &other,
            &other_token,
            json!({"watcherId": watcher}),
        );
        assert_eq!(
            (status, &answer["code"]),
            (404, &json!("not_found")),
            "{answer}"
        );
    }
    let (_, listed) = filesystem_rpc(&s, "ListDir", &id, &token, json!({"path": "."}));
    let names: Vec<&str> = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["mine.txt"], "{listed}");

    // The sandbox plants links to a host file and a host directory.
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("secret.txt"), "HOST-SECRET").unwrap();
    let plant = format!(
        "import os\nos.symlink({0:?}, 'file-link')\nos.symlink({1:?}, 'dir-link')\n\
         os.mkdir('d')\nos.symlink({1:?}, 'd/inner')\nos.symlink('/', 'd/root')\nprint('planted')",
        host.path().join("secret.txt").display().to_string(),
        host.path().display().to_string(),
    );
    let (_, planted) = s.execute(&id, Some(&a), &plant);
    assert_eq!(planted["stdout"], "planted\n", "{planted}");
    let call = |method: &str, body: Value| filesystem_rpc(&s, method, &id, &token, body);

    let (status, info) = call("Stat", json!({"path": "file-link"}));
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["entry"]["type"], "FILE_TYPE_SYMLINK", "{info}");
    assert_eq!(
        info["entry"]["size"],
        json!(host.path().join("secret.txt").as_os_str().len().to_string()),
        "the link's own size: {info}"
    );
    let (status, listed) = call("ListDir", json!({"path": ".", "depth": 10}));
    assert_eq!(status, 200, "{listed}");
    let paths: Vec<&str> = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            "/workspace/d",
            "/workspace/d/inner",
            "/workspace/d/root",
            "/workspace/dir-link",
            "/workspace/file-link",
            "/workspace/mine.txt"
        ],
        "{listed}"
    );
    for (method, body) in [
        ("Stat", json!({"path": "dir-link/secret.txt"})),
        ("Stat", json!({"path": "d/root/etc/passwd"})),
        ("Stat", json!({"path": "/etc/passwd"})),
        ("ListDir", json!({"path": "dir-link"})),
        ("ListDir", json!({"path": "d/root/etc"})),
        ("MakeDir", json!({"path": "dir-link/planted"})),
        (
            "Move",
            json!({"source": "dir-link/secret.txt", "destination": "stolen"}),
        ),
        (
            "Move",
            json!({"source": "mine.txt", "destination": "dir-link/planted"}),
        ),
        (
            "Move",
            json!({"source": "mine.txt", "destination": "/tmp/planted"}),
        ),
        ("Remove", json!({"path": "dir-link/secret.txt"})),
        ("Remove", json!({"path": "d/root/etc/passwd"})),
        ("CreateWatcher", json!({"path": "dir-link"})),
    ] {
        let (status, answer) = call(method, body.clone());
        assert_eq!(
            (status, &answer["code"]),
            (400, &json!("invalid_argument")),
            "{method} {body}: {answer}"
        );
    }
    // A rename never replaces, even a link: the link stays as it was.
    let (status, answer) = call(
        "Move",
        json!({"source": "mine.txt", "destination": "file-link"}),
    );
    assert_eq!(
        (status, &answer["code"]),
        (409, &json!("already_exists")),
        "{answer}"
    );
    // Removing the links, and a directory holding links, removes the links only.
    for path in ["file-link", "dir-link", "d"] {
        let (status, answer) = call("Remove", json!({"path": path}));
        assert_eq!(status, 200, "{path}: {answer}");
    }
    let (_, listed) = call("ListDir", json!({"path": "."}));
    assert_eq!(listed["entries"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(
        std::fs::read_to_string(host.path().join("secret.txt")).unwrap(),
        "HOST-SECRET"
    );
    assert_eq!(std::fs::read_dir(host.path()).unwrap().count(), 1);
    assert!(Path::new("/etc/passwd").exists());
}

/// Where `cpu_weight` lands: the `corral` parent's `cpu.shares` (v1) or `cpu.weight` (v2), with
/// the value it takes for a weight of 150; `None` without a `cpu` controller.
fn cpu_weight_file() -> Option<(PathBuf, &'static str)> {
    use corral_sandbox::cgroup::Layout;
    match Layout::detect()? {
        Layout::V1(list) => list
            .iter()
            .find(|(c, _)| c == "cpu")
            .map(|(_, mount)| (mount.join("corral/cpu.shares"), "1536")),
        Layout::V2(mount) => Some((mount.join("corral/cpu.weight"), "150")),
    }
}

#[test]
fn the_cpu_weight_is_set_on_the_corral_parent_or_the_server_refuses_to_start() {
    // Out of range: the server does not start, and says why.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("c.toml"), "cpu_weight = 0\n").unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(dir.path().join("c.toml"))
        .arg("--db")
        .arg(dir.path().join("corral.db"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cpu_weight: 0 is not within 1..=10000"),
        "{stderr}"
    );

    // In range: set where this user may set it (as root always, given a cpu controller);
    // elsewhere the server refuses to start rather than run unweighted.
    let Some((file, expected)) = cpu_weight_file() else {
        return;
    };
    let before = std::fs::read_to_string(&file).unwrap_or_default();
    struct Restore(PathBuf, String);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = std::fs::write(&self.0, self.1.trim());
        }
    }
    let _restore = Restore(file.clone(), before);
    let port = free_port();
    std::fs::write(
        dir.path().join("c.toml"),
        "cpu_weight = 150\npool_size = 0\n",
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--config",
        ])
        .arg(dir.path().join("c.toml"))
        .arg("--db")
        .arg(dir.path().join("corral.db"))
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let started = loop {
        if child.try_wait().unwrap().is_some() {
            break false;
        }
        if ureq::get(&format!("http://127.0.0.1:{port}/healthz"))
            .call()
            .is_ok()
        {
            break true;
        }
        assert!(
            Instant::now() < deadline,
            "the server neither started nor stopped"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    if started {
        assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), expected);
        child.kill().unwrap();
        child.wait().unwrap();
    } else {
        assert!(!nix::unistd::geteuid().is_root(), "root can set the weight");
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert!(stderr.contains("cpu_weight: "), "{stderr}");
    }
}

/// A paused sandbox survives a graceful restart (crate::persist of corral-server): after
/// SIGTERM and a new server on the same database, it is listed as paused under its id, to its
/// owner only; a resume gives a fresh kernel (`memory: not kept`) on its files with its
/// settings; what was saved is gone once resumed, and a deleted saved sandbox leaves nothing.
/// Saved sandboxes count against the key's sandbox limit.
#[test]
fn a_paused_sandbox_survives_a_restart_with_its_files() {
    let dir = tempfile::tempdir().unwrap();
    // World-readable, as `/var/lib/corral` is.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let saved_dir = dir.path().join("corral.db.saved");
    let mut s = Server::start_in(dir, "shutdown_grace_s = 2");
    let (key_a, key_b) = (s.key("A"), s.key("B"));
    let body = r#"{"image":"host","env":{"KEPT_ENV":"yes"},"metadata":{"team":"x"},"limits":{"disk_mb":64}}"#;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (status, info) = s.call("POST", "/v1/sandboxes", Some(&key_a), Some(body));
        assert_eq!(status, 201, "{info}");
        ids.push(info["id"].as_str().unwrap().to_string());
    }
    let (kept, deleted) = (ids[0].clone(), ids[1].clone());
    let (status, out) = s.execute(
        &kept,
        Some(&key_a),
        "import os\nos.makedirs('deep/er', exist_ok=True)\n\
         open('deep/er/data.txt', 'w').write('saved bytes')\nlost = 42",
    );
    assert_eq!(status, 200, "{out}");
    for id in &ids {
        let (status, info) = s.call(
            "POST",
            &format!("/v1/sandboxes/{id}/pause"),
            Some(&key_a),
            None,
        );
        assert_eq!(status, 200, "{info}");
    }
    let pid = s.pid();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(s.child.wait().unwrap().success());
    assert_eq!(cgroups_of(pid), Vec::<PathBuf>::new());
    let saved_file = saved_dir.join(&kept).join("deep/er/data.txt");
    assert!(saved_file.is_file());
    // No other local user reads a tenant's saved files.
    let mode = std::fs::metadata(&saved_dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "{mode:o}");
    if nix::unistd::geteuid().is_root() {
        let read = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"])
            .arg(&saved_file)
            .output()
            .unwrap();
        assert!(!read.status.success(), "nobody read {saved_file:?}");
        assert!(!String::from_utf8_lossy(&read.stdout).contains("saved bytes"));
    }

    let dir = std::mem::replace(&mut s._dir, tempfile::tempdir().unwrap());
    drop(s);
    let s = Server::start_in(dir, "max_sessions_per_key = 2");
    // Listed as paused, to its owner only.
    let (status, info) = s.call("GET", &format!("/v1/sandboxes/{kept}"), Some(&key_a), None);
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["state"], "paused", "{info}");
    assert_eq!(info["memory"], "not kept", "{info}");
    assert_eq!(info["metadata"]["team"], "x", "{info}");
    let (_, list) = s.call("GET", "/v1/sandboxes", Some(&key_a), None);
    let listed: Vec<&str> = list["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["id"].as_str())
        .collect();
    assert!(
        listed.contains(&kept.as_str()) && listed.contains(&deleted.as_str()),
        "{list}"
    );
    for (method, path) in [
        ("GET", format!("/v1/sandboxes/{kept}")),
        ("POST", format!("/v1/sandboxes/{kept}/resume")),
        ("DELETE", format!("/v1/sandboxes/{kept}")),
    ] {
        let (status, answer) = s.call(method, &path, Some(&key_b), None);
        assert_eq!(status, 404, "B: {method} {path}: {answer}");
    }
    let (_, list_b) = s.call("GET", "/v1/sandboxes", Some(&key_b), None);
    assert_eq!(list_b["sandboxes"], json!([]), "{list_b}");
    // Saved sandboxes count against the key's limit as live ones do, so that restarts cannot
    // pile them up on the host's disk.
    let (status, answer) = s.call(
        "POST",
        "/v1/sandboxes",
        Some(&key_a),
        Some(r#"{"image":"host"}"#),
    );
    assert_eq!(status, 429, "{answer}");
    // Paused until resumed: no execution.
    let (status, answer) = s.execute(&kept, Some(&key_a), "1");
    assert_eq!(status, 409, "{answer}");
    assert_eq!(error_code(&answer), "sandbox_paused");

    let (status, info) = s.call(
        "POST",
        &format!("/v1/sandboxes/{kept}/resume"),
        Some(&key_a),
        None,
    );
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["id"], kept.as_str());
    assert_eq!(info["state"], "running", "{info}");
    assert_eq!(info["memory"], "not kept", "{info}");
    assert_eq!(info["limits"]["disk_mb"], 64, "{info}");
    let (status, out) = s.execute(
        &kept,
        Some(&key_a),
        "import os\nprint(open('deep/er/data.txt').read(), os.environ.get('KEPT_ENV'), 'lost' in globals())",
    );
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["stdout"], "saved bytes yes False\n", "{out}");
    assert!(
        !saved_dir.join(&kept).exists(),
        "the saved files outlived the resume"
    );
    // A second resume: it runs.
    let (status, _) = s.call(
        "POST",
        &format!("/v1/sandboxes/{kept}/resume"),
        Some(&key_a),
        None,
    );
    assert_eq!(status, 409);

    // A saved sandbox deleted: its files go with it.
    assert!(saved_dir.join(&deleted).exists());
    let (status, _) = s.call(
        "DELETE",
        &format!("/v1/sandboxes/{deleted}"),
        Some(&key_a),
        None,
    );
    assert_eq!(status, 204);
    assert!(!saved_dir.join(&deleted).exists());
    let (status, _) = s.call(
        "GET",
        &format!("/v1/sandboxes/{deleted}"),
        Some(&key_a),
        None,
    );
    assert_eq!(status, 404);
    // Its place under the key's limit is free again.
    let (status, answer) = s.call(
        "POST",
        "/v1/sandboxes",
        Some(&key_a),
        Some(r#"{"image":"host"}"#),
    );
    assert_eq!(status, 201, "{answer}");
}

/// A saved sandbox paused longer than `max_paused_s` is deleted at the next start, files and
/// all.
#[test]
fn a_saved_sandbox_expires_across_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let saved_dir = dir.path().join("corral.db.saved");
    let mut s = Server::start_in(dir, "shutdown_grace_s = 2\nmax_paused_s = 1");
    let id = s.create(None);
    s.execute(&id, None, "open('f', 'w').write('x')");
    let (status, _) = s.call("POST", &format!("/v1/sandboxes/{id}/pause"), None, None);
    assert_eq!(status, 200);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(s.pid()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(s.child.wait().unwrap().success());
    assert!(saved_dir.join(&id).exists());
    std::thread::sleep(Duration::from_millis(2100));
    let dir = std::mem::replace(&mut s._dir, tempfile::tempdir().unwrap());
    drop(s);
    let s = Server::start_in(dir, "max_paused_s = 1");
    let (status, _) = s.call("GET", &format!("/v1/sandboxes/{id}"), None, None);
    assert_eq!(status, 404);
    assert!(!saved_dir.join(&id).exists());
}

/// A session of `s` on the host image (with the request's other `fields`, JSON), which ran
/// `code`, paused.
fn paused_session(s: &Server, key: Option<&str>, fields: &str, code: &str) -> String {
    let body = format!(r#"{{"image":"host"{fields}}}"#);
    let (status, info) = s.call("POST", "/v1/sandboxes", key, Some(&body));
    assert_eq!(status, 201, "{info}");
    let id = info["id"].as_str().unwrap().to_string();
    let (status, out) = s.execute(&id, key, code);
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["error"], Value::Null, "{out}");
    let (status, info) = s.call("POST", &format!("/v1/sandboxes/{id}/pause"), key, None);
    assert_eq!(status, 200, "{info}");
    id
}

/// Resumes `id` (200) and answers what `code` prints in it, with the resume's answer.
fn resume_and_print(s: &Server, key: Option<&str>, id: &str, code: &str) -> (Value, String) {
    let (status, info) = s.call("POST", &format!("/v1/sandboxes/{id}/resume"), key, None);
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["state"], "running", "{info}");
    let (status, out) = s.execute(id, key, code);
    assert_eq!(status, 200, "{out}");
    (info, out["stdout"].as_str().unwrap_or_default().to_string())
}

/// The warnings of a sandbox's info, joined.
fn warnings_of(info: &Value) -> String {
    info["warnings"]
        .as_array()
        .map(|w| {
            w.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// Where sandbox `id`'s files were saved beside the database in `root`: `corral.db.saved/`
/// (`saved-sandboxes/` before issue 31).
fn saved_files(root: &Path, id: &str) -> PathBuf {
    ["corral.db.saved", "saved-sandboxes"]
        .iter()
        .map(|d| root.join(d).join(id))
        .find(|p| p.is_dir())
        .unwrap_or_else(|| panic!("no saved files of {id}"))
}

/// Bytes the host's disk holds for the files and directories below `dir` (st_blocks).
fn allocated_below(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let meta = std::fs::symlink_metadata(entry.path()).unwrap();
        total += meta.blocks() * 512;
        if meta.is_dir() {
            total += allocated_below(&entry.path());
        }
    }
    total
}

/// Issue 31: two servers in one directory (`--db n1.db`, `--db n2.db`, as docs/scale-out.md's
/// nodes may be) each keep their own paused sandboxes across a restart: the start of one
/// never removes what the other saved, and both resume with their files.
#[test]
fn two_servers_in_one_directory_keep_their_own_saved_sandboxes() {
    let shared = tempfile::tempdir().unwrap();
    let start = |name: &str| {
        Server::start_on_db(
            tempfile::tempdir().unwrap(),
            shared.path().join(name),
            "shutdown_grace_s = 2",
        )
    };
    let (n1, n2) = (start("n1.db"), start("n2.db"));
    let write = |who: &str| format!("open('mine.txt', 'w').write('of {who}')");
    let id1 = paused_session(&n1, None, "", &write("n1"));
    let id2 = paused_session(&n2, None, "", &write("n2"));
    // Both stop, then both start again: the second start must not take the first's files
    // for strays.
    let mut n1 = n1;
    let mut n2 = n2;
    n1.stop_gracefully();
    n2.stop_gracefully();
    let (db1, db2) = (n1.db.clone(), n2.db.clone());
    drop((n1, n2));
    let n1 = Server::start_on_db(tempfile::tempdir().unwrap(), db1, "");
    let n2 = Server::start_on_db(tempfile::tempdir().unwrap(), db2, "");
    let read = "print(open('mine.txt').read())";
    for (s, id, who) in [(&n1, &id1, "n1"), (&n2, &id2, "n2")] {
        let (status, info) = s.call("GET", &format!("/v1/sandboxes/{id}"), None, None);
        assert_eq!(status, 200, "{who}: {info}");
        assert_eq!(warnings_of(&info), "", "{who}: {info}");
        let (_, out) = resume_and_print(s, None, id, read);
        assert_eq!(out, format!("of {who}\n"), "{who}");
    }
    // Neither lists the other's.
    let (status, _) = n1.call("GET", &format!("/v1/sandboxes/{id2}"), None, None);
    assert_eq!(status, 404);
}

/// Issue 31: a saved sandbox whose files are gone (removed while the server was down, or
/// while it runs) is listed as paused with a warning that its files are lost, and resumes
/// on an empty workspace with that warning: never a 500, never stuck.
#[test]
fn a_saved_sandbox_whose_files_are_gone_resumes_empty_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let s = Server::start_in(dir, "shutdown_grace_s = 2");
    let code = "open('f.txt', 'w').write('x')";
    let before = paused_session(&s, None, "", code);
    let after = paused_session(&s, None, "", code);
    let remove = |id: &str| std::fs::remove_dir_all(saved_files(&root, id)).unwrap();
    let mut s = s;
    s.stop_gracefully();
    remove(&before);
    let s = s.started_again("");
    remove(&after);
    let (_, list) = s.call("GET", "/v1/sandboxes", None, None);
    let listed: Vec<&Value> = list["sandboxes"].as_array().unwrap().iter().collect();
    assert_eq!(listed.len(), 2, "{list}");
    let (status, info) = s.call("GET", &format!("/v1/sandboxes/{before}"), None, None);
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["state"], "paused", "{info}");
    assert!(warnings_of(&info).contains("files are lost"), "{info}");
    for id in [&before, &after] {
        let (info, out) = resume_and_print(&s, None, id, "import os\nprint(os.listdir('.'))");
        assert!(
            warnings_of(&info).contains("files are lost"),
            "{id}: {info}"
        );
        assert_eq!(info["memory"], "not kept", "{info}");
        assert_eq!(out, "[]\n", "{id}");
    }
}

/// Issue 31: a paused sandbox's sparse file is saved sparse (a 2 GiB file of a few bytes
/// takes a few blocks of the host's disk, not 2 GiB, and no time) and comes back with its
/// size and data, in a sandbox of 64 MiB of memory.
#[test]
fn a_sparse_file_is_saved_and_restored_sparse() {
    use std::os::unix::fs::MetadataExt as _;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let s = Server::start_in(dir, "shutdown_grace_s = 2");
    let id = paused_session(
        &s,
        None,
        r#","language":"bash","limits":{"memory_mb":64,"disk_mb":4096}"#,
        "printf head > big\nprintf middle | dd of=big bs=1 seek=1073741824 conv=notrunc 2>/dev/null\n\
         truncate -s 2G big",
    );
    let s = s.restarted("");
    let saved = saved_files(&root, &id).join("big");
    let meta = std::fs::symlink_metadata(&saved).unwrap();
    assert_eq!(meta.len(), 2 << 30);
    assert!(
        meta.blocks() * 512 <= 1 << 20,
        "{} bytes",
        meta.blocks() * 512
    );
    let (info, out) = resume_and_print(
        &s,
        None,
        &id,
        "stat -c %s big; head -c 4 big; echo\n\
         dd if=big bs=1 skip=1073741824 count=6 2>/dev/null; echo\n\
         echo $(( $(stat -c '%b*%B' big) < 1048576 ))",
    );
    assert_eq!(warnings_of(&info), "", "{info}");
    assert_eq!(out, "2147483648\nhead\nmiddle\n1\n");
}

/// Issue 31: saved sandboxes share a budget of the host's disk (`saved_disk_bytes`; a key at
/// most `saved_disk_bytes_per_key` of it). A file beyond it is left out whole, named in the
/// sandbox's warnings before and after the resume; the rest is saved, and the host's disk
/// holds no more than the budget.
#[test]
fn saved_sandboxes_stay_within_their_disk_budget() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let config =
        "shutdown_grace_s = 2\nsaved_disk_bytes = 4194304\nsaved_disk_bytes_per_key = 2097152";
    let s = Server::start_in(dir, config);
    let (key_a, key_b) = (s.key("A"), s.key("B"));
    let write = |name: &str, bytes: usize| {
        format!("import os\nopen('{name}', 'wb').write(os.urandom({bytes}))")
    };
    let a = paused_session(
        &s,
        Some(&key_a),
        "",
        &format!(
            "{}\n{}",
            write("over.bin", 3 << 20),
            write("fits.bin", 1536 << 10)
        ),
    );
    let b = paused_session(&s, Some(&key_b), "", &write("b.bin", 1536 << 10));
    let s = s.restarted(config);
    let saved = root.join("corral.db.saved");
    let used = allocated_below(&saved);
    assert!(used <= 4 << 20, "{used} bytes on the host's disk");
    assert!(used >= 3 << 20, "{used}: what fits was saved");

    let (status, info) = s.call("GET", &format!("/v1/sandboxes/{a}"), Some(&key_a), None);
    assert_eq!(status, 200, "{info}");
    let warned = warnings_of(&info);
    assert!(
        warned.contains("over.bin") && warned.contains("not saved"),
        "{info}"
    );
    assert!(!warned.contains("fits.bin"), "{info}");
    let ls = "import os\nprint(sorted((n, os.path.getsize(n)) for n in os.listdir('.')))";
    let (info, out) = resume_and_print(&s, Some(&key_a), &a, ls);
    assert!(warnings_of(&info).contains("over.bin"), "{info}");
    assert_eq!(out, "[('fits.bin', 1572864)]\n");
    let (info, out) = resume_and_print(&s, Some(&key_b), &b, ls);
    assert_eq!(warnings_of(&info), "", "{info}");
    assert_eq!(out, "[('b.bin', 1572864)]\n");
}

/// Issue 31: a graceful stop spends at most `shutdown_save_s` saving paused sandboxes; with
/// none, the sandbox is saved without its files, and its warnings say so.
#[test]
fn saving_stops_when_its_time_is_up() {
    let s = Server::start("shutdown_grace_s = 2\nshutdown_save_s = 0");
    let id = paused_session(&s, None, "", "open('late.txt', 'w').write('x')");
    let s = s.restarted("");
    let (status, info) = s.call("GET", &format!("/v1/sandboxes/{id}"), None, None);
    assert_eq!(status, 200, "{info}");
    assert!(
        warnings_of(&info).contains("time for the copy ran out"),
        "{info}"
    );
    let (info, out) = resume_and_print(&s, None, &id, "import os\nprint(os.listdir('.'))");
    assert!(
        warnings_of(&info).contains("time for the copy ran out"),
        "{info}"
    );
    assert_eq!(out, "[]\n");
}

/// Runs `cmd args` through session `id`'s process agent (`POST …/processes`): its exit code
/// and its stdout; panics with the answer when the program does not start.
fn run_process(s: &Server, key: Option<&str>, id: &str, cmd: &str, args: &[&str]) -> (i64, String) {
    use base64::Engine;
    let body = json!({"cmd": cmd, "args": args}).to_string();
    let (status, bytes) = s.raw(
        "POST",
        &format!("/v1/sandboxes/{id}/processes"),
        key,
        Some(body.as_bytes()),
    );
    let text = String::from_utf8_lossy(&bytes).into_owned();
    assert_eq!(status, 200, "{cmd} in {id}: {text}");
    let (mut stdout, mut exit) = (Vec::new(), None);
    for line in text.lines() {
        let event: Value = serde_json::from_str(line).unwrap();
        match event["type"].as_str() {
            Some("stdout") => stdout.extend(
                base64::engine::general_purpose::STANDARD
                    .decode(event["data"].as_str().unwrap())
                    .unwrap(),
            ),
            Some("end") => exit = event["exit_code"].as_i64(),
            _ => {}
        }
    }
    (
        exit.unwrap_or_else(|| panic!("no end: {text}")),
        String::from_utf8(stdout).unwrap(),
    )
}

/// Issue 22: every sandbox has a process agent, not only sessions forked from the zygote.
/// On a server without a warm pool, Python, JavaScript and bash sessions each run programs
/// beside their kernel, in their own sandbox (the session's uid, workspace, environment and
/// files); so does a session after a kernel restart, and one resumed after a server restart
/// (`memory: not kept`). The session's code sees the program's files and the program the
/// session's; code contexts of another language start there too.
#[test]
fn sandboxes_of_their_own_run_processes() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start_in(dir, "shutdown_grace_s = 2");
    let key = s.key("A");
    let key = Some(key.as_str());
    let check = |s: &Server, id: &str, what: &str| {
        let (code, out) = run_process(
            s,
            key,
            id,
            "sh",
            &["-c", "echo $AGENT_ENV; id -u; pwd; cat from-kernel.txt"],
        );
        assert_eq!(
            (code, out.as_str()),
            (0, "yes\n1000\n/workspace\nkernel"),
            "{what}"
        );
        let (code, _) = run_process(s, key, id, "sh", &["-c", "echo agent > from-agent.txt"]);
        assert_eq!(code, 0, "{what}");
    };
    let mut ids = Vec::new();
    for (language, write, read) in [
        (
            "python",
            "open('from-kernel.txt', 'w').write('kernel')",
            "print(open('from-agent.txt').read().strip())",
        ),
        (
            "javascript",
            "require('fs').writeFileSync('from-kernel.txt', 'kernel')",
            "console.log(require('fs').readFileSync('from-agent.txt', 'utf8').trim())",
        ),
        (
            "bash",
            "printf kernel > from-kernel.txt",
            "cat from-agent.txt",
        ),
    ] {
        let body = json!({"image": "host", "language": language, "env": {"AGENT_ENV": "yes"}});
        let (status, info) = s.call("POST", "/v1/sandboxes", key, Some(&body.to_string()));
        assert_eq!(status, 201, "{info}");
        let id = info["id"].as_str().unwrap().to_string();
        let (status, out) = s.execute(&id, key, write);
        assert_eq!((status, &out["status"]), (200, &json!("success")), "{out}");
        check(&s, &id, language);
        let (status, out) = s.execute(&id, key, read);
        assert_eq!(status, 200, "{out}");
        assert_eq!(out["stdout"], "agent\n", "{language}: {out}");
        // Its agent starts code contexts of any language, as a forked session's does.
        let other = if language == "bash" { "python" } else { "bash" };
        let code = if other == "bash" {
            "echo 42"
        } else {
            "print(6 * 7)"
        };
        let body = json!({"code": code, "language": other}).to_string();
        let (status, out) = s.call(
            "POST",
            &format!("/v1/sandboxes/{id}/execute"),
            key,
            Some(&body),
        );
        assert_eq!(
            (status, &out["stdout"]),
            (200, &json!("42\n")),
            "{language}: {out}"
        );

        // A kernel restart makes a kernel of its own sandbox: it has an agent too.
        let (status, info) = s.call("POST", &format!("/v1/sandboxes/{id}/restart"), key, None);
        assert_eq!(status, 200, "{info}");
        check(&s, &id, &format!("{language} after a restart"));
        ids.push(id);
    }

    // Paused, the server restarted, resumed: a fresh kernel on the saved files, with an agent.
    let paused = ids[0].clone();
    let (status, info) = s.call("POST", &format!("/v1/sandboxes/{paused}/pause"), key, None);
    assert_eq!(status, 200, "{info}");
    let pid = s.pid();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(s.child.wait().unwrap().success());
    let dir = std::mem::replace(&mut s._dir, tempfile::tempdir().unwrap());
    drop(s);
    let s = Server::start_in(dir, "");
    let (status, info) = s.call("POST", &format!("/v1/sandboxes/{paused}/resume"), key, None);
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["memory"], "not kept", "{info}");
    check(&s, &paused, "resumed after a server restart");
}
