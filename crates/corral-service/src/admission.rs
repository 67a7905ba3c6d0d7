//! Admission control: the host memory promised to live sandboxes, the one-shot run slots and
//! the upload slots, both shared fairly between keys.
//!
//! Every live sandbox (a session, or a one-shot run while it runs) holds a promise of host
//! memory: [`corral_sandbox::Limits::host_memory_bytes`]. Their sum stays within the budget
//! (`memory_overcommit` × `MemTotal`, or `memory_budget_bytes`): a sandbox beyond it is refused
//! with 503 and `Retry-After` rather than left to the OOM killer. One-shot runs also take one of
//! `max_runs` slots, and an upload streams its body only with one of `max_uploads_in_flight`
//! slots (which bounds the server's buffers for all of them). Both kinds of slot are
//! [`corral_share`] pools: at most `max_runs_per_key` (`max_uploads_in_flight_per_key`) of them
//! for one key, and a floor of [`FLOOR_PER_KEY`] every key keeps whatever the others hold, out
//! of a reserve of an eighth above the total. A request that gets its slot (and a run its
//! memory) within `admission_wait_s` goes on; else it is refused: a run with 429 (no slot) or
//! 503 (no memory), an upload with 429 `key_busy` (its key's share) or 503 `uploads_busy`, its
//! body never read. Nothing waits unboundedly.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use corral_sandbox::limits::show_bytes;
use corral_share::{Grant, Limits, Pool};

use prometheus_client::metrics::gauge::Gauge;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::service::{ServiceError, Unavailability};

/// What a refused request is told to wait before it retries.
const RETRY_AFTER_S: u64 = 5;

/// Run and upload slots every key may hold whatever other keys hold.
pub const FLOOR_PER_KEY: u64 = 1;

pub struct Admission {
    runs: Arc<Pool>,
    uploads: Arc<Pool>,
    wait: Duration,
    budget: u64,
    /// Bytes promised to live sandboxes, in all and per key, shared by [`Self::memory`]'s rule.
    committed: Mutex<Committed>,
    memory: Limits,
    /// Woken whenever a slot or memory is released.
    freed: tokio::sync::Notify,
    /// `/metrics` views of the state, kept up to date with it.
    committed_gauge: Gauge,
    runs_gauge: Gauge,
    /// The queues: runs and uploads waiting now.
    runs_waiting: Gauge,
    uploads_waiting: Gauge,
}

/// The memory promised to live sandboxes: in all, and per key (a key promised nothing is not
/// in the map).
#[derive(Default)]
struct Committed {
    all: u64,
    by_key: HashMap<String, u64>,
}

/// How the memory budget is shared: a key may be promised `memory_budget_per_key` (three
/// quarters of the budget unless set), and every key one default sandbox's worth whatever the
/// others hold, out of a reserve of a sixteenth of the budget (at least that much).
fn memory_limits(config: &Config, budget: u64) -> Limits {
    let reserve_floor = corral_sandbox::Limits::default().host_memory_bytes();
    let reserve = (budget / 16).max(reserve_floor);
    let per_key = config
        .memory_budget_per_key
        .unwrap_or(budget / 4 * 3)
        .min(budget + reserve);
    Limits::new(budget, per_key, reserve_floor.min(per_key), reserve)
}

/// Limits of a slot pool of `total` with `per_key` for one key: the floor out of a reserve of
/// an eighth above the total (at least one slot).
fn slot_limits(total: usize, per_key: usize) -> Limits {
    let total = total as u64;
    let reserve = (total / 8).max(FLOOR_PER_KEY);
    Limits::new(
        total,
        (per_key as u64).clamp(FLOOR_PER_KEY, total + reserve),
        FLOOR_PER_KEY,
        reserve,
    )
}

/// An upload's slot; released when dropped.
pub struct UploadPermit {
    admission: Arc<Admission>,
    slot: Option<Grant>,
}

impl Drop for UploadPermit {
    fn drop(&mut self) {
        // Given back before the waiters are woken, so that they find it.
        drop(self.slot.take());
        self.admission.freed.notify_waiters();
    }
}

/// Why a request cannot be admitted now.
enum Refusal {
    Slots(String),
    KeyUploads(String),
    Uploads(String),
    Memory(String),
}

