//! The operator's routes through a router answer for the whole cluster (docs/scale-out.md,
//! "Operators and the console"), each node deciding on the key as it would alone:
//!
//! - `GET /v1/operator/sandboxes`: every node's list, merged and paged as the native list is
//!   (by node name, then creation; the cursor `NODE~CURSOR`, CURSOR the node's own), each row
//!   naming its `node`;
//! - `GET /v1/audit` and `GET /v1/audit/egress`: every node's log (of executions, of egress
//!   decisions) merged newest first, a page at a time; the cursor says where each node's log
//!   resumes;
//! - `GET /v1/keys`: every node's keys, a key held differently by some node named so;
//! - `DELETE /v1/keys/{id}`: revoked on every node, or an error naming where it was not;
//! - `POST /v1/keys`: refused (a key one node makes is unknown to the others).
//!
//! Each answer has a `nodes` section: every node this router knows and whether it answers, so
//! that a node that is down (or that refuses a key the others take: their keys differ) is
//! reported, not silently missing. A key every node refuses gets a node's refusal. Every
//! node's answer is read whole, at most `max_list_bytes`.

use std::collections::{BTreeMap, VecDeque};

use axum::extract::Request;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use corral_kernel::NodeName;
use corral_service::db::{AUDIT_DEFAULT, AUDIT_LIMIT};
use corral_service::service::LIST_LIMIT;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::gather::{fetch, forward_again, node_error, report, Missing, Refusals};
use crate::list::{cursor, parse_cursor};
use crate::nodes::{Lookup, Nodes};
use crate::proxy::ForwardError;
use crate::route::{error, no_nodes, Face};

/// The operator's routes a router answers itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OperatorRoute {
    Sandboxes,
    /// `GET` of this audit log's path.
    Audit(AuditLog),
    Keys,
    CreateKey,
    /// The key id as the path has it (still percent-encoded).
    RevokeKey(String),
}

/// The audit logs a node keeps (docs/api.md, "Operators").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AuditLog {
    Executions,
    Egress,
}

impl AuditLog {
    fn path(self) -> &'static str {
        match self {
            AuditLog::Executions => "/v1/audit",
            AuditLog::Egress => "/v1/audit/egress",
        }
    }
}

pub(crate) async fn answer(nodes: &Nodes, route: OperatorRoute, request: Request) -> Response {
    let headers = request.headers().clone();
    let query = match Query::parse(request.uri().query()) {
        Ok(query) => query,
        Err(message) => return bad_request(message),
    };
    match route {
        OperatorRoute::Sandboxes => sandboxes(nodes, query, &headers).await,
        OperatorRoute::Audit(log) => audit(nodes, log, query, &headers).await,
        OperatorRoute::Keys => keys(nodes, &headers).await,
        OperatorRoute::CreateKey => create_key(nodes, &headers).await,
        OperatorRoute::RevokeKey(id) => revoke_key(nodes, &id, &headers).await,
    }
}

fn bad_request(message: String) -> Response {
    error(
        Face::Native,
        StatusCode::BAD_REQUEST,
        "bad_request",
        message,
    )
}

/// A request's query: the router's own parameters taken out, the rest passed to the nodes.
struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    /// The query, or why it is not one (a 400's message).
    fn parse(query: Option<&str>) -> Result<Query, String> {
        serde_urlencoded::from_str(query.unwrap_or(""))
            .map(|pairs| Query { pairs })
            .map_err(|e| format!("the query: {e}"))
    }

    /// Takes parameter `name` out (its last value).
    fn take(&mut self, name: &str) -> Option<String> {
        let mut found = None;
        self.pairs.retain(|(key, value)| {
            let this = key == name;
            if this {
                found = Some(value.clone());
            }
            !this
        });
        found
    }

    /// `path`, with what is left of the query and `extra`.
    fn path(&self, path: &str, extra: &[(&str, String)]) -> String {
        let mut pairs: Vec<(&str, &str)> = self
            .pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        pairs.extend(extra.iter().map(|(k, v)| (*k, v.as_str())));
        match serde_urlencoded::to_string(&pairs) {
            Ok(query) if !query.is_empty() => format!("{path}?{query}"),
            _ => path.to_string(),
        }
    }
}

