//! The image store: `<data dir>/images/<recipe hash>/{manifest.json, rootfs/}`.
//!
//! An image directory is never modified once it exists. A build writes into
//! `images/.tmp/<hash>.<pid>` and renames it into place only when complete, under an
//! exclusive `flock` on `images/.locks/<hash>.lock`, so a failed or interrupted build
//! leaves no image behind and concurrent builds of one recipe run one after the other (the
//! second finds the image built and does nothing).

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use corral_sandbox::Rootfs;
use nix::fcntl::{Flock, FlockArg};

use crate::debian;
use crate::progress::{Event, Progress};
use crate::recipe::{Kind, Recipe};
use crate::{builder, ImageError, Manifest};

/// The store of images built by root, which every user can read (like podman's
/// /var/lib/containers). Root uses it by default: a store under /root (mode 0700) could not
/// be entered by the unprivileged uid a sandbox runs as.
pub const SHARED_DATA_DIR: &str = "/var/lib/corral";

const MANIFEST: &str = "manifest.json";
const ROOTFS: &str = "rootfs";
const TMP: &str = ".tmp";
const LOCKS: &str = ".locks";
const LOGS: &str = ".logs";

/// The default data directory: `$XDG_DATA_HOME/corral`, else `~/.local/share/corral` for
/// ordinary users and [`SHARED_DATA_DIR`] for root.
fn default_data_dir() -> PathBuf {
    if let Some(xdg) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(xdg).join("corral");
    }
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from(SHARED_DATA_DIR);
    }
    let home = std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"));
    home.join(".local/share/corral")
}

/// An image found in a store.
#[derive(Debug, Clone)]
pub struct StoredImage {
    pub manifest: Manifest,
    /// The image directory (`manifest.json` and `rootfs/` inside).
    pub path: PathBuf,
    /// Found in the shared store rather than the user's own.
    pub shared: bool,
}

impl StoredImage {
    pub fn rootfs(&self) -> PathBuf {
        self.path.join(ROOTFS)
    }
}

/// What a sandbox needs to know about its image.
#[derive(Debug, Clone)]
pub struct ResolvedImage {
    pub name: String,
    pub rootfs: Rootfs,
    /// Environment of every sandbox using the image (the recipe's `env`).
    pub env: Vec<(String, String)>,
    /// `python`, `javascript`, `bash`: the languages whose interpreters the image has.
    pub languages: Vec<String>,
    /// None for `host`, which is not built.
    pub manifest: Option<Manifest>,
}

/// The result of [`Store::build`].
#[derive(Debug, Clone)]
pub struct Built {
    pub image: StoredImage,
    /// The image existed already (the recipe is unchanged): nothing was built.
    pub already_built: bool,
}

#[derive(Debug, Clone)]
pub struct Store {
    /// `<data dir>/images`: where this user's images are built and removed.
    dir: PathBuf,
    /// The shared store's images directory, searched after `dir` (when it differs).
    shared: Option<PathBuf>,
}

impl Store {
    /// The store of `data_dir` (`--data-dir` / `CORRAL_DATA_DIR`) alone, or with `None` the
    /// default data directory, falling back to the shared store for reading.
    pub fn open(data_dir: Option<&Path>) -> Store {
        match data_dir {
            // Absolute: the sandbox mounts the image from another working directory.
            Some(dir) => Store {
                dir: std::path::absolute(dir)
                    .unwrap_or_else(|_| dir.to_path_buf())
                    .join("images"),
                shared: None,
            },
            None => {
                let dir = default_data_dir().join("images");
                let shared = Path::new(SHARED_DATA_DIR).join("images");
                Store {
                    shared: (dir != shared).then_some(shared),
                    dir,
                }
            }
        }
    }

    /// Where this store builds images.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The data directory the store's images live in (caches go beside them).
    pub fn data_dir(&self) -> &Path {
        self.dir.parent().unwrap_or(&self.dir)
    }

