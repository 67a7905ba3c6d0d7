//! The server's blocking threads, shared fairly between keys.
//!
//! The engine is a blocking library: every engine call a request makes runs on a thread of
//! tokio's blocking pool (`blocking_threads`), and holds it while it runs or waits for a busy
//! session. Before it takes a thread, a call on behalf of a key is admitted here against two
//! budgets: `max_blocking_calls_per_key` for its key and `max_blocking_calls` for all keys.
//! A call beyond either is refused at once (429 `key_busy`, or 503 `server_busy`; both with
//! `Retry-After`), never queued, so that one key (or several together) cannot take every
//! thread and hang the requests of the others. `max_blocking_calls` stays below
//! `blocking_threads`: the threads above it are left for the short work that is no key's
//! engine call (authenticating a request, stopping a stream whose client went away), and
//! half of them for a floor every key keeps: a key with fewer than [`FLOOR_PER_KEY`] calls
//! on threads is admitted even when other keys together hold all of `max_blocking_calls`,
//! so that keys which fill the budget between them still leave each other key served.
//!
//! A key's call is admitted by [`crate::Service::admit`], whose [`crate::Admitted`] holds
//! the [`ThreadPermit`] that only [`Threads::admit`] (or, for the work that is no key's,
//! [`Threads::unmetered`]) makes. corral-server's `threads::run` and `threads::spawn` are the
//! only ways the server puts work on the blocking pool (its `clippy.toml` forbids
//! `tokio::task::spawn_blocking` elsewhere).

use std::sync::Arc;

use corral_share::{Grant, Limits, Pool};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::config::Config;
use crate::metrics::{Metrics, RefusalLabels};
use crate::service::{ServiceError, Tenant, Unavailability};

/// What a refused call is told to wait before it retries: engine calls are short or are
/// refused at once, so a thread is usually free again soon.
const RETRY_AFTER_S: u64 = 1;

/// Calls every key may have on threads whatever other keys hold (up to halfway between
/// `max_blocking_calls` and `blocking_threads` in all): one running and one waiting.
pub const FLOOR_PER_KEY: usize = 2;

pub struct Threads {
    /// Admitted calls holding a thread (or queued for one), in a pool of `max_blocking_calls`
    /// with a share of `max_blocking_calls_per_key` and a floor of [`FLOOR_PER_KEY`] out of a
    /// reserve of half the threads above it.
    calls: Arc<Pool>,
    /// Blocking threads taken now (admitted and unmetered work).
    in_use: Gauge,
    refusals: Family<RefusalLabels, Counter>,
}

/// The right to run one piece of work on a blocking thread; given back when dropped (when
/// the work has finished, however it ended).
pub struct ThreadPermit {
    threads: Arc<Threads>,
    /// The call's unit of the pool; `None` for unmetered work.
    _call: Option<Grant>,
}

impl Threads {
    pub fn new(config: &Config, metrics: &Metrics) -> Arc<Threads> {
        let per_key = config.blocking_calls_per_key() as u64;
        let limits = Limits::new(
            config.max_blocking_calls as u64,
            per_key,
            (FLOOR_PER_KEY as u64).min(per_key),
            ((config.blocking_threads - config.max_blocking_calls) / 2) as u64,
        );
        Arc::new(Threads {
            calls: Pool::new("blocking threads", "calls", limits),
            in_use: metrics.blocking_threads_in_use.clone(),
            refusals: metrics.blocking_refusals.clone(),
        })
    }

    /// Admits a call of `tenant` onto a blocking thread, or refuses it at once: 429
    /// `key_busy` when the key holds `max_blocking_calls_per_key` threads already, 503
    /// `server_busy` when all keys together hold `max_blocking_calls` and this key holds its
    /// floor ([`FLOOR_PER_KEY`]) already, or when the floors too have taken their threads.
    pub fn admit(self: &Arc<Self>, tenant: &Tenant) -> Result<ThreadPermit, ServiceError> {
        match self.calls.take(&tenant.0, 1) {
            Ok(call) => {
                self.in_use.inc();
                Ok(ThreadPermit {
                    threads: self.clone(),
                    _call: Some(call),
                })
            }
            Err(refusal) if refusal.is_key() => {
                self.refused("key");
                Err(ServiceError::KeyBusy {
                    message: format!(
                        "{refusal} (max_blocking_calls_per_key): retry when one of its calls \
                         is done"
                    ),
                    retry_after_s: RETRY_AFTER_S,
                })
            }
            Err(refusal) => {
                self.refused("server");
                Err(ServiceError::Unavailable {
                    reason: Unavailability::ServerBusy,
                    message: format!(
                        "{refusal} (max_blocking_calls): retry when one of them is done"
                    ),
                    retry_after_s: RETRY_AFTER_S,
                })
            }
        }
    }

