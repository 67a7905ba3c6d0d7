//! Self-healing (issue 18 item 3): `kill -9` of the warm pool's zygote (what the OOM killer
//! would do) while two tenants keep creating sessions. The zygote is replaced; every creation
//! in the gap is answered 201 or `503 zygote_restarting` with a `Retry-After`, never another
//! error; both tenants create sessions again within seconds; `/healthz` and `/metrics` count
//! the restart; the warm pool refills; and when the server stops, nothing of either
//! generation is left on the host.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::*;

/// The warm pool's full zygote (the one that forks sessions): the process below the server
/// that runs `corral_zygote.py` without `lean`, one pid namespace below the server's, whose
/// parent runs no zygote (a session being forked runs its program too, for a moment).
fn full_zygote(server: i32) -> Vec<(i32, u64)> {
    let depth = |pid: i32| {
        fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .map(|l| l.split_whitespace().count())
    };
    let cmdline = |pid: i32| fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let runs_zygote =
        |pid: i32| String::from_utf8_lossy(&cmdline(pid)).contains("corral_zygote.py");
    let zygote_depth = depth(server).map(|d| d + 1);
    descendants(server)
        .into_iter()
        .filter(|&(pid, _)| {
            runs_zygote(pid)
                && !cmdline(pid).ends_with(b"corral_zygote.py\0lean\0")
                && depth(pid) == zygote_depth
                && stat(pid).is_some_and(|(parent, _)| !runs_zygote(parent))
        })
        .collect()
}

/// What one tenant saw of one creation.
#[derive(Debug)]
struct Creation {
    tenant: &'static str,
    started: Instant,
    status: u16,
    code: String,
    retry_after: Option<String>,
    /// The stdout of `print(1)` in the session, when it was created.
    printed: Option<String>,
}

impl Server {
    /// Creates a session of `key`, runs `print(1)` in it and deletes it.
    fn create_and_use(&self, tenant: &'static str, key: &str) -> Creation {
        let started = Instant::now();
        let response = self
            .agent
            .post(&format!("{}/v1/sandboxes", self.url))
            .set("Accept", "application/json")
            .set("Authorization", &format!("Bearer {key}"))
            .set("Content-Type", "application/json")
            .send_string("{}");
        let response = match response {
            Ok(r) | Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("POST /v1/sandboxes: {e}\n{}", self.log_text()),
        };
        let status = response.status();
        let retry_after = response.header("Retry-After").map(str::to_string);
        let body: Value = response.into_json().unwrap_or(Value::Null);
        let mut printed = None;
        if let (201, Some(id)) = (status, body["id"].as_str()) {
            let (_, result) = self.call(
                "POST",
                &format!("/v1/sandboxes/{id}/execute"),
                key,
                Some(&json!({"code": "print(1)", "timeout_s": 30})),
            );
            printed = Some(result["stdout"].as_str().unwrap_or_default().to_string());
            let _ = self.call("DELETE", &format!("/v1/sandboxes/{id}"), key, None);
        }
        Creation {
            tenant,
            started,
            status,
            code: body["error"]["code"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            retry_after,
            printed,
        }
    }
}

#[test]
fn a_killed_zygote_is_replaced_while_two_tenants_create_sessions() {
    let _g = shared();
    let s = Arc::new(Server::start(2));
    s.wait_pool(2);
    let keys = [("A", s.key("A")), ("B", s.key("B"))];
    let old = full_zygote(s.pid());
    assert_eq!(old.len(), 1, "one full zygote below the server: {old:?}");
    let (old_pid, old_start) = old[0];
    let old_generation: Vec<(i32, u64)> = descendants(old_pid)
        .into_iter()
        .chain([(old_pid, old_start)])
        .collect();

    let creations = Arc::new(Mutex::new(Vec::<Creation>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = keys
        .iter()
        .flat_map(|(tenant, key)| [(*tenant, key.clone()), (*tenant, key.clone())])
        .map(|(tenant, key)| {
            let (s, creations, stop) = (s.clone(), creations.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let c = s.create_and_use(tenant, &key);
                    let failed = c.status != 201;
                    creations.lock().unwrap().push(c);
                    if failed {
                        thread::sleep(Duration::from_millis(100));
                    }
                }
            })
        })
        .collect();
    let succeeded = |tenant: &str, since: Instant| {
        creations
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.tenant == tenant && c.started >= since && c.status == 201)
            .count()
    };
    let begin = Instant::now();
    assert!(
        wait_until(Duration::from_secs(60), || succeeded("A", begin) >= 2
            && succeeded("B", begin) >= 2),
        "the tenants' creations do not succeed before the kill\n{}",
        s.log_text()
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old_pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill -9 of the zygote");
    let killed = Instant::now();
    // Within seconds, a new zygote serves both tenants again.
    let healthy = || {
        let (status, health) = s.call("GET", "/healthz", &keys[0].1, None);
        status == 200
            && health["status"] == "ok"
            && health["pools"][0]["zygote_alive"] == true
            && health["pools"][0]["zygote_restarts"] == 1
    };
    let recovered = wait_until(Duration::from_secs(30), || {
        healthy() && succeeded("A", killed) >= 2 && succeeded("B", killed) >= 2
    });
    let took = killed.elapsed();
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }

