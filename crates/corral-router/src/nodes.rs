//! The nodes a router knows: where they are (a static list, or DNS), their names, health and
//! load, read from each node's `/healthz` at every probe. Nothing here is shared between
//! router replicas: each learns the same facts from the nodes themselves.
//!
//! The node source says where new sandboxes may go; a node's `/healthz` says whether its
//! sandboxes live. A node that leaves the source (a pod that is not ready, or is terminating,
//! leaves its headless Service's DNS) takes no new sandboxes, and its existing ones are still
//! served at its last address for as long as it answers there with its name; once it does not,
//! it is down (its sandboxes answer 410) and is no longer probed. A lookup that fails keeps
//! the last answer: a DNS outage is not every node leaving.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use corral_kernel::NodeName;
use http_body_util::BodyExt as _;
use serde::Deserialize;

use crate::proxy::{client, Client};
use crate::RouterConfig;

/// The largest `/healthz` answer read from a node.
const MAX_HEALTH_BYTES: usize = 64 << 10;

/// Where the nodes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeSource {
    /// `HOST:PORT` of every node.
    Static(Vec<String>),
    /// `NAME:PORT`, a name that resolves to every node's address (a headless Service), looked
    /// up again at every probe so that nodes that come and go are followed.
    Dns(String),
}

impl NodeSource {
    pub fn is_empty(&self) -> bool {
        match self {
            NodeSource::Static(list) => list.is_empty(),
            NodeSource::Dns(name) => name.is_empty(),
        }
    }

    fn entries(&self) -> &[String] {
        match self {
            NodeSource::Static(list) => list,
            NodeSource::Dns(name) => std::slice::from_ref(name),
        }
    }
}

/// What a node's `/healthz` tells a router.
#[derive(Debug, Deserialize)]
struct Health {
    status: String,
    node: Option<NodeName>,
    sessions_live: Option<u64>,
    max_sessions: Option<u64>,
}

/// A node as last seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub addr: SocketAddr,
    /// Its last probe (or the last request sent to it) reached it.
    pub up: bool,
    /// The node source gave its address at the last probe: only such nodes get new
    /// sandboxes. A node up and not listed has left DNS and still serves its sandboxes.
    pub listed: bool,
    /// A zygote of its pool is being replaced: new sandboxes go elsewhere while any other
    /// node is fully up.
    pub degraded: bool,
    pub live: u64,
    pub max: u64,
    /// Creations this router placed on it whose answer has not come back.
    pending: u64,
    /// When the answers of the creations placed on it came back, kept until a probe that
    /// began after them (whose `sessions_live` counts them): a burst of creations is spread
    /// before the node tells its new load, and a probe that read the load before a creation
    /// was made does not forget it.
    answered: Vec<Instant>,
}

impl Member {
    /// Its load, as a fraction of its `max_sessions`, with what was placed and not yet
    /// counted by it.
    fn load(&self) -> f64 {
        (self.live + self.pending + self.answered.len() as u64) as f64 / self.max.max(1) as f64
    }
}

/// A creation placed on a node (`place`), counted in its load while it is on its way and,
/// once dropped (its answer came back), until the node's next probe counts it.
pub struct Placement<'a> {
    nodes: &'a Nodes,
    name: NodeName,
}

impl Placement<'_> {
    pub fn node(&self) -> &NodeName {
        &self.name
    }
}

impl Drop for Placement<'_> {
    fn drop(&mut self) {
        self.nodes.answered(&self.name);
    }
}

/// Where a sandbox's node is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Up(SocketAddr),
    /// Known, and not answering: its sandboxes are lost.
    Down,
    /// Never seen by this router.
    Unknown,
}

pub struct Nodes {
    config: Arc<RouterConfig>,
    client: Client,
    members: Mutex<BTreeMap<NodeName, Member>>,
    /// Each entry of the node source's last successful lookup, kept when a lookup fails.
    resolved: Mutex<BTreeMap<String, Vec<SocketAddr>>>,
    /// Addresses not used (a server without a node name, a loopback node of a public
    /// router), reported once each.
    reported: Mutex<HashSet<SocketAddr>>,
}

