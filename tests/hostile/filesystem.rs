//! The sandbox's filesystem view: read-only root, private /tmp and
//! /dev/shm, minimal /dev, no /sys, no way back to the host's root.

use crate::harness::*;
use crate::host::*;
use std::path::Path;

#[test]
fn rootfs_writes_fail() {
    let _g = shared();
    let mark = marker("rootfs");
    let passwd_before = digest(Path::new("/etc/passwd"));
    let python = std::fs::canonicalize("/usr/bin/python3").unwrap();
    let python_before = (
        digest(&python),
        std::fs::metadata(&python).unwrap().modified().unwrap(),
    );
    // A first Python run fills the image's bytecode cache, which later runs bind read-only.
    Run::python("print('DONE')").run().assert_completed();
    let o = Run::python(include_str!("attacks/write_rootfs.py"))
        .env("MARK", &mark)
        .run();
    o.assert_completed();
    o.assert_no_escape();
    // The runner, its library and the code policy.
    assert_eq!(o.value("RUNTIME-BYTECODE"), "3", "{}", o.dump());
    for what in [
        "create-runtime",
        "overwrite-runtime-bytecode",
        "create-usr-bin",
        "create-etc",
        "create-root",
        "mkdir-root",
        "append-etc-passwd",
        "chmod-python",
        "utime-python",
        "symlink-in-lib",
    ] {
        o.assert_blocked(what, READ_ONLY);
    }
    o.assert_blocked("rename-in-usr-bin", &["EROFS", "EACCES", "EPERM", "ENOENT"]);
    // Host unchanged.
    assert_no_host_file_named(&mark);
    assert!(!Path::new(&format!("/usr/lib/pwn-{mark}")).exists());
    assert_eq!(digest(Path::new("/etc/passwd")), passwd_before);
    let python_after = (
        digest(&python),
        std::fs::metadata(&python).unwrap().modified().unwrap(),
    );
    assert_eq!(python_after, python_before, "host python binary modified");
}

/// Parses `MOUNT <point> <fstype> <opts> <super opts>` lines.
fn mount_of<'a>(o: &'a Outcome, point: &str) -> Option<Vec<&'a str>> {
    o.values("MOUNT")
        .into_iter()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .rfind(|f| f.len() == 4 && f[0] == point)
}

#[test]
fn mounts_are_readonly_nosuid_and_scratch_is_tmpfs() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/mount_flags.py"))
        .disk("16M")
        .run();
    o.assert_completed();
    // The root and any bound host tree: read-only, nosuid, nodev (§8).
    let root = mount_of(&o, "/").unwrap_or_else(|| panic!("no / mount\n{}", o.dump()));
    for point in ["/", "/usr", "/lib", "/bin", "/etc"] {
        let Some(f) = mount_of(&o, point) else {
            continue; // part of the root mount
        };
        let opts: Vec<&str> = f[2].split(',').collect();
        for want in ["ro", "nosuid", "nodev"] {
            assert!(
                opts.contains(&want),
                "{point} mounted without {want}: {f:?}\n{}",
                o.dump()
            );
        }
    }
    assert!(root[2].split(',').any(|x| x == "ro"), "{}", o.dump());
    // Scratch space lives in memory with a size limit, never on host disk.
    for point in ["/tmp", "/workspace"] {
        let f = mount_of(&o, point).unwrap_or_else(|| panic!("{point} not a mount\n{}", o.dump()));
        assert_eq!(f[1], "tmpfs", "{point} is not tmpfs: {f:?}\n{}", o.dump());
        assert!(
            f[3].contains("size=16384k"),
            "{point} lacks size=16M: {f:?}\n{}",
            o.dump()
        );
    }
}

#[test]
fn proc_sys_writes_fail() {
    let _g = shared();
    let mark = marker("procsys");
    let hostname_before = hostname();
    let core_before = std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap();
    let modprobe_before = std::fs::read_to_string("/proc/sys/kernel/modprobe").ok();
    let o = Run::python(include_str!("attacks/proc_sys_writes.py"))
        .env("MARK", &mark)
        .run();
    o.assert_completed();
    o.assert_no_escape();
    for what in ["proc-hostname", "proc-core-pattern", "proc-drop-caches"] {
        o.assert_blocked(what, READ_ONLY);
    }
    // Absent when the kernel has no module support.
    o.assert_blocked("proc-modprobe", &["EROFS", "EACCES", "EPERM", "ENOENT"]);
    o.assert_blocked(
        "proc-sysrq-trigger",
        &["EROFS", "EACCES", "EPERM", "ENOENT"],
    );
    o.assert_blocked("oom-score-adj-lower", &["EACCES", "EPERM"]);
    assert_eq!(hostname(), hostname_before, "host hostname changed");
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap(),
        core_before,
        "host core_pattern changed"
    );
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/modprobe").ok(),
        modprobe_before
    );
}

