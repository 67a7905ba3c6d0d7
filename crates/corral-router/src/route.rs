//! Which node a request goes to, and the router's own answers (its `/healthz`, and the errors
//! of sandboxes whose node is gone), in the shape of the face the request came to.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use corral_kernel::node::node_of;
use corral_kernel::NodeName;
use corral_share::{Limits, Pool};
use corral_wire::e2b::{E2bError, SANDBOX_ID_HEADER};
use corral_wire::error::ApiError;
use http_body_util::BodyExt as _;

use crate::nodes::{Lookup, Nodes};
use crate::operator::{AuditLog, OperatorRoute};
use crate::proxy::{forward, ForwardError};
use crate::RouterConfig;

/// Which API a request belongs to: its errors are answered in that API's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Face {
    Native,
    /// E2B's control plane (`/sandboxes…`, `/v2/sandboxes…`), errors `{"code", "message"}`.
    E2bControl,
    /// E2B's sandbox plane (the `E2b-Sandbox-Id` header): a sandbox that is not there is
    /// answered as E2B's edge proxy answers it (502), which the SDK reads as "not running".
    E2bSandbox,
}

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// The node that owns sandbox `id`.
    Sandbox { id: String, face: Face },
    /// The least-loaded node: a new sandbox, or a one-shot run.
    Place,
    /// Every node, merged: a list of sandboxes.
    List(Face),
    /// The router itself.
    Health,
    /// Every node's metrics, labelled with their node (crate::metrics).
    Metrics,
    /// An operator's route, answered for every node (crate::operator).
    Operator(OperatorRoute),
    /// Any node: the documents, and what no node serves (which each node answers alike).
    Any,
}

fn target(method: &Method, path: &str, headers: &HeaderMap) -> Target {
    if let Some(id) = headers.get(SANDBOX_ID_HEADER).and_then(|v| v.to_str().ok()) {
        return Target::Sandbox {
            id: id.to_string(),
            face: Face::E2bSandbox,
        };
    }
    if let Some(id) = headers
        .get(axum::http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .and_then(host_routed_sandbox)
    {
        // A port of a sandbox by host name (`{port}-{id}.{domain}`): its node proxies it.
        return Target::Sandbox {
            id,
            face: Face::Native,
        };
    }
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let sandbox = |id: &str, face| Target::Sandbox {
        id: id.to_string(),
        face,
    };
    match (method, segments.as_slice()) {
        (_, ["healthz"]) => Target::Health,
        (&Method::GET, ["metrics"]) => Target::Metrics,
        (&Method::GET, ["v1", "operator", "sandboxes"]) => {
            Target::Operator(OperatorRoute::Sandboxes)
        }
        (&Method::GET, ["v1", "audit"]) => {
            Target::Operator(OperatorRoute::Audit(AuditLog::Executions))
        }
        (&Method::GET, ["v1", "audit", "egress"]) => {
            Target::Operator(OperatorRoute::Audit(AuditLog::Egress))
        }
        (&Method::GET, ["v1", "keys"]) => Target::Operator(OperatorRoute::Keys),
        (&Method::POST, ["v1", "keys"]) => Target::Operator(OperatorRoute::CreateKey),
        (&Method::DELETE, ["v1", "keys", id]) if !id.is_empty() => {
            Target::Operator(OperatorRoute::RevokeKey(id.to_string()))
        }
        (&Method::POST, ["v1", "run"]) => Target::Place,
        (&Method::POST, ["v1", "sandboxes"]) => Target::Place,
        (&Method::GET, ["v1", "sandboxes"]) => Target::List(Face::Native),
        (_, ["v1", "sandboxes", id, ..]) if !id.is_empty() => sandbox(id, Face::Native),
        (&Method::POST, ["v2", "sandboxes"]) => Target::Place,
        (&Method::GET, ["v2", "sandboxes"]) => Target::List(Face::E2bControl),
        (_, ["v2", "sandboxes", id, ..] | ["sandboxes", id, ..]) if !id.is_empty() => {
            sandbox(id, Face::E2bControl)
        }
        _ => Target::Any,
    }
}

/// The sandbox a host-routed port request names: a `Host` whose first label is
/// `{port}-{id}` with an id that names a node (the nodes' `[ports] domain` makes the rest).
fn host_routed_sandbox(host: &str) -> Option<String> {
    let label = host.split('.').next()?.to_ascii_lowercase();
    let (port, id) = label.split_once('-')?;
    let port: u16 = port
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| port.parse().ok())
        .flatten()?;
    (port != 0 && node_of(id).is_some()).then(|| id.to_string())
}

