//! Per-sandbox control groups on cgroup v1 (one directory per controller) and v2 (one directory).
//!
//! Everything here goes through plain file operations under a detected mount point, so the
//! logic is unit-tested against a fake tree in a temporary directory.

use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::spec::Limits;

/// Controllers a v1 sandbox cgroup is created in. Memory and pids are required; the others
/// are used when mounted (cpuacct measures CPU time even for processes killed unreaped).
const V1_CONTROLLERS: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "freezer"];
const CPU_PERIOD_US: u64 = 100_000;

/// A CPU weight on cgroup v2's scale: 1 to 10000, where an ordinary process weighs 100.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuWeight(u16);

impl CpuWeight {
    /// `weight` when it lies in 1..=10000.
    pub fn new(weight: u16) -> Option<CpuWeight> {
        (1..=10_000).contains(&weight).then_some(CpuWeight(weight))
    }
}

/// How the host's cgroup hierarchy is laid out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// Legacy hierarchy: each controller mounted on its own (controller, mount point).
    V1(Vec<(String, PathBuf)>),
    /// Unified hierarchy mounted at this path with the needed controllers available.
    V2(PathBuf),
}

impl Layout {
    /// Detects the layout from `/proc/self/mountinfo`; `None` when neither v2 with the memory
    /// and pids controllers nor v1 memory and pids hierarchies are mounted.
    pub fn detect() -> Option<Layout> {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
        Self::from_mountinfo(&mountinfo, |p| fs::read_to_string(p).ok())
    }

    fn from_mountinfo(mountinfo: &str, read: impl Fn(&Path) -> Option<String>) -> Option<Layout> {
        let mut v1 = Vec::new();
        let mut v2 = None;
        for line in mountinfo.lines() {
            // Fields: id parent major:minor root mount-point options [optional...] - fstype source super-options
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mount_point = left.split(' ').nth(4).map(unescape_mountinfo);
            let mut right = right.split(' ');
            let (fstype, super_opts) = (right.next(), right.nth(1));
            match (fstype, mount_point) {
                (Some("cgroup2"), Some(mp)) => v2 = v2.or(Some(mp)),
                (Some("cgroup"), Some(mp)) => {
                    for opt in super_opts.unwrap_or("").split(',') {
                        if V1_CONTROLLERS.contains(&opt) {
                            v1.push((opt.to_string(), mp.clone()));
                        }
                    }
                }
                _ => {}
            }
        }
        if let Some(mount) = v2 {
            let controllers = read(&mount.join("cgroup.controllers")).unwrap_or_default();
            let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
            if has("memory") && has("pids") {
                return Some(Layout::V2(mount));
            }
        }
        let has_v1 = |c: &str| v1.iter().any(|(name, _)| name == c);
        (has_v1("memory") && has_v1("pids")).then_some(Layout::V1(v1))
    }

    pub fn version(&self) -> u8 {
        match self {
            Layout::V1(_) => 1,
            Layout::V2(_) => 2,
        }
    }

    /// Controllers this layout offers to sandboxes.
    pub fn controllers(&self) -> Vec<String> {
        match self {
            Layout::V1(list) => list.iter().map(|(c, _)| c.clone()).collect(),
            Layout::V2(mount) => fs::read_to_string(mount.join("cgroup.controllers"))
                .unwrap_or_default()
                .split_whitespace()
                .filter(|c| ["memory", "pids", "cpu"].contains(c))
                .map(str::to_string)
                .collect(),
        }
    }

