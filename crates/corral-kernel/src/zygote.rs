//! The zygotes: sandboxed Pythons that fork sessions and one-shot runs in milliseconds. An
//! image's full zygote has the heavy libraries (IPython, numpy, pandas, matplotlib) imported
//! and forks sessions and the one-shot runs that use them; its lean zygote has only the
//! one-shot runner (and a few light standard modules) imported and forks the other one-shot
//! runs, whose forks then copy and tear down far less memory. A fork request carries only the
//! session's descriptors; the session's plan (limits, environment) goes to the
//! forked child alone, on the session's own control socket, so the zygote never holds any
//! tenant's data. The child enters namespaces, a cgroup and restrictions of its own through
//! the engine's lockdown ([`corral_sandbox::session`], loaded into the zygote as
//! `libcorral_session.so`) before any code runs; the host then verifies that through `/proc`
//! before the session is handed out.

use std::collections::BTreeSet;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_egress::{proxy_environment, EgressMonitor, EgressProxy};
use corral_sandbox::cgroup::Cgroup;
use corral_sandbox::ids::{HostIds, IdLease};
use corral_sandbox::session::{
    SessionPlan, MAX_PLAN_BYTES, MSG_AGENT, MSG_ERROR, MSG_EXIT, MSG_KERNEL, MSG_PROXY, MSG_READY,
};
use corral_sandbox::setup::ChildFailure;
use corral_sandbox::{
    children_peak_memory, landlock_warning, recv_with_credentials, sandbox_cgroup, send_fds,
    Charge, ControlSocket, Egress, Finish, Limits, Owner, Policy, Report, Role, Rootfs, Sandbox,
    SandboxError, SandboxSpec, Supervised, Workspace, ROOTLESS_INOTIFY_LIMITS,
};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{setsockopt, socketpair, sockopt, AddressFamily, SockFlag, SockType};
use nix::unistd::Pid;

use crate::policy::CodePolicy;
use crate::protocol::{encode, Decoder, HostMessage, KernelMessage, ResultLimits};
use crate::runtime::{
    as_support_files, every_kernel_file, PYTHON_KERNEL_LIB, PYTHON_ONESHOT, PYTHON_POLICY,
    SESSION_LIBRARY, ZYGOTE,
};
use crate::session::{KernelError, KernelHost, KernelProcess, Language, Session, SessionOptions};

/// How long forking one session may take before it is given up.
const FORK_TIMEOUT: Duration = Duration::from_secs(10);

/// Which of an image's two zygotes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ZygoteKind {
    /// IPython and the data stack (numpy, pandas, matplotlib) imported: forks sessions, and
    /// the one-shot runs that import the data stack.
    Full,
    /// The one-shot runner alone (and a few light standard modules): forks the other one-shot
    /// runs, never a session.
    Lean,
}

impl ZygoteKind {
    pub const ALL: [ZygoteKind; 2] = [ZygoteKind::Full, ZygoteKind::Lean];

    /// `full` or `lean`, as `/metrics` labels it.
    pub fn name(self) -> &'static str {
        match self {
            ZygoteKind::Full => "full",
            ZygoteKind::Lean => "lean",
        }
    }
}

/// A pre-imported Python that forks sessions or one-shot runs.
pub struct Zygote {
    sandbox: Sandbox,
    socket: OwnedFd,
    rootfs: Rootfs,
    kind: ZygoteKind,
    /// The heavy modules the zygote managed to import (an image may lack some); none for a
    /// lean zygote.
    pub preloaded: Vec<String>,
    /// A lean zygote: the top-level names of every module it has imported.
    modules: BTreeSet<String>,
    /// A lean zygote: the names of the standard library's modules, as its interpreter knows
    /// them.
    stdlib: BTreeSet<String>,
}

impl std::fmt::Debug for Zygote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Zygote")
            .field("rootfs", &self.rootfs)
            .field("kind", &self.kind)
            .field("preloaded", &self.preloaded)
            .finish()
    }
}

