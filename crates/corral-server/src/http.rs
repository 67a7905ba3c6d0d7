//! The native HTTP API (docs/api.md) over [`Service`]: authentication, JSON bodies with clear
//! errors, NDJSON event streams, files, metrics, the OpenAPI document and the API page.

use parking_lot::Mutex;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

mod contexts;
mod openapi;
mod processes;
pub(crate) mod pump;

pub use corral_wire::close_if_body_unread;
pub use corral_wire::keys::{from_local_program, presented_key};
pub use processes::OutputEvent;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use corral_kernel::{End, Event, Stopper};
use corral_sandbox::{ExecutionResult, FileEntry, Reservation};
use futures_util::StreamExt as _;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use utoipa::OpenApi;

use crate::error::{ApiError, ErrorBody};
use crate::service::{
    Admitted, CommandRequest, CreateSandboxRequest, ExecuteRequest, ListQuery, RunRequest,
    SandboxInfo, SandboxMetric, Service, ServiceError, Tenant, Upload,
};

/// Events buffered per stream: a client that reads slowly holds at most this many.
const STREAM_BUFFER: usize = 64;
/// A client that reads nothing for this long is treated as gone and its execution interrupted.
const SLOW_CLIENT_LIMIT: Duration = Duration::from_secs(30);
/// Frames of an upload's body queued between the connection and the writer (beside the one
/// each of them holds): all the server buffers of an upload.
const UPLOAD_QUEUE: usize = 1;
/// After an upload failed (its file did not fit), how long the rest of its body is still read
/// and discarded, so that the client, still sending, can read the answer.
const UPLOAD_DRAIN: Duration = Duration::from_secs(10);
#[derive(Clone)]
pub struct AppState {
    pub service: Arc<Service>,
}

impl AppState {
    pub fn new(service: Arc<Service>) -> AppState {
        AppState { service }
    }
}

/// Runs an admitted call's engine work off the async runtime, on a blocking thread that holds
/// the call until the work is done (admit it with [`Service::admit`] before the work's inputs
/// move into it).
pub async fn blocking<T: Send + 'static>(
    call: Admitted,
    f: impl FnOnce(&Admitted) -> Result<T, ServiceError> + Send + 'static,
) -> Result<T, ApiError> {
    crate::threads::run(call, move |call| f(&call))
        .await
        .map_err(|e| ApiError::internal(format!("internal error: {e}")))?
        .map_err(ApiError::from)
}

/// [`blocking`] for the first step of a call that carries on (a stream after its checks): the
/// call comes back with the step's result, to hold the thread for the rest.
pub async fn blocking_step<T: Send + 'static>(
    call: Admitted,
    f: impl FnOnce(&Admitted) -> Result<T, ServiceError> + Send + 'static,
) -> Result<(Admitted, T), ApiError> {
    crate::threads::run(call, move |call| f(&call).map(|t| (call, t)))
        .await
        .map_err(|e| ApiError::internal(format!("internal error: {e}")))?
        .map_err(ApiError::from)
}

/// The tenant of a request: its key's, or `local` for a keyless request to a loopback server
/// that comes from a local program ([`from_local_program`]).
pub async fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<Tenant, ApiError> {
    match presented_key(headers)? {
        None if !state.service.config().requires_keys() => {
            if from_local_program(headers) {
                Ok(Tenant::local())
            } else {
                Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "forbidden",
                    "a request without a key must come from a local program or this server's \
                     console (a loopback Host, and no Origin but the server's own); send \
                     `Authorization: Bearer KEY`",
                ))
            }
        }
        None => Err(ApiError::unauthorized(
            "an API key is required: send `Authorization: Bearer KEY` (make one with `corral key create`)",
        )),
        Some(key) => {
            let service = state.service.clone();
            // Before the key is known: a short look-up, on the threads no key's budget takes.
            let thread = service.unmetered_thread();
            let id = crate::threads::spawn(thread, move || service.db().verify_key(&key))
                .await
                .map_err(|e| ApiError::internal(e.to_string()))?
                .map_err(|e| ApiError::internal(e.to_string()))?;
            id.map(Tenant)
                .ok_or_else(|| ApiError::unauthorized("unknown or revoked API key"))
        }
    }
}

impl FromRequestParts<AppState> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        authenticate(state, &parts.headers).await
    }
}

/// Parses a JSON request body; the error names the field at fault (`limits.timeout_s: invalid
/// type: string "x", expected f64 ...`), for every face of the server.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(body)).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            format!("invalid JSON body: {}", e.inner())
        } else {
            format!("invalid JSON body: `{path}`: {}", e.inner())
        }
    })
}

