//! The lockdown of a sandboxed program: the one implementation of the last layers, used by the
//! one-shot workload ([`crate::child`]) and by sessions forked from a zygote
//! ([`crate::session`]) alike.
//!
//! Order: `no_new_privs`, every capability dropped (bounding, ambient, inheritable, effective,
//! permitted), the seccomp filters; then the rlimits and Landlock. The one-shot workload
//! applies the first part while init still builds the root and the rest once released.

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

/// What locks one program down.
#[derive(Debug)]
pub struct Lockdown {
    pub filters: &'static [&'static [sock_filter]],
    pub rlimits: Vec<(Resource, u64)>,
    /// `Some(required)`: apply Landlock (a kernel without it is an error when required);
    /// `None`: a zygote, whose sessions mount their own filesystems and apply it themselves.
    pub landlock: Option<bool>,
}

impl Lockdown {
    /// Everything, in order.
    pub fn apply(&self) -> Result<(), LockdownError> {
        self.privileges()?;
        self.confine()
    }

    /// `no_new_privs`, no capability in any set, the seccomp filters.
    pub fn privileges(&self) -> Result<(), LockdownError> {
        no_new_privs()?;
        drop_capabilities().map_err(LockdownError::Capabilities)?;
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

fn drop_capabilities() -> Result<(), caps::errors::CapsError> {
    for cap in caps::all() {
        caps::drop(None, caps::CapSet::Bounding, cap)?;
    }
    for set in [
        caps::CapSet::Ambient,
        caps::CapSet::Inheritable,
        caps::CapSet::Effective,
        caps::CapSet::Permitted,
    ] {
        caps::clear(None, set)?;
    }
    Ok(())
}
