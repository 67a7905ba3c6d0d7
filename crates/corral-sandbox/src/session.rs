//! A session forked from a zygote enters its own sandbox.
//!
//! A zygote is a pre-imported interpreter in a sandbox of the [`crate::Role::Zygote`] role; for
//! each session it forks, through the `corral_session_fork` C entry point of the
//! `libcorral_session.so` library built from this crate (which the Python zygote loads), a
//! child that calls [`enter`]. [`enter`] reads the session's [`SessionPlan`] from the session's own control
//! socket — so nothing a client sent ever reaches the zygote — and then, with the same code
//! the one-shot engine uses:
//!
//! 1. joins the session's cgroup (the host passes the opened membership files);
//! 2. becomes the session's own ids, which no other live sandbox has: as root a host uid and
//!    gid, rootless with subordinate ids the ids of the zygote's user namespace that map to
//!    the session's host ids (`ids::IdLease::zygote_id`); rootless without, it stays the
//!    zygote's (the caller's);
//! 3. enters a new user namespace (the sandbox user mapped to that uid) and fresh mount, pid,
//!    net, ipc, uts and cgroup namespaces;
//! 4. forks the session's init (pid 1), which mounts the session's filesystems (the
//!    [`rootfs::session_plan`]: `/tmp`, `/workspace`, `/dev/shm`, `/proc` with the one-shot
//!    masks, devpts), brings loopback up, hands the host a descriptor of `/workspace`, then
//! 5. forks the kernel, which applies [`crate::lockdown`] (rlimits, `no_new_privs`,
//!    capabilities, seccomp, Landlock) and only then returns to the interpreter, with the
//!    session's environment.
//!
//! init reports on the control socket as the one-shot init does on its report socket:
//! `R` + the workspace descriptor, `K` with the kernel's pid (as credentials, which the kernel
//! translates into the host's pid namespace), a [`crate::setup`] report on failure, `X` + i32 wait status
//! when the kernel has exited; it takes `i` (interrupt) and EOF (the host is gone).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::sched::{unshare, CloneFlags};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixCredentials};
use nix::unistd::{ForkResult, Gid, Pid, Uid};
use serde::{Deserialize, Serialize};

use crate::child;
use crate::lockdown;
use crate::rootfs::{self, SANDBOX_UID};
use crate::seccomp;
use crate::setup::{ChildFailure, Step};
use crate::spec::{workload_rlimits, Limits};
use crate::sys;

/// Control messages (session init → host).
pub const MSG_READY: u8 = b'R';
pub const MSG_KERNEL: u8 = b'K';
pub use crate::setup::MSG_ERROR;
pub const MSG_EXIT: u8 = b'X';
/// The egress proxy's listening socket, made in the session's network namespace before the
/// kernel exists, when the plan asks for it; init keeps no copy.
pub const MSG_PROXY: u8 = b'N';
/// The host's end of the session's process agent's socket ([`crate::agent`]), when the plan
/// asks for an agent; init keeps no copy.
pub const MSG_AGENT: u8 = b'A';

/// The largest plan the child reads; a plan carries the session's environment. (One
/// SEQPACKET message, which must fit the socket's default send buffer.)
pub const MAX_PLAN_BYTES: usize = 128 << 10;

/// Everything a forked session needs, sent by the host on the session's control socket after
/// the fork.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SessionPlan {
    /// The uid and gid the session becomes before it makes its user namespace (the zygote may
    /// switch to them): host ids as root, ids of the zygote's user namespace rootless with
    /// subordinate ids; none rootless without.
    pub host_ids: Option<(u32, u32)>,
    pub disk_bytes: u64,
    pub memory_bytes: u64,
    pub pids: u64,
    /// Whether the host made a cgroup (else memory and processes are limited by rlimits).
    pub in_cgroup: bool,
    pub landlock_required: bool,
    /// Rootless: the most inotify instances and watches the session's user may hold, so that
    /// one session cannot take the whole per-user allowance the sessions share.
    pub inotify_limits: Option<(u64, u64)>,
    /// The session's environment on top of the interpreter's own.
    pub env: Vec<(String, String)>,
    /// A one-shot run served from the fork: the program's file name. The plan's message then
    /// carries a descriptor of the program's text, which init places read-only at
    /// `/run/corral/<name>` (on a filesystem of its own over the zygote's `/run/corral`), as
    /// a one-shot sandbox has it.
    pub program: Option<String>,
    /// Listen for the egress proxy in the session's network namespace ([`MSG_PROXY`]).
    pub proxy_endpoint: bool,
    /// Start the session's process agent ([`MSG_AGENT`]): sessions have one, one-shot runs
    /// do not.
    #[serde(default)]
    pub agent: bool,
}

