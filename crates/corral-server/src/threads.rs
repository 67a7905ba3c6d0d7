//! The one door of the server onto tokio's blocking pool: [`run`] runs an admitted call's
//! work ([`corral_service::Service::admit`]), [`spawn`] the work that is no key's; both hold
//! a permit of the blocking-thread budgets ([`corral_service::threads`]) while it runs.

pub use corral_service::threads::*;
use corral_service::Admitted;

/// Runs the work of an admitted call on a blocking thread; the call (with its thread of the
/// key's budget) is held until the work has finished, even when the caller stops waiting for
/// it, or until the work hands it on (to the stream that carries on with it).
pub fn run<T: Send + 'static>(
    call: Admitted,
    work: impl FnOnce(Admitted) -> T + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    #[allow(clippy::disallowed_methods)] // this is one of the two places allowed to
    tokio::task::spawn_blocking(move || work(call))
}

/// Runs `work` that is no key's call on a blocking thread, holding `permit` until it has
/// finished (even when the caller stops waiting for it).
pub fn spawn<T: Send + 'static>(
    permit: ThreadPermit,
    work: impl FnOnce() -> T + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    #[allow(clippy::disallowed_methods)] // this is one of the two places allowed to
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
