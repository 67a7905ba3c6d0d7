//! Requests in flight through `corral route`, taken by one tenant. Every request counts until
//! its answer ends (an execution's until it returns), and a router takes `--max-in-flight` of
//! them at once: one key holding them all with long executions used to leave every other
//! key's requests, list and create included, 503 `router_busy`. They are now a pool the keys
//! share (corral-share): with `--max-in-flight 8` a key holds at most 4 (then 429 `key_busy`),
//! and every other key is served.

use std::io::Write as _;
use std::net::TcpStream;

use super::waiting::{answer_within, send_execute};
use super::*;

/// A `corral route` in front of one node: its URL. Dropping the child kills it.
struct Route {
    child: Child,
    url: String,
}

impl Drop for Route {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn route(node: &str, max_in_flight: usize) -> Route {
    let port = free_port();
    let child = Command::new(corral_bin())
        .args(["route", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--node")
        .arg(node.trim_start_matches("http://"))
        .arg("--max-in-flight")
        .arg(max_in_flight.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(5))
        .build();
    let up = wait_until(Duration::from_secs(30), || {
        agent
            .get(&format!("{url}/healthz"))
            .call()
            .is_ok_and(|r| r.status() == 200)
    });
    assert!(up, "corral route did not see its node");
    Route { child, url }
}

#[test]
fn one_key_holding_the_routers_requests_leaves_other_keys_served() {
    let _g = shared();
    let mut s = Server::start_with(2, "node_name = \"n1\"\n");
    let (key_a, key_b, key_c) = (s.key("A"), s.key("B"), s.key("C"));
    let router = route(&s.url, 8);
    let direct = std::mem::replace(&mut s.url, router.url.clone());
    let body = json!({"limits": {"timeout_s": 300}});
    let sessions: Vec<String> = (0..8).map(|_| s.session(&key_a, &body)).collect();
    // A call that lasts 20 s on each of A's sessions: every place of the router, were A
    // alone to be bounded by it.
    let mut calls: Vec<TcpStream> = sessions
        .iter()
        .map(|id| send_execute(&s, &key_a, id, "import time; time.sleep(20)", 120))
        .collect();
    thread::sleep(Duration::from_secs(3));
    let mut made = Vec::new();
    for key in [&key_b, &key_c] {
        let started = Instant::now();
        let (status, listed) = s.call("GET", "/v1/sandboxes", key, None);
        assert_eq!(status, 200, "{listed}");
        let id = s.session(key, &json!({}));
        made.push((key.clone(), id.clone()));
        let (status, result) = s.call(
            "POST",
            &format!("/v1/sandboxes/{id}/execute"),
            key,
            Some(&json!({"code": "print(1)"})),
        );
        assert_eq!(status, 200, "{result}");
        assert_eq!(result["stdout"], "1\n", "{result}");
        let took = started.elapsed();
        eprintln!("another key listed, created and ran through the router in {took:?}");
        assert!(took < Duration::from_secs(30), "{took:?}");
    }
    let (mut held, mut refused) = (0, 0);
    for conn in &mut calls {
        let head = answer_within(conn, Duration::from_secs(2));
        if head.starts_with("HTTP/1.1 429") {
            assert!(head.contains("key_busy"), "{head}");
            assert!(head.to_ascii_lowercase().contains("retry-after"), "{head}");
            refused += 1;
        } else {
            assert!(head.is_empty(), "a held call: {head}");
            held += 1;
        }
    }
    assert_eq!((held, refused), (4, 4), "A holds its share of the router");

    // Once A's calls end, the router serves A again.
    drop(calls);
    let served = wait_until(Duration::from_secs(30), || {
        s.call("GET", "/v1/sandboxes", &key_a, None).0 == 200
    });
    assert!(served, "A's share of the router did not come back");
    for id in &sessions {
        s.delete(&key_a, id);
    }
    for (key, id) in &made {
        s.delete(key, id);
    }
    s.url = direct;
    drop(router);
    let left = s.stop();
    assert!(left.is_empty(), "{left:?}");
}

/// Made-up keys whose creations' bodies never come (the red team's finding on issue 31): 3
/// keys × 16 connections to `corral route --max-in-flight 32`, each announcing 100 bytes and
/// sending `{`. They used to hold every place in flight, and a real key's list was 503
/// `router_busy`. A creation's body is now read before its place is taken, and within 10 s:
/// the real key lists, creates and runs meanwhile, every made-up connection is answered 408,
/// and the host is left as it was.
#[test]
fn made_up_keys_with_creations_that_never_arrive_leave_real_keys_served() {
    let _g = shared();
    let mut s = Server::start_with(1, "node_name = \"n1\"\n");
    let key = s.key("A");
    let router = route(&s.url, 32);
    let direct = std::mem::replace(&mut s.url, router.url.clone());
    let address = router.url.trim_start_matches("http://").to_string();
    let started = Instant::now();
    let mut slow: Vec<TcpStream> = Vec::new();
    for made_up in ["bogus-1", "bogus-2", "bogus-3"] {
        for _ in 0..16 {
            let mut conn = TcpStream::connect(&address).unwrap();
            write!(
                conn,
                "POST /v1/sandboxes HTTP/1.1\r\nHost: {address}\r\n\
                 Authorization: Bearer {made_up}\r\nContent-Type: application/json\r\n\
                 Content-Length: 100\r\n\r\n{{"
            )
            .unwrap();
            slow.push(conn);
        }
    }
    thread::sleep(Duration::from_secs(1));
    let (status, listed) = s.call("GET", "/v1/sandboxes", &key, None);
    assert_eq!(status, 200, "{listed}");
    let id = s.session(&key, &json!({}));
    let (status, result) = s.call(
        "POST",
        &format!("/v1/sandboxes/{id}/execute"),
        &key,
        Some(&json!({"code": "print(1)"})),
    );
    assert_eq!(status, 200, "{result}");
    assert_eq!(result["stdout"], "1\n", "{result}");
    eprintln!("the real key was served in {:?}", started.elapsed());
    for conn in &mut slow {
        let head = answer_within(conn, Duration::from_secs(30));
        assert!(head.starts_with("HTTP/1.1 408"), "{head}");
        assert!(head.contains("request_timeout"), "{head}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "{:?}",
        started.elapsed()
    );
    s.delete(&key, &id);
    s.url = direct;
    drop(router);
    let left = s.stop();
    assert!(left.is_empty(), "{left:?}");
}