/// The page size asked for, or why it is not one (a 400's message).
fn limit(given: Option<String>, default: usize, max: usize) -> Result<usize, String> {
    match given.map(|v| v.parse::<usize>()) {
        None => Ok(default),
        Some(Ok(n)) if (1..=max).contains(&n) => Ok(n),
        Some(_) => Err(format!("`limit` must be between 1 and {max}")),
    }
}

/// `row` (a JSON object) with `"node": name` added.
fn with_node(mut row: Value, name: &NodeName) -> Value {
    if let Value::Object(map) = &mut row {
        map.insert("node".into(), name.as_str().into());
    }
    row
}

/// One page of a node's operator list.
#[derive(Deserialize)]
struct SandboxList {
    sandboxes: Vec<Value>,
    /// The node's cursor of its next page.
    next: Option<String>,
}

async fn sandboxes(nodes: &Nodes, mut query: Query, headers: &HeaderMap) -> Response {
    let limit = match limit(query.take("limit"), LIST_LIMIT, LIST_LIMIT) {
        Ok(limit) => limit,
        Err(message) => return bad_request(message),
    };
    let start = match query.take("after").map(|token| parse_cursor(&token)) {
        None => None,
        Some(Some(start)) => Some(start),
        Some(None) => return bad_request("`after` is not a cursor this service gave".into()),
    };
    let up = nodes.up();
    if up.is_empty() {
        return no_nodes(Face::Native);
    }
    let max = nodes.config().max_list_bytes;
    let first = start
        .as_ref()
        .map_or(0, |c| up.partition_point(|(name, _)| *name < c.node));
    let mut items: Vec<Value> = Vec::new();
    let mut next = None;
    let mut refusals = Refusals::default();
    for (i, (name, addr)) in up.iter().enumerate().skip(first) {
        // The node pages its list (in creation order) as the native list does: the router
        // asks for what is left of the page, from where the cursor says this node resumes.
        let mut extra = vec![("limit", (limit - items.len()).to_string())];
        if let Some(c) = start
            .as_ref()
            .filter(|c| c.node == *name && !c.after.is_empty())
        {
            extra.push(("after", c.after.clone()));
        }
        let path = query.path("/v1/operator/sandboxes", &extra);
        let bytes = match fetch(nodes, Face::Native, *addr, Method::GET, &path, headers, max).await
        {
            Ok(bytes) => bytes,
            Err(Missing::Down) => {
                nodes.mark_down(name);
                continue;
            }
            Err(Missing::Answer(answer)) => match refusals.keep(name, answer) {
                None => continue,
                Some(answer) => return answer,
            },
        };
        refusals.taken();
        let page = match serde_json::from_slice::<SandboxList>(&bytes) {
            Ok(page) => page,
            Err(e) => {
                return node_error(
                    Face::Native,
                    format!("node {name}'s operator list is not a list of sandboxes: {e}"),
                )
            }
        };
        if page.sandboxes.len() > limit - items.len() {
            return node_error(
                Face::Native,
                format!("node {name}'s operator list is longer than the page asked for"),
            );
        }
        items.extend(page.sandboxes.into_iter().map(|row| with_node(row, name)));
        if let Some(after) = page.next {
            next = Some(cursor(name, &after));
            break;
        }
        if items.len() == limit {
            next = up.get(i + 1).map(|(following, _)| cursor(following, ""));
            break;
        }
    }
    if let Some(refusal) = refusals.refusal() {
        return refusal;
    }
    let mut body = json!({ "sandboxes": items, "nodes": report(nodes, &refusals.nodes) });
    if let Some(next) = next {
        body["next"] = next.into();
    }
    Json(body).into_response()
}

#[derive(Deserialize)]
struct AuditPage {
    entries: Vec<Value>,
    next: Option<i64>,
}

/// An audit line as the merge needs it.
struct Line {
    at: i64,
    id: i64,
    row: Value,
}

/// An audit cursor: for each node whose log goes on, the id its next page is `before` (none:
/// from its newest line). Written as a query string, `NODE=ID&NODE=&…`.
fn parse_audit_cursor(token: &str) -> Option<Vec<(NodeName, Option<i64>)>> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(token).ok()?;
    if pairs.is_empty() {
        return None;
    }
    let resume: Vec<(NodeName, Option<i64>)> = pairs
        .into_iter()
        .map(|(node, before)| {
            let before = match before.as_str() {
                "" => None,
                id => Some(id.parse().ok()?),
            };
            Some((node.parse().ok()?, before))
        })
        .collect::<Option<_>>()?;
    // Each node once: a router writes no other.
    let distinct: std::collections::BTreeSet<&NodeName> = resume.iter().map(|(n, _)| n).collect();
    (distinct.len() == resume.len()).then_some(resume)
}

