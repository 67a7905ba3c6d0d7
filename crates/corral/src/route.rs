//! `corral route`: the stateless router in front of several nodes (docs/scale-out.md).

use std::net::SocketAddr;

use anyhow::{Context, Result};
use clap::Args;
use corral_router::{NodeSource, RouterConfig};

#[derive(Debug, Args)]
pub struct RouteArgs {
    /// Address to listen on. A router on anything but loopback uses no node on loopback (a
    /// loopback node serves keyless requests as its local user).
    #[arg(long, env = "CORRAL_ROUTE_LISTEN", default_value = "127.0.0.1:8421")]
    listen: SocketAddr,
    /// A node, HOST:PORT (repeatable, or comma-separated).
    #[arg(
        long = "node",
        env = "CORRAL_ROUTE_NODES",
        value_name = "HOST:PORT",
        value_delimiter = ',',
        conflicts_with = "nodes_dns"
    )]
    nodes: Vec<String>,
    /// A DNS name that resolves to every node (a headless Service:
    /// NAME.NAMESPACE.svc.cluster.local:PORT), resolved again at every probe.
    #[arg(long, env = "CORRAL_ROUTE_NODES_DNS", value_name = "NAME:PORT")]
    nodes_dns: Option<String>,
    /// How often every node's /healthz is read (e.g. 1s, 500ms).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    probe_interval: std::time::Duration,
    /// How long connecting to a node may take before it counts as down.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    connect_timeout: std::time::Duration,
    /// Requests in flight at once (a stream counts until it ends); more get 503.
    #[arg(long, default_value_t = 4096)]
    max_in_flight: usize,
}

pub fn route(args: RouteArgs) -> Result<()> {
    let nodes = match args.nodes_dns {
        Some(name) => NodeSource::Dns(name),
        None => NodeSource::Static(args.nodes),
    };
    let mut config = RouterConfig::new(args.listen, nodes);
    config.probe_interval = args.probe_interval;
    config.connect_timeout = args.connect_timeout;
    config.max_in_flight = args.max_in_flight.max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        eprintln!("corral route: listening on http://{}", config.listen);
        corral_router::serve(config).await
    })?;
    Ok(())
}
