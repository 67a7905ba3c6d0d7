//! Host-side access to a sandbox's `/workspace`, which the sandbox fully controls.
//!
//! Every path is resolved with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)` relative to a descriptor of the workspace root,
//! one component at a time for directories, so a link the sandbox planted is never followed
//! and nothing outside the workspace is reached. Only regular files are read.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, mkdirat, Mode, SFlag};

use crate::result::FileEntry;

/// The most files `list` and `copy_out` visit: a sandbox cannot make the host walk forever.
const MAX_ENTRIES: usize = 10_000;
const MAX_DEPTH: usize = 32;

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
}

impl WorkspaceError {
    fn io(path: &Path, source: impl Into<io::Error>) -> Self {
        WorkspaceError::Io {
            path: path.to_path_buf(),
            source: source.into(),
        }
    }
}

/// A descriptor of a sandbox's `/workspace`; it keeps the tmpfs reachable after the sandbox
/// has ended, until dropped.
#[derive(Debug)]
pub struct Workspace {
    root: OwnedFd,
    /// Root mode: the host ids the sandbox user maps to. Every operation inside the workspace
    /// runs with these as the thread's filesystem ids, so the host touches the workspace with
    /// exactly the sandbox's own permissions (a second layer behind openat2), and what it
    /// creates belongs to the sandbox (the tmpfs rejects owners its user namespace cannot map).
    owner: Option<(u32, u32)>,
}

/// While alive, the calling thread's filesystem uid and gid are the sandbox's.
struct AsSandboxUser(Option<(nix::unistd::Uid, nix::unistd::Gid)>);

impl AsSandboxUser {
    fn new(owner: Option<(u32, u32)>) -> Self {
        AsSandboxUser(owner.map(|(uid, gid)| {
            let old_gid = nix::unistd::setfsgid(gid.into());
            let old_uid = nix::unistd::setfsuid(uid.into());
            (old_uid, old_gid)
        }))
    }
}

impl Drop for AsSandboxUser {
    fn drop(&mut self) {
        if let Some((uid, gid)) = self.0 {
            nix::unistd::setfsuid(uid);
            nix::unistd::setfsgid(gid);
        }
    }
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

impl Workspace {
    /// Wraps a descriptor of a workspace directory (an `O_PATH` descriptor received from a
    /// sandbox); `owner` is the host uid and gid the sandbox user maps to, in root mode.
    pub fn new(root: OwnedFd, owner: Option<(u32, u32)>) -> Self {
        Workspace { root, owner }
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
            dir = open_beneath(
                dir.as_raw_fd(),
                Path::new(part),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY,
                Mode::empty(),
            )?;
        }
        Ok(dir)
    }

    /// Writes `data` to `path`, creating parent directories; an existing file is replaced,
    /// anything else at that path is an error.
    pub fn write_file(&self, path: &Path, data: &mut dyn Read) -> Result<u64, WorkspaceError> {
        let parts = checked_components(path)?;
        let _as_sandbox = AsSandboxUser::new(self.owner);
        let (name, parents) = parts.split_last().expect("checked non-empty");
        let dir = self
            .open_dir(parents, true)
            .map_err(|e| WorkspaceError::io(path, e))?;
        let fd = open_beneath(
            dir.as_raw_fd(),
            Path::new(name),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NONBLOCK,
            Mode::from_bits_truncate(0o644),
        )
        .map_err(|e| WorkspaceError::io(path, e))?;
        let stat = fstat(fd.as_raw_fd()).map_err(|e| WorkspaceError::io(path, e))?;
        if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
            return Err(WorkspaceError::NotRegular(path.to_path_buf()));
        }
        let mut file = File::from(fd);
        file.set_len(0).map_err(|e| WorkspaceError::io(path, e))?;
        io::copy(data, &mut file).map_err(|e| WorkspaceError::io(path, e))
    }

    /// Opens the regular file at `path` for reading.
    pub fn open_file(&self, path: &Path) -> Result<File, WorkspaceError> {
        let parts = checked_components(path)?;
        let _as_sandbox = AsSandboxUser::new(self.owner);
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
        let _as_sandbox = AsSandboxUser::new(self.owner);
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
        // The name is unlinked relative to the directory just checked; a sandbox racing to
        // swap the file for something else can only make us remove its own replacement.
        nix::unistd::unlinkat(
            Some(dir.as_raw_fd()),
            Path::new(name),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        )
        .map_err(|e| WorkspaceError::io(path, e))
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
        let shown = dir.unwrap_or(Path::new("."));
        let _as_sandbox = AsSandboxUser::new(self.owner);
        let root = self
            .open_dir(&parts, false)
            .map_err(|e| WorkspaceError::io(shown, e))?;
        let mut out = Vec::new();
        walk(root, parts.iter().collect(), 0, &mut out)?;
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// Copies every regular file of the workspace into `dest` (created if needed), keeping
    /// relative paths. Nothing is written outside `dest` and no link is followed on either side.
    pub fn copy_out(&self, dest: &Path) -> Result<Vec<FileEntry>, WorkspaceError> {
        std::fs::create_dir_all(dest).map_err(|e| WorkspaceError::io(dest, e))?;
        let dest_root = nix::fcntl::open(
            dest,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| WorkspaceError::io(dest, e))?;
        // SAFETY: open returned a new descriptor that nothing else owns.
        let dest_root = unsafe { OwnedFd::from_raw_fd(dest_root) };
        let files = self.list()?;
        for entry in &files {
            let rel = Path::new(&entry.path);
            let mut src = self.open_file(rel)?;
            let parts = checked_components(rel)?;
            let (name, parents) = parts.split_last().expect("checked non-empty");
            let mut dir = dest_root
                .try_clone()
                .map_err(|e| WorkspaceError::io(dest, e))?;
            for part in parents {
                match mkdirat(
                    Some(dir.as_raw_fd()),
                    *part,
                    Mode::from_bits_truncate(0o755),
                ) {
                    Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                    Err(e) => return Err(WorkspaceError::io(rel, e)),
                }
                dir = open_beneath(
                    dir.as_raw_fd(),
                    Path::new(part),
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY,
                    Mode::empty(),
                )
                .map_err(|e| WorkspaceError::io(rel, e))?;
            }
            let out = open_beneath(
                dir.as_raw_fd(),
                Path::new(name),
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC,
                Mode::from_bits_truncate(0o644),
            )
            .map_err(|e| WorkspaceError::io(rel, e))?;
            io::copy(&mut src, &mut File::from(out)).map_err(|e| WorkspaceError::io(rel, e))?;
        }
        Ok(files)
    }
}

fn walk(
    dir: OwnedFd,
    prefix: PathBuf,
    depth: usize,
    out: &mut Vec<FileEntry>,
) -> Result<(), WorkspaceError> {
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
        if out.len() >= MAX_ENTRIES {
            break;
        }
        let Ok(fd) = open_beneath(raw, name, OFlag::O_PATH, Mode::empty()) else {
            continue; // a symlink (RESOLVE_NO_SYMLINKS) or gone
        };
        let Ok(stat) = fstat(fd.as_raw_fd()) else {
            continue;
        };
        let kind = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
        if kind == SFlag::S_IFREG {
            out.push(FileEntry {
                path: prefix.join(name).to_string_lossy().into_owned(),
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
            walk(fd, prefix.join(&name), depth + 1, out)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace(dir: &Path) -> Workspace {
        let fd = nix::fcntl::open(dir, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        // SAFETY: open returned a new descriptor that nothing else owns.
        Workspace::new(unsafe { OwnedFd::from_raw_fd(fd) }, None)
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
}
