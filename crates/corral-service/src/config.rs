//! Server settings: defaults, overridden by a TOML file (`corral serve --config FILE`), then by
//! command-line flags.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Every setting of `corral serve`; unknown keys in the file are errors.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub listen: SocketAddr,
    /// The image store (as `--data-dir` / `CORRAL_DATA_DIR`); `None`: the default store.
    pub data_dir: Option<PathBuf>,
    /// The SQLite database of keys, sessions and the audit log; default `<data dir>/corral.db`.
    pub db: Option<PathBuf>,
    /// The image sessions and runs use when the request names none.
    pub default_image: String,
    /// Python sessions kept forked ahead from the default image's zygote (0: no pool).
    pub pool_size: usize,
    pub max_sessions: usize,
    pub max_sessions_per_key: usize,
    /// One-shot runs (`POST /v1/run`) in flight at once, from all keys.
    pub max_runs: usize,
    /// One-shot runs in flight at once from one key; default half of `max_runs` (at least 1),
    /// so that no key can hold every slot.
    pub max_runs_per_key: Option<usize>,
    /// How long a one-shot run waits for a slot (or for memory budget) before it is refused
    /// (429 or 503, with `Retry-After`).
    pub admission_wait_s: u64,
    /// The memory promised to live sandboxes (each its memory limit plus its `/workspace`
    /// and `/tmp` tmpfs) may reach this multiple of the host's `MemTotal`.
    pub memory_overcommit: f64,
    /// A fixed memory budget in bytes instead of `memory_overcommit` × `MemTotal`.
    pub memory_budget_bytes: Option<u64>,
    /// What one key's live sandboxes may be promised of the memory budget; default three
    /// quarters of it. Past the budget every key is still promised one default sandbox
    /// (admission.rs).
    pub memory_budget_per_key: Option<u64>,
    /// Largest upload: a file (`PUT .../files/...`) or an E2B multipart body. An upload is
    /// held to its sandbox's disk limit as well (JSON bodies are held to `max_json_bytes`).
    pub max_body_bytes: usize,
    /// Uploads whose bodies stream into sandboxes at once, from all keys; more wait up to
    /// `admission_wait_s` for a slot, then are refused (503 `uploads_busy`).
    pub max_uploads_in_flight: usize,
    /// Uploads streaming at once from one key; default half of `max_uploads_in_flight` (at
    /// least 1). Past the server's slots every key still streams one (admission.rs).
    pub max_uploads_in_flight_per_key: Option<usize>,
    /// Threads of the server's blocking pool (tokio's `max_blocking_threads`): every engine
    /// call, and every other blocking step of a request, runs on one of them.
    pub blocking_threads: usize,
    /// Engine calls on blocking threads at once, from all keys; below `blocking_threads`, so
    /// that the rest (authentication, the stop of a stream) always find a thread. A call
    /// beyond it is refused at once (503 `server_busy`, `Retry-After`).
    pub max_blocking_calls: usize,
    /// Engine calls on blocking threads at once from one key (running, or waiting for a busy
    /// session); a call beyond it is refused at once (429 `key_busy`, `Retry-After`). Default
    /// half of `max_blocking_calls`, so that no key can take all of it.
    pub max_blocking_calls_per_key: Option<usize>,
    pub max_json_bytes: usize,
    /// Bytes of rich results the server holds at once, from every execution of every key:
    /// from decoding until the answer that carries them has been written (or dropped). A
    /// result that does not fit is dropped, and named in the result's `warnings`.
    pub max_result_bytes_in_flight: usize,
    /// What one key may hold of `max_result_bytes_in_flight`; default half of it, so that no
    /// key can take all of it.
    pub max_result_bytes_in_flight_per_key: Option<usize>,
    /// Bytes of programs' output the server holds for clients at once, from every stream of
    /// every key: in the streams' queues and in frames not yet written to their clients
    /// (docs/api.md#processes). Output that does not fit is dropped from the stream it was
    /// for, which says so (a `lost` line); the program runs on.
    pub max_output_bytes: u64,
    /// What one key may hold of `max_output_bytes`; default a quarter of it. Every key keeps
    /// an eighth of this share (its floor) even when other keys hold all of
    /// `max_output_bytes`, out of a reserve of an eighth of `max_output_bytes` above it.
    pub max_output_bytes_per_key: Option<u64>,
    /// Keys whose directory watchers (E2B `files.watch_dir`) scan at once, from all keys; a
    /// key scans one directory at a time, and a key beyond this waits for its turn (every
    /// key keeps one turn out of a reserve of a quarter of this above it).
    pub max_watch_scans: u64,
    /// The fraction of a core one key's watcher scans may take: after a scan that took `t`,
    /// the key's next one waits `t * (1 / watch_scan_share - 1)`.
    pub watch_scan_share: f64,
    pub default_idle_timeout_s: u64,
    pub max_idle_timeout_s: u64,
    /// A paused sandbox (whose idle clock stops) is closed once paused this long.
    pub max_paused_s: u64,
    /// On SIGTERM, running executions get this long to finish before they are interrupted.
    pub shutdown_grace_s: u64,
    /// A connection must send a request's head within this long of opening or of its previous
    /// answer, or it is closed (crate::serve_app).
    pub header_timeout_s: u64,
    /// On SIGTERM, saving paused sandboxes (crate::persist) takes at most this long in all:
    /// each gets an even share of what is left, and the files not saved by then are named in
    /// its warnings.
    pub shutdown_save_s: u64,
    /// The host's disk that saved sandboxes' files may take in all; default a quarter of what
    /// the database's filesystem has free at start plus what they take already.
    pub saved_disk_bytes: Option<u64>,
    /// What one key's saved sandboxes may take of it; default half of it.
    pub saved_disk_bytes_per_key: Option<u64>,
    /// Run even where Landlock is missing (reported as a warning in results).
    pub allow_degraded: bool,
    /// Refuse to run where cgroups are unavailable, instead of falling back to rlimits.
    pub strict: bool,
    /// The limits a request leaves out (a `[default_limits]` table with the fields of a
    /// request's `limits`); what it leaves out takes `corral run`'s defaults.
    pub default_limits: crate::service::LimitsRequest,
    /// The code policy of every key and of keyless local use (a `[code_policy]` table with
    /// the fields of a request's `policy`); requests can only narrow it (docs/code-policy.md).
    pub code_policy: crate::service::PolicyRequest,
    /// The code policy of the keys named NAME, instead of `code_policy` (`[key_code_policy.NAME]`
    /// tables).
    pub key_code_policy: std::collections::BTreeMap<String, crate::service::PolicyRequest>,
    /// The CPU weight of all sandboxes together against the host's other processes, on cgroup
    /// v2's scale (1–10000; an ordinary process weighs 100), set on the `corral` parent cgroup
    /// at start. Unset: left as it is.
    pub cpu_weight: Option<u16>,
    /// What sandboxes may reach beyond their loopback (a `[network]` table;
    /// docs/network.md): by default nothing.
    pub network: NetworkConfig,
    /// The port proxy (a `[ports]` table; docs/api.md#ports).
    pub ports: PortsConfig,
    /// What the keys named NAME may ask for, instead of `[network]`'s `allow`, `cidrs` and
    /// `default` (`[key_network.NAME]` tables), within `[network]`'s `allow` and `cidrs`.
    pub key_network: std::collections::BTreeMap<String, crate::network::KeyNetworkConfig>,
    /// This server's name in a cluster behind `corral route` (docs/scale-out.md): the ids it
    /// makes end in it, so that a router can tell which node owns a sandbox. Unset: a single
    /// node, whose ids name none.
    pub node_name: Option<corral_kernel::NodeName>,
    /// Rows kept of each audit log (executions, egress decisions, ended sessions): the
    /// newest; older ones are removed a batch at a time as rows are added (crate::db::Retention).
    pub audit_max_rows: u64,
    /// Audit-log rows older than this many seconds are removed likewise.
    pub audit_max_age_s: u64,
}

