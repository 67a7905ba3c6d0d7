//! Bytes the host writes into a sandbox's workspace, charged to the sandbox.
//!
//! The kernel charges a tmpfs page to the memory cgroup of the process that allocates it, so a
//! file the host writes into a workspace would count against the host, not the sandbox. The
//! copy is therefore made by a short-lived writer: a child forked from the host that joins the
//! sandbox's cgroup (through descriptors of its membership files) and raises its own
//! `oom_score_adj` to 1000 before it writes a byte, so that the pages count against the
//! sandbox's memory limit (and its CPU time against its CPU quota), and a copy that would take
//! the sandbox past that limit gets the writer killed, not the sandbox's own processes. The
//! host opens the file (beneath the workspace, never through a link), streams the data to the
//! writer over a socket through one bounded buffer, and reads the outcome from its exit status.
//!
//! The host may be multithreaded: between `fork` and `_exit` the writer only makes system
//! calls on memory prepared before the fork; it allocates nothing.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::sys::socket::{send, MsgFlags};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::ForkResult;

use crate::cgroup::{read_oom_kills, Cgroup};

/// The buffer each copy reads the data through.
const COPY_BUFFER: usize = 64 << 10;
/// The writer's exit status when it could not raise its `oom_score_adj` or join the cgroup.
const WRITER_SETUP_FAILED: i32 = 255;
/// The writer's exit status when it could not read a [`Data::File`], or the file shrank.
const WRITER_SOURCE_FAILED: i32 = 254;

/// The sandbox's cgroup, as a workspace charges what the host writes into it.
#[derive(Debug)]
pub struct Charge {
    /// The membership file of each of the cgroup's directories, opened for writing.
    join: Vec<OwnedFd>,
    /// The file that counts the cgroup's OOM kills: a killed writer was the OOM killer's
    /// when it went up.
    oom_events: File,
    /// The sandbox's memory limit, for the error that names it.
    memory_bytes: u64,
    /// How many writers the OOM killer killed: kills that were not the sandbox's own.
    writer_oom_kills: AtomicU64,
}

impl Charge {
    /// Charges to `cgroup`, whose memory limit is `memory_bytes`.
    pub fn new(cgroup: &Cgroup, memory_bytes: u64) -> io::Result<Charge> {
        Ok(Charge {
            join: cgroup.join_files()?,
            oom_events: cgroup.open_oom_events()?,
            memory_bytes,
            writer_oom_kills: AtomicU64::new(0),
        })
    }

    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes
    }

    /// How many of the cgroup's OOM kills were of writers, not of the sandbox's processes.
    pub fn writer_oom_kills(&self) -> u64 {
        self.writer_oom_kills.load(Ordering::Relaxed)
    }
}

/// Why a copy failed.
#[derive(Debug)]
pub(crate) enum CopyFailure {
    /// Reading the data failed (the client went away, or sent too much).
    Source(io::Error),
    /// Writing the file failed with this error (ENOSPC: the workspace is full).
    Write(io::Error),
    /// The OOM killer killed the writer: the sandbox reached its memory limit.
    OutOfMemory,
    /// The writer could not join the sandbox's cgroup, or could not start.
    Writer(io::Error),
}

