//! The host side of one sandbox: create it, release the program, collect its output and
//! status within the limits, and tear everything down.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Once, OnceLock};
use std::time::{Duration, Instant};

use corral_egress::{proxy_environment, EgressProxy, NetworkReport};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, Signal};
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use nix::unistd::{ForkResult, Gid, Pid, Uid};

use crate::cgroup::{Cgroup, Layout};
use crate::charge::Charge;
use crate::child::{self, ChildPlan, MSG_CGROUP, MSG_EXIT, MSG_INIT_PID, MSG_PROXY, MSG_READY};
use crate::ids::{HostIds, IdLease, Subordinate};
use crate::landlock_rules;
use crate::owner::Owner;
use crate::result::{ExecutionResult, Status};
use crate::rootfs::{self, Entry};
use crate::seccomp;
use crate::session::MSG_AGENT;
use crate::setup::{ChildFailure, MSG_ERROR};
use crate::spec::{
    base_environment, workload_rlimits, zygote_rlimits, ControlSocket, Limits, Policy, Role,
    SandboxSpec,
};
use crate::workspace::{Workspace, WorkspaceError};

/// Room in the root tmpfs for the synthetic files and mount points, beyond the program file.
const ROOT_TMPFS_SLACK: u64 = 4 << 20;
/// How long to wait for pipes to close after the sandbox was killed.
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(2);

/// What runtimes print when an allocation fails (compared without case): Python's
/// `MemoryError`, `strerror(ENOMEM)` and bash's `xmalloc: cannot allocate`, V8's "Allocation
/// failed - JavaScript heap out of memory", C++'s `std::bad_alloc`, GNU's "memory exhausted".
const OUT_OF_MEMORY_MARKERS: [&str; 6] = [
    "memoryerror",
    "cannot allocate",
    "out of memory",
    "allocation failed",
    "bad_alloc",
    "memory exhausted",
];

/// How much of the end of stderr is searched for [`OUT_OF_MEMORY_MARKERS`].
const OUT_OF_MEMORY_TAIL: usize = 16 << 10;

/// Whether a failed program ran into `RLIMIT_DATA`, the memory limit of the rlimit fallback
/// (no cgroup, so no OOM kill to observe): its peak memory, which the host measures, reached
/// at least half of `limit`, and it failed as programs do when an allocation is refused
/// (the end of `output`, its stderr, says so, or it died of SIGSEGV, SIGBUS or SIGABRT). The
/// peak is the largest single process's resident size (`ru_maxrss`, or `VmHWM` of a live
/// session kernel), and the rlimit bounds each process's data segment alone: a program that
/// fails with half the limit resident is taken to have reached it (its interpreter and
/// libraries are resident but not counted; its reserved but untouched memory is counted but
/// not resident). One-shot runs and session executions are judged by this one rule.
pub fn hit_rlimit_data(limit: u64, peak: u64, signal: Option<i32>, output: &[u8]) -> bool {
    if limit == 0 || peak < limit / 2 {
        return false;
    }
    if matches!(signal, Some(libc::SIGSEGV | libc::SIGBUS | libc::SIGABRT)) {
        return true;
    }
    let tail = String::from_utf8_lossy(&output[output.len().saturating_sub(OUT_OF_MEMORY_TAIL)..])
        .to_lowercase();
    OUT_OF_MEMORY_MARKERS.iter().any(|m| tail.contains(m))
}

/// The sentence reported when [`hit_rlimit_data`] holds.
pub fn rlimit_data_message(limit: u64) -> String {
    format!(
        "the program reached the {} MiB memory limit and an allocation failed \
         (no cgroup here: the limit is RLIMIT_DATA, per process)",
        limit >> 20
    )
}

/// The largest peak resident size (`VmHWM`) among the live children of `init` (a sandbox's
/// or a session's init, whose children are its program or kernel and the orphans it
/// adopted), read from the host's `/proc`: what [`hit_rlimit_data`] needs of a process that
/// has not ended. A pid that is no longer `init`'s child by the time its status is read
/// (gone, and reused) is skipped. `init` must be alive (not reaped), or its pid could name
/// another process.
pub fn children_peak_memory(init: Pid) -> Option<u64> {
    let children = std::fs::read_to_string(format!("/proc/{init}/task/{init}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(str::trim)
            };
            if field("PPid:")? != init.to_string() {
                return None;
            }
            let kib: u64 = field("VmHWM:")?.strip_suffix("kB")?.trim().parse().ok()?;
            Some(kib * 1024)
        })
        .max()
}

