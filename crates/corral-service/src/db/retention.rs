//! How long the audit log is kept (docs/api.md, "Settings": `audit_max_rows`,
//! `audit_max_age_s`): the executions, the egress decisions and the ended sessions are each
//! held to a number of rows and an age, oldest removed first. A pass runs once every
//! [`Retention::every`] rows added to a log (so that adding stays cheap) and, until nothing is
//! left to remove, when the server opens the database.

use std::time::Duration;

use rusqlite::{params, Connection};

/// The most rows one pass removes from one log.
pub const BATCH: u64 = 10_000;

/// How much of each log is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Rows of one log kept: the newest.
    pub max_rows: u64,
    /// Rows older than this are removed.
    pub max_age: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            max_rows: 1_000_000,
            max_age: Duration::from_secs(30 * 24 * 3600),
        }
    }
}

impl Retention {
    /// A log is pruned once every this many rows added to it: a tenth of `max_rows`, 1 to
    /// 1000.
    pub fn every(&self) -> u64 {
        (self.max_rows / 10).clamp(1, 1000)
    }

    /// The most rows a log holds at any time (the ended sessions: besides the live and saved
    /// ones, which `max_sessions` bounds): `max_rows` plus the rows added between two passes.
    pub fn bound(&self) -> u64 {
        self.max_rows + self.every() - 1
    }
}

/// A log whose rows are pruned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Log {
    /// A row per execution, command, process and one-shot run.
    Executions,
    /// A row per decision of an egress proxy.
    Egress,
    /// A row per session; only ended ones (and not the ones saved across a restart) are
    /// removed.
    Sessions,
}

impl Log {
    pub const ALL: [Log; 3] = [Log::Executions, Log::Egress, Log::Sessions];

    /// Its table, and the label of `corral_audit_rows_pruned_total`.
    pub fn name(self) -> &'static str {
        match self {
            Log::Executions => "executions",
            Log::Egress => "egress",
            Log::Sessions => "sessions",
        }
    }

    pub(super) fn index(self) -> usize {
        self as usize
    }
}

/// Removes at most `batch` rows of `log` that `retention` does not keep, as of `now` (seconds
/// since the Unix epoch), oldest first; returns how many.
pub(super) fn prune(
    conn: &Connection,
    log: Log,
    retention: &Retention,
    now: i64,
    batch: u64,
) -> Result<u64, rusqlite::Error> {
    let max_rows = i64::try_from(retention.max_rows).unwrap_or(i64::MAX);
    let cutoff = now.saturating_sub(i64::try_from(retention.max_age.as_secs()).unwrap_or(i64::MAX));
    let batch = i64::try_from(batch).unwrap_or(i64::MAX);
    // Ids only grow (AUTOINCREMENT; a session's rowid is one more than the largest), so the
    // rows above `newest - max_rows` are at most `max_rows`, and the newest.
    let (newest, by_count, by_age) = match log {
        Log::Executions | Log::Egress => (
            format!("SELECT MAX(id) FROM {}", log.name()),
            format!(
                "DELETE FROM {t} WHERE id IN \
                 (SELECT id FROM {t} WHERE id <= ?1 ORDER BY id LIMIT ?2)",
                t = log.name()
            ),
            format!(
                "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE at < ?1 LIMIT ?2)",
                t = log.name()
            ),
        ),
        Log::Sessions => (
            "SELECT MAX(rowid) FROM sessions".to_string(),
            "DELETE FROM sessions WHERE rowid IN (SELECT rowid FROM sessions WHERE rowid <= ?1 \
             AND ended_at IS NOT NULL AND id NOT IN (SELECT id FROM saved_sandboxes) \
             ORDER BY rowid LIMIT ?2)"
                .to_string(),
            "DELETE FROM sessions WHERE rowid IN (SELECT rowid FROM sessions WHERE ended_at < ?1 \
             AND id NOT IN (SELECT id FROM saved_sandboxes) LIMIT ?2)"
                .to_string(),
        ),
    };
    let Some(newest) = conn.query_row(&newest, [], |r| r.get::<_, Option<i64>>(0))? else {
        return Ok(0);
    };
    let counted = conn.execute(&by_count, params![newest.saturating_sub(max_rows), batch])?;
    let counted = i64::try_from(counted).unwrap_or(i64::MAX);
    let room = batch - counted;
    let aged = if room > 0 {
        conn.execute(&by_age, params![cutoff, room])?
    } else {
        0
    };
    Ok(counted as u64 + aged as u64)
}

#[cfg(test)]
mod tests {
    use super::super::{AuditEntry, AuditQuery, Db, EgressEntry};
    use super::*;

    fn db(dir: &tempfile::TempDir, retention: Retention) -> (Db, Family) {
        let pruned = Family::default();
        let db = Db::open(&dir.path().join("c.db"))
            .unwrap()
            .with_retention(retention, pruned.clone())
            .unwrap();
        (db, pruned)
    }

    type Family = prometheus_client::metrics::family::Family<
        crate::metrics::PrunedLabels,
        prometheus_client::metrics::counter::Counter,
    >;

    fn pruned(family: &Family, log: Log) -> u64 {
        family
            .get_or_create(&crate::metrics::PrunedLabels {
                table: log.name().into(),
            })
            .get()
    }

