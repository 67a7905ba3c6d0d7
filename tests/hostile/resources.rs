//! Resource exhaustion: memory, disk, /dev/shm, output volume.

use crate::harness::*;
use crate::host::*;
use std::time::{Duration, Instant};

/// Largest `KEY n` value printed by the program.
fn max_value(o: &Outcome, key: &str) -> u64 {
    o.values(key)
        .iter()
        .filter_map(|v| v.split(' ').next_back()?.parse().ok())
        .max()
        .unwrap_or(0)
}

#[test]
fn memory_bomb_is_stopped() {
    let _g = exclusive();
    let before = Snapshot::take();
    let o = Run::python(include_str!("attacks/memory_bomb.py"))
        .memory("64M")
        .timeout(20)
        .run();
    o.assert_started();
    o.assert_no_escape();
    let peak = max_value(&o, "ALLOCATED");
    assert!(peak >= 8, "bomb did not allocate\n{}", o.dump());
    assert!(
        peak <= 72,
        "allocated {peak} MiB with --memory 64M\n{}",
        o.dump()
    );
    // Both modes report the limit: the cgroup's OOM kill, or under the rlimit fallback an
    // allocation refused by RLIMIT_DATA (a MemoryError inside the program) with the peak
    // near the limit.
    assert_eq!(o.status(), "memory_limit", "{}", o.dump());
    let message = o.j()["error_message"].as_str().unwrap_or_default();
    assert!(message.contains("64 MiB memory limit"), "{}", o.dump());
    if o.rlimit_mode() {
        assert!(
            o.stderr().contains("MemoryError") || o.stderr().contains("Cannot allocate memory"),
            "{}",
            o.dump()
        );
    }
    assert_host_can_fork();
    before.assert_nothing_left();
}

/// A memory bomb in a session, with a kernel started directly and one forked from a zygote,
/// is stopped near the limit and reported as `memory_limit` in both modes: the cgroup's OOM
/// kill ends the session; under the rlimit fallback the refused allocation is a MemoryError
/// that the kernel survives, judged by the rule of one-shot runs, and the session stays
/// usable.
#[test]
fn session_memory_bomb_is_stopped() {
    use corral_kernel::{Language, Session, SessionOptions, Zygote, ZygoteKind};
    use corral_sandbox::{Rootfs, Status};

    let _g = exclusive();
    let before = Snapshot::take();
    let bomb = "hog = []\nwhile len(hog) < 1024:\n    hog.append(b'\\x01' * (1 << 20))\n    \
                print('ALLOCATED', len(hog), flush=True)\n";
    {
        let mut options = SessionOptions::new(Language::Python);
        options.limits.memory_bytes = 128 << 20;
        let zygote = Zygote::start(&Rootfs::Host, &[], Default::default(), ZygoteKind::Full)
            .expect("the zygote starts");
        let sessions = [
            (
                "direct",
                Session::create(&options).expect("a session starts"),
            ),
            (
                "zygote",
                zygote.fork_session(&options).expect("a session forks"),
            ),
        ];
        for (how, mut s) in sessions {
            let r = s.execute(bomb, Duration::from_secs(30), &mut |_| {});
            let allocated = r
                .stdout
                .lines()
                .filter_map(|l| l.strip_prefix("ALLOCATED ")?.parse::<u64>().ok())
                .max()
                .unwrap_or(0);
            assert!(allocated >= 8, "{how}: the bomb did not allocate: {r:?}");
            assert!(allocated <= 136, "{how}: allocated {allocated} MiB of 128");
            assert_eq!(r.status, Status::MemoryLimit, "{how}: {r:?}");
            let message = r.error_message.as_deref().unwrap_or_default();
            assert!(message.contains("128 MiB memory limit"), "{how}: {r:?}");
            let rlimit_mode = s.warnings().iter().any(|w| w.contains("rlimit"));
            if rlimit_mode {
                assert!(s.is_alive(), "{how}: {r:?}");
                let after = s.execute("del hog\n1 + 1", Duration::from_secs(30), &mut |_| {});
                assert_eq!(after.status, Status::Success, "{how}: {after:?}");
            } else {
                assert!(!s.is_alive(), "{how}: the OOM kill ends the session: {r:?}");
            }
        }
    }
    assert_host_can_fork();
    before.assert_nothing_left();
}

#[test]
fn disk_fill_stops_at_disk_limit() {
    let _g = shared();
    let mark = marker("fill");
    let o = Run::python(include_str!("attacks/disk_fill.py"))
        .env("MARK", &mark)
        .disk("16M")
        .run();
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("fill-tmp", &["ENOSPC", "EFBIG"]);
    o.assert_blocked("fill-workspace", &["ENOSPC", "EFBIG"]);
    for area in ["/tmp", "/workspace"] {
        let wrote: u64 = o
            .values("WROTE")
            .iter()
            .find_map(|l| l.strip_prefix(&format!("{area} ")))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no WROTE {area}\n{}", o.dump()));
        assert!(
            (8 << 20..=17 << 20).contains(&wrote),
            "{area}: wrote {wrote} bytes with --disk 16M\n{}",
            o.dump()
        );
    }
    assert_no_host_file_named(&mark);
}

