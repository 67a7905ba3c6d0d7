//! The port proxy (docs/api.md#ports, docs/threat-model.md): a server that a program runs
//! inside a sandbox — `python3 -m http.server 8000` in the background, a websocket server, a
//! notebook — reached from outside through `corral serve`.
//!
//! - Native: `/v1/sandboxes/{id}/ports/{port}/{path...}`, any method; the request goes to
//!   `127.0.0.1:{port}` inside the sandbox as `/{path...}` (with its query), with the same
//!   authentication and tenancy as every other route of the sandbox.
//! - By host name, as E2B's `getHost(port)` builds it: a request whose `Host` is
//!   `{port}-{sandboxId}.{domain}` ([`PortsConfig::domain`]; a loopback server defaults to
//!   `localhost:{its port}`, so `8000-sbx-….localhost:8420` works on one machine). It needs
//!   the owner's key too, unless the operator made host-routed ports public
//!   ([`PortsConfig::public`], E2B's default behaviour).
//!
//! Bodies stream both ways (HTTP/1.1); an `Upgrade` (WebSocket) is passed through, and then
//! bytes are copied both ways. The connection inside the sandbox is opened by the sandbox's
//! init ([`corral_sandbox::ports`]): the socket lives in the sandbox's network namespace, so
//! a port names only a listener of that sandbox, never the host's. Bounds: at most
//! [`PortsConfig::max_connections_per_sandbox`] proxied connections per sandbox at once (more
//! are refused at once with 429, never queued), [`CONNECT_TIMEOUT`] to connect, and every
//! connection is closed once idle for [`PortsConfig::idle_timeout_s`]. The credential that
//! authenticated the request (`Authorization`, `X-API-KEY`) is never passed to the sandbox.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use corral_sandbox::ports::PortError;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{ApiError, ErrorBody};
use crate::http::{authenticate, presented_key, AppState};
use crate::service::Tenant;
pub use corral_service::config::PortsConfig;

/// How long the proxy waits for a sandbox's listener to accept a connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The domain of host-routed ports of a server with `config`, if it has one.
pub fn domain_of(config: &crate::Config) -> Option<String> {
    config.ports.domain_for(config.listen)
}

/// The proxy's state: the settings and the connections open to each sandbox.
pub struct Proxy {
    config: PortsConfig,
    domain: Option<String>,
    open: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Proxy {
    pub fn new(config: &crate::Config) -> Arc<Proxy> {
        Arc::new(Proxy {
            config: config.ports.clone(),
            domain: domain_of(config),
            open: Mutex::new(HashMap::new()),
        })
    }

    /// The domain of host-routed ports, if the server has one.
    pub fn domain(&self) -> Option<&str> {
        self.domain.as_deref()
    }

    /// A slot for one more connection to sandbox `id`, or 429 when it has all it may have.
    fn slot(&self, id: &str) -> Result<OwnedSemaphorePermit, ApiError> {
        let max = self.config.max_connections_per_sandbox;
        let mut open = self.open.lock();
        // Sandboxes with no connection open need no entry.
        open.retain(|_, s| s.available_permits() < max);
        let semaphore = open
            .entry(id.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(max)))
            .clone();
        semaphore.try_acquire_owned().map_err(|_| {
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_connections",
                format!("sandbox {id} has {max} proxied connections open, its most"),
            )
        })
    }

    /// The port and sandbox a `Host` names (`{port}-{id}.{domain}`), if it is a host-routed
    /// request.
    fn route_of(&self, host: &str) -> Option<(u16, String)> {
        let domain = self.domain.as_deref()?;
        let host = host.to_ascii_lowercase();
        // A domain without a port matches whatever port the client used.
        let name = if domain.contains(':') {
            host.as_str()
        } else {
            host.rsplit_once(':')
                .map_or(host.as_str(), |(name, _)| name)
        };
        let label = name.strip_suffix(domain)?.strip_suffix('.')?;
        let (port, id) = label.split_once('-')?;
        if id.is_empty() || id.contains('.') || !port.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let port = port.parse().ok().filter(|p| *p != 0)?;
        Some((port, id.to_string()))
    }
}

