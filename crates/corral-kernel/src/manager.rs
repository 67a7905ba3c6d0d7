//! Sessions by id, as the server and the MCP server use them: create (from the warm pool
//! where possible), execute, run commands, interrupt, restart, close, list, inspect, and
//! idle expiry.

use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use std::collections::VecDeque;

use corral_egress::EgressMonitor;
use corral_sandbox::cgroup::{MemoryUsage, Meter};
use corral_sandbox::ports::PortOpener;
use corral_sandbox::{ExecutionResult, NetworkReport, Workspace};

use crate::agent::{AgentError, ProcessAgent};
use crate::context::MAX_CONTEXTS;
use crate::event::Event;
use crate::node::NodeName;
use crate::pool::Pool;
use crate::session::Language;
use crate::session::{Interrupter, KernelError, Session, SessionOptions, Stopper};

/// What a caller may see of a session.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionInfo {
    pub id: String,
    pub language: &'static str,
    pub created_at: SystemTime,
    pub last_used: SystemTime,
    pub idle_timeout: Duration,
    pub executions: u64,
    /// `None` while alive; why it died otherwise.
    pub death: Option<String>,
    /// Protections weaker than requested for this session.
    pub warnings: Vec<String>,
    /// Since when the session is paused (frozen, see [`SessionManager::pause`]).
    pub paused_at: Option<SystemTime>,
    /// What its egress proxy has done since the kernel started (none without a network
    /// policy).
    pub network: Option<NetworkReport>,
}

/// How often the usage of every session is sampled, and how many samples each keeps (the last
/// ten minutes; docs/threat-model.md §11).
const SAMPLE_EVERY: Duration = Duration::from_secs(5);
const SAMPLES_KEPT: usize = 120;

/// One reading of a session's usage (see [`SessionManager::metrics`]).
#[derive(Debug, Clone, PartialEq)]
pub struct MetricSample {
    pub at: SystemTime,
    /// CPU time used by the session since it was created (its current kernel's, after a
    /// restart); `None` without a cgroup.
    pub cpu_time: Option<Duration>,
    /// Memory charged to the session's cgroup; `None` without a cgroup.
    pub memory: Option<MemoryUsage>,
    /// Bytes used in `/workspace`, and its size.
    pub disk_used: u64,
    pub disk_total: u64,
}

struct Entry {
    session: Mutex<Session>,
    /// Callers waiting for `session` ([`take_turn`]).
    waiting: AtomicUsize,
    interrupter: Interrupter,
    /// The session's workspace, reachable without waiting for the session's lock (a restart
    /// replaces it).
    workspace: Mutex<Workspace>,
    info: Mutex<SessionInfo>,
    last_used: Mutex<Instant>,
    /// Since when the session is paused; `None` while it runs.
    paused: Mutex<Option<Instant>>,
    /// Reads the session's cgroup without its lock (a restart replaces it).
    meter: Mutex<Option<Meter>>,
    /// The last [`SAMPLES_KEPT`] samples, oldest first.
    samples: Mutex<VecDeque<MetricSample>>,
    /// Reads the session's egress report without waiting for the session (a restart
    /// replaces it).
    network: Mutex<Option<EgressMonitor>>,
    /// Opens connections to the session's listeners without waiting for the session (a
    /// restart replaces it).
    ports: Mutex<Option<PortOpener>>,
    /// The session's process agent, reachable without waiting for the session (a restart
    /// replaces it).
    agent: Mutex<Option<Arc<ProcessAgent>>>,
    /// What the session was made from (a code context takes its limits, policy and code
    /// policy, in another language).
    options: SessionOptions,
    /// The session's code contexts besides its own kernel, by id (see [`crate::context`]).
    contexts: Mutex<std::collections::BTreeMap<String, Arc<Context>>>,
}

impl Entry {
    /// The session's info, with its egress report as of now.
    fn info(&self) -> SessionInfo {
        let mut info = self.info.lock().clone();
        info.network = self.network.lock().as_ref().map(EgressMonitor::report);
        info
    }

