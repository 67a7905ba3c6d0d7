//! Each key's share of the egress proxies' connections (docs/threat-model.md §11). Every
//! sandbox with a network policy may hold [`MAX_CONCURRENT`] connections open at once through
//! its proxy, and the whole process [`MAX_CONCURRENT_TOTAL`]: without a bound per key, one key
//! with enough sandboxes (sixteen, each holding 64 idle connections, a silent head being
//! enough for 10 s and renewed at once) took every place, and every other key's sandboxes got
//! 503 for each connection. A key's sandboxes share at most half of the process's places, as
//! a key's one-shot runs take at most half of the run slots.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use corral_sandbox::egress::proxy::{MAX_CONCURRENT, MAX_CONCURRENT_TOTAL};
use corral_sandbox::egress::ConnectionShare;

/// The places one key's sandboxes share.
pub const PER_KEY: usize = MAX_CONCURRENT_TOTAL / 2;

const _: () = assert!(
    PER_KEY >= MAX_CONCURRENT,
    "a key's share holds one sandbox's bound"
);

/// The shares of the keys that have had a sandbox with a network policy.
#[derive(Debug, Default)]
pub struct EgressShares {
    by_key: Mutex<HashMap<String, Arc<ConnectionShare>>>,
}

impl EgressShares {
    /// Key `key_id`'s share, the same for all its sandboxes.
    pub fn of(&self, key_id: &str) -> Arc<ConnectionShare> {
        self.by_key
            .lock()
            .expect("lock")
            .entry(key_id.to_string())
            .or_insert_with(|| Arc::new(ConnectionShare::new(PER_KEY, "this key's sandboxes")))
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_has_one_share_of_half_the_process() {
        let shares = EgressShares::default();
        let (a, a_again, b) = (shares.of("key-a"), shares.of("key-a"), shares.of("key-b"));
        assert!(Arc::ptr_eq(&a, &a_again));
        assert!(!Arc::ptr_eq(&a, &b));
        assert_eq!(a.limit(), MAX_CONCURRENT_TOTAL / 2);
    }
}