impl Zygote {
    /// Starts a zygote of `kind` for `rootfs` and waits until its imports are done.
    pub fn start(
        rootfs: &Rootfs,
        image_env: &[(String, String)],
        policy: Policy,
        kind: ZygoteKind,
    ) -> Result<Zygote, KernelError> {
        let mut argv = vec!["python3".into(), format!("/run/corral/{}", ZYGOTE.0)];
        let mut files = match kind {
            ZygoteKind::Full => every_kernel_file(),
            ZygoteKind::Lean => {
                argv.push("lean".into());
                // The code policy's hook too: the runs it forks may have a policy.
                as_support_files([PYTHON_KERNEL_LIB, PYTHON_POLICY])
            }
        };
        let mut spec = SandboxSpec::new(argv);
        spec.rootfs = rootfs.clone();
        spec.role = Role::Zygote;
        spec.env = image_env.to_vec();
        spec.policy = policy;
        spec.control_socket = Some(ControlSocket::SeqPacket);
        // The zygote's own cgroup holds only the zygote (sessions get their own); it is sized
        // for the preloaded libraries.
        spec.limits = Limits {
            memory_bytes: 2 << 30,
            pids: 64,
            ..Limits::default()
        };
        // One-shot runs served from forks run the one-shot runner, imported before the forks.
        files.extend(as_support_files([ZYGOTE, PYTHON_ONESHOT]));
        files.push((SESSION_LIBRARY.0.into(), SESSION_LIBRARY.1.to_vec()));
        spec.support_files = files;
        let mut sandbox = Sandbox::create(&spec)?;
        let socket = sandbox
            .take_socket()
            .expect("a control socket was requested");
        sandbox.start()?;
        let fail = |reason: String| KernelError::Startup {
            language: "python zygote",
            reason,
        };
        let mut buf = vec![0u8; 64 << 10];
        let mut stderr = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(fail("no answer within 120 s".into()));
            }
            let mut fds = [
                PollFd::new(socket.as_fd(), PollFlags::POLLIN),
                PollFd::new(sandbox.stderr_fd(), PollFlags::POLLIN),
                PollFd::new(sandbox.report_fd(), PollFlags::POLLIN),
            ];
            let _ = poll(
                &mut fds,
                PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX),
            );
            let ready: Vec<bool> = fds
                .iter()
                .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                .collect();
            if ready[1] {
                if let Ok(n) = nix::unistd::read(sandbox.stderr_fd().as_raw_fd(), &mut buf) {
                    stderr.extend_from_slice(&buf[..n.min(8192usize.saturating_sub(stderr.len()))]);
                }
            }
            if ready[0] {
                let n = nix::sys::socket::recv(
                    socket.as_raw_fd(),
                    &mut buf,
                    nix::sys::socket::MsgFlags::empty(),
                )
                .map_err(io::Error::from)?;
                if n == 0 {
                    // It died before it was ready: wait for init's report, which says why.
                    let mut report = [PollFd::new(sandbox.report_fd(), PollFlags::POLLIN)];
                    let _ = poll(&mut report, PollTimeout::from(2000u16));
                    while let Ok(n) = nix::unistd::read(sandbox.stderr_fd().as_raw_fd(), &mut buf) {
                        if n == 0 || stderr.len() >= 8192 {
                            break;
                        }
                        stderr.extend_from_slice(&buf[..n.min(8192 - stderr.len())]);
                    }
                    return Err(fail(format!(
                        "it exited before it was ready; stderr: {}",
                        String::from_utf8_lossy(&stderr)
                    )));
                }
                let ready: serde_json::Value = serde_json::from_slice(&buf[..n])
                    .map_err(|e| fail(format!("bad ready message: {e}")))?;
                let names = |key: &str| -> Vec<String> {
                    ready[key]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|v| v.as_str().map(String::from))
                                .collect()
                        })
                        .unwrap_or_default()
                };
                return Ok(Zygote {
                    sandbox,
                    socket,
                    rootfs: rootfs.clone(),
                    kind,
                    preloaded: names("preloaded"),
                    modules: names("modules").into_iter().collect(),
                    stdlib: names("stdlib").into_iter().collect(),
                });
            }
            if ready[2] {
                let why = match sandbox.read_report() {
                    Report::SetupError(failure) => failure.to_string(),
                    _ => format!("it exited; stderr: {}", String::from_utf8_lossy(&stderr)),
                };
                return Err(fail(why));
            }
        }
    }

    /// Whether the zygote process still takes fork requests: its end of the request socket
    /// hangs up when it dies. (Its sandbox's init outlives it while sessions it forked live:
    /// they are in pid namespaces below the zygote's.)
    pub fn is_alive(&self) -> bool {
        let mut fds = [PollFd::new(self.socket.as_fd(), PollFlags::empty())];
        !matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
    }

    pub fn kind(&self) -> ZygoteKind {
        self.kind
    }

    /// Whether a one-shot program that imports `imports` (top-level module names, see
    /// [`crate::imports`]) is better forked from the full zygote than from this lean one: it
    /// imports a module that this zygote has not imported and that is not part of the
    /// standard library (the data stack and what builds on it, or a module of the run's
    /// workspace). A standard module costs a few milliseconds to import, less than the fork
    /// of the full zygote costs more; the data stack costs from 0.1 to 0.7 s.
    pub fn prefers_full(&self, imports: &BTreeSet<&str>) -> bool {
        imports_beyond(imports, &self.modules, &self.stdlib)
    }

    /// Forks a Python session from the zygote with the given options (its rootfs must be the
    /// zygote's) and waits until its kernel is ready and verified.
    pub fn fork_session(&self, options: &SessionOptions) -> Result<Session, KernelError> {
        assert_eq!(options.language, Language::Python, "the zygote runs Python");
        assert_eq!(
            self.kind,
            ZygoteKind::Full,
            "only the full zygote serves sessions"
        );
        let forked = self.fork(
            &options.limits,
            options.policy,
            &options.egress,
            &options.env,
            None,
        )?;
        let mut session = Session::from_kernel(
            KernelProcess {
                host: KernelHost::Forked(forked.kernel),
                socket: forked.protocol,
            },
            options.clone(),
            forked.warnings,
        )?;
        if let Some(agent) = forked.agent {
            session.set_agent(crate::agent::ProcessAgent::new(agent)?);
        }
        verify_isolation(forked.kernel_pid)
            .map_err(|e| fork_failed(format!("isolation check failed: {e}")))?;
        Ok(session)
    }

    /// Forks a one-shot run of the Python program `code`, placed at `/run/corral/<file_name>`,
    /// with these limits, policy and environment (on top of the zygote's, which is the
    /// image's): a sandbox like a session's, whose kernel runs the program as the one-shot
    /// runner does in a fresh interpreter once [`ForkedRun`] is started.
    pub fn fork_run(
        &self,
        limits: &Limits,
        policy: Policy,
        env: &[(String, String)],
        file_name: &str,
        code: &[u8],
    ) -> Result<ForkedRun, KernelError> {
        let forked = self.fork(
            limits,
            policy,
            &Egress::default(),
            env,
            Some((file_name, code)),
        )?;
        Ok(ForkedRun {
            kernel: forked.kernel,
            protocol: forked.protocol,
            kernel_pid: forked.kernel_pid,
            limits: *limits,
            warnings: forked.warnings,
            code_policy: CodePolicy::default(),
            keepalive: None,
        })
    }

    /// Forks a child that enters a sandbox of its own with `limits`, `egress` and `env` (and,
    /// for a one-shot run, the program's file name and text): the request carries descriptors
    /// only, the plan goes to the child on its own control socket. Returns once the child's
    /// init has reported its workspace, its proxy endpoint (with a network policy) and its
    /// kernel; the kernel may still be locking itself down.
    fn fork(
        &self,
        limits: &Limits,
        policy: Policy,
        egress: &Egress,
        env: &[(String, String)],
        program: Option<(&str, &[u8])>,
    ) -> Result<Forked, KernelError> {
        let limits = *limits;
        let host_ids = corral_sandbox::host_ids();
        let (cgroup, cgroup_warning) = sandbox_cgroup(&limits, policy)?;
        if program.is_some() && cgroup.is_none() {
            // Without a cgroup a fresh interpreter's memory use is measured by its rusage,
            // which a fork's cannot match.
            return Err(KernelError::NeedsFreshInterpreter(
                cgroup_warning.unwrap_or_default(),
            ));
        }
        let warnings = match program {
            // A one-shot run warns as a one-shot sandbox does.
            Some(_) => landlock_warning(policy)?
                .into_iter()
                .chain(corral_sandbox::ids::warning())
                .chain(cgroup_warning)
                .collect(),
            // A session warns as its zygote's sandbox does (the host ids among it).
            None => {
                let mut warnings: Vec<String> = self.sandbox.warnings().to_vec();
                warnings.extend(cgroup_warning);
                warnings
            }
        };
        let join = match &cgroup {
            Some(c) => c.join_files()?,
            None => Vec::new(),
        };
        let (stdout_r, stdout_w) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
        let (stderr_r, stderr_w) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
        let (proto_host, proto_kernel) = socketpair(
            AddressFamily::Unix,
            SockType::Stream,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(io::Error::from)?;
        let (control_host, control_init) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(io::Error::from)?;
        setsockopt(&control_host, sockopt::PassCred, &true).map_err(io::Error::from)?;

        // The session's own host ids, which no other live sandbox has (but rootless without
        // subordinate ids): the zygote switches to them before the session makes its user
        // namespace. Rootless, they are ids of the zygote's namespace, which maps them.
        let id_lease = match host_ids {
            HostIds::Root(pool) => Some(pool.acquire()?),
            HostIds::Subordinate(sub) => Some(sub.pool.acquire()?),
            HostIds::Caller { .. } => None,
        };
        let owner = match (host_ids, &id_lease) {
            (HostIds::Root(_), Some(lease)) => Owner::Host {
                uid: lease.uid(),
                gid: lease.gid(),
            },
            (HostIds::Subordinate(_), Some(lease)) => Owner::Namespace {
                userns: self
                    .sandbox
                    .user_namespace()
                    .ok_or_else(|| {
                        fork_failed("the zygote has no user namespace of its own".into())
                    })?
                    .clone(),
                uid: lease.zygote_id(),
                gid: lease.zygote_id(),
            },
            _ => Owner::Caller,
        };
        let proxy_endpoint = !egress.policy.is_none();
        // Sessions have a process agent; one-shot runs do not.
        let want_agent = program.is_none();
        // The proxy's variables first, so that the session's own override them.
        let env: Vec<(String, String)> = match proxy_endpoint {
            true => proxy_environment()
                .into_iter()
                .chain(env.iter().cloned())
                .collect(),
            false => env.to_vec(),
        };
        let plan = SessionPlan {
            host_ids: id_lease
                .as_ref()
                .map(|lease| (lease.zygote_id(), lease.zygote_id())),
            disk_bytes: limits.disk_bytes,
            memory_bytes: limits.memory_bytes,
            pids: limits.pids,
            in_cgroup: cgroup.is_some(),
            landlock_required: !policy.allow_degraded,
            inotify_limits: (!matches!(host_ids, HostIds::Root(_)))
                .then_some(ROOTLESS_INOTIFY_LIMITS),
            env,
            program: program.map(|(name, _)| name.to_string()),
            proxy_endpoint,
            agent: want_agent,
        };
        let plan = serde_json::to_vec(&plan).expect("a plan serializes");
        if plan.len() > MAX_PLAN_BYTES {
            return Err(fork_failed(format!(
                "the session's environment is too large ({} bytes; at most {MAX_PLAN_BYTES})",
                plan.len()
            )));
        }
        // A one-shot run's program goes with the plan, as a sealed memory file.
        let program_file = program
            .map(|(_, code)| sealed_memory_file(code))
            .transpose()?;
        let mut fds: Vec<RawFd> = vec![
            proto_kernel.as_raw_fd(),
            control_init.as_raw_fd(),
            stdout_w.as_raw_fd(),
            stderr_w.as_raw_fd(),
        ];
        fds.extend(join.iter().map(|f| f.as_raw_fd()));
        // The request is the descriptors alone; the plan goes to the forked child only.
        send_fds(self.socket.as_fd(), b"f", &fds)?;
        drop((proto_kernel, control_init, stdout_w, stderr_w, join));
        match &program_file {
            Some(file) => send_fds(control_host.as_fd(), &plan, &[file.as_raw_fd()])?,
            None => {
                nix::sys::socket::send(
                    control_host.as_raw_fd(),
                    &plan,
                    nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
                )
                .map_err(io::Error::from)?;
            }
        }
        drop(program_file);

        // The session's init reports its workspace and pid, then its kernel's pid.
        let mut workspace = None;
        let mut init_pid = None;
        let mut kernel_pid = None;
        let mut proxy = None;
        let mut agent = None;
        let deadline = Instant::now() + FORK_TIMEOUT;
        let mut buf = [0u8; 4096];
        while workspace.is_none()
            || kernel_pid.is_none()
            || (proxy_endpoint && proxy.is_none())
            || (want_agent && agent.is_none())
        {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut pfd = [PollFd::new(control_host.as_fd(), PollFlags::POLLIN)];
            if left.is_zero()
                || !matches!(poll(&mut pfd, PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX)), Ok(n) if n > 0)
            {
                return Err(fork_failed("no answer from the forked session".into()));
            }
            let got = recv_with_credentials(control_host.as_fd(), &mut buf)?;
            match (buf.get(..got.len), got.fd, got.pid) {
                (Some([MSG_READY]), Some(fd), Some(pid)) => {
                    let charge = cgroup
                        .as_ref()
                        .map(|cg| Charge::new(cg, limits.memory_bytes))
                        .transpose()?;
                    workspace = Some(Workspace::new(fd, owner.clone(), charge));
                    init_pid = Some(pid);
                }
                (Some([MSG_KERNEL]), _, Some(pid)) => kernel_pid = Some(pid),
                (Some([MSG_PROXY]), Some(fd), _) if proxy_endpoint && proxy.is_none() => {
                    proxy = Some(
                        EgressProxy::start(fd, egress.clone(), limits.proxy())
                            .map_err(|e| fork_failed(format!("starting the egress proxy: {e}")))?,
                    );
                }
                (Some([MSG_AGENT]), Some(fd), _) if want_agent && agent.is_none() => {
                    agent = Some(fd);
                }
                (Some(msg @ [MSG_ERROR, ..]), _, _) => {
                    return Err(fork_failed(ChildFailure::decode(msg).map_or_else(
                        || "the forked session sent a garbled report".into(),
                        |failure| failure.to_string(),
                    )))
                }
                _ => return Err(fork_failed("the forked session exited during setup".into())),
            }
        }
        Ok(Forked {
            kernel: ForkedKernel {
                control: Arc::new(control_host),
                stdout: stdout_r,
                stderr: stderr_r,
                workspace: workspace.expect("loop ends with it"),
                init_pid: init_pid.expect("set with the workspace"),
                cgroup,
                killed: false,
                egress: proxy,
                _id_lease: id_lease,
            },
            protocol: proto_host,
            kernel_pid: kernel_pid.expect("loop ends with it"),
            agent,
            warnings,
        })
    }
}