/// Where a one-shot run's program is, as in a one-shot sandbox.
pub const PROGRAM_DIR: &str = "/run/corral";

/// What the kernel process returns to the interpreter: its environment and, for a one-shot
/// run, the program to run (else it serves a session).
#[derive(Debug, Clone, PartialEq)]
pub struct Entered {
    pub env: Vec<(String, String)>,
    pub program: Option<String>,
}

/// The fixed descriptors a forked session child receives, in this order, followed by the
/// cgroup membership files (if any).
pub struct SessionFds {
    pub protocol: RawFd,
    pub control: RawFd,
    pub stdout: RawFd,
    pub stderr: RawFd,
    pub cgroup: Vec<RawFd>,
}

impl SessionFds {
    pub fn from_slice(fds: &[RawFd]) -> Option<SessionFds> {
        match fds {
            [protocol, control, stdout, stderr, cgroup @ ..] => Some(SessionFds {
                protocol: *protocol,
                control: *control,
                stdout: *stdout,
                stderr: *stderr,
                cgroup: cgroup.to_vec(),
            }),
            _ => None,
        }
    }

    fn control(&self) -> BorrowedFd<'_> {
        // SAFETY: the control socket stays open in the child until it exits.
        unsafe { BorrowedFd::borrow_raw(self.control) }
    }

    /// Reports `err` failing `step` to the host ([`crate::setup`]) and exits.
    fn fail(&self, step: Step, err: impl std::error::Error + 'static) -> ! {
        let msg = ChildFailure::encode(step, "", &err);
        let _ = sys::send_message(self.control(), &msg, None);
        // SAFETY: _exit ends this child without running the zygote's exit handlers.
        unsafe { libc::_exit(126) }
    }
}

/// Enters the session's sandbox; returns only in the kernel process, fully locked down, with
/// the session's environment (and a one-shot run's program). Every failure is reported on the
/// control socket and ends the process. Must be called in a freshly forked, single-threaded
/// child of the zygote ([`corral_session_fork`]).
pub fn enter(fds: &SessionFds) -> Entered {
    let mut keep = vec![fds.protocol, fds.control, fds.stdout, fds.stderr];
    keep.extend(&fds.cgroup);
    sys::close_all_except(&keep);
    let (plan, program) = match read_plan(fds.control()) {
        Ok(read) => read,
        Err(e) => fds.fail(Step::ReadPlan, e),
    };
    let program = match (&plan.program, program) {
        (None, None) => None,
        (Some(name), Some(text)) if is_file_name(name) => Some((name.clone(), text)),
        _ => fds.fail(
            Step::ReadPlan,
            io::Error::new(
                io::ErrorKind::InvalidData,
                "a program needs a plain file name and its text",
            ),
        ),
    };
    for &fd in &fds.cgroup {
        if let Err(e) = join_cgroup_file(fd) {
            fds.fail(Step::JoinCgroup, e);
        }
    }
    if let Some((uid, gid)) = plan.host_ids {
        if let Err(e) = child::become_user(Uid::from_raw(uid), Gid::from_raw(gid)) {
            fds.fail(Step::SwitchUser, e);
        }
        // Changing credentials made us non-dumpable, which would make /proc/self/uid_map
        // belong to root and unwritable for us.
        // SAFETY: prctl with integer arguments only.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
    }
    let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
    if let Err(e) = unshare(CloneFlags::CLONE_NEWUSER) {
        fds.fail(Step::Namespaces, e);
    }
    if let Err(e) = child::write_id_maps("/proc/self", uid.as_raw(), gid.as_raw(), true) {
        fds.fail(Step::MapUser, e);
    }
    if let Err(e) = unshare(
        CloneFlags::CLONE_NEWNS
            | CloneFlags::CLONE_NEWPID
            | CloneFlags::CLONE_NEWNET
            | CloneFlags::CLONE_NEWIPC
            | CloneFlags::CLONE_NEWUTS
            | CloneFlags::CLONE_NEWCGROUP,
    ) {
        fds.fail(Step::Namespaces, e);
    }
    // The session's init is pid 1 of the new pid namespace; this process is done.
    // SAFETY: this process is single-threaded (a fresh fork).
    match unsafe { nix::unistd::fork() } {
        Err(e) => fds.fail(Step::StartInit, e),
        Ok(ForkResult::Parent { .. }) => {
            // SAFETY: see `SessionFds::fail`.
            unsafe { libc::_exit(0) }
        }
        Ok(ForkResult::Child) => init(fds, plan, program),
    }
}