#[derive(Clone)]
pub(crate) struct AppState {
    pub nodes: Arc<Nodes>,
    in_flight: Arc<Pool>,
    /// Bytes of creation bodies being read, before they take their place in flight.
    bodies: Arc<Pool>,
    accepted: Arc<AcceptedKeys>,
}

/// How many keys the router remembers as accepted by a node (the least recently used is
/// forgotten first, and counts as unverified again until a node accepts it anew): about 100
/// bytes each.
const ACCEPTED_KEYS: usize = 4096;

/// Hashes of the keys a node has accepted: only these get a share of their own in the
/// router's pools. A key no node has accepted yet (or a made-up one) counts as unverified,
/// with the requests that present none: however many keys a client makes up, they take
/// one key's share, never another key's floor or the whole pool.
struct AcceptedKeys(std::sync::Mutex<hashlink::LruCache<String, ()>>);

impl AcceptedKeys {
    fn new() -> AcceptedKeys {
        AcceptedKeys(std::sync::Mutex::new(hashlink::LruCache::new(
            ACCEPTED_KEYS,
        )))
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, hashlink::LruCache<String, ()>> {
        // The cache is consistent between calls: a poisoned lock is taken as it is.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The key a request to `target` with `headers` counts against: its key's hash if a node
    /// has accepted it; else, for a sandbox's own routes (E2B's sandbox plane and host-routed
    /// ports, which nodes answer by the sandbox's token or a public port, not by the key),
    /// the one key [`SANDBOX_ROUTES`]; else the unverified one (`""`), which a new key's first
    /// creation or list shares with requests that present no key.
    fn key_of(&self, target: &Target, headers: &HeaderMap) -> String {
        match in_flight_key(headers) {
            Some(hash) if self.cache().get(&hash).is_some() => hash,
            _ if matches!(target, Target::Sandbox { .. }) => SANDBOX_ROUTES.to_string(),
            _ => String::new(),
        }
    }

    fn accept(&self, headers: &HeaderMap) {
        if let Some(hash) = in_flight_key(headers) {
            self.cache().insert(hash, ());
        }
    }
}

/// The key that requests to a sandbox's own routes without an accepted key count against (a
/// key hash is hex: no hash is this).
const SANDBOX_ROUTES: &str = "sandbox routes";

/// Whether a node answers `target` with a success only for a key it holds: a creation (or a
/// run) and a list. Other routes may answer anyone (documents, a port's page), or be the
/// router's own answers.
fn checks_key(target: &Target) -> bool {
    matches!(target, Target::Place | Target::List(_))
}

/// Marks an answer of the router's that a node's success stands behind (a list that asked
/// at least one node): only such an answer accepts the key it was made for. A list whose
/// cursor is past every node is answered by the router alone, for any key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeAnswered;

/// How requests in flight are shared between the keys that present them (a key's share is
/// half of `max_in_flight`, and every key keeps a floor of 64 out of a reserve of a sixteenth
/// above it, as the egress proxies' connections are shared): one key's many long streams
/// leave every other key's requests served. Keys no node has accepted share one key's
/// ([`AcceptedKeys`]).
fn in_flight_limits(max_in_flight: usize) -> Limits {
    let total = max_in_flight.max(1) as u64;
    let per_key = (total / 2).max(1);
    let floor = per_key.min(64);
    Limits::new(total, per_key, floor, (total / 16).max(floor))
}

/// How the bytes of creation bodies being read are shared: sixteen bodies of the largest
/// size in all, half of that for one key, and one whole body for every key.
fn body_limits(max_create_bytes: usize) -> Limits {
    let floor = max_create_bytes.max(1) as u64;
    Limits::new(16 * floor, 8 * floor, floor, floor)
}

/// A hash of the API key a request presents (the nodes check it; the router only tells keys
/// apart), or none when it presents none, or one the nodes will refuse.
fn in_flight_key(headers: &HeaderMap) -> Option<String> {
    match corral_wire::keys::presented_key(headers) {
        Ok(Some(key)) => Some(corral_service::db::hash_key(&key)),
        Ok(None) | Err(_) => None,
    }
}

/// The router's application: every request is routed by [`target`].
pub fn app(config: Arc<RouterConfig>, nodes: Arc<Nodes>) -> Router {
    Router::new().fallback(handle).with_state(AppState {
        nodes,
        in_flight: Pool::new(
            "this router",
            "requests in flight",
            in_flight_limits(config.max_in_flight),
        ),
        bodies: Pool::new(
            "creation bodies being read",
            "bytes",
            body_limits(config.max_create_bytes),
        ),
        accepted: Arc::new(AcceptedKeys::new()),
    })
}

/// An error of the router's own, in `face`'s shape.
pub(crate) fn error(
    face: Face,
    status: StatusCode,
    code: &'static str,
    message: String,
) -> Response {
    match face {
        Face::Native => ApiError::new(status, code, message).into_response(),
        Face::E2bControl | Face::E2bSandbox => E2bError::new(status, message).into_response(),
    }
}

/// A sandbox whose node does not answer: its sandboxes went with it. Native clients get 410
/// `sandbox_gone`; E2B clients what E2B says of a sandbox that is no more (404 on the control
/// plane, 502 "not found" on the sandbox plane).
fn gone(face: Face, id: &str, node: &NodeName) -> Response {
    match face {
        Face::Native => error(
            face,
            StatusCode::GONE,
            "sandbox_gone",
            format!(
                "sandbox {id} was on node {node}, which does not answer: the sandboxes of a \
                 node that stops are lost; create another"
            ),
        ),
        Face::E2bControl => error(
            face,
            StatusCode::NOT_FOUND,
            "not_found",
            format!("sandbox {id} not found: its node {node} does not answer"),
        ),
        Face::E2bSandbox => error(
            face,
            StatusCode::BAD_GATEWAY,
            "not_found",
            format!("The sandbox {id} was not found (its node {node} does not answer)"),
        ),
    }
}

/// An id that names no node this router knows: no such sandbox, as a node would say.
fn unknown(face: Face, id: &str) -> Response {
    match face {
        Face::E2bSandbox => error(
            face,
            StatusCode::BAD_GATEWAY,
            "not_found",
            format!("The sandbox {id} was not found"),
        ),
        _ => error(
            face,
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no sandbox {id}"),
        ),
    }
}

pub(crate) fn no_nodes(face: Face) -> Response {
    let mut answer = error(
        face,
        StatusCode::SERVICE_UNAVAILABLE,
        "no_nodes",
        "no Corral node is up behind this router; retry".to_string(),
    );
    answer
        .headers_mut()
        .insert(axum::http::header::RETRY_AFTER, 1.into());
    answer
}

fn face_of(path: &str, headers: &HeaderMap) -> Face {
    if headers.contains_key(SANDBOX_ID_HEADER) {
        Face::E2bSandbox
    } else if path.starts_with("/v1/") {
        Face::Native
    } else {
        Face::E2bControl
    }
}

async fn handle(State(state): State<AppState>, request: Request) -> Response {
    let face = face_of(request.uri().path(), request.headers());
    let target = target(request.method(), request.uri().path(), request.headers());
    let key = state.accepted.key_of(&target, request.headers());
    // A creation's body is read before the request takes its place in flight (under its
    // own bound and deadline), so a body that comes slowly, or never, holds no place.
    let (request, body) = match target {
        Target::Place => {
            let (parts, body) = request.into_parts();
            match read_creation(&state, face, &key, body).await {
                Ok(read) => (Request::from_parts(parts, Body::empty()), Some(read)),
                Err(answer) => return answer,
            }
        }
        _ => (request, None),
    };
    let permit = match state.in_flight.take(&key, 1) {
        Ok(permit) => permit,
        Err(refusal) => return busy(face, &refusal),
    };
    let headers = checks_key(&target).then(|| request.headers().clone());
    // A placement's success is always a node's; a list's only when it asked one.
    let places = matches!(target, Target::Place);
    let (creation, _held) = body.unzip();
    let answer = route(&state, target, request, creation).await;
    let node_said_yes = answer.status().is_success()
        && (places || answer.extensions().get::<NodeAnswered>().is_some());
    if let Some(headers) = headers.filter(|_| node_said_yes) {
        state.accepted.accept(&headers);
    }
    // The permit is held until the answer's body has been sent (or dropped): a stream counts
    // while it lasts.
    let (parts, body) = answer.into_parts();
    let body = body.map_frame(move |frame| {
        let _held = &permit;
        frame
    });
    Response::from_parts(parts, Body::new(body))
}

/// A pool's refusal: past the key's share 429 `key_busy`, past the router's 503
/// `router_busy`.
fn busy(face: Face, refusal: &corral_share::Refusal) -> Response {
    let (status, code) = if refusal.is_key() {
        (StatusCode::TOO_MANY_REQUESTS, "key_busy")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "router_busy")
    };
    let mut answer = error(face, status, code, format!("{refusal}; retry"));
    answer
        .headers_mut()
        .insert(axum::http::header::RETRY_AFTER, 1.into());
    answer
}

/// Answers `request` for `target`; a creation's body is `creation`, read by `handle`.
async fn route(
    state: &AppState,
    target: Target,
    request: Request,
    creation: Option<Bytes>,
) -> Response {
    let nodes = &state.nodes;
    match target {
        Target::Health => health(nodes),
        Target::Metrics => crate::metrics::metrics(nodes, request.headers()).await,
        Target::Operator(route) => crate::operator::answer(nodes, route, request).await,
        Target::List(face) => crate::list::list(nodes, face, request).await,
        Target::Place => {
            let face = face_of(request.uri().path(), request.headers());
            place(nodes, face, request, creation.unwrap_or_default()).await
        }
        Target::Any => {
            let face = face_of(request.uri().path(), request.headers());
            match nodes.up().into_iter().next() {
                Some((name, addr)) => send(nodes, face, &name, addr, request, None).await,
                None => no_nodes(face),
            }
        }
        Target::Sandbox { id, face } => {
            let Some(node) = node_of(&id) else {
                return unknown(face, &id);
            };
            match nodes.lookup(&node) {
                Lookup::Up(addr) => send(nodes, face, &node, addr, request, Some(&id)).await,
                Lookup::Down => gone(face, &id, &node),
                Lookup::Unknown => unknown(face, &id),
            }
        }
    }
}

/// A creation's (or a one-shot run's) body: JSON, at most `max_create_bytes`, arrived within
/// `body_timeout` (else 413, 408), its bytes counted against the key's share of the bodies
/// being read (held until the creation is answered).
async fn read_creation(
    state: &AppState,
    face: Face,
    key: &str,
    body: Body,
) -> Result<(Bytes, corral_share::Grant), Response> {
    let config = state.nodes.config();
    let max = config.max_create_bytes;
    let mut held = state
        .bodies
        .take(key, 0)
        .map_err(|refusal| busy(face, &refusal))?;
    let read = async {
        let mut body = http_body_util::Limited::new(body, max);
        let mut bytes = bytes::BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    error(
                        face,
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "payload_too_large",
                        format!("a creation's body is at most {max} bytes"),
                    )
                } else {
                    error(
                        face,
                        StatusCode::BAD_REQUEST,
                        "bad_request",
                        format!("reading the request body: {e}"),
                    )
                }
            })?;
            if let Some(data) = frame.data_ref() {
                held.try_grow(data.len() as u64)
                    .map_err(|refusal| busy(face, &refusal))?;
                bytes.extend_from_slice(data);
            }
        }
        Ok(bytes.freeze())
    };
    match tokio::time::timeout(config.body_timeout, read).await {
        Ok(Ok(bytes)) => Ok((bytes, held)),
        Ok(Err(answer)) => Err(answer),
        Err(_) => Err(error(
            face,
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!(
                "a creation's body must arrive within {} s",
                config.body_timeout.as_secs_f64()
            ),
        )),
    }
}

