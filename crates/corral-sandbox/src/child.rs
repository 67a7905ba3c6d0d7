//! Code that runs in the forked processes: stage 1 (namespaces and id maps), init (pid 1 of
//! the sandbox: builds the root, reaps, kills what is left) and the workload (drops every
//! privilege, forks a session kernel's process agent, then execs the program).
//!
//! Everything a child needs is prepared by the host process before `fork` ([`ChildPlan`]),
//! and every failure is reported over the report socket ([`crate::setup`]) before exiting.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::resource::Resource;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{chdir, pivot_root, ForkResult, Gid, Pid, Uid};

use crate::lockdown::Lockdown;
use crate::rootfs::{self, Op, NEW_ROOT, SANDBOX_GID, SANDBOX_UID};
use crate::seccomp;
use crate::setup::{ChildFailure, Step};
use crate::sys;

/// Messages on the report socket (child → host). One SEQPACKET message each.
pub(crate) const MSG_INIT_PID: u8 = b'P';
/// Stage 1 has made the namespaces and waits for the host to map its ids ([`ChildPlan::host_maps`]).
pub(crate) const MSG_UNSHARED: u8 = b'U';
pub(crate) const MSG_READY: u8 = b'R';
pub(crate) const MSG_EXIT: u8 = b'X';
/// Host → workload, once: the membership files of the sandbox's cgroup (one per hierarchy) as
/// SCM_RIGHTS, or none when the sandbox runs without a cgroup. The host creates the cgroup
/// while stage 1 builds the namespaces; the files it opened carry its credentials, which is
/// what the kernel checks when a sandbox process writes to them from inside its user
/// namespace. init stays out of the cgroup: it holds only the program's process tree, which is
/// empty once init reports the exit, so the host can read and remove the cgroup while init
/// and its namespaces are still being torn down.
pub(crate) const MSG_CGROUP: u8 = b'C';
/// init → host, once, when the sandbox has a network policy: the egress proxy's listening
/// socket ([`corral_egress::listen`]), made in the sandbox's network namespace before the
/// program runs; init keeps no copy.
pub(crate) const MSG_PROXY: u8 = b'N';
/// Most cgroup hierarchies a sandbox joins (v1: memory, pids, cpu, cpuacct, freezer).
const MAX_CGROUP_FILES: usize = 8;