/// A name for a file directly in [`PROGRAM_DIR`].
fn is_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

/// The plan and the descriptor its message carried (a one-shot run's program).
fn read_plan(control: BorrowedFd<'_>) -> io::Result<(SessionPlan, Option<OwnedFd>)> {
    let mut buf = vec![0u8; MAX_PLAN_BYTES];
    let (n, fd) = sys::recv_message(control, &mut buf)?;
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the host gave up on this session",
        ));
    }
    let plan = serde_json::from_slice(&buf[..n]).map_err(io::Error::other);
    // The plan carries the session's environment: keep no copy of it but the parsed one.
    buf.fill(0);
    Ok((plan?, fd))
}

fn join_cgroup_file(fd: RawFd) -> io::Result<()> {
    // SAFETY: `fd` is a cgroup membership file the host sent; this process owns it now.
    let file = unsafe { OwnedFd::from_raw_fd(fd) };
    nix::unistd::write(&file, b"0")?;
    Ok(())
}

/// Pid 1 of the session.
fn init(fds: &SessionFds, plan: SessionPlan, program: Option<(String, OwnedFd)>) -> Entered {
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if let Some((instances, watches)) = plan.inotify_limits {
        if let Err(e) = lockdown::limit_inotify(instances, watches) {
            fds.fail(Step::Inotify, e);
        }
    }
    if let Err(e) = build_filesystems(plan.disk_bytes) {
        fds.fail(Step::BuildRoot, e);
    }
    if let Some((name, text)) = program {
        if let Err(e) = place_program(&name, text) {
            fds.fail(Step::PlaceProgram, e);
        }
    }
    let workspace = match nix::fcntl::open(
        "/workspace",
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(e) => fds.fail(Step::OpenWorkspace, e),
    };
    if let Err(e) = send_with_pid(fds.control(), MSG_READY, Some(workspace), Pid::this()) {
        fds.fail(Step::ReportReady, e);
    }
    let _ = nix::unistd::close(workspace);
    if plan.proxy_endpoint {
        let sent = corral_egress::listen().and_then(|endpoint| {
            sys::send_message(fds.control(), &[MSG_PROXY], Some(endpoint.as_raw_fd()))
        });
        if let Err(e) = sent {
            fds.fail(Step::ProxyEndpoint, e);
        }
    }

    if plan.agent {
        let started = crate::agent_fork::start(
            crate::agent_fork::Forker::SessionInit,
            &workload_lockdown(&plan),
            plan.env.clone(),
            fds.control(),
        );
        if let Err(e) = started {
            fds.fail(Step::ProcessAgent, e);
        }
    }

    // SIGCHLD through a signalfd, as the one-shot init takes it; the kernel unblocks it.
    let mut sigchld = nix::sys::signal::SigSet::empty();
    sigchld.add(nix::sys::signal::Signal::SIGCHLD);
    if let Err(e) = sigchld.thread_block() {
        fds.fail(Step::BlockSigchld, e);
    }
    let children = match nix::sys::signalfd::SignalFd::with_flags(
        &sigchld,
        nix::sys::signalfd::SfdFlags::SFD_CLOEXEC | nix::sys::signalfd::SfdFlags::SFD_NONBLOCK,
    ) {
        Ok(fd) => fd,
        Err(e) => fds.fail(Step::Signalfd, e),
    };
    // SAFETY: init is single-threaded.
    let kernel = match unsafe { nix::unistd::fork() } {
        Err(e) => fds.fail(Step::StartWorkload, e),
        Ok(ForkResult::Child) => {
            drop(children);
            return kernel(fds, plan);
        }
        Ok(ForkResult::Parent { child }) => child,
    };
    for fd in [fds.protocol, fds.stdout, fds.stderr] {
        let _ = nix::unistd::close(fd);
    }
    drop(plan);
    if let Err(e) = send_with_pid(fds.control(), MSG_KERNEL, None, kernel) {
        fds.fail(Step::ReportKernel, e);
    }
    if let Err(e) = lockdown::init(seccomp::init_filters()) {
        fds.fail(e.step(), e);
    }
    let status = child::supervise(fds.control, &children, kernel, true);
    let mut msg = vec![MSG_EXIT];
    msg.extend_from_slice(&status.to_le_bytes());
    let _ = sys::send_message(fds.control(), &msg, None);
    // SAFETY: see `SessionFds::fail`.
    unsafe { libc::_exit(0) }
}