    /// The directory (v2) or directories (v1) under which sandbox cgroups are created,
    /// creating and configuring them if needed.
    fn parents(&self, euid_is_root: bool) -> io::Result<Vec<(Vec<String>, PathBuf)>> {
        match self {
            Layout::V1(list) => {
                let mut parents: Vec<(Vec<String>, PathBuf)> = Vec::new();
                for (c, mount) in list {
                    let dir = mount.join("corral");
                    match parents.iter_mut().find(|(_, d)| *d == dir) {
                        Some((controllers, _)) => controllers.push(c.clone()),
                        None => {
                            ensure_dir(&dir)?;
                            parents.push((vec![c.clone()], dir));
                        }
                    }
                }
                Ok(parents)
            }
            Layout::V2(mount) => {
                let base = if euid_is_root {
                    mount.clone()
                } else {
                    delegated_v2_base(mount)?
                };
                let dir = base.join("corral");
                if euid_is_root {
                    enable_v2_controllers(&base)?;
                }
                ensure_dir(&dir)?;
                enable_v2_controllers(&dir)?;
                Ok(vec![(vec!["unified".to_string()], dir)])
            }
        }
    }
}

impl Layout {
    /// Sets the CPU weight of all sandboxes together against the host's other processes: the
    /// `corral` parent's `cpu.weight` on v2, its `cpu.shares` on v1 (`weight` × 1024 / 100,
    /// the scale on which an ordinary process weighs 1024). Fails when the layout has no
    /// `cpu` controller or the kernel refuses the value.
    pub fn set_cpu_weight(&self, weight: CpuWeight) -> io::Result<()> {
        let parents = self.parents(nix::unistd::geteuid().is_root())?;
        let weight = u64::from(weight.0);
        let target = match self {
            Layout::V1(_) => parents
                .iter()
                .find(|(controllers, _)| controllers.iter().any(|c| c == "cpu"))
                .map(|(_, dir)| (dir.join("cpu.shares"), weight * 1024 / 100)),
            Layout::V2(_) => self
                .controllers()
                .iter()
                .any(|c| c == "cpu")
                .then(|| (parents[0].1.join("cpu.weight"), weight)),
        };
        let (file, value) = target
            .ok_or_else(|| io::Error::new(io::ErrorKind::Unsupported, "no cpu controller"))?;
        write_file(&file, &value.to_string())
    }

