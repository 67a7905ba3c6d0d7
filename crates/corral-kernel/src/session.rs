//! A stateful interpreter session: one kernel in one sandbox, executions streamed as events.

use parking_lot::Mutex;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_egress::EgressMonitor;
use corral_sandbox::ports::PortOpener;
use corral_sandbox::{
    hit_rlimit_data, rlimit_data_message, ControlSocket, Egress, ExecutionResult, LanguageError,
    Limits, Policy, Report, ResultBudget, Rootfs, Sandbox, SandboxError, SandboxSpec, Status,
    Workspace,
};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::event::{into_rich_result, End, Event, Utf8Stream};
use crate::policy::CodePolicy;
use crate::protocol::{
    encode, Decoder, DoneStatus, HostMessage, KernelMessage, ResultLimits, MAX_FRAME,
};
use crate::runtime;

/// How long a kernel may take to answer an interrupt before its sandbox is killed.
const INTERRUPT_GRACE: Duration = Duration::from_secs(2);
/// How often the interrupt of a command is sent again until the command ends: a kernel
/// ignores one that comes before it has set the command up (it cannot tell it from one meant
/// for a run that has ended), and takes a command's interrupt any number of times.
const COMMAND_INTERRUPT_AGAIN: Duration = Duration::from_millis(100);
/// Startup stderr kept for the error message of a kernel that failed to start.
const STARTUP_STDERR: usize = 8 << 10;

/// A language a session can speak: the one type of every face (`corral run --lang`, the API's
/// and MCP's `language`), each face's derive behind a feature of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema), schemars(inline))]
pub enum Language {
    Python,
    Javascript,
    Bash,
}

impl Language {
    pub fn parse(name: &str) -> Option<Language> {
        match name {
            "python" | "python3" | "py" => Some(Language::Python),
            "javascript" | "js" | "node" => Some(Language::Javascript),
            "bash" | "sh" | "shell" => Some(Language::Bash),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Javascript => "javascript",
            Language::Bash => "bash",
        }
    }
}

/// Everything that defines a session; kept so that a restart can recreate it.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    pub rootfs: Rootfs,
    /// Environment the image asks for (below `env`).
    pub image_env: Vec<(String, String)>,
    pub language: Language,
    pub limits: Limits,
    pub env: Vec<(String, String)>,
    pub policy: Policy,
    /// What the session's code may import and how long it may be (docs/code-policy.md); it
    /// applies to every execution, and the kernel learns its module rules before the first.
    pub code_policy: CodePolicy,
    /// What the session may reach beyond its loopback (a session with a network policy is
    /// never taken from the warm pool).
    pub egress: Egress,
    /// How long the kernel may take to become ready.
    pub startup_timeout: Duration,
    /// The host's budget of results held at once, shared with other sessions and runs (none:
    /// only the per-execution limits bound them).
    pub result_budget: Option<Arc<ResultBudget>>,
}

impl SessionOptions {
    pub fn new(language: Language) -> Self {
        SessionOptions {
            rootfs: Rootfs::Host,
            image_env: Vec::new(),
            language,
            limits: Limits::default(),
            env: Vec::new(),
            policy: Policy::default(),
            code_policy: CodePolicy::default(),
            egress: Egress::default(),
            startup_timeout: Duration::from_secs(60),
            result_budget: None,
        }
    }

