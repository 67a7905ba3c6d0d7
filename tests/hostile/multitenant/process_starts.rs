//! Oversized process starts (`POST …/processes`, E2B `process.Process/Start`, and the
//! interpreter of a new code context). A start goes to
//! the session's process agent as one frame, which the agent holds to 256 KiB: a frame past
//! that ends its connection, and with it every process and code context of the session. An
//! argv, environment or directory of hundreds of KiB must be the client's error (400), not the
//! end of the agent. A tag stays on the host (it is listed, never sent to the agent), for each
//! of the 32 programs a sandbox may run: it is bounded too, so that a key cannot make the host
//! hold (and list) 32 × 8 MiB per sandbox. A sandbox's environment, which the host holds for
//! the sandbox's life and adds to every start, is bounded the same way when it is made.

use super::*;

#[test]
fn oversized_starts_are_refused_and_the_agent_lives() {
    let _g = shared();
    let s = Server::start(2);
    s.wait_pool(2);
    let (key_a, key_b) = (s.key("A"), s.key("B"));
    let a = s.session(&key_a, &json!({}));
    let b = s.session(&key_b, &json!({}));
    let (_victim, _stream) = s.start_process(
        &key_a,
        &a,
        &json!({"cmd": "sleep", "args": ["600"], "tag": "kept"}),
    );
    let big = "x".repeat(300 << 10);
    for body in [
        json!({"cmd": "echo", "args": [big]}),
        json!({"cmd": "true", "env": {"BIG": big}}),
        json!({"cmd": "true", "cwd": format!("/{}", "d/".repeat(150 << 10))}),
        json!({"cmd": "true", "tag": "t".repeat(4 << 20)}),
    ] {
        let (status, answer) = s.call(
            "POST",
            &format!("/v1/sandboxes/{a}/processes"),
            &key_a,
            Some(&body),
        );
        assert_eq!(status, 400, "{answer}");
    }
    // A code context's interpreter is started by the agent the same way.
    let body = json!({"language": "python", "cwd": format!("/{}", "d/".repeat(150 << 10))});
    let (status, answer) = s.call(
        "POST",
        &format!("/v1/sandboxes/{a}/contexts"),
        &key_a,
        Some(&body),
    );
    assert_eq!(status, 400, "{answer}");
    // An environment past the bound, for a sandbox (held on the host for its life, given to
    // every program its agent starts) or for one execution, is refused as well, and makes
    // nothing.
    let env: serde_json::Map<String, Value> = (0..16)
        .map(|i| (format!("V{i}"), json!("e".repeat(100 << 10))))
        .collect();
    for language in ["python", "javascript"] {
        let body = json!({"language": language, "env": env});
        let (status, answer) = s.call("POST", "/v1/sandboxes", &key_a, Some(&body));
        assert_eq!(status, 400, "{language}: {answer}");
    }
    let body = json!({"code": "1", "env": env});
    let (status, answer) = s.call(
        "POST",
        &format!("/v1/sandboxes/{a}/execute"),
        &key_a,
        Some(&body),
    );
    assert_eq!(status, 400, "{answer}");
    let (_, list) = s.call("GET", "/v1/sandboxes", &key_a, None);
    assert_eq!(
        list["sandboxes"].as_array().map(Vec::len),
        Some(1),
        "{list}"
    );
    // The agent serves on: its running program is still listed, a new one runs.
    let (status, list) = s.call("GET", &format!("/v1/sandboxes/{a}/processes"), &key_a, None);
    assert_eq!(status, 200, "{list}");
    assert_eq!(
        list["processes"].as_array().map(Vec::len),
        Some(1),
        "{list}"
    );
    assert_eq!(list["processes"][0]["tag"], "kept", "{list}");
    assert_eq!(s.agent_output(&key_a, &a, "echo alive"), "alive\n");
    assert_eq!(s.agent_output(&key_b, &b, "echo B"), "B\n");
    s.delete(&key_a, &a);
    s.delete(&key_b, &b);
    let left = s.stop();
    assert!(left.is_empty(), "{left:?}");
}
