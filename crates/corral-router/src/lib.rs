//! `corral route`: a stateless router in front of several Corral nodes (`corral serve` with a
//! `node_name`), as docs/scale-out.md describes. A sandbox id names the node that owns it
//! (`corral_kernel::node`), so every replica of the router sends each request for a sandbox to
//! its node without shared state: the native API, the E2B control plane (`/sandboxes/{id}`,
//! `/v2/sandboxes/{id}/…`) and sandbox plane (the `E2b-Sandbox-Id` header), streams and files
//! alike, bodies streamed both ways. New sandboxes (and one-shot runs) go to the least-loaded
//! healthy node; lists are gathered from every node, a page at a time, and so are the
//! operator's routes (every node's sandboxes, audit log and keys) and `/metrics`.
//!
//! Keys are checked by the nodes only: the router forwards `Authorization` and `X-API-Key`
//! unchanged and never answers for a key itself, so there is one answer to "is this key
//! valid". Every node must hold the same keys (`corral key add`).

mod gather;
mod list;
mod metrics;
mod nodes;
mod operator;
mod proxy;
mod route;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub use metrics::MAX_METRICS_BYTES;
pub use nodes::{NodeSource, Nodes};
pub use route::app;

/// The settings of `corral route`.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    pub listen: SocketAddr,
    /// Where the nodes are: a static list of `HOST:PORT`, or a DNS name of every node (a
    /// headless Service's `NAME.NAMESPACE.svc:PORT`), resolved at every probe.
    pub nodes: NodeSource,
    /// How often every node's `/healthz` is read (its name, health and load).
    pub probe_interval: Duration,
    /// How long connecting to a node may take; a node that does not answer in time is
    /// taken as down.
    pub connect_timeout: Duration,
    /// How long a node may take to begin its answer (a non-streamed execution answers when
    /// it ends, so this is above the longest execution a node allows).
    pub answer_timeout: Duration,
    /// Requests in flight at once (a streamed answer counts until it ends), shared between
    /// keys (a key's share is half, and every key keeps a floor of 64 out of a reserve of a
    /// sixteenth above it): past a key's share 429 `key_busy`, past the
    /// router's 503 `router_busy`.
    pub max_in_flight: usize,
    /// The largest list answer read from one node when lists are gathered.
    pub max_list_bytes: usize,
    /// The largest body of a creation or a one-shot run (held to be offered to another node
    /// if the first is gone): the nodes' `max_json_bytes`.
    pub max_create_bytes: usize,
    /// How long a creation's body may take to arrive (it is read before the request takes
    /// its place in flight): past it, 408.
    pub body_timeout: Duration,
    /// How long a connection may take to send a request's head, from when it opens or its
    /// previous answer ends; then it is closed.
    pub header_timeout: Duration,
}

impl RouterConfig {
    pub fn new(listen: SocketAddr, nodes: NodeSource) -> RouterConfig {
        RouterConfig {
            listen,
            nodes,
            probe_interval: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(2),
            answer_timeout: Duration::from_secs(3600),
            max_in_flight: 4096,
            max_list_bytes: 32 << 20,
            max_create_bytes: 8 << 20,
            body_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(30),
        }
    }

    /// A router reachable from other hosts must not reach nodes on loopback: a loopback node
    /// serves keyless requests as its local user, and would serve anyone's that way.
    fn allows(&self, node: &SocketAddr) -> bool {
        self.listen.ip().is_loopback() || !node.ip().is_loopback()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error("listening on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("no nodes: give --node HOST:PORT (repeatable) or --nodes-dns NAME:PORT")]
    NoNodes,
}

/// Routes on `config.listen` until SIGTERM or SIGINT; requests in flight then finish.
pub async fn serve(config: RouterConfig) -> Result<(), RouterError> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| RouterError::Listen {
            addr: config.listen,
            source,
        })?;
    serve_on(config, listener, corral_wire::shutdown_signal()).await
}

/// As [`serve`], on a bound listener, until `stop` completes.
pub async fn serve_on(
    config: RouterConfig,
    listener: tokio::net::TcpListener,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), RouterError> {
    if config.nodes.is_empty() {
        return Err(RouterError::NoNodes);
    }
    let config = Arc::new(config);
    let nodes = Nodes::new(config.clone());
    // The first probe before the first request: a router that starts answers at once.
    nodes.probe().await;
    let probing = tokio::spawn(nodes.clone().probe_forever());
    let header_timeout = config.header_timeout;
    let app = app(config, nodes);
    corral_wire::serve_app(listener, app, header_timeout, stop).await;
    probing.abort();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_router_reachable_from_elsewhere_uses_no_loopback_node() {
        let node = |s: &str| s.parse::<SocketAddr>().unwrap();
        let config = |listen: &str| RouterConfig::new(node(listen), NodeSource::Dns("x:1".into()));
        let public = config("0.0.0.0:8421");
        assert!(!public.allows(&node("127.0.0.1:8420")));
        assert!(!public.allows(&node("[::1]:8420")));
        assert!(public.allows(&node("10.0.0.7:8420")));
        let local = config("127.0.0.1:8421");
        assert!(local.allows(&node("127.0.0.1:8420")));
        assert!(local.allows(&node("10.0.0.7:8420")));
    }
}
