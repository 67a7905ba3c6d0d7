//! Whose permissions the host uses in a sandbox's workspace ([`Owner`]): always the sandbox
//! user's own, so that the host reads, lists, creates and removes there exactly what the
//! sandbox itself could (a second layer behind `openat2`), and what it creates belongs to the
//! sandbox.
//!
//! Rootless with subordinate ids the sandbox's files belong to an id the caller has no rights
//! over, and a multithreaded host cannot enter another user namespace. Each operation then
//! runs in a helper forked for it: it joins the sandbox's user namespace (the caller owns it,
//! so it may), becomes the sandbox user there, gives up every capability the namespace gave
//! it, does the work on the workspace's descriptor, and sends the outcome back over a socket,
//! opened files as descriptors (`SCM_RIGHTS`). The host may be multithreaded: between `fork`
//! and `_exit` the helper runs the operation's own code, which takes no lock but the
//! allocator's (which `fork` leaves usable in the child) and writes nothing but its reply.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::sched::CloneFlags;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, Gid, Uid};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::result::FileEntry;
use crate::workspace::WorkspaceError;

/// The most descriptors one reply of a helper carries.
pub(crate) const MAX_REPLY_FDS: usize = 64;
/// The largest reply a helper sends (a listing of `MAX_ENTRIES` files of long names fits).
const MAX_REPLY_BYTES: u64 = 128 << 20;

/// Whose permissions the host takes to work in a workspace.
#[derive(Debug, Clone)]
pub enum Owner {
    /// Rootless without subordinate ids: the caller, whom the sandbox user maps to.
    Caller,
    /// Root: the sandbox's host ids, taken as the calling thread's filesystem ids (which also
    /// leaves root's capabilities out of every permission check).
    Host { uid: u32, gid: u32 },
    /// Rootless with subordinate ids: the sandbox user's ids in `userns`, a user namespace of
    /// the caller's that maps them to the sandbox's host ids (the sandbox's own, or for a
    /// session its zygote's), taken by a forked helper.
    Namespace {
        userns: Arc<OwnedFd>,
        uid: u32,
        gid: u32,
    },
}

impl Owner {
    /// Runs `op` with the sandbox user's permissions and returns what it returned. `op` may
    /// use the descriptors of `keep` (and `workspace`) beyond those it opens; `path` names the
    /// operation in an error of the helper itself.
    pub(crate) fn run<T: Transfer>(
        &self,
        path: &Path,
        workspace: RawFd,
        keep: &[RawFd],
        op: impl FnOnce() -> Result<T, WorkspaceError>,
    ) -> Result<T, WorkspaceError> {
        match self {
            Owner::Caller => op(),
            Owner::Host { uid, gid } => {
                let _ids = FilesystemIds::switch(*uid, *gid);
                op()
            }
            Owner::Namespace { userns, uid, gid } => {
                let mut keep = keep.to_vec();
                keep.extend([workspace, userns.as_raw_fd()]);
                in_helper(userns.as_raw_fd(), *uid, *gid, &keep, op)
                    .map_err(|e| WorkspaceError::io(path, e))?
            }
        }
    }
}

/// While alive, the calling thread's filesystem uid and gid are these.
struct FilesystemIds(Uid, Gid);

impl FilesystemIds {
    fn switch(uid: u32, gid: u32) -> FilesystemIds {
        let old_gid = nix::unistd::setfsgid(gid.into());
        let old_uid = nix::unistd::setfsuid(uid.into());
        FilesystemIds(old_uid, old_gid)
    }
}

impl Drop for FilesystemIds {
    fn drop(&mut self) {
        nix::unistd::setfsuid(self.0);
        nix::unistd::setfsgid(self.1);
    }
}

/// Runs `op` in a helper that becomes `uid` and `gid` of the user namespace `userns` first;
/// returns its reply. An error when the helper could not start or did not answer.
fn in_helper<T: Transfer>(
    userns: RawFd,
    uid: u32,
    gid: u32,
    keep: &[RawFd],
    op: impl FnOnce() -> Result<T, WorkspaceError>,
) -> io::Result<Result<T, WorkspaceError>> {
    let (host, helper_end) = UnixStream::pair()?;
    let mut keep = keep.to_vec();
    keep.push(helper_end.as_raw_fd());
    // SAFETY: the child runs `helper` only, which makes system calls, runs `op` (code of this
    // crate's that allocates but takes no other lock) and ends in `_exit`.
    let child = match unsafe { nix::unistd::fork() }? {
        ForkResult::Child => helper(helper_end, userns, uid, gid, &keep, op),
        ForkResult::Parent { child } => child,
    };
    drop(helper_end);
    let reply = receive(&host);
    drop(host);
    while let Err(nix::errno::Errno::EINTR) = waitpid(child, None) {}
    reply
}

