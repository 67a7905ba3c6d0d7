//! The E2B-compatible face (docs/api.md#e2b-compatibility): enough of E2B's control plane and of its in-sandbox
//! daemons (envd and the Jupyter server) for the unmodified `e2b` / `e2b-code-interpreter`
//! SDKs, pointed here with `E2B_API_URL` and `E2B_SANDBOX_URL`. Every request is served by
//! [`Service`](crate::service::Service), as the native API is.
//!
//! - Control plane, authenticated by `X-API-KEY`: `POST /v2/sandboxes`,
//!   `POST /v2/sandboxes/{id}/connect`, `GET /sandboxes/{id}`, `DELETE /sandboxes/{id}`.
//!   Errors are `{"code": <status>, "message": "..."}`, the shape the SDK parses.
//! - Sandbox plane, selected by the `E2b-Sandbox-Id` header and authenticated by the
//!   per-sandbox `X-Access-Token` handed out at creation: `POST /execute` (NDJSON),
//!   `POST/GET /files`, `GET /health`, the Connect RPCs `POST /process.Process/Start` and
//!   `POST /process.Process/SendSignal` (which kills a command started by `Start`), and envd's
//!   filesystem service `filesystem.Filesystem/*` (stat, list, mkdir, move, remove, and
//!   directory watchers, polled by the client or streamed by `WatchDir`: [`watch_dir`]).
//!   A sandbox that is unknown or gone answers 502 "The sandbox … was not found", as E2B's
//!   edge proxy does; the SDK reads that as "not running". So does a sandbox whose token is
//!   missing or wrong, so that the answer never tells whether an id exists.
//!
//! E2B paths are mapped onto the session's workspace: relative paths and paths under
//! `/home/user` (E2B's home) or `/workspace` name workspace files; other absolute paths are
//! refused. The SDK calls Corral does not serve ([`Unsupported`]) are answered as E2B
//! answers an operation it does not implement, with a message that says so: HTTP 501 on the
//! REST routes, the Connect code `unimplemented` on the RPCs.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::SystemTime;

use axum::body::{Body, Bytes};
use axum::extract::multipart::MultipartRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Multipart, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Extension, Json, Router};
use corral_kernel::{End, Event};
use corral_sandbox::workspace::{EntryInfo, EntryKind, MAX_DEPTH};
use corral_sandbox::{Reservation, Status};
use futures_util::StreamExt as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

mod contexts;
mod process;

use crate::config::Config;
use crate::connect::{self, Code, Decoder, FLAG_END_STREAM};
use crate::error::ApiError;
use crate::http::{authenticate, blocking, parse_json, stream_frames, stream_upload, AppState};
use crate::service::{
    Admitted, CreateSandboxRequest, ExecuteRequest, ListQuery, SandboxInfo, Service, ServiceError,
    Tenant, LIST_LIMIT,
};
use crate::watch::{Snapshot, MAX_WATCHERS};
pub use corral_wire::e2b::{E2bError, SANDBOX_ID_HEADER};

mod watch_dir;
use watch_dir::{create_watcher, event_json, poll_watcher, Watcher};

/// What `clientID` says in sandbox descriptions.
const CLIENT_ID: &str = "corral";
/// In `[0.4.0, 0.5.7)`: the SDK sends no user header and uploads files only as multipart;
/// from 0.5.2 it sends `close_stdin`.
const ENVD_VERSION: &str = "0.5.2";
/// The template a create request without `templateID` gets.
const DEFAULT_TEMPLATE: &str = "code-interpreter-v1";
/// E2B's own template names, served by Corral's default image; other names are image names.
const DEFAULT_IMAGE_TEMPLATES: &[&str] = &["code-interpreter-v1", "code-interpreter", "base"];
/// E2B's home directory, and Corral's workspace that stands for it.
const E2B_HOME: &str = "/home/user";
const WORKSPACE: &str = "/workspace";
const ACCESS_TOKEN_HEADER: &str = "x-access-token";
/// The sandbox's token on the code interpreter's `/contexts…` requests.
const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";
const CONNECT_JSON: &str = "application/connect+json";
const PROCESS_SERVICE: &str = "process.Process";
const FILESYSTEM_SERVICE: &str = "filesystem.Filesystem";

/// The E2B SDK calls Corral does not serve. Each is answered as E2B answers an operation it
/// does not implement, never as something missing (which the SDK would report as a missing
/// file or sandbox): 501 on the REST routes, the Connect code `unimplemented` on the RPCs.
/// The messages name the SDK call, say that Corral does not support it, and what to do
/// instead. docs/e2b.md lists them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum Unsupported {
    #[error("fork is not supported by Corral: create another sandbox")]
    Fork,
    #[error(
        "snapshots (create_snapshot, list_snapshots, delete_snapshot) are not supported by \
         Corral"
    )]
    Snapshots,
    #[error(
        "update_network is not supported by Corral: a sandbox's network policy is fixed when it \
         is created"
    )]
    Network,
    #[error(
        "run_code(language={language:?}) is not supported by Corral: {reason}; a Corral \
         sandbox runs the languages of its image (python, javascript, bash)"
    )]
    Language { language: String, reason: String },
    #[error("{service}/{method} is not supported by Corral")]
    Rpc {
        service: &'static str,
        method: String,
    },
}

impl From<Unsupported> for E2bError {
    fn from(e: Unsupported) -> E2bError {
        E2bError::new(StatusCode::NOT_IMPLEMENTED, e.to_string())
    }
}

/// A sandbox made through this face: who owns it, the token of its sandbox plane, and the
/// template it was asked for.
struct Registered {
    tenant: Tenant,
    token: String,
    template: String,
}

/// The sandboxes of the E2B face, by id. A sandbox closed elsewhere (native API, idle
/// expiry) is forgotten when next seen gone, and on every creation.
#[derive(Default)]
struct Registry {
    sandboxes: Mutex<HashMap<String, Registered>>,
    /// The directory watchers of `files.watch_dir`, by id; dropped with their sandbox.
    watchers: Mutex<HashMap<String, Arc<Watcher>>>,
}

impl Registry {
    fn register(&self, id: &str, tenant: Tenant, template: String) -> String {
        let token = hex::encode(rand::random::<[u8; 32]>());
        let entry = Registered {
            tenant,
            token: token.clone(),
            template,
        };
        self.sandboxes.lock().insert(id.to_string(), entry);
        token
    }

    fn forget(&self, id: &str) {
        self.sandboxes.lock().remove(id);
        self.watchers.lock().retain(|_, w| w.sandbox != id);
    }

    /// Forgets every sandbox for which `alive(tenant, id)` is false, and its watchers.
    fn prune(&self, alive: impl Fn(&Tenant, &str) -> bool) {
        let mut sandboxes = self.sandboxes.lock();
        sandboxes.retain(|id, e| alive(&e.tenant, id));
        self.watchers
            .lock()
            .retain(|_, w| sandboxes.contains_key(&w.sandbox));
    }

    /// Keeps a new watcher: its id, unless its sandbox has [`MAX_WATCHERS`] already.
    fn add_watcher(&self, watcher: Watcher) -> Result<String, RpcError> {
        let mut watchers = self.watchers.lock();
        let of_sandbox = watchers
            .values()
            .filter(|w| w.sandbox == watcher.sandbox)
            .count();
        if of_sandbox >= MAX_WATCHERS {
            return Err(RpcError(
                Code::FailedPrecondition,
                format!(
                    "this sandbox has {MAX_WATCHERS} directory watchers already, the most it \
                     may have: stop one (handle.stop()) first"
                ),
            ));
        }
        let watcher_id = format!("w{}", hex::encode(rand::random::<[u8; 16]>()));
        watchers.insert(watcher_id.clone(), Arc::new(watcher));
        Ok(watcher_id)
    }

