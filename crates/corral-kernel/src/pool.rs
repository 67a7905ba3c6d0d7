//! A warm pool: sessions forked from the zygote ahead of demand, so that a burst of session
//! creations is served without waiting for forks.
//!
//! The pool has two zygotes of its image (see [`crate::zygote`]): the full one forks sessions
//! and the one-shot runs that import the data stack, the lean one forks the other one-shot
//! runs ([`Pool::fork_run`]).
//!
//! The pool also keeps its zygotes alive, each on its own. A zygote that dies (`kill -9`, the
//! OOM killer) is
//! noticed by the refill thread, which looks at it every [`CHECK_EVERY`], or by a fork that
//! failed because of it, and is replaced by a new one started the same way; while
//! replacements keep failing, the next attempt waits longer each time (0.5 s doubling up to
//! 30 s). A creation during the full zygote's gap waits up to [`ZYGOTE_WAIT`] for the new
//! zygote, then fails with [`KernelError::ZygoteUnavailable`], which is temporary; a one-shot
//! run during a gap is forked from the other zygote. A dead zygote's sandbox is
//! kept until the last session forked from it is gone (the sandbox's init is the ancestor of
//! their pid namespaces: tearing it down would kill them); ready sessions whose kernel is
//! gone are dropped, never handed out.

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread;
use std::time::{Duration, Instant};

use corral_sandbox::{Limits, Policy, Rootfs, SandboxSpec};

use crate::imports::imported_modules;
use crate::session::{check_env, KernelError, Language, Session, SessionOptions};
use crate::zygote::{ForkedRun, Zygote, ZygoteKind};

/// Refilling waits this long after the last acquisition: forking competes for CPU with the
/// sessions just handed out, so a burst is served first and refilled after.
const REFILL_QUIET: Duration = Duration::from_millis(250);
/// How often the refill thread looks at the zygotes and at the ready sessions when it has
/// nothing else to do.
pub const CHECK_EVERY: Duration = Duration::from_millis(500);
/// How long a session creation waits for a replacement zygote before it is refused with
/// [`KernelError::ZygoteUnavailable`].
pub const ZYGOTE_WAIT: Duration = Duration::from_secs(10);
/// The wait before the first retry of a failed zygote start; it doubles with every further
/// failure, up to [`BACKOFF_MAX`].
const BACKOFF_FIRST: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A zygote that dies sooner than this after its start counts as a failed start for the
/// backoff, so one that is killed at once every time is not restarted in a tight loop.
const STABLE_UPTIME: Duration = Duration::from_secs(30);
/// A fork fails the moment the zygote dies, which its request socket may show a little later
/// (a zygote killed while it forks). After a failed fork the pool looks this long for the
/// death before it takes the failure for something else.
const DEATH_GRACE: Duration = Duration::from_secs(2);
/// The `retry_after` of [`KernelError::ZygoteUnavailable`] while a start is in progress.
const RETRY_WHILE_STARTING: Duration = Duration::from_secs(2);

/// One zygote process. The pool holds the live one, and every session forked from one holds
/// it too.
#[derive(Debug)]
struct Generation {
    zygote: Zygote,
    started: Instant,
}

enum ZygoteState {
    Up(Arc<Generation>),
    /// Dead (its sandbox torn down once no fork in flight and no session forked from it
    /// holds it any more) and to be replaced: the next start is tried at `next_attempt`.
    Down {
        next_attempt: Instant,
        starting: bool,
    },
}

struct Supervision {
    state: ZygoteState,
    /// Dead zygotes replaced by a new one that started.
    restarts: u64,
    /// Failed starts and early deaths in a row, for the backoff.
    failures: u32,
    /// While down: the death, or the last failed start.
    last_error: Option<String>,
}

impl Supervision {
    fn unavailable(&self) -> KernelError {
        let retry_after = match self.state {
            ZygoteState::Down {
                next_attempt,
                starting: false,
            } => next_attempt.saturating_duration_since(Instant::now()) + RETRY_WHILE_STARTING,
            _ => RETRY_WHILE_STARTING,
        };
        // Whole seconds, as a Retry-After header says them.
        let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
        KernelError::ZygoteUnavailable {
            reason: self.last_error.clone().unwrap_or_else(|| "it died".into()),
            retry_after: Duration::from_secs(secs.clamp(1, BACKOFF_MAX.as_secs())),
        }
    }
}

