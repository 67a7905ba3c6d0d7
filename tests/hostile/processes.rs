//! Process isolation and lifetime: own pid namespace, whole-tree kill on
//! exit and on timeout, pids limit.

use crate::harness::*;
use crate::host::*;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn host_processes_invisible() {
    let _g = shared();
    let host_pid = std::process::id();
    for caller in CALLERS {
        check_processes_invisible(caller, host_pid);
    }
}

fn check_processes_invisible(caller: Caller, host_pid: u32) {
    let o = Run::python(include_str!("attacks/proc_visibility.py"))
        .env("HOST_PID", host_pid.to_string())
        .caller(caller)
        .run();
    o.assert_completed();
    o.assert_no_escape();
    let n: usize = o.value("PIDS").parse().unwrap();
    assert!((1..=6).contains(&n), "{n} processes visible\n{}", o.dump());
    let me = std::env::current_exe().unwrap();
    let me = me.file_name().unwrap().to_string_lossy();
    for p in o.values("PROC") {
        for host_only in [me.as_ref(), "cargo", "systemd", "sshd", "corral-test"] {
            assert!(
                !p.contains(host_only),
                "host process visible: {p}\n{}",
                o.dump()
            );
        }
    }
    // Every visible process's cgroup lies inside the sandbox's cgroup namespace (init, which
    // stays outside the sandbox's cgroup, has that file masked).
    let groups = o.values("CGROUP");
    assert!(!groups.is_empty(), "{}", o.dump());
    for g in groups {
        assert!(
            !g.contains("/.."),
            "host cgroup path visible: {g}\n{}",
            o.dump()
        );
    }
    if host_pid > 64 {
        o.assert_blocked("hostpid-proc", NO_FILE);
        o.assert_blocked("hostpid-kill0", &["ESRCH"]);
    }
    let alive: usize = o.value("KILL0-ALIVE").parse().unwrap();
    assert!(alive <= 6, "{alive} pids answer kill(0)\n{}", o.dump());
}

/// The host moves init, and init the workload, to another CPU while the sandbox is built; the
/// program must still start with the CPUs its caller may use, all of them, and init must end
/// up with them too.
#[test]
fn program_and_init_keep_the_callers_cpu_affinity() {
    let _g = shared();
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let allowed = |status: &str| {
        status
            .lines()
            .filter_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .map(|v| v.trim().to_string())
            .collect::<Vec<_>>()
    };
    let mine = allowed(&status).pop().unwrap();
    for caller in CALLERS {
        let o = Run::python(
            "print(open('/proc/self/status').read()); print(open('/proc/1/status').read())",
        )
        .caller(caller)
        .run();
        assert_eq!(o.status(), "success", "{}", o.dump());
        assert_eq!(
            allowed(o.stdout()),
            [mine.clone(), mine.clone()],
            "{}",
            o.dump()
        );
    }
}

#[test]
fn kill_minus_one_spares_host_processes() {
    let _g = shared();
    // A host process of the same user (rootless: same uid the sandbox maps
    // to), the most exposed victim.
    let mut sleeper = Command::new("sleep").arg("300").spawn().unwrap();
    let o = Run::python(include_str!("attacks/kill_all.py"))
        .env("HOST_SLEEP_PID", sleeper.id().to_string())
        .run();
    let alive = sleeper.try_wait().unwrap().is_none();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("kill-host-sleep", &["ESRCH"]);
    // kill(-1) worked inside: the sandbox's own sleeper died of SIGKILL.
    assert_eq!(o.value("INNER-SIGNAL"), "9", "{}", o.dump());
    assert!(alive, "SANDBOX HOLE: kill -9 -1 killed a host process");
}

#[test]
fn setsid_daemons_do_not_survive() {
    let _g = exclusive();
    let before = Snapshot::take();
    let mark = marker("daemon");
    let o = Run::python(include_str!("attacks/daemon.py"))
        .env("MARK", &mark)
        .run();
    o.assert_completed();
    // Non-vacuous: the daemons were running when the program ended.
    let n: u32 = o.value("DAEMONS").parse().unwrap();
    assert!(n >= 2, "daemons did not start\n{}", o.dump());
    assert_no_procs(&mark);
    before.assert_nothing_left();
}

#[test]
fn fork_loop_stops_at_pids_limit() {
    let _g = exclusive();
    let before = Snapshot::take();
    let mark = marker("forks");
    let o = Run::python(include_str!("attacks/fork_count.py"))
        .env("MARK", &mark)
        .pids(64)
        .timeout(20)
        .run();
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("fork-limit", &["EAGAIN"]);
    let n: u32 = o.value("FORKED").parse().unwrap();
    assert!(
        (5..64).contains(&n),
        "forked {n} with --pids 64\n{}",
        o.dump()
    );
    assert_host_can_fork();
    assert_no_procs(&mark);
    before.assert_nothing_left();
}