    /// The sandbox that runs this session's kernel directly (without a zygote).
    pub(crate) fn kernel_spec(&self) -> SandboxSpec {
        let mut spec = SandboxSpec::new(runtime::kernel_argv(self.language));
        spec.rootfs = self.rootfs.clone();
        spec.env = self.image_env.iter().chain(&self.env).cloned().collect();
        spec.limits = self.limits;
        spec.policy = self.policy;
        spec.egress = self.egress.clone();
        // Its code contexts, started by its process agent, may be of any language.
        spec.support_files = runtime::every_kernel_file();
        spec.control_socket = Some(ControlSocket::Stream);
        spec.process_agent = true;
        spec
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error("the {language} kernel did not start: {reason}")]
    Startup {
        language: &'static str,
        reason: String,
    },
    #[error("{0}")]
    Io(#[from] io::Error),
    /// A call to the session's process agent failed (a code context's kernel).
    #[error(transparent)]
    Agent(#[from] crate::agent::AgentError),
    /// A per-execution environment that cannot be sent (see [`Session::execute_with_env`]);
    /// nothing was run.
    #[error("invalid environment: {0}")]
    InvalidEnvironment(String),
    /// A command that cannot be sent (empty, a NUL byte, a malformed environment name, too
    /// large); nothing was run.
    #[error("invalid command: {0}")]
    InvalidCommand(String),
    /// A one-shot run that a fork of the zygote cannot serve as a fresh interpreter would
    /// (see [`crate::oneshot::run_forked`]); nothing was forked.
    #[error("this run needs a fresh interpreter: {0}")]
    NeedsFreshInterpreter(String),
    /// The image's zygote is dead and its replacement was not ready within the wait; nothing
    /// was created. Temporary: retrying after `retry_after` can succeed.
    #[error("the Python zygote of this image is being restarted ({reason}); retry in {}s", retry_after.as_secs())]
    ZygoteUnavailable {
        reason: String,
        retry_after: Duration,
    },
    /// Pausing needs the session's cgroup freezer; a session without a cgroup (the rlimit
    /// fallback) cannot be paused. Nothing was changed.
    #[error("this session cannot be paused: it has no cgroup (the rlimit fallback, see `corral doctor`)")]
    PauseUnsupported,
    /// Freezing or thawing failed; a pause that failed left the session running.
    #[error("pausing or resuming the session: {0}")]
    Freeze(#[from] corral_sandbox::cgroup::FreezeError),
}

/// How long a pause waits for every process of the session to freeze.
const PAUSE_WAIT: Duration = Duration::from_secs(2);

/// The warm-up cell: a first cell's path (compile, execute, output).
const WARM_UP_CELL: &str = "print(1)";

/// What an exchange with the kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Code in the interpreter: an execution.
    Cell,
    /// A cell that is not an execution (see [`Session::warm_up`]).
    WarmUp,
    /// A program beside the interpreter: not an execution, and its non-zero exit status is
    /// no language error.
    Command,
}

/// Wakes a running execution from another thread and interrupts it.
#[derive(Debug, Clone)]
pub struct Interrupter(Arc<OwnedFd>);

impl Interrupter {
    pub fn interrupt(&self) {
        let _ = nix::unistd::write(self.0.as_fd(), b"i");
    }
}

/// Stops one command and no other, from any thread (see [`Session::run_command`]): one that
/// has not started yet never starts, one that runs has its process group killed. Unlike an
/// [`Interrupter`], it never reaches the session's next run.
#[derive(Debug, Clone, Default)]
pub struct Stopper(Arc<Mutex<Stopping>>);

#[derive(Debug, Default)]
struct Stopping {
    run: RunState,
    stopped: bool,
}

#[derive(Debug, Default)]
enum RunState {
    #[default]
    Waiting,
    /// Running; the interrupter of its session.
    Running(Interrupter),
    Ended,
}

impl Stopper {
    /// Stops the command; false when it had already ended (nothing was stopped).
    pub fn stop(&self) -> bool {
        let mut s = self.0.lock();
        match &s.run {
            RunState::Ended => return false,
            // Sent under the lock, so never after the run has ended (see `end`).
            RunState::Running(interrupter) if !s.stopped => interrupter.interrupt(),
            RunState::Running(_) | RunState::Waiting => {}
        }
        s.stopped = true;
        true
    }

    /// The command starts, in the session `interrupter` interrupts; false (and it does not
    /// start) when it was stopped before.
    fn begin(&self, interrupter: Interrupter) -> bool {
        let mut s = self.0.lock();
        if s.stopped {
            s.run = RunState::Ended;
            return false;
        }
        s.run = RunState::Running(interrupter);
        true
    }

    /// The command has ended (called while its session is still held, so that an interrupt
    /// sent before is either seen by the command or drained by the next run); whether it
    /// was stopped.
    fn end(&self) -> bool {
        let mut s = self.0.lock();
        s.run = RunState::Ended;
        s.stopped
    }
}

/// The exit status the kernel reports for a command an interrupt killed (a shell's, after
/// SIGINT).
const INTERRUPTED_STATUS: i32 = 130;

/// Makes `result` that of a command a [`Stopper`] stopped: killed by SIGKILL.
fn stopped(result: &mut ExecutionResult) {
    result.status = Status::Error;
    result.exit_code = None;
    result.signal = Some(nix::sys::signal::Signal::SIGKILL as i32);
    result.error_message = Some("the command was stopped (killed by SIGKILL)".into());
}

/// Why a session can no longer execute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Death {
    pub status: Status,
    pub message: String,
}

/// A running kernel: directly in its own sandbox, or forked from a zygote.
pub(crate) struct KernelProcess {
    pub host: KernelHost,
    /// The host's end of the kernel's fd 3.
    pub socket: OwnedFd,
}

pub(crate) enum KernelHost {
    Sandbox(Sandbox),
    Forked(crate::zygote::ForkedKernel),
    /// A code context's kernel, started by a session's process agent.
    Context(crate::context::ContextKernel),
}

impl KernelHost {
    fn stdout_fd(&self) -> BorrowedFd<'_> {
        match self {
            KernelHost::Sandbox(s) => s.stdout_fd(),
            KernelHost::Forked(f) => f.stdout.as_fd(),
            KernelHost::Context(c) => c.stdout.as_fd(),
        }
    }
    fn stderr_fd(&self) -> BorrowedFd<'_> {
        match self {
            KernelHost::Sandbox(s) => s.stderr_fd(),
            KernelHost::Forked(f) => f.stderr.as_fd(),
            KernelHost::Context(c) => c.stderr.as_fd(),
        }
    }
    fn report_fd(&self) -> BorrowedFd<'_> {
        match self {
            KernelHost::Sandbox(s) => s.report_fd(),
            KernelHost::Forked(f) => f.control.as_fd(),
            KernelHost::Context(c) => c.report_fd(),
        }
    }
    fn read_report(&mut self) -> Report {
        match self {
            KernelHost::Sandbox(s) => s.read_report(),
            KernelHost::Forked(f) => f.read_report(),
            KernelHost::Context(c) => c.read_report(),
        }
    }
    fn interrupt(&self) {
        let _ = match self {
            KernelHost::Sandbox(s) => s.interrupt(),
            KernelHost::Forked(f) => f.interrupt(),
            KernelHost::Context(c) => c.interrupt(),
        };
    }
    fn kill(&mut self) {
        match self {
            KernelHost::Sandbox(s) => {
                s.kill();
                s.finish();
            }
            KernelHost::Forked(f) => f.kill(),
            KernelHost::Context(c) => c.kill(),
        }
    }
    fn cgroup(&self) -> Option<&corral_sandbox::cgroup::Cgroup> {
        match self {
            KernelHost::Sandbox(s) => s.cgroup(),
            KernelHost::Forked(f) => f.cgroup.as_ref(),
            // The session's cgroup is its own kernel's: a context's usage is not told apart.
            KernelHost::Context(_) => None,
        }
    }
    fn cpu_time(&self) -> Option<Duration> {
        self.cgroup().and_then(|c| c.cpu_time())
    }
    fn peak_memory(&self) -> Option<u64> {
        match self {
            KernelHost::Sandbox(s) => s.peak_memory(),
            KernelHost::Forked(f) => f.peak_memory(),
            KernelHost::Context(_) => None,
        }
    }
    /// Whether memory is bounded by `RLIMIT_DATA` alone (no cgroup: the rlimit fallback).
    fn memory_rlimited(&self) -> bool {
        match self {
            KernelHost::Sandbox(s) => s.memory_rlimited(),
            KernelHost::Forked(f) => f.cgroup.is_none(),
            KernelHost::Context(_) => false,
        }
    }
    fn oom_killed(&self) -> bool {
        match self {
            KernelHost::Sandbox(s) => s.oom_killed(),
            KernelHost::Forked(f) => f
                .cgroup
                .as_ref()
                .is_some_and(|c| c.oom_kills() > f.workspace.writer_oom_kills()),
            KernelHost::Context(_) => false,
        }
    }
    fn workspace(&self) -> &Workspace {
        match self {
            KernelHost::Sandbox(s) => s.workspace(),
            KernelHost::Forked(f) => &f.workspace,
            KernelHost::Context(c) => &c.workspace,
        }
    }
    fn network_monitor(&self) -> Option<EgressMonitor> {
        match self {
            KernelHost::Sandbox(s) => s.network_monitor(),
            KernelHost::Forked(f) => f.network_monitor(),
            KernelHost::Context(_) => None,
        }
    }
    fn port_opener(&self) -> Option<PortOpener> {
        match self {
            KernelHost::Sandbox(s) => s.port_opener(),
            KernelHost::Forked(f) => Some(f.port_opener()),
            // A context's ports are its session's: reached through the session's own kernel.
            KernelHost::Context(_) => None,
        }
    }
}