    let mut found = Vec::new();
    if !recovered {
        found.push(format!(
            "the tenants did not create sessions again within {took:?} of the kill\n{}",
            s.log_text()
        ));
    }
    let restarts = s.metric("corral_zygote_restarts_total{image=\"default\",zygote=\"full\"}");
    if restarts != Some(1.0) {
        found.push(format!(
            "/metrics counts {restarts:?} restarts of the full zygote"
        ));
    }
    if s.metric("corral_zygote_up{image=\"default\",zygote=\"full\"}") != Some(1.0) {
        found.push("/metrics does not say the full zygote is up".to_string());
    }
    let (unavailable, total) = {
        let creations = creations.lock().unwrap();
        for c in creations.iter() {
            match c.status {
                201 => {
                    // A session handed out before the kill may die with its zygote's
                    // generation; one made after the recovery works.
                    if c.started >= killed + took && c.printed.as_deref() != Some("1\n") {
                        found.push(format!("a session made after the recovery: {c:?}"));
                    }
                }
                503 if c.code == "zygote_restarting"
                    && c.retry_after
                        .as_deref()
                        .and_then(|r| r.parse::<u64>().ok())
                        .is_some_and(|r| r >= 1) => {}
                _ => found.push(format!(
                    "a creation failed other than with 503 and Retry-After: {c:?}"
                )),
            }
        }
        (
            creations.iter().filter(|c| c.status == 503).count(),
            creations.len(),
        )
    };
    eprintln!("{total} creations, {unavailable} answered 503; recovered in {took:?}");
    // The pool refills from the new zygote.
    if !wait_until(Duration::from_secs(30), || {
        s.metric("corral_pool_ready").unwrap_or(0.0) >= 2.0
    }) {
        found.push(format!(
            "the warm pool did not refill: {:?} ready",
            s.metric("corral_pool_ready")
        ));
    }
    let replacement = full_zygote(s.pid());
    if replacement.len() != 1 || old_generation.contains(&replacement[0]) {
        found.push(format!(
            "after the recovery the full zygotes are {replacement:?} (the old one was {old_pid})"
        ));
    }
    let s = Arc::into_inner(s).expect("every client has ended");
    let mut host = s.stop();
    if !wait_until(Duration::from_secs(10), || {
        old_generation.iter().all(|&(p, start)| !alive(p, start))
    }) {
        host.push("processes of the killed zygote's generation are left".to_string());
    }
    verdict("a killed zygote is not replaced as promised", &found, &host);
}