#[test]
fn dangerous_devices_absent() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/dev_devices.py")).run();
    o.assert_completed();
    o.assert_no_escape();
    for name in [
        "kvm",
        "mem",
        "kmem",
        "port",
        "kmsg",
        "vda",
        "sda",
        "nvme0n1",
        "fuse",
        "net-tun",
        "loop0",
        "loop-control",
        "vsock",
        "vhost-net",
        "dri-card0",
        "input-event0",
        "cpu-0-msr",
        "hwrng",
        "watchdog",
    ] {
        o.assert_blocked(&format!("dev-{name}"), NO_FILE);
    }
}

#[test]
fn dev_contains_only_safe_devices() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/dev_devices.py")).run();
    o.assert_completed();
    // null zero full random urandom tty ptmx (+ pts instances).
    let safe = ["1:3", "1:5", "1:7", "1:8", "1:9", "5:0", "5:2"];
    let devs = o.values("DEV");
    assert!(
        devs.iter().any(|d| d.starts_with("null chr 1:3")),
        "{}",
        o.dump()
    );
    for d in devs {
        let f: Vec<&str> = d.split(' ').collect();
        assert_ne!(
            f[1],
            "blk",
            "block device in sandbox /dev: {d}\n{}",
            o.dump()
        );
        if f[1] == "chr" {
            assert!(
                safe.contains(&f[2]),
                "unexpected device /dev/{d}\n{}",
                o.dump()
            );
        }
    }
}

#[test]
fn sys_is_absent() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/sys_absent.py")).run();
    o.assert_completed();
    o.assert_no_escape();
    for what in [
        "sys-list",
        "sys-cgroup",
        "sys-class-net",
        "sys-kernel-notes",
        "sys-dmi",
    ] {
        o.assert_blocked(what, NO_FILE);
    }
}

#[test]
fn kernel_memory_and_addresses_hidden() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/kernel_info.py")).run();
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("proc-kcore", &["EACCES", "EPERM", "ENOENT"]);
    o.assert_blocked("proc-kmsg", &["EACCES", "EPERM", "ENOENT"]);
    o.assert_blocked("kallsyms", &["ZEROED", "EACCES", "EPERM", "ENOENT"]);
    o.assert_blocked("syslog-read", EPERM);
}

/// `/proc` files that name the host (its boot line, kernel build, hardware, disks, boot id)
/// are masked, for both ways a one-shot sandbox is started.
#[test]
fn host_identifying_proc_files_are_masked() {
    let _g = shared();
    let host_cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    for caller in CALLERS {
        let o = Run::python(include_str!("attacks/host_proc_files.py"))
            .caller(caller)
            .run();
        o.assert_completed();
        o.assert_no_escape();
        let hidden = &["EMPTY", "ENOENT", "EACCES", "EPERM"];
        for name in [
            "cmdline",
            "bootconfig",
            "config.gz",
            "modules",
            "kallsyms",
            "iomem",
            "ioports",
            "interrupts",
            "devices",
            "misc",
            "consoles",
            "crypto",
            "partitions",
            "diskstats",
            "swaps",
            "buddyinfo",
            "zoneinfo",
            "pagetypeinfo",
            "sys/kernel/random/boot_id",
            "bus",
            "fs",
            "irq",
            "driver",
            "scsi",
            "acpi",
            "asound",
        ] {
            o.assert_blocked(name, hidden);
        }
        for secret in [host_cmdline.trim(), boot_id.trim()] {
            if !secret.is_empty() {
                o.assert_absent(secret);
            }
        }
        // The mount table names no host path: not the image store, not corral's location.
        let mounts = o.value("MOUNTS");
        let bin = corral_bin();
        for host_path in [bin.parent().unwrap().to_str().unwrap(), "/var/lib/corral"] {
            assert!(
                !mounts.contains(host_path),
                "{caller:?}: /proc/mounts names {host_path}\n{}",
                o.dump()
            );
        }
    }
}