/// The helper: joins the namespace as the sandbox user, runs `op`, sends its outcome.
fn helper<T: Transfer>(
    reply: UnixStream,
    userns: RawFd,
    uid: u32,
    gid: u32,
    keep: &[RawFd],
    op: impl FnOnce() -> Result<T, WorkspaceError>,
) -> ! {
    crate::sys::close_all_except(keep);
    let outcome = match become_sandbox_user(userns, uid, gid) {
        Ok(()) => Ok(op()),
        Err(e) => Err(e),
    };
    let sent = send(&reply, outcome);
    // SAFETY: _exit ends the helper without running the host's exit handlers.
    unsafe { libc::_exit(i32::from(sent.is_err())) }
}

/// Enters the user namespace `userns` as `uid` and `gid` there, without supplementary groups
/// and without a capability.
fn become_sandbox_user(userns: RawFd, uid: u32, gid: u32) -> io::Result<()> {
    let step = |what: &'static str| {
        move |e: nix::errno::Errno| {
            io::Error::new(io::Error::from(e).kind(), format!("{what}: {e}"))
        }
    };
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    // SAFETY: `userns` is a descriptor of a user namespace this process keeps open.
    let ns = unsafe { std::os::fd::BorrowedFd::borrow_raw(userns) };
    nix::sched::setns(ns, CloneFlags::CLONE_NEWUSER)
        .map_err(step("joining the sandbox's user namespace"))?;
    nix::unistd::setgroups(&[]).map_err(step("dropping supplementary groups"))?;
    let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
    nix::unistd::setresgid(gid, gid, gid).map_err(step("becoming the sandbox group"))?;
    nix::unistd::setresuid(uid, uid, uid).map_err(step("becoming the sandbox user"))?;
    // Joining the namespace gave every capability in it, which a change between ids the
    // namespace does not count as root's leaves in place: the sandbox user has none.
    for set in [
        caps::CapSet::Effective,
        caps::CapSet::Permitted,
        caps::CapSet::Inheritable,
    ] {
        caps::clear(None, set)
            .map_err(|e| io::Error::other(format!("dropping capabilities: {e}")))?;
    }
    Ok(())
}

/// Sends `outcome`: a header (the length of what follows) carrying its descriptors, then the
/// rest as JSON.
fn send<T: Transfer>(
    to: &UnixStream,
    outcome: io::Result<Result<T, WorkspaceError>>,
) -> io::Result<()> {
    let mut fds = Vec::new();
    let wire = match outcome {
        Ok(reply) => Ok(reply.into_wire(&mut fds)),
        Err(e) => Err(WireIo::of(&e)),
    };
    let json = serde_json::to_vec(&wire)?;
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let header = (json.len() as u64).to_le_bytes();
    let rights = [ControlMessage::ScmRights(&raw)];
    let cmsgs = if raw.is_empty() {
        &rights[..0]
    } else {
        &rights[..]
    };
    let iov = [io::IoSlice::new(&header)];
    if sendmsg::<()>(to.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None)? != header.len() {
        return Err(io::ErrorKind::WriteZero.into());
    }
    let mut to = to;
    to.write_all(&json)
}