/// Why a sandbox was not made or its program did not start: one variant per step of the
/// host's, and [`SandboxError::Child`] for a step of the sandbox's own processes.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A protection cannot be applied and the policy does not allow running without it.
    #[error("refusing to run: {0}")]
    Refused(String),
    /// The kernel would not make the sandbox's namespaces.
    #[error("refusing to run: {}: {source}", child::NAMESPACES_FAILED)]
    Namespaces {
        #[source]
        source: io::Error,
    },
    /// The host could not map the sandbox user into its user namespace (or tell init it has).
    #[error("sandbox setup failed: mapping the sandbox user: {0}")]
    UserMap(#[source] io::Error),
    /// Rootless with subordinate ids: a helper did not map the sandbox's ids. The sandbox is
    /// refused, never run as the caller instead.
    #[error("mapping the sandbox's subordinate ids: {0}")]
    IdMap(#[from] crate::subids::MapError),
    /// No cgroup could be made for the sandbox, and the policy forbids running without.
    #[error(
        "refusing to run: cannot create a cgroup ({source}) and --strict forbids the rlimit \
         fallback"
    )]
    NoCgroup {
        #[source]
        source: io::Error,
    },
    /// The sandbox's cgroup was made but could not be handed to it.
    #[error("sandbox setup failed: {what}: {source}")]
    Cgroup {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// A setup step of the sandbox's own processes failed, as they reported it.
    #[error("sandbox setup failed: {0}")]
    Child(#[from] ChildFailure),
    /// The sandbox's setup processes ended (or sent something else) without a report.
    #[error("sandbox setup failed: the sandbox's setup processes exited without reporting")]
    Unreported,
    #[error("sandbox setup failed: starting the egress proxy: {0}")]
    EgressProxy(#[source] io::Error),
    #[error("sandbox setup failed: copying an input file: {0}")]
    InputFile(#[source] WorkspaceError),
    /// The workload ended before it handed over its process agent.
    #[error(
        "sandbox setup failed: the sandbox's workload ended without starting its process agent"
    )]
    NoAgent,
    /// A program started another way than [`Sandbox`]'s (see [`Supervised`]) did not start:
    /// that way's own error.
    #[error(transparent)]
    Start(Box<dyn std::error::Error + Send + Sync>),
    /// The host's own plumbing (pipes, sockets, a fork) failed.
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

impl SandboxError {
    fn io(what: &'static str) -> impl FnOnce(nix::errno::Errno) -> SandboxError {
        move |e| SandboxError::Io {
            what,
            source: e.into(),
        }
    }
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// How a sandbox ended.
#[derive(Debug)]
pub struct Outcome {
    pub status: Status,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: Capture,
    pub stderr: Capture,
    pub execution_time: Duration,
    pub cpu_time: Duration,
    pub peak_memory_bytes: u64,
    pub error_message: Option<String>,
    /// What the egress proxy did, when the sandbox had one.
    pub network: Option<NetworkReport>,
}

impl Outcome {
    /// The one-shot result of a run with these `warnings` that left `workspace`.
    pub fn into_result(self, workspace: &Workspace, mut warnings: Vec<String>) -> ExecutionResult {
        let files = workspace.list().unwrap_or_else(|e| {
            warnings.push(format!("listing the workspace failed: {e}"));
            Vec::new()
        });
        if let Some(limit) = self.network.as_ref().and_then(|n| n.limit_reached.as_ref()) {
            warnings.push(format!("egress: {limit}"));
        }
        ExecutionResult {
            status: self.status,
            exit_code: self.exit_code,
            signal: self.signal,
            stdout: self.stdout.text(),
            stderr: self.stderr.text(),
            stdout_truncated: self.stdout.truncated,
            stderr_truncated: self.stderr.truncated,
            results: Vec::new(),
            error: None,
            files,
            execution_time_ms: self.execution_time.as_millis() as u64,
            cpu_time_ms: self.cpu_time.as_millis() as u64,
            peak_memory_bytes: self.peak_memory_bytes,
            error_message: self.error_message,
            warnings,
            network: self.network,
            reservation: Default::default(),
        }
    }
}

/// The first `limit` bytes of a stream, and whether more was dropped.
#[derive(Debug, Default)]
pub struct Capture {
    pub bytes: Vec<u8>,
    pub truncated: bool,
    limit: usize,
}

impl Capture {
    fn new(limit: usize) -> Self {
        Capture {
            bytes: Vec::new(),
            truncated: false,
            limit,
        }
    }

    /// Keeps what fits and returns it (the part worth forwarding live).
    fn push<'a>(&mut self, chunk: &'a [u8]) -> &'a [u8] {
        let room = self.limit.saturating_sub(self.bytes.len());
        if chunk.len() > room {
            self.truncated = true;
        }
        let kept = &chunk[..chunk.len().min(room)];
        self.bytes.extend_from_slice(kept);
        kept
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// Rootless with subordinate ids: opens the user namespace of `pid` (made by this process's
/// uid and not yet mapped, so still this user's to open) and maps the ids of `lease` into it
/// with the helpers.
fn map_subordinate(
    sub: &Subordinate,
    pid: Pid,
    lease: &IdLease,
    zygote: bool,
) -> Result<Arc<OwnedFd>, SandboxError> {
    let userns = nix::fcntl::open(
        format!("/proc/{pid}/ns/user").as_str(),
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(SandboxError::io("opening the sandbox's user namespace"))?;
    // SAFETY: open returned a new descriptor that nothing else owns.
    let userns = Arc::new(unsafe { OwnedFd::from_raw_fd(userns) });
    sub.map(pid, lease, zygote)?;
    Ok(userns)
}

/// The cgroup layout, detected once per process.
pub fn cgroup_layout() -> Option<&'static Layout> {
    static LAYOUT: OnceLock<Option<Layout>> = OnceLock::new();
    LAYOUT.get_or_init(Layout::detect).as_ref()
}

/// Removes, once per process, the cgroups that killed Corral processes left behind
/// ([`Layout::sweep_stale`]). Later calls return at once.
pub fn sweep_stale_cgroups_once() {
    static SWEPT: Once = Once::new();
    SWEPT.call_once(|| {
        if let Some(layout) = cgroup_layout() {
            layout.sweep_stale();
        }
    });
}

/// A name for a sandbox or session cgroup: `<pid>-<counter>-<nanos>` (the owner pid lets
/// a later process recognize what a killed one left behind).
pub fn unique_name() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{}-{}-{nanos:x}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn cstrings(items: impl IntoIterator<Item = String>) -> Result<Vec<CString>, SandboxError> {
    items
        .into_iter()
        .map(|s| {
            CString::new(s).map_err(|_| {
                SandboxError::Refused("argument or environment contains a NUL byte".into())
            })
        })
        .collect()
}

/// While alive, this (single-threaded, root) process's effective uid and gid are another's;
/// the saved ids stay root's, which dropping it takes back (with the capabilities).
struct EffectiveIds;

impl EffectiveIds {
    fn switch(uid: Uid, gid: Gid) -> nix::Result<EffectiveIds> {
        let keep = Gid::from_raw(u32::MAX);
        nix::unistd::setresgid(keep, gid, keep)?;
        let keep = Uid::from_raw(u32::MAX);
        if let Err(e) = nix::unistd::setresuid(keep, uid, keep) {
            let keep = Gid::from_raw(u32::MAX);
            let _ = nix::unistd::setresgid(keep, Gid::from_raw(0), keep);
            return Err(e);
        }
        Ok(EffectiveIds)
    }
}

impl Drop for EffectiveIds {
    fn drop(&mut self) {
        let (keep_uid, keep_gid) = (Uid::from_raw(u32::MAX), Gid::from_raw(u32::MAX));
        // The saved ids are root's: taking them back cannot fail.
        nix::unistd::setresuid(keep_uid, Uid::from_raw(0), keep_uid)
            .and_then(|()| nix::unistd::setresgid(keep_gid, Gid::from_raw(0), keep_gid))
            .expect("restoring root's effective ids");
    }
}

/// A new cgroup for one sandbox with `limits`; where none can be made and the policy allows
/// running without, `None` and the warning that says so.
pub fn sandbox_cgroup(
    limits: &crate::spec::Limits,
    policy: crate::spec::Policy,
) -> Result<(Option<Cgroup>, Option<String>), SandboxError> {
    let cgroup = match cgroup_layout() {
        Some(layout) => Cgroup::create(layout, &unique_name(), limits),
        None => Err(io::Error::new(
            io::ErrorKind::NotFound,
            "no cgroup v1 or v2 hierarchy with the memory and pids controllers is mounted",
        )),
    };
    match cgroup {
        Ok(cg) => Ok((Some(cg), None)),
        Err(source) if policy.strict => Err(SandboxError::NoCgroup { source }),
        Err(reason) => Ok((
            None,
            Some(format!(
                "cgroups unavailable ({reason}): memory and process limits are enforced \
                 with rlimits only (RLIMIT_DATA, RLIMIT_NPROC) and CPU only by the timeout"
            )),
        )),
    }
}

/// A running (or ready to run) sandbox. Dropping it kills whatever is left and removes
/// every trace of it.
#[derive(Debug)]
pub struct Sandbox {
    /// Rootless with subordinate ids: the sandbox's user namespace (the host's workspace
    /// operations join it; a zygote's sessions take ids it maps).
    userns: Option<Arc<OwnedFd>>,
    init: Pid,
    reaped: bool,
    cgroup: Option<Cgroup>,
    stdout: OwnedFd,
    stderr: OwnedFd,
    report: OwnedFd,
    /// The host's end of init's control socket (a SEQPACKET pair); closing it makes init
    /// kill everything. Shared only weakly ([`crate::ports::PortOpener`]).
    control: Option<Arc<OwnedFd>>,
    started: bool,
    /// The host's end of the program's fd 3, until taken.
    socket: Option<OwnedFd>,
    /// Set once init reports the sandbox ready.
    workspace: Option<Workspace>,
    warnings: Vec<String>,
    limits: crate::spec::Limits,
    /// The spec's `stop` descriptor (a duplicate), polled while the program runs.
    stop: Option<OwnedFd>,
    /// The egress proxy serving the sandbox's network policy, until the sandbox ends.
    egress: Option<EgressProxy>,
    /// Root mode, and rootless with subordinate ids: the lease on the sandbox's host ids,
    /// released (after `Drop` has killed and reaped everything) when the sandbox is dropped.
    id_lease: Option<IdLease>,
    /// The workload sends its process agent's socket once started, not yet received
    /// ([`SandboxSpec::process_agent`], [`Sandbox::take_agent`]).
    agent_awaited: bool,
}

/// Receives the bytes a program sends on its fd-3 socket.
pub type SocketSink<'a> = &'a mut dyn FnMut(&[u8]);

/// What init said on the report socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// The program exited with this raw wait status; init has killed everything else.
    Exited(i32),
    /// A setup step failed (e.g. the program could not be executed).
    SetupError(ChildFailure),
    /// init sent something else than a report.
    Garbled,
    /// init is gone without a report.
    Closed,
}

/// Resource use and cause of death, read after the sandbox has ended.
#[derive(Debug, Clone)]
pub struct Finish {
    pub cpu_time: Duration,
    pub peak_memory_bytes: u64,
    /// The kernel's OOM killer killed a process of this sandbox.
    pub oom_killed: bool,
    /// What the egress proxy did, when the sandbox had one (it is stopped by then).
    pub network: Option<NetworkReport>,
}

impl Sandbox {
    /// Builds the sandbox up to the point where the program would start: namespaces, root
    /// filesystem and cgroup exist, input files are in the workspace. Call [`Sandbox::wait`]
    /// to start the program.
    pub fn create(spec: &SandboxSpec) -> Result<Sandbox, SandboxError> {
        Sandbox::build(spec, false)
    }

    /// [`Sandbox::create`]; with `start_at_once`, init starts the program as soon as the root
    /// is built instead of waiting for [`Sandbox::start`], which saves a round trip through
    /// the host. Only for a caller that starts the program right away and has nothing to put
    /// into the workspace first.
    fn build(spec: &SandboxSpec, start_at_once: bool) -> Result<Sandbox, SandboxError> {
        debug_assert!(!start_at_once || spec.input_files.is_empty());
        if spec.process_agent && spec.role != Role::Workload {
            return Err(SandboxError::Refused(
                "only a workload has a process agent (a zygote's sessions start their own)".into(),
            ));
        }
        let workload_filters = seccomp::filters(spec.role);
        let init_filters = seccomp::init_filters();
        let host_ids = crate::ids::host_ids();
        let warnings: Vec<String> = landlock_warning(spec.policy)?
            .into_iter()
            .chain(crate::ids::warning())
            .collect();
        let root_mode = matches!(host_ids, HostIds::Root(_));
        let subordinate = match host_ids {
            HostIds::Subordinate(sub) => Some(sub),
            _ => None,
        };
        let limits = spec.limits;

        let run_files: Vec<(&str, &[u8])> = spec
            .program_file
            .iter()
            .chain(&spec.support_files)
            .map(|(n, c)| (n.as_str(), c.as_slice()))
            .collect();
        let ops = rootfs::plan(
            &spec.rootfs,
            limits.disk_bytes,
            &run_files,
            spec.role == Role::Workload,
            Entry::of,
        );
        let root_size =
            ROOT_TMPFS_SLACK + run_files.iter().map(|(_, c)| c.len() as u64).sum::<u64>();

        let program_name = spec
            .argv
            .first()
            .ok_or_else(|| SandboxError::Refused("empty command".into()))?;
        let exec_candidates = if program_name.starts_with('/') {
            vec![program_name.clone()]
        } else {
            ["/usr/local/bin", "/usr/bin", "/bin"]
                .iter()
                .map(|d| format!("{d}/{program_name}"))
                .collect()
        };
        let mut env = base_environment(&limits);
        let proxy_endpoint = !spec.egress.policy.is_none();
        if proxy_endpoint {
            env.extend(proxy_environment());
        }
        for (k, v) in &spec.env {
            crate::env::check_var(k, v).map_err(|e| SandboxError::Refused(e.to_string()))?;
            env.retain(|(existing, _)| existing != k);
            env.push((k.clone(), v.clone()));
        }

        let (stdout_r, stdout_w) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(SandboxError::io("pipe"))?;
        let (stderr_r, stderr_w) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(SandboxError::io("pipe"))?;
        crate::sys::ensure_stdio_open();
        // A socket rather than a pipe: the host's requests to init carry descriptors
        // (crate::ports).
        let (control_w, control_r) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(SandboxError::io("socketpair"))?;
        let socket = match spec.control_socket {
            None => None,
            Some(kind) => Some(
                socketpair(
                    AddressFamily::Unix,
                    match kind {
                        ControlSocket::Stream => SockType::Stream,
                        ControlSocket::SeqPacket => SockType::SeqPacket,
                    },
                    None,
                    SockFlag::SOCK_CLOEXEC,
                )
                .map_err(SandboxError::io("socketpair"))?,
            ),
        };
        let (report, report_child) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(SandboxError::io("socketpair"))?;

        let id_lease = match host_ids {
            HostIds::Root(pool) => Some(pool.acquire()),
            HostIds::Subordinate(sub) => Some(sub.pool.acquire()),
            HostIds::Caller { .. } => None,
        }
        .transpose()
        .map_err(|source| SandboxError::Io {
            what: "leasing a host uid for the sandbox",
            source,
        })?;
        // Root mode switches to the leased ids itself; rootless, the helpers map them.
        let switch_to = id_lease
            .as_ref()
            .filter(|_| root_mode)
            .map(|lease| (Uid::from_raw(lease.uid()), Gid::from_raw(lease.gid())));
        // Root mode: a zygote stays in the host's user namespace (see ChildPlan::host_userns).
        let host_userns = root_mode && spec.role == Role::Zygote;
        let plan = ChildPlan {
            runtime_dir: spec.runtime_dir.clone(),
            ops,
            switch_to,
            host_userns,
            host_maps: subordinate.is_some(),
            // A zygote's sessions each set their own share, below the zygote's namespace.
            inotify_limits: (!root_mode && spec.role == Role::Workload)
                .then_some(crate::spec::ROOTLESS_INOTIFY_LIMITS),
            report: report_child.as_raw_fd(),
            control: control_r.as_raw_fd(),
            socket: socket.as_ref().map(|(_, child)| child.as_raw_fd()),
            role: spec.role,
            stdin: spec.stdin.as_ref().map(AsRawFd::as_raw_fd),
            stdout: stdout_w.as_raw_fd(),
            stderr: stderr_w.as_raw_fd(),
            root_size,
            exec_candidates: cstrings(exec_candidates)?,
            argv: cstrings(spec.argv.iter().cloned())?,
            envp: cstrings(env.iter().map(|(k, v)| format!("{k}={v}")))?,
            rlimits: match spec.role {
                Role::Workload => workload_rlimits(&limits, true),
                Role::Zygote => zygote_rlimits(),
            },
            fallback_rlimits: match spec.role {
                Role::Workload => workload_rlimits(&limits, false),
                Role::Zygote => zygote_rlimits(),
            },
            landlock_required: !spec.policy.allow_degraded,
            workload_filters,
            init_filters,
            start_at_once,
            proxy_endpoint,
            cpus: nix::sched::sched_getaffinity(Pid::from_raw(0)).ok(),
            agent_env: spec.process_agent.then(|| env.clone()),
        };

        // A single-threaded host (the `corral run` command) clones init straight into the new
        // namespaces. Otherwise stage 1 does it: glibc's fork, unlike a raw clone, leaves
        // malloc usable in the child whatever locks other threads hold.
        let direct = crate::sys::single_threaded() && !host_userns;
        let first_child = if direct {
            // Root mode: a user namespace belongs to the effective uid that creates it, and
            // the kernel charges every per-user count inside it (inotify instances, message
            // queues, pending signals) to that owner at the host's level as well. Made by
            // root, a sandbox could use up root's own allowance on the host: the host makes
            // it as the sandbox's uid.
            let as_owner = switch_to
                .map(|(uid, gid)| EffectiveIds::switch(uid, gid))
                .transpose()
                .map_err(SandboxError::io(
                    "taking the sandbox's uid to create its namespaces",
                ))?;
            // SAFETY: this process has one thread. The child only runs
            // `child::init_in_namespaces`, which uses data prepared above and system calls,
            // and ends in _exit or exec.
            let cloned = unsafe { crate::sys::clone_process(child::NAMESPACES.bits()) };
            if matches!(cloned, Ok(0)) {
                child::init_in_namespaces(&plan);
            }
            drop(as_owner);
            match cloned {
                Err(source) => return Err(SandboxError::Namespaces { source }),
                Ok(0) => child::init_in_namespaces(&plan),
                Ok(pid) => Pid::from_raw(pid),
            }
        } else {
            // SAFETY: the child only runs `child::stage1`, which uses data prepared above
            // and system calls, and ends in _exit or exec.
            match unsafe { nix::unistd::fork() }.map_err(SandboxError::io("fork"))? {
                ForkResult::Child => child::stage1(&plan),
                ForkResult::Parent { child } => child,
            }
        };
        let socket = socket.map(|(host, child)| {
            drop(child);
            host
        });
        drop((stdout_w, stderr_w, control_r, report_child));

        let mut sandbox = Sandbox {
            userns: None,
            id_lease,
            init: Pid::from_raw(0),
            reaped: true,
            cgroup: None,
            stdout: stdout_r,
            stderr: stderr_r,
            report,
            control: Some(Arc::new(control_w)),
            started: start_at_once,
            socket,
            workspace: None,
            warnings,
            limits,
            egress: None,
            agent_awaited: spec.process_agent,
            stop: spec
                .stop
                .as_ref()
                .map(|fd| fd.try_clone())
                .transpose()
                .map_err(|source| SandboxError::Io {
                    what: "duplicating the stop descriptor",
                    source,
                })?,
        };
        let zygote = spec.role == Role::Zygote;
        if direct {
            sandbox.init = first_child;
            sandbox.reaped = false;
            // The host makes the cgroup next, while init builds the root elsewhere.
            if let Some(cpus) = &plan.cpus {
                child::move_off_this_cpu(first_child, cpus);
            }
            match (subordinate, &sandbox.id_lease) {
                (Some(sub), Some(lease)) => {
                    sandbox.userns = Some(map_subordinate(sub, first_child, lease, zygote)?);
                }
                _ => {
                    // Root mode maps the per-sandbox ids and lets init drop root's groups
                    // itself; rootless without subordinate ids, only the caller's own ids can
                    // be mapped, with setgroups denied.
                    let (uid, gid, deny_setgroups) = match switch_to {
                        Some((u, g)) => (u.as_raw(), g.as_raw(), false),
                        None => (
                            nix::unistd::geteuid().as_raw(),
                            nix::unistd::getegid().as_raw(),
                            true,
                        ),
                    };
                    child::write_id_maps(&format!("/proc/{first_child}"), uid, gid, deny_setgroups)
                        .map_err(SandboxError::UserMap)?;
                }
            }
            sandbox
                .send_control(&[child::MAPS_WRITTEN])
                .map_err(SandboxError::UserMap)?;
        } else if let (Some(sub), Some(lease)) = (subordinate, &sandbox.id_lease) {
            // Stage 1 has made the namespaces (or failed to) and waits for its maps.
            let mut buf = [0u8; 4096];
            let mapped = match sandbox.recv(&mut buf) {
                Ok((n, _)) => match &buf[..n] {
                    [child::MSG_UNSHARED] => map_subordinate(sub, first_child, lease, zygote)
                        .map(|userns| sandbox.userns = Some(userns)),
                    msg => {
                        Err(ChildFailure::decode(msg).map_or(SandboxError::Unreported, Into::into))
                    }
                },
                Err(e) => Err(e),
            }
            .and_then(|()| {
                sandbox
                    .send_control(&[child::MAPS_WRITTEN])
                    .map_err(SandboxError::UserMap)
            });
            if let Err(e) = mapped {
                let _ = kill(first_child, Signal::SIGKILL);
                child::reap(first_child);
                return Err(e);
            }
        }

        // Made while the namespaces are built, then sent to the workload to join.
        if let Err(e) = sandbox.send_cgroup(spec) {
            if direct {
                return Err(e); // dropping the sandbox kills and reaps init
            }
            // Dropping the sandbox kills and reaps init, once stage 1 has said which it is.
            let mut buf = [0u8; 16];
            while let Ok((n, _)) = sandbox.recv(&mut buf) {
                match buf.get(..n) {
                    Some([MSG_INIT_PID, pid @ ..]) if pid.len() == 4 => {
                        let pid = i32::from_le_bytes(pid.try_into().expect("4 bytes"));
                        sandbox.init = Pid::from_raw(pid);
                        sandbox.reaped = false;
                        break;
                    }
                    Some([]) | None => break,
                    Some(_) => {}
                }
            }
            child::reap(first_child);
            return Err(e);
        }

        let mut buf = [0u8; 4096];
        // Stage 1 reports init's pid and init reports readiness; the two are different
        // processes, so the messages may arrive in either order. (Without stage 1 the host
        // knows init's pid already.)
        let handshake = (|| {
            let mut init_pid = direct.then_some(first_child);
            while init_pid.is_none()
                || sandbox.workspace.is_none()
                || (proxy_endpoint && sandbox.egress.is_none())
            {
                let (n, fd) = sandbox.recv(&mut buf)?;
                match (buf.get(..n), fd) {
                    (Some([MSG_INIT_PID, pid @ ..]), _) if pid.len() == 4 => {
                        let pid = i32::from_le_bytes(pid.try_into().expect("4 bytes"));
                        init_pid = Some(Pid::from_raw(pid));
                        sandbox.init = Pid::from_raw(pid);
                        sandbox.reaped = false;
                        child::reap(first_child);
                    }
                    (Some([MSG_READY]), Some(fd)) => {
                        let owner = match (switch_to, &sandbox.userns) {
                            (Some((uid, gid)), _) => Owner::Host {
                                uid: uid.as_raw(),
                                gid: gid.as_raw(),
                            },
                            (None, Some(userns)) => Owner::Namespace {
                                userns: userns.clone(),
                                uid: rootfs::SANDBOX_UID,
                                gid: rootfs::SANDBOX_GID,
                            },
                            (None, None) => Owner::Caller,
                        };
                        let charge = sandbox
                            .cgroup
                            .as_ref()
                            .map(|cg| Charge::new(cg, limits.memory_bytes))
                            .transpose()
                            .map_err(|source| SandboxError::Cgroup {
                                what: "opening the cgroup's membership files",
                                source,
                            })?;
                        sandbox.workspace = Some(Workspace::new(fd, owner, charge));
                    }
                    (Some(msg @ [MSG_ERROR, ..]), _) => {
                        return Err(
                            ChildFailure::decode(msg).map_or(SandboxError::Unreported, Into::into)
                        )
                    }
                    (Some([MSG_PROXY]), Some(fd)) if proxy_endpoint && sandbox.egress.is_none() => {
                        let proxy = EgressProxy::start(fd, spec.egress.clone(), limits.proxy())
                            .map_err(SandboxError::EgressProxy)?;
                        sandbox.egress = Some(proxy);
                    }
                    _ => {
                        if init_pid.is_none() {
                            child::reap(first_child);
                        }
                        return Err(SandboxError::Unreported);
                    }
                }
            }
            Ok(())
        })();
        handshake?;

        for input in &spec.input_files {
            let mut source = &input.source;
            sandbox
                .workspace()
                .write_file(&input.dest, &mut source)
                .map_err(SandboxError::InputFile)?;
        }
        Ok(sandbox)
    }

    /// Creates the sandbox's cgroup (or, where the policy allows, records why there is none)
    /// and sends stage 1 its membership files.
    fn send_cgroup(&mut self, spec: &SandboxSpec) -> Result<(), SandboxError> {
        let (cgroup, warning) = sandbox_cgroup(&spec.limits, spec.policy)?;
        self.cgroup = cgroup;
        self.warnings.extend(warning);
        let files = match &self.cgroup {
            Some(cg) => cg.join_files().map_err(|source| SandboxError::Cgroup {
                what: "opening the cgroup's membership files",
                source,
            })?,
            None => Vec::new(),
        };
        let raw: Vec<_> = files.iter().map(|f| f.as_raw_fd()).collect();
        crate::sys::send_fds(self.report.as_fd(), &[MSG_CGROUP], &raw).map_err(|source| {
            SandboxError::Cgroup {
                what: "sending the cgroup to the sandbox",
                source,
            }
        })
    }

    fn recv(&self, buf: &mut [u8]) -> Result<(usize, Option<OwnedFd>), SandboxError> {
        crate::sys::recv_message(self.report.as_fd(), buf).map_err(|source| SandboxError::Io {
            what: "reading the sandbox report",
            source,
        })
    }

    /// The sandbox's `/workspace`.
    pub fn workspace(&self) -> &Workspace {
        self.workspace.as_ref().expect("set when create returns")
    }

    /// Protections weaker than requested for this sandbox.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Rootless with subordinate ids: the sandbox's user namespace, whose owner (the caller)
    /// may join it. A zygote's maps the ids of its sessions ([`IdLease::zygote_id`]).
    pub fn user_namespace(&self) -> Option<&Arc<OwnedFd>> {
        self.userns.as_ref()
    }

    /// Starts the program (once).
    pub fn start(&mut self) -> Result<(), SandboxError> {
        if !self.started {
            self.send_control(b"g").map_err(|source| SandboxError::Io {
                what: "starting the program (the sandbox has ended)",
                source,
            })?;
            self.started = true;
        }
        Ok(())
    }

    /// The host's end of the sandbox's process agent's socket ([`SandboxSpec::process_agent`]),
    /// once: starts the program ([`Sandbox::start`]) and waits for the workload to hand it
    /// over, which it does before it runs anything of the program's. `None` for a sandbox
    /// without an agent, or once taken.
    pub fn take_agent(&mut self) -> Result<Option<OwnedFd>, SandboxError> {
        if !std::mem::take(&mut self.agent_awaited) {
            return Ok(None);
        }
        self.start()?;
        let mut buf = [0u8; 4096];
        let (n, fd) = self.recv(&mut buf)?;
        match (&buf[..n], fd) {
            ([MSG_AGENT], Some(fd)) => Ok(Some(fd)),
            (msg, _) => Err(ChildFailure::decode(msg).map_or(SandboxError::NoAgent, Into::into)),
        }
    }

    /// Sends SIGINT to the program (through init, which alone can address it).
    pub fn interrupt(&self) -> io::Result<()> {
        self.send_control(b"i")
    }

    fn send_control(&self, byte: &[u8]) -> io::Result<()> {
        let control = self
            .control
            .as_ref()
            .ok_or_else(|| io::Error::from(io::ErrorKind::BrokenPipe))?;
        nix::sys::socket::send(
            control.as_raw_fd(),
            byte,
            nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
        )?;
        Ok(())
    }

    /// Opens connections to the sandbox's listeners, until it ends.
    pub fn port_opener(&self) -> Option<crate::ports::PortOpener> {
        self.control.as_ref().map(crate::ports::PortOpener::new)
    }

    /// The host's end of the program's fd 3 (once).
    pub fn take_socket(&mut self) -> Option<OwnedFd> {
        self.socket.take()
    }

    pub fn stdout_fd(&self) -> BorrowedFd<'_> {
        self.stdout.as_fd()
    }

    pub fn stderr_fd(&self) -> BorrowedFd<'_> {
        self.stderr.as_fd()
    }

    /// Readable when init reports (see [`Sandbox::read_report`]).
    pub fn report_fd(&self) -> BorrowedFd<'_> {
        self.report.as_fd()
    }

    /// Reads one report from init; call when [`Sandbox::report_fd`] is readable.
    pub fn read_report(&mut self) -> Report {
        let mut buf = [0u8; 4096];
        match crate::sys::recv_message(self.report.as_fd(), &mut buf) {
            Ok((n, _)) if n > 0 => match &buf[..n] {
                [MSG_EXIT, status @ ..] if status.len() == 4 => {
                    Report::Exited(i32::from_le_bytes(status.try_into().expect("4 bytes")))
                }
                msg => ChildFailure::decode(msg).map_or(Report::Garbled, Report::SetupError),
            },
            _ => Report::Closed,
        }
    }

    /// Ends the sandbox (killing what still runs), reaps init and reads the resource use.
    pub fn finish(&mut self) -> Finish {
        // init exits by itself once the program is gone; closing the control pipe makes it
        // kill whatever is left first.
        self.control = None;
        // The cgroup holds the program's processes only (not init), all reaped once init has
        // reported the exit: it is read and removed while init's namespaces are torn down.
        // (Without a report, removing it kills and waits out what is left.)
        let cgroup = self.cgroup.take();
        let network = self.egress.take().map(|mut proxy| proxy.stop());
        let oom_killed = self.oom_killed_in(cgroup.as_ref());
        let peak_memory = cgroup.as_ref().and_then(Cgroup::peak_memory);
        // rusage misses processes the kernel reaped itself (a killed tree): prefer the cgroup.
        let cpu_time = cgroup.as_ref().and_then(Cgroup::cpu_time);
        drop(cgroup);
        let usage = self.reap_init();
        let peak_memory_bytes =
            peak_memory.unwrap_or(usage.map_or(0, |u| u.ru_maxrss.max(0) as u64 * 1024));
        let cpu_time = cpu_time.unwrap_or_else(|| {
            usage.map_or(Duration::ZERO, |u| {
                let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
                tv(u.ru_utime) + tv(u.ru_stime)
            })
        });
        Finish {
            cpu_time,
            peak_memory_bytes,
            oom_killed,
            network,
        }
    }

    /// Reads what the egress proxy does (none without a network policy).
    pub fn network_monitor(&self) -> Option<corral_egress::EgressMonitor> {
        self.egress.as_ref().map(EgressProxy::monitor)
    }

    /// Starts the program and waits for it to end (or for the timeout), passing output to
    /// `on_output` as it arrives, up to the output limit.
    pub fn wait(&mut self, on_output: &mut dyn FnMut(Stream, &[u8])) -> Outcome {
        self.wait_with_socket(on_output, None)
    }

    /// [`Sandbox::wait`], also passing every byte the program sends on its fd-3 socket (taken
    /// with [`Sandbox::take_socket`]) to `on_socket`.
    pub fn wait_with_socket(
        &mut self,
        on_output: &mut dyn FnMut(Stream, &[u8]),
        socket: Option<(BorrowedFd<'_>, SocketSink<'_>)>,
    ) -> Outcome {
        wait_for_program(self, on_output, socket)
    }

    /// CPU time used so far by every process of the sandbox, where a cgroup measures it.
    pub fn cpu_time(&self) -> Option<Duration> {
        self.cgroup.as_ref().and_then(Cgroup::cpu_time)
    }

    /// The sandbox's cgroup; `None` in the rlimit fallback.
    pub fn cgroup(&self) -> Option<&Cgroup> {
        self.cgroup.as_ref()
    }

    /// Peak memory of the sandbox so far: the cgroup's, or without one (the rlimit fallback)
    /// the largest peak of a live process of init's (see [`children_peak_memory`]).
    pub fn peak_memory(&self) -> Option<u64> {
        match &self.cgroup {
            Some(cgroup) => cgroup.peak_memory(),
            None if !self.reaped => children_peak_memory(self.init),
            None => None,
        }
    }

    /// Whether memory is bounded by `RLIMIT_DATA` alone (no cgroup: the rlimit fallback).
    /// Meaningful until [`Sandbox::finish`], which lets go of the cgroup.
    pub fn memory_rlimited(&self) -> bool {
        self.cgroup.is_none()
    }

    /// Whether the kernel's OOM killer has killed a process of this sandbox.
    pub fn oom_killed(&self) -> bool {
        self.oom_killed_in(self.cgroup.as_ref())
    }

    /// Whether the OOM killer killed a process of `cgroup` (the sandbox's) other than the
    /// writers of files the host put into its workspace.
    fn oom_killed_in(&self, cgroup: Option<&Cgroup>) -> bool {
        let writers = self
            .workspace
            .as_ref()
            .map_or(0, Workspace::writer_oom_kills);
        cgroup.map_or(0, Cgroup::oom_kills) > writers
    }

    /// Kills every process of the sandbox (init last: its death takes the pid namespace down).
    pub fn kill(&mut self) {
        if let Some(cg) = &self.cgroup {
            cg.kill_all();
        }
        if !self.reaped {
            let _ = kill(self.init, Signal::SIGKILL);
        }
    }

    fn reap_init(&mut self) -> Option<libc::rusage> {
        if self.reaped {
            return None;
        }
        // SAFETY: rusage is plain old data; all-zero is valid.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        loop {
            let mut status = 0;
            // SAFETY: wait4 writes into the valid status and rusage we pass.
            let rc = unsafe { libc::wait4(self.init.as_raw(), &mut status, 0, &mut usage) };
            if rc == self.init.as_raw() {
                self.reaped = true;
                return Some(usage);
            }
            if rc < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            self.reaped = true;
            return None;
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if !self.reaped {
            self.kill();
            self.reap_init();
        }
        // The cgroup's own Drop removes its directories.
    }
}