/// Everything the children need, prepared before `fork` so they only make system calls.
pub(crate) struct ChildPlan {
    pub ops: Vec<Op>,
    /// Root mode: switch to these host ids first.
    pub switch_to: Option<(Uid, Gid)>,
    /// Root mode, zygote role: no user namespace. The zygote runs in the host's, as
    /// `switch_to`, keeping only CAP_SETUID and CAP_SETGID (bounded by its seccomp filter to
    /// the sandbox uid range), so that each session it forks becomes a host uid of its own
    /// before entering a user namespace of its own: every per-uid kernel account of a
    /// session is then its own, up to the host's level (a user namespace nested in a shared
    /// one would share its owner's). init builds the root as root, then becomes `switch_to`
    /// with no capability.
    pub host_userns: bool,
    /// Rootless with subordinate ids: the host maps the sandbox user to the sandbox's host
    /// ids with the setuid helpers once the user namespace exists (stage 1 reports
    /// [`MSG_UNSHARED`]); the namespace's creator then becomes the sandbox user, which drops
    /// the caller's supplementary groups, keeping its capabilities there. A zygote's workload
    /// keeps CAP_SETUID and CAP_SETGID, as in root mode, to give each session an id of the
    /// caller's range that its namespace maps (`ids::Subordinate::maps`).
    pub host_maps: bool,
    /// Rootless: the sandbox's share of the caller's inotify allowance, set by init.
    pub inotify_limits: Option<(u64, u64)>,
    /// Both ways: children → host reports; host → workload the cgroup to join (see
    /// [`MSG_CGROUP`]).
    pub report: RawFd,
    /// Host → init: one byte `g` starts the workload (unless `start_at_once`), `i` interrupts
    /// it (SIGINT); EOF means the host is gone and everything is killed.
    pub control: RawFd,
    /// Dup'ed to fd 3 of the workload when the program speaks a protocol with the host.
    pub socket: Option<RawFd>,
    /// The spec's runtime directory, bound read-only at `rootfs::RUNTIME_DIR`.
    pub runtime_dir: Option<std::path::PathBuf>,
    pub role: crate::spec::Role,
    /// The workload's fd 0 when the caller feeds it (else `/dev/null`).
    pub stdin: Option<RawFd>,
    pub stdout: RawFd,
    pub stderr: RawFd,
    pub root_size: u64,
    pub exec_candidates: Vec<CString>,
    pub argv: Vec<CString>,
    pub envp: Vec<CString>,
    /// The workload's rlimits when it runs in a cgroup, and when it has to do without one.
    pub rlimits: Vec<(Resource, u64)>,
    pub fallback_rlimits: Vec<(Resource, u64)>,
    pub landlock_required: bool,
    /// The workload's filters (the zygote's for the zygote role).
    pub workload_filters: &'static [&'static [seccomp::sock_filter]],
    pub init_filters: &'static [&'static [seccomp::sock_filter]],
    /// init starts the workload once the root is built and readiness is reported, without
    /// waiting for the host's `g`.
    pub start_at_once: bool,
    /// init listens for the egress proxy in the sandbox's network namespace and hands the
    /// socket to the host ([`MSG_PROXY`]).
    pub proxy_endpoint: bool,
    /// The CPUs the host may use, read before init exists: the host and init move init and
    /// the workload while the sandbox is built ([`move_off_this_cpu`]), and the program gets
    /// these back.
    pub cpus: Option<nix::sched::CpuSet>,
    /// A session's kernel: the workload forks the sandbox's process agent with this
    /// environment (the workload's own) once released, just before it locks itself down the
    /// rest of the way, and hands the host its socket ([`crate::session::MSG_AGENT`]).
    pub agent_env: Option<Vec<(String, String)>>,
}

impl ChildPlan {
    fn report(&self) -> BorrowedFd<'_> {
        // SAFETY: the report socket stays open in every child until it exits or execs.
        unsafe { BorrowedFd::borrow_raw(self.report) }
    }

    /// Reports `err` failing `step` to the host and exits.
    fn fail(&self, step: Step, err: impl std::error::Error + 'static) -> ! {
        self.fail_on(step, "", err)
    }

    /// [`ChildPlan::fail`], for a step that names what it acted on.
    fn fail_on(&self, step: Step, subject: &str, err: impl std::error::Error + 'static) -> ! {
        let msg = ChildFailure::encode(step, subject, &err);
        let _ = sys::send_message(self.report(), &msg, None);
        // SAFETY: _exit ends this child without running the parent's atexit handlers or
        // flushing its copied stdio buffers.
        unsafe { libc::_exit(126) }
    }
}

/// The namespaces init is made in. Two more come from the workload:
/// - the cgroup namespace, once it is in the sandbox's cgroup, which then becomes its root;
/// - the network namespace ([`make_network`]), which init joins before anything of the
///   program's runs. Creating one costs about 0.3 ms, spent there while init builds the root
///   rather than before init exists.
pub(crate) const NAMESPACES: CloneFlags = CloneFlags::CLONE_NEWUSER
    .union(CloneFlags::CLONE_NEWNS)
    .union(CloneFlags::CLONE_NEWPID)
    .union(CloneFlags::CLONE_NEWIPC)
    .union(CloneFlags::CLONE_NEWUTS);
pub(crate) const NAMESPACES_FAILED: &str =
    "creating namespaces (user, mount, pid, net, ipc, uts, cgroup); check that user \
     namespaces are enabled (sysctl user.max_user_namespaces > 0, \
     kernel.unprivileged_userns_clone=1, no AppArmor userns restriction)";
/// Host → init on the control pipe, when the host made init itself: its id maps are written.
pub(crate) const MAPS_WRITTEN: u8 = b'm';

