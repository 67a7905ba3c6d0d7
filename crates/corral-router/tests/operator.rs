//! The operator's routes, `/metrics` and the sandbox actions through the router, against fake
//! nodes that answer as nodes do (an operator key `op`, a plain key `plain`): every node's
//! sandboxes, audit lines, keys and metrics merged, paged and bounded; a node that is down
//! reported, not silently missing; a plain key refused as a node refuses it; keys revoked on
//! every node or an error naming where not; restart, pause, resume and delete reaching the
//! sandbox's node.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Path, Query};
use axum::http::{HeaderMap, Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use corral_router::MAX_METRICS_BYTES;
use http_body_util::BodyExt as _;
use serde_json::{json, Value};
use tower::ServiceExt as _;

mod support;
use support::router_for;

/// What a fake node holds.
#[derive(Clone, Default)]
struct Spec {
    /// Its sandboxes, as stamps (`sbx-<stamp hex>-<node>`).
    sandboxes: Vec<u64>,
    /// Its audit log, newest first: (id, at).
    audit: Vec<(i64, i64)>,
    /// Its keys: (id, revoked).
    keys: Vec<(&'static str, bool)>,
    /// Bytes of padding in each operator-list row and in its metrics.
    pad: usize,
}

type Calls = Arc<Mutex<Vec<String>>>;

fn refused() -> Response {
    (
        StatusCode::FORBIDDEN,
        Json(json!({"error": {"code": "forbidden", "message": "this needs an operator key"}})),
    )
        .into_response()
}

/// Node `node`'s refusal of a request that is not an operator's: 403 for the plain key, 401
/// for any other; the operator key `drifted` is unknown to `node-b` (the nodes' keys differ).
fn refusal(node: &str, headers: &HeaderMap) -> Option<Response> {
    match headers.get("authorization").and_then(|v| v.to_str().ok()) {
        Some("Bearer op") => None,
        Some("Bearer drifted") if node != "node-b" => None,
        Some("Bearer plain") => Some(refused()),
        _ => Some(
            (
                StatusCode::UNAUTHORIZED,
                Json(json!({"error": {"code": "unauthorized", "message": "no such key"}})),
            )
                .into_response(),
        ),
    }
}

/// A node's audit log (`log`: which of the two): newest first, paged by `before` and `limit`
/// as a node pages it; every line says which log it is from.
fn audit_log(
    name: &'static str,
    audit: Vec<(i64, i64)>,
    log: &'static str,
) -> axum::routing::MethodRouter {
    get(
        move |headers: HeaderMap, Query(q): Query<Vec<(String, String)>>| async move {
            // Any key the node holds sees (its own) lines; an unknown key is 401.
            match refusal(name, &headers) {
                Some(r) if r.status() == StatusCode::UNAUTHORIZED => return Err(r),
                _ => {}
            }
            let param = |n: &str| q.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
            let limit: usize = param("limit").unwrap().parse().unwrap();
            let before: Option<i64> = param("before").map(|b| b.parse().unwrap());
            let entries: Vec<Value> = audit
                .iter()
                .filter(|(id, _)| before.is_none_or(|b| *id < b))
                .take(limit)
                .map(|(id, at)| json!({"id": id, "at": at, "key_id": "key-a", "log": log}))
                .collect();
            let next = (entries.len() == limit).then(|| entries.last().unwrap()["id"].clone());
            Ok(Json(json!({"entries": entries, "next": next})))
        },
    )
}

async fn fake_node(
    name: &'static str,
    spec: Spec,
    calls: Calls,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let keys = Arc::new(Mutex::new(spec.keys.clone()));
    let revoked = keys.clone();
    let list = spec.clone();
    let audit = spec.audit.clone();
    let pad = spec.pad;
    let live = spec.sandboxes.len();
    let acted = calls.clone();
    let app = Router::new()
        .route(
            "/healthz",
            get(move || async move {
                Json(json!({"status": "ok", "node": name, "sessions_live": live, "max_sessions": 10}))
            }),
        )
        .route(
            "/v1/operator/sandboxes",
            get(
                move |headers: HeaderMap, Query(q): Query<Vec<(String, String)>>| async move {
                    if let Some(refusal) = refusal(name, &headers) {
                        return Err(refusal);
                    }
                    if let Some((k, _)) = q.iter().find(|(k, _)| !["key", "limit", "after"].contains(&k.as_str())) {
                        return Err((
                            StatusCode::BAD_REQUEST,
                            Json(json!({"error": {"code": "bad_request", "message": format!("unknown field `{k}`")}})),
                        )
                            .into_response());
                    }
                    // Paged as a node pages it: in creation order, the cursor the creation
                    // stamp and id of the page's last sandbox.
                    let param = |n: &str| q.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
                    let limit: usize = param("limit").map_or(1000, |l| l.parse().unwrap());
                    let mut stamps = list.sandboxes.clone();
                    stamps.sort();
                    let cursor = |s: u64| format!("{s:020}-sbx-{s:x}-{name}");
                    let mut page: Vec<u64> = stamps
                        .into_iter()
                        .filter(|s| param("after").is_none_or(|after| cursor(*s) > after))
                        .take(limit + 1)
                        .collect();
                    let next = (page.len() > limit).then(|| {
                        page.truncate(limit);
                        cursor(*page.last().unwrap())
                    });
                    let rows: Vec<Value> = page
                        .iter()
                        .map(|s| json!({"id": format!("sbx-{s:x}-{name}"), "key_id": "key-a", "pad": "x".repeat(list.pad)}))
                        .collect();
                    Ok(Json(json!({ "sandboxes": rows, "next": next })))
                },
            ),
        )
        .route("/v1/audit", audit_log(name, audit.clone(), "executions"))
        .route("/v1/audit/egress", audit_log(name, audit, "egress"))
        .route(
            "/v1/keys",
            get(move |headers: HeaderMap| {
                let keys = keys.clone();
                async move {
                    if let Some(refusal) = refusal(name, &headers) {
                        return Err(refusal);
                    }
                    let keys: Vec<Value> = keys
                        .lock()
                        .unwrap()
                        .iter()
                        .map(|(id, revoked)| json!({"id": id, "name": "k", "created_at": 1, "revoked": revoked, "operator": false}))
                        .collect();
                    Ok::<_, Response>(Json(json!({ "keys": keys })))
                }
            }),
        )
        .route(
            "/v1/keys/{id}",
            delete(move |headers: HeaderMap, Path(id): Path<String>| {
                let keys = revoked.clone();
                async move {
                    if let Some(refusal) = refusal(name, &headers) {
                        return Err(refusal);
                    }
                    let mut keys = keys.lock().unwrap();
                    match keys.iter_mut().find(|(k, revoked)| *k == id && !*revoked) {
                        Some(key) => {
                            key.1 = true;
                            Ok::<_, Response>(StatusCode::NO_CONTENT)
                        }
                        None => Ok(StatusCode::NOT_FOUND),
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move |headers: HeaderMap| async move {
                // Any key the node holds sees its metrics; an unknown key is 401.
                match refusal(name, &headers) {
                    Some(r) if r.status() == StatusCode::UNAUTHORIZED => return Err(r),
                    _ => {}
                }
                Ok(format!(
                    "# HELP corral_sessions_live Live sessions.\n# TYPE corral_sessions_live gauge\n\
                     corral_sessions_live {live}\n# HELP pad Padding.\n# TYPE pad gauge\n{}# EOF\n",
                    "pad 1\n".repeat(pad / 6)
                ))
            }),
        )
        .route(
            "/v1/sandboxes/{id}",
            delete(move |Path(id): Path<String>| {
                let calls = acted.clone();
                async move {
                    calls.lock().unwrap().push(format!("{name} DELETE {id}"));
                    StatusCode::NO_CONTENT
                }
            }),
        )
        .route(
            "/v1/sandboxes/{id}/{action}",
            post(move |Path((id, action)): Path<(String, String)>| {
                let calls = calls.clone();
                async move {
                    calls.lock().unwrap().push(format!("{name} {action} {id}"));
                    Json(json!({"id": id, "state": action}))
                }
            }),
        );
    support::serve(app).await
}

async fn call_as(app: &Router, method: Method, path: &str, key: &str) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {key}"))
        .body(Body::empty())
        .unwrap();
    let answer = app.clone().oneshot(request).await.unwrap();
    let status = answer.status();
    let bytes = answer.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, body)
}

async fn get_as(app: &Router, path: &str, key: &str) -> (StatusCode, Value) {
    call_as(app, Method::GET, path, key).await
}

fn statuses(body: &Value) -> Vec<(String, String)> {
    body["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap().to_string(),
                n["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

/// Three nodes: a with 3 sandboxes, b with 2, c with 4.
async fn three_nodes(calls: &Calls) -> (Vec<SocketAddr>, Vec<tokio::task::JoinHandle<()>>) {
    let mut addrs = Vec::new();
    let mut tasks = Vec::new();
    for (name, sandboxes) in [
        ("node-a", vec![1, 2, 0x10]),
        ("node-b", vec![5, 6]),
        ("node-c", vec![3, 4, 7, 8]),
    ] {
        let spec = Spec {
            sandboxes,
            ..Spec::default()
        };
        let (addr, task) = fake_node(name, spec, calls.clone()).await;
        addrs.push(addr);
        tasks.push(task);
    }
    (addrs, tasks)
}

#[tokio::test]
async fn the_operator_list_holds_every_nodes_sandboxes_paged_and_reports_a_node_down() {
    let calls = Calls::default();
    let (addrs, tasks) = three_nodes(&calls).await;
    let (app, _) = router_for(&addrs, |_| {}).await;
    // Pages of two: every sandbox once, by node, then creation; each row names its node.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..10 {
        let mut path = "/v1/operator/sandboxes?limit=2".to_string();
        if let Some(after) = &after {
            path += &format!("&after={}", urlencode(after));
        }
        let (status, body) = get_as(&app, &path, "op").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let rows = body["sandboxes"].as_array().unwrap();
        assert!(rows.len() <= 2, "{body}");
        for row in rows {
            let id = row["id"].as_str().unwrap();
            assert!(id.ends_with(row["node"].as_str().unwrap()), "{row}");
            seen.push(id.to_string());
        }
        assert_eq!(
            statuses(&body),
            pairs(&[("node-a", "ok"), ("node-b", "ok"), ("node-c", "ok")])
        );
        after = body["next"].as_str().map(str::to_string);
        if after.is_none() {
            break;
        }
    }
    assert_eq!(
        seen,
        [
            "sbx-1-node-a",
            "sbx-2-node-a",
            "sbx-10-node-a",
            "sbx-5-node-b",
            "sbx-6-node-b",
            "sbx-3-node-c",
            "sbx-4-node-c",
            "sbx-7-node-c",
            "sbx-8-node-c"
        ]
    );
    // One page by default; the key filter reaches the nodes; what the nodes refuse is refused.
    let (status, body) = get_as(&app, "/v1/operator/sandboxes?key=key-a", "op").await;
    assert_eq!(
        (status, body["sandboxes"].as_array().unwrap().len()),
        (StatusCode::OK, 9)
    );
    assert!(body.get("next").is_none());
    let (status, body) = get_as(&app, "/v1/operator/sandboxes?bogus=1", "op").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    for bad in ["limit=0", "limit=1001", "after=garbage"] {
        let (status, body) = get_as(&app, &format!("/v1/operator/sandboxes?{bad}"), "op").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
    // A plain key is refused as a node refuses it; no key at all is the node's 401.
    let (status, body) = get_as(&app, "/v1/operator/sandboxes", "plain").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("forbidden"))
    );
    let (status, _) = get_as(&app, "/v1/operator/sandboxes", "nobody").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // A key node-b does not hold (the nodes' keys differ): the others' sandboxes, node-b
    // named as refusing it. The same for the audit log and the keys.
    let (status, body) = get_as(&app, "/v1/operator/sandboxes", "drifted").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["sandboxes"].as_array().unwrap().len(), 7, "{body}");
    let expected = pairs(&[("node-a", "ok"), ("node-b", "refused"), ("node-c", "ok")]);
    assert_eq!(statuses(&body), expected);
    for path in ["/v1/audit", "/v1/keys"] {
        let (status, body) = get_as(&app, path, "drifted").await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        assert_eq!(statuses(&body), expected, "{path}");
    }
    // node-b stops: it is reported unreachable, and the others are still listed.
    tasks[1].abort();
    let (status, body) = get_as(&app, "/v1/operator/sandboxes", "op").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let ids: Vec<&str> = body["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 7, "{body}");
    assert!(ids.iter().all(|id| !id.ends_with("node-b")), "{body}");
    assert_eq!(
        statuses(&body),
        pairs(&[
            ("node-a", "ok"),
            ("node-b", "unreachable"),
            ("node-c", "ok")
        ])
    );
}

fn urlencode(s: &str) -> String {
    serde_urlencoded::to_string([("x", s)]).unwrap()[2..].to_string()
}

#[tokio::test]
async fn an_operator_list_beyond_the_bound_is_refused_and_one_within_it_is_merged() {
    let calls = Calls::default();
    let spec = |pad| Spec {
        sandboxes: (1..=100).collect(),
        pad,
        ..Spec::default()
    };
    let (small, _a) = fake_node("node-a", spec(100), calls.clone()).await;
    let (big, _b) = fake_node("node-b", spec(20_000), calls.clone()).await; // about 2 MB
    let (app, _) = router_for(&[small, big], |c| c.max_list_bytes = 1 << 20).await;
    let (status, body) = get_as(&app, "/v1/operator/sandboxes?limit=100", "op").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["sandboxes"].as_array().unwrap().len(), 100);
    let (status, body) = get_as(&app, "/v1/operator/sandboxes", "op").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["error"]["code"], "node_error");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1048576 bytes"),
        "{body}"
    );
}

#[tokio::test]
async fn the_audit_logs_are_merged_newest_first_paged_and_bounded() {
    let calls = Calls::default();
    // Each node's log newest first; times interleave across nodes (and tie across a and c).
    let logs = [
        ("node-a", vec![(13, 100), (12, 70), (11, 40), (10, 10)]),
        ("node-b", vec![(6, 90), (5, 50)]),
        ("node-c", vec![(23, 100), (22, 60), (21, 20)]),
    ];
    let mut addrs = Vec::new();
    let mut tasks = Vec::new();
    for (name, audit) in logs {
        let spec = Spec {
            audit,
            ..Spec::default()
        };
        let (addr, task) = fake_node(name, spec, calls.clone()).await;
        addrs.push(addr);
        tasks.push(task);
    }
    let (app, _) = router_for(&addrs, |_| {}).await;
    // Both logs, of executions and of egress decisions, alike.
    for (log, name) in [("/v1/audit", "executions"), ("/v1/audit/egress", "egress")] {
        let mut seen = Vec::new();
        let mut before: Option<String> = None;
        for _ in 0..10 {
            let mut path = format!("{log}?limit=3");
            if let Some(before) = &before {
                path += &format!("&before={}", urlencode(before));
            }
            let (status, body) = get_as(&app, &path, "op").await;
            assert_eq!(status, StatusCode::OK, "{body}");
            let entries = body["entries"].as_array().unwrap();
            assert!(entries.len() <= 3, "{body}");
            for e in entries {
                assert_eq!(e["log"], name, "{log}: {e}");
                seen.push((
                    e["node"].as_str().unwrap().to_string(),
                    e["id"].as_i64().unwrap(),
                    e["at"].as_i64().unwrap(),
                ));
            }
            before = body["next"].as_str().map(str::to_string);
            if before.is_none() {
                break;
            }
        }
        let ats: Vec<i64> = seen.iter().map(|(_, _, at)| *at).collect();
        assert_eq!(
            ats,
            [100, 100, 90, 70, 60, 50, 40, 20, 10],
            "{log}: {seen:?}"
        );
        assert_eq!(seen.len(), 9);
        let distinct: BTreeSet<(String, i64)> =
            seen.iter().map(|(n, id, _)| (n.clone(), *id)).collect();
        assert_eq!(distinct.len(), 9, "{log}: every line once: {seen:?}");
        // A cursor no router gave, and limits the nodes refuse.
        for bad in ["before=a%3Dx", "before=Node%3D1", "limit=0", "limit=1001"] {
            let (status, body) = get_as(&app, &format!("{log}?{bad}"), "op").await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{log} {bad}: {body}");
        }
    }
    // A node down: the others' lines, and the node reported.
    tasks[2].abort();
    for log in ["/v1/audit", "/v1/audit/egress"] {
        let (status, body) = get_as(&app, log, "op").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            body["entries"].as_array().unwrap().len(),
            6,
            "{log}: {body}"
        );
        assert_eq!(
            statuses(&body),
            pairs(&[
                ("node-a", "ok"),
                ("node-b", "ok"),
                ("node-c", "unreachable")
            ])
        );
    }
}

