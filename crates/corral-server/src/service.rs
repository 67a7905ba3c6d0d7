//! What the server does, without HTTP: one-shot runs, sessions owned by tenants, files and
//! commands in sessions, the audit log. Synchronous (the engine is); the HTTP layer and the
//! in-process MCP server call it from blocking threads.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Seek, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use corral_image::{ImageError, ResolvedImage, Store};
use corral_kernel::bytecode::BytecodeCache;
use corral_kernel::oneshot;
use corral_kernel::{
    Event, KernelError, Language, ManagerError, Pool, SessionManager, SessionOptions, Stopper,
    ZygoteKind, ZygoteStatus,
};
use corral_sandbox::limits::show_bytes;
use corral_sandbox::limits::timeout_from_secs;
use corral_sandbox::{
    ExecutionResult, FileEntry, InputFile, LimitError, LimitField, Limits, Policy, ResultBudget,
    SandboxSpec, Status, WorkspaceError,
};
use serde::{Deserialize, Serialize};

use crate::admission::{Admission, RunPermit};
use crate::config::Config;
use crate::db::{AuditEntry, Db};
use crate::metrics::Metrics;

/// The tenant a request acts for: an API key's id, or `local` for keyless loopback use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub String);

impl Tenant {
    pub fn local() -> Tenant {
        Tenant("local".into())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    InvalidPath(String),
    /// No such sandbox (or another tenant's).
    #[error("{0}")]
    NotFound(String),
    /// No such file or directory in a sandbox's workspace: the sandbox itself is there.
    #[error("{0}")]
    FileNotFound(String),
    #[error("{0}")]
    SandboxDead(String),
    #[error("{0}")]
    UnknownImage(String),
    #[error("{0}")]
    UnsupportedLanguage(String),
    #[error("{message}")]
    TooManySandboxes { message: String, retry_after_s: u64 },
    /// Temporarily unable to create the sandbox; retrying after `retry_after_s` can succeed.
    #[error("{message}")]
    Unavailable {
        reason: Unavailability,
        message: String,
        retry_after_s: u64,
    },
    #[error("{0}")]
    Sandbox(String),
    /// An upload larger than it may ever be (its announced length, or what it sent).
    #[error("{0}")]
    PayloadTooLarge(String),
    /// A file that does not fit the sandbox: its workspace is full, or it would take the
    /// sandbox past its memory limit.
    #[error("{0}")]
    InsufficientStorage(String),
    #[error("the server is shutting down")]
    ShuttingDown,
}

impl ServiceError {
    /// Whether this is the refusal of an upload that does not fit (413 or 507): the answer
    /// to give even when its body then failed too.
    pub fn is_refused_upload(&self) -> bool {
        matches!(
            self,
            ServiceError::PayloadTooLarge(_) | ServiceError::InsufficientStorage(_)
        )
    }
}

/// Why a sandbox cannot be made now (each is answered 503 with its own code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailability {
    /// The image's zygote is being replaced.
    ZygoteRestarting,
    /// The memory promised to live sandboxes has reached the host's budget.
    MemoryBudget,
    /// Every upload slot (`max_uploads_in_flight`) is taken.
    Uploads,
}

impl From<WorkspaceError> for ServiceError {
    fn from(e: WorkspaceError) -> Self {
        match e {
            WorkspaceError::OutsideWorkspace(_)
            | WorkspaceError::NotRegular(_)
            | WorkspaceError::Link(_) => ServiceError::InvalidPath(e.to_string()),
            WorkspaceError::Io { ref source, .. } => match source.raw_os_error() {
                Some(libc::ENOENT) => ServiceError::FileNotFound(e.to_string()),
                // A path leaving the workspace, or a file where a directory was expected.
                Some(libc::EXDEV | libc::ENOTDIR | libc::EISDIR) => {
                    ServiceError::InvalidPath(e.to_string())
                }
                _ => ServiceError::Sandbox(e.to_string()),
            },
            WorkspaceError::Full { .. } | WorkspaceError::OverMemoryLimit { .. } => {
                ServiceError::InsufficientStorage(e.to_string())
            }
            WorkspaceError::Source { .. } => ServiceError::BadRequest(e.to_string()),
        }
    }
}

/// Resource limits as requests give them; absent fields take the defaults of `corral run`
/// (docs/cli.md#corral-run).
#[derive(Debug, Clone, Default, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsRequest {
    /// Wall-clock limit in seconds (sessions: the default per-execution timeout).
    pub timeout_s: Option<f64>,
    pub memory_mb: Option<u64>,
    pub cpus: Option<f64>,
    pub pids: Option<u64>,
    /// Size of `/workspace` (and of `/tmp`).
    pub disk_mb: Option<u64>,
    /// Rich results (their frames, buffered) per execution, in MiB; 0 keeps none.
    pub result_mb: Option<u64>,
    /// Rich results kept per execution.
    pub result_count: Option<u64>,
}