/// The lockdown of the session's kernel and of its process agent.
fn workload_lockdown(plan: &SessionPlan) -> lockdown::Lockdown {
    let limits = Limits {
        disk_bytes: plan.disk_bytes,
        memory_bytes: plan.memory_bytes,
        pids: plan.pids,
        ..Limits::default()
    };
    lockdown::Lockdown {
        filters: seccomp::filters(crate::spec::Role::Workload),
        rlimits: workload_rlimits(&limits, plan.in_cgroup),
        landlock: Some(plan.landlock_required),
        keep_capabilities: &[],
    }
}

/// The kernel process: standard streams and the protocol socket in place, then the lockdown.
fn kernel(fds: &SessionFds, plan: SessionPlan) -> Entered {
    // init is not dumpable; the kernel is, as any program is, so that it may read its own
    // /proc/self files (the session's code runs here; seccomp keeps ptrace out).
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
    if let Err(e) = nix::sys::signal::SigSet::empty().thread_set_mask() {
        fds.fail(Step::SignalMask, e);
    }
    let _ = nix::unistd::setsid();
    if let Err(e) = child::redirect_stdio(None, fds.stdout, fds.stderr, Some(fds.protocol)) {
        fds.fail(Step::Stdio, e);
    }
    sys::close_all_except(&[3]);
    if let Err(e) = workload_lockdown(&plan).apply() {
        // The control socket is closed here: stderr reaches the host.
        eprintln!("corral: locking the session down failed: {e}");
        // SAFETY: see `SessionFds::fail`.
        unsafe { libc::_exit(126) }
    }
    Entered {
        env: plan.env,
        program: plan.program.map(|name| format!("{PROGRAM_DIR}/{name}")),
    }
}