/// A JSON body whose problems are answered in the API's error format: 400 naming the field,
/// 413 when it is over the limit.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::payload_too_large("the request body is over the size limit")
            } else {
                ApiError::bad_request(format!("reading the request body: {}", e.body_text()))
            }
        })?;
        parse_json(&bytes)
            .map(ApiJson)
            .map_err(ApiError::bad_request)
    }
}

pub fn router(state: AppState) -> Router {
    let config = state.service.config().clone();
    let ports = crate::ports::Proxy::new(&config);
    // An upload's body streams; `Upload` bounds it (max_body_bytes and the sandbox's disk).
    let files = Router::new().route(
        "/v1/sandboxes/{id}/files/{*path}",
        get(read_file).put(write_file).delete(remove_file),
    );
    Router::new()
        .route("/v1/run", post(run))
        .route("/v1/sandboxes", post(create_sandbox).get(list_sandboxes))
        .route("/v1/sandboxes/{id}", get(get_sandbox).delete(kill_sandbox))
        .route("/v1/sandboxes/{id}/pause", post(pause_sandbox))
        .route("/v1/sandboxes/{id}/metrics", get(sandbox_metrics))
        .route("/v1/sandboxes/{id}/resume", post(resume_sandbox))
        .route("/v1/sandboxes/{id}/restart", post(restart_sandbox))
        .route("/v1/sandboxes/{id}/execute", post(execute))
        .route("/v1/sandboxes/{id}/commands", post(commands))
        .route(
            "/v1/sandboxes/{id}/contexts",
            post(contexts::create).get(contexts::list),
        )
        .route(
            "/v1/sandboxes/{id}/contexts/{context}",
            axum::routing::delete(contexts::remove),
        )
        .route(
            "/v1/sandboxes/{id}/contexts/{context}/restart",
            post(contexts::restart),
        )
        .route(
            "/v1/sandboxes/{id}/processes",
            post(processes::start).get(processes::list),
        )
        .route(
            "/v1/sandboxes/{id}/processes/{pid}/output",
            get(processes::output),
        )
        .route(
            "/v1/sandboxes/{id}/processes/{pid}/input",
            post(processes::input),
        )
        .route(
            "/v1/sandboxes/{id}/processes/{pid}/close-stdin",
            post(processes::close_stdin),
        )
        .route(
            "/v1/sandboxes/{id}/processes/{pid}/signal",
            post(processes::signal),
        )
        .route(
            "/v1/sandboxes/{id}/processes/{pid}/resize",
            post(processes::resize),
        )
        .route("/v1/sandboxes/{id}/files", get(list_files))
        // `files/` with nothing after it names no file: a bad path, not an unknown route.
        .route(
            "/v1/sandboxes/{id}/files/",
            axum::routing::any(|| async {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_path",
                    "no file path after files/ (e.g. files/data.csv)",
                )
            }),
        )
        .merge(crate::files_api::router())
        .layer(DefaultBodyLimit::max(config.max_json_bytes))
        .merge(files)
        .merge(crate::ports::router(ports.clone()))
        .merge(crate::e2b::router(&config))
        .merge(crate::operator::router())
        .merge(crate::console::router())
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .route("/docs", get(docs))
        .fallback(|| async { ApiError::not_found("no such route (see GET /docs)") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not take that method (see GET /docs)",
            )
        })
        .layer(axum::middleware::from_fn_with_state(
            crate::ports::HostRouting {
                app: state.clone(),
                proxy: ports,
            },
            crate::ports::by_host,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .layer(axum::middleware::from_fn(crate::console::security_headers))
        .layer(axum::middleware::from_fn(close_if_body_unread))
        .with_state(state)
}

async fn count_requests(
    State(state): State<AppState>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let response = next.run(req).await;
    state
        .service
        .metrics
        .http_requests
        .get_or_create(&crate::metrics::HttpLabels {
            status: response.status().as_u16(),
        })
        .inc();
    response
}

fn wants_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/json") && !v.contains("ndjson"))
}

