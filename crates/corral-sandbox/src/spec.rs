//! What a sandbox is asked to be: image, program, environment, limits and policy.

use std::fs::File;
use std::path::PathBuf;
use std::time::Duration;

use nix::sys::resource::Resource;

/// Resource limits of one sandbox: those a caller sets (defaults in docs/cli.md#corral-run) and
/// the host-side bounds no flag or setting changes (docs/threat-model.md §11).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Wall-clock limit; the whole process tree is killed when it is reached.
    pub timeout: Duration,
    /// Memory limit in bytes (cgroup memory, no swap; RLIMIT_DATA in fallback mode).
    pub memory_bytes: u64,
    /// CPU quota in CPUs (cgroup cpu quota).
    pub cpus: f64,
    /// Maximum number of processes and threads (cgroup pids; RLIMIT_NPROC in fallback mode).
    pub pids: u64,
    /// Size of the `/workspace` tmpfs; `/tmp` gets its own tmpfs of the same size.
    pub disk_bytes: u64,
    /// Bytes of stdout and of stderr kept; the rest is drained and dropped.
    pub output_bytes: usize,
    /// Bytes of kernel protocol frames (rich results, errors) the host buffers per execution;
    /// a frame that does not fit in what is left is discarded as it arrives, unread.
    pub result_bytes: usize,
    /// Rich results kept per execution; later ones are dropped (with a warning).
    pub result_count: usize,
    /// Bytes the sandbox may move through its egress proxy, both ways together; reaching it
    /// closes every connection and the proxy's endpoint (docs/network.md).
    pub net_bytes: u64,
    /// Connections the sandbox's egress proxy accepts in all; the next one is refused and
    /// the endpoint closed.
    pub net_connections: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: Duration::from_secs(30),
            memory_bytes: 512 << 20,
            cpus: 1.0,
            pids: 256,
            disk_bytes: 256 << 20,
            output_bytes: 1 << 20,
            result_bytes: 64 << 20,
            result_count: 256,
            net_bytes: 1 << 30,
            net_connections: 1024,
        }
    }
}

/// The root filesystem a sandbox runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rootfs {
    /// The host's own `/usr`, `/lib*`, `/bin`, `/sbin`, bound read-only, with a synthetic `/etc`.
    Host,
    /// A complete root filesystem directory (a built image), bound read-only; `/etc` is
    /// taken from the image with the identity files replaced by synthetic ones.
    Directory(PathBuf),
}

/// Which weaker modes the caller accepts when a protection cannot be applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Policy {
    /// Refuse to run when cgroups are unavailable instead of falling back to rlimits.
    pub strict: bool,
    /// Run without Landlock when the kernel lacks it (reported as a warning).
    pub allow_degraded: bool,
}

/// What the sandboxed program is, which decides its last layers of protection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// Untrusted code: Landlock, the workload seccomp profile, a masked `/proc`.
    #[default]
    Workload,
    /// Corral's own zygote, which never runs untrusted code but forks sessions that enter
    /// fresh namespaces of their own (nested user namespace, mounts, pid, net, ipc, uts) and
    /// then apply every workload layer themselves. It therefore runs without Landlock (which
    /// forbids mounting), with the zygote seccomp profile (workload plus the namespace calls)
    /// and with an unmasked `/proc` (the kernel refuses a new proc mount where an existing one
    /// is partly covered); like a workload it has no capabilities and `no_new_privs`.
    Zygote,
}

/// The kind of socket the program finds at fd 3, connected to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlSocket {
    /// A byte stream (the kernel protocol's frames, of any size).
    Stream,
    /// Message boundaries kept and descriptors passed with messages (the zygote's requests).
    SeqPacket,
}

/// A file copied into the workspace before the program starts.
#[derive(Debug)]
pub struct InputFile {
    /// Opened by the caller, with the caller's own permissions.
    pub source: File,
    /// Relative path under `/workspace`.
    pub dest: PathBuf,
}

/// Everything needed to start one sandbox.
#[derive(Debug)]
pub struct SandboxSpec {
    pub rootfs: Rootfs,
    /// Program and arguments; `argv[0]` is looked up in `/usr/local/bin`, `/usr/bin` and `/bin`
    /// inside the sandbox unless it is an absolute path.
    pub argv: Vec<String>,
    /// Extra environment on top of the fixed safe set.
    pub env: Vec<(String, String)>,
    pub limits: Limits,
    pub policy: Policy,
    /// What the sandbox may reach beyond its own loopback, and how the host enforces it.
    pub egress: corral_egress::Egress,
    /// A file placed read-only at `/run/corral/<name>` (the program text of a one-shot run).
    pub program_file: Option<(String, Vec<u8>)>,
    /// More read-only files under `/run/corral` (e.g. a kernel's runtime).
    pub support_files: Vec<(String, Vec<u8>)>,
    /// A host directory Corral prepared (the one-shot runtime with its bytecode), bound
    /// read-only at [`crate::rootfs::RUNTIME_DIR`]: cheaper than copying its files in each run.
    pub runtime_dir: Option<std::path::PathBuf>,
    /// A socket to the host at fd 3, if the program speaks a protocol with it.
    pub control_socket: Option<ControlSocket>,
    pub role: Role,
    pub input_files: Vec<InputFile>,
    /// The workload's standard input: the read end of a pipe the caller feeds (never a
    /// terminal or another host descriptor); `None` is `/dev/null`.
    pub stdin: Option<std::os::fd::OwnedFd>,
    /// Readable when the caller wants the run stopped (`corral run`: a signalfd of SIGINT,
    /// SIGTERM and SIGHUP): the sandbox is then killed with every process in it and torn
    /// down, and the run ends as `error`, saying so. Never read, only polled.
    pub stop: Option<std::os::fd::OwnedFd>,
    /// A session's kernel: the sandbox has a process agent ([`crate::agent`]) beside the
    /// program, locked down as it is, whose socket the host takes with
    /// `Sandbox::take_agent`. One-shot runs have none (it would cost them time).
    pub process_agent: bool,
}

