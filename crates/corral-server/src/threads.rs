//! The one door of the server onto tokio's blocking pool: [`spawn`] runs work that holds a
//! permit of the blocking-thread budgets ([`corral_service::threads`]).

pub use corral_service::threads::*;

/// Runs `work` on a blocking thread, holding `permit` until it has finished (even when the
/// caller stops waiting for it). The only door of the server onto tokio's blocking pool.
pub fn spawn<T: Send + 'static>(
    permit: ThreadPermit,
    work: impl FnOnce() -> T + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    #[allow(clippy::disallowed_methods)] // this is the one place allowed to
    tokio::task::spawn_blocking(move || {
        let _held_until_done = permit;
        work()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_service::metrics::Metrics;
    use corral_service::{Config, Tenant};

    #[tokio::test]
    async fn a_permit_is_held_until_its_work_is_done() {
        let config = Config {
            blocking_threads: 5,
            max_blocking_calls: 1,
            max_blocking_calls_per_key: Some(1),
            ..Config::default()
        };
        let threads = Threads::new(&config, &Metrics::default());
        let a = Tenant("a".into());
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let running = spawn(threads.admit(&a).unwrap(), move || wait.recv().is_ok());
        assert!(threads.admit(&a).is_err(), "admitted while the work runs");
        go.send(()).unwrap();
        assert!(running.await.unwrap());
        threads.admit(&a).unwrap();
    }
}
