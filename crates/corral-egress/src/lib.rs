//! Egress: what a sandbox may reach beyond its own loopback, and the host-side proxy that
//! enforces it (docs/network.md).
//!
//! A sandbox with a [`NetworkPolicy`] other than `none` still has a network namespace with
//! nothing but loopback and no resolver. Its init, before any of the program runs, listens on
//! [`PROXY_ADDR`] inside that namespace and hands the listening socket to the host, keeping no
//! copy; the program finds the proxy through `HTTP_PROXY` and its kin. The host accepts on it
//! ([`proxy::EgressProxy`]), decides on the requested name before resolving it, resolves on
//! the host, refuses internal addresses unless the operator opted the name in, connects to the
//! vetted address only, and for a tunnel requires a TLS ClientHello naming the allowed host.
//! A program that ignores the proxy has nowhere to connect.

pub mod address;
pub mod head;
pub mod hello;
pub mod policy;
pub mod proxy;
pub mod resolve;
pub mod share;

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use policy::{CidrRule, HostPattern, HostRule, NetworkPolicy, PolicyError};
pub use proxy::{EgressMonitor, EgressProxy, ProxyLimits};
pub use resolve::{FixedResolver, Resolve, SystemResolver};
pub use share::{EgressPools, EgressShare};

/// Where the proxy listens inside a sandbox's network namespace.
pub const PROXY_PORT: u16 = 3128;
pub const PROXY_ADDR: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::LOCALHOST, PROXY_PORT);

/// The most denials a report lists (the latest ones; the counters count them all).
pub const MAX_DENIALS: usize = 32;

/// The variables that point programs at the proxy (curl, pip, requests, npm, git, wget read
/// one or the other spelling), and keep loopback direct.
pub fn proxy_environment() -> Vec<(String, String)> {
    let url = format!("http://{PROXY_ADDR}");
    let mut env = Vec::new();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        env.push((name.to_string(), url.clone()));
        env.push((name.to_ascii_lowercase(), url.clone()));
    }
    for name in ["NO_PROXY", "no_proxy"] {
        env.push((name.to_string(), "localhost,127.0.0.1,::1".to_string()));
    }
    env
}

/// Creates the proxy's listening socket in the calling process's network namespace (a
/// sandbox's, with loopback up): no `SO_REUSEADDR`/`SO_REUSEPORT`, so nothing else in the
/// namespace can bind the port while it is open.
pub fn listen() -> io::Result<OwnedFd> {
    use nix::sys::socket::{bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType};
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    bind(
        fd.as_raw_fd(),
        &nix::sys::socket::SockaddrIn::from(PROXY_ADDR),
    )?;
    listen(&fd, Backlog::MAXCONN)?;
    Ok(fd)
}

/// Checks that a descriptor a sandbox's init sent is what [`listen`] makes: a listening TCP
/// socket on [`PROXY_ADDR`].
pub fn check_listener(fd: &OwnedFd) -> io::Result<()> {
    use nix::sys::socket::{getsockname, getsockopt, sockopt, SockType, SockaddrIn};
    let listening = getsockopt(fd, sockopt::AcceptConn)?;
    let kind = getsockopt(fd, sockopt::SockType)?;
    let addr: SockaddrIn = getsockname(fd.as_fd().as_raw_fd())?;
    if !listening || kind != SockType::Stream || SocketAddrV4::from(addr) != PROXY_ADDR {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the sandbox's proxy endpoint is not a TCP socket listening on 127.0.0.1:3128",
        ));
    }
    Ok(())
}

/// How the host carries out a sandbox's policy: the policy, how names are resolved, and who
/// hears of each decision (the server's audit log and metrics).
#[derive(Clone, Debug)]
pub struct Egress {
    pub policy: NetworkPolicy,
    pub resolver: Arc<dyn Resolve>,
    pub observer: Option<Arc<dyn EgressObserver>>,
    /// The key's share of the process's egress pools (connections, resolver slots and
    /// threads), which all its sandboxes draw from.
    pub share: EgressShare,
}

impl Default for Egress {
    fn default() -> Self {
        Egress::new(NetworkPolicy::None)
    }
}

impl Egress {
    /// `policy`, resolved by the system's resolver, with no observer, for the process's one key.
    pub fn new(policy: NetworkPolicy) -> Egress {
        Egress {
            policy,
            resolver: Arc::new(SystemResolver),
            observer: None,
            share: EgressShare::default(),
        }
    }
}

/// Hears of every decision of a sandbox's proxy and of the bytes each connection moved.
pub trait EgressObserver: Send + Sync + fmt::Debug {
    fn decision(&self, decision: &Decision);
    /// A connection that was allowed has ended, having moved these bytes.
    fn closed(&self, bytes_up: u64, bytes_down: u64);
}

/// What the proxy decided about one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The name or address the program asked for (`?` when its request was unreadable).
    pub host: String,
    pub port: u16,
    pub verdict: Verdict,
    /// The address connected to, when it was allowed.
    pub address: Option<SocketAddr>,
    /// A sentence saying what was decided and why.
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// Refused by the policy or a bound.
    Denied(Reason),
    /// Allowed, but the name did not resolve or the server could not be reached.
    Failed(Reason),
}

impl Verdict {
    /// `allowed`, `denied` or `failed`, as metrics and the audit log name it.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Allowed => "allowed",
            Verdict::Denied(_) => "denied",
            Verdict::Failed(_) => "failed",
        }
    }

    pub fn reason(self) -> Option<Reason> {
        match self {
            Verdict::Allowed => None,
            Verdict::Denied(r) | Verdict::Failed(r) => Some(r),
        }
    }
}