/// Sends `tag` (with a descriptor) and `pid` as the sender's credentials, which the kernel
/// translates into the receiver's pid namespace.
fn send_with_pid(control: BorrowedFd<'_>, tag: u8, fd: Option<RawFd>, pid: Pid) -> io::Result<()> {
    // SAFETY: ucred is plain old data.
    let mut ucred: libc::ucred = unsafe { std::mem::zeroed() };
    ucred.pid = pid.as_raw();
    ucred.uid = SANDBOX_UID;
    ucred.gid = rootfs::SANDBOX_GID;
    let creds = UnixCredentials::from(ucred);
    let fds = fd.map(|f| [f]);
    let mut cmsgs = vec![ControlMessage::ScmCredentials(&creds)];
    cmsgs.extend(fds.iter().map(|f| ControlMessage::ScmRights(f)));
    let iov = [io::IoSlice::new(std::slice::from_ref(&tag))];
    sendmsg::<()>(
        control.as_raw_fd(),
        &iov,
        &cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    Ok(())
}

/// A one-shot run's program, read from the descriptor the host sent, as the only file of a
/// read-only filesystem at [`PROGRAM_DIR`] (which hides the zygote's runtime files there).
fn place_program(name: &str, text: OwnedFd) -> io::Result<()> {
    use std::io::{Read, Seek};
    let mut file = std::fs::File::from(text);
    file.rewind()?;
    let mut contents = Vec::new();
    file.read_to_end(&mut contents)?;
    drop(file);
    let dir = Path::new(PROGRAM_DIR);
    rootfs::execute(
        &[
            rootfs::Op::Tmpfs {
                target: dir.into(),
                // A tmpfs of size 0 would be unbounded.
                size: contents.len() as u64 + 4096,
                mode: 0o755,
                noexec: false,
            },
            rootfs::Op::File {
                path: dir.join(name),
                contents,
                mode: 0o444,
            },
        ],
        Path::new("/"),
    )?;
    sys::make_read_only(dir)
}

fn build_filesystems(disk_bytes: u64) -> io::Result<()> {
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
        None::<&str>,
    )?;
    rootfs::execute(&rootfs::session_plan(disk_bytes), Path::new("/"))?;
    nix::unistd::sethostname(rootfs::HOSTNAME)?;
    sys::loopback_up().map_err(|e| io::Error::new(e.kind(), format!("loopback up: {e}")))?;
    nix::unistd::chdir("/workspace")?;
    Ok(())
}

/// The C entry point of `libcorral_session.so`: forks the zygote, and the child enters the
/// session's sandbox ([`enter`]) with `fds`, the descriptors the zygote received with the fork
/// request ([`SessionFds`]). No code of the zygote's interpreter runs in the child, nor in the
/// session's init: the kernel process is the first to go back to it. Returns NULL in the
/// zygote (whether the fork was made or not: the host sees the session's control socket hang
/// up when it failed), and in the kernel process only a NUL-terminated JSON object that stays
/// allocated for the life of the process:
/// `{"env": {"NAME": "value", ...}, "program": "/run/corral/main.py"}`, `program` null for a
/// session.
///
/// # Safety
/// `fds` must point to `count` readable descriptor numbers; the caller must be single-threaded
/// and do for the fork what the interpreter's own `fork` does around it (for Python: hold the
/// GIL, call `PyOS_BeforeFork` before, and `PyOS_AfterFork_Parent` in the zygote, or
/// `PyOS_AfterFork_Child` in the kernel process, after).
#[no_mangle]
pub unsafe extern "C" fn corral_session_fork(
    fds: *const libc::c_int,
    count: libc::size_t,
) -> *const libc::c_char {
    // SAFETY: the caller passes `count` descriptor numbers at `fds`.
    let fds = unsafe { std::slice::from_raw_parts(fds, count) };
    let Some(fds) = SessionFds::from_slice(fds) else {
        return std::ptr::null();
    };
    // SAFETY: the caller is single-threaded; the child runs only this library's code (and
    // returns to the caller only in the kernel process, as a fork's child would).
    match unsafe { nix::unistd::fork() } {
        Ok(ForkResult::Child) => {}
        Ok(ForkResult::Parent { .. }) | Err(_) => return std::ptr::null(),
    }
    // The zygote ignores SIGCHLD (its children are not its to reap); the session's init must
    // see its kernel's.
    // SAFETY: restoring a signal's default disposition.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_DFL) };
    let entered = enter(&fds);
    let env: serde_json::Map<String, serde_json::Value> = entered
        .env
        .into_iter()
        .map(|(k, v)| (k, serde_json::Value::String(v)))
        .collect();
    let json = serde_json::json!({"env": env, "program": entered.program}).to_string();
    CString::new(json)
        .expect("JSON escapes NUL")
        .into_raw()
        .cast_const()
}
