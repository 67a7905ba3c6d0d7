//! A warm pool: sessions forked from the zygote ahead of demand, so that a burst of session
//! creations is served without waiting for forks.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread;
use std::time::{Duration, Instant};

/// Refilling waits this long after the last acquisition: forking competes for CPU with the
/// sessions just handed out, so a burst is served first and refilled after.
const REFILL_QUIET: Duration = Duration::from_millis(250);

use corral_sandbox::{Policy, Rootfs};

use crate::session::{KernelError, Language, Session, SessionOptions};
use crate::zygote::Zygote;

/// Python sessions for one image: a zygote and up to `target` sessions forked ahead.
pub struct Pool {
    zygote: Zygote,
    /// The options every pooled session is made with; other requests fork on demand.
    template: SessionOptions,
    target: usize,
    ready: Mutex<VecDeque<Session>>,
    wanted: Condvar,
    last_acquired: Mutex<Instant>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("zygote", &self.zygote)
            .field("target", &self.target)
            .field("ready", &self.ready_count())
            .finish()
    }
}

impl Pool {
    /// Starts the zygote for `rootfs` and a background thread that keeps `target` sessions
    /// ready. The thread ends when the pool is dropped.
    pub fn start(
        rootfs: Rootfs,
        image_env: Vec<(String, String)>,
        policy: Policy,
        target: usize,
    ) -> Result<Arc<Pool>, KernelError> {
        let zygote = Zygote::start(&rootfs, &image_env, policy)?;
        let mut template = SessionOptions::new(Language::Python);
        template.rootfs = rootfs;
        template.image_env = image_env;
        template.policy = policy;
        let pool = Arc::new(Pool {
            zygote,
            template,
            target,
            ready: Mutex::new(VecDeque::new()),
            wanted: Condvar::new(),
            last_acquired: Mutex::new(Instant::now()),
        });
        let weak = Arc::downgrade(&pool);
        thread::Builder::new()
            .name("corral-pool".into())
            .spawn(move || refill(weak))
            .map_err(KernelError::Io)?;
        Ok(pool)
    }

    pub fn zygote(&self) -> &Zygote {
        &self.zygote
    }

    /// How many sessions are ready right now.
    pub fn ready_count(&self) -> usize {
        self.ready.lock().expect("pool lock").len()
    }

    /// Whether requests with `options` can be served by this pool.
    pub fn serves(&self, options: &SessionOptions) -> bool {
        options.language == Language::Python && options.rootfs == self.template.rootfs
    }

    /// A session with `options`: from the pool when they are the pool's defaults, else forked
    /// now from the zygote.
    pub fn acquire(&self, options: &SessionOptions) -> Result<Session, KernelError> {
        let pooled = options.limits == self.template.limits
            && options.env.is_empty()
            && options.policy == self.template.policy
            && options.image_env == self.template.image_env;
        *self.last_acquired.lock().expect("pool lock") = Instant::now();
        if pooled {
            let taken = self.ready.lock().expect("pool lock").pop_front();
            self.wanted.notify_one();
            if let Some(session) = taken.filter(|s| s.is_alive()) {
                return Ok(session);
            }
        }
        self.zygote.fork_session(options)
    }
}

fn refill(pool: Weak<Pool>) {
    loop {
        let Some(pool) = pool.upgrade() else {
            return;
        };
        let missing = {
            let ready = pool.ready.lock().expect("pool lock");
            let (ready, _) = pool
                .wanted
                .wait_timeout_while(ready, Duration::from_secs(1), |r| r.len() >= pool.target)
                .expect("pool lock");
            pool.target.saturating_sub(ready.len())
        };
        for _ in 0..missing {
            let quiet_for = pool.last_acquired.lock().expect("pool lock").elapsed();
            if quiet_for < REFILL_QUIET {
                thread::sleep(REFILL_QUIET - quiet_for);
                break;
            }
            match pool.zygote.fork_session(&pool.template) {
                Ok(mut session) => {
                    session.warm_up();
                    if session.is_alive() {
                        pool.ready.lock().expect("pool lock").push_back(session);
                    }
                }
                Err(e) => {
                    eprintln!("corral: warm pool: {e}");
                    thread::sleep(Duration::from_secs(1));
                    break;
                }
            }
        }
    }
}