/// Why a connection was refused or failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// No rule of the allow-list names the host.
    NotAllowed,
    /// Rules name the host, for other ports.
    PortNotAllowed,
    /// An address literal no CIDR rule allows (or a name that is an address in disguise).
    IpLiteral,
    /// The name resolves only to internal addresses (loopback, private, link-local, the
    /// host's own, ...), or a literal is an internal address no range its operator named
    /// holds.
    InternalAddress,
    /// A malformed, oversized or unsupported request.
    InvalidRequest,
    /// The program sent no complete request in time.
    Timeout,
    /// A tunnel whose first bytes are not a TLS ClientHello.
    TlsRequired,
    /// A ClientHello without a server name, or naming another host than the tunnel's.
    TlsServerName,
    /// The sandbox's limit of connections was reached.
    ConnectionLimit,
    /// Too many connections at once (the sandbox's, or the host's).
    Busy,
    /// The name did not resolve on the host.
    ResolveFailed,
    /// No vetted address of the host could be connected to.
    UpstreamFailed,
}

impl Reason {
    /// The snake_case name (metrics labels, the audit log).
    pub fn name(self) -> &'static str {
        match self {
            Reason::NotAllowed => "not_allowed",
            Reason::PortNotAllowed => "port_not_allowed",
            Reason::IpLiteral => "ip_literal",
            Reason::InternalAddress => "internal_address",
            Reason::InvalidRequest => "invalid_request",
            Reason::Timeout => "timeout",
            Reason::TlsRequired => "tls_required",
            Reason::TlsServerName => "tls_server_name",
            Reason::ConnectionLimit => "connection_limit",
            Reason::Busy => "busy",
            Reason::ResolveFailed => "resolve_failed",
            Reason::UpstreamFailed => "upstream_failed",
        }
    }

    pub const ALL: [Reason; 12] = [
        Reason::NotAllowed,
        Reason::PortNotAllowed,
        Reason::IpLiteral,
        Reason::InternalAddress,
        Reason::InvalidRequest,
        Reason::Timeout,
        Reason::TlsRequired,
        Reason::TlsServerName,
        Reason::ConnectionLimit,
        Reason::Busy,
        Reason::ResolveFailed,
        Reason::UpstreamFailed,
    ];
}

/// One connection that did not get through.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Denial {
    pub host: String,
    pub port: u16,
    pub reason: Reason,
    pub message: String,
}

/// What a sandbox's proxy did: part of the result object (`network`) and of a session's info.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NetworkReport {
    /// Connections allowed and made.
    pub connections: u64,
    /// Connections refused by the policy or a bound.
    pub denied: u64,
    /// Connections allowed whose name did not resolve or whose server was unreachable.
    pub failed: u64,
    /// Bytes sent from the sandbox to servers, and received from them.
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// The latest refusals and failures (at most 32).
    pub denials: Vec<Denial>,
    /// Set when a limit (bytes, connections) cut the sandbox's egress: the proxy then closed
    /// every connection and its endpoint.
    pub limit_reached: Option<String>,
}

impl NetworkReport {
    /// Adds one refusal or failure.
    fn record(&mut self, denial: Denial) {
        if self.denials.len() == MAX_DENIALS {
            self.denials.remove(0);
        }
        self.denials.push(denial);
    }

    /// What happened after `earlier` (a report of the same proxy): the counters' growth and
    /// the denials recorded since (as far as the list still holds them).
    pub fn since(&self, earlier: &NetworkReport) -> NetworkReport {
        let new_denials =
            (self.denied + self.failed).saturating_sub(earlier.denied + earlier.failed);
        let keep = usize::try_from(new_denials)
            .unwrap_or(usize::MAX)
            .min(self.denials.len());
        NetworkReport {
            connections: self.connections.saturating_sub(earlier.connections),
            denied: self.denied.saturating_sub(earlier.denied),
            failed: self.failed.saturating_sub(earlier.failed),
            bytes_up: self.bytes_up.saturating_sub(earlier.bytes_up),
            bytes_down: self.bytes_down.saturating_sub(earlier.bytes_down),
            denials: self
                .denials
                .iter()
                .skip(self.denials.len() - keep)
                .cloned()
                .collect(),
            limit_reached: self
                .limit_reached
                .clone()
                .filter(|_| earlier.limit_reached.is_none()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denial(n: u16) -> Denial {
        Denial {
            host: "h".into(),
            port: n,
            reason: Reason::NotAllowed,
            message: String::new(),
        }
    }

    #[test]
    fn a_report_keeps_the_latest_denials_and_tells_what_is_new() {
        let mut r = NetworkReport::default();
        for n in 0..40 {
            r.denied += 1;
            r.record(denial(n));
        }
        assert_eq!(r.denials.len(), MAX_DENIALS);
        assert_eq!(r.denials[0].port, 8);
        let before = r.clone();
        r.denied += 2;
        r.record(denial(100));
        r.record(denial(101));
        r.bytes_up += 10;
        let d = r.since(&before);
        assert_eq!((d.denied, d.bytes_up, d.denials.len()), (2, 10, 2));
        assert_eq!(d.denials[0].port, 100);
        assert_eq!(r.since(&r).denials.len(), 0);
        assert_eq!(Reason::ALL.len(), 12);
        let names: std::collections::HashSet<_> = Reason::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(names.len(), 12);
        for reason in Reason::ALL {
            assert_eq!(
                serde_json::to_value(reason).unwrap(),
                serde_json::Value::String(reason.name().into())
            );
        }
    }

    #[test]
    fn the_environment_points_at_the_endpoint() {
        let env = proxy_environment();
        assert!(env.contains(&("https_proxy".into(), "http://127.0.0.1:3128".into())));
        assert!(env.contains(&("NO_PROXY".into(), "localhost,127.0.0.1,::1".into())));
    }
}
