//! Host uids and gids for sandboxes when Corral runs as root: each live sandbox (one-shot,
//! zygote or session) holds one no other live sandbox holds, in this process or in any other
//! Corral process on the host, so every per-uid kernel account (inotify instances and
//! watches, pipe buffers, process counts, message queues, pending signals) is its own.
//!
//! A lease is an exclusive `flock` on `<LEASE_DIR>/<id>`: the kernel drops it when the
//! lease's descriptor closes, also when a Corral process is killed, so nothing needs cleaning
//! up. (flock locks belong to the open file description, so two leases of one process
//! exclude each other as well.)

use std::fs::{DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::sync::atomic::{AtomicU32, Ordering};

use nix::fcntl::{Flock, FlockArg};

/// First host uid/gid given to sandboxes when Corral runs as root; each sandbox gets one of
/// the next [`ID_RANGE`], owning nothing on the host.
pub const ROOT_MODE_ID_BASE: u32 = 1_000_000_000;
pub const ID_RANGE: u32 = 65_536;
/// Where the leases live (root only: a path of the host's runtime directory).
const LEASE_DIR: &str = "/run/corral/ids";

/// A host uid (and the gid of the same number) that no other live sandbox has.
#[derive(Debug)]
pub struct IdLease {
    id: u32,
    _lock: Flock<File>,
}

impl IdLease {
    /// Takes a free id, starting from a point that differs between processes and calls.
    pub fn acquire() -> io::Result<IdLease> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        static DIR: std::sync::OnceLock<Result<(), io::ErrorKind>> = std::sync::OnceLock::new();
        DIR.get_or_init(|| {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(LEASE_DIR)
                .map_err(|e| e.kind())
        })
        .map_err(|kind| io::Error::new(kind, format!("creating {LEASE_DIR}")))?;
        let start = std::process::id()
            .wrapping_mul(2_654_435_761)
            .wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed));
        for step in 0..ID_RANGE {
            let id = ROOT_MODE_ID_BASE + start.wrapping_add(step) % ID_RANGE;
            let lock = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
                .open(format!("{LEASE_DIR}/{id}"))?;
            match Flock::lock(lock, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => return Ok(IdLease { id, _lock: lock }),
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => continue,
                Err((_, e)) => return Err(e.into()),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!("all {ID_RANGE} sandbox uids are in use"),
        ))
    }

    pub fn id(&self) -> u32 {
        self.id
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn live_leases_never_share_an_id() {
        if !nix::unistd::geteuid().is_root() {
            return; // the lease directory is root's
        }
        let leases: Vec<IdLease> = (0..200).map(|_| IdLease::acquire().unwrap()).collect();
        let mut ids: Vec<u32> = leases.iter().map(IdLease::id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), leases.len());
        assert!(ids
            .iter()
            .all(|id| (ROOT_MODE_ID_BASE..ROOT_MODE_ID_BASE + ID_RANGE).contains(id)));
        // Another process's leases are honoured too: a child that takes the same number of
        // leases while ours are held gets none of our ids.
        let (read, write) = nix::unistd::pipe().unwrap();
        // SAFETY: the child only takes leases, writes to a pipe and exits.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let theirs: Vec<IdLease> = (0..200).map(|_| IdLease::acquire().unwrap()).collect();
                let clash = theirs.iter().any(|l| ids.binary_search(&l.id()).is_ok());
                let _ = nix::unistd::write(&write, &[u8::from(clash)]);
                // SAFETY: ends the forked test process at once.
                unsafe { libc::_exit(0) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                drop(write);
                let mut clash = [2u8];
                nix::unistd::read(read.as_raw_fd(), &mut clash).unwrap();
                nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(clash, [0], "another process got an id that is leased here");
            }
        }
    }
}
