//! The server's blocking threads taken by one tenant. Every engine call runs on a thread of
//! tokio's blocking pool (`blocking_threads`) and holds it while it runs or waits for its busy
//! session; a session lets 1 call run and 4 wait, and a key may have many sessions, so one
//! key used to be able to take every thread, after which every other key's requests (even
//! the authentication of a request) hung. Calls are now admitted against
//! `max_blocking_calls_per_key` and `max_blocking_calls` before they take a thread.
//!
//! The server here has a pool of 24 threads, 16 of them for calls and 8 for one key. Tenant A
//! keeps 5 sessions busy and piles 4 more calls on each: 25 calls, more than the whole pool.
//! Exactly 8 may hold a thread; the other 17 must be refused at once (429 `key_busy`,
//! `Retry-After`), and tenant B must create a session, execute in it, list and get its info
//! promptly meanwhile. Before the admission, A's calls took all 24 threads and B's first
//! request never got an answer.

use std::net::TcpStream;

use super::waiting::{answer_within, send_execute};
use super::*;

const SESSIONS: usize = 5;
/// Calls piled on each busy session: the most that may wait for it (`MAX_WAITING`).
const PILED: usize = 4;
const PER_KEY: usize = 8;
const CONFIG: &str = "blocking_threads = 24\nmax_blocking_calls = 16\n\
                      max_blocking_calls_per_key = 8\n";
/// How long each of B's requests may take.
const PROMPT: Duration = Duration::from_secs(15);

#[test]
fn one_key_cannot_take_every_blocking_thread() {
    let _g = shared();
    let s = Server::start_with(1, CONFIG);
    s.wait_pool(1);
    let (key_a, key_b) = (s.key("A"), s.key("B"));
    let sessions: Vec<String> = (0..SESSIONS)
        .map(|_| s.session(&key_a, &json!({"limits": {"timeout_s": 300}})))
        .collect();
    s.wait_pool(1);
    let server = s.pid();
    let tasks = |pid: i32| fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());

    // Every session of A is busy for a minute, and 4 more calls wait for each.
    let mut calls: Vec<TcpStream> = sessions
        .iter()
        .map(|id| send_execute(&s, &key_a, id, "import time; time.sleep(60)", 120))
        .collect();
    thread::sleep(Duration::from_secs(2));
    for id in &sessions {
        calls.extend((0..PILED).map(|_| send_execute(&s, &key_a, id, "1", 120)));
    }
    thread::sleep(Duration::from_secs(2));

    // B is served meanwhile, each request promptly.
    let agent = ureq::AgentBuilder::new().timeout(PROMPT).build();
    let b_call = |method: &str, path: &str, body: Option<Value>| -> Value {
        let started = Instant::now();
        let request = agent
            .request(method, &format!("{}{path}", s.url))
            .set("Authorization", &format!("Bearer {key_b}"))
            .set("Accept", "application/json");
        let answer = match body {
            Some(b) => request
                .set("Content-Type", "application/json")
                .send_string(&b.to_string()),
            None => request.call(),
        };
        match answer {
            Ok(r) => r.into_json().unwrap(),
            Err(e) => panic!(
                "B's {method} {path} got no answer within {PROMPT:?} ({:?}) while A held its \
                 calls: {e} (the server has {} threads)\n{}",
                started.elapsed(),
                tasks(server),
                s.log_text()
            ),
        }
    };
    let b = b_call("POST", "/v1/sandboxes", Some(json!({})))["id"]
        .as_str()
        .expect("B's session has an id")
        .to_string();
    let result = b_call(
        "POST",
        &format!("/v1/sandboxes/{b}/execute"),
        Some(json!({"code": "print(1)"})),
    );
    assert_eq!(result["stdout"], "1\n", "{result}");
    let listed = b_call("GET", "/v1/sandboxes", None);
    let ids: Vec<&str> = listed["sandboxes"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|v| v["id"].as_str())
        .collect();
    assert_eq!(ids, [b.as_str()], "{listed}");
    let info = b_call("GET", &format!("/v1/sandboxes/{b}"), None);
    assert_eq!(info["id"], b.as_str(), "{info}");

    // A's calls beyond its share were refused at once, saying why; the rest still hold.
    let mut refused = 0;
    let mut holding = 0;
    for conn in &mut calls {
        let head = answer_within(conn, Duration::from_secs(2));
        if head.starts_with("HTTP/1.1 429") {
            assert!(head.contains("key_busy"), "{head}");
            assert!(head.to_ascii_lowercase().contains("retry-after"), "{head}");
            refused += 1;
        } else {
            assert!(head.is_empty(), "a call of A: {head}");
            holding += 1;
        }
    }
    let total = SESSIONS * (1 + PILED);
    assert_eq!(
        (holding, refused),
        (PER_KEY, total - PER_KEY),
        "of A's {total} calls, {holding} hold a thread and {refused} were refused"
    );
    let in_use = s.metric("corral_blocking_threads_in_use").unwrap_or(-1.0);
    assert!(
        in_use >= PER_KEY as f64,
        "corral_blocking_threads_in_use {in_use}"
    );
    let counted = s
        .metric("corral_blocking_refusals_total{scope=\"key\"}")
        .unwrap_or(0.0);
    assert_eq!(counted, (total - PER_KEY) as f64, "refusals counted");

    // Killing A's sessions gives every thread back.
    drop(calls);
    for id in &sessions {
        s.delete(&key_a, id);
    }
    s.delete(&key_b, &b);
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.metric("corral_blocking_threads_in_use") != Some(0.0) {
        assert!(
            Instant::now() < deadline,
            "blocking threads still taken 30 s after A's sessions were killed: {:?}",
            s.metric("corral_blocking_threads_in_use")
        );
        thread::sleep(Duration::from_millis(100));
    }
    let left = s.stop();
    assert!(left.is_empty(), "{left:?}");
}