/// The operator's network settings: what any request may ask for, which names may resolve
/// to internal addresses, and the policy of requests that ask for the server's default.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetworkConfig {
    /// Host names (`NAME[:PORT]`, `*.SUFFIX[:PORT]`) a request may allow; a request's names
    /// must lie within them (403 `network_not_allowed` otherwise).
    pub allow: Vec<String>,
    /// Address ranges (`CIDR[:PORT]`) a request may allow. A range that lies within one
    /// internal block (`10.0.0.0/8`, `127.0.0.1/32`, `169.254.169.254/32`), or names one
    /// address alone, opts its internal addresses in, on the ports it names alone;
    /// `0.0.0.0/0` and `::/0` hold none of them, whatever a request's narrower range says.
    pub cidrs: Vec<String>,
    /// Names of `allow` that may resolve to internal addresses (loopback, private,
    /// link-local, the host's own): a mirror on a private network, say.
    pub allow_private: Vec<String>,
    /// The policy of a request that asks for the default (`"network": {"default": true}`,
    /// E2B `allow_internet_access`, the MCP tools): items within `allow` and `cidrs`; empty:
    /// none.
    pub default: Vec<String>,
}

impl NetworkConfig {
    /// The operator's bound (its names marked as `allow_private` says, its ranges that name
    /// internal addresses opted in) and the default policy, checked.
    pub fn policies(
        &self,
    ) -> anyhow::Result<(corral_sandbox::NetworkPolicy, corral_sandbox::NetworkPolicy)> {
        use corral_sandbox::NetworkPolicy;
        let bound = NetworkPolicy::from_lists(&self.allow, &self.cidrs, &self.allow_private)
            .map_err(|e| anyhow::anyhow!("[network]: {e}"))?
            .with_own_opt_ins();
        let default = NetworkPolicy::from_items(&self.default, &[])
            .map_err(|e| anyhow::anyhow!("[network] default: {e}"))?;
        default.within(&bound).map_err(|item| {
            anyhow::anyhow!("[network] default: {item} is not within [network] allow and cidrs")
        })?;
        Ok((bound.clone(), default.with_opt_ins_of(&bound)))
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8420)),
            data_dir: None,
            db: None,
            default_image: "default".into(),
            pool_size: 16,
            max_sessions: 1000,
            max_sessions_per_key: 100,
            max_runs: 64,
            max_runs_per_key: None,
            admission_wait_s: 10,
            memory_overcommit: 1.5,
            memory_budget_bytes: None,
            memory_budget_per_key: None,
            max_body_bytes: 64 << 20,
            max_uploads_in_flight: 32,
            max_uploads_in_flight_per_key: None,
            blocking_threads: 512,
            max_blocking_calls: 384,
            max_blocking_calls_per_key: None,
            max_json_bytes: 8 << 20,
            max_result_bytes_in_flight: 256 << 20,
            max_result_bytes_in_flight_per_key: None,
            max_output_bytes: 1 << 30,
            max_output_bytes_per_key: None,
            max_watch_scans: 8,
            watch_scan_share: 0.1,
            default_idle_timeout_s: 600,
            max_idle_timeout_s: 24 * 3600,
            max_paused_s: 24 * 3600,
            cpu_weight: None,
            shutdown_grace_s: 10,
            header_timeout_s: 30,
            shutdown_save_s: 10,
            saved_disk_bytes: None,
            saved_disk_bytes_per_key: None,
            allow_degraded: false,
            strict: false,
            default_limits: Default::default(),
            code_policy: Default::default(),
            key_code_policy: Default::default(),
            network: Default::default(),
            ports: Default::default(),
            key_network: Default::default(),
            node_name: None,
            audit_max_rows: crate::db::Retention::default().max_rows,
            audit_max_age_s: crate::db::Retention::default().max_age.as_secs(),
        }
    }
}