fn audit_cursor(resume: &[(NodeName, Option<i64>)]) -> Option<String> {
    let pairs: Vec<(&str, String)> = resume
        .iter()
        .map(|(node, before)| {
            (
                node.as_str(),
                before.map_or(String::new(), |b| b.to_string()),
            )
        })
        .collect();
    serde_urlencoded::to_string(pairs).ok()
}

/// One node's part of an audit page.
struct Source {
    node: NodeName,
    before: Option<i64>,
    lines: VecDeque<Line>,
    /// The node said there may be more after what it gave.
    more: bool,
    last_taken: Option<i64>,
}

async fn audit(nodes: &Nodes, log: AuditLog, mut query: Query, headers: &HeaderMap) -> Response {
    let limit = match limit(query.take("limit"), AUDIT_DEFAULT, AUDIT_LIMIT) {
        Ok(limit) => limit,
        Err(message) => return bad_request(message),
    };
    let from: Vec<(NodeName, Option<i64>)> = match query.take("before") {
        None => nodes
            .up()
            .into_iter()
            .map(|(name, _)| (name, None))
            .collect(),
        Some(token) => match parse_audit_cursor(&token) {
            Some(from) => from,
            None => return bad_request("`before` is not a cursor this service gave".into()),
        },
    };
    // A node of the cursor that is down now is dropped from the paging: the `nodes` section
    // says it does not answer.
    let targets: Vec<(NodeName, std::net::SocketAddr, Option<i64>)> = from
        .into_iter()
        .filter_map(|(name, before)| match nodes.lookup(&name) {
            Lookup::Up(addr) => Some((name, addr, before)),
            Lookup::Down | Lookup::Unknown => None,
        })
        .collect();
    if nodes.up().is_empty() {
        return no_nodes(Face::Native);
    }
    let max = nodes.config().max_list_bytes;
    let answers = futures_util::future::join_all(targets.iter().map(|(_, addr, before)| {
        let mut extra = vec![("limit", limit.to_string())];
        if let Some(before) = before {
            extra.push(("before", before.to_string()));
        }
        let path = query.path(log.path(), &extra);
        async move { fetch(nodes, Face::Native, *addr, Method::GET, &path, headers, max).await }
    }))
    .await;
    let mut sources = Vec::new();
    let mut refusals = Refusals::default();
    for ((node, _, before), answer) in targets.into_iter().zip(answers) {
        let bytes = match answer {
            Ok(bytes) => bytes,
            Err(Missing::Down) => {
                nodes.mark_down(&node);
                continue;
            }
            Err(Missing::Answer(answer)) => match refusals.keep(&node, answer) {
                None => continue,
                Some(answer) => return answer,
            },
        };
        refusals.taken();
        let page: AuditPage = match serde_json::from_slice(&bytes) {
            Ok(page) => page,
            Err(e) => {
                return node_error(
                    Face::Native,
                    format!("node {node}'s audit log is not one: {e}"),
                )
            }
        };
        let mut lines = VecDeque::new();
        for row in page.entries {
            let (Some(at), Some(id)) = (
                row.get("at").and_then(Value::as_i64),
                row.get("id").and_then(Value::as_i64),
            ) else {
                return node_error(
                    Face::Native,
                    format!("node {node}'s audit line has no `at` or `id`"),
                );
            };
            lines.push_back(Line { at, id, row });
        }
        sources.push(Source {
            node,
            before,
            lines,
            more: page.next.is_some(),
            last_taken: None,
        });
    }
    // Each node's log is newest first; the page takes the newest head of them all, a node's
    // lines always in its own order (so each node's place is one id), until it holds `limit`.
    let mut entries = Vec::new();
    while entries.len() < limit {
        let newest = sources
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.lines.front().map(|line| (i, line.at)))
            .fold(None, |best: Option<(usize, i64)>, (i, at)| match best {
                Some((_, best_at)) if best_at >= at => best,
                _ => Some((i, at)),
            });
        let Some((i, _)) = newest else { break };
        let source = &mut sources[i];
        let Some(line) = source.lines.pop_front() else {
            break;
        };
        source.last_taken = Some(line.id);
        entries.push(with_node(line.row, &source.node));
    }
    let resume: Vec<(NodeName, Option<i64>)> = sources
        .into_iter()
        .filter(|s| !s.lines.is_empty() || s.more)
        .map(|s| (s.node, s.last_taken.or(s.before)))
        .collect();
    if let Some(refusal) = refusals.refusal() {
        return refusal;
    }
    let mut body = json!({ "entries": entries, "nodes": report(nodes, &refusals.nodes) });
    if !resume.is_empty() {
        if let Some(next) = audit_cursor(&resume) {
            body["next"] = next.into();
        }
    }
    Json(body).into_response()
}