    /// Sandbox `id`'s watcher `watcher_id`.
    fn watcher(&self, id: &str, watcher_id: &str) -> Result<Arc<Watcher>, RpcError> {
        self.watchers
            .lock()
            .get(watcher_id)
            .filter(|w| w.sandbox == id)
            .cloned()
            .ok_or_else(|| watcher_not_found(watcher_id))
    }

    fn remove_watcher(&self, id: &str, watcher_id: &str) -> Result<(), RpcError> {
        let mut watchers = self.watchers.lock();
        match watchers.get(watcher_id) {
            Some(w) if w.sandbox == id => {
                watchers.remove(watcher_id);
                Ok(())
            }
            _ => Err(watcher_not_found(watcher_id)),
        }
    }

    /// The token and template of `tenant`'s sandbox `id`, if this face made it.
    fn lookup(&self, tenant: &Tenant, id: &str) -> Option<(String, String)> {
        self.sandboxes
            .lock()
            .get(id)
            .filter(|e| &e.tenant == tenant)
            .map(|e| (e.token.clone(), e.template.clone()))
    }

    /// The owner of the sandbox a sandbox-plane request names, if its token is right. A wrong
    /// or missing token is answered exactly as an unknown sandbox (502, "not found"): the
    /// answer does not tell another tenant's sandbox ids from ids that do not exist.
    fn authorize(&self, headers: &HeaderMap) -> Result<(String, Tenant), E2bError> {
        let id = headers
            .get(SANDBOX_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                E2bError::new(
                    StatusCode::NOT_FOUND,
                    "this route belongs to the E2B sandbox plane: send an E2b-Sandbox-Id header",
                )
            })?;
        let presented = headers
            .get(ACCESS_TOKEN_HEADER)
            .or_else(|| headers.get(TRAFFIC_TOKEN_HEADER))
            .map_or(&b""[..], HeaderValue::as_bytes);
        let sandboxes = self.sandboxes.lock();
        match sandboxes.get(id) {
            Some(entry) if tokens_match(entry.token.as_bytes(), presented) => {
                Ok((id.to_string(), entry.tenant.clone()))
            }
            _ => Err(E2bError::not_running(id)),
        }
    }
}

fn watcher_not_found(watcher_id: &str) -> RpcError {
    RpcError(
        Code::NotFound,
        format!("watcher with id {watcher_id} not found"),
    )
}

/// Compares a secret without stopping at the first difference.
fn tokens_match(expected: &[u8], presented: &[u8]) -> bool {
    expected.len() == presented.len()
        && expected
            .iter()
            .zip(presented)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// The E2B routes, merged into the application by [`crate::http::router`].
pub fn router(config: &Config) -> Router<AppState> {
    let uploads = Router::new()
        .route("/files", get(read_file).post(write_files))
        .layer(DefaultBodyLimit::max(config.max_body_bytes));
    Router::new()
        .route("/v2/sandboxes", post(create_sandbox).get(list_sandboxes))
        .route("/v2/sandboxes/{id}/connect", post(connect_sandbox))
        .route("/sandboxes/{id}/connect", post(connect_sandbox))
        .route("/sandboxes/{id}/resume", post(resume_sandbox))
        .route("/sandboxes/{id}/pause", post(pause_sandbox))
        .route("/sandboxes/{id}", get(sandbox_info).delete(kill_sandbox))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/metrics", get(sandbox_metrics))
        .route(
            "/sandboxes/{id}/fork",
            post(|s, h, b| refuse(s, h, b, Unsupported::Fork)),
        )
        .route(
            "/sandboxes/{id}/snapshots",
            post(|s, h, b| refuse(s, h, b, Unsupported::Snapshots)),
        )
        .route(
            "/snapshots",
            get(|s, h, b| refuse(s, h, b, Unsupported::Snapshots)),
        )
        .route(
            "/templates/{id}",
            delete(|s, h, b| refuse(s, h, b, Unsupported::Snapshots)),
        )
        .route(
            "/sandboxes/{id}/network",
            put(|s, h, b| refuse(s, h, b, Unsupported::Network)),
        )
        .route("/execute", post(execute))
        .route("/contexts", get(contexts::list).post(contexts::create))
        .route("/contexts/{id}", delete(contexts::remove))
        .route("/contexts/{id}/restart", post(contexts::restart))
        .route("/health", get(health))
        .route("/process.Process/Start", post(process::start))
        .route("/process.Process/Connect", post(process::connect))
        .route("/process.Process/List", post(process::list))
        .route("/process.Process/SendInput", post(process::send_input))
        .route("/process.Process/CloseStdin", post(process::close_stdin))
        .route("/process.Process/SendSignal", post(process::send_signal))
        .route("/process.Process/Update", post(process::update))
        .route("/process.Process/StreamInput", post(process::stream_input))
        .route("/process.Process/{method}", post(process::other))
        .route(
            "/filesystem.Filesystem/WatchDir",
            post(watch_dir::watch_dir),
        )
        .route("/filesystem.Filesystem/{method}", post(filesystem_rpc))
        .layer(DefaultBodyLimit::max(config.max_json_bytes))
        .merge(uploads)
        .layer(Extension(Arc::new(Registry::default())))
}

// ---------------------------------------------------------------------------------------
// Control plane

/// The part of E2B's `NewSandbox` Corral uses; other keys are ignored.
#[derive(Debug, Default, Deserialize)]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    #[serde(rename = "envVars")]
    env_vars: Option<BTreeMap<String, String>>,
    /// Seconds; Corral's idle timeout.
    timeout: Option<u64>,
    metadata: Option<BTreeMap<String, String>>,
    /// With `network`, mapped onto the sandbox's egress allow-list (`e2b_network`).
    allow_internet_access: Option<bool>,
    network: Option<crate::e2b_network::E2bNetwork>,
}

/// Corral's image for an E2B template: E2B's own names mean the default image.
fn image_of_template(template: &str) -> Option<String> {
    (!DEFAULT_IMAGE_TEMPLATES.contains(&template)).then(|| template.to_string())
}

/// `domain`: where the SDK's `get_host(port)` points (`{port}-{id}.{domain}`, crate::ports).
fn sandbox_json(id: &str, template: &str, token: &str, domain: Option<String>) -> Value {
    json!({
        "templateID": template,
        "sandboxID": id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": token,
        "domain": domain,
        // The SDK sends this one (as `E2B-Traffic-Access-Token`) on the code interpreter's
        // requests that carry no `X-Access-Token` (`/contexts…`).
        "trafficAccessToken": token,
    })
}

async fn tenant_of(state: &AppState, headers: &HeaderMap) -> Result<Tenant, E2bError> {
    Ok(authenticate(state, headers).await?)
}

async fn create_sandbox(
    State(state): State<AppState>,
    Extension(registry): Extension<Arc<Registry>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<Value>), E2bError> {
    let tenant = tenant_of(&state, &headers).await?;
    let req: NewSandbox = if body.iter().all(u8::is_ascii_whitespace) {
        NewSandbox::default()
    } else {
        parse_json(&body).map_err(E2bError::bad_request)?
    };
    let max_timeout = state.service.config().max_idle_timeout_s;
    if let Some(t) = req.timeout.filter(|t| !(1..=max_timeout).contains(t)) {
        return Err(E2bError::bad_request(format!(
            "timeout {t}: it must be between 1 and {max_timeout} seconds"
        )));
    }
    let network = crate::e2b_network::network_of(
        req.allow_internet_access,
        req.network.as_ref(),
        state.service.has_default_network(&tenant)?,
    )?;
    let template = req
        .template_id
        .unwrap_or_else(|| DEFAULT_TEMPLATE.to_string());
    let create = CreateSandboxRequest {
        image: image_of_template(&template),
        language: None,
        limits: None,
        env: req.env_vars,
        idle_timeout_s: req.timeout,
        // E2B's SDKs know no code policy: the key's applies.
        policy: None,
        metadata: req.metadata,
        network,
    };
    let (service, owner) = (state.service.clone(), tenant.clone());
    let info = blocking(service.admit(&owner)?, move |call| {
        service.create_session(call, &create)
    })
    .await?;
    let service = state.service.clone();
    registry.prune(|tenant, id| service.get(tenant, id).is_ok());
    let token = registry.register(&info.id, tenant, template.clone());
    Ok((
        StatusCode::CREATED,
        Json(sandbox_json(
            &info.id,
            &template,
            &token,
            crate::ports::domain_of(state.service.config()),
        )),
    ))
}