    fn line(db: &Db, n: usize) {
        let code = format!("print({n})");
        db.audit(&AuditEntry {
            key_id: "k",
            session_id: None,
            kind: "run",
            code: &code,
            status: "ok",
            execution_time_ms: 1,
            cpu_time_ms: 1,
            peak_memory_bytes: 1,
        })
        .unwrap();
        db.egress(&EgressEntry {
            key_id: "k",
            session_id: None,
            host: "example.org",
            port: 443,
            decision: "denied",
            reason: "not_allowed",
            address: None,
        })
        .unwrap();
    }

    #[test]
    fn the_logs_never_pass_their_bound_and_keep_the_newest_rows() {
        let dir = tempfile::tempdir().unwrap();
        let retention = Retention {
            max_rows: 20,
            max_age: Duration::from_secs(3600),
        };
        assert_eq!((retention.every(), retention.bound()), (2, 21));
        let (db, family) = db(&dir, retention);
        for n in 1..=200 {
            line(&db, n);
            for log in [Log::Executions, Log::Egress] {
                assert!(
                    db.rows(log).unwrap() <= retention.bound(),
                    "{log:?} after {n}"
                );
            }
        }
        assert_eq!(db.rows(Log::Executions).unwrap(), 20);
        assert_eq!(pruned(&family, Log::Executions), 180);
        assert_eq!(pruned(&family, Log::Egress), 180);
        // The audit log still pages, newest first, over exactly the rows kept.
        let mut ids = Vec::new();
        let mut before = None;
        loop {
            let page = db
                .query_audit(&AuditQuery {
                    before,
                    limit: 7,
                    ..Default::default()
                })
                .unwrap();
            ids.extend(page.iter().map(|r| r.id));
            if page.len() < 7 {
                break;
            }
            before = page.last().map(|r| r.id);
        }
        assert_eq!(ids, (181..=200).rev().collect::<Vec<i64>>());
    }

    #[test]
    fn rows_older_than_the_age_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let retention = Retention {
            max_rows: 1000,
            max_age: Duration::from_secs(3600),
        };
        let (db, family) = db(&dir, retention);
        for n in 0..50 {
            line(&db, n);
        }
        // The first 30 are two hours old; the next pass (every 100 rows) removes them.
        db.conn()
            .execute_batch(
                "UPDATE executions SET at = at - 7200 WHERE id <= 30; \
                 UPDATE egress SET at = at - 7200 WHERE id <= 30;",
            )
            .unwrap();
        for n in 50..100 {
            line(&db, n);
        }
        assert_eq!(db.rows(Log::Executions).unwrap(), 70);
        assert_eq!(db.rows(Log::Egress).unwrap(), 70);
        assert_eq!(pruned(&family, Log::Executions), 30);
        let oldest = db
            .query_audit(&AuditQuery {
                limit: 1000,
                ..Default::default()
            })
            .unwrap()
            .last()
            .map(|r| r.id);
        assert_eq!(oldest, Some(31));
    }

    #[test]
    fn ended_sessions_are_pruned_but_live_and_saved_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let retention = Retention {
            max_rows: 10,
            max_age: Duration::from_secs(3600),
        };
        let (db, _) = db(&dir, retention);
        db.session_started("live", "k", "default", "python")
            .unwrap();
        db.session_started("saved", "k", "default", "python")
            .unwrap();
        db.session_ended("saved", "saved").unwrap();
        db.save_sandbox("saved", "k", 0, "{}").unwrap();
        for n in 0..100 {
            let id = format!("s{n}");
            db.session_started(&id, "k", "default", "python").unwrap();
            db.session_ended(&id, "deleted").unwrap();
            assert!(db.rows(Log::Sessions).unwrap() <= retention.bound() + 2);
        }
        let ids: Vec<String> = {
            let conn = db.conn();
            let mut stmt = conn
                .prepare("SELECT id FROM sessions ORDER BY rowid")
                .unwrap();
            let rows = stmt.query_map([], |r| r.get(0)).unwrap();
            rows.collect::<Result<_, _>>().unwrap()
        };
        assert_eq!(ids[..2], ["live", "saved"]);
        assert_eq!(ids.last().map(String::as_str), Some("s99"));
        assert!(ids.len() <= 2 + retention.bound() as usize, "{ids:?}");
        // An ended session past the age goes, a live one of any age stays.
        db.conn()
            .execute_batch("UPDATE sessions SET created_at = 0, ended_at = CASE WHEN ended_at IS NULL THEN NULL ELSE 0 END")
            .unwrap();
        db.session_started("new", "k", "default", "python").unwrap();
        assert_eq!(db.session_end_reason("s99").unwrap(), None);
        let left = db.rows(Log::Sessions).unwrap();
        assert_eq!(left, 3, "live, saved and new are left");
    }

    #[test]
    fn opening_prunes_a_log_grown_past_its_retention_in_batches() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = Db::open(&dir.path().join("c.db")).unwrap();
            db.conn()
                .execute_batch(
                    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 25000) \
                     INSERT INTO executions (key_id, kind, at, code_sha256, status, \
                     execution_time_ms, cpu_time_ms, peak_memory_bytes) \
                     SELECT 'k', 'run', strftime('%s', 'now'), '', 'ok', 0, 0, 0 FROM n;",
                )
                .unwrap();
            assert_eq!(db.rows(Log::Executions).unwrap(), 25_000);
        }
        let (db, family) = db(
            &dir,
            Retention {
                max_rows: 10,
                ..Default::default()
            },
        );
        assert_eq!(db.rows(Log::Executions).unwrap(), 10);
        assert_eq!(pruned(&family, Log::Executions), 24_990);
        let newest = db
            .query_audit(&AuditQuery {
                limit: 1,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(newest[0].id, 25_000);
    }
}