impl LimitsRequest {
    /// The limits asked for on top of `defaults` (the server's), checked against the engine's
    /// bounds (those of `corral run` too); a limit out of range is a bad request naming its
    /// field.
    pub fn to_limits(&self, defaults: &Limits) -> Result<Limits, ServiceError> {
        let mut limits = *defaults;
        if let Some(t) = self.timeout_s {
            limits.timeout = timeout_from_secs(t).map_err(limits_error)?;
        }
        if let Some(m) = self.memory_mb {
            limits.memory_bytes = m.saturating_mul(1 << 20);
        }
        if let Some(c) = self.cpus {
            limits.cpus = c;
        }
        if let Some(p) = self.pids {
            limits.pids = p;
        }
        if let Some(d) = self.disk_mb {
            limits.disk_bytes = d.saturating_mul(1 << 20);
        }
        if let Some(r) = self.result_mb {
            limits.result_bytes = usize::try_from(r.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
        }
        if let Some(n) = self.result_count {
            limits.result_count = usize::try_from(n).unwrap_or(usize::MAX);
        }
        limits.validate().map_err(limits_error)?;
        Ok(limits)
    }
}

/// An engine limit error as a bad request naming the request's field (`limits.memory_mb`).
fn limits_error(e: LimitError) -> ServiceError {
    let field = match e.field {
        LimitField::Timeout => "timeout_s",
        LimitField::Memory => "memory_mb",
        LimitField::Cpus => "cpus",
        LimitField::Pids => "pids",
        LimitField::Disk => "disk_mb",
        LimitField::ResultBytes => "result_mb",
        LimitField::ResultCount => "result_count",
    };
    ServiceError::BadRequest(e.naming(&format!("limits.{field}")))
}

/// A file for a one-shot run's workspace: text in `content`, or bytes in `content_base64`.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InputFileRequest {
    /// Relative to `/workspace`.
    pub path: String,
    pub content: Option<String>,
    pub content_base64: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    pub code: String,
    /// `python` (default), `javascript` or `bash`.
    pub language: Option<String>,
    /// Default: the server's default image.
    pub image: Option<String>,
    pub limits: Option<LimitsRequest>,
    pub env: Option<BTreeMap<String, String>>,
    pub files: Option<Vec<InputFileRequest>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxRequest {
    pub image: Option<String>,
    pub language: Option<String>,
    pub limits: Option<LimitsRequest>,
    pub env: Option<BTreeMap<String, String>>,
    /// The session is closed after this long without use (default 600).
    pub idle_timeout_s: Option<u64>,
}

#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecuteRequest {
    pub code: String,
    /// When given, it must be the session's language.
    pub language: Option<String>,
    /// Default: the session's `limits.timeout_s`.
    pub timeout_s: Option<f64>,
}

#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CommandRequest {
    /// A shell command line (run by `bash -c`), or the program when `args` is given.
    pub cmd: String,
    /// Arguments: when present, `cmd` runs directly, without a shell.
    pub args: Option<Vec<String>>,
    /// Working directory inside the sandbox (default `/workspace`).
    pub cwd: Option<String>,
    pub env: Option<BTreeMap<String, String>>,
    pub timeout_s: Option<f64>,
}

/// A session as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SandboxInfo {
    pub id: String,
    pub image: String,
    pub language: String,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// When the session will be closed if it stays idle (moves with every use).
    pub expires_at: String,
    pub last_used_at: String,
    /// `running` or `dead`.
    pub state: String,
    pub executions: u64,
    /// Why the kernel died, when it did.
    pub death: Option<String>,
    /// Protections weaker than requested for this session (also in every execution's result).
    pub warnings: Vec<String>,
}

/// A checked command: what runs, with what, for how long.
#[derive(Debug, Clone)]
pub struct PreparedCommand {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
}

/// How long an image resolved by name is reused: a newly built image is used at most this much
/// later.
const RESOLVED_FOR: Duration = Duration::from_secs(1);

/// What the service knows of a session beyond the manager: who owns it and what it runs.
#[derive(Debug, Clone)]
struct Owned {
    tenant: Tenant,
    image: String,
    default_timeout: Duration,
    /// Host memory promised to the session (see [`Admission`]), given back when it ends.
    promised_bytes: u64,
    /// What of it a dead session still holds: its workspace, until it is closed.
    workspace_bytes: u64,
}

pub struct Service {
    config: Config,
    store: Store,
    manager: Arc<SessionManager>,
    pool: Option<Arc<Pool>>,
    db: Db,
    pub metrics: Metrics,
    sessions: Mutex<HashMap<String, Owned>>,
    /// Session slots taken by creations in progress, per tenant.
    reserved: Mutex<HashMap<String, usize>>,
    /// The memory budget of live sandboxes and the one-shot run slots.
    admission: Arc<Admission>,
    shutting_down: AtomicBool,
    bytecode: Mutex<HashMap<String, Arc<BytecodeCache>>>,
    /// Images resolved by name, each reused for [`RESOLVED_FOR`].
    resolved: Mutex<HashMap<String, (Instant, Arc<ResolvedImage>)>>,
    /// The rich results held at once (`max_result_bytes_in_flight`), and each key's share.
    result_budget: Arc<ResultBudget>,
    result_shares: Mutex<HashMap<String, Arc<ResultBudget>>>,
    /// The limits a request leaves out (`default_limits` in the config).
    default_limits: Limits,
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Reads the image's env and languages into session options.
fn session_options(
    image: &ResolvedImage,
    language: Language,
    limits: Limits,
    env: Vec<(String, String)>,
    policy: Policy,
) -> SessionOptions {
    let mut options = SessionOptions::new(language);
    options.rootfs = image.rootfs.clone();
    options.image_env = image.env.clone();
    options.limits = limits;
    options.env = env;
    options.policy = policy;
    options
}

fn check_env(
    env: Option<&BTreeMap<String, String>>,
) -> Result<Vec<(String, String)>, ServiceError> {
    let mut out = Vec::new();
    for (k, v) in env.into_iter().flatten() {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(ServiceError::BadRequest(format!(
                "env: {k:?} is not a valid variable name (non-empty, no '=' or NUL)"
            )));
        }
        out.push((k.clone(), v.clone()));
    }
    Ok(out)
}

