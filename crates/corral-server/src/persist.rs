//! Paused sandboxes across a server restart (docs/api.md#pause-and-resume).
//!
//! A paused sandbox keeps its memory only as long as its processes live, that is as long as
//! the server. When the server shuts down gracefully, every paused sandbox's workspace is
//! copied to `<database dir>/saved-sandboxes/<id>/` (through the same [`OutDir`] that copies
//! files out of any sandbox: new files only, no link followed, at most the sandbox's disk
//! limit) and its settings — owner, image, language, limits, environment, code policy, network
//! policy, metadata, idle timeout, since when it is paused — are recorded in the server's
//! database (`saved_sandboxes`). They are saved at shutdown rather than at every pause, so
//! that a pause stays a freeze of milliseconds; a server that is killed (or crashes) loses its
//! paused sandboxes, as it loses its running ones.
//!
//! After the restart they are listed as paused, under their own ids and to their owners only.
//! A resume starts a fresh kernel with the same settings, under the same id, on the saved
//! files, and its info says `"memory": "not kept"`: variables, imports and processes are gone.
//! A saved sandbox still expires once it has been paused `max_paused_s` (counted from its
//! pause, across restarts); one that is deleted or expires has its files removed at once.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use corral_sandbox::workspace::{CopyLimits, OutDir};
use corral_sandbox::Workspace;
use serde::{Deserialize, Serialize};

use crate::db::Db;
use crate::service::{CreateSandboxRequest, Tenant};

/// What `memory` says of a sandbox resumed on saved files.
pub const MEMORY_NOT_KEPT: &str = "not kept";
/// What it says of every other sandbox.
pub const MEMORY_KEPT: &str = "kept";

/// The most directory levels a restore descends (as deep as a copy out goes).
const MAX_DEPTH: usize = corral_sandbox::workspace::MAX_DEPTH + 1;

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
}

/// The settings a saved sandbox is created again with.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedSpec {
    /// The request it was created with, every field resolved (image, language, limits, code
    /// policy).
    pub request: CreateSandboxRequest,
    /// Unix seconds.
    pub created_at: u64,
}

/// A paused sandbox saved by a previous server process.
#[derive(Debug, Clone)]
pub struct SavedSandbox {
    pub id: String,
    pub tenant: Tenant,
    pub paused_at: SystemTime,
    pub spec: SavedSpec,
}

impl SavedSandbox {
    pub fn created_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.spec.created_at)
    }
}