/// Receives what [`send`] sent.
fn receive<T: Transfer>(from: &UnixStream) -> io::Result<Result<T, WorkspaceError>> {
    let gone =
        || io::Error::other("the helper working as the sandbox user ended without an answer");
    let mut header = [0u8; 8];
    let mut space = nix::cmsg_space!([RawFd; MAX_REPLY_FDS]);
    let mut fds = Vec::new();
    let (bytes, truncated) = loop {
        let mut iov = [io::IoSliceMut::new(&mut header)];
        let msg = match recvmsg::<()>(
            from.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            received => received?,
        };
        for cmsg in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(received) = cmsg {
                // SAFETY: the kernel installed these descriptors for us; nothing else owns them.
                fds.extend(
                    received
                        .into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        break (msg.bytes, msg.flags.contains(MsgFlags::MSG_CTRUNC));
    };
    if bytes != header.len() || truncated {
        return Err(gone());
    }
    let len = u64::from_le_bytes(header);
    if len > MAX_REPLY_BYTES {
        return Err(io::Error::other(format!(
            "the helper's answer is too large ({len} bytes)"
        )));
    }
    let mut json = Vec::new();
    from.take(len).read_to_end(&mut json)?;
    if json.len() as u64 != len {
        return Err(gone());
    }
    let wire: Result<<Result<T, WorkspaceError> as Transfer>::Wire, WireIo> =
        serde_json::from_slice(&json).map_err(io::Error::other)?;
    let reply = wire.map_err(WireIo::into_error)?;
    let mut fds = fds.into_iter();
    let reply = Transfer::from_wire(reply, &mut fds)
        .ok_or_else(|| io::Error::other("the helper's answer does not fit its descriptors"))?;
    match fds.next() {
        None => Ok(reply),
        Some(_) => Err(io::Error::other(
            "the helper sent descriptors its answer lacks",
        )),
    }
}

/// What a helper sends back: the parts of a value without descriptors, as they are sent
/// (`Wire`), and its descriptors, in order.
pub(crate) trait Transfer: Sized {
    type Wire: Serialize + DeserializeOwned;
    fn into_wire(self, fds: &mut Vec<OwnedFd>) -> Self::Wire;
    fn from_wire(wire: Self::Wire, fds: &mut dyn Iterator<Item = OwnedFd>) -> Option<Self>;
}

impl Transfer for () {
    type Wire = ();
    fn into_wire(self, _: &mut Vec<OwnedFd>) {}
    fn from_wire((): (), _: &mut dyn Iterator<Item = OwnedFd>) -> Option<()> {
        Some(())
    }
}

impl Transfer for u64 {
    type Wire = u64;
    fn into_wire(self, _: &mut Vec<OwnedFd>) -> u64 {
        self
    }
    fn from_wire(wire: u64, _: &mut dyn Iterator<Item = OwnedFd>) -> Option<u64> {
        Some(wire)
    }
}

impl Transfer for bool {
    type Wire = bool;
    fn into_wire(self, _: &mut Vec<OwnedFd>) -> bool {
        self
    }
    fn from_wire(wire: bool, _: &mut dyn Iterator<Item = OwnedFd>) -> Option<bool> {
        Some(wire)
    }
}

impl Transfer for FileEntry {
    type Wire = FileEntry;
    fn into_wire(self, _: &mut Vec<OwnedFd>) -> FileEntry {
        self
    }
    fn from_wire(wire: FileEntry, _: &mut dyn Iterator<Item = OwnedFd>) -> Option<FileEntry> {
        Some(wire)
    }
}

impl Transfer for crate::workspace::EntryInfo {
    type Wire = crate::workspace::EntryInfo;
    fn into_wire(self, _: &mut Vec<OwnedFd>) -> Self::Wire {
        self
    }
    fn from_wire(wire: Self::Wire, _: &mut dyn Iterator<Item = OwnedFd>) -> Option<Self> {
        Some(wire)
    }
}

impl Transfer for PathBuf {
    type Wire = Vec<u8>;
    fn into_wire(self, _: &mut Vec<OwnedFd>) -> Vec<u8> {
        self.into_os_string().into_vec()
    }
    fn from_wire(wire: Vec<u8>, _: &mut dyn Iterator<Item = OwnedFd>) -> Option<PathBuf> {
        Some(std::ffi::OsString::from_vec(wire).into())
    }
}

impl Transfer for OwnedFd {
    type Wire = ();
    fn into_wire(self, fds: &mut Vec<OwnedFd>) {
        fds.push(self);
    }
    fn from_wire((): (), fds: &mut dyn Iterator<Item = OwnedFd>) -> Option<OwnedFd> {
        fds.next()
    }
}

impl Transfer for File {
    type Wire = ();
    fn into_wire(self, fds: &mut Vec<OwnedFd>) {
        fds.push(self.into());
    }
    fn from_wire((): (), fds: &mut dyn Iterator<Item = OwnedFd>) -> Option<File> {
        fds.next().map(File::from)
    }
}

impl<T: Transfer> Transfer for Vec<T> {
    type Wire = Vec<T::Wire>;
    fn into_wire(self, fds: &mut Vec<OwnedFd>) -> Vec<T::Wire> {
        self.into_iter().map(|item| item.into_wire(fds)).collect()
    }
    fn from_wire(wire: Vec<T::Wire>, fds: &mut dyn Iterator<Item = OwnedFd>) -> Option<Vec<T>> {
        wire.into_iter()
            .map(|item| T::from_wire(item, fds))
            .collect()
    }
}

impl<A: Transfer, B: Transfer> Transfer for (A, B) {
    type Wire = (A::Wire, B::Wire);
    fn into_wire(self, fds: &mut Vec<OwnedFd>) -> Self::Wire {
        (self.0.into_wire(fds), self.1.into_wire(fds))
    }
    fn from_wire(wire: Self::Wire, fds: &mut dyn Iterator<Item = OwnedFd>) -> Option<Self> {
        Some((A::from_wire(wire.0, fds)?, B::from_wire(wire.1, fds)?))
    }
}

impl<T: Transfer> Transfer for Result<T, WorkspaceError> {
    type Wire = Result<T::Wire, WireError>;
    fn into_wire(self, fds: &mut Vec<OwnedFd>) -> Self::Wire {
        self.map(|v| v.into_wire(fds))
            .map_err(|e| WireError::of(&e))
    }
    fn from_wire(wire: Self::Wire, fds: &mut dyn Iterator<Item = OwnedFd>) -> Option<Self> {
        Some(match wire {
            Ok(v) => Ok(T::from_wire(v, fds)?),
            Err(e) => Err(e.into_error()),
        })
    }
}

/// An I/O error as it is sent: its errno, else its message.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct WireIo {
    errno: Option<i32>,
    message: String,
}

impl WireIo {
    fn of(e: &io::Error) -> WireIo {
        WireIo {
            errno: e.raw_os_error(),
            message: e.to_string(),
        }
    }

    fn into_error(self) -> io::Error {
        match self.errno {
            Some(errno) => io::Error::from_raw_os_error(errno),
            None => io::Error::other(self.message),
        }
    }
}

/// A [`WorkspaceError`] as it is sent (paths as their bytes).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum WireError {
    OutsideWorkspace(Vec<u8>),
    NotRegular(Vec<u8>),
    Io {
        path: Vec<u8>,
        source: WireIo,
    },
    Link(Vec<u8>),
    Full {
        path: Vec<u8>,
        capacity: u64,
    },
    OverMemoryLimit {
        path: Vec<u8>,
        memory_bytes: u64,
    },
    Source {
        path: Vec<u8>,
        source: WireIo,
    },
    NotADirectory(Vec<u8>),
    Exists(Vec<u8>),
    TooManyEntries {
        path: Vec<u8>,
        max: usize,
        what: crate::workspace::Walk,
    },
    TooDeep {
        path: Vec<u8>,
        max: usize,
        what: crate::workspace::Walk,
    },
    TooLarge {
        path: Vec<u8>,
        max: usize,
    },
}