fn parse_language(name: Option<&str>) -> Result<Language, ServiceError> {
    match name {
        None => Ok(Language::Python),
        Some(n) => Language::parse(n).ok_or_else(|| {
            ServiceError::UnsupportedLanguage(format!(
                "unknown language {n:?}: use python, javascript or bash"
            ))
        }),
    }
}

fn timeout_from(seconds: Option<f64>, default: Duration) -> Result<Duration, ServiceError> {
    match seconds {
        None => Ok(default),
        Some(t) => {
            timeout_from_secs(t).map_err(|e| ServiceError::BadRequest(e.naming("timeout_s")))
        }
    }
}

impl Service {
    /// Opens the database, ends the sessions a killed predecessor left, removes its stale
    /// cgroups, and starts the warm pool of the default image when it is built.
    pub fn start(config: Config) -> anyhow::Result<Arc<Service>> {
        config.check()?;
        let metrics = Metrics::default();
        let admission = Arc::new(Admission::new(&config, config.memory_budget()?, &metrics));
        let store = Store::open(config.data_dir.as_deref());
        let db_path = config
            .db
            .clone()
            .unwrap_or_else(|| store.data_dir().join("corral.db"));
        let db = Db::open(&db_path)?;
        let orphans = db.end_orphaned_sessions()?;
        if !orphans.is_empty() {
            eprintln!(
                "corral: {} session(s) of a previous server process were marked dead",
                orphans.len()
            );
        }
        // Cgroups of sandboxes whose owner was killed (their processes died with their
        // control pipes); removed now, before any sandbox of this process exists.
        corral_sandbox::sweep_stale_cgroups_once();
        let policy = Policy {
            strict: config.strict,
            allow_degraded: config.allow_degraded,
        };
        // The limits a request leaves out: the server's `default_limits`, checked once here.
        let default_limits = config
            .default_limits
            .to_limits(&Limits::default())
            .map_err(|e| anyhow::anyhow!("default_limits: {e}"))?;
        let manager = SessionManager::new();
        let pool = match store.resolve(&config.default_image) {
            Ok(image) if config.pool_size > 0 && image.languages.iter().any(|l| l == "python") => {
                match Pool::start(
                    image.rootfs,
                    image.env,
                    policy,
                    default_limits,
                    config.pool_size,
                ) {
                    Ok(pool) => {
                        manager.add_pool(pool.clone());
                        Some(pool)
                    }
                    Err(e) => {
                        eprintln!("corral: no warm pool for `{}`: {e}", config.default_image);
                        None
                    }
                }
            }
            Ok(_) => None,
            Err(e) => {
                eprintln!(
                    "corral: warning: {e}: requests for it fail until it is built \
                     (`corral image build {}`)",
                    config.default_image
                );
                None
            }
        };
        let result_budget = ResultBudget::new(
            config.max_result_bytes_in_flight,
            format!(
                "the server's budget of {} for rich results held at once \
                 (max_result_bytes_in_flight)",
                show_bytes(config.max_result_bytes_in_flight as u64)
            ),
        );
        let service = Arc::new(Service {
            config,
            store,
            manager,
            pool,
            db,
            metrics,
            sessions: Mutex::new(HashMap::new()),
            reserved: Mutex::new(HashMap::new()),
            admission,
            shutting_down: AtomicBool::new(false),
            bytecode: Mutex::new(HashMap::new()),
            resolved: Mutex::new(HashMap::new()),
            result_budget,
            result_shares: Mutex::new(HashMap::new()),
            default_limits,
        });
        let weak = Arc::downgrade(&service);
        std::thread::Builder::new()
            .name("corral-reconcile".into())
            .spawn(move || reconcile(weak))?;
        Ok(service)
    }

