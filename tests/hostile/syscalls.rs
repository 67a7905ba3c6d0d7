//! The seccomp allow-list: dangerous system calls fail with EPERM (clone3
//! with ENOSYS so libc falls back to clone, whose flags can be filtered).

use crate::harness::*;
use crate::host::*;
use std::time::{Instant, SystemTime};

#[test]
fn ptrace_traceme_and_attach() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/ptrace.py"))
        .env("HOST_PID", std::process::id().to_string())
        .run();
    o.assert_completed();
    o.assert_no_escape();
    for what in [
        "ptrace-traceme",
        "ptrace-attach-pid1",
        "ptrace-seize-pid1",
        "ptrace-attach-child",
        "ptrace-attach-hostpid",
    ] {
        o.assert_blocked(what, EPERM);
    }
}

#[test]
fn mount_and_umount_denied() {
    // Exclusive: compares the host's mount table before and after.
    let _g = exclusive();
    let before = Snapshot::take();
    let o = Run::python(include_str!("attacks/mount.py")).run();
    o.assert_completed();
    o.assert_no_escape();
    for what in [
        "mount-tmpfs",
        "mount-proc",
        "mount-bind-root",
        "remount-root-rw",
        "remount-usr-rw",
        "umount-proc",
        "umount-tmp-detach",
        "umount-root-detach",
    ] {
        o.assert_blocked(what, EPERM);
    }
    // The new mount API: denied, or absent on old kernels.
    for what in ["fsopen", "open-tree-clone", "move-mount"] {
        o.assert_blocked(what, &["EPERM", "ENOSYS"]);
    }
    assert_ne!(
        o.value("MOUNT-BINARY"),
        "0",
        "setuid mount(8) succeeded\n{}",
        o.dump()
    );
    assert_eq!(o.value("MOUNTINFO-UNCHANGED"), "True", "{}", o.dump());
    before.assert_nothing_left();
}

#[test]
fn unshare_namespaces_denied() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/unshare.py")).run();
    o.assert_completed();
    o.assert_no_escape();
    for ns in [
        "newuser",
        "newns",
        "newnet",
        "newpid",
        "newuts",
        "newipc",
        "newcgroup",
        "newtime",
        "user-net",
    ] {
        o.assert_blocked(&format!("unshare-{ns}"), EPERM);
    }
    assert_eq!(o.value("NS-UNCHANGED"), "True", "{}", o.dump());
    assert_ne!(
        o.value("UNSHARE-BINARY"),
        "0",
        "unshare -r succeeded\n{}",
        o.dump()
    );
}

#[test]
fn setns_denied() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/setns.py")).run();
    o.assert_completed();
    o.assert_no_escape();
    for ns in ["user", "mnt", "net", "pid", "uts", "ipc", "cgroup"] {
        o.assert_blocked(&format!("setns-self-{ns}"), EPERM);
        // pid 1's ns files may not even be openable (ptrace access check).
        o.assert_blocked(&format!("setns-1-{ns}"), &["EPERM", "EACCES", "ENOENT"]);
    }
}

#[test]
fn clone_with_namespace_flags_and_clone3_denied() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/clone_ns.py")).run();
    o.assert_completed();
    o.assert_no_escape();
    for what in [
        "clone-newuser",
        "clone-newnet",
        "clone-newpid",
        "clone-newns",
        "clone-newuser-newnet",
    ] {
        o.assert_blocked(what, EPERM);
    }
    o.assert_blocked("clone3-plain", &["ENOSYS"]);
    o.assert_blocked("clone3-newuser", &["ENOSYS", "EPERM"]);
    // Ordinary process and thread creation still work.
    assert_eq!(o.value("FORK"), "7", "{}", o.dump());
    assert!(o.has_line("THREAD ok"), "{}", o.dump());
}

#[test]
fn keyring_syscalls_denied() {
    let _g = shared();
    let mark = marker("key");
    let o = Run::python(include_str!("attacks/keyring.py"))
        .env("MARK", &mark)
        .run();
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("keyctl-join", EPERM);
    o.assert_blocked("keyctl-get-user", EPERM);
    o.assert_blocked("add-key", &["EPERM", "ENOSYS"]);
    o.assert_blocked("request-key", &["EPERM", "ENOSYS"]);
    // The host keyrings list no key carrying our marker.
    let keys = std::fs::read_to_string("/proc/keys").unwrap_or_default();
    assert!(!keys.contains(&mark), "key added on the host: {keys}");
}

