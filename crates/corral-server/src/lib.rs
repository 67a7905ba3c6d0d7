//! Corral's HTTP server: the native API and the E2B-compatible face (docs/api.md),
//! API keys and tenancy, metrics, and the lifecycle of the sessions it owns. The engine is
//! synchronous; [`service::Service`] holds the logic and the HTTP layer calls it from
//! blocking threads.

pub mod admission;
pub mod config;
pub mod connect;
pub mod console;
pub mod db;
mod docs_page;
pub mod e2b;
mod e2b_network;
pub mod error;
pub mod files_api;
pub mod http;
pub mod metrics;
pub mod network;
pub mod operator;
pub mod persist;
pub mod ports;
pub mod service;
mod shutdown;
pub mod threads;
pub mod watch;

use std::sync::Arc;
use std::time::Duration;

pub use config::Config;
pub use service::{Service, ServiceError, Tenant};
pub use shutdown::shutdown_signal;

/// Serves `service` on `listener` until SIGTERM or SIGINT, then shuts down: no new work is
/// accepted, running executions get the configured grace period and are then interrupted,
/// and every sandbox is torn down.
pub async fn serve(service: Arc<Service>, listener: tokio::net::TcpListener) -> anyhow::Result<()> {
    let app = http::router(http::AppState::new(service.clone()));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let header_timeout = service.config().header_timeout();
    let mut server = tokio::spawn(serve_app(listener, app, header_timeout, async {
        let _ = stop_rx.await;
    }));
    tokio::select! {
        _ = shutdown_signal() => {}
        result = &mut server => {
            result?;
            return Ok(());
        }
    }
    eprintln!("corral: shutting down: no new work; running executions may finish");
    service.begin_shutdown();
    let _ = stop_tx.send(());
    if tokio::time::timeout(service.config().shutdown_grace(), &mut server)
        .await
        .is_err()
    {
        eprintln!("corral: grace period over: interrupting running executions");
        service.interrupt_all();
        if tokio::time::timeout(Duration::from_secs(5), &mut server)
            .await
            .is_err()
        {
            server.abort();
        }
    }
    let closing = service.clone();
    let thread = closing.unmetered_thread();
    threads::spawn(thread, move || closing.close_all()).await?;
    eprintln!("corral: every sandbox is torn down");
    Ok(())
}

/// Serves `app` on `listener` (HTTP/1.1, upgrades passed through) until `stop` completes, then
/// lets the requests in flight finish; `corral serve` and `corral route` serve this way. A
/// connection must send a request's head within `header_timeout` of opening, or of its previous
/// answer's end, or it is closed: a client that opens connections and sends nothing, sends a
/// head a byte at a time or leaves a connection idle holds it no longer than that (hyper's
/// header read timeout, which `axum::serve` leaves unset).
pub async fn serve_app(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    header_timeout: Duration,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(header_timeout);
    // Every connection's task holds a receiver: `stopping` tells them to finish, and its
    // `closed` is when the last one has.
    let (stopping, _) = tokio::sync::watch::channel(false);
    tokio::pin!(stop);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // As `axum::serve` does: a connection that failed as it was accepted is
                // skipped; out of descriptors, the next accept waits a second.
                Err(e) if connection_error(&e) => continue,
                Err(_) => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let connection = builder
            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
            .with_upgrades();
        let mut stop_rx = stopping.subscribe();
        tokio::spawn(async move {
            tokio::pin!(connection);
            let mut shutting = false;
            loop {
                tokio::select! {
                    _ = connection.as_mut() => break,
                    _ = stop_rx.changed(), if !shutting => {
                        shutting = true;
                        connection.as_mut().graceful_shutdown();
                    }
                }
            }
            drop(stop_rx);
        });
    }
    drop(listener);
    let _ = stopping.send(true);
    stopping.closed().await;
}

fn connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}