/// Maps the sandbox user and group (and nothing else) to `host_uid`/`host_gid` in the user
/// namespace of the process whose `/proc` directory is `proc_dir`. An unprivileged writer
/// must deny `setgroups` first; a privileged one leaves it allowed so that init can drop the
/// host's supplementary groups.
pub(crate) fn write_id_maps(
    proc_dir: &str,
    host_uid: u32,
    host_gid: u32,
    deny_setgroups: bool,
) -> io::Result<()> {
    let maps = [
        ("setgroups", "deny".to_string()),
        ("uid_map", format!("{SANDBOX_UID} {host_uid} 1")),
        ("gid_map", format!("{SANDBOX_GID} {host_gid} 1")),
    ];
    for (file, content) in maps.iter().skip(usize::from(!deny_setgroups)) {
        std::fs::write(format!("{proc_dir}/{file}"), content)
            .map_err(|e| io::Error::new(e.kind(), format!("writing {proc_dir}/{file}: {e}")))?;
    }
    Ok(())
}

impl ChildPlan {
    /// Closes every descriptor the host process had open but the sandbox's own.
    fn close_host_descriptors(&self) {
        let mut keep = vec![self.report, self.control, self.stdout, self.stderr];
        keep.extend(self.socket);
        keep.extend(self.stdin);
        sys::close_all_except(&keep);
    }

    /// Opens the runtime directory (`O_PATH`) for init to bind: in the sandbox's mount
    /// namespace (a mount can only be bound from the namespace it is in, so not by the host)
    /// and before its creator becomes the sandbox user, whose permissions may not reach it
    /// (rootless with subordinate ids: a home directory of mode 0700 on the way). init's
    /// children close it before they run anything of the sandbox's.
    fn open_runtime_dir(&self) -> Option<OwnedFd> {
        let dir = self.runtime_dir.as_ref()?;
        match nix::fcntl::open(
            dir,
            nix::fcntl::OFlag::O_PATH
                | nix::fcntl::OFlag::O_DIRECTORY
                | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        ) {
            // SAFETY: open returned a new descriptor that nothing else owns.
            Ok(fd) => Some(unsafe { OwnedFd::from_raw_fd(fd) }),
            Err(e) => self.fail_on(Step::RuntimeDir, &dir.display().to_string(), e),
        }
    }

    /// Waits for the host's [`MAPS_WRITTEN`]; false when the host gave up on this sandbox.
    fn await_maps(&self) -> bool {
        let mut byte = [0u8; 1];
        matches!(nix::unistd::read(self.control, &mut byte), Ok(1)) && byte[0] == MAPS_WRITTEN
    }
}

