//! The bounds of a sandbox's [`Limits`]: the one check every front-end (`corral run`, the HTTP
//! API, the E2B face, MCP) applies to what a caller asks for, before any sandbox is made.

use std::fmt;
use std::time::Duration;

use crate::spec::Limits;

/// Longest wall-clock limit (and per-execution timeout).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
pub const MIN_MEMORY_BYTES: u64 = 4 << 20;
pub const MAX_MEMORY_BYTES: u64 = 64 << 30;
pub const MIN_PIDS: u64 = 1;
pub const MAX_PIDS: u64 = 32_768;
/// Bounds of the `/workspace` tmpfs (and of `/tmp`, which has the same size).
pub const MIN_DISK_BYTES: u64 = 1 << 20;
pub const MAX_DISK_BYTES: u64 = 64 << 30;
/// CPUs are in (0, `MAX_CPUS`].
pub const MAX_CPUS: f64 = 64.0;
/// Rich results per execution (bytes of frames buffered, and results kept): 0 keeps none.
/// The server's budget of results held at once bounds them across executions too.
pub const MAX_RESULT_BYTES: u64 = 1 << 30;
pub const MAX_RESULT_COUNT: u64 = 4096;
/// Egress through the proxy: bytes both ways together, and connections in all.
pub const MIN_NET_BYTES: u64 = 1 << 20;
pub const MAX_NET_BYTES: u64 = 1 << 40;
pub const MIN_NET_CONNECTIONS: u64 = 1;
pub const MAX_NET_CONNECTIONS: u64 = 65_536;

/// Which limit is out of range; front-ends name it in their own terms (`--memory`,
/// `limits.memory_mb`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitField {
    Timeout,
    Memory,
    Cpus,
    Pids,
    Disk,
    ResultBytes,
    ResultCount,
    NetBytes,
    NetConnections,
}

impl LimitField {
    pub fn name(self) -> &'static str {
        match self {
            LimitField::Timeout => "timeout",
            LimitField::Memory => "memory",
            LimitField::Cpus => "cpus",
            LimitField::Pids => "pids",
            LimitField::Disk => "disk",
            LimitField::ResultBytes => "result-bytes",
            LimitField::ResultCount => "result-count",
            LimitField::NetBytes => "net-bytes",
            LimitField::NetConnections => "net-connections",
        }
    }
}

impl fmt::Display for LimitField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A limit out of its range: which one, what is allowed, and what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {requirement} (asked: {asked})")]
pub struct LimitError {
    pub field: LimitField,
    /// "must be between 4 MiB and 64 GiB", in units a person reads.
    pub requirement: String,
    pub asked: String,
}

impl LimitError {
    /// The message with the field named as the caller knows it (`--memory`,
    /// `limits.memory_mb`).
    pub fn naming(&self, field: &str) -> String {
        format!("{field} {} (asked: {})", self.requirement, self.asked)
    }
}

pub use corral_share::show_bytes;

fn timeout_error(asked: String) -> LimitError {
    LimitError {
        field: LimitField::Timeout,
        requirement: format!(
            "must be more than 0 and at most {} seconds",
            MAX_TIMEOUT.as_secs()
        ),
        asked,
    }
}

/// A wall-clock limit given in seconds (as every front-end takes it), checked: more than 0,
/// at most [`MAX_TIMEOUT`], a number.
pub fn timeout_from_secs(seconds: f64) -> Result<Duration, LimitError> {
    if seconds > 0.0 && seconds <= MAX_TIMEOUT.as_secs_f64() {
        Ok(Duration::from_secs_f64(seconds))
    } else {
        Err(timeout_error(format!("{seconds} s")))
    }
}

fn range_u64(
    field: LimitField,
    value: u64,
    min: u64,
    max: u64,
    show: fn(u64) -> String,
) -> Result<(), LimitError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(LimitError {
            field,
            requirement: format!("must be between {} and {}", show(min), show(max)),
            asked: show(value),
        })
    }
}

impl Limits {
    /// What the sandbox's egress proxy may move and open.
    pub fn proxy(&self) -> corral_egress::ProxyLimits {
        corral_egress::ProxyLimits {
            net_bytes: self.net_bytes,
            net_connections: self.net_connections,
        }
    }

