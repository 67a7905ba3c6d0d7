//! `corral doctor`: which protection layers this host can apply, probed for real.

use nix::sched::{unshare, CloneFlags};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::ForkResult;

use crate::cgroup::Cgroup;
use crate::ids::HostIds;
use crate::seccomp;
use crate::spec::Role;
use crate::spec::{Limits, Rootfs, SandboxSpec};
use crate::{landlock_rules, sandbox, Status};

/// One protection layer and whether it can be applied here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub layer: String,
    pub active: bool,
    pub detail: String,
}

/// Runs `probe` in a forked child and returns its result (an errno on failure).
fn in_child(probe: impl FnOnce() -> nix::Result<()>) -> nix::Result<()> {
    // SAFETY: the child only makes system calls and then _exits.
    match unsafe { nix::unistd::fork() }? {
        ForkResult::Child => {
            let code = match probe() {
                Ok(()) => 0,
                Err(e) => e as i32,
            };
            // SAFETY: _exit ends the probe child without running the parent's exit handlers.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => match waitpid(child, None)? {
            WaitStatus::Exited(_, 0) => Ok(()),
            WaitStatus::Exited(_, code) => Err(nix::errno::Errno::from_raw(code)),
            _ => Err(nix::errno::Errno::EINTR),
        },
    }
}

/// Whether this host can offer egress allow-lists (docs/network.md): its proxy resolves names
/// with the host's resolver and connects out. Informational: `--net none` needs neither.
fn egress_check() -> Check {
    let resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    // Connecting a UDP socket sends nothing; it fails where there is no route.
    let route = std::net::UdpSocket::bind("0.0.0.0:0").and_then(|s| s.connect("192.0.2.1:9"));
    egress_verdict(&resolv, route)
}

/// The egress line of a host whose `/etc/resolv.conf` holds `resolv` and whose attempt to
/// route a datagram out ended as `route`.
fn egress_verdict(resolv: &str, route: std::io::Result<()>) -> Check {
    let servers = resolv
        .lines()
        .filter(|l| l.split_whitespace().next() == Some("nameserver"))
        .count();
    match (servers, route) {
        (0, _) => check(
            "egress",
            false,
            "/etc/resolv.conf names no name server: the proxy could not resolve allowed names \
             (--net none is unaffected)",
        ),
        (_, Err(e)) => check(
            "egress",
            false,
            format!("no route out of this host ({e}): allowed names could not be reached"),
        ),
        (n, Ok(())) => check(
            "egress",
            true,
            format!(
                "--net allow:... can be offered: {n} name server(s), a route out; each sandbox's \
                 proxy listens on 127.0.0.1:3128 in its own network namespace"
            ),
        ),
    }
}

fn check(layer: &str, active: bool, detail: impl Into<String>) -> Check {
    Check {
        layer: layer.to_string(),
        active,
        detail: detail.into(),
    }
}

