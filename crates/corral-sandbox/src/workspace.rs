//! Host-side access to a sandbox's `/workspace`, which the sandbox fully controls.
//!
//! Every path is resolved with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)` relative to a descriptor of the workspace root,
//! one component at a time for directories, so a link the sandbox planted is never followed
//! and nothing outside the workspace is reached. Only regular files are read.
//!
//! Files enter a workspace as the sandbox's own: written to a fresh hidden name beneath the
//! target's directory and renamed over the target only once complete (a failed write leaves
//! nothing, and an existing file stays as it was), owned by the sandbox's user, and written by
//! a process in the sandbox's cgroup ([`Charge`]) so that they count against its memory limit
//! as if the sandbox had written them.
//!
//! Files leave a sandbox for the host only through an [`OutDir`]: it creates new files only
//! (`O_CREAT|O_EXCL|O_NOFOLLOW`, beneath a descriptor of the directory, never through a name
//! that exists there), and caps the bytes and entries it writes.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use corral_share::Grant;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, mkdirat, Mode, SFlag};

use crate::charge::{copy_into, Charge, CopyFailure, Data};
use crate::limits::show_bytes;
use crate::owner::{Owner, Transfer, MAX_REPLY_FDS};
use crate::result::FileEntry;
use crate::sparse::SparseError;

/// The most files `list` and `copy_out` visit, and the most entries one [`Workspace::list_dir`]
/// returns: a sandbox cannot make the host walk forever.
pub const MAX_ENTRIES: usize = 10_000;
/// The most directory levels a walk descends below where it starts.
pub const MAX_DEPTH: usize = 32;
/// The most bytes of paths and link targets one [`Workspace::list_dir`] returns. Within
/// [`MAX_ENTRIES`] and [`MAX_DEPTH`] a sandbox can make each path 8 KiB long (32 levels of
/// 255-byte names, made relative to each directory, past `PATH_MAX`) and each link's target
/// 4 KiB: 120 MB that the host would hold and encode for every listing.
pub const MAX_LISTING_BYTES: usize = 8 << 20;
/// The most names one [`Workspace::remove`] unlinks (files, links, directories, and attempts
/// the sandbox made fail by changing the tree meanwhile).
pub const MAX_REMOVE_ENTRIES: usize = 100_000;
/// The most directory levels one [`Workspace::remove`] descends.
pub const MAX_REMOVE_DEPTH: usize = 128;

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error("path {0:?} is not a relative path inside the workspace")]
    OutsideWorkspace(PathBuf),
    #[error(
        "{0:?} is not a regular file (symlinks and special files are never followed or copied)"
    )]
    NotRegular(PathBuf),
    #[error("{path:?}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// The path, or a directory on it, is a symbolic link (which the sandbox made): refused.
    #[error(
        "{0:?}: the sandbox made this path, or a directory on it, a symbolic link, and Corral \
         never follows links (use the link's target)"
    )]
    Link(PathBuf),
    /// The workspace (a tmpfs of the sandbox's disk limit) has no room for the file.
    #[error(
        "{path:?} was not written: the workspace is full (it holds {} in all: the sandbox's \
         disk limit)", show_bytes(*.capacity)
    )]
    Full { path: PathBuf, capacity: u64 },
    /// Writing the file would take the sandbox past its memory limit: a workspace file is
    /// memory the sandbox uses.
    #[error(
        "{path:?} was not written: it would take the sandbox past its memory limit ({}), \
         which files in the workspace count against", show_bytes(*.memory_bytes)
    )]
    OverMemoryLimit { path: PathBuf, memory_bytes: u64 },
    /// Reading the data to write failed; nothing was written.
    #[error("{path:?} was not written: reading its data failed: {source}")]
    Source { path: PathBuf, source: io::Error },
    /// A directory was expected (to list, or to make: something else is there).
    #[error("{0:?} is not a directory")]
    NotADirectory(PathBuf),
    /// The destination of a rename exists: a rename never replaces anything.
    #[error("{0:?} already exists (a rename never replaces a file or directory)")]
    Exists(PathBuf),
    /// A listing or removal passed the bound on entries; nothing (listing) or part (removal)
    /// was done.
    #[error(
        "{path:?} holds more than {max} entries {what}: stopped there (list a subdirectory, \
         a smaller depth, or use a command)"
    )]
    TooManyEntries {
        path: PathBuf,
        max: usize,
        what: Walk,
    },
    /// A listing passed the bound on the bytes of its paths and link targets; nothing was
    /// listed.
    #[error(
        "the entries below {path:?} have more than {max} bytes of names and link targets: \
         nothing listed (list a subdirectory, a smaller depth, or use a command)"
    )]
    TooLarge { path: PathBuf, max: usize },
    /// A listing or removal passed the bound on directory levels.
    #[error(
        "{path:?} is more than {max} directory levels deep {what}: stopped there (list a \
         subdirectory, a smaller depth, or use a command)"
    )]
    TooDeep {
        path: PathBuf,
        max: usize,
        what: Walk,
    },
}

impl WorkspaceError {
    pub(crate) fn io(path: &Path, source: impl Into<io::Error>) -> Self {
        let source = source.into();
        // RESOLVE_NO_SYMLINKS and O_NOFOLLOW answer ELOOP for a link on the way.
        if source.raw_os_error() == Some(libc::ELOOP) {
            return WorkspaceError::Link(path.to_path_buf());
        }
        WorkspaceError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Whether an error of a write means that the filesystem has no room.
fn no_room(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG)
    )
}

/// The output directory as a whole cannot be used: nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum OutDirError {
    #[error("{0:?} exists and is not a directory")]
    NotADirectory(PathBuf),
    #[error("{path:?}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// One file that was not written to an [`OutDir`] (the others still are). Paths are relative
/// to the output directory and come from the sandbox: they are shown escaped (`{:?}`).
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error(
        "{0:?} already exists there (a file, link or special file is never written through \
         or replaced): not copied"
    )]
    Exists(PathBuf),
    #[error(
        "{path:?} not copied: {parent:?} already exists there and is not a directory (links \
         are never followed)"
    )]
    ParentNotDirectory { path: PathBuf, parent: PathBuf },
    #[error(
        "{path:?} not copied: its {size} bytes would pass the cap of {cap} bytes written in all \
         ({left} left)"
    )]
    OverByteCap {
        path: PathBuf,
        size: u64,
        cap: u64,
        left: u64,
    },
    #[error("{path:?} not copied: the cap of {max} files and directories written was reached")]
    TooManyEntries { path: PathBuf, max: usize },
    #[error(
        "the workspace holds more than {max} files, or more than {MAX_LISTING_BYTES} bytes of \
         their paths: the rest were not copied"
    )]
    ListingTruncated { max: usize },
    #[error("{0:?} changed while it was copied: not copied")]
    Changed(PathBuf),
    #[error("{path:?} not copied: its {size} bytes do not fit: {refusal}")]
    OverBudget {
        path: PathBuf,
        size: u64,
        refusal: corral_share::Refusal,
    },
    #[error("{0:?} not copied: the time for the copy ran out")]
    OutOfTime(PathBuf),
    #[error("the time for the copy ran out: {files} more file(s) were not copied")]
    NotReached { files: usize },
    #[error("{0:?} is not a relative path of plain names: not copied")]
    BadName(PathBuf),
    #[error("reading {path:?} from the workspace: {source}")]
    Read {
        path: PathBuf,
        source: WorkspaceError,
    },
    #[error("writing {path:?}: {source}")]
    Write { path: PathBuf, source: io::Error },
}

/// What one [`Workspace::copy_out`] wrote and what it skipped.
#[derive(Debug, Default)]
pub struct CopyReport {
    pub copied: Vec<FileEntry>,
    pub skipped: Vec<CopyError>,
}

/// Caps on what one [`OutDir`] writes, over every file written through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyLimits {
    /// Bytes written in all, counting every file by its apparent size (a hole costs as much
    /// as the data it stands for, although it is written as a hole: whatever copies the
    /// files on later, without holes, stays within it) and every hard link as a file of its
    /// own.
    pub max_bytes: u64,
    /// Files and directories created in all.
    pub max_entries: usize,
}

impl CopyLimits {
    /// The default for a sandbox whose workspace holds `disk_bytes`: no more than the
    /// workspace could hold without sparse files or links.
    pub fn for_workspace(disk_bytes: u64) -> Self {
        CopyLimits {
            max_bytes: disk_bytes,
            max_entries: MAX_ENTRIES,
        }
    }
}

/// A host directory that files from a sandbox are written into. It only ever creates new
/// names beneath its descriptor: a regular file with `O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC`
/// (mode 0644), a directory with `mkdirat`; an existing name (file, hard link, symlink, FIFO,
/// device) is never opened, followed or replaced, and a directory on the way is entered only
/// if it is a real directory on the same mount (`openat2` with `RESOLVE_BENEATH |
/// RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV`, `O_PATH`, so it cannot block). A file copied from
/// another keeps its holes (crate::sparse). Nothing is written past its [`CopyLimits`], past
/// what its [`Grant`] of the host's disk may grow to ([`OutDir::charge_to`]), or after its
/// deadline ([`OutDir::stop_at`]); a file that does not fit is left out whole, never cut.
#[derive(Debug)]
pub struct OutDir {
    fd: OwnedFd,
    path: PathBuf,
    limits: CopyLimits,
    /// Bytes written, as [`CopyLimits::max_bytes`] counts them.
    bytes: u64,
    entries: usize,
    /// The block of the directory's filesystem: what a directory made takes of the disk.
    block: u64,
    /// What each directory written into (by inode) takes of the disk as counted so far: when
    /// first entered, or made, then as it grows to hold the names written into it.
    dirs: HashMap<u64, u64>,
    grant: Option<Grant>,
    deadline: Option<Instant>,
}

