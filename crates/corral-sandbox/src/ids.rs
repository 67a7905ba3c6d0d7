//! The host uid and gid of each sandbox. Each live sandbox (one-shot, zygote or session)
//! holds one no other live sandbox holds, in this process or in any other Corral process of
//! the same user, so that its per-uid kernel accounts are its own and its files belong to an
//! id that owns nothing else on the host ([`HostIds`], decided once per process):
//!
//! - as root, from `[ROOT_MODE_ID_BASE, ROOT_MODE_ID_BASE + ID_RANGE)`;
//! - rootless, from the caller's subordinate ids (`/etc/subuid`, `/etc/subgid`), which the
//!   setuid helpers `newuidmap` and `newgidmap` map into the sandbox's user namespace
//!   ([`crate::subids`]). Every user namespace is still the caller's, so the counts the kernel
//!   keeps per user namespace (inotify, processes, message queues, pending signals) climb to
//!   the caller; those that hang off the host uid (pipe buffers) and file ownership do not;
//! - rootless without subordinate ids (or without the helpers), the caller's own uid, with
//!   setgroups denied: every result's `warnings` and `corral doctor` say so and why.
//!
//! A lease is an exclusive `flock` on `<dir>/<host uid>`: the kernel drops it when the
//! lease's descriptor closes, also when a Corral process is killed, so nothing needs cleaning
//! up. (flock locks belong to the open file description, so two leases of one process
//! exclude each other as well.)

use std::fs::{DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use nix::fcntl::{Flock, FlockArg};
use nix::unistd::Pid;

use crate::rootfs::SANDBOX_UID;
use crate::subids::{self, MapError, Range};

/// First host uid/gid given to sandboxes when Corral runs as root; each sandbox gets one of
/// the next [`ID_RANGE`], owning nothing on the host. It is also where a zygote's sessions
/// find their ids in every mode ([`IdLease::zygote_id`]).
pub const ROOT_MODE_ID_BASE: u32 = 1_000_000_000;
pub const ID_RANGE: u32 = 65_536;
/// The ids of root mode, which no user's subordinate range may overlap.
pub const ROOT_MODE_IDS: Range = Range {
    start: ROOT_MODE_ID_BASE,
    count: ID_RANGE,
};
/// Where root's leases live: a path of the host's runtime directory.
const ROOT_LEASE_DIR: &str = "/run/corral/ids";
/// Where a rootless user's leases live, below the home directory of the password database
/// (not `$HOME`): a function of the uid alone, so that every Corral process of the user,
/// whatever its environment, takes its leases in the same place.
const ROOTLESS_LEASE_DIR: &str = ".local/state/corral/ids";

/// Host ids sandboxes are leased from: `count` uids from `uid_base` and as many gids from
/// `gid_base`, each lease a lock file in `dir`.
#[derive(Debug)]
pub struct IdPool {
    uid_base: u32,
    gid_base: u32,
    count: u32,
    dir: PathBuf,
    /// Whether `dir` was made (or found) private to this user, once.
    ready: OnceLock<Result<(), String>>,
}

/// A host uid and gid that no other live sandbox has.
#[derive(Debug)]
pub struct IdLease {
    offset: u32,
    uid: u32,
    gid: u32,
    _lock: Flock<File>,
}

impl IdPool {
    pub fn new(uid_base: u32, gid_base: u32, count: u32, dir: PathBuf) -> IdPool {
        IdPool {
            uid_base,
            gid_base,
            count,
            dir,
            ready: OnceLock::new(),
        }
    }

    /// How many ids the pool holds.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Makes the lease directory (mode 0700) where it is missing, and checks that it is a
    /// directory of this user's that nobody else may enter.
    fn make_dir(&self) -> io::Result<()> {
        let made = self.ready.get_or_init(|| {
            let dir = &self.dir;
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| format!("creating {}: {e}", dir.display()))?;
            let meta =
                std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            if !meta.is_dir()
                || meta.uid() != nix::unistd::geteuid().as_raw()
                || meta.mode() & 0o077 != 0
            {
                return Err(format!(
                    "{} is not a directory of this user's that only it may enter",
                    dir.display()
                ));
            }
            Ok(())
        });
        made.clone()
            .map_err(|e| io::Error::other(format!("the sandbox id leases: {e}")))
    }

    /// Takes a free id, starting from a point that differs between processes and calls.
    pub fn acquire(&self) -> io::Result<IdLease> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        self.make_dir()?;
        let start = std::process::id()
            .wrapping_mul(2_654_435_761)
            .wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed));
        for step in 0..self.count {
            let offset = start.wrapping_add(step) % self.count;
            let uid = self.uid_base + offset;
            let lock = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
                .open(self.dir.join(uid.to_string()))?;
            match Flock::lock(lock, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => {
                    return Ok(IdLease {
                        offset,
                        uid,
                        gid: self.gid_base + offset,
                        _lock: lock,
                    })
                }
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => continue,
                Err((_, e)) => return Err(e.into()),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!("all {} sandbox uids are in use", self.count),
        ))
    }
}