#[test]
fn huge_file_beyond_disk_limit_fails() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/huge_file.py"))
        .disk("16M")
        .run();
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("huge-sequential", &["ENOSPC", "EFBIG"]);
    let seq: u64 = o.value("SEQUENTIAL").parse().unwrap();
    assert!(seq <= 17 << 20, "wrote {seq} bytes\n{}", o.dump());
    // RLIMIT_FSIZE (§8) stops files larger than the disk even when sparse.
    o.assert_blocked("huge-sparse-write", &["EFBIG", "ENOSPC"]);
    o.assert_blocked("huge-ftruncate", &["EFBIG", "ENOSPC", "EINVAL"]);
}

#[test]
fn dev_shm_fill_is_bounded() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/shm_fill.py"))
        .disk("16M")
        .memory("64M")
        .timeout(20)
        .run();
    o.assert_started();
    o.assert_no_escape();
    let wrote = max_value(&o, "WROTE");
    assert!(wrote <= 72, "wrote {wrote} MiB to /dev/shm\n{}", o.dump());
    if o.status() != "memory_limit" {
        o.assert_blocked("shm-fill", &["ENOSPC", "ENOENT", "EFBIG", "ENOMEM"]);
    }
}

/// Peak resident memory of a running corral process, polled.
fn vm_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

#[test]
fn output_flood_is_truncated_at_cap() {
    let _g = shared();
    let start = Instant::now();
    let mut run = Run::python(include_str!("attacks/output_flood.py"))
        .timeout(20)
        .spawn();
    let pid = run.pid();
    let mut peak_rss = 0;
    while !run.has_exited() && start.elapsed() < Duration::from_secs(60) {
        peak_rss = peak_rss.max(vm_rss_kib(pid));
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = run.wait();
    o.assert_exit_follows_status();
    assert!(
        !["sandbox_error", "timeout"].contains(&o.status()),
        "{}",
        o.dump()
    );
    assert!(o.wall < Duration::from_secs(20), "flood took {:?}", o.wall);
    assert_eq!(o.j()["stdout_truncated"], true, "{}", o.dump());
    assert_eq!(o.j()["stderr_truncated"], true, "{}", o.dump());
    let (out, err) = (o.stdout(), o.stderr());
    assert!(out.starts_with("START\nAAAA"), "{}", o.dump());
    assert!(out.len() <= OUTPUT_CAP, "stdout {} bytes > cap", out.len());
    assert!(err.len() <= OUTPUT_CAP, "stderr {} bytes > cap", err.len());
    assert!(
        out.len() >= OUTPUT_CAP / 2,
        "stdout only {} bytes",
        out.len()
    );
    // corral streamed and discarded, it did not buffer 200 MiB.
    assert!(peak_rss < 96 * 1024, "corral peaked at {peak_rss} KiB RSS");
}

/// A sandbox that takes every inotify instance its user may hold leaves the caller's own
/// allowance usable: as root the sandbox's user namespace belongs to its own host uid (made
/// by root, every sandbox would be charged to root, and root's daemons could no longer watch
/// files); rootless it may take only its share of the caller's.
#[test]
fn per_user_kernel_counts_stay_the_sandboxes_own() {
    let _g = exclusive();
    let before = Snapshot::take();
    let mut running = Run::python(include_str!("attacks/inotify_hold.py"))
        .env("HOLD", "3")
        .timeout(20)
        .spawn();
    let mut refused = Vec::new();
    let mut probes = 0;
    while !running.has_exited() {
        if let Err(e) = nix::sys::inotify::Inotify::init(nix::sys::inotify::InitFlags::empty()) {
            refused.push(e.to_string());
        }
        probes += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = running.wait();
    o.assert_completed();
    o.assert_blocked("inotify-instances", &["EMFILE"]);
    let held: u32 = o.value("INOTIFY").parse().unwrap();
    assert!(
        held >= 32,
        "the sandbox held only {held} instances\n{}",
        o.dump()
    );
    assert!(
        probes > 50,
        "only {probes} probes while the sandbox held its instances"
    );
    assert!(
        refused.is_empty(),
        "while the sandbox held {held} inotify instances the caller could not make one \
         ({} of {probes} probes refused: {:?})\n{}",
        refused.len(),
        refused.first(),
        o.dump()
    );
    before.assert_nothing_left();
}
