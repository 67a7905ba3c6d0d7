//! Forwarding one request to one node: the body streams to the node as the client sends it,
//! and the answer streams back as the node writes it; nothing is buffered here.

use std::net::SocketAddr;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, Request, Response, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::RouterConfig;

pub type Client = hyper_util::client::legacy::Client<HttpConnector, Body>;

pub fn client(config: &RouterConfig) -> Client {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(config.connect_timeout));
    connector.set_nodelay(true);
    hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .pool_idle_timeout(std::time::Duration::from_secs(30))
        .build(connector)
}

/// Why a request did not reach its node's answer.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// The node did not take the connection: it is down.
    #[error("node {addr} does not accept connections")]
    Unreachable {
        addr: SocketAddr,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("node {addr} failed the request")]
    Failed {
        addr: SocketAddr,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("node {addr} did not begin its answer within {after:?}")]
    TimedOut {
        addr: SocketAddr,
        after: std::time::Duration,
    },
    #[error("a request to node {addr} could not be built")]
    Build {
        addr: SocketAddr,
        #[source]
        source: axum::http::Error,
    },
}

/// The headers that belong to one connection, not to the request (RFC 9110, 7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::try_from(name.trim()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Sends `request` (its method, path, query, headers — `Host` and keys included — and
/// streaming body) to the node at `addr`, and gives back its answer, streaming.
pub async fn forward(
    client: &Client,
    config: &RouterConfig,
    addr: SocketAddr,
    request: Request<Body>,
) -> Result<Response<Body>, ForwardError> {
    let (mut parts, body) = request.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    parts.uri = Uri::builder()
        .scheme("http")
        .authority(addr.to_string())
        .path_and_query(path)
        .build()
        .map_err(|source| ForwardError::Build { addr, source })?;
    parts.version = axum::http::Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    let request = Request::from_parts(parts, body);
    let answer = tokio::time::timeout(config.answer_timeout, client.request(request))
        .await
        .map_err(|_| ForwardError::TimedOut {
            addr,
            after: config.answer_timeout,
        })?
        .map_err(|source| {
            if source.is_connect() {
                ForwardError::Unreachable { addr, source }
            } else {
                ForwardError::Failed { addr, source }
            }
        })?;
    let (mut parts, body) = answer.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Ok(Response::from_parts(parts, Body::new(body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_headers_are_not_forwarded() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, "keep-alive, x-private".parse().unwrap());
        headers.insert("x-private", "1".parse().unwrap());
        headers.insert(header::TRANSFER_ENCODING, "chunked".parse().unwrap());
        headers.insert(header::AUTHORIZATION, "Bearer k".parse().unwrap());
        headers.insert("e2b-sandbox-id", "sbx-1-a".parse().unwrap());
        strip_hop_by_hop(&mut headers);
        let mut left: Vec<&str> = headers.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, ["authorization", "e2b-sandbox-id"]);
    }
}