/// Bytes that hold, until they are dropped, the room in the server's budget of rich results
/// of the results they were made of.
struct Held {
    bytes: Vec<u8>,
    _reservation: Reservation,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// Counts the bytes written to it.
#[derive(Default)]
struct Counter(usize);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `value` as JSON that holds `reservation` until the answer carrying it has been written or
/// dropped. Sized exactly first, so that it is held once, not in a buffer grown by doubling.
pub fn held_json(value: &impl Serialize, reservation: Reservation) -> Bytes {
    let mut counter = Counter::default();
    serde_json::to_writer(&mut counter, value).expect("results serialize");
    let mut bytes = Vec::with_capacity(counter.0);
    serde_json::to_writer(&mut bytes, value).expect("results serialize");
    Bytes::from_owner(Held {
        bytes,
        _reservation: reservation,
    })
}

/// A result object as the answer: its JSON holds the result's room in the server's budget
/// of rich results until it has been written, or dropped with the connection.
pub fn result_answer(mut result: ExecutionResult) -> Bytes {
    let reservation = std::mem::take(&mut result.reservation);
    held_json(&result, reservation)
}

fn json_response(body: Bytes) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Runs the blocking `work` of admitted `call` that emits frames and streams them as the
/// response body; when the client goes away, `on_gone` runs (it interrupts the work). What
/// `work` returns (the room of the results it streamed) is held by the body until it is
/// dropped: a client that does not read keeps holding it.
pub fn stream_frames(
    content_type: &'static str,
    call: Admitted,
    work: impl FnOnce(&Admitted, &mut dyn FnMut(Bytes)) -> Reservation + Send + 'static,
    on_gone: impl FnOnce(&Admitted) + Send + 'static,
) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(STREAM_BUFFER);
    let held = Arc::new(Mutex::new(Reservation::default()));
    let body_holds = held.clone();
    let (done_tx, done_rx) = oneshot::channel::<()>();
    let watcher = tx.clone();
    // The stop runs on a thread of no key's budget: there is one per admitted stream.
    let gone_call = call.unmetered_later();
    tokio::spawn(async move {
        tokio::select! {
            _ = watcher.closed() => {
                let _ = crate::threads::run(gone_call(), move |call| on_gone(&call)).await;
            }
            _ = done_rx => {}
        }
    });
    let runtime = tokio::runtime::Handle::current();
    crate::threads::run(call, move |call| {
        let mut open = true;
        let reservation = work(&call, &mut |frame| {
            if open {
                let sent =
                    runtime.block_on(tokio::time::timeout(SLOW_CLIENT_LIMIT, tx.send(frame)));
                open = matches!(sent, Ok(Ok(())));
            }
        });
        *held.lock() = reservation;
        drop(tx);
        let _ = done_tx.send(());
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx).map(
        move |frame| {
            let _held_until_the_body_is_dropped = &body_holds;
            Ok::<_, Infallible>(frame)
        },
    ));
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// The body of an upload as the blocking writer reads it: frames from a bounded queue.
struct QueuedBody {
    frames: mpsc::Receiver<std::io::Result<Bytes>>,
    current: Bytes,
}

impl std::io::Read for QueuedBody {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.frames.blocking_recv() {
                None => return Ok(0),
                Some(frame) => self.current = frame?,
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        bytes::Buf::advance(&mut self.current, n);
        Ok(n)
    }
}

/// Streams `body` into `upload`, written on a blocking thread, through a queue of
/// [`UPLOAD_QUEUE`] frames: the body is never held whole. Returns what the upload wrote, and
/// the body's own error if reading it failed (the client went away, or a limit of the
/// extractor), which the caller answers in its own terms; a client that sends nothing for
/// [`SLOW_CLIENT_LIMIT`] fails the upload (400). When the upload fails first, the
/// rest of the body (up to `max_body_bytes` in all, for [`UPLOAD_DRAIN`]) is read and
/// discarded before the answer, so that a client that sends all of its body before it reads
/// can read it.
pub(crate) async fn stream_upload<S, E>(
    upload: Upload,
    call: Admitted,
    mut body: S,
    max_body_bytes: u64,
) -> (Result<FileEntry, ServiceError>, Option<E>)
where
    S: futures_util::Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let (tx, frames) = mpsc::channel(UPLOAD_QUEUE);
    let writing = crate::threads::run(call, move |_call| {
        upload.write(&mut QueuedBody {
            frames,
            current: Bytes::new(),
        })
    });
    let mut received = 0u64;
    let mut drain_until = None;
    let mut failed = None;
    loop {
        let next = match drain_until {
            // A client that sends nothing for SLOW_CLIENT_LIMIT gives its slot up.
            None => match tokio::time::timeout(SLOW_CLIENT_LIMIT, body.next()).await {
                Ok(next) => next,
                Err(_) => {
                    let stalled = format!(
                        "the client sent nothing for {} s",
                        SLOW_CLIENT_LIMIT.as_secs()
                    );
                    let _ = tx.send(Err(std::io::Error::other(stalled))).await;
                    break;
                }
            },
            Some(deadline) => match tokio::time::timeout_at(deadline, body.next()).await {
                Ok(next) => next,
                Err(_) => break,
            },
        };
        match next {
            None => break,
            Some(Err(e)) => {
                let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                failed = Some(e);
                break;
            }
            Some(Ok(frame)) => {
                received += frame.len() as u64;
                if drain_until.is_none() && tx.send(Ok(frame)).await.is_err() {
                    drain_until = Some(tokio::time::Instant::now() + UPLOAD_DRAIN);
                }
                if drain_until.is_some() && received > max_body_bytes {
                    break;
                }
            }
        }
    }
    drop(tx);
    let written = writing
        .await
        .unwrap_or_else(|e| Err(ServiceError::Sandbox(format!("internal error: {e}"))));
    (written, failed)
}