/// Stage 1: a child of a multithreaded host process (see [`init_in_namespaces`] for the
/// single-threaded case). It makes the namespaces and init, which it leaves to the host.
pub(crate) fn stage1(plan: &ChildPlan) -> ! {
    plan.close_host_descriptors();
    if let Some((uid, gid)) = plan.switch_to.filter(|_| !plan.host_userns) {
        if let Err(e) = become_user(uid, gid) {
            plan.fail(Step::SwitchUser, e);
        }
        // Changing credentials made us non-dumpable, which would make /proc/self/uid_map
        // belong to root and unwritable for us.
        // SAFETY: prctl with integer arguments only.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
    }
    let (host_uid, host_gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
    let runtime_dir;
    if plan.host_userns {
        if let Err(e) = unshare(NAMESPACES.difference(CloneFlags::CLONE_NEWUSER)) {
            plan.fail(Step::Namespaces, e);
        }
        runtime_dir = plan.open_runtime_dir();
    } else {
        if let Err(e) = unshare(NAMESPACES) {
            plan.fail(Step::Namespaces, e);
        }
        runtime_dir = plan.open_runtime_dir();
        if plan.host_maps {
            if let Err(e) = sys::send_message(plan.report(), &[MSG_UNSHARED], None) {
                plan.fail(Step::ReportNamespace, e);
            }
            if !plan.await_maps() {
                // SAFETY: see `ChildPlan::fail_on`.
                unsafe { libc::_exit(0) }
            }
            if let Err(e) = become_user(Uid::from_raw(SANDBOX_UID), Gid::from_raw(SANDBOX_GID)) {
                plan.fail(Step::SandboxUser, e);
            }
        } else if let Err(e) =
            write_id_maps("/proc/self", host_uid.as_raw(), host_gid.as_raw(), true)
        {
            plan.fail(Step::MapUser, e);
        }
    }
    // SAFETY: stage 1 is single-threaded (it is a fresh fork).
    match unsafe { sys::clone_process(libc::CLONE_PARENT) } {
        Err(e) => plan.fail(Step::StartInit, e),
        Ok(0) => init(plan, runtime_dir),
        Ok(pid) => {
            let mut msg = vec![MSG_INIT_PID];
            msg.extend_from_slice(&pid.to_le_bytes());
            let _ = sys::send_message(plan.report(), &msg, None);
            // SAFETY: see `fail`.
            unsafe { libc::_exit(0) }
        }
    }
}

/// init as the child of a single-threaded host that cloned it straight into [`NAMESPACES`]:
/// it starts with the host's credentials, waits until the host has written its id maps, and
/// in root mode, or rootless with subordinate ids, then drops the host's groups and becomes
/// the sandbox user (the mapped ids are the per-sandbox host ids), keeping its capabilities
/// inside its own user namespace.
pub(crate) fn init_in_namespaces(plan: &ChildPlan) -> ! {
    plan.close_host_descriptors();
    if !plan.await_maps() {
        // The host gave up on this sandbox.
        // SAFETY: see `ChildPlan::fail_on`.
        unsafe { libc::_exit(0) }
    }
    let runtime_dir = plan.open_runtime_dir();
    if plan.switch_to.is_some() || plan.host_maps {
        if let Err(e) = become_user(Uid::from_raw(SANDBOX_UID), Gid::from_raw(SANDBOX_GID)) {
            plan.fail(Step::SandboxUser, e);
        }
    }
    init(plan, runtime_dir)
}

/// Drops every supplementary group and takes `uid` and `gid` as real, effective and saved ids.
pub(crate) fn become_user(uid: Uid, gid: Gid) -> nix::Result<()> {
    nix::unistd::setgroups(&[])?;
    nix::unistd::setresgid(gid, gid, gid)?;
    nix::unistd::setresuid(uid, uid, uid)
}

/// [`become_user`], keeping the permitted capabilities (the lockdown then reduces them).
fn become_user_keeping_capabilities(uid: Uid, gid: Gid) -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    become_user(uid, gid)?;
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, 0, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Joins the sandbox's cgroup (the host's [`MSG_CGROUP`]) and makes it the root of a new
/// cgroup namespace. Returns whether there was a cgroup to join.
fn join_cgroup(plan: &ChildPlan) -> io::Result<bool> {
    let files = receive_cgroup_files(plan)?;
    for &fd in &files {
        // SAFETY: `fd` is an open cgroup membership file the host process sent us.
        let n = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
        let written = if n == 1 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        };
        // SAFETY: the descriptor is ours and not used again.
        unsafe { libc::close(fd) };
        written?;
    }
    unshare(CloneFlags::CLONE_NEWCGROUP)?;
    Ok(!files.is_empty())
}

/// Waits for a [`MSG_CGROUP`]; the descriptors it carried (none: no cgroup).
fn receive_cgroup_files(plan: &ChildPlan) -> io::Result<Vec<RawFd>> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut byte = [0u8; 1];
    let mut iov = [io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; MAX_CGROUP_FILES]);
    let msg = recvmsg::<()>(plan.report, &mut iov, Some(&mut space), MsgFlags::empty())?;
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(received) = cmsg {
            fds.extend(received);
        }
    }
    if msg.bytes != 1 || byte[0] != MSG_CGROUP {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the host gave up on this sandbox",
        ));
    }
    Ok(fds)
}

