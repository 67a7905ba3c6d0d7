//! The nodes a router knows: where they are (a static list, or DNS), their names, health and
//! load, read from each node's `/healthz` at every probe. Nothing here is shared between
//! router replicas: each learns the same facts from the nodes themselves.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

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
    /// A zygote of its pool is being replaced: new sandboxes go elsewhere while any other
    /// node is fully up.
    pub degraded: bool,
    pub live: u64,
    pub max: u64,
    /// Creations this router sent to it that it has not answered yet.
    pending: u64,
    /// For each creation it answered, the probe round under way then: counted until a probe
    /// that started after the answer reads the node's own count (a probe under way when a
    /// creation was placed may have read the count before it), so that a burst of creations
    /// is spread before the next probe tells the new load.
    answered: Vec<u64>,
}

impl Member {
    /// Its load, as a fraction of its `max_sessions`, with what this router placed on it that
    /// its last probe may not have counted.
    fn load(&self) -> f64 {
        (self.live + self.pending + self.answered.len() as u64) as f64 / self.max.max(1) as f64
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
    /// Probes started so far (see [`Member::answered`]).
    round: std::sync::atomic::AtomicU64,
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
            round: std::sync::atomic::AtomicU64::new(0),
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

    /// Resolves the nodes' addresses and reads every one's `/healthz`; a node not reached is
    /// down until a later probe reaches it.
    pub async fn probe(&self) {
        let round = self.begin_round();
        let mut addrs: Vec<SocketAddr> = Vec::new();
        for entry in self.config.nodes.entries() {
            match tokio::net::lookup_host(entry.as_str()).await {
                Ok(found) => addrs.extend(found),
                Err(e) => eprintln!("corral route: resolving {entry}: {e}"),
            }
        }
        addrs.sort();
        addrs.dedup();
        addrs.retain(|addr| {
            let allowed = self.config.allows(addr);
            if !allowed {
                self.report_once(*addr, "is on loopback, and this router is not: not used");
            }
            allowed
        });
        let seen =
            futures_util::future::join_all(addrs.iter().map(|&addr| self.health(addr))).await;
        self.apply(round, addrs.into_iter().zip(seen));
    }

    fn begin_round(&self) -> u64 {
        self.round.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1
    }

    /// Takes in what probe `round` read from each address.
    fn apply(&self, round: u64, seen: impl IntoIterator<Item = (SocketAddr, Option<Health>)>) {
        let mut members = self.members();
        for member in members.values_mut() {
            member.up = false;
        }
        for (addr, health) in seen {
            let Some(health) = health else { continue };
            let Some(name) = health.node else {
                self.report_once(addr, "has no node_name: not used (docs/scale-out.md)");
                continue;
            };
            let (pending, answered) = members.get(&name).map_or((0, Vec::new()), |old| {
                let unread = old.answered.iter().copied().filter(|&r| r >= round);
                (old.pending, unread.collect())
            });
            members.insert(
                name,
                Member {
                    addr,
                    up: true,
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

    /// The node that gets a new sandbox: the least loaded of the nodes up, those without a
    /// zygote being replaced first; between nodes loaded alike, one at random, so that router
    /// replicas (which do not know of each other's placements until the next probe) do not all
    /// pick the same one.
    pub fn place(&self) -> Option<(NodeName, SocketAddr)> {
        let mut members = self.members();
        let rank = |m: &Member| (m.degraded, m.load());
        let best = members
            .values()
            .filter(|m| m.up)
            .map(rank)
            .min_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal))?;
        let tied: Vec<&NodeName> = members
            .iter()
            .filter(|(_, m)| m.up && rank(m) == best)
            .map(|(name, _)| name)
            .collect();
        let name = tied[rand::random_range(0..tied.len())].clone();
        let member = members.get_mut(&name)?;
        member.pending += 1;
        Some((name, member.addr))
    }

    /// A creation [`Nodes::place`]d on `name` is over: answered (`reached`), or the node did
    /// not take it.
    pub fn placed(&self, name: &NodeName, reached: bool) {
        let round = self.round.load(std::sync::atomic::Ordering::SeqCst);
        if let Some(m) = self.members().get_mut(name) {
            m.pending = m.pending.saturating_sub(1);
            if reached {
                m.answered.push(round);
            }
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

    /// The nodes up, by name.
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
            .map(|_| nodes.place().unwrap().0.to_string())
            .collect();
        assert_eq!(picks[..4], ["b", "b", "b", "b"]);
        let mut last_two = picks[4..].to_vec();
        last_two.sort();
        assert_eq!(last_two, ["a", "b"]);
        // With nothing else up, a degraded node still takes sandboxes.
        let only_degraded = nodes_with(&[("a", false, false, 0, 10), ("d", true, true, 9, 10)]);
        assert_eq!(only_degraded.place().unwrap().0.as_str(), "d");
        assert!(nodes_with(&[("a", false, false, 0, 10)]).place().is_none());
    }

    fn idle(node: &str) -> Health {
        Health {
            status: "ok".into(),
            node: Some(node.parse().unwrap()),
            sessions_live: Some(0),
            max_sessions: Some(10),
        }
    }

    /// A probe under way when a creation is placed may read the node's count before the
    /// creation is in it: the creation still counts until a probe started after its answer.
    #[tokio::test]
    async fn a_placement_counts_until_a_probe_started_after_its_answer() {
        let nodes = nodes_with(&[("a", true, false, 0, 10), ("b", true, false, 0, 10)]);
        let addr = |n: &str| nodes.members()[&n.parse::<NodeName>().unwrap()].addr;
        let seen = |live: &[(&str, u64)]| -> Vec<(SocketAddr, Option<Health>)> {
            live.iter()
                .map(|&(n, count)| {
                    let mut health = idle(n);
                    health.sessions_live = Some(count);
                    (addr(n), Some(health))
                })
                .collect()
        };
        // A probe begins; a creation is placed; the probe reads both nodes idle.
        let early = nodes.begin_round();
        let (first, _) = nodes.place().unwrap();
        nodes.apply(early, seen(&[("a", 0), ("b", 0)]));
        let other = if first.as_str() == "a" { "b" } else { "a" };
        assert_eq!(nodes.place().unwrap().0.as_str(), other);
        // Another probe begins before the answers come, and reads the nodes before them.
        let during = nodes.begin_round();
        nodes.placed(&first, true);
        nodes.placed(&other.parse().unwrap(), true);
        nodes.apply(during, seen(&[("a", 0), ("b", 0)]));
        for name in ["a", "b"] {
            let m = &nodes.members()[&name.parse::<NodeName>().unwrap()];
            assert_eq!((m.live, m.pending, m.answered.len()), (0, 0, 1), "{name}");
        }
        // A probe started after both answers reads them in the nodes' own counts.
        let later = nodes.begin_round();
        nodes.apply(later, seen(&[("a", 1), ("b", 1)]));
        for name in ["a", "b"] {
            let m = &nodes.members()[&name.parse::<NodeName>().unwrap()];
            assert_eq!((m.live, m.pending, m.answered.len()), (1, 0, 0), "{name}");
        }
        // A node that did not take its creation is not charged with it.
        let (third, _) = nodes.place().unwrap();
        nodes.placed(&third, false);
        let m = &nodes.members()[&third];
        assert_eq!((m.pending, m.answered.len()), (0, 0));
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
}
