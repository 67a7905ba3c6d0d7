//! Paused sandboxes across a server restart (docs/api.md#pause-and-resume).
//!
//! A paused sandbox keeps its memory only as long as its processes live, that is as long as
//! the server. When the server shuts down gracefully, every paused sandbox's workspace is
//! copied to `<database file>.saved/<id>/` (`corral.db.saved/` beside `corral.db`: each
//! database has a directory of its own, so that servers on several databases in one
//! directory never touch each other's) through the same [`OutDir`] that copies files out of
//! any sandbox: new files only, no link followed, holes kept as holes, at most the sandbox's
//! disk limit (by apparent size), within the key's share of the host's disk for saved sandboxes
//! ([`DiskBudget`]) and before the time to save runs out. A file that does not fit is left
//! out whole. Its settings — owner, image, language, limits, environment, code policy,
//! network policy, metadata, idle timeout, since when it is paused — and the files left out
//! are recorded in the server's database (`saved_sandboxes`). They are saved at shutdown
//! rather than at every pause, so that a pause stays a freeze of milliseconds; a server that
//! is killed (or crashes) loses its paused sandboxes, as it loses its running ones.
//!
//! After the restart they are listed as paused, under their own ids and to their owners only,
//! with warnings naming what was not saved, or saying that their files are lost (their
//! directory is gone). A resume starts a fresh kernel with the same settings, under the same
//! id, on the saved files (none when they are lost), and its info says `"memory": "not
//! kept"`: variables, imports and processes are gone. A saved sandbox still expires once it
//! has been paused `max_paused_s` (counted from its pause, across restarts); one that is
//! deleted or expires has its files removed at once.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use corral_sandbox::workspace::{CopyError, CopyLimits, OutDir};
use corral_sandbox::Workspace;
use corral_share::{Grant, Limits, Pool};
use serde::{Deserialize, Serialize};

use crate::db::Db;
use crate::service::{CreateSandboxRequest, Tenant};

/// What `memory` says of a sandbox resumed on saved files.
pub const MEMORY_NOT_KEPT: &str = "not kept";
/// What it says of every other sandbox.
pub const MEMORY_KEPT: &str = "kept";

/// The most directory levels a restore descends (as deep as a copy out goes).
const MAX_DEPTH: usize = corral_sandbox::workspace::MAX_DEPTH + 1;
/// The most files a saved sandbox's record names as not saved; the rest are counted.
const MAX_NAMED_NOT_SAVED: usize = 20;
/// Where servers before issue 31 kept the saved sandboxes of every database of a directory.
const LEGACY_DIR: &str = "saved-sandboxes";

/// Why saving or restoring a sandbox failed.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error("saving the workspace of {id}: {source}")]
    Copy {
        id: String,
        #[source]
        source: corral_sandbox::workspace::OutDirError,
    },
    #[error("saving the workspace of {id}: {source}")]
    Workspace {
        id: String,
        #[source]
        source: corral_sandbox::WorkspaceError,
    },
    #[error("restoring {}: {source}", path.display())]
    Restore {
        path: PathBuf,
        #[source]
        source: corral_sandbox::WorkspaceError,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Db(#[from] crate::db::DbError),
    #[error("the saved settings of {id} cannot be read: {source}")]
    Spec {
        id: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{0:?} is not the id of a sandbox")]
    BadId(String),
    #[error("the database {} has no file name to name its saved sandboxes' directory after", .0.display())]
    NoFileName(PathBuf),
    #[error(
        "saved_disk_bytes ({total}) and saved_disk_bytes_per_key ({per_key}) must be more than 0"
    )]
    NoDisk { total: u64, per_key: u64 },
}

/// What the database keeps of a saved sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedSpec {
    /// The request it was created with, every field resolved (image, language, limits, code
    /// policy).
    pub request: CreateSandboxRequest,
    /// Unix seconds.
    pub created_at: u64,
    /// Why files of its workspace were not saved (at most [`MAX_NAMED_NOT_SAVED`], then how
    /// many more): a cap, the disk budget, the time to save. Empty: all of them were.
    #[serde(default)]
    pub not_saved: Vec<String>,
}

/// A paused sandbox saved by a previous server process.
#[derive(Debug, Clone)]
pub struct SavedSandbox {
    pub id: String,
    pub tenant: Tenant,
    pub paused_at: SystemTime,
    pub spec: SavedSpec,
    /// Its saved directory was not found: it resumes on an empty workspace.
    pub files_lost: bool,
}