/// Probes every layer of docs/baseline.md, then builds and runs a real sandbox: `/bin/true` in
/// `rootfs` (a node's container has no `/bin/true` of its own; its images do).
pub fn run_checks(rootfs: Rootfs) -> Vec<Check> {
    let mut checks = Vec::new();
    let euid = nix::unistd::geteuid();
    let host_ids = crate::ids::host_ids();
    checks.push(check(
        "mode",
        true,
        match host_ids {
            HostIds::Root(_) => format!(
                "root: sandboxes run as unprivileged host uids from {}",
                crate::ids::ROOT_MODE_ID_BASE
            ),
            HostIds::Subordinate(sub) => format!(
                "rootless (uid {euid}): sandboxes run as subordinate ids of yours, uids {} and \
                 gids {} ({} at once), mapped by {} and {}",
                sub.uids,
                sub.gids,
                sub.pool.count(),
                sub.newuidmap.display(),
                sub.newgidmap.display()
            ),
            HostIds::Caller { missing } => format!(
                "rootless (uid {euid}): sandboxes run as your own uid through a user namespace \
                 (no subordinate ids: {missing})"
            ),
        },
    ));

    checks.push(check(
        "uid per session",
        !matches!(host_ids, HostIds::Caller { .. }),
        match host_ids {
            HostIds::Root(_) => "every sandbox and session runs as a host uid of its own: \
                 per-uid kernel limits (inotify, pipe buffers, processes, message queues) are \
                 its own"
                .to_string(),
            HostIds::Subordinate(_) => format!(
                "every sandbox and session runs as a host uid and gid of its own from your \
                 subordinate ids: its pipe buffers and files are its own, and it has none of \
                 your groups; what the kernel counts per user namespace (inotify, processes, \
                 message queues, pending signals) is still charged to you, so each may hold at \
                 most {} of your inotify instances",
                crate::spec::ROOTLESS_INOTIFY_LIMITS.0
            ),
            HostIds::Caller { missing } => crate::ids::caller_uid_warning(missing),
        },
    ));

    let userns = in_child(|| unshare(CloneFlags::CLONE_NEWUSER));
    checks.push(check(
        "user namespace",
        userns.is_ok(),
        match userns {
            Ok(()) => "can be created".to_string(),
            Err(e) => format!(
                "cannot be created ({e}): enable with sysctl user.max_user_namespaces=15000 \
                 (and kernel.unprivileged_userns_clone=1 or kernel.apparmor_restrict_unprivileged_userns=0 where present)"
            ),
        },
    ));
    for (name, flag) in [
        ("mount namespace", CloneFlags::CLONE_NEWNS),
        ("pid namespace", CloneFlags::CLONE_NEWPID),
        ("network namespace", CloneFlags::CLONE_NEWNET),
        ("ipc namespace", CloneFlags::CLONE_NEWIPC),
        ("uts namespace", CloneFlags::CLONE_NEWUTS),
        ("cgroup namespace", CloneFlags::CLONE_NEWCGROUP),
    ] {
        let r = in_child(|| {
            unshare(CloneFlags::CLONE_NEWUSER)?;
            unshare(flag)
        });
        checks.push(check(
            name,
            r.is_ok(),
            match r {
                Ok(()) => "can be created inside a user namespace".to_string(),
                Err(e) => format!("cannot be created ({e})"),
            },
        ));
    }

    // The kernel reports a "Seccomp:" status line only when built with seccomp support; the
    // real test is the sandbox run at the end, which installs the filters.
    let seccomp_ok = std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Seccomp_filters:")))
        .unwrap_or(false);
    let programs = seccomp::filters(Role::Workload).len() + seccomp::init_filters().len();
    checks.push(check(
        "seccomp",
        seccomp_ok,
        if seccomp_ok {
            format!(
                "filter mode available; {programs} BPF programs embedded (workload and init roles)"
            )
        } else {
            "kernel built without CONFIG_SECCOMP_FILTER".to_string()
        },
    ));

    let pattern = std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap_or_default();
    let piped = pattern.trim_start().starts_with('|');
    checks.push(check(
        "core dumps",
        true,
        if piped {
            format!(
                "core_pattern pipes to `{}`; sandboxes set RLIMIT_CORE to {}, which the kernel \
                 treats as \"never pipe\", so crashes inside a sandbox never run it",
                pattern.trim().trim_start_matches('|'),
                crate::spec::CORE_LIMIT
            )
        } else {
            format!(
                "core_pattern is a file name; sandboxes set RLIMIT_CORE to {} (no core file fits)",
                crate::spec::CORE_LIMIT
            )
        },
    ));

    let abi = landlock_rules::kernel_abi();
    checks.push(check(
        "landlock",
        abi > 0,
        if abi > 0 {
            format!("ABI version {abi}")
        } else {
            "unavailable: needs Linux >= 5.13 with landlock in the lsm= boot list (--allow-degraded runs without it)".to_string()
        },
    ));

    match sandbox::cgroup_layout() {
        None => checks.push(check(
            "cgroups",
            false,
            "no v1 or v2 hierarchy with memory and pids is mounted: limits fall back to rlimits",
        )),
        Some(layout) => {
            let controllers = layout.controllers();
            checks.push(check(
                "cgroups",
                true,
                format!(
                    "cgroup v{} with {}",
                    layout.version(),
                    controllers.join(", ")
                ),
            ));
            for c in ["memory", "pids", "cpu", "freezer"] {
                if layout.version() == 2 && c == "freezer" {
                    continue; // built into v2
                }
                let present = controllers.iter().any(|x| x == c);
                checks.push(check(
                    &format!("cgroup {c}"),
                    present,
                    if present { "mounted" } else { "not available" },
                ));
            }
            let name = format!("doctor-{}", std::process::id());
            let created = Cgroup::create(layout, &name, &Limits::default());
            checks.push(check(
                "cgroup creation",
                created.is_ok(),
                match created {
                    Ok(_) => {
                        "sandbox cgroups can be created (limits enforced by the kernel)".to_string()
                    }
                    Err(e) => format!(
                        "cannot create sandbox cgroups ({e}): rlimit fallback, or --strict refuses"
                    ),
                },
            ));
        }
    }

    checks.push(egress_check());

    let mut spec = SandboxSpec::new(vec!["/bin/true".to_string()]);
    spec.rootfs = rootfs;
    let (result, _) = sandbox::run(&spec, &mut |_, _| {}, None);
    let full = result.status == Status::Success && result.warnings.is_empty();
    checks.push(check(
        "isolation",
        result.status == Status::Success,
        match result.status {
            Status::Success if full => {
                "a real sandbox ran with every layer of docs/baseline.md".to_string()
            }
            Status::Success => format!(
                "a real sandbox ran, degraded: {}",
                result.warnings.join("; ")
            ),
            _ => format!(
                "a real sandbox could not run: {}",
                result.error_message.unwrap_or_default()
            ),
        },
    ));
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn egress_is_offered_only_with_a_name_server_and_a_route_out() {
        let resolv = "# by the host\nsearch example.org\nnameserver 10.0.0.53\n";
        let offered = egress_verdict(resolv, Ok(()));
        assert_eq!(offered.layer, "egress");
        assert!(offered.active, "{offered:?}");
        assert!(offered.detail.contains("1 name server(s)"), "{offered:?}");

        for resolv in [
            "",
            "# nameserver 10.0.0.53\nsearch example.org\n",
            "nameservers 1\n",
        ] {
            let none = egress_verdict(resolv, Ok(()));
            assert!(!none.active, "{resolv:?}: {none:?}");
            assert!(none.detail.contains("names no name server"), "{none:?}");
        }

        let unroutable = std::io::Error::from_raw_os_error(libc::ENETUNREACH);
        let no_route = egress_verdict(resolv, Err(unroutable));
        assert!(!no_route.active, "{no_route:?}");
        assert!(
            no_route.detail.starts_with("no route out of this host"),
            "{no_route:?}"
        );
    }
}