#[derive(Deserialize)]
struct KeyList {
    keys: Vec<Value>,
}

/// What must be the same of a key on every node (its `created_at` is when each node added it).
fn key_terms(key: &Value) -> [&Value; 3] {
    ["name", "revoked", "operator"].map(|field| key.get(field).unwrap_or(&Value::Null))
}

async fn keys(nodes: &Nodes, headers: &HeaderMap) -> Response {
    let up = nodes.up();
    if up.is_empty() {
        return no_nodes(Face::Native);
    }
    let max = nodes.config().max_list_bytes;
    let answers = futures_util::future::join_all(up.iter().map(|(_, addr)| {
        fetch(
            nodes,
            Face::Native,
            *addr,
            Method::GET,
            "/v1/keys",
            headers,
            max,
        )
    }))
    .await;
    let mut held: Vec<(NodeName, BTreeMap<String, Value>)> = Vec::new();
    let mut order: Vec<String> = Vec::new();
    let mut refusals = Refusals::default();
    for ((name, _), answer) in up.into_iter().zip(answers) {
        let bytes = match answer {
            Ok(bytes) => bytes,
            Err(Missing::Down) => {
                nodes.mark_down(&name);
                continue;
            }
            Err(Missing::Answer(answer)) => match refusals.keep(&name, answer) {
                None => continue,
                Some(answer) => return answer,
            },
        };
        refusals.taken();
        let list: KeyList = match serde_json::from_slice(&bytes) {
            Ok(list) => list,
            Err(e) => {
                return node_error(
                    Face::Native,
                    format!("node {name}'s keys are not a key list: {e}"),
                )
            }
        };
        let mut by_id = BTreeMap::new();
        for key in list.keys {
            let Some(id) = key.get("id").and_then(Value::as_str).map(str::to_string) else {
                return node_error(
                    Face::Native,
                    format!("node {name} lists a key without an id"),
                );
            };
            if !order.contains(&id) {
                order.push(id.clone());
            }
            by_id.insert(id, key);
        }
        held.push((name, by_id));
    }
    let keys: Vec<Value> = order
        .iter()
        .filter_map(|id| {
            let shown = held.iter().find_map(|(_, keys)| keys.get(id))?.clone();
            let differs: Vec<&str> = held
                .iter()
                .filter(|(_, keys)| {
                    keys.get(id)
                        .is_none_or(|key| key_terms(key) != key_terms(&shown))
                })
                .map(|(name, _)| name.as_str())
                .collect();
            let mut shown = shown;
            if !differs.is_empty() {
                shown["differs_on"] = differs.into();
            }
            Some(shown)
        })
        .collect();
    if let Some(refusal) = refusals.refusal() {
        return refusal;
    }
    Json(json!({ "keys": keys, "nodes": report(nodes, &refusals.nodes) })).into_response()
}

/// A key made through a router would be made by one node, with a secret the others do not
/// know: refused, after the node has said whether the key asking is an operator's (so that
/// any other key is refused as a node refuses it).
async fn create_key(nodes: &Nodes, headers: &HeaderMap) -> Response {
    let Some((name, addr)) = nodes.up().into_iter().next() else {
        return no_nodes(Face::Native);
    };
    let max = nodes.config().max_list_bytes;
    match fetch(
        nodes,
        Face::Native,
        addr,
        Method::GET,
        "/v1/keys",
        headers,
        max,
    )
    .await
    {
        Ok(_) => error(
            Face::Native,
            StatusCode::NOT_IMPLEMENTED,
            "keys_on_nodes",
            "keys are not made through a router: a key one node made would be refused by the \
             others. Make it on one host with `corral key create`, and add it to every node \
             with `corral key add` (docs/scale-out.md, \"Keys are checked by the nodes\")"
                .into(),
        ),
        Err(Missing::Down) => {
            nodes.mark_down(&name);
            error(
                Face::Native,
                StatusCode::BAD_GATEWAY,
                "node_unreachable",
                format!("node {name} does not answer; retry"),
            )
        }
        Err(Missing::Answer(answer)) => answer,
    }
}