/// Reads and drops up to `max_bytes` of `body`, for at most [`UPLOAD_DRAIN`].
async fn drain<S, E>(mut body: S, max_bytes: u64)
where
    S: futures_util::Stream<Item = Result<Bytes, E>> + Unpin,
{
    let deadline = tokio::time::Instant::now() + UPLOAD_DRAIN;
    let mut received = 0u64;
    while received <= max_bytes {
        match tokio::time::timeout_at(deadline, body.next()).await {
            Ok(Some(Ok(frame))) => received += frame.len() as u64,
            _ => break,
        }
    }
}

fn json_line(value: &impl Serialize) -> Vec<u8> {
    let mut line = serde_json::to_vec(value).expect("events serialize");
    line.push(b'\n');
    line
}

type Work = Box<
    dyn FnOnce(&Admitted, &mut dyn FnMut(&Event)) -> Result<ExecutionResult, ServiceError>
        + Send
        + 'static,
>;

/// Runs `work` on a blocking thread and streams its events as NDJSON; when the client goes
/// away, `on_gone` interrupts the work.
pub fn ndjson_stream(
    call: Admitted,
    work: Work,
    on_gone: impl FnOnce(&Admitted) + Send + 'static,
    with_exit_code: bool,
) -> Response {
    stream_frames(
        "application/x-ndjson",
        call,
        move |call, send| {
            // Every event is forwarded as it comes, the `end` the run's own; a run that ends
            // without one (a one-shot run, or an error) gets it from its outcome.
            let mut ended = false;
            let outcome = work(call, &mut |event| {
                ended |= matches!(event, Event::End(_));
                send(Bytes::from(json_line(event)));
            });
            let end_of = |result: &ExecutionResult| match with_exit_code {
                true => End::of_command(result),
                false => End::of(result),
            };
            let (end, reservation) = match outcome {
                Ok(mut result) => (
                    (!ended).then(|| end_of(&result)),
                    std::mem::take(&mut result.reservation),
                ),
                Err(e) => (
                    (!ended).then(|| end_of(&ExecutionResult::sandbox_error(e.to_string()))),
                    Reservation::default(),
                ),
            };
            if let Some(end) = end {
                send(Bytes::from(json_line(&Event::End(end))));
            }
            reservation
        },
        on_gone,
    )
}

/// One-shot run in a fresh sandbox.
#[utoipa::path(post, path = "/v1/run", request_body = RunRequest, tag = "run",
    responses(
        (status = 200, description = "The result object (docs/results.md), whatever the program did", body = corral_sandbox::ExecutionResult),
        (status = 400, description = "Malformed request", body = ErrorBody),
        (status = 422, description = "Unknown image or language", body = ErrorBody),
        (status = 429, description = "No run slot within admission_wait_s (max_runs, max_runs_per_key); see Retry-After", body = ErrorBody),
        (status = 503, description = "The host's memory budget is committed, or the server is stopping; see Retry-After", body = ErrorBody),
    ))]
async fn run(
    State(state): State<AppState>,
    tenant: Tenant,
    ApiJson(req): ApiJson<RunRequest>,
) -> Result<Response, ApiError> {
    // A slot and the memory the run's limits promise (bounded wait; see admission.rs).
    let permit = state.service.admit_run(&tenant, &req).await?;
    let service = state.service.clone();
    let answer = blocking(service.admit(&tenant)?, move |call| {
        service
            .run(call, &req, permit, &mut |_, _| {})
            .map(result_answer)
    })
    .await?;
    Ok(json_response(answer))
}

/// Create a session.
#[utoipa::path(post, path = "/v1/sandboxes", request_body = CreateSandboxRequest, tag = "sandboxes",
    responses(
        (status = 201, body = SandboxInfo),
        (status = 400, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 429, description = "Session limits reached; see Retry-After", body = ErrorBody),
        (status = 503, description = "The image's zygote is being replaced, the host's memory budget is committed, or the server is stopping; see Retry-After", body = ErrorBody),
    ))]
async fn create_sandbox(
    State(state): State<AppState>,
    tenant: Tenant,
    body: Bytes,
) -> Result<(StatusCode, Json<SandboxInfo>), ApiError> {
    // An empty body means all defaults.
    let req: CreateSandboxRequest = if body.iter().all(u8::is_ascii_whitespace) {
        CreateSandboxRequest::default()
    } else {
        parse_json(&body).map_err(ApiError::bad_request)?
    };
    let service = state.service.clone();
    let info = blocking(service.admit(&tenant)?, move |call| {
        service.create_session(call, &req)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(info)))
}