impl OutDir {
    /// Fails unless `path` is a directory or does not exist yet (then [`OutDir::create`] will
    /// make it). Changes nothing.
    pub fn check(path: &Path) -> Result<(), OutDirError> {
        match std::fs::metadata(path) {
            Ok(md) if md.is_dir() => Ok(()),
            Ok(_) => Err(OutDirError::NotADirectory(path.to_path_buf())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
                Err(OutDirError::NotADirectory(path.to_path_buf()))
            }
            Err(source) => Err(OutDirError::Io {
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// Opens the directory `path` (the caller's choice, trusted: links in it are followed),
    /// creating it and its parents if it does not exist.
    pub fn create(path: &Path, limits: CopyLimits) -> Result<OutDir, OutDirError> {
        match Self::open(path, limits) {
            Err(OutDirError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir_all(path).map_err(|source| OutDirError::Io {
                    path: path.to_path_buf(),
                    source,
                })?;
                Self::open(path, limits)
            }
            other => other,
        }
    }

    /// Opens the existing directory `path`.
    pub fn open(path: &Path, limits: CopyLimits) -> Result<OutDir, OutDirError> {
        let io_error = |e: nix::errno::Errno| match e {
            nix::errno::Errno::ENOTDIR => OutDirError::NotADirectory(path.to_path_buf()),
            e => OutDirError::Io {
                path: path.to_path_buf(),
                source: e.into(),
            },
        };
        let fd = nix::fcntl::open(
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(io_error)?;
        // SAFETY: open returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let block = fstat(fd.as_raw_fd()).map_err(io_error)?.st_blksize.max(512) as u64;
        Ok(OutDir {
            fd,
            path: path.to_path_buf(),
            limits,
            bytes: 0,
            entries: 0,
            block,
            dirs: HashMap::new(),
            grant: None,
            deadline: None,
        })
    }

    /// Charges what is written from now on to `grant` too (a key's share of a pool of the
    /// host's disk), as the disk holds it: the blocks of each file (`st_blocks`; whole blocks,
    /// and every hole where the filesystem keeps none) and a block for each directory made.
    /// What it cannot grow for is not written, or removed again.
    pub fn charge_to(&mut self, grant: Grant) {
        self.grant = Some(grant);
    }

    /// The grant given to [`OutDir::charge_to`], holding what was written since.
    pub fn into_grant(self) -> Option<Grant> {
        self.grant
    }

    /// Writes nothing after `deadline`: a file being copied then is removed, and
    /// [`Workspace::copy_out`] copies no more.
    pub fn stop_at(&mut self, deadline: Instant) {
        self.deadline = Some(deadline);
    }

    fn out_of_time(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// The directory as the caller named it.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes written so far, as [`CopyLimits::max_bytes`] counts them.
    pub fn bytes_written(&self) -> u64 {
        self.bytes
    }

    /// Counts `bytes` more against the cap and `disk` more against the grant for `rel` (of
    /// `size` bytes), or refuses them and changes nothing.
    fn admit(&mut self, rel: &Path, size: u64, bytes: u64, disk: u64) -> Result<(), CopyError> {
        if self.out_of_time() {
            return Err(CopyError::OutOfTime(rel.to_path_buf()));
        }
        let left = self.limits.max_bytes.saturating_sub(self.bytes);
        if bytes > left {
            return Err(CopyError::OverByteCap {
                path: rel.to_path_buf(),
                size,
                cap: self.limits.max_bytes,
                left,
            });
        }
        if let Some(grant) = &mut self.grant {
            grant
                .try_grow(disk)
                .map_err(|refusal| CopyError::OverBudget {
                    path: rel.to_path_buf(),
                    size,
                    refusal,
                })?;
        }
        self.bytes += bytes;
        Ok(())
    }

    /// Takes back what [`OutDir::admit`] counted for something that was not written at all.
    fn unadmit(&mut self, bytes: u64, disk: u64) {
        self.bytes -= bytes;
        self.refund(disk);
    }

    /// Gives `disk` back to the grant: what it counted is no longer on the disk.
    fn refund(&mut self, disk: u64) {
        if let Some(grant) = &mut self.grant {
            grant.shrink(disk);
        }
    }

    /// Creates the new file `rel` (directories on the way as needed) and copies `size` bytes
    /// of `data` into it: no more, and nothing at all if `data` holds more than `size` bytes
    /// (the partial file is removed again). Returns the bytes written.
    pub fn write_new(
        &mut self,
        rel: &Path,
        data: &mut dyn Read,
        size: u64,
    ) -> Result<u64, CopyError> {
        // Counted before the first byte, so that even a failed copy stays within the caps.
        let (dir, name, mut file, mut disk) = self.create_new(rel, size, size)?;
        let copied = io::copy(&mut data.take(size), &mut file);
        let more = copied.as_ref().is_ok_and(|_| {
            let mut probe = [0u8; 1];
            !matches!(data.read(&mut probe), Ok(0))
        });
        let failed = match copied {
            Ok(n) if !more => match self.settle(rel, size, &dir, &file, &mut disk) {
                Ok(()) => return Ok(n),
                Err(e) => e,
            },
            Ok(_) => CopyError::Changed(rel.to_path_buf()),
            Err(source) => CopyError::Write {
                path: rel.to_path_buf(),
                source,
            },
        };
        self.remove_new(&dir, name, file, disk);
        Err(failed)
    }

    /// Creates the new file `rel` (as [`OutDir::write_new`] does) and copies the regular file
    /// `source` into it, holes kept: only its data is read and written (the cap still counts
    /// its size, the grant what the disk holds). A file that changes meanwhile, or that
    /// cannot be copied whole, is removed again. Returns its size.
    pub fn copy_new(&mut self, rel: &Path, source: &File) -> Result<u64, CopyError> {
        let read_error = |e: io::Error| CopyError::Read {
            path: rel.to_path_buf(),
            source: WorkspaceError::io(rel, e),
        };
        let size = source.metadata().map_err(read_error)?.len();
        let data = crate::sparse::data_bytes(source.as_raw_fd(), size)
            .map_err(|errno| read_error(io::Error::from_raw_os_error(errno)))?;
        let (dir, name, file, mut disk) = self.create_new(rel, size, data)?;
        let mut buf = vec![0u8; 1 << 20];
        // What the data may grow to (the file changed): never more than was counted.
        let mut allowed = data;
        let deadline = self.deadline;
        let copied = crate::sparse::copy(
            source.as_raw_fd(),
            file.as_raw_fd(),
            size,
            &mut buf,
            &mut |n| {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(CopyError::OutOfTime(rel.to_path_buf()));
                }
                allowed = allowed
                    .checked_sub(n)
                    .ok_or_else(|| CopyError::Changed(rel.to_path_buf()))?;
                Ok(())
            },
        );
        let failed = match copied {
            Ok(_) => {
                let unchanged = source.metadata().is_ok_and(|m| m.len() == size);
                match self.settle(rel, size, &dir, &file, &mut disk) {
                    Ok(()) if unchanged => return Ok(size),
                    Ok(()) => CopyError::Changed(rel.to_path_buf()),
                    Err(e) => e,
                }
            }
            Err(SparseError::Stopped(e)) => e,
            Err(SparseError::Shrank) => CopyError::Changed(rel.to_path_buf()),
            Err(SparseError::Read(errno)) => read_error(io::Error::from_raw_os_error(errno)),
            Err(SparseError::Write(errno)) => CopyError::Write {
                path: rel.to_path_buf(),
                source: io::Error::from_raw_os_error(errno),
            },
        };
        self.remove_new(&dir, name, file, disk);
        Err(failed)
    }

    /// Counts `rel` (`size` bytes, of which `data` are written) and an entry, then creates
    /// it: its directory, its name there, the file open for writing, and what the grant
    /// counts of it so far.
    fn create_new<'a>(
        &mut self,
        rel: &'a Path,
        size: u64,
        data: u64,
    ) -> Result<(OwnedFd, &'a std::ffi::OsStr, File, u64), CopyError> {
        let parts = checked_components(rel).map_err(|_| CopyError::BadName(rel.to_path_buf()))?;
        let (name, parents) = parts.split_last().expect("checked non-empty");
        let name: &'a std::ffi::OsStr = name;
        // Refused before any directory is made for it.
        self.admit(rel, size, size, data)?;
        let opened = self
            .enter_parents(rel, size, parents)
            .and_then(|dir| self.check_entries(rel).map(|()| dir))
            .and_then(|dir| {
                openat2(dir.as_raw_fd(), Path::new(name), new_file())
                    .map(|fd| (dir, fd))
                    .map_err(|e| match e {
                        nix::errno::Errno::EEXIST => CopyError::Exists(rel.to_path_buf()),
                        e => CopyError::Write {
                            path: rel.to_path_buf(),
                            source: e.into(),
                        },
                    })
            });
        let (dir, fd) = match opened {
            Ok(opened) => opened,
            Err(e) => {
                // Nothing of it was written.
                self.unadmit(size, data);
                return Err(e);
            }
        };
        self.entries += 1;
        // SAFETY: openat2 returned a new descriptor that nothing else owns.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        Ok((dir, name, file, data))
    }

    /// Charges the grant with what the written `file` takes of the disk beyond the `disk` it
    /// holds for it already (whole blocks; every hole where the filesystem keeps none), and
    /// with what its directory `dir` grew by to hold its name, or refuses them.
    fn settle(
        &mut self,
        rel: &Path,
        size: u64,
        dir: &OwnedFd,
        file: &File,
        disk: &mut u64,
    ) -> Result<(), CopyError> {
        use std::os::unix::fs::MetadataExt as _;
        let allocated = file
            .metadata()
            .map_err(|source| CopyError::Write {
                path: rel.to_path_buf(),
                source,
            })?
            .blocks()
            * 512;
        let extra = allocated.saturating_sub(*disk);
        self.admit(rel, size, 0, extra)?;
        *disk += extra;
        self.charge_dir(rel, size, dir)
    }

    /// Charges the grant with what `dir` takes of the disk beyond what was counted of it
    /// (a directory grows with the names in it and does not shrink when they go), or
    /// refuses it. The first time, what it takes is only noted: what it held before.
    fn charge_dir(&mut self, rel: &Path, size: u64, dir: &OwnedFd) -> Result<(), CopyError> {
        let stat = fstat(dir.as_raw_fd()).map_err(|e| CopyError::Write {
            path: rel.to_path_buf(),
            source: e.into(),
        })?;
        let now = stat.st_blocks as u64 * 512;
        let counted = *self.dirs.entry(stat.st_ino).or_insert(now);
        if now > counted {
            self.admit(rel, size, 0, now - counted)?;
            self.dirs.insert(stat.st_ino, now);
        }
        Ok(())
    }

    /// Removes the file `name` just created in `dir` (O_EXCL: the one this OutDir made), and
    /// gives the `disk` it held back to the grant. What it counted against the cap stays
    /// counted: even failed copies stay within it.
    fn remove_new(&mut self, dir: &OwnedFd, name: &std::ffi::OsStr, file: File, disk: u64) {
        drop(file);
        let _ = nix::unistd::unlinkat(
            Some(dir.as_raw_fd()),
            Path::new(name),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
        self.refund(disk);
    }

    /// Fails when one more file or directory would pass the entry cap.
    fn check_entries(&self, rel: &Path) -> Result<(), CopyError> {
        if self.entries >= self.limits.max_entries {
            return Err(CopyError::TooManyEntries {
                path: rel.to_path_buf(),
                max: self.limits.max_entries,
            });
        }
        Ok(())
    }

    /// The directory `parents` below the root, created (`mkdirat`) where missing and entered
    /// only if it is a real directory.
    fn enter_parents(
        &mut self,
        rel: &Path,
        size: u64,
        parents: &[&std::ffi::OsStr],
    ) -> Result<OwnedFd, CopyError> {
        let write_error = |source: nix::errno::Errno| CopyError::Write {
            path: rel.to_path_buf(),
            source: source.into(),
        };
        let mut dir = self.fd.try_clone().map_err(|source| CopyError::Write {
            path: rel.to_path_buf(),
            source,
        })?;
        let mut shown = PathBuf::new();
        for part in parents {
            shown.push(part);
            self.note_dir(&dir);
            let enter = |dir: &OwnedFd| {
                open_beneath(
                    dir.as_raw_fd(),
                    Path::new(part),
                    OFlag::O_PATH | OFlag::O_DIRECTORY,
                    Mode::empty(),
                )
            };
            let entered = match enter(&dir) {
                Err(nix::errno::Errno::ENOENT) => {
                    self.check_entries(rel)?;
                    self.admit(rel, size, 0, self.block)?;
                    match mkdirat(
                        Some(dir.as_raw_fd()),
                        *part,
                        Mode::from_bits_truncate(0o755),
                    ) {
                        Ok(()) => {
                            self.entries += 1;
                            // Its name may have grown the directory it was made in.
                            self.charge_dir(rel, size, &dir)?;
                        }
                        Err(e) => {
                            // Not made by this OutDir.
                            self.refund(self.block);
                            if e != nix::errno::Errno::EEXIST {
                                return Err(write_error(e));
                            }
                        }
                    }
                    enter(&dir)
                }
                other => other,
            };
            dir = match entered {
                Ok(fd) => fd,
                // A symlink (RESOLVE_NO_SYMLINKS), a file or special file, another mount.
                Err(
                    nix::errno::Errno::ELOOP
                    | nix::errno::Errno::ENOTDIR
                    | nix::errno::Errno::EXDEV,
                ) => {
                    return Err(CopyError::ParentNotDirectory {
                        path: rel.to_path_buf(),
                        parent: shown,
                    })
                }
                Err(e) => return Err(write_error(e)),
            };
        }
        self.note_dir(&dir);
        Ok(dir)
    }

    /// Notes what `dir` takes of the disk before anything is written into it, the first
    /// time it is entered (a directory made here: the block counted for it).
    fn note_dir(&mut self, dir: &OwnedFd) {
        if let Ok(stat) = fstat(dir.as_raw_fd()) {
            self.dirs
                .entry(stat.st_ino)
                .or_insert(stat.st_blocks as u64 * 512);
        }
    }
}

/// A descriptor of a sandbox's `/workspace`; it keeps the tmpfs reachable after the sandbox
/// has ended, until dropped (with every clone of it).
#[derive(Debug, Clone)]
pub struct Workspace {
    root: Arc<OwnedFd>,
    /// Whose permissions every operation inside the workspace runs with: the sandbox user's,
    /// so the host touches the workspace with exactly the sandbox's own permissions (a second
    /// layer behind openat2), and what it creates belongs to the sandbox (the tmpfs rejects
    /// owners its user namespace cannot map).
    owner: Owner,
    /// The sandbox's cgroup, which the bytes written into the workspace are charged to;
    /// `None` where the sandbox has none (the rlimit fallback).
    charge: Option<Arc<Charge>>,
}

/// The start of the hidden names uploads are written under before they are renamed to
/// their own (see [`Workspace::write_file`]).
pub const UPLOAD_TEMP_PREFIX: &str = ".corral-upload-";

/// Creates a new regular file under a fresh hidden name in `dir` (never an existing name):
/// its name and the file, open for writing.
fn create_temp(dir: &OwnedFd) -> io::Result<(PathBuf, File)> {
    let mut attempts = 0;
    loop {
        let name = PathBuf::from(format!("{UPLOAD_TEMP_PREFIX}{}", crate::unique_name()));
        let how = new_file();
        match openat2(dir.as_raw_fd(), &name, how) {
            // SAFETY: openat2 returned a new descriptor that nothing else owns.
            Ok(fd) => return Ok((name, File::from(unsafe { OwnedFd::from_raw_fd(fd) }))),
            // The sandbox made that name first.
            Err(nix::errno::Errno::EEXIST) if attempts < 8 => attempts += 1,
            Err(e) => return Err(e.into()),
        }
    }
}

/// How a new file is created beneath a directory the host holds: exclusively (never an
/// existing name, link or special file), never through a link, mode 0644.
fn new_file() -> OpenHow {
    OpenHow::new()
        .flags(
            OFlag::O_WRONLY
                | OFlag::O_CREAT
                | OFlag::O_EXCL
                | OFlag::O_NOFOLLOW
                | OFlag::O_CLOEXEC
                | OFlag::O_NOCTTY,
        )
        .mode(Mode::from_bits_truncate(0o644))
        .resolve(resolve())
}

fn resolve() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS
        | ResolveFlag::RESOLVE_NO_XDEV
}

fn open_beneath(dir: RawFd, path: &Path, flags: OFlag, mode: Mode) -> nix::Result<OwnedFd> {
    // openat2 rejects O_NOCTTY next to O_PATH (an O_PATH descriptor never opens the file).
    let extra = if flags.contains(OFlag::O_PATH) {
        OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW
    } else {
        OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW | OFlag::O_NOCTTY
    };
    let how = OpenHow::new()
        .flags(flags | extra)
        .mode(mode)
        .resolve(resolve());
    let fd = openat2(dir, path, how)?;
    // SAFETY: openat2 returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Checks that `path` is relative and stays inside the workspace; returns its components.
pub fn checked_components(path: &Path) -> Result<Vec<&std::ffi::OsStr>, WorkspaceError> {
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => parts.push(p),
            Component::CurDir => {}
            _ => return Err(WorkspaceError::OutsideWorkspace(path.to_path_buf())),
        }
    }
    if parts.is_empty() {
        return Err(WorkspaceError::OutsideWorkspace(path.to_path_buf()));
    }
    Ok(parts)
}

/// What a walk that [`WorkspaceError::TooManyEntries`] or [`WorkspaceError::TooDeep`] stopped
/// was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Walk {
    Listing,
    Removing,
}

impl std::fmt::Display for Walk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Walk::Listing => "to list",
            Walk::Removing => "to remove",
        })
    }
}

