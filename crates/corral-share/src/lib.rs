//! Fair shares of a pool that many keys draw from: the one mechanism behind every bound that
//! tenants share on a Corral host (docs/threat-model.md, "Shared pools").
//!
//! A [`Pool`] holds units of one resource — blocking threads, egress connections, resolver
//! slots, buffered output bytes, router requests, watcher scans. Each key (a tenant; one key
//! for a process that serves no tenants) takes units through a [`Grant`], which gives them
//! back when dropped. Three numbers share the pool ([`Limits`]):
//!
//! - **`per_key`**: what one key may hold at once, so that one key cannot take the pool;
//! - **`total`**: what all keys together may hold, so that two or three keys, each within its
//!   share, cannot take it either;
//! - **`floor`**: what every key may hold whatever the others hold, so that keys that fill
//!   `total` between them still leave every other key served. Units taken under the floor
//!   past `total` come out of a **`reserve`** above it; when the reserve too is gone, the
//!   pool refuses everyone, which bounds the floor's own cost.
//!
//! A request is refused at once, never queued: the caller answers it (429, 503, a refused
//! connection, a paused stream) and the refusal says which bound it met ([`Refusal`]).
//!
//! The state is a few counters behind a mutex that no code path can leave inconsistent, so a
//! panic elsewhere while it is held (there is none) would not poison it for everyone: a
//! poisoned lock is taken as it is.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// How a pool is shared between keys; see the crate's documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// What all keys together may hold, but for what keys under their floor take past it.
    pub total: u64,
    /// What one key may hold at once.
    pub per_key: u64,
    /// What every key may hold whatever the others hold (at most `per_key`).
    pub floor: u64,
    /// What keys under their floor may take past `total`, in all.
    pub reserve: u64,
}

impl Limits {
    /// Limits where one key may hold `per_key` of `total`, and every key `floor` out of a
    /// reserve of `reserve` above it.
    pub const fn new(total: u64, per_key: u64, floor: u64, reserve: u64) -> Limits {
        Limits {
            total,
            per_key,
            floor,
            reserve,
        }
    }

    /// The most the pool ever holds at once.
    pub const fn ceiling(&self) -> u64 {
        self.total + self.reserve
    }

    /// The rule itself: whether a key that holds `held_by_key` may take `more`, when all keys
    /// hold `held`. A [`Pool`] counts for itself; a caller whose units are counted elsewhere
    /// (live sessions in a table) asks this with its own counts.
    pub fn admits(&self, held: u64, held_by_key: u64, more: u64) -> Result<(), Bound> {
        if more == 0 {
            return Ok(());
        }
        let after_key = held_by_key.saturating_add(more);
        let after = held.saturating_add(more);
        if after_key > self.per_key {
            return Err(Bound::Key);
        }
        let within_floor = after_key <= self.floor && after <= self.ceiling();
        if after > self.total && !within_floor {
            return Err(Bound::Pool);
        }
        Ok(())
    }
}

/// Which bound refuses a request ([`Limits::admits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// The key's share.
    Key,
    /// The pool's total (and the key is past its floor, or the reserve is gone).
    Pool,
}

/// Why a pool refused a key's request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The key would hold more than its share.
    #[error("this key holds {held} of the {limit} {unit} of {what} one key may hold")]
    Key {
        what: &'static str,
        unit: &'static str,
        held: u64,
        limit: u64,
    },
    /// All keys together hold the pool, and this key holds its floor already (or the floors
    /// have taken the reserve).
    #[error("all keys together hold {held} of the {limit} {unit} of {what}")]
    Pool {
        what: &'static str,
        unit: &'static str,
        held: u64,
        limit: u64,
    },
}

impl Refusal {
    /// Whether the key's own share was the bound (else it was the pool's).
    pub fn is_key(&self) -> bool {
        matches!(self, Refusal::Key { .. })
    }
}

