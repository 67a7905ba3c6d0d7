//! End to end through a sandbox's egress proxy (docs/network.md): `pip install --user` of a
//! small pure-Python package with `corral run --net allow:...` naming only the package index the
//! host's pip is configured with (read from pip at test time, `tests/egress/index.py`), and the
//! same install failing fast, with an error that says why, without it. Skipped (not failed)
//! when the host itself cannot reach its index.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A small pure-Python package the host's Python lacks (the `host` image is the host's /usr).
const PACKAGE: (&str, &str) = ("tomli-w", "tomli_w");

/// The index and every host it serves the package's files from; `None` (with the reason
/// printed) when the host cannot reach it.
fn host_index() -> Option<(String, Vec<String>)> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/egress/index.py");
    let out = Command::new("/usr/bin/python3")
        .arg(script)
        .arg(PACKAGE.0)
        .output()
        .expect("running tests/egress/index.py");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut index = None;
    let mut hosts = Vec::new();
    for line in text.lines() {
        match line.split_once(' ') {
            Some(("INDEX", url)) => index = Some(url.to_string()),
            Some(("HOST", host)) => hosts.push(host.to_string()),
            Some(("UNREACHABLE", why)) => {
                eprintln!("skipped: the host cannot reach its package index: {why}");
                return None;
            }
            _ => {}
        }
    }
    let index = index.unwrap_or_else(|| {
        panic!(
            "index.py printed no index\n{text}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(!hosts.is_empty(), "index.py printed no host\n{text}");
    Some((index, hosts))
}

fn pip_run(index: &str, net: &[String]) -> (Value, Duration) {
    let script = format!(
        "python3 -m pip install --user --no-cache-dir --retries 1 --timeout 20 \
         --index-url '{index}' {package} && python3 -c 'import {module}; print(\"IMPORTED\", \
         {module}.__name__)'",
        package = PACKAGE.0,
        module = PACKAGE.1
    );
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args([
            "run",
            "--image",
            "host",
            "--lang",
            "bash",
            "--timeout",
            "120",
            "--json",
        ])
        // Debian marks its Python externally managed; a --user install in a sandbox is fine.
        .args(["--env", "PIP_BREAK_SYSTEM_PACKAGES=1", "-c", &script])
        .args(net)
        .stdin(Stdio::null())
        .output()
        .expect("running corral");
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no result object ({e})\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (json, started.elapsed())
}

#[test]
fn pip_installs_through_an_allow_list_naming_only_the_index_and_fails_fast_without() {
    let Some((index, hosts)) = host_index() else {
        return;
    };
    let imported = Command::new("/usr/bin/python3")
        .args(["-c", &format!("import {}", PACKAGE.1)])
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(
        !imported.success(),
        "the host's Python has {} already",
        PACKAGE.1
    );

    // The index's names only; an operator's opt-in lets them resolve to internal addresses
    // (a mirror on a private network, as on the project's test host).
    let mut net = vec!["--net".to_string(), format!("allow:{}", hosts.join(","))];
    for host in &hosts {
        net.extend(["--net-allow-private".to_string(), host.clone()]);
    }
    let (j, _) = pip_run(&index, &net);
    let stdout = j["stdout"].as_str().unwrap_or_default();
    assert_eq!(j["status"], "success", "{j:#}");
    assert!(stdout.contains(&format!("IMPORTED {}", PACKAGE.1)), "{j:#}");
    let network = &j["network"];
    assert!(network["connections"].as_u64().unwrap() >= 1, "{j:#}");
    assert!(network["bytes_down"].as_u64().unwrap() > 1000, "{j:#}");
    assert_eq!(network["denials"], serde_json::json!([]), "{j:#}");

    // No network: no resolver, no route; pip says the name does not resolve.
    let (j, took) = pip_run(&index, &[]);
    assert_eq!(j["status"], "error", "{j:#}");
    assert_eq!(j["network"], Value::Null, "{j:#}");
    let output = format!("{}{}", j["stdout"], j["stderr"]);
    assert!(
        output.contains("Failed to establish a new connection")
            || output.contains("No matching distribution"),
        "{j:#}"
    );
    assert!(took < Duration::from_secs(30), "took {took:?}");

    // An allow-list that does not name the index: the proxy refuses, and pip shows why.
    let (j, took) = pip_run(&index, &["--net".into(), "allow:example.invalid".into()]);
    assert_eq!(j["status"], "error", "{j:#}");
    let output = format!("{}{}", j["stdout"], j["stderr"]);
    assert!(
        output.contains("is not on this sandbox's network allow-list"),
        "{j:#}"
    );
    let denial = &j["network"]["denials"][0];
    assert_eq!(denial["reason"], "not_allowed", "{j:#}");
    assert_eq!(denial["host"], hosts[0].as_str(), "{j:#}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
}
