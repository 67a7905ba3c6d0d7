//! The tools over streamable HTTP at `/mcp`, with the server's key rule: bound to anything but
//! loopback, every request needs `Authorization: Bearer KEY`; on loopback a request without a
//! key from a local program acts as the local tenant, and one with a key must carry a valid one.
//! The key is read as `corral serve` reads it ([`corral_wire::keys::presented_key`]): an
//! `Authorization` header that is not `Bearer KEY` is 401, never "no key".

use std::future::Future;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use corral_service::Tenant;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

use crate::backend::Caller;
use crate::tools::{CorralMcp, Shared};

/// Maps an API key to its tenant (`None`: no such live key).
pub type KeyCheck = Arc<dyn Fn(&str) -> Result<Option<Tenant>, String> + Send + Sync>;

/// How requests are authenticated.
#[derive(Clone)]
pub struct Auth {
    /// Keys are required (the listener is not on loopback).
    pub required: bool,
    pub check: KeyCheck,
}

fn refuse(status: StatusCode, code: &str, message: &str) -> Response {
    let body = axum::Json(serde_json::json!({"error": {"code": code, "message": message}}));
    let mut response = (status, body).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
    }
    response
}

async fn authenticate(State(auth): State<Auth>, mut req: Request, next: Next) -> Response {
    // The native API's rule: an `Authorization` that is not `Bearer KEY` is refused, never
    // taken for a request without a key.
    let key = match corral_wire::keys::presented_key(req.headers()) {
        Ok(key) => key,
        Err(e) => return refuse(e.status, e.code, &e.message),
    };
    let caller = match key {
        Some(key) => {
            let check = auth.check.clone();
            let k = key.clone();
            match tokio::task::spawn_blocking(move || check(&k)).await {
                Ok(Ok(Some(tenant))) => Caller {
                    tenant,
                    key: Some(key),
                },
                Ok(Ok(None)) => {
                    return refuse(StatusCode::UNAUTHORIZED, "unauthorized", "unknown API key")
                }
                Ok(Err(e)) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, "internal", &e),
                Err(e) => {
                    return refuse(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "internal",
                        &e.to_string(),
                    )
                }
            }
        }
        None if auth.required => {
            return refuse(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this server requires an API key: Authorization: Bearer KEY",
            )
        }
        // As for `corral serve`: a web page the user visits cannot use a keyless server.
        None if !corral_wire::keys::from_local_program(req.headers()) => {
            return refuse(
                StatusCode::FORBIDDEN,
                "forbidden",
                "a request without a key must come from a local program (a loopback Host, and \
                 no Origin but the server's own); send Authorization: Bearer KEY",
            )
        }
        None => Caller::local(),
    };
    req.extensions_mut().insert(caller);
    next.run(req).await
}

/// Serves the tools at `/mcp` on `listener` until `shutdown` completes; then ends every MCP
/// session and closes the sandboxes they made. A connection that sends no request head within
/// `header_timeout` (of opening, or of its last answer) is closed.
pub async fn serve(
    shared: Arc<Shared>,
    listener: tokio::net::TcpListener,
    auth: Auth,
    header_timeout: std::time::Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut config = StreamableHttpServerConfig::default();
    if auth.required {
        // Reached under names we cannot know; DNS rebinding needs no key, this server does.
        config = config.disable_allowed_hosts();
    }
    let cancel = config.cancellation_token.clone();
    let factory = shared.clone();
    let mcp = StreamableHttpService::new(
        move || Ok(CorralMcp::new(factory.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let app = axum::Router::new()
        .nest_service("/mcp", mcp)
        .layer(axum::middleware::from_fn_with_state(auth, authenticate))
        .layer(axum::middleware::from_fn(corral_wire::close_if_body_unread));
    corral_wire::serve_app(listener, app, header_timeout, async move {
        shutdown.await;
        cancel.cancel();
    })
    .await;
    shared.close_stateless().await;
    Ok(())
}
