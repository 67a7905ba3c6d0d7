//! Tenant B against A's sandbox on every face that names a sandbox: the native routes this
//! round added (restart, metrics, the file calls), the E2B control plane (connect, pause,
//! resume, kill, timeout, metrics, info), the E2B sandbox plane with B's own access token or
//! none (executions, contexts, processes, file calls, watches, downloads), and the operator
//! routes (keys, every key's sandboxes, another key's audit lines). Each must answer as for a
//! sandbox that does not exist, and A's sandbox must run on untouched: not paused, not
//! restarted (its variables kept), its key and token still good.

use super::*;

/// A sandbox of tenant `key` made through the E2B face: its id and access token.
fn e2b_sandbox(s: &Server, key: &str) -> (String, String) {
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

/// A request with the given headers: status and body text.
fn request(
    s: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut req = s.agent.request(method, &format!("{}{path}", s.url));
    for (name, value) in headers {
        req = req.set(name, value);
    }
    let response = match req.send_string(body) {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {path}: {e}\n{}", s.log_text()),
    };
    let status = response.status();
    (status, response.into_string().unwrap_or_default())
}

#[test]
fn another_key_cannot_pause_restart_or_reach_a_sandbox_on_any_face() {
    let _g = shared();
    let s = Server::start(1);
    s.wait_pool(1);
    let (key_a, key_b) = (s.key("A"), s.key("B"));
    let (a, token_a) = e2b_sandbox(&s, &key_a);
    let (_b, token_b) = e2b_sandbox(&s, &key_b);
    let o = s.exec(
        &key_a,
        &a,
        "x = 7\nopen('kept.txt', 'w').write('A')\nprint('ok')",
    );
    assert_eq!(o.stdout(), "ok\n", "{}", o.dump());
    let (_, who) = s.call("GET", "/v1/whoami", &key_a, None);
    let key_a_id = who["key_id"].as_str().unwrap().to_string();

    // Native routes, with B's key.
    for (method, path, body) in [
        (
            "POST",
            format!("/v1/sandboxes/{a}/restart"),
            Some(json!({})),
        ),
        ("GET", format!("/v1/sandboxes/{a}/metrics"), None),
        ("POST", format!("/v1/sandboxes/{a}/pause"), Some(json!({}))),
        (
            "GET",
            format!("/v1/sandboxes/{a}/files:stat?path=kept.txt"),
            None,
        ),
        ("GET", format!("/v1/sandboxes/{a}/files:list?path="), None),
        (
            "POST",
            format!("/v1/sandboxes/{a}/files:mkdir"),
            Some(json!({"path": "b-was-here"})),
        ),
        (
            "POST",
            format!("/v1/sandboxes/{a}/files:move"),
            Some(json!({"from": "kept.txt", "to": "moved.txt"})),
        ),
        (
            "POST",
            format!("/v1/sandboxes/{a}/files:remove"),
            Some(json!({"path": "kept.txt"})),
        ),
        ("GET", format!("/v1/sandboxes/{a}/files/kept.txt"), None),
    ] {
        let (status, answer) = s.call(method, &path, &key_b, body.as_ref());
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (404, Some("not_found")),
            "B: {method} {path}: {answer}"
        );
    }

    // The E2B control plane, with B's key.
    let b_key = [("X-API-KEY", key_b.as_str())];
    for (method, path, body) in [
        (
            "POST",
            format!("/v2/sandboxes/{a}/connect"),
            r#"{"timeout":60}"#,
        ),
        (
            "POST",
            format!("/sandboxes/{a}/connect"),
            r#"{"timeout":60}"#,
        ),
        ("POST", format!("/sandboxes/{a}/pause"), ""),
        (
            "POST",
            format!("/sandboxes/{a}/resume"),
            r#"{"timeout":60}"#,
        ),
        (
            "POST",
            format!("/sandboxes/{a}/timeout"),
            r#"{"timeout":1}"#,
        ),
        ("GET", format!("/sandboxes/{a}"), ""),
        ("GET", format!("/sandboxes/{a}/metrics"), ""),
        ("DELETE", format!("/sandboxes/{a}"), ""),
    ] {
        let mut headers = b_key.to_vec();
        headers.push(("Content-Type", "application/json"));
        let (status, answer) = request(&s, method, &path, &headers, body);
        assert_eq!(status, 404, "B: {method} {path}: {answer}");
    }

    // The E2B sandbox plane: A's id with B's token, with none, with A's token on another id.
    let plane_calls: [(&str, &str, &str, &str); 7] = [
        (
            "POST",
            "/execute",
            "application/json",
            r#"{"code":"x = 0"}"#,
        ),
        ("GET", "/contexts", "application/json", ""),
        ("POST", "/process.Process/List", "application/json", "{}"),
        (
            "POST",
            "/filesystem.Filesystem/ListDir",
            "application/json",
            r#"{"path":"/home/user","depth":1}"#,
        ),
        (
            "POST",
            "/filesystem.Filesystem/CreateWatcher",
            "application/json",
            r#"{"path":"/home/user","recursive":true}"#,
        ),
        (
            "POST",
            "/filesystem.Filesystem/Remove",
            "application/json",
            r#"{"path":"/home/user/kept.txt"}"#,
        ),
        (
            "GET",
            "/files?path=/home/user/kept.txt",
            "application/octet-stream",
            "",
        ),
    ];
    for (id, token) in [
        (a.as_str(), Some(token_b.as_str())),
        (a.as_str(), None),
        (a.as_str(), Some("0000")),
    ] {
        for (method, path, content_type, body) in plane_calls {
            let mut headers = vec![("E2b-Sandbox-Id", id), ("Content-Type", content_type)];
            if let Some(token) = token {
                headers.push(("X-Access-Token", token));
                headers.push(("E2B-Traffic-Access-Token", token));
            }
            let (status, answer) = request(&s, method, path, &headers, body);
            assert_eq!(
                status, 502,
                "B: {method} {path} on {id} with {token:?}: {answer}"
            );
            assert!(answer.contains("not found"), "{answer}");
        }
    }

    // The operator routes, with B's (not an operator's) key.
    for (method, path, body) in [
        ("GET", "/v1/keys".to_string(), None),
        (
            "POST",
            "/v1/keys".to_string(),
            Some(json!({"name": "mine"})),
        ),
        ("DELETE", format!("/v1/keys/{key_a_id}"), None),
        ("GET", "/v1/operator/sandboxes".to_string(), None),
        ("GET", format!("/v1/audit?key={key_a_id}"), None),
    ] {
        let (status, answer) = s.call(method, &path, &key_b, body.as_ref());
        assert_eq!(status, 403, "B: {method} {path}: {answer}");
    }

    // A's sandbox runs on as it was, with its key and its token.
    let info = s.info(&key_a, &a);
    assert_eq!(info["state"], "running", "{info}");
    let o = s.exec(
        &key_a,
        &a,
        "import os\nprint(x, open('kept.txt').read(), sorted(os.listdir('.')))",
    );
    assert_eq!(o.stdout(), "7 A ['kept.txt']\n", "{}", o.dump());
    let (status, answer) = request(
        &s,
        "POST",
        "/process.Process/List",
        &[
            ("E2b-Sandbox-Id", a.as_str()),
            ("X-Access-Token", token_a.as_str()),
            ("Content-Type", "application/json"),
        ],
        "{}",
    );
    assert_eq!(status, 200, "A's token: {answer}");
    let left = s.stop();
    assert!(left.is_empty(), "{left:?}");
}