    /// Keeps a sample of now, dropping the oldest beyond [`SAMPLES_KEPT`].
    fn record_sample(&self) {
        let sample = self.sample();
        let mut samples = self.samples.lock();
        if samples.len() == SAMPLES_KEPT {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    /// The session's usage now.
    fn sample(&self) -> MetricSample {
        let meter = self.meter.lock().clone();
        let (disk_used, disk_total) = self.workspace.lock().usage().unwrap_or((0, 0));
        MetricSample {
            at: SystemTime::now(),
            cpu_time: meter.as_ref().and_then(Meter::cpu_time),
            memory: meter.as_ref().and_then(Meter::memory),
            disk_used,
            disk_total,
        }
    }

    /// Refuses work for a paused session: its processes are frozen, and nothing may wait on
    /// them (an upload's writer joins the session's cgroup and would freeze too).
    fn check_running(&self, id: &str) -> Result<(), ManagerError> {
        match *self.paused.lock() {
            Some(_) => Err(ManagerError::Paused(id.to_string())),
            None => Ok(()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error("no session {0}")]
    NotFound(String),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// The session is paused: resume it first (only info, resume and close work meanwhile).
    #[error("session {0} is paused: resume it first")]
    Paused(String),
    /// A resume of a session that is not paused.
    #[error("session {0} is not paused")]
    NotPaused(String),
    /// A pause of a session whose kernel died.
    #[error("session {id} is dead ({reason})")]
    Dead { id: String, reason: String },
    /// A pause while the session executes or runs a command.
    #[error("session {0} is busy: pause it between executions")]
    Busy(String),
    /// A call that would wait for a session (or one of its code contexts) while
    /// [`MAX_WAITING`] calls wait for it already.
    #[error(
        "session {0} is busy and {MAX_WAITING} calls wait for it already: retry when one is done"
    )]
    QueueFull(String),
    /// A creation under the id of a live session.
    #[error("a session {0} exists already")]
    Exists(String),
    #[error(transparent)]
    Agent(#[from] AgentError),
    #[error("session {0} has {MAX_CONTEXTS} code contexts already, the most it may have")]
    TooManyContexts(String),
    #[error("session {id} has no code context {context}")]
    NoContext { id: String, context: String },
    #[error(
        "the default context of session {0} is its own kernel: restart it, or close the session"
    )]
    MainContext(String),
}

/// The most calls (executions, commands, restarts, resumes) that wait at once for one
/// session, or one code context, while it is busy; more are refused
/// ([`ManagerError::QueueFull`]). Each waiting call holds a thread of its caller (the server's
/// blocking pool, shared by every key): without a bound, one key's calls piled on one busy
/// session would take them all.
pub const MAX_WAITING: usize = 4;

/// `session`, once the calls before this one are done: at once if it is free; refused if
/// [`MAX_WAITING`] calls wait for it already (`waiting` counts them).
fn take_turn<'a>(
    session: &'a Mutex<Session>,
    waiting: &AtomicUsize,
    id: &str,
) -> Result<MutexGuard<'a, Session>, ManagerError> {
    if let Some(session) = session.try_lock() {
        return Ok(session);
    }
    if waiting.fetch_add(1, Ordering::SeqCst) >= MAX_WAITING {
        waiting.fetch_sub(1, Ordering::SeqCst);
        return Err(ManagerError::QueueFull(id.to_string()));
    }
    let session = session.lock();
    waiting.fetch_sub(1, Ordering::SeqCst);
    Ok(session)
}

/// All live sessions of a process.
pub struct SessionManager {
    sessions: Mutex<HashMap<String, Arc<Entry>>>,
    pools: Mutex<Vec<Arc<Pool>>>,
    next: AtomicU64,
    /// How long a session may stay paused before it is closed (its idle clock stops while
    /// it is paused).
    max_paused: Duration,
    /// The node name ids end in (`crate::node`); `None` on a single node.
    node: Option<NodeName>,
}

