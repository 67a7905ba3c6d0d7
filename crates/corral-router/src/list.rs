//! Lists of sandboxes, gathered from every node a page at a time. A page walks the nodes up in
//! the order of their names, each node's sandboxes in creation order, until it holds `limit`
//! sandboxes; the cursor it gives back (`NODE~CURSOR`) says where the next page begins: at that
//! node, after that node's own cursor. Nothing is kept between pages, so any router replica
//! serves the next page. A node that is down is passed over (its sandboxes are gone).

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use corral_kernel::NodeName;
use corral_service::service::LIST_LIMIT;
use serde::Deserialize;
use serde_json::Value;

use crate::gather::{fetch_answer, node_error, Missing};
use crate::nodes::Nodes;
use crate::proxy::forward;
use crate::route::{error, no_nodes, Face};

/// E2B's `Sandbox.list()` pages by 100 unless it asks for another size, as a node does.
const E2B_DEFAULT_LIMIT: usize = 100;
const E2B_NEXT_HEADER: &str = "x-next-token";
/// Between a router cursor's node and the node's own cursor.
const SEPARATOR: char = '~';

/// A native list page, as a node answers it.
#[derive(Deserialize)]
struct NativePage {
    sandboxes: Vec<Value>,
    next: Option<String>,
}

/// Where a page begins: at node `node` (or the first node after it, if it is gone), after
/// the node's cursor `after` (at its start if empty).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Cursor {
    pub node: NodeName,
    pub after: String,
}

pub(crate) fn parse_cursor(token: &str) -> Option<Cursor> {
    let (node, after) = token.split_once(SEPARATOR)?;
    Some(Cursor {
        node: node.parse().ok()?,
        after: after.to_string(),
    })
}

pub(crate) fn cursor(node: &NodeName, after: &str) -> String {
    format!("{node}{SEPARATOR}{after}")
}

pub(crate) async fn list(nodes: &Nodes, face: Face, request: Request) -> Response {
    let (cursor_key, default_limit) = match face {
        Face::Native => ("after", LIST_LIMIT),
        _ => ("nextToken", E2B_DEFAULT_LIMIT),
    };
    let pairs: Vec<(String, String)> =
        match serde_urlencoded::from_str(request.uri().query().unwrap_or("")) {
            Ok(pairs) => pairs,
            Err(e) => {
                return error(
                    face,
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    format!("the query: {e}"),
                )
            }
        };
    let mut token = None;
    let mut limit = None;
    let mut rest = Vec::new();
    for (key, value) in pairs {
        if key == cursor_key {
            token = Some(value);
        } else if key == "limit" {
            limit = Some(value);
        } else {
            rest.push((key, value));
        }
    }
    let up = nodes.up();
    let limit = match limit.as_deref().map(str::parse::<usize>) {
        None => default_limit,
        Some(Ok(n)) if n >= 1 && (n <= LIST_LIMIT || face != Face::Native) => n.min(LIST_LIMIT),
        // A limit the nodes refuse: one of them says why, in its words.
        Some(_) => {
            return match up.first() {
                Some((_, addr)) => forward(nodes.client(), nodes.config(), *addr, request)
                    .await
                    .unwrap_or_else(|e| node_error(face, e.to_string())),
                None => no_nodes(face),
            }
        }
    };
    let start = match token.as_deref().map(parse_cursor) {
        None => None,
        Some(Some(cursor)) => Some(cursor),
        Some(None) => {
            return error(
                face,
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("`{cursor_key}` is not a cursor this service gave"),
            )
        }
    };
    if up.is_empty() {
        return no_nodes(face);
    }
    let headers = request.headers().clone();
    let path = request.uri().path().to_string();
    let mut items: Vec<Value> = Vec::new();
    let mut next = None;
    let mut answered = false;
    let first = start
        .as_ref()
        .map_or(0, |c| up.partition_point(|(name, _)| *name < c.node));
    for (i, (name, addr)) in up.iter().enumerate().skip(first) {
        let mut query = rest.clone();
        query.push(("limit".into(), (limit - items.len()).to_string()));
        if let Some(c) = start
            .as_ref()
            .filter(|c| c.node == *name && !c.after.is_empty())
        {
            query.push((cursor_key.into(), c.after.clone()));
        }
        let page = match page_of(nodes, face, *addr, &path, &query, &headers).await {
            Ok(page) => page,
            Err(Missing::Down) => {
                nodes.mark_down(name);
                continue;
            }
            Err(Missing::Answer(answer)) => return answer,
        };
        answered = true;
        items.extend(page.items);
        if let Some(after) = page.next {
            next = Some(cursor(name, &after));
            break;
        }
        if items.len() >= limit {
            next = up.get(i + 1).map(|(following, _)| cursor(following, ""));
            break;
        }
    }
    let mut answer = match face {
        Face::Native => {
            let mut body = serde_json::json!({ "sandboxes": items });
            if let Some(next) = next {
                body["next"] = next.into();
            }
            axum::Json(body).into_response()
        }
        _ => {
            let mut answer = axum::Json(items).into_response();
            if let Some(next) = next.and_then(|n| HeaderValue::from_str(&n).ok()) {
                answer.headers_mut().insert(E2B_NEXT_HEADER, next);
            }
            answer
        }
    };
    if answered {
        answer.extensions_mut().insert(crate::route::NodeAnswered);
    }
    answer
}

struct Page {
    items: Vec<Value>,
    next: Option<String>,
}

async fn page_of(
    nodes: &Nodes,
    face: Face,
    addr: std::net::SocketAddr,
    path: &str,
    query: &[(String, String)],
    headers: &HeaderMap,
) -> Result<Page, Missing> {
    let query = serde_urlencoded::to_string(query).map_err(|e| {
        Missing::Answer(error(
            face,
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("the query: {e}"),
        ))
    })?;
    let max = nodes.config().max_list_bytes;
    let (answer_headers, bytes) = fetch_answer(
        nodes,
        face,
        addr,
        Method::GET,
        &format!("{path}?{query}"),
        headers,
        max,
    )
    .await?;
    let next_header = answer_headers
        .get(E2B_NEXT_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let bad = |e: serde_json::Error| {
        Missing::Answer(node_error(
            face,
            format!("node {addr}'s list is not a list of sandboxes: {e}"),
        ))
    };
    match face {
        Face::Native => {
            let page: NativePage = serde_json::from_slice(&bytes).map_err(bad)?;
            Ok(Page {
                items: page.sandboxes,
                next: page.next,
            })
        }
        _ => Ok(Page {
            items: serde_json::from_slice(&bytes).map_err(bad)?,
            next: next_header,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_name_a_node_and_its_own_cursor() {
        let node: NodeName = "corral-node-1".parse().unwrap();
        let c = cursor(&node, "00000000000000000042-sbx-1-corral-node-1");
        assert_eq!(
            parse_cursor(&c),
            Some(Cursor {
                node: node.clone(),
                after: "00000000000000000042-sbx-1-corral-node-1".into()
            })
        );
        assert_eq!(
            parse_cursor(&cursor(&node, "")),
            Some(Cursor {
                node,
                after: String::new()
            })
        );
        for bad in ["", "no-separator", "Bad~x", "~x"] {
            assert_eq!(parse_cursor(bad), None, "{bad:?}");
        }
    }
}