/// What a workload is told when this kernel has no Landlock (where `policy` allows running
/// without it; else the refusal).
pub fn landlock_warning(policy: Policy) -> Result<Option<String>, SandboxError> {
    if landlock_rules::kernel_abi() > 0 {
        return Ok(None);
    }
    if !policy.allow_degraded {
        return Err(SandboxError::Refused(
            "this kernel has no Landlock (needs Linux >= 5.13 booted with lsm=...,landlock); \
             pass --allow-degraded to run without this layer"
                .into(),
        ));
    }
    Ok(Some(
        "Landlock is unavailable on this kernel: the filesystem is protected by mounts and \
         permissions only"
            .into(),
    ))
}

/// A program started in a sandbox of its own, as [`wait_for_program`] drives it: a
/// [`Sandbox`], or a one-shot run forked from a zygote.
pub trait Supervised {
    fn limits(&self) -> &Limits;
    /// Lets the program run.
    fn start(&mut self) -> Result<(), SandboxError>;
    fn stdout_fd(&self) -> BorrowedFd<'_>;
    fn stderr_fd(&self) -> BorrowedFd<'_>;
    /// Readable when init reports (see [`Supervised::read_report`]) or is gone.
    fn report_fd(&self) -> BorrowedFd<'_>;
    fn read_report(&mut self) -> Report;
    /// Kills every process of the sandbox.
    fn kill(&mut self);
    /// After the program: what it used, read as the sandbox is torn down.
    fn finish(&mut self) -> Finish;
    /// Whether a cgroup bounds memory (else RLIMIT_DATA does, per process).
    fn has_cgroup(&self) -> bool;
    /// Readable when the caller wants the run stopped (see `SandboxSpec::stop`).
    fn stop_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
}