/// Pid 1 of the sandbox; `runtime_dir` is [`ChildPlan::open_runtime_dir`]'s.
fn init(plan: &ChildPlan, runtime_dir: Option<OwnedFd>) -> ! {
    // Non-dumpable before any sandbox process exists: init's memory is a copy of the host
    // process's (environment included) and must never be readable through /proc/1.
    // No PR_SET_PDEATHSIG: it fires when the host *thread* that forked exits, which a
    // multithreaded host does all the time. The control pipe is the lifeline instead: it
    // reads EOF once the host process is gone, and init then kills everything.
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if let Err(e) = sys::scrub_args_and_environment() {
        plan.fail(Step::HideCommandLine, e);
    }
    let _ = nix::unistd::setsid();

    // SIGCHLD is taken through a signalfd so that init can wait for children and for the
    // host's requests at once; the workload restores an empty mask before exec.
    let mut sigchld = nix::sys::signal::SigSet::empty();
    sigchld.add(nix::sys::signal::Signal::SIGCHLD);
    if let Err(e) = sigchld.thread_block() {
        plan.fail(Step::BlockSigchld, e);
    }
    let children = match nix::sys::signalfd::SignalFd::with_flags(
        &sigchld,
        nix::sys::signalfd::SfdFlags::SFD_CLOEXEC | nix::sys::signalfd::SfdFlags::SFD_NONBLOCK,
    ) {
        Ok(fd) => fd,
        Err(e) => plan.fail(Step::Signalfd, e),
    };

    // The workload starts now, makes the network namespace and locks itself down (cgroup,
    // capabilities, seccomp) while init builds the root; it waits on `go` before it runs
    // anything of the program's.
    let (go_r, go_w) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(pipe) => pipe,
        Err(e) => plan.fail(Step::StartPipe, e),
    };
    // The workload sends the network namespace it made here.
    let (network_in, network_out) = match nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::SeqPacket,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    ) {
        Ok(pair) => pair,
        Err(e) => plan.fail(Step::SocketPair, e),
    };
    // SAFETY: init is single-threaded.
    let workload_pid = match unsafe { nix::unistd::fork() } {
        Err(e) => plan.fail(Step::StartWorkload, e),
        Ok(ForkResult::Child) => {
            drop((go_w, network_in, runtime_dir));
            workload(plan, go_r, network_out)
        }
        Ok(ForkResult::Parent { child }) => child,
    };
    drop(go_r);
    drop(network_out);
    if let Some(cpus) = &plan.cpus {
        move_off_this_cpu(workload_pid, cpus);
        // Undoes the host's move of init (init stays where it is: its CPU is among `cpus`).
        let _ = nix::sched::sched_setaffinity(Pid::from_raw(0), cpus);
    }

    if let Some((instances, watches)) = plan.inotify_limits {
        if let Err(e) = crate::lockdown::limit_inotify(instances, watches) {
            plan.fail(Step::Inotify, e);
        }
    }
    if let Err(e) = build_root(plan, runtime_dir) {
        plan.fail(Step::BuildRoot, e);
    }
    let mut byte = [0u8; 1];
    let Ok((1, Some(network))) = sys::recv_message(network_in.as_fd(), &mut byte) else {
        // The workload failed and has reported why.
        // SAFETY: see `ChildPlan::fail_on`.
        unsafe { libc::_exit(126) }
    };
    drop(network_in);
    // Nothing of the sandbox may stay in the host's network namespace: the program can read
    // /proc/1/net.
    if let Err(e) = nix::sched::setns(network, CloneFlags::CLONE_NEWNET) {
        plan.fail(Step::JoinNetwork, e);
    }
    if plan.proxy_endpoint {
        let sent = corral_egress::listen().and_then(|endpoint| {
            sys::send_message(plan.report(), &[MSG_PROXY], Some(endpoint.as_raw_fd()))
        });
        if let Err(e) = sent {
            plan.fail(Step::ProxyEndpoint, e);
        }
    }
    let workspace = match nix::fcntl::open(
        "/workspace",
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(e) => plan.fail(Step::OpenWorkspace, e),
    };
    if let Err(e) = sys::send_message(plan.report(), &[MSG_READY], Some(workspace)) {
        plan.fail(Step::ReportReady, e);
    }
    let _ = nix::unistd::close(workspace);

    let mut go = [b'g'];
    if !plan.start_at_once
        && (!matches!(nix::unistd::read(plan.control, &mut go), Ok(1)) || go[0] != b'g')
    {
        // The host gave up on this sandbox; the workload dies with init.
        // SAFETY: see `fail`.
        unsafe { libc::_exit(0) }
    }
    if nix::unistd::write(&go_w, b"g") != Ok(1) {
        plan.fail(Step::StartWorkload, io::Error::last_os_error());
    }
    drop(go_w);
    for fd in [plan.stdout, plan.stderr]
        .into_iter()
        .chain(plan.socket)
        .chain(plan.stdin)
    {
        let _ = nix::unistd::close(fd);
    }
    if let Some((uid, gid)) = plan.switch_to.filter(|_| plan.host_userns) {
        if let Err(e) = become_user(uid, gid) {
            plan.fail(Step::SwitchUser, e);
        }
    }
    if let Err(e) = crate::lockdown::init(plan.init_filters) {
        plan.fail(e.step(), e);
    }

    // A zygote's sessions live in pid namespaces below its own, as init's children once their
    // forking child is gone: they outlive the zygote, and init waits for them.
    let kill_with_workload = plan.role == crate::spec::Role::Workload;
    let status = supervise(plan.control, &children, workload_pid, kill_with_workload);
    let mut msg = vec![MSG_EXIT];
    msg.extend_from_slice(&status.to_le_bytes());
    let _ = sys::send_message(plan.report(), &msg, None);
    // SAFETY: see `fail`.
    unsafe { libc::_exit(0) }
}