    /// The limits a request leaves out: the config's `default_limits` over the engine's.
    pub fn default_limits(&self) -> &Limits {
        &self.default_limits
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    pub fn pool_ready(&self) -> usize {
        self.pool.as_ref().map_or(0, |p| p.ready_count())
    }

    /// The warm pool's image and the state of its zygotes (the full one, then the lean one),
    /// when there is a pool.
    pub fn zygote_status(&self) -> Option<(&str, [(ZygoteKind, ZygoteStatus); 2])> {
        self.pool.as_ref().map(|p| {
            (
                self.config.default_image.as_str(),
                ZygoteKind::ALL.map(|kind| (kind, p.zygote_status(kind))),
            )
        })
    }

    /// Bytes of rich results the server holds now, against `max_result_bytes_in_flight`.
    pub fn result_bytes_held(&self) -> usize {
        self.result_budget.used()
    }

    /// `tenant`'s share of the budget of rich results held at once.
    fn result_share(&self, tenant: &Tenant) -> Arc<ResultBudget> {
        self.result_shares
            .lock()
            .expect("lock")
            .entry(tenant.0.clone())
            .or_insert_with(|| {
                let limit = self.config.result_bytes_per_key();
                self.result_budget.share(
                    limit,
                    format!(
                        "this key's share of {} of the server's budget for rich results held \
                         at once (max_result_bytes_in_flight_per_key)",
                        show_bytes(limit as u64)
                    ),
                )
            })
            .clone()
    }

    pub fn sessions_live(&self) -> usize {
        self.sessions.lock().expect("lock").len()
    }

    /// Gives back what a session that left `sessions` was promised.
    fn released(&self, owned: Option<Owned>) {
        if let Some(owned) = owned {
            self.admission.release(owned.promised_bytes);
        }
    }

    /// A dead session's kernel, and with it its memory and `/tmp`, is gone; only its
    /// workspace stays promised until the session is closed.
    fn release_dead(&self, id: &str) {
        let freed = {
            let mut sessions = self.sessions.lock().expect("lock");
            match sessions.get_mut(id) {
                Some(o) if o.promised_bytes > o.workspace_bytes => {
                    let freed = o.promised_bytes - o.workspace_bytes;
                    o.promised_bytes = o.workspace_bytes;
                    freed
                }
                _ => 0,
            }
        };
        self.admission.release(freed);
    }

    fn policy(&self) -> Policy {
        Policy {
            strict: self.config.strict,
            allow_degraded: self.config.allow_degraded,
        }
    }

    fn check_running(&self) -> Result<(), ServiceError> {
        if self.shutting_down.load(Ordering::Relaxed) {
            return Err(ServiceError::ShuttingDown);
        }
        Ok(())
    }

    /// The image `name` (the default image without one), as the store resolved it at most
    /// [`RESOLVED_FOR`] ago: resolving reads the image's manifest and checks its path, which
    /// costs a run more than a tenth of a millisecond.
    fn image(&self, name: Option<&str>) -> Result<Arc<ResolvedImage>, ServiceError> {
        let name = name.unwrap_or(&self.config.default_image);
        if let Some((at, image)) = self.resolved.lock().expect("lock").get(name) {
            if at.elapsed() < RESOLVED_FOR {
                return Ok(image.clone());
            }
        }
        let image = Arc::new(self.resolve(name)?);
        self.resolved
            .lock()
            .expect("lock")
            .insert(name.to_string(), (Instant::now(), image.clone()));
        Ok(image)
    }

    fn resolve(&self, name: &str) -> Result<ResolvedImage, ServiceError> {
        self.store.resolve(name).map_err(|e| match e {
            ImageError::NotBuilt { builtin: true, .. } => ServiceError::UnknownImage(format!(
                "image `{name}` is not built yet: run `corral image build {name}` on the server"
            )),
            ImageError::NotBuilt { .. } => ServiceError::UnknownImage(format!(
                "no image named `{name}` (`corral image ls` on the server lists them)"
            )),
            other => ServiceError::UnknownImage(other.to_string()),
        })
    }

    fn check_language(image: &ResolvedImage, language: Language) -> Result<(), ServiceError> {
        if image.languages.iter().any(|l| l == language.name()) {
            Ok(())
        } else {
            Err(ServiceError::UnsupportedLanguage(format!(
                "image `{}` has no {} interpreter (it has: {})",
                image.name,
                language.name(),
                image.languages.join(", ")
            )))
        }
    }

    /// The session `id` if `tenant` owns it; another tenant's session is "not found" too.
    fn owned(&self, tenant: &Tenant, id: &str) -> Result<Owned, ServiceError> {
        self.sessions
            .lock()
            .expect("lock")
            .get(id)
            .filter(|o| &o.tenant == tenant)
            .cloned()
            .ok_or_else(|| ServiceError::NotFound(format!("no sandbox {id}")))
    }

    fn manager_error(&self, id: &str, e: ManagerError) -> ServiceError {
        match e {
            ManagerError::NotFound(_) => ServiceError::NotFound(format!("no sandbox {id}")),
            ManagerError::Kernel(e @ KernelError::ZygoteUnavailable { retry_after, .. }) => {
                ServiceError::Unavailable {
                    reason: Unavailability::ZygoteRestarting,
                    message: e.to_string(),
                    retry_after_s: retry_after.as_secs().max(1),
                }
            }
            other => {
                self.metrics.sandbox_failures.inc();
                ServiceError::Sandbox(other.to_string())
            }
        }
    }

    fn reserve_slot(&self, tenant: &Tenant) -> Result<(), ServiceError> {
        let sessions = self.sessions.lock().expect("lock");
        let mut reserved = self.reserved.lock().expect("lock");
        let total = sessions.len() + reserved.values().sum::<usize>();
        let mine = sessions.values().filter(|o| &o.tenant == tenant).count()
            + reserved.get(&tenant.0).copied().unwrap_or(0);
        if total >= self.config.max_sessions {
            return Err(ServiceError::TooManySandboxes {
                message: format!(
                    "the server runs its maximum of {} sandboxes: delete one or retry later",
                    self.config.max_sessions
                ),
                retry_after_s: 5,
            });
        }
        if mine >= self.config.max_sessions_per_key {
            return Err(ServiceError::TooManySandboxes {
                message: format!(
                    "this key has its maximum of {} sandboxes: delete one or retry later",
                    self.config.max_sessions_per_key
                ),
                retry_after_s: 5,
            });
        }
        *reserved.entry(tenant.0.clone()).or_default() += 1;
        Ok(())
    }

    fn release_slot(&self, tenant: &Tenant) {
        let mut reserved = self.reserved.lock().expect("lock");
        if let Some(n) = reserved.get_mut(&tenant.0) {
            *n -= 1;
            if *n == 0 {
                reserved.remove(&tenant.0);
            }
        }
    }

    pub fn create_session(
        &self,
        tenant: &Tenant,
        req: &CreateSandboxRequest,
    ) -> Result<SandboxInfo, ServiceError> {
        self.check_running()?;
        let language = parse_language(req.language.as_deref())?;
        let image = self.image(req.image.as_deref())?;
        Self::check_language(&image, language)?;
        let limits = req
            .limits
            .clone()
            .unwrap_or_default()
            .to_limits(&self.default_limits)?;
        let env = check_env(req.env.as_ref())?;
        let idle = req
            .idle_timeout_s
            .unwrap_or(self.config.default_idle_timeout_s);
        if idle == 0 || idle > self.config.max_idle_timeout_s {
            return Err(ServiceError::BadRequest(format!(
                "idle_timeout_s must be between 1 and {}",
                self.config.max_idle_timeout_s
            )));
        }
        self.reserve_slot(tenant)?;
        let promised = limits.host_memory_bytes();
        if let Err(e) = self.admission.commit(promised) {
            self.release_slot(tenant);
            return Err(e);
        }
        let started = Instant::now();
        let mut options = session_options(&image, language, limits, env, self.policy());
        options.result_budget = Some(self.result_share(tenant));
        let created = self.manager.create(&options, Duration::from_secs(idle));
        self.metrics
            .session_create_seconds
            .observe(started.elapsed().as_secs_f64());
        let info = match created {
            Ok(info) => info,
            Err(e) => {
                self.admission.release(promised);
                self.release_slot(tenant);
                return Err(self.manager_error("(new)", e));
            }
        };
        let owned = Owned {
            tenant: tenant.clone(),
            image: image.name.clone(),
            default_timeout: limits.timeout,
            promised_bytes: promised,
            workspace_bytes: limits.disk_bytes,
        };
        self.sessions
            .lock()
            .expect("lock")
            .insert(info.id.clone(), owned.clone());
        self.release_slot(tenant);
        if let Err(e) = self
            .db
            .session_started(&info.id, &tenant.0, &image.name, language.name())
        {
            eprintln!("corral: {e}");
        }
        Ok(Self::info(&info, &owned))
    }

    fn info(info: &corral_kernel::SessionInfo, owned: &Owned) -> SandboxInfo {
        SandboxInfo {
            id: info.id.clone(),
            image: owned.image.clone(),
            language: info.language.to_string(),
            created_at: rfc3339(info.created_at),
            expires_at: rfc3339(info.last_used + info.idle_timeout),
            last_used_at: rfc3339(info.last_used),
            state: if info.death.is_some() {
                "dead".into()
            } else {
                "running".into()
            },
            executions: info.executions,
            death: info.death.clone(),
            warnings: info.warnings.clone(),
        }
    }

    pub fn get(&self, tenant: &Tenant, id: &str) -> Result<SandboxInfo, ServiceError> {
        let owned = self.owned(tenant, id)?;
        let info = self
            .manager
            .get(id)
            .map_err(|e| self.manager_error(id, e))?;
        Ok(Self::info(&info, &owned))
    }

    pub fn list(&self, tenant: &Tenant) -> Vec<SandboxInfo> {
        let owned: HashMap<String, Owned> = self
            .sessions
            .lock()
            .expect("lock")
            .iter()
            .filter(|(_, o)| &o.tenant == tenant)
            .map(|(id, o)| (id.clone(), o.clone()))
            .collect();
        self.manager
            .list()
            .iter()
            .filter_map(|info| owned.get(&info.id).map(|o| Self::info(info, o)))
            .collect()
    }

    /// Closes session `id`: its sandbox is torn down and nothing of it remains.
    pub fn kill(&self, tenant: &Tenant, id: &str) -> Result<(), ServiceError> {
        self.owned(tenant, id)?;
        let owned = self.sessions.lock().expect("lock").remove(id);
        let closed = self.manager.close(id);
        // Given back once the sandbox is torn down, not before.
        self.released(owned);
        let _ = self.db.session_ended(id, "deleted");
        closed.map_err(|e| self.manager_error(id, e))
    }

    /// Sets session `id`'s idle timeout (the session then expires that long after its last use).
    pub fn set_idle_timeout(
        &self,
        tenant: &Tenant,
        id: &str,
        seconds: u64,
    ) -> Result<SandboxInfo, ServiceError> {
        if seconds == 0 || seconds > self.config.max_idle_timeout_s {
            return Err(ServiceError::BadRequest(format!(
                "the idle timeout must be between 1 and {} seconds",
                self.config.max_idle_timeout_s
            )));
        }
        self.owned(tenant, id)?;
        self.manager
            .set_idle_timeout(id, Duration::from_secs(seconds))
            .map_err(|e| self.manager_error(id, e))?;
        self.get(tenant, id)
    }

    /// Interrupts the running execution of session `id`, if any.
    pub fn interrupt(&self, tenant: &Tenant, id: &str) -> Result<(), ServiceError> {
        self.owned(tenant, id)?;
        self.manager
            .interrupt(id)
            .map_err(|e| self.manager_error(id, e))
    }

    /// Checks that `id` is `tenant`'s live session, before a stream is opened for it.
    pub fn check_session(&self, tenant: &Tenant, id: &str) -> Result<(), ServiceError> {
        self.owned(tenant, id)?;
        let info = self
            .manager
            .get(id)
            .map_err(|e| self.manager_error(id, e))?;
        match info.death {
            Some(why) => Err(ServiceError::SandboxDead(format!(
                "sandbox {id} is dead ({why}): delete it and create another"
            ))),
            None => Ok(()),
        }
    }

    fn audit(
        &self,
        tenant: &Tenant,
        session: Option<&str>,
        kind: &str,
        code: &str,
        r: &ExecutionResult,
    ) {
        let status = serde_json::to_value(r.status)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        self.metrics
            .record_execution(kind, &status, r.execution_time_ms);
        if r.status == Status::SandboxError {
            self.metrics.sandbox_failures.inc();
        }
        let entry = AuditEntry {
            key_id: &tenant.0,
            session_id: session,
            kind,
            code,
            status: &status,
            execution_time_ms: r.execution_time_ms,
            cpu_time_ms: r.cpu_time_ms,
            peak_memory_bytes: r.peak_memory_bytes,
        };
        if let Err(e) = self.db.audit(&entry) {
            eprintln!("corral: audit log: {e}");
        }
    }

    /// Checks everything about an execution request that can be the caller's fault (so that
    /// it is answered with an error status before any stream starts); returns its timeout.
    pub fn prepare_execute(
        &self,
        tenant: &Tenant,
        id: &str,
        req: &ExecuteRequest,
    ) -> Result<Duration, ServiceError> {
        self.check_running()?;
        let owned = self.owned(tenant, id)?;
        let info = self
            .manager
            .get(id)
            .map_err(|e| self.manager_error(id, e))?;
        if let Some(lang) = &req.language {
            if Language::parse(lang).map(Language::name) != Some(info.language) {
                return Err(ServiceError::UnsupportedLanguage(format!(
                    "sandbox {id} runs {}, not {lang}",
                    info.language
                )));
            }
        }
        self.check_session(tenant, id)?;
        timeout_from(req.timeout_s, owned.default_timeout)
    }

    /// Runs `req.code` in session `id`, streaming events to `on_event` (`End` included).
    pub fn execute(
        &self,
        tenant: &Tenant,
        id: &str,
        req: &ExecuteRequest,
        on_event: &mut dyn FnMut(&Event),
    ) -> Result<ExecutionResult, ServiceError> {
        let timeout = self.prepare_execute(tenant, id, req)?;
        let result = self
            .manager
            .execute(id, &req.code, timeout, on_event)
            .map_err(|e| self.manager_error(id, e))?;
        self.audit(tenant, Some(id), "execute", &req.code, &result);
        if let Some(why) = self.manager.get(id).ok().and_then(|i| i.death) {
            self.release_dead(id);
            let _ = self.db.session_ended(id, &format!("died: {why}"));
        }
        Ok(result)
    }

    /// Checks a command request as [`Service::prepare_execute`] does an execution.
    pub fn prepare_command(
        &self,
        tenant: &Tenant,
        id: &str,
        req: &CommandRequest,
    ) -> Result<PreparedCommand, ServiceError> {
        self.check_running()?;
        let owned = self.owned(tenant, id)?;
        self.check_session(tenant, id)?;
        if req.cmd.is_empty() {
            return Err(ServiceError::BadRequest("cmd must not be empty".into()));
        }
        let argv: Vec<String> = match &req.args {
            Some(args) => std::iter::once(req.cmd.clone())
                .chain(args.iter().cloned())
                .collect(),
            None => vec!["/bin/bash".into(), "-c".into(), req.cmd.clone()],
        };
        if argv.iter().any(|a| a.contains('\0')) {
            return Err(ServiceError::BadRequest(
                "cmd and args must not contain NUL bytes".into(),
            ));
        }
        if let Some(cwd) = &req.cwd {
            if !cwd.starts_with('/') || cwd.contains('\0') {
                return Err(ServiceError::BadRequest(
                    "cwd must be an absolute path inside the sandbox".into(),
                ));
            }
        }
        Ok(PreparedCommand {
            argv,
            env: check_env(req.env.as_ref())?,
            timeout: timeout_from(req.timeout_s, owned.default_timeout)?,
        })
    }

    /// Runs a command inside session `id`'s sandbox; the result's `exit_code` is the command's.
    /// `stop` stops it (and only it), whether it waits for the session or runs.
    pub fn run_command(
        &self,
        tenant: &Tenant,
        id: &str,
        req: &CommandRequest,
        stop: &Stopper,
        on_event: &mut dyn FnMut(&Event),
    ) -> Result<ExecutionResult, ServiceError> {
        let p = self.prepare_command(tenant, id, req)?;
        let result = self
            .manager
            .run_command(
                id,
                &p.argv,
                req.cwd.as_deref(),
                &p.env,
                p.timeout,
                stop,
                on_event,
            )
            .map_err(|e| self.manager_error(id, e))?;
        self.audit(tenant, Some(id), "command", &p.argv.join(" "), &result);
        Ok(result)
    }

    fn with_workspace<T>(
        &self,
        tenant: &Tenant,
        id: &str,
        f: impl FnOnce(&corral_sandbox::Workspace) -> Result<T, WorkspaceError>,
    ) -> Result<T, ServiceError> {
        self.owned(tenant, id)?;
        let workspace = self
            .manager
            .workspace(id)
            .map_err(|e| self.manager_error(id, e))?;
        f(&workspace).map_err(ServiceError::from)
    }

    /// Checks an upload of a file to `path` in session `id` before its body is read: the
    /// session is `tenant`'s, the path stays inside the workspace, and `announced` bytes (the
    /// body's length, when it is known) fit the bound of one upload: the workspace's size (the
    /// sandbox's disk limit) and `max_body_bytes`.
    pub fn prepare_upload(
        &self,
        tenant: &Tenant,
        id: &str,
        path: &str,
        announced: Option<u64>,
    ) -> Result<Upload, ServiceError> {
        corral_sandbox::workspace::checked_components(Path::new(path))?;
        let workspace = self.with_workspace(tenant, id, |ws| Ok(ws.clone()))?;
        let capacity = workspace.capacity()?;
        let limit = capacity.min(self.config.max_body_bytes as u64);
        let upload = Upload {
            workspace,
            path: path.trim_start_matches("./").to_string(),
            limit,
            capacity,
            max_body_bytes: self.config.max_body_bytes as u64,
        };
        match announced {
            Some(n) if n > limit => Err(upload.too_large(Some(n))),
            _ => Ok(upload),
        }
    }

    /// Writes `data` to `path` in session `id` (an upload whose data is at hand).
    pub fn write_file(
        &self,
        tenant: &Tenant,
        id: &str,
        path: &str,
        data: &[u8],
    ) -> Result<FileEntry, ServiceError> {
        self.prepare_upload(tenant, id, path, Some(data.len() as u64))?
            .write(&mut &data[..])
    }

    /// Opens a workspace file for reading (regular files only, never through a link).
    pub fn open_file(
        &self,
        tenant: &Tenant,
        id: &str,
        path: &str,
    ) -> Result<std::fs::File, ServiceError> {
        self.with_workspace(tenant, id, |ws| ws.open_file(Path::new(path)))
    }

    pub fn remove_file(&self, tenant: &Tenant, id: &str, path: &str) -> Result<(), ServiceError> {
        self.with_workspace(tenant, id, |ws| ws.remove_file(Path::new(path)))
    }

    pub fn list_files(
        &self,
        tenant: &Tenant,
        id: &str,
        dir: Option<&str>,
    ) -> Result<Vec<FileEntry>, ServiceError> {
        let dir = dir.filter(|d| !d.is_empty() && *d != "." && *d != "/");
        self.with_workspace(tenant, id, |ws| ws.list_below(dir.map(Path::new)))
    }

    /// A slot for one upload streaming its body (at most `max_uploads_in_flight` at once),
    /// waited for at most `admission_wait_s`, then refused (503 with `Retry-After`).
    pub async fn admit_upload(&self) -> Result<crate::admission::UploadPermit, ServiceError> {
        self.check_running()?;
        self.admission.admit_upload().await
    }

    /// Admits a one-shot run of `tenant`: a slot (at most `max_runs`, `max_runs_per_key` of
    /// them for one key) and the host memory its limits promise, waited for at most
    /// `admission_wait_s`, then refused (429, or 503 when memory is short; both with
    /// `Retry-After`). Its limits are checked first. Hand the permit to [`Service::run`].
    pub async fn admit_run(
        &self,
        tenant: &Tenant,
        req: &RunRequest,
    ) -> Result<RunPermit, ServiceError> {
        self.check_running()?;
        let limits = req
            .limits
            .clone()
            .unwrap_or_default()
            .to_limits(&self.default_limits)?;
        self.admission
            .admit_run(&tenant.0, limits.host_memory_bytes())
            .await
    }

    /// Runs `req` in a fresh sandbox, holding `permit` (from [`Service::admit_run`]) until the
    /// sandbox is gone. Problems with the request are errors; whatever the program does
    /// (including failing to start) is in the result.
    pub fn run(
        &self,
        tenant: &Tenant,
        req: &RunRequest,
        permit: RunPermit,
        on_output: &mut dyn FnMut(corral_sandbox::Stream, &[u8]),
    ) -> Result<ExecutionResult, ServiceError> {
        self.check_running()?;
        let language = parse_language(req.language.as_deref())?;
        let image = self.image(req.image.as_deref())?;
        Self::check_language(&image, language)?;
        let mut spec = SandboxSpec::new(Vec::new());
        spec.limits = req
            .limits
            .clone()
            .unwrap_or_default()
            .to_limits(&self.default_limits)?;
        spec.env = image.env.clone();
        spec.env.extend(check_env(req.env.as_ref())?);
        spec.policy = self.policy();
        for f in req.files.iter().flatten() {
            spec.input_files.push(input_file(f)?);
        }
        spec.rootfs = image.rootfs.clone();
        let file_name = match language {
            Language::Python => "main.py",
            Language::Javascript => "main.js",
            Language::Bash => "main.sh",
        };
        // Python on the warm pool's image: a sandbox forked from one of its zygotes, where it
        // can run the program exactly as a fresh interpreter would (else, or when the fork
        // fails, a fresh interpreter).
        let forked = self
            .pool
            .as_ref()
            .filter(|_| language == Language::Python)
            .and_then(|pool| {
                oneshot::run_forked(
                    pool,
                    &spec,
                    file_name,
                    req.code.as_bytes(),
                    Some(self.result_share(tenant)),
                    on_output,
                )
            });
        let result = match forked {
            Some((result, zygote)) => {
                self.metrics.record_forked_run(zygote);
                result
            }
            None => {
                let bytecode = (language == Language::Python).then(|| self.bytecode_cache(&image));
                let (mut result, workspace) = oneshot::run(
                    spec,
                    language,
                    file_name,
                    req.code.clone().into_bytes(),
                    bytecode.as_deref(),
                    Some(self.result_share(tenant)),
                    on_output,
                );
                if let Some(ws) = workspace {
                    match ws.list() {
                        Ok(files) => result.files = files,
                        Err(e) => result.warnings.push(format!("listing the workspace: {e}")),
                    }
                }
                result
            }
        };
        // The sandbox and its workspace are gone: its slot and memory are free.
        drop(permit);
        self.audit(tenant, None, "run", &req.code, &result);
        Ok(result)
    }

    fn bytecode_cache(&self, image: &ResolvedImage) -> Arc<BytecodeCache> {
        self.bytecode
            .lock()
            .expect("lock")
            .entry(image.name.clone())
            .or_insert_with(|| Arc::new(BytecodeCache::new(self.store.data_dir(), &image.rootfs)))
            .clone()
    }

    /// Refuses new work from now on.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Relaxed);
    }

