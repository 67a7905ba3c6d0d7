//! Prometheus metrics (`GET /metrics`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExecutionLabels {
    /// `run`, `execute` or `command`.
    pub kind: String,
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EgressLabels {
    /// `allowed`, `denied` or `failed`.
    pub decision: String,
    /// Why it was denied or failed (docs/network.md); empty when allowed.
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabels {
    /// `up` (sandbox to server) or `down`.
    pub direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ZygoteLabels {
    pub image: String,
    /// `full` (sessions, and one-shot runs that import the data stack) or `lean` (the other
    /// one-shot runs).
    pub zygote: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ForkLabels {
    /// The zygote that forked the run: `full` or `lean`.
    pub zygote: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PrunedLabels {
    /// The log: `executions`, `egress` or `sessions` (crate::db::Log).
    pub table: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// The budget that was used up: `key` (`max_blocking_calls_per_key`) or `server`
    /// (`max_blocking_calls`).
    pub scope: String,
}

pub struct Metrics {
    registry: Registry,
    pub sessions_live: Gauge,
    pub pool_ready: Gauge,
    /// Host memory promised to live sandboxes (sessions and running one-shot runs).
    pub memory_committed_bytes: Gauge,
    /// What that promise may reach (`memory_overcommit` × MemTotal, or `memory_budget_bytes`).
    pub memory_budget_bytes: Gauge,
    pub runs_in_flight: Gauge,
    /// One-shot runs waiting for a slot or for memory budget (the run admission queue).
    pub runs_waiting: Gauge,
    /// Uploads waiting for one of the `max_uploads_in_flight` slots (the upload queue).
    pub uploads_waiting: Gauge,
    /// Room taken now in the budget of rich results held at once (`max_result_bytes_in_flight`).
    pub result_bytes_held: Gauge,
    /// One-shot runs served by a sandbox forked from one of the warm pool's zygotes.
    pub runs_forked: Family<ForkLabels, Counter>,
    pub executions: Family<ExecutionLabels, Counter>,
    pub execution_seconds: Histogram,
    pub session_create_seconds: Histogram,
    pub sandbox_failures: Counter,
    pub http_requests: Family<HttpLabels, Counter>,
    /// 1 while a zygote of the warm pool runs, 0 while it is being replaced.
    pub zygote_up: Family<ZygoteLabels, Gauge>,
    /// Dead zygotes replaced by a new one.
    pub zygote_restarts: Family<ZygoteLabels, Counter>,
    pub pauses: Counter,
    pub resumes: Counter,
    /// Every decision of a sandbox's egress proxy.
    pub egress_decisions: Family<EgressLabels, Counter>,
    /// Bytes moved through egress proxies, by direction.
    pub egress_bytes: Family<DirectionLabels, Counter>,
    /// Audit-log rows removed by retention (`audit_max_rows`, `audit_max_age_s`), by log.
    pub audit_rows_pruned: Family<PrunedLabels, Counter>,
    /// Blocking threads taken now (threads.rs).
    pub blocking_threads_in_use: Gauge,
    /// Calls refused a blocking thread, by the budget that was used up.
    pub blocking_refusals: Family<RefusalLabels, Counter>,
    /// Calls of keys admitted ([`crate::Service::admit`]): one per call a face makes.
    pub calls_admitted: Counter,
    /// Look-ups of a sandbox by its owner, the check that a call's sandbox is its key's.
    pub ownership_checks: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("corral");
        let m = Metrics {
            sessions_live: Gauge::default(),
            pool_ready: Gauge::default(),
            memory_committed_bytes: Gauge::default(),
            memory_budget_bytes: Gauge::default(),
            runs_in_flight: Gauge::default(),
            runs_waiting: Gauge::default(),
            uploads_waiting: Gauge::default(),
            result_bytes_held: Gauge::default(),
            runs_forked: Family::default(),
            executions: Family::default(),
            // 0.5 ms .. ~65 s
            execution_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 18)),
            session_create_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            sandbox_failures: Counter::default(),
            http_requests: Family::default(),
            zygote_up: Family::default(),
            zygote_restarts: Family::default(),
            pauses: Counter::default(),
            resumes: Counter::default(),
            egress_decisions: Family::default(),
            egress_bytes: Family::default(),
            audit_rows_pruned: Family::default(),
            blocking_threads_in_use: Gauge::default(),
            blocking_refusals: Family::default(),
            calls_admitted: Counter::default(),
            ownership_checks: Counter::default(),
            registry: Registry::default(),
        };
        registry.register("sessions_live", "Sessions alive", m.sessions_live.clone());
        registry.register(
            "pool_ready",
            "Sessions forked ahead and ready in the warm pool",
            m.pool_ready.clone(),
        );
        registry.register(
            "memory_committed_bytes",
            "Host memory promised to live sandboxes: memory limit plus /workspace and /tmp",
            m.memory_committed_bytes.clone(),
        );
        registry.register(
            "memory_budget_bytes",
            "The most host memory live sandboxes may be promised",
            m.memory_budget_bytes.clone(),
        );
        registry.register(
            "runs_in_flight",
            "One-shot runs running now",
            m.runs_in_flight.clone(),
        );
        registry.register(
            "runs_waiting",
            "One-shot runs waiting for a slot or for memory budget (at most admission_wait_s)",
            m.runs_waiting.clone(),
        );
        registry.register(
            "uploads_waiting",
            "Uploads waiting for a slot of max_uploads_in_flight (at most admission_wait_s)",
            m.uploads_waiting.clone(),
        );
        registry.register(
            "result_bytes_held",
            "Room taken now in the budget of rich results the server holds at once \
             (max_result_bytes_in_flight); each result counts twice its size",
            m.result_bytes_held.clone(),
        );
        registry.register(
            "runs_forked",
            "One-shot runs served by a sandbox forked from a zygote of the warm pool, by zygote",
            m.runs_forked.clone(),
        );
        registry.register(
            "executions",
            "Executions by kind and final status",
            m.executions.clone(),
        );
        registry.register(
            "execution_seconds",
            "Wall time of executions, one-shot runs and commands",
            m.execution_seconds.clone(),
        );
        registry.register(
            "session_create_seconds",
            "Time to create a session",
            m.session_create_seconds.clone(),
        );
        registry.register(
            "sandbox_failures",
            "Sandboxes Corral could not build or run",
            m.sandbox_failures.clone(),
        );
        registry.register(
            "http_requests",
            "HTTP requests by response status",
            m.http_requests.clone(),
        );
        registry.register(
            "zygote_up",
            "Whether a zygote of the warm pool runs (0 while it is being replaced)",
            m.zygote_up.clone(),
        );
        registry.register(
            "zygote_restarts",
            "Dead zygotes replaced by a new one",
            m.zygote_restarts.clone(),
        );
        registry.register("pauses", "Sandboxes paused", m.pauses.clone());
        registry.register("resumes", "Paused sandboxes resumed", m.resumes.clone());
        registry.register(
            "egress_decisions",
            "Decisions of sandboxes' egress proxies, by decision and reason",
            m.egress_decisions.clone(),
        );
        registry.register(
            "egress_bytes",
            "Bytes moved through sandboxes' egress proxies, by direction",
            m.egress_bytes.clone(),
        );
        registry.register(
            "audit_rows_pruned",
            "Audit-log rows removed by retention (audit_max_rows, audit_max_age_s), by log",
            m.audit_rows_pruned.clone(),
        );
        // Every log's series from the start, at 0.
        for log in crate::db::Log::ALL {
            let _ = m.audit_rows_pruned.get_or_create(&PrunedLabels {
                table: log.name().into(),
            });
        }
        registry.register(
            "blocking_threads_in_use",
            "Blocking threads taken now by engine calls and other blocking work of requests",
            m.blocking_threads_in_use.clone(),
        );
        registry.register(
            "blocking_refusals",
            "Calls refused a blocking thread at once, by the budget used up: key \
             (max_blocking_calls_per_key) or server (max_blocking_calls)",
            m.blocking_refusals.clone(),
        );
        registry.register(
            "calls_admitted",
            "Calls of keys admitted to the engine, each holding a blocking thread",
            m.calls_admitted.clone(),
        );
        registry.register(
            "ownership_checks",
            "Look-ups of a sandbox for a call of its owner",
            m.ownership_checks.clone(),
        );
        // Both series from the start, at 0.
        for scope in ["key", "server"] {
            let _ = m.blocking_refusals.get_or_create(&RefusalLabels {
                scope: scope.into(),
            });
        }
        for kind in corral_kernel::ZygoteKind::ALL {
            let _ = m.runs_forked.get_or_create(&ForkLabels {
                zygote: kind.name().into(),
            });
        }
        Metrics { registry, ..m }
    }
}

impl Metrics {
    pub fn record_execution(&self, kind: &str, status: &str, wall_ms: u64) {
        self.executions
            .get_or_create(&ExecutionLabels {
                kind: kind.into(),
                status: status.into(),
            })
            .inc();
        self.execution_seconds.observe(wall_ms as f64 / 1000.0);
    }

    /// A one-shot run forked from the `zygote` zygote.
    pub fn record_forked_run(&self, zygote: corral_kernel::ZygoteKind) {
        self.runs_forked
            .get_or_create(&ForkLabels {
                zygote: zygote.name().into(),
            })
            .inc();
    }

    /// Copies the pool's view of one of its zygotes (read at scrape time) into the metrics.
    pub fn record_zygote(
        &self,
        image: &str,
        kind: corral_kernel::ZygoteKind,
        zygote: &corral_kernel::ZygoteStatus,
    ) {
        let labels = ZygoteLabels {
            image: image.into(),
            zygote: kind.name().into(),
        };
        self.zygote_up
            .get_or_create(&labels)
            .set(i64::from(zygote.alive));
        // The pool counts; the counter follows it, never backwards.
        self.zygote_restarts
            .get_or_create(&labels)
            .inner()
            .fetch_max(zygote.restarts, std::sync::atomic::Ordering::Relaxed);
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_kernel::ZygoteKind;

    #[test]
    fn exposition_names_every_family() {
        let m = Metrics::default();
        m.record_execution("execute", "success", 3);
        m.sessions_live.set(2);
        m.memory_committed_bytes.set(1 << 30);
        let down = corral_kernel::ZygoteStatus {
            alive: false,
            restarts: 3,
            last_error: None,
        };
        m.record_zygote("default", ZygoteKind::Full, &down);
        m.egress_decisions
            .get_or_create(&EgressLabels {
                decision: "denied".into(),
                reason: "not_allowed".into(),
            })
            .inc();
        m.egress_bytes
            .get_or_create(&DirectionLabels {
                direction: "down".into(),
            })
            .inc_by(5);
        m.record_zygote(
            "default",
            ZygoteKind::Full,
            &corral_kernel::ZygoteStatus {
                restarts: 2,
                ..down.clone()
            },
        );
        m.record_zygote(
            "default",
            ZygoteKind::Lean,
            &corral_kernel::ZygoteStatus {
                alive: true,
                ..down
            },
        );
        m.record_forked_run(ZygoteKind::Lean);
        m.record_forked_run(ZygoteKind::Lean);
        let text = m.encode();
        for name in [
            "corral_sessions_live 2",
            "corral_pool_ready",
            "corral_memory_committed_bytes 1073741824",
            "corral_memory_budget_bytes",
            "corral_runs_in_flight",
            "corral_runs_waiting 0",
            "corral_uploads_waiting 0",
            "corral_executions_total{kind=\"execute\",status=\"success\"} 1",
            "corral_execution_seconds_bucket",
            "corral_session_create_seconds_count",
            "corral_sandbox_failures_total",
            "corral_zygote_up{image=\"default\",zygote=\"full\"} 0",
            "corral_zygote_restarts_total{image=\"default\",zygote=\"full\"} 3",
            "corral_zygote_up{image=\"default\",zygote=\"lean\"} 1",
            "corral_zygote_restarts_total{image=\"default\",zygote=\"lean\"} 3",
            "corral_runs_forked_total{zygote=\"lean\"} 2",
            "corral_runs_forked_total{zygote=\"full\"} 0",
            "corral_egress_decisions_total{decision=\"denied\",reason=\"not_allowed\"} 1",
            "corral_egress_bytes_total{direction=\"down\"} 5",
            "corral_audit_rows_pruned_total{table=\"executions\"} 0",
            "corral_audit_rows_pruned_total{table=\"sessions\"} 0",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
    }
}