impl Supervised for Sandbox {
    fn limits(&self) -> &Limits {
        &self.limits
    }
    fn start(&mut self) -> Result<(), SandboxError> {
        Sandbox::start(self)
    }
    fn stdout_fd(&self) -> BorrowedFd<'_> {
        Sandbox::stdout_fd(self)
    }
    fn stderr_fd(&self) -> BorrowedFd<'_> {
        Sandbox::stderr_fd(self)
    }
    fn report_fd(&self) -> BorrowedFd<'_> {
        Sandbox::report_fd(self)
    }
    fn read_report(&mut self) -> Report {
        Sandbox::read_report(self)
    }
    fn kill(&mut self) {
        Sandbox::kill(self)
    }
    fn finish(&mut self) -> Finish {
        Sandbox::finish(self)
    }
    fn has_cgroup(&self) -> bool {
        !self.memory_rlimited()
    }
    fn stop_fd(&self) -> Option<BorrowedFd<'_>> {
        self.stop.as_ref().map(AsFd::as_fd)
    }
}

/// Starts the program and waits for it to end (or for its timeout, when it is killed with all
/// its processes), passing its output to `on_output` as it arrives, up to the output limit,
/// and every byte it sends on its fd-3 socket to `socket`'s sink: the one-shot run of
/// [`Sandbox::wait`], and of a run forked from a zygote.
pub fn wait_for_program(
    program: &mut dyn Supervised,
    on_output: &mut dyn FnMut(Stream, &[u8]),
    mut socket: Option<(BorrowedFd<'_>, SocketSink<'_>)>,
) -> Outcome {
    let limits = *program.limits();
    let started = Instant::now();
    let deadline = started + limits.timeout;
    let mut stdout = Capture::new(limits.output_bytes);
    let mut stderr = Capture::new(limits.output_bytes);
    if let Err(e) = program.start() {
        program.kill();
        program.finish();
        return Outcome {
            status: Status::SandboxError,
            exit_code: None,
            signal: None,
            stdout,
            stderr,
            execution_time: started.elapsed(),
            cpu_time: Duration::ZERO,
            peak_memory_bytes: 0,
            error_message: Some(e.to_string()),
            network: None,
        };
    }
    // The program is running and the host has nothing to do until it writes or exits:
    // the time to clean up after killed Corral processes (a thread of its own would cost
    // a short run more than the sweep itself).
    sweep_stale_cgroups_once();
    let mut open = [true, true, true, socket.is_some()]; // stdout, stderr, report, socket
    let mut exit_status = None;
    let mut setup_error = None;
    let mut timed_out = false;
    let mut stopped = false;
    let mut killed_at: Option<Instant> = None;
    let mut buf = vec![0u8; 64 << 10];
    while open[..3].iter().any(|o| *o) {
        let now = Instant::now();
        let wait_until = match killed_at {
            Some(t) => t + DRAIN_AFTER_KILL,
            None => deadline,
        };
        if now >= wait_until {
            if killed_at.is_some() {
                break;
            }
            timed_out = true;
            program.kill();
            killed_at = Some(now);
            continue;
        }
        let timeout = PollTimeout::try_from(wait_until - now).unwrap_or(PollTimeout::MAX);
        let mut fds = Vec::with_capacity(5);
        let mut which = Vec::with_capacity(5);
        let socket_fd = socket.as_ref().map(|(fd, _)| *fd);
        // The stop descriptor stays readable once it is: polled until it first is.
        let stop_fd = program.stop_fd().filter(|_| !stopped);
        for (i, fd) in [
            Some(program.stdout_fd()),
            Some(program.stderr_fd()),
            Some(program.report_fd()),
            socket_fd,
            stop_fd,
        ]
        .into_iter()
        .enumerate()
        {
            if let (true, Some(fd)) = (open.get(i).copied().unwrap_or(true), fd) {
                fds.push(PollFd::new(fd, PollFlags::POLLIN));
                which.push(i);
            }
        }
        match poll(&mut fds, timeout) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
        }
        let ready: Vec<usize> = fds
            .iter()
            .zip(&which)
            .filter(|(fd, _)| fd.revents().is_some_and(|r| !r.is_empty()))
            .map(|(_, &i)| i)
            .collect();
        for i in ready {
            if i == 4 {
                // The caller wants the run stopped: everything is killed, as on a timeout.
                stopped = true;
                if killed_at.is_none() {
                    program.kill();
                    killed_at = Some(Instant::now());
                }
                continue;
            }
            if i == 3 {
                let (fd, sink) = socket.as_mut().expect("polled only when present");
                match nix::unistd::read(fd.as_raw_fd(), &mut buf) {
                    Ok(0) | Err(_) => open[3] = false,
                    Ok(n) => sink(&buf[..n]),
                }
                continue;
            }
            if i == 2 {
                match program.read_report() {
                    Report::Closed => open[2] = false,
                    // init's last word: the host tears down while init exits.
                    Report::Exited(raw) => {
                        exit_status = Some(raw);
                        open[2] = false;
                    }
                    Report::SetupError(failure) => setup_error = Some(failure.to_string()),
                    Report::Garbled => setup_error = Some("init sent an unknown report".into()),
                }
                continue;
            }
            let fd = if i == 0 {
                program.stdout_fd()
            } else {
                program.stderr_fd()
            };
            match nix::unistd::read(fd.as_raw_fd(), &mut buf) {
                Ok(0) | Err(_) => open[i] = false,
                Ok(n) => {
                    let (capture, stream) = if i == 0 {
                        (&mut stdout, Stream::Stdout)
                    } else {
                        (&mut stderr, Stream::Stderr)
                    };
                    let kept = capture.push(&buf[..n]);
                    if !kept.is_empty() {
                        on_output(stream, kept);
                    }
                }
            }
        }
    }
    let execution_time = started.elapsed();
    if !open[2] && exit_status.is_none() && !timed_out {
        // init vanished without a report (killed from outside): make sure
        // nothing else is left.
        program.kill();
    }
    // Without a cgroup, memory is bounded by RLIMIT_DATA alone (the rlimit fallback).
    let rlimit_memory = !program.has_cgroup();
    let finish = program.finish();
    let (exit_code, signal) = match exit_status {
        Some(raw) => child::decode_status(raw),
        // Killed by the host (timeout, a stop) before init could report it: SIGKILL is what
        // ended it, whichever of the two went first.
        None if timed_out || stopped => (None, Some(libc::SIGKILL)),
        None => (None, None),
    };
    let (status, message) = if let Some(msg) = setup_error {
        (Status::SandboxError, Some(msg))
    } else if stopped {
        (
            Status::Error,
            Some("the run was stopped by its caller: the sandbox was killed and torn down".into()),
        )
    } else if timed_out {
        (
            Status::Timeout,
            Some(format!(
                "the program ran longer than the {:.1} s time limit and was killed with all its processes",
                limits.timeout.as_secs_f64()
            )),
        )
    } else if finish.oom_killed && exit_code != Some(0) {
        (
            Status::MemoryLimit,
            Some(format!(
                "the program exceeded the {} MiB memory limit and was killed",
                limits.memory_bytes >> 20
            )),
        )
    } else if exit_status.is_none() {
        (
            Status::SandboxError,
            Some("the sandbox's init ended without reporting the program's status".into()),
        )
    } else if exit_code == Some(0) {
        (Status::Success, None)
    } else if rlimit_memory
        && hit_rlimit_data(
            limits.memory_bytes,
            finish.peak_memory_bytes,
            signal,
            &stderr.bytes,
        )
    {
        (
            Status::MemoryLimit,
            Some(rlimit_data_message(limits.memory_bytes)),
        )
    } else {
        let how = match (exit_code, signal) {
            (Some(code), _) => format!("exited with code {code}"),
            (None, Some(sig)) => format!("was killed by signal {sig}"),
            _ => "ended abnormally".into(),
        };
        (Status::Error, Some(format!("the program {how}")))
    };
    Outcome {
        status,
        exit_code,
        signal,
        stdout,
        stderr,
        execution_time,
        cpu_time: finish.cpu_time,
        peak_memory_bytes: finish.peak_memory_bytes,
        error_message: message,
        network: finish.network,
    }
}