impl SessionManager {
    /// A manager whose background thread closes sessions idle past their timeout, and
    /// sessions paused longer than `max_paused`.
    pub fn new(max_paused: Duration) -> Arc<SessionManager> {
        SessionManager::with_node(max_paused, None)
    }

    /// As [`SessionManager::new`], for a member of a cluster: the ids it makes name `node`
    /// (`crate::node::sandbox_id`).
    pub fn with_node(max_paused: Duration, node: Option<NodeName>) -> Arc<SessionManager> {
        let manager = Arc::new(SessionManager {
            sessions: Mutex::new(HashMap::new()),
            pools: Mutex::new(Vec::new()),
            next: AtomicU64::new(1),
            max_paused,
            node,
        });
        let weak = Arc::downgrade(&manager);
        thread::Builder::new()
            .name("corral-idle".into())
            .spawn(move || expire_idle(weak))
            .expect("spawning the idle reaper");
        manager
    }

    /// Serves Python sessions on the pool's image from it.
    pub fn add_pool(&self, pool: Arc<Pool>) {
        self.pools.lock().push(pool);
    }

    /// Closes every session and tears every pool down (see [`Pool::shutdown`]): nothing of
    /// this manager's is left on the host.
    pub fn shutdown(&self) {
        let ids: Vec<String> = self.sessions.lock().keys().cloned().collect();
        for id in ids {
            let _ = self.close(&id);
        }
        let pools: Vec<Arc<Pool>> = self.pools.lock().drain(..).collect();
        for pool in pools {
            pool.shutdown();
        }
    }

    pub fn create(
        &self,
        options: &SessionOptions,
        idle_timeout: Duration,
    ) -> Result<SessionInfo, ManagerError> {
        self.create_as(options, idle_timeout, None)
    }

    /// [`SessionManager::create`], the session named `id` when given (a session the server
    /// saved across a restart comes back under its own id); refused when a live session has
    /// that id.
    pub fn create_as(
        &self,
        options: &SessionOptions,
        idle_timeout: Duration,
        id: Option<&str>,
    ) -> Result<SessionInfo, ManagerError> {
        if let Some(id) = id {
            if self.sessions.lock().contains_key(id) {
                return Err(ManagerError::Exists(id.to_string()));
            }
        }
        let pool = self
            .pools
            .lock()
            .iter()
            .find(|p| p.serves(options))
            .cloned();
        let mut session = match pool {
            Some(pool) => pool.acquire(options)?,
            None => Session::create(options)?,
        };
        // A pooled session was made before its owner was known.
        session.set_result_budget(options.result_budget.clone());
        let id = id.map(str::to_string).unwrap_or_else(|| {
            let nanos = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            let stamp = ((nanos & 0xffff_ffff) << 16)
                | (self.next.fetch_add(1, Ordering::Relaxed) & 0xffff);
            crate::node::sandbox_id(stamp, rand::random(), self.node.as_ref())
        });
        let now = SystemTime::now();
        let info = SessionInfo {
            id: id.clone(),
            language: session.language().name(),
            created_at: now,
            last_used: now,
            idle_timeout,
            executions: 0,
            death: None,
            warnings: session.warnings().to_vec(),
            paused_at: None,
            network: None,
        };
        let agent = session.agent().ok();
        if let Some(agent) = &agent {
            // A pooled session's agent was started before its owner's environment was known.
            agent.set_env(options.env.clone());
        }
        let entry = Arc::new(Entry {
            agent: Mutex::new(agent),
            options: options.clone(),
            contexts: Mutex::new(Default::default()),
            network: Mutex::new(session.network_monitor()),
            ports: Mutex::new(session.port_opener()),
            interrupter: session.interrupter(),
            workspace: Mutex::new(session.workspace().clone()),
            meter: Mutex::new(session.meter()),
            session: Mutex::new(session),
            waiting: AtomicUsize::new(0),
            info: Mutex::new(info.clone()),
            last_used: Mutex::new(Instant::now()),
            paused: Mutex::new(None),
            samples: Mutex::new(VecDeque::with_capacity(SAMPLES_KEPT)),
        });
        entry.record_sample();
        let info = entry.info();
        self.sessions.lock().insert(id, entry);
        Ok(info)
    }

