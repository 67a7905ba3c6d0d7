//! The bytes of results a host holds at once, across every execution: a server makes one
//! [`ResultBudget`] (`max_result_bytes_in_flight`) and a share of it per key, and a decoder
//! takes the room of each result frame it keeps from the budget before it buffers the frame
//! (docs/threat-model.md §11). The [`Reservation`] it gets travels with the result it covers,
//! into the answer made of it, and gives its bytes back when that is dropped.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// At most `limit` bytes reserved at once; a share's reservations take from the budget it is
/// a share of as well.
#[derive(Debug)]
pub struct ResultBudget {
    limit: usize,
    used: AtomicUsize,
    parent: Option<Arc<ResultBudget>>,
    /// What the budget is, for the warning of a result it had no room for.
    name: String,
}

impl ResultBudget {
    pub fn new(limit: usize, name: impl Into<String>) -> Arc<ResultBudget> {
        Arc::new(ResultBudget {
            limit,
            used: AtomicUsize::new(0),
            parent: None,
            name: name.into(),
        })
    }

    /// A share of this budget: at most `limit` of it, and only what it has room for.
    pub fn share(self: &Arc<Self>, limit: usize, name: impl Into<String>) -> Arc<ResultBudget> {
        Arc::new(ResultBudget {
            limit,
            used: AtomicUsize::new(0),
            parent: Some(self.clone()),
            name: name.into(),
        })
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The bytes reserved now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::SeqCst)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Reserves `bytes` in this budget and in every budget it is a share of, or in none: the
    /// error is the budget that had no room.
    pub fn try_reserve(self: &Arc<Self>, bytes: usize) -> Result<Reservation, &ResultBudget> {
        self.take(bytes)?;
        Ok(Reservation {
            budget: Some(self.clone()),
            bytes,
        })
    }

    fn take(&self, bytes: usize) -> Result<(), &ResultBudget> {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                used.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .map_err(|_| self)?;
        if let Some(parent) = &self.parent {
            if let Err(full) = parent.take(bytes) {
                self.used.fetch_sub(bytes, Ordering::SeqCst);
                return Err(full);
            }
        }
        Ok(())
    }

    fn give_back(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::SeqCst);
        if let Some(parent) = &self.parent {
            parent.give_back(bytes);
        }
    }
}

/// Bytes reserved in a [`ResultBudget`], given back when this is dropped. The default one
/// holds nothing (a host without a budget).
#[derive(Debug, Default)]
pub struct Reservation {
    budget: Option<Arc<ResultBudget>>,
    bytes: usize,
}

impl Reservation {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Takes over `other`'s bytes, which must be of the same budget as any this one holds.
    pub fn absorb(&mut self, mut other: Reservation) {
        if other.bytes == 0 {
            return;
        }
        if self.bytes == 0 {
            *self = other;
            return;
        }
        let same = match (&self.budget, &other.budget) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        assert!(same, "reservations of different budgets are not merged");
        self.bytes += std::mem::take(&mut other.bytes);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(budget) = &self.budget {
            if self.bytes > 0 {
                budget.give_back(self.bytes);
            }
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
        let refused = budget.try_reserve(41).unwrap_err();
        assert_eq!(refused.name(), "the budget");
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
    fn a_share_takes_from_its_budget_and_is_held_to_its_own_limit() {
        let server = ResultBudget::new(100, "the server's");
        let key_a = server.share(60, "a's share");
        let key_b = server.share(60, "b's share");
        let a = key_a.try_reserve(50).unwrap();
        assert_eq!((key_a.used(), server.used()), (50, 50));
        // Within the server's room but over a's share: a's share is named, nothing is taken.
        assert_eq!(key_a.try_reserve(20).unwrap_err().name(), "a's share");
        assert_eq!((key_a.used(), server.used()), (50, 50));
        // Within b's share but over what the server has left: the server is named, and b's
        // share is given back what it took.
        assert_eq!(key_b.try_reserve(51).unwrap_err().name(), "the server's");
        assert_eq!((key_b.used(), server.used()), (0, 50));
        let b = key_b.try_reserve(50).unwrap();
        assert_eq!(server.used(), 100);
        drop(a);
        assert_eq!((key_a.used(), key_b.used(), server.used()), (0, 50, 50));
        drop(b);
        assert_eq!(server.used(), 0);
    }

    #[test]
    fn concurrent_reservations_never_overrun_the_limit() {
        let server = ResultBudget::new(1000, "the server's");
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let share = server.share(600, format!("share {i}"));
                let server = server.clone();
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        if let Ok(r) = share.try_reserve(7) {
                            assert!(server.used() <= 1000 && share.used() <= 600);
                            drop(r);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(server.used(), 0);
    }

    #[test]
    #[should_panic(expected = "different budgets")]
    fn reservations_of_different_budgets_are_not_merged() {
        let (x, y) = (ResultBudget::new(10, "x"), ResultBudget::new(10, "y"));
        let mut a = x.try_reserve(1).unwrap();
        a.absorb(y.try_reserve(1).unwrap());
    }
}
