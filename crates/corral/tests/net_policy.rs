//! `corral run --net-policy FILE` (docs/network.md, docs/cli.md): a network policy read from a
//! TOML file, or JSON when the name ends in `.json`, gives the program what its lists allow,
//! through the sandbox's proxy, and refuses the rest; `--net-allow-private` adds to the file's
//! own opt-ins; a file that is not a policy is refused before anything runs, saying why. The upstream is a
//! server of the test's on the host's loopback, which the policy opts in (`allow_private`).

use std::io::{Read, Write};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

/// A server on the host's loopback that answers every request `200 hello`: its port.
fn hello_upstream() -> u16 {
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = upstream.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut conn in upstream.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
        }
    });
    port
}

/// The program: fetches each URL through the proxy the sandbox's environment names and
/// prints what came back, or why not.
const FETCH: &str = r#"import os, urllib.request
for k in ('NO_PROXY', 'no_proxy'):
    os.environ.pop(k, None)
for url in os.environ['URLS'].split():
    try:
        print(url, urllib.request.urlopen(url, timeout=20).read().decode())
    except Exception as e:
        print(url, 'REFUSED', e)
"#;

fn run(policy_args: &[&str], urls: &str) -> (Option<i32>, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["run", "--image", "host", "--json", "--timeout", "60"])
        .args(["--env", &format!("URLS={urls}"), "-c", FETCH])
        .args(policy_args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code(), json, stderr)
}

#[test]
fn a_policy_file_in_toml_or_json_allows_what_it_lists_and_nothing_else() {
    let port = hello_upstream();
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("policy.toml");
    std::fs::write(
        &toml,
        format!("allow = [\"localhost:{port}\"]\nallow_private = [\"localhost\"]\n"),
    )
    .unwrap();
    let json = dir.path().join("policy.json");
    std::fs::write(
        &json,
        format!("{{\"allow\": [\"localhost:{port}\", \"*.example.org\"]}}"),
    )
    .unwrap();
    let allowed = format!("http://localhost:{port}/");
    let urls = format!("{allowed} http://elsewhere.example.net/");

    let (_, r, stderr) = run(&["--net-policy", toml.to_str().unwrap()], &urls);
    assert_eq!(r["status"], "success", "{r:#}\n{stderr}");
    let stdout = r["stdout"].as_str().unwrap();
    assert!(stdout.contains(&format!("{allowed} hello")), "{r:#}");
    assert!(
        stdout.contains("http://elsewhere.example.net/ REFUSED")
            && stdout.contains("is not on this sandbox's network allow-list"),
        "{r:#}"
    );
    assert_eq!(r["network"]["connections"], 1, "{r:#}");
    assert_eq!(r["network"]["denied"], 1, "{r:#}");

    // JSON, whose file does not opt localhost in: the name is allowed, its loopback address is
    // not, until --net-allow-private adds it.
    let (_, r, stderr) = run(&["--net-policy", json.to_str().unwrap()], &allowed);
    assert_eq!(r["status"], "success", "{r:#}\n{stderr}");
    let stdout = r["stdout"].as_str().unwrap();
    assert!(stdout.contains(&format!("{allowed} REFUSED")), "{r:#}");
    assert_eq!(r["network"]["connections"], 0, "{r:#}");
    let (_, r, stderr) = run(
        &[
            "--net-policy",
            json.to_str().unwrap(),
            "--net-allow-private",
            "localhost",
        ],
        &allowed,
    );
    assert!(
        r["stdout"]
            .as_str()
            .unwrap_or_default()
            .contains(&format!("{allowed} hello")),
        "{r:#}\n{stderr}"
    );

    // Not a policy: refused before anything runs, naming the file.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "allow = [\"localhost\"]\ndeny = [\"x\"]\n").unwrap();
    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, "{\"allow\": [\"10.0.0.1\"]}").unwrap();
    for (file, why) in [
        (&bad, "unknown field `deny`"),
        (&broken, "\"10.0.0.1\" is an address"),
        (&dir.path().join("missing.toml"), "No such file"),
    ] {
        let (code, r, _) = run(&["--net-policy", file.to_str().unwrap()], &allowed);
        assert_eq!(code, Some(125), "{}: {r:#}", file.display());
        assert_eq!(
            (&r["status"], &r["stdout"], &r["execution_time_ms"]),
            (&json!("sandbox_error"), &json!(""), &json!(0)),
            "nothing ran: {r:#}"
        );
        let message = r["error_message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("--net-policy {}: ", file.display()))
                && message.contains(why),
            "{message}"
        );
    }
}