/// A sandbox forked from a zygote, its kernel started.
struct Forked {
    kernel: ForkedKernel,
    /// The host's end of the kernel's fd 3.
    protocol: OwnedFd,
    /// The kernel's pid in our namespace.
    kernel_pid: i32,
    /// The host's end of the session's process agent's socket (a session's fork only).
    agent: Option<OwnedFd>,
    warnings: Vec<String>,
}

/// A memory file holding `bytes`, sealed so that nobody can change it.
fn sealed_memory_file(bytes: &[u8]) -> io::Result<OwnedFd> {
    use nix::fcntl::{fcntl, FcntlArg, SealFlag};
    use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
    let fd = memfd_create(
        c"corral-program",
        MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
    )?;
    let mut file = std::fs::File::from(fd);
    io::Write::write_all(&mut file, bytes)?;
    let fd = OwnedFd::from(file);
    fcntl(
        fd.as_raw_fd(),
        FcntlArg::F_ADD_SEALS(
            SealFlag::F_SEAL_SEAL
                | SealFlag::F_SEAL_SHRINK
                | SealFlag::F_SEAL_GROW
                | SealFlag::F_SEAL_WRITE,
        ),
    )?;
    Ok(fd)
}

/// A one-shot run forked from a zygote ([`Zygote::fork_run`]), to be driven by
/// [`corral_sandbox::wait_for_program`]: starting it waits for the kernel to report ready
/// (locked down), verifies its isolation through `/proc`, and only then lets the program run.
pub struct ForkedRun {
    kernel: ForkedKernel,
    protocol: OwnedFd,
    kernel_pid: i32,
    limits: Limits,
    warnings: Vec<String>,
    /// Its module rules go to the kernel with `run`, on the run's own socket.
    code_policy: CodePolicy,
    /// What the run needs kept as long as it lives: its zygote's sandbox, whose init is the
    /// ancestor of its pid namespace. Declared last, so it is dropped after the kernel.
    keepalive: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

impl ForkedRun {
    pub(crate) fn keep_alive(&mut self, what: Arc<dyn std::any::Any + Send + Sync>) {
        self.keepalive = Some(what);
    }