    /// Checks every limit a caller can set against the engine's bounds; the error names the
    /// first one out of range.
    pub fn validate(&self) -> Result<(), LimitError> {
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            return Err(timeout_error(format!("{} s", self.timeout.as_secs_f64())));
        }
        range_u64(
            LimitField::Memory,
            self.memory_bytes,
            MIN_MEMORY_BYTES,
            MAX_MEMORY_BYTES,
            show_bytes,
        )?;
        if !(self.cpus > 0.0 && self.cpus <= MAX_CPUS) {
            return Err(LimitError {
                field: LimitField::Cpus,
                requirement: format!("must be more than 0 and at most {MAX_CPUS}"),
                asked: self.cpus.to_string(),
            });
        }
        range_u64(LimitField::Pids, self.pids, MIN_PIDS, MAX_PIDS, |n| {
            n.to_string()
        })?;
        range_u64(
            LimitField::Disk,
            self.disk_bytes,
            MIN_DISK_BYTES,
            MAX_DISK_BYTES,
            show_bytes,
        )?;
        range_u64(
            LimitField::ResultBytes,
            self.result_bytes as u64,
            0,
            MAX_RESULT_BYTES,
            show_bytes,
        )?;
        range_u64(
            LimitField::ResultCount,
            self.result_count as u64,
            0,
            MAX_RESULT_COUNT,
            |n| n.to_string(),
        )?;
        range_u64(
            LimitField::NetBytes,
            self.net_bytes,
            MIN_NET_BYTES,
            MAX_NET_BYTES,
            show_bytes,
        )?;
        range_u64(
            LimitField::NetConnections,
            self.net_connections,
            MIN_NET_CONNECTIONS,
            MAX_NET_CONNECTIONS,
            |n| n.to_string(),
        )
    }

    /// The memory this sandbox may pin on the host at most: its memory limit plus its two
    /// tmpfs, `/workspace` and `/tmp` (tmpfs pages are RAM, and not all of them are charged to
    /// the sandbox's own memory limit: files the host writes into a session's workspace,
    /// hosts without a memory cgroup).
    pub fn host_memory_bytes(&self) -> u64 {
        self.memory_bytes
            .saturating_add(self.disk_bytes.saturating_mul(2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_and_the_maxima_are_valid() {
        Limits::default().validate().unwrap();
        Limits {
            timeout: MAX_TIMEOUT,
            memory_bytes: MAX_MEMORY_BYTES,
            cpus: MAX_CPUS,
            pids: MAX_PIDS,
            disk_bytes: MAX_DISK_BYTES,
            net_bytes: MAX_NET_BYTES,
            net_connections: MAX_NET_CONNECTIONS,
            ..Limits::default()
        }
        .validate()
        .unwrap();
        Limits {
            timeout: Duration::from_millis(1),
            memory_bytes: MIN_MEMORY_BYTES,
            cpus: 0.01,
            pids: MIN_PIDS,
            disk_bytes: MIN_DISK_BYTES,
            net_bytes: MIN_NET_BYTES,
            net_connections: MIN_NET_CONNECTIONS,
            ..Limits::default()
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn each_limit_out_of_range_is_named() {
        let d = Limits::default();
        let cases = [
            (
                Limits {
                    timeout: MAX_TIMEOUT + Duration::from_secs(1),
                    ..d
                },
                LimitField::Timeout,
            ),
            (
                Limits {
                    timeout: Duration::ZERO,
                    ..d
                },
                LimitField::Timeout,
            ),
            (
                Limits {
                    memory_bytes: 100 << 30,
                    ..d
                },
                LimitField::Memory,
            ),
            (
                Limits {
                    memory_bytes: MIN_MEMORY_BYTES - 1,
                    ..d
                },
                LimitField::Memory,
            ),
            (Limits { cpus: 0.0, ..d }, LimitField::Cpus),
            (Limits { cpus: 64.5, ..d }, LimitField::Cpus),
            (
                Limits {
                    cpus: f64::NAN,
                    ..d
                },
                LimitField::Cpus,
            ),
            (Limits { pids: 0, ..d }, LimitField::Pids),
            (
                Limits {
                    pids: MAX_PIDS + 1,
                    ..d
                },
                LimitField::Pids,
            ),
            (
                Limits {
                    disk_bytes: MAX_DISK_BYTES + 1,
                    ..d
                },
                LimitField::Disk,
            ),
            (Limits { disk_bytes: 0, ..d }, LimitField::Disk),
            (
                Limits {
                    net_bytes: MIN_NET_BYTES - 1,
                    ..d
                },
                LimitField::NetBytes,
            ),
            (
                Limits {
                    net_bytes: MAX_NET_BYTES + 1,
                    ..d
                },
                LimitField::NetBytes,
            ),
            (
                Limits {
                    net_connections: 0,
                    ..d
                },
                LimitField::NetConnections,
            ),
            (
                Limits {
                    net_connections: MAX_NET_CONNECTIONS + 1,
                    ..d
                },
                LimitField::NetConnections,
            ),
        ];
        for (limits, field) in cases {
            let e = limits.validate().unwrap_err();
            assert_eq!(e.field, field, "{limits:?}: {e}");
            assert!(e.to_string().starts_with(field.name()), "{e}");
        }
        let e = Limits {
            memory_bytes: 100 << 30,
            ..d
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            e.naming("--memory"),
            "--memory must be between 4 MiB and 64 GiB (asked: 100 GiB)"
        );
    }

    #[test]
    fn timeouts_in_seconds_are_checked_before_they_become_durations() {
        assert_eq!(timeout_from_secs(2.5), Ok(Duration::from_millis(2500)));
        assert_eq!(timeout_from_secs(86_400.0), Ok(MAX_TIMEOUT));
        for bad in [0.0, -1.0, 86_400.5, f64::NAN, f64::INFINITY, 1e300] {
            let e = timeout_from_secs(bad).unwrap_err();
            assert_eq!(e.field, LimitField::Timeout, "{bad}");
        }
    }

    #[test]
    fn the_host_promise_counts_both_tmpfs() {
        let l = Limits::default();
        assert_eq!(l.host_memory_bytes(), (512 << 20) + 2 * (256 << 20));
        let huge = Limits {
            memory_bytes: u64::MAX,
            ..l
        };
        assert_eq!(huge.host_memory_bytes(), u64::MAX);
    }
}