#[derive(Serialize, utoipa::ToSchema)]
struct SandboxList {
    sandboxes: Vec<SandboxInfo>,
    /// Present when there are more: pass it as `after` for the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<String>,
}

/// The query of `GET /v1/sandboxes`: `state` (comma-separated, repeatable), `image`, `limit`,
/// `after`, and `metadata.KEY=VALUE` (repeatable; every entry must match).
fn list_query(pairs: Vec<(String, String)>) -> Result<ListQuery, ApiError> {
    let mut query = ListQuery::default();
    for (key, value) in pairs {
        match key.as_str() {
            "state" => query.states.extend(
                value
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_string),
            ),
            "limit" => {
                query.limit = Some(value.parse().map_err(|_| {
                    ApiError::bad_request(format!("`limit` {value:?} is not a number"))
                })?)
            }
            "after" => query.after = Some(value),
            "image" => query.image = Some(value),
            _ => match key.strip_prefix("metadata.") {
                Some(k) if !k.is_empty() => {
                    query.metadata.insert(k.to_string(), value);
                }
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "unknown query parameter `{key}`: the parameters are state, image, \
                         limit, after and metadata.KEY"
                    )))
                }
            },
        }
    }
    Ok(query)
}

/// List this key's sessions, in creation order: filtered by `state` (`running`, `paused`, `dead`;
/// comma-separated), `image` and `metadata.KEY=VALUE`, at most `limit` (1 to 1000, default 1000) a
/// page, from after `after` (the `next` of the previous page).
#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes",
    params(
        ("state" = Option<String>, Query, description = "`running`, `paused`, `dead`, comma-separated"),
        ("image" = Option<String>, Query, description = "Only sessions of this image"),
        ("metadata.KEY" = Option<String>, Query, description = "Only sessions whose metadata has KEY with this value (any KEY, repeatable)"),
        ("limit" = Option<u32>, Query, description = "At most this many a page (1 to 1000, default 1000)"),
        ("after" = Option<String>, Query, description = "The `next` of the previous page"),
    ),
    responses((status = 200, body = SandboxList), (status = 400, body = ErrorBody)))]
async fn list_sandboxes(
    State(state): State<AppState>,
    tenant: Tenant,
    query: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<SandboxList>, ApiError> {
    let Query(pairs) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let page = state.service.list(&tenant, &list_query(pairs)?)?;
    Ok(Json(SandboxList {
        sandboxes: page.sandboxes,
        next: page.next,
    }))
}

#[derive(Serialize, utoipa::ToSchema)]
struct MetricList {
    metrics: Vec<SandboxMetric>,
}

/// A session's usage over the last ten minutes: a sample every five seconds, oldest first,
/// and one of now.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/metrics", tag = "sandboxes",
    responses((status = 200, body = MetricList), (status = 404, body = ErrorBody)))]
async fn sandbox_metrics(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> Result<Json<MetricList>, ApiError> {
    let service = state.service.clone();
    let metrics = blocking(service.admit(&tenant)?, move |call| {
        service.metrics(call, &id)
    })
    .await?;
    Ok(Json(MetricList { metrics }))
}

/// Inspect a session.
#[utoipa::path(get, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    responses((status = 200, body = SandboxInfo), (status = 404, body = ErrorBody)))]
async fn get_sandbox(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> Result<Json<SandboxInfo>, ApiError> {
    Ok(Json(state.service.get(&tenant, &id)?))
}

/// Pause a session between executions: every process of its sandbox is frozen, keeping its
/// memory and files, and its idle clock stops (it is closed once paused `max_paused_s`).
/// Until it is resumed only inspecting, resuming and killing it work (others: 409
/// `sandbox_paused`).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pause", tag = "sandboxes",
    responses((status = 200, body = SandboxInfo), (status = 404, body = ErrorBody),
        (status = 409, description = "`sandbox_paused` (already), `sandbox_busy` (executing), \
            `pause_unsupported` (no cgroup freezer) or `sandbox_dead`", body = ErrorBody)))]
async fn pause_sandbox(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> Result<Json<SandboxInfo>, ApiError> {
    let service = state.service.clone();
    Ok(Json(
        blocking(service.admit(&tenant)?, move |call| {
            service.pause(call, &id)
        })
        .await?,
    ))
}

/// Resume a paused session, with every process and all its memory as they were.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/resume", tag = "sandboxes",
    responses((status = 200, body = SandboxInfo), (status = 404, body = ErrorBody),
        (status = 409, description = "`sandbox_not_paused`", body = ErrorBody)))]
