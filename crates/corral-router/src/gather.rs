//! Reading one whole answer from one node, bounded, for the routes that gather every node's
//! answer into one (the operator's routes, `/metrics`): the client's headers (its key) go to
//! the node unchanged, so each node decides on the key as it would alone.

use std::net::SocketAddr;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::Response;
use corral_kernel::NodeName;
use http_body_util::BodyExt as _;

use crate::nodes::Nodes;
use crate::proxy::{forward, ForwardError};
use crate::route::{error, Face};

/// Why a node's answer is not there to gather.
pub(crate) enum Missing {
    /// The node does not take the connection: it is down (and is marked so).
    Down,
    /// What to answer the client instead: the node's own refusal (401, 403, 400, …), passed
    /// on as it is, or the router's 502 for an answer it could not read.
    Answer(Response),
}

/// The body of node `addr`'s answer to `method path_and_query` with `headers`, when it is 200
/// and at most `max` bytes; the router's own errors in `face`'s shape.
pub(crate) async fn fetch(
    nodes: &Nodes,
    face: Face,
    addr: SocketAddr,
    method: Method,
    path_and_query: &str,
    headers: &HeaderMap,
    max: usize,
) -> Result<Bytes, Missing> {
    fetch_answer(nodes, face, addr, method, path_and_query, headers, max)
        .await
        .map(|(_, body)| body)
}

/// As [`fetch`], with the answer's headers.
pub(crate) async fn fetch_answer(
    nodes: &Nodes,
    face: Face,
    addr: SocketAddr,
    method: Method,
    path_and_query: &str,
    headers: &HeaderMap,
    max: usize,
) -> Result<(HeaderMap, Bytes), Missing> {
    let uri: axum::http::Uri = path_and_query.parse().map_err(|e| {
        Missing::Answer(error(
            face,
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("{e}"),
        ))
    })?;
    let request = || {
        let mut request = Request::new(Body::empty());
        *request.method_mut() = method.clone();
        *request.uri_mut() = uri.clone();
        *request.headers_mut() = headers.clone();
        request.headers_mut().remove(header::CONTENT_LENGTH);
        request.headers_mut().remove(header::CONTENT_TYPE);
        request
    };
    let answer = match forward_again(nodes, addr, request).await {
        Ok(answer) => answer,
        Err(ForwardError::Unreachable { .. }) => return Err(Missing::Down),
        Err(e) => return Err(Missing::Answer(node_error(face, e.to_string()))),
    };
    if answer.status() != StatusCode::OK {
        return Err(Missing::Answer(answer));
    }
    let (parts, body) = answer.into_parts();
    http_body_util::Limited::new(body, max)
        .collect()
        .await
        .map(|collected| (parts.headers, collected.to_bytes()))
        .map_err(|e| {
            Missing::Answer(node_error(
                face,
                format!("reading node {addr}'s answer (at most {max} bytes): {e}"),
            ))
        })
}

/// Forwards `request()` to node `addr`, twice if the first fails on a kept-alive connection
/// the node closed (it stopped, or restarted): for requests that may be repeated (a read, a
/// revocation), so that a node's restart is not taken for a failure.
pub(crate) async fn forward_again(
    nodes: &Nodes,
    addr: SocketAddr,
    request: impl Fn() -> Request,
) -> Result<Response, ForwardError> {
    match forward(nodes.client(), nodes.config(), addr, request()).await {
        Err(ForwardError::Failed { .. }) => {
            forward(nodes.client(), nodes.config(), addr, request()).await
        }
        first => first,
    }
}

/// The router's 502: a node's answer it could not read or use.
pub(crate) fn node_error(face: Face, message: String) -> Response {
    error(face, StatusCode::BAD_GATEWAY, "node_error", message)
}

/// A node as the gathered answers report it.
#[derive(Debug, serde::Serialize)]
pub(crate) struct NodeReport {
    pub name: String,
    /// `ok`; `degraded` (a zygote of its pool is being replaced); `unreachable` (its last
    /// probe, or the last request sent to it, did not reach it: what it holds is missing from
    /// the answer); `refused` (it refused the key that other nodes took: the nodes' keys
    /// differ, and what it holds is missing from the answer).
    pub status: &'static str,
    pub sessions_live: u64,
    pub max_sessions: u64,
}

/// Every node this router knows, by name; those in `refused` refused the request's key.
pub(crate) fn report(nodes: &Nodes, refused: &[NodeName]) -> Vec<NodeReport> {
    nodes
        .known()
        .into_iter()
        .map(|(name, m)| NodeReport {
            status: match (m.up, m.degraded) {
                (false, _) => "unreachable",
                _ if refused.contains(&name) => "refused",
                (true, true) => "degraded",
                (true, false) => "ok",
            },
            name: name.to_string(),
            sessions_live: m.live,
            max_sessions: m.max,
        })
        .collect()
}

/// The nodes that refused a request's key (401, 403) while gathering. Keys are the same on every
/// node, so a key is refused by all or none; when some node refuses a key others take, the
/// nodes' keys differ: the answer holds what the others gave and names the refusing nodes.
#[derive(Default)]
pub(crate) struct Refusals {
    first: Option<Response>,
    pub nodes: Vec<NodeName>,
    taken: bool,
}

impl Refusals {
    /// Keeps `answer` when it is node `node`'s refusal of the key; else gives it back.
    pub fn keep(&mut self, node: &NodeName, answer: Response) -> Option<Response> {
        if !matches!(
            answer.status(),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
        ) {
            return Some(answer);
        }
        self.nodes.push(node.clone());
        self.first.get_or_insert(answer);
        None
    }

    /// A node took the key.
    pub fn taken(&mut self) {
        self.taken = true;
    }

    /// The refusal to answer with: a node's, when no node took the key.
    pub fn refusal(&mut self) -> Option<Response> {
        if self.taken {
            None
        } else {
            self.first.take()
        }
    }
}
