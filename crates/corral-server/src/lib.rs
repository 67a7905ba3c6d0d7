//! Corral's HTTP server: the native API and the E2B-compatible face (docs/api.md),
//! over the service of corral-service (API keys and tenancy, metrics, the sessions it owns).
//! The engine is synchronous; [`service::Service`] holds the logic and the HTTP layer calls
//! it from blocking threads.

pub mod connect;
pub mod console;
mod docs_page;
pub mod e2b;
mod e2b_network;
pub mod files_api;
pub mod http;
pub mod operator;
pub mod ports;
pub mod threads;

// The service's modules, by the names the faces here use.
pub use corral_service::{admission, config, db, metrics, network, persist, service, watch};
// The wire items this crate shares with the other faces.
pub use corral_wire::error;

use std::sync::Arc;
use std::time::Duration;

pub use config::Config;
pub use corral_wire::{serve_app, shutdown_signal};
pub use service::{Service, ServiceError, Tenant};

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