    fn entry(&self, id: &str) -> Result<Arc<Entry>, ManagerError> {
        self.sessions
            .lock()
            .get(id)
            .cloned()
            .ok_or_else(|| ManagerError::NotFound(id.to_string()))
    }

    /// Runs code in session `id`, with `env` set for this execution only (see
    /// [`Session::execute_with_env`]); executions in one session are serialized.
    pub fn execute(
        &self,
        id: &str,
        code: &str,
        env: &[(String, String)],
        timeout: Duration,
        on_event: &mut dyn FnMut(&Event),
    ) -> Result<ExecutionResult, ManagerError> {
        let entry = self.entry(id)?;
        let mut session = take_turn(&entry.session, &entry.waiting, id)?;
        entry.check_running(id)?;
        let result = session.execute_with_env(code, env, timeout, on_event)?;
        *entry.last_used.lock() = Instant::now();
        let mut info = entry.info.lock();
        info.last_used = SystemTime::now();
        info.executions = session.executions();
        info.death = session.death().map(|d| d.message.clone());
        Ok(result)
    }

    /// Runs a program in session `id`'s sandbox (see [`Session::run_command`]); serialized
    /// with its executions, and stopped by `stop` whether it waits for them or runs. It does
    /// not count as an execution.
    #[allow(clippy::too_many_arguments)]
    pub fn run_command(
        &self,
        id: &str,
        argv: &[String],
        cwd: Option<&str>,
        env: &[(String, String)],
        timeout: Duration,
        stop: &Stopper,
        on_event: &mut dyn FnMut(&Event),
    ) -> Result<ExecutionResult, ManagerError> {
        let entry = self.entry(id)?;
        let mut session = take_turn(&entry.session, &entry.waiting, id)?;
        entry.check_running(id)?;
        let result = session.run_command(argv, cwd, env, timeout, stop, on_event)?;
        *entry.last_used.lock() = Instant::now();
        let mut info = entry.info.lock();
        info.last_used = SystemTime::now();
        info.death = session.death().map(|d| d.message.clone());
        Ok(result)
    }

    /// Interrupts the running execution of session `id`, if any.
    pub fn interrupt(&self, id: &str) -> Result<(), ManagerError> {
        self.entry(id)?.interrupter.interrupt();
        Ok(())
    }

    /// Sets how long session `id` may stay idle from now on.
    pub fn set_idle_timeout(&self, id: &str, idle_timeout: Duration) -> Result<(), ManagerError> {
        self.entry(id)?.info.lock().idle_timeout = idle_timeout;
        Ok(())
    }

    /// Freezes session `id` (see [`Session::pause`]) between its executions: it uses no CPU
    /// and keeps its memory, and its idle clock stops; it is closed once paused longer than
    /// the manager's `max_paused`.
    pub fn pause(&self, id: &str) -> Result<SessionInfo, ManagerError> {
        let entry = self.entry(id)?;
        let Some(mut session) = entry.session.try_lock() else {
            return Err(ManagerError::Busy(id.to_string()));
        };
        let mut paused = entry.paused.lock();
        if paused.is_some() {
            return Err(ManagerError::Paused(id.to_string()));
        }
        if let Some(death) = session.death() {
            return Err(ManagerError::Dead {
                id: id.to_string(),
                reason: death.message.clone(),
            });
        }
        session.pause()?;
        *paused = Some(Instant::now());
        entry.info.lock().paused_at = Some(SystemTime::now());
        Ok(entry.info())
    }

    /// Thaws session `id`, paused by [`SessionManager::pause`]; its idle clock starts again
    /// from now.
    pub fn resume(&self, id: &str) -> Result<SessionInfo, ManagerError> {
        let entry = self.entry(id)?;
        let mut session = take_turn(&entry.session, &entry.waiting, id)?;
        let mut paused = entry.paused.lock();
        if paused.is_none() {
            return Err(ManagerError::NotPaused(id.to_string()));
        }
        session.resume()?;
        *paused = None;
        *entry.last_used.lock() = Instant::now();
        {
            let mut info = entry.info.lock();
            info.paused_at = None;
            info.last_used = SystemTime::now();
        }
        Ok(entry.info())
    }