    /// Interrupts every running execution (the end of the shutdown grace period).
    pub fn interrupt_all(&self) {
        for info in self.manager.list() {
            let _ = self.manager.interrupt(&info.id);
        }
    }

    /// Tears every session down; nothing of them remains.
    pub fn close_all(&self) {
        let sessions: Vec<(String, Owned)> = self.sessions.lock().expect("lock").drain().collect();
        for (id, owned) in sessions {
            let _ = self.manager.close(&id);
            self.released(Some(owned));
            let _ = self.db.session_ended(&id, "server shut down");
        }
        self.manager.shutdown();
    }
}

/// An upload checked by [`Service::prepare_upload`], ready for its data. It holds the
/// session's workspace (not the session), so that it neither waits for nor holds up the
/// session's executions; closing the session meanwhile kills its writer.
pub struct Upload {
    workspace: corral_sandbox::Workspace,
    path: String,
    /// The most bytes it may hold.
    limit: u64,
    /// The workspace's size.
    capacity: u64,
    /// The server's `max_body_bytes`.
    max_body_bytes: u64,
}

impl Upload {
    /// The refusal of an upload of `bytes` (`None`: more than the bound, as it was sent).
    fn too_large(&self, bytes: Option<u64>) -> ServiceError {
        let size = match bytes {
            Some(n) => show_bytes(n),
            None => format!("more than {}", show_bytes(self.limit)),
        };
        ServiceError::PayloadTooLarge(format!(
            "the upload ({size}) is larger than any file this sandbox can take: its workspace \
             holds {} in all (its disk limit), and the server takes at most {} in one upload \
             (max_body_bytes)",
            show_bytes(self.capacity),
            show_bytes(self.max_body_bytes)
        ))
    }

