//! Admission control: the host memory promised to live sandboxes, the one-shot run slots
//! shared fairly between keys, and the uploads whose bodies stream at once.
//!
//! Every live sandbox (a session, or a one-shot run while it runs) holds a promise of host
//! memory: [`corral_sandbox::Limits::host_memory_bytes`]. Their sum stays within the budget
//! (`memory_overcommit` × `MemTotal`, or `memory_budget_bytes`): a sandbox beyond it is refused
//! with 503 and `Retry-After` rather than left to the OOM killer. One-shot runs also take one of
//! `max_runs` slots, at most `max_runs_per_key` of them per key, so that one key cannot starve
//! the others; a run that cannot get its slot and its memory within `admission_wait_s` is
//! refused (429, or 503 when memory was what it lacked). An upload streams its body only with
//! one of `max_uploads_in_flight` slots, which bounds the server's buffers for all of them;
//! one that gets none within `admission_wait_s` is refused with 503 (its body is never read).
//! Nothing waits unboundedly.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corral_sandbox::limits::show_bytes;

use prometheus_client::metrics::gauge::Gauge;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::service::{ServiceError, Unavailability};

/// What a refused request is told to wait before it retries.
const RETRY_AFTER_S: u64 = 5;

pub struct Admission {
    max_runs: usize,
    max_runs_per_key: usize,
    wait: Duration,
    budget: u64,
    state: Mutex<State>,
    /// Woken whenever a slot or memory is released.
    freed: tokio::sync::Notify,
    /// `/metrics` views of the state, kept up to date with it.
    committed_gauge: Gauge,
    runs_gauge: Gauge,
    /// The queues: runs and uploads waiting now.
    runs_waiting: Gauge,
    uploads_waiting: Gauge,
    /// One permit per upload streaming now.
    uploads: Arc<tokio::sync::Semaphore>,
    max_uploads: usize,
}

/// An upload's slot; released when dropped.
pub struct UploadPermit {
    _slot: tokio::sync::OwnedSemaphorePermit,
}

#[derive(Default)]
struct State {
    runs: usize,
    runs_per_key: HashMap<String, usize>,
    /// Bytes promised to live sandboxes.
    committed: u64,
}

impl Admission {
    fn publish(&self, state: &State) {
        self.committed_gauge
            .set(i64::try_from(state.committed).unwrap_or(i64::MAX));
        self.runs_gauge
            .set(i64::try_from(state.runs).unwrap_or(i64::MAX));
    }
}

/// Why a request cannot be admitted now.
enum Refusal {
    Slots(String),
    Memory(String),
}

impl Refusal {
    fn into_error(self) -> ServiceError {
        match self {
            Refusal::Slots(message) => ServiceError::TooManySandboxes {
                message,
                retry_after_s: RETRY_AFTER_S,
            },
            Refusal::Memory(message) => ServiceError::Unavailable {
                reason: Unavailability::MemoryBudget,
                message,
                retry_after_s: RETRY_AFTER_S,
            },
        }
    }
}

/// A one-shot run's slot and memory; released when dropped (when the run's sandbox is gone).
pub struct RunPermit {
    admission: Arc<Admission>,
    tenant: String,
    bytes: u64,
}

impl Drop for RunPermit {
    fn drop(&mut self) {
        {
            let mut state = self.admission.state.lock().expect("lock");
            state.runs -= 1;
            if let Some(n) = state.runs_per_key.get_mut(&self.tenant) {
                *n -= 1;
                if *n == 0 {
                    state.runs_per_key.remove(&self.tenant);
                }
            }
            state.committed -= self.bytes;
            self.admission.publish(&state);
        }
        self.admission.freed.notify_waiters();
    }
}

impl Admission {
    /// Slots and budget from `config`; `budget` in bytes ([`Config::memory_budget`]).
    pub fn new(config: &Config, budget: u64, metrics: &Metrics) -> Admission {
        metrics
            .memory_budget_bytes
            .set(i64::try_from(budget).unwrap_or(i64::MAX));
        Admission {
            max_runs: config.max_runs,
            max_runs_per_key: config.runs_per_key(),
            wait: Duration::from_secs(config.admission_wait_s),
            budget,
            state: Mutex::new(State::default()),
            freed: tokio::sync::Notify::new(),
            committed_gauge: metrics.memory_committed_bytes.clone(),
            runs_gauge: metrics.runs_in_flight.clone(),
            runs_waiting: metrics.runs_waiting.clone(),
            uploads_waiting: metrics.uploads_waiting.clone(),
            uploads: Arc::new(tokio::sync::Semaphore::new(config.max_uploads_in_flight)),
            max_uploads: config.max_uploads_in_flight,
        }
    }