impl Config {
    pub fn from_file(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    /// Keys are required unless the server listens on loopback only.
    pub fn requires_keys(&self) -> bool {
        !self.listen.ip().is_loopback()
    }

    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_s)
    }

    pub fn header_timeout(&self) -> Duration {
        Duration::from_secs(self.header_timeout_s.max(1))
    }

    pub fn shutdown_save(&self) -> Duration {
        Duration::from_secs(self.shutdown_save_s)
    }

    /// The share of the host's disk for saved sandboxes, as set.
    pub fn saved_disk(&self) -> crate::persist::DiskBudget {
        crate::persist::DiskBudget {
            total: self.saved_disk_bytes,
            per_key: self.saved_disk_bytes_per_key,
        }
    }

    /// `max_runs_per_key`, or its default: half of `max_runs`, at least 1.
    pub fn runs_per_key(&self) -> usize {
        self.max_runs_per_key
            .unwrap_or(self.max_runs / 2)
            .clamp(1, self.max_runs.max(1))
    }

    /// `max_uploads_in_flight_per_key`, or its default: half of `max_uploads_in_flight`, at
    /// least 1.
    pub fn uploads_per_key(&self) -> usize {
        self.max_uploads_in_flight_per_key
            .unwrap_or(self.max_uploads_in_flight / 2)
            .clamp(1, self.max_uploads_in_flight.max(1))
    }

    /// `max_result_bytes_in_flight_per_key`, or its default: half of
    /// `max_result_bytes_in_flight`; never more than that.
    pub fn result_bytes_per_key(&self) -> usize {
        self.max_result_bytes_in_flight_per_key
            .unwrap_or(self.max_result_bytes_in_flight / 2)
            .min(self.max_result_bytes_in_flight)
    }

    /// How sandboxes (live, and paused ones saved across a restart) are shared: `max_sessions`
    /// in all, `max_sessions_per_key` for one key, and every key one sandbox whatever the
    /// others hold, out of a reserve of a sixteenth of `max_sessions` (at least 1).
    pub fn session_limits(&self) -> corral_share::Limits {
        let total = self.max_sessions as u64;
        let reserve = (total / 16).max(1);
        let per_key = (self.max_sessions_per_key as u64).min(total + reserve);
        corral_share::Limits::new(total, per_key, 1.min(per_key), reserve)
    }

    /// How the bytes of rich results held at once are shared: `max_result_bytes_in_flight`, a
    /// key's share ([`Config::result_bytes_per_key`]), its floor (an eighth of the share) and
    /// the floors' reserve (an eighth of the total).
    pub fn result_limits(&self) -> corral_share::Limits {
        let total = self.max_result_bytes_in_flight as u64;
        let per_key = self.result_bytes_per_key() as u64;
        corral_share::Limits::new(total, per_key, per_key / 8, total / 8)
    }

    /// How the output bytes held for clients are shared: `max_output_bytes`, a key's share
    /// (`max_output_bytes_per_key`, or a quarter), its floor (an eighth of the share) and the
    /// floors' reserve (an eighth of `max_output_bytes`).
    pub fn output_limits(&self) -> corral_share::Limits {
        let total = self.max_output_bytes;
        let per_key = self
            .max_output_bytes_per_key
            .unwrap_or(total / 4)
            .min(total);
        corral_share::Limits::new(total, per_key, per_key / 8, total / 8)
    }

    /// How the turns of watcher scans are shared: `max_watch_scans` in all, one a key, and
    /// every key's one out of a reserve of a quarter of `max_watch_scans` (at least 1).
    pub fn watch_scan_limits(&self) -> corral_share::Limits {
        let total = self.max_watch_scans;
        corral_share::Limits::new(total, 1, 1, (total / 4).max(1))
    }

    /// `max_blocking_calls_per_key`, or its default: half of `max_blocking_calls`, at least 1.
    pub fn blocking_calls_per_key(&self) -> usize {
        self.max_blocking_calls_per_key
            .unwrap_or((self.max_blocking_calls / 2).max(1))
    }

    /// Refuses settings that cannot work.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.max_runs == 0 || self.max_runs_per_key == Some(0) {
            anyhow::bail!("max_runs and max_runs_per_key must be at least 1");
        }
        if self.max_uploads_in_flight == 0 || self.max_uploads_in_flight_per_key == Some(0) {
            anyhow::bail!(
                "max_uploads_in_flight and max_uploads_in_flight_per_key must be at least 1"
            );
        }
        if !(1..=self.max_blocking_calls).contains(&self.blocking_calls_per_key())
            || self.max_blocking_calls >= self.blocking_threads
        {
            anyhow::bail!(
                "the blocking settings must be 1 <= max_blocking_calls_per_key <= \
                 max_blocking_calls < blocking_threads (the rest of the threads are kept for \
                 authentication and stopping streams)"
            );
        }
        if !(self.memory_overcommit > 0.0 && self.memory_overcommit.is_finite()) {
            anyhow::bail!("memory_overcommit must be a positive number (1.5: 150% of MemTotal)");
        }
        if self.max_result_bytes_in_flight == 0
            || self.max_result_bytes_in_flight_per_key == Some(0)
        {
            anyhow::bail!(
                "max_result_bytes_in_flight and max_result_bytes_in_flight_per_key must be more \
                 than 0 (with 0 no rich result could be returned)"
            );
        }
        if self.max_output_bytes == 0 || self.max_output_bytes_per_key == Some(0) {
            anyhow::bail!(
                "max_output_bytes and max_output_bytes_per_key must be more than 0 (with 0 no \
                 program's output could reach its client)"
            );
        }
        if self.max_watch_scans == 0 {
            anyhow::bail!("max_watch_scans must be at least 1");
        }
        if !(self.watch_scan_share > 0.0 && self.watch_scan_share <= 1.0) {
            anyhow::bail!(
                "watch_scan_share must be more than 0 and at most 1 (0.1: a tenth of a core)"
            );
        }
        if self.saved_disk_bytes == Some(0) || self.saved_disk_bytes_per_key == Some(0) {
            anyhow::bail!(
                "saved_disk_bytes and saved_disk_bytes_per_key must be more than 0 (paused \
                 sandboxes could not be saved)"
            );
        }
        if self.memory_budget_bytes == Some(0) || self.memory_budget_per_key == Some(0) {
            anyhow::bail!("memory_budget_bytes and memory_budget_per_key must be more than 0");
        }
        if self.audit_max_rows == 0 || self.audit_max_age_s == 0 {
            anyhow::bail!(
                "audit_max_rows and audit_max_age_s must be at least 1 (with 0 no audit line \
                 would be kept)"
            );
        }
        // SQLite counts rows and seconds in i64.
        if i64::try_from(self.audit_max_rows).is_err()
            || i64::try_from(self.audit_max_age_s).is_err()
        {
            anyhow::bail!("audit_max_rows and audit_max_age_s must be below 2^63");
        }

        crate::network::NetworkBounds::of(&self.network, &self.key_network)?;
        Ok(())
    }

    /// How much of the audit log is kept.
    pub fn audit_retention(&self) -> crate::db::Retention {
        crate::db::Retention {
            max_rows: self.audit_max_rows,
            max_age: Duration::from_secs(self.audit_max_age_s),
        }
    }

    /// The memory budget of live sandboxes: `memory_budget_bytes`, else `memory_overcommit` ×
    /// the host's `MemTotal`.
    pub fn memory_budget(&self) -> anyhow::Result<u64> {
        if let Some(bytes) = self.memory_budget_bytes {
            return Ok(bytes);
        }
        let total = mem_total_bytes()?;
        Ok((total as f64 * self.memory_overcommit) as u64)
    }
}