    /// Writes the file from `data`, which is read to its end, and at most to the upload's
    /// bound (more is refused with 413). A failed upload leaves nothing behind.
    pub fn write(self, data: &mut dyn Read) -> Result<FileEntry, ServiceError> {
        let mut bounded = Bounded {
            inner: data,
            left: self.limit,
            over: false,
        };
        match self
            .workspace
            .write_file(Path::new(&self.path), &mut bounded)
        {
            Ok(size) => Ok(FileEntry {
                path: self.path,
                size,
            }),
            Err(WorkspaceError::Source { .. }) if bounded.over => Err(self.too_large(None)),
            Err(e) => Err(e.into()),
        }
    }
}

/// A reader that fails once its source holds more than `left` bytes.
struct Bounded<'a> {
    inner: &'a mut dyn Read,
    left: u64,
    over: bool,
}

impl Read for Bounded<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => {
                    self.over = true;
                    Err(std::io::Error::other("the upload is over its bound"))
                }
            };
        }
        let room = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..room])?;
        self.left -= n as u64;
        Ok(n)
    }
}

/// A one-shot input file, staged in an unlinked temporary file.
fn input_file(f: &InputFileRequest) -> Result<InputFile, ServiceError> {
    use base64::Engine as _;
    let dest = std::path::PathBuf::from(&f.path);
    corral_sandbox::workspace::checked_components(&dest)
        .map_err(|e| ServiceError::InvalidPath(format!("files: {e}")))?;
    let bytes = match (&f.content, &f.content_base64) {
        (Some(text), None) => text.clone().into_bytes(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| {
                ServiceError::BadRequest(format!("files: {}: content_base64: {e}", f.path))
            })?,
        _ => {
            return Err(ServiceError::BadRequest(format!(
                "files: {}: give exactly one of content and content_base64",
                f.path
            )))
        }
    };
    let staged = tempfile::tempfile().and_then(|mut t| {
        t.write_all(&bytes)?;
        t.rewind()?;
        Ok(t)
    });
    let source =
        staged.map_err(|e| ServiceError::Sandbox(format!("staging an input file: {e}")))?;
    Ok(InputFile { source, dest })
}

/// Forgets sessions the manager closed on its own (idle expiry) and records their end.
fn reconcile(service: Weak<Service>) {
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let Some(service) = service.upgrade() else {
            return;
        };
        let gone: Vec<(String, Owned)> = {
            let mut sessions = service.sessions.lock().expect("lock");
            // Asked under the lock, not from an earlier listing, so that a session created
            // meanwhile is never taken for a gone one.
            let gone: Vec<String> = sessions
                .keys()
                .filter(|id| service.manager.get(id).is_err())
                .cloned()
                .collect();
            gone.into_iter()
                .filter_map(|id| sessions.remove(&id).map(|o| (id, o)))
                .collect()
        };
        for (id, owned) in gone {
            service.released(Some(owned));
            let _ = service
                .db
                .session_ended(&id, "expired: idle past its timeout");
        }
        for info in service.manager.list() {
            if info.death.is_some() {
                service.release_dead(&info.id);
            }
        }
    }
}