impl IdLease {
    /// The host uid.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// The host gid.
    pub fn gid(&self) -> u32 {
        self.gid
    }

    /// The uid and gid a zygote gives the session of this lease: `ROOT_MODE_ID_BASE` plus the
    /// lease's place in its pool. As root that is the host id itself; rootless, an id of the
    /// zygote's user namespace, which maps it to this lease's host ids
    /// ([`Subordinate::maps`]). Either way within the range the zygote's seccomp filter
    /// confines `setresuid` and `setresgid` to.
    pub fn zygote_id(&self) -> u32 {
        ROOT_MODE_ID_BASE + self.offset
    }
}

/// Who sandboxes run as on the host.
#[derive(Debug)]
pub enum HostIds {
    /// Corral runs as root: ids of [`ROOT_MODE_IDS`].
    Root(IdPool),
    /// Rootless, with the caller's subordinate ids.
    Subordinate(Subordinate),
    /// Rootless without subordinate ids: the caller's own uid and gid; `missing` says what
    /// was missing.
    Caller { missing: String },
}

/// The caller's subordinate ranges, the pool of leases in them and the helpers that map them.
#[derive(Debug)]
pub struct Subordinate {
    pub pool: IdPool,
    pub uids: Range,
    pub gids: Range,
    pub newuidmap: PathBuf,
    pub newgidmap: PathBuf,
}

/// One line of a user namespace's id map: inside, outside, count.
pub type MapLine = (u32, u32, u32);

impl Subordinate {
    /// The uid and gid maps of the user namespace of a sandbox holding `lease`: the sandbox
    /// user ([`SANDBOX_UID`]) is the lease's ids. A zygote's namespace also maps every other id
    /// of the pool at `ROOT_MODE_ID_BASE` plus its place in the pool, for its sessions to
    /// take ([`IdLease::zygote_id`]); its own place there stays unmapped, so that no session
    /// can become the zygote.
    pub fn maps(&self, lease: &IdLease, zygote: bool) -> (Vec<MapLine>, Vec<MapLine>) {
        let map = |base: u32, own: u32| {
            let mut lines = vec![(SANDBOX_UID, own, 1)];
            if zygote {
                let offset = lease.offset;
                let after = offset + 1;
                lines.extend(
                    [
                        (ROOT_MODE_ID_BASE, base, offset),
                        (
                            ROOT_MODE_ID_BASE + after,
                            base + after,
                            self.pool.count - after,
                        ),
                    ]
                    .into_iter()
                    .filter(|&(_, _, count)| count > 0),
                );
            }
            lines
        };
        (
            map(self.uids.start, lease.uid),
            map(self.gids.start, lease.gid),
        )
    }

    /// Maps the sandbox's ids ([`Subordinate::maps`]) into the user namespace of `pid` with
    /// the helpers.
    pub fn map(&self, pid: Pid, lease: &IdLease, zygote: bool) -> Result<(), MapError> {
        let (uids, gids) = self.maps(lease, zygote);
        subids::map(&self.newuidmap, &self.newgidmap, pid, &uids, &gids)
    }
}

/// This process's [`HostIds`], detected on first use.
pub fn host_ids() -> &'static HostIds {
    static IDS: OnceLock<HostIds> = OnceLock::new();
    IDS.get_or_init(|| {
        detect(
            Path::new(subids::SUBUID_FILE),
            Path::new(subids::SUBGID_FILE),
            &subids::HELPER_DIRS,
        )
    })
}