fn build_root(plan: &ChildPlan, runtime_dir: Option<OwnedFd>) -> io::Result<()> {
    let root = Path::new(NEW_ROOT);
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )?;
    let data = format!("size={},mode=755,nr_inodes=4096", plan.root_size);
    mount(
        Some("tmpfs"),
        root,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )?;
    rootfs::execute(&plan.ops, root)?;
    if let Some(dir) = runtime_dir {
        rootfs::bind_runtime_dir(dir.as_fd(), root)?;
    }
    nix::unistd::sethostname(rootfs::HOSTNAME)?;
    mount(
        Some(root),
        root,
        None::<&str>,
        MsFlags::MS_REMOUNT
            | MsFlags::MS_BIND
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV,
        None::<&str>,
    )?;
    chdir(root)?;
    // Also moves the workload's root, which is the same old root.
    pivot_root(".", ".")?;
    umount2(".", MntFlags::MNT_DETACH)?;
    chdir("/workspace")?;
    Ok(())
}

/// Makes the sandbox's network namespace, with only a loopback interface, up; returns it for
/// init to join. (init cannot open it through the workload's /proc directory or a pidfd: the
/// workload is not dumpable.)
fn make_network() -> io::Result<std::fs::File> {
    unshare(CloneFlags::CLONE_NEWNET)?;
    sys::loopback_up().map_err(|e| io::Error::new(e.kind(), format!("loopback up: {e}")))?;
    std::fs::File::open("/proc/thread-self/ns/net")
}

/// Moves `pid` to the CPUs of `cpus` other than the caller's, if there are any.
///
/// A forked child starts on its parent's CPU, and the kernel seldom moves a task within the
/// 2 ms a sandbox takes to build. Without this, init would wait on the host's CPU while the
/// host makes the cgroup (0.41 ms median, in 32 of 40 runs on the 2-vCPU test VM), and the
/// workload would make the network namespace on init's CPU, taking turns with init's mounts,
/// while another CPU idles. init takes `cpus` back once it has moved the workload, and the
/// workload before it execs ([`workload`]), after init's `go`: the program always starts
/// with the affinity of the host.
pub(crate) fn move_off_this_cpu(pid: Pid, cpus: &nix::sched::CpuSet) {
    let Ok(here) = nix::sched::sched_getcpu() else {
        return;
    };
    let mut others = *cpus;
    if others.unset(here).is_ok() {
        // An empty set (a single usable CPU) is refused with EINVAL and changes nothing.
        let _ = nix::sched::sched_setaffinity(pid, &others);
    }
}