#[tokio::test]
async fn an_audit_answer_beyond_the_bound_is_refused() {
    let calls = Calls::default();
    let spec = Spec {
        audit: (0..1000).rev().map(|i| (i, i)).collect(),
        ..Spec::default()
    };
    let (node, _n) = fake_node("node-a", spec, calls).await;
    // 1000 lines are about 40 KB.
    let (app, _) = router_for(&[node], |c| c.max_list_bytes = 32 << 10).await;
    let (status, body) = get_as(&app, "/v1/audit?limit=100", "op").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = get_as(&app, "/v1/audit?limit=1000", "op").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("32768 bytes"),
        "{body}"
    );
}

#[tokio::test]
async fn keys_are_listed_from_every_node_revoked_on_every_node_and_not_made_here() {
    let calls = Calls::default();
    let keys = |extra: Option<&'static str>| Spec {
        keys: [Some("key-000000000001"), Some("key-000000000002"), extra]
            .into_iter()
            .flatten()
            .map(|k| (k, false))
            .collect(),
        ..Spec::default()
    };
    let (a, _a) = fake_node("node-a", keys(None), calls.clone()).await;
    let (b, _b) = fake_node("node-b", keys(Some("key-0000000000bb")), calls.clone()).await;
    let (c, task_c) = fake_node("node-c", keys(None), calls.clone()).await;
    let (app, _) = router_for(&[a, b, c], |_| {}).await;
    // A key only one node holds is named so.
    let (status, body) = get_as(&app, "/v1/keys", "op").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let keys = body["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 3, "{body}");
    for key in keys {
        let differs = key.get("differs_on").cloned();
        if key["id"] == "key-0000000000bb" {
            assert_eq!(differs, Some(json!(["node-a", "node-c"])), "{body}");
        } else {
            assert_eq!(differs, None, "{body}");
        }
    }
    // A plain key is refused, listing as revoking or making.
    assert_eq!(
        get_as(&app, "/v1/keys", "plain").await.0,
        StatusCode::FORBIDDEN
    );
    let (status, body) = call_as(&app, Method::DELETE, "/v1/keys/key-000000000001", "plain").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, body) = call_as(&app, Method::POST, "/v1/keys", "plain").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    // An operator cannot make a key here: it would live on one node only.
    let (status, body) = call_as(&app, Method::POST, "/v1/keys", "op").await;
    assert_eq!(status, StatusCode::NOT_IMPLEMENTED, "{body}");
    assert_eq!(body["error"]["code"], "keys_on_nodes");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("corral key add"));
    // Revoked on every node; again, it is no live key anywhere.
    let (status, body) = call_as(&app, Method::DELETE, "/v1/keys/key-000000000001", "op").await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let (_, body) = get_as(&app, "/v1/keys", "op").await;
    let one = body["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["id"] == "key-000000000001")
        .unwrap()
        .clone();
    assert_eq!(
        (one["revoked"].as_bool(), one.get("differs_on")),
        (Some(true), None),
        "{body}"
    );
    let (status, _) = call_as(&app, Method::DELETE, "/v1/keys/key-000000000001", "op").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // A key only some nodes hold is revoked where it is live: consistent, 204.
    let (status, _) = call_as(&app, Method::DELETE, "/v1/keys/key-0000000000bb", "op").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    // With node-c down the revocation is done where it can be and the answer says where not.
    task_c.abort();
    let (status, body) = call_as(&app, Method::DELETE, "/v1/keys/key-000000000002", "op").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["error"]["code"], "keys_differ");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("revoked on [node-a, node-b]"), "{message}");
    assert!(message.contains("NOT revoked on [node-c"), "{message}");
    let (_, body) = get_as(&app, "/v1/keys", "op").await;
    assert_eq!(
        statuses(&body),
        pairs(&[
            ("node-a", "ok"),
            ("node-b", "ok"),
            ("node-c", "unreachable")
        ])
    );
}