/// What [`copy_into`] copies.
pub(crate) enum Data<'a> {
    /// Everything read until it ends.
    Stream(&'a mut dyn Read),
    /// The first `size` bytes of a regular file of the host's, holes kept as holes
    /// (crate::sparse).
    File(&'a File, u64),
}

/// The failure of a sparse copy as [`copy_into`] reports it.
fn sparse_failure(e: crate::sparse::SparseError<std::convert::Infallible>) -> CopyFailure {
    use crate::sparse::SparseError;
    match e {
        SparseError::Read(errno) => CopyFailure::Source(io::Error::from_raw_os_error(errno)),
        SparseError::Write(errno) => CopyFailure::Write(io::Error::from_raw_os_error(errno)),
        SparseError::Shrank => CopyFailure::Source(io::Error::other("it shrank while copied")),
        SparseError::Stopped(never) => match never {},
    }
}

/// Copies all of `data` into `file` and returns how many bytes that was (a file's size):
/// charged to `charge` by a writer in the sandbox's cgroup, or written by this thread where
/// the sandbox has no cgroup (the tmpfs size still bounds it).
pub(crate) fn copy_into(
    file: &File,
    data: Data<'_>,
    charge: Option<&Charge>,
) -> Result<u64, CopyFailure> {
    let mut buf = vec![0u8; COPY_BUFFER];
    let Some(charge) = charge else {
        return match data {
            Data::Stream(data) => pump(data, &mut &*file, &mut buf).map_err(|e| match e {
                Pump::Source(e) => CopyFailure::Source(e),
                Pump::Sink(e) => CopyFailure::Write(e),
            }),
            Data::File(source, size) => crate::sparse::copy(
                source.as_raw_fd(),
                file.as_raw_fd(),
                size,
                &mut buf,
                &mut |_| Ok(()),
            )
            .map(|_| size)
            .map_err(sparse_failure),
        };
    };
    let (host, writer_end) = UnixStream::pair().map_err(CopyFailure::Writer)?;
    let join: Vec<RawFd> = charge.join.iter().map(AsRawFd::as_raw_fd).collect();
    // The writer reads a file itself, or the socket this thread feeds.
    let source = match &data {
        Data::Stream(_) => Source::Socket(writer_end.as_raw_fd()),
        Data::File(file, size) => Source::File(file.as_raw_fd(), *size),
    };
    let source_fd = match source {
        Source::Socket(fd) | Source::File(fd, _) => fd,
    };
    let mut keep: Vec<u32> = join
        .iter()
        .chain([&source_fd, &file.as_raw_fd()])
        .map(|&fd| fd as u32)
        .collect();
    keep.sort_unstable();
    let oom_kills = read_oom_kills(&charge.oom_events);
    // SAFETY: the child runs `writer` only, which makes system calls on memory prepared
    // above (`keep`, `join`, its copy of `buf`) and ends in `_exit`.
    let child = match unsafe { nix::unistd::fork() } {
        Err(e) => return Err(CopyFailure::Writer(e.into())),
        Ok(ForkResult::Child) => writer(source, file.as_raw_fd(), &join, &keep, &mut buf),
        Ok(ForkResult::Parent { child }) => child,
    };
    drop(writer_end);
    let pumped = match data {
        Data::Stream(data) => pump(data, &mut Sent(host.as_fd()), &mut buf),
        Data::File(_, size) => Ok(size),
    };
    // The writer sees the end of the data (or, after a failure, stops early).
    drop(host);
    let status = loop {
        match waitpid(child, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other,
        }
    };
    // What the writer met comes first: data that failed or ran over its bound after the
    // file was already full is still "it did not fit".
    match (pumped, status) {
        (_, Ok(WaitStatus::Exited(_, WRITER_SETUP_FAILED))) => Err(CopyFailure::Writer(
            io::Error::other("the writer could not join the sandbox's cgroup"),
        )),
        (_, Ok(WaitStatus::Exited(_, WRITER_SOURCE_FAILED))) => Err(CopyFailure::Source(
            io::Error::other("the file could not be read whole"),
        )),
        (_, Ok(WaitStatus::Exited(_, errno))) if errno != 0 => {
            Err(CopyFailure::Write(io::Error::from_raw_os_error(errno)))
        }
        (_, Ok(WaitStatus::Signaled(_, nix::sys::signal::Signal::SIGKILL, _)))
            if read_oom_kills(&charge.oom_events) > oom_kills =>
        {
            charge.writer_oom_kills.fetch_add(1, Ordering::Relaxed);
            Err(CopyFailure::OutOfMemory)
        }
        (Err(Pump::Source(e)), _) => Err(CopyFailure::Source(e)),
        (Ok(n), Ok(WaitStatus::Exited(_, 0))) => Ok(n),
        (_, status) => Err(CopyFailure::Writer(io::Error::other(format!(
            "the writer ended unexpectedly ({status:?}): was the sandbox closed meanwhile?"
        )))),
    }
}

/// Which side of a copy failed.
enum Pump {
    Source(io::Error),
    Sink(io::Error),
}

/// Copies `from` into `to` through `buf` until `from` ends.
fn pump(from: &mut dyn Read, to: &mut dyn Write, buf: &mut [u8]) -> Result<u64, Pump> {
    let mut total = 0u64;
    loop {
        let n = match from.read(buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Pump::Source(e)),
        };
        to.write_all(&buf[..n]).map_err(Pump::Sink)?;
        total += n as u64;
    }
}

/// Writes to a socket without SIGPIPE: a writer that is gone is an error, not a signal.
struct Sent<'a>(BorrowedFd<'a>);

impl Write for Sent<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(send(self.0.as_raw_fd(), buf, MsgFlags::MSG_NOSIGNAL)?)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What the writer child copies from.
#[derive(Clone, Copy)]
enum Source {
    /// A socket, to its end.
    Socket(RawFd),
    /// A file of this size, holes kept.
    File(RawFd, u64),
}