/// The saved sandboxes of this server: in its database and under its directory.
pub struct Saved {
    dir: PathBuf,
    max_paused: Duration,
    sandboxes: Mutex<BTreeMap<String, SavedSandbox>>,
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

impl Saved {
    /// The sandboxes saved under `dir` and in `db`; those paused longer than `max_paused` are
    /// deleted now, and so are files of sandboxes the database does not know.
    pub fn load(db: &Db, dir: PathBuf, max_paused: Duration) -> Result<Saved, PersistError> {
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
                    };
                    sandboxes.insert(id, sandbox);
                }
                (Err(e), _) | (_, Err(e)) => {
                    eprintln!("corral: a saved sandbox is dropped: {e}");
                    db.forget_saved_sandbox(&id)?;
                }
            }
        }
        let saved = Saved {
            dir,
            max_paused,
            sandboxes: Mutex::new(sandboxes),
        };
        saved.make_private()?;
        saved.remove_strays();
        saved.expire(db);
        Ok(saved)
    }

    /// Makes the directory of saved workspaces, or makes it the server's own: mode 0700, so
    /// that no other local user reads the tenants' files through it (the database's directory
    /// is usually world-readable, as `/var/lib/corral` is; the files inside keep the copy's
    /// 0644). A directory made with a wider mode (by an older server) is narrowed; anything
    /// else at its path is refused.
    fn make_private(&self) -> Result<(), PersistError> {
        use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
        let io = |source| PersistError::Io {
            path: self.dir.clone(),
            source,
        };
        match fs::DirBuilder::new().mode(0o700).create(&self.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(io(e)),
            _ => {}
        }
        if !fs::symlink_metadata(&self.dir).map_err(io)?.is_dir() {
            return Err(io(std::io::Error::from(std::io::ErrorKind::NotADirectory)));
        }
        fs::set_permissions(&self.dir, fs::Permissions::from_mode(0o700)).map_err(io)
    }

    /// Removes saved files no saved sandbox owns (a shutdown that stopped half-way).
    fn remove_strays(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let known = self.sandboxes.lock().expect("lock");
        for entry in entries.flatten() {
            let name = entry.file_name();
            if !known.contains_key(name.to_string_lossy().as_ref()) {
                let _ = fs::remove_dir_all(entry.path());
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
            .sandboxes
            .lock()
            .expect("lock")
            .values()
            .filter(|s| {
                now.duration_since(s.paused_at)
                    .is_ok_and(|d| d > self.max_paused)
            })
            .map(|s| s.id.clone())
            .collect();
        for id in &expired {
            self.sandboxes.lock().expect("lock").remove(id);
            self.delete(db, id);
        }
        expired.len()
    }

    /// Removes a saved sandbox's files and its row.
    fn delete(&self, db: &Db, id: &str) {
        if let Ok(path) = self.path(id) {
            let _ = fs::remove_dir_all(path);
        }
        if let Err(e) = db.forget_saved_sandbox(id) {
            eprintln!("corral: {e}");
        }
    }

    /// `tenant`'s saved sandbox `id`, if there is one (and it has not expired).
    pub fn get(&self, db: &Db, tenant: &Tenant, id: &str) -> Option<SavedSandbox> {
        self.expire(db);
        self.sandboxes
            .lock()
            .expect("lock")
            .get(id)
            .filter(|s| &s.tenant == tenant)
            .cloned()
    }

    /// `tenant`'s saved sandboxes (every key's with `None`).
    pub fn of(&self, db: &Db, tenant: Option<&Tenant>) -> Vec<SavedSandbox> {
        self.expire(db);
        self.sandboxes
            .lock()
            .expect("lock")
            .values()
            .filter(|s| tenant.is_none_or(|t| s.tenant == *t))
            .cloned()
            .collect()
    }

    /// How many sandboxes are saved, and how many of them are `tenant`'s: they count against
    /// the server's and the key's sandbox limits as live ones do, so that restarts cannot
    /// pile up saved workspaces on the host's disk beyond what the limits allow.
    pub fn count(&self, tenant: &Tenant) -> (usize, usize) {
        let sandboxes = self.sandboxes.lock().expect("lock");
        let mine = sandboxes.values().filter(|s| &s.tenant == tenant).count();
        (sandboxes.len(), mine)
    }

    /// Takes `tenant`'s saved sandbox `id` out (to resume it): no other request sees it
    /// until it is [`Saved::put_back`] or [`Saved::finish`]ed.
    pub fn take(&self, db: &Db, tenant: &Tenant, id: &str) -> Option<SavedSandbox> {
        self.expire(db);
        let mut sandboxes = self.sandboxes.lock().expect("lock");
        match sandboxes.get(id) {
            Some(s) if &s.tenant == tenant => sandboxes.remove(id),
            _ => None,
        }
    }

    /// A resume that failed: the sandbox stays saved.
    pub fn put_back(&self, sandbox: SavedSandbox) {
        self.sandboxes
            .lock()
            .expect("lock")
            .insert(sandbox.id.clone(), sandbox);
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

    /// Saves a paused sandbox: its workspace's files (at most `disk_bytes`), then its row.
    pub fn save(
        &self,
        db: &Db,
        sandbox: SavedSandbox,
        workspace: &Workspace,
        disk_bytes: u64,
    ) -> Result<(), PersistError> {
        let path = self.path(&sandbox.id)?;
        self.make_private()?;
        // What a previous save of this id left (a server killed during its shutdown).
        let _ = fs::remove_dir_all(&path);
        let id = sandbox.id.clone();
        let mut out =
            OutDir::create(&path, CopyLimits::for_workspace(disk_bytes)).map_err(|source| {
                PersistError::Copy {
                    id: id.clone(),
                    source,
                }
            })?;
        let report = workspace
            .copy_out(&mut out)
            .map_err(|source| PersistError::Workspace {
                id: id.clone(),
                source,
            })?;
        for skipped in &report.skipped {
            eprintln!("corral: saving {id}: a file was not saved: {skipped}");
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
        self.put_back(sandbox);
        Ok(())
    }

    /// Writes the saved files of `id` into `workspace` (a fresh sandbox's); how many.
    pub fn restore(&self, id: &str, workspace: &Workspace) -> Result<usize, PersistError> {
        let root = self.path(id)?;
        let mut restored = 0;
        restore_dir(&root, Path::new(""), 0, workspace, &mut restored)?;
        Ok(restored)
    }
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
            let mut file = fs::File::open(entry.path()).map_err(io(&entry.path()))?;
            workspace
                .write_file(&rel, &mut file)
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
        })
        .unwrap()
    }

    /// At start: the directory becomes mode 0700, a row whose id is no sandbox id is dropped
    /// (never used as a path), a sandbox paused too long is deleted with its files, files
    /// nobody saved are removed, the rest stays, to its owner only.
    #[test]
    fn loading_drops_bad_ids_expired_sandboxes_and_stray_files() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("corral.db")).unwrap();
        let saved_dir = dir.path().join("saved-sandboxes");
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

        let saved = Saved::load(&db, saved_dir.clone(), Duration::from_secs(3600)).unwrap();
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

        // Another key cannot delete it; its owner can, files and row.
        assert!(!saved.remove(&db, &Tenant("key-b".into()), "sbx-kept"));
        assert!(saved.remove(&db, &a, "sbx-kept"));
        assert!(!saved_dir.join("sbx-kept").exists());
        assert!(db.saved_sandboxes().unwrap().is_empty());
    }

    /// A link (or any non-directory) where the saved workspaces go is refused, not followed.
    #[test]
    fn loading_refuses_a_link_in_place_of_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("corral.db")).unwrap();
        let elsewhere = dir.path().join("elsewhere");
        fs::create_dir(&elsewhere).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(&elsewhere, fs::Permissions::from_mode(0o755)).unwrap();
        let saved_dir = dir.path().join("saved-sandboxes");
        std::os::unix::fs::symlink(&elsewhere, &saved_dir).unwrap();
        assert!(Saved::load(&db, saved_dir, Duration::from_secs(3600)).is_err());
        let mode = fs::metadata(&elsewhere).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755, "{mode:o}");
    }
}