    /// A thread for work that is no key's engine call and is short or bounded by one that
    /// was admitted: authenticating a request (before its key is known), or interrupting the
    /// execution of a stream whose client went away. It uses the threads above
    /// `max_blocking_calls`.
    pub fn unmetered(self: &Arc<Self>) -> ThreadPermit {
        self.in_use.inc();
        ThreadPermit {
            threads: self.clone(),
            _call: None,
        }
    }

    fn refused(&self, scope: &str) {
        self.refusals
            .get_or_create(&RefusalLabels {
                scope: scope.into(),
            })
            .inc();
    }
}

impl ThreadPermit {
    /// What makes, later, an unmetered permit of the same threads: for the stop of the
    /// stream this permit runs (one per admitted stream, so bounded by the budgets).
    pub fn unmetered_later(&self) -> impl FnOnce() -> ThreadPermit + Send + 'static {
        let threads = self.threads.clone();
        move || threads.unmetered()
    }
}

impl Drop for ThreadPermit {
    fn drop(&mut self) {
        // The call's grant goes back to the pool as the field is dropped.
        self.threads.in_use.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn threads(max: usize, per_key: usize) -> (Arc<Threads>, Metrics) {
        let metrics = Metrics::default();
        let config = Config {
            // Two threads for keys under their floor above the budget.
            blocking_threads: max + 4,
            max_blocking_calls: max,
            max_blocking_calls_per_key: Some(per_key),
            ..Config::default()
        };
        (Threads::new(&config, &metrics), metrics)
    }

    /// The variant of a refusal, by the code the faces answer it with (corral-server's
    /// `error.rs` maps each to its status).
    fn code(e: ServiceError) -> &'static str {
        match e {
            ServiceError::TooManySandboxes { .. } => "too_many_sandboxes",
            ServiceError::KeyBusy { .. } => "key_busy",
            ServiceError::BadRequest(_) => "bad_request",
            ServiceError::Unavailable { reason, .. } => match reason {
                Unavailability::Uploads => "uploads_busy",
                Unavailability::MemoryBudget => "memory_budget_committed",
                Unavailability::ServerBusy => "server_busy",
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_key_past_its_share_is_refused_and_others_are_not() {
        let (threads, metrics) = threads(5, 2);
        let (a, b) = (Tenant("a".into()), Tenant("b".into()));
        let held: Vec<_> = (0..2).map(|_| threads.admit(&a).unwrap()).collect();
        let Err(e) = threads.admit(&a) else {
            panic!("a third call of a was admitted")
        };
        let ServiceError::KeyBusy { retry_after_s, .. } = e else {
            panic!("{e:?}")
        };
        assert_eq!(retry_after_s, RETRY_AFTER_S);
        let b_held = threads.admit(&b).unwrap();
        assert_eq!(metrics.blocking_threads_in_use.get(), 3);
        drop(held);
        assert_eq!(metrics.blocking_threads_in_use.get(), 1);
        // A's share is back once its calls are done.
        let _again = threads.admit(&a).unwrap();
        drop(b_held);
        assert_eq!(threads.calls.held_by("b"), 0);
        let text = metrics.encode();
        assert!(
            text.contains("corral_blocking_refusals_total{scope=\"key\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn past_the_server_budget_a_key_keeps_its_floor_and_unmetered_work_runs() {
        let (threads, metrics) = threads(3, 3);
        let tenants: Vec<_> = ["a", "b", "c"].map(|k| Tenant(k.into())).into();
        let _held: Vec<_> = [0, 0, 2]
            .iter()
            .map(|&i| threads.admit(&tenants[i]).unwrap())
            .collect();
        // The budget is full: a holds its floor already, c not yet, b has nothing.
        let e = threads.admit(&tenants[0]).err().expect("a past its floor");
        assert_eq!(code(e), "server_busy");
        let floor_c = threads.admit(&tenants[2]).expect("c under its floor");
        let e = threads.admit(&tenants[2]).err().expect("c past its floor");
        assert_eq!(code(e), "server_busy");
        let floor_b = threads.admit(&tenants[1]).expect("b under its floor");
        // The floors' threads (two here) are taken: even a key with nothing is refused.
        let d = Tenant("d".into());
        let e = threads.admit(&d).err().expect("past the floors' threads");
        assert_eq!(code(e), "server_busy");
        let unmetered = threads.unmetered();
        assert_eq!(metrics.blocking_threads_in_use.get(), 6);
        drop((unmetered, floor_b, floor_c));
        assert_eq!(threads.calls.held(), 3);
        assert!(metrics
            .encode()
            .contains("corral_blocking_refusals_total{scope=\"server\"} 3"));
    }
}