/// What one node did with a revocation.
enum Revoked {
    Done,
    /// No live key of that id there (already revoked, or never added).
    NotLive,
    /// The node refused the request (401, 403): nothing changed there.
    Refused(Response),
    Failed(String),
}

async fn revoke_key(nodes: &Nodes, id: &str, headers: &HeaderMap) -> Response {
    let known = nodes.known();
    if !known.iter().any(|(_, m)| m.up) {
        return no_nodes(Face::Native);
    }
    let path = format!("/v1/keys/{id}");
    let outcomes = futures_util::future::join_all(known.iter().map(|(name, member)| {
        let path = path.as_str();
        async move {
            if !member.up {
                return Revoked::Failed("does not answer".into());
            }
            let uri: axum::http::Uri = match path.parse() {
                Ok(uri) => uri,
                Err(e) => return Revoked::Failed(format!("the path: {e}")),
            };
            let request = || {
                let mut request = Request::new(axum::body::Body::empty());
                *request.method_mut() = Method::DELETE;
                *request.uri_mut() = uri.clone();
                *request.headers_mut() = headers.clone();
                request
                    .headers_mut()
                    .remove(axum::http::header::CONTENT_LENGTH);
                request
            };
            match forward_again(nodes, member.addr, request).await {
                Ok(answer) => match answer.status() {
                    StatusCode::NO_CONTENT => Revoked::Done,
                    StatusCode::NOT_FOUND => Revoked::NotLive,
                    StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Revoked::Refused(answer),
                    status => Revoked::Failed(format!("answered {status}")),
                },
                Err(e @ ForwardError::Unreachable { .. }) => {
                    nodes.mark_down(name);
                    Revoked::Failed(e.to_string())
                }
                Err(e) => Revoked::Failed(e.to_string()),
            }
        }
    }))
    .await;
    let mut done = Vec::new();
    let mut not_live = Vec::new();
    let mut missed = Vec::new();
    let mut refusal = None;
    for ((name, _), outcome) in known.iter().zip(outcomes) {
        match outcome {
            Revoked::Done => done.push(name.as_str()),
            Revoked::NotLive => not_live.push(name.as_str()),
            Revoked::Refused(answer) => {
                missed.push(format!("{name} (refused the key asking)"));
                refusal.get_or_insert(answer);
            }
            Revoked::Failed(why) => missed.push(format!("{name} ({why})")),
        }
    }
    // Refused everywhere it was heard: this key may not revoke keys; nothing changed.
    if let Some(refusal) = refusal.filter(|_| done.is_empty() && not_live.is_empty()) {
        return refusal;
    }
    if missed.is_empty() {
        return if done.is_empty() {
            error(
                Face::Native,
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no live key {id} on any node"),
            )
        } else {
            StatusCode::NO_CONTENT.into_response()
        };
    }
    error(
        Face::Native,
        StatusCode::BAD_GATEWAY,
        "keys_differ",
        format!(
            "key {id} was revoked on [{}] and was not live on [{}], but NOT revoked on [{}]: \
             it is still valid there, and the nodes now hold different keys. Revoke it on those \
             nodes (`corral key revoke {id}`), or retry here when they answer",
            done.join(", "),
            not_live.join(", "),
            missed.join(", "),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_cursors_say_where_each_node_resumes() {
        let a: NodeName = "node-a".parse().unwrap();
        let b: NodeName = "node-b".parse().unwrap();
        let resume = vec![(a.clone(), Some(42)), (b.clone(), None)];
        let token = audit_cursor(&resume).unwrap();
        assert_eq!(parse_audit_cursor(&token), Some(resume));
        for bad in [
            "",
            "X",
            "Node=1",
            "node-a=x",
            "node-a=1&-b=2",
            "node-a=1&node-a=2",
        ] {
            assert_eq!(parse_audit_cursor(bad), None, "{bad:?}");
        }
    }
}