/// What an entry of the workspace is. A link is reported as a link: its target is never
/// looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    /// A FIFO, socket or device node.
    Other,
}

/// One entry of the workspace, as `lstat` sees it (never through a link).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EntryInfo {
    /// Relative to the workspace; empty for the workspace itself.
    pub path: PathBuf,
    pub kind: EntryKind,
    pub size: u64,
    /// `st_mode`: the file type and permission bits.
    pub mode: u32,
    /// Host ids (see [`Workspace::sandbox_user`]).
    pub uid: u32,
    pub gid: u32,
    pub ino: u64,
    /// Modification time: seconds and nanoseconds since the epoch, as the sandbox set it.
    pub modified: (i64, u32),
    /// A link's target as it is stored (at most `PATH_MAX` bytes), never resolved.
    pub link_target: Option<PathBuf>,
}

impl EntryInfo {
    /// The entry's name: the last component of its path (empty for the workspace).
    pub fn name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    fn of_stat(path: PathBuf, stat: &nix::sys::stat::FileStat) -> EntryInfo {
        let kind = match SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT {
            SFlag::S_IFREG => EntryKind::File,
            SFlag::S_IFDIR => EntryKind::Dir,
            SFlag::S_IFLNK => EntryKind::Symlink,
            _ => EntryKind::Other,
        };
        EntryInfo {
            path,
            kind,
            size: stat.st_size.max(0) as u64,
            mode: stat.st_mode,
            uid: stat.st_uid,
            gid: stat.st_gid,
            ino: stat.st_ino,
            modified: (
                stat.st_mtime,
                stat.st_mtime_nsec.clamp(0, 999_999_999) as u32,
            ),
            link_target: None,
        }
    }
}

/// The entry `name` of directory `dir` (shown as `path`), without following it if it is a
/// link; a link's target is read (`readlinkat`, which never follows it either).
fn entry_at(dir: RawFd, name: &std::ffi::OsStr, path: PathBuf) -> nix::Result<EntryInfo> {
    let stat = nix::sys::stat::fstatat(Some(dir), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)?;
    let mut entry = EntryInfo::of_stat(path, &stat);
    if entry.kind == EntryKind::Symlink {
        // Swapped for something else meanwhile: then no target.
        entry.link_target = nix::fcntl::readlinkat(Some(dir), name)
            .ok()
            .map(PathBuf::from);
    }
    Ok(entry)
}

/// The names in directory `dir` (without `.` and `..`), sorted; fails once there are more
/// than `room`.
fn dir_names(
    dir: &OwnedFd,
    shown: &Path,
    room: usize,
    max: usize,
    what: Walk,
) -> Result<Vec<std::ffi::OsString>, WorkspaceError> {
    let fd = open_beneath(
        dir.as_raw_fd(),
        Path::new("."),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        Mode::empty(),
    )
    .map_err(|e| WorkspaceError::io(shown, e))?;
    let mut listing =
        nix::dir::Dir::from_fd(fd.into_raw_fd()).map_err(|e| WorkspaceError::io(shown, e))?;
    let mut names = Vec::new();
    for entry in listing.iter() {
        let entry = entry.map_err(|e| WorkspaceError::io(shown, e))?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        if names.len() >= room {
            return Err(WorkspaceError::TooManyEntries {
                path: shown.to_path_buf(),
                max,
                what,
            });
        }
        names.push(std::ffi::OsStr::from_bytes(name).to_os_string());
    }
    names.sort();
    Ok(names)
}

/// What a listing holds so far: its entries, and the bytes of their paths and link targets.
#[derive(Default)]
struct Listing {
    entries: Vec<EntryInfo>,
    bytes: usize,
}

/// Adds the entries below `dir` (shown as `prefix`), `levels` levels of them, to `out`, each
/// directory followed by what is in it (names in sorted order); at most [`MAX_ENTRIES`]
/// entries, [`MAX_DEPTH`] levels and [`MAX_LISTING_BYTES`].
fn walk_entries(
    dir: &OwnedFd,
    prefix: &Path,
    levels: usize,
    below: usize,
    listing: &mut Listing,
) -> Result<(), WorkspaceError> {
    const WHAT: Walk = Walk::Listing;
    let room = MAX_ENTRIES - listing.entries.len();
    let names = dir_names(dir, prefix, room, MAX_ENTRIES, WHAT)?;
    for name in names {
        if listing.entries.len() >= MAX_ENTRIES {
            return Err(WorkspaceError::TooManyEntries {
                path: prefix.to_path_buf(),
                max: MAX_ENTRIES,
                what: WHAT,
            });
        }
        let path = prefix.join(&name);
        let Ok(entry) = entry_at(dir.as_raw_fd(), &name, path.clone()) else {
            continue; // gone meanwhile
        };
        listing.bytes += entry.path.as_os_str().len()
            + entry
                .link_target
                .as_ref()
                .map_or(0, |t| t.as_os_str().len());
        if listing.bytes > MAX_LISTING_BYTES {
            return Err(WorkspaceError::TooLarge {
                path: prefix.to_path_buf(),
                max: MAX_LISTING_BYTES,
            });
        }
        let is_dir = entry.kind == EntryKind::Dir;
        listing.entries.push(entry);
        if !is_dir || levels <= 1 {
            continue;
        }
        if below >= MAX_DEPTH {
            return Err(WorkspaceError::TooDeep {
                path,
                max: MAX_DEPTH,
                what: WHAT,
            });
        }
        // Entered only if it is still a real directory (not swapped for a link meanwhile).
        if let Ok(sub) = open_beneath(
            dir.as_raw_fd(),
            Path::new(&name),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            Mode::empty(),
        ) {
            walk_entries(&sub, &path, levels - 1, below + 1, listing)?;
        }
    }
    Ok(())
}

/// Renames `from` in `from_dir` to `to` in `to_dir` unless `to` exists (`RENAME_NOREPLACE`):
/// a link at either name is renamed or refused as itself, never followed.
fn rename_noreplace(
    from_dir: RawFd,
    from: &std::ffi::OsStr,
    to_dir: RawFd,
    to: &std::ffi::OsStr,
) -> nix::Result<()> {
    let from = std::ffi::CString::new(from.as_bytes()).map_err(|_| nix::errno::Errno::EINVAL)?;
    let to = std::ffi::CString::new(to.as_bytes()).map_err(|_| nix::errno::Errno::EINVAL)?;
    // SAFETY: both names are NUL-terminated strings that live across the call, and both
    // descriptors are open directories the caller holds; the call takes no other memory.
    let res = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            from_dir,
            from.as_ptr(),
            to_dir,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    nix::errno::Errno::result(res).map(drop)
}