#[test]
fn bpf_denied() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/bpf.py")).run();
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("bpf-map-create", EPERM);
    o.assert_blocked("bpf-prog-load", EPERM);
}

#[test]
fn perf_event_open_denied() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/perf_event.py")).run();
    o.assert_completed();
    o.assert_no_escape();
    for what in ["perf-self", "perf-cpu-wide", "perf-hw"] {
        o.assert_blocked(what, EPERM);
    }
}

#[test]
fn userfaultfd_denied() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/userfaultfd.py")).run();
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("userfaultfd", EPERM);
    o.assert_blocked("userfaultfd-user-mode", EPERM);
    o.assert_blocked("dev-userfaultfd", NO_FILE);
}

#[test]
fn io_uring_denied() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/io_uring.py")).run();
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("io-uring-setup", EPERM);
    o.assert_blocked("io-uring-enter", EPERM);
    o.assert_blocked("io-uring-register", EPERM);
}

#[test]
fn kernel_module_loading_denied() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/kernel_modules.py")).run();
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("init-module", EPERM);
    o.assert_blocked("finit-module", EPERM);
    o.assert_blocked("delete-module", EPERM);
}

#[test]
fn kexec_reboot_and_swapon_denied() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/kexec_reboot.py")).run();
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("kexec-load", EPERM);
    o.assert_blocked("kexec-file-load", EPERM);
    o.assert_blocked("reboot", EPERM);
    o.assert_blocked("swapon", EPERM);
}

#[test]
fn clock_cannot_be_changed() {
    let _g = shared();
    let (wall0, mono0) = (SystemTime::now(), Instant::now());
    let o = Run::python(include_str!("attacks/clock.py")).run();
    let (wall1, mono1) = (SystemTime::now(), Instant::now());
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("settimeofday", EPERM);
    o.assert_blocked("clock-settime", EPERM);
    o.assert_blocked("clock-adjtime", EPERM);
    o.assert_blocked("adjtimex", EPERM);
    // Wall clock advanced like the monotonic clock: nobody shifted it.
    let wall = wall1
        .duration_since(wall0)
        .unwrap_or_default()
        .as_secs_f64();
    let mono = mono1.duration_since(mono0).as_secs_f64();
    assert!(
        (wall - mono).abs() < 2.0,
        "host clock moved: wall {wall}s vs mono {mono}s"
    );
}

#[test]
fn hostname_cannot_be_changed() {
    let _g = shared();
    let before = hostname();
    let mark = marker("uts");
    let o = Run::python(include_str!("attacks/hostname.py"))
        .env("MARK", &mark)
        .run();
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("sethostname", EPERM);
    o.assert_blocked("setdomainname", EPERM);
    assert_eq!(o.value("HOSTNAME"), "corral", "{}", o.dump());
    assert_eq!(hostname(), before, "host hostname changed");
}

#[test]
fn mknod_devices_denied() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/mknod.py")).run();
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("mknodat-mem", EPERM);
    o.assert_blocked("mknodat-disk", EPERM);
    o.assert_blocked("os-mknod-kmsg", EPERM);
    if cfg!(target_arch = "x86_64") {
        o.assert_blocked("mknod-port", EPERM);
    }
    for l in o.values("EXISTS") {
        assert!(
            l.ends_with(" False"),
            "device node created: {l}\n{}",
            o.dump()
        );
    }
}

#[test]
fn tiocsti_injection_denied() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/tiocsti.py")).run();
    o.assert_completed();
    o.assert_no_escape();
    // Seccomp answers EPERM before the kernel looks at the fd; without a
    // terminal the kernel would say ENOTTY, so accept that too for pipes.
    o.assert_blocked("tiocsti-fd0", &["EPERM", "ENOTTY"]);
    o.assert_blocked("tiocsti-fd1", &["EPERM", "ENOTTY"]);
    o.assert_blocked("tiocsti-devtty", &["EPERM", "ENXIO", "ENOENT", "EIO"]);
    // On a real terminal only seccomp stops it.
    o.assert_blocked("tiocsti-pty", &["EPERM", "EIO"]);
}
