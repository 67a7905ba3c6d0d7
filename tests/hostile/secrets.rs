//! Host secrets: planted files, the corral process's environment, /etc.

use crate::harness::*;
use crate::host::*;

#[test]
fn host_secret_by_absolute_path() {
    let _g = shared();
    let s = HostSecret::plant();
    let o = Run::python(include_str!("attacks/read_host_secret.py"))
        .env("HOST_SECRET_PATH", s.path_str())
        .env("HOST_SECRET_DIR", s.dir_str())
        .run();
    o.assert_completed();
    o.assert_no_escape();
    for what in ["abs-read", "abs-stat", "abs-listdir", "abs-parent-listdir"] {
        o.assert_blocked(what, NO_FILE_OR_ACCESS);
    }
    o.assert_absent(&s.token);
    s.assert_unchanged();
}

#[test]
fn host_secret_via_proc_root_links() {
    let _g = shared();
    let s = HostSecret::plant();
    let o = Run::python(include_str!("attacks/read_secret_via_proc_root.py"))
        .env("HOST_SECRET_PATH", s.path_str())
        .run();
    o.assert_completed();
    o.assert_no_escape();
    for what in [
        "proc1-root",
        "self-root-dotdot",
        "self-root-deep-dotdot",
        "proc1-cwd-dotdot",
        "thread-self-root",
    ] {
        o.assert_blocked(what, NO_FILE_OR_ACCESS);
    }
    o.assert_absent(&s.token);
    s.assert_unchanged();
}

#[test]
fn host_secret_via_host_pid_guessing() {
    let _g = shared();
    let s = HostSecret::plant();
    let o = Run::python(include_str!("attacks/read_secret_via_host_pid.py"))
        .env("HOST_SECRET_PATH", s.path_str())
        .env("HOST_PID", std::process::id().to_string())
        .run();
    o.assert_completed();
    o.assert_no_escape();
    // Our pid does not exist in the sandbox's pid namespace.
    for what in ["hostpid-root", "hostpid-environ", "hostpid-cmdline"] {
        o.assert_blocked(what, NO_FILE_OR_ACCESS);
    }
    o.assert_blocked("hostpid-signal", &["ESRCH", "EPERM"]);
    o.assert_blocked("pid-sweep", NO_FILE);
    assert!(o.value("SWEPT").parse::<u32>().unwrap() > 4000);
    o.assert_absent(&s.token);
    s.assert_unchanged();
}

#[test]
fn host_secret_not_found_by_filesystem_walk() {
    let _g = shared();
    let s = HostSecret::plant();
    let o = Run::python(include_str!("attacks/search_filesystem.py"))
        .env("HOST_SECRET_PATH", s.path_str())
        .run();
    o.assert_completed();
    o.assert_no_escape();
    assert!(
        o.value("WALKED").parse::<u32>().unwrap() > 10,
        "{}",
        o.dump()
    );
    // The root is the sandbox's: it has the workspace and no host dirs.
    let root: Vec<&str> = o.value("ROOTDIR").split(' ').collect();
    assert!(root.contains(&"workspace"), "{}", o.dump());
    for host_only in ["root", "home", "sys", "boot", "srv", "mnt", "media", "snap"] {
        assert!(
            !root.contains(&host_only),
            "host dir /{host_only} visible\n{}",
            o.dump()
        );
    }
    o.assert_absent(&s.token);
    s.assert_unchanged();
}

#[test]
fn host_environment_not_visible() {
    let _g = shared();
    let token = marker("envsecret");
    let o = Run::python(include_str!("attacks/dump_environment.py"))
        .host_env("CORRAL_HOSTILE_SECRET", &token)
        .host_env("AWS_SECRET_ACCESS_KEY", &token)
        .run();
    o.assert_completed();
    o.assert_no_escape();
    // Non-vacuous: the sandbox's own environ was readable and dumped.
    let dumped = o.values("ENVIRON");
    assert!(
        dumped.iter().any(|l| l.starts_with("/proc/self/environ ")),
        "own environ not dumped\n{}",
        o.dump()
    );
    assert!(
        !o.value("ENV").contains("CORRAL_HOSTILE_SECRET"),
        "{}",
        o.dump()
    );
    assert!(
        !o.value("ENV").contains("AWS_SECRET_ACCESS_KEY"),
        "{}",
        o.dump()
    );
    o.assert_absent(&token);
}