/// Runs `spec` to completion: the one-shot path of `corral run` and `POST /v1/run`.
/// Returns the result object and the workspace (for copying files out), which stays
/// readable until dropped. With `on_socket`, `spec` must ask for a control socket, and every
/// byte the program sends on it is passed on.
pub fn run(
    spec: &SandboxSpec,
    on_output: &mut dyn FnMut(Stream, &[u8]),
    on_socket: Option<SocketSink<'_>>,
) -> (ExecutionResult, Option<Workspace>) {
    // Nothing happens between creating the sandbox and starting the program but copying the
    // input files, so without any the program starts as soon as the sandbox is ready.
    let mut sandbox = match Sandbox::build(spec, spec.input_files.is_empty()) {
        Ok(s) => s,
        Err(e) => return (ExecutionResult::sandbox_error(e.to_string()), None),
    };
    let socket = sandbox.take_socket();
    let outcome = match (&socket, on_socket) {
        (Some(fd), Some(sink)) => sandbox.wait_with_socket(on_output, Some((fd.as_fd(), sink))),
        _ => sandbox.wait(on_output),
    };
    let result = outcome.into_result(sandbox.workspace(), sandbox.warnings.clone());
    let workspace = sandbox.workspace.take();
    drop(sandbox);
    (result, workspace)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn rlimit_fallback_reports_failed_allocations_near_the_limit() {
        let python =
            b"Traceback (most recent call last):\n  File \"main.py\", line 3\nMemoryError\n";
        let node =
            b"FATAL ERROR: Reached heap limit Allocation failed - JavaScript heap out of memory\n";
        let bash = b"main.sh: xmalloc: cannot allocate 134217729 bytes\n";
        for stderr in [
            &python[..],
            node,
            bash,
            b"OSError: [Errno 12] Cannot allocate memory",
        ] {
            assert!(hit_rlimit_data(64 * MIB, 60 * MIB, None, stderr));
            assert!(hit_rlimit_data(64 * MIB, 32 * MIB, None, stderr));
            // A huge request refused early is the program's own error, as with a cgroup.
            assert!(!hit_rlimit_data(64 * MIB, 31 * MIB, None, stderr));
        }
        // A crash on a refused allocation, without a word.
        assert!(hit_rlimit_data(
            64 * MIB,
            50 * MIB,
            Some(libc::SIGSEGV),
            b""
        ));
        assert!(hit_rlimit_data(
            64 * MIB,
            50 * MIB,
            Some(libc::SIGABRT),
            b""
        ));
        // Other failures stay errors.
        assert!(!hit_rlimit_data(
            64 * MIB,
            60 * MIB,
            None,
            b"ValueError: nope\n"
        ));
        assert!(!hit_rlimit_data(
            64 * MIB,
            60 * MIB,
            Some(libc::SIGTERM),
            b""
        ));
        assert!(!hit_rlimit_data(0, 60 * MIB, None, python));
        // Only the end of stderr counts.
        let mut early = b"MemoryError\n".to_vec();
        early.extend(std::iter::repeat_n(b'.', OUT_OF_MEMORY_TAIL));
        early.extend_from_slice(b"\nValueError\n");
        assert!(!hit_rlimit_data(64 * MIB, 60 * MIB, None, &early));
    }
}