/// A creation (or a one-shot run) goes to the least-loaded node. Its body (read by
/// [`read_creation`]) is held, so that when that node does not take the connection (it died
/// since the last probe) the next one gets it: a node's death costs no creation.
async fn place(nodes: &Nodes, face: Face, request: Request, bytes: Bytes) -> Response {
    let (parts, _) = request.into_parts();
    for _ in 0..PLACE_ATTEMPTS {
        let Some((placed, addr)) = nodes.place() else {
            break;
        };
        let request = Request::from_parts(parts.clone(), Body::from(bytes.clone()));
        match forward(nodes.client(), nodes.config(), addr, request).await {
            Ok(answer) => return answer,
            Err(ForwardError::Unreachable { .. }) => nodes.mark_down(placed.node()),
            Err(e) => {
                return error(
                    face,
                    StatusCode::BAD_GATEWAY,
                    "node_error",
                    format!("{e}: {}", source_chain(&e)),
                )
            }
        }
    }
    no_nodes(face)
}

/// How many nodes a creation is offered to before the router gives up (each one that does
/// not take the connection is marked down first).
const PLACE_ATTEMPTS: usize = 3;

/// Forwards `request` to node `name`; a node that does not take the connection is marked
/// down (its sandbox, if the request is for one, is gone).
async fn send(
    nodes: &Nodes,
    face: Face,
    name: &NodeName,
    addr: std::net::SocketAddr,
    request: Request,
    sandbox: Option<&str>,
) -> Response {
    match forward(nodes.client(), nodes.config(), addr, request).await {
        Ok(answer) => answer,
        Err(e @ ForwardError::Unreachable { .. }) => {
            nodes.mark_down(name);
            match sandbox {
                Some(id) => gone(face, id, name),
                None => error(
                    face,
                    StatusCode::BAD_GATEWAY,
                    "node_unreachable",
                    format!("{e}; retry (another node will be chosen)"),
                ),
            }
        }
        Err(e) => error(
            face,
            StatusCode::BAD_GATEWAY,
            "node_error",
            format!("{e}: {}", source_chain(&e)),
        ),
    }
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut parts = Vec::new();
    let mut next = e.source();
    while let Some(s) = next {
        parts.push(s.to_string());
        next = s.source();
    }
    parts.join(": ")
}