pub struct Session {
    kernel: KernelProcess,
    decoder: Decoder,
    options: SessionOptions,
    wake_read: OwnedFd,
    wake_write: Arc<OwnedFd>,
    dead: Option<Death>,
    next_id: u64,
    executions: u64,
    /// Protections weaker than requested (the sandbox's, the zygote's and the session's).
    warnings: Vec<String>,
    /// Held while the session is paused (see [`Session::pause`]).
    thaw_guard: Option<corral_sandbox::cgroup::ThawGuard>,
    /// The session's process agent (every session but a code context, which uses its
    /// session's).
    agent: Option<Arc<crate::agent::ProcessAgent>>,
    /// What the kernel needs kept as long as it lives: the sandbox of the zygote it was
    /// forked from, whose init is the ancestor of its pid namespace. Declared last, so it is
    /// dropped after the kernel.
    keepalive: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("language", &self.options.language)
            .field("executions", &self.executions)
            .field("dead", &self.dead)
            .finish()
    }
}

fn readable(fds: &mut [PollFd<'_>], i: usize) -> bool {
    fds[i].revents().is_some_and(|r| !r.is_empty())
}

fn read_into(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Option<usize> {
    match nix::unistd::read(fd.as_raw_fd(), buf) {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(n),
    }
}

impl Session {
    /// Creates a session whose kernel runs directly in a fresh sandbox.
    pub fn create(options: &SessionOptions) -> Result<Session, KernelError> {
        let mut sandbox = Sandbox::create(&options.kernel_spec())?;
        let socket = sandbox
            .take_socket()
            .expect("a control socket was requested");
        sandbox.start()?;
        let agent = sandbox.take_agent()?;
        let warnings = sandbox.warnings().to_vec();
        let mut session = Session::from_kernel(
            KernelProcess {
                host: KernelHost::Sandbox(sandbox),
                socket,
            },
            options.clone(),
            warnings,
        )?;
        if let Some(agent) = agent {
            session.set_agent(crate::agent::ProcessAgent::new(agent)?);
        }
        Ok(session)
    }

    /// Wraps a started kernel and waits until it reports ready.
    pub(crate) fn from_kernel(
        kernel: KernelProcess,
        options: SessionOptions,
        warnings: Vec<String>,
    ) -> Result<Session, KernelError> {
        let (wake_read, wake_write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
                .map_err(io::Error::from)?;
        // A kernel that stops reading must not block the host forever.
        nix::sys::socket::setsockopt(
            &kernel.socket,
            nix::sys::socket::sockopt::SendTimeout,
            &nix::sys::time::TimeVal::new(10, 0),
        )
        .map_err(io::Error::from)?;
        let mut session = Session {
            kernel,
            decoder: Decoder::with_limits(ResultLimits::of(&options.limits))
                .with_budget(options.result_budget.clone()),
            options,
            wake_read,
            wake_write: Arc::new(wake_write),
            dead: None,
            next_id: 1,
            executions: 0,
            warnings,
            thaw_guard: None,
            agent: None,
            keepalive: None,
        };
        session.await_ready()?;
        session.send_code_policy()?;
        Ok(session)
    }

    /// Tells the kernel the module rules of the session's code policy, if it has any: it
    /// checks every execution against them from then on (it handles frames in order, so
    /// before the first execution) and installs the policy's import hook. No answer.
    fn send_code_policy(&mut self) -> Result<(), KernelError> {
        let language = self.options.language;
        if let Some(rules) = self.options.code_policy.module_rules(language) {
            write_all(
                self.kernel.socket.as_fd(),
                &encode(&HostMessage::Policy(rules)),
            )?;
        }
        Ok(())
    }

    fn await_ready(&mut self) -> Result<(), KernelError> {
        let language = self.options.language.name();
        let deadline = Instant::now() + self.options.startup_timeout;
        let mut stderr = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        let fail = |reason: String| KernelError::Startup { language, reason };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(fail(format!(
                    "no answer within {:?}; stderr: {}",
                    self.options.startup_timeout,
                    String::from_utf8_lossy(&stderr)
                )));
            }
            let sandbox = &self.kernel.host;
            let mut fds = [
                PollFd::new(self.kernel.socket.as_fd(), PollFlags::POLLIN),
                PollFd::new(sandbox.stderr_fd(), PollFlags::POLLIN),
                PollFd::new(sandbox.stdout_fd(), PollFlags::POLLIN),
                PollFd::new(sandbox.report_fd(), PollFlags::POLLIN),
            ];
            match poll(
                &mut fds,
                PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX),
            ) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(io::Error::from(e).into()),
            }
            let (socket_ready, err_ready, out_ready, report_ready) = (
                readable(&mut fds, 0),
                readable(&mut fds, 1),
                readable(&mut fds, 2),
                readable(&mut fds, 3),
            );
            if err_ready {
                if let Some(n) = read_into(self.kernel.host.stderr_fd(), &mut buf) {
                    let room = STARTUP_STDERR.saturating_sub(stderr.len());
                    stderr.extend_from_slice(&buf[..n.min(room)]);
                }
            }
            if out_ready {
                read_into(self.kernel.host.stdout_fd(), &mut buf);
            }
            if socket_ready {
                let Some(n) = read_into(self.kernel.socket.as_fd(), &mut buf) else {
                    return Err(fail(format!(
                        "it exited; stderr: {}",
                        String::from_utf8_lossy(&stderr)
                    )));
                };
                self.decoder.push(&buf[..n]);
                loop {
                    match self.decoder.next_message() {
                        Ok(Some(KernelMessage::Ready { .. })) => return Ok(()),
                        Ok(Some(_)) => continue,
                        Ok(None) => break,
                        Err(e) => return Err(fail(e.to_string())),
                    }
                }
            }
            if report_ready {
                let why = match self.kernel.host.read_report() {
                    Report::SetupError(failure) => failure.to_string(),
                    Report::Exited(_) | Report::Closed | Report::Garbled => {
                        format!("it exited; stderr: {}", String::from_utf8_lossy(&stderr))
                    }
                };
                return Err(fail(why));
            }
        }
    }

    /// Protections weaker than requested for this session (also in every result).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    pub fn language(&self) -> Language {
        self.options.language
    }

    /// Why the session is dead, if it is.
    pub fn death(&self) -> Option<&Death> {
        self.dead.as_ref()
    }

    pub fn is_alive(&self) -> bool {
        self.dead.is_none()
    }

    /// Takes the room of this session's results from `budget` from now on (a session made
    /// ahead, for a warm pool, gets its owner's budget when it is handed out).
    pub fn set_result_budget(&mut self, budget: Option<Arc<ResultBudget>>) {
        self.decoder.set_budget(budget.clone());
        self.options.result_budget = budget;
    }

    pub(crate) fn set_agent(&mut self, agent: Arc<crate::agent::ProcessAgent>) {
        self.agent = Some(agent);
    }

    /// The session's process agent, which runs programs beside the interpreter without its
    /// lock ([`crate::agent`]).
    pub fn agent(&self) -> Result<Arc<crate::agent::ProcessAgent>, crate::agent::AgentError> {
        self.agent
            .clone()
            .ok_or(crate::agent::AgentError::Unavailable)
    }

    /// Keeps `what` until this session's kernel is gone (a restart, which makes a kernel of
    /// its own sandbox, lets go of it).
    pub(crate) fn keep_alive(&mut self, what: Arc<dyn std::any::Any + Send + Sync>) {
        self.keepalive = Some(what);
    }

    /// Whether an idle session's kernel is still there: not marked dead, its sandbox has
    /// reported nothing and its socket is not hung up. Looks without waiting and reads
    /// nothing; for sessions kept ready in the warm pool, whose kernel can be killed while no
    /// execution watches it.
    pub(crate) fn probe_alive(&self) -> bool {
        if self.dead.is_some() {
            return false;
        }
        let mut fds = [
            PollFd::new(self.kernel.host.report_fd(), PollFlags::POLLIN),
            PollFd::new(self.kernel.socket.as_fd(), PollFlags::empty()),
        ];
        if poll(&mut fds, PollTimeout::ZERO).is_err() {
            return true;
        }
        let reported = fds[0].revents().is_some_and(|r| !r.is_empty());
        let hung_up = fds[1]
            .revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR));
        !reported && !hung_up
    }

    /// How many executions this session has run.
    /// Freezes every process of the session (its cgroup's freezer): it uses no CPU and keeps
    /// its memory until [`Session::resume`]. Only between executions: the caller holds the
    /// session, so nothing runs and nothing is sent to the kernel meanwhile.
    pub fn pause(&mut self) -> Result<(), KernelError> {
        let cgroup = self
            .kernel
            .host
            .cgroup()
            .ok_or(KernelError::PauseUnsupported)?;
        let guard = cgroup.freeze_guarded(PAUSE_WAIT).inspect_err(|_| {
            let _ = cgroup.thaw();
        })?;
        self.thaw_guard = Some(guard);
        Ok(())
    }

    /// What reads the session's cgroup (CPU time, memory), kept apart from the session; `None`
    /// without a cgroup (the rlimit fallback).
    pub fn meter(&self) -> Option<corral_sandbox::cgroup::Meter> {
        self.kernel.host.cgroup().map(|c| c.meter())
    }

    /// Thaws a session [`Session::pause`] froze.
    pub fn resume(&mut self) -> Result<(), KernelError> {
        let cgroup = self
            .kernel
            .host
            .cgroup()
            .ok_or(KernelError::PauseUnsupported)?;
        cgroup.thaw()?;
        self.thaw_guard = None;
        Ok(())
    }

    pub fn executions(&self) -> u64 {
        self.executions
    }

    pub fn workspace(&self) -> &Workspace {
        self.kernel.host.workspace()
    }

    /// Reads what the session's egress proxy does (none without a network policy).
    pub fn network_monitor(&self) -> Option<EgressMonitor> {
        self.kernel.host.network_monitor()
    }

    /// Opens connections to servers listening in the session's sandbox (a restart replaces
    /// it); none once the kernel's sandbox is gone.
    pub fn port_opener(&self) -> Option<PortOpener> {
        self.kernel.host.port_opener()
    }

    fn drain_wake(&self) {
        let mut buf = [0u8; 64];
        while read_into(self.wake_read.as_fd(), &mut buf).is_some() {}
    }

    /// A handle that interrupts the current execution from another thread.
    pub fn interrupter(&self) -> Interrupter {
        Interrupter(self.wake_write.clone())
    }

    /// Runs `code`, streaming events to `on_event` (which sees `End` last) and returning the
    /// folded result. A timeout interrupts the code and keeps the session; a kernel that does
    /// not answer the interrupt, or that dies, ends the session. Code longer than the code
    /// policy's `max_code_bytes` is refused without reaching the kernel; the kernel refuses
    /// code that breaks its module rules before running any of it.
    pub fn execute(
        &mut self,
        code: &str,
        timeout: Duration,
        on_event: &mut dyn FnMut(&Event),
    ) -> ExecutionResult {
        self.execute_with_env(code, &[], timeout, on_event)
            .expect("an execution without an environment is always sent")
    }

    /// [`Session::execute`] with `env` set for this execution only: the Python and
    /// JavaScript kernels set the variables before the cell and put back what was there
    /// after it. Refused without sending anything (`InvalidEnvironment`) for a bash session
    /// (its shell's variables are its state) and for a name that is empty or holds `=` or a
    /// NUL byte, or a value with a NUL byte.
    pub fn execute_with_env(
        &mut self,
        code: &str,
        env: &[(String, String)],
        timeout: Duration,
        on_event: &mut dyn FnMut(&Event),
    ) -> Result<ExecutionResult, KernelError> {
        if !env.is_empty() {
            if self.options.language == Language::Bash {
                return Err(KernelError::InvalidEnvironment(
                    "a bash session takes no per-execution environment: export the variables \
                     in the code"
                        .into(),
                ));
            }
            corral_sandbox::env::check(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .map_err(|e| KernelError::InvalidEnvironment(e.to_string()))?;
        }
        let too_long = self.options.code_policy.length_violation(code.len());
        if let Some(error) = too_long.filter(|_| self.dead.is_none()) {
            return Ok(self.refuse(error, on_event));
        }
        let id = self.next_id();
        let env = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let frame = encode(&HostMessage::Execute { id: &id, code, env });
        Ok(self.exchange(&id, &frame, Kind::Cell, timeout, None, on_event))
    }

    /// The result of an execution refused on the host by the code policy: nothing was sent.
    fn refuse(
        &mut self,
        error: LanguageError,
        on_event: &mut dyn FnMut(&Event),
    ) -> ExecutionResult {
        let (started, cpu_before) = (Instant::now(), self.kernel.host.cpu_time());
        self.executions += 1;
        let mut result = ExecutionResult {
            status: Status::Error,
            warnings: self.warnings.clone(),
            error_message: Some(format!("{}: {}", error.name, error.value)),
            ..ExecutionResult::sandbox_error("")
        };
        on_event(&Event::Error(error.clone()));
        result.error = Some(error);
        self.emit_end(Kind::Cell, &mut result, started, cpu_before, on_event);
        result
    }

    /// Runs a cell that nobody sees and that leaves no trace in the interpreter (not in its
    /// history, no execution count), through the whole path of an execution (frames, output,
    /// `done`): a session kept in the warm pool has then paid the copy-on-write faults of its
    /// first execution before it is handed out.
    pub(crate) fn warm_up(&mut self) {
        let id = self.next_id();
        let frame = encode(&HostMessage::WarmUp {
            id: &id,
            code: WARM_UP_CELL,
        });
        self.exchange(
            &id,
            &frame,
            Kind::WarmUp,
            Duration::from_secs(30),
            None,
            &mut |_| {},
        );
    }

    /// Runs the program `argv` inside the session's sandbox, beside the interpreter (whose
    /// state it does not touch), with stdin `/dev/null`, in `cwd` (relative to the workspace;
    /// `None` is the workspace) and with the kernel's environment plus `env`. Events and the
    /// timeout, interrupt and death handling are those of [`Session::execute`]; an interrupt
    /// or a timeout kills the command's process group. The result's `exit_code` is the
    /// program's exit status (128 + N after signal N; 130 when interrupted), and a non-zero
    /// status is `error` without a language error. A program that cannot be started
    /// (`CommandError`) is an error like a language error. Commands do not count as
    /// executions. A command that `stop` stops, before it starts or while it runs, ends
    /// killed by `SIGKILL` (no exit code).
    pub fn run_command(
        &mut self,
        argv: &[String],
        cwd: Option<&str>,
        env: &[(String, String)],
        timeout: Duration,
        stop: &Stopper,
        on_event: &mut dyn FnMut(&Event),
    ) -> Result<ExecutionResult, KernelError> {
        check_command(argv, cwd, env)?;
        let id = self.next_id();
        let frame = encode(&HostMessage::Command {
            id: &id,
            argv,
            cwd,
            env: env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect(),
        });
        if frame.len() - 4 > MAX_FRAME {
            return Err(KernelError::InvalidCommand(format!(
                "it encodes to {} bytes, over the limit of {MAX_FRAME}",
                frame.len() - 4
            )));
        }
        Ok(self.exchange(&id, &frame, Kind::Command, timeout, Some(stop), on_event))
    }

    /// Makes a session taken from the warm pool (made with the pool's options, without an
    /// environment or a code policy) the session `options` ask for: the kernel sets
    /// `options.env` in its environment, as a session forked with it does right after the
    /// fork, and takes the code policy's module rules, before the first execution (frames are
    /// handled in order; the kernel answers nothing). `options` must differ from the pool's
    /// in `env` and `code_policy` only.
    pub(crate) fn adopt(&mut self, options: &SessionOptions) -> Result<(), KernelError> {
        if !options.env.is_empty() {
            let frame = encode(&HostMessage::Environment {
                env: options
                    .env
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect(),
            });
            if frame.len() - 4 > MAX_FRAME {
                return Err(KernelError::InvalidCommand(format!(
                    "the environment encodes to {} bytes, over the limit of {MAX_FRAME}",
                    frame.len() - 4
                )));
            }
            write_all(self.kernel.socket.as_fd(), &frame)?;
        }
        self.options = options.clone();
        self.send_code_policy()
    }

    fn next_id(&mut self) -> String {
        let id = self.next_id.to_string();
        self.next_id += 1;
        id
    }

    /// Sends `frame` (whose id is `id`) and streams what the kernel answers until its `done`.
    fn exchange(
        &mut self,
        id: &str,
        frame: &[u8],
        kind: Kind,
        timeout: Duration,
        stop: Option<&Stopper>,
        on_event: &mut dyn FnMut(&Event),
    ) -> ExecutionResult {
        let started = Instant::now();
        let cpu_before = self.kernel.host.cpu_time();
        let monitor = self.kernel.host.network_monitor();
        let network_before = monitor.as_ref().map(EgressMonitor::report);
        let mut result = ExecutionResult {
            status: Status::Success,
            warnings: self.warnings.clone(),
            ..ExecutionResult::sandbox_error("")
        };
        result.error_message = None;
        if let Some(death) = &self.dead {
            result.status = Status::SandboxError;
            result.error_message = Some(format!("the session is dead: {}", death.message));
            self.emit_end(kind, &mut result, started, cpu_before, on_event);
            return result;
        }
        if kind == Kind::Cell {
            self.executions += 1;
        }
        // An interrupt is for the execution running when it is sent: one that came while the
        // session was idle (a client that left just as its execution ended) must not stop
        // this one.
        self.drain_wake();
        if stop.is_some_and(|stop| !stop.begin(self.interrupter())) {
            stopped(&mut result);
            self.emit_end(kind, &mut result, started, cpu_before, on_event);
            return result;
        }
        // Each exchange may send back the whole budget of frames and results again.
        self.decoder.begin_execution();
        if let Err(e) = write_all(self.kernel.socket.as_fd(), frame) {
            self.die(
                Status::SandboxError,
                format!("the kernel stopped reading: {e}"),
            );
        }

        let limit = self.options.limits.output_bytes;
        let mut out = (Utf8Stream::default(), 0usize);
        let mut err = (Utf8Stream::default(), 0usize);
        let mut buf = vec![0u8; 64 << 10];
        let deadline = started + timeout;
        let mut interrupted_at: Option<Instant> = None;
        // When the interrupt was last sent: a command's is sent again until the command ends.
        let mut interrupt_sent = started;
        let mut timed_out = false;
        let mut done = false;
        while !done && self.dead.is_none() {
            let now = Instant::now();
            let until = interrupted_at.map_or(deadline, |t| t + INTERRUPT_GRACE);
            if now >= until {
                if interrupted_at.is_some() {
                    self.die(
                        Status::Timeout,
                        "the kernel did not answer an interrupt and was killed".into(),
                    );
                    break;
                }
                timed_out = true;
                self.kernel.host.interrupt();
                (interrupted_at, interrupt_sent) = (Some(now), now);
                continue;
            }
            let again = (interrupted_at.is_some() && kind == Kind::Command)
                .then(|| interrupt_sent + COMMAND_INTERRUPT_AGAIN);
            if again.is_some_and(|t| now >= t) {
                self.kernel.host.interrupt();
                interrupt_sent = now;
                continue;
            }
            let wake_at = again.map_or(until, |t| t.min(until));
            let sandbox = &self.kernel.host;
            let mut fds = [
                PollFd::new(self.kernel.socket.as_fd(), PollFlags::POLLIN),
                PollFd::new(sandbox.stdout_fd(), PollFlags::POLLIN),
                PollFd::new(sandbox.stderr_fd(), PollFlags::POLLIN),
                PollFd::new(sandbox.report_fd(), PollFlags::POLLIN),
                PollFd::new(self.wake_read.as_fd(), PollFlags::POLLIN),
            ];
            match poll(
                &mut fds,
                PollTimeout::try_from(wake_at.saturating_duration_since(now))
                    .unwrap_or(PollTimeout::MAX),
            ) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => {
                    self.die(Status::SandboxError, format!("poll: {e}"));
                    break;
                }
            }
            let ready: Vec<bool> = (0..5).map(|i| readable(&mut fds, i)).collect();
            if ready[4] {
                read_into(self.wake_read.as_fd(), &mut buf);
                if interrupted_at.is_none() {
                    self.kernel.host.interrupt();
                    let sent = Instant::now();
                    (interrupted_at, interrupt_sent) = (Some(sent), sent);
                }
            }
            if ready[1] {
                self.read_stream(true, &mut out, limit, &mut result, &mut buf, on_event);
            }
            if ready[2] {
                self.read_stream(false, &mut err, limit, &mut result, &mut buf, on_event);
            }
            if ready[0] {
                match read_into(self.kernel.socket.as_fd(), &mut buf) {
                    None => self.kernel_exited(),
                    Some(n) => {
                        self.decoder.push(&buf[..n]);
                        done = self.handle_frames(id, kind, &mut result, on_event);
                    }
                }
            }
            if ready[3] && self.dead.is_none() && !done {
                self.kernel_exited();
            }
        }
        // Output written before `done` (or before the kernel died) is in the pipes: drain it
        // so that it precedes `end`.
        self.drain_streams(&mut out, &mut err, limit, &mut result, &mut buf, on_event);
        for (stream, is_out) in [(&mut out.0, true), (&mut err.0, false)] {
            let rest = stream.flush();
            if !rest.is_empty() {
                self.emit_text(is_out, rest, &mut result, on_event);
            }
        }

        result.warnings.extend(self.decoder.warnings());
        result.reservation = self.decoder.take_held();
        // What the proxy did while this ran.
        result.network = monitor
            .zip(network_before)
            .map(|(m, before)| m.report().since(&before));
        if let Some(limit) = result
            .network
            .as_ref()
            .and_then(|n| n.limit_reached.as_ref())
        {
            result.warnings.push(format!("egress: {limit}"));
        }
        let was_stopped = stop.is_some_and(Stopper::end);
        if let Some(death) = &self.dead {
            result.status = death.status;
            result.error_message = Some(death.message.clone());
        } else if was_stopped && result.exit_code == Some(INTERRUPTED_STATUS) {
            stopped(&mut result);
        } else if timed_out {
            result.status = Status::Timeout;
            let (what, how) = match kind {
                Kind::Cell | Kind::WarmUp => ("execution", "interrupted"),
                Kind::Command => ("command", "killed"),
            };
            result.error_message = Some(format!(
                "the {what} ran longer than {:.1} s and was {how}; the session keeps its state",
                timeout.as_secs_f64()
            ));
        } else if let Some(e) = &result.error {
            result.status = Status::Error;
            result.error_message = Some(format!("{}: {}", e.name, e.value));
            if kind == Kind::Cell && self.hit_rlimit_data(&result) {
                result.status = Status::MemoryLimit;
                result.error_message = Some(format!(
                    "{}; the session keeps its state",
                    rlimit_data_message(self.options.limits.memory_bytes)
                ));
            }
        } else if let Some(code) = result.exit_code.filter(|&c| c != 0) {
            result.status = Status::Error;
            result.error_message = Some(format!("the command exited with status {code}"));
        }
        self.emit_end(kind, &mut result, started, cpu_before, on_event);
        result
    }

    /// Whether a cell that failed with a language error, its kernel alive, ran into the memory
    /// limit of the rlimit fallback: the rule of one-shot runs ([`hit_rlimit_data`]), with
    /// the kernel's peak and its stderr followed by the error as the output it judges.
    fn hit_rlimit_data(&self, result: &ExecutionResult) -> bool {
        let Some(e) = &result.error else {
            return false;
        };
        if !self.kernel.host.memory_rlimited() {
            return false;
        }
        let peak = self.kernel.host.peak_memory().unwrap_or(0);
        let output = format!("{}\n{}: {}\n", result.stderr, e.name, e.value);
        hit_rlimit_data(
            self.options.limits.memory_bytes,
            peak,
            None,
            output.as_bytes(),
        )
    }

    fn emit_end(
        &self,
        kind: Kind,
        result: &mut ExecutionResult,
        started: Instant,
        cpu_before: Option<Duration>,
        on_event: &mut dyn FnMut(&Event),
    ) {
        result.execution_time_ms = started.elapsed().as_millis() as u64;
        result.cpu_time_ms = match (cpu_before, self.kernel.host.cpu_time()) {
            (Some(a), Some(b)) => b.saturating_sub(a).as_millis() as u64,
            _ => 0,
        };
        result.peak_memory_bytes = self.kernel.host.peak_memory().unwrap_or(0);
        on_event(&Event::End(match kind {
            Kind::Command => End::of_command(result),
            Kind::Cell | Kind::WarmUp => End::of(result),
        }));
    }

    /// Handles complete frames; true once this execution's `done` arrived. A command's
    /// `ExitCode` error becomes its `exit_code`, not an error.
    fn handle_frames(
        &mut self,
        id: &str,
        kind: Kind,
        result: &mut ExecutionResult,
        on_event: &mut dyn FnMut(&Event),
    ) -> bool {
        loop {
            match self.decoder.next_message() {
                Ok(None) => return false,
                Err(e) => {
                    self.die(
                        Status::SandboxError,
                        format!("kernel protocol violation: {e}"),
                    );
                    return false;
                }
                Ok(Some(KernelMessage::Result {
                    id: rid,
                    is_main_result,
                    data,
                })) if rid == id => {
                    // Kept once: the event lends it to `on_event`, then it joins the result.
                    let event = Event::Result(into_rich_result(is_main_result, data));
                    on_event(&event);
                    if let Event::Result(r) = event {
                        result.results.push(r);
                    }
                }
                Ok(Some(KernelMessage::Error {
                    id: eid,
                    name,
                    value,
                    ..
                })) if eid == id
                    && kind == Kind::Command
                    && name == "ExitCode"
                    && value.parse::<i32>().is_ok() =>
                {
                    result.exit_code = value.parse().ok();
                }
                Ok(Some(KernelMessage::Error {
                    id: eid,
                    name,
                    value,
                    traceback,
                    violations,
                })) if eid == id => {
                    let e = LanguageError {
                        name,
                        value,
                        traceback,
                        violations,
                    };
                    on_event(&Event::Error(e.clone()));
                    result.error = Some(e);
                }
                Ok(Some(KernelMessage::Done { id: did, status })) if did == id => {
                    if kind == Kind::Command && status == DoneStatus::Ok {
                        result.exit_code.get_or_insert(0);
                    }
                    if status == DoneStatus::Error
                        && result.error.is_none()
                        && result.exit_code.is_none()
                    {
                        result.error = Some(LanguageError {
                            name: "Error".into(),
                            value: "the execution failed".into(),
                            traceback: String::new(),
                            violations: Vec::new(),
                        });
                    }
                    return true;
                }
                Ok(Some(_)) => {} // another execution's late frame, or a repeated `ready`
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn read_stream(
        &mut self,
        is_out: bool,
        stream: &mut (Utf8Stream, usize),
        limit: usize,
        result: &mut ExecutionResult,
        buf: &mut [u8],
        on_event: &mut dyn FnMut(&Event),
    ) -> bool {
        let fd = if is_out {
            self.kernel.host.stdout_fd()
        } else {
            self.kernel.host.stderr_fd()
        };
        let Some(n) = read_into(fd, buf) else {
            return false;
        };
        let room = limit.saturating_sub(stream.1);
        if n > room {
            if is_out {
                result.stdout_truncated = true;
            } else {
                result.stderr_truncated = true;
            }
        }
        let kept = n.min(room);
        stream.1 += kept;
        let text = stream.0.push(&buf[..kept]);
        if !text.is_empty() {
            self.emit_text(is_out, text, result, on_event);
        }
        true
    }

    fn drain_streams(
        &mut self,
        out: &mut (Utf8Stream, usize),
        err: &mut (Utf8Stream, usize),
        limit: usize,
        result: &mut ExecutionResult,
        buf: &mut [u8],
        on_event: &mut dyn FnMut(&Event),
    ) {
        loop {
            let sandbox = &self.kernel.host;
            let mut fds = [
                PollFd::new(sandbox.stdout_fd(), PollFlags::POLLIN),
                PollFd::new(sandbox.stderr_fd(), PollFlags::POLLIN),
            ];
            if !matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0) {
                return;
            }
            let (o, e) = (readable(&mut fds, 0), readable(&mut fds, 1));
            let mut progressed = false;
            if o {
                progressed |= self.read_stream(true, out, limit, result, buf, on_event);
            }
            if e {
                progressed |= self.read_stream(false, err, limit, result, buf, on_event);
            }
            if !progressed {
                return;
            }
        }
    }

    fn emit_text(
        &self,
        is_out: bool,
        text: String,
        result: &mut ExecutionResult,
        on_event: &mut dyn FnMut(&Event),
    ) {
        if is_out {
            result.stdout.push_str(&text);
            on_event(&Event::Stdout { text });
        } else {
            result.stderr.push_str(&text);
            on_event(&Event::Stderr { text });
        }
    }

    fn kernel_exited(&mut self) {
        let (status, message) = if self.kernel.host.oom_killed() {
            (
                Status::MemoryLimit,
                format!(
                    "the kernel exceeded the {} MiB memory limit and was killed; the session has ended",
                    self.options.limits.memory_bytes >> 20
                ),
            )
        } else {
            (
                Status::Error,
                "the kernel exited; the session has ended".to_string(),
            )
        };
        self.die(status, message);
    }

    fn die(&mut self, status: Status, message: String) {
        if self.dead.is_none() {
            self.kernel.host.kill();
            self.dead = Some(Death { status, message });
        }
    }

    /// Replaces the kernel with a fresh one (all interpreter state is lost); the workspace's
    /// files are carried over.
    pub fn restart(&mut self) -> Result<(), KernelError> {
        if let KernelHost::Context(c) = &self.kernel.host {
            // A code context starts again in its session's sandbox, on the same files.
            let fresh = Session::start_context(
                c.agent().clone(),
                self.options.clone(),
                c.workspace.clone(),
                c.cwd.clone(),
                self.warnings.clone(),
            )?;
            self.die(Status::Error, "restarted".into());
            *self = fresh;
            return Ok(());
        }
        let fresh = Session::create(&self.options)?;
        copy_workspace(self.workspace(), fresh.workspace());
        self.die(Status::Error, "restarted".into());
        *self = fresh;
        Ok(())
    }
}

/// Checks what the kernel could not run, or could not even read: an empty argv, a NUL byte
/// anywhere, an environment name that is empty or holds `=`.
fn check_command(
    argv: &[String],
    cwd: Option<&str>,
    env: &[(String, String)],
) -> Result<(), KernelError> {
    if argv.is_empty() {
        return Err(KernelError::InvalidCommand("argv is empty".into()));
    }
    if let Some(s) = argv
        .iter()
        .map(String::as_str)
        .chain(cwd)
        .find(|s| s.contains('\0'))
    {
        return Err(KernelError::InvalidCommand(format!(
            "{s:?} contains a NUL byte"
        )));
    }
    check_env(env)
}

/// Checks `env` against the one rule ([`corral_sandbox::env`]).
pub(crate) fn check_env(env: &[(String, String)]) -> Result<(), KernelError> {
    corral_sandbox::env::check(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map_err(|e| KernelError::InvalidCommand(e.to_string()))
}

fn write_all(fd: BorrowedFd<'_>, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match nix::unistd::write(fd, bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Copies every regular file of one workspace into another (a restart keeps files).
fn copy_workspace(from: &Workspace, to: &Workspace) {
    for entry in from.list().unwrap_or_default() {
        if let Ok(mut file) = from.open_file(Path::new(&entry.path)) {
            let _ = to.write_file(Path::new(&entry.path), &mut file);
        }
    }
}