/// The host's `MemTotal` from `/proc/meminfo`.
fn mem_total_bytes() -> anyhow::Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| anyhow::anyhow!("reading /proc/meminfo: {e}"))?;
    parse_mem_total(&text).ok_or_else(|| {
        anyhow::anyhow!(
            "/proc/meminfo has no MemTotal line: set memory_budget_bytes in the configuration"
        )
    })
}

fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line["MemTotal:".len()..].split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => n.checked_mul(1024),
        None => Some(n),
        Some(_) => None,
    }
}

/// The operator's settings of the port proxy (a `[ports]` table).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PortsConfig {
    /// The domain of host-routed ports (`{port}-{id}.{domain}`), returned to E2B's SDKs as the
    /// sandbox's `domain`; `HOST[:PORT]` as clients write it. Unset: `localhost:{port}` for a
    /// server that listens on loopback, else no host routing.
    pub domain: Option<String>,
    /// Host-routed ports answer without a key (as E2B's public ports do): anyone who can reach
    /// the server and knows a sandbox's id can use its ports. The native route always needs
    /// the owner's key.
    pub public: bool,
    /// Proxied connections to one sandbox at once; more are refused (429).
    pub max_connections_per_sandbox: usize,
    /// A proxied connection that moves no byte either way this long is closed.
    pub idle_timeout_s: u64,
}