    /// Every built image, the user's own first, each group by name then age.
    pub fn list(&self) -> Result<Vec<StoredImage>, ImageError> {
        let mut all = scan(&self.dir, false)?;
        if let Some(shared) = &self.shared {
            let own: Vec<String> = all.iter().map(|i| i.manifest.hash.clone()).collect();
            all.extend(
                scan(shared, true)?
                    .into_iter()
                    .filter(|i| !own.contains(&i.manifest.hash)),
            );
        }
        Ok(all)
    }

    /// The image `name` refers to: a built-in name means the image of the built-in recipe as
    /// it is now (so a changed recipe is not silently replaced by an old build); another name
    /// the most recent image of that name; else a unique prefix (6+ digits) of a hash.
    pub fn find(&self, name: &str) -> Result<Option<StoredImage>, ImageError> {
        if let Some(recipe) = Recipe::builtin(name) {
            if recipe.kind == Kind::Host {
                return Ok(None);
            }
            let hash = recipe.with_host_suite(&debian::host_codename()?).hash();
            return Ok(self.built(&hash));
        }
        let images = self.list()?;
        if let Some(newest) = images
            .iter()
            .filter(|i| i.manifest.name == name)
            .max_by(|a, b| a.manifest.created.cmp(&b.manifest.created))
        {
            return Ok(Some(newest.clone()));
        }
        if name.len() >= 6 && name.chars().all(|c| c.is_ascii_hexdigit()) {
            let mut matching: Vec<_> = images
                .into_iter()
                .filter(|i| i.manifest.hash.starts_with(&name.to_ascii_lowercase()))
                .collect();
            return match matching.len() {
                0 => Ok(None),
                1 => Ok(matching.pop()),
                _ => Err(ImageError::Ambiguous {
                    name: name.to_string(),
                    candidates: matching.iter().map(|i| i.manifest.hash.clone()).collect(),
                }),
            };
        }
        Ok(None)
    }

    /// What `corral run --image NAME` runs in.
    pub fn resolve(&self, name: &str) -> Result<ResolvedImage, ImageError> {
        if name == "host" {
            return Ok(ResolvedImage {
                name: name.to_string(),
                rootfs: Rootfs::Host,
                env: Vec::new(),
                languages: builder::languages_in(Path::new("/")),
                manifest: None,
            });
        }
        let image = self.find(name)?.ok_or_else(|| ImageError::NotBuilt {
            name: name.to_string(),
            builtin: Recipe::builtin(name).is_some(),
        })?;
        let rootfs = image.rootfs();
        if nix::unistd::geteuid().is_root() {
            if let Some(blocker) = unsearchable_ancestor(&rootfs) {
                return Err(ImageError::Unreachable {
                    name: name.to_string(),
                    path: image.path,
                    blocker,
                });
            }
        }
        let m = image.manifest;
        Ok(ResolvedImage {
            name: name.to_string(),
            rootfs: Rootfs::Directory(rootfs),
            env: m.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            languages: m.languages.clone(),
            manifest: Some(m),
        })
    }

    /// The manifest of `name` as JSON; for `host`, a description of what it binds.
    pub fn inspect(&self, name: &str) -> Result<serde_json::Value, ImageError> {
        if name == "host" {
            return Ok(serde_json::json!({
                "name": "host",
                "builtin": true,
                "rootfs": "the host's /usr, /bin, /sbin and /lib* bound read-only, with a synthetic /etc",
                "languages": builder::languages_in(Path::new("/")),
            }));
        }
        let image = self.find(name)?.ok_or_else(|| ImageError::NotBuilt {
            name: name.to_string(),
            builtin: Recipe::builtin(name).is_some(),
        })?;
        Ok(serde_json::to_value(&image.manifest).expect("a manifest serializes"))
    }

