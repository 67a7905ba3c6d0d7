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

/// Keeps each of `sessions` (of `key`) busy for a minute and piles [`PILED`] more calls on
/// each: the connections, their answers unread.
fn pile(s: &Server, key: &str, sessions: &[String]) -> Vec<TcpStream> {
    let mut calls: Vec<TcpStream> = sessions
        .iter()
        .map(|id| send_execute(s, key, id, "import time; time.sleep(60)", 120))
        .collect();
    thread::sleep(Duration::from_secs(2));
    for id in sessions {
        calls.extend((0..PILED).map(|_| send_execute(s, key, id, "1", 120)));
    }
    thread::sleep(Duration::from_secs(2));
    calls
}

/// Of `calls`, how many still wait for their answer and how many were refused 429
/// `key_busy` with `Retry-After`; any other answer fails the test.
fn held_and_refused(calls: &mut [TcpStream]) -> (usize, usize) {
    held_and_refused_with(calls, "HTTP/1.1 429", "key_busy")
}

/// Of `calls`, how many still wait for their answer and how many were refused with `status`
/// and `code` and `Retry-After`; any other answer fails the test.
fn held_and_refused_with(calls: &mut [TcpStream], status: &str, code: &str) -> (usize, usize) {
    let (mut held, mut refused) = (0, 0);
    for conn in calls {
        let head = answer_within(conn, Duration::from_secs(2));
        if head.starts_with(status) {
            assert!(head.contains(code), "{head}");
            assert!(head.to_ascii_lowercase().contains("retry-after"), "{head}");
            refused += 1;
        } else {
            assert!(head.is_empty(), "a piled call: {head}");
            held += 1;
        }
    }
    (held, refused)
}

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
    let mut calls = pile(&s, &key_a, &sessions);

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
    let (holding, refused) = held_and_refused(&mut calls);
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

/// Two keys together can take the whole budget (`max_blocking_calls`): a third key still
/// keeps its floor (`FLOOR_PER_KEY`, 2 calls on threads at once, from half the threads above
/// the budget), so its execution is served promptly; its calls past the floor are refused at
/// once (503 `server_busy`, `Retry-After`), never left to hang, and what takes no engine call
/// (its info, `/healthz`) is still answered. Everything is given back after.
#[test]
fn keys_together_past_the_server_budget_leave_every_other_key_its_floor() {
    let _g = shared();
    let s = Server::start_with(1, CONFIG);
    s.wait_pool(1);
    let (key_a, key_c, key_b) = (s.key("A"), s.key("C"), s.key("B"));
    let b = s.session(&key_b, &json!({"limits": {"timeout_s": 300}}));
    let limits = json!({"limits": {"timeout_s": 300}});
    let a: Vec<String> = (0..2).map(|_| s.session(&key_a, &limits)).collect();
    let c: Vec<String> = (0..2).map(|_| s.session(&key_c, &limits)).collect();
    s.wait_pool(1);

    // A and C each hold their share: 8 + 8, all of max_blocking_calls.
    let mut calls_a = pile(&s, &key_a, &a);
    let mut calls_c = pile(&s, &key_c, &c);
    let started = Instant::now();
    let (status, answer) = s.call(
        "POST",
        &format!("/v1/sandboxes/{b}/execute"),
        &key_b,
        Some(&json!({"code": "print(1)"})),
    );
    assert!(
        started.elapsed() < PROMPT,
        "B's execution took {:?}",
        started.elapsed()
    );
    assert_eq!(
        (status, answer["stdout"].as_str()),
        (200, Some("1\n")),
        "{answer}"
    );
    // B past its floor: one call runs, one waits, the other three are refused at once.
    let mut calls_b = pile(&s, &key_b, std::slice::from_ref(&b));
    assert_eq!(
        held_and_refused_with(&mut calls_b, "HTTP/1.1 503", "server_busy"),
        (2, PILED - 1)
    );
    let info = s.info(&key_b, &b);
    assert_eq!(info["id"], b.as_str(), "{info}");
    let health = s.agent.get(&format!("{}/healthz", s.url)).call();
    assert!(health.is_ok_and(|r| r.status() == 200));
    let calls = 2 * (1 + PILED);
    for piled in [&mut calls_a, &mut calls_c] {
        assert_eq!(held_and_refused(piled), (PER_KEY, calls - PER_KEY));
    }
    let counted = s
        .metric("corral_blocking_refusals_total{scope=\"server\"}")
        .unwrap_or(0.0);
    assert!(counted >= 1.0, "server refusals counted: {counted}");

    // Kills take no share: A and C free their threads, and B is served again.
    drop((calls_a, calls_b, calls_c));
    for (key, ids) in [(&key_a, &a), (&key_c, &c)] {
        for id in ids {
            s.delete(key, id);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.metric("corral_blocking_threads_in_use") != Some(0.0) {
        assert!(
            Instant::now() < deadline,
            "blocking threads still taken 30 s after the kills: {:?}",
            s.metric("corral_blocking_threads_in_use")
        );
        thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(s.exec(&key_b, &b, "print(1)").stdout(), "1\n");
    s.delete(&key_b, &b);
    let left = s.stop();
    assert!(left.is_empty(), "{left:?}");
}