/// The native routes.
pub fn router(proxy: Arc<Proxy>) -> Router<AppState> {
    Router::new()
        .route("/v1/sandboxes/{id}/ports/{port}", any(native))
        .route("/v1/sandboxes/{id}/ports/{port}/", any(native))
        .route("/v1/sandboxes/{id}/ports/{port}/{*path}", any(native))
        .layer(axum::Extension(proxy))
}

/// State of the host-routing middleware.
#[derive(Clone)]
pub struct HostRouting {
    pub app: AppState,
    pub proxy: Arc<Proxy>,
}

/// Serves host-routed requests (`{port}-{id}.{domain}`); passes every other request on.
pub async fn by_host(State(routing): State<HostRouting>, req: Request, next: Next) -> Response {
    let route = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| routing.proxy.route_of(h));
    let Some((port, id)) = route else {
        return next.run(req).await;
    };
    let tenant = if routing.proxy.config.public {
        match routing.app.service.owner_of(&id) {
            Some(tenant) => tenant,
            None => return ApiError::not_found(format!("no sandbox {id}")).into_response(),
        }
    } else if keyless_local(&routing, req.headers()) {
        Tenant::local()
    } else {
        match authenticate(&routing.app, req.headers()).await {
            Ok(tenant) => tenant,
            Err(e) => return e.into_response(),
        }
    };
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    match forward(&routing.app, &routing.proxy, tenant, id, port, path, req).await {
        Ok(mut response) => {
            response
                .extensions_mut()
                .insert(crate::console::Served::HostPreview);
            response
        }
        Err(e) => e.into_response(),
    }
}

/// A keyless server's host-routed request from this machine: the domain is `localhost`'s
/// (`*.localhost` resolves only to loopback), no key is presented, and the request comes from
/// no page or from a page of this machine (as `http::from_local_program` requires of every
/// keyless request: a page of another site can neither read nor post to a port).
fn keyless_local(routing: &HostRouting, headers: &HeaderMap) -> bool {
    let local_domain = routing.proxy.domain().is_some_and(|d| {
        let host = d.rsplit_once(':').map_or(d, |(host, _)| host);
        host == "localhost" || host.ends_with(".localhost")
    });
    let mut origins = headers.get_all(header::ORIGIN).iter();
    let origin_ok = match (origins.next(), origins.next()) {
        (None, _) => true,
        (Some(origin), None) => origin.to_str().is_ok_and(local_origin),
        (Some(_), Some(_)) => false,
    };
    local_domain
        && !routing.app.service.config().requires_keys()
        && matches!(presented_key(headers), Ok(None))
        && origin_ok
}