/// The [`HostIds`] of this process, with subordinate ids from these files and helpers from
/// these directories.
fn detect(subuid_file: &Path, subgid_file: &Path, helper_dirs: &[&str]) -> HostIds {
    if nix::unistd::geteuid().is_root() {
        return HostIds::Root(IdPool::new(
            ROOT_MODE_ID_BASE,
            ROOT_MODE_ID_BASE,
            ID_RANGE,
            ROOT_LEASE_DIR.into(),
        ));
    }
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    let user = match nix::unistd::User::from_uid(uid) {
        Ok(Some(user)) => user,
        Ok(None) => {
            return HostIds::Caller {
                missing: format!("uid {uid} has no entry in /etc/passwd, which newuidmap needs"),
            }
        }
        Err(e) => {
            return HostIds::Caller {
                missing: format!("looking up uid {uid} in /etc/passwd: {e}"),
            }
        }
    };
    let mut missing = Vec::new();
    // newuidmap and newgidmap map only for a caller whose real ids are its password entry's,
    // into a process whose effective ids are the same.
    if nix::unistd::geteuid() != uid || nix::unistd::getegid() != gid || gid != user.gid {
        missing.push(format!(
            "this process's ids (uid {uid}, euid {}, gid {gid}, egid {}) are not the user's \
             own from /etc/passwd (uid {uid}, gid {}), as newuidmap and newgidmap require",
            nix::unistd::geteuid(),
            nix::unistd::getegid(),
            user.gid
        ));
    }
    let name = Some(user.name.as_str());
    let uids = subids::range_in(subuid_file, name, uid.as_raw(), uid.as_raw(), ROOT_MODE_IDS)
        .map_err(|e| missing.push(e));
    let gids = subids::range_in(subgid_file, name, uid.as_raw(), gid.as_raw(), ROOT_MODE_IDS)
        .map_err(|e| missing.push(e));
    let newuidmap = subids::find_helper("newuidmap", helper_dirs).map_err(|e| missing.push(e));
    let newgidmap = subids::find_helper("newgidmap", helper_dirs).map_err(|e| missing.push(e));
    match (uids, gids, newuidmap, newgidmap) {
        (Ok(uids), Ok(gids), Ok(newuidmap), Ok(newgidmap)) if missing.is_empty() => {
            HostIds::Subordinate(Subordinate {
                pool: IdPool::new(
                    uids.start,
                    gids.start,
                    uids.count.min(gids.count).min(ID_RANGE),
                    user.dir.join(ROOTLESS_LEASE_DIR),
                ),
                uids,
                gids,
                newuidmap,
                newgidmap,
            })
        }
        _ => HostIds::Caller {
            missing: missing.join("; "),
        },
    }
}

/// The warning every sandbox's result carries about its host ids: rootless without
/// subordinate ids only.
pub fn warning() -> Option<String> {
    match host_ids() {
        HostIds::Caller { missing } => Some(caller_uid_warning(missing)),
        HostIds::Root(_) | HostIds::Subordinate(_) => None,
    }
}

