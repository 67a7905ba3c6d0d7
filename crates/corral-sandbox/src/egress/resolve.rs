//! Name resolution for the proxy, on the host, within a time bound: the system's resolver in
//! production, a fixed table in tests (so that an allowed name can be made to resolve to
//! loopback without touching the host's configuration).

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{IpAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// How long a name may take to resolve.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Resolutions in flight at once in this process (each holds a thread until the system's
/// resolver answers, which its own timeouts bound).
pub const MAX_RESOLVING: usize = 64;

static RESOLVING: AtomicUsize = AtomicUsize::new(0);

/// Turns a host name into addresses.
pub trait Resolve: Send + Sync + fmt::Debug {
    fn resolve(&self, name: &str) -> io::Result<Vec<IpAddr>>;
}

/// The host's resolver (`getaddrinfo`: `/etc/hosts`, then the name servers of
/// `/etc/resolv.conf`).
#[derive(Debug, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, name: &str) -> io::Result<Vec<IpAddr>> {
        Ok((name, 0).to_socket_addrs()?.map(|a| a.ip()).collect())
    }
}

/// A fixed table of names and their addresses; any other name does not resolve.
#[derive(Debug, Default, Clone)]
pub struct FixedResolver(pub HashMap<String, Vec<IpAddr>>);

impl Resolve for FixedResolver {
    fn resolve(&self, name: &str) -> io::Result<Vec<IpAddr>> {
        self.0.get(name).cloned().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{name} is not in the table"),
            )
        })
    }
}

/// Why a name was not resolved.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("it did not resolve within {} s", RESOLVE_TIMEOUT.as_secs())]
    Timeout,
    #[error("{MAX_RESOLVING} names are being resolved already")]
    Busy,
    #[error("{0}")]
    Failed(#[source] io::Error),
    /// The sandbox ended meanwhile.
    #[error("the sandbox ended")]
    Stopped,
}

/// Resolves `name` on a thread of its own, waiting at most [`RESOLVE_TIMEOUT`] (and no longer
/// than until `stopped` is set): a resolver that hangs costs a thread until its own timeout,
/// never the connection's caller.
pub fn resolve_within(
    resolver: &Arc<dyn Resolve>,
    name: &str,
    stopped: &AtomicBool,
) -> Result<Vec<IpAddr>, ResolveError> {
    if RESOLVING.fetch_add(1, Ordering::SeqCst) >= MAX_RESOLVING {
        RESOLVING.fetch_sub(1, Ordering::SeqCst);
        return Err(ResolveError::Busy);
    }
    let (tx, rx) = mpsc::channel();
    let resolver = resolver.clone();
    let owned = name.to_string();
    let spawned = std::thread::Builder::new()
        .name("corral-resolve".into())
        .stack_size(256 << 10)
        .spawn(move || {
            let _ = tx.send(resolver.resolve(&owned));
            RESOLVING.fetch_sub(1, Ordering::SeqCst);
        });
    if let Err(e) = spawned {
        RESOLVING.fetch_sub(1, Ordering::SeqCst);
        return Err(ResolveError::Failed(e));
    }
    let deadline = Instant::now() + RESOLVE_TIMEOUT;
    loop {
        if stopped.load(Ordering::SeqCst) {
            return Err(ResolveError::Stopped);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ResolveError::Timeout);
        }
        match rx.recv_timeout(left.min(Duration::from_millis(100))) {
            Ok(result) => return result.map_err(ResolveError::Failed),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(ResolveError::Failed(io::Error::other(
                    "the resolver panicked",
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Slow;
    impl Resolve for Slow {
        fn resolve(&self, _: &str) -> io::Result<Vec<IpAddr>> {
            std::thread::sleep(Duration::from_secs(1));
            Ok(Vec::new())
        }
    }

    #[test]
    fn a_table_resolves_its_names_and_the_system_knows_localhost() {
        let table: Arc<dyn Resolve> = Arc::new(FixedResolver(HashMap::from([(
            "a.test".to_string(),
            vec!["127.0.0.1".parse().unwrap()],
        )])));
        let go = AtomicBool::new(false);
        assert_eq!(resolve_within(&table, "a.test", &go).unwrap().len(), 1);
        assert!(matches!(
            resolve_within(&table, "b.test", &go),
            Err(ResolveError::Failed(_))
        ));
        let system: Arc<dyn Resolve> = Arc::new(SystemResolver);
        let local = resolve_within(&system, "localhost", &go).unwrap();
        assert!(
            local.iter().all(IpAddr::is_loopback) && !local.is_empty(),
            "{local:?}"
        );
    }

    #[test]
    fn a_stop_ends_the_wait() {
        let slow: Arc<dyn Resolve> = Arc::new(Slow);
        let stop = AtomicBool::new(true);
        let t = Instant::now();
        assert!(matches!(
            resolve_within(&slow, "x", &stop),
            Err(ResolveError::Stopped)
        ));
        assert!(t.elapsed() < Duration::from_millis(500));
    }
}
