//! The pools every egress proxy of a process draws from, shared between keys through
//! [`corral_share`] (docs/threat-model.md, "Shared pools"): connections open at once, names
//! being resolved, and resolver threads alive. A server gives each key its own
//! [`EgressShare`] of the process's pools; `corral run` has one key.
//!
//! A look-up holds two units. A **resolver slot**, from the moment it starts until it has an
//! answer or the proxy stops waiting for one ([`RESOLVE_TIMEOUT`](crate::resolve::RESOLVE_TIMEOUT)):
//! this is what a key's sandboxes wait on, so it is what the key's share and floor are of. And
//! a **resolver thread**, until the thread that calls the host's resolver returns, which the
//! proxy cannot hasten (`getaddrinfo` cannot be cancelled; a name server that never answers
//! holds it for its own timeouts, about 10 s with the defaults of resolv.conf). Were a slot
//! held until the thread returns, a key whose names never resolve would hold its slots twice
//! as long as it waits on them, and the threads bound the slots; were threads not counted at
//! all, a key could start a new look-up every 5 s while the old ones still block, and pile up
//! threads without bound. So the threads are a second, larger pool with a share and a floor of
//! their own: a key that piles up stuck threads meets its share of them (four times its share
//! of slots: twenty seconds of stuck look-ups at its full rate), and other keys keep theirs.

use std::sync::{Arc, OnceLock};

use corral_share::{Limits, Pool, Share};

/// Connections open at once through the process's proxies: the total, one key's share (half,
/// as a key's one-shot runs take at most half of the run slots), and the floor every key keeps
/// (one sandbox's bound, [`MAX_CONCURRENT`](crate::proxy::MAX_CONCURRENT)) out of a reserve of
/// four floors.
pub const CONNECTIONS: Limits = Limits::new(1024, 512, 64, 256);
/// Names being resolved at once, waited on by a proxy.
pub const RESOLVER_SLOTS: Limits = Limits::new(64, 16, 4, 16);
/// Threads calling the host's resolver, including those still blocked after the proxy stopped
/// waiting for them.
pub const RESOLVER_THREADS: Limits = Limits::new(256, 64, 8, 32);

/// The key of a process that serves no tenants (`corral run`).
pub const LOCAL_KEY: &str = "local";

/// The pools of the process's egress proxies.
#[derive(Debug, Clone)]
pub struct EgressPools {
    pub connections: Arc<Pool>,
    pub resolver_slots: Arc<Pool>,
    pub resolver_threads: Arc<Pool>,
}

impl EgressPools {
    pub fn new(connections: Limits, resolver_slots: Limits, resolver_threads: Limits) -> Self {
        EgressPools {
            connections: Pool::new("this host's egress proxies", "connections", connections),
            resolver_slots: Pool::new(
                "this host's egress proxies",
                "look-ups waited on",
                resolver_slots,
            ),
            resolver_threads: Pool::new(
                "this host's egress proxies",
                "resolver threads",
                resolver_threads,
            ),
        }
    }

    /// The process's pools, with [`CONNECTIONS`], [`RESOLVER_SLOTS`] and [`RESOLVER_THREADS`].
    pub fn process() -> &'static EgressPools {
        static POOLS: OnceLock<EgressPools> = OnceLock::new();
        POOLS.get_or_init(|| EgressPools::new(CONNECTIONS, RESOLVER_SLOTS, RESOLVER_THREADS))
    }

    /// `key`'s share of each pool, the same for all its sandboxes.
    pub fn share(&self, key: &str) -> EgressShare {
        EgressShare {
            connections: self.connections.share(key),
            resolver_slots: self.resolver_slots.share(key),
            resolver_threads: self.resolver_threads.share(key),
        }
    }
}

/// A key's share of the egress pools: what its sandboxes' proxies take from.
#[derive(Debug, Clone)]
pub struct EgressShare {
    pub connections: Share,
    pub resolver_slots: Share,
    pub resolver_threads: Share,
}

impl Default for EgressShare {
    /// The process's pools, for its one key.
    fn default() -> Self {
        EgressPools::process().share(LOCAL_KEY)
    }
}

const _: () = assert!(
    CONNECTIONS.floor >= crate::proxy::MAX_CONCURRENT as u64,
    "a key's floor of connections holds one sandbox's bound"
);
const _: () = assert!(
    RESOLVER_THREADS.per_key > RESOLVER_SLOTS.per_key
        && RESOLVER_THREADS.floor > RESOLVER_SLOTS.floor,
    "a key's threads outlast its slots"
);

#[cfg(test)]
mod tests {
    use super::*;

    /// The process's connections: two keys that hold their shares fill the pool, and a third
    /// key still opens one sandbox's worth, and no more.
    #[test]
    fn two_keys_holding_their_shares_leave_a_third_one_sandboxs_connections() {
        let pools = EgressPools::new(CONNECTIONS, RESOLVER_SLOTS, RESOLVER_THREADS);
        let (a, b, c) = (pools.share("a"), pools.share("b"), pools.share("c"));
        let mut held: Vec<_> = (0..512).map(|_| a.connections.take(1).unwrap()).collect();
        assert!(a.connections.take(1).unwrap_err().is_key());
        held.extend((0..512).map(|_| b.connections.take(1).unwrap()));
        held.extend((0..64).map(|_| c.connections.take(1).unwrap()));
        let refusal = c.connections.take(1).unwrap_err();
        assert!(!refusal.is_key(), "{refusal}");
        assert_eq!(pools.connections.held(), 1024 + 64);
        drop(held);
        assert_eq!(pools.connections.held(), 0);
    }
}