    /// Removes every image of this store called `name` (or the one whose hash starts with
    /// `name`) and returns their manifests.
    pub fn remove(&self, name: &str) -> Result<Vec<Manifest>, ImageError> {
        let mut targets: Vec<StoredImage> = scan(&self.dir, false)?
            .into_iter()
            .filter(|i| i.manifest.name == name)
            .collect();
        if targets.is_empty() {
            match self.find(name)? {
                Some(image) if image.shared => {
                    return Err(ImageError::InSharedStore {
                        name: name.to_string(),
                        shared: image.path.parent().unwrap_or(&image.path).to_path_buf(),
                        own: self.dir.clone(),
                    })
                }
                Some(image) => targets.push(image),
                None => {
                    return Err(ImageError::NotBuilt {
                        name: name.to_string(),
                        builtin: Recipe::builtin(name).is_some(),
                    })
                }
            }
        }
        self.prepare()?;
        let mut removed = Vec::new();
        for image in targets {
            let _lock = self.lock(&image.manifest.hash, || {})?;
            // Renamed first, so the image disappears at once and a crash while deleting
            // leaves only a stale temporary directory, cleaned up by the next build.
            let trash = self.dir.join(TMP).join(format!(
                "{}.rm.{}",
                image.manifest.hash,
                std::process::id()
            ));
            fs::rename(&image.path, &trash)
                .map_err(ImageError::io(format!("removing {}", image.path.display())))?;
            fs::remove_dir_all(&trash)
                .map_err(ImageError::io(format!("deleting {}", trash.display())))?;
            removed.push(image.manifest);
        }
        Ok(removed)
    }

    /// Builds `recipe` unless an image of it exists. Needs root.
    pub fn build(&self, recipe: Recipe, progress: &mut dyn Progress) -> Result<Built, ImageError> {
        if recipe.kind == Kind::Host {
            return Err(ImageError::NothingToBuild);
        }
        let codename = debian::host_codename()?;
        let recipe = recipe.with_host_suite(&codename);
        if let Some(image) = self.built(&recipe.hash()) {
            return Ok(Built {
                image,
                already_built: true,
            });
        }
        if !nix::unistd::geteuid().is_root() {
            return Err(ImageError::NeedsRoot);
        }
        let mirror = debian::mirror_for(&debian::host_sources(), &codename, &recipe.suite)?;
        let log = self
            .dir
            .join(LOGS)
            .join(format!("{}-{}.log", recipe.name, &recipe.hash()[..12]));
        self.install(&recipe, progress, |staging, progress| {
            builder::build(&recipe, &mirror, &staging.join(ROOTFS), &log, progress)
        })
    }

    /// The locked, atomic part of a build: `build` fills the staging directory's `rootfs/`
    /// and returns the manifest; only then is the directory renamed into place.
    pub(crate) fn install(
        &self,
        recipe: &Recipe,
        progress: &mut dyn Progress,
        build: impl FnOnce(&Path, &mut dyn Progress) -> Result<Manifest, ImageError>,
    ) -> Result<Built, ImageError> {
        let hash = recipe.hash();
        self.prepare()?;
        let _lock = self.lock(&hash, || {
            progress.event(Event::Waiting { name: &recipe.name })
        })?;
        if let Some(image) = self.built(&hash) {
            return Ok(Built {
                image,
                already_built: true,
            });
        }
        self.remove_stale_staging(&hash)?;

        let staging = Staging::create(&self.dir.join(TMP), &hash)?;
        let manifest = build(&staging.path, progress)?;
        let json = serde_json::to_vec_pretty(&manifest).expect("a manifest serializes");
        fs::write(staging.path.join(MANIFEST), json)
            .map_err(ImageError::io("writing the manifest"))?;
        set_mode(&staging.path, 0o755)?;
        let target = self.dir.join(&hash);
        fs::rename(&staging.path, &target).map_err(ImageError::io(format!(
            "moving the image to {}",
            target.display()
        )))?;
        staging.disarm();
        if let Ok(dir) = File::open(&self.dir) {
            let _ = dir.sync_all();
        }
        Ok(Built {
            image: StoredImage {
                manifest,
                path: target,
                shared: false,
            },
            already_built: false,
        })
    }

    /// The image of `hash`, from this user's store or else the shared one.
    fn built(&self, hash: &str) -> Option<StoredImage> {
        std::iter::once((&self.dir, false))
            .chain(self.shared.iter().map(|s| (s, true)))
            .find_map(|(dir, shared)| load(&dir.join(hash), shared))
    }

