//! The server's SQLite database: API keys (stored hashed), the sessions that exist, and the
//! audit log of executions, kept as [`Retention`] says.

mod retention;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use rand::RngCore as _;
use rusqlite::{params, Connection, OptionalExtension};
use sha2::{Digest, Sha256};

pub use retention::{Log, Retention};

use crate::metrics::PrunedLabels;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

#[derive(Debug, thiserror::Error)]
#[error("database: {0}")]
pub struct DbError(#[from] rusqlite::Error);

/// What [`Db::add_key`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyAdded {
    New,
    /// The key was there already, with that name and secret.
    Unchanged,
    /// A key of that id (with another name or secret), or another key with that secret, is
    /// there: nothing was changed.
    Differs,
    /// The key was there and is revoked; it stays revoked.
    Revoked,
}

/// A key as `corral key ls` shows it (never the secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInfo {
    pub id: String,
    pub name: String,
    pub created_at: i64,
    pub revoked: bool,
    /// An operator key also sees every key's sandboxes and audit log and manages keys
    /// (docs/api.md, "Operators"). Made only on the host: `corral key create --operator`, or
    /// `corral key add --operator` for the same key on every node of a cluster.
    pub operator: bool,
}

/// The most audit-log lines one page holds, and the default.
pub const AUDIT_LIMIT: usize = 1000;
pub const AUDIT_DEFAULT: usize = 100;

/// Which audit-log lines a query returns (docs/api.md, "Audit log"): every field narrows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditQuery {
    pub key_id: Option<String>,
    pub session_id: Option<String>,
    pub kind: Option<String>,
    pub status: Option<String>,
    /// Only lines at or after this time (seconds since the Unix epoch).
    pub since: Option<i64>,
    /// Only lines older than this line id: the `next` of the previous page.
    pub before: Option<i64>,
    /// At most this many lines, newest first.
    pub limit: usize,
}

/// One stored audit-log line, as a query returns it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditRecord {
    pub id: i64,
    pub key_id: String,
    pub session_id: Option<String>,
    /// `run`, `execute` or `command`.
    pub kind: String,
    /// Seconds since the Unix epoch.
    pub at: i64,
    /// The SHA-256 of the code or command (the code itself is never stored).
    pub code_sha256: String,
    pub status: String,
    pub execution_time_ms: i64,
    pub cpu_time_ms: i64,
    pub peak_memory_bytes: i64,
}

/// One audit-log line.
#[derive(Debug, Clone)]
pub struct AuditEntry<'a> {
    pub key_id: &'a str,
    pub session_id: Option<&'a str>,
    /// `run`, `execute` or `command`.
    pub kind: &'a str,
    pub code: &'a str,
    pub status: &'a str,
    pub execution_time_ms: u64,
    pub cpu_time_ms: u64,
    pub peak_memory_bytes: u64,
}

/// Which egress decisions [`Db::query_egress`] returns.
#[derive(Debug, Clone, Default)]
pub struct EgressQuery {
    pub key_id: Option<String>,
    pub session_id: Option<String>,
    /// `allowed`, `denied` or `failed`.
    pub decision: Option<String>,
    /// The name (or address) the program asked for.
    pub host: Option<String>,
    /// Only decisions at or after this time (seconds since the Unix epoch).
    pub since: Option<i64>,
    /// Only decisions older than this one: the `next` of the previous page.
    pub before: Option<i64>,
    /// At most this many, newest first.
    pub limit: usize,
}

/// One stored egress decision, as a query returns it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EgressRecord {
    pub id: i64,
    pub key_id: String,
    /// The session, or none for a one-shot run.
    pub session_id: Option<String>,
    /// Seconds since the Unix epoch.
    pub at: i64,
    /// The name (or address) the program asked for.
    pub host: String,
    pub port: u16,
    /// `allowed`, `denied` or `failed`.
    pub decision: String,
    /// Why it was denied or failed (docs/network.md); empty when allowed.
    pub reason: String,
    /// The address connected to, when allowed.
    pub address: Option<String>,
}

