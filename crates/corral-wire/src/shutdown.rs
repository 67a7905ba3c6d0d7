//! The signals that end Corral's long-running commands (`corral serve`, `corral route`,
//! `corral mcp`) gracefully.

use tokio::signal::unix::{signal, SignalKind};

/// Completes at the first SIGTERM or SIGINT. Panics if their handlers cannot be installed: a
/// server that could not shut down gracefully does not start.
pub async fn shutdown_signal() {
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing a SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