    /// Replaces the kernel of session `id` (state is lost, files are kept).
    pub fn restart(&self, id: &str) -> Result<SessionInfo, ManagerError> {
        let entry = self.entry(id)?;
        let mut session = take_turn(&entry.session, &entry.waiting, id)?;
        entry.check_running(id)?;
        session.restart()?;
        *entry.workspace.lock() = session.workspace().clone();
        *entry.meter.lock() = session.meter();
        *entry.network.lock() = session.network_monitor();
        *entry.ports.lock() = session.port_opener();
        *entry.agent.lock() = session.agent().ok();
        // The contexts were kernels of the old sandbox, which is gone.
        entry.contexts.lock().clear();
        {
            let mut info = entry.info.lock();
            info.death = None;
            info.executions = 0;
        }
        Ok(entry.info())
    }

    /// The workspace of session `id` to read, paused or not (a paused session's files are
    /// saved across a restart); nothing may write through it while the session is paused.
    pub fn workspace_to_save(&self, id: &str) -> Result<Workspace, ManagerError> {
        let entry = self.entry(id)?;
        let workspace = entry.workspace.lock().clone();
        Ok(workspace)
    }

    /// Opens connections to the servers listening in session `id`'s sandbox (for the port
    /// proxy); refused while it is paused. A connection counts as use of the session: its
    /// idle clock starts again.
    pub fn port_opener(&self, id: &str) -> Result<PortOpener, ManagerError> {
        let entry = self.entry(id)?;
        entry.check_running(id)?;
        let opener = entry.ports.lock().clone();
        let opener = opener.ok_or_else(|| ManagerError::Dead {
            id: id.to_string(),
            reason: "its sandbox has ended".into(),
        })?;
        *entry.last_used.lock() = Instant::now();
        entry.info.lock().last_used = SystemTime::now();
        Ok(opener)
    }

    /// The workspace of session `id` (for the files API). It is not the session: using it
    /// neither waits for the session's executions nor holds them up, and closing the session
    /// meanwhile kills whatever is writing into it.
    pub fn workspace(&self, id: &str) -> Result<Workspace, ManagerError> {
        let entry = self.entry(id)?;
        entry.check_running(id)?;
        let workspace = entry.workspace.lock().clone();
        Ok(workspace)
    }

    /// The process agent of session `id` (see [`crate::agent`]): programs it starts run
    /// beside the session's executions, without its lock. Asking for it counts as a use of
    /// the session (its idle clock starts again).
    pub fn agent(&self, id: &str) -> Result<Arc<ProcessAgent>, ManagerError> {
        let entry = self.entry(id)?;
        entry.check_running(id)?;
        let agent = entry.agent.lock().clone();
        // Working with its processes is using the session: its idle clock starts again.
        *entry.last_used.lock() = Instant::now();
        entry.info.lock().last_used = SystemTime::now();
        Ok(agent.ok_or(AgentError::Unavailable)?)
    }

    /// Closes session `id`: its sandbox is torn down and nothing of it remains.
    pub fn close(&self, id: &str) -> Result<(), ManagerError> {
        let entry = self
            .sessions
            .lock()
            .remove(id)
            .ok_or_else(|| ManagerError::NotFound(id.to_string()))?;
        entry.interrupter.interrupt();
        drop(entry.session.lock());
        Ok(())
    }

    /// The samples of session `id`'s usage kept from the last ten minutes (one every five
    /// seconds), oldest first, and one taken now.
    pub fn metrics(&self, id: &str) -> Result<Vec<MetricSample>, ManagerError> {
        let entry = self.entry(id)?;
        let mut samples: Vec<MetricSample> = entry.samples.lock().iter().cloned().collect();
        samples.push(entry.sample());
        Ok(samples)
    }