async fn resume_sandbox(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> Result<Json<SandboxInfo>, ApiError> {
    let service = state.service.clone();
    Ok(Json(
        blocking(service.admit(&tenant)?, move |call| {
            service.resume(call, &id)
        })
        .await?,
    ))
}

/// Restart a session's kernel: its variables and processes are gone, its files stay.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/restart", tag = "sandboxes",
    responses((status = 200, body = SandboxInfo), (status = 404, body = ErrorBody),
        (status = 409, description = "`sandbox_paused`", body = ErrorBody)))]
async fn restart_sandbox(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> Result<Json<SandboxInfo>, ApiError> {
    let service = state.service.clone();
    Ok(Json(
        blocking(service.admit(&tenant)?, move |call| {
            service.restart(call, &id)
        })
        .await?,
    ))
}

/// Kill a session: its sandbox is torn down and nothing of it remains.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    responses((status = 204), (status = 404, body = ErrorBody)))]
async fn kill_sandbox(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let service = state.service.clone();
    // Never refused: a key can close its sandboxes while its calls hold its every thread.
    blocking(service.admit_unmetered(&tenant), move |call| {
        service.kill(call, &id)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Run code in a session: an NDJSON stream of events (docs/results.md#events), or with
/// `Accept: application/json` the folded result object.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/execute", request_body = ExecuteRequest, tag = "sandboxes",
    responses(
        (status = 200, description = "NDJSON events (application/x-ndjson), or the result object", body = corral_sandbox::ExecutionResult),
        (status = 404, body = ErrorBody), (status = 409, description = "The session is dead", body = ErrorBody),
    ))]
async fn execute(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<ExecuteRequest>,
) -> Result<Response, ApiError> {
    let service = state.service.clone();
    // One admission and one check of the session, on the thread the execution then runs on.
    let call = service.admit(&tenant)?;
    if wants_json(&headers) {
        let answer = blocking(call, move |call| {
            let prepared = service.prepare_execute(call, &id, req)?;
            service
                .execute(call, prepared, &mut |_| {})
                .map(result_answer)
        })
        .await?;
        return Ok(json_response(answer));
    }
    let (call, prepared) = {
        let (service, id) = (service.clone(), id.clone());
        blocking_step(call, move |call| service.prepare_execute(call, &id, req)).await?
    };
    let gone_service = service.clone();
    Ok(ndjson_stream(
        call,
        Box::new(move |call, on_event| service.execute(call, prepared, on_event)),
        move |call| {
            let _ = gone_service.interrupt(call, &id);
        },
        false,
    ))
}

/// Run a command inside a session's sandbox: NDJSON `stdout`/`stderr` events and an `end`
/// event carrying `exit_code` (or, with `Accept: application/json`, the result object).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands", request_body = CommandRequest, tag = "sandboxes",
    responses(
        (status = 200, description = "NDJSON events, or the result object", body = corral_sandbox::ExecutionResult),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
    ))]
async fn commands(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<CommandRequest>,
) -> Result<Response, ApiError> {
    let service = state.service.clone();
    let call = service.admit(&tenant)?;
    if wants_json(&headers) {
        let answer = blocking(call, move |call| {
            let prepared = service.prepare_command(call, &id, req)?;
            service
                .run_command(call, prepared, &Stopper::default(), &mut |_| {})
                .map(result_answer)
        })
        .await?;
        return Ok(json_response(answer));
    }
    let (call, prepared) = {
        let service = service.clone();
        blocking_step(call, move |call| service.prepare_command(call, &id, req)).await?
    };
    // A client that goes away stops its command, and no other execution of the session.
    let stop = Stopper::default();
    let gone = stop.clone();
    Ok(ndjson_stream(
        call,
        Box::new(move |call, on_event| service.run_command(call, prepared, &stop, on_event)),
        move |_| {
            gone.stop();
        },
        true,
    ))
}

/// Write a workspace file (the body is its content, streamed into the sandbox).
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files/{path}", tag = "files",
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 201, body = corral_sandbox::FileEntry), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 413, description = "Larger than the sandbox's workspace or max_body_bytes", body = ErrorBody),
        (status = 503, description = "Every upload slot is taken (max_uploads_in_flight); see Retry-After", body = ErrorBody),
        (status = 507, description = "The file does not fit: the workspace is full, or it would take the sandbox past its memory limit", body = ErrorBody)))]