/// Whether `origin` is a page of this machine: `http(s)://` and `localhost`, a name under
/// `.localhost` or a loopback address, with an optional port, and nothing else.
fn local_origin(origin: &str) -> bool {
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    let host = match authority.rsplit_once(':') {
        Some((host, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => host,
        Some(_) if !authority.ends_with(']') => return false,
        _ => authority,
    };
    let host = host.to_ascii_lowercase();
    (scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https"))
        && (host == "localhost"
            || (host.ends_with(".localhost")
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.'))
            || host == "[::1]"
            || host
                .parse::<std::net::Ipv4Addr>()
                .is_ok_and(|ip| ip.is_loopback()))
}

/// Reach a server a program runs in the sandbox on `port`: the request (any method, with its
/// query; `path` may be empty) goes to `127.0.0.1:{port}/{path}` inside the sandbox, and its
/// answer comes back as the program sent it. An `Upgrade` (WebSocket) is passed through. The
/// credential that authenticated the request is not passed on.
#[utoipa::path(method(get, post, put, delete, patch, head, options),
    path = "/v1/sandboxes/{id}/ports/{port}/{path}", operation_id = "port", tag = "ports",
    responses(
        (status = 200, description = "The program's answer, whatever its status"),
        (status = 400, description = "not a port", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 429, description = "`too_many_connections`", body = ErrorBody),
        (status = 502, description = "`port_closed` (nothing listens) or `port_error`", body = ErrorBody),
        (status = 504, description = "`port_timeout`", body = ErrorBody)))]
pub(crate) async fn native(
    State(app): State<AppState>,
    axum::Extension(proxy): axum::Extension<Arc<Proxy>>,
    req: Request,
) -> Response {
    async {
        let tenant = authenticate(&app, req.headers()).await?;
        let (id, port, path) = native_target(req.uri())?;
        // A browser fetching a service worker's script says so: none is ever served from the
        // API's origin (the page that asks runs in an opaque origin and could not register
        // one anyway; docs/console.md#origins).
        if req.headers().contains_key("service-worker") {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "service_worker_refused",
                "the path-based port route never serves a service worker's script: serve \
                 the app on its own origin ({port}-{id}.{domain})",
            ));
        }
        let mut response = forward(&app, &proxy, tenant, id, port, path, req).await?;
        response
            .extensions_mut()
            .insert(crate::console::Served::PathPreview);
        Ok(response)
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// The sandbox, port and path (with the query) of a native port route, from the raw URI (the
/// path is passed on as the client wrote it, never decoded).
fn native_target(uri: &Uri) -> Result<(String, u16, String), ApiError> {
    let rest = uri
        .path()
        .strip_prefix("/v1/sandboxes/")
        .ok_or_else(|| ApiError::not_found("no such route"))?;
    let (id, rest) = rest
        .split_once("/ports/")
        .ok_or_else(|| ApiError::not_found("no such route"))?;
    let (port, path) = match rest.split_once('/') {
        Some((port, path)) => (port, format!("/{path}")),
        None => (rest, "/".to_string()),
    };
    let port = parse_port(port)?;
    let path = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path,
    };
    Ok((id.to_string(), port, path))
}

fn parse_port(port: &str) -> Result<u16, ApiError> {
    port.parse::<u16>()
        .ok()
        .filter(|p| *p != 0 && port.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| {
            ApiError::bad_request(format!("{port:?} is not a port (a number from 1 to 65535)"))
        })
}

/// Sends `req` to `port` of sandbox `id` (which `tenant` must own) as `path`, and its answer
/// back; an upgrade is passed through.
async fn forward(
    app: &AppState,
    proxy: &Proxy,
    tenant: Tenant,
    id: String,
    port: u16,
    path: String,
    mut req: Request,
) -> Result<Response, ApiError> {
    let call = app.service.admit(&tenant)?;
    let opener = app.service.port_opener(&call, &id)?;
    let slot = proxy.slot(&id)?;
    let stream = crate::threads::run(call, move |_call| opener.connect(port, CONNECT_TIMEOUT))
        .await
        .map_err(|e| ApiError::internal(format!("internal error: {e}")))?
        .map_err(|e| port_error(&id, e))?;
    let stream = tokio::net::TcpStream::from_std(stream)
        .map_err(|e| ApiError::internal(format!("connecting to port {port}: {e}")))?;
    let idle = Duration::from_secs(proxy.config.idle_timeout_s);
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(Idle::new(stream, idle)))
            .await
            .map_err(|e| bad_gateway(port, e))?;
    // The slot is held as long as the connection: by its task until the exchange ends or is
    // upgraded, then by the task that copies the upgraded bytes.
    let slot = Arc::new(slot);
    let held = slot.clone();
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
        drop(held);
    });

    let client_upgrade = req
        .headers()
        .contains_key(header::UPGRADE)
        .then(|| hyper::upgrade::on(&mut req));
    strip_credentials(req.headers_mut());
    *req.uri_mut() = path
        .parse()
        .map_err(|_| ApiError::bad_request("the request's path is not a valid URI"))?;
    let mut response = sender
        .send_request(req)
        .await
        .map_err(|e| bad_gateway(port, e))?;
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        // A switch the client did not ask for is no answer to pass on: a proxy in front of
        // Corral would take the client's connection for a tunnel.
        let Some(client) = client_upgrade else {
            return Err(ApiError::new(
                StatusCode::BAD_GATEWAY,
                "port_error",
                format!(
                    "the server on port {port} of the sandbox switched protocols (101) for a \
                     request that asked for no upgrade"
                ),
            ));
        };
        let sandbox = hyper::upgrade::on(&mut response);
        tokio::spawn(async move {
            if let (Ok(client), Ok(sandbox)) = (client.await, sandbox.await) {
                let (mut client, mut sandbox) = (TokioIo::new(client), TokioIo::new(sandbox));
                let _ = tokio::io::copy_bidirectional(&mut client, &mut sandbox).await;
            }
            drop(slot);
        });
    }
    Ok(response.map(Body::new))
}