/// Removes `name` in `dir` (shown as `shown`), a directory with everything in it, never
/// following a link: names are unlinked relative to descriptors of directories entered
/// beneath the workspace, so a link is removed as itself. `count` counts every unlink and
/// every attempt the sandbox defeats by changing the tree, up to [`MAX_REMOVE_ENTRIES`].
fn remove_at(
    dir: &OwnedFd,
    name: &std::ffi::OsStr,
    shown: &Path,
    below: usize,
    count: &mut usize,
) -> Result<(), WorkspaceError> {
    use nix::errno::Errno;
    use nix::unistd::{unlinkat, UnlinkatFlags};
    const WHAT: Walk = Walk::Removing;
    loop {
        if *count >= MAX_REMOVE_ENTRIES {
            return Err(WorkspaceError::TooManyEntries {
                path: shown.to_path_buf(),
                max: MAX_REMOVE_ENTRIES,
                what: WHAT,
            });
        }
        *count += 1;
        // A file, link or special file goes at once; a directory answers EISDIR.
        match unlinkat(Some(dir.as_raw_fd()), name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) => return Ok(()),
            Err(Errno::EISDIR) => {}
            Err(e) => return Err(WorkspaceError::io(shown, e)),
        }
        if below >= MAX_REMOVE_DEPTH {
            return Err(WorkspaceError::TooDeep {
                path: shown.to_path_buf(),
                max: MAX_REMOVE_DEPTH,
                what: WHAT,
            });
        }
        let sub = match open_beneath(
            dir.as_raw_fd(),
            Path::new(name),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            Mode::empty(),
        ) {
            Ok(sub) => sub,
            // Swapped for a link or a file meanwhile: unlinked as such on the next round.
            Err(Errno::ELOOP | Errno::ENOTDIR) => continue,
            Err(e) => return Err(WorkspaceError::io(shown, e)),
        };
        let room = MAX_REMOVE_ENTRIES.saturating_sub(*count).max(1);
        for child in dir_names(&sub, shown, room, MAX_REMOVE_ENTRIES, WHAT)? {
            match remove_at(&sub, &child, &shown.join(&child), below + 1, count) {
                Err(WorkspaceError::Io { source, .. })
                    if source.raw_os_error() == Some(libc::ENOENT) => {} // gone meanwhile
                other => other?,
            }
        }
        match unlinkat(Some(dir.as_raw_fd()), name, UnlinkatFlags::RemoveDir) {
            Ok(()) => return Ok(()),
            // Filled again (or swapped) by the sandbox meanwhile: another round.
            Err(Errno::ENOTEMPTY | Errno::EEXIST | Errno::ENOTDIR) => continue,
            Err(e) => return Err(WorkspaceError::io(shown, e)),
        }
    }
}

impl Workspace {
    /// Wraps a descriptor of a workspace directory (an `O_PATH` descriptor received from a
    /// sandbox); `owner` is how the host takes the sandbox user's permissions; `charge` the
    /// sandbox's cgroup, where it has one.
    pub fn new(root: OwnedFd, owner: Owner, charge: Option<Charge>) -> Self {
        Workspace {
            root: Arc::new(root),
            owner,
            charge: charge.map(Arc::new),
        }
    }

    /// The size of the workspace's filesystem: no file written into it can be larger.
    pub fn capacity(&self) -> Result<u64, WorkspaceError> {
        Ok(self.usage()?.1)
    }

    /// The bytes the workspace's files take, and its filesystem's size.
    pub fn usage(&self) -> Result<(u64, u64), WorkspaceError> {
        let stat = nix::sys::statvfs::fstatvfs(self.root.as_fd())
            .map_err(|e| WorkspaceError::io(Path::new("."), e))?;
        let block = stat.fragment_size() as u64;
        let used = (stat.blocks() as u64).saturating_sub(stat.blocks_free() as u64);
        Ok((
            used.saturating_mul(block),
            (stat.blocks() as u64).saturating_mul(block),
        ))
    }

    /// How many times the OOM killer killed a writer of this workspace: OOM kills of the
    /// sandbox's cgroup that were not of the sandbox's own processes.
    pub fn writer_oom_kills(&self) -> u64 {
        self.charge.as_ref().map_or(0, |c| c.writer_oom_kills())
    }

    /// A failed write of `path` as the error that says why: a full workspace, or `source`.
    fn write_error(&self, path: &Path, source: io::Error) -> WorkspaceError {
        if no_room(&source) {
            return WorkspaceError::Full {
                path: path.to_path_buf(),
                capacity: self.capacity().unwrap_or(0),
            };
        }
        WorkspaceError::io(path, source)
    }

    /// Opens (creating with `create`) the directory `parts` below the root, one component at
    /// a time, never following a link.
    fn open_dir(&self, parts: &[&std::ffi::OsStr], create: bool) -> nix::Result<OwnedFd> {
        let mut dir = open_beneath(
            self.root.as_raw_fd(),
            Path::new("."),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            Mode::empty(),
        )?;
        for part in parts {
            if create {
                match mkdirat(
                    Some(dir.as_raw_fd()),
                    *part,
                    Mode::from_bits_truncate(0o755),
                ) {
                    Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                    Err(e) => return Err(e),
                }
            }
            dir = match open_beneath(
                dir.as_raw_fd(),
                Path::new(part),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY,
                Mode::empty(),
            ) {
                Ok(next) => next,
                // A link where a directory is expected is refused as a link (ELOOP), not as
                // "not a directory".
                Err(nix::errno::Errno::ENOTDIR)
                    if nix::sys::stat::fstatat(
                        Some(dir.as_raw_fd()),
                        *part,
                        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                    )
                    .is_ok_and(|st| {
                        SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK
                    }) =>
                {
                    return Err(nix::errno::Errno::ELOOP)
                }
                Err(e) => return Err(e),
            };
        }
        Ok(dir)
    }

    /// Runs `op` with the sandbox user's permissions ([`Owner`]); it may use `keep` besides
    /// the workspace's descriptor. `path` names the operation in the errors of a helper.
    fn as_owner<T: Transfer>(
        &self,
        path: &Path,
        keep: &[RawFd],
        op: impl FnOnce() -> Result<T, WorkspaceError>,
    ) -> Result<T, WorkspaceError> {
        self.owner.run(path, self.root.as_raw_fd(), keep, op)
    }

    /// Writes `data` to `path`, creating parent directories, and returns its size. The data
    /// goes to a fresh hidden name in the target's directory, renamed over `path` once it is
    /// complete: when anything fails (no room, the memory limit, reading `data`), nothing is
    /// left and an existing file at `path` is unchanged. A link, directory or special file at
    /// `path` is refused, never followed or replaced.
    pub fn write_file(&self, path: &Path, data: &mut dyn Read) -> Result<u64, WorkspaceError> {
        self.write_data(path, Data::Stream(data))
    }

    /// [`Workspace::write_file`] of the host's regular file `source` (the caller's, opened
    /// by the caller): only its data is copied and its holes stay holes, so that a sparse
    /// file costs the sandbox's memory only what it holds. Returns its size.
    pub fn write_file_from(&self, path: &Path, source: &File) -> Result<u64, WorkspaceError> {
        let meta = source.metadata().map_err(|e| WorkspaceError::io(path, e))?;
        if !meta.is_file() {
            return Err(WorkspaceError::NotRegular(path.to_path_buf()));
        }
        self.write_data(path, Data::File(source, meta.len()))
    }