#[tokio::test]
async fn metrics_are_every_nodes_labelled_and_bounded() {
    let calls = Calls::default();
    let (addrs, tasks) = three_nodes(&calls).await;
    let (app, _) = router_for(&addrs, |_| {}).await;
    let (status, body) = get_as(&app, "/metrics", "op").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let text = body.as_str().unwrap();
    for line in [
        "corral_sessions_live{node=\"node-a\"} 3",
        "corral_sessions_live{node=\"node-b\"} 2",
        "corral_sessions_live{node=\"node-c\"} 4",
        "corral_router_node_up{node=\"node-b\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in {text}");
    }
    assert_eq!(text.matches("# TYPE corral_sessions_live gauge").count(), 1);
    assert!(text.ends_with("# EOF\n"));
    for node in ["node-a", "node-b", "node-c"] {
        let line = format!("corral_router_node_refused{{node=\"{node}\"}} 0");
        assert!(text.lines().any(|l| l == line), "{line} in {text}");
    }
    // The nodes decide on the key: one every node refuses gets a node's refusal.
    let request = Request::get("/metrics").body(Body::empty()).unwrap();
    let answer = app.clone().oneshot(request).await.unwrap();
    assert_eq!(answer.status(), StatusCode::UNAUTHORIZED);
    let (status, _) = get_as(&app, "/metrics", "nobody").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // A key node-b does not hold (the nodes' keys differ): the others' samples, and node-b
    // marked as refusing it, as the operator routes report it in `nodes`.
    let (status, body) = get_as(&app, "/metrics", "drifted").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let text = body.as_str().unwrap();
    for line in [
        "corral_sessions_live{node=\"node-a\"} 3",
        "corral_sessions_live{node=\"node-c\"} 4",
        "corral_router_node_up{node=\"node-b\"} 1",
        "corral_router_node_refused{node=\"node-a\"} 0",
        "corral_router_node_refused{node=\"node-b\"} 1",
        "corral_router_node_refused{node=\"node-c\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in {text}");
    }
    assert!(
        !text.contains("corral_sessions_live{node=\"node-b\"}"),
        "{text}"
    );
    assert_eq!(
        text.matches("# TYPE corral_router_node_refused gauge")
            .count(),
        1
    );
    assert!(text.ends_with("# EOF\n"));
    // A node down: its samples are missing, and it says so.
    tasks[0].abort();
    let (_, body) = get_as(&app, "/metrics", "op").await;
    let text = body.as_str().unwrap();
    assert!(
        text.lines()
            .any(|l| l == "corral_router_node_up{node=\"node-a\"} 0"),
        "{text}"
    );
    assert!(
        !text.contains("corral_sessions_live{node=\"node-a\"}"),
        "{text}"
    );
    // The router's health lists every node.
    let (_, health) = get_as(&app, "/healthz", "").await;
    assert_eq!(
        statuses(&health),
        pairs(&[
            ("node-a", "unreachable"),
            ("node-b", "ok"),
            ("node-c", "ok")
        ])
    );
    // One node's metrics beyond the bound: the router's 502.
    let spec = Spec {
        pad: MAX_METRICS_BYTES + 1,
        ..Spec::default()
    };
    let (big, _big) = fake_node("node-z", spec, calls).await;
    let (app, _) = router_for(&[addrs[1], big], |_| {}).await;
    let (status, body) = get_as(&app, "/metrics", "op").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("{MAX_METRICS_BYTES} bytes")),
        "{body}"
    );
}

#[tokio::test]
async fn restart_pause_resume_and_delete_reach_the_sandboxes_node() {
    let calls = Calls::default();
    let (addrs, _tasks) = three_nodes(&calls).await;
    let (app, _) = router_for(&addrs, |_| {}).await;
    for (method, path) in [
        (Method::POST, "/v1/sandboxes/sbx-5-node-b/restart"),
        (Method::POST, "/v1/sandboxes/sbx-3-node-c/pause"),
        (Method::POST, "/v1/sandboxes/sbx-3-node-c/resume"),
        (Method::DELETE, "/v1/sandboxes/sbx-1-node-a"),
    ] {
        let (status, body) = call_as(&app, method, path, "op").await;
        assert!(status.is_success(), "{path}: {status} {body}");
    }
    assert_eq!(
        *calls.lock().unwrap(),
        [
            "node-b restart sbx-5-node-b",
            "node-c pause sbx-3-node-c",
            "node-c resume sbx-3-node-c",
            "node-a DELETE sbx-1-node-a"
        ]
    );
}
