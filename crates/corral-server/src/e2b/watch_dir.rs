//! Directory watchers of envd's filesystem service: the polling ones of the sync Python SDK
//! (`CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`) and the streaming `WatchDir` of the
//! JavaScript SDK and the async Python SDK. Both are the same [`Watcher`] (see
//! [`crate::watch`] for why it polls): the streaming one is polled by the server, which sends
//! each poll's events as they are found and forgets the watcher when the stream ends.
//!
//! Bounds: the [`MAX_WATCHERS`] of a sandbox count both kinds; a poll lists at most
//! [`MAX_ENTRIES`](corral_sandbox::workspace::MAX_ENTRIES) entries, never through a link;
//! a stream polls at most every [`MIN_POLL`], and after a slow poll waits
//! [`POLL_COST_FACTOR`] times as long as that poll took, so that one watcher of a large
//! directory takes a bounded share of a core; every scan (a creation's, a poll's) takes a
//! turn of its key's ([`crate::watch::Scans`]), so that all of a key's watchers together
//! take at most `watch_scan_share` of a core (a poll without a turn within [`TURN_WAIT`]
//! reports nothing, and the next one what changed since the last); a stream whose client reads nothing for
//! [`SLOW_CLIENT_LIMIT`] ends, and so does every stream at its client's deadline
//! (`Connect-Timeout-Ms`, at most [`MAX_STREAM`]) and when the server shuts down.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::*;
use crate::service::Admitted;
use crate::watch::{EventKind, ScanTurn};

/// The shortest wait between two polls of a streaming watcher.
pub const MIN_POLL: Duration = Duration::from_millis(200);
/// After a poll that took `t`, the next one waits at least `t * POLL_COST_FACTOR`.
pub const POLL_COST_FACTOR: u32 = 20;
/// The longest wait between two polls, whatever the last one cost.
const MAX_POLL: Duration = Duration::from_secs(10);
/// How long a streaming watch lasts without a deadline from its client.
pub const MAX_STREAM: Duration = Duration::from_secs(24 * 3600);
/// A client that reads nothing of its stream for this long loses it.
pub const SLOW_CLIENT_LIMIT: Duration = Duration::from_secs(30);
/// The keepalive interval without a `Keepalive-Ping-Interval` header, and its bounds.
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(50);
const KEEPALIVE_BOUNDS: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(300));
/// How long a creation or a client's poll waits for its key's turn to scan.
pub const TURN_WAIT: Duration = Duration::from_secs(2);
/// Frames queued for a slow client before the poller waits for it.
const STREAM_BUFFER: usize = 16;

/// A watcher of `files.watch_dir`: its sandbox, the directory (relative to the workspace),
/// how deep it looks, and what the directory held at the last poll.
pub(super) struct Watcher {
    pub(super) sandbox: String,
    dir: String,
    depth: usize,
    seen: Mutex<Snapshot>,
}

/// Makes a watcher of directory `path` (E2B's path) of `sandbox` and keeps it in the
/// registry: its id. `path` must be a directory (never a link to one).
pub(super) fn create_watcher(
    service: &Service,
    call: &Admitted,
    registry: &Registry,
    sandbox: &PlaneSandbox,
    path: &str,
    recursive: bool,
) -> Result<String, RpcError> {
    let PlaneSandbox { id, tenant } = sandbox;
    let dir = rpc_path(path)?;
    let depth = if recursive { MAX_DEPTH } else { 1 };
    if service.stat(call, id, &dir)?.kind != EntryKind::Dir {
        return Err(RpcError(
            Code::InvalidArgument,
            format!("path {path} is not a directory"),
        ));
    }
    let turn = service
        .watch_scans()
        .turn_within(&tenant.0, TURN_WAIT)
        .ok_or_else(|| {
            RpcError(
                Code::ResourceExhausted,
                "this key's directory watchers are scanning at their most (watch_scan_share): \
                 retry soon"
                    .into(),
            )
        })?;
    let entries = turn.scan(|| service.list_dir(call, id, &dir, depth))?;
    let watcher = Watcher {
        seen: Mutex::new(Snapshot::of(std::path::Path::new(&dir), &entries)),
        sandbox: id.clone(),
        dir,
        depth,
    };
    registry.add_watcher(watcher)
}

