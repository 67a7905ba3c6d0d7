//! Two sandboxes alive at the same time cannot see or touch each other.

use crate::harness::*;
use crate::host::*;
use std::time::{Duration, Instant};

#[test]
fn concurrent_sandboxes_are_isolated() {
    let _g = shared();
    let mark = marker("pair");
    let secret = marker("asecret");
    let ready = format!("ready-{mark}");
    let mut a = Run::python(include_str!("attacks/concurrent_a.py"))
        .env("A_SECRET", &secret)
        .env("MARK", &mark)
        .timeout(25)
        .spawn();
    let start = Instant::now();
    while !wait_for_proc(&ready, Duration::from_millis(100)) {
        if a.has_exited() || start.elapsed() > Duration::from_secs(20) {
            panic!("sandbox A never became ready\n{}", a.wait().dump());
        }
    }
    let b = Run::python(include_str!("attacks/concurrent_b.py"))
        .env("MARK", &mark)
        .timeout(10)
        .run();
    // A must still be running, or B did not actually run alongside it.
    let a_alive = !procs_with(&ready).is_empty();
    let a = a.wait();

    b.assert_completed();
    b.assert_no_escape();
    b.assert_absent(&secret);
    for what in ["b-read-workspace", "b-read-tmp", "b-read-dev"] {
        b.assert_blocked(what, NO_FILE);
    }
    b.assert_blocked("b-abstract-connect", &["ECONNREFUSED"]);
    for l in b.values("LIST") {
        assert!(
            !l.contains("a-secret"),
            "B sees A's files: {l}\n{}",
            b.dump()
        );
    }
    assert!(
        a_alive,
        "A ended before B finished; the runs did not overlap"
    );

    a.assert_completed();
    assert_eq!(a.value("A-INTACT"), "True", "B disturbed A\n{}", a.dump());
    assert_eq!(
        a.value("A-CONNECTIONS"),
        "0",
        "B reached A's socket\n{}",
        a.dump()
    );
}