async fn write_file(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((id, path)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<FileEntry>), ApiError> {
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let service = state.service.clone();
    let max_body_bytes = state.service.config().max_body_bytes as u64;
    let prepared = async {
        blocking(service.admit(&tenant)?, move |call| {
            service.prepare_upload(call, &id, &path, announced)
        })
        .await
    };
    let upload = match prepared.await {
        Ok(upload) => upload,
        Err(e) => {
            // Refused before a byte was read (too large for the sandbox, no such sandbox, a
            // bad path, the key's threads all taken): a body the server would have taken is
            // read and dropped first, so that a client that sends all of it before it reads
            // gets the answer, not a broken pipe. A body over max_body_bytes is not read at
            // all.
            if announced.is_none_or(|n| n <= max_body_bytes) {
                drain(body.into_data_stream(), max_body_bytes).await;
            }
            return Err(e);
        }
    };
    let _slot = state.service.admit_upload(&tenant).await?;
    // The writer's thread, once the upload has its slot (refused like the slot: body unread).
    let write = state.service.admit(&tenant)?;
    let (written, failed) =
        stream_upload(upload, write, body.into_data_stream(), max_body_bytes).await;
    match (written, failed) {
        (Err(e), _) if e.is_refused_upload() => Err(e.into()),
        (_, Some(e)) => Err(ApiError::bad_request(format!(
            "reading the request body: {e}"
        ))),
        (written, None) => Ok((StatusCode::CREATED, Json(written?))),
    }
}

/// Read a workspace file (raw bytes).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/{path}", tag = "files",
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn read_file(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((id, path)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let service = state.service.clone();
    let file = blocking(service.admit(&tenant)?, move |call| {
        service.open_file(call, &id, &path)
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

/// Delete a workspace file.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/files/{path}", tag = "files",
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn remove_file(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((id, path)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let service = state.service.clone();
    blocking(service.admit(&tenant)?, move |call| {
        service.remove_file(call, &id, &path)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct FilesQuery {
    /// A directory of the workspace (default: all of it).
    dir: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
struct FileList {
    files: Vec<FileEntry>,
}

/// List the regular files below a workspace directory.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", tag = "files", params(FilesQuery),
    responses((status = 200, body = FileList), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn list_files(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    query: Result<Query<FilesQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<FileList>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let service = state.service.clone();
    let files = blocking(service.admit(&tenant)?, move |call| {
        service.list_files(call, &id, query.dir.as_deref())
    })
    .await?;
    Ok(Json(FileList { files }))
}

/// Liveness, and the state of the warm pool's zygotes (the full one, which forks sessions, and
/// the lean one of one-shot runs), and in a cluster the node's name and load; needs no key. Always 200 while the server answers:
/// `status` is `degraded` while a zygote is down (it is being replaced).
#[utoipa::path(get, path = "/healthz", tag = "service", responses((status = 200)))]
async fn healthz(State(state): State<AppState>) -> Json<serde_json::Value> {
    let pools: Vec<serde_json::Value> = state
        .service
        .zygote_status()
        .into_iter()
        .map(|(image, [(_, full), (_, lean)])| {
            serde_json::json!({
                "image": image,
                "zygote_alive": full.alive,
                "zygote_restarts": full.restarts,
                "lean_zygote_alive": lean.alive,
                "lean_zygote_restarts": lean.restarts,
            })
        })
        .collect();
    let ok = pools
        .iter()
        .all(|p| p["zygote_alive"] == true && p["lean_zygote_alive"] == true);
    let mut health = serde_json::json!({
        "status": if ok { "ok" } else { "degraded" },
        "pools": pools,
    });
    // A cluster's node tells `corral route` its name and load (docs/scale-out.md); a single
    // server tells keyless callers nothing of how busy it is.
    if let Some(node) = &state.service.config().node_name {
        health["node"] = node.as_str().into();
        health["sessions_live"] = state.service.sessions_live().into();
        health["max_sessions"] = state.service.config().max_sessions.into();
    }
    Json(health)
}

/// Prometheus metrics. Authenticated like the API: a key, or a keyless local program on a
/// loopback server.
#[utoipa::path(get, path = "/metrics", tag = "service", responses(
    (status = 200, content_type = "text/plain"),
    (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
async fn metrics(State(state): State<AppState>, _tenant: Tenant) -> Response {
    let m = &state.service.metrics;
    m.sessions_live.set(state.service.sessions_live() as i64);
    m.pool_ready.set(state.service.pool_ready() as i64);
    m.result_bytes_held
        .set(state.service.result_bytes_held() as i64);
    if let Some((image, zygotes)) = state.service.zygote_status() {
        for (kind, zygote) in &zygotes {
            m.record_zygote(image, *kind, zygote);
        }
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.encode(),
    )
        .into_response()
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Corral",
        description = "Run untrusted code in disposable, locked-down sandboxes. Errors are `{\"error\": {\"code\", \"message\"}}`. Authenticate with `Authorization: Bearer KEY` (required unless the server listens on loopback)."
    ),
    paths(
        run,
        create_sandbox,
        list_sandboxes,
        get_sandbox,
        kill_sandbox,
        pause_sandbox,
        resume_sandbox,
        restart_sandbox,
        sandbox_metrics,
        execute,
        commands,
        write_file,
        read_file,
        remove_file,
        list_files,
        healthz,
        metrics,
        crate::operator::whoami,
        crate::operator::audit,
        crate::operator::egress_audit,
        crate::operator::list_keys,
        crate::operator::create_key,
        crate::operator::revoke_key,
        crate::operator::all_sandboxes
    )
)]
pub struct ApiDoc;

/// The whole OpenAPI document: [`ApiDoc`], the filesystem calls of [`crate::files_api`] and
/// the programs, contexts and ports of [`openapi::SandboxProgramsDoc`].
fn api_doc() -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi()
        .merge_from(crate::files_api::FilesApiDoc::openapi())
        .merge_from(openapi::SandboxProgramsDoc::openapi());
    openapi::complete(&mut doc);
    doc
}

async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(api_doc())
}

/// A readable API page, rendered here from the OpenAPI document (no scripts, works offline).
async fn docs() -> Html<String> {
    Html(crate::docs_page::render(&api_doc()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tower::ServiceExt as _;

    #[test]
    fn the_openapi_document_describes_the_code_policy() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let schema = |name: &str| doc["components"]["schemas"][name].clone();
        let policy = schema("PolicyRequest");
        for field in ["allowed_modules", "denied_modules", "max_code_bytes"] {
            assert!(policy["properties"][field].is_object(), "{field}: {policy}");
        }
        for request in ["RunRequest", "CreateSandboxRequest", "SandboxInfo"] {
            assert!(
                schema(request)["properties"]["policy"].is_object(),
                "{request}"
            );
        }
        let violation = schema("Violation");
        assert!(violation["properties"]["rule"].is_object(), "{violation}");
        assert!(schema("LanguageError")["properties"]["violations"].is_object());
    }

    /// A router that only parses bodies the way the API does, answering 200 when parsed.
    fn parser() -> Router {
        async fn ok<T>(_: ApiJson<T>) -> StatusCode {
            StatusCode::OK
        }
        Router::new()
            .route("/run", post(ok::<RunRequest>))
            .route("/create", post(ok::<CreateSandboxRequest>))
            .route("/execute", post(ok::<ExecuteRequest>))
            .route("/commands", post(ok::<CommandRequest>))
            .layer(DefaultBodyLimit::max(1024))
    }

    fn answer(route: &str, body: Vec<u8>) -> (StatusCode, Vec<u8>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let request = axum::http::Request::post(route)
                .body(Body::from(body))
                .unwrap();
            let response = parser().oneshot(request).await.unwrap();
            let status = response.status();
            let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap();
            (status, bytes.to_vec())
        })
    }

    fn is_api_error(bytes: &[u8], code: &str) -> bool {
        serde_json::from_slice::<serde_json::Value>(bytes)
            .is_ok_and(|v| v["error"]["code"] == code && v["error"]["message"].is_string())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever the bytes, a body is parsed or refused with a 400 in the API's format.
        #[test]
        fn arbitrary_bodies_are_parsed_or_refused_cleanly(
            route in prop::sample::select(vec!["/run", "/create", "/execute", "/commands"]),
            body in prop::collection::vec(any::<u8>(), 0..512),
        ) {
            let (status, bytes) = answer(route, body);
            prop_assert!(status == StatusCode::OK || (status == StatusCode::BAD_REQUEST && is_api_error(&bytes, "bad_request")));
        }

        /// JSON of the right outer shape with arbitrary field names and values.
        #[test]
        fn arbitrary_json_objects_are_parsed_or_refused_cleanly(
            route in prop::sample::select(vec!["/run", "/create", "/execute", "/commands"]),
            fields in prop::collection::btree_map(
                prop::sample::select(vec!["code", "language", "image", "limits", "env", "files", "cmd", "args", "cwd", "timeout_s", "idle_timeout_s", "other"]),
                prop_oneof![
                    Just(serde_json::Value::Null),
                    any::<i64>().prop_map(serde_json::Value::from),
                    any::<f64>().prop_map(serde_json::Value::from),
                    ".{0,20}".prop_map(serde_json::Value::from),
                    Just(serde_json::json!({"timeout_s": -1, "memory_mb": 1e30})),
                    Just(serde_json::json!(["a", 1])),
                ],
                0..6,
            ),
        ) {
            let body = serde_json::to_vec(&fields).unwrap();
            let (status, bytes) = answer(route, body);
            prop_assert!(status == StatusCode::OK || (status == StatusCode::BAD_REQUEST && is_api_error(&bytes, "bad_request")));
        }
    }

    #[test]
    fn unknown_fields_and_oversized_bodies_are_named() {
        let (status, bytes) = answer("/run", br#"{"code":"1","colour":"red"}"#.to_vec());
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(String::from_utf8_lossy(&bytes).contains("colour"));
        let (status, bytes) = answer("/run", vec![b' '; 4096]);
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(is_api_error(&bytes, "payload_too_large"));
    }
}