impl SavedSandbox {
    pub fn created_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.spec.created_at)
    }

    /// What its info's `warnings` say of its files.
    pub fn warnings(&self) -> Vec<String> {
        if self.files_lost {
            return vec![FILES_LOST.to_string()];
        }
        self.spec
            .not_saved
            .iter()
            .map(|why| format!("not saved at the restart: {why}"))
            .collect()
    }
}

/// The warning of a saved sandbox whose files are gone.
const FILES_LOST: &str = "its saved files are lost (their directory beside the server's \
    database is gone): it resumes on an empty workspace, with its settings";

/// The share of the host's disk that saved sandboxes' files take (docs/api.md).
#[derive(Debug, Clone, Copy, Default)]
pub struct DiskBudget {
    /// In all; default a quarter of what the database's filesystem has free at start plus
    /// what saved sandboxes take already.
    pub total: Option<u64>,
    /// Per key; default half of `total`.
    pub per_key: Option<u64>,
}

impl DiskBudget {
    /// The pool's limits, with `free` bytes free on the disk and `saved` taken by saved
    /// sandboxes: a key may hold `per_key` of the total; an eighth of it is the reserve out
    /// of which every key may save up to a thirty-second of it (its floor) when the others
    /// have filled the rest.
    fn limits(&self, free: u64, saved: u64) -> Result<Limits, PersistError> {
        let total = self.total.unwrap_or(free.saturating_add(saved) / 4);
        let per_key = self.per_key.unwrap_or(total / 2).min(total);
        if total == 0 || per_key == 0 {
            return Err(PersistError::NoDisk { total, per_key });
        }
        let reserve = total / 8;
        Ok(Limits::new(
            total - reserve,
            per_key,
            (total / 32).min(per_key),
            reserve,
        ))
    }
}

/// The saved sandboxes of this server: in its database and under its directory.
pub struct Saved {
    dir: PathBuf,
    max_paused: Duration,
    sandboxes: Mutex<BTreeMap<String, SavedSandbox>>,
    /// The host's disk that saved sandboxes' files take.
    disk: Arc<Pool>,
    /// What each saved sandbox's files hold of `disk`.
    held: Mutex<HashMap<String, Grant>>,
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Ids are the server's own (`sbx-…`); anything else in the table is not used as a path.
fn checked_id(id: &str) -> Result<&str, PersistError> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    ok.then_some(id)
        .ok_or_else(|| PersistError::BadId(id.to_string()))
}

/// The directory of the saved sandboxes of the database `db`: `<its file name>.saved` beside
/// it.
pub fn saved_dir(db: &Path) -> Result<PathBuf, PersistError> {
    let name = db
        .file_name()
        .ok_or_else(|| PersistError::NoFileName(db.to_path_buf()))?;
    let mut name = name.to_os_string();
    name.push(".saved");
    Ok(db.with_file_name(name))
}

/// Bytes of the disk that the files and directories below `dir` take (`st_blocks`), not
/// following links, as deep as a restore goes.
fn allocated(dir: &Path, depth: usize) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    let mut total = 0;
    for entry in entries.flatten() {
        let Ok(meta) = fs::symlink_metadata(entry.path()) else {
            continue;
        };
        total += meta.blocks() * 512;
        if meta.is_dir() && depth < MAX_DEPTH {
            total += allocated(&entry.path(), depth + 1);
        }
    }
    total
}

/// A real directory at `path` (not a link to one).
fn is_real_dir(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
}

/// A real directory at `path` that the server's user owns (what another user made in a
/// shared directory is not taken for the server's own).
fn is_own_dir(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    fs::symlink_metadata(path)
        .is_ok_and(|m| m.is_dir() && m.uid() == nix::unistd::geteuid().as_raw())
}