/// Units of one resource, shared fairly between keys.
pub struct Pool {
    what: &'static str,
    unit: &'static str,
    limits: Limits,
    state: Mutex<State>,
    refused_key: AtomicU64,
    refused_pool: AtomicU64,
}

#[derive(Default)]
struct State {
    held: u64,
    /// Per key; a key that holds nothing is not in the map, so the map is as large as the
    /// number of keys holding something.
    by_key: HashMap<Arc<str>, u64>,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("what", &self.what)
            .field("limits", &self.limits)
            .field("held", &self.held())
            .finish()
    }
}

impl Pool {
    /// A pool of `what` (`"egress connections"`), counted in `unit` (`"connections"`,
    /// `"bytes"`), shared by `limits`.
    pub fn new(what: &'static str, unit: &'static str, limits: Limits) -> Arc<Pool> {
        assert!(
            limits.floor <= limits.per_key && limits.per_key <= limits.ceiling(),
            "{what}: the floor ({}) must lie within the per-key share ({}), and the share \
             within the pool ({} + {})",
            limits.floor,
            limits.per_key,
            limits.total,
            limits.reserve
        );
        Arc::new(Pool {
            what,
            unit,
            limits,
            state: Mutex::new(State::default()),
            refused_key: AtomicU64::new(0),
            refused_pool: AtomicU64::new(0),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every change to the state is made whole before the guard is dropped: a poisoned
        // lock holds consistent counters.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `amount` units for `key`, or the bound that refuses them (see the crate's rule).
    pub fn take(self: &Arc<Self>, key: &str, amount: u64) -> Result<Grant, Refusal> {
        let key: Arc<str> = Arc::from(key);
        let mut state = self.state();
        self.admit(&mut state, &key, amount)?;
        Ok(Grant {
            pool: self.clone(),
            key,
            amount,
        })
    }

    /// `amount` units that `key` holds already, whatever the bounds (what an earlier process
    /// left behind, such as files on a disk, which exist whether admitted or not): counted,
    /// never refused, so that the pool refuses what would go past its bounds with them.
    pub fn take_held(self: &Arc<Self>, key: &str, amount: u64) -> Grant {
        let key: Arc<str> = Arc::from(key);
        let mut state = self.state();
        state.held = state.held.saturating_add(amount);
        *state.by_key.entry(key.clone()).or_insert(0) += amount;
        Grant {
            pool: self.clone(),
            key,
            amount,
        }
    }

    /// A key's handle on this pool, to take from later without naming the key again.
    pub fn share(self: &Arc<Self>, key: &str) -> Share {
        Share {
            pool: self.clone(),
            key: Arc::from(key),
        }
    }

    /// Admits `more` units for `key` (on top of what it holds, through any grant) and counts
    /// them.
    fn admit(&self, state: &mut State, key: &Arc<str>, more: u64) -> Result<(), Refusal> {
        let held_by_key = state.by_key.get(key).copied().unwrap_or(0);
        match self.limits.admits(state.held, held_by_key, more) {
            Ok(()) if more == 0 => Ok(()),
            Ok(()) => {
                state.held += more;
                *state.by_key.entry(key.clone()).or_insert(0) += more;
                Ok(())
            }
            Err(Bound::Key) => {
                self.refused_key.fetch_add(1, Ordering::Relaxed);
                Err(Refusal::Key {
                    what: self.what,
                    unit: self.unit,
                    held: held_by_key,
                    limit: self.limits.per_key,
                })
            }
            Err(Bound::Pool) => {
                self.refused_pool.fetch_add(1, Ordering::Relaxed);
                Err(Refusal::Pool {
                    what: self.what,
                    unit: self.unit,
                    held: state.held,
                    limit: self.limits.total,
                })
            }
        }
    }

    fn give_back(&self, key: &Arc<str>, amount: u64) {
        if amount == 0 {
            return;
        }
        let mut state = self.state();
        state.held -= amount;
        if let Some(n) = state.by_key.get_mut(key) {
            *n -= amount;
            if *n == 0 {
                state.by_key.remove(key);
            }
        }
    }

    /// What the pool is of, for messages and metrics.
    pub fn what(&self) -> &'static str {
        self.what
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Units held now by all keys.
    pub fn held(&self) -> u64 {
        self.state().held
    }

    /// Units held now by `key`.
    pub fn held_by(&self, key: &str) -> u64 {
        self.state().by_key.get(key).copied().unwrap_or(0)
    }

    /// Keys that hold something now.
    pub fn keys(&self) -> usize {
        self.state().by_key.len()
    }

    /// Requests refused so far: by a key's share, and by the pool's.
    pub fn refusals(&self) -> (u64, u64) {
        (
            self.refused_key.load(Ordering::Relaxed),
            self.refused_pool.load(Ordering::Relaxed),
        )
    }
}

/// A key's handle on a pool ([`Pool::share`]).
#[derive(Clone, Debug)]
pub struct Share {
    pool: Arc<Pool>,
    key: Arc<str>,
}

impl Share {
    /// `amount` units for this share's key.
    pub fn take(&self, amount: u64) -> Result<Grant, Refusal> {
        let mut state = self.pool.state();
        self.pool.admit(&mut state, &self.key, amount)?;
        Ok(Grant {
            pool: self.pool.clone(),
            key: self.key.clone(),
            amount,
        })
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    pub fn key(&self) -> &str {
        &self.key
    }
}

/// Units a key holds of a pool; given back when dropped.
#[derive(Debug)]
pub struct Grant {
    pool: Arc<Pool>,
    key: Arc<str>,
    amount: u64,
}

impl Grant {
    /// Units held through this grant.
    pub fn amount(&self) -> u64 {
        self.amount
    }

    /// Takes `more` units, by the same rule as [`Pool::take`]: on `Err` nothing changed.
    pub fn try_grow(&mut self, more: u64) -> Result<(), Refusal> {
        let mut state = self.pool.state();
        self.pool.admit(&mut state, &self.key, more)?;
        self.amount += more;
        Ok(())
    }

    /// Gives back `less` units (at most what the grant holds) and keeps the rest.
    pub fn shrink(&mut self, less: u64) {
        let less = less.min(self.amount);
        self.pool.give_back(&self.key, less);
        self.amount -= less;
    }

    /// Hands `amount` units (at most what the grant holds) on to a new grant of the same
    /// key, without asking the pool again: units that move with what they count (bytes of
    /// output from a stream's queue into the frame that carries them to its client).
    pub fn split(&mut self, amount: u64) -> Grant {
        let amount = amount.min(self.amount);
        self.amount -= amount;
        Grant {
            pool: self.pool.clone(),
            key: self.key.clone(),
            amount,
        }
    }

    /// Takes over `other`'s units, without asking the pool again (the units are held
    /// already): `other` must be a grant of the same pool for the same key.
    pub fn merge(&mut self, mut other: Grant) {
        assert!(
            Arc::ptr_eq(&self.pool, &other.pool) && self.key == other.key,
            "grants of different pools or keys are not merged"
        );
        self.amount += std::mem::take(&mut other.amount);
    }

    /// A handle on the same pool for the same key.
    pub fn share(&self) -> Share {
        Share {
            pool: self.pool.clone(),
            key: self.key.clone(),
        }
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        self.pool.give_back(&self.key, self.amount);
    }
}

/// `n` bytes for a person: in whole GiB, MiB or KiB when exact, else in bytes (never rounded,
/// so that a value just outside a bound never reads as the bound). How every bound on bytes
/// (a pool's, a sandbox's) is written in the refusals that name it.
pub fn show_bytes(n: u64) -> String {
    for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{} {unit}", n >> shift);
        }
    }
    format!("{n} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_as_people_write_them() {
        assert_eq!(show_bytes(64 << 30), "64 GiB");
        assert_eq!(show_bytes(4 << 20), "4 MiB");
        assert_eq!(show_bytes((4 << 20) - 1), "4194303 bytes");
        assert_eq!(show_bytes(1536 << 20), "1536 MiB");
        assert_eq!(show_bytes(12), "12 bytes");
    }

    fn pool(total: u64, per_key: u64, floor: u64, reserve: u64) -> Arc<Pool> {
        Pool::new(
            "test units",
            "units",
            Limits::new(total, per_key, floor, reserve),
        )
    }

    #[test]
    fn one_key_stops_at_its_share() {
        let p = pool(10, 4, 1, 2);
        let grants: Vec<_> = (0..4).map(|_| p.take("a", 1).unwrap()).collect();
        let refusal = p.take("a", 1).unwrap_err();
        assert!(refusal.is_key(), "{refusal}");
        assert_eq!(p.held_by("a"), 4);
        assert_eq!(p.refusals(), (1, 0));
        drop(grants);
        assert_eq!(p.held(), 0);
        assert_eq!(p.keys(), 0, "a key holding nothing leaves no entry");
        p.take("a", 4).unwrap();
    }

    #[test]
    fn two_keys_filling_the_pool_leave_a_third_its_floor() {
        let p = pool(8, 4, 2, 3);
        let _a = p.take("a", 4).unwrap();
        let _b = p.take("b", 4).unwrap();
        // The pool is full: a third key still gets its floor, out of the reserve.
        let c1 = p.take("c", 1).unwrap();
        let c2 = p.take("c", 1).unwrap();
        let refusal = p.take("c", 1).unwrap_err();
        assert!(!refusal.is_key(), "past its floor: the pool's bound");
        // A fourth key gets the last unit of the reserve, a fifth nothing.
        let _d = p.take("d", 1).unwrap();
        assert!(p.take("e", 1).is_err(), "the reserve bounds the floors");
        assert_eq!(p.held(), 11);
        assert_eq!(p.held(), p.limits().ceiling());
        drop((c1, c2));
        p.take("e", 2).unwrap();
        // The full keys get nothing more while the pool is past its total.
        assert!(p.take("a", 1).unwrap_err().is_key());
        assert!(p.take("b", 0).is_ok(), "nothing is always admitted");
    }

    #[test]
    fn a_key_at_its_floor_in_a_full_pool_is_refused_by_the_pool() {
        let p = pool(4, 4, 1, 4);
        let _a = p.take("a", 4).unwrap();
        let b = p.take("b", 1).unwrap();
        let e = p.take("b", 1).unwrap_err();
        assert_eq!(
            e,
            Refusal::Pool {
                what: "test units",
                unit: "units",
                held: 5,
                limit: 4
            }
        );
        drop(b);
        assert_eq!(p.held(), 4);
    }

    #[test]
    fn units_held_already_are_counted_past_the_bounds_and_block_the_rest() {
        let p = pool(10, 6, 2, 2);
        let held = p.take_held("a", 9);
        assert_eq!((p.held(), p.held_by("a")), (9, 9));
        assert!(
            p.take("a", 1).unwrap_err().is_key(),
            "past its share already"
        );
        // Another key still has its floor, then no more.
        let _b = p.take("b", 2).unwrap();
        assert!(p.take("b", 1).is_err());
        drop(held);
        assert_eq!(p.held(), 2);
        p.take("a", 6).unwrap();
    }

    #[test]
    fn grants_grow_and_shrink_by_the_same_rule() {
        let p = pool(100, 60, 10, 10);
        let mut a = p.take("a", 10).unwrap();
        a.try_grow(50).unwrap();
        assert!(a.try_grow(1).unwrap_err().is_key());
        assert_eq!(a.amount(), 60, "a refused growth changes nothing");
        let mut b = p.share("b").take(40).unwrap();
        // 100 held: b is past its floor, so it may not grow; c may take its floor.
        assert!(!b.try_grow(1).unwrap_err().is_key());
        let c = p.share("c").take(10).unwrap();
        a.shrink(30);
        b.try_grow(20).unwrap();
        assert_eq!(p.held(), 30 + 60 + 10);
        a.shrink(1000);
        assert_eq!(a.amount(), 0);
        assert_eq!(p.held_by("a"), 0);
        drop((a, b, c));
        assert_eq!(p.held(), 0);
        assert_eq!(p.keys(), 0);
    }

    #[test]
    fn a_split_grant_carries_its_units_until_dropped() {
        let p = pool(10, 6, 1, 1);
        let mut queue = p.take("a", 6).unwrap();
        let frame = queue.split(4);
        assert_eq!((queue.amount(), frame.amount()), (2, 4));
        assert_eq!(
            p.held_by("a"),
            6,
            "a split takes nothing and gives nothing back"
        );
        assert!(queue.try_grow(1).unwrap_err().is_key());
        drop(frame);
        assert_eq!(p.held_by("a"), 2);
        assert_eq!(queue.split(100).amount(), 2, "at most what the grant holds");
        assert_eq!(p.held(), 0);
    }

    #[test]
    fn a_grants_share_takes_for_its_key() {
        let p = pool(10, 3, 1, 1);
        let g = p.take("k", 2).unwrap();
        let more = g.share().take(1).unwrap();
        assert_eq!(p.held_by("k"), 3);
        assert!(g.share().take(1).unwrap_err().is_key());
        drop(more);
        assert_eq!(g.share().key(), "k");
    }

    #[test]
    fn the_rule_alone_answers_for_counts_kept_elsewhere() {
        let limits = Limits::new(10, 4, 1, 2);
        assert_eq!(limits.admits(0, 0, 4), Ok(()));
        assert_eq!(limits.admits(4, 4, 1), Err(Bound::Key));
        assert_eq!(limits.admits(10, 0, 1), Ok(()), "the floor");
        assert_eq!(limits.admits(10, 1, 1), Err(Bound::Pool), "past the floor");
        assert_eq!(
            limits.admits(12, 0, 1),
            Err(Bound::Pool),
            "the reserve is gone"
        );
        assert_eq!(limits.admits(12, 4, 0), Ok(()), "nothing always fits");
    }

    #[test]
    fn merged_grants_hold_both_and_give_back_once() {
        let p = pool(10, 10, 0, 0);
        let mut a = p.take("k", 3).unwrap();
        a.merge(p.take("k", 4).unwrap());
        assert_eq!((a.amount(), p.held()), (7, 7));
        drop(a);
        assert_eq!(p.held(), 0);
    }

    #[test]
    #[should_panic(expected = "not merged")]
    fn grants_of_other_keys_are_not_merged() {
        let p = pool(10, 10, 0, 0);
        let mut a = p.take("a", 1).unwrap();
        a.merge(p.take("b", 1).unwrap());
    }

    #[test]
    #[should_panic(expected = "floor")]
    fn a_floor_above_the_share_is_a_mistake() {
        pool(10, 2, 3, 0);
    }

    #[test]
    fn concurrent_takers_never_exceed_the_ceiling() {
        let p = pool(50, 20, 5, 10);
        let peak = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let p = p.clone();
                let peak = peak.clone();
                std::thread::spawn(move || {
                    let key = format!("k{}", i % 4);
                    for _ in 0..2000 {
                        if let Ok(g) = p.take(&key, 3) {
                            peak.fetch_max(p.held(), Ordering::Relaxed);
                            assert!(p.held_by(&key) <= 20);
                            drop(g);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(peak.load(Ordering::Relaxed) <= p.limits().ceiling());
        assert_eq!(p.held(), 0);
    }
}