impl Default for PortsConfig {
    fn default() -> Self {
        PortsConfig {
            domain: None,
            public: false,
            max_connections_per_sandbox: 64,
            idle_timeout_s: 300,
        }
    }
}

impl PortsConfig {
    /// The domain of host-routed ports for a server listening on `listen`.
    pub fn domain_for(&self, listen: std::net::SocketAddr) -> Option<String> {
        match &self.domain {
            Some(domain) => Some(domain.to_ascii_lowercase()),
            None if listen.ip().is_loopback() => Some(format!("localhost:{}", listen.port())),
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_overrides_defaults_and_rejects_unknown_keys() {
        let c: Config = toml::from_str("listen = \"0.0.0.0:9000\"\npool_size = 2").unwrap();
        assert_eq!(c.pool_size, 2);
        assert!(c.requires_keys());
        assert_eq!(c.max_sessions, Config::default().max_sessions);
        assert!(!Config::default().requires_keys());
        let err = toml::from_str::<Config>("pool_sise = 2").unwrap_err();
        assert!(err.to_string().contains("pool_sise"), "{err}");
    }

    #[test]
    fn the_network_table_bounds_requests_and_names_a_default() {
        let c: Config = toml::from_str(
            "[network]\nallow = [\"index.example.org\", \"*.example.net:443\"]\n\
             allow_private = [\"index.example.org\"]\ndefault = [\"index.example.org:443\"]",
        )
        .unwrap();
        c.check().unwrap();
        let (bound, default) = c.network.policies().unwrap();
        assert_eq!(
            bound.items(),
            ["index.example.org:80+443", "*.example.net:443"]
        );
        assert_eq!(default.check_name("index.example.org", 443), Ok(true));
        for bad in [
            "[network]\ndefault = [\"evil.com\"]",
            "[network]\nallow = [\"10.0.0.0/8\"]",
            "[network]\nallow = [\"a.com\"]\nallow_private = [\"b.com\"]",
            "[network]\nallowed = []",
        ] {
            let c = toml::from_str::<Config>(bad);
            assert!(c.is_err() || c.unwrap().check().is_err(), "{bad}");
        }
        let (bound, default) = Config::default().network.policies().unwrap();
        assert!(bound.is_none() && default.is_none());
    }

    #[test]
    fn runs_per_key_defaults_to_half_the_slots() {
        let mut c = Config::default();
        assert_eq!((c.max_runs, c.runs_per_key()), (64, 32));
        c.max_runs = 1;
        assert_eq!(c.runs_per_key(), 1);
        c.max_runs = 8;
        c.max_runs_per_key = Some(100);
        assert_eq!(c.runs_per_key(), 8);
        c.check().unwrap();
        c.max_runs_per_key = Some(0);
        assert!(c.check().is_err());
        let c: Config = toml::from_str("memory_overcommit = -1").unwrap();
        assert!(c.check().is_err());
    }

    #[test]
    fn blocking_budgets_must_nest_below_the_pool() {
        let c = Config::default();
        c.check().unwrap();
        assert_eq!(
            (
                c.blocking_threads,
                c.max_blocking_calls,
                c.blocking_calls_per_key()
            ),
            (512, 384, 192)
        );
        for bad in [
            "max_blocking_calls_per_key = 0",
            "max_blocking_calls = 8\nmax_blocking_calls_per_key = 9",
            "blocking_threads = 384",
            "blocking_threads = 16\nmax_blocking_calls = 16\nmax_blocking_calls_per_key = 4",
        ] {
            let c: Config = toml::from_str(bad).unwrap();
            assert!(c.check().is_err(), "{bad}");
        }
        let c: Config = toml::from_str(
            "blocking_threads = 16\nmax_blocking_calls = 15\nmax_blocking_calls_per_key = 15",
        )
        .unwrap();
        c.check().unwrap();
    }

    #[test]
    fn output_bytes_are_shared_with_a_floor_and_checked() {
        let c = Config::default();
        let l = c.output_limits();
        assert_eq!(
            (l.total, l.per_key, l.floor, l.reserve),
            (1 << 30, 256 << 20, 32 << 20, 128 << 20)
        );
        let c: Config =
            toml::from_str("max_output_bytes = 8388608\nmax_output_bytes_per_key = 16777216")
                .unwrap();
        assert_eq!(
            c.output_limits().per_key,
            8 << 20,
            "never more than the total"
        );
        for bad in [
            "max_output_bytes = 0",
            "max_output_bytes_per_key = 0",
            "max_watch_scans = 0",
            "watch_scan_share = 0.0",
            "watch_scan_share = 1.5",
        ] {
            let c: Config = toml::from_str(bad).unwrap();
            assert!(c.check().is_err(), "{bad}");
        }
        let scans = Config::default().watch_scan_limits();
        assert_eq!(
            (scans.total, scans.per_key, scans.floor, scans.reserve),
            (8, 1, 1, 2)
        );
    }

    #[test]
    fn a_key_may_hold_half_the_result_budget_unless_told() {
        let mut c = Config::default();
        assert_eq!(
            (c.max_result_bytes_in_flight, c.result_bytes_per_key()),
            (256 << 20, 128 << 20)
        );
        c.max_result_bytes_in_flight_per_key = Some(512 << 20);
        assert_eq!(c.result_bytes_per_key(), 256 << 20);
        c.check().unwrap();
        let c: Config = toml::from_str("max_result_bytes_in_flight = 0").unwrap();
        assert!(c.check().is_err());
        let c: Config = toml::from_str("max_result_bytes_in_flight_per_key = 0").unwrap();
        assert!(c.check().is_err());
    }

    #[test]
    fn the_audit_log_is_kept_to_a_checked_retention() {
        let c = Config::default();
        assert_eq!(
            (c.audit_max_rows, c.audit_max_age_s),
            (1_000_000, 30 * 24 * 3600)
        );
        let c: Config = toml::from_str("audit_max_rows = 50\naudit_max_age_s = 60").unwrap();
        c.check().unwrap();
        assert_eq!(
            c.audit_retention(),
            crate::db::Retention {
                max_rows: 50,
                max_age: Duration::from_secs(60)
            }
        );
        for bad in [
            "audit_max_rows = 0",
            "audit_max_age_s = 0",
            "audit_max_rows = 9223372036854775808",
            "audit_max_age_s = -1",
        ] {
            let c = toml::from_str::<Config>(bad);
            assert!(c.is_err() || c.unwrap().check().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_budget_is_mem_total_times_the_overcommit_unless_given() {
        assert_eq!(
            parse_mem_total("MemTotal:       24684092 kB\nMemFree: 1 kB\n"),
            Some(24_684_092 * 1024)
        );
        assert_eq!(parse_mem_total("MemFree: 1 kB\n"), None);
        let c: Config = toml::from_str("memory_budget_bytes = 2147483648").unwrap();
        assert_eq!(c.memory_budget().unwrap(), 2 << 30);
        let total = mem_total_bytes().unwrap();
        let c: Config = toml::from_str("memory_overcommit = 2.0").unwrap();
        assert_eq!(c.memory_budget().unwrap(), total * 2);
    }
}