impl Nodes {
    pub fn new(config: Arc<RouterConfig>) -> Arc<Nodes> {
        Arc::new(Nodes {
            client: client(&config),
            config,
            members: Mutex::new(BTreeMap::new()),
            resolved: Mutex::new(BTreeMap::new()),
            reported: Mutex::new(HashSet::new()),
        })
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    pub(crate) fn config(&self) -> &RouterConfig {
        &self.config
    }

    fn members(&self) -> std::sync::MutexGuard<'_, BTreeMap<NodeName, Member>> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub async fn probe_forever(self: Arc<Self>) {
        let mut every = tokio::time::interval(self.config.probe_interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every.tick().await;
        loop {
            every.tick().await;
            self.probe().await;
        }
    }

    /// Resolves the nodes' addresses and reads the `/healthz` of every one, and of every node
    /// up that is no longer listed; a node not reached is down until a later probe reaches it.
    pub async fn probe(&self) {
        let mut listed = BTreeSet::new();
        for entry in self.config.nodes.entries() {
            let found = tokio::net::lookup_host(entry.as_str())
                .await
                .map(|found| found.collect());
            listed.extend(self.remember(entry, found));
        }
        listed.retain(|addr| {
            let allowed = self.config.allows(addr);
            if !allowed {
                self.report_once(*addr, "is on loopback, and this router is not: not used");
            }
            allowed
        });
        let addrs = self.targets(&listed);
        let began = Instant::now();
        let seen =
            futures_util::future::join_all(addrs.iter().map(|&addr| self.health(addr))).await;
        self.record(&listed, began, addrs.into_iter().zip(seen));
    }

    /// Where a probe reads `/healthz`: the listed addresses, and those of the nodes up that
    /// are not listed (their sandboxes live while they answer).
    fn targets(&self, listed: &BTreeSet<SocketAddr>) -> Vec<SocketAddr> {
        let mut addrs = listed.clone();
        addrs.extend(
            self.members()
                .values()
                .filter(|m| m.up && !listed.contains(&m.addr))
                .map(|m| m.addr),
        );
        addrs.into_iter().collect()
    }

    /// The addresses of `entry`: this lookup's, or when it failed the last successful one's.
    fn remember(&self, entry: &str, found: std::io::Result<Vec<SocketAddr>>) -> Vec<SocketAddr> {
        let mut resolved = self.resolved.lock().unwrap_or_else(|e| e.into_inner());
        match found {
            Ok(addrs) => {
                resolved.insert(entry.to_string(), addrs.clone());
                addrs
            }
            Err(e) => {
                let last = resolved.get(entry).cloned().unwrap_or_default();
                eprintln!(
                    "corral route: resolving {entry}: {e}; using its last answer ({} addresses)",
                    last.len()
                );
                last
            }
        }
    }

    /// What a probe that `began` saw: every node that answered at `addr` is up under the
    /// name it gave, and listed if the source gave `addr`; every other node is down.
    fn record(
        &self,
        listed: &BTreeSet<SocketAddr>,
        began: Instant,
        seen: impl IntoIterator<Item = (SocketAddr, Option<Health>)>,
    ) {
        let mut members = self.members();
        for member in members.values_mut() {
            member.up = false;
            member.listed = false;
        }
        for (addr, health) in seen {
            let Some(health) = health else { continue };
            let Some(name) = health.node else {
                self.report_once(addr, "has no node_name: not used (docs/scale-out.md)");
                continue;
            };
            let listed = listed.contains(&addr);
            // Two addresses that answer with one name (a node that came back at a new
            // address while its old one still answers): the listed one is the node.
            let before = members.get(&name);
            if before.is_some_and(|m| m.up && m.listed) && !listed {
                continue;
            }
            let pending = before.map_or(0, |m| m.pending);
            let mut answered = before.map(|m| m.answered.clone()).unwrap_or_default();
            answered.retain(|at| *at >= began);
            members.insert(
                name,
                Member {
                    addr,
                    up: true,
                    listed,
                    degraded: health.status != "ok",
                    live: health.sessions_live.unwrap_or(0),
                    max: health.max_sessions.unwrap_or(1),
                    pending,
                    answered,
                },
            );
        }
    }

    fn report_once(&self, addr: SocketAddr, what: &str) {
        if self
            .reported
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(addr)
        {
            eprintln!("corral route: the server at {addr} {what}");
        }
    }

    async fn health(&self, addr: SocketAddr) -> Option<Health> {
        let request = Request::get(format!("http://{addr}/healthz"))
            .header(header::HOST, addr.to_string())
            .body(Body::empty())
            .ok()?;
        let answer =
            tokio::time::timeout(self.config.connect_timeout, self.client.request(request))
                .await
                .ok()?
                .ok()?;
        if answer.status() != StatusCode::OK {
            return None;
        }
        let body = http_body_util::Limited::new(answer.into_body(), MAX_HEALTH_BYTES);
        let bytes = tokio::time::timeout(self.config.connect_timeout, body.collect())
            .await
            .ok()?
            .ok()?
            .to_bytes();
        serde_json::from_slice(&bytes).ok()
    }

    /// The node that gets a new sandbox: the least loaded of the nodes up and listed, those without a
    /// zygote being replaced first; between nodes loaded alike, one at random, so that router
    /// replicas (which do not know of each other's placements until the next probe) do not all
    /// pick the same one.
    pub fn place(&self) -> Option<(Placement<'_>, SocketAddr)> {
        let mut members = self.members();
        let rank = |m: &Member| (m.degraded, m.load());
        let best = members
            .values()
            .filter(|m| m.up && m.listed)
            .map(rank)
            .min_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal))?;
        let tied: Vec<&NodeName> = members
            .iter()
            .filter(|(_, m)| m.up && m.listed && rank(m) == best)
            .map(|(name, _)| name)
            .collect();
        let name = tied[rand::random_range(0..tied.len())].clone();
        let member = members.get_mut(&name)?;
        member.pending += 1;
        let addr = member.addr;
        Some((Placement { nodes: self, name }, addr))
    }

    /// The answer of a creation placed on `name` came back.
    fn answered(&self, name: &NodeName) {
        if let Some(m) = self.members().get_mut(name) {
            m.pending = m.pending.saturating_sub(1);
            m.answered.push(Instant::now());
        }
    }

    pub fn lookup(&self, name: &NodeName) -> Lookup {
        match self.members().get(name) {
            Some(m) if m.up => Lookup::Up(m.addr),
            Some(_) => Lookup::Down,
            None => Lookup::Unknown,
        }
    }

    /// A node that did not accept a connection is down until a probe reaches it again.
    pub fn mark_down(&self, name: &NodeName) {
        if let Some(m) = self.members().get_mut(name) {
            m.up = false;
        }
    }

    /// The nodes up (listed or not: their sandboxes live), by name.
    pub fn up(&self) -> Vec<(NodeName, SocketAddr)> {
        self.members()
            .iter()
            .filter(|(_, m)| m.up)
            .map(|(n, m)| (n.clone(), m.addr))
            .collect()
    }

    /// Every node known, and whether it is up.
    pub fn known(&self) -> Vec<(NodeName, Member)> {
        self.members()
            .iter()
            .map(|(n, m)| (n.clone(), m.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes_with(members: &[(&str, bool, bool, u64, u64)]) -> Arc<Nodes> {
        let config = RouterConfig::new(
            "127.0.0.1:0".parse().unwrap(),
            NodeSource::Static(vec!["127.0.0.1:1".into()]),
        );
        let nodes = Nodes::new(Arc::new(config));
        {
            let mut map = nodes.members();
            for (i, &(name, up, degraded, live, max)) in members.iter().enumerate() {
                map.insert(
                    name.parse().unwrap(),
                    Member {
                        addr: SocketAddr::from(([127, 0, 0, 1], 9000 + i as u16)),
                        up,
                        listed: up,
                        degraded,
                        live,
                        max,
                        pending: 0,
                        answered: Vec::new(),
                    },
                );
            }
        }
        nodes
    }

    #[tokio::test]
    async fn creations_go_to_the_least_loaded_node_up_and_spread_between_probes() {
        let nodes = nodes_with(&[
            ("a", true, false, 5, 10),
            ("b", true, false, 1, 10),
            ("c", false, false, 0, 10),
            ("d", true, true, 0, 10),
        ]);
        // c is down and d's zygote is being replaced: b, the least loaded, until it has as
        // many as a; then one each.
        let picks: Vec<String> = (0..6)
            .map(|_| nodes.place().unwrap().0.node().to_string())
            .collect();
        assert_eq!(picks[..4], ["b", "b", "b", "b"]);
        let mut last_two = picks[4..].to_vec();
        last_two.sort();
        assert_eq!(last_two, ["a", "b"]);
        // With nothing else up, a degraded node still takes sandboxes.
        let only_degraded = nodes_with(&[("a", false, false, 0, 10), ("d", true, true, 9, 10)]);
        assert_eq!(only_degraded.place().unwrap().0.node().as_str(), "d");
        assert!(nodes_with(&[("a", false, false, 0, 10)]).place().is_none());
    }

    #[tokio::test]
    async fn a_node_is_up_down_or_unknown() {
        let nodes = nodes_with(&[("a", true, false, 0, 10), ("b", false, false, 0, 10)]);
        assert!(matches!(nodes.lookup(&"a".parse().unwrap()), Lookup::Up(_)));
        assert_eq!(nodes.lookup(&"b".parse().unwrap()), Lookup::Down);
        assert_eq!(nodes.lookup(&"z".parse().unwrap()), Lookup::Unknown);
        nodes.mark_down(&"a".parse().unwrap());
        assert_eq!(nodes.lookup(&"a".parse().unwrap()), Lookup::Down);
    }

    fn addr(last: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, last], 8420))
    }

    fn healthy(name: &str) -> Option<Health> {
        Some(Health {
            status: "ok".into(),
            node: Some(name.parse().unwrap()),
            sessions_live: Some(0),
            max_sessions: Some(10),
        })
    }

    fn placed(nodes: &Nodes, times: usize) -> BTreeSet<String> {
        (0..times)
            .map(|_| nodes.place().unwrap().0.node().to_string())
            .collect()
    }

    #[tokio::test]
    async fn a_node_that_leaves_the_source_keeps_its_sandboxes_and_gets_no_new_ones() {
        let nodes = nodes_with(&[]);
        let all: BTreeSet<SocketAddr> = [addr(1), addr(2), addr(3)].into();
        nodes.record(
            &all,
            Instant::now(),
            [
                (addr(1), healthy("a")),
                (addr(2), healthy("b")),
                (addr(3), healthy("c")),
            ],
        );
        assert_eq!(placed(&nodes, 30), ["a", "b", "c"].map(String::from).into());

        // c leaves DNS and still answers at its address: it is probed there, serves its
        // sandboxes, is in lists, and takes no new sandbox.
        let two: BTreeSet<SocketAddr> = [addr(1), addr(2)].into();
        assert_eq!(nodes.targets(&two), vec![addr(1), addr(2), addr(3)]);
        nodes.record(
            &two,
            Instant::now(),
            [
                (addr(1), healthy("a")),
                (addr(2), healthy("b")),
                (addr(3), healthy("c")),
            ],
        );
        let c: NodeName = "c".parse().unwrap();
        assert_eq!(nodes.lookup(&c), Lookup::Up(addr(3)));
        assert_eq!(nodes.up().len(), 3);
        assert_eq!(placed(&nodes, 30), ["a", "b"].map(String::from).into());

        // It stops answering: down (its sandboxes are gone), and no longer probed.
        nodes.record(
            &two,
            Instant::now(),
            [
                (addr(1), healthy("a")),
                (addr(2), healthy("b")),
                (addr(3), None),
            ],
        );
        assert_eq!(nodes.lookup(&c), Lookup::Down);
        assert_eq!(nodes.targets(&two), vec![addr(1), addr(2)]);

        // Listed again, it takes new sandboxes again.
        nodes.record(
            &all,
            Instant::now(),
            [
                (addr(1), healthy("a")),
                (addr(2), healthy("b")),
                (addr(3), healthy("c")),
            ],
        );
        assert_eq!(placed(&nodes, 30), ["a", "b", "c"].map(String::from).into());
    }

    #[tokio::test]
    async fn a_name_answering_at_two_addresses_is_the_listed_one() {
        let nodes = nodes_with(&[]);
        let listed: BTreeSet<SocketAddr> = [addr(2)].into();
        // Its old address (not listed) is probed first, its new one (listed) next, and the
        // reverse: either way the node is at its listed address.
        for seen in [
            [(addr(1), healthy("a")), (addr(2), healthy("a"))],
            [(addr(2), healthy("a")), (addr(1), healthy("a"))],
        ] {
            nodes.record(&listed, Instant::now(), seen);
            assert_eq!(nodes.lookup(&"a".parse().unwrap()), Lookup::Up(addr(2)));
            assert_eq!(nodes.place().unwrap().1, addr(2));
        }
    }

    #[tokio::test]
    async fn a_failed_lookup_keeps_the_last_answer() {
        let nodes = nodes_with(&[]);
        let failed = || Err(std::io::Error::other("no answer"));
        assert_eq!(nodes.remember("x:1", failed()), Vec::<SocketAddr>::new());
        assert_eq!(
            nodes.remember("x:1", Ok(vec![addr(1), addr(2)])),
            vec![addr(1), addr(2)]
        );
        assert_eq!(nodes.remember("x:1", failed()), vec![addr(1), addr(2)]);
        assert_eq!(nodes.remember("x:1", Ok(vec![addr(3)])), vec![addr(3)]);
        assert_eq!(nodes.remember("x:1", failed()), vec![addr(3)]);
        assert_eq!(nodes.remember("y:1", failed()), Vec::<SocketAddr>::new());
    }

    #[tokio::test]
    async fn a_creation_counts_until_a_probe_that_began_after_its_answer() {
        let nodes = nodes_with(&[]);
        let all: BTreeSet<SocketAddr> = [addr(1), addr(2)].into();
        let probe = |began| {
            nodes.record(
                &all,
                began,
                [(addr(1), healthy("a")), (addr(2), healthy("b"))],
            )
        };
        let counted = |name: &str| {
            let member = nodes
                .members()
                .get(&name.parse().unwrap())
                .cloned()
                .unwrap();
            member.pending + member.answered.len() as u64
        };
        probe(Instant::now());
        // A creation on its way: a probe that read the node's load before the node made the
        // sandbox (sessions_live still 0) does not forget it, and the next creation goes to
        // the other node.
        let (first, _) = nodes.place().unwrap();
        let on = first.node().to_string();
        probe(Instant::now());
        assert_eq!(counted(&on), 1);
        let (second, _) = nodes.place().unwrap();
        assert_ne!(second.node().as_str(), on);
        // Both answered after a probe began (which read the loads before): still counted.
        let began = Instant::now();
        drop(first);
        drop(second);
        probe(began);
        assert_eq!((counted("a"), counted("b")), (1, 1));
        // A probe that began after the answers reads them in sessions_live: no longer counted
        // here.
        probe(Instant::now());
        assert_eq!((counted("a"), counted("b")), (0, 0));
    }
}