/// The zygote as `/healthz` and `/metrics` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZygoteStatus {
    /// Whether a zygote is running (as of the last look, at most [`CHECK_EVERY`] ago unless
    /// forks are in flight).
    pub alive: bool,
    /// How many times a dead zygote was replaced by a new one.
    pub restarts: u64,
    /// While it is down: why (its death, or the last failed start of its replacement).
    pub last_error: Option<String>,
}

/// The wait before the next start after `failures` failures in a row.
fn backoff(failures: u32) -> Duration {
    match failures {
        0 => Duration::ZERO,
        n => BACKOFF_FIRST
            .saturating_mul(1 << (n - 1).min(16))
            .min(BACKOFF_MAX),
    }
}

/// One of the pool's zygotes, as it is supervised.
struct Supervisor {
    state: Mutex<Supervision>,
    /// Signalled (with `state`) when a new zygote is up.
    up: Condvar,
}

impl Supervisor {
    fn new(state: ZygoteState) -> Supervisor {
        Supervisor {
            state: Mutex::new(Supervision {
                state,
                restarts: 0,
                failures: 0,
                last_error: None,
            }),
            up: Condvar::new(),
        }
    }
}

/// Python sessions for one image: its two zygotes and up to `target` sessions forked ahead.
pub struct Pool {
    /// The full zygote's, then the lean one's (indexed by [`ZygoteKind`]).
    zygotes: [Supervisor; 2],
    /// Set when a zygote was found dead: wakes the refill thread to replace it.
    zygote_down: AtomicBool,
    /// The options every pooled session is made with; other requests fork on demand. Its
    /// rootfs, image environment and policy are the zygotes'.
    template: SessionOptions,
    target: usize,
    ready: Mutex<VecDeque<Session>>,
    wanted: Condvar,
    last_acquired: Mutex<Instant>,
    /// Set by [`Pool::shutdown`]: no more forks, the refill thread ends.
    closed: AtomicBool,
    refill_thread: Mutex<Option<thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("rootfs", &self.template.rootfs)
            .field("zygote", &self.zygote_status(ZygoteKind::Full))
            .field("lean_zygote", &self.zygote_status(ZygoteKind::Lean))
            .field("target", &self.target)
            .field("ready", &self.ready_count())
            .finish()
    }
}

impl Pool {
    /// Starts the zygotes for `rootfs` and a background thread that keeps `target` sessions
    /// ready and replaces a zygote that dies. The thread ends when the pool is dropped.
    pub fn start(
        rootfs: Rootfs,
        image_env: Vec<(String, String)>,
        policy: Policy,
        limits: Limits,
        target: usize,
    ) -> Result<Arc<Pool>, KernelError> {
        let up = |kind| -> Result<ZygoteState, KernelError> {
            let zygote = Zygote::start(&rootfs, &image_env, policy, kind)?;
            Ok(ZygoteState::Up(Arc::new(Generation {
                zygote,
                started: Instant::now(),
            })))
        };
        let zygotes = [
            Supervisor::new(up(ZygoteKind::Full)?),
            Supervisor::new(up(ZygoteKind::Lean)?),
        ];
        let mut template = SessionOptions::new(Language::Python);
        template.limits = limits;
        template.rootfs = rootfs;
        template.image_env = image_env;
        template.policy = policy;
        let pool = Arc::new(Pool {
            zygotes,
            zygote_down: AtomicBool::new(false),
            template,
            target,
            ready: Mutex::new(VecDeque::new()),
            wanted: Condvar::new(),
            last_acquired: Mutex::new(Instant::now()),
            closed: AtomicBool::new(false),
            refill_thread: Mutex::new(None),
        });
        let weak = Arc::downgrade(&pool);
        let thread = thread::Builder::new()
            .name("corral-pool".into())
            .spawn(move || refill(weak))
            .map_err(KernelError::Io)?;
        *pool.refill_thread.lock() = Some(thread);
        Ok(pool)
    }