    /// Creates the store's directories; those the sandbox user must pass through are 0755
    /// whatever the umask.
    fn prepare(&self) -> Result<(), ImageError> {
        let data_dir = self.dir.parent().unwrap_or(&self.dir);
        for (dir, mode) in [
            (data_dir, 0o755),
            (self.dir.as_path(), 0o755),
            (&self.dir.join(TMP), 0o700),
            (&self.dir.join(LOCKS), 0o700),
            (&self.dir.join(LOGS), 0o700),
        ] {
            if dir.is_dir() {
                continue;
            }
            fs::DirBuilder::new()
                .recursive(true)
                .mode(mode)
                .create(dir)
                .map_err(ImageError::io(format!("creating {}", dir.display())))?;
            set_mode(dir, mode)?;
        }
        Ok(())
    }

    /// An exclusive lock on `hash`, waiting for it; `on_wait` is called first if another
    /// process holds it.
    fn lock(&self, hash: &str, on_wait: impl FnOnce()) -> Result<Flock<File>, ImageError> {
        let path = self.lock_path(hash);
        let file = self.lock_file(&path)?;
        let file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(lock),
            Err((file, nix::errno::Errno::EWOULDBLOCK)) => file,
            Err((_, e)) => return Err(lock_error(&path, e)),
        };
        on_wait();
        Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| lock_error(&path, e))
    }

    /// The lock on `hash` if nobody holds it.
    fn try_lock(&self, hash: &str) -> Result<Option<Flock<File>>, ImageError> {
        let path = self.lock_path(hash);
        match Flock::lock(self.lock_file(&path)?, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(Some(lock)),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
            Err((_, e)) => Err(lock_error(&path, e)),
        }
    }

    fn lock_path(&self, hash: &str) -> PathBuf {
        self.dir.join(LOCKS).join(format!("{hash}.lock"))
    }

    fn lock_file(&self, path: &Path) -> Result<File, ImageError> {
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(ImageError::io(format!("opening {}", path.display())))
    }

    /// Deletes what interrupted builds and removals left in `.tmp`. The caller holds the
    /// lock of `own_hash`; a directory of another image is stale when nobody holds its lock.
    fn remove_stale_staging(&self, own_hash: &str) -> Result<(), ImageError> {
        let tmp = self.dir.join(TMP);
        let entries =
            fs::read_dir(&tmp).map_err(ImageError::io(format!("reading {}", tmp.display())))?;
        for entry in entries.filter_map(|e| e.ok()) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(hash) = name.split('.').next().filter(|h| is_hash(h)) else {
                continue;
            };
            let _other = if hash == own_hash {
                None
            } else {
                match self.try_lock(hash)? {
                    Some(lock) => Some(lock),
                    None => continue,
                }
            };
            fs::remove_dir_all(entry.path()).map_err(ImageError::io(format!(
                "removing the leftover build directory {}",
                entry.path().display()
            )))?;
        }
        Ok(())
    }
}

fn lock_error(path: &Path, e: nix::errno::Errno) -> ImageError {
    ImageError::Io {
        what: format!("locking {}", path.display()),
        source: e.into(),
    }
}

/// The temporary directory of one build; deleted on drop unless it was renamed into place.
struct Staging {
    path: PathBuf,
    keep: bool,
}

impl Staging {
    fn create(tmp: &Path, hash: &str) -> Result<Staging, ImageError> {
        let path = tmp.join(format!("{hash}.{}", std::process::id()));
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(ImageError::io(format!("creating {}", path.display())))?;
        Ok(Staging { path, keep: false })
    }

