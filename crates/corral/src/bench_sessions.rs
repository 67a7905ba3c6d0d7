//! `corral bench --only sessions|density`: session creation, warm execution and memory
//! density (docs/benchmarks.md, promises 2 to 4), each against a baseline measured in the same run.

use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use corral_kernel::{Language, Pool, Session, SessionOptions, Zygote, ZygoteKind};
use corral_sandbox::Status;

use crate::bench::summarize;

/// Enough pre-forked sessions to absorb a burst of 50 creations.
const POOL_TARGET: usize = 64;
const IPYKERNEL_SCRIPT: &str = include_str!("bench/ipykernel_baseline.py");

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn options(image: &str, data_dir: Option<&Path>) -> Result<SessionOptions> {
    let store = corral_image::Store::open(data_dir);
    let resolved = store
        .resolve(image)
        .with_context(|| format!("image {image} (build it with `corral image build {image}`)"))?;
    let mut o = SessionOptions::new(Language::Python);
    o.rootfs = resolved.rootfs;
    o.image_env = resolved.env;
    Ok(o)
}

/// Creates a session from `pool` and waits for the result of `print(1)`.
fn create_and_print(pool: &Pool, options: &SessionOptions) -> Result<(Duration, Session)> {
    let (split, s) = create_and_print_split(pool, options)?;
    Ok((split.acquire + split.execute, s))
}

/// Where one creation's time went: taking the session from the pool (`acquire`: pop, probe,
/// adopt), then its first execution (`execute`), with the CPU time the session's cgroup
/// charged for that execution (`kernel_cpu`, `None` without a cgroup) and the calling
/// thread's own CPU time for both (`host_cpu`). CPU times do not depend on the machine's
/// load the way wall-clock times do.
struct Split {
    acquire: Duration,
    execute: Duration,
    kernel_cpu: Option<Duration>,
    host_cpu: Duration,
}

/// The CPU time the calling thread has used so far.
fn thread_cpu() -> Duration {
    match nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_THREAD) {
        Ok(u) => {
            let tv = |t: nix::sys::time::TimeVal| {
                Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000)
            };
            tv(u.user_time()) + tv(u.system_time())
        }
        Err(_) => Duration::ZERO,
    }
}

/// [`create_and_print`], timed phase by phase.
fn create_and_print_split(pool: &Pool, options: &SessionOptions) -> Result<(Split, Session)> {
    let host_before = thread_cpu();
    let t = Instant::now();
    let mut s = pool.acquire(options)?;
    let acquire = t.elapsed();
    let meter = s.meter();
    let cpu_before = meter.as_ref().and_then(|m| m.cpu_time());
    let t = Instant::now();
    let r = s.execute("print(1)", Duration::from_secs(30), &mut |_| {});
    let execute = t.elapsed();
    let host_cpu = thread_cpu().saturating_sub(host_before);
    let kernel_cpu = cpu_before
        .zip(meter.as_ref().and_then(|m| m.cpu_time()))
        .map(|(a, b)| b.saturating_sub(a));
    if r.stdout != "1\n" {
        bail!("print(1) gave {r:?}");
    }
    let split = Split {
        acquire,
        execute,
        kernel_cpu,
        host_cpu,
    };
    Ok((split, s))
}

/// Three bursts of 50 concurrent creations from a full pool. With `keep`, the 50 sessions
/// live until the burst is over (as a client's would); without, each is closed as soon as
/// its result is in, so the burst also pays for tearing the first ones down.
fn bursts(pool: &Arc<Pool>, options: &SessionOptions, keep: bool) -> Result<Vec<Duration>> {
    let mut times = Vec::new();
    for _ in 0..3 {
        wait_for_pool(pool);
        let barrier = Arc::new(Barrier::new(50));
        let handles: Vec<_> = (0..50)
            .map(|_| {
                let (pool, options, barrier) = (pool.clone(), options.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    let (t, session) = create_and_print(&pool, &options)?;
                    Ok((t, keep.then_some(session)))
                })
            })
            .collect();
        let mut kept = Vec::new();
        for h in handles {
            let got: Result<(Duration, Option<Session>)> = h.join().expect("bench thread");
            let (t, session) = got?;
            times.push(t);
            kept.extend(session);
        }
        drop(kept);
    }
    Ok(times)
}

fn p99(times: &[Duration]) -> Duration {
    let mut v = times.to_vec();
    v.sort();
    v[((v.len() - 1) as f64 * 0.99).round() as usize]
}