    /// A slot for one upload, waited for at most `admission_wait_s`; then refused with 503
    /// and `Retry-After`.
    pub async fn admit_upload(&self) -> Result<UploadPermit, ServiceError> {
        if let Ok(slot) = self.uploads.clone().try_acquire_owned() {
            return Ok(UploadPermit { _slot: slot });
        }
        let _waiting = Waiting::new(&self.uploads_waiting);
        let permit = tokio::time::timeout(self.wait, self.uploads.clone().acquire_owned()).await;
        match permit {
            Ok(Ok(slot)) => Ok(UploadPermit { _slot: slot }),
            _ => Err(ServiceError::Unavailable {
                reason: Unavailability::Uploads,
                message: format!(
                    "the server streams its maximum of {} uploads at once \
                     (max_uploads_in_flight): retry later",
                    self.max_uploads
                ),
                retry_after_s: 1,
            }),
        }
    }

    /// The memory budget of live sandboxes, in bytes.
    pub fn budget_bytes(&self) -> u64 {
        self.budget
    }

    /// Bytes promised to live sandboxes now.
    pub fn committed_bytes(&self) -> u64 {
        self.state.lock().expect("lock").committed
    }

    /// One-shot runs in flight now.
    pub fn runs(&self) -> usize {
        self.state.lock().expect("lock").runs
    }

    /// Refuses outright what could never fit, even on an idle host: retrying cannot help.
    fn check_fits(&self, bytes: u64) -> Result<(), ServiceError> {
        if bytes > self.budget {
            return Err(ServiceError::BadRequest(format!(
                "limits: memory_mb + 2 × disk_mb (the memory and the /workspace and /tmp tmpfs) \
                 is {}, more than this server's whole memory budget of {} for all its sandboxes",
                show_bytes(bytes),
                show_gib(self.budget)
            )));
        }
        Ok(())
    }

    fn memory_refusal(&self, committed: u64, bytes: u64) -> Refusal {
        Refusal::Memory(format!(
            "the host's memory budget is committed: {} of {} GiB promised to live sandboxes, \
             and this one needs {}: retry later, or ask for less memory or disk",
            show_gib_number(committed),
            show_gib_number(self.budget),
            show_bytes(bytes)
        ))
    }

    /// Promises `bytes` to a new session now, or refuses (503 with `Retry-After`) when the
    /// budget cannot hold them; [`Admission::release`] gives them back.
    pub fn commit(&self, bytes: u64) -> Result<(), ServiceError> {
        self.check_fits(bytes)?;
        let mut state = self.state.lock().expect("lock");
        if state.committed + bytes > self.budget {
            return Err(self.memory_refusal(state.committed, bytes).into_error());
        }
        state.committed += bytes;
        self.publish(&state);
        Ok(())
    }

    /// Gives back memory promised with [`Admission::commit`].
    pub fn release(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        {
            let mut state = self.state.lock().expect("lock");
            state.committed -= bytes;
            self.publish(&state);
        }
        self.freed.notify_waiters();
    }

    fn try_admit_run(&self, tenant: &str, bytes: u64) -> Result<(), Refusal> {
        let mut state = self.state.lock().expect("lock");
        let mine = state.runs_per_key.get(tenant).copied().unwrap_or(0);
        if mine >= self.max_runs_per_key {
            return Err(Refusal::Slots(format!(
                "this key has its maximum of {} one-shot runs in flight (max_runs_per_key): \
                 retry when one has finished",
                self.max_runs_per_key
            )));
        }
        if state.runs >= self.max_runs {
            return Err(Refusal::Slots(format!(
                "the server runs its maximum of {} one-shot runs (max_runs): retry later",
                self.max_runs
            )));
        }
        if state.committed + bytes > self.budget {
            return Err(self.memory_refusal(state.committed, bytes));
        }
        state.runs += 1;
        *state.runs_per_key.entry(tenant.to_string()).or_default() += 1;
        state.committed += bytes;
        self.publish(&state);
        Ok(())
    }

    /// A slot for one of `tenant`'s one-shot runs and `bytes` of memory, waited for at most
    /// `admission_wait_s`; then refused with 429 (no slot) or 503 (no memory), both with
    /// `Retry-After`.
    pub async fn admit_run(
        self: &Arc<Self>,
        tenant: &str,
        bytes: u64,
    ) -> Result<RunPermit, ServiceError> {
        self.check_fits(bytes)?;
        let deadline = Instant::now() + self.wait;
        let mut waiting = None;
        loop {
            // Registered before the check, so that a release between the two is not missed.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            match self.try_admit_run(tenant, bytes) {
                Ok(()) => {
                    return Ok(RunPermit {
                        admission: self.clone(),
                        tenant: tenant.to_string(),
                        bytes,
                    })
                }
                Err(refusal) => {
                    waiting.get_or_insert_with(|| Waiting::new(&self.runs_waiting));
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() || tokio::time::timeout(left, freed).await.is_err() {
                        return Err(refusal.into_error());
                    }
                }
            }
        }
    }
}