/// `Sandbox.connect(id)`: the same description as at creation. A session made through the
/// native API gets a token here.
async fn connect_sandbox(
    State(state): State<AppState>,
    Extension(registry): Extension<Arc<Registry>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, E2bError> {
    let tenant = tenant_of(&state, &headers).await?;
    let mut info = state.service.get(&tenant, &id)?;
    // E2B's connect resumes a paused sandbox.
    if info.state == "paused" {
        let service = state.service.clone();
        let (owner, sandbox) = (tenant.clone(), id.clone());
        info = blocking(service.admit(&owner)?, move |call| {
            service.resume(call, &sandbox)
        })
        .await?;
    }
    Ok(Json(known_sandbox_json(
        &state, &registry, tenant, &id, info.image,
    )))
}

/// The sandbox as E2B's create and connect answer it, registering it with this face the first
/// time it is seen here.
fn known_sandbox_json(
    state: &AppState,
    registry: &Registry,
    tenant: Tenant,
    id: &str,
    image: String,
) -> Value {
    let (token, template) = match registry.lookup(&tenant, id) {
        Some(known) => known,
        None => (registry.register(id, tenant, image.clone()), image),
    };
    sandbox_json(
        id,
        &template,
        &token,
        crate::ports::domain_of(state.service.config()),
    )
}

/// `Sandbox.pause()` (`beta_pause`): 204; 409 when it is already paused.
async fn pause_sandbox(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let tenant = tenant_of(&state, &headers).await?;
    let service = state.service.clone();
    blocking(service.admit(&tenant)?, move |call| {
        service.pause(call, &id)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The older SDKs' `Sandbox.resume(id)`: 201 with the sandbox; 409 when it is not paused.
async fn resume_sandbox(
    State(state): State<AppState>,
    Extension(registry): Extension<Arc<Registry>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<Value>), E2bError> {
    let tenant = tenant_of(&state, &headers).await?;
    let service = state.service.clone();
    let (owner, sandbox) = (tenant.clone(), id.clone());
    let info = blocking(service.admit(&owner)?, move |call| {
        service.resume(call, &sandbox)
    })
    .await?;
    Ok((
        StatusCode::CREATED,
        Json(known_sandbox_json(
            &state, &registry, tenant, &id, info.image,
        )),
    ))
}

/// A session as E2B's `ListedSandbox` (and, with the token, `SandboxDetail`) describes it.
fn listed_sandbox(info: &SandboxInfo, template: Option<String>) -> Value {
    let limits = &info.limits;
    json!({
        "templateID": template.unwrap_or_else(|| info.image.clone()),
        "sandboxID": info.id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "startedAt": info.created_at,
        "endAt": info.expires_at,
        "cpuCount": limits.cpus.unwrap_or(1.0).ceil() as u64,
        "memoryMB": limits.memory_mb.unwrap_or(0),
        "diskSizeMB": limits.disk_mb.unwrap_or(0),
        "state": if info.state == "paused" { "paused" } else { "running" },
        "metadata": info.metadata,
        // Corral's own: `not kept` once resumed on files saved across a restart.
        "memory": info.memory,
    })
}

/// `Sandbox.get_info(id)`: E2B's `SandboxDetail`.
async fn sandbox_info(
    State(state): State<AppState>,
    Extension(registry): Extension<Arc<Registry>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, E2bError> {
    let tenant = tenant_of(&state, &headers).await?;
    let info = state.service.get(&tenant, &id)?;
    let known = registry.lookup(&tenant, &id);
    let mut detail = listed_sandbox(&info, known.as_ref().map(|(_, t)| t.clone()));
    if let Some((token, _)) = known {
        detail["envdAccessToken"] = json!(token);
        detail["trafficAccessToken"] = json!(token);
    }
    Ok(Json(detail))
}

/// The query of `Sandbox.list()`: `metadata` (itself a URL-encoded `k=v&...`), `state`
/// (comma-separated), `template`, `limit`, `nextToken`; `order` and `startedAfter` are taken
/// and ignored (the list is in creation order).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListParams {
    metadata: Option<String>,
    state: Option<String>,
    template: Option<String>,
    limit: Option<usize>,
    next_token: Option<String>,
    #[serde(rename = "order")]
    _order: Option<String>,
    #[serde(rename = "startedAfter")]
    _started_after: Option<String>,
}

/// `Sandbox.list()`: this key's sandboxes, a page at a time (`x-next-token`).
async fn list_sandboxes(
    State(state): State<AppState>,
    Extension(registry): Extension<Arc<Registry>>,
    headers: HeaderMap,
    query: Result<Query<ListParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, E2bError> {
    let tenant = tenant_of(&state, &headers).await?;
    let Query(params) = query.map_err(|e| E2bError::bad_request(e.body_text()))?;
    let metadata = match &params.metadata {
        Some(encoded) => serde_urlencoded::from_str::<BTreeMap<String, String>>(encoded)
            .map_err(|e| E2bError::bad_request(format!("metadata {encoded:?}: {e}")))?,
        None => BTreeMap::new(),
    };
    let query = ListQuery {
        states: params
            .state
            .iter()
            .flat_map(|s| s.split(','))
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect(),
        metadata,
        image: params.template.as_deref().map(|t| {
            image_of_template(t).unwrap_or_else(|| state.service.config().default_image.clone())
        }),
        limit: Some(params.limit.unwrap_or(100).min(LIST_LIMIT)),
        after: params.next_token,
    };
    let page = state.service.list(&tenant, &query)?;
    let listed: Vec<Value> = page
        .sandboxes
        .iter()
        .map(|info| {
            let template = registry.lookup(&tenant, &info.id).map(|(_, t)| t);
            listed_sandbox(info, template)
        })
        .collect();
    let mut response = Json(listed).into_response();
    if let Some(next) = page.next.and_then(|n| HeaderValue::from_str(&n).ok()) {
        response.headers_mut().insert("x-next-token", next);
    }
    Ok(response)
}

#[derive(Debug, Default, Deserialize)]
struct MetricsParams {
    /// Unix seconds: samples from then on.
    start: Option<u64>,
    /// Unix seconds: samples up to then.
    end: Option<u64>,
}

/// `get_metrics()`: E2B's `SandboxMetric` list, from Corral's samples (every 5 s, the last
/// 10 minutes, and one of now).
async fn sandbox_metrics(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<Query<MetricsParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<Value>>, E2bError> {
    let tenant = tenant_of(&state, &headers).await?;
    let Query(params) = query.map_err(|e| E2bError::bad_request(e.body_text()))?;
    let service = state.service.clone();
    let metrics = blocking(service.admit(&tenant)?, move |call| {
        service.metrics(call, &id)
    })
    .await?;
    let listed = metrics
        .iter()
        .filter(|m| {
            params.start.is_none_or(|s| m.timestamp_unix >= s)
                && params.end.is_none_or(|e| m.timestamp_unix <= e)
        })
        .map(|m| {
            json!({
                "timestamp": m.timestamp,
                "timestampUnix": m.timestamp_unix,
                "cpuCount": m.cpu_count,
                "cpuUsedPct": m.cpu_used_pct,
                "memUsed": m.memory_used_bytes,
                "memTotal": m.memory_limit_bytes,
                "memCache": m.memory_cache_bytes,
                "diskUsed": m.disk_used_bytes,
                "diskTotal": m.disk_total_bytes,
            })
        })
        .collect();
    Ok(Json(listed))
}

async fn kill_sandbox(
    State(state): State<AppState>,
    Extension(registry): Extension<Arc<Registry>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let tenant = tenant_of(&state, &headers).await?;
    let service = state.service.clone();
    let (owner, sandbox) = (tenant.clone(), id.clone());
    let killed = blocking(service.admit_unmetered(&owner), move |call| {
        service.kill(call, &sandbox)
    })
    .await;
    if registry.lookup(&tenant, &id).is_some() {
        registry.forget(&id);
    }
    killed?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
struct Timeout {
    /// Seconds from now.
    timeout: u64,
}

/// `Sandbox.set_timeout(n)`: the session now expires `n` seconds after its last use.
async fn set_timeout(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode, E2bError> {
    let tenant = tenant_of(&state, &headers).await?;
    let req: Timeout = parse_json(&body).map_err(E2bError::bad_request)?;
    let service = state.service.clone();
    blocking(service.admit(&tenant)?, move |call| {
        service.set_idle_timeout(call, &id, req.timeout)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

// ---------------------------------------------------------------------------------------
// Sandbox plane

/// A sandbox-plane request's sandbox: named by `E2b-Sandbox-Id`, with the right
/// `X-Access-Token`, and still alive.
struct PlaneSandbox {
    id: String,
    tenant: Tenant,
}

impl FromRequestParts<AppState> for PlaneSandbox {
    type Rejection = E2bError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, E2bError> {
        let registry = parts
            .extensions
            .get::<Arc<Registry>>()
            .cloned()
            .ok_or_else(|| ApiError::internal("the E2B registry is missing"))?;
        let (id, tenant) = registry.authorize(&parts.headers)?;
        match state.service.get(&tenant, &id) {
            Ok(_) => Ok(PlaneSandbox { id, tenant }),
            Err(ServiceError::NotFound(_)) => {
                registry.forget(&id);
                Err(E2bError::not_running(&id))
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// envd's health check: 204 for a live sandbox; without `E2b-Sandbox-Id`, 204 for Corral.
async fn health(
    headers: HeaderMap,
    sandbox: Result<PlaneSandbox, E2bError>,
) -> Result<StatusCode, E2bError> {
    if headers.contains_key(SANDBOX_ID_HEADER) {
        sandbox?;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// The workspace path of an E2B path: relative paths and paths below `/home/user` or
/// `/workspace` are workspace paths; the workspace's own checks (no `..`, no links) follow.
fn workspace_path(path: &str) -> Result<String, E2bError> {
    for root in [E2B_HOME, WORKSPACE] {
        if let Some(rest) = path.strip_prefix(root) {
            if rest.is_empty() {
                return Ok(String::new());
            }
            if let Some(rest) = rest.strip_prefix('/') {
                return Ok(rest.to_string());
            }
        }
    }
    if path.starts_with('/') {
        return Err(E2bError::bad_request(format!(
            "{path}: only paths in the workspace ({E2B_HOME} or {WORKSPACE}, or relative) are reachable"
        )));
    }
    Ok(path.to_string())
}

/// A working directory inside the sandbox: E2B's home and relative paths are mapped onto the
/// workspace, other absolute paths are kept.
fn sandbox_cwd(cwd: &str) -> String {
    if cwd.starts_with('/') {
        match cwd.strip_prefix(E2B_HOME) {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("{WORKSPACE}{rest}"),
            _ => cwd.to_string(),
        }
    } else {
        format!("{WORKSPACE}/{cwd}")
    }
}

#[derive(Debug, Deserialize)]
struct FileQuery {
    path: Option<String>,
}

fn file_query(
    query: Result<Query<FileQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<FileQuery, E2bError> {
    query
        .map(|Query(q)| q)
        .map_err(|e| E2bError::bad_request(e.body_text()))
}

/// `files.read`: the raw bytes of a workspace file.
async fn read_file(
    State(state): State<AppState>,
    sandbox: PlaneSandbox,
    query: Result<Query<FileQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, E2bError> {
    let path = file_query(query)?
        .path
        .ok_or_else(|| E2bError::bad_request("the path query parameter is required"))?;
    let rel = workspace_path(&path)?;
    let service = state.service.clone();
    let file = blocking(service.admit(&sandbox.tenant)?, move |call| {
        service.open_file(call, &sandbox.id, &rel)
    })
    .await?;
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(file));
    Ok((
        // A download, never a page: whatever the sandbox wrote, a browser saves it rather
        // than shows it in the API's origin (docs/console.md, "Origins").
        [
            (header::CONTENT_TYPE, "application/octet-stream"),
            (header::CONTENT_DISPOSITION, "attachment"),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

fn multipart_error(status: StatusCode, text: String) -> E2bError {
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        E2bError::new(status, "the upload is over the size limit")
    } else {
        E2bError::bad_request(format!("reading the multipart body: {text}"))
    }
}

/// `files.write`: every multipart `file` part is streamed into the workspace (as the native
/// upload is), at the `path` query parameter when there is one, else at the part's file name.
async fn write_files(
    State(state): State<AppState>,
    sandbox: PlaneSandbox,
    query: Result<Query<FileQuery>, axum::extract::rejection::QueryRejection>,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<Json<Vec<Value>>, E2bError> {
    let query = file_query(query)?;
    let mut multipart = multipart.map_err(|e| multipart_error(e.status(), e.body_text()))?;
    let _slot = state.service.admit_upload(&sandbox.tenant).await?;
    let max_body_bytes = state.service.config().max_body_bytes as u64;
    let mut written = Vec::new();
    while let Some(field) = multipart
        .next_field()
        .await
        .map_err(|e| multipart_error(e.status(), e.body_text()))?
    {
        if field.name() != Some("file") {
            continue;
        }
        let path = query
            .path
            .clone()
            .or_else(|| field.file_name().map(str::to_string))
            .ok_or_else(|| E2bError::bad_request("a file part without a path or file name"))?;
        let rel = workspace_path(&path)?;
        let service = state.service.clone();
        let (tenant, id) = (sandbox.tenant.clone(), sandbox.id.clone());
        let write = service.admit(&tenant)?;
        let upload = blocking(service.admit(&tenant)?, move |call| {
            service.prepare_upload(call, &id, &rel, None)
        })
        .await?;
        let entry = match stream_upload(upload, write, field, max_body_bytes).await {
            (Err(e), _) if e.is_refused_upload() => return Err(e.into()),
            (_, Some(e)) => return Err(multipart_error(e.status(), e.body_text())),
            (entry, None) => entry?,
        };
        let name = entry
            .path
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        written.push(json!({
            "name": name,
            "type": "file",
            "path": format!("{WORKSPACE}/{}", entry.path),
        }));
    }
    if written.is_empty() {
        return Err(E2bError::bad_request("no multipart part named `file`"));
    }
    Ok(Json(written))
}

fn json_line(value: &impl Serialize) -> Bytes {
    let mut line = serde_json::to_vec(value).expect("JSON values serialize");
    line.push(b'\n');
    Bytes::from(line)
}

fn timestamp() -> String {
    humantime::format_rfc3339_micros(SystemTime::now()).to_string()
}

/// The E2B line of an execution event, made from borrowed parts (a large result or error is
/// copied once, into its line); `End` has none (the stream ends with `number_of_executions`
/// and `end_of_execution`).
fn execution_line(event: &Event) -> Option<Bytes> {
    #[derive(Serialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    enum Line<'a> {
        Stdout {
            text: &'a str,
            timestamp: String,
        },
        Stderr {
            text: &'a str,
            timestamp: String,
        },
        Result {
            is_main_result: bool,
            #[serde(skip_serializing_if = "Option::is_none")]
            text: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            html: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            png: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            svg: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            json: Option<&'a Value>,
            #[serde(skip_serializing_if = "Option::is_none")]
            markdown: Option<&'a str>,
        },
        Error {
            name: &'a str,
            value: &'a str,
            traceback: &'a str,
        },
    }
    let line = match event {
        Event::Stdout { text } => Line::Stdout {
            text,
            timestamp: timestamp(),
        },
        Event::Stderr { text } => Line::Stderr {
            text,
            timestamp: timestamp(),
        },
        Event::Result(r) => Line::Result {
            is_main_result: r.is_main_result,
            // E2B's Jupyter server shows a string value without its quotes ('abc' → abc).
            text: r.text.as_deref().map(|text| {
                text.strip_prefix('\'')
                    .and_then(|t| t.strip_suffix('\''))
                    .unwrap_or(text)
            }),
            html: r.html.as_deref(),
            png: r.png.as_deref(),
            svg: r.svg.as_deref(),
            json: r.json.as_ref(),
            markdown: r.markdown.as_deref(),
        },
        Event::Error(e) => Line::Error {
            name: &e.name,
            value: &e.value,
            traceback: &e.traceback,
        },
        Event::End(_) => return None,
    };
    Some(json_line(&line))
}

/// An `error` line for an execution that failed without a language error (timeout, memory
/// limit, a dead kernel), so that the SDK's `execution.error` says what happened.
fn status_error_line(end: &End) -> Option<Value> {
    let name = match end.status {
        Status::Success => return None,
        Status::Error => "ExecutionError",
        Status::Timeout => "TimeoutError",
        Status::MemoryLimit => "MemoryLimitError",
        Status::SandboxError => "SandboxError",
    };
    let value = end
        .error_message
        .clone()
        .unwrap_or_else(|| format!("the execution ended with status {name}"));
    Some(json!({"type": "error", "name": name, "value": value, "traceback": ""}))
}

/// `run_code`'s request: in context `context_id`, else in `language`'s default context;
/// `env_vars` are set for this execution only.
#[derive(Debug, Deserialize)]
struct RunCode {
    code: String,
    context_id: Option<String>,
    language: Option<String>,
    env_vars: Option<BTreeMap<String, String>>,
}

/// `run_code`: NDJSON lines in the Jupyter server's format, one object per line.
async fn execute(
    State(state): State<AppState>,
    sandbox: Result<PlaneSandbox, E2bError>,
    body: Bytes,
) -> Result<Response, E2bError> {
    // Refused only now that the body is read: a connection whose request was not read to its
    // end is closed, and the client's next request on it cut off.
    let sandbox = sandbox?;
    let req: RunCode = parse_json(&body).map_err(E2bError::bad_request)?;
    let PlaneSandbox { id, tenant } = sandbox;
    let run = ExecuteRequest {
        code: req.code,
        language: req.language.clone(),
        timeout_s: None,
        env: req.env_vars.filter(|e| !e.is_empty()),
        context: req.context_id.clone(),
    };
    // One admission and one check of the session, on the thread the execution then runs on.
    let call = state.service.admit(&tenant)?;
    let (call, checked) = {
        let (service, id) = (state.service.clone(), id.clone());
        crate::threads::run(call, move |call| {
            let checked = service.prepare_execute(&call, &id, run);
            (call, checked)
        })
        .await
        .map_err(|e| ApiError::internal(format!("internal error: {e}")))?
    };
    let prepared = match checked {
        Ok(prepared) => prepared,
        Err(ServiceError::UnsupportedLanguage(reason)) => {
            let language = req.language.unwrap_or_default();
            return Err(Unsupported::Language { language, reason }.into());
        }
        Err(e) => return Err(e.into()),
    };
    let service = state.service.clone();
    let (gone_service, gone_id) = (service.clone(), id.clone());
    Ok(stream_frames(
        "application/x-ndjson",
        call,
        move |call, emit| {
            // The run's `end` says how it ended: a status other than success becomes an
            // `error` line, unless the code raised one itself.
            let (mut saw_error, mut end) = (false, None);
            let outcome = service.execute(call, prepared, &mut |event| match event {
                Event::End(e) => end = Some(e.clone()),
                _ => {
                    if let Some(line) = execution_line(event) {
                        saw_error |= matches!(event, Event::Error(_));
                        emit(line);
                    }
                }
            });
            let (failure, reservation) = match outcome {
                // The lines of the results hold their room until the stream is gone.
                Ok(mut result) => (
                    end.as_ref()
                        .and_then(status_error_line)
                        .filter(|_| !saw_error),
                    std::mem::take(&mut result.reservation),
                ),
                Err(e) => (
                    Some(json!({
                        "type": "error", "name": "SandboxError", "value": e.to_string(), "traceback": "",
                    })),
                    Reservation::default(),
                ),
            };
            if let Some(line) = failure {
                emit(json_line(&line));
            }
            if let Ok(info) = service.get(&tenant, &id) {
                emit(json_line(&json!({
                    "type": "number_of_executions", "execution_count": info.executions,
                })));
            }
            emit(json_line(&json!({"type": "end_of_execution"})));
            reservation
        },
        move |call| {
            let _ = gone_service.interrupt(call, &gone_id);
        },
    ))
}

/// A Connect error: `{"code": "<connect code>", "message": "..."}`.
fn connect_error(code: Code, message: impl Into<String>) -> Value {
    json!({"code": code.as_str(), "message": message.into()})
}

/// A unary Connect call that fails: the HTTP status of `code`, and the error as JSON.
fn connect_unary_error(code: Code, message: impl Into<String>) -> Response {
    (code.http_status(), Json(connect_error(code, message))).into_response()
}

fn connect_error_of(e: &ServiceError) -> Value {
    connect_error(connect_code_of(e), e.to_string())
}

/// The Connect code of a service error.
fn connect_code_of(e: &ServiceError) -> Code {
    match e {
        ServiceError::BadRequest(_)
        | ServiceError::InvalidPath(_)
        | ServiceError::UnknownImage(_)
        | ServiceError::UnsupportedLanguage(_) => Code::InvalidArgument,
        ServiceError::NotFound(_) | ServiceError::FileNotFound(_) => Code::NotFound,
        ServiceError::FileExists(_) => Code::AlreadyExists,
        ServiceError::SandboxDead(_) | ServiceError::Conflict { .. } => Code::FailedPrecondition,
        ServiceError::Forbidden(_) => Code::PermissionDenied,
        ServiceError::TooManySandboxes { .. }
        | ServiceError::KeyBusy { .. }
        | ServiceError::PayloadTooLarge(_)
        | ServiceError::InsufficientStorage(_) => Code::ResourceExhausted,
        ServiceError::Sandbox(_) => Code::Internal,
        ServiceError::Unavailable { .. } | ServiceError::ShuttingDown => Code::Unavailable,
        // Only a creation asks for a network, and that is no RPC.
        ServiceError::NetworkNotAllowed(_) => Code::InvalidArgument,
        ServiceError::Process(e) => process::connect_code(e),
    }
}

fn connect_message(value: &Value) -> Bytes {
    connect::encode(
        0,
        &serde_json::to_vec(value).expect("JSON values serialize"),
    )
}

fn connect_end_of_stream(error: Option<Value>) -> Bytes {
    let trailer = match error {
        Some(error) => json!({"error": error}),
        None => json!({}),
    };
    connect::encode(
        FLAG_END_STREAM,
        &serde_json::to_vec(&trailer).expect("JSON values serialize"),
    )
}

/// A Connect stream that fails before it starts: 200 with only the end-of-stream message.
fn connect_failure(error: Value) -> Response {
    (
        [(header::CONTENT_TYPE, CONNECT_JSON)],
        connect_end_of_stream(Some(error)),
    )
        .into_response()
}

/// A signal as envd's status says it (Go's `ProcessState`: "signal: killed").
fn signal_name(signal: i32) -> String {
    use nix::sys::signal::Signal;
    let name = match Signal::try_from(signal) {
        Ok(Signal::SIGKILL) => "killed",
        Ok(Signal::SIGTERM) => "terminated",
        Ok(Signal::SIGINT) => "interrupt",
        Ok(Signal::SIGSEGV) => "segmentation fault",
        Ok(Signal::SIGABRT) => "aborted",
        Ok(Signal::SIGXCPU) => "CPU time limit exceeded",
        Ok(Signal::SIGXFSZ) => "file size limit exceeded",
        _ => return format!("signal {signal}"),
    };
    name.to_string()
}

/// The command timeout a Connect client asks for (`connect-timeout-ms`), in seconds.
fn connect_timeout_s(headers: &HeaderMap) -> Option<f64> {
    let ms: u64 = headers
        .get("connect-timeout-ms")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (ms > 0).then(|| (ms as f64 / 1000.0).min(24.0 * 3600.0))
}

/// Reads the one request message of a server-streaming call, from a body of any chunking.
async fn read_request_message(body: Body, max_len: usize) -> Result<Vec<u8>, Value> {
    let invalid = |m: String| connect_error(Code::InvalidArgument, m);
    let mut decoder = Decoder::new(max_len);
    let mut messages = Vec::new();
    let mut chunks = body.into_data_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| invalid(format!("reading the request body: {e}")))?;
        decoder
            .push(&chunk, &mut messages)
            .map_err(|e| invalid(e.to_string()))?;
        if messages.len() > 1 {
            return Err(invalid("a server-streaming call takes one message".into()));
        }
    }
    decoder.finish().map_err(|e| invalid(e.to_string()))?;
    match messages.pop() {
        Some(m) if m.flags == 0 => Ok(m.payload),
        Some(_) => Err(invalid("the request message has unexpected flags".into())),
        None => Err(invalid("the request has no message".into())),
    }
}

fn unimplemented_rpc(service: &'static str, method: String) -> Response {
    let e = Unsupported::Rpc { service, method };
    connect_unary_error(Code::Unimplemented, e.to_string())
}

// ---------------------------------------------------------------------------------------
// envd's filesystem service

/// The `filesystem.Filesystem` RPCs served (Connect unary, JSON codec).
const FILESYSTEM_METHODS: &[&str] = &[
    "Stat",
    "ListDir",
    "MakeDir",
    "Move",
    "Remove",
    "CreateWatcher",
    "GetWatcherEvents",
    "RemoveWatcher",
];

/// A `filesystem.*` request: every field any of the served calls takes, in protobuf-JSON
/// (lowerCamelCase, or the proto's snake_case names); absent fields are their defaults.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct FilesystemRequest {
    path: String,
    depth: u32,
    source: String,
    destination: String,
    recursive: bool,
    #[serde(alias = "watcher_id", rename = "watcherId")]
    watcher_id: String,
}

/// A failed filesystem call, as the Connect error it is answered with.
struct RpcError(Code, String);

impl From<ServiceError> for RpcError {
    fn from(e: ServiceError) -> RpcError {
        RpcError(connect_code_of(&e), e.to_string())
    }
}

/// The workspace path of an E2B path in a filesystem call: other absolute paths are
/// `invalid_argument` (the SDK raises `InvalidArgumentException`, never "not found").
fn rpc_path(path: &str) -> Result<String, RpcError> {
    workspace_path(path).map_err(|e| RpcError(Code::InvalidArgument, e.message))
}

/// An entry's path as the sandbox sees it.
fn sandbox_path(rel: &std::path::Path) -> String {
    if rel.as_os_str().is_empty() {
        WORKSPACE.to_string()
    } else {
        format!("{WORKSPACE}/{}", rel.display())
    }
}

/// A file's permissions as envd writes them (Go's `FileMode.String()`: type letters, or `-`,
/// then `rwxrwxrwx`).
fn permissions_string(mode: u32) -> String {
    let mut out = String::new();
    match mode & libc::S_IFMT {
        libc::S_IFDIR => out.push('d'),
        libc::S_IFLNK => out.push('L'),
        libc::S_IFBLK => out.push('D'),
        libc::S_IFIFO => out.push('p'),
        libc::S_IFSOCK => out.push('S'),
        libc::S_IFCHR => out.push_str("Dc"),
        _ => {}
    }
    for (bit, letter) in [
        (libc::S_ISUID, 'u'),
        (libc::S_ISGID, 'g'),
        (libc::S_ISVTX, 't'),
    ] {
        if mode & bit != 0 {
            out.push(letter);
        }
    }
    if out.is_empty() {
        out.push('-');
    }
    for (i, letter) in "rwxrwxrwx".chars().enumerate() {
        out.push(if mode & (0o400 >> i) != 0 {
            letter
        } else {
            '-'
        });
    }
    out
}

/// A modification time in protobuf-JSON (RFC 3339); one the sandbox set outside what that
/// can say (before 1970, after 9999) is clamped.
fn proto_timestamp((secs, nanos): (i64, u32)) -> String {
    const MAX_SECS: i64 = 253_402_300_799; // 9999-12-31T23:59:59Z
    let at = match u64::try_from(secs.min(MAX_SECS)) {
        Ok(s) => SystemTime::UNIX_EPOCH + std::time::Duration::new(s, nanos.min(999_999_999)),
        Err(_) => SystemTime::UNIX_EPOCH,
    };
    humantime::format_rfc3339_nanos(at).to_string()
}

/// An `EntryInfo` as envd returns it. Owners are named as the sandbox sees them: its user is
/// `user` (E2B's), 0 is `root`, other ids are numbers. A link is a link (`FILE_TYPE_SYMLINK`,
/// `isSymlink`) with its target as stored: the host never resolves it.
fn entry_json(entry: &EntryInfo, user: (u32, u32)) -> Value {
    let name_of = |id: u32, user_id: u32| match id {
        _ if id == user_id => "user".to_string(),
        0 => "root".to_string(),
        id => id.to_string(),
    };
    let path = sandbox_path(&entry.path);
    let name = path.rsplit('/').next().unwrap_or_default().to_string();
    let kind = match entry.kind {
        EntryKind::File => "FILE_TYPE_FILE",
        EntryKind::Dir => "FILE_TYPE_DIRECTORY",
        EntryKind::Symlink => "FILE_TYPE_SYMLINK",
        EntryKind::Other => "FILE_TYPE_UNSPECIFIED",
    };
    let mut info = json!({
        "name": name,
        "type": kind,
        "path": path,
        "size": entry.size.to_string(),
        "mode": entry.mode & 0o777,
        "permissions": permissions_string(entry.mode),
        "owner": name_of(entry.uid, user.0),
        "group": name_of(entry.gid, user.1),
        "modifiedTime": proto_timestamp(entry.modified),
    });
    if let Some(target) = &entry.link_target {
        info["symlinkTarget"] = json!(target.to_string_lossy());
        info["isSymlink"] = json!(true);
    }
    info
}

/// envd's `filesystem.Filesystem` RPCs on the workspace: `Stat`, `ListDir`, `MakeDir`,
/// `Move`, `Remove` and the polling watchers (`CreateWatcher`, `GetWatcherEvents`,
/// `RemoveWatcher`), Connect unary with the JSON codec. Every path goes through the
/// workspace's checks (no `..`, never through a link). The streaming `WatchDir` has its
/// own route ([`watch_dir::watch_dir`]); other methods are `unimplemented`, whatever the
/// sandbox.
async fn filesystem_rpc(
    State(state): State<AppState>,
    Extension(registry): Extension<Arc<Registry>>,
    Path(method): Path<String>,
    sandbox: Result<PlaneSandbox, E2bError>,
    body: Bytes,
) -> Result<Response, E2bError> {
    if !FILESYSTEM_METHODS.contains(&method.as_str()) {
        return Ok(unimplemented_rpc(FILESYSTEM_SERVICE, method));
    }
    let sandbox = sandbox?; // once the body is read (see `execute`)
    let req: FilesystemRequest = match parse_json(&body) {
        Ok(req) => req,
        Err(e) => {
            return Ok(connect_unary_error(
                Code::InvalidArgument,
                format!("{method}Request: {e}"),
            ))
        }
    };
    let service = state.service.clone();
    let call = service.admit(&sandbox.tenant)?;
    let answer = crate::threads::run(call, move |call| {
        filesystem_call(&service, &call, &registry, &sandbox, &method, req)
    })
    .await
    .map_err(|e| ApiError::internal(format!("internal error: {e}")))?;
    Ok(match answer {
        Ok(value) => Json(value).into_response(),
        Err(RpcError(code, message)) => connect_unary_error(code, message),
    })
}

fn filesystem_call(
    service: &Service,
    call: &Admitted,
    registry: &Registry,
    sandbox: &PlaneSandbox,
    method: &str,
    req: FilesystemRequest,
) -> Result<Value, RpcError> {
    let PlaneSandbox { id, .. } = sandbox;
    let user = || service.sandbox_user(call, id).map_err(RpcError::from);
    match method {
        "Stat" => {
            let entry = service.stat(call, id, &rpc_path(&req.path)?)?;
            Ok(json!({"entry": entry_json(&entry, user()?)}))
        }
        "ListDir" => {
            let dir = rpc_path(&req.path)?;
            let depth = (req.depth as usize).max(1);
            let entries = service.list_dir(call, id, &dir, depth)?;
            let user = user()?;
            let entries: Vec<Value> = entries.iter().map(|e| entry_json(e, user)).collect();
            Ok(json!({"entries": entries}))
        }
        "MakeDir" => {
            let path = rpc_path(&req.path)?;
            if !service.make_dir(call, id, &path)? {
                return Err(RpcError(
                    Code::AlreadyExists,
                    format!("directory already exists: {}", req.path),
                ));
            }
            let entry = service.stat(call, id, &path)?;
            Ok(json!({"entry": entry_json(&entry, user()?)}))
        }
        "Move" => {
            let (from, to) = (rpc_path(&req.source)?, rpc_path(&req.destination)?);
            let entry = service.move_path(call, id, &from, &to)?;
            Ok(json!({"entry": entry_json(&entry, user()?)}))
        }
        "Remove" => match service.remove_path(call, id, &rpc_path(&req.path)?) {
            // As envd (`os.RemoveAll`): nothing there is nothing to do.
            Ok(()) | Err(ServiceError::FileNotFound(_)) => Ok(json!({})),
            Err(e) => Err(e.into()),
        },
        "CreateWatcher" => {
            let watcher_id =
                create_watcher(service, call, registry, sandbox, &req.path, req.recursive)?;
            Ok(json!({"watcherId": watcher_id}))
        }
        "GetWatcherEvents" => {
            let turn = service
                .watch_scans()
                .turn_within(&sandbox.tenant.0, watch_dir::TURN_WAIT);
            let events = poll_watcher(service, call, registry, sandbox, &req.watcher_id, turn)?;
            let events: Vec<Value> = events.iter().map(|(n, k)| event_json(n, *k)).collect();
            Ok(json!({"events": events}))
        }
        "RemoveWatcher" => {
            registry.remove_watcher(id, &req.watcher_id)?;
            Ok(json!({}))
        }
        _ => unreachable!("only FILESYSTEM_METHODS are called"),
    }
}

/// A control-plane call Corral does not serve: 501 once the key is checked.
async fn refuse(
    State(state): State<AppState>,
    headers: HeaderMap,
    _body: Bytes,
    what: Unsupported,
) -> E2bError {
    match tenant_of(&state, &headers).await {
        Ok(_) => what.into(),
        Err(e) => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_sandbox::ExecutionResult;

    #[test]
    fn e2b_paths_map_onto_the_workspace() {
        assert_eq!(workspace_path("data.txt").unwrap(), "data.txt");
        assert_eq!(workspace_path("sub/data.txt").unwrap(), "sub/data.txt");
        assert_eq!(workspace_path("/home/user/data.txt").unwrap(), "data.txt");
        assert_eq!(workspace_path("/home/user/a/b.csv").unwrap(), "a/b.csv");
        assert_eq!(workspace_path("/workspace/out.png").unwrap(), "out.png");
        assert_eq!(workspace_path("/workspace").unwrap(), "");
        // `..` stays in the path for the workspace's own checks to refuse.
        assert_eq!(workspace_path("../etc/passwd").unwrap(), "../etc/passwd");
        for outside in [
            "/etc/passwd",
            "/home/username/x",
            "/workspaces/x",
            "/",
            "/tmp/x",
        ] {
            let err = workspace_path(outside).unwrap_err();
            assert_eq!(err.status, StatusCode::BAD_REQUEST, "{outside}");
        }
    }

    #[test]
    fn working_directories_map_onto_the_workspace() {
        assert_eq!(sandbox_cwd("/home/user"), "/workspace");
        assert_eq!(sandbox_cwd("/home/user/proj"), "/workspace/proj");
        assert_eq!(sandbox_cwd("proj"), "/workspace/proj");
        assert_eq!(sandbox_cwd("/tmp"), "/tmp");
        assert_eq!(sandbox_cwd("/home/username"), "/home/username");
    }

    #[test]
    fn templates_of_e2b_mean_the_default_image() {
        assert_eq!(image_of_template("code-interpreter-v1"), None);
        assert_eq!(image_of_template("base"), None);
        assert_eq!(image_of_template("default"), Some("default".into()));
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(tokens_match(b"secret", b"secret"));
        assert!(!tokens_match(b"secret", b"secreT"));
        assert!(!tokens_match(b"secret", b"secre"));
        assert!(!tokens_match(b"secret", b""));
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn the_sandbox_plane_needs_a_known_sandbox_and_its_token() {
        let registry = Registry::default();
        let token = registry.register("sbx-1", Tenant("k1".into()), "base".into());
        assert_eq!(token.len(), 64);
        assert_ne!(
            token,
            registry.register("sbx-2", Tenant("k1".into()), "base".into())
        );

        let ok = registry
            .authorize(&headers(&[
                ("e2b-sandbox-id", "sbx-1"),
                ("x-access-token", &token),
            ]))
            .unwrap();
        assert_eq!(ok, ("sbx-1".to_string(), Tenant("k1".into())));

        // A wrong or missing token, even another sandbox's, is answered as an unknown id.
        let other = registry.register("sbx-3", Tenant("k2".into()), "base".into());
        for presented in [
            &[("x-access-token", "nope")][..],
            &[],
            &[("x-access-token", &other)],
        ] {
            let mut sent = vec![("e2b-sandbox-id", "sbx-1")];
            sent.extend_from_slice(presented);
            let refused = registry.authorize(&headers(&sent)).unwrap_err();
            assert_eq!(refused, E2bError::not_running("sbx-1"), "{presented:?}");
        }

        let unknown = registry
            .authorize(&headers(&[
                ("e2b-sandbox-id", "sbx-9"),
                ("x-access-token", &token),
            ]))
            .unwrap_err();
        assert_eq!(unknown, E2bError::not_running("sbx-9"));
        assert_eq!(unknown.status, StatusCode::BAD_GATEWAY);
        assert!(unknown.message.contains("was not found"));

        let no_header = registry.authorize(&headers(&[])).unwrap_err();
        assert_eq!(no_header.status, StatusCode::NOT_FOUND);

        registry.forget("sbx-1");
        let forgotten = registry
            .authorize(&headers(&[
                ("e2b-sandbox-id", "sbx-1"),
                ("x-access-token", &token),
            ]))
            .unwrap_err();
        assert_eq!(forgotten.status, StatusCode::BAD_GATEWAY);

        registry.prune(|_, id| id != "sbx-2");
        assert!(registry.lookup(&Tenant("k1".into()), "sbx-2").is_none());
    }

    #[tokio::test]
    async fn unsupported_calls_are_501_or_unimplemented_and_say_so() {
        let every = [
            Unsupported::Fork,
            Unsupported::Snapshots,
            Unsupported::Network,
            Unsupported::Language {
                language: "r".into(),
                reason: "sandbox s runs python, not r".into(),
            },
        ];
        for e in every {
            let (status, body) = body_json(E2bError::from(e.clone()).into_response()).await;
            assert_eq!(status, StatusCode::NOT_IMPLEMENTED, "{e:?}");
            assert_eq!(body["code"], 501);
            assert!(e.to_string().contains("not supported by Corral"), "{e}");
        }
        for (service, method) in [(PROCESS_SERVICE, "Nope"), (FILESYSTEM_SERVICE, "Nope")] {
            let response = unimplemented_rpc(service, method.into());
            assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
            let (status, body) = body_json(response).await;
            assert_eq!(status, StatusCode::NOT_IMPLEMENTED);
            assert_eq!(body["code"], "unimplemented");
            let message = body["message"].as_str().unwrap();
            assert!(message.contains("not supported by Corral"), "{message}");
            assert!(
                message.contains(&format!("{service}/{method}")),
                "{message}"
            );
        }
    }

    #[test]
    fn lookups_are_per_tenant() {
        let registry = Registry::default();
        let token = registry.register("sbx-1", Tenant("k1".into()), "base".into());
        assert_eq!(
            registry.lookup(&Tenant("k1".into()), "sbx-1"),
            Some((token, "base".into()))
        );
        assert_eq!(registry.lookup(&Tenant("k2".into()), "sbx-1"), None);
    }

    async fn body_json(response: Response) -> (StatusCode, Value) {
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn errors_have_e2b_shape() {
        let (status, body) = body_json(E2bError::not_running("sbx-1").into_response()).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY);
        assert_eq!(
            body,
            json!({"code": 502, "message": "The sandbox sbx-1 was not found"})
        );

        let busy = E2bError::from(ServiceError::TooManySandboxes {
            message: "too many".into(),
            retry_after_s: 7,
        });
        let response = busy.into_response();
        assert_eq!(response.headers()[header::RETRY_AFTER], "7");
        let (status, body) = body_json(response).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(body, json!({"code": 429, "message": "too many"}));

        let (status, body) = body_json(
            E2bError::from(ServiceError::FileNotFound("no file x".into())).into_response(),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body, json!({"code": 404, "message": "no file x"}));
    }

    #[test]
    fn execution_events_become_jupyter_lines() {
        let line = |event: &Event| {
            execution_line(event).map(|bytes| serde_json::from_slice::<Value>(&bytes).unwrap())
        };
        let stdout = line(&Event::Stdout {
            text: "hi\n".into(),
        })
        .unwrap();
        assert_eq!(stdout["type"], "stdout");
        assert_eq!(stdout["text"], "hi\n");
        let ts = stdout["timestamp"].as_str().unwrap();
        assert!(humantime::parse_rfc3339(ts).is_ok(), "{ts}");

        let result = corral_sandbox::RichResult {
            is_main_result: true,
            text: Some("42".into()),
            html: None,
            png: Some("iVBORw0KGgo=".into()),
            svg: None,
            json: None,
            markdown: None,
        };
        assert_eq!(
            line(&Event::Result(result)).unwrap(),
            json!({"type": "result", "is_main_result": true, "text": "42", "png": "iVBORw0KGgo="})
        );

        let quoted = corral_sandbox::RichResult {
            is_main_result: true,
            text: Some("'abc'".into()),
            html: None,
            png: None,
            svg: None,
            json: None,
            markdown: None,
        };
        assert_eq!(line(&Event::Result(quoted)).unwrap()["text"], "abc");

        let error = corral_sandbox::LanguageError {
            name: "ZeroDivisionError".into(),
            value: "division by zero".into(),
            traceback: "Traceback ...".into(),
            violations: Vec::new(),
        };
        assert_eq!(
            line(&Event::Error(error)).unwrap(),
            json!({"type": "error", "name": "ZeroDivisionError", "value": "division by zero",
                   "traceback": "Traceback ..."})
        );
        let end = Event::End(End::of(&ExecutionResult::sandbox_error("gone")));
        assert_eq!(line(&end), None);

        let end = json_line(&json!({"type": "end_of_execution"}));
        assert!(end.ends_with(b"}\n") && !end[..end.len() - 1].contains(&b'\n'));
    }

    #[test]
    fn failures_without_a_language_error_are_reported() {
        let mut result = ExecutionResult::sandbox_error("the kernel died");
        assert_eq!(
            status_error_line(&End::of(&result)).unwrap(),
            json!({"type": "error", "name": "SandboxError", "value": "the kernel died", "traceback": ""})
        );
        result.status = Status::Timeout;
        assert_eq!(
            status_error_line(&End::of(&result)).unwrap()["name"],
            "TimeoutError"
        );
        result.status = Status::Success;
        assert_eq!(status_error_line(&End::of(&result)), None);
    }

    #[test]
    fn connect_timeouts_come_from_the_header() {
        assert_eq!(
            connect_timeout_s(&headers(&[("connect-timeout-ms", "60000")])),
            Some(60.0)
        );
        assert_eq!(
            connect_timeout_s(&headers(&[("connect-timeout-ms", "0")])),
            None
        );
        assert_eq!(connect_timeout_s(&headers(&[])), None);
        assert_eq!(
            connect_timeout_s(&headers(&[("connect-timeout-ms", "x")])),
            None
        );
    }

    #[tokio::test]
    async fn the_request_message_is_read_from_any_chunking() {
        let payload =
            br#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"]},"stdin":false}"#;
        let framed = connect::encode(0, payload);
        let chunks: Vec<Result<Bytes, std::convert::Infallible>> = framed
            .chunks(3)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let body = Body::from_stream(futures_util::stream::iter(chunks));
        let read = read_request_message(body, 1024).await.unwrap();
        assert_eq!(read, payload);
        let start: Value = serde_json::from_slice(&read).unwrap();
        assert_eq!(start["process"]["args"], json!(["-l", "-c", "echo hi"]));

        let err = read_request_message(Body::from(framed.clone()), 8)
            .await
            .unwrap_err();
        assert_eq!(err["code"], "invalid_argument");
        let err = read_request_message(Body::empty(), 8).await.unwrap_err();
        assert!(err["message"].as_str().unwrap().contains("no message"));
        let mut two = framed.to_vec();
        two.extend_from_slice(&framed);
        let err = read_request_message(Body::from(two), 1024)
            .await
            .unwrap_err();
        assert!(err["message"].as_str().unwrap().contains("one message"));
    }

    #[tokio::test]
    async fn connect_failures_are_end_of_stream_messages() {
        let response = connect_failure(connect_error(Code::NotFound, "gone"));
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[header::CONTENT_TYPE], CONNECT_JSON);
        let bytes = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .unwrap();
        let mut decoder = Decoder::new(1024);
        let mut frames = Vec::new();
        decoder.push(&bytes, &mut frames).unwrap();
        decoder.finish().unwrap();
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].flags, FLAG_END_STREAM);
        let trailer: Value = serde_json::from_slice(&frames[0].payload).unwrap();
        assert_eq!(
            trailer,
            json!({"error": {"code": "not_found", "message": "gone"}})
        );
    }
}