#[test]
fn exponential_fork_bomb_is_contained() {
    let _g = exclusive();
    let before = Snapshot::take();
    let mark = marker("bomb");
    let needle = format!("bomb-{mark}");
    let mut run = Run::python(include_str!("attacks/fork_bomb.py"))
        .env("MARK", &mark)
        .pids(64)
        .timeout(3)
        .spawn();
    // Count the bomb's processes from the host while it runs.
    let mut peak = 0;
    let start = Instant::now();
    while !run.has_exited() && start.elapsed() < Duration::from_secs(30) {
        peak = peak.max(procs_with(&needle).len());
        assert_host_can_fork();
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = run.wait();
    o.assert_exit_follows_status();
    assert!(
        ["timeout", "error", "success"].contains(&o.status()),
        "{}",
        o.dump()
    );
    assert!(
        o.wall < Duration::from_secs(15),
        "bomb ran {:?}\n{}",
        o.wall,
        o.dump()
    );
    assert!(
        peak >= 2,
        "the bomb never forked (peak {peak})\n{}",
        o.dump()
    );
    assert!(
        peak <= 64,
        "SANDBOX HOLE: {peak} bomb processes with --pids 64"
    );
    assert_host_can_fork();
    assert_no_procs(&mark);
    before.assert_nothing_left();
}

#[test]
fn infinite_loop_times_out_and_tree_is_killed() {
    let _g = exclusive();
    let before = Snapshot::take();
    let mark = marker("spin");
    let mut run = Run::python(include_str!("attacks/infinite_loop.py"))
        .env("MARK", &mark)
        .timeout(2)
        .spawn();
    // While it runs, its cgroup exists (root mode): the after-check below
    // is then known to look in the right place.
    let mut saw_cgroup = false;
    while !run.has_exited() {
        saw_cgroup |= corral_cgroups().difference(&before.cgroups).count() > 0;
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = run.wait();
    o.assert_exit_follows_status();
    if !o.rlimit_mode() {
        assert!(
            saw_cgroup,
            "no cgroup under /sys/fs/cgroup/*/corral/ during the run"
        );
    }
    assert_eq!(o.status(), "timeout", "{}", o.dump());
    assert!(o.has_line("SPINNING"), "program never ran\n{}", o.dump());
    let ms = o.execution_time_ms();
    assert!(
        (1500..4000).contains(&ms),
        "execution_time_ms={ms}\n{}",
        o.dump()
    );
    assert!(o.wall < Duration::from_secs(10), "took {:?}", o.wall);
    assert!(o.j()["error_message"].is_string(), "{}", o.dump());
    assert_no_procs(&mark);
    before.assert_nothing_left();
}

/// `kill -9` of the `corral run` process itself (threat model H9): its sandbox dies with init's
/// control pipe, and the cgroup the killed process never removed is removed by the next run.
#[test]
fn a_killed_corral_run_leaves_nothing_once_the_next_run_is_done() {
    let _g = exclusive();
    let before = Snapshot::take();
    let mark = marker("orphan");
    let tag = format!("proc-{mark}");
    let run = Run::python(
        "import os, sys\n\
         os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(120)', \
         'proc-' + os.environ['MARK']])\n",
    )
    .env("MARK", &mark)
    .timeout(120)
    .spawn();
    let started = Instant::now();
    while procs_with(&tag).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the program never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let orphaned: Vec<_> = corral_cgroups()
        .difference(&before.cgroups)
        .cloned()
        .collect();
    let killed = Command::new("kill")
        .args(["-9", &run.pid().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    drop(run); // reaps the killed corral process
    assert_no_procs(&tag);
    // Root mode: the killed process's teardown never ran, so its cgroup is still there (no
    // other Corral process runs meanwhile: every test holds the lock, this one exclusively).
    for dir in &orphaned {
        assert!(
            dir.exists(),
            "{} was removed before the next run",
            dir.display()
        );
    }

    let next = Run::python("print('NEXT')").run();
    assert_eq!(next.status(), "success", "{}", next.dump());
    assert!(next.has_line("NEXT"), "{}", next.dump());
    before.assert_nothing_left();
}

#[test]
fn timeout_exit_code_without_json_is_124() {
    let _g = shared();
    let start = Instant::now();
    let o = Run::python("while True:\n    pass\n")
        .timeout(1)
        .without_json()
        .run();
    assert_eq!(o.exit.and_then(|e| e.code()), Some(124), "{}", o.dump());
    assert!(start.elapsed() < Duration::from_secs(8));
}

#[test]
fn timeout_survives_signals_to_init_and_sigstop() {
    let _g = shared();
    let mark = marker("freeze");
    let o = Run::python(include_str!("attacks/freeze_supervisor.py"))
        .env("MARK", &mark)
        .timeout(2)
        .run();
    o.assert_exit_follows_status();
    assert!(o.has_line("FREEZING"), "program never ran\n{}", o.dump());
    assert_eq!(o.status(), "timeout", "{}", o.dump());
    assert!(o.wall < Duration::from_secs(10), "took {:?}", o.wall);
    assert_no_procs(&mark);
}

#[test]
fn crashes_leave_no_core_and_never_reach_a_core_helper() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/core_dump.py")).run();
    o.assert_completed();
    o.assert_no_escape();
    assert_eq!(o.value("CORELIMIT"), "1 1", "{}", o.dump());
    o.assert_blocked("raise-core-limit", &["EPERM", "EINVAL"]);
    assert_eq!(
        o.value("CRASH"),
        "-6",
        "the child must die of SIGABRT\n{}",
        o.dump()
    );
    assert_eq!(
        o.value("CORES"),
        "0",
        "a core file was written\n{}",
        o.dump()
    );
}