fn wait_for_pool(pool: &Pool) {
    let until = Instant::now() + Duration::from_secs(60);
    while pool.ready_count() < POOL_TARGET && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `code` as a one-shot in the image and returns its stdout.
fn oneshot_stdout(image: &str, data_dir: Option<&Path>, code: &str) -> Result<(String, Duration)> {
    let me = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(me);
    cmd.args([
        "run",
        "--image",
        image,
        "--json",
        "--timeout",
        "300",
        "--memory",
        "2G",
        "-c",
        code,
    ]);
    if let Some(d) = data_dir {
        cmd.arg("--data-dir").arg(d);
    }
    let t = Instant::now();
    let out = cmd.output()?;
    let elapsed = t.elapsed();
    let result: corral_sandbox::ExecutionResult = serde_json::from_slice(&out.stdout)
        .with_context(|| String::from_utf8_lossy(&out.stderr).into_owned())?;
    if result.status != Status::Success {
        bail!(
            "{code:?} failed: {:?} {}",
            result.error_message,
            result.stderr
        );
    }
    Ok((result.stdout, elapsed))
}

pub fn sessions(image: &str, data_dir: Option<&Path>) -> Result<()> {
    let options = options(image, data_dir)?;
    println!("\nsessions on image `{image}`");

    // Baselines, measured now: a cold interpreter importing the data stack, and an ipykernel
    // started and driven in the same kind of sandbox.
    let mut cold = Vec::new();
    for _ in 0..5 {
        let (_, t) = oneshot_stdout(image, data_dir, "import pandas, matplotlib.pyplot")?;
        cold.push(t);
    }
    let cold = summarize(cold);
    let ipy = oneshot_stdout(image, data_dir, IPYKERNEL_SCRIPT).map(|(out, _)| out);
    let ipy: Option<serde_json::Value> = match ipy {
        Ok(out) => serde_json::from_str(out.trim()).ok(),
        Err(e) => {
            eprintln!("bench: the ipykernel baseline could not run ({e:#}); install python3-ipykernel and python3-jupyter-client in the image");
            None
        }
    };

    let pool = Pool::start(
        options.rootfs.clone(),
        options.image_env.clone(),
        options.policy,
        options.limits,
        POOL_TARGET,
    )?;
    println!("  zygote preloaded: {}", pool.preloaded().join(", "));
    wait_for_pool(&pool);

    // One at a time, the pool refilled in between.
    let mut single = Vec::new();
    let (mut acquires, mut executes, mut kernel_cpus, mut host_cpus) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..30 {
        let (split, session) = create_and_print_split(&pool, &options)?;
        drop(session);
        single.push(split.acquire + split.execute);
        acquires.push(split.acquire);
        executes.push(split.execute);
        kernel_cpus.extend(split.kernel_cpu);
        host_cpus.push(split.host_cpu);
        wait_for_pool(&pool);
    }
    // The control: a session's second `print(1)`, after the pool refilled (so with nothing of
    // the pool running beside it), against its first one above. Equal times say that the
    // first execution pays nothing of its own (an idle process waking up costs both).
    let mut second = Vec::new();
    for _ in 0..30 {
        let (_, mut session) = create_and_print_split(&pool, &options)?;
        wait_for_pool(&pool);
        let t = Instant::now();
        let r = session.execute("print(1)", Duration::from_secs(30), &mut |_| {});
        second.push(t.elapsed());
        if r.stdout != "1\n" {
            bail!("print(1) gave {r:?}");
        }
        drop(session);
        wait_for_pool(&pool);
    }
    let burst = bursts(&pool, &options, false)?;
    let burst_kept = bursts(&pool, &options, true)?;
    // Straight from the zygote, without the pool.
    let mut forked = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let mut s = pool.fork_session(&options)?;
        s.execute("print(1)", Duration::from_secs(30), &mut |_| {});
        forked.push(t.elapsed());
    }
    // Sessions whose kernel runs in a sandbox of its own (JavaScript and bash are never
    // forked), with their process agent: create -> the first result.
    let mut own = Vec::new();
    for (language, code, expected) in [
        (Language::Javascript, "console.log(1)", "1\n"),
        (Language::Bash, "echo 1", "1\n"),
    ] {
        let options = SessionOptions {
            language,
            ..options.clone()
        };
        let mut times = Vec::new();
        for _ in 0..20 {
            let t = Instant::now();
            let mut s = Session::create(&options)?;
            let r = s.execute(code, Duration::from_secs(30), &mut |_| {});
            times.push(t.elapsed());
            if r.stdout != expected {
                bail!("{code} gave {r:?}");
            }
        }
        own.push((language.name(), summarize(times)));
    }
    // Warm execution round trips.
    let mut session = pool.acquire(&options)?;
    let mut warm = Vec::new();
    for _ in 0..300 {
        let t = Instant::now();
        let r = session.execute("1+1", Duration::from_secs(10), &mut |_| {});
        warm.push(t.elapsed());
        if r.results.first().and_then(|x| x.text.as_deref()) != Some("2") {
            bail!("1+1 gave {r:?}");
        }
    }
    // Pause and resume of a session holding a 200 MB DataFrame (the cgroup freezer).
    let r = session.execute(
        "import numpy as np, pandas as pd\n\
         df = pd.DataFrame(np.random.default_rng(1).random((200 << 20) // 8 // 4 * 4).reshape(-1, 4))\n\
         print(df.memory_usage().sum() >> 20)",
        Duration::from_secs(60),
        &mut |_| {},
    );
    if r.stdout.trim() != "200" {
        bail!("the 200 MB DataFrame was not made: {r:?}");
    }
    let (mut pauses, mut resumes) = (Vec::new(), Vec::new());
    for _ in 0..30 {
        let t = Instant::now();
        session.pause()?;
        pauses.push(t.elapsed());
        let t = Instant::now();
        session.resume()?;
        resumes.push(t.elapsed());
    }
    let r = session.execute("print(df.shape)", Duration::from_secs(10), &mut |_| {});
    if r.stdout.trim() != "(6553600, 4)" {
        bail!("the DataFrame did not survive the pauses: {r:?}");
    }
    let (pauses, resumes) = (summarize(pauses), summarize(resumes));
    let (burst_p99, kept_p99) = (p99(&burst), p99(&burst_kept));
    let (single, burst, burst_kept, forked, warm) = (
        summarize(single),
        summarize(burst),
        summarize(burst_kept),
        summarize(forked),
        summarize(warm),
    );
    println!("  {:58} {:>9} {:>9}", "", "p50 ms", "p95 ms");
    println!(
        "  {:58} {:>9.1} {:>9.1}",
        "cold `import pandas, matplotlib.pyplot` (one-shot run)",
        ms(cold.p50),
        ms(cold.p95)
    );
    if let Some(ipy) = &ipy {
        println!(
            "  {:58} {:>9.1}",
            "ipykernel start -> first print(1) result (same sandbox)",
            ipy["start_ms"].as_f64().unwrap_or(0.0)
        );
    }
    println!(
        "  {:58} {:>9.2} {:>9.2}",
        "corral session create -> print(1) result, 1 at a time",
        ms(single.p50),
        ms(single.p95)
    );
    for (what, times) in [
        (
            "  of which taking it from the pool (pop, probe, adopt)",
            acquires,
        ),
        ("  of which its first execution", executes),
        ("  CPU of that execution, the session's cgroup", kernel_cpus),
        ("  CPU of the creation, the creating thread", host_cpus),
        (
            "  the same session's second print(1), pool refilled",
            second,
        ),
    ] {
        if times.is_empty() {
            continue;
        }
        let times = summarize(times);
        println!(
            "  {:58} {:>9.3} {:>9.3}",
            what,
            ms(times.p50),
            ms(times.p95)
        );
    }
    println!(
        "  {:58} {:>9.2} {:>9.2}  p99 {:.2}",
        "corral session create -> print(1) result, 50 concurrent",
        ms(burst.p50),
        ms(burst.p95),
        ms(burst_p99)
    );
    println!(
        "  {:58} {:>9.2} {:>9.2}  p99 {:.2}",
        "  the same, each session kept until the burst is over",
        ms(burst_kept.p50),
        ms(burst_kept.p95),
        ms(kept_p99)
    );
    println!(
        "  {:58} {:>9.2} {:>9.2}",
        "corral session forked from the zygote (no pool)",
        ms(forked.p50),
        ms(forked.p95)
    );
    for (language, times) in &own {
        println!(
            "  {:58} {:>9.2} {:>9.2}",
            format!("{language} session, own sandbox: create -> first result"),
            ms(times.p50),
            ms(times.p95)
        );
    }
    println!(
        "  {:58} {:>9.3} {:>9.3}",
        "corral warm `1+1` round trip (library)",
        ms(warm.p50),
        ms(warm.p95)
    );
    println!(
        "  {:58} {:>9.3} {:>9.3}",
        "pause, a session holding a 200 MB DataFrame",
        ms(pauses.p50),
        ms(pauses.p95)
    );
    println!(
        "  {:58} {:>9.3} {:>9.3}",
        "resume, the same",
        ms(resumes.p50),
        ms(resumes.p95)
    );
    if let Some(trips) = ipy.as_ref().and_then(|v| v["round_trips_ms"].as_array()) {
        let trips: Vec<Duration> = trips
            .iter()
            .filter_map(|t| t.as_f64())
            .map(|t| Duration::from_secs_f64(t / 1e3))
            .collect();
        let ipy_trip = summarize(trips);
        println!(
            "  {:58} {:>9.3} {:>9.3}",
            "ipykernel execute_request `1+1` round trip",
            ms(ipy_trip.p50),
            ms(ipy_trip.p95)
        );
        println!(
            "  warm exec / ipykernel: p50 {:.3}x",
            ms(warm.p50) / ms(ipy_trip.p50)
        );
    }
    println!(
        "  create / cold import: p50 {:.3}x;  goals: p50 <= 10 ms, p99 <= 30 ms at 50 concurrent (required 50 / 150); warm exec p50 <= 2 ms; pause and resume <= 50 ms each",
        ms(single.p50) / ms(cold.p50)
    );
    Ok(())
}