    fn write_data(&self, path: &Path, data: Data<'_>) -> Result<u64, WorkspaceError> {
        let parts = checked_components(path)?;
        let (name, parents) = parts.split_last().expect("checked non-empty");
        let name = Path::new(name);
        let (dir, (temp, file)) = self.as_owner(path, &[], || {
            let dir = self
                .open_dir(parents, true)
                .map_err(|e| self.write_error(path, e.into()))?;
            match open_beneath(dir.as_raw_fd(), name, OFlag::O_PATH, Mode::empty()) {
                Ok(existing) => {
                    let stat =
                        fstat(existing.as_raw_fd()).map_err(|e| WorkspaceError::io(path, e))?;
                    if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
                        return Err(WorkspaceError::NotRegular(path.to_path_buf()));
                    }
                }
                Err(nix::errno::Errno::ENOENT) => {}
                Err(e) => return Err(WorkspaceError::io(path, e)),
            }
            let temp = create_temp(&dir).map_err(|e| self.write_error(path, e))?;
            Ok((dir, temp))
        })?;
        let copied = copy_into(&file, data, self.charge.as_deref()).map_err(|e| match e {
            CopyFailure::Source(source) => WorkspaceError::Source {
                path: path.to_path_buf(),
                source,
            },
            CopyFailure::Write(e) if e.raw_os_error() == Some(libc::ENOMEM) => {
                self.over_memory(path)
            }
            CopyFailure::Write(e) => self.write_error(path, e),
            CopyFailure::OutOfMemory => self.over_memory(path),
            CopyFailure::Writer(e) => WorkspaceError::io(path, e),
        });
        drop(file);
        self.as_owner(path, &[dir.as_raw_fd()], || {
            let renamed = copied.and_then(|size| {
                nix::fcntl::renameat(Some(dir.as_raw_fd()), &temp, Some(dir.as_raw_fd()), name)
                    .map_err(|e| match e {
                        // Made a directory meanwhile, by the sandbox.
                        nix::errno::Errno::EISDIR => WorkspaceError::NotRegular(path.to_path_buf()),
                        e => WorkspaceError::io(path, e),
                    })
                    .map(|()| size)
            });
            if renamed.is_err() {
                let _ = nix::unistd::unlinkat(
                    Some(dir.as_raw_fd()),
                    &temp,
                    nix::unistd::UnlinkatFlags::NoRemoveDir,
                );
            }
            renamed
        })
    }

    /// The error of a write the sandbox's memory limit stopped.
    fn over_memory(&self, path: &Path) -> WorkspaceError {
        WorkspaceError::OverMemoryLimit {
            path: path.to_path_buf(),
            memory_bytes: self.charge.as_ref().map_or(0, |c| c.memory_bytes()),
        }
    }

    /// Opens the regular file at `path` for reading.
    pub fn open_file(&self, path: &Path) -> Result<File, WorkspaceError> {
        let parts = checked_components(path)?;
        self.as_owner(path, &[], || self.open_regular(path, &parts))
    }

    /// [`Workspace::open_file`] of `path` (whose components are `parts`), with the caller's
    /// permissions.
    fn open_regular(
        &self,
        path: &Path,
        parts: &[&std::ffi::OsStr],
    ) -> Result<File, WorkspaceError> {
        let (name, parents) = parts.split_last().expect("checked non-empty");
        let dir = self
            .open_dir(parents, false)
            .map_err(|e| WorkspaceError::io(path, e))?;
        let fd = open_beneath(
            dir.as_raw_fd(),
            Path::new(name),
            OFlag::O_RDONLY | OFlag::O_NONBLOCK,
            Mode::empty(),
        )
        .map_err(|e| WorkspaceError::io(path, e))?;
        let stat = fstat(fd.as_raw_fd()).map_err(|e| WorkspaceError::io(path, e))?;
        if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
            return Err(WorkspaceError::NotRegular(path.to_path_buf()));
        }
        Ok(File::from(fd))
    }

    /// Removes the regular file at `path` (never a directory, and never through a link).
    pub fn remove_file(&self, path: &Path) -> Result<(), WorkspaceError> {
        let parts = checked_components(path)?;
        self.as_owner(path, &[], || {
            let (name, parents) = parts.split_last().expect("checked non-empty");
            let dir = self
                .open_dir(parents, false)
                .map_err(|e| WorkspaceError::io(path, e))?;
            let fd = open_beneath(
                dir.as_raw_fd(),
                Path::new(name),
                OFlag::O_PATH,
                Mode::empty(),
            )
            .map_err(|e| WorkspaceError::io(path, e))?;
            let stat = fstat(fd.as_raw_fd()).map_err(|e| WorkspaceError::io(path, e))?;
            if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
                return Err(WorkspaceError::NotRegular(path.to_path_buf()));
            }
            // The name is unlinked relative to the directory just checked; a sandbox racing
            // to swap the file for something else can only make us remove its own
            // replacement.
            nix::unistd::unlinkat(
                Some(dir.as_raw_fd()),
                Path::new(name),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            )
            .map_err(|e| WorkspaceError::io(path, e))
        })
    }

    /// The host uid and gid of the sandbox's user: who its files belong to.
    pub fn sandbox_user(&self) -> (u32, u32) {
        match &self.owner {
            Owner::Caller => (
                nix::unistd::geteuid().as_raw(),
                nix::unistd::getegid().as_raw(),
            ),
            Owner::Host { uid, gid } | Owner::Namespace { uid, gid, .. } => (*uid, *gid),
        }
    }

    /// Opens the directory `parts` below the root, reporting a failure as `path`'s.
    fn dir_of(&self, parts: &[&std::ffi::OsStr], create: bool) -> Result<OwnedFd, WorkspaceError> {
        let shown: PathBuf = parts.iter().collect();
        self.open_dir(parts, create).map_err(|e| {
            if e == nix::errno::Errno::ENOTDIR {
                WorkspaceError::NotADirectory(shown)
            } else {
                WorkspaceError::io(&shown, e)
            }
        })
    }

    /// The components of `path`, which may also name the workspace itself (empty, `.`).
    fn components_or_root(path: &Path) -> Result<Vec<&std::ffi::OsStr>, WorkspaceError> {
        if path.components().all(|c| c == Component::CurDir) {
            return Ok(Vec::new());
        }
        checked_components(path)
    }

    /// What is at `path` (the workspace itself when empty), as `lstat` sees it: a link is
    /// reported as a link with its target, never followed; a link on the way is refused.
    pub fn stat(&self, path: &Path) -> Result<EntryInfo, WorkspaceError> {
        let parts = Self::components_or_root(path)?;
        let shown: PathBuf = parts.iter().collect();
        self.as_owner(path, &[], || {
            let Some((name, parents)) = parts.split_last() else {
                let stat = fstat(self.root.as_raw_fd()).map_err(|e| WorkspaceError::io(path, e))?;
                return Ok(EntryInfo::of_stat(PathBuf::new(), &stat));
            };
            let dir = self.dir_of(parents, false)?;
            entry_at(dir.as_raw_fd(), name, shown.clone())
                .map_err(|e| WorkspaceError::io(&shown, e))
        })
    }

    /// The entries below the directory `path` (the workspace when empty), `depth` levels of
    /// them (1: its own entries), each directory followed by its entries, names sorted.
    /// Links are listed as links and never entered. Fails, listing nothing, past
    /// [`MAX_ENTRIES`] entries, [`MAX_DEPTH`] levels or [`MAX_LISTING_BYTES`]: a partial
    /// listing would look whole.
    pub fn list_dir(&self, path: &Path, depth: usize) -> Result<Vec<EntryInfo>, WorkspaceError> {
        let parts = Self::components_or_root(path)?;
        let prefix: PathBuf = parts.iter().collect();
        self.as_owner(path, &[], || {
            let dir = self.dir_of(&parts, false)?;
            let mut listing = Listing::default();
            walk_entries(&dir, &prefix, depth.max(1), 0, &mut listing)?;
            Ok(listing.entries)
        })
    }

    /// Makes the directory `path` and the missing ones on the way (as the sandbox's user,
    /// mode 0755), entering each only if it is a real directory. True if `path` was made,
    /// false if it was already a directory.
    pub fn make_dir(&self, path: &Path) -> Result<bool, WorkspaceError> {
        let parts = Self::components_or_root(path)?;
        let shown: PathBuf = parts.iter().collect();
        let Some((name, parents)) = parts.split_last() else {
            return Ok(false);
        };
        self.as_owner(path, &[], || self.make_dir_at(parents, name, &shown))
    }

    /// [`Workspace::make_dir`] of `name` in directory `parents`, as the sandbox's user.
    fn make_dir_at(
        &self,
        parents: &[&std::ffi::OsStr],
        name: &std::ffi::OsStr,
        shown: &Path,
    ) -> Result<bool, WorkspaceError> {
        let shown = shown.to_path_buf();
        let dir = self.dir_of(parents, true).map_err(|e| match e {
            WorkspaceError::Io { ref source, .. } if no_room(source) => {
                self.write_error(&shown, io::Error::from_raw_os_error(libc::ENOSPC))
            }
            e => e,
        })?;
        match mkdirat(Some(dir.as_raw_fd()), name, Mode::from_bits_truncate(0o755)) {
            Ok(()) => Ok(true),
            Err(nix::errno::Errno::EEXIST) => {
                match entry_at(dir.as_raw_fd(), name, shown.clone()) {
                    Ok(e) if e.kind == EntryKind::Dir => Ok(false),
                    Ok(e) if e.kind == EntryKind::Symlink => Err(WorkspaceError::Link(shown)),
                    Ok(_) => Err(WorkspaceError::NotADirectory(shown)),
                    Err(e) => Err(WorkspaceError::io(&shown, e)),
                }
            }
            Err(e) => Err(self.write_error(&shown, e.into())),
        }
    }

    /// Renames `from` to `to`, making the missing directories on the way to `to`. Never
    /// replaces anything (`RENAME_NOREPLACE`): an existing `to` is refused. A link at `from`
    /// is renamed as itself; a link on the way to either is refused. Returns what is at `to`.
    pub fn rename(&self, from: &Path, to: &Path) -> Result<EntryInfo, WorkspaceError> {
        let from_parts = checked_components(from)?;
        let to_parts = checked_components(to)?;
        let (from_name, from_parents) = from_parts.split_last().expect("checked non-empty");
        let (to_name, to_parents) = to_parts.split_last().expect("checked non-empty");
        let to_shown: PathBuf = to_parts.iter().collect();
        self.as_owner(from, &[], || {
            self.rename_at(
                from,
                (from_parents, from_name),
                (to_parents, to_name),
                &to_shown,
            )
        })
    }

    /// [`Workspace::rename`], as the sandbox's user.
    fn rename_at(
        &self,
        from: &Path,
        (from_parents, from_name): (&[&std::ffi::OsStr], &&std::ffi::OsStr),
        (to_parents, to_name): (&[&std::ffi::OsStr], &&std::ffi::OsStr),
        to_shown: &Path,
    ) -> Result<EntryInfo, WorkspaceError> {
        let to_shown = to_shown.to_path_buf();
        let from_dir = self.dir_of(from_parents, false)?;
        // The source must be there before anything is made on the way to the destination.
        nix::sys::stat::fstatat(
            Some(from_dir.as_raw_fd()),
            *from_name,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|e| WorkspaceError::io(from, e))?;
        let to_dir = self.dir_of(to_parents, true)?;
        rename_noreplace(from_dir.as_raw_fd(), from_name, to_dir.as_raw_fd(), to_name).map_err(
            |e| match e {
                nix::errno::Errno::EEXIST | nix::errno::Errno::ENOTEMPTY => {
                    WorkspaceError::Exists(to_shown.clone())
                }
                e => WorkspaceError::io(from, e),
            },
        )?;
        entry_at(to_dir.as_raw_fd(), to_name, to_shown.clone())
            .map_err(|e| WorkspaceError::io(&to_shown, e))
    }

    /// Removes `path`: a file, link or special file, or a directory with everything in it.
    /// Nothing is followed: a link (to anywhere) is removed as itself, and a directory is
    /// emptied through descriptors opened beneath the workspace. Bounded by
    /// [`MAX_REMOVE_ENTRIES`] names and [`MAX_REMOVE_DEPTH`] levels: past them it stops, with
    /// part of the tree removed.
    pub fn remove(&self, path: &Path) -> Result<(), WorkspaceError> {
        let parts = checked_components(path)?;
        let shown: PathBuf = parts.iter().collect();
        let (name, parents) = parts.split_last().expect("checked non-empty");
        self.as_owner(path, &[], || {
            let dir = self.dir_of(parents, false)?;
            let mut count = 0;
            remove_at(&dir, name, &shown, 0, &mut count)
        })
    }

    /// Every regular file below the workspace (symlinks and special files are skipped), in
    /// sorted order.
    pub fn list(&self) -> Result<Vec<FileEntry>, WorkspaceError> {
        self.list_below(None)
    }

    /// Every regular file below directory `dir` of the workspace (the whole workspace when
    /// `None`), with paths relative to the workspace, in sorted order.
    pub fn list_below(&self, dir: Option<&Path>) -> Result<Vec<FileEntry>, WorkspaceError> {
        let parts = match dir {
            Some(d) => checked_components(d)?,
            None => Vec::new(),
        };
        Ok(self.listing(&parts)?.0)
    }

    /// The regular files below `parts`, sorted, and whether the walk stopped at
    /// [`MAX_ENTRIES`] or [`MAX_LISTING_BYTES`].
    fn listing(
        &self,
        parts: &[&std::ffi::OsStr],
    ) -> Result<(Vec<FileEntry>, bool), WorkspaceError> {
        let prefix: PathBuf = parts.iter().collect();
        let shown = if parts.is_empty() {
            Path::new(".")
        } else {
            &prefix
        };
        self.as_owner(shown, &[], || {
            let root = self
                .open_dir(parts, false)
                .map_err(|e| WorkspaceError::io(shown, e))?;
            let mut out = Vec::new();
            let truncated = walk(root, prefix.clone(), 0, &mut out, &mut 0)?;
            out.sort_by(|a, b| a.path.cmp(&b.path));
            Ok((out, truncated))
        })
    }

    /// Copies every regular file of the workspace into `out`, keeping relative paths, as new
    /// files only and within `out`'s caps (see [`OutDir`]). A file that cannot be copied
    /// (its name exists in `out`, it passes a cap, it vanished) is skipped and reported; the
    /// others are still copied. No link is followed on either side.
    pub fn copy_out(&self, out: &mut OutDir) -> Result<CopyReport, WorkspaceError> {
        let (files, truncated) = self.listing(&[])?;
        let mut report = CopyReport::default();
        // Opened with the sandbox user's permissions a batch at a time (one helper each,
        // rootless with subordinate ids), copied with the host's.
        for (done, batch) in files.chunks(MAX_REPLY_FDS).enumerate() {
            if out.out_of_time() {
                report.skipped.push(CopyError::NotReached {
                    files: files.len() - done * MAX_REPLY_FDS,
                });
                break;
            }
            let opened = self.as_owner(Path::new("."), &[], || {
                Ok(batch
                    .iter()
                    .map(|entry| {
                        let rel = Path::new(&entry.path);
                        checked_components(rel).and_then(|parts| self.open_regular(rel, &parts))
                    })
                    .collect::<Vec<_>>())
            })?;
            for (entry, source) in batch.iter().zip(opened) {
                let rel = PathBuf::from(&entry.path);
                let copied = source
                    .map_err(|source| CopyError::Read {
                        path: rel.clone(),
                        source,
                    })
                    .and_then(|src| out.copy_new(&rel, &src));
                match copied {
                    Ok(size) => report.copied.push(FileEntry {
                        path: entry.path.clone(),
                        size,
                    }),
                    Err(e) => report.skipped.push(e),
                }
            }
        }
        if truncated {
            report
                .skipped
                .push(CopyError::ListingTruncated { max: MAX_ENTRIES });
        }
        Ok(report)
    }
}