/// Signal state is the caller's too: an ignored signal stays ignored across `execve`, and
/// Corral's runtime (like many a supervisor) ignores SIGPIPE. The program must start with
/// every disposition at its default, or `yes | head` prints "Broken pipe" instead of ending.
#[test]
fn host_signal_dispositions_not_inherited() {
    let _g = shared();
    let o = Run::bash(
        "grep -E '^Sig(Ign|Blk):' /proc/self/status\n\
         yes | head -n 1 >/dev/null\n\
         echo \"YES-STATUS ${PIPESTATUS[0]}\"\n",
    )
    .run();
    assert_eq!(o.status(), "success", "{}", o.dump());
    for line in ["SigIgn:\t0000000000000000", "SigBlk:\t0000000000000000"] {
        assert!(o.stdout().contains(line), "{line:?} missing\n{}", o.dump());
    }
    // 128 + SIGPIPE: `yes` was killed by the signal, not told EPIPE.
    assert!(o.stdout().contains("YES-STATUS 141"), "{}", o.dump());
    assert!(!o.stderr().contains("Broken pipe"), "{}", o.dump());
}

#[test]
fn etc_is_synthetic_without_host_accounts() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/etc_is_synthetic.py")).run();
    o.assert_completed();
    o.assert_no_escape();
    for what in [
        "etc-shadow",
        "etc-gshadow",
        "etc-sudoers",
        "etc-ssh-hostkey",
    ] {
        o.assert_blocked(what, NO_FILE_OR_ACCESS);
    }
    for what in ["root-home", "home", "var-run-docker"] {
        o.assert_blocked(what, NO_FILE_OR_ACCESS);
    }
    // /run, if present, holds only Corral's own files, nothing of the host's
    // /run (sockets, pid files, credentials).
    let run: Vec<&str> = o.value("RUN").split(' ').collect();
    for e in std::fs::read_dir("/run").into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        assert!(
            name == "corral" || !run.contains(&name.as_str()),
            "host /run/{name} visible in the sandbox\n{}",
            o.dump()
        );
    }
    // The sandbox's /etc/passwd is not the host's: locally created host
    // accounts (uid >= 100, e.g. the rootless test user) are absent.
    let sandbox_users: Vec<&str> = o
        .value("PASSWD")
        .split('|')
        .filter_map(|l| l.split(':').next())
        .collect();
    let host_passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    for line in host_passwd.lines() {
        let f: Vec<&str> = line.split(':').collect();
        let uid: u32 = f.get(2).and_then(|u| u.parse().ok()).unwrap_or(0);
        if uid >= 100 && uid != 65534 && f[0] != "sandbox" {
            assert!(
                !sandbox_users.contains(&f[0]),
                "host account {} visible in the sandbox\n{}",
                f[0],
                o.dump()
            );
        }
    }
    assert_eq!(
        o.value("IDENTITY"),
        "1000 1000 sandbox /workspace /workspace",
        "{}",
        o.dump()
    );
}

#[test]
fn host_paths_from_the_command_line_not_visible() {
    let _g = shared();
    let base = tempfile::Builder::new().prefix("hx-").tempdir().unwrap();
    let mark = marker("cmdline");
    let out = base.path().join(format!("client-{mark}"));
    let o = Run::python(include_str!("attacks/host_cmdline.py"))
        .out(&out)
        .run();
    o.assert_completed();
    assert!(o.values("PROCFILE").len() >= 2, "{}", o.dump());
    assert!(o.value("MOUNTINFO").contains("workspace"), "{}", o.dump());
    // Neither the --out path nor corral's own host location leaks.
    o.assert_absent(&mark);
    let bin = corral_bin();
    let bin_dir = bin.parent().unwrap().to_str().unwrap();
    assert!(
        !o.stdout().contains(bin_dir),
        "corral's host path visible\n{}",
        o.dump()
    );
}
