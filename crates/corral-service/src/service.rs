//! What the server does, without HTTP: one-shot runs, sessions owned by tenants, files and
//! commands in sessions, the audit log. Synchronous (the engine is); the HTTP layer and the
//! in-process MCP server call it from blocking threads.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Seek, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime};

use corral_egress::{Decision, EgressObserver, EgressPools};
use corral_image::{ImageError, ResolvedImage, Store};
use corral_kernel::bytecode::BytecodeCache;
use corral_kernel::oneshot;
use corral_kernel::{
    CodePolicy, Event, KernelError, Language, ManagerError, PolicyError, Pool, SessionManager,
    SessionOptions, Stopper, ZygoteKind, ZygoteStatus,
};
use corral_sandbox::limits::show_bytes;
use corral_sandbox::limits::timeout_from_secs;
use corral_sandbox::workspace::EntryInfo;
use corral_sandbox::{
    Egress, ExecutionResult, FileEntry, InputFile, LimitError, LimitField, Limits, NetworkReport,
    Policy, ResultBudget, SandboxSpec, Status, WorkspaceError,
};
use serde::{Deserialize, Serialize};

use crate::admission::{Admission, RunPermit};
use crate::config::Config;
use crate::db::{AuditEntry, Db, EgressEntry};
use crate::metrics::{DirectionLabels, EgressLabels, Metrics};
use crate::network::NetworkBounds;
use crate::threads::{ThreadPermit, Threads};

mod contexts;
mod listing;
mod processes;

pub use listing::OwnedPage;

/// The tenant a request acts for: an API key's id, or `local` for keyless loopback use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub String);

impl Tenant {
    pub fn local() -> Tenant {
        Tenant("local".into())
    }
}

/// A call of a tenant, admitted by [`Service::admit`]: the tenant's work methods take it, and
/// it holds the call's blocking thread of the key's budget until it is dropped (when the work
/// is done, however it ended).
pub struct Admitted {
    tenant: Tenant,
    thread: ThreadPermit,
}

impl Admitted {
    /// The tenant the call acts for.
    pub fn tenant(&self) -> &Tenant {
        &self.tenant
    }

    /// What makes, later, a call of the same tenant on a thread of no key's budget: for the
    /// stop of the stream this call runs (one per admitted stream, so bounded by the
    /// budgets). It is no admission.
    pub fn unmetered_later(&self) -> impl FnOnce() -> Admitted + Send + 'static {
        let tenant = self.tenant.clone();
        let thread = self.thread.unmetered_later();
        move || Admitted {
            tenant,
            thread: thread(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("{0}")]
    BadRequest(String),
    /// Asked for more than the key may have (a request that would widen its code policy).
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    InvalidPath(String),
    /// No such sandbox (or another tenant's).
    #[error("{0}")]
    NotFound(String),
    /// No such file or directory in a sandbox's workspace: the sandbox itself is there.
    #[error("{0}")]
    FileNotFound(String),
    /// The destination of a move exists (a move never replaces anything).
    #[error("{0}")]
    FileExists(String),
    #[error("{0}")]
    SandboxDead(String),
    #[error("{0}")]
    UnknownImage(String),
    #[error("{0}")]
    UnsupportedLanguage(String),
    #[error("{message}")]
    TooManySandboxes { message: String, retry_after_s: u64 },
    /// The key holds its most blocking threads already (`max_blocking_calls_per_key`).
    #[error("{message}")]
    KeyBusy { message: String, retry_after_s: u64 },
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
    /// A network policy outside what the server's operator allows (403).
    #[error("{0}")]
    NetworkNotAllowed(String),
    /// The sandbox is not in a state that allows the call (each answered 409 with its own
    /// code).
    #[error("{message}")]
    Conflict { state: Conflict, message: String },
    /// A call to a program in a sandbox (or to its process agent) that failed.
    #[error(transparent)]
    Process(corral_kernel::agent::AgentError),
}

/// Why a call does not fit the sandbox's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conflict {
    /// It is paused: only info, resume, kill and the timeout work.
    Paused,
    /// A resume of a sandbox that is not paused.
    NotPaused,
    /// A pause while it executes or runs a command.
    Busy,
    /// A pause of a sandbox without a cgroup freezer (the rlimit fallback).
    PauseUnsupported,
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
    /// The sandbox is busy and the most calls that may wait for it wait already
    /// ([`corral_kernel::MAX_WAITING`]).
    SandboxBusy,
    /// Every blocking thread of the budget (`max_blocking_calls`) is taken.
    ServerBusy,
}