    /// The names of the sandbox cgroups that exist now, of every Corral process of this user
    /// (each is named `<owner pid>-...`).
    pub fn sandbox_cgroups(&self) -> Vec<String> {
        let Ok(parents) = self.parents(nix::unistd::geteuid().is_root()) else {
            return Vec::new();
        };
        // Every sandbox cgroup exists under each parent, so one listing names them all.
        let Some((_, first)) = parents.first() else {
            return Vec::new();
        };
        fs::read_dir(first)
            .map(|entries| {
                entries
                    .flatten()
                    // d_type from the listing: no stat per control file.
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Removes sandbox cgroups left behind by a Corral process that no longer exists (killed
    /// with SIGKILL before its teardown ran). A cgroup is named `<owner pid>-...`; it is removed
    /// only when that pid is gone and no process is left in it. Returns how many were removed.
    pub fn sweep_stale(&self) -> usize {
        let Ok(parents) = self.parents(nix::unistd::geteuid().is_root()) else {
            return 0;
        };
        let Some((_, first)) = parents.first() else {
            return 0;
        };
        let names = self.sandbox_cgroups();
        let euid = nix::unistd::geteuid().as_raw();
        let mut removed = 0;
        for name in names {
            let owner_alive = name
                .split('-')
                .next()
                .and_then(|p| p.parse::<i32>().ok())
                .is_none_or(|pid| {
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
                        != Err(nix::errno::Errno::ESRCH)
                });
            if owner_alive {
                continue;
            }
            // Only this user's own cgroups: a rootless process cannot remove root's.
            let ours = fs::metadata(first.join(&name))
                .is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == euid);
            if !ours {
                continue;
            }
            let mut stale = Cgroup {
                version: self.version(),
                dirs: parents
                    .iter()
                    .map(|(c, p)| (c.clone(), p.join(&name)))
                    .filter(|(_, d)| d.is_dir())
                    .collect(),
            };
            if stale.procs().is_empty() {
                stale.destroy();
                removed += 1;
            } else {
                std::mem::forget(stale); // still in use by someone: leave it alone
            }
        }
        removed
    }
}

fn unescape_mountinfo(s: &str) -> PathBuf {
    PathBuf::from(
        s.replace("\\040", " ")
            .replace("\\011", "\t")
            .replace("\\134", "\\"),
    )
}

fn ensure_dir(dir: &Path) -> io::Result<()> {
    match fs::create_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

fn enable_v2_controllers(dir: &Path) -> io::Result<()> {
    let available = fs::read_to_string(dir.join("cgroup.controllers"))?;
    let wanted: Vec<String> = ["memory", "pids", "cpu"]
        .iter()
        .filter(|c| available.split_whitespace().any(|a| a == **c))
        .map(|c| format!("+{c}"))
        .collect();
    let enabled = fs::read_to_string(dir.join("cgroup.subtree_control"))?;
    if wanted
        .iter()
        .all(|w| enabled.split_whitespace().any(|e| e == &w[1..]))
    {
        return Ok(());
    }
    fs::write(dir.join("cgroup.subtree_control"), wanted.join(" "))
}

/// Rootless on v2: the nearest ancestor of our own cgroup that we may write and that already
/// delegates memory and pids to its children (systemd's `user@UID.service`).
fn delegated_v2_base(mount: &Path) -> io::Result<PathBuf> {
    let own = fs::read_to_string("/proc/self/cgroup")?;
    let rel = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no cgroup v2 membership"))?;
    let mut dir = mount.join(rel.trim_start_matches('/'));
    while dir.starts_with(mount) && dir != mount {
        let subtree = fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
        let delegates = ["memory", "pids"]
            .iter()
            .all(|c| subtree.split_whitespace().any(|s| s == *c));
        if delegates && nix::unistd::access(&dir, nix::unistd::AccessFlags::W_OK).is_ok() {
            return Ok(dir);
        }
        dir.pop();
    }
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        "no writable cgroup v2 subtree is delegated to this user",
    ))
}

/// How long [`Cgroup::kill_all`] waits for a group to freeze before it signals anyway.
const KILL_FREEZE_WAIT: Duration = Duration::from_millis(200);

/// Why a cgroup could not be frozen or thawed.
#[derive(Debug, thiserror::Error)]
pub enum FreezeError {
    #[error("this cgroup has no freezer (cgroup v1 without the freezer controller)")]
    NoFreezer,
    #[error("writing the freezer state: {0}")]
    Write(#[source] io::Error),
    #[error("reading the freezer state: {0}")]
    Read(#[source] io::Error),
    #[error("the processes did not all freeze within {0:?}")]
    Timeout(Duration),
    #[error("starting the process that thaws the group if the host dies: {0}")]
    Guard(#[source] io::Error),
}

/// Reads a cgroup's usage by path, without owning it (a sampler keeps one): once the cgroup is
/// removed, every reading is `None`.
#[derive(Debug, Clone)]
pub struct Meter {
    version: u8,
    /// The directory of the CPU accounting (v1 `cpuacct`, the v2 directory).
    cpu: Option<PathBuf>,
    /// The directory of the memory controller (v1 `memory`, the v2 directory).
    memory: Option<PathBuf>,
}

/// Memory of a cgroup now: everything it is charged (`used`), of which page cache (`cache`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryUsage {
    pub used: u64,
    pub cache: u64,
}

impl Meter {
    /// CPU time used by every process that ever ran in the cgroup.
    pub fn cpu_time(&self) -> Option<Duration> {
        let dir = self.cpu.as_ref()?;
        if self.version == 2 {
            let stat = fs::read_to_string(dir.join("cpu.stat")).ok()?;
            let usec = stat
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec "))?
                .trim()
                .parse()
                .ok()?;
            return Some(Duration::from_micros(usec));
        }
        let nanos = fs::read_to_string(dir.join("cpuacct.usage")).ok()?;
        Some(Duration::from_nanos(nanos.trim().parse().ok()?))
    }

    /// The memory charged to the cgroup now.
    pub fn memory(&self) -> Option<MemoryUsage> {
        let dir = self.memory.as_ref()?;
        let (usage, cache_key) = if self.version == 2 {
            ("memory.current", "file ")
        } else {
            ("memory.usage_in_bytes", "cache ")
        };
        let used = fs::read_to_string(dir.join(usage))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let stat = fs::read_to_string(dir.join("memory.stat")).ok()?;
        let cache = stat
            .lines()
            .find_map(|l| l.strip_prefix(cache_key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        Some(MemoryUsage { used, cache })
    }
}

/// Held while a cgroup is frozen (see [`Cgroup::freeze_guarded`]): dropping it thaws the group
/// and reaps the process that would have thawed it had this process died.
#[derive(Debug)]
pub struct ThawGuard {
    child: nix::unistd::Pid,
    host_end: Option<OwnedFd>,
}

impl Drop for ThawGuard {
    fn drop(&mut self) {
        drop(self.host_end.take());
        while let Err(nix::errno::Errno::EINTR) = nix::sys::wait::waitpid(self.child, None) {}
    }
}

/// One sandbox's cgroup (one directory per v1 controller, or one v2 directory).
#[derive(Debug)]
pub struct Cgroup {
    version: u8,
    /// (controllers mounted there, directory); for v2 the one controller is "unified".
    dirs: Vec<(Vec<String>, PathBuf)>,
}

impl Cgroup {
    /// Creates the cgroup `name` and writes the limits. On error nothing is left behind.
    pub fn create(layout: &Layout, name: &str, limits: &Limits) -> io::Result<Cgroup> {
        let parents = layout.parents(nix::unistd::geteuid().is_root())?;
        let mut cgroup = Cgroup {
            version: layout.version(),
            dirs: Vec::new(),
        };
        for (controllers, parent) in parents {
            let dir = parent.join(name);
            if let Err(e) = fs::create_dir(&dir) {
                cgroup.destroy();
                return Err(e);
            }
            cgroup.dirs.push((controllers, dir));
        }
        if let Err(e) = cgroup.apply(limits) {
            cgroup.destroy();
            return Err(e);
        }
        Ok(cgroup)
    }

    fn dir(&self, controller: &str) -> Option<&Path> {
        let key = if self.version == 2 {
            "unified"
        } else {
            controller
        };
        self.dirs
            .iter()
            .find(|(c, _)| c.iter().any(|x| x == key))
            .map(|(_, d)| d.as_path())
    }

    fn apply(&self, limits: &Limits) -> io::Result<()> {
        let quota = (limits.cpus * CPU_PERIOD_US as f64).round() as u64;
        let memory = limits.memory_bytes.to_string();
        let pids = limits.pids.to_string();
        if self.version == 2 {
            let dir = self.dir("unified").expect("v2 cgroup has its directory");
            write_file(&dir.join("memory.max"), &memory)?;
            write_optional(&dir.join("memory.swap.max"), "0")?;
            write_file(&dir.join("pids.max"), &pids)?;
            write_optional(&dir.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
            return Ok(());
        }
        let mem = self.dir("memory").expect("v1 memory is required");
        write_file(&mem.join("memory.limit_in_bytes"), &memory)?;
        // A memory+swap limit equal to the memory limit leaves no room for swap. Without swap
        // accounting that file is absent, and swappiness 0 keeps the group out of swap.
        if !write_optional(&mem.join("memory.memsw.limit_in_bytes"), &memory)? {
            write_optional(&mem.join("memory.swappiness"), "0")?;
        }
        let pid_dir = self.dir("pids").expect("v1 pids is required");
        write_file(&pid_dir.join("pids.max"), &pids)?;
        if let Some(cpu) = self.dir("cpu") {
            // A new group's period is the kernel's default, which CPU_PERIOD_US is.
            write_file(&cpu.join("cpu.cfs_quota_us"), &quota.to_string())?;
        }
        Ok(())
    }

    /// The membership file of every directory, opened for writing: a single-threaded child
    /// writes "0" to each to join the cgroup before it drops privileges.
    ///
    /// On v1 this is `tasks`, not `cgroup.procs`: a thread moving *itself* through `tasks`
    /// skips the global `cgroup_threadgroup_rwsem`, whose write lock waits for an RCU grace
    /// period (5-25 ms measured here, against 0.3 ms). For a single-threaded process, moving
    /// its only thread moves the process.
    pub fn join_files(&self) -> io::Result<Vec<OwnedFd>> {
        let file = if self.version == 2 {
            "cgroup.procs"
        } else {
            "tasks"
        };
        self.dirs
            .iter()
            .map(|(_, d)| {
                fs::OpenOptions::new()
                    .write(true)
                    .open(d.join(file))
                    .map(OwnedFd::from)
            })
            .collect()
    }

    /// The file that counts the OOM kills of this cgroup (`memory.events` on v2,
    /// `memory.oom_control` on v1).
    fn oom_events_path(&self) -> Option<PathBuf> {
        let (dir, file) = if self.version == 2 {
            (self.dir("unified"), "memory.events")
        } else {
            (self.dir("memory"), "memory.oom_control")
        };
        dir.map(|d| d.join(file))
    }

    /// How many times the kernel's OOM killer killed a process of this cgroup.
    pub fn oom_kills(&self) -> u64 {
        self.oom_events_path()
            .and_then(|p| fs::read_to_string(p).ok())
            .map_or(0, |s| parse_oom_kills(&s))
    }

    /// [`Cgroup::oom_events_path`] opened for reading, for [`read_oom_kills`].
    pub fn open_oom_events(&self) -> io::Result<fs::File> {
        let path = self
            .oom_events_path()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no memory controller"))?;
        fs::File::open(path)
    }

    /// CPU time used by every process that ever ran in the cgroup.
    pub fn cpu_time(&self) -> Option<Duration> {
        self.meter().cpu_time()
    }

    /// What reads this cgroup's usage without owning it.
    pub fn meter(&self) -> Meter {
        Meter {
            version: self.version,
            cpu: self.dir("cpuacct").map(Path::to_path_buf),
            memory: self.dir("memory").map(Path::to_path_buf),
        }
    }

    /// Peak memory use of the whole tree, where the kernel records it.
    pub fn peak_memory(&self) -> Option<u64> {
        let (dir, file) = if self.version == 2 {
            (self.dir("unified")?, "memory.peak")
        } else {
            (self.dir("memory")?, "memory.max_usage_in_bytes")
        };
        fs::read_to_string(dir.join(file)).ok()?.trim().parse().ok()
    }

    fn procs(&self) -> Vec<i32> {
        let dir = if self.version == 2 {
            self.dir("unified")
        } else {
            self.dir("pids")
        };
        dir.and_then(|d| fs::read_to_string(d.join("cgroup.procs")).ok())
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Kills every process in the cgroup. v2 uses `cgroup.kill` where the kernel has it;
    /// otherwise the group is frozen first so nothing can fork while it is being killed.
    pub fn kill_all(&self) {
        if self.version == 2 {
            let dir = self.dir("unified").expect("v2 cgroup has its directory");
            if write_file(&dir.join("cgroup.kill"), "1").is_ok() {
                return;
            }
        }
        let _ = self.freeze(KILL_FREEZE_WAIT);
        self.signal_all();
        let _ = self.thaw();
    }

    /// Freezes every process of the cgroup (v2 `cgroup.freeze`, v1 the freezer controller)
    /// and waits up to `wait` until the kernel reports the whole group frozen: frozen
    /// processes use no CPU and keep their memory. A group not frozen in time is left
    /// freezing, with [`FreezeError::Timeout`]: the caller thaws it or kills it.
    pub fn freeze(&self, wait: Duration) -> Result<(), FreezeError> {
        let (file, frozen) = self.freezer()?;
        write_file(&file, frozen).map_err(FreezeError::Write)?;
        let until = Instant::now() + wait;
        loop {
            if self.is_frozen()? {
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(FreezeError::Timeout(wait));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// [`Cgroup::freeze`], with a guard that thaws the group again if this process dies
    /// while it is frozen: a process outside the sandbox that waits for this one to go away.
    /// On cgroup v1 a frozen process cannot die, not even of SIGKILL, until it is thawed; so
    /// without the guard a host that was killed would leave a paused sandbox's processes on
    /// the host for good (their init kills them when the host goes, and the kill waits for a
    /// thaw no one would make). Dropping the guard ends it (it thaws the group as it goes).
    pub fn freeze_guarded(&self, wait: Duration) -> Result<ThawGuard, FreezeError> {
        let (file, _) = self.freezer()?;
        let thawed: &'static [u8] = if self.version == 2 { b"0" } else { b"THAWED" };
        let state = fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .map_err(FreezeError::Write)?;
        let (host_gone, host_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| FreezeError::Guard(e.into()))?;
        let mut keep = [host_gone.as_raw_fd() as u32, state.as_raw_fd() as u32];
        keep.sort_unstable();
        // SAFETY: the child only makes system calls on descriptors and memory prepared above
        // (`keep`, `thawed`), allocates nothing, and ends in `_exit`: what a child of a
        // multithreaded process may do.
        let child = match unsafe { nix::unistd::fork() } {
            Err(e) => return Err(FreezeError::Guard(e.into())),
            Ok(nix::unistd::ForkResult::Child) => {
                crate::sys::close_all_except_sorted(&keep);
                let mut byte = [0u8; 1];
                // Returns once every write end is closed: the host released the guard, or died.
                // SAFETY: read into a valid one-byte buffer; write from a static slice.
                unsafe {
                    while libc::read(host_gone.as_raw_fd(), byte.as_mut_ptr().cast(), 1) != 0 {
                        if *libc::__errno_location() != libc::EINTR {
                            break;
                        }
                    }
                    libc::write(state.as_raw_fd(), thawed.as_ptr().cast(), thawed.len());
                    libc::_exit(0)
                }
            }
            Ok(nix::unistd::ForkResult::Parent { child }) => child,
        };
        drop((host_gone, state));
        let guard = ThawGuard {
            child,
            host_end: Some(host_end),
        };
        self.freeze(wait)?;
        Ok(guard)
    }

    /// Thaws the group (see [`Cgroup::freeze`]).
    pub fn thaw(&self) -> Result<(), FreezeError> {
        let (file, _) = self.freezer()?;
        let thawed = if self.version == 2 { "0" } else { "THAWED" };
        write_file(&file, thawed).map_err(FreezeError::Write)
    }

    /// Whether the kernel reports every process of the group frozen.
    pub fn is_frozen(&self) -> Result<bool, FreezeError> {
        if self.version == 2 {
            let dir = self.dir("unified").ok_or(FreezeError::NoFreezer)?;
            let events =
                fs::read_to_string(dir.join("cgroup.events")).map_err(FreezeError::Read)?;
            return Ok(events.lines().any(|l| l.trim() == "frozen 1"));
        }
        let (file, _) = self.freezer()?;
        let state = fs::read_to_string(file).map_err(FreezeError::Read)?;
        Ok(state.trim() == "FROZEN")
    }

    /// The file that freezes the group and the value that does.
    fn freezer(&self) -> Result<(PathBuf, &'static str), FreezeError> {
        if self.version == 2 {
            let dir = self.dir("unified").ok_or(FreezeError::NoFreezer)?;
            return Ok((dir.join("cgroup.freeze"), "1"));
        }
        let dir = self.dir("freezer").ok_or(FreezeError::NoFreezer)?;
        Ok((dir.join("freezer.state"), "FROZEN"))
    }

    fn signal_all(&self) {
        for pid in self.procs() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    /// Removes the cgroup directories, killing stragglers first. Waits (briefly) for exiting
    /// processes to leave; a directory that cannot be removed is reported on stderr.
    pub fn destroy(&mut self) {
        if !self.procs().is_empty() {
            self.kill_all();
        }
        // Processes with large address spaces take a while to exit on a loaded host (a server
        // tearing its warm pool down at once); past this, the next Corral process of this
        // user sweeps the empty cgroup (`Layout::sweep_stale`).
        let until = Instant::now() + Duration::from_secs(10);
        for (_, dir) in self.dirs.drain(..).rev() {
            loop {
                match fs::remove_dir(&dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    // Busy while the last processes leave; any other error is final.
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < until => {
                        std::thread::sleep(Duration::from_millis(2))
                    }
                    Err(e) => {
                        eprintln!("corral: could not remove cgroup {}: {e}", dir.display());
                        break;
                    }
                }
            }
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        self.destroy();
    }
}

/// The OOM kills counted in the contents of `memory.events` or `memory.oom_control`.
fn parse_oom_kills(events: &str) -> u64 {
    events
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// The OOM kills counted now in a file from [`Cgroup::open_oom_events`] (read from its start).
pub fn read_oom_kills(events: &fs::File) -> u64 {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 1024];
    let n = events.read_at(&mut buf, 0).unwrap_or(0);
    parse_oom_kills(&String::from_utf8_lossy(&buf[..n]))
}

fn write_file(path: &Path, value: &str) -> io::Result<()> {
    let mut f = fs::OpenOptions::new().write(true).open(path)?;
    f.write_all(value.as_bytes()).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("writing {value:?} to {}: {e}", path.display()),
        )
    })
}

/// Writes `value` to `path` if the kernel offers that file; tells whether it did.
fn write_optional(path: &Path, value: &str) -> io::Result<bool> {
    match write_file(path, value) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_MOUNTINFO: &str = "\
35 25 0:30 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
36 35 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
37 35 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
38 35 0:33 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
39 35 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
40 35 0:35 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn v1_hybrid_without_v2_controllers_is_v1() {
        let layout = Layout::from_mountinfo(V1_MOUNTINFO, |_| Some(String::new())).unwrap();
        let Layout::V1(list) = layout else {
            panic!("expected v1")
        };
        let names: Vec<_> = list.iter().map(|(c, _)| c.as_str()).collect();
        assert_eq!(names, ["cpu", "cpuacct", "memory", "pids", "freezer"]);
        assert_eq!(list[0].1, list[1].1, "co-mounted controllers share a mount");
        assert_eq!(list[2].1, PathBuf::from("/sys/fs/cgroup/memory"));
    }

    #[test]
    fn v2_with_memory_and_pids_wins() {
        let info = "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let layout =
            Layout::from_mountinfo(info, |_| Some("cpuset cpu io memory pids".into())).unwrap();
        assert_eq!(layout, Layout::V2(PathBuf::from("/sys/fs/cgroup")));
        assert!(Layout::from_mountinfo(info, |_| Some("cpu io".into())).is_none());
    }

    #[test]
    fn no_cgroups_is_none() {
        let info = "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n";
        assert!(Layout::from_mountinfo(info, |_| None).is_none());
    }

    /// A fake v1 tree: the files the kernel would provide in each new directory are created
    /// by the test, since a plain directory has none.
    #[test]
    fn v1_limits_are_written_to_each_controller() {
        let root = tempfile::tempdir().unwrap();
        let list: Vec<_> = ["memory", "pids", "cpu", "freezer"]
            .iter()
            .map(|c| (c.to_string(), root.path().join(c)))
            .collect();
        for (c, mount) in &list {
            let dir = mount.join("corral/sbx");
            fs::create_dir_all(&dir).unwrap();
            let files: &[&str] = match c.as_str() {
                "memory" => &["memory.limit_in_bytes", "memory.oom_control"],
                "pids" => &["pids.max", "cgroup.procs"],
                "cpu" => &["cpu.cfs_period_us", "cpu.cfs_quota_us"],
                _ => &["freezer.state"],
            };
            for f in files {
                fs::write(dir.join(f), "").unwrap();
            }
        }
        let cg = Cgroup {
            version: 1,
            dirs: list
                .iter()
                .map(|(c, m)| (vec![c.clone()], m.join("corral/sbx")))
                .collect(),
        };
        let limits = Limits {
            memory_bytes: 64 << 20,
            pids: 32,
            cpus: 0.5,
            ..Limits::default()
        };
        cg.apply(&limits).unwrap();
        let read = |p: &str| fs::read_to_string(root.path().join(p)).unwrap();
        assert_eq!(read("memory/corral/sbx/memory.limit_in_bytes"), "67108864");
        assert_eq!(read("pids/corral/sbx/pids.max"), "32");
        assert_eq!(read("cpu/corral/sbx/cpu.cfs_quota_us"), "50000");
        fs::write(
            root.path().join("memory/corral/sbx/memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
        )
        .unwrap();
        assert_eq!(cg.oom_kills(), 3);
        // Without swap accounting (no memsw file) swappiness keeps the group out of swap;
        // with it, the memsw limit does and swappiness is left alone.
        let memory = root.path().join("memory/corral/sbx");
        fs::write(memory.join("memory.swappiness"), "").unwrap();
        cg.apply(&limits).unwrap();
        assert_eq!(read("memory/corral/sbx/memory.swappiness"), "0");
        fs::write(memory.join("memory.swappiness"), "").unwrap();
        fs::write(memory.join("memory.memsw.limit_in_bytes"), "").unwrap();
        cg.apply(&limits).unwrap();
        assert_eq!(
            read("memory/corral/sbx/memory.memsw.limit_in_bytes"),
            "67108864"
        );
        assert_eq!(read("memory/corral/sbx/memory.swappiness"), "");
        std::mem::forget(cg); // the fake files make rmdir fail; the tempdir cleans up
    }

    #[test]
    fn the_cpu_weight_goes_to_the_corral_parent() {
        let root = tempfile::tempdir().unwrap();
        let v1 = Layout::V1(vec![
            ("memory".into(), root.path().join("memory")),
            ("cpu".into(), root.path().join("cpu")),
        ]);
        for c in ["memory", "cpu/corral"] {
            fs::create_dir_all(root.path().join(c)).unwrap();
        }
        fs::write(root.path().join("cpu/corral/cpu.shares"), "").unwrap();
        v1.set_cpu_weight(CpuWeight::new(2000).unwrap()).unwrap();
        let shares = fs::read_to_string(root.path().join("cpu/corral/cpu.shares")).unwrap();
        assert_eq!(shares, "20480");
        // Without a cpu controller there is nothing to weigh: an error, not a silent no-op.
        let no_cpu = Layout::V1(vec![("memory".into(), root.path().join("memory"))]);
        assert!(no_cpu.set_cpu_weight(CpuWeight::new(100).unwrap()).is_err());
        assert_eq!(CpuWeight::new(0), None);
        assert_eq!(CpuWeight::new(10_001), None);
    }

    #[test]
    fn v2_limits_go_to_one_directory() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("corral/sbx");
        fs::create_dir_all(&dir).unwrap();
        for f in ["memory.max", "pids.max", "cpu.max", "memory.events"] {
            fs::write(dir.join(f), "").unwrap();
        }
        let cg = Cgroup {
            version: 2,
            dirs: vec![(vec!["unified".into()], dir.clone())],
        };
        cg.apply(&Limits::default()).unwrap();
        assert_eq!(
            fs::read_to_string(dir.join("memory.max")).unwrap(),
            (512u64 << 20).to_string()
        );
        assert_eq!(
            fs::read_to_string(dir.join("cpu.max")).unwrap(),
            "100000 100000"
        );
        assert!(!dir.join("memory.swap.max").exists());
        fs::write(
            dir.join("memory.events"),
            "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n",
        )
        .unwrap();
        assert_eq!(cg.oom_kills(), 1);
        std::mem::forget(cg);
    }

    #[test]
    fn removal_gives_up_at_once_on_a_directory_it_cannot_remove() {
        // As a rootless process meeting root's leftover cgroup (EACCES), here a non-empty
        // directory (ENOTEMPTY): only EBUSY, processes still leaving, is worth waiting for.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("kept"), b"").unwrap();
        let mut cgroup = Cgroup {
            version: 1,
            dirs: vec![(vec!["memory".into()], dir.path().to_path_buf())],
        };
        let started = Instant::now();
        cgroup.destroy();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "retried for {:?}",
            started.elapsed()
        );
        assert!(dir.path().join("kept").exists());
    }
}