/// Adds the regular files below `dir` to `out`; true when it stopped at [`MAX_ENTRIES`], or
/// at [`MAX_LISTING_BYTES`] of paths (`bytes`: those of `out` so far).
fn walk(
    dir: OwnedFd,
    prefix: PathBuf,
    depth: usize,
    out: &mut Vec<FileEntry>,
    bytes: &mut usize,
) -> Result<bool, WorkspaceError> {
    let raw = dir.as_raw_fd();
    let mut listing = nix::dir::Dir::from_fd(raw).map_err(|e| WorkspaceError::io(&prefix, e))?;
    std::mem::forget(dir); // now owned by `listing`
    let mut subdirs = Vec::new();
    for entry in listing.iter() {
        let entry = entry.map_err(|e| WorkspaceError::io(&prefix, e))?;
        let name = Path::new(std::ffi::OsStr::from_bytes(entry.file_name().to_bytes()));
        if name == Path::new(".") || name == Path::new("..") {
            continue;
        }
        let Ok(fd) = open_beneath(raw, name, OFlag::O_PATH, Mode::empty()) else {
            continue; // a symlink (RESOLVE_NO_SYMLINKS) or gone
        };
        let Ok(stat) = fstat(fd.as_raw_fd()) else {
            continue;
        };
        let kind = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
        if kind == SFlag::S_IFREG {
            let path = prefix.join(name).to_string_lossy().into_owned();
            *bytes += path.len();
            if out.len() >= MAX_ENTRIES || *bytes > MAX_LISTING_BYTES {
                return Ok(true);
            }
            out.push(FileEntry {
                path,
                size: stat.st_size as u64,
            });
        } else if kind == SFlag::S_IFDIR && depth < MAX_DEPTH {
            subdirs.push(name.to_path_buf());
        }
    }
    for name in subdirs {
        if let Ok(fd) = open_beneath(
            raw,
            &name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            Mode::empty(),
        ) {
            if walk(fd, prefix.join(&name), depth + 1, out, bytes)? {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace(dir: &Path) -> Workspace {
        let fd = nix::fcntl::open(dir, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        // SAFETY: open returned a new descriptor that nothing else owns.
        Workspace::new(unsafe { OwnedFd::from_raw_fd(fd) }, Owner::Caller, None)
    }

    #[test]
    fn list_below_a_directory_keeps_workspace_relative_paths() {
        let dir = tempfile::tempdir().unwrap();
        let ws = workspace(dir.path());
        ws.write_file(Path::new("a.txt"), &mut &b"a"[..]).unwrap();
        ws.write_file(Path::new("sub/b.txt"), &mut &b"bb"[..])
            .unwrap();
        ws.write_file(Path::new("sub/deep/c.txt"), &mut &b"ccc"[..])
            .unwrap();
        let below: Vec<(String, u64)> = ws
            .list_below(Some(Path::new("sub")))
            .unwrap()
            .into_iter()
            .map(|e| (e.path, e.size))
            .collect();
        assert_eq!(
            below,
            [
                ("sub/b.txt".to_string(), 2),
                ("sub/deep/c.txt".to_string(), 3)
            ]
        );
        assert_eq!(ws.list().unwrap().len(), 3);
        assert!(matches!(
            ws.list_below(Some(Path::new("../x"))),
            Err(WorkspaceError::OutsideWorkspace(_))
        ));
    }

    fn limits(max_bytes: u64, max_entries: usize) -> CopyLimits {
        CopyLimits {
            max_bytes,
            max_entries,
        }
    }

    #[test]
    fn copy_out_creates_new_files_only_and_reports_existing_names() {
        use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
        let src = tempfile::tempdir().unwrap();
        let ws = workspace(src.path());
        for name in [
            "exec.sh",
            "linked",
            "fifo",
            "symlink",
            "dir/inner",
            "ok",
            "sub/ok",
        ] {
            ws.write_file(Path::new(name), &mut &b"sandbox"[..])
                .unwrap();
        }
        let host = tempfile::tempdir().unwrap();
        let dest = host.path().join("out");
        std::fs::create_dir(&dest).unwrap();
        std::fs::write(dest.join("exec.sh"), b"host").unwrap();
        std::fs::set_permissions(dest.join("exec.sh"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        std::fs::write(host.path().join("elsewhere"), b"host").unwrap();
        std::fs::hard_link(host.path().join("elsewhere"), dest.join("linked")).unwrap();
        nix::unistd::mkfifo(&dest.join("fifo"), Mode::from_bits_truncate(0o644)).unwrap();
        std::os::unix::fs::symlink(host.path().join("not-there"), dest.join("symlink")).unwrap();
        std::os::unix::fs::symlink(host.path(), dest.join("dir")).unwrap();

        let mut out = OutDir::create(&dest, limits(1 << 20, 100)).unwrap();
        let report = ws.copy_out(&mut out).unwrap();
        let copied: Vec<&str> = report.copied.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(copied, ["ok", "sub/ok"]);
        assert_eq!(std::fs::read(dest.join("sub/ok")).unwrap(), b"sandbox");
        let mode = std::fs::metadata(dest.join("ok")).unwrap().mode();
        assert_eq!(mode & 0o7133, 0, "mode {mode:o}");
        let mut exists: Vec<String> = Vec::new();
        for e in &report.skipped {
            match e {
                CopyError::Exists(p) => exists.push(p.display().to_string()),
                CopyError::ParentNotDirectory { path, parent } => {
                    assert_eq!(
                        (path.as_path(), parent.as_path()),
                        (Path::new("dir/inner"), Path::new("dir"))
                    );
                }
                other => panic!("unexpected {other}"),
            }
        }
        assert_eq!(exists, ["exec.sh", "fifo", "linked", "symlink"]);
        assert_eq!(report.skipped.len(), 5);
        assert_eq!(std::fs::read(dest.join("exec.sh")).unwrap(), b"host");
        let mode = std::fs::metadata(dest.join("exec.sh")).unwrap().mode();
        assert_eq!(mode & 0o777, 0o755);
        assert_eq!(
            std::fs::read(host.path().join("elsewhere")).unwrap(),
            b"host"
        );
        assert!(std::fs::symlink_metadata(dest.join("fifo"))
            .unwrap()
            .file_type()
            .is_fifo());
        assert!(!host.path().join("not-there").exists());
        assert!(!host.path().join("inner").exists());
    }

    #[test]
    fn copy_out_counts_sparse_files_and_hard_links_by_what_it_writes() {
        use std::os::unix::fs::MetadataExt;
        let src = tempfile::tempdir().unwrap();
        let sparse = std::fs::File::create(src.path().join("a-sparse")).unwrap();
        sparse.set_len(1 << 20).unwrap();
        for i in 0..8 {
            std::fs::hard_link(
                src.path().join("a-sparse"),
                src.path().join(format!("b-link{i}")),
            )
            .unwrap();
        }
        std::fs::write(src.path().join("c-small"), b"small").unwrap();
        let ws = workspace(src.path());
        let dest = tempfile::tempdir().unwrap();
        let mut out = OutDir::create(dest.path(), limits((3 << 20) + 100, 100)).unwrap();
        let report = ws.copy_out(&mut out).unwrap();
        // Three files of 1 MiB fit, then 100 bytes: the small file still fits after the
        // others were refused.
        assert_eq!(report.copied.len(), 4, "{report:?}");
        assert_eq!(report.skipped.len(), 6, "{report:?}");
        assert!(report
            .skipped
            .iter()
            .all(|e| matches!(e, CopyError::OverByteCap { left: 100, .. })));
        assert_eq!(out.bytes_written(), (3 << 20) + 5);
        let allocated: u64 = std::fs::read_dir(dest.path())
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().blocks() * 512)
            .sum();
        // Written with their holes: the three copies of 1 MiB take no disk.
        assert!(allocated <= 64 << 10, "{allocated}");
        for f in &report.copied {
            let copy = std::fs::metadata(dest.path().join(&f.path)).unwrap();
            assert_eq!(copy.len(), f.size, "{f:?}");
        }

        // The entry cap counts directories created too.
        let src = tempfile::tempdir().unwrap();
        let ws = workspace(src.path());
        for name in ["a/1", "a/2", "b/1", "c"] {
            ws.write_file(Path::new(name), &mut &b"x"[..]).unwrap();
        }
        let dest = tempfile::tempdir().unwrap();
        let mut out = OutDir::create(dest.path(), limits(1 << 20, 3)).unwrap();
        let report = ws.copy_out(&mut out).unwrap();
        let copied: Vec<&str> = report.copied.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(copied, ["a/1", "a/2"]);
        assert!(report
            .skipped
            .iter()
            .all(|e| matches!(e, CopyError::TooManyEntries { max: 3, .. })));
        assert_eq!(report.skipped.len(), 2);
    }

    /// The blocks a directory grows by to hold the names copied into it are disk the copy
    /// takes: thousands of empty files with long names take megabytes of directory and no
    /// byte of data, and the grant holds them too.
    #[test]
    fn copy_out_charges_what_directories_grow_by() {
        use std::os::unix::fs::MetadataExt;
        let src = tempfile::tempdir().unwrap();
        for i in 0..3000 {
            File::create(src.path().join(format!("{i:04}{}", "x".repeat(240)))).unwrap();
        }
        let pool = corral_share::Pool::new(
            "disk",
            "bytes",
            corral_share::Limits::new(1 << 30, 1 << 30, 0, 0),
        );
        let dst = tempfile::tempdir().unwrap();
        let root = dst.path().join("out");
        let mut out = OutDir::create(&root, CopyLimits::for_workspace(1 << 20)).unwrap();
        let dir_self = std::fs::symlink_metadata(&root).unwrap().blocks() * 512;
        out.charge_to(pool.take("k", dir_self).unwrap());
        let report = workspace(src.path()).copy_out(&mut out).unwrap();
        assert_eq!(report.copied.len(), 3000, "{:?}", report.skipped.first());
        let taken = std::fs::symlink_metadata(&root).unwrap().blocks() * 512;
        assert!(taken > 100 << 10, "the directory grew: {taken}");
        assert!(
            pool.held() >= taken,
            "the grant holds {} of the {taken} bytes the directory takes",
            pool.held()
        );
    }

    /// A grant of the host's disk holds what the copy takes of it (blocks, directories): a
    /// file it cannot grow for is left out, whole; past the deadline nothing more is written.
    #[test]
    fn copy_out_charges_the_disk_it_takes_and_stops_at_its_deadline() {
        use std::os::unix::fs::MetadataExt;
        let src = tempfile::tempdir().unwrap();
        let ws = workspace(src.path());
        ws.write_file(Path::new("dir/a"), &mut &[1u8; 100 << 10][..])
            .unwrap();
        ws.write_file(Path::new("b"), &mut &[2u8; 200 << 10][..])
            .unwrap();
        ws.write_file(Path::new("c"), &mut &b"c"[..]).unwrap();
        let pool = corral_share::Pool::new(
            "test disk",
            "bytes",
            corral_share::Limits::new(160 << 10, 160 << 10, 0, 0),
        );
        let dest = tempfile::tempdir().unwrap();
        let mut out = OutDir::create(dest.path(), limits(1 << 30, 100)).unwrap();
        out.charge_to(pool.take("key", 0).unwrap());
        let report = ws.copy_out(&mut out).unwrap();
        let mut copied: Vec<&str> = report.copied.iter().map(|f| f.path.as_str()).collect();
        copied.sort();
        assert_eq!(copied, ["c", "dir/a"], "{report:?}");
        assert!(
            matches!(report.skipped.as_slice(), [CopyError::OverBudget { path, .. }] if path == Path::new("b")),
            "{report:?}"
        );
        let held = out.into_grant().unwrap();
        let on_disk: u64 = ["c", "dir/a", "dir"]
            .iter()
            .map(|p| std::fs::metadata(dest.path().join(p)).unwrap().blocks() * 512)
            .sum();
        assert!(!dest.path().join("b").exists());
        assert_eq!(held.amount(), on_disk);
        assert_eq!(pool.held(), on_disk);

        let dest = tempfile::tempdir().unwrap();
        let mut out = OutDir::create(dest.path(), limits(1 << 30, 100)).unwrap();
        out.stop_at(Instant::now());
        let report = ws.copy_out(&mut out).unwrap();
        assert!(report.copied.is_empty());
        assert!(
            matches!(
                report.skipped.as_slice(),
                [CopyError::NotReached { files: 3 }]
            ),
            "{report:?}"
        );
        assert_eq!(std::fs::read_dir(dest.path()).unwrap().count(), 0);
    }

    #[test]
    fn copy_out_reports_a_workspace_with_too_many_files() {
        let src = tempfile::tempdir().unwrap();
        for i in 0..=MAX_ENTRIES {
            std::fs::write(src.path().join(i.to_string()), b"").unwrap();
        }
        let ws = workspace(src.path());
        let dest = tempfile::tempdir().unwrap();
        let mut out = OutDir::create(dest.path(), CopyLimits::for_workspace(1 << 20)).unwrap();
        let report = ws.copy_out(&mut out).unwrap();
        assert_eq!(report.copied.len(), MAX_ENTRIES);
        assert!(matches!(
            report.skipped.as_slice(),
            [CopyError::ListingTruncated { max: MAX_ENTRIES }]
        ));
    }

    #[test]
    fn write_new_never_writes_more_than_announced() {
        let dest = tempfile::tempdir().unwrap();
        let mut out = OutDir::create(dest.path(), limits(100, 10)).unwrap();
        let err = out
            .write_new(Path::new("grown"), &mut &b"0123456789"[..], 4)
            .unwrap_err();
        assert!(matches!(err, CopyError::Changed(_)), "{err}");
        assert!(
            !dest.path().join("grown").exists(),
            "the partial file is removed"
        );
        assert_eq!(
            out.write_new(Path::new("ok"), &mut &b"0123"[..], 4)
                .unwrap(),
            4
        );
        let err = out
            .write_new(Path::new("big"), &mut &[0u8; 100][..], 100)
            .unwrap_err();
        assert!(
            matches!(err, CopyError::OverByteCap { left: 92, .. }),
            "{err}"
        );
        assert!(matches!(
            out.write_new(Path::new("../escape"), &mut &b""[..], 0),
            Err(CopyError::BadName(_))
        ));
    }

    #[test]
    fn an_out_dir_must_be_a_directory() {
        let host = tempfile::tempdir().unwrap();
        let file = host.path().join("file");
        std::fs::write(&file, b"host").unwrap();
        assert!(matches!(
            OutDir::check(&file),
            Err(OutDirError::NotADirectory(_))
        ));
        assert!(matches!(
            OutDir::check(&file.join("below")),
            Err(OutDirError::NotADirectory(_))
        ));
        assert!(matches!(
            OutDir::create(&file, CopyLimits::for_workspace(1)),
            Err(OutDirError::NotADirectory(_))
        ));
        assert_eq!(std::fs::read(&file).unwrap(), b"host");
        OutDir::check(&host.path().join("new/dir")).unwrap();
        OutDir::create(&host.path().join("new/dir"), CopyLimits::for_workspace(1)).unwrap();
        assert!(host.path().join("new/dir").is_dir());
    }

    #[test]
    fn a_failed_write_leaves_nothing_and_the_old_file_unchanged() {
        use std::os::unix::fs::FileTypeExt;
        struct Fails(usize);
        impl Read for Fails {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if self.0 == 0 {
                    return Err(io::Error::other("the client went away"));
                }
                let n = buf.len().min(self.0);
                buf[..n].fill(b'n');
                self.0 -= n;
                Ok(n)
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let ws = workspace(dir.path());
        ws.write_file(Path::new("keep.txt"), &mut &b"original"[..])
            .unwrap();
        for path in ["keep.txt", "sub/new.txt"] {
            let err = ws
                .write_file(Path::new(path), &mut Fails(100_000))
                .unwrap_err();
            assert!(matches!(err, WorkspaceError::Source { .. }), "{err}");
        }
        assert_eq!(
            std::fs::read(dir.path().join("keep.txt")).unwrap(),
            b"original"
        );
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .chain(std::fs::read_dir(dir.path().join("sub")).unwrap())
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["keep.txt", "sub"], "no partial or temporary file");

        // A link, a FIFO or a directory at the target is refused and stays as it was.
        let outside = tempfile::NamedTempFile::new().unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
        nix::unistd::mkfifo(&dir.path().join("fifo"), Mode::from_bits_truncate(0o644)).unwrap();
        for path in ["link", "fifo", "sub"] {
            assert!(
                ws.write_file(Path::new(path), &mut &b"x"[..]).is_err(),
                "{path}"
            );
        }
        assert!(std::fs::symlink_metadata(dir.path().join("link"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(outside.path()).unwrap(), b"");
        assert!(std::fs::symlink_metadata(dir.path().join("fifo"))
            .unwrap()
            .file_type()
            .is_fifo());

        assert_eq!(
            ws.write_file(Path::new("keep.txt"), &mut &b"new"[..])
                .unwrap(),
            3
        );
        assert_eq!(std::fs::read(dir.path().join("keep.txt")).unwrap(), b"new");
    }

    fn kinds(entries: &[EntryInfo]) -> Vec<(String, EntryKind)> {
        entries
            .iter()
            .map(|e| (e.path.display().to_string(), e.kind))
            .collect()
    }

    /// A workspace with `a/b/c.txt`, and a host directory outside it holding `b/c.txt`
    /// and `secret`.
    fn planted() -> (tempfile::TempDir, tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(outside.path().join("b")).unwrap();
        std::fs::write(outside.path().join("b/c.txt"), b"host").unwrap();
        std::fs::write(outside.path().join("secret"), b"host").unwrap();
        let ws = workspace(dir.path());
        ws.write_file(Path::new("a/b/c.txt"), &mut &b"sandbox"[..])
            .unwrap();
        (dir, outside, ws)
    }

    fn host_intact(outside: &Path) {
        assert_eq!(std::fs::read(outside.join("b/c.txt")).unwrap(), b"host");
        assert_eq!(std::fs::read(outside.join("secret")).unwrap(), b"host");
        let mut names: Vec<_> = std::fs::read_dir(outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["b", "secret"]);
    }

    #[test]
    fn stat_and_list_report_links_as_links_and_never_follow_them() {
        let (dir, outside, ws) = planted();
        let info = ws.stat(Path::new("a/b/c.txt")).unwrap();
        assert_eq!((info.kind, info.size), (EntryKind::File, 7));
        assert_eq!(info.name(), "c.txt");
        assert_eq!(ws.stat(Path::new("")).unwrap().kind, EntryKind::Dir);
        assert_eq!(
            kinds(&ws.list_dir(Path::new("."), 3).unwrap()),
            [
                ("a".into(), EntryKind::Dir),
                ("a/b".into(), EntryKind::Dir),
                ("a/b/c.txt".into(), EntryKind::File)
            ]
        );
        assert_eq!(ws.list_dir(Path::new("a"), 1).unwrap().len(), 1);
        // A link planted at every component of the path, in turn.
        for at in ["a", "a/b", "a/b/c.txt"] {
            let real = dir.path().join(at);
            let moved = dir.path().join("moved");
            std::fs::rename(&real, &moved).unwrap();
            let target = if at == "a" {
                outside.path().to_path_buf()
            } else if at == "a/b" {
                outside.path().join("b")
            } else {
                outside.path().join("secret")
            };
            std::os::unix::fs::symlink(&target, &real).unwrap();
            let link = ws.stat(Path::new(at)).unwrap();
            assert_eq!(link.kind, EntryKind::Symlink, "{at}");
            assert_eq!(link.link_target.as_deref(), Some(target.as_path()));
            if at != "a/b/c.txt" {
                assert!(matches!(
                    ws.stat(Path::new("a/b/c.txt")),
                    Err(WorkspaceError::Link(_))
                ));
                assert!(matches!(
                    ws.list_dir(Path::new(at), 1),
                    Err(WorkspaceError::Link(_))
                ));
            }
            // The link is listed, never entered.
            let listed = ws.list_dir(Path::new(""), 5).unwrap();
            assert!(listed.iter().all(|e| !e.path.ends_with("secret")));
            assert!(listed
                .iter()
                .any(|e| e.path == Path::new(at) && e.kind == EntryKind::Symlink));
            std::fs::remove_file(&real).unwrap();
            std::fs::rename(&moved, &real).unwrap();
        }
        assert!(matches!(
            ws.stat(Path::new("../x")),
            Err(WorkspaceError::OutsideWorkspace(_))
        ));
        assert!(matches!(
            ws.list_dir(Path::new("a/b/c.txt"), 1),
            Err(WorkspaceError::NotADirectory(_))
        ));
        host_intact(outside.path());
    }

    #[test]
    fn listings_are_bounded_in_depth_and_entries() {
        let dir = tempfile::tempdir().unwrap();
        let deep: PathBuf = (0..=MAX_DEPTH).map(|i| i.to_string()).collect();
        std::fs::create_dir_all(dir.path().join(&deep)).unwrap();
        let ws = workspace(dir.path());
        assert_eq!(ws.list_dir(Path::new(""), 2).unwrap().len(), 2);
        assert_eq!(
            ws.list_dir(Path::new(""), MAX_DEPTH).unwrap().len(),
            MAX_DEPTH
        );
        let err = ws.list_dir(Path::new(""), 1000).unwrap_err();
        assert!(
            matches!(err, WorkspaceError::TooDeep { max: MAX_DEPTH, .. }),
            "{err}"
        );
        let wide = tempfile::tempdir().unwrap();
        for i in 0..MAX_ENTRIES {
            std::fs::write(wide.path().join(i.to_string()), b"").unwrap();
        }
        let ws = workspace(wide.path());
        assert_eq!(ws.list_dir(Path::new(""), 1).unwrap().len(), MAX_ENTRIES);
        std::fs::write(wide.path().join("one-more"), b"").unwrap();
        let err = ws.list_dir(Path::new(""), 1).unwrap_err();
        assert!(
            matches!(
                err,
                WorkspaceError::TooManyEntries {
                    max: MAX_ENTRIES,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn listings_are_bounded_in_the_bytes_of_names_and_link_targets() {
        let dir = tempfile::tempdir().unwrap();
        let target = format!("/{}", "t".repeat(3999));
        // Each link: a 255-byte name and a 4000-byte target; 2,000 of them pass the bound.
        let per_link = 255 + 4000;
        let fits = MAX_LISTING_BYTES / per_link;
        for i in 0..fits {
            let name = format!("{i:05}{}", "n".repeat(250));
            std::os::unix::fs::symlink(&target, dir.path().join(name)).unwrap();
        }
        let ws = workspace(dir.path());
        assert_eq!(ws.list_dir(Path::new(""), 1).unwrap().len(), fits);
        std::os::unix::fs::symlink(&target, dir.path().join("z".repeat(255))).unwrap();
        let err = ws.list_dir(Path::new(""), 1).unwrap_err();
        assert!(
            matches!(
                err,
                WorkspaceError::TooLarge {
                    max: MAX_LISTING_BYTES,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn file_lists_stop_at_the_bytes_of_their_paths() {
        let dir = tempfile::tempdir().unwrap();
        // 14 levels of 255-byte names: each file's path is under 4 KiB (PATH_MAX).
        let deep: PathBuf = (0..14)
            .map(|i| format!("{i:02}{}", "d".repeat(253)))
            .collect();
        std::fs::create_dir_all(dir.path().join(&deep)).unwrap();
        let path_len = deep.as_os_str().len() + 1 + 255;
        let fits = MAX_LISTING_BYTES / path_len;
        for i in 0..fits + 10 {
            std::fs::write(
                dir.path()
                    .join(&deep)
                    .join(format!("{i:05}{}", "f".repeat(250))),
                b"",
            )
            .unwrap();
        }
        let ws = workspace(dir.path());
        let listed = ws.list().unwrap();
        assert_eq!(listed.len(), fits);
        let out = tempfile::tempdir().unwrap();
        let mut copy =
            OutDir::create(&out.path().join("o"), CopyLimits::for_workspace(1 << 30)).unwrap();
        let report = ws.copy_out(&mut copy).unwrap();
        assert_eq!(report.copied.len(), fits);
        assert!(report
            .skipped
            .iter()
            .any(|e| matches!(e, CopyError::ListingTruncated { .. })));
    }

    #[test]
    fn make_dir_makes_parents_and_never_goes_through_links() {
        let (dir, outside, ws) = planted();
        assert!(ws.make_dir(Path::new("x/y/z")).unwrap());
        assert!(dir.path().join("x/y/z").is_dir());
        assert!(!ws.make_dir(Path::new("x/y")).unwrap());
        assert!(!ws.make_dir(Path::new("")).unwrap());
        assert!(matches!(
            ws.make_dir(Path::new("a/b/c.txt")),
            Err(WorkspaceError::NotADirectory(_))
        ));
        assert!(matches!(
            ws.make_dir(Path::new("a/b/c.txt/d")),
            Err(WorkspaceError::NotADirectory(_))
        ));
        std::os::unix::fs::symlink(outside.path(), dir.path().join("out")).unwrap();
        for path in ["out", "out/new", "out/b/new"] {
            assert!(
                matches!(ws.make_dir(Path::new(path)), Err(WorkspaceError::Link(_))),
                "{path}"
            );
        }
        host_intact(outside.path());
    }

    #[test]
    fn rename_never_replaces_and_never_follows() {
        let (dir, outside, ws) = planted();
        ws.write_file(Path::new("other"), &mut &b"other"[..])
            .unwrap();
        let err = ws
            .rename(Path::new("other"), Path::new("a/b/c.txt"))
            .unwrap_err();
        assert!(matches!(err, WorkspaceError::Exists(_)), "{err}");
        assert!(matches!(
            ws.rename(Path::new("a/b"), Path::new("a")),
            Err(WorkspaceError::Exists(_))
        ));
        assert_eq!(std::fs::read(dir.path().join("other")).unwrap(), b"other");
        assert_eq!(
            std::fs::read(dir.path().join("a/b/c.txt")).unwrap(),
            b"sandbox"
        );
        let moved = ws
            .rename(Path::new("other"), Path::new("new/dir/other"))
            .unwrap();
        assert_eq!((moved.kind, moved.size), (EntryKind::File, 5));
        assert!(matches!(
            ws.rename(Path::new("missing"), Path::new("nowhere/x")),
            Err(WorkspaceError::Io { .. })
        ));
        assert!(!dir.path().join("nowhere").exists(), "nothing made");
        // A link is renamed as itself; a link on the way is refused either side.
        std::os::unix::fs::symlink(outside.path(), dir.path().join("out")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("s")).unwrap();
        let link = ws.rename(Path::new("s"), Path::new("s2")).unwrap();
        assert_eq!(link.kind, EntryKind::Symlink);
        assert!(matches!(
            ws.rename(Path::new("out/secret"), Path::new("stolen")),
            Err(WorkspaceError::Link(_))
        ));
        assert!(matches!(
            ws.rename(Path::new("new/dir/other"), Path::new("out/planted")),
            Err(WorkspaceError::Link(_))
        ));
        assert!(matches!(
            ws.rename(Path::new("s2"), Path::new("out")),
            Err(WorkspaceError::Exists(_))
        ));
        assert!(matches!(
            ws.rename(Path::new("a"), Path::new("/tmp/x")),
            Err(WorkspaceError::OutsideWorkspace(_))
        ));
        host_intact(outside.path());
    }

    #[test]
    fn remove_takes_trees_and_links_as_themselves() {
        let (dir, outside, ws) = planted();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("a/b/to-dir")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("a/to-file"))
            .unwrap();
        nix::unistd::mkfifo(&dir.path().join("a/fifo"), Mode::from_bits_truncate(0o644)).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("out")).unwrap();
        assert!(matches!(
            ws.remove(Path::new("out/secret")),
            Err(WorkspaceError::Link(_))
        ));
        assert!(matches!(
            ws.remove(Path::new("out/b")),
            Err(WorkspaceError::Link(_))
        ));
        ws.remove(Path::new("a")).unwrap();
        ws.remove(Path::new("out")).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let err = ws.remove(Path::new("a")).unwrap_err();
        assert!(
            matches!(&err, WorkspaceError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound),
            "{err}"
        );
        assert!(ws.remove(Path::new("")).is_err());
        assert!(ws.remove(Path::new("/etc")).is_err());
        host_intact(outside.path());

        // Past its bound on depth it stops.
        let deep: PathBuf = (0..=MAX_REMOVE_DEPTH).map(|_| "d").collect();
        std::fs::create_dir_all(dir.path().join(&deep)).unwrap();
        let err = ws.remove(Path::new("d")).unwrap_err();
        assert!(matches!(err, WorkspaceError::TooDeep { .. }), "{err}");
    }

    #[test]
    fn an_entry_swapped_for_a_link_meanwhile_is_never_followed() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let (dir, outside, ws) = planted();
        let root = dir.path().to_path_buf();
        let target = outside.path().to_path_buf();
        let stop = Arc::new(AtomicBool::new(false));
        // The sandbox swaps `x` between a directory (with a file in it), a file, and links
        // to the host's directory and file, as fast as it can.
        let swapper = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let tmp = root.join(format!("tmp{i}"));
                    match i % 4 {
                        0 => std::os::unix::fs::symlink(&target, &tmp).unwrap(),
                        1 => std::os::unix::fs::symlink(target.join("secret"), &tmp).unwrap(),
                        2 => std::fs::write(&tmp, b"f").unwrap(),
                        _ => {
                            std::fs::create_dir(&tmp).unwrap();
                            std::fs::write(tmp.join("secret"), b"d").unwrap();
                            std::os::unix::fs::symlink(&target, tmp.join("b")).unwrap();
                        }
                    }
                    let x = root.join("x");
                    if std::fs::rename(&tmp, &x).is_err() {
                        // A directory is not replaced by rename(2) over a non-directory.
                        let _ = std::fs::remove_dir_all(&x).or_else(|_| std::fs::remove_file(&x));
                        let _ = std::fs::rename(&tmp, &x);
                    }
                    let _ = std::fs::remove_dir_all(&tmp).or_else(|_| std::fs::remove_file(&tmp));
                }
            })
        };
        for _ in 0..300 {
            let _ = ws.stat(Path::new("x/secret"));
            let _ = ws.list_dir(Path::new("x"), 3);
            let _ = ws.remove(Path::new("x/secret"));
            let _ = ws.remove(Path::new("x/b"));
            let _ = ws.rename(Path::new("x/secret"), Path::new("got"));
            let _ = ws.remove(Path::new("got"));
            let _ = ws.remove(Path::new("x"));
            let _ = ws.make_dir(Path::new("x/b/new"));
        }
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        host_intact(outside.path());
    }

    #[test]
    fn remove_file_refuses_links_and_directories() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::NamedTempFile::new().unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("d"), dir.path().join("dlink")).unwrap();
        std::fs::write(dir.path().join("d/f"), b"x").unwrap();
        let ws = workspace(dir.path());
        assert!(ws.remove_file(Path::new("link")).is_err());
        assert!(outside.path().exists(), "the link's target must survive");
        assert!(ws.remove_file(Path::new("d")).is_err());
        assert!(ws.remove_file(Path::new("dlink/f")).is_err());
        assert!(ws.remove_file(Path::new("/etc/passwd")).is_err());
        ws.remove_file(Path::new("d/f")).unwrap();
        assert!(!dir.path().join("d/f").exists());
        assert!(dir.path().join("link").exists());
    }

    /// Rootless with subordinate ids, a helper joins the sandbox's user namespace and works
    /// there as the sandbox user: it reaches the sandbox's private files (of its host id), not
    /// another id's, and what it creates belongs to the sandbox. (Root only: the test maps an
    /// unused id into a user namespace of its own.)
    #[test]
    fn a_helper_works_in_the_sandboxs_namespace_with_its_permissions_alone() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        const HOST_ID: u32 = 2_100_000_000;
        let (ready_r, ready_w) = nix::unistd::pipe().unwrap();
        let (hold_r, hold_w) = nix::unistd::pipe().unwrap();
        // SAFETY: the child makes system calls only and ends in _exit.
        let child = match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                drop((ready_r, hold_w));
                let made = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).is_ok();
                let _ = nix::unistd::write(&ready_w, &[u8::from(made)]);
                let _ = nix::unistd::read(hold_r.as_raw_fd(), &mut [0u8]);
                // SAFETY: ends the forked test process at once.
                unsafe { libc::_exit(0) }
            }
            nix::unistd::ForkResult::Parent { child } => child,
        };
        drop((ready_w, hold_r));
        let mut made = [0u8];
        nix::unistd::read(ready_r.as_raw_fd(), &mut made).unwrap();
        assert_eq!(made, [1]);
        for file in ["uid_map", "gid_map"] {
            std::fs::write(format!("/proc/{child}/{file}"), format!("1000 {HOST_ID} 1")).unwrap();
        }
        let userns = File::open(format!("/proc/{child}/ns/user")).unwrap();
        drop(hold_w);
        nix::sys::wait::waitpid(child, None).unwrap();

        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let root = dir.path().join("ws");
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(root.join("private")).unwrap();
        std::fs::write(root.join("private/mine"), b"the sandbox's").unwrap();
        std::fs::write(root.join("roots"), b"root's").unwrap();
        let id = Some(nix::unistd::Uid::from_raw(HOST_ID));
        let gid = Some(nix::unistd::Gid::from_raw(HOST_ID));
        for (path, mode) in [("", 0o755), ("private", 0o700), ("private/mine", 0o600)] {
            nix::unistd::chown(&root.join(path), id, gid).unwrap();
            std::fs::set_permissions(root.join(path), std::fs::Permissions::from_mode(mode))
                .unwrap();
        }
        std::fs::set_permissions(root.join("roots"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        let fd =
            nix::fcntl::open(&root, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        let ws = Workspace::new(
            // SAFETY: open returned a new descriptor that nothing else owns.
            unsafe { OwnedFd::from_raw_fd(fd) },
            Owner::Namespace {
                userns: Arc::new(userns.into()),
                uid: 1000,
                gid: 1000,
            },
            None,
        );

        let listed: Vec<String> = ws.list().unwrap().into_iter().map(|e| e.path).collect();
        assert_eq!(listed, ["private/mine", "roots"]);
        let mut text = String::new();
        ws.open_file(Path::new("private/mine"))
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "the sandbox's");
        // Root's private file stays closed to the sandbox user: no capability came along.
        match ws.open_file(Path::new("roots")) {
            Err(WorkspaceError::Io { source, .. }) => {
                assert_eq!(source.raw_os_error(), Some(libc::EACCES))
            }
            other => panic!("{other:?}"),
        }
        assert!(
            ws.remove_file(Path::new("roots")).is_ok(),
            "the sandbox's directory"
        );
        assert_eq!(
            ws.write_file(Path::new("new/made"), &mut &b"uploaded"[..])
                .unwrap(),
            8
        );
        for made in ["new", "new/made"] {
            let meta = std::fs::metadata(root.join(made)).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (HOST_ID, HOST_ID), "{made}");
        }
        let host = tempfile::tempdir().unwrap();
        let mut out = OutDir::create(&host.path().join("out"), limits(1 << 20, 100)).unwrap();
        let report = ws.copy_out(&mut out).unwrap();
        assert!(report.skipped.is_empty(), "{:?}", report.skipped);
        assert_eq!(
            std::fs::read(host.path().join("out/private/mine")).unwrap(),
            b"the sandbox's"
        );
        assert_eq!(
            std::fs::read(host.path().join("out/new/made")).unwrap(),
            b"uploaded"
        );
    }
}