impl From<WorkspaceError> for ServiceError {
    fn from(e: WorkspaceError) -> Self {
        match e {
            WorkspaceError::OutsideWorkspace(_)
            | WorkspaceError::NotRegular(_)
            | WorkspaceError::NotADirectory(_)
            | WorkspaceError::Link(_) => ServiceError::InvalidPath(e.to_string()),
            WorkspaceError::Exists(_) => ServiceError::FileExists(e.to_string()),
            WorkspaceError::TooManyEntries { .. }
            | WorkspaceError::TooDeep { .. }
            | WorkspaceError::TooLarge { .. } => ServiceError::BadRequest(e.to_string()),
            WorkspaceError::Io { ref source, .. } => match source.raw_os_error() {
                Some(libc::ENOENT) => ServiceError::FileNotFound(e.to_string()),
                // A path leaving the workspace, or a file where a directory was expected.
                Some(libc::EXDEV | libc::ENOTDIR | libc::EISDIR | libc::EINVAL) => {
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
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    /// MiB the sandbox may move through its egress proxy, both ways together (with a
    /// `network` policy).
    pub net_mb: Option<u64>,
    /// Connections the sandbox's egress proxy accepts in all.
    pub net_connections: Option<u64>,
}

impl From<&Limits> for LimitsRequest {
    /// Every field set: the limits a session runs with, as requests give them.
    fn from(l: &Limits) -> Self {
        LimitsRequest {
            timeout_s: Some(l.timeout.as_secs_f64()),
            memory_mb: Some(l.memory_bytes >> 20),
            cpus: Some(l.cpus),
            pids: Some(l.pids),
            disk_mb: Some(l.disk_bytes >> 20),
            result_mb: Some((l.result_bytes >> 20) as u64),
            result_count: Some(l.result_count as u64),
            net_mb: Some(l.net_bytes >> 20),
            net_connections: Some(l.net_connections),
        }
    }
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
        if let Some(m) = self.net_mb {
            limits.net_bytes = m.saturating_mul(1 << 20);
        }
        if let Some(n) = self.net_connections {
            limits.net_connections = n;
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
        LimitField::NetBytes => "net_mb",
        LimitField::NetConnections => "net_connections",
    };
    ServiceError::BadRequest(e.naming(&format!("limits.{field}")))
}

/// What a sandbox may reach beyond its loopback (docs/network.md). Absent, or with nothing
/// in it: nothing. Every item must lie within the server's `[network]` settings.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NetworkRequest {
    /// Host names, `NAME[:PORT]` or `*.SUFFIX[:PORT]` (ports 80 and 443 when none is given).
    #[serde(default)]
    pub allow: Vec<String>,
    /// Address ranges, `CIDR[:PORT]` (`[IPv6-CIDR]:PORT`).
    #[serde(default)]
    pub cidrs: Vec<String>,
    /// The server's default policy (`[network] default`) instead of `allow` and `cidrs`.
    #[serde(default)]
    pub default: bool,
}

/// A code policy as requests and the server's settings give it (docs/code-policy.md): what
/// the code may import and how long it may be. Defence in depth, never a boundary. A
/// request's policy can only narrow its key's (403 otherwise); what it leaves out is the key's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PolicyRequest {
    /// The only modules the code may import (with their submodules); absent: any module. An
    /// empty list allows none.
    pub allowed_modules: Option<Vec<String>>,
    /// Modules the code may not import (with their submodules); they win over allowed ones.
    pub denied_modules: Option<Vec<String>>,
    /// The longest code, in bytes; longer code is refused before anything starts.
    pub max_code_bytes: Option<u64>,
}

impl PolicyRequest {
    /// The policy asked for, checked by the engine's one validator; an error is a bad request
    /// naming the field as `{prefix}.allowed_modules` and so on.
    pub fn to_policy(&self, prefix: &str) -> Result<CodePolicy, ServiceError> {
        CodePolicy::new(
            self.allowed_modules.clone(),
            self.denied_modules.clone().unwrap_or_default(),
            self.max_code_bytes,
        )
        .map_err(|e| policy_error(prefix, &e))
    }

    /// `policy` as the API shows it: every field filled.
    pub fn of(policy: &CodePolicy) -> PolicyRequest {
        PolicyRequest {
            allowed_modules: policy
                .allowed_modules()
                .map(|m| m.iter().cloned().collect()),
            denied_modules: Some(policy.denied_modules().iter().cloned().collect()),
            max_code_bytes: policy.max_code_bytes().map(|n| n as u64),
        }
    }
}

/// An engine policy error as a bad request naming the field under `prefix`.
fn policy_error(prefix: &str, e: &PolicyError) -> ServiceError {
    ServiceError::BadRequest(match e.field() {
        Some(field) => e.naming(&format!("{prefix}.{field}")),
        None => format!("{prefix}: {e}"),
    })
}

/// The code policies of the server's settings: `code_policy` for every key, and
/// `key_code_policy.NAME` instead of it for the keys named NAME.
#[derive(Debug, Clone, Default)]
struct CodePolicies {
    default: CodePolicy,
    by_key_name: HashMap<String, CodePolicy>,
}

impl CodePolicies {
    fn of(config: &Config) -> Result<CodePolicies, ServiceError> {
        let mut by_key_name = HashMap::new();
        for (name, policy) in &config.key_code_policy {
            by_key_name.insert(
                name.clone(),
                policy.to_policy(&format!("key_code_policy.{name}"))?,
            );
        }
        Ok(CodePolicies {
            default: config.code_policy.to_policy("code_policy")?,
            by_key_name,
        })
    }
}

/// A file for a one-shot run's workspace: text in `content`, or bytes in `content_base64`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct InputFileRequest {
    /// Relative to `/workspace`.
    pub path: String,
    pub content: Option<String>,
    pub content_base64: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    /// Narrows the key's code policy for this run (docs/code-policy.md).
    pub policy: Option<PolicyRequest>,
    pub network: Option<NetworkRequest>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxRequest {
    pub image: Option<String>,
    pub language: Option<String>,
    pub limits: Option<LimitsRequest>,
    pub env: Option<BTreeMap<String, String>>,
    /// The session is closed after this long without use (default 600).
    pub idle_timeout_s: Option<u64>,
    /// Narrows the key's code policy for every execution of the session (docs/code-policy.md).
    pub policy: Option<PolicyRequest>,
    /// Labels of the caller's own, returned with the session and usable to filter the list
    /// (at most [`METADATA_ENTRIES`] entries; keys of 1 to [`METADATA_KEY_BYTES`] bytes,
    /// values of at most [`METADATA_VALUE_BYTES`]).
    pub metadata: Option<BTreeMap<String, String>>,
    pub network: Option<NetworkRequest>,
}

/// Bounds of a session's `metadata` (docs/api.md).
pub const METADATA_ENTRIES: usize = 64;
pub const METADATA_KEY_BYTES: usize = 128;
pub const METADATA_VALUE_BYTES: usize = 1024;

/// Checks a session's `metadata` against its bounds.
fn check_metadata(
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<BTreeMap<String, String>, ServiceError> {
    let Some(metadata) = metadata else {
        return Ok(BTreeMap::new());
    };
    if metadata.len() > METADATA_ENTRIES {
        return Err(ServiceError::BadRequest(format!(
            "`metadata` has {} entries; at most {METADATA_ENTRIES} are allowed",
            metadata.len()
        )));
    }
    for (key, value) in metadata {
        if key.is_empty() || key.len() > METADATA_KEY_BYTES {
            return Err(ServiceError::BadRequest(format!(
                "`metadata` key {key:?}: keys have 1 to {METADATA_KEY_BYTES} bytes"
            )));
        }
        if value.len() > METADATA_VALUE_BYTES {
            return Err(ServiceError::BadRequest(format!(
                "`metadata.{key}`: values have at most {METADATA_VALUE_BYTES} bytes"
            )));
        }
    }
    Ok(metadata.clone())
}

/// Which sessions a listing returns, and how many (docs/api.md, "List").
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListQuery {
    /// Only sessions in one of these states (`running`, `paused`, `dead`); empty: all.
    pub states: Vec<String>,
    /// Only sessions whose metadata has every one of these entries.
    pub metadata: BTreeMap<String, String>,
    /// Only sessions of this image.
    pub image: Option<String>,
    /// At most this many (1 to [`LIST_LIMIT`]; default [`LIST_LIMIT`]).
    pub limit: Option<usize>,
    /// Only sessions after this cursor: the `next` of the previous page.
    pub after: Option<String>,
}

/// The most sessions one page of a listing holds.
pub const LIST_LIMIT: usize = 1000;

/// One page of a listing: the sessions in creation order, and the cursor of the next page
/// when there are more.
#[derive(Debug, Clone, PartialEq)]
pub struct ListPage {
    pub sandboxes: Vec<SandboxInfo>,
    pub next: Option<String>,
}

/// One reading of a session's usage, as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxMetric {
    /// RFC 3339, UTC.
    pub timestamp: String,
    /// The same, in seconds since the Unix epoch.
    pub timestamp_unix: u64,
    /// The session's CPU limit, rounded up to whole CPUs.
    pub cpu_count: u64,
    /// CPU used since the previous reading, in percent of `cpu_count` CPUs (0 for the first).
    pub cpu_used_pct: f64,
    pub memory_used_bytes: u64,
    /// Of `memory_used_bytes`, page cache.
    pub memory_cache_bytes: u64,
    pub memory_limit_bytes: u64,
    /// Bytes used in `/workspace`, and its size.
    pub disk_used_bytes: u64,
    pub disk_total_bytes: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ExecuteRequest {
    pub code: String,
    /// When given, it must be the session's language.
    pub language: Option<String>,
    /// Default: the session's `limits.timeout_s`.
    pub timeout_s: Option<f64>,
    /// Environment variables set for this execution only (Python and JavaScript sessions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    /// The code context to run in (`GET …/contexts`); without it, `language`'s default
    /// context (the session's own kernel for its language).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxInfo {
    pub id: String,
    pub image: String,
    pub language: String,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// When the session will be closed if it stays idle (moves with every use).
    pub expires_at: String,
    pub last_used_at: String,
    /// `running`, `paused` or `dead`.
    pub state: String,
    /// RFC 3339, UTC: since when the sandbox is paused (absent while it runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused_at: Option<String>,
    pub executions: u64,
    /// Why the kernel died, when it did.
    pub death: Option<String>,
    /// Protections weaker than requested for this session (also in every execution's result).
    pub warnings: Vec<String>,
    /// The code policy every execution is held to: the key's, narrowed by the request's.
    pub policy: PolicyRequest,
    /// The `metadata` it was created with.
    pub metadata: BTreeMap<String, String>,
    /// The limits it runs with (every field set).
    pub limits: LimitsRequest,
    /// What its egress proxy has done since the kernel started; `null` without a network
    /// policy.
    pub network: Option<NetworkReport>,
    /// `kept`, or `not kept` for a sandbox paused across a server restart: it is resumed on
    /// its saved files with a fresh kernel (crate::persist).
    pub memory: String,
}

/// A checked execution of a session, made by [`Service::prepare_execute`] for the call that
/// [`Service::execute`] then runs it for.
#[derive(Debug)]
pub struct PreparedExecution {
    id: String,
    req: ExecuteRequest,
    /// The request's `env`, checked.
    env: Vec<(String, String)>,
    timeout: Duration,
}

/// A checked command of a session, made by [`Service::prepare_command`] for the call that
/// [`Service::run_command`] then runs it for: what runs, where, with what, for how long.
#[derive(Debug, Clone)]
pub struct PreparedCommand {
    id: String,
    argv: Vec<String>,
    cwd: Option<String>,
    env: Vec<(String, String)>,
    timeout: Duration,
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
    /// Its code policy, as the API shows it.
    policy: PolicyRequest,
    limits: Limits,
    metadata: BTreeMap<String, String>,
    /// What it was created with, every field resolved: what a restart saves (crate::persist).
    request: CreateSandboxRequest,
    /// Resumed on files saved across a restart: its memory was not kept.
    restored: bool,
}

pub struct Service {
    config: Config,
    store: Store,
    manager: Arc<SessionManager>,
    pool: Option<Arc<Pool>>,
    db: Arc<Db>,
    pub metrics: Metrics,
    /// What each key's requests may ask for (`[network]`, `[key_network.NAME]`).
    networks: NetworkBounds,
    sessions: Mutex<HashMap<String, Owned>>,
    /// Session slots taken by creations in progress, per tenant.
    reserved: Mutex<HashMap<String, usize>>,
    /// The memory budget of live sandboxes and the one-shot run slots.
    admission: Arc<Admission>,
    /// The blocking threads engine calls take, shared fairly between keys.
    threads: Arc<Threads>,
    /// The bytes of programs' output held for clients (`max_output_bytes`), shared fairly
    /// between keys.
    output: Arc<corral_share::Pool>,
    /// The turns of directory watchers' scans, shared fairly between keys.
    watch_scans: crate::watch::Scans,
    shutting_down: AtomicBool,
    bytecode: Mutex<HashMap<String, Arc<BytecodeCache>>>,
    /// Images resolved by name, each reused for [`RESOLVED_FOR`].
    resolved: Mutex<HashMap<String, (Instant, Arc<ResolvedImage>)>>,
    /// The rich results held at once (`max_result_bytes_in_flight`), and each key's share.
    /// Bytes of rich results held at once, shared by keys.
    result_bytes: Arc<corral_share::Pool>,
    /// The limits a request leaves out (`default_limits` in the config).
    default_limits: Limits,
    /// The code policies of keys, which requests narrow (`code_policy`, `key_code_policy`).
    code_policies: CodePolicies,
    /// Paused sandboxes saved across a restart.
    saved: crate::persist::Saved,
}

/// Hears a sandbox's egress decisions: each is a line of the audit log (`egress` table) and
/// a count in `corral_egress_decisions_total`; the bytes go to `corral_egress_bytes_total`.
struct EgressAudit {
    db: Arc<Db>,
    decisions: prometheus_client::metrics::family::Family<
        EgressLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    bytes: prometheus_client::metrics::family::Family<
        DirectionLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    tenant: String,
    /// The session's id, once it has one (none for a one-shot run).
    session: std::sync::OnceLock<String>,
}

impl std::fmt::Debug for EgressAudit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressAudit")
            .field("tenant", &self.tenant)
            .field("session", &self.session.get())
            .finish()
    }
}

impl EgressObserver for EgressAudit {
    fn decision(&self, d: &Decision) {
        let reason = d.verdict.reason().map_or("", |r| r.name());
        self.decisions
            .get_or_create(&EgressLabels {
                decision: d.verdict.name().into(),
                reason: reason.into(),
            })
            .inc();
        let entry = EgressEntry {
            key_id: &self.tenant,
            session_id: self.session.get().map(String::as_str),
            host: &d.host,
            port: d.port,
            decision: d.verdict.name(),
            reason,
            address: d.address.map(|a| a.to_string()),
        };
        if let Err(e) = self.db.egress(&entry) {
            eprintln!("corral: audit log: {e}");
        }
    }