/// Serves the host's requests and reaps children until the workload has exited and nothing
/// else is left; everything still running is killed once the host closes the control pipe,
/// and once the workload is gone when `kill_with_workload`. Returns the workload's raw wait
/// status.
pub(crate) fn supervise(
    control: RawFd,
    children: &nix::sys::signalfd::SignalFd,
    workload: Pid,
    kill_with_workload: bool,
) -> i32 {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;

    let mut workload_status = None;
    let mut host_gone = false;
    loop {
        // Reap whatever has exited.
        loop {
            let mut raw = 0;
            // SAFETY: waitpid writes the status into a valid i32.
            let pid = unsafe { libc::waitpid(-1, &mut raw, libc::WNOHANG) };
            if pid <= 0 {
                if pid < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD) {
                    return workload_status.unwrap_or(raw);
                }
                break;
            }
            if pid == workload.as_raw() {
                workload_status = Some(raw);
            }
        }
        if workload_status.is_some() && kill_with_workload || host_gone {
            // Daemons and stragglers die with the workload. Repeated after every reap so a
            // process forked during a sweep is caught by the next one.
            // SAFETY: kill(-1) from a namespace's init signals every other process in it.
            unsafe { libc::kill(-1, libc::SIGKILL) };
        }
        // SAFETY: the control pipe stays open until init exits.
        let control_fd = unsafe { BorrowedFd::borrow_raw(control) };
        let mut fds = vec![PollFd::new(children.as_fd(), PollFlags::POLLIN)];
        if !host_gone {
            fds.push(PollFd::new(control_fd, PollFlags::POLLIN));
        }
        if let Err(e) = poll(&mut fds, PollTimeout::NONE) {
            if e != nix::errno::Errno::EINTR {
                host_gone = true;
            }
            continue;
        }
        let control_ready = fds
            .get(1)
            .and_then(|f| f.revents())
            .is_some_and(|r| !r.is_empty());
        while children.read_signal().is_ok_and(|s| s.is_some()) {}
        if control_ready {
            // One message per request (the control socket is a SEQPACKET pair).
            let mut buf = [0u8; 64];
            match sys::recv_message(control_fd, &mut buf) {
                Ok((0, _)) | Err(_) => host_gone = true,
                Ok((n, fd)) => match &buf[..n] {
                    [b'i'] if workload_status.is_none() => {
                        let _ = nix::sys::signal::kill(workload, nix::sys::signal::Signal::SIGINT);
                    }
                    [crate::ports::MSG_CONNECT, port @ ..] => crate::ports::answer(port, fd),
                    _ => {}
                },
            }
        }
    }
}