/// One decision of a sandbox's egress proxy, for the audit log.
#[derive(Debug, Clone)]
pub struct EgressEntry<'a> {
    pub key_id: &'a str,
    /// The session, or none for a one-shot run.
    pub session_id: Option<&'a str>,
    pub host: &'a str,
    pub port: u16,
    /// `allowed`, `denied` or `failed`.
    pub decision: &'a str,
    /// Empty when allowed.
    pub reason: &'a str,
    /// The address connected to, when allowed.
    pub address: Option<String>,
}

pub struct Db {
    conn: Mutex<Connection>,
    retention: Retention,
    /// Rows added to each [`Log`] (by [`Log::index`]) since this process opened the database.
    added: [AtomicU64; 3],
    /// Rows removed from each log by retention (`corral_audit_rows_pruned_total`).
    pruned: Family<PrunedLabels, Counter>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS keys (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER,
    operator INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    key_id TEXT NOT NULL,
    image TEXT NOT NULL,
    language TEXT NOT NULL,
    server_pid INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    ended_at INTEGER,
    end_reason TEXT
);
CREATE TABLE IF NOT EXISTS executions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key_id TEXT NOT NULL,
    session_id TEXT,
    kind TEXT NOT NULL,
    at INTEGER NOT NULL,
    code_sha256 TEXT NOT NULL,
    status TEXT NOT NULL,
    execution_time_ms INTEGER NOT NULL,
    cpu_time_ms INTEGER NOT NULL,
    peak_memory_bytes INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS saved_sandboxes (
    id TEXT PRIMARY KEY,
    key_id TEXT NOT NULL,
    paused_at INTEGER NOT NULL,
    saved_at INTEGER NOT NULL,
    spec TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS egress (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key_id TEXT NOT NULL,
    session_id TEXT,
    at INTEGER NOT NULL,
    host TEXT NOT NULL,
    port INTEGER NOT NULL,
    decision TEXT NOT NULL,
    reason TEXT NOT NULL,
    address TEXT
);
CREATE INDEX IF NOT EXISTS executions_at ON executions (at);
CREATE INDEX IF NOT EXISTS egress_at ON egress (at);
CREATE INDEX IF NOT EXISTS sessions_ended_at ON sessions (ended_at);
";

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

pub fn hash_key(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

impl Db {
    /// Opens (creating) the database at `path`; the file is readable by its owner only. Its
    /// logs are kept as [`Retention::default`] says until [`Db::with_retention`].
    pub fn open(path: &Path) -> Result<Db, DbError> {
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let conn = Connection::open(path)?;
        {
            use std::os::unix::fs::PermissionsExt as _;
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
        }
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.execute_batch(SCHEMA)?;
        // A database made before operator keys existed: its keys are not operators.
        let has_operator: bool = conn.query_row(
            "SELECT COUNT(*) FROM pragma_table_info('keys') WHERE name = 'operator'",
            [],
            |r| r.get::<_, i64>(0).map(|n| n > 0),
        )?;
        if !has_operator {
            conn.execute_batch("ALTER TABLE keys ADD COLUMN operator INTEGER NOT NULL DEFAULT 0")?;
        }
        Ok(Db {
            conn: Mutex::new(conn),
            retention: Retention::default(),
            added: Default::default(),
            pruned: Family::default(),
        })
    }

    /// Keeps the logs as `retention` says from now on, counting the rows it removes in
    /// `pruned`; removes now, a batch at a time, every row it does not keep.
    pub fn with_retention(
        mut self,
        retention: Retention,
        pruned: Family<PrunedLabels, Counter>,
    ) -> Result<Db, DbError> {
        self.retention = retention;
        self.pruned = pruned;
        for log in Log::ALL {
            while self.prune(&self.conn(), log)? == retention::BATCH {}
        }
        Ok(self)
    }

    /// One pass of retention over `log`; returns how many rows it removed.
    fn prune(&self, conn: &Connection, log: Log) -> Result<u64, DbError> {
        let removed = retention::prune(conn, log, &self.retention, now(), retention::BATCH)?;
        self.pruned
            .get_or_create(&PrunedLabels {
                table: log.name().into(),
            })
            .inc_by(removed);
        Ok(removed)
    }

    /// Counts a row added to `log`, and prunes it once every [`Retention::every`] rows.
    fn added(&self, conn: &Connection, log: Log) -> Result<(), DbError> {
        let added = self.added[log.index()].fetch_add(1, Ordering::Relaxed) + 1;
        if added.is_multiple_of(self.retention.every()) {
            self.prune(conn, log)?;
        }
        Ok(())
    }

    /// How many rows `log` holds (for tests and inspection).
    pub fn rows(&self, log: Log) -> Result<u64, DbError> {
        self.conn()
            .query_row(&format!("SELECT COUNT(*) FROM {}", log.name()), [], |r| {
                r.get::<_, i64>(0)
            })
            .map(|n| n as u64)
            .map_err(DbError)
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes a key (an operator's when `operator`); returns its id and the secret, which is
    /// shown once and stored only hashed.
    pub fn create_key(&self, name: &str, operator: bool) -> Result<(String, String), DbError> {
        let mut bytes = [0u8; 24];
        rand::rng().fill_bytes(&mut bytes);
        let secret = format!("crl_{}", hex::encode(bytes));
        let mut id_bytes = [0u8; 6];
        rand::rng().fill_bytes(&mut id_bytes);
        let id = format!("key-{}", hex::encode(id_bytes));
        self.conn().execute(
            "INSERT INTO keys (id, name, hash, created_at, operator) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![id, name, hash_key(&secret), now(), operator],
        )?;
        Ok((id, secret))
    }

    /// Adds key `id` named `name` with `secret` (made elsewhere: the same key on every node of
    /// a cluster), an operator's if `operator`, stored only hashed. An existing key of that id
    /// or secret is left as it is (an operator's or not).
    pub fn add_key(
        &self,
        id: &str,
        name: &str,
        secret: &str,
        operator: bool,
    ) -> Result<KeyAdded, DbError> {
        let hash = hash_key(secret);
        let conn = self.conn();
        let added = conn.execute(
            "INSERT INTO keys (id, name, hash, created_at, operator) VALUES (?1, ?2, ?3, ?4, ?5) \
             ON CONFLICT DO NOTHING",
            params![id, name, hash, now(), operator],
        )?;
        if added == 1 {
            return Ok(KeyAdded::New);
        }
        let existing: Option<(String, String, Option<i64>, bool)> = conn
            .query_row(
                "SELECT name, hash, revoked_at, operator FROM keys WHERE id = ?1",
                params![id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()?;
        Ok(match existing {
            Some((_, _, Some(_), _)) => KeyAdded::Revoked,
            Some((n, h, None, o)) if n == name && h == hash && o == operator => KeyAdded::Unchanged,
            _ => KeyAdded::Differs,
        })
    }

    pub fn list_keys(&self) -> Result<Vec<KeyInfo>, DbError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT id, name, created_at, revoked_at, operator FROM keys ORDER BY created_at",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(KeyInfo {
                id: r.get(0)?,
                name: r.get(1)?,
                created_at: r.get(2)?,
                revoked: r.get::<_, Option<i64>>(3)?.is_some(),
                operator: r.get(4)?,
            })
        })?;
        rows.collect::<Result<_, _>>().map_err(DbError)
    }

    /// Revokes key `id`; false when there is no such live key.
    pub fn revoke_key(&self, id: &str) -> Result<bool, DbError> {
        let n = self.conn().execute(
            "UPDATE keys SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
            params![id, now()],
        )?;
        Ok(n == 1)
    }

    /// The id of the live key whose secret is `secret`.
    pub fn verify_key(&self, secret: &str) -> Result<Option<String>, DbError> {
        self.conn()
            .query_row(
                "SELECT id FROM keys WHERE hash = ?1 AND revoked_at IS NULL",
                params![hash_key(secret)],
                |r| r.get(0),
            )
            .optional()
            .map_err(DbError)
    }

    /// Whether `id` is a live operator key (the keyless tenant `local` is not one).
    pub fn is_operator(&self, id: &str) -> Result<bool, DbError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT operator FROM keys WHERE id = ?1 AND revoked_at IS NULL",
                params![id],
                |r| r.get::<_, bool>(0),
            )
            .optional()?
            .unwrap_or(false))
    }

    /// The audit-log lines `query` asks for, newest first.
    pub fn query_audit(&self, query: &AuditQuery) -> Result<Vec<AuditRecord>, DbError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT id, key_id, session_id, kind, at, code_sha256, status, execution_time_ms, \
             cpu_time_ms, peak_memory_bytes FROM executions \
             WHERE (?1 IS NULL OR key_id = ?1) AND (?2 IS NULL OR session_id = ?2) \
             AND (?3 IS NULL OR kind = ?3) AND (?4 IS NULL OR status = ?4) \
             AND (?5 IS NULL OR at >= ?5) AND (?6 IS NULL OR id < ?6) \
             ORDER BY id DESC LIMIT ?7",
        )?;
        let rows = stmt.query_map(
            params![
                query.key_id,
                query.session_id,
                query.kind,
                query.status,
                query.since,
                query.before,
                query.limit as i64
            ],
            |r| {
                Ok(AuditRecord {
                    id: r.get(0)?,
                    key_id: r.get(1)?,
                    session_id: r.get(2)?,
                    kind: r.get(3)?,
                    at: r.get(4)?,
                    code_sha256: r.get(5)?,
                    status: r.get(6)?,
                    execution_time_ms: r.get(7)?,
                    cpu_time_ms: r.get(8)?,
                    peak_memory_bytes: r.get(9)?,
                })
            },
        )?;
        rows.collect::<Result<_, _>>().map_err(DbError)
    }

    /// The name of key `id` (None when there is no such key: the keyless tenant `local`).
    pub fn key_name(&self, id: &str) -> Result<Option<String>, DbError> {
        self.conn()
            .query_row("SELECT name FROM keys WHERE id = ?1", params![id], |r| {
                r.get(0)
            })
            .optional()
            .map_err(DbError)
    }

    pub fn session_started(
        &self,
        id: &str,
        key_id: &str,
        image: &str,
        language: &str,
    ) -> Result<(), DbError> {
        let conn = self.conn();
        conn.execute(
            "INSERT INTO sessions (id, key_id, image, language, server_pid, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![id, key_id, image, language, std::process::id(), now()],
        )?;
        self.added(&conn, Log::Sessions)
    }

    pub fn session_ended(&self, id: &str, reason: &str) -> Result<(), DbError> {
        self.conn().execute(
            "UPDATE sessions SET ended_at = ?2, end_reason = ?3 WHERE id = ?1 AND ended_at IS NULL",
            params![id, now(), reason],
        )?;
        Ok(())
    }

    /// Marks dead every session a previous server process left open (it was killed before it
    /// could tear them down); returns their ids.
    pub fn end_orphaned_sessions(&self) -> Result<Vec<String>, DbError> {
        let conn = self.conn();
        let ids: Vec<String> = {
            let mut stmt = conn
                .prepare("SELECT id FROM sessions WHERE ended_at IS NULL AND server_pid != ?1")?;
            let rows = stmt.query_map(params![std::process::id()], |r| r.get(0))?;
            rows.collect::<Result<_, _>>()?
        };
        conn.execute(
            "UPDATE sessions SET ended_at = ?2, end_reason = 'orphaned: the server stopped \
             without tearing it down' WHERE ended_at IS NULL AND server_pid != ?1",
            params![std::process::id(), now()],
        )?;
        Ok(ids)
    }

    /// A session this server process takes up again (a paused sandbox saved across a
    /// restart, resumed): open again, and this process's.
    pub fn session_restored(&self, id: &str) -> Result<(), DbError> {
        self.conn().execute(
            "UPDATE sessions SET ended_at = NULL, end_reason = NULL, server_pid = ?2 WHERE id = ?1",
            params![id, std::process::id()],
        )?;
        Ok(())
    }

    /// Records a paused sandbox saved at shutdown (crate::persist): its owner, since when it
    /// is paused (unix seconds) and its settings (JSON).
    pub fn save_sandbox(
        &self,
        id: &str,
        key_id: &str,
        paused_at: i64,
        spec: &str,
    ) -> Result<(), DbError> {
        self.conn().execute(
            "INSERT OR REPLACE INTO saved_sandboxes (id, key_id, paused_at, saved_at, spec) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![id, key_id, paused_at, now(), spec],
        )?;
        Ok(())
    }

    /// Every saved sandbox: (id, key id, paused at, spec).
    pub fn saved_sandboxes(&self) -> Result<Vec<(String, String, i64, String)>, DbError> {
        let conn = self.conn();
        let mut stmt =
            conn.prepare("SELECT id, key_id, paused_at, spec FROM saved_sandboxes ORDER BY id")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Forgets a saved sandbox (resumed, deleted or expired).
    pub fn forget_saved_sandbox(&self, id: &str) -> Result<(), DbError> {
        self.conn()
            .execute("DELETE FROM saved_sandboxes WHERE id = ?1", params![id])?;
        Ok(())
    }

    /// The end reason of session `id` (None while it is open or unknown).
    pub fn session_end_reason(&self, id: &str) -> Result<Option<String>, DbError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT end_reason FROM sessions WHERE id = ?1",
                params![id],
                |r| r.get::<_, Option<String>>(0),
            )
            .optional()?
            .flatten())
    }

    pub fn audit(&self, e: &AuditEntry<'_>) -> Result<(), DbError> {
        let conn = self.conn();
        conn.execute(
            "INSERT INTO executions (key_id, session_id, kind, at, code_sha256, status, \
             execution_time_ms, cpu_time_ms, peak_memory_bytes) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![
                e.key_id,
                e.session_id,
                e.kind,
                now(),
                hex::encode(Sha256::digest(e.code.as_bytes())),
                e.status,
                e.execution_time_ms as i64,
                e.cpu_time_ms as i64,
                e.peak_memory_bytes as i64
            ],
        )?;
        self.added(&conn, Log::Executions)
    }

    /// Records one egress decision.
    pub fn egress(&self, e: &EgressEntry<'_>) -> Result<(), DbError> {
        let conn = self.conn();
        conn.execute(
            "INSERT INTO egress (key_id, session_id, at, host, port, decision, reason, address) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                e.key_id,
                e.session_id,
                now(),
                e.host,
                e.port,
                e.decision,
                e.reason,
                e.address
            ],
        )?;
        self.added(&conn, Log::Egress)
    }

    /// The egress decisions `query` asks for, newest first.
    pub fn query_egress(&self, query: &EgressQuery) -> Result<Vec<EgressRecord>, DbError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT id, key_id, session_id, at, host, port, decision, reason, address FROM egress \
             WHERE (?1 IS NULL OR key_id = ?1) AND (?2 IS NULL OR session_id = ?2) \
             AND (?3 IS NULL OR decision = ?3) AND (?4 IS NULL OR host = ?4) \
             AND (?5 IS NULL OR at >= ?5) AND (?6 IS NULL OR id < ?6) \
             ORDER BY id DESC LIMIT ?7",
        )?;
        let rows = stmt.query_map(
            params![
                query.key_id,
                query.session_id,
                query.decision,
                query.host,
                query.since,
                query.before,
                query.limit as i64
            ],
            |r| {
                Ok(EgressRecord {
                    id: r.get(0)?,
                    key_id: r.get(1)?,
                    session_id: r.get(2)?,
                    at: r.get(3)?,
                    host: r.get(4)?,
                    port: r.get(5)?,
                    decision: r.get(6)?,
                    reason: r.get(7)?,
                    address: r.get(8)?,
                })
            },
        )?;
        rows.collect::<Result<_, _>>().map_err(DbError)
    }

    /// How many audit-log lines there are for `session_id` (for tests and inspection).
    pub fn audit_count(&self, session_id: &str) -> Result<u64, DbError> {
        self.conn()
            .query_row(
                "SELECT COUNT(*) FROM executions WHERE session_id = ?1",
                params![session_id],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as u64)
            .map_err(DbError)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stored_hashed_verified_and_revoked() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("c.db")).unwrap();
        let (id, secret) = db.create_key("ci", false).unwrap();
        assert_eq!(
            db.verify_key(&secret).unwrap().as_deref(),
            Some(id.as_str())
        );
        assert_eq!(db.verify_key("crl_wrong").unwrap(), None);
        let raw = std::fs::read(dir.path().join("c.db")).unwrap();
        let wal = std::fs::read(dir.path().join("c.db-wal")).unwrap_or_default();
        let needle = secret.as_bytes();
        for bytes in [&raw, &wal] {
            assert!(!bytes.windows(needle.len()).any(|w| w == needle));
        }
        assert!(db.revoke_key(&id).unwrap());
        assert!(!db.revoke_key(&id).unwrap());
        assert_eq!(db.verify_key(&secret).unwrap(), None);
        assert!(db.list_keys().unwrap()[0].revoked);
    }

    #[test]
    fn a_key_made_on_one_node_is_added_to_another_and_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let first = Db::open(&dir.path().join("a.db")).unwrap();
        let second = Db::open(&dir.path().join("b.db")).unwrap();
        let (id, secret) = first.create_key("team", false).unwrap();
        assert_eq!(
            second.add_key(&id, "team", &secret, false).unwrap(),
            KeyAdded::New
        );
        assert_eq!(
            second.verify_key(&secret).unwrap().as_deref(),
            Some(id.as_str())
        );
        assert_eq!(
            second.add_key(&id, "team", &secret, false).unwrap(),
            KeyAdded::Unchanged
        );
        // Another secret or name under that id, or that secret under another id: refused, and
        // the key is as it was.
        assert_eq!(
            second.add_key(&id, "team", "crl_other", false).unwrap(),
            KeyAdded::Differs
        );
        assert_eq!(
            second.add_key(&id, "other", &secret, false).unwrap(),
            KeyAdded::Differs
        );
        assert_eq!(
            second
                .add_key("key-000000000000", "x", &secret, false)
                .unwrap(),
            KeyAdded::Differs
        );
        // Nor is a key added again as an operator's made one.
        assert_eq!(
            second.add_key(&id, "team", &secret, true).unwrap(),
            KeyAdded::Differs
        );
        assert!(!second.is_operator(&id).unwrap());
        assert_eq!(second.verify_key("crl_other").unwrap(), None);
        assert_eq!(
            second.verify_key(&secret).unwrap().as_deref(),
            Some(id.as_str())
        );
        // An operator key made on one node is an operator's on the other.
        let (op, op_secret) = first.create_key("ops", true).unwrap();
        assert_eq!(
            second.add_key(&op, "ops", &op_secret, true).unwrap(),
            KeyAdded::New
        );
        assert!(second.is_operator(&op).unwrap());
        assert_eq!(
            second.add_key(&op, "ops", &op_secret, false).unwrap(),
            KeyAdded::Differs
        );
        assert!(second.is_operator(&op).unwrap());
        // A revoked key stays revoked.
        assert!(second.revoke_key(&id).unwrap());
        assert_eq!(
            second.add_key(&id, "team", &secret, false).unwrap(),
            KeyAdded::Revoked
        );
        assert_eq!(second.verify_key(&secret).unwrap(), None);
    }

    #[test]
    fn sessions_of_another_server_process_are_ended_as_orphans() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("c.db")).unwrap();
        db.session_started("mine", "k", "default", "python")
            .unwrap();
        db.conn()
            .execute(
                "INSERT INTO sessions (id, key_id, image, language, server_pid, created_at) \
                 VALUES ('old', 'k', 'default', 'python', 1, 0)",
                [],
            )
            .unwrap();
        assert_eq!(db.end_orphaned_sessions().unwrap(), ["old"]);
        assert!(db
            .session_end_reason("old")
            .unwrap()
            .unwrap()
            .starts_with("orphaned"));
        assert_eq!(db.session_end_reason("mine").unwrap(), None);
    }

    #[test]
    fn operator_keys_are_marked_and_old_databases_gain_the_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        {
            // A database of a server from before operator keys.
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE keys (id TEXT PRIMARY KEY, name TEXT NOT NULL, hash TEXT NOT NULL \
                 UNIQUE, created_at INTEGER NOT NULL, revoked_at INTEGER); \
                 INSERT INTO keys VALUES ('key-old', 'old', 'h', 0, NULL);",
            )
            .unwrap();
        }
        let db = Db::open(&path).unwrap();
        assert!(!db.is_operator("key-old").unwrap());
        let (op, _) = db.create_key("ops", true).unwrap();
        let (tenant, _) = db.create_key("t", false).unwrap();
        assert!(db.is_operator(&op).unwrap());
        assert!(!db.is_operator(&tenant).unwrap());
        assert!(!db.is_operator("local").unwrap());
        let keys = db.list_keys().unwrap();
        assert_eq!(
            keys.iter().map(|k| k.operator).collect::<Vec<_>>(),
            [false, true, false]
        );
        // A revoked operator key is no operator.
        assert!(db.revoke_key(&op).unwrap());
        assert!(!db.is_operator(&op).unwrap());
        // Opening it again does not add the column twice.
        drop(db);
        Db::open(&path).unwrap();
    }

    #[test]
    fn the_audit_log_is_queried_by_every_filter_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("c.db")).unwrap();
        let line = |key: &'static str, session, kind: &'static str, status: &'static str| {
            db.audit(&AuditEntry {
                key_id: key,
                session_id: session,
                kind,
                code: "print(1)",
                status,
                execution_time_ms: 1,
                cpu_time_ms: 1,
                peak_memory_bytes: 1,
            })
            .unwrap()
        };
        line("a", Some("s1"), "execute", "ok");
        line("a", None, "run", "error");
        line("b", Some("s2"), "command", "ok");
        let all = |q: AuditQuery| {
            db.query_audit(&AuditQuery { limit: 10, ..q })
                .unwrap()
                .iter()
                .map(|r| r.id)
                .collect::<Vec<_>>()
        };
        assert_eq!(all(AuditQuery::default()), [3, 2, 1]);
        let key = |k: &str| Some(k.to_string());
        assert_eq!(
            all(AuditQuery {
                key_id: key("a"),
                ..Default::default()
            }),
            [2, 1]
        );
        assert_eq!(
            all(AuditQuery {
                session_id: key("s2"),
                ..Default::default()
            }),
            [3]
        );
        assert_eq!(
            all(AuditQuery {
                kind: key("run"),
                ..Default::default()
            }),
            [2]
        );
        assert_eq!(
            all(AuditQuery {
                status: key("ok"),
                ..Default::default()
            }),
            [3, 1]
        );
        assert_eq!(
            all(AuditQuery {
                before: Some(3),
                ..Default::default()
            }),
            [2, 1]
        );
        assert_eq!(
            all(AuditQuery {
                since: Some(now() + 60),
                ..Default::default()
            }),
            Vec::<i64>::new()
        );
        assert_eq!(
            all(AuditQuery {
                key_id: key("nobody"),
                ..Default::default()
            }),
            Vec::<i64>::new()
        );
        let page = db
            .query_audit(&AuditQuery {
                limit: 1,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(page.len(), 1);
        assert_eq!(
            page[0].code_sha256,
            hex::encode(Sha256::digest(b"print(1)"))
        );
        // A filter is a value, never SQL.
        assert_eq!(
            all(AuditQuery {
                key_id: key("a' OR '1'='1"),
                ..Default::default()
            }),
            Vec::<i64>::new()
        );
    }
}