fn bytes(path: &Path) -> Vec<u8> {
    path.as_os_str().as_bytes().to_vec()
}

fn path(bytes: Vec<u8>) -> PathBuf {
    std::ffi::OsString::from_vec(bytes).into()
}

impl WireError {
    fn of(e: &WorkspaceError) -> WireError {
        match e {
            WorkspaceError::OutsideWorkspace(p) => WireError::OutsideWorkspace(bytes(p)),
            WorkspaceError::NotRegular(p) => WireError::NotRegular(bytes(p)),
            WorkspaceError::Io { path, source } => WireError::Io {
                path: bytes(path),
                source: WireIo::of(source),
            },
            WorkspaceError::Link(p) => WireError::Link(bytes(p)),
            WorkspaceError::Full { path, capacity } => WireError::Full {
                path: bytes(path),
                capacity: *capacity,
            },
            WorkspaceError::OverMemoryLimit { path, memory_bytes } => WireError::OverMemoryLimit {
                path: bytes(path),
                memory_bytes: *memory_bytes,
            },
            WorkspaceError::Source { path, source } => WireError::Source {
                path: bytes(path),
                source: WireIo::of(source),
            },
            WorkspaceError::NotADirectory(p) => WireError::NotADirectory(bytes(p)),
            WorkspaceError::Exists(p) => WireError::Exists(bytes(p)),
            WorkspaceError::TooManyEntries { path, max, what } => WireError::TooManyEntries {
                path: bytes(path),
                max: *max,
                what: *what,
            },
            WorkspaceError::TooLarge { path, max } => WireError::TooLarge {
                path: bytes(path),
                max: *max,
            },
            WorkspaceError::TooDeep { path, max, what } => WireError::TooDeep {
                path: bytes(path),
                max: *max,
                what: *what,
            },
        }
    }

