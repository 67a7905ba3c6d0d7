//! The router against fake nodes (small axum servers that answer as nodes do): its bounds
//! (list answers, creation bodies, requests in flight), each crossed; bodies that stream
//! through unbounded by the router; keys passed on untouched; and the answers for sandboxes of
//! a node that died, of unknown nodes, and of single-node ids, in each face's shape.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::Path;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use http_body_util::BodyExt as _;
use serde_json::{json, Value};
use tokio::sync::Notify;
use tower::ServiceExt as _;

mod support;
use support::router_for;

#[derive(Default)]
struct Hold {
    entered: Notify,
    release: Notify,
    /// Requests holding now.
    holding: std::sync::atomic::AtomicUsize,
}

/// A fake node named `name`: its list holds `list_entries` sandboxes, `POST /v1/sandboxes`
/// answers with the body's length, `PUT …/files/…` counts the streamed bytes, `GET
/// /v1/sandboxes/{id}` echoes the `Authorization` header, and `…/hold` says it has begun and
/// waits for its release.
async fn fake_node(
    name: &'static str,
    list_entries: usize,
    release: Arc<Hold>,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let app = Router::new()
        .route(
            "/healthz",
            get(move || async move {
                Json(json!({"status": "ok", "node": name, "sessions_live": 0, "max_sessions": 10}))
            }),
        )
        .route(
            "/v1/sandboxes",
            get(move || async move {
                let sandboxes: Vec<Value> = (0..list_entries)
                    .map(|i| json!({"id": format!("sbx-{i:x}-{name}"), "pad": "x".repeat(1000)}))
                    .collect();
                Json(json!({ "sandboxes": sandboxes }))
            })
            .post(move |body: Bytes| async move {
                (
                    StatusCode::CREATED,
                    Json(json!({"id": format!("sbx-1-{name}"), "got": body.len()})),
                )
            }),
        )
        .route(
            "/v1/sandboxes/{id}",
            get(
                move |Path(id): Path<String>, headers: HeaderMap| async move {
                    let auth = headers
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    Json(json!({"id": id, "node": name, "authorization": auth}))
                },
            ),
        )
        .route(
            "/v1/sandboxes/{id}/files/{*path}",
            put(|body: Body| async move {
                let mut stream = body.into_data_stream();
                let mut n = 0usize;
                while let Some(chunk) = futures_util::StreamExt::next(&mut stream).await {
                    n += chunk.unwrap().len();
                }
                Json(json!({"size": n}))
            }),
        )
        .route(
            "/v1/sandboxes/{id}/hold",
            post(move || {
                let release = release.clone();
                async move {
                    release.entered.notify_one();
                    let released = release.release.notified();
                    release
                        .holding
                        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    released.await;
                    release
                        .holding
                        .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    "released"
                }
            }),
        );
    support::serve(app).await
}

async fn call(app: &Router, request: Request<Body>) -> (StatusCode, HeaderMap, Value) {
    let answer = app.clone().oneshot(request).await.unwrap();
    let status = answer.status();
    let headers = answer.headers().clone();
    let bytes = answer.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        headers,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn get_req(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

#[tokio::test]
async fn a_list_answer_beyond_the_bound_is_refused_and_one_within_it_is_merged() {
    let release = Arc::new(Hold::default());
    let (small, _a) = fake_node("fake-a", 3, release.clone()).await;
    let (big, _b) = fake_node("fake-b", 3000, release.clone()).await; // about 3 MB
    let (app, _) = router_for(&[small], |_| {}).await;
    let (status, _, body) = call(&app, get_req("/v1/sandboxes")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["sandboxes"].as_array().unwrap().len(), 3);
    let (app, _) = router_for(&[small, big], |c| c.max_list_bytes = 1 << 20).await;
    let (status, _, body) = call(&app, get_req("/v1/sandboxes")).await;
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
async fn a_creation_body_beyond_the_bound_is_refused_while_uploads_stream_through() {
    let release = Arc::new(Hold::default());
    let (node, _n) = fake_node("fake-a", 0, release).await;
    let (app, _) = router_for(&[node], |c| c.max_create_bytes = 1024).await;
    let create = |n: usize| {
        Request::post("/v1/sandboxes")
            .header("content-type", "application/json")
            .body(Body::from(vec![b' '; n]))
            .unwrap()
    };
    let (status, _, body) = call(&app, create(1024)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["got"], 1024);
    let (status, _, body) = call(&app, create(1025)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(body["error"]["code"], "payload_too_large");
    // An upload to a sandbox is not held: 16 MiB stream through a router that holds 1 KiB.
    let chunks = futures_util::stream::iter(
        (0..256).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![7u8; 64 << 10]))),
    );
    let upload = Request::put("/v1/sandboxes/sbx-1-fake-a/files/big.bin")
        .body(Body::from_stream(chunks))
        .unwrap();
    let (status, _, body) = call(&app, upload).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["size"], 16 << 20);
}