    /// Runs the program under `policy`'s module rules (docs/code-policy.md).
    pub(crate) fn set_code_policy(&mut self, policy: CodePolicy) {
        self.code_policy = policy;
    }

    /// The host's end of the program's fd 3 (its result frames).
    pub fn socket(&self) -> BorrowedFd<'_> {
        self.protocol.as_fd()
    }

    pub fn workspace(&self) -> &Workspace {
        &self.kernel.workspace
    }

    /// Protections weaker than requested for this run.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Waits until the kernel, locked down, reports ready on its protocol socket.
    fn await_ready(&mut self) -> Result<(), ForkedRunError> {
        let not_ready = |why: &str| Err(ForkedRunError::NotReady(why.to_string()));
        let deadline = Instant::now() + FORK_TIMEOUT;
        let mut decoder = Decoder::with_limits(ResultLimits::of(&self.limits));
        let mut buf = [0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut fds = [
                PollFd::new(self.protocol.as_fd(), PollFlags::POLLIN),
                PollFd::new(self.kernel.control.as_fd(), PollFlags::POLLIN),
            ];
            match poll(
                &mut fds,
                PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX),
            ) {
                Ok(0) => return not_ready("no answer from the forked kernel"),
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(ForkedRunError::Poll(e)),
            }
            if fds[1].revents().is_some_and(|r| !r.is_empty()) {
                return match self.kernel.read_report() {
                    Report::SetupError(failure) => Err(ForkedRunError::Setup(failure)),
                    _ => not_ready("the forked kernel exited before it was ready"),
                };
            }
            if fds[0].revents().is_some_and(|r| !r.is_empty()) {
                match nix::unistd::read(self.protocol.as_raw_fd(), &mut buf) {
                    Ok(0) | Err(_) => return not_ready("the forked kernel exited"),
                    Ok(n) => decoder.push(&buf[..n]),
                }
                match decoder.next_message() {
                    Ok(Some(KernelMessage::Ready { .. })) => return Ok(()),
                    Ok(Some(_)) => return not_ready("the forked kernel spoke before it was ready"),
                    Ok(None) => {}
                    Err(e) => return not_ready(&e.to_string()),
                }
            }
        }
    }
}

