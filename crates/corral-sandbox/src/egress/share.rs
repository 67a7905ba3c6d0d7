//! A bound on the connections open at once through a group of egress proxies: every sandbox
//! that shares one [`ConnectionShare`] counts against it, on top of its own bound
//! ([`MAX_CONCURRENT`](super::proxy::MAX_CONCURRENT)) and the process's
//! ([`MAX_CONCURRENT_TOTAL`](super::proxy::MAX_CONCURRENT_TOTAL)). A server gives each key
//! one, so that one key's many sandboxes, each holding its own bound of idle connections,
//! cannot take every place of the process and leave other keys' sandboxes none.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Places for connections open at once, shared by the proxies of a group of sandboxes.
#[derive(Debug)]
pub struct ConnectionShare {
    open: AtomicUsize,
    limit: usize,
    /// Whose places they are, for a refusal: "this key's sandboxes".
    what: &'static str,
}

impl ConnectionShare {
    pub const fn new(limit: usize, what: &'static str) -> ConnectionShare {
        ConnectionShare {
            open: AtomicUsize::new(0),
            limit,
            what,
        }
    }

    /// Takes a place: false, and nothing taken, when all are taken.
    pub(crate) fn take(&self) -> bool {
        self.open
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |open| {
                (open < self.limit).then_some(open + 1)
            })
            .is_ok()
    }

    /// Gives back a place [`ConnectionShare::take`] took.
    pub(crate) fn give_back(&self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
    }

    /// Places taken now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn what(&self) -> &str {
        self.what
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_stop_at_the_limit_and_come_back() {
        let share = ConnectionShare::new(2, "a test's share");
        assert!(share.take() && share.take());
        assert!(!share.take());
        assert_eq!(share.open(), 2);
        share.give_back();
        assert!(share.take());
        assert!(!share.take());
    }
}