/// Removes what authenticated the request to Corral: the sandbox's server never sees a key.
fn strip_credentials(headers: &mut HeaderMap) {
    if matches!(presented_key(headers), Ok(Some(_))) {
        headers.remove(header::AUTHORIZATION);
    }
    headers.remove("x-api-key");
}

fn bad_gateway(port: u16, e: hyper::Error) -> ApiError {
    ApiError::new(
        StatusCode::BAD_GATEWAY,
        "port_error",
        format!("the server on port {port} of the sandbox did not answer HTTP: {e}"),
    )
}

fn port_error(id: &str, e: PortError) -> ApiError {
    let message = e.to_string();
    match e {
        PortError::Gone => ApiError::not_found(format!("no sandbox {id}")),
        PortError::Refused(_) => ApiError::new(StatusCode::BAD_GATEWAY, "port_closed", message),
        PortError::Timeout(_) => {
            ApiError::new(StatusCode::GATEWAY_TIMEOUT, "port_timeout", message)
        }
        PortError::InvalidPort => ApiError::bad_request(message),
        PortError::BadReply | PortError::Io { .. } => ApiError::internal(message),
    }
}

/// A stream that fails with `TimedOut` once no byte has moved either way for `limit`.
struct Idle<S> {
    inner: S,
    limit: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl<S> Idle<S> {
    fn new(inner: S, limit: Duration) -> Idle<S> {
        Idle {
            inner,
            limit,
            timer: Box::pin(tokio::time::sleep(limit)),
        }
    }

    fn moved(&mut self) {
        let deadline = tokio::time::Instant::now() + self.limit;
        self.timer.as_mut().reset(deadline);
    }

    /// `Pending` stays pending until the idle limit, which turns it into an error.
    fn check<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match poll {
            Poll::Ready(Ok(v)) => {
                self.moved();
                Poll::Ready(Ok(v))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match self.timer.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the proxied connection was idle too long",
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Idle<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_read(cx, buf);
        this.check(cx, poll)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Idle<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.check(cx, poll)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy(domain: Option<&str>, listen: &str) -> Proxy {
        let config = PortsConfig {
            domain: domain.map(str::to_string),
            ..PortsConfig::default()
        };
        Proxy {
            domain: config.domain_for(listen.parse().unwrap()),
            config,
            open: Mutex::new(HashMap::new()),
        }
    }

    #[test]
    fn hosts_route_to_a_port_and_a_sandbox() {
        let local = proxy(None, "127.0.0.1:8420");
        assert_eq!(local.domain(), Some("localhost:8420"));
        assert_eq!(
            local.route_of("8000-sbx-1a2b.localhost:8420"),
            Some((8000, "sbx-1a2b".into()))
        );
        assert_eq!(
            local.route_of("8000-SBX-1A2B.LOCALHOST:8420"),
            Some((8000, "sbx-1a2b".into()))
        );
        // The server itself, another port of the domain, ports that are not ports.
        for host in [
            "localhost:8420",
            "127.0.0.1:8420",
            "8000-sbx-1.localhost:9999",
            "x-sbx-1.localhost:8420",
            "99999-sbx-1.localhost:8420",
            "8000-.localhost:8420",
            "8000-a.b.localhost:8420",
            "8000-sbx-1.evil.localhost:8420",
            "8000-sbx-1localhost:8420",
            "0-sbx-1.localhost:8420",
        ] {
            assert_eq!(local.route_of(host), None, "{host}");
        }
        // No domain on a public address: no host routing.
        assert_eq!(proxy(None, "0.0.0.0:8420").domain(), None);
        let named = proxy(Some("Sandbox.Example.com"), "0.0.0.0:8420");
        assert_eq!(
            named.route_of("3000-sbx-9.sandbox.example.com"),
            Some((3000, "sbx-9".into()))
        );
        assert_eq!(
            named.route_of("3000-sbx-9.sandbox.example.com:443"),
            Some((3000, "sbx-9".into()))
        );
    }

    #[test]
    fn native_paths_keep_what_the_client_wrote() {
        let target = |uri: &str| native_target(&uri.parse().unwrap());
        assert_eq!(
            target("/v1/sandboxes/sbx-1/ports/8000").unwrap(),
            ("sbx-1".into(), 8000, "/".into())
        );
        assert_eq!(
            target("/v1/sandboxes/sbx-1/ports/8000/a%2Fb/c?x=1&y").unwrap(),
            ("sbx-1".into(), 8000, "/a%2Fb/c?x=1&y".into())
        );
        for bad in [
            "/v1/sandboxes/sbx-1/ports/0/",
            "/v1/sandboxes/sbx-1/ports/65536/",
            "/v1/sandboxes/sbx-1/ports/+80/",
            "/v1/sandboxes/sbx-1/ports/http/",
        ] {
            assert_eq!(
                target(bad).unwrap_err().status,
                StatusCode::BAD_REQUEST,
                "{bad}"
            );
        }
    }

    #[test]
    fn connections_per_sandbox_are_bounded() {
        let mut p = proxy(None, "127.0.0.1:8420");
        p.config.max_connections_per_sandbox = 2;
        let a = p.slot("a").unwrap();
        let _b = p.slot("a").unwrap();
        assert_eq!(
            p.slot("a").unwrap_err().status,
            StatusCode::TOO_MANY_REQUESTS
        );
        // Another sandbox has its own.
        let _c = p.slot("b").unwrap();
        drop(a);
        let _d = p.slot("a").unwrap();
    }

    #[test]
    fn local_origins_are_pages_of_this_machine() {
        for ok in [
            "http://localhost:8420",
            "http://8000-sbx-1.localhost:8420",
            "https://127.0.0.1",
            "http://[::1]:3000",
        ] {
            assert!(local_origin(ok), "{ok}");
        }
        for bad in [
            "http://evil.com",
            "http://localhost.evil.com",
            "http://evil.com/.localhost",
            "http://localhost:8420/path",
            "file://localhost",
            "null",
            "http://user@localhost",
            "http://10.0.0.1:8420",
        ] {
            assert!(!local_origin(bad), "{bad}");
        }
    }

    #[test]
    fn the_key_never_reaches_the_sandbox() {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, "Bearer ck_secret".parse().unwrap());
        headers.insert("x-api-key", "ck_secret".parse().unwrap());
        headers.insert("x-app", "kept".parse().unwrap());
        strip_credentials(&mut headers);
        assert!(headers.get(header::AUTHORIZATION).is_none());
        assert!(headers.get("x-api-key").is_none());
        assert_eq!(headers["x-app"], "kept");
    }
}