impl Supervised for ForkedRun {
    fn limits(&self) -> &Limits {
        &self.limits
    }

    fn start(&mut self) -> Result<(), SandboxError> {
        let fail = |e: ForkedRunError| SandboxError::Start(Box::new(e));
        self.await_ready().map_err(fail)?;
        verify_isolation(self.kernel_pid).map_err(|e| fail(ForkedRunError::Isolation(e)))?;
        nix::sys::socket::send(
            self.protocol.as_raw_fd(),
            &encode(&HostMessage::Run {
                policy: self.code_policy.module_rules(Language::Python),
            }),
            nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
        )
        .map_err(|e| fail(ForkedRunError::Release(e)))?;
        Ok(())
    }

    fn stdout_fd(&self) -> BorrowedFd<'_> {
        self.kernel.stdout.as_fd()
    }

    fn stderr_fd(&self) -> BorrowedFd<'_> {
        self.kernel.stderr.as_fd()
    }

    fn report_fd(&self) -> BorrowedFd<'_> {
        self.kernel.control.as_fd()
    }

    fn read_report(&mut self) -> Report {
        self.kernel.read_report()
    }

    fn kill(&mut self) {
        self.kernel.kill();
    }

    fn finish(&mut self) -> Finish {
        // The cgroup holds the run's init and kernel (and whatever the program started): read,
        // then removed once they are gone.
        let cgroup = self.kernel.cgroup.take();
        let oom_killed = cgroup.as_ref().is_some_and(|c| c.oom_kills() > 0);
        let peak_memory_bytes = cgroup.as_ref().and_then(Cgroup::peak_memory).unwrap_or(0);
        let cpu_time = cgroup
            .as_ref()
            .and_then(Cgroup::cpu_time)
            .unwrap_or(Duration::ZERO);
        let network = self.kernel.egress.take().map(|mut proxy| proxy.stop());
        self.kernel.kill();
        drop(cgroup);
        Finish {
            cpu_time,
            peak_memory_bytes,
            oom_killed,
            network,
        }
    }

    fn has_cgroup(&self) -> bool {
        self.kernel.cgroup.is_some()
    }
}

