//! Forking a sandbox's process agent ([`crate::agent`]): the one implementation, for a session
//! forked from a zygote (its init forks the agent) and for a sandbox of its own whose workload
//! is a session's kernel (the workload forks it, just before it becomes the kernel).
//!
//! Either way the agent ends up as the sandbox init's child, beside the kernel, in the
//! sandbox's namespaces and cgroup, with the kernel's uid, not dumpable, in a session of its
//! own, with `/dev/null` as its standard streams and no other descriptor than its socket, and
//! locked down exactly as the kernel is (the workload seccomp role, the rlimits, Landlock)
//! before it reads anything of the host's. The host's end of its socket goes to the host on
//! the sandbox's control socket, as [`crate::session::MSG_AGENT`] with the descriptor.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use crate::lockdown::Lockdown;
use crate::session::MSG_AGENT;
use crate::sys;

/// Which process forks the agent, and so how much of the lockdown it holds already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Forker {
    /// A forked session's init (pid 1 of the session, not locked down yet): the agent is its
    /// child and takes the whole lockdown.
    SessionInit,
    /// The workload of a sandbox of its own, released by init, with the first part of the
    /// lockdown applied ([`Lockdown::privileges`]: `no_new_privs`, no capability, the
    /// seccomp filters), which the agent inherits; the agent takes the rest
    /// ([`Lockdown::confine`]). It is made init's child (`CLONE_PARENT`), a sibling of the
    /// kernel as in a forked session, so the kernel is never its parent; and its environment
    /// is the one given, nothing inherited from the host process init was forked from.
    Workload,
}

/// Forks the agent with `env` as its environment (below each request's own), locked down by
/// `lockdown`, and sends the host its socket on `control`. Returns in the caller only; the
/// agent serves until the host hangs up. The caller must be single-threaded.
pub(crate) fn start(
    forker: Forker,
    lockdown: &Lockdown,
    env: Vec<(String, String)>,
    control: BorrowedFd<'_>,
) -> io::Result<()> {
    let (host, agent) = crate::agent::socket_pair()?;
    let child = match forker {
        // init of a pid namespace cannot use CLONE_PARENT.
        Forker::SessionInit => {
            // SAFETY: the caller is single-threaded; the child runs only the code below and
            // ends in `_exit` (directly or through `serve`).
            let forked = unsafe { nix::unistd::fork() }?;
            matches!(forked, nix::unistd::ForkResult::Child)
        }
        // SAFETY: as for the fork above.
        Forker::Workload => unsafe { sys::clone_process(libc::CLONE_PARENT) }? == 0,
    };
    if child {
        drop(host);
        // Not dumpable: the session's code runs as the same uid and must not reach into the
        // agent through /proc/<pid>/mem. Its programs are dumpable again once they exec, as
        // any program is.
        // SAFETY: prctl with integer arguments only.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
        let _ = nix::unistd::setsid();
        sys::close_all_except(&[agent.as_raw_fd()]);
        // The forker's 0, 1 and 2 are the zygote's (shared by its sessions) or the kernel's
        // output: never the agent's.
        let locked = stdio_to_dev_null().is_ok()
            && match forker {
                Forker::SessionInit => lockdown.apply().is_ok(),
                Forker::Workload => lockdown.confine().is_ok(),
            };
        if !locked {
            // The host sees the agent's socket close.
            // SAFETY: _exit ends the agent without running the forker's exit handlers.
            unsafe { libc::_exit(126) }
        }
        if forker == Forker::Workload {
            for (name, _) in std::env::vars_os() {
                std::env::remove_var(name);
            }
        }
        crate::agent::serve(agent, env)
    }
    drop(agent);
    sys::send_message(control, &[MSG_AGENT], Some(host.as_raw_fd()))
}

/// Points descriptors 0, 1 and 2 at `/dev/null`.
fn stdio_to_dev_null() -> io::Result<()> {
    let null = nix::fcntl::open(
        "/dev/null",
        nix::fcntl::OFlag::O_RDWR,
        nix::sys::stat::Mode::empty(),
    )?;
    for fd in 0..3 {
        if fd != null {
            nix::unistd::dup2(null, fd)?;
        }
    }
    if null > 2 {
        let _ = nix::unistd::close(null);
    }
    Ok(())
}