    fn into_error(self) -> WorkspaceError {
        match self {
            WireError::OutsideWorkspace(p) => WorkspaceError::OutsideWorkspace(path(p)),
            WireError::NotRegular(p) => WorkspaceError::NotRegular(path(p)),
            WireError::Io { path: p, source } => WorkspaceError::Io {
                path: path(p),
                source: source.into_error(),
            },
            WireError::Link(p) => WorkspaceError::Link(path(p)),
            WireError::Full { path: p, capacity } => WorkspaceError::Full {
                path: path(p),
                capacity,
            },
            WireError::OverMemoryLimit {
                path: p,
                memory_bytes,
            } => WorkspaceError::OverMemoryLimit {
                path: path(p),
                memory_bytes,
            },
            WireError::Source { path: p, source } => WorkspaceError::Source {
                path: path(p),
                source: source.into_error(),
            },
            WireError::NotADirectory(p) => WorkspaceError::NotADirectory(path(p)),
            WireError::Exists(p) => WorkspaceError::Exists(path(p)),
            WireError::TooManyEntries { path: p, max, what } => WorkspaceError::TooManyEntries {
                path: path(p),
                max,
                what,
            },
            WireError::TooLarge { path: p, max } => WorkspaceError::TooLarge { path: path(p), max },
            WireError::TooDeep { path: p, max, what } => WorkspaceError::TooDeep {
                path: path(p),
                max,
                what,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Seek;

    use super::*;

    type Reply = (Vec<Result<File, WorkspaceError>>, (PathBuf, u64));

    #[test]
    fn replies_keep_their_values_errors_and_descriptors_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str| {
            std::fs::write(dir.path().join(name), text).unwrap();
            File::open(dir.path().join(name)).unwrap()
        };
        let odd = PathBuf::from(std::ffi::OsString::from_vec(b"d\xffir/f".to_vec()));
        let sent: Result<Reply, WorkspaceError> = Ok((
            vec![
                Ok(file("a", "first")),
                Err(WorkspaceError::NotRegular(odd.clone())),
                Err(WorkspaceError::io(
                    Path::new("x"),
                    io::Error::from_raw_os_error(libc::EACCES),
                )),
                Ok(file("b", "second")),
            ],
            (odd.clone(), 7),
        ));
        let (a, b) = UnixStream::pair().unwrap();
        send(&a, Ok(sent)).unwrap();
        let (opened, (name, n)) =
            receive::<(Vec<Result<File, WorkspaceError>>, (PathBuf, u64))>(&b)
                .unwrap()
                .unwrap();
        assert_eq!((name, n), (odd.clone(), 7));
        let mut texts = Vec::new();
        for entry in opened {
            match entry {
                Ok(mut f) => {
                    f.rewind().unwrap();
                    let mut text = String::new();
                    f.read_to_string(&mut text).unwrap();
                    texts.push(text);
                }
                Err(WorkspaceError::NotRegular(p)) => assert_eq!(p, odd),
                Err(WorkspaceError::Io { path, source }) => {
                    assert_eq!(path, Path::new("x"));
                    assert_eq!(source.raw_os_error(), Some(libc::EACCES));
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(texts, ["first", "second"]);
        // A helper's own failure arrives as the error it was.
        send::<()>(&a, Err(io::Error::other("joining: EPERM"))).unwrap();
        assert_eq!(receive::<()>(&b).unwrap_err().to_string(), "joining: EPERM");
        // A helper that ended without a word.
        drop(a);
        assert!(receive::<()>(&b)
            .unwrap_err()
            .to_string()
            .contains("without an answer"));
    }
}