/// Why a run forked from a zygote did not start.
#[derive(Debug, thiserror::Error)]
enum ForkedRunError {
    /// A setup step of the forked kernel failed, as it reported it.
    #[error("the forked run did not start: {0}")]
    Setup(#[source] ChildFailure),
    #[error("the forked run did not start: {0}")]
    NotReady(String),
    #[error("the forked run did not start: {0}")]
    Poll(#[source] nix::errno::Errno),
    #[error("the forked run did not start: isolation check failed: {0}")]
    Isolation(#[source] IsolationBreach),
    #[error("the forked run did not start: {0}")]
    Release(#[source] nix::errno::Errno),
}

fn fork_failed(reason: String) -> KernelError {
    KernelError::Startup {
        language: "python (zygote)",
        reason,
    }
}

/// Checks from the host, through `/proc`, that a forked kernel holds no capability, cannot
/// gain any, runs under the zygote's and the workload's seccomp filters, and sits in a pid
/// namespace below the zygote's.
pub(crate) fn verify_isolation(pid: i32) -> Result<(), IsolationBreach> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(IsolationBreach::Unreadable)?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or("")
            .to_string()
    };
    for set in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
        let value = field(set);
        if !value.trim_start_matches('0').is_empty() {
            return Err(IsolationBreach::Capabilities { set, value });
        }
    }
    if field("NoNewPrivs:") != "1" {
        return Err(IsolationBreach::NoNewPrivs);
    }
    if field("Seccomp:") != "2" {
        return Err(IsolationBreach::NoSeccompFilter);
    }
    // Two filters from the zygote role, two more from the workload role.
    let filters: u32 = field("Seccomp_filters:").parse().unwrap_or(0);
    if filters < 4 {
        return Err(IsolationBreach::TooFewFilters(filters));
    }
    // NSpid lists the pid in every pid namespace from ours down: host, zygote, session.
    if field("NSpid:").split_whitespace().count() < 3 {
        return Err(IsolationBreach::NoPidNamespace);
    }
    Ok(())
}

/// What [`verify_isolation`] found wrong with a forked kernel (the host then refuses it).
#[derive(Debug, thiserror::Error)]
pub(crate) enum IsolationBreach {
    #[error("its /proc status could not be read")]
    Unreadable(#[source] std::io::Error),
    #[error("{set} {value}: a capability is left")]
    Capabilities { set: &'static str, value: String },
    #[error("no_new_privs is not set")]
    NoNewPrivs,
    #[error("seccomp filter mode is not active")]
    NoSeccompFilter,
    #[error("only {0} seccomp filters are installed")]
    TooFewFilters(u32),
    #[error("the kernel is not in a pid namespace of its own")]
    NoPidNamespace,
}

/// A kernel forked from a zygote: the host's ends of its pipes and its init's control socket.
pub(crate) struct ForkedKernel {
    /// Shared only weakly ([`corral_sandbox::ports::PortOpener`]): closing it ends the session.
    pub control: Arc<OwnedFd>,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    pub workspace: Workspace,
    /// The session init's pid in our namespace (its death takes the session down).
    init_pid: i32,
    pub cgroup: Option<Cgroup>,
    killed: bool,
    /// The egress proxy serving the session's network policy, stopped when it is killed.
    egress: Option<EgressProxy>,
    /// The lease on the session's host ids (but rootless without subordinate ids), released
    /// once it is killed.
    _id_lease: Option<IdLease>,
}

impl ForkedKernel {
    pub fn read_report(&mut self) -> Report {
        let mut buf = [0u8; 4096];
        match corral_sandbox::recv_message(self.control.as_fd(), &mut buf) {
            Ok((5, _)) if buf[0] == MSG_EXIT => {
                Report::Exited(i32::from_le_bytes(buf[1..5].try_into().expect("4 bytes")))
            }
            Ok((n, _)) if n > 0 => {
                ChildFailure::decode(&buf[..n]).map_or(Report::Garbled, Report::SetupError)
            }
            _ => Report::Closed,
        }
    }

    /// Reads what the egress proxy does (none without a network policy).
    pub fn network_monitor(&self) -> Option<EgressMonitor> {
        self.egress.as_ref().map(EgressProxy::monitor)
    }

    /// Opens connections to the session's listeners, until it ends.
    pub fn port_opener(&self) -> corral_sandbox::ports::PortOpener {
        corral_sandbox::ports::PortOpener::new(&self.control)
    }

    pub fn interrupt(&self) -> io::Result<()> {
        nix::sys::socket::send(
            self.control.as_raw_fd(),
            b"i",
            nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
        )?;
        Ok(())
    }

    /// Whether the session's init is alive: its control socket is not hung up. The init is
    /// not our child, so its pid names it only while this holds.
    fn init_alive(&self) -> bool {
        let mut pfd = [PollFd::new(self.control.as_fd(), PollFlags::POLLIN)];
        let hung_up = matches!(poll(&mut pfd, PollTimeout::ZERO), Ok(n) if n > 0)
            && pfd[0]
                .revents()
                .is_some_and(|r| r.contains(PollFlags::POLLHUP));
        !hung_up
    }

    /// Peak memory of the session so far: its cgroup's, or without one (the rlimit fallback)
    /// its kernel's, read while its init is alive (before and after the read, so that the pid
    /// read named it).
    pub fn peak_memory(&self) -> Option<u64> {
        match &self.cgroup {
            Some(cgroup) => cgroup.peak_memory(),
            None if self.init_alive() => {
                let peak = children_peak_memory(Pid::from_raw(self.init_pid));
                self.init_alive().then_some(peak).flatten()
            }
            None => None,
        }
    }

    /// Kills the session: its cgroup (frozen, then killed) and its init, whose death takes
    /// the session's pid namespace down.
    pub fn kill(&mut self) {
        if self.killed {
            return;
        }
        self.killed = true;
        if let Some(mut proxy) = self.egress.take() {
            proxy.stop();
        }
        if let Some(c) = &self.cgroup {
            c.kill_all();
        }
        // The init is not our child, so its pid could be reused once it is gone: signal it
        // only while its control socket shows it alive.
        if self.init_alive() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.init_pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        wait_for_hangup(self.control.as_fd());
    }
}

/// Waits (briefly) until the peer of `control` is gone.
fn wait_for_hangup(control: BorrowedFd<'_>) {
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut buf = [0u8; 64];
    while Instant::now() < deadline {
        let mut pfd = [PollFd::new(control, PollFlags::POLLIN)];
        if poll(&mut pfd, PollTimeout::from(50u8)).is_err() {
            return;
        }
        match nix::sys::socket::recv(
            control.as_raw_fd(),
            &mut buf,
            nix::sys::socket::MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(0) => return,
            Err(nix::errno::Errno::EAGAIN) | Ok(_) => {}
            Err(_) => return,
        }
    }
}

impl Drop for ForkedKernel {
    fn drop(&mut self) {
        self.kill();
        // The cgroup's own Drop removes it (waiting for its processes to leave).
    }
}

/// Whether `imports` names a module that is neither in `imported` nor in `stdlib`.
fn imports_beyond(
    imports: &BTreeSet<&str>,
    imported: &BTreeSet<String>,
    stdlib: &BTreeSet<String>,
) -> bool {
    imports
        .iter()
        .any(|name| !imported.contains(*name) && !stdlib.contains(*name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::imports::imported_modules;

    #[test]
    fn runs_importing_modules_outside_the_standard_library_prefer_the_full_zygote() {
        let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
        let imported = set(&["os", "sys", "random", "corral_oneshot"]);
        let stdlib = set(&["os", "sys", "random", "asyncio", "json"]);
        let full =
            |code: &str| imports_beyond(&imported_modules(code.as_bytes()), &imported, &stdlib);
        assert!(!full("print(1)"));
        assert!(
            !full("import os, random\nimport asyncio"),
            "the standard library"
        );
        assert!(
            !full("import corral_oneshot"),
            "imported by the lean zygote"
        );
        assert!(full("import json\nimport numpy as np"));
        assert!(full("from pandas import DataFrame"));
        assert!(full("import helper  # a module of the workspace"));
    }
}