impl SandboxSpec {
    pub fn new(argv: Vec<String>) -> Self {
        SandboxSpec {
            rootfs: Rootfs::Host,
            argv,
            env: Vec::new(),
            limits: Limits::default(),
            policy: Policy::default(),
            egress: corral_egress::Egress::default(),
            program_file: None,
            support_files: Vec::new(),
            runtime_dir: None,
            control_socket: None,
            role: Role::Workload,
            input_files: Vec::new(),
            stdin: None,
            stop: None,
            process_agent: false,
        }
    }
}

/// The rlimits of every sandboxed program (the engine's workload and a zygote's forked
/// kernels alike); memory and processes are limited here only when no cgroup does it.
pub fn workload_rlimits(limits: &Limits, with_cgroup: bool) -> Vec<(Resource, u64)> {
    let mut rlimits = vec![
        // 1, not 0: with a piped core_pattern (apport, systemd-coredump) the kernel ignores
        // a limit of 0 and runs the helper as host root on every crash; a limit of exactly
        // 1 is its marker for "never pipe", and too small for any core file.
        (Resource::RLIMIT_CORE, CORE_LIMIT),
        (Resource::RLIMIT_NOFILE, 4096),
        (Resource::RLIMIT_FSIZE, limits.disk_bytes),
        (Resource::RLIMIT_MEMLOCK, 64 << 10),
        (Resource::RLIMIT_MSGQUEUE, 64 << 10),
        (Resource::RLIMIT_RTPRIO, 0),
        (Resource::RLIMIT_SIGPENDING, 1024),
    ];
    if !with_cgroup {
        rlimits.push((Resource::RLIMIT_DATA, limits.memory_bytes));
        rlimits.push((Resource::RLIMIT_NPROC, limits.pids));
    }
    rlimits
}

/// The rlimits of a zygote: those of [`workload_rlimits`] that do not depend on a sandbox's
/// limits. A forked session sets its own and cannot raise a hard limit above its zygote's, so
/// the zygote leaves the size-dependent ones (file size, and without a cgroup, data and
/// processes) as it found them; its own cgroup bounds its memory and processes.
pub fn zygote_rlimits() -> Vec<(Resource, u64)> {
    workload_rlimits(&Limits::default(), true)
        .into_iter()
        .filter(|(resource, _)| *resource != Resource::RLIMIT_FSIZE)
        .collect()
}

/// Rootless, every sandbox of a caller is charged to the caller's own per-user inotify
/// allowance (128 instances by default), with or without subordinate ids (the kernel charges
/// it to the owner of each user namespace up the chain, and every one is the caller's): each
/// sandbox may take at most this much of it (instances, watches). As root every sandbox has a
/// uid, and so an allowance, of its own.
pub const ROOTLESS_INOTIFY_LIMITS: (u64, u64) = (32, 16_384);

/// The core-file limit of every sandboxed process (see [`workload_rlimits`]).
pub const CORE_LIMIT: u64 = 1;

/// The environment every sandboxed program starts with: nothing from the host.
pub fn base_environment(limits: &Limits) -> Vec<(String, String)> {
    let threads = (limits.cpus.ceil() as u64).max(1).to_string();
    [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("HOME", "/workspace"),
        ("USER", "sandbox"),
        ("LOGNAME", "sandbox"),
        ("SHELL", "/bin/bash"),
        ("LANG", "C.UTF-8"),
        ("TERM", "dumb"),
        ("TMPDIR", "/tmp"),
        // Caches and configuration stay out of the workspace, which is the user's files.
        ("XDG_CACHE_HOME", "/tmp/.cache"),
        ("XDG_CONFIG_HOME", "/tmp/.config"),
        ("PYTHONUNBUFFERED", "1"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("MPLBACKEND", "Agg"),
        ("MPLCONFIGDIR", "/tmp/.matplotlib"),
        ("OPENBLAS_NUM_THREADS", threads.as_str()),
        ("OMP_NUM_THREADS", threads.as_str()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}
