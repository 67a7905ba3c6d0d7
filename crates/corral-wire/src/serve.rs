//! The HTTP/1 server loop of `corral serve` and `corral route`.

use std::time::Duration;

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
