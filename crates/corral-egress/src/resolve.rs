//! Name resolution for the proxy, on the host, within a time bound: the system's resolver in
//! production, a fixed table in tests (so that an allowed name can be made to resolve to
//! loopback without touching the host's configuration).

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{IpAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use corral_share::Refusal;

use crate::share::EgressShare;

/// How long a name may take to resolve.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// The key's share of resolver slots or threads, or the process's, is taken
    /// ([`EgressShare`]).
    #[error("{0}")]
    Busy(#[source] Refusal),
    #[error("{0}")]
    Failed(#[source] io::Error),
    /// The sandbox ended meanwhile.
    #[error("the sandbox ended")]
    Stopped,
}

/// Resolves `name` on a thread of its own, waiting at most [`RESOLVE_TIMEOUT`] (and no longer
/// than until `stopped` is set): a resolver that hangs costs a thread until its own timeout,
/// never the connection's caller. The look-up holds a resolver slot of `share` while it is
/// waited on, and a resolver thread until the thread returns (see [`crate::share`]).
pub fn resolve_within(
    resolver: &Arc<dyn Resolve>,
    share: &EgressShare,
    name: &str,
    stopped: &AtomicBool,
) -> Result<Vec<IpAddr>, ResolveError> {
    let _slot = share.resolver_slots.take(1).map_err(ResolveError::Busy)?;
    let thread = share.resolver_threads.take(1).map_err(ResolveError::Busy)?;
    let (tx, rx) = mpsc::channel();
    let resolver = resolver.clone();
    let owned = name.to_string();
    std::thread::Builder::new()
        .name("corral-resolve".into())
        .stack_size(256 << 10)
        .spawn(move || {
            let _thread = thread;
            let _ = tx.send(resolver.resolve(&owned));
        })
        .map_err(ResolveError::Failed)?;
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
        assert_eq!(
            resolve_within(&table, &EgressShare::default(), "a.test", &go)
                .unwrap()
                .len(),
            1
        );
        assert!(matches!(
            resolve_within(&table, &EgressShare::default(), "b.test", &go),
            Err(ResolveError::Failed(_))
        ));
        let system: Arc<dyn Resolve> = Arc::new(SystemResolver);
        let local = resolve_within(&system, &EgressShare::default(), "localhost", &go).unwrap();
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
            resolve_within(&slow, &EgressShare::default(), "x", &stop),
            Err(ResolveError::Stopped)
        ));
        assert!(t.elapsed() < Duration::from_millis(500));
    }

    /// Names under `hang.` block until the gate opens, as on a name server that never
    /// answers; `ok.test` resolves at once.
    #[derive(Debug, Default)]
    struct Gate {
        open: std::sync::Mutex<bool>,
        opened: std::sync::Condvar,
    }
    impl Resolve for Gate {
        fn resolve(&self, name: &str) -> io::Result<Vec<IpAddr>> {
            if name.starts_with("hang.") {
                let open = self.open.lock().unwrap();
                drop(self.opened.wait_while(open, |open| !*open).unwrap());
            }
            Ok(vec!["127.0.0.1".parse().unwrap()])
        }
    }

    fn until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// One key whose names never resolve holds its share of slots, and no more; other keys
    /// resolve. A look-up that is no longer waited on gives its slot back at once and keeps
    /// its thread until the resolver returns: the key's stuck threads stop at their own share.
    #[test]
    fn a_key_that_never_gets_an_answer_holds_its_share_and_others_resolve() {
        use crate::share::EgressPools;
        use corral_share::Limits;
        let pools = EgressPools::new(
            Limits::new(8, 4, 1, 1),
            Limits::new(4, 2, 1, 2),
            Limits::new(6, 3, 1, 2),
        );
        let gate = Arc::new(Gate::default());
        let resolver: Arc<dyn Resolve> = gate.clone();
        let (a, b) = (pools.share("a"), pools.share("b"));
        let stop = Arc::new(AtomicBool::new(false));
        let waiting: Vec<_> = (0..2)
            .map(|_| {
                let (resolver, a, stop) = (resolver.clone(), a.clone(), stop.clone());
                std::thread::spawn(move || resolve_within(&resolver, &a, "hang.test", &stop))
            })
            .collect();
        until("a's look-ups start", || {
            pools.resolver_slots.held_by("a") == 2
        });
        let go = AtomicBool::new(false);
        match resolve_within(&resolver, &a, "hang.test", &go) {
            Err(ResolveError::Busy(refusal)) => assert!(refusal.is_key(), "{refusal}"),
            other => panic!("a third look-up of a's: {other:?}"),
        }
        assert_eq!(
            resolve_within(&resolver, &b, "ok.test", &go).unwrap().len(),
            1
        );

        // No longer waited on: the slots come back, the threads are still held.
        stop.store(true, Ordering::SeqCst);
        for w in waiting {
            assert!(matches!(w.join().unwrap(), Err(ResolveError::Stopped)));
        }
        assert_eq!(pools.resolver_slots.held_by("a"), 0);
        assert_eq!(pools.resolver_threads.held_by("a"), 2);
        let more = {
            let (resolver, a) = (resolver.clone(), a.clone());
            std::thread::spawn(move || {
                resolve_within(&resolver, &a, "hang.test", &AtomicBool::new(false))
            })
        };
        until("a's third thread", || {
            pools.resolver_threads.held_by("a") == 3
        });
        match resolve_within(&resolver, &a, "hang.test", &go) {
            Err(ResolveError::Busy(refusal)) => {
                assert!(refusal.is_key(), "{refusal}");
                assert!(
                    refusal.to_string().contains("resolver threads"),
                    "{refusal}"
                );
            }
            other => panic!("a fourth thread of a's: {other:?}"),
        }
        assert_eq!(
            pools.resolver_slots.held_by("a"),
            1,
            "a refused look-up holds nothing"
        );
        assert_eq!(
            resolve_within(&resolver, &b, "ok.test", &go).unwrap().len(),
            1
        );

        *gate.open.lock().unwrap() = true;
        gate.opened.notify_all();
        assert_eq!(more.join().unwrap().unwrap().len(), 1);
        until("a's threads return", || pools.resolver_threads.held() == 0);
        assert_eq!(pools.resolver_slots.held(), 0);
    }
}
