//! What the engine's integration tests share: the zygote, sessions made every way, a warm
//! pool, and running a cell. Each test file is a crate of its own that declares `mod support;`
//! and uses part of this module, so the rest is unused in that crate (hence the `allow`).
#![allow(dead_code)]

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use corral_kernel::{Language, Pool, Session, SessionOptions, Zygote, ZygoteKind};
use corral_sandbox::{ExecutionResult, Rootfs};

pub const SECOND: Duration = Duration::from_secs(1);

/// The zygote of this test binary (host image), started by the first test that needs it.
pub fn zygote() -> &'static Zygote {
    static ZYGOTE: OnceLock<Zygote> = OnceLock::new();
    ZYGOTE.get_or_init(|| {
        Zygote::start(&Rootfs::Host, &[], Default::default(), ZygoteKind::Full)
            .expect("the zygote starts")
    })
}

/// Both ways a Python session is made.
pub fn python_sessions() -> Vec<(&'static str, Session)> {
    python_sessions_with(&SessionOptions::new(Language::Python))
}

/// Both ways a Python session is made, with `options`.
pub fn python_sessions_with(options: &SessionOptions) -> Vec<(&'static str, Session)> {
    vec![
        (
            "direct",
            Session::create(options).expect("a direct session starts"),
        ),
        (
            "zygote",
            zygote()
                .fork_session(options)
                .expect("a forked session starts"),
        ),
    ]
}

/// A warm pool (host image) of `size` sessions, once all of them are ready.
pub fn full_pool(size: usize) -> Arc<Pool> {
    let pool = Pool::start(
        Rootfs::Host,
        Vec::new(),
        Default::default(),
        Default::default(),
        size,
    )
    .expect("the pool starts");
    let deadline = Instant::now() + 60 * SECOND;
    while pool.ready_count() < size {
        assert!(Instant::now() < deadline, "the pool did not fill");
        std::thread::sleep(Duration::from_millis(20));
    }
    pool
}

/// One cell, with 20 s to run.
pub fn run(session: &mut Session, code: &str) -> ExecutionResult {
    session.execute(code, 20 * SECOND, &mut |_| {})
}

pub fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}