impl Refusal {
    fn into_error(self) -> ServiceError {
        match self {
            Refusal::Slots(message) => ServiceError::TooManySandboxes {
                message,
                retry_after_s: RETRY_AFTER_S,
            },
            Refusal::KeyUploads(message) => ServiceError::KeyBusy {
                message,
                retry_after_s: 1,
            },
            Refusal::Uploads(message) => ServiceError::Unavailable {
                reason: Unavailability::Uploads,
                message,
                retry_after_s: 1,
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
    slot: Option<Grant>,
    bytes: u64,
}

impl Drop for RunPermit {
    fn drop(&mut self) {
        drop(self.slot.take());
        self.admission.runs_gauge.dec();
        self.admission.release(&self.tenant, self.bytes);
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
            runs: Pool::new(
                "one-shot run slots",
                "runs",
                slot_limits(config.max_runs, config.runs_per_key()),
            ),
            uploads: Pool::new(
                "upload slots",
                "uploads",
                slot_limits(config.max_uploads_in_flight, config.uploads_per_key()),
            ),
            wait: Duration::from_secs(config.admission_wait_s),
            budget,
            committed: Mutex::new(Committed::default()),
            memory: memory_limits(config, budget),
            freed: tokio::sync::Notify::new(),
            committed_gauge: metrics.memory_committed_bytes.clone(),
            runs_gauge: metrics.runs_in_flight.clone(),
            runs_waiting: metrics.runs_waiting.clone(),
            uploads_waiting: metrics.uploads_waiting.clone(),
        }
    }

    fn committed(&self) -> MutexGuard<'_, Committed> {
        // A sum that every change updates whole: a poisoned lock still holds it.
        self.committed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Tries `admit` until it succeeds or `admission_wait_s` has passed, counted in `gauge`
    /// while it waits; a release between two tries wakes it.
    async fn wait_for<T>(
        &self,
        gauge: &Gauge,
        mut admit: impl FnMut() -> Result<T, Refusal>,
    ) -> Result<T, ServiceError> {
        let deadline = Instant::now() + self.wait;
        let mut waiting = None;
        loop {
            // Registered before the try, so that a release between the two is not missed.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            match admit() {
                Ok(admitted) => return Ok(admitted),
                Err(refusal) => {
                    waiting.get_or_insert_with(|| Waiting::new(gauge));
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() || tokio::time::timeout(left, freed).await.is_err() {
                        return Err(refusal.into_error());
                    }
                }
            }
        }
    }

    /// A slot for one of `tenant`'s uploads, waited for at most `admission_wait_s`; then
    /// refused with 429 (the key's share) or 503 (the server's), with `Retry-After`.
    pub async fn admit_upload(
        self: &Arc<Self>,
        tenant: &str,
    ) -> Result<UploadPermit, ServiceError> {
        let slot = self
            .wait_for(&self.uploads_waiting, || {
                self.uploads.take(tenant, 1).map_err(|refusal| {
                    let limits = self.uploads.limits();
                    if refusal.is_key() {
                        Refusal::KeyUploads(format!(
                            "this key streams its maximum of {} uploads at once \
                             (max_uploads_in_flight_per_key): retry when one is done",
                            limits.per_key
                        ))
                    } else {
                        Refusal::Uploads(format!(
                            "the server streams its maximum of {} uploads at once \
                             (max_uploads_in_flight): retry later",
                            limits.total
                        ))
                    }
                })
            })
            .await?;
        Ok(UploadPermit {
            admission: self.clone(),
            slot: Some(slot),
        })
    }

    /// The memory budget of live sandboxes, in bytes.
    pub fn budget_bytes(&self) -> u64 {
        self.budget
    }

    /// Bytes promised to live sandboxes now.
    pub fn committed_bytes(&self) -> u64 {
        self.committed().all
    }

    /// One-shot runs in flight now.
    pub fn runs(&self) -> u64 {
        self.runs.held()
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

    /// Promises `bytes` to `tenant` now, or says why the budget cannot hold them.
    fn try_commit(&self, tenant: &str, bytes: u64) -> Result<(), Refusal> {
        let mut committed = self.committed();
        let mine = committed.by_key.get(tenant).copied().unwrap_or(0);
        match self.memory.admits(committed.all, mine, bytes) {
            Ok(()) => {}
            Err(corral_share::Bound::Key) => {
                return Err(Refusal::Memory(format!(
                    "this key's share of the host's memory budget is committed: {} of {} GiB \
                     promised to its live sandboxes (memory_budget_per_key), and this one needs \
                     {}: retry later, or ask for less memory or disk",
                    show_gib_number(mine),
                    show_gib_number(self.memory.per_key),
                    show_bytes(bytes)
                )))
            }
            Err(corral_share::Bound::Pool) => {
                return Err(Refusal::Memory(format!(
                    "the host's memory budget is committed: {} of {} GiB promised to live \
                     sandboxes, and this one needs {}: retry later, or ask for less memory or disk",
                    show_gib_number(committed.all),
                    show_gib_number(self.budget),
                    show_bytes(bytes)
                )))
            }
        }
        if bytes == 0 {
            return Ok(());
        }
        committed.all += bytes;
        *committed.by_key.entry(tenant.to_string()).or_default() += bytes;
        self.committed_gauge
            .set(i64::try_from(committed.all).unwrap_or(i64::MAX));
        Ok(())
    }

    /// Promises `bytes` to a new session of `tenant` now, or refuses (503 with `Retry-After`)
    /// when the budget, or the key's share of it, cannot hold them; [`Admission::release`]
    /// gives them back.
    pub fn commit(&self, tenant: &str, bytes: u64) -> Result<(), ServiceError> {
        self.check_fits(bytes)?;
        self.try_commit(tenant, bytes).map_err(Refusal::into_error)
    }

    /// Gives back memory promised to `tenant` with [`Admission::commit`].
    pub fn release(&self, tenant: &str, bytes: u64) {
        if bytes == 0 {
            return;
        }
        {
            let mut committed = self.committed();
            committed.all -= bytes;
            if let Some(mine) = committed.by_key.get_mut(tenant) {
                *mine -= bytes;
                if *mine == 0 {
                    committed.by_key.remove(tenant);
                }
            }
            self.committed_gauge
                .set(i64::try_from(committed.all).unwrap_or(i64::MAX));
        }
        self.freed.notify_waiters();
    }

    /// A slot and `bytes` of memory for a run of `tenant` now, or why not.
    fn try_admit_run(&self, tenant: &str, bytes: u64) -> Result<Grant, Refusal> {
        let slot = self.runs.take(tenant, 1).map_err(|refusal| {
            let limits = self.runs.limits();
            Refusal::Slots(if refusal.is_key() {
                format!(
                    "this key has its maximum of {} one-shot runs in flight (max_runs_per_key): \
                     retry when one has finished",
                    limits.per_key
                )
            } else {
                format!(
                    "the server runs its maximum of {} one-shot runs (max_runs): retry later",
                    limits.total
                )
            })
        })?;
        // Without the memory the slot is given back (dropped) at once.
        self.try_commit(tenant, bytes)?;
        Ok(slot)
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
        let slot = self
            .wait_for(&self.runs_waiting, || self.try_admit_run(tenant, bytes))
            .await?;
        self.runs_gauge.inc();
        Ok(RunPermit {
            admission: self.clone(),
            tenant: tenant.to_string(),
            slot: Some(slot),
            bytes,
        })
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
        assert_eq!(a.runs.keys(), 0);
    }

    #[tokio::test]
    async fn a_waiting_run_gets_the_slot_another_releases() {
        let a = admission(1, 1, 5_000, 100);
        let first = a.admit_run("A", 10).await.unwrap();
        let _floor = a.admit_run("B", 10).await.unwrap();
        let waiter = {
            let a = a.clone();
            tokio::spawn(async move { a.admit_run("C", 10).await.map(|_| ()) })
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
    async fn keys_filling_the_run_slots_leave_another_key_its_floor() {
        let a = admission(4, 2, 50, 100);
        let _held = [
            a.admit_run("A", 1).await.unwrap(),
            a.admit_run("A", 1).await.unwrap(),
            a.admit_run("B", 1).await.unwrap(),
            a.admit_run("B", 1).await.unwrap(),
        ];
        // All four slots are held: C still gets its floor, out of the reserve (one slot).
        let c = a.admit_run("C", 1).await.unwrap();
        assert_eq!(a.runs(), 5);
        let refused = a.admit_run("D", 1).await.err().unwrap();
        assert_eq!(code(refused), "too_many_sandboxes");
        drop(c);
        a.admit_run("D", 1).await.unwrap();
    }

    #[tokio::test]
    async fn uploads_are_shared_between_keys_with_a_floor() {
        let config = Config {
            max_uploads_in_flight: 2,
            ..Config::default()
        };
        assert_eq!(config.uploads_per_key(), 1, "half of the slots");
        let mut a = Admission::new(&config, 1, &Metrics::default());
        a.wait = Duration::from_millis(50);
        let a = Arc::new(a);
        let held = [
            a.admit_upload("A").await.unwrap(),
            a.admit_upload("B").await.unwrap(),
        ];
        let refused = a.admit_upload("A").await.err().unwrap();
        assert!(
            refused
                .to_string()
                .contains("max_uploads_in_flight_per_key"),
            "{refused}"
        );
        assert_eq!(code(refused), "key_busy");
        // The slots are full; C gets its floor, D waits and is refused.
        let c = a.admit_upload("C").await.unwrap();
        let waiter = {
            let a = a.clone();
            tokio::spawn(async move { a.admit_upload("D").await.err().unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            a.uploads_waiting.get(),
            1,
            "the waiting upload is in the queue's gauge"
        );
        let refused = waiter.await.unwrap();
        assert!(refused.to_string().contains("(max_uploads_in_flight)"));
        assert_eq!(code(refused), "uploads_busy");
        assert_eq!(a.uploads_waiting.get(), 0);
        drop((held, c));
        a.admit_upload("D").await.unwrap();
    }

    #[tokio::test]
    async fn a_waiting_upload_gets_the_slot_another_releases() {
        let config = Config {
            max_uploads_in_flight: 1,
            ..Config::default()
        };
        let mut a = Admission::new(&config, 1, &Metrics::default());
        a.wait = Duration::from_secs(5);
        let a = Arc::new(a);
        let first = a.admit_upload("A").await.unwrap();
        let second = a.admit_upload("B").await.unwrap(); // B's floor
        let waiter = {
            let a = a.clone();
            tokio::spawn(async move { a.admit_upload("C").await.map(|_| ()) })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        drop(first);
        waiter.await.unwrap().unwrap();
        drop(second);
    }

    /// Issue 31's red team: one key with ten sandboxes took the whole budget, and every other
    /// key's creation and run was 503. A key now holds its share, and a third key still gets
    /// one default sandbox when two keys together have promised the whole budget.
    #[tokio::test]
    async fn one_key_cannot_take_the_memory_budget_and_others_keep_their_floor() {
        let gib = 1u64 << 30;
        let config = Config {
            memory_budget_per_key: Some(6 * gib),
            ..Config::default()
        };
        let a = Admission::new(&config, 10 * gib, &Metrics::default());
        a.commit("A", 6 * gib).unwrap();
        let e = a.commit("A", gib).unwrap_err();
        assert!(e.to_string().contains("memory_budget_per_key"), "{e}");
        assert_eq!(code(e), "memory_budget_committed");
        a.commit("B", 4 * gib).unwrap();
        // The budget is promised whole: C gets its floor of one default sandbox, no more.
        a.commit("C", gib).unwrap();
        assert_eq!(
            code(a.commit("C", gib).unwrap_err()),
            "memory_budget_committed"
        );
        a.release("A", 6 * gib);
        a.commit("C", gib).unwrap();
        assert_eq!(a.committed_bytes(), 6 * gib);
    }

    #[tokio::test]
    async fn memory_is_promised_and_given_back() {
        let gib = 1u64 << 30;
        let a = admission(8, 8, 20, 3 * gib);
        a.commit("A", gib).unwrap();
        a.commit("B", gib).unwrap();
        let e = a.commit("C", 2 * gib).unwrap_err();
        assert!(
            e.to_string()
                .contains("memory budget is committed: 2 of 3 GiB promised"),
            "{e}"
        );
        assert_eq!(code(e), "memory_budget_committed");
        // A run waits for the memory too, then is refused with 503.
        let e = a.admit_run("C", 2 * gib).await.err().unwrap();
        assert_eq!(code(e), "memory_budget_committed");
        a.release("A", gib);
        let run = a.admit_run("C", 2 * gib).await.unwrap();
        assert_eq!(a.committed_bytes(), 3 * gib);
        drop(run);
        assert_eq!(a.committed_bytes(), gib);
        // More than the whole budget can never fit: a bad request, not "retry later".
        assert_eq!(code(a.commit("A", 4 * gib).unwrap_err()), "bad_request");
        assert_eq!(
            code(a.admit_run("A", 4 * gib).await.err().unwrap()),
            "bad_request"
        );
    }
}
