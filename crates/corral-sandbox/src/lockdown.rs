//! The lockdown of a sandboxed program: the one implementation of the last layers, used by the
//! one-shot workload ([`crate::child`]) and by sessions forked from a zygote
//! ([`crate::session`]) alike.
//!
//! Order: `no_new_privs`, every capability dropped (bounding, ambient, inheritable, effective,
//! permitted), the seccomp filters; then the rlimits and Landlock. The one-shot workload
//! applies the first part while init still builds the root and the rest once released.

use caps::Capability;
use nix::sys::resource::{setrlimit, Resource};

use crate::landlock_rules::{self, LandlockError};
use crate::seccomp::{self, sock_filter, SeccompError};

/// A step of the lockdown failed: the program must not run.
#[derive(Debug, thiserror::Error)]
pub enum LockdownError {
    #[error("setting no_new_privs: {0}")]
    NoNewPrivs(#[source] std::io::Error),
    #[error("dropping capabilities: {0}")]
    Capabilities(#[source] caps::errors::CapsError),
    #[error("installing the seccomp filter: {0}")]
    Seccomp(#[source] SeccompError),
    #[error("setting {resource:?}: {source}")]
    Rlimit {
        resource: Resource,
        #[source]
        source: nix::errno::Errno,
    },
    #[error("applying Landlock: {0}")]
    Landlock(#[source] LandlockError),
}

impl LockdownError {
    /// The setup step this failure is reported as.
    pub(crate) fn step(&self) -> crate::setup::Step {
        use crate::setup::Step;
        match self {
            LockdownError::NoNewPrivs(_) => Step::NoNewPrivs,
            LockdownError::Capabilities(_) => Step::Capabilities,
            LockdownError::Seccomp(_) => Step::Seccomp,
            LockdownError::Rlimit { .. } => Step::Rlimits,
            LockdownError::Landlock(_) => Step::Landlock,
        }
    }
}

/// What locks one program down.
#[derive(Debug)]
pub struct Lockdown {
    pub filters: &'static [&'static [sock_filter]],
    pub rlimits: Vec<(Resource, u64)>,
    /// `Some(required)`: apply Landlock (a kernel without it is an error when required);
    /// `None`: a zygote, whose sessions mount their own filesystems and apply it themselves.
    pub landlock: Option<bool>,
    /// Kept in the bounding, permitted and effective sets; every other capability goes.
    /// Empty but for a zygote's (as root, and rootless with subordinate ids:
    /// [`ID_CAPABILITIES`]).
    pub keep_capabilities: &'static [Capability],
}

/// What a zygote keeps (as root, and rootless with subordinate ids): giving each forked
/// session its own host uid and gid.
pub const ID_CAPABILITIES: [Capability; 2] = [Capability::CAP_SETUID, Capability::CAP_SETGID];

impl Lockdown {
    /// Everything, in order.
    pub fn apply(&self) -> Result<(), LockdownError> {
        self.privileges()?;
        self.confine()
    }

    /// `no_new_privs`, no capability in any set, the seccomp filters.
    pub fn privileges(&self) -> Result<(), LockdownError> {
        no_new_privs()?;
        drop_capabilities(self.keep_capabilities).map_err(LockdownError::Capabilities)?;
        seccomp::install(self.filters).map_err(LockdownError::Seccomp)
    }

    /// The rlimits, then Landlock (which must come after the final root is in place).
    pub fn confine(&self) -> Result<(), LockdownError> {
        for &(resource, limit) in &self.rlimits {
            setrlimit(resource, limit, limit)
                .map_err(|source| LockdownError::Rlimit { resource, source })?;
        }
        if let Some(required) = self.landlock {
            landlock_rules::restrict(required).map_err(LockdownError::Landlock)?;
        }
        Ok(())
    }
}

/// A sandbox's init once it has started its program: it only waits and kills.
pub fn init(filters: &'static [&'static [sock_filter]]) -> Result<(), LockdownError> {
    for set in [
        caps::CapSet::Effective,
        caps::CapSet::Permitted,
        caps::CapSet::Inheritable,
    ] {
        caps::clear(None, set).map_err(LockdownError::Capabilities)?;
    }
    no_new_privs()?;
    seccomp::install(filters).map_err(LockdownError::Seccomp)
}

fn no_new_privs() -> Result<(), LockdownError> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(LockdownError::NoNewPrivs(std::io::Error::last_os_error()));
    }
    Ok(())
}

fn drop_capabilities(keep: &[Capability]) -> Result<(), caps::errors::CapsError> {
    // Dropping from the bounding set needs CAP_SETPCAP in effect, which a change of uid (a
    // root-mode zygote's) has taken out of the effective set but left permitted.
    caps::set(
        None,
        caps::CapSet::Effective,
        &caps::read(None, caps::CapSet::Permitted)?,
    )?;
    for cap in caps::all() {
        if !keep.contains(&cap) {
            caps::drop(None, caps::CapSet::Bounding, cap)?;
        }
    }
    for set in [caps::CapSet::Ambient, caps::CapSet::Inheritable] {
        caps::clear(None, set)?;
    }
    let kept: caps::CapsHashSet = keep.iter().copied().collect();
    // Effective first: it must stay a subset of permitted.
    for set in [caps::CapSet::Effective, caps::CapSet::Permitted] {
        caps::set(None, set, &kept)?;
    }
    // What is kept must survive the program's execve, which a non-root uid does only through
    // the ambient set (a subset of inheritable).
    caps::set(None, caps::CapSet::Inheritable, &kept)?;
    for &cap in keep {
        caps::raise(None, caps::CapSet::Ambient, cap)?;
    }
    Ok(())
}

/// Sets the per-user inotify maxima of the caller's own user namespace (which needs
/// CAP_SYS_RESOURCE there). The kernel checks them at every level up to the host's, so they
/// bound what the sandbox takes of its owner's allowance: rootless, every sandbox's owner is
/// the caller ([`crate::spec::ROOTLESS_INOTIFY_LIMITS`]).
pub fn limit_inotify(instances: u64, watches: u64) -> std::io::Result<()> {
    for (file, value) in [
        ("/proc/sys/user/max_inotify_instances", instances),
        ("/proc/sys/user/max_inotify_watches", watches),
    ] {
        std::fs::write(file, value.to_string())
            .map_err(|e| std::io::Error::new(e.kind(), format!("writing {file}: {e}")))?;
    }
    Ok(())
}