    fn closed(&self, bytes_up: u64, bytes_down: u64) {
        for (direction, n) in [("up", bytes_up), ("down", bytes_down)] {
            self.bytes
                .get_or_create(&DirectionLabels {
                    direction: direction.into(),
                })
                .inc_by(n);
        }
    }
}

/// Weighs all sandboxes together against the host's other processes (the `cpu_weight`
/// setting); the server refuses to start when it cannot.
fn set_cpu_weight(weight: u16) -> anyhow::Result<()> {
    let weight = corral_sandbox::cgroup::CpuWeight::new(weight)
        .ok_or_else(|| anyhow::anyhow!("cpu_weight: {weight} is not within 1..=10000"))?;
    let layout = corral_sandbox::cgroup_layout()
        .ok_or_else(|| anyhow::anyhow!("cpu_weight: this host offers no cgroups to weigh"))?;
    layout
        .set_cpu_weight(weight)
        .map_err(|e| anyhow::anyhow!("cpu_weight: {e}"))
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

/// The most bytes of names and values an `env` may hold (a sandbox's, an execution's, a
/// command's, a run's). A sandbox's is held on the host for its life and given to every
/// program its process agent starts, whose start (argv and environment) is bounded alike.
pub const MAX_ENV_BYTES: usize = 128 << 10;

fn check_env(
    env: Option<&BTreeMap<String, String>>,
) -> Result<Vec<(String, String)>, ServiceError> {
    let bytes: usize = env
        .into_iter()
        .flatten()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    if bytes > MAX_ENV_BYTES {
        return Err(ServiceError::BadRequest(format!(
            "env: {bytes} bytes of names and values; at most {MAX_ENV_BYTES} are allowed"
        )));
    }
    let env: Vec<(String, String)> = env
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    corral_sandbox::env::check(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map_err(|e| ServiceError::BadRequest(format!("env: {e}")))?;
    Ok(env)
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
        let threads = Threads::new(&config, &metrics);
        let store = Store::open(config.data_dir.as_deref());
        let db_path = config
            .db
            .clone()
            .unwrap_or_else(|| store.data_dir().join("corral.db"));
        let db = Arc::new(
            Db::open(&db_path)?
                .with_retention(config.audit_retention(), metrics.audit_rows_pruned.clone())?,
        );
        let networks = NetworkBounds::of(&config.network, &config.key_network)?;
        let orphans = db.end_orphaned_sessions()?;
        let saved = crate::persist::Saved::load(
            &db,
            &db_path,
            Duration::from_secs(config.max_paused_s),
            config.saved_disk(),
        )?;
        if !orphans.is_empty() {
            eprintln!(
                "corral: {} session(s) of a previous server process were marked dead",
                orphans.len()
            );
        }
        // Cgroups of sandboxes whose owner was killed (their processes died with their
        // control pipes); removed now, before any sandbox of this process exists.
        corral_sandbox::sweep_stale_cgroups_once();
        if let Some(weight) = config.cpu_weight {
            set_cpu_weight(weight)?;
        }
        let policy = Policy {
            strict: config.strict,
            allow_degraded: config.allow_degraded,
        };
        // The limits a request leaves out: the server's `default_limits`, checked once here.
        let default_limits = config
            .default_limits
            .to_limits(&Limits::default())
            .map_err(|e| anyhow::anyhow!("default_limits: {e}"))?;
        let code_policies = CodePolicies::of(&config).map_err(anyhow::Error::from)?;
        let manager = SessionManager::with_node(
            Duration::from_secs(config.max_paused_s),
            config.node_name.clone(),
        );
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
        let result_bytes =
            corral_share::Pool::new("rich results held", "bytes", config.result_limits());
        let output = corral_share::Pool::new("program output", "bytes", config.output_limits());
        let watch_scans = crate::watch::Scans::new(&config);
        let service = Arc::new(Service {
            config,
            store,
            manager,
            pool,
            db,
            metrics,
            networks,
            sessions: Mutex::new(HashMap::new()),
            reserved: Mutex::new(HashMap::new()),
            admission,
            output,
            watch_scans,
            threads,
            shutting_down: AtomicBool::new(false),
            bytecode: Mutex::new(HashMap::new()),
            resolved: Mutex::new(HashMap::new()),
            result_bytes,
            default_limits,
            code_policies,
            saved,
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
        self.result_bytes.held() as usize
    }

    /// `tenant`'s room in the budget of rich results held at once.
    fn result_share(&self, tenant: &Tenant) -> Arc<ResultBudget> {
        let limits = self.result_bytes.limits();
        ResultBudget::of(
            &self.result_bytes,
            &tenant.0,
            format!(
                "this key's share of {} of the server's budget for rich results held at once \
                 (max_result_bytes_in_flight_per_key)",
                show_bytes(limits.per_key)
            ),
            format!(
                "the server's budget of {} for rich results held at once \
                 (max_result_bytes_in_flight)",
                show_bytes(limits.total)
            ),
        )
    }

    pub fn sessions_live(&self) -> usize {
        self.sessions.lock().len()
    }

    /// Gives back what a session that left `sessions` was promised.
    fn released(&self, owned: Option<Owned>) {
        if let Some(owned) = owned {
            self.admission
                .release(&owned.tenant.0, owned.promised_bytes);
        }
    }

    /// A dead session's kernel, and with it its memory and `/tmp`, is gone; only its
    /// workspace stays promised until the session is closed.
    fn release_dead(&self, id: &str) {
        let freed = {
            let mut sessions = self.sessions.lock();
            match sessions.get_mut(id) {
                Some(o) if o.promised_bytes > o.workspace_bytes => {
                    let freed = o.promised_bytes - o.workspace_bytes;
                    o.promised_bytes = o.workspace_bytes;
                    Some((o.tenant.clone(), freed))
                }
                _ => None,
            }
        };
        if let Some((tenant, freed)) = freed {
            self.admission.release(&tenant.0, freed);
        }
    }

    fn policy(&self) -> Policy {
        Policy {
            strict: self.config.strict,
            allow_degraded: self.config.allow_degraded,
        }
    }

    /// The code policy of `tenant`'s key (`key_code_policy` of its name, else `code_policy`),
    /// narrowed by the request's `asked` for code of `language`: a request may only narrow it
    /// (403 naming what it would widen), and module rules for bash, which has none, are a bad
    /// request; the key's module rules do not apply to bash.
    fn code_policy(
        &self,
        tenant: &Tenant,
        asked: Option<&PolicyRequest>,
        language: Language,
    ) -> Result<CodePolicy, ServiceError> {
        let asked = asked
            .map(|p| p.to_policy("policy"))
            .transpose()?
            .unwrap_or_default();
        asked
            .check_language(language)
            .map_err(|e| ServiceError::BadRequest(format!("policy: {e}")))?;
        let name = self.key_name(tenant)?;
        let policies = &self.code_policies;
        let base = name
            .and_then(|n| policies.by_key_name.get(&n))
            .unwrap_or(&policies.default);
        let policy = base.narrowed_by(&asked).map_err(|e| {
            ServiceError::Forbidden(format!(
                "policy.{e}: a request can only narrow its key's code policy"
            ))
        })?;
        Ok(policy.for_language(language))
    }

    /// The name of `tenant`'s key (`None`: keyless local use, or a key without one).
    fn key_name(&self, tenant: &Tenant) -> Result<Option<String>, ServiceError> {
        self.db
            .key_name(&tenant.0)
            .map_err(|e| ServiceError::Sandbox(e.to_string()))
    }

    /// Whether `tenant`'s key has a default network policy (`[network] default`, or its
    /// `[key_network.NAME] default`).
    pub fn has_default_network(&self, tenant: &Tenant) -> Result<bool, ServiceError> {
        Ok(self.networks.has_default(self.key_name(tenant)?.as_deref()))
    }

    /// The egress of a request of `tenant`'s: its policy, checked against its key's bound
    /// (`[network]` or `[key_network.NAME]`), and an observer that writes every decision to
    /// the audit log and the metrics (which learns the session's id once it has one).
    fn egress(
        &self,
        tenant: &Tenant,
        req: Option<&NetworkRequest>,
    ) -> Result<(Egress, Option<Arc<EgressAudit>>), ServiceError> {
        let Some(req) = req else {
            return Ok((Egress::default(), None));
        };
        let policy = self
            .networks
            .policy(self.key_name(tenant)?.as_deref(), req)?;
        if policy.is_none() {
            return Ok((Egress::default(), None));
        }
        let audit = Arc::new(EgressAudit {
            db: self.db.clone(),
            decisions: self.metrics.egress_decisions.clone(),
            bytes: self.metrics.egress_bytes.clone(),
            tenant: tenant.0.clone(),
            session: std::sync::OnceLock::new(),
        });
        let mut egress = Egress::new(policy);
        egress.observer = Some(audit.clone());
        egress.share = EgressPools::process().share(&tenant.0);
        Ok((egress, Some(audit)))
    }

    /// `ShuttingDown` once the server has begun to shut down (no new work from then on).
    pub fn check_running(&self) -> Result<(), ServiceError> {
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
        if let Some((at, image)) = self.resolved.lock().get(name) {
            if at.elapsed() < RESOLVED_FOR {
                return Ok(image.clone());
            }
        }
        let image = Arc::new(self.resolve(name)?);
        self.resolved
            .lock()
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
        self.metrics.ownership_checks.inc();
        let owned = self
            .sessions
            .lock()
            .get(id)
            .filter(|o| &o.tenant == tenant)
            .cloned();
        match owned {
            Some(owned) => Ok(owned),
            // Saved across a restart: paused until resumed.
            None if self.saved.get(&self.db, tenant, id).is_some() => {
                Err(self.manager_error(id, ManagerError::Paused(id.to_string())))
            }
            None => Err(ServiceError::NotFound(format!("no sandbox {id}"))),
        }
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
            ManagerError::Paused(_) => ServiceError::Conflict {
                state: Conflict::Paused,
                message: format!("sandbox {id} is paused: resume it first"),
            },
            ManagerError::NotPaused(_) => ServiceError::Conflict {
                state: Conflict::NotPaused,
                message: format!("sandbox {id} is not paused"),
            },
            e @ ManagerError::QueueFull(_) => ServiceError::Unavailable {
                reason: Unavailability::SandboxBusy,
                message: e.to_string(),
                retry_after_s: 1,
            },
            ManagerError::Busy(_) => ServiceError::Conflict {
                state: Conflict::Busy,
                message: format!(
                    "sandbox {id} is executing: pause it when the execution has finished"
                ),
            },
            ManagerError::Kernel(e @ KernelError::PauseUnsupported) => ServiceError::Conflict {
                state: Conflict::PauseUnsupported,
                message: e.to_string(),
            },
            ManagerError::Agent(e) => ServiceError::Process(e),
            ManagerError::Kernel(e @ KernelError::InvalidEnvironment(_)) => {
                ServiceError::BadRequest(e.to_string())
            }
            ManagerError::Kernel(KernelError::Agent(e)) => ServiceError::Process(e),
            e @ ManagerError::NoContext { .. } => ServiceError::NotFound(e.to_string()),
            e @ (ManagerError::TooManyContexts(_) | ManagerError::MainContext(_)) => {
                ServiceError::BadRequest(e.to_string())
            }
            ManagerError::Dead { reason, .. } => ServiceError::SandboxDead(format!(
                "sandbox {id} is dead ({reason}): delete it and create another"
            )),
            other => {
                self.metrics.sandbox_failures.inc();
                ServiceError::Sandbox(other.to_string())
            }
        }
    }

    fn reserve_slot(&self, tenant: &Tenant) -> Result<(), ServiceError> {
        let sessions = self.sessions.lock();
        let mut reserved = self.reserved.lock();
        // Paused sandboxes saved across a restart count as live ones (crate::persist).
        let (saved, saved_mine) = self.saved.count(tenant);
        let total = sessions.len() + reserved.values().sum::<usize>() + saved;
        let mine = sessions.values().filter(|o| &o.tenant == tenant).count()
            + reserved.get(&tenant.0).copied().unwrap_or(0)
            + saved_mine;
        match self
            .config
            .session_limits()
            .admits(total as u64, mine as u64, 1)
        {
            Ok(()) => {}
            Err(corral_share::Bound::Pool) => {
                return Err(ServiceError::TooManySandboxes {
                    message: format!(
                        "the server runs its maximum of {} sandboxes: delete one or retry later",
                        self.config.max_sessions
                    ),
                    retry_after_s: 5,
                })
            }
            Err(corral_share::Bound::Key) => {
                return Err(ServiceError::TooManySandboxes {
                    message: format!(
                        "this key has its maximum of {} sandboxes: delete one or retry later",
                        self.config.max_sessions_per_key
                    ),
                    retry_after_s: 5,
                })
            }
        }
        *reserved.entry(tenant.0.clone()).or_default() += 1;
        Ok(())
    }

    fn release_slot(&self, tenant: &Tenant) {
        let mut reserved = self.reserved.lock();
        if let Some(n) = reserved.get_mut(&tenant.0) {
            *n -= 1;
            if *n == 0 {
                reserved.remove(&tenant.0);
            }
        }
    }

    pub fn create_session(
        &self,
        call: &Admitted,
        req: &CreateSandboxRequest,
    ) -> Result<SandboxInfo, ServiceError> {
        let tenant = call.tenant();
        self.create_session_as(tenant, req, None)
    }

    /// [`Service::create_session`] under `id` when given (a saved sandbox resumed).
    fn create_session_as(
        &self,
        tenant: &Tenant,
        req: &CreateSandboxRequest,
        id: Option<&str>,
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
        let code_policy = self.code_policy(tenant, req.policy.as_ref(), language)?;
        let metadata = check_metadata(req.metadata.as_ref())?;
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
        if let Err(e) = self.admission.commit(&tenant.0, promised) {
            self.release_slot(tenant);
            return Err(e);
        }
        let (egress, audit) = match self.egress(tenant, req.network.as_ref()) {
            Ok(egress) => egress,
            Err(e) => {
                self.admission.release(&tenant.0, promised);
                self.release_slot(tenant);
                return Err(e);
            }
        };
        let started = Instant::now();
        let mut options = session_options(&image, language, limits, env, self.policy());
        options.result_budget = Some(self.result_share(tenant));
        let policy = PolicyRequest::of(&code_policy);
        options.code_policy = code_policy;
        options.egress = egress;
        let created = self
            .manager
            .create_as(&options, Duration::from_secs(idle), id);
        self.metrics
            .session_create_seconds
            .observe(started.elapsed().as_secs_f64());
        let info = match created {
            Ok(info) => info,
            Err(e) => {
                self.admission.release(&tenant.0, promised);
                self.release_slot(tenant);
                return Err(self.manager_error("(new)", e));
            }
        };
        if let Some(audit) = audit {
            let _ = audit.session.set(info.id.clone());
        }
        let owned = Owned {
            tenant: tenant.clone(),
            image: image.name.clone(),
            default_timeout: limits.timeout,
            promised_bytes: promised,
            workspace_bytes: limits.disk_bytes,
            request: CreateSandboxRequest {
                image: Some(image.name.clone()),
                language: Some(language.name().to_string()),
                limits: Some(LimitsRequest::from(&limits)),
                idle_timeout_s: Some(idle),
                policy: Some(policy.clone()),
                metadata: Some(metadata.clone()),
                ..req.clone()
            },
            policy,
            limits,
            metadata,
            restored: false,
        };
        self.sessions.lock().insert(info.id.clone(), owned.clone());
        self.release_slot(tenant);
        // A saved sandbox resumed under its id has its row already (crate::persist).
        let recorded = match id {
            None => self
                .db
                .session_started(&info.id, &tenant.0, &image.name, language.name()),
            Some(_) => Ok(()),
        };
        if let Err(e) = recorded {
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
            } else if info.paused_at.is_some() {
                "paused".into()
            } else {
                "running".into()
            },
            paused_at: info.paused_at.map(rfc3339),
            executions: info.executions,
            death: info.death.clone(),
            warnings: info.warnings.clone(),
            policy: owned.policy.clone(),
            metadata: owned.metadata.clone(),
            limits: LimitsRequest::from(&owned.limits),
            network: info.network.clone(),
            memory: if owned.restored {
                crate::persist::MEMORY_NOT_KEPT
            } else {
                crate::persist::MEMORY_KEPT
            }
            .to_string(),
        }
    }

    /// A saved sandbox as the API shows it: paused, with its settings.
    fn saved_info(&self, saved: &crate::persist::SavedSandbox) -> SandboxInfo {
        let request = &saved.spec.request;
        let limits = request
            .limits
            .clone()
            .unwrap_or_default()
            .to_limits(&self.default_limits)
            .unwrap_or(self.default_limits);
        let idle = Duration::from_secs(
            request
                .idle_timeout_s
                .unwrap_or(self.config.default_idle_timeout_s),
        );
        let info = corral_kernel::SessionInfo {
            id: saved.id.clone(),
            language: parse_language(request.language.as_deref()).map_or("python", Language::name),
            created_at: saved.created_at(),
            last_used: saved.paused_at,
            idle_timeout: idle,
            executions: 0,
            death: None,
            warnings: saved.warnings(),
            paused_at: Some(saved.paused_at),
            network: None,
        };
        let owned = Owned {
            tenant: saved.tenant.clone(),
            image: request.image.clone().unwrap_or_default(),
            default_timeout: limits.timeout,
            promised_bytes: 0,
            workspace_bytes: 0,
            policy: request.policy.clone().unwrap_or_default(),
            limits,
            metadata: request.metadata.clone().unwrap_or_default(),
            request: request.clone(),
            restored: true,
        };
        Self::info(&info, &owned)
    }

    /// Resumes a sandbox saved across a restart: a fresh session of its settings, under its
    /// id, on its saved files (its memory was not kept).
    fn resume_saved(
        &self,
        saved: crate::persist::SavedSandbox,
    ) -> Result<SandboxInfo, ServiceError> {
        let id = saved.id.clone();
        let info = match self.create_session_as(&saved.tenant, &saved.spec.request, Some(&id)) {
            Ok(info) => info,
            Err(e) => {
                self.saved.put_back(saved);
                return Err(e);
            }
        };
        let restored = self
            .manager
            .workspace(&id)
            .map_err(|e| self.manager_error(&id, e))
            .and_then(|workspace| {
                self.saved
                    .restore(&id, &workspace)
                    .map_err(|e| ServiceError::Sandbox(e.to_string()))
            });
        let lost = match restored {
            Ok(restored) => restored.is_none(),
            Err(e) => {
                // The saved files stay for another try; the fresh session goes.
                let owned = self.sessions.lock().remove(&id);
                let _ = self.manager.close(&id);
                self.released(owned);
                self.saved.put_back(saved);
                return Err(e);
            }
        };
        // What the answer says of its files: what was not saved, or that they are lost.
        let warnings = crate::persist::SavedSandbox {
            files_lost: saved.files_lost || lost,
            ..saved
        }
        .warnings();
        self.saved.finish(&self.db, &id);
        if let Err(e) = self.db.session_restored(&id) {
            eprintln!("corral: {e}");
        }
        let mut sessions = self.sessions.lock();
        let Some(owned) = sessions.get_mut(&id) else {
            return Ok(info);
        };
        owned.restored = true;
        let mut info = SandboxInfo {
            memory: crate::persist::MEMORY_NOT_KEPT.to_string(),
            ..info
        };
        info.warnings.extend(warnings);
        Ok(info)
    }

    /// Session `id` of `tenant`'s, described. A look-up that never waits for a sandbox: it
    /// takes no admission, and faces answer it without a blocking thread.
    pub fn get(&self, tenant: &Tenant, id: &str) -> Result<SandboxInfo, ServiceError> {
        if let Some(saved) = self.saved.get(&self.db, tenant, id) {
            return Ok(self.saved_info(&saved));
        }
        let owned = self.owned(tenant, id)?;
        let info = self
            .manager
            .get(id)
            .map_err(|e| self.manager_error(id, e))?;
        Ok(Self::info(&info, &owned))
    }

    /// Samples of session `id`'s usage from the last ten minutes, one every five seconds, and
    /// one of now (docs/api.md, "Metrics").
    pub fn metrics(&self, call: &Admitted, id: &str) -> Result<Vec<SandboxMetric>, ServiceError> {
        self.samples(call.tenant(), id)
    }

    /// The latest usage sample of `owner`'s session `id`, for an operator's call (the face
    /// checks that its key is an operator's); `None` when it has none.
    pub fn latest_usage(
        &self,
        _operator: &Admitted,
        owner: &Tenant,
        id: &str,
    ) -> Option<SandboxMetric> {
        self.samples(owner, id).ok()?.pop()
    }

    fn samples(&self, tenant: &Tenant, id: &str) -> Result<Vec<SandboxMetric>, ServiceError> {
        let owned = self.owned(tenant, id)?;
        let samples = self
            .manager
            .metrics(id)
            .map_err(|e| self.manager_error(id, e))?;
        let cpu_count = owned.limits.cpus.ceil().max(1.0) as u64;
        let mut previous: Option<&corral_kernel::MetricSample> = None;
        let mut metrics = Vec::with_capacity(samples.len());
        for sample in &samples {
            let cpu_used_pct = match (previous, sample.cpu_time) {
                (Some(p), Some(now)) => {
                    let wall = sample.at.duration_since(p.at).unwrap_or_default();
                    let used = now.saturating_sub(p.cpu_time.unwrap_or_default());
                    if wall.is_zero() {
                        0.0
                    } else {
                        100.0 * used.as_secs_f64() / wall.as_secs_f64() / cpu_count as f64
                    }
                }
                _ => 0.0,
            };
            previous = Some(sample);
            let memory = sample
                .memory
                .unwrap_or(corral_sandbox::cgroup::MemoryUsage { used: 0, cache: 0 });
            metrics.push(SandboxMetric {
                timestamp: rfc3339(sample.at),
                timestamp_unix: sample
                    .at
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
                cpu_count,
                cpu_used_pct,
                memory_used_bytes: memory.used,
                memory_cache_bytes: memory.cache,
                memory_limit_bytes: owned.limits.memory_bytes,
                disk_used_bytes: sample.disk_used,
                disk_total_bytes: sample.disk_total,
            });
        }
        Ok(metrics)
    }

    /// Closes session `id`: its sandbox is torn down and nothing of it remains.
    pub fn kill(&self, call: &Admitted, id: &str) -> Result<(), ServiceError> {
        let tenant = call.tenant();
        if self.saved.remove(&self.db, tenant, id) {
            let _ = self.db.session_ended(id, "deleted");
            return Ok(());
        }
        self.owned(tenant, id)?;
        let owned = self.sessions.lock().remove(id);
        let closed = self.manager.close(id);
        // Given back once the sandbox is torn down, not before.
        self.released(owned);
        let _ = self.db.session_ended(id, "deleted");
        closed.map_err(|e| self.manager_error(id, e))
    }

    /// Sets session `id`'s idle timeout (the session then expires that long after its last use).
    pub fn set_idle_timeout(
        &self,
        call: &Admitted,
        id: &str,
        seconds: u64,
    ) -> Result<SandboxInfo, ServiceError> {
        let tenant = call.tenant();
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
        self.get(call.tenant(), id)
    }

    /// Opens connections to the listeners of session `id` (corral-server's port proxy);
    /// refused while it is paused.
    pub fn port_opener(
        &self,
        call: &Admitted,
        id: &str,
    ) -> Result<corral_sandbox::ports::PortOpener, ServiceError> {
        let tenant = call.tenant();
        self.owned(tenant, id)?;
        self.manager
            .port_opener(id)
            .map_err(|e| self.manager_error(id, e))
    }

    /// The tenant that owns session `id` (for host-routed ports an operator made public).
    pub fn owner_of(&self, id: &str) -> Option<Tenant> {
        let sessions = self.sessions.lock();
        sessions.get(id).map(|o| o.tenant.clone())
    }

    /// Pauses session `id`: every process of its sandbox is frozen, keeping its memory and
    /// files; its idle clock stops (docs/api.md, "Pause and resume").
    pub fn pause(&self, call: &Admitted, id: &str) -> Result<SandboxInfo, ServiceError> {
        let tenant = call.tenant();
        let owned = self.owned(tenant, id)?;
        let info = self
            .manager
            .pause(id)
            .map_err(|e| self.manager_error(id, e))?;
        self.metrics.pauses.inc();
        Ok(Self::info(&info, &owned))
    }

    /// Resumes session `id`, paused by [`Service::pause`].
    pub fn resume(&self, call: &Admitted, id: &str) -> Result<SandboxInfo, ServiceError> {
        let tenant = call.tenant();
        if let Some(saved) = self.saved.take(&self.db, tenant, id) {
            let info = self.resume_saved(saved)?;
            self.metrics.resumes.inc();
            return Ok(info);
        }
        let owned = self.owned(tenant, id)?;
        let info = self
            .manager
            .resume(id)
            .map_err(|e| self.manager_error(id, e))?;
        self.metrics.resumes.inc();
        Ok(Self::info(&info, &owned))
    }

    /// Replaces the kernel of session `id`: its variables and processes are gone, its files
    /// stay (docs/api.md, "Restart").
    pub fn restart(&self, call: &Admitted, id: &str) -> Result<SandboxInfo, ServiceError> {
        let tenant = call.tenant();
        let owned = self.owned(tenant, id)?;
        let info = self
            .manager
            .restart(id)
            .map_err(|e| self.manager_error(id, e))?;
        Ok(Self::info(&info, &owned))
    }

    /// Interrupts the running execution of session `id`, if any.
    pub fn interrupt(&self, call: &Admitted, id: &str) -> Result<(), ServiceError> {
        let tenant = call.tenant();
        self.owned(tenant, id)?;
        self.manager
            .interrupt(id)
            .map_err(|e| self.manager_error(id, e))
    }

    /// Checks that `id` is `tenant`'s live, running session, before a stream is opened for it.
    pub(crate) fn check_session(&self, tenant: &Tenant, id: &str) -> Result<(), ServiceError> {
        self.owned(tenant, id)?;
        let info = self
            .manager
            .get(id)
            .map_err(|e| self.manager_error(id, e))?;
        self.check_live(id, &info)
    }

    /// Checks that session `id`, as the manager describes it, is neither dead nor paused.
    fn check_live(&self, id: &str, info: &corral_kernel::SessionInfo) -> Result<(), ServiceError> {
        if let Some(why) = &info.death {
            return Err(ServiceError::SandboxDead(format!(
                "sandbox {id} is dead ({why}): delete it and create another"
            )));
        }
        if info.paused_at.is_some() {
            return Err(self.manager_error(id, ManagerError::Paused(id.to_string())));
        }
        Ok(())
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
    /// it is answered with an error status before any stream starts): the execution that
    /// [`Service::execute`] then runs, without checking it again.
    pub fn prepare_execute(
        &self,
        call: &Admitted,
        id: &str,
        req: ExecuteRequest,
    ) -> Result<PreparedExecution, ServiceError> {
        let tenant = call.tenant();
        self.check_running()?;
        let owned = self.owned(tenant, id)?;
        let info = self
            .manager
            .get(id)
            .map_err(|e| self.manager_error(id, e))?;
        // The language that runs the code: its context's, the one asked for (in its default
        // context, if the image has it), else the session's own.
        let language = if let Some(context) = &req.context {
            self.manager
                .list_contexts(id)
                .map_err(|e| self.manager_error(id, e))?
                .into_iter()
                .find(|c| &c.id == context)
                .map(|c| Some(c.language))
                .ok_or_else(|| {
                    self.manager_error(
                        id,
                        ManagerError::NoContext {
                            id: id.to_string(),
                            context: context.clone(),
                        },
                    )
                })?
        } else if let Some(lang) = &req.language {
            Some(self.context_language(id, lang)?)
        } else {
            Language::parse(info.language)
        };
        if language == Some(Language::Bash) && req.env.as_ref().is_some_and(|e| !e.is_empty()) {
            return Err(ServiceError::BadRequest(
                "env: bash takes no per-execution environment: export the variables in the code"
                    .into(),
            ));
        }
        let env = check_env(req.env.as_ref())?;
        self.check_live(id, &info)?;
        Ok(PreparedExecution {
            id: id.to_string(),
            timeout: timeout_from(req.timeout_s, owned.default_timeout)?,
            env,
            req,
        })
    }

    /// Runs a prepared execution's code in its session, streaming events to `on_event` (`End`
    /// included).
    pub fn execute(
        &self,
        call: &Admitted,
        prepared: PreparedExecution,
        on_event: &mut dyn FnMut(&Event),
    ) -> Result<ExecutionResult, ServiceError> {
        let PreparedExecution {
            id,
            req,
            env,
            timeout,
        } = prepared;
        let id = id.as_str();
        let context =
            self.execution_context(id, req.context.as_deref(), req.language.as_deref())?;
        let result = match context {
            None => self.manager.execute(id, &req.code, &env, timeout, on_event),
            Some(context) => self
                .manager
                .execute_in_context(id, &context, &req.code, &env, timeout, on_event),
        }
        .map_err(|e| self.manager_error(id, e))?;
        self.audit(call.tenant(), Some(id), "execute", &req.code, &result);
        if let Some(why) = self.manager.get(id).ok().and_then(|i| i.death) {
            self.release_dead(id);
            let _ = self.db.session_ended(id, &format!("died: {why}"));
        }
        Ok(result)
    }

    /// Checks a command request as [`Service::prepare_execute`] does an execution.
    pub fn prepare_command(
        &self,
        call: &Admitted,
        id: &str,
        req: CommandRequest,
    ) -> Result<PreparedCommand, ServiceError> {
        let tenant = call.tenant();
        self.check_running()?;
        let owned = self.owned(tenant, id)?;
        let info = self
            .manager
            .get(id)
            .map_err(|e| self.manager_error(id, e))?;
        self.check_live(id, &info)?;
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
            id: id.to_string(),
            argv,
            env: check_env(req.env.as_ref())?,
            timeout: timeout_from(req.timeout_s, owned.default_timeout)?,
            cwd: req.cwd,
        })
    }

    /// Runs a prepared command inside its session's sandbox; the result's `exit_code` is the
    /// command's. `stop` stops it (and only it), whether it waits for the session or runs.
    pub fn run_command(
        &self,
        call: &Admitted,
        prepared: PreparedCommand,
        stop: &Stopper,
        on_event: &mut dyn FnMut(&Event),
    ) -> Result<ExecutionResult, ServiceError> {
        let p = prepared;
        let result = self
            .manager
            .run_command(
                &p.id,
                &p.argv,
                p.cwd.as_deref(),
                &p.env,
                p.timeout,
                stop,
                on_event,
            )
            .map_err(|e| self.manager_error(&p.id, e))?;
        self.audit(
            call.tenant(),
            Some(&p.id),
            "command",
            &p.argv.join(" "),
            &result,
        );
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
        call: &Admitted,
        id: &str,
        path: &str,
        announced: Option<u64>,
    ) -> Result<Upload, ServiceError> {
        let tenant = call.tenant();
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
        call: &Admitted,
        id: &str,
        path: &str,
        data: &[u8],
    ) -> Result<FileEntry, ServiceError> {
        self.prepare_upload(call, id, path, Some(data.len() as u64))?
            .write(&mut &data[..])
    }

    /// Opens a workspace file for reading (regular files only, never through a link).
    pub fn open_file(
        &self,
        call: &Admitted,
        id: &str,
        path: &str,
    ) -> Result<std::fs::File, ServiceError> {
        let tenant = call.tenant();
        self.with_workspace(tenant, id, |ws| ws.open_file(Path::new(path)))
    }

    pub fn remove_file(&self, call: &Admitted, id: &str, path: &str) -> Result<(), ServiceError> {
        let tenant = call.tenant();
        self.with_workspace(tenant, id, |ws| ws.remove_file(Path::new(path)))
    }

    pub fn list_files(
        &self,
        call: &Admitted,
        id: &str,
        dir: Option<&str>,
    ) -> Result<Vec<FileEntry>, ServiceError> {
        let tenant = call.tenant();
        let dir = dir.filter(|d| !d.is_empty() && *d != "." && *d != "/");
        self.with_workspace(tenant, id, |ws| ws.list_below(dir.map(Path::new)))
    }

    /// What is at `path` in session `id`'s workspace (the workspace itself when empty),
    /// never following a link.
    pub fn stat(&self, call: &Admitted, id: &str, path: &str) -> Result<EntryInfo, ServiceError> {
        let tenant = call.tenant();
        self.with_workspace(tenant, id, |ws| ws.stat(Path::new(path)))
    }

    /// The entries of directory `dir`, `depth` levels of them (see [`corral_sandbox::Workspace::list_dir`]).
    pub fn list_dir(
        &self,
        call: &Admitted,
        id: &str,
        dir: &str,
        depth: usize,
    ) -> Result<Vec<EntryInfo>, ServiceError> {
        let tenant = call.tenant();
        self.with_workspace(tenant, id, |ws| ws.list_dir(Path::new(dir), depth))
    }

    /// The host uid and gid of session `id`'s user, who its workspace files belong to.
    pub fn sandbox_user(&self, call: &Admitted, id: &str) -> Result<(u32, u32), ServiceError> {
        let tenant = call.tenant();
        self.with_workspace(tenant, id, |ws| Ok(ws.sandbox_user()))
    }

    /// Makes directory `path` and its parents; false if it was already there.
    pub fn make_dir(&self, call: &Admitted, id: &str, path: &str) -> Result<bool, ServiceError> {
        let tenant = call.tenant();
        self.with_workspace(tenant, id, |ws| ws.make_dir(Path::new(path)))
    }

    /// Moves `from` to `to`, never replacing anything; what is at `to` afterwards.
    pub fn move_path(
        &self,
        call: &Admitted,
        id: &str,
        from: &str,
        to: &str,
    ) -> Result<EntryInfo, ServiceError> {
        let tenant = call.tenant();
        self.with_workspace(tenant, id, |ws| ws.rename(Path::new(from), Path::new(to)))
    }

    /// Removes `path`, a directory with everything in it (never through a link).
    pub fn remove_path(&self, call: &Admitted, id: &str, path: &str) -> Result<(), ServiceError> {
        let tenant = call.tenant();
        self.with_workspace(tenant, id, |ws| ws.remove(Path::new(path)))
    }

    /// Admits one call of `tenant`: a blocking thread of its key's budget, or a refusal at
    /// once (429 `key_busy`, 503 `server_busy`; see [`Threads::admit`]). Every piece of a
    /// tenant's work takes the [`Admitted`] call, so no face can do it unadmitted; a face
    /// runs the work on a blocking thread of its own that holds the call until it is done.
    pub fn admit(&self, tenant: &Tenant) -> Result<Admitted, ServiceError> {
        let thread = self.threads.admit(tenant)?;
        self.metrics.calls_admitted.inc();
        Ok(Admitted {
            tenant: tenant.clone(),
            thread,
        })
    }

    /// Admits a call of `tenant` that is never refused, on the threads above
    /// `max_blocking_calls` ([`Threads::unmetered`]): closing a sandbox, which a key can do
    /// even while its calls hold every thread of its budget.
    pub fn admit_unmetered(&self, tenant: &Tenant) -> Admitted {
        self.metrics.calls_admitted.inc();
        Admitted {
            tenant: tenant.clone(),
            thread: self.threads.unmetered(),
        }
    }

    /// `tenant`'s share of the bytes of programs' output held for clients: every output
    /// stream of the key counts what it holds in it ([`corral_kernel::agent`]).
    pub fn output_share(&self, tenant: &Tenant) -> corral_share::Share {
        self.output.share(&tenant.0)
    }

    /// The turns of directory watchers' scans ([`crate::watch::Scans`]).
    pub fn watch_scans(&self) -> &crate::watch::Scans {
        &self.watch_scans
    }

    /// A blocking thread for work that is no key's engine call ([`Threads::unmetered`]).
    pub fn unmetered_thread(&self) -> ThreadPermit {
        self.threads.unmetered()
    }

    /// A slot for one of `tenant`'s uploads streaming its body (at most
    /// `max_uploads_in_flight` at once, `max_uploads_in_flight_per_key` of one key), waited for
    /// at most `admission_wait_s`, then refused (429 or 503 with `Retry-After`).
    pub async fn admit_upload(
        &self,
        tenant: &Tenant,
    ) -> Result<crate::admission::UploadPermit, ServiceError> {
        self.check_running()?;
        self.admission.admit_upload(&tenant.0).await
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
        let language = parse_language(req.language.as_deref())?;
        self.code_policy(tenant, req.policy.as_ref(), language)?;
        // A network policy outside the operator's is refused before the run waits for a slot.
        self.egress(tenant, req.network.as_ref())?;
        self.admission
            .admit_run(&tenant.0, limits.host_memory_bytes())
            .await
    }

    /// Runs `req` in a fresh sandbox, holding `permit` (from [`Service::admit_run`]) until the
    /// sandbox is gone. Problems with the request are errors; whatever the program does
    /// (including failing to start) is in the result.
    pub fn run(
        &self,
        call: &Admitted,
        req: &RunRequest,
        permit: RunPermit,
        on_output: &mut dyn FnMut(corral_sandbox::Stream, &[u8]),
    ) -> Result<ExecutionResult, ServiceError> {
        let tenant = call.tenant();
        self.check_running()?;
        let language = parse_language(req.language.as_deref())?;
        let image = self.image(req.image.as_deref())?;
        Self::check_language(&image, language)?;
        let code_policy = self.code_policy(tenant, req.policy.as_ref(), language)?;
        let mut spec = SandboxSpec::new(Vec::new());
        spec.limits = req
            .limits
            .clone()
            .unwrap_or_default()
            .to_limits(&self.default_limits)?;
        spec.env = image.env.clone();
        spec.env.extend(check_env(req.env.as_ref())?);
        spec.policy = self.policy();
        spec.egress = self.egress(tenant, req.network.as_ref())?.0;
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
                    &code_policy,
                    Some(self.result_share(tenant)),
                    on_output,
                )
            });
        let result = match forked {
            Some((result, zygote)) => {
                if let Some(zygote) = zygote {
                    self.metrics.record_forked_run(zygote);
                }
                result
            }
            None => {
                let bytecode = (language == Language::Python).then(|| self.bytecode_cache(&image));
                let (mut result, workspace) = oneshot::run(
                    spec,
                    language,
                    file_name,
                    req.code.clone().into_bytes(),
                    &code_policy,
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
            .entry(image.name.clone())
            .or_insert_with(|| Arc::new(BytecodeCache::new(self.store.data_dir(), &image.rootfs)))
            .clone()
    }

    /// Saves the paused session `id`, paused since `paused_at`, across the restart, writing
    /// nothing after `deadline` (crate::persist).
    fn save_paused(&self, id: &str, owned: &Owned, paused_at: SystemTime, deadline: Instant) {
        let Ok(workspace) = self.manager.workspace_to_save(id) else {
            return;
        };
        let created_at = self
            .manager
            .get(id)
            .ok()
            .and_then(|i| i.created_at.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        let saved = crate::persist::SavedSandbox {
            id: id.to_string(),
            tenant: owned.tenant.clone(),
            paused_at,
            spec: crate::persist::SavedSpec {
                request: owned.request.clone(),
                created_at,
                not_saved: Vec::new(),
            },
            files_lost: false,
        };
        match self.saved.save(
            &self.db,
            saved,
            &workspace,
            owned.limits.disk_bytes,
            deadline,
        ) {
            Ok(()) => eprintln!("corral: paused sandbox {id} saved: resume it after the restart"),
            Err(e) => eprintln!("corral: paused sandbox {id} could not be saved: {e}"),
        }
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

    /// Tears every session down; nothing of them remains but the paused ones' saved files.
    /// Saving them takes at most `shutdown_save_s` in all, shared by [`in_key_shares`], so
    /// that neither one large workspace nor one key's many paused sandboxes can take the
    /// others' time.
    pub fn close_all(&self) {
        let sessions: Vec<(String, Owned)> = self.sessions.lock().drain().collect();
        let paused: Vec<(String, (&str, &Owned, SystemTime))> = sessions
            .iter()
            .filter_map(|(id, owned)| {
                let since = self.manager.get(id).ok()?.paused_at?;
                Some((owned.tenant.0.clone(), (id.as_str(), owned, since)))
            })
            .collect();
        let end = Instant::now() + self.config.shutdown_save();
        in_key_shares(paused, end, |(id, owned, since), deadline| {
            self.save_paused(id, owned, since, deadline)
        });
        for (id, owned) in sessions {
            let _ = self.manager.close(&id);
            self.released(Some(owned));
            let _ = self.db.session_ended(&id, "server shut down");
        }
        self.manager.shutdown();
    }
}

/// Calls `work` on every item (of a key) with a deadline before `end`: each key an even share
/// of the time left, and each item of a key an even share of what is left of its key's, so
/// that the time one key's items do not take goes to the others, and a key with many items
/// takes no more time than a key with one.
fn in_key_shares<T>(items: Vec<(String, T)>, end: Instant, mut work: impl FnMut(T, Instant)) {
    let mut by_key: BTreeMap<String, Vec<T>> = BTreeMap::new();
    for (key, item) in items {
        by_key.entry(key).or_default().push(item);
    }
    let mut keys_left = by_key.len() as u32;
    for items in by_key.into_values() {
        let key_end =
            Instant::now() + end.saturating_duration_since(Instant::now()) / keys_left.max(1);
        let mut left = items.len() as u32;
        for item in items {
            let share = key_end.saturating_duration_since(Instant::now()) / left.max(1);
            work(item, Instant::now() + share);
            left -= 1;
        }
        keys_left -= 1;
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
            let mut sessions = service.sessions.lock();
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

#[cfg(test)]
mod tests {
    /// Saving paused sandboxes at shutdown: a key with nine sandboxes that each take all the
    /// time they are given leaves a key with one its half of the time, not a tenth.
    #[test]
    fn each_key_gets_an_even_share_of_the_time_to_save() {
        use std::time::{Duration, Instant};
        let total = Duration::from_millis(1000);
        let mut items: Vec<(String, &str)> = (0..9).map(|_| ("key-a".into(), "a")).collect();
        items.push(("key-b".into(), "b"));
        let mut given_b = Duration::ZERO;
        super::in_key_shares(items, Instant::now() + total, |who, deadline| {
            let share = deadline.saturating_duration_since(Instant::now());
            if who == "b" {
                given_b = share;
            }
            // Takes all of its time, as a large workspace does.
            std::thread::sleep(share);
        });
        assert!(
            given_b >= total * 2 / 5,
            "key b's one sandbox had {given_b:?} of {total:?}"
        );
    }

    use super::*;

    #[test]
    fn the_configured_code_policies_are_checked_naming_their_table() {
        let config: Config = toml::from_str(
            "[code_policy]\ndenied_modules = [\"socket\"]\n\
             [key_code_policy.ci]\nallowed_modules = [\"json\"]\nmax_code_bytes = 100\n",
        )
        .unwrap();
        let policies = CodePolicies::of(&config).unwrap();
        assert_eq!(
            PolicyRequest::of(&policies.default),
            PolicyRequest {
                allowed_modules: None,
                denied_modules: Some(vec!["socket".into()]),
                max_code_bytes: None,
            }
        );
        assert_eq!(
            policies.by_key_name["ci"].allowed_modules(),
            Some(&["json".to_string()].into())
        );
        let config: Config =
            toml::from_str("[key_code_policy.ci]\nallowed_modules = [\"a b\"]\n").unwrap();
        let err = CodePolicies::of(&config).unwrap_err().to_string();
        assert!(
            err.starts_with("key_code_policy.ci.allowed_modules: \"a b\" is not a module name"),
            "{err}"
        );
        let unknown = toml::from_str::<Config>("[code_policy]\nallowed = [\"json\"]\n");
        assert!(unknown.unwrap_err().to_string().contains("allowed"));
    }
}