/// The router's health: 200 while at least one node is up (ready), 503 otherwise; and every
/// node it knows, with its status and load.
fn health(nodes: &Nodes) -> Response {
    let known = nodes.known();
    let up = known.iter().filter(|(_, m)| m.up).count();
    let listed = known.iter().filter(|(_, m)| m.up && m.listed).count();
    let status = if up > 0 {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = serde_json::json!({
        "status": if up > 0 { "ok" } else { "no_nodes" },
        "nodes_up": up,
        "nodes_listed": listed,
        "nodes_known": known.len(),
        "nodes": crate::gather::report(nodes, &[]),
    });
    (status, axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_flight_requests_count_against_the_key_they_present() {
        let headers = |pairs: &[(&'static str, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.append(*k, v.parse().unwrap());
            }
            h
        };
        let accepted = AcceptedKeys::new();
        let a = headers(&[("authorization", "Bearer crl_a")]);
        let b = headers(&[("authorization", "Bearer crl_b")]);
        assert_eq!(
            accepted.key_of(&Target::Any, &a),
            "",
            "no node has accepted crl_a yet"
        );
        let plane = Target::Sandbox {
            id: "sbx-1".into(),
            face: Face::E2bSandbox,
        };
        assert_eq!(
            accepted.key_of(&plane, &a),
            SANDBOX_ROUTES,
            "a sandbox's own routes without an accepted key share a key of their own"
        );
        accepted.accept(&a);
        accepted.accept(&b);
        let hash = accepted.key_of(&Target::Any, &a);
        assert_eq!(
            hash,
            accepted.key_of(&Target::Any, &headers(&[("x-api-key", "crl_a")]))
        );
        assert_ne!(hash, accepted.key_of(&Target::Any, &b));
        assert!(
            !hash.is_empty() && !hash.contains("crl_a"),
            "the key itself is not kept"
        );
        assert_eq!(accepted.key_of(&Target::Any, &headers(&[])), "");
        let refused = headers(&[("authorization", "Basic crl_a")]);
        accepted.accept(&refused);
        assert_eq!(
            accepted.key_of(&Target::Any, &refused),
            "",
            "a key the nodes refuse counts as none"
        );
        // The router remembers a bounded number of keys: the least recently used goes first.
        for i in 0..ACCEPTED_KEYS {
            accepted.accept(&headers(&[("x-api-key", &format!("crl_{i}"))]));
        }
        assert_eq!(accepted.key_of(&Target::Any, &a), "", "crl_a was forgotten");
        assert_eq!(accepted.cache().len(), ACCEPTED_KEYS);
    }

    #[test]
    fn a_key_may_hold_half_the_requests_and_every_key_a_floor() {
        let limits = in_flight_limits(4096);
        assert_eq!(limits, Limits::new(4096, 2048, 64, 256));
        let one = in_flight_limits(1);
        assert_eq!((one.total, one.per_key, one.floor), (1, 1, 1));
        // Two keys holding their shares fill the router; a third still gets its floor.
        assert!(limits.admits(4096, 0, 64).is_ok());
        assert!(limits.admits(4096 + 64, 64, 1).is_err());
    }

    fn t(method: Method, path: &str) -> Target {
        target(&method, path, &HeaderMap::new())
    }

    #[test]
    fn requests_are_routed_by_the_sandbox_they_name() {
        let native = |id: &str| Target::Sandbox {
            id: id.into(),
            face: Face::Native,
        };
        let e2b = |id: &str| Target::Sandbox {
            id: id.into(),
            face: Face::E2bControl,
        };
        assert_eq!(t(Method::POST, "/v1/sandboxes"), Target::Place);
        assert_eq!(t(Method::POST, "/v1/run"), Target::Place);
        assert_eq!(t(Method::POST, "/v2/sandboxes"), Target::Place);
        assert_eq!(t(Method::GET, "/v1/sandboxes"), Target::List(Face::Native));
        assert_eq!(
            t(Method::GET, "/v2/sandboxes"),
            Target::List(Face::E2bControl)
        );
        assert_eq!(t(Method::GET, "/v1/sandboxes/sbx-1-a"), native("sbx-1-a"));
        assert_eq!(
            t(Method::PUT, "/v1/sandboxes/sbx-1-a/files/x/y.txt"),
            native("sbx-1-a")
        );
        assert_eq!(
            t(Method::POST, "/v1/sandboxes/sbx-1-a/execute"),
            native("sbx-1-a")
        );
        assert_eq!(t(Method::DELETE, "/sandboxes/sbx-1-a"), e2b("sbx-1-a"));
        assert_eq!(
            t(Method::POST, "/v2/sandboxes/sbx-1-a/connect"),
            e2b("sbx-1-a")
        );
        assert_eq!(
            t(Method::POST, "/sandboxes/sbx-1-a/timeout"),
            e2b("sbx-1-a")
        );
        assert_eq!(t(Method::GET, "/healthz"), Target::Health);
        assert_eq!(t(Method::GET, "/metrics"), Target::Metrics);
        // The operator's routes are answered for every node; whoami by any node.
        let op = Target::Operator;
        assert_eq!(
            t(Method::GET, "/v1/operator/sandboxes"),
            op(OperatorRoute::Sandboxes)
        );
        assert_eq!(
            t(Method::GET, "/v1/audit"),
            op(OperatorRoute::Audit(AuditLog::Executions))
        );
        assert_eq!(
            t(Method::GET, "/v1/audit/egress"),
            op(OperatorRoute::Audit(AuditLog::Egress))
        );
        assert_eq!(t(Method::GET, "/v1/keys"), op(OperatorRoute::Keys));
        assert_eq!(t(Method::POST, "/v1/keys"), op(OperatorRoute::CreateKey));
        assert_eq!(
            t(Method::DELETE, "/v1/keys/key-0123456789ab"),
            op(OperatorRoute::RevokeKey("key-0123456789ab".into()))
        );
        assert_eq!(t(Method::GET, "/v1/whoami"), Target::Any);
        // Restart, pause, resume and delete go to the sandbox's node.
        for (method, path) in [
            (Method::POST, "/v1/sandboxes/sbx-1-a/restart"),
            (Method::POST, "/v1/sandboxes/sbx-1-a/pause"),
            (Method::POST, "/v1/sandboxes/sbx-1-a/resume"),
            (Method::DELETE, "/v1/sandboxes/sbx-1-a"),
        ] {
            assert_eq!(t(method, path), native("sbx-1-a"), "{path}");
        }
        assert_eq!(t(Method::GET, "/openapi.json"), Target::Any);
        assert_eq!(t(Method::GET, "/v1/nothing"), Target::Any);
        // The sandbox plane is addressed by header, whatever the path.
        let mut headers = HeaderMap::new();
        headers.insert(SANDBOX_ID_HEADER, "sbx-2-b".parse().unwrap());
        assert_eq!(
            target(&Method::POST, "/execute", &headers),
            Target::Sandbox {
                id: "sbx-2-b".into(),
                face: Face::E2bSandbox
            }
        );
        assert_eq!(
            target(&Method::POST, "/v1/sandboxes", &headers),
            Target::Sandbox {
                id: "sbx-2-b".into(),
                face: Face::E2bSandbox
            }
        );
    }

    #[test]
    fn host_routed_ports_go_to_the_node_their_sandbox_names() {
        let host = |h: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(axum::http::header::HOST, h.parse().unwrap());
            target(&Method::GET, "/index.html", &headers)
        };
        assert_eq!(
            host("8000-sbx-1a2b-node1.corral.example:8421"),
            Target::Sandbox {
                id: "sbx-1a2b-node1".into(),
                face: Face::Native
            }
        );
        assert_eq!(
            host("8000-SBX-1A2B-NODE1.localhost"),
            Target::Sandbox {
                id: "sbx-1a2b-node1".into(),
                face: Face::Native
            }
        );
        // The router's own names, ids without a node, ports that are not ports.
        for h in [
            "corral-router.corral.svc:8421",
            "localhost:8421",
            "8000-sbx-1a2b.localhost",
            "x-sbx-1a2b-node1.localhost",
            "0-sbx-1a2b-node1.localhost",
            "99999-sbx-1a2b-node1.localhost",
        ] {
            assert_eq!(host(h), Target::Any, "{h}");
        }
    }
}