    /// Tears the pool down before the process exits: the refill thread ends (after the fork
    /// it may be in), the ready sessions are killed, and each zygote's sandbox goes with the
    /// last session or run forked from it, all with their cgroups. Later creations fail.
    pub fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        drop(self.ready.lock());
        self.wanted.notify_all();
        if let Some(thread) = self.refill_thread.lock().take() {
            let _ = thread.join();
        }
        let ready: Vec<Session> = self.ready.lock().drain(..).collect();
        drop(ready);
        for supervisor in &self.zygotes {
            let mut s = supervisor.state.lock();
            s.last_error = Some("the server is shutting down".into());
            let old = std::mem::replace(
                &mut s.state,
                ZygoteState::Down {
                    next_attempt: Instant::now() + BACKOFF_MAX,
                    starting: false,
                },
            );
            drop(s);
            drop(old);
        }
    }

    /// The heavy modules the current full zygote managed to import; empty while it is being
    /// replaced.
    pub fn preloaded(&self) -> Vec<String> {
        match self.current(ZygoteKind::Full) {
            Some(g) => g.zygote.preloaded.clone(),
            None => Vec::new(),
        }
    }

    /// Whether the `kind` zygote is up and how often it was replaced.
    pub fn zygote_status(&self, kind: ZygoteKind) -> ZygoteStatus {
        let s = self.supervisor(kind).state.lock();
        ZygoteStatus {
            alive: matches!(s.state, ZygoteState::Up(_)),
            restarts: s.restarts,
            last_error: match s.state {
                ZygoteState::Up(_) => None,
                ZygoteState::Down { .. } => s.last_error.clone(),
            },
        }
    }

    /// How many sessions are ready right now.
    pub fn ready_count(&self) -> usize {
        self.ready.lock().len()
    }

    /// Whether requests with `options` can be served by this pool.
    pub fn serves(&self, options: &SessionOptions) -> bool {
        options.language == Language::Python && options.rootfs == self.template.rootfs
    }

    /// A session with `options`: from the pool when its limits, policy and image are the
    /// pool's (the client's `env` and code policy are then given to the session taken, before
    /// its first execution), else forked now from the zygote (see [`Pool::fork_session`]).
    pub fn acquire(&self, options: &SessionOptions) -> Result<Session, KernelError> {
        check_env(&options.env)?;
        // A session with a network policy gets a proxy endpoint of its own when it is forked.
        let pooled = options.limits == self.template.limits
            && options.egress.policy.is_none()
            && options.policy == self.template.policy
            && options.image_env == self.template.image_env;
        *self.last_acquired.lock() = Instant::now();
        if pooled {
            loop {
                let taken = self.ready.lock().pop_front();
                self.wanted.notify_one();
                match taken {
                    Some(mut session) if session.probe_alive() => match session.adopt(options) {
                        Ok(()) => return Ok(session),
                        Err(e @ KernelError::InvalidCommand(_)) => return Err(e),
                        // Its kernel stopped reading: dropped, and the next one.
                        Err(_) => continue,
                    },
                    // Its kernel is gone (with its zygote, say): dropped, and the next one.
                    Some(_) => continue,
                    None => break,
                }
            }
        }
        self.fork_session(options)
    }

    /// A session forked now from the full zygote. While the zygote is being replaced, or when
    /// a fork fails because it died, this waits for the new one (up to [`ZYGOTE_WAIT`] in all)
    /// and forks from it; past that it fails with [`KernelError::ZygoteUnavailable`].
    pub fn fork_session(&self, options: &SessionOptions) -> Result<Session, KernelError> {
        self.fork_with(
            || ZygoteKind::Full,
            |generation| fork_from(generation, options),
        )
    }

    fn supervisor(&self, kind: ZygoteKind) -> &Supervisor {
        &self.zygotes[kind as usize]
    }

    /// `fork` from the current zygote of the kind `choose` names; while it is being replaced,
    /// or when `fork` failed because it died, chooses again and waits for the zygote chosen
    /// (up to [`ZYGOTE_WAIT`] in all) and forks from that; past that it fails with
    /// [`KernelError::ZygoteUnavailable`].
    fn fork_with<T>(
        &self,
        choose: impl Fn() -> ZygoteKind,
        fork: impl Fn(&Arc<Generation>) -> Result<T, KernelError>,
    ) -> Result<T, KernelError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(KernelError::ZygoteUnavailable {
                reason: "the server is shutting down".into(),
                retry_after: BACKOFF_MAX,
            });
        }
        let deadline = Instant::now() + ZYGOTE_WAIT;
        loop {
            let generation = self.wait_for_zygote(choose(), deadline)?;
            match fork(&generation) {
                Err(e @ KernelError::NeedsFreshInterpreter(_)) => return Err(e),
                Err(_) if self.died(&generation) => continue,
                other => return other,
            }
        }
    }

    /// The part of a one-shot run's environment that is not the image's, when this pool's
    /// zygotes can serve the run (same image, policy and image environment); see
    /// [`crate::oneshot::run_forked`].
    pub(crate) fn run_env<'a>(&self, spec: &'a SandboxSpec) -> Option<&'a [(String, String)]> {
        let t = &self.template;
        // A run with a network policy runs in a fresh sandbox, with its proxy endpoint.
        if spec.rootfs != t.rootfs || spec.policy != t.policy || !spec.egress.policy.is_none() {
            return None;
        }
        spec.env.strip_prefix(t.image_env.as_slice())
    }

    /// Which zygote forks a one-shot run of `code`: the lean one, unless the program imports
    /// a module outside the standard library that the lean one has not imported
    /// ([`Zygote::prefers_full`]); while one of them is being replaced, the other.
    fn zygote_for(&self, code: &[u8]) -> ZygoteKind {
        let Some(lean) = self.current(ZygoteKind::Lean) else {
            return ZygoteKind::Full;
        };
        if !lean.zygote.prefers_full(&imported_modules(code)) {
            return ZygoteKind::Lean;
        }
        match self.current(ZygoteKind::Full) {
            Some(_) => ZygoteKind::Full,
            None => ZygoteKind::Lean,
        }
    }

    /// A one-shot run of `code` forked now (see [`Zygote::fork_run`]), and the kind of the
    /// zygote it was forked from, chosen by what the program imports: the lean zygote unless
    /// the program imports a module outside the standard library that the lean one has not
    /// imported ([`Zygote::prefers_full`]). While the zygote chosen is being replaced, or when
    /// it died during the fork, the other one forks it; while both are, this waits as
    /// [`Pool::fork_session`] does.
    pub(crate) fn fork_run(
        &self,
        limits: &Limits,
        env: &[(String, String)],
        file_name: &str,
        code: &[u8],
    ) -> Result<(ForkedRun, ZygoteKind), KernelError> {
        self.fork_with(
            || self.zygote_for(code),
            |generation| {
                let mut run = generation.zygote.fork_run(
                    limits,
                    self.template.policy,
                    env,
                    file_name,
                    code,
                )?;
                run.keep_alive(generation.clone());
                Ok((run, generation.zygote.kind()))
            },
        )
    }

    fn current(&self, kind: ZygoteKind) -> Option<Arc<Generation>> {
        match &self.supervisor(kind).state.lock().state {
            ZygoteState::Up(g) => Some(g.clone()),
            ZygoteState::Down { .. } => None,
        }
    }

    /// The live `kind` zygote, waiting for a replacement until `deadline`.
    fn wait_for_zygote(
        &self,
        kind: ZygoteKind,
        deadline: Instant,
    ) -> Result<Arc<Generation>, KernelError> {
        let supervisor = self.supervisor(kind);
        let mut s = supervisor.state.lock();
        loop {
            if let ZygoteState::Up(g) = &s.state {
                return Ok(g.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(s.unavailable());
            }
            supervisor.up.wait_for(&mut s, left);
        }
    }

    /// Looks whether `generation`'s zygote is alive, marking it down when it is not.
    fn check(&self, generation: &Arc<Generation>) -> bool {
        let alive = generation.zygote.is_alive();
        if !alive {
            self.mark_down(generation);
        }
        alive
    }

    /// After a failed fork: whether the cause is that `generation`'s zygote died (it is then
    /// marked down, if nobody did already).
    fn died(&self, generation: &Arc<Generation>) -> bool {
        let deadline = Instant::now() + DEATH_GRACE;
        loop {
            let current = self.current(generation.zygote.kind());
            if !current.is_some_and(|c| Arc::ptr_eq(&c, generation)) {
                return true;
            }
            if !self.check(generation) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Records that `generation`'s zygote is dead and wakes the refill thread to replace it.
    fn mark_down(&self, generation: &Arc<Generation>) {
        let kind = generation.zygote.kind();
        let mut s = self.supervisor(kind).state.lock();
        if !matches!(&s.state, ZygoteState::Up(g) if Arc::ptr_eq(g, generation)) {
            return;
        }
        let uptime = generation.started.elapsed();
        s.failures = if uptime >= STABLE_UPTIME {
            0
        } else {
            s.failures.saturating_add(1)
        };
        let delay = backoff(s.failures);
        let old = std::mem::replace(
            &mut s.state,
            ZygoteState::Down {
                next_attempt: Instant::now() + delay,
                starting: false,
            },
        );
        s.last_error = Some(format!("it died after {} s", uptime.as_secs()));
        drop(s);
        // Its sandbox is torn down (its init killed and reaped) when the last session forked
        // from it, or the last fork in flight, lets go of it.
        drop(old);
        eprintln!(
            "corral: warm pool: the {} zygote died after {uptime:.1?}; a new one starts in \
             {delay:?}",
            kind.name()
        );
        self.zygote_down.store(true, Ordering::SeqCst);
        drop(self.ready.lock());
        self.wanted.notify_all();
    }

    /// The refill thread's turn at the `kind` zygote: the live one, or, while it is down, a
    /// new one started now if its time has come; `Err` with how long until the next attempt.
    fn supervise(&self, kind: ZygoteKind) -> Result<Arc<Generation>, Duration> {
        if let Some(g) = self.current(kind) {
            if self.check(&g) {
                return Ok(g);
            }
        }
        let supervisor = self.supervisor(kind);
        {
            let mut s = supervisor.state.lock();
            match s.state {
                ZygoteState::Up(ref g) => return Ok(g.clone()),
                ZygoteState::Down { next_attempt, .. } => {
                    let wait = next_attempt.saturating_duration_since(Instant::now());
                    if !wait.is_zero() {
                        return Err(wait);
                    }
                    s.state = ZygoteState::Down {
                        next_attempt,
                        starting: true,
                    };
                }
            }
        }
        let t = &self.template;
        let started = Zygote::start(&t.rootfs, &t.image_env, t.policy, kind);
        let mut s = supervisor.state.lock();
        match started {
            Ok(zygote) => {
                let g = Arc::new(Generation {
                    zygote,
                    started: Instant::now(),
                });
                s.state = ZygoteState::Up(g.clone());
                s.restarts += 1;
                s.last_error = None;
                eprintln!(
                    "corral: warm pool: a new {} zygote is up (restart {})",
                    kind.name(),
                    s.restarts
                );
                supervisor.up.notify_all();
                Ok(g)
            }
            Err(e) => {
                s.failures = s.failures.saturating_add(1);
                let delay = backoff(s.failures);
                s.state = ZygoteState::Down {
                    next_attempt: Instant::now() + delay,
                    starting: false,
                };
                s.last_error = Some(format!("its replacement did not start: {e}"));
                eprintln!(
                    "corral: warm pool: a new {} zygote did not start ({e}); next try in \
                     {delay:?}",
                    kind.name()
                );
                Err(delay)
            }
        }
    }

    /// Drops the ready sessions whose kernel is gone.
    fn prune(&self) {
        let dead: Vec<Session> = {
            let mut ready = self.ready.lock();
            let mut dead = Vec::new();
            let mut alive = VecDeque::with_capacity(ready.len());
            for session in ready.drain(..) {
                if session.probe_alive() {
                    alive.push_back(session);
                } else {
                    dead.push(session);
                }
            }
            *ready = alive;
            dead
        };
        drop(dead);
    }
}

/// A session forked from `generation`'s zygote, holding the generation.
fn fork_from(
    generation: &Arc<Generation>,
    options: &SessionOptions,
) -> Result<Session, KernelError> {
    let mut session = generation.zygote.fork_session(options)?;
    session.keep_alive(generation.clone());
    Ok(session)
}

fn refill(pool: Weak<Pool>) {
    loop {
        let Some(pool) = pool.upgrade() else {
            return;
        };
        if pool.closed.load(Ordering::SeqCst) {
            return;
        }
        {
            let mut ready = pool.ready.lock();
            pool.wanted.wait_while_for(
                &mut ready,
                |r| {
                    r.len() >= pool.target
                        && !pool.zygote_down.load(Ordering::SeqCst)
                        && !pool.closed.load(Ordering::SeqCst)
                },
                CHECK_EVERY,
            );
        }
        pool.zygote_down.store(false, Ordering::SeqCst);
        pool.prune();
        // The lean zygote is replaced when its time has come; nothing here waits for it.
        let _ = pool.supervise(ZygoteKind::Lean);
        let generation = match pool.supervise(ZygoteKind::Full) {
            Ok(g) => g,
            Err(wait) => {
                drop(pool);
                thread::sleep(wait.min(CHECK_EVERY));
                continue;
            }
        };
        let missing = pool.target.saturating_sub(pool.ready_count());
        for _ in 0..missing {
            if pool.closed.load(Ordering::SeqCst) {
                break;
            }
            let quiet_for = pool.last_acquired.lock().elapsed();
            if quiet_for < REFILL_QUIET {
                thread::sleep(REFILL_QUIET - quiet_for);
                break;
            }
            match fork_from(&generation, &pool.template) {
                Ok(mut session) => {
                    session.warm_up();
                    if session.is_alive() {
                        pool.ready.lock().push_back(session);
                    }
                }
                // Replaced on the next turn.
                Err(_) if pool.died(&generation) => break,
                Err(e) => {
                    eprintln!("corral: warm pool: {e}");
                    thread::sleep(Duration::from_secs(1));
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_half_a_second_to_thirty() {
        let waits: Vec<u64> = (0..10).map(|n| backoff(n).as_millis() as u64).collect();
        assert_eq!(
            waits,
            [0, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        assert_eq!(backoff(u32::MAX), BACKOFF_MAX);
    }

    /// A pool whose zygotes are down, without a refill thread to replace them.
    fn down_pool(next_attempt: Instant, starting: bool) -> Pool {
        let down = || Supervisor {
            state: Mutex::new(Supervision {
                state: ZygoteState::Down {
                    next_attempt,
                    starting,
                },
                restarts: 2,
                failures: 3,
                last_error: Some("it died after 4 s".into()),
            }),
            up: Condvar::new(),
        };
        Pool {
            zygotes: [down(), down()],
            zygote_down: AtomicBool::new(false),
            template: SessionOptions::new(Language::Python),
            target: 0,
            ready: Mutex::new(VecDeque::new()),
            wanted: Condvar::new(),
            last_acquired: Mutex::new(Instant::now()),
            closed: AtomicBool::new(false),
            refill_thread: Mutex::new(None),
        }
    }

    #[test]
    fn while_the_zygote_is_down_a_creation_waits_then_fails_temporarily() {
        let pool = down_pool(Instant::now() + Duration::from_secs(5), false);
        assert_eq!(
            pool.zygote_status(ZygoteKind::Full),
            ZygoteStatus {
                alive: false,
                restarts: 2,
                last_error: Some("it died after 4 s".into()),
            }
        );
        let t = Instant::now();
        let e = pool
            .wait_for_zygote(ZygoteKind::Full, t + Duration::from_millis(200))
            .unwrap_err();
        assert!(t.elapsed() >= Duration::from_millis(200));
        match e {
            KernelError::ZygoteUnavailable {
                reason,
                retry_after,
            } => {
                assert_eq!(reason, "it died after 4 s");
                // The next start is due in under 5 s, and takes a while itself.
                assert_eq!(retry_after, Duration::from_secs(7));
            }
            other => panic!("{other:?}"),
        }
        let starting = down_pool(Instant::now(), true);
        assert!(matches!(
            starting.wait_for_zygote(ZygoteKind::Lean, Instant::now()),
            Err(KernelError::ZygoteUnavailable { retry_after, .. })
                if retry_after == RETRY_WHILE_STARTING
        ));
    }
}
