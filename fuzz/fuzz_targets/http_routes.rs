//! Every route of `corral serve` (native, E2B, Connect, console, ports, operators) over an
//! arbitrary request, through a service with an empty image store, which builds no sandbox (as
//! Cloud Hypervisor fuzzes its HTTP API through a stub VMM): whatever comes in, the server
//! answers within its bounds, never panics, never answers 500, and always with Corral's own
//! security headers.
//!
//! Input: a request head in text (`METHOD PATH`, then `Name: value` lines), an empty line, the
//! body. A head without `Host` gets the loopback server's own, so keyless requests act as the
//! local tenant and reach the service.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

struct App {
    runtime: tokio::runtime::Runtime,
    router: Router,
    _dir: tempfile::TempDir,
}

fn app() -> &'static App {
    static APP: OnceLock<App> = OnceLock::new();
    APP.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let config = corral_server::Config {
            listen: "127.0.0.1:8421".parse().unwrap(),
            data_dir: Some(dir.path().join("data")),
            db: Some(dir.path().join("corral.db")),
            pool_size: 0,
            admission_wait_s: 0,
            ..corral_server::Config::default()
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let service = runtime
            .block_on(async {
                tokio::task::spawn_blocking(|| corral_server::Service::start(config)).await
            })
            .expect("the service thread")
            .expect("a service over an empty store");
        let router =
            corral_server::http::router(corral_server::http::AppState::new(Arc::clone(&service)));
        App {
            runtime,
            router,
            _dir: dir,
        }
    })
}

fn request(data: &[u8]) -> Option<http::Request<Body>> {
    let split = data.windows(2).position(|w| w == b"\n\n")?;
    let (head, body) = (
        std::str::from_utf8(&data[..split]).ok()?,
        &data[split + 2..],
    );
    let mut lines = head.split('\n');
    let (method, path) = lines.next()?.split_once(' ')?;
    let mut builder = http::Request::builder().method(method).uri(path);
    let mut host = false;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        host |= name.trim().eq_ignore_ascii_case("host");
        builder = builder.header(name.trim(), value.trim());
    }
    if !host {
        builder = builder.header("host", "127.0.0.1:8421");
    }
    builder.body(Body::from(body.to_vec())).ok()
}

fuzz_target!(|data: &[u8]| {
    let Some(request) = request(data) else {
        return;
    };
    let app = app();
    let answered = app.runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), async {
            let response = app.router.clone().oneshot(request).await.unwrap();
            let (parts, body) = response.into_parts();
            // Bounded: no answer of a service without sandboxes is large.
            let body = http_body_util::Limited::new(body, 8 << 20).collect().await;
            (parts, body.map(|b| b.to_bytes()))
        })
        .await
    });
    let (parts, body) = answered.expect("answered within 30 s");
    let body = body.expect("a body within 8 MiB");
    assert_ne!(
        parts.status,
        http::StatusCode::INTERNAL_SERVER_ERROR,
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert_eq!(
        parts
            .headers
            .get("x-content-type-options")
            .map(|v| v.as_bytes()),
        Some(&b"nosniff"[..]),
        "{:?} without Corral's security headers",
        parts.status
    );
});
