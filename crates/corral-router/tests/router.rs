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
    // Each key has a share of its own once a node has accepted it.
    for key in ["crl_a", "crl_b", "crl_c"] {
        let listed = call(&app, with_key(key, get_req("/v1/sandboxes"))).await;
        assert_eq!(listed.0, StatusCode::OK, "{}", listed.2);
    }
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

/// A node that holds one key, `crl_real`: its list and creation answer that key and refuse
/// every other with 401, as a node does.
async fn keyed_node() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    fn real(headers: &HeaderMap) -> bool {
        headers.get("authorization").and_then(|v| v.to_str().ok()) == Some("Bearer crl_real")
    }
    let refused = || {
        (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": {"code": "unauthorized"}})),
        )
    };
    let app = Router::new()
        .route(
            "/healthz",
            get(|| async {
                Json(json!({"status": "ok", "node": "fake-k", "sessions_live": 0, "max_sessions": 10}))
            }),
        )
        .route(
            "/v1/sandboxes",
            get(move |headers: HeaderMap| async move {
                if !real(&headers) {
                    return refused();
                }
                (StatusCode::OK, Json(json!({"sandboxes": []})))
            })
            .post(move |headers: HeaderMap, body: Bytes| async move {
                if !real(&headers) {
                    return refused();
                }
                (
                    StatusCode::CREATED,
                    Json(json!({"id": "sbx-1-fake-k", "got": body.len()})),
                )
            }),
        );
    support::serve(app).await
}

/// `corral route` on a loopback port in front of `node`, served as `corral route` serves.
async fn listening_router(
    node: SocketAddr,
    tune: impl FnOnce(&mut corral_router::RouterConfig),
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut config = corral_router::RouterConfig::new(
        addr,
        corral_router::NodeSource::Static(vec![node.to_string()]),
    );
    tune(&mut config);
    let task = tokio::spawn(async move {
        corral_router::serve_on(config, listener, std::future::pending())
            .await
            .unwrap();
    });
    (addr, task)
}

/// What `stream` answers before it closes or `within` passes (empty if nothing), and whether
/// it closed.
async fn answer_of(stream: &mut tokio::net::TcpStream, within: Duration) -> (String, bool) {
    use tokio::io::AsyncReadExt as _;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&got).into(), true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&got).into(), false),
        }
    }
}

async fn send_raw(router: SocketAddr, text: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt as _;
    let mut stream = tokio::net::TcpStream::connect(router).await.unwrap();
    stream.write_all(text.as_bytes()).await.unwrap();
    stream
}