/// The workload process: drops everything, waits for init's `go` (the root is built and the
/// host has released the program), then becomes the program.
fn workload(plan: &ChildPlan, go: std::os::fd::OwnedFd, network_out: std::os::fd::OwnedFd) -> ! {
    let network = match make_network() {
        Ok(ns) => ns,
        Err(e) => plan.fail(Step::CreateNetwork, e),
    };
    if let Err(e) = sys::send_message(network_out.as_fd(), b"n", Some(network.as_raw_fd())) {
        plan.fail(Step::PassNetwork, e);
    }
    drop(network);
    drop(network_out);
    if let Err(e) = redirect_stdio(plan.stdin, plan.stdout, plan.stderr, plan.socket) {
        plan.fail(Step::Stdio, e);
    }
    if let Err(e) = nix::sys::signal::SigSet::empty().thread_set_mask() {
        plan.fail(Step::SignalMask, e);
    }
    // Neither Corral's runtime (which ignores SIGPIPE) nor whoever started it decides how the
    // program reacts to signals: without this, `yes | head -1` would print "Broken pipe".
    sys::reset_signal_dispositions();
    sys::cloexec_from(if plan.socket.is_some() { 4 } else { 3 });
    let in_cgroup = match join_cgroup(plan) {
        Ok(joined) => joined,
        Err(e) => plan.fail(Step::JoinCgroup, e),
    };
    // The zygote's sessions mount their own filesystems, which a Landlock domain forbids;
    // each session applies Landlock itself before running any code.
    let lockdown = Lockdown {
        filters: plan.workload_filters,
        rlimits: if in_cgroup {
            plan.rlimits.clone()
        } else {
            plan.fallback_rlimits.clone()
        },
        landlock: (plan.role == crate::spec::Role::Workload).then_some(plan.landlock_required),
        keep_capabilities: if plan.host_userns
            || plan.host_maps && plan.role == crate::spec::Role::Zygote
        {
            &crate::lockdown::ID_CAPABILITIES
        } else {
            &[]
        },
    };
    if let Some((uid, gid)) = plan.switch_to.filter(|_| plan.host_userns) {
        if let Err(e) = become_user_keeping_capabilities(uid, gid) {
            plan.fail(Step::SwitchUser, e);
        }
    }
    if let Err(e) = lockdown.privileges() {
        plan.fail(e.step(), e);
    }

    let mut byte = [0u8; 1];
    if !matches!(nix::unistd::read(go.as_raw_fd(), &mut byte), Ok(1)) {
        // init gave up (and the sandbox is being torn down).
        // SAFETY: see `ChildPlan::fail_on`.
        unsafe { libc::_exit(0) }
    }
    drop(go);
    // Undoes init's `move_off_this_cpu`.
    if let Some(cpus) = &plan.cpus {
        if let Err(e) = nix::sched::sched_setaffinity(Pid::from_raw(0), cpus) {
            plan.fail(Step::CpuAffinity, e);
        }
    }
    if let Err(e) = chdir("/workspace") {
        plan.fail(Step::EnterWorkspace, e);
    }
    if let Some(env) = &plan.agent_env {
        let started = crate::agent_fork::start(
            crate::agent_fork::Forker::Workload,
            &lockdown,
            env.clone(),
            plan.report(),
        );
        if let Err(e) = started {
            plan.fail(Step::ProcessAgent, e);
        }
    }
    if let Err(e) = lockdown.confine() {
        plan.fail(e.step(), e);
    }
    let argv: Vec<*const libc::c_char> = plan
        .argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp: Vec<*const libc::c_char> = plan
        .envp
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let mut last = io::Error::from_raw_os_error(libc::ENOENT);
    for path in &plan.exec_candidates {
        // SAFETY: path, argv and envp are NUL-terminated arrays of valid C strings that
        // outlive the call.
        unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
        last = io::Error::last_os_error();
        if last.raw_os_error() != Some(libc::ENOENT) {
            break;
        }
    }
    let program = plan.argv[0].to_string_lossy();
    plan.fail_on(
        Step::Exec,
        &format!("{program} (is it installed in this image?)"),
        last,
    )
}

/// Standard input from `stdin` (else `/dev/null`), `stdout` and `stderr` as 1 and 2, `socket`
/// (if any) as 3.
pub(crate) fn redirect_stdio(
    stdin: Option<RawFd>,
    stdout: RawFd,
    stderr: RawFd,
    socket: Option<RawFd>,
) -> io::Result<()> {
    let stdin = match stdin {
        Some(fd) => fd,
        None => nix::fcntl::open(
            "/dev/null",
            nix::fcntl::OFlag::O_RDONLY,
            nix::sys::stat::Mode::empty(),
        )?,
    };
    for (from, to) in [(stdin, 0), (stdout, 1), (stderr, 2)]
        .into_iter()
        .chain(socket.map(|s| (s, 3)))
    {
        if from == to {
            // dup2 onto itself is a no-op that would leave close-on-exec set.
            nix::fcntl::fcntl(
                to,
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
            )?;
        } else {
            nix::unistd::dup2(from, to)?;
        }
    }
    Ok(())
}

/// Decodes a raw wait status into (exit code, signal).
pub(crate) fn decode_status(raw: i32) -> (Option<i32>, Option<i32>) {
    match WaitStatus::from_raw(Pid::from_raw(1), raw) {
        Ok(WaitStatus::Exited(_, code)) => (Some(code), None),
        Ok(WaitStatus::Signaled(_, sig, _)) => (None, Some(sig as i32)),
        _ => (None, None),
    }
}

/// Reaps one of our own children (stage 1 or init), retrying on EINTR.
pub(crate) fn reap(pid: Pid) -> Option<i32> {
    loop {
        match waitpid(pid, None) {
            Ok(WaitStatus::Exited(_, code)) => return Some(code),
            Ok(_) => return None,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return None,
        }
    }
}