/// What changed in watcher `watcher_id`'s directory since its last poll, scanned in `turn`
/// (none: nothing, and the next poll reports it).
pub(super) fn poll_watcher(
    service: &Service,
    call: &Admitted,
    registry: &Registry,
    sandbox: &PlaneSandbox,
    watcher_id: &str,
    turn: Option<ScanTurn>,
) -> Result<Vec<(std::path::PathBuf, EventKind)>, RpcError> {
    let PlaneSandbox { id, .. } = sandbox;
    let watcher = registry.watcher(id, watcher_id)?;
    let Some(turn) = turn else {
        return Ok(Vec::new());
    };
    let mut seen = watcher.seen.lock();
    let entries = turn.scan(|| service.list_dir(call, id, &watcher.dir, watcher.depth))?;
    let now = Snapshot::of(std::path::Path::new(&watcher.dir), &entries);
    let events = seen.events_to(&now);
    *seen = now;
    Ok(events)
}

/// An event as `filesystem.FilesystemEvent` writes it.
pub(super) fn event_json(name: &std::path::Path, kind: EventKind) -> Value {
    json!({"name": name.to_string_lossy(), "type": kind.proto_name()})
}

/// The keepalive interval a client asks for (`Keepalive-Ping-Interval`, seconds), bounded.
fn keepalive_interval(headers: &HeaderMap) -> Duration {
    headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|s| Duration::from_secs(s).clamp(KEEPALIVE_BOUNDS.0, KEEPALIVE_BOUNDS.1))
        .unwrap_or(DEFAULT_KEEPALIVE)
}

/// The wait before the next poll, after one that took `took`.
fn next_poll(took: Duration) -> Duration {
    took.saturating_mul(POLL_COST_FACTOR)
        .clamp(MIN_POLL, MAX_POLL)
}

/// Removes a streaming watcher from the registry when its stream ends, however it ends.
struct StreamWatcher {
    registry: Arc<Registry>,
    sandbox: String,
    watcher_id: String,
}

impl Drop for StreamWatcher {
    fn drop(&mut self) {
        let _ = self
            .registry
            .remove_watcher(&self.sandbox, &self.watcher_id);
    }
}