#[test]
fn tmp_and_dev_shm_are_private() {
    let _g = shared();
    let mark = marker("tmpshm");
    // Planted on the host, world-readable.
    let planted: Vec<_> = ["/tmp", "/dev/shm"]
        .iter()
        .map(|d| Path::new(d).join(format!("planted-{mark}")))
        .filter(|p| std::fs::write(p, &mark).is_ok())
        .collect();
    assert!(!planted.is_empty());
    let o = Run::python(include_str!("attacks/tmp_shm_private.py"))
        .env("MARK", &mark)
        .run();
    for p in &planted {
        let _ = std::fs::remove_file(p);
    }
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("host-tmp-file", NO_FILE);
    o.assert_blocked("host-shm-file", NO_FILE);
    for l in o.values("LIST") {
        assert!(
            !l.contains("planted-"),
            "host file visible: {l}\n{}",
            o.dump()
        );
    }
    // Its writes succeeded in its own /tmp and workspace...
    assert!(
        o.has_line("CREATED /tmp") && o.has_line("CREATED /workspace"),
        "{}",
        o.dump()
    );
    // ...and did not reach the host.
    for d in ["/tmp", "/dev/shm"] {
        assert!(
            !Path::new(&format!("{d}/created-{mark}")).exists(),
            "created in host {d}"
        );
    }
    assert_no_host_file_named(&format!("created-{mark}"));
}

#[test]
fn proc_exe_cannot_be_overwritten() {
    let _g = shared();
    let corral = corral_bin();
    let corral_before = digest(&corral);
    let python = std::fs::canonicalize("/usr/bin/python3").unwrap();
    let python_before = digest(&python);
    let o = Run::python(include_str!("attacks/proc_exe_overwrite.py")).run();
    o.assert_completed();
    o.assert_no_escape();
    let busy_or_ro = &["ETXTBSY", "EACCES", "EROFS", "EPERM"];
    o.assert_blocked("self-exe-write", busy_or_ro);
    o.assert_blocked(
        "pid1-exe-write",
        &["ETXTBSY", "EACCES", "EROFS", "EPERM", "ENOENT"],
    );
    o.assert_blocked("python-binary-write", busy_or_ro);
    o.assert_blocked("self-exe-truncate", busy_or_ro);
    if o.values("BLOCKED")
        .iter()
        .any(|l| l.starts_with("pid-exe-write"))
    {
        o.assert_blocked(
            "pid-exe-write",
            &["ETXTBSY", "EACCES", "EROFS", "EPERM", "ENOENT"],
        );
    }
    assert_eq!(digest(&corral), corral_before, "corral binary modified");
    assert_eq!(digest(&python), python_before, "host python modified");
}

#[test]
fn cwd_dotdot_chroot_and_pivot_root_stay_inside() {
    let _g = shared();
    let s = HostSecret::plant();
    let o = Run::python(include_str!("attacks/proc_cwd_escape.py"))
        .env("HOST_SECRET_PATH", s.path_str())
        .run();
    o.assert_completed();
    o.assert_no_escape();
    for key in ["DOTDOT-ROOT", "CWD-ROOT"] {
        let names: Vec<&str> = o.value(key).split(' ').collect();
        assert!(
            names.contains(&"workspace"),
            "{key}: not the sandbox root\n{}",
            o.dump()
        );
        assert!(
            !names.contains(&"home"),
            "{key}: host root reached\n{}",
            o.dump()
        );
    }
    o.assert_blocked("self-cwd-dotdot", NO_FILE);
    o.assert_blocked("pid1-cwd-dotdot", NO_FILE_OR_ACCESS);
    o.assert_blocked("chroot", EPERM);
    o.assert_blocked("pivot-root", EPERM);
    o.assert_absent(&s.token);
    s.assert_unchanged();
}

#[test]
fn inherited_fds_do_not_reach_the_host() {
    let _g = shared();
    for caller in CALLERS {
        check_no_host_fds(caller);
    }
}

fn check_no_host_fds(caller: Caller) {
    let s = HostSecret::plant();
    let o = Run::python(include_str!("attacks/leaked_fds.py"))
        .env("HOST_SECRET_PATH", s.path_str())
        .caller(caller)
        .run();
    o.assert_completed();
    o.assert_no_escape();
    let fds = o.values("FD");
    assert!(fds.iter().any(|l| l.starts_with("self 0 ")), "{}", o.dump());
    let base = s.base.path().to_str().unwrap();
    for l in &fds {
        // No descriptor names a host location the sandbox cannot see.
        assert!(!l.contains(base), "fd to host path: {l}\n{}", o.dump());
        assert!(
            !l.contains("/sys/fs/cgroup"),
            "fd to host cgroup: {l}\n{}",
            o.dump()
        );
        assert!(
            !l.contains("/var/lib/"),
            "fd to host state dir: {l}\n{}",
            o.dump()
        );
    }
    o.assert_absent(&s.token);
    s.assert_unchanged();
}

#[test]
fn open_by_handle_at_shocker_fails() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/shocker.py")).run();
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("open-by-handle-2", EPERM);
    o.assert_blocked("open-by-handle-128", EPERM);
    o.assert_blocked("open-by-real-handle", &["EPERM", "ENOTSUP", "ENOSYS"]);
}
