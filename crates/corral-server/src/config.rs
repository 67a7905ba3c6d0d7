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
    /// Largest request body: uploaded files (JSON bodies are held to `max_json_bytes`).
    pub max_body_bytes: usize,
    pub max_json_bytes: usize,
    pub default_idle_timeout_s: u64,
    pub max_idle_timeout_s: u64,
    /// On SIGTERM, running executions get this long to finish before they are interrupted.
    pub shutdown_grace_s: u64,
    /// Run even where Landlock is missing (reported as a warning in results).
    pub allow_degraded: bool,
    /// Refuse to run where cgroups are unavailable, instead of falling back to rlimits.
    pub strict: bool,
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
            max_body_bytes: 64 << 20,
            max_json_bytes: 8 << 20,
            default_idle_timeout_s: 600,
            max_idle_timeout_s: 24 * 3600,
            shutdown_grace_s: 10,
            allow_degraded: false,
            strict: false,
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
}