    fn disarm(mut self) {
        self.keep = true;
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.keep {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

fn is_hash(s: &str) -> bool {
    s.len() == 64 && s.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
}

/// The images of one `images` directory: `<hash>/manifest.json` that parse and match their
/// directory name. Anything else (a leftover, a foreign file) is not an image.
fn scan(dir: &Path, shared: bool) -> Result<Vec<StoredImage>, ImageError> {
    let entries = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(ImageError::io(format!("reading {}", dir.display()))(e)),
    };
    let mut images = Vec::new();
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !is_hash(&name) {
            continue;
        }
        images.extend(load(&entry.path(), shared));
    }
    images.sort_by(|a, b| {
        (&a.manifest.name, &a.manifest.created).cmp(&(&b.manifest.name, &b.manifest.created))
    });
    Ok(images)
}

/// The image in directory `path` if its manifest parses and names the directory's hash.
fn load(path: &Path, shared: bool) -> Option<StoredImage> {
    let text = fs::read(path.join(MANIFEST)).ok()?;
    let manifest: Manifest = serde_json::from_slice(&text).ok()?;
    (path.file_name()? == manifest.hash.as_str()).then(|| StoredImage {
        manifest,
        path: path.to_path_buf(),
        shared,
    })
}

fn set_mode(path: &Path, mode: u32) -> Result<(), ImageError> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(ImageError::io(format!(
        "setting the mode of {}",
        path.display()
    )))
}