/// Proportional set size (kB) of every process whose command line mentions `needle`.
fn pss_of(needle: &str) -> (u64, u64, usize) {
    let (mut pss, mut rss, mut count) = (0, 0, 0);
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let path = entry.path();
        let cmdline = std::fs::read(path.join("cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmdline).contains(needle) {
            continue;
        }
        let Ok(rollup) = std::fs::read_to_string(path.join("smaps_rollup")) else {
            continue;
        };
        let field = |name: &str| {
            rollup
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        pss += field("Pss:");
        rss += field("Rss:");
        count += 1;
    }
    (pss, rss, count)
}

pub fn density(image: &str, data_dir: Option<&Path>, n: usize) -> Result<()> {
    let options = options(image, data_dir)?;
    println!("\ndensity: {n} idle sessions with pandas imported, image `{image}`");
    let zygote = Zygote::start(
        &options.rootfs,
        &options.image_env,
        options.policy,
        ZygoteKind::Full,
    )?;
    if !zygote.preloaded.iter().any(|m| m == "pandas") {
        bail!("the image has no pandas to import");
    }
    let (base_pss, _, _) = pss_of("corral_zygote.py");
    let t = Instant::now();
    let mut sessions: Vec<Session> = Vec::with_capacity(n);
    for _ in 0..n {
        let mut s = zygote.fork_session(&options)?;
        // Each session really uses pandas once, as an agent's first cell would.
        let r = s.execute(
            "import pandas as pd\ndf = pd.DataFrame({'a': range(10)})\nlen(df)",
            Duration::from_secs(30),
            &mut |_| {},
        );
        if r.status != Status::Success {
            bail!("session setup failed: {r:?}");
        }
        sessions.push(s);
    }
    let created = t.elapsed();
    std::thread::sleep(Duration::from_secs(2));
    let (pss, rss, procs) = pss_of("corral_zygote.py");
    let total = pss.saturating_sub(base_pss);
    println!(
        "  created {n} sessions in {:.1} s ({procs} processes incl. the zygote)",
        created.as_secs_f64()
    );
    println!(
        "  total PSS {:.1} MiB, {:.2} MiB per session (RSS sum would claim {:.1} MiB); goal <= 8 MiB per session",
        total as f64 / 1024.0,
        total as f64 / 1024.0 / n as f64,
        rss as f64 / 1024.0
    );
    drop(sessions);
    // The pool's second zygote, which serves one-shot runs that do not use the data stack.
    let lean = Zygote::start(
        &options.rootfs,
        &options.image_env,
        options.policy,
        ZygoteKind::Lean,
    )?;
    std::thread::sleep(Duration::from_secs(1));
    let (lean_pss, lean_rss, _) = pss_of("corral_zygote.py\0lean");
    println!(
        "  the zygotes alone: full {:.1} MiB PSS, lean (one-shot runs) {:.1} MiB PSS ({:.1} MiB RSS)",
        base_pss as f64 / 1024.0,
        lean_pss as f64 / 1024.0,
        lean_rss as f64 / 1024.0
    );
    drop(lean);
    Ok(())
}
