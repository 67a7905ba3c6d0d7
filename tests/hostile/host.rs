//! Host-side observation: what the attacks must not have changed.

use std::collections::BTreeSet;
use std::fs;
use std::hash::{DefaultHasher, Hasher};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};
use tempfile::TempDir;

use crate::harness::{is_own_pid, marker};

/// Host processes whose command line contains `needle`.
pub fn procs_with(needle: &str) -> Vec<(u32, String)> {
    let me = std::process::id();
    let mut found = Vec::new();
    let Ok(rd) = fs::read_dir("/proc") else {
        return found;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        if let Ok(raw) = fs::read(e.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
            if cmd.contains(needle) {
                found.push((pid, cmd));
            }
        }
    }
    found
}

/// After a run nothing it started may survive. A short grace period covers
/// the kernel finishing a SIGKILL that was already sent.
pub fn assert_no_procs(needle: &str) {
    let start = Instant::now();
    loop {
        let left = procs_with(needle);
        if left.is_empty() {
            return;
        }
        if start.elapsed() > Duration::from_millis(1500) {
            panic!("SANDBOX HOLE: processes outlived the sandbox: {left:#?}");
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Wait until a host process whose cmdline contains `needle` exists.
pub fn wait_for_proc(needle: &str, timeout: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if !procs_with(needle).is_empty() {
            return true;
        }
        thread::sleep(Duration::from_millis(25));
    }
    false
}

/// Every directory under `/sys/fs/cgroup/*/corral/` (v1) and `/sys/fs/cgroup/corral/` (v2)
/// that this suite made: its name begins with the pid of this test binary or of a `corral` it
/// started (`harness::spawn_corral`). Another Corral's cgroups on the same host are not judged.
pub fn corral_cgroups() -> BTreeSet<PathBuf> {
    let mut roots = vec![PathBuf::from("/sys/fs/cgroup/corral")];
    if let Ok(rd) = fs::read_dir("/sys/fs/cgroup") {
        roots.extend(rd.flatten().map(|e| e.path().join("corral")));
    }
    let mut set = BTreeSet::new();
    for r in roots {
        if let Ok(rd) = fs::read_dir(&r) {
            for e in rd.flatten() {
                let owner = e
                    .file_name()
                    .to_str()
                    .and_then(|n| n.split('-').next()?.parse::<u32>().ok());
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false)
                    && owner.is_some_and(is_own_pid)
                {
                    set.insert(e.path());
                }
            }
        }
    }
    set
}

/// Entries of the host temp dir whose name mentions corral.
fn corral_tmp_entries() -> BTreeSet<PathBuf> {
    let mut set = BTreeSet::new();
    for dir in [
        std::env::temp_dir(),
        PathBuf::from("/tmp"),
        PathBuf::from("/dev/shm"),
    ] {
        if let Ok(rd) = fs::read_dir(&dir) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().contains("corral") {
                    set.insert(e.path());
                }
            }
        }
    }
    set
}

fn mount_points() -> BTreeSet<String> {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .collect()
}

/// Host state that must be identical before and after a run. Only
/// meaningful under `harness::exclusive()`.
pub struct Snapshot {
    pub cgroups: BTreeSet<PathBuf>,
    mounts: BTreeSet<String>,
    tmp: BTreeSet<PathBuf>,
}

impl Snapshot {
    pub fn take() -> Self {
        Snapshot {
            cgroups: corral_cgroups(),
            mounts: mount_points(),
            tmp: corral_tmp_entries(),
        }
    }

    /// No new cgroup dir, mount point or temp dir remains.
    pub fn assert_nothing_left(&self) {
        let start = Instant::now();
        loop {
            let now = Snapshot::take();
            let cg: Vec<_> = now.cgroups.difference(&self.cgroups).collect();
            let mn: Vec<_> = now.mounts.difference(&self.mounts).collect();
            let tmp: Vec<_> = now.tmp.difference(&self.tmp).collect();
            if cg.is_empty() && mn.is_empty() && tmp.is_empty() {
                return;
            }
            if start.elapsed() > Duration::from_millis(1500) {
                panic!("sandbox left state on the host: cgroups={cg:?} mounts={mn:?} temp={tmp:?}");
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A world-readable secret file planted on the host. Only isolation can
/// keep the sandbox from reading it.
pub struct HostSecret {
    pub base: TempDir,
    pub dir: PathBuf,
    pub path: PathBuf,
    pub token: String,
}

impl HostSecret {
    pub fn plant() -> Self {
        let base = tempfile::Builder::new()
            .prefix("hx-")
            .tempdir()
            .expect("tempdir");
        fs::set_permissions(base.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let dir = base.path().join("secret");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.join("secret.txt");
        let token = marker("secret");
        fs::write(&path, format!("{token}\n")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        HostSecret {
            base,
            dir,
            path,
            token,
        }
    }

    pub fn path_str(&self) -> &str {
        self.path.to_str().expect("utf-8 temp path")
    }

    pub fn dir_str(&self) -> &str {
        self.dir.to_str().expect("utf-8 temp path")
    }

    /// Content, mode and directory listing are exactly as planted.
    pub fn assert_unchanged(&self) {
        let content = fs::read_to_string(&self.path).expect("planted secret vanished");
        assert_eq!(
            content,
            format!("{}\n", self.token),
            "planted secret modified"
        );
        let mode = fs::metadata(&self.path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o644, "planted secret mode changed");
        let names = list_names(&self.dir);
        assert_eq!(names, vec!["secret.txt".to_string()], "secret dir changed");
    }
}

/// Sorted file names in a directory.
pub fn list_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A content fingerprint (no crypto needed: detects modification).
pub fn digest(path: &Path) -> Option<(u64, u64)> {
    let data = fs::read(path).ok()?;
    let mut h = DefaultHasher::new();
    h.write(&data);
    Some((data.len() as u64, h.finish()))
}

pub fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The host can still create processes (fork bombs must not starve it).
pub fn assert_host_can_fork() {
    let st = std::process::Command::new("true")
        .status()
        .expect("host cannot fork after the attack");
    assert!(st.success());
}

/// Any path in the host's common scratch places whose name has `needle`.
pub fn assert_no_host_file_named(needle: &str) {
    let mut dirs = vec![
        std::env::temp_dir(),
        PathBuf::from("/tmp"),
        PathBuf::from("/dev/shm"),
        PathBuf::from("/"),
        PathBuf::from("/usr/bin"),
        PathBuf::from("/etc"),
        PathBuf::from("/var/tmp"),
    ];
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home));
    }
    for d in dirs {
        if let Ok(rd) = fs::read_dir(&d) {
            for e in rd.flatten() {
                assert!(
                    !e.file_name().to_string_lossy().contains(needle),
                    "SANDBOX HOLE: the attack created {} on the host",
                    e.path().display()
                );
            }
        }
    }
}

/// Every entry under `dir`, without following symlinks.
pub fn walk(dir: &Path) -> Vec<(PathBuf, fs::Metadata)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let md = fs::symlink_metadata(e.path()).unwrap();
            if md.is_dir() {
                stack.push(e.path());
            }
            out.push((e.path(), md));
        }
    }
    out
}