/// The first directory on the way to `path` (itself included) that other users cannot
/// search: in root mode a sandbox runs as an unprivileged host uid that must walk the path.
fn unsearchable_ancestor(path: &Path) -> Option<PathBuf> {
    let path = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    path.ancestors()
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .find(|p| fs::metadata(p).is_ok_and(|m| m.mode() & 0o001 == 0))
        .map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};
    use std::time::Duration;

    use crate::progress::Phase;
    use crate::ToolFailure;

    fn recipe(name: &str, packages: &[&str]) -> Recipe {
        let list: Vec<String> = packages.iter().map(|p| format!("{p:?}")).collect();
        Recipe::parse(
            &format!(
                "name = {name:?}\nsuite = \"bookworm\"\npackages = [{}]\n[env]\nX = \"1\"\n",
                list.join(", ")
            ),
            Path::new("/"),
        )
        .unwrap()
    }

    /// What a builder would produce: a root with a shell and python, and its manifest.
    fn fake_build(recipe: &Recipe, staging: &Path, created: &str) -> Result<Manifest, ImageError> {
        let root = staging.join(ROOTFS);
        fs::create_dir_all(root.join("usr/bin")).unwrap();
        for exe in ["python3", "bash"] {
            fs::write(root.join("usr/bin").join(exe), "").unwrap();
            fs::set_permissions(
                root.join("usr/bin").join(exe),
                fs::Permissions::from_mode(0o755),
            )
            .unwrap();
        }
        Ok(Manifest {
            name: recipe.name.clone(),
            hash: recipe.hash(),
            recipe: recipe.canonical(),
            content_hash: "sha256:0".into(),
            size_bytes: 1,
            created: created.into(),
            build_seconds: 0.0,
            mirror: "http://mirror.invalid/debian".into(),
            languages: crate::builder::languages_in(&root),
            packages: Default::default(),
            pypi_packages: Default::default(),
            skipped_packages: Vec::new(),
            env: recipe.env.clone(),
        })
    }

    struct Recorder(Vec<String>);

    impl Progress for Recorder {
        fn event(&mut self, event: Event<'_>) {
            self.0.push(format!("{event:?}"));
        }
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    #[test]
    fn install_renames_a_complete_image_into_place() {
        let data = tempfile::tempdir().unwrap();
        let store = Store::open(Some(data.path()));
        let r = recipe("sci", &["python3"]);
        let built = store
            .install(&r, &mut Recorder(vec![]), |s, _| {
                fake_build(&r, s, "2025-01-01T00:00:00Z")
            })
            .unwrap();
        assert!(!built.already_built);
        assert_eq!(built.image.path, store.dir().join(r.hash()));
        assert_eq!(
            entries(&built.image.path),
            ["manifest.json", "rootfs"],
            "only the finished image"
        );
        assert_eq!(
            fs::metadata(&built.image.path).unwrap().mode() & 0o777,
            0o755,
            "other users (the sandbox's uid) can enter the image"
        );
        assert!(entries(&store.dir().join(TMP)).is_empty());

        let resolved = store.resolve("sci").unwrap();
        assert_eq!(resolved.rootfs, Rootfs::Directory(built.image.rootfs()));
        assert_eq!(resolved.languages, ["python", "bash"]);
        assert_eq!(resolved.env, [("X".to_string(), "1".to_string())]);
        assert_eq!(
            store.inspect("sci").unwrap()["hash"],
            serde_json::json!(r.hash())
        );
        // By hash prefix too.
        assert_eq!(
            store.find(&r.hash()[..8]).unwrap().unwrap().path,
            built.image.path
        );
    }

    #[test]
    fn failed_build_leaves_nothing_behind() {
        let data = tempfile::tempdir().unwrap();
        let store = Store::open(Some(data.path()));
        let r = recipe("sci", &["python3"]);
        let err = store
            .install(&r, &mut Recorder(vec![]), |staging, _| {
                // Half a root filesystem, then the tool fails.
                fs::create_dir_all(staging.join("rootfs/usr/lib")).unwrap();
                fs::write(staging.join("rootfs/usr/lib/half"), "x").unwrap();
                Err(ImageError::Tool(Box::new(ToolFailure {
                    phase: Phase::Packages,
                    command: "apt-get install".into(),
                    status: "exited with status 100".into(),
                    tail: vec!["E: Unable to locate package nope".into()],
                    log: "/x.log".into(),
                    hint: "check the packages".into(),
                })))
            })
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("packages failed: `apt-get install` exited with status 100")
                && text.contains("  | E: Unable to locate package nope")
                && text.contains("what to do: check the packages"),
            "{text}"
        );
        assert!(!store.dir().join(r.hash()).exists());
        assert!(
            entries(&store.dir().join(TMP)).is_empty(),
            "staging removed"
        );
        assert!(store.list().unwrap().is_empty());
        assert!(matches!(
            store.resolve("sci"),
            Err(ImageError::NotBuilt { builtin: false, .. })
        ));
    }

    #[test]
    fn interrupted_build_is_cleaned_up_by_the_next() {
        let data = tempfile::tempdir().unwrap();
        let store = Store::open(Some(data.path()));
        let r = recipe("sci", &["python3"]);
        store.prepare().unwrap();
        // What a killed build leaves: a staging directory nobody holds the lock of, and
        // one of another image whose build is still running (its lock is held).
        let leftover = store.dir().join(TMP).join(format!("{}.4242", r.hash()));
        fs::create_dir_all(leftover.join("rootfs/usr")).unwrap();
        let other = recipe("other", &[]);
        let running = store.dir().join(TMP).join(format!("{}.4343", other.hash()));
        fs::create_dir_all(&running).unwrap();
        let _other_lock = store.lock(&other.hash(), || {}).unwrap();

        assert!(
            store.list().unwrap().is_empty(),
            "a leftover is not an image"
        );
        store
            .install(&r, &mut Recorder(vec![]), |s, _| fake_build(&r, s, "t"))
            .unwrap();
        assert!(!leftover.exists());
        assert!(running.exists(), "a build in progress is left alone");
    }

    #[test]
    fn concurrent_builds_of_one_recipe_build_once() {
        let data = tempfile::tempdir().unwrap();
        let store = Store::open(Some(data.path()));
        let r = recipe("sci", &["python3"]);
        let builds = Arc::new(AtomicUsize::new(0));
        let start = Arc::new(Barrier::new(2));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (store, r, builds, start) =
                    (store.clone(), r.clone(), builds.clone(), start.clone());
                std::thread::spawn(move || {
                    let mut events = Recorder(vec![]);
                    start.wait();
                    let built = store
                        .install(&r, &mut events, |s, _| {
                            builds.fetch_add(1, Ordering::SeqCst);
                            // Long enough for the other thread to reach the lock.
                            std::thread::sleep(Duration::from_millis(500));
                            fake_build(&r, s, "t")
                        })
                        .unwrap();
                    (built.already_built, events.0)
                })
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(builds.load(Ordering::SeqCst), 1, "built exactly once");
        let waited: Vec<_> = results.iter().filter(|(already, _)| *already).collect();
        assert_eq!(waited.len(), 1, "the second found the first's image");
        assert!(
            waited[0].1.iter().any(|e| e.starts_with("Waiting")),
            "and said it was waiting: {:?}",
            waited[0].1
        );
        assert_eq!(store.list().unwrap().len(), 1);
    }

    #[test]
    fn an_unchanged_recipe_is_not_rebuilt_and_a_changed_one_is() {
        let data = tempfile::tempdir().unwrap();
        let store = Store::open(Some(data.path()));
        let r1 = recipe("sci", &["python3"]);
        store
            .install(&r1, &mut Recorder(vec![]), |s, _| {
                fake_build(&r1, s, "2025-01-01T00:00:00Z")
            })
            .unwrap();
        let again = store
            .install(&r1, &mut Recorder(vec![]), |_, _| panic!("rebuilt"))
            .unwrap();
        assert!(again.already_built);

        let r2 = recipe("sci", &["python3", "nodejs"]);
        store
            .install(&r2, &mut Recorder(vec![]), |s, _| {
                fake_build(&r2, s, "2025-02-01T00:00:00Z")
            })
            .unwrap();
        assert_eq!(store.list().unwrap().len(), 2);
        assert_eq!(
            store.find("sci").unwrap().unwrap().manifest.hash,
            r2.hash(),
            "a name means its newest image"
        );
        let removed = store.remove("sci").unwrap();
        assert_eq!(removed.len(), 2, "rm NAME removes every image of that name");
        assert!(store.list().unwrap().is_empty());
        assert!(matches!(
            store.remove("sci"),
            Err(ImageError::NotBuilt { .. })
        ));
    }

    #[test]
    fn rm_by_hash_prefix_and_ambiguity() {
        let data = tempfile::tempdir().unwrap();
        let store = Store::open(Some(data.path()));
        let r = recipe("sci", &["python3"]);
        store
            .install(&r, &mut Recorder(vec![]), |s, _| fake_build(&r, s, "t"))
            .unwrap();
        let removed = store.remove(&r.hash()[..10]).unwrap();
        assert_eq!(removed[0].hash, r.hash());
        assert!(store.list().unwrap().is_empty());
    }

    #[test]
    fn host_resolves_to_the_host_rootfs() {
        let data = tempfile::tempdir().unwrap();
        let host = Store::open(Some(data.path())).resolve("host").unwrap();
        assert_eq!(host.rootfs, Rootfs::Host);
        assert!(host.manifest.is_none());
        assert!(host.languages.contains(&"bash".to_string()));
    }

    #[test]
    fn foreign_entries_in_the_store_are_not_images() {
        let data = tempfile::tempdir().unwrap();
        let store = Store::open(Some(data.path()));
        let r = recipe("sci", &[]);
        store.prepare().unwrap();
        // A directory with an image's name whose manifest names another hash.
        let bogus = store.dir().join("a".repeat(64));
        fs::create_dir_all(&bogus).unwrap();
        let m = fake_build(&r, &bogus, "t").unwrap();
        fs::write(bogus.join(MANIFEST), serde_json::to_vec(&m).unwrap()).unwrap();
        fs::write(store.dir().join("notes.txt"), "x").unwrap();
        assert!(store.list().unwrap().is_empty());
    }

    #[test]
    fn unsearchable_parents_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let inner = dir.path().join("a/b");
        fs::create_dir_all(&inner).unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(dir.path().join("a"), fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(unsearchable_ancestor(&inner), Some(dir.path().join("a")));
        // Through a symlink, the real path counts.
        std::os::unix::fs::symlink(&inner, dir.path().join("link")).unwrap();
        assert_eq!(
            unsearchable_ancestor(&dir.path().join("link")),
            Some(dir.path().join("a").canonicalize().unwrap())
        );
        fs::set_permissions(dir.path().join("a"), fs::Permissions::from_mode(0o711)).unwrap();
        assert_eq!(unsearchable_ancestor(&inner), None);
    }
}