impl Saved {
    /// The sandboxes saved for the database `db` at `db_path`; those paused longer than
    /// `max_paused` are deleted now, and so are files in its directory that no saved sandbox
    /// of it owns. Files saved under `saved-sandboxes/` by a server before issue 31 are moved
    /// over, those of this database's sandboxes only.
    pub fn load(
        db: &Db,
        db_path: &Path,
        max_paused: Duration,
        budget: DiskBudget,
    ) -> Result<Saved, PersistError> {
        let dir = saved_dir(db_path)?;
        let mut sandboxes = BTreeMap::new();
        for (id, key, paused_at, spec) in db.saved_sandboxes()? {
            let spec = serde_json::from_str(&spec).map_err(|source| PersistError::Spec {
                id: id.clone(),
                source,
            });
            match (checked_id(&id), spec) {
                (Ok(_), Ok(spec)) => {
                    let sandbox = SavedSandbox {
                        id: id.clone(),
                        tenant: Tenant(key),
                        paused_at: UNIX_EPOCH + Duration::from_secs(paused_at.max(0) as u64),
                        spec,
                        files_lost: false,
                    };
                    sandboxes.insert(id, sandbox);
                }
                (Err(e), _) | (_, Err(e)) => {
                    eprintln!("corral: a saved sandbox is dropped: {e}");
                    db.forget_saved_sandbox(&id)?;
                }
            }
        }
        make_private(&dir)?;
        let legacy = db_path.with_file_name(LEGACY_DIR);
        if is_own_dir(&legacy) {
            move_legacy(&legacy, &dir, sandboxes.keys());
        }
        let mut saved_bytes = 0;
        let mut sizes = Vec::new();
        for sandbox in sandboxes.values_mut() {
            let path = dir.join(&sandbox.id);
            if is_real_dir(&path) {
                let bytes = allocated(&path, 0) + allocated_self(&path);
                saved_bytes += bytes;
                sizes.push((sandbox.id.clone(), sandbox.tenant.0.clone(), bytes));
            } else {
                sandbox.files_lost = true;
            }
        }
        let free = nix::sys::statvfs::statvfs(&dir)
            .map(|s| s.blocks_available().saturating_mul(s.fragment_size()))
            .map_err(|e| PersistError::Io {
                path: dir.clone(),
                source: e.into(),
            })?;
        let disk = Pool::new(
            "the host's disk for saved sandboxes",
            "bytes",
            budget.limits(free, saved_bytes)?,
        );
        // On the disk already: counted whatever the budget is now.
        let held = sizes
            .into_iter()
            .map(|(id, key, bytes)| (id, disk.take_held(&key, bytes)))
            .collect();
        let saved = Saved {
            dir,
            max_paused,
            sandboxes: Mutex::new(sandboxes),
            disk,
            held: Mutex::new(held),
        };
        saved.remove_strays();
        saved.expire(db);
        Ok(saved)
    }