fn with_key(key: &str, request: Request<Body>) -> Request<Body> {
    let (mut parts, body) = request.into_parts();
    parts
        .headers
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    Request::from_parts(parts, body)
}

/// Requests in flight are shared between the keys that present them: with `--max-in-flight
/// 8`, a key holds at most 4 (then 429 `key_busy`), and two keys holding theirs fill the
/// router, yet a third key's lists and creations are served out of its floor; past the floor,
/// 503 `router_busy`. When the holders end, everyone is served again. Before the share, one
/// key holding every request in flight left every other key's requests, list and create
/// included, 503 `router_busy`.
#[tokio::test]
async fn one_keys_requests_in_flight_leave_other_keys_served() {
    let release = Arc::new(Hold::default());
    let (node, _n) = fake_node("fake-a", 1, release.clone()).await;
    let (app, _) = router_for(&[node], |c| c.max_in_flight = 8).await;
    let hold = |key: &'static str| {
        let app = app.clone();
        tokio::spawn(async move {
            let request = Request::post("/v1/sandboxes/sbx-1-fake-a/hold")
                .body(Body::empty())
                .unwrap();
            call(&app, with_key(key, request)).await.0
        })
    };
    let holding = |n: usize| {
        let release = release.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while release.holding.load(std::sync::atomic::Ordering::SeqCst) < n {
                assert!(Instant::now() < deadline, "the holds did not begin");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let mut held: Vec<_> = (0..4).map(|_| hold("crl_a")).collect();
    holding(4).await;
    let refused = call(&app, with_key("crl_a", get_req("/v1/sandboxes"))).await;
    assert_eq!(refused.0, StatusCode::TOO_MANY_REQUESTS, "{}", refused.2);
    assert_eq!(refused.2["error"]["code"], "key_busy");
    assert_eq!(refused.1["retry-after"], "1");

    held.extend((0..4).map(|_| hold("crl_b")));
    holding(8).await;
    let list = call(&app, with_key("crl_c", get_req("/v1/sandboxes"))).await;
    assert_eq!(list.0, StatusCode::OK, "{}", list.2);
    assert_eq!(list.2["sandboxes"][0]["id"], "sbx-0-fake-a");
    let create = Request::post("/v1/sandboxes")
        .header("content-type", "application/json")
        .body(Body::from("{}"))
        .unwrap();
    let created = call(&app, with_key("crl_c", create)).await;
    assert_eq!(created.0, StatusCode::CREATED, "{}", created.2);
    let keyless = call(&app, get_req("/v1/sandboxes/sbx-1-fake-a")).await;
    assert_eq!(keyless.0, StatusCode::OK, "{}", keyless.2);

    // A third key past its floor, when the floors too are taken: the router is busy.
    let mut floor: Vec<_> = (0..4).map(|_| hold("crl_c")).collect();
    holding(12).await;
    let refused = call(&app, with_key("crl_d", get_req("/v1/sandboxes"))).await;
    assert_eq!(refused.0, StatusCode::SERVICE_UNAVAILABLE, "{}", refused.2);
    assert_eq!(refused.2["error"]["code"], "router_busy");
    assert_eq!(refused.1["retry-after"], "1");

    release.release.notify_waiters();
    held.append(&mut floor);
    for h in held {
        assert_eq!(h.await.unwrap(), StatusCode::OK);
    }
    let (status, _, _) = call(&app, with_key("crl_a", get_req("/v1/sandboxes"))).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn keys_reach_the_node_untouched() {
    let release = Arc::new(Hold::default());
    let (node, _n) = fake_node("fake-a", 0, release).await;
    let (app, _) = router_for(&[node], |_| {}).await;
    let request = Request::get("/v1/sandboxes/sbx-1-fake-a")
        .header("authorization", "Bearer crl_whatever")
        .body(Body::empty())
        .unwrap();
    let (status, _, body) = call(&app, request).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["authorization"], "Bearer crl_whatever");
    assert_eq!(body["node"], "fake-a");
}

#[tokio::test]
async fn a_dead_nodes_sandboxes_are_gone_at_once_and_the_others_answer() {
    let release = Arc::new(Hold::default());
    let (alive, _a) = fake_node("fake-a", 0, release.clone()).await;
    let (doomed, task) = fake_node("fake-b", 0, release.clone()).await;
    let (app, nodes) = router_for(&[alive, doomed], |_| {}).await;
    assert_eq!(nodes.up().len(), 2);
    let (status, _, body) = call(&app, get_req("/v1/sandboxes/sbx-1-fake-b")).await;
    assert_eq!(
        (status, body["node"].as_str()),
        (StatusCode::OK, Some("fake-b"))
    );
    task.abort();
    let _ = task.await;
    let started = Instant::now();
    let (status, _, body) = call(&app, get_req("/v1/sandboxes/sbx-1-fake-b")).await;
    assert_eq!(status, StatusCode::GONE, "{body}");
    assert_eq!(body["error"]["code"], "sandbox_gone");
    assert!(started.elapsed() < Duration::from_secs(2));
    // E2B's faces: 404 on the control plane, the edge proxy's 502 on the sandbox plane.
    let (status, _, body) = call(&app, get_req("/sandboxes/sbx-1-fake-b")).await;
    assert_eq!(
        (status, body["code"].as_u64()),
        (StatusCode::NOT_FOUND, Some(404))
    );
    let plane = Request::post("/execute")
        .header("e2b-sandbox-id", "sbx-1-fake-b")
        .body(Body::empty())
        .unwrap();
    let (status, _, body) = call(&app, plane).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert!(
        body["message"].as_str().unwrap().contains("was not found"),
        "{body}"
    );
    // The other node's sandboxes answer; creations go there only.
    let (status, _, _) = call(&app, get_req("/v1/sandboxes/sbx-1-fake-a")).await;
    assert_eq!(status, StatusCode::OK);
    for _ in 0..4 {
        let create = Request::post("/v1/sandboxes")
            .body(Body::from("{}"))
            .unwrap();
        let (status, _, body) = call(&app, create).await;
        assert_eq!(
            (status, body["id"].as_str()),
            (StatusCode::CREATED, Some("sbx-1-fake-a"))
        );
    }
    // Ids of nodes never seen, single-node ids and non-ids: no such sandbox.
    for id in ["sbx-1-fake-z", "sbx-1", "nonsense"] {
        let (status, _, body) = call(&app, get_req(&format!("/v1/sandboxes/{id}"))).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{id}: {body}");
    }
}

#[tokio::test]
async fn a_router_with_no_node_up_says_so() {
    let release = Arc::new(Hold::default());
    let (node, task) = fake_node("fake-a", 0, release).await;
    task.abort();
    let _ = task.await;
    let (app, _) = router_for(&[node], |_| {}).await;
    let (status, _, body) = call(&app, get_req("/healthz")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["nodes_up"], 0);
    let create = Request::post("/v1/sandboxes")
        .body(Body::from("{}"))
        .unwrap();
    let (status, headers, body) = call(&app, create).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "no_nodes");
    assert_eq!(headers["retry-after"], "1");
}

#[tokio::test]
async fn a_health_answer_beyond_64_kib_is_taken_for_a_node_down() {
    async fn serve(pad: usize) -> SocketAddr {
        let app = Router::new().route(
            "/healthz",
            get(move || async move {
                Json(
                    json!({"status": "ok", "node": "fake-big", "sessions_live": 0,
                            "max_sessions": 10, "pad": "x".repeat(pad)}),
                )
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    }
    let (_, nodes) = router_for(&[serve(60 << 10).await], |_| {}).await;
    assert_eq!(nodes.up().len(), 1);
    let (_, nodes) = router_for(&[serve(64 << 10).await], |_| {}).await;
    assert!(nodes.up().is_empty());
}
