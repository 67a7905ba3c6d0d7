//! Directory watchers of one key (E2B `files.watch_dir`, issue 31). A watcher polls: each
//! poll scans its directory (up to 10,000 entries) on the server, and a watcher waited 20
//! times as long as its last scan took, so each took up to a twentieth of a core, but a key
//! may have 8 watchers a sandbox in 100 sandboxes: 34 sandboxes x 8 watchers of 10,000 files
//! took the server to 120 % CPU and another key's trivial execution from 40 ms to seconds.
//! Every scan now takes a turn of its key's, which it keeps after the scan long enough that
//! all of the key's scans take at most `watch_scan_share` of a core (0.1 here, the default).

use std::net::TcpStream;

use super::streams::{e2b_sandbox, envelope, exec_within, open_stream_within, send_request};
use super::*;

const SANDBOXES: usize = 3;
const WATCHERS: usize = 8;

/// The CPU time the process has used, in clock ticks (user and system).
fn cpu_ticks(pid: i32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's closing parenthesis; utime and stime are the 14th and
    // 15th of the line.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// The share of a core process `pid` uses over `span`.
fn cpu_share(pid: i32, span: Duration) -> f64 {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .unwrap() as f64;
    let before = cpu_ticks(pid);
    thread::sleep(span);
    (cpu_ticks(pid) - before) as f64 / ticks / span.as_secs_f64()
}

/// The slowest of five of B's trivial executions.
fn slowest_execution(s: &Server, key: &str, id: &str) -> Duration {
    (0..5)
        .map(|_| {
            let started = Instant::now();
            let v = exec_within(s, key, id, Duration::from_secs(60)).expect("B executes");
            assert_eq!(v["results"][0]["text"], "42", "{v}");
            started.elapsed()
        })
        .max()
        .unwrap()
}

/// Key A watches directories of 10,000 files with 8 streaming watchers in each of 3
/// sandboxes; the server's CPU stays within A's share of a core, and key B's trivial
/// execution stays within seconds of what it took before.
#[test]
fn one_keys_watchers_take_at_most_its_share_of_a_core() {
    let _g = shared();
    let s = Server::start(1);
    s.wait_pool(1);
    let (key_a, key_b) = (s.key("A"), s.key("B"));
    let b = s.session(&key_b, &json!({}));
    let server = s.pid();
    let mut sandboxes = Vec::new();
    for _ in 0..SANDBOXES {
        let (id, token) = e2b_sandbox(&s, &key_a);
        let o = s.exec(
            &key_a,
            &id,
            "import os\nfor d in range(100):\n    os.makedirs(f'/workspace/big/{d}')\n    \
             for f in range(99):\n        open(f'/workspace/big/{d}/{f}', 'w').close()\nprint('made')",
        );
        assert_eq!(o.stdout().trim(), "made", "{}", o.dump());
        sandboxes.push((id, token));
    }
    let baseline = slowest_execution(&s, &key_b, &b);
    let idle = cpu_share(server, Duration::from_secs(3));

    let mut watchers: Vec<TcpStream> = Vec::new();
    for (id, token) in &sandboxes {
        let plane = [
            ("E2b-Sandbox-Id", id.as_str()),
            ("X-Access-Token", token.as_str()),
            ("Content-Type", "application/connect+json"),
        ];
        let body = envelope(&json!({"path": "/workspace/big", "recursive": true}));
        let path = "/filesystem.Filesystem/WatchDir";
        for _ in 0..WATCHERS {
            // Each watcher's first listing waits for A's turn, which rests nine times as long
            // as A's last scan took: on a slow host the 24th start comes minutes later, by
            // design. So only the first start is awaited (the watchers are served); the others
            // are asked for and left to come, as a client that opens them all at once would.
            if watchers.is_empty() {
                let patience = Duration::from_secs(120);
                match open_stream_within(&s, "POST", path, &plane, &body, patience) {
                    Ok(conn) => watchers.push(conn),
                    Err(e) => panic!("A's first watcher: {e}\n{}", s.log_text()),
                }
            } else {
                watchers.push(send_request(&s, "POST", path, &plane, &body).unwrap());
            }
        }
    }
    thread::sleep(Duration::from_secs(2));
    let busy = cpu_share(server, Duration::from_secs(8));
    let during = slowest_execution(&s, &key_b, &b);
    eprintln!(
        "{} watchers of A over 10,000 files each: the server used {:.0} % of a core (idle \
         {:.0} %); B's slowest of five executions took {during:?} (before: {baseline:?})",
        watchers.len(),
        busy * 100.0,
        idle * 100.0
    );
    // A's scans take a tenth of a core; the rest is the watchers' other work (their
    // streams' timers, refused turns) and B's executions, and the server's idle use.
    assert!(
        busy < idle + 0.35,
        "A's watchers took the server to {:.0} % of a core",
        busy * 100.0
    );
    assert!(
        during < baseline + Duration::from_secs(3),
        "B's execution took {during:?} while A's watchers ran (before: {baseline:?})"
    );
    drop(watchers);
    let left = s.stop();
    assert!(left.is_empty(), "{left:?}");
}
