//! The bytes of results a host holds at once, across every execution: a server makes one
//! [`corral_share::Pool`] of them (`max_result_bytes_in_flight`, a share per key and a floor)
//! and a [`ResultBudget`] per key, and a decoder takes the room of each result frame it keeps
//! from that budget before it buffers the frame (docs/threat-model.md §11). The
//! [`Reservation`] it gets travels with the result it covers, into the answer made of it, and
//! gives its bytes back when that is dropped.

use std::sync::Arc;

use corral_share::{Grant, Limits, Pool, Share};

/// One key's room for results in a pool of result bytes.
#[derive(Debug)]
pub struct ResultBudget {
    share: Share,
    /// What the key's share is and what the pool is, for the warning of a result neither had
    /// room for.
    share_name: String,
    pool_name: String,
}

impl ResultBudget {
    /// A budget of `limit` bytes of its own (a host with one tenant).
    pub fn new(limit: usize, name: impl Into<String>) -> Arc<ResultBudget> {
        let limit = limit as u64;
        let pool = Pool::new("result bytes", "bytes", Limits::new(limit, limit, 0, 0));
        let name = name.into();
        ResultBudget::of(&pool, "", name.clone(), name)
    }

    /// `key`'s budget in `pool`, whose refusals name `share_name` (the key's share was full)
    /// or `pool_name` (the pool was).
    pub fn of(
        pool: &Arc<Pool>,
        key: &str,
        share_name: impl Into<String>,
        pool_name: impl Into<String>,
    ) -> Arc<ResultBudget> {
        Arc::new(ResultBudget {
            share: pool.share(key),
            share_name: share_name.into(),
            pool_name: pool_name.into(),
        })
    }

    /// The bytes this key holds now.
    pub fn used(&self) -> usize {
        self.share.pool().held_by(self.share.key()) as usize
    }

    /// Reserves `bytes` for this key, or says which bound had no room (the error names it).
    pub fn try_reserve(&self, bytes: usize) -> Result<Reservation, &str> {
        match self.share.take(bytes as u64) {
            Ok(grant) => Ok(Reservation(Some(grant))),
            Err(refusal) if refusal.is_key() => Err(&self.share_name),
            Err(_) => Err(&self.pool_name),
        }
    }
}

/// Bytes reserved in a [`ResultBudget`], given back when this is dropped. The default one
/// holds nothing (a host without a budget).
#[derive(Debug, Default)]
pub struct Reservation(Option<Grant>);

impl Reservation {
    pub fn bytes(&self) -> usize {
        self.0.as_ref().map_or(0, |g| g.amount() as usize)
    }

    /// Takes over `other`'s bytes, which must be of the same budget as any this one holds.
    pub fn absorb(&mut self, other: Reservation) {
        match (&mut self.0, other.0) {
            (_, None) => {}
            (Some(mine), Some(theirs)) => mine.merge(theirs),
            (mine, theirs) => *mine = theirs,
        }
    }
}

/// A reservation is not part of the value of what holds it: any two are equal.
impl PartialEq for Reservation {
    fn eq(&self, _: &Reservation) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_take_room_and_give_it_back_when_dropped() {
        let budget = ResultBudget::new(100, "the budget");
        let a = budget.try_reserve(60).unwrap();
        assert_eq!((a.bytes(), budget.used()), (60, 60));
        assert_eq!(budget.try_reserve(41).unwrap_err(), "the budget");
        assert_eq!(budget.used(), 60, "a refusal takes nothing");
        let mut b = budget.try_reserve(40).unwrap();
        assert_eq!(budget.used(), 100);
        assert!(budget.try_reserve(1).is_err());
        assert!(budget.try_reserve(0).is_ok(), "nothing always fits");
        drop(a);
        assert_eq!(budget.used(), 40);
        b.absorb(budget.try_reserve(10).unwrap());
        assert_eq!((b.bytes(), budget.used()), (50, 50));
        let mut empty = Reservation::default();
        empty.absorb(b);
        assert_eq!((empty.bytes(), budget.used()), (50, 50));
        empty.absorb(Reservation::default());
        drop(empty);
        assert_eq!(budget.used(), 0);
        assert!(budget.try_reserve(usize::MAX).is_err(), "no overflow");
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn keys_are_held_to_their_share_and_a_third_keeps_its_floor() {
        let pool = Pool::new("result bytes", "bytes", Limits::new(100, 60, 10, 20));
        let key = |k: &str| ResultBudget::of(&pool, k, format!("{k}'s share"), "the server's");
        let (a, b, c) = (key("a"), key("b"), key("c"));
        let held_a = a.try_reserve(50).unwrap();
        // Over a's share: a's share is named, nothing is taken.
        assert_eq!(a.try_reserve(20).unwrap_err(), "a's share");
        assert_eq!(pool.held(), 50);
        // Within b's share but past what the pool has left: the pool is named.
        assert_eq!(b.try_reserve(51).unwrap_err(), "the server's");
        let held_b = b.try_reserve(50).unwrap();
        // The pool is full; c still has its floor.
        let held_c = c.try_reserve(10).unwrap();
        assert_eq!(c.try_reserve(1).unwrap_err(), "the server's");
        assert_eq!(pool.held(), 110);
        drop((held_a, held_b, held_c));
        assert_eq!(pool.held(), 0);
    }
}