/// Made-up keys that send creations whose bodies never come: 3 keys × 16 connections, each
/// `Content-Length: 100` and then only `{`, against `--max-in-flight 32`. A creation's body is
/// read before the request takes a place in flight, and within a deadline: the real key's
/// list and creation are served meanwhile, and every made-up connection is answered 408 when
/// its deadline passes. Before, each held a place for as long as it stayed open, and the real
/// key's list was 503 `router_busy`.
#[tokio::test]
async fn made_up_keys_with_slow_creation_bodies_hold_no_place_in_flight() {
    let (node, _n) = keyed_node().await;
    let (router, _r) = listening_router(node, |c| {
        c.max_in_flight = 32;
        c.body_timeout = Duration::from_secs(4);
    })
    .await;
    let started = Instant::now();
    let mut slow = Vec::new();
    for key in ["bogus-1", "bogus-2", "bogus-3"] {
        for _ in 0..16 {
            slow.push(
                send_raw(
                    router,
                    &format!(
                        "POST /v1/sandboxes HTTP/1.1\r\nHost: r\r\nAuthorization: Bearer {key}\r\n\
                         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
                    ),
                )
                .await,
            );
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut list = send_raw(
        router,
        "GET /v1/sandboxes HTTP/1.1\r\nHost: r\r\nAuthorization: Bearer crl_real\r\n\
         Connection: close\r\n\r\n",
    )
    .await;
    let (answer, _) = answer_of(&mut list, Duration::from_secs(3)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let mut create = send_raw(
        router,
        "POST /v1/sandboxes HTTP/1.1\r\nHost: r\r\nAuthorization: Bearer crl_real\r\n\
         Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
    )
    .await;
    let (answer, _) = answer_of(&mut create, Duration::from_secs(3)).await;
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the real key was served only once the slow bodies' deadline passed"
    );
    for mut stream in slow {
        let (answer, _) = answer_of(&mut stream, Duration::from_secs(10)).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("request_timeout"), "{answer}");
    }
}

/// A connection that sends no request, or a head that never ends, or stays idle after an
/// answer, is closed once the header timeout passes.
#[tokio::test]
async fn connections_that_send_no_request_head_are_closed() {
    let (node, _n) = keyed_node().await;
    let (router, _r) = listening_router(node, |c| c.header_timeout = Duration::from_secs(1)).await;
    let mut silent = send_raw(router, "").await;
    let mut partial = send_raw(router, "GET /healthz HTTP/1.1\r\nHost: r\r\n").await;
    let mut idle = send_raw(router, "GET /healthz HTTP/1.1\r\nHost: r\r\n\r\n").await;
    for stream in [&mut silent, &mut partial] {
        let (answer, closed) = answer_of(stream, Duration::from_secs(10)).await;
        assert!(closed, "still open: {answer}");
        assert!(!answer.contains("200 OK"), "{answer}");
    }
    let (answer, closed) = answer_of(&mut idle, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(closed, "the idle connection is still open");
}

/// Keys no node has accepted share one key's places in flight, with keyless requests: twelve
/// made-up keys holding a request each take 4 of the router's 8 (then 429 `key_busy`), and a
/// key a node has accepted is served. Before, each made-up key had a share and a floor of its
/// own, and twelve of them took the router and its reserve: the real key got 503.
#[tokio::test]
async fn made_up_keys_share_one_keys_places_in_flight() {
    let release = Arc::new(Hold::default());
    let (node, _n) = fake_node("fake-a", 1, release.clone()).await;
    let (app, _) = router_for(&[node], |c| c.max_in_flight = 8).await;
    let listed = call(&app, with_key("crl_c", get_req("/v1/sandboxes"))).await;
    assert_eq!(listed.0, StatusCode::OK, "{}", listed.2);
    let held = made_up_keys_hold(&app, &release, false).await;
    let list = call(&app, with_key("crl_c", get_req("/v1/sandboxes"))).await;
    assert_eq!(list.0, StatusCode::OK, "{}", list.2);
    assert_eq!(
        release.holding.load(std::sync::atomic::Ordering::SeqCst),
        4,
        "made-up keys hold one key's share"
    );
    release.release.notify_waiters();
    let (mut ok, mut busy) = (0, 0);
    for h in held {
        let (status, _, body) = h.await.unwrap();
        match status {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(body["error"]["code"], "key_busy");
                busy += 1;
            }
            other => panic!("{other}: {body}"),
        }
    }
    assert_eq!((ok, busy), (4, 8));
}

/// A list whose cursor is past every node is the router's own answer (no node checked the
/// key), so it accepts no key; and a sandbox's own routes (E2B's sandbox plane, answered by
/// the sandbox's token) that made-up keys hold share one key's places of their own, so a new
/// real key's first request, which no node has accepted yet, is served.
#[tokio::test]
async fn a_list_no_node_answered_accepts_no_key_and_sandbox_routes_leave_new_keys_served() {
    let release = Arc::new(Hold::default());
    let (node, _n) = fake_node("fake-a", 1, release.clone()).await;
    let (app, _) = router_for(&[node], |c| c.max_in_flight = 8).await;
    for i in 0..12 {
        let past_every_node = get_req("/v1/sandboxes?after=zzzz~");
        let listed = call(&app, with_key(&format!("made-up-{i}"), past_every_node)).await;
        assert_eq!(listed.0, StatusCode::OK, "{}", listed.2);
    }
    let held = made_up_keys_hold(&app, &release, true).await;
    let first = call(&app, with_key("crl_new", get_req("/v1/sandboxes"))).await;
    assert_eq!(
        first.0,
        StatusCode::OK,
        "a new key's first list: {}",
        first.2
    );
    assert_eq!(
        release.holding.load(std::sync::atomic::Ordering::SeqCst),
        4,
        "made-up keys hold one key's share, however they listed"
    );
    release.release.notify_waiters();
    for h in held {
        let (status, _, body) = h.await.unwrap();
        assert!(
            status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
            "{status}: {body}"
        );
    }
}

/// Twelve made-up keys each ask the fake node to hold a request of sandbox `sbx-1-fake-a`
/// (through E2B's sandbox plane when `plane`); returns once four are held and the rest have
/// had time to be answered or held.
async fn made_up_keys_hold(
    app: &Router,
    release: &Arc<Hold>,
    plane: bool,
) -> Vec<tokio::task::JoinHandle<(StatusCode, HeaderMap, Value)>> {
    let held = (0..12)
        .map(|i| {
            let app = app.clone();
            tokio::spawn(async move {
                let mut request = Request::post("/v1/sandboxes/sbx-1-fake-a/hold");
                if plane {
                    request = request.header("e2b-sandbox-id", "sbx-1-fake-a");
                }
                let request = request.body(Body::empty()).unwrap();
                call(&app, with_key(&format!("made-up-{i}"), request)).await
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while release.holding.load(std::sync::atomic::Ordering::SeqCst) < 4 {
        assert!(Instant::now() < deadline, "the holds did not begin");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    held
}