/// The writer child: keeps only the descriptors it needs, becomes the first choice of the OOM
/// killer, joins the sandbox's cgroup, then copies `source` into `file`. Exits 0 when
/// everything was written, the errno of a failed write, [`WRITER_SOURCE_FAILED`] or
/// [`WRITER_SETUP_FAILED`].
fn writer(source: Source, file: RawFd, join: &[RawFd], keep: &[u32], buf: &mut [u8]) -> ! {
    crate::sys::close_all_except_sorted(keep);
    let exit = |code: i32| -> ! {
        // SAFETY: _exit ends the child without running the host's exit handlers.
        unsafe { libc::_exit(code) }
    };
    let write_all = |fd: RawFd, bytes: &[u8]| -> Result<(), i32> {
        let mut done = 0;
        while done < bytes.len() {
            let rest = &bytes[done..];
            // SAFETY: `rest` is valid for reads of its length.
            let n = unsafe { libc::write(fd, rest.as_ptr().cast(), rest.len()) };
            if n < 0 {
                match nix::errno::Errno::last_raw() {
                    libc::EINTR => continue,
                    errno => return Err(errno),
                }
            }
            done += n as usize;
        }
        Ok(())
    };
    // SAFETY: a constant NUL-terminated path; the descriptor is closed below.
    let adj = unsafe {
        libc::open(
            c"/proc/self/oom_score_adj".as_ptr(),
            libc::O_WRONLY | libc::O_CLOEXEC,
        )
    };
    if adj < 0 || write_all(adj, b"1000").is_err() {
        exit(WRITER_SETUP_FAILED);
    }
    // SAFETY: `adj` was opened above and is not used again.
    unsafe { libc::close(adj) };
    for &fd in join {
        if write_all(fd, b"0").is_err() {
            exit(WRITER_SETUP_FAILED);
        }
    }
    let source = match source {
        Source::Socket(fd) => fd,
        Source::File(fd, size) => {
            use crate::sparse::SparseError;
            match crate::sparse::copy::<()>(fd, file, size, buf, &mut |_| Ok(())) {
                Ok(_) => exit(0),
                Err(SparseError::Write(errno)) => exit(errno),
                Err(_) => exit(WRITER_SOURCE_FAILED),
            }
        }
    };
    loop {
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { libc::read(source, buf.as_mut_ptr().cast(), buf.len()) };
        if n == 0 {
            exit(0);
        }
        if n < 0 {
            match nix::errno::Errno::last_raw() {
                libc::EINTR => continue,
                // The host is gone: what was written is not wanted.
                errno => exit(errno),
            }
        }
        if let Err(errno) = write_all(file, &buf[..n as usize]) {
            exit(errno);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A charge whose "membership files" are plain files: the writer's path without a cgroup.
    fn fake_charge(dir: &std::path::Path) -> Charge {
        let join = ["memory", "pids"]
            .iter()
            .map(|name| OwnedFd::from(File::create(dir.join(name)).unwrap()))
            .collect();
        std::fs::write(dir.join("events"), "oom 0\noom_kill 0\n").unwrap();
        Charge {
            join,
            oom_events: File::open(dir.join("events")).unwrap(),
            memory_bytes: 1 << 20,
            writer_oom_kills: AtomicU64::new(0),
        }
    }

    #[test]
    fn the_writer_joins_every_membership_file_and_copies_everything() {
        let dir = tempfile::tempdir().unwrap();
        let charge = fake_charge(dir.path());
        let file = File::create(dir.path().join("out")).unwrap();
        let data: Vec<u8> = (0..(3 * COPY_BUFFER + 17)).map(|i| i as u8).collect();
        let n = copy_into(&file, Data::Stream(&mut &data[..]), Some(&charge)).unwrap();
        assert_eq!(n, data.len() as u64);
        assert_eq!(std::fs::read(dir.path().join("out")).unwrap(), data);
        for name in ["memory", "pids"] {
            assert_eq!(std::fs::read(dir.path().join(name)).unwrap(), b"0");
        }
    }

    /// A file is copied by the writer itself, holes kept: a file of 256 MiB with two bytes
    /// takes a few blocks, with or without a cgroup.
    #[test]
    fn a_file_is_copied_with_its_holes() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let charge = fake_charge(dir.path());
        let source = File::create(dir.path().join("sparse")).unwrap();
        source.set_len(256 << 20).unwrap();
        nix::sys::uio::pwrite(&source, b"x", 128 << 20).unwrap();
        let source = File::open(dir.path().join("sparse")).unwrap();
        for (name, charge) in [("charged", Some(&charge)), ("plain", None)] {
            let file = File::create(dir.path().join(name)).unwrap();
            let n = copy_into(&file, Data::File(&source, 256 << 20), charge).unwrap();
            assert_eq!(n, 256 << 20);
            let meta = std::fs::metadata(dir.path().join(name)).unwrap();
            assert_eq!(meta.len(), 256 << 20);
            assert!(meta.blocks() * 512 <= 64 << 10, "{name}: {}", meta.blocks());
            let copy = std::fs::read(dir.path().join(name)).unwrap();
            assert_eq!(copy[128 << 20], b'x');
            assert_eq!(copy.iter().filter(|&&b| b != 0).count(), 1);
        }
    }

    #[test]
    fn a_failed_write_or_read_is_reported_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let charge = fake_charge(dir.path());
        let full = File::options().write(true).open("/dev/full").unwrap();
        for charge in [Some(&charge), None] {
            match copy_into(&full, Data::Stream(&mut &[1u8; 100][..]), charge) {
                Err(CopyFailure::Write(e)) => assert_eq!(e.raw_os_error(), Some(libc::ENOSPC)),
                other => panic!("{other:?}"),
            }
        }
        struct Broken;
        impl Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::other("the client went away"))
            }
        }
        let file = File::create(dir.path().join("out")).unwrap();
        for charge in [Some(&charge), None] {
            assert!(matches!(
                copy_into(&file, Data::Stream(&mut Broken), charge),
                Err(CopyFailure::Source(_))
            ));
        }
    }
}