/// What a sandbox is told when it runs as the caller's own uid ([`HostIds::Caller`]), in its
/// result's `warnings` (and by `corral doctor`).
pub fn caller_uid_warning(missing: &str) -> String {
    format!(
        "rootless without subordinate ids ({missing}): every sandbox and session runs as the \
         host uid of the user running Corral, with that user's supplementary groups, so \
         their files are that user's and per-user kernel limits (pipe buffers, processes, \
         message queues) are shared between them; each may hold at most {} of that user's \
         inotify instances (a range in /etc/subuid and /etc/subgid and the newuidmap and \
         newgidmap helpers, Debian's uidmap package, give each a host uid of its own)",
        crate::spec::ROOTLESS_INOTIFY_LIMITS.0
    )
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    fn pool_in(dir: &Path, uid_base: u32, gid_base: u32, count: u32) -> IdPool {
        IdPool::new(uid_base, gid_base, count, dir.join("leases/ids"))
    }

    #[test]
    fn live_leases_never_share_an_id() {
        let dir = tempfile::tempdir().unwrap();
        let pool = pool_in(dir.path(), 100_000, 300_000, 1024);
        let leases: Vec<IdLease> = (0..200).map(|_| pool.acquire().unwrap()).collect();
        let mut ids: Vec<u32> = leases.iter().map(IdLease::uid).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), leases.len());
        assert!(ids.iter().all(|id| (100_000..101_024).contains(id)));
        for lease in &leases {
            assert_eq!(lease.gid() - 300_000, lease.uid() - 100_000);
            assert_eq!(lease.zygote_id(), ROOT_MODE_ID_BASE + lease.uid() - 100_000);
        }
        // The directory is the user's alone.
        let meta = std::fs::metadata(dir.path().join("leases/ids")).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o700);
        // Another process's leases are honoured too: a child that takes the same number of
        // leases while ours are held gets none of our ids.
        let (read, write) = nix::unistd::pipe().unwrap();
        // SAFETY: the child only takes leases, writes to a pipe and exits.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let pool = pool_in(dir.path(), 100_000, 300_000, 1024);
                let theirs: Vec<IdLease> = (0..200).map(|_| pool.acquire().unwrap()).collect();
                let clash = theirs.iter().any(|l| ids.binary_search(&l.uid()).is_ok());
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
        // A full pool says so; a released lease is free again.
        let small = pool_in(dir.path(), 500_000, 500_000, 2);
        let (a, _b) = (small.acquire().unwrap(), small.acquire().unwrap());
        assert!(small.acquire().unwrap_err().to_string().contains("all 2"));
        let freed = a.uid();
        drop(a);
        assert_eq!(small.acquire().unwrap().uid(), freed);
    }

    #[test]
    fn a_lease_directory_others_may_enter_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let ids = dir.path().join("leases/ids");
        std::fs::create_dir_all(&ids).unwrap();
        std::fs::set_permissions(&ids, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = pool_in(dir.path(), 100_000, 100_000, 10)
            .acquire()
            .unwrap_err();
        assert!(err.to_string().contains("only it may enter"), "{err}");
    }

    #[test]
    fn a_zygote_maps_the_whole_pool_but_its_own_place_for_its_sessions() {
        let dir = tempfile::tempdir().unwrap();
        let sub = Subordinate {
            pool: pool_in(dir.path(), 100_000, 300_000, 2048),
            uids: Range {
                start: 100_000,
                count: 65_536,
            },
            gids: Range {
                start: 300_000,
                count: 2048,
            },
            newuidmap: "/usr/bin/newuidmap".into(),
            newgidmap: "/usr/bin/newgidmap".into(),
        };
        let lease = sub.pool.acquire().unwrap();
        let k = lease.uid() - 100_000;
        let (uids, gids) = sub.maps(&lease, false);
        assert_eq!(uids, [(SANDBOX_UID, 100_000 + k, 1)]);
        assert_eq!(gids, [(SANDBOX_UID, 300_000 + k, 1)]);
        let (uids, gids) = sub.maps(&lease, true);
        for (lines, base) in [(&uids, 100_000), (&gids, 300_000)] {
            // Every id of the pool mapped exactly once; the zygote's own at SANDBOX_UID only.
            let mut outside: Vec<u32> =
                lines.iter().flat_map(|&(_, out, n)| out..out + n).collect();
            outside.sort_unstable();
            assert_eq!(outside, (base..base + 2048).collect::<Vec<_>>());
            for &(inside, out, n) in lines.iter().skip(1) {
                assert_eq!(inside - ROOT_MODE_ID_BASE, out - base);
                assert!(!(out..out + n).contains(&(base + k)));
                assert!(n > 0);
            }
        }
        // At either end of the pool, one line around it is empty and left out.
        let first = Subordinate {
            pool: pool_in(dir.path(), 900_000, 900_000, 1),
            ..sub
        };
        let only = first.pool.acquire().unwrap();
        assert_eq!(first.maps(&only, true).0, [(SANDBOX_UID, 900_000, 1)]);
    }

    #[test]
    fn detection_says_what_is_missing() {
        if nix::unistd::geteuid().is_root() {
            assert!(matches!(
                detect(Path::new("/nonexistent"), Path::new("/nonexistent"), &[]),
                HostIds::Root(_)
            ));
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        let HostIds::Caller { missing } = detect(&empty, &dir.path().join("absent"), &[]) else {
            panic!("subordinate ids from an empty file");
        };
        assert!(missing.contains("empty: no range for"), "{missing}");
        assert!(missing.contains("absent: No such file"), "{missing}");
        assert!(missing.contains("no newuidmap in"), "{missing}");
        assert!(missing.contains("no newgidmap in"), "{missing}");
    }
}