    fn sandboxes(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, SavedSandbox>> {
        // Every change is one insert or remove: a poisoned map is consistent.
        self.sandboxes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, Grant>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The pool of the host's disk that saved sandboxes take.
    pub fn disk(&self) -> &Arc<Pool> {
        &self.disk
    }

    /// Removes what no saved sandbox of this database owns in its own directory (a shutdown
    /// that stopped half-way). Nothing outside it is judged.
    fn remove_strays(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let known = self.sandboxes();
        for entry in entries.flatten() {
            let name = entry.file_name();
            if !known.contains_key(name.to_string_lossy().as_ref()) {
                let path = entry.path();
                let _ = if is_real_dir(&path) {
                    fs::remove_dir_all(path)
                } else {
                    fs::remove_file(path)
                };
            }
        }
    }

    fn path(&self, id: &str) -> Result<PathBuf, PersistError> {
        Ok(self.dir.join(checked_id(id)?))
    }

    /// Deletes every saved sandbox paused longer than `max_paused`; how many.
    pub fn expire(&self, db: &Db) -> usize {
        let now = SystemTime::now();
        let expired: Vec<String> = self
            .sandboxes()
            .values()
            .filter(|s| {
                now.duration_since(s.paused_at)
                    .is_ok_and(|d| d > self.max_paused)
            })
            .map(|s| s.id.clone())
            .collect();
        for id in &expired {
            self.sandboxes().remove(id);
            self.delete(db, id);
        }
        expired.len()
    }

    /// Removes a saved sandbox's files and its row, and gives back the disk they held.
    fn delete(&self, db: &Db, id: &str) {
        if let Ok(path) = self.path(id) {
            let _ = fs::remove_dir_all(path);
        }
        self.held().remove(id);
        if let Err(e) = db.forget_saved_sandbox(id) {
            eprintln!("corral: {e}");
        }
    }

    /// `tenant`'s saved sandbox `id`, if there is one (and it has not expired).
    pub fn get(&self, db: &Db, tenant: &Tenant, id: &str) -> Option<SavedSandbox> {
        self.expire(db);
        self.sandboxes()
            .get(id)
            .filter(|s| &s.tenant == tenant)
            .cloned()
    }

    /// `tenant`'s saved sandboxes (every key's with `None`).
    pub fn of(&self, db: &Db, tenant: Option<&Tenant>) -> Vec<SavedSandbox> {
        self.expire(db);
        self.sandboxes()
            .values()
            .filter(|s| tenant.is_none_or(|t| s.tenant == *t))
            .cloned()
            .collect()
    }

    /// How many sandboxes are saved, and how many of them are `tenant`'s: they count against
    /// the server's and the key's sandbox limits as live ones do.
    pub fn count(&self, tenant: &Tenant) -> (usize, usize) {
        let sandboxes = self.sandboxes();
        let mine = sandboxes.values().filter(|s| &s.tenant == tenant).count();
        (sandboxes.len(), mine)
    }

    /// Takes `tenant`'s saved sandbox `id` out (to resume it): no other request sees it
    /// until it is [`Saved::put_back`] or [`Saved::finish`]ed.
    pub fn take(&self, db: &Db, tenant: &Tenant, id: &str) -> Option<SavedSandbox> {
        self.expire(db);
        let mut sandboxes = self.sandboxes();
        match sandboxes.get(id) {
            Some(s) if &s.tenant == tenant => sandboxes.remove(id),
            _ => None,
        }
    }

    /// A resume that failed: the sandbox stays saved.
    pub fn put_back(&self, sandbox: SavedSandbox) {
        self.sandboxes().insert(sandbox.id.clone(), sandbox);
    }

    /// A resume that succeeded: the saved files and row are gone.
    pub fn finish(&self, db: &Db, id: &str) {
        self.delete(db, id);
    }

    /// Deletes `tenant`'s saved sandbox `id`; whether there was one.
    pub fn remove(&self, db: &Db, tenant: &Tenant, id: &str) -> bool {
        match self.take(db, tenant, id) {
            Some(_) => {
                self.delete(db, id);
                true
            }
            None => false,
        }
    }

    /// Saves a paused sandbox: its workspace's files (at most `disk_bytes` of data, within
    /// its key's share of the disk, before `deadline`), then its row, naming the files left
    /// out.
    pub fn save(
        &self,
        db: &Db,
        mut sandbox: SavedSandbox,
        workspace: &Workspace,
        disk_bytes: u64,
        deadline: Instant,
    ) -> Result<(), PersistError> {
        let path = self.path(&sandbox.id)?;
        make_private(&self.dir)?;
        // What a previous save of this id left (a server killed during its shutdown).
        let _ = fs::remove_dir_all(&path);
        self.held().remove(&sandbox.id);
        let id = sandbox.id.clone();
        let mut out =
            OutDir::create(&path, CopyLimits::for_workspace(disk_bytes)).map_err(|source| {
                PersistError::Copy {
                    id: id.clone(),
                    source,
                }
            })?;
        // The directory itself is made already.
        out.charge_to(
            self.disk
                .take_held(&sandbox.tenant.0, allocated_self(&path)),
        );
        out.stop_at(deadline);
        let report = workspace.copy_out(&mut out);
        let grant = out.into_grant();
        let report = report.map_err(|source| {
            let _ = fs::remove_dir_all(&path);
            PersistError::Workspace {
                id: id.clone(),
                source,
            }
        })?;
        sandbox.spec.not_saved = not_saved(&report.skipped);
        sandbox.files_lost = false;
        for why in &sandbox.spec.not_saved {
            eprintln!("corral: saving {id}: {why}");
        }
        let spec = serde_json::to_string(&sandbox.spec).map_err(|source| PersistError::Spec {
            id: id.clone(),
            source,
        })?;
        db.save_sandbox(
            &id,
            &sandbox.tenant.0,
            unix_secs(sandbox.paused_at) as i64,
            &spec,
        )?;
        if let Some(grant) = grant {
            self.held().insert(id, grant);
        }
        self.put_back(sandbox);
        Ok(())
    }

    /// Writes the saved files of `id` into `workspace` (a fresh sandbox's), holes kept; how
    /// many, or `None` when its directory is gone (its files are lost).
    pub fn restore(&self, id: &str, workspace: &Workspace) -> Result<Option<usize>, PersistError> {
        let root = self.path(id)?;
        if !is_real_dir(&root) {
            return Ok(None);
        }
        let mut restored = 0;
        restore_dir(&root, Path::new(""), 0, workspace, &mut restored)?;
        Ok(Some(restored))
    }
}

/// The disk that the directory `path` itself takes.
fn allocated_self(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    fs::symlink_metadata(path).map_or(0, |m| m.blocks() * 512)
}

/// What a saved sandbox's record says of the files a copy left out: the first
/// [`MAX_NAMED_NOT_SAVED`], then how many more.
fn not_saved(skipped: &[CopyError]) -> Vec<String> {
    let mut named: Vec<String> = skipped
        .iter()
        .take(MAX_NAMED_NOT_SAVED)
        .map(ToString::to_string)
        .collect();
    if skipped.len() > MAX_NAMED_NOT_SAVED {
        named.push(format!(
            "and {} more file(s) or reasons",
            skipped.len() - MAX_NAMED_NOT_SAVED
        ));
    }
    named
}

/// Makes the directory of saved workspaces, or makes it the server's own: mode 0700, so that
/// no other local user reads the tenants' files through it (the database's directory is
/// usually world-readable, as `/var/lib/corral` is; the files inside keep the copy's 0644). A
/// directory of the server's user made with a wider mode (by an older server) is narrowed;
/// anything else at its path is refused: a link, and a directory another user made (one who
/// may write in the database's directory, as anyone may in `/tmp`), whose owner could read
/// the tenants' files in it or plant what a resume would copy into a sandbox.
fn make_private(dir: &Path) -> Result<(), PersistError> {
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
    let io = |source| PersistError::Io {
        path: dir.to_path_buf(),
        source,
    };
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(io(e)),
        _ => {}
    }
    // Judged and narrowed through one descriptor, so that no link swapped in meanwhile is
    // followed.
    let opened = fs::File::options()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP | libc::ENOTDIR) => {
                io(std::io::Error::from(std::io::ErrorKind::NotADirectory))
            }
            _ => io(e),
        })?;
    let meta = opened.metadata().map_err(io)?;
    if std::os::unix::fs::MetadataExt::uid(&meta) != nix::unistd::geteuid().as_raw() {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "the directory of saved sandboxes belongs to another user: remove it, or use a \
             database in a directory that only the server's user may write to",
        )));
    }
    opened
        .set_permissions(fs::Permissions::from_mode(0o700))
        .map_err(io)
}