/// Counts a request in a queue's gauge for as long as it waits.
struct Waiting<'a>(&'a Gauge);

impl<'a> Waiting<'a> {
    fn new(gauge: &'a Gauge) -> Waiting<'a> {
        gauge.inc();
        Waiting(gauge)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

fn show_gib_number(bytes: u64) -> String {
    let gib = bytes as f64 / (1u64 << 30) as f64;
    if gib.fract() == 0.0 {
        format!("{gib:.0}")
    } else {
        format!("{gib:.1}")
    }
}

fn show_gib(bytes: u64) -> String {
    format!("{} GiB", show_gib_number(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(max_runs: usize, per_key: usize, wait_ms: u64, budget: u64) -> Arc<Admission> {
        let config = Config {
            max_runs,
            max_runs_per_key: Some(per_key),
            ..Config::default()
        };
        let mut a = Admission::new(&config, budget, &Metrics::default());
        a.wait = Duration::from_millis(wait_ms);
        Arc::new(a)
    }

    fn code(e: ServiceError) -> &'static str {
        crate::error::ApiError::from(e).code
    }

    #[tokio::test]
    async fn one_key_cannot_take_every_slot() {
        let a = admission(4, 2, 50, 100);
        let held = [
            a.admit_run("A", 1).await.unwrap(),
            a.admit_run("A", 1).await.unwrap(),
        ];
        let started = Instant::now();
        let refused = a.admit_run("A", 1).await.err().unwrap();
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert_eq!(code(refused), "too_many_sandboxes");
        let b = a.admit_run("B", 1).await.unwrap();
        assert_eq!(a.runs(), 3);
        drop(held);
        drop(b);
        assert_eq!((a.runs(), a.committed_bytes()), (0, 0));
        assert!(a.state.lock().unwrap().runs_per_key.is_empty());
    }

    #[tokio::test]
    async fn a_waiting_run_gets_the_slot_another_releases() {
        let a = admission(1, 1, 5_000, 100);
        let first = a.admit_run("A", 10).await.unwrap();
        let waiter = {
            let a = a.clone();
            tokio::spawn(async move { a.admit_run("B", 10).await.map(|_| ()) })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        assert_eq!(
            a.runs_waiting.get(),
            1,
            "the waiting run is in the queue's gauge"
        );
        let started = Instant::now();
        drop(first);
        waiter.await.unwrap().unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(a.runs_waiting.get(), 0);
    }

    #[tokio::test]
    async fn uploads_beyond_the_cap_wait_then_are_refused() {
        let config = Config {
            max_uploads_in_flight: 2,
            ..Config::default()
        };
        let mut a = Admission::new(&config, 1, &Metrics::default());
        a.wait = Duration::from_millis(50);
        let held = [
            a.admit_upload().await.unwrap(),
            a.admit_upload().await.unwrap(),
        ];
        let a = Arc::new(a);
        let waiter = {
            let a = a.clone();
            tokio::spawn(async move { a.admit_upload().await.err().unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            a.uploads_waiting.get(),
            1,
            "the waiting upload is in the queue's gauge"
        );
        let refused = waiter.await.unwrap();
        assert!(refused.to_string().contains("max_uploads_in_flight"));
        assert_eq!(code(refused), "uploads_busy");
        assert_eq!(a.uploads_waiting.get(), 0);
        drop(held);
        a.admit_upload().await.unwrap();
    }

    #[tokio::test]
    async fn memory_is_promised_and_given_back() {
        let gib = 1u64 << 30;
        let a = admission(8, 8, 20, 3 * gib);
        a.commit(gib).unwrap();
        a.commit(gib).unwrap();
        let e = a.commit(2 * gib).unwrap_err();
        assert!(
            e.to_string()
                .contains("memory budget is committed: 2 of 3 GiB promised"),
            "{e}"
        );
        assert_eq!(code(e), "memory_budget_committed");
        // A run waits for the memory too, then is refused with 503.
        let e = a.admit_run("A", 2 * gib).await.err().unwrap();
        assert_eq!(code(e), "memory_budget_committed");
        a.release(gib);
        let run = a.admit_run("A", 2 * gib).await.unwrap();
        assert_eq!(a.committed_bytes(), 3 * gib);
        drop(run);
        assert_eq!(a.committed_bytes(), gib);
        // More than the whole budget can never fit: a bad request, not "retry later".
        assert_eq!(code(a.commit(4 * gib).unwrap_err()), "bad_request");
        assert_eq!(
            code(a.admit_run("A", 4 * gib).await.err().unwrap()),
            "bad_request"
        );
    }
}
