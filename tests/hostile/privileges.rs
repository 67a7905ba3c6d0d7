//! Credentials: unprivileged uid/gid, no capabilities in any set,
//! no_new_privs, and no way back to root.

use crate::harness::*;

#[test]
fn no_capabilities_no_new_privs_and_seccomp() {
    let _g = shared();
    for caller in CALLERS {
        check_caps_and_identity(
            Run::python(include_str!("attacks/caps_status.py"))
                .caller(caller)
                .run(),
        );
    }
}

fn check_caps_and_identity(o: Outcome) {
    o.assert_completed();
    let status = |k: &str| -> String {
        o.values("STATUS")
            .into_iter()
            .find_map(|l| l.strip_prefix(&format!("{k} ")).map(str::to_string))
            .unwrap_or_else(|| panic!("no {k} in /proc/self/status\n{}", o.dump()))
    };
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(
            status(cap),
            "0000000000000000",
            "{cap} not empty\n{}",
            o.dump()
        );
    }
    assert_eq!(status("NoNewPrivs"), "1", "{}", o.dump());
    assert_eq!(
        status("Seccomp"),
        "2",
        "seccomp filter not active\n{}",
        o.dump()
    );
    assert_eq!(status("Uid"), "1000 1000 1000 1000", "{}", o.dump());
    assert_eq!(status("Gid"), "1000 1000 1000 1000", "{}", o.dump());
    let groups = status("Groups");
    assert!(
        groups.is_empty() || groups == "1000",
        "supplementary groups: {groups}\n{}",
        o.dump()
    );
}

#[test]
fn setuid_to_root_fails() {
    let _g = shared();
    for caller in CALLERS {
        check_setuid_blocked(
            Run::python(include_str!("attacks/setuid_root.py"))
                .caller(caller)
                .run(),
        );
    }
}

fn check_setuid_blocked(o: Outcome) {
    o.assert_completed();
    o.assert_no_escape();
    for what in [
        "setuid-0",
        "setgid-0",
        "setresuid-0",
        "setreuid-0",
        "setgroups-0",
        "raw-setuid-0",
        "raw-setresgid-0",
        "setfsuid-0",
    ] {
        o.assert_blocked(what, EPERM);
    }
    // The only supplementary group allowed is the sandbox's own.
    let ids = o.value("IDS");
    assert!(
        ids == "(1000, 1000, 1000) (1000, 1000, 1000) []"
            || ids == "(1000, 1000, 1000) (1000, 1000, 1000) [1000]",
        "{}",
        o.dump()
    );
}

#[test]
fn capset_and_ambient_caps_fail() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/capset.py")).run();
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("capset-all", EPERM);
    o.assert_blocked("capset-sys-admin", EPERM);
    o.assert_blocked("ambient-raise", EPERM);
    o.assert_blocked("clear-no-new-privs", &["EINVAL", "EPERM"]);
    assert_eq!(o.value("NNP"), "1", "{}", o.dump());
}

#[test]
fn setuid_binaries_gain_nothing() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/setuid_binaries.py")).run();
    o.assert_completed();
    let exits = o.values("EXIT");
    assert!(exits.len() >= 5, "{}", o.dump());
    for e in &exits {
        let f: Vec<&str> = e.splitn(3, ' ').collect();
        assert!(f[1] != "0", "setuid program succeeded: {e}\n{}", o.dump());
    }
    // mount(8) specifically exists on this host image and must fail.
    assert!(
        exits
            .iter()
            .any(|e| e.starts_with("/usr/bin/mount ") && !e.starts_with("/usr/bin/mount 0")),
        "{}",
        o.dump()
    );
    let euids = o.value("SU-EUIDS");
    assert!(
        !euids.split(' ').any(|u| u == "0"),
        "SANDBOX HOLE: setuid su ran with euid 0\n{}",
        o.dump()
    );
    assert_eq!(o.value("XMOUNTED"), "False", "{}", o.dump());
}