    /// Samples the usage of every session.
    fn sample_all(&self) {
        let entries: Vec<Arc<Entry>> = self.sessions.lock().values().cloned().collect();
        for entry in entries {
            entry.record_sample();
        }
    }

    pub fn get(&self, id: &str) -> Result<SessionInfo, ManagerError> {
        Ok(self.entry(id)?.info())
    }

    pub fn list(&self) -> Vec<SessionInfo> {
        let entries: Vec<Arc<Entry>> = self.sessions.lock().values().cloned().collect();
        let mut infos: Vec<SessionInfo> = entries.iter().map(|e| e.info()).collect();
        infos.sort_by(|a, b| a.id.cmp(&b.id));
        infos
    }

    /// Closes every session idle longer than its timeout, and every session paused longer
    /// than `max_paused`; returns how many.
    pub fn expire_idle(&self) -> usize {
        let expired: Vec<String> = self
            .sessions
            .lock()
            .iter()
            .filter(|(_, e)| {
                if let Some(since) = *e.paused.lock() {
                    return since.elapsed() > self.max_paused;
                }
                let idle = e.last_used.lock().elapsed();
                // A session busy executing holds its lock; it is not idle.
                e.session.try_lock().is_some() && idle > e.info.lock().idle_timeout
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            let _ = self.close(id);
        }
        expired.len()
    }
}

/// A code context of a session, as listed: the session's own kernel is the default context
/// of its language, `default-<language>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextInfo {
    pub id: String,
    pub language: Language,
    /// Its working directory, relative to `/workspace` (none: `/workspace`).
    pub cwd: Option<String>,
}

/// The id of `language`'s default context.
pub fn default_context_id(language: Language) -> String {
    format!("default-{}", language.name())
}

/// A code context besides the session's own kernel.
struct Context {
    info: ContextInfo,
    session: Mutex<Session>,
    /// Callers waiting for `session` ([`take_turn`]).
    waiting: AtomicUsize,
}

impl SessionManager {
    fn main_language(entry: &Entry) -> Language {
        entry.options.language
    }

    /// Starts a code context of `language` in session `id` (a kernel of that language in the
    /// session's sandbox, with its limits and code policy, in `cwd`): at most
    /// [`MAX_CONTEXTS`] besides the session's own kernel.
    pub fn create_context(
        &self,
        id: &str,
        language: Language,
        cwd: Option<String>,
    ) -> Result<ContextInfo, ManagerError> {
        let context_id = format!("ctx-{:x}", self.next.fetch_add(1, Ordering::Relaxed));
        self.start_context(id, context_id, language, cwd)
    }

    fn start_context(
        &self,
        id: &str,
        context_id: String,
        language: Language,
        cwd: Option<String>,
    ) -> Result<ContextInfo, ManagerError> {
        let entry = self.entry(id)?;
        entry.check_running(id)?;
        let agent = entry.agent.lock().clone().ok_or(AgentError::Unavailable)?;
        if entry.contexts.lock().len() >= MAX_CONTEXTS {
            return Err(ManagerError::TooManyContexts(id.to_string()));
        }
        let mut options = entry.options.clone();
        options.language = language;
        let workspace = entry.workspace.lock().clone();
        let warnings = entry.info.lock().warnings.clone();
        let session = Session::start_context(agent, options, workspace, cwd.clone(), warnings)?;
        let info = ContextInfo {
            id: context_id.clone(),
            language,
            cwd,
        };
        let mut contexts = entry.contexts.lock();
        if let Some(existing) = contexts.get(&info.id) {
            // Started at once by another request (a language's default context).
            return Ok(existing.info.clone());
        }
        if contexts.len() >= MAX_CONTEXTS {
            return Err(ManagerError::TooManyContexts(id.to_string()));
        }
        contexts.insert(
            context_id,
            Arc::new(Context {
                info: info.clone(),
                session: Mutex::new(session),
                waiting: AtomicUsize::new(0),
            }),
        );
        Ok(info)
    }