/// `filesystem.Filesystem/WatchDir`: the Connect server-streaming RPC (JSON codec) of
/// `files.watchDir` (JavaScript) and the async `files.watch_dir` (Python). Envelopes: `start`
/// once the watcher exists, then `filesystem` events as polls find them and `keepalive`
/// when nothing was sent for the client's keepalive interval; the stream ends (with an
/// error) when the sandbox or its watcher goes, at the client's deadline
/// (`deadline_exceeded`), or when the server shuts down (`unavailable`).
pub(super) async fn watch_dir(
    State(state): State<AppState>,
    Extension(registry): Extension<Arc<Registry>>,
    sandbox: Result<PlaneSandbox, E2bError>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, E2bError> {
    let payload = read_request_message(body, state.service.config().max_json_bytes).await;
    let sandbox = sandbox?; // once the body is read (see `execute`)
    let payload = match payload {
        Ok(payload) => payload,
        Err(error) => return Ok(connect_failure(error)),
    };
    let req: FilesystemRequest = match parse_json(&payload) {
        Ok(req) => req,
        Err(e) => {
            return Ok(connect_failure(connect_error(
                Code::InvalidArgument,
                format!("WatchDirRequest: {e}"),
            )))
        }
    };
    let watcher_id = {
        let (service, registry) = (state.service.clone(), registry.clone());
        let id = sandbox.id.clone();
        let tenant = sandbox.tenant.clone();
        let call = match service.admit(&tenant) {
            Ok(call) => call,
            Err(e) => return Ok(connect_failure(connect_error_of(&e))),
        };
        let made = crate::threads::run(call, move |call| {
            let sandbox = PlaneSandbox { id, tenant };
            create_watcher(
                &service,
                &call,
                &registry,
                &sandbox,
                &req.path,
                req.recursive,
            )
        })
        .await
        .map_err(|e| ApiError::internal(format!("internal error: {e}")))?;
        match made {
            Ok(watcher_id) => watcher_id,
            Err(RpcError(code, message)) => {
                return Ok(connect_failure(connect_error(code, message)))
            }
        }
    };
    let registered = StreamWatcher {
        registry: registry.clone(),
        sandbox: sandbox.id.clone(),
        watcher_id: watcher_id.clone(),
    };
    let deadline = Instant::now()
        + connect_timeout_s(&headers)
            .map(Duration::from_secs_f64)
            .unwrap_or(MAX_STREAM)
            .min(MAX_STREAM);
    let keepalive = keepalive_interval(&headers);
    let (tx, rx) = mpsc::channel::<Bytes>(STREAM_BUFFER);
    let service = state.service.clone();
    tokio::spawn(async move {
        let _registered = registered;
        let send = |frame: Bytes| {
            let tx = tx.clone();
            async move {
                matches!(
                    tokio::time::timeout(SLOW_CLIENT_LIMIT, tx.send(frame)).await,
                    Ok(Ok(()))
                )
            }
        };
        if !send(connect_message(&json!({"start": {}}))).await {
            return;
        }
        let mut last_sent = Instant::now();
        let mut wait = MIN_POLL;
        let sandbox = Arc::new(sandbox);
        loop {
            tokio::select! {
                _ = tx.closed() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            let ended = if Instant::now() >= deadline {
                Some(connect_error(
                    Code::DeadlineExceeded,
                    "the watch reached its deadline",
                ))
            } else if let Err(e) = service.check_running() {
                Some(connect_error_of(&e))
            } else {
                None
            };
            if let Some(error) = ended {
                let _ = send(connect_end_of_stream(Some(error))).await;
                return;
            }
            let started = Instant::now();
            // A key whose scans have used their share of a core, or whose blocking threads
            // are all taken, polls again later.
            let Some(turn) = service.watch_scans().turn(&sandbox.tenant.0) else {
                wait = MIN_POLL;
                continue;
            };
            let Ok(call) = service.admit(&sandbox.tenant) else {
                wait = MAX_POLL;
                continue;
            };
            let polled = {
                let (service, registry, sandbox) =
                    (service.clone(), registry.clone(), sandbox.clone());
                let watcher_id = watcher_id.clone();
                crate::threads::run(call, move |call| {
                    poll_watcher(
                        &service,
                        &call,
                        &registry,
                        &sandbox,
                        &watcher_id,
                        Some(turn),
                    )
                })
                .await
            };
            wait = next_poll(started.elapsed());
            let events = match polled {
                Ok(Ok(events)) => events,
                Ok(Err(RpcError(code, message))) => {
                    let _ = send(connect_end_of_stream(Some(connect_error(code, message)))).await;
                    return;
                }
                Err(e) => {
                    let error = connect_error(Code::Internal, format!("internal error: {e}"));
                    let _ = send(connect_end_of_stream(Some(error))).await;
                    return;
                }
            };
            for (name, kind) in &events {
                let event = json!({"filesystem": event_json(name, *kind)});
                if !send(connect_message(&event)).await {
                    return;
                }
                last_sent = Instant::now();
            }
            if last_sent.elapsed() >= keepalive {
                if !send(connect_message(&json!({"keepalive": {}}))).await {
                    return;
                }
                last_sent = Instant::now();
            }
        }
    });
    let body =
        Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, Infallible>));
    Ok(([(header::CONTENT_TYPE, CONNECT_JSON)], body).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_wait_longer_after_slow_ones_within_bounds() {
        assert_eq!(next_poll(Duration::ZERO), MIN_POLL);
        assert_eq!(next_poll(Duration::from_millis(50)), Duration::from_secs(1));
        assert_eq!(next_poll(Duration::from_secs(60)), MAX_POLL);
    }

    #[test]
    fn keepalives_follow_the_client_within_bounds() {
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert("keepalive-ping-interval", HeaderValue::from_static(v));
            keepalive_interval(&h)
        };
        assert_eq!(keepalive_interval(&HeaderMap::new()), DEFAULT_KEEPALIVE);
        assert_eq!(with("5"), Duration::from_secs(5));
        assert_eq!(with("0"), KEEPALIVE_BOUNDS.0);
        assert_eq!(with("999999"), KEEPALIVE_BOUNDS.1);
        assert_eq!(with("soon"), DEFAULT_KEEPALIVE);
    }
}
