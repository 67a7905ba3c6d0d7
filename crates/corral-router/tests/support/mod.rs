//! What the router's integration tests share: fake nodes served on loopback, and a router in
//! front of them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use corral_router::{app, NodeSource, Nodes, RouterConfig};
use tokio::task::JoinHandle;

/// Serves `node` (a fake node's routes) on a free loopback port until the task is aborted.
pub async fn serve(node: Router) -> (SocketAddr, JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, node).await.unwrap();
    });
    (addr, task)
}

/// The router's app in front of `nodes` (a 500 ms connect timeout, then `tune`), once it has
/// probed them.
pub async fn router_for(
    nodes: &[SocketAddr],
    tune: impl FnOnce(&mut RouterConfig),
) -> (Router, Arc<Nodes>) {
    let mut config = RouterConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        NodeSource::Static(nodes.iter().map(|a| a.to_string()).collect()),
    );
    config.connect_timeout = Duration::from_millis(500);
    tune(&mut config);
    let config = Arc::new(config);
    let nodes = Nodes::new(config.clone());
    nodes.probe().await;
    (app(config, nodes.clone()), nodes)
}