    /// Session `id`'s contexts: its own kernel's (the default of its language) first.
    pub fn list_contexts(&self, id: &str) -> Result<Vec<ContextInfo>, ManagerError> {
        let entry = self.entry(id)?;
        let language = Self::main_language(&entry);
        let main = ContextInfo {
            id: default_context_id(language),
            language,
            cwd: None,
        };
        let others = entry.contexts.lock();
        Ok(std::iter::once(main)
            .chain(others.values().map(|c| c.info.clone()))
            .collect())
    }

    /// The context that runs `language` by default in session `id`: the session's own kernel
    /// for its language, else `default-<language>`, started now if it is not there yet.
    pub fn default_context(&self, id: &str, language: Language) -> Result<String, ManagerError> {
        let entry = self.entry(id)?;
        let context_id = default_context_id(language);
        if language == Self::main_language(&entry)
            || entry.contexts.lock().contains_key(&context_id)
        {
            return Ok(context_id);
        }
        self.start_context(id, context_id.clone(), language, None)?;
        Ok(context_id)
    }

    fn context(
        &self,
        entry: &Entry,
        id: &str,
        context_id: &str,
    ) -> Result<Arc<Context>, ManagerError> {
        entry
            .contexts
            .lock()
            .get(context_id)
            .cloned()
            .ok_or_else(|| ManagerError::NoContext {
                id: id.to_string(),
                context: context_id.to_string(),
            })
    }

    /// Runs code in context `context_id` of session `id` (its own kernel's id runs there, as
    /// [`SessionManager::execute`]); executions in one context are serialized, contexts run
    /// at once.
    pub fn execute_in_context(
        &self,
        id: &str,
        context_id: &str,
        code: &str,
        env: &[(String, String)],
        timeout: Duration,
        on_event: &mut dyn FnMut(&Event),
    ) -> Result<ExecutionResult, ManagerError> {
        let entry = self.entry(id)?;
        if context_id == default_context_id(Self::main_language(&entry)) {
            return self.execute(id, code, env, timeout, on_event);
        }
        let context = self.context(&entry, id, context_id)?;
        let mut session = take_turn(&context.session, &context.waiting, id)?;
        entry.check_running(id)?;
        let result = session.execute_with_env(code, env, timeout, on_event)?;
        *entry.last_used.lock() = Instant::now();
        entry.info.lock().last_used = SystemTime::now();
        Ok(result)
    }

    /// Restarts context `context_id` of session `id` (its own kernel's: the session's
    /// restart).
    pub fn restart_context(&self, id: &str, context_id: &str) -> Result<(), ManagerError> {
        let entry = self.entry(id)?;
        if context_id == default_context_id(Self::main_language(&entry)) {
            return self.restart(id).map(drop);
        }
        let context = self.context(&entry, id, context_id)?;
        let mut session = take_turn(&context.session, &context.waiting, id)?;
        entry.check_running(id)?;
        Ok(session.restart()?)
    }

    /// Removes context `context_id` of session `id`; its kernel is killed. The session's own
    /// kernel is not removed (close the session).
    pub fn remove_context(&self, id: &str, context_id: &str) -> Result<(), ManagerError> {
        let entry = self.entry(id)?;
        if context_id == default_context_id(Self::main_language(&entry)) {
            return Err(ManagerError::MainContext(id.to_string()));
        }
        let removed = entry.contexts.lock().remove(context_id);
        match removed {
            Some(_) => Ok(()),
            None => Err(ManagerError::NoContext {
                id: id.to_string(),
                context: context_id.to_string(),
            }),
        }
    }
}

/// The manager's background thread: idle expiry every second, usage samples every
/// [`SAMPLE_EVERY`].
fn expire_idle(manager: Weak<SessionManager>) {
    let mut last_sample = Instant::now();
    loop {
        thread::sleep(Duration::from_secs(1));
        match manager.upgrade() {
            Some(m) => {
                m.expire_idle();
                if last_sample.elapsed() >= SAMPLE_EVERY {
                    last_sample = Instant::now();
                    m.sample_all();
                }
            }
            None => return,
        }
    }
}