/// Moves the saved files of the sandboxes `ids` (this database's) from `legacy` (the
/// `saved-sandboxes/` that servers before issue 31 shared between the databases of a
/// directory) into `dir`, where they are not there already; removes `legacy` once it is
/// empty. Nothing else in it is touched: it may hold another database's.
fn move_legacy<'a>(legacy: &Path, dir: &Path, ids: impl Iterator<Item = &'a String>) {
    for id in ids {
        let (from, to) = (legacy.join(id), dir.join(id));
        if is_own_dir(&from) && fs::symlink_metadata(&to).is_err() {
            match fs::rename(&from, &to) {
                Ok(()) => eprintln!(
                    "corral: saved sandbox {id} moved from {} to {}",
                    legacy.display(),
                    dir.display()
                ),
                Err(e) => eprintln!(
                    "corral: saved sandbox {id} could not be moved from {}: {e}",
                    legacy.display()
                ),
            }
        }
    }
    // Fails unless it is empty.
    let _ = fs::remove_dir(legacy);
}

/// Copies the regular files below `root/rel` into `workspace` at `rel`. The saved tree is the
/// server's own (made by an [`OutDir`]); links and special files are not expected there and
/// are skipped all the same.
fn restore_dir(
    root: &Path,
    rel: &Path,
    depth: usize,
    workspace: &Workspace,
    restored: &mut usize,
) -> Result<(), PersistError> {
    let dir = root.join(rel);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PersistError::Io { path, source }
    };
    if depth > MAX_DEPTH {
        return Ok(());
    }
    for entry in fs::read_dir(&dir).map_err(io(&dir))? {
        let entry = entry.map_err(io(&dir))?;
        let kind = entry.file_type().map_err(io(&entry.path()))?;
        let rel = rel.join(entry.file_name());
        if kind.is_dir() {
            restore_dir(root, &rel, depth + 1, workspace, restored)?;
        } else if kind.is_file() {
            use std::os::unix::fs::OpenOptionsExt as _;
            let file = fs::File::options()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(entry.path())
                .map_err(io(&entry.path()))?;
            workspace
                .write_file_from(&rel, &file)
                .map_err(|source| PersistError::Restore {
                    path: rel.clone(),
                    source,
                })?;
            *restored += 1;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> String {
        serde_json::to_string(&SavedSpec {
            request: CreateSandboxRequest::default(),
            created_at: 1,
            not_saved: Vec::new(),
        })
        .unwrap()
    }

    const BUDGET: DiskBudget = DiskBudget {
        total: Some(1 << 30),
        per_key: None,
    };

    /// At start: the directory becomes mode 0700, a row whose id is no sandbox id is dropped
    /// (never used as a path), a sandbox paused too long is deleted with its files, files
    /// nobody saved are removed, the rest stays, to its owner only.
    #[test]
    fn loading_drops_bad_ids_expired_sandboxes_and_stray_files() {
        let dir = tempfile::tempdir().unwrap();
        let db_path = dir.path().join("corral.db");
        let db = Db::open(&db_path).unwrap();
        let saved_dir = dir.path().join("corral.db.saved");
        let now = unix_secs(SystemTime::now()) as i64;
        for id in ["sbx-kept", "sbx-old", "stray"] {
            fs::create_dir_all(saved_dir.join(id)).unwrap();
            fs::write(saved_dir.join(id).join("f"), "x").unwrap();
        }
        fs::create_dir_all(dir.path().join("outside")).unwrap();
        db.save_sandbox("sbx-kept", "key-a", now, &spec()).unwrap();
        db.save_sandbox("sbx-old", "key-a", now - 7200, &spec())
            .unwrap();
        db.save_sandbox("../outside", "key-a", now, &spec())
            .unwrap();
        db.save_sandbox("sbx-garbled", "key-a", now, "{not json")
            .unwrap();

        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(&saved_dir, fs::Permissions::from_mode(0o755)).unwrap();

        let saved = Saved::load(&db, &db_path, Duration::from_secs(3600), BUDGET).unwrap();
        // Narrowed to the server's own: other local users read no tenant's files.
        let mode = fs::metadata(&saved_dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{mode:o}");
        let a = Tenant("key-a".into());
        let ids: Vec<String> = saved.of(&db, Some(&a)).into_iter().map(|s| s.id).collect();
        assert_eq!(ids, ["sbx-kept"]);
        assert!(saved
            .get(&db, &Tenant("key-b".into()), "sbx-kept")
            .is_none());
        assert!(saved_dir.join("sbx-kept/f").is_file());
        assert!(!saved_dir.join("sbx-old").exists());
        assert!(!saved_dir.join("stray").exists());
        assert!(dir.path().join("outside").is_dir());
        let rows: Vec<String> = db
            .saved_sandboxes()
            .unwrap()
            .into_iter()
            .map(|r| r.0)
            .collect();
        assert_eq!(rows, ["sbx-kept"]);
        // Its files hold their disk.
        assert!(saved.disk().held_by("key-a") >= 4096);

        // Another key cannot delete it; its owner can, files and row, and the disk is free.
        assert!(!saved.remove(&db, &Tenant("key-b".into()), "sbx-kept"));
        assert!(saved.remove(&db, &a, "sbx-kept"));
        assert!(!saved_dir.join("sbx-kept").exists());
        assert!(db.saved_sandboxes().unwrap().is_empty());
        assert_eq!(saved.disk().held(), 0);
    }

    /// Two databases in one directory: each has its saved sandboxes in a directory of its
    /// own, and neither's start removes the other's. What an older server saved in the
    /// shared `saved-sandboxes/` is moved over for the database that owns it, nothing else
    /// there is touched, and a sandbox whose files are nowhere is loaded as lost.
    #[test]
    fn each_database_keeps_its_own_and_takes_its_own_from_the_shared_directory() {
        let dir = tempfile::tempdir().unwrap();
        let now = unix_secs(SystemTime::now()) as i64;
        let legacy = dir.path().join("saved-sandboxes");
        let (p1, p2) = (dir.path().join("n1.db"), dir.path().join("n2.db"));
        let (db1, db2) = (Db::open(&p1).unwrap(), Db::open(&p2).unwrap());
        for (db, id) in [(&db1, "sbx-one"), (&db2, "sbx-two"), (&db1, "sbx-lost")] {
            db.save_sandbox(id, "key-a", now, &spec()).unwrap();
        }
        for id in ["sbx-one", "sbx-two"] {
            fs::create_dir_all(legacy.join(id)).unwrap();
            fs::write(legacy.join(id).join("f"), id).unwrap();
        }
        let one = Saved::load(&db1, &p1, Duration::from_secs(3600), BUDGET).unwrap();
        assert_eq!(
            fs::read_to_string(dir.path().join("n1.db.saved/sbx-one/f")).unwrap(),
            "sbx-one"
        );
        assert!(legacy.join("sbx-two/f").is_file(), "not n1's");
        let lost = one.get(&db1, &Tenant("key-a".into()), "sbx-lost").unwrap();
        assert!(lost.files_lost);
        assert!(lost.warnings()[0].contains("files are lost"));
        assert!(
            !one.get(&db1, &Tenant("key-a".into()), "sbx-one")
                .unwrap()
                .files_lost
        );

        let two = Saved::load(&db2, &p2, Duration::from_secs(3600), BUDGET).unwrap();
        assert!(dir.path().join("n2.db.saved/sbx-two/f").is_file());
        assert!(!legacy.exists(), "removed once empty");
        // n2's start left n1's files alone, and n1's next start n2's.
        drop((one, two));
        Saved::load(&db1, &p1, Duration::from_secs(3600), BUDGET).unwrap();
        assert!(dir.path().join("n1.db.saved/sbx-one/f").is_file());
        assert!(dir.path().join("n2.db.saved/sbx-two/f").is_file());
    }

    /// The default budget is a quarter of what the disk has free plus what is saved; a key
    /// may hold half of it; a budget of nothing is refused.
    #[test]
    fn the_disk_budget_defaults_to_a_quarter_of_the_free_disk() {
        let limits = DiskBudget::default().limits(300 << 20, 100 << 20).unwrap();
        assert_eq!(limits.ceiling(), 100 << 20);
        assert_eq!(limits.per_key, 50 << 20);
        assert!(limits.floor <= limits.per_key && limits.floor > 0);
        let set = DiskBudget {
            total: Some(1 << 20),
            per_key: Some(4 << 20),
        };
        assert_eq!(set.limits(0, 0).unwrap().per_key, 1 << 20);
        assert!(DiskBudget::default().limits(0, 0).is_err());
    }

    /// A directory where the saved workspaces go that another user made (another local user
    /// who can write in the database's directory, as in `/tmp`, made it first) is refused and
    /// left as it is: it is not the server's own, so its owner could read the tenants' files
    /// in it or plant files and links there that a resume would copy into a sandbox.
    #[test]
    fn loading_refuses_a_directory_another_user_owns() {
        let dir = tempfile::tempdir().unwrap();
        let db_path = dir.path().join("corral.db");
        let db = Db::open(&db_path).unwrap();
        let planted = dir.path().join("corral.db.saved");
        fs::create_dir(&planted).unwrap();
        use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
        fs::set_permissions(&planted, fs::Permissions::from_mode(0o777)).unwrap();
        let other = nix::unistd::geteuid().as_raw() + 1;
        if std::os::unix::fs::chown(&planted, Some(other), None).is_err() {
            // Not root: the server could not chmod it either, and fails on that.
            return;
        }
        assert!(Saved::load(&db, &db_path, Duration::from_secs(3600), BUDGET).is_err());
        let meta = fs::metadata(&planted).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o777);
        assert_eq!(meta.uid(), other);
    }

    /// A link (or any non-directory) where the saved workspaces go is refused, not followed.
    #[test]
    fn loading_refuses_a_link_in_place_of_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let db_path = dir.path().join("corral.db");
        let db = Db::open(&db_path).unwrap();
        let elsewhere = dir.path().join("elsewhere");
        fs::create_dir(&elsewhere).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(&elsewhere, fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.path().join("corral.db.saved")).unwrap();
        assert!(Saved::load(&db, &db_path, Duration::from_secs(3600), BUDGET).is_err());
        let mode = fs::metadata(&elsewhere).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755, "{mode:o}");
    }
}
