//! `corral bench --only soak`: the soak of docs/benchmarks.md. It starts `corral serve` on
//! loopback with three tenants (two well-behaved keys, one hostile key) and runs many clients
//! for a long time, mixing sessions, uploads, downloads and one-shot runs with hostile work:
//! output floods, rich-result floods, memory and fork bombs, uploads over the disk limit,
//! requests for another tenant's sandboxes, malformed bodies and streams abandoned halfway.
//!
//! It fails (non-zero exit) when a well-behaved client saw an error, when a hostile request
//! was answered other than its documented refusal, when the server's memory grew under the
//! load, or when sandboxes or cgroups were left behind. Bounded in clients and time; loopback
//! only. Well-behaved clients honour `Retry-After` on 429/503, as the API asks of clients.

use parking_lot::Mutex;
use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::bench::BenchArgs;
use crate::bench_server::{metric, percentile, rss_mib, start_server};

/// How long a well-behaved request keeps retrying 429/503 answers before it counts as failed.
const RETRY_FOR: Duration = Duration::from_secs(60);
/// The server's RSS under the soak stays below this: the rich results it may hold at once
/// (`max_result_bytes_in_flight`, 256 MiB by default) and 64 MiB for everything else.
const RSS_CEILING_MIB: f64 = 320.0;
/// Every client numbers its cycles apart from the others: it starts at its own index and steps
/// by more than there are clients.
const CYCLE_STRIDE: u64 = 1009;
/// Bytes each well-behaved session uploads and reads back.
const UPLOAD_BYTES: usize = 256 << 10;

/// The tenants' keys, the server's address and the well-behaved sessions alive now (which the
/// hostile tenant tries to reach).
struct Ctx {
    url: String,
    good: [String; 2],
    evil: String,
    live_good: Mutex<Vec<String>>,
}

/// What one client kind counts.
#[derive(Default)]
struct Tally {
    cycles: AtomicU64,
    errors: AtomicU64,
    retries: AtomicU64,
    first_errors: Mutex<Vec<String>>,
    latencies: Mutex<Vec<Duration>>,
}

impl Tally {
    fn failed(&self, e: anyhow::Error) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_errors.lock();
        if first.len() < 5 {
            first.push(format!("{e:#}"));
        }
    }
}

/// A request's answer: status and body (JSON when it parses, else the text as a string).
struct Answer {
    status: u16,
    body: Value,
}

fn request(
    agent: &ureq::Agent,
    method: &str,
    url: &str,
    key: &str,
    body: Option<&[u8]>,
) -> Result<Answer> {
    let req = agent
        .request(method, url)
        .set("Authorization", &format!("Bearer {key}"))
        .set("Accept", "application/json");
    let result = match body {
        Some(b) => req.send_bytes(b),
        None => req.call(),
    };
    let response = match result {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => bail!("{method} {url}: {e}"),
    };
    let status = response.status();
    let mut bytes = Vec::new();
    response
        .into_reader()
        .take(64 << 20)
        .read_to_end(&mut bytes)
        .with_context(|| format!("{method} {url}: reading the answer"))?;
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    Ok(Answer { status, body })
}

/// A well-behaved request: retried on 429/503 for as long as `Retry-After` asks, up to
/// [`RETRY_FOR`]; any other status than `expect` is an error.
fn polite(
    tally: &Tally,
    agent: &ureq::Agent,
    method: &str,
    url: &str,
    key: &str,
    body: Option<&[u8]>,
    expect: u16,
) -> Result<Value> {
    let give_up = Instant::now() + RETRY_FOR;
    loop {
        let a = request(agent, method, url, key, body)?;
        if a.status == expect {
            return Ok(a.body);
        }
        if matches!(a.status, 429 | 503) && Instant::now() < give_up {
            tally.retries.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(250));
            continue;
        }
        bail!("{method} {url}: status {} {}", a.status, a.body);
    }
}

fn json_bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).expect("JSON serializes")
}

/// Create a session, execute, upload a file, read it from code and back over the API, kill.
fn good_session(ctx: &Ctx, tally: &Tally, agent: &ureq::Agent, n: u64) -> Result<()> {
    let key = &ctx.good[(n % 2) as usize];
    let url = &ctx.url;
    let info = polite(
        tally,
        agent,
        "POST",
        &format!("{url}/v1/sandboxes"),
        key,
        Some(b"{}"),
        201,
    )?;
    let id = info["id"].as_str().context("no id")?.to_string();
    ctx.live_good.lock().push(id.clone());
    let outcome = (|| -> Result<()> {
        let exec = |code: &str| -> Result<Value> {
            let r = polite(
                tally,
                agent,
                "POST",
                &format!("{url}/v1/sandboxes/{id}/execute"),
                key,
                Some(&json_bytes(&json!({ "code": code }))),
                200,
            )?;
            if r["status"] != "success" {
                bail!("`{code}` ended {}: {}", r["status"], r["error_message"]);
            }
            Ok(r)
        };
        exec("x = 41")?;
        let data: Vec<u8> = (0..UPLOAD_BYTES)
            .map(|i| (i * 7 + n as usize) as u8)
            .collect();
        polite(
            tally,
            agent,
            "PUT",
            &format!("{url}/v1/sandboxes/{id}/files/in/data.bin"),
            key,
            Some(&data),
            201,
        )?;
        let r = exec("print(len(open('in/data.bin','rb').read()), x + 1)")?;
        if r["stdout"] != format!("{UPLOAD_BYTES} 42\n") {
            bail!("reading the upload gave {}", r["stdout"]);
        }
        let back = request(
            agent,
            "GET",
            &format!("{url}/v1/sandboxes/{id}/files/in/data.bin"),
            key,
            None,
        )?;
        // The body of a file download is the raw bytes: compare through the lossy text.
        if back.status != 200 || back.body != Value::String(String::from_utf8_lossy(&data).into()) {
            bail!("downloading the upload: status {}", back.status);
        }
        Ok(())
    })();
    ctx.live_good.lock().retain(|x| x != &id);
    close(agent, url, key, &id, outcome, &[204])
}

/// Deletes session `id` whatever `outcome` the cycle had, then reports the outcome, or a
/// DELETE answered other than `expect`.
fn close(
    agent: &ureq::Agent,
    url: &str,
    key: &str,
    id: &str,
    outcome: Result<()>,
    expect: &[u16],
) -> Result<()> {
    let killed = request(
        agent,
        "DELETE",
        &format!("{url}/v1/sandboxes/{id}"),
        key,
        None,
    )?;
    outcome?;
    if !expect.contains(&killed.status) {
        bail!("DELETE {id}: status {}", killed.status);
    }
    Ok(())
}

/// A one-shot run with a file in and a computed answer out.
fn good_run(ctx: &Ctx, tally: &Tally, agent: &ureq::Agent, n: u64) -> Result<()> {
    let key = &ctx.good[(n % 2) as usize];
    let body = json!({
        "code": "print(sum(range(100)), open('n.txt').read())",
        "files": [{"path": "n.txt", "content": n.to_string()}],
    });
    let r = polite(
        tally,
        agent,
        "POST",
        &format!("{}/v1/run", ctx.url),
        key,
        Some(&json_bytes(&body)),
        200,
    )?;
    if r["status"] != "success" || r["stdout"] != format!("4950 {n}\n") {
        bail!("run gave {} {}", r["status"], r["stdout"]);
    }
    Ok(())
}

/// Hostile one-shot runs, each of which must end with its documented status.
fn evil_run(ctx: &Ctx, _tally: &Tally, agent: &ureq::Agent, n: u64) -> Result<()> {
    let kind = n % 4;
    let (code, limits, expect): (&str, Value, &[&str]) = match kind {
        0 => (
            "import sys\nwhile True: sys.stdout.write('x' * 65536)",
            json!({"timeout_s": 2}),
            &["timeout"],
        ),
        1 => (
            "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass",
            json!({"timeout_s": 2, "pids": 16}),
            &["timeout", "error"],
        ),
        2 => (
            "b = []\nwhile True: b.append(bytearray(1 << 20))",
            json!({"timeout_s": 10, "memory_mb": 64}),
            &["memory_limit"],
        ),
        _ => (
            "import time; time.sleep(60)",
            json!({"timeout_s": 1}),
            &["timeout"],
        ),
    };
    let a = request(
        agent,
        "POST",
        &format!("{}/v1/run", ctx.url),
        &ctx.evil,
        Some(&json_bytes(&json!({"code": code, "limits": limits}))),
    )?;
    match a.status {
        200 if expect.iter().any(|s| a.body["status"] == *s) => {
            if kind == 0 && a.body["stdout_truncated"] != true {
                bail!("an output flood was not truncated");
            }
            Ok(())
        }
        // Admission may refuse the hostile tenant when it holds its share: that is the point.
        429 | 503 => Ok(()),
        s => bail!("hostile run {kind}: status {s} {}", a.body),
    }
}

/// Hostile sessions: uploads over the disk limit, rich-result floods, a memory bomb.
fn evil_session(ctx: &Ctx, _tally: &Tally, agent: &ureq::Agent, n: u64) -> Result<()> {
    let url = &ctx.url;
    let key = &ctx.evil;
    let body = json!({"limits": {"memory_mb": 96, "disk_mb": 8, "timeout_s": 10}});
    let a = request(
        agent,
        "POST",
        &format!("{url}/v1/sandboxes"),
        key,
        Some(&json_bytes(&body)),
    )?;
    if matches!(a.status, 429 | 503) {
        // Refused past its shares: it tries again soon, as a persistent attacker would.
        std::thread::sleep(Duration::from_millis(100));
        return Ok(());
    }
    if a.status != 201 {
        bail!("hostile create: status {} {}", a.status, a.body);
    }
    let id = a.body["id"].as_str().context("no id")?.to_string();
    let outcome = (|| -> Result<()> {
        match n % 3 {
            0 => {
                // 12 MiB into an 8 MiB workspace: refused, nothing kept.
                let big = vec![7u8; 12 << 20];
                let up = request(
                    agent,
                    "PUT",
                    &format!("{url}/v1/sandboxes/{id}/files/big.bin"),
                    key,
                    Some(&big),
                )?;
                if !matches!(up.status, 413 | 507) {
                    bail!(
                        "an upload over the disk limit answered {} {}",
                        up.status,
                        up.body
                    );
                }
            }
            1 => {
                let flood = "from IPython.display import display, HTML\n\
                             for i in range(400): display(HTML('x' * (1 << 20)))";
                let r = request(
                    agent,
                    "POST",
                    &format!("{url}/v1/sandboxes/{id}/execute"),
                    key,
                    Some(&json_bytes(&json!({ "code": flood }))),
                )?;
                if r.status != 200 {
                    bail!("a result flood answered {} {}", r.status, r.body);
                }
                let kept = r.body["results"].as_array().map_or(0, Vec::len);
                if kept >= 400 {
                    bail!("a result flood kept all {kept} results");
                }
            }
            _ => {
                let r = request(
                    agent,
                    "POST",
                    &format!("{url}/v1/sandboxes/{id}/execute"),
                    key,
                    Some(&json_bytes(
                        &json!({"code": "b = []\nwhile True: b.append(bytearray(1 << 20))"}),
                    )),
                )?;
                if r.status != 200 || r.body["status"] != "memory_limit" {
                    bail!("a memory bomb answered {} {}", r.status, r.body["status"]);
                }
            }
        }
        Ok(())
    })();
    // A memory bomb may have ended the session already.
    close(agent, url, key, &id, outcome, &[204, 404])
}

/// Another tenant's sandboxes, malformed bodies, streams abandoned halfway.
fn evil_misc(ctx: &Ctx, _tally: &Tally, agent: &ureq::Agent, n: u64) -> Result<()> {
    let url = &ctx.url;
    let key = &ctx.evil;
    match n % 3 {
        0 => {
            let victim = ctx.live_good.lock().first().cloned();
            let id = victim.unwrap_or_else(|| "sb-00000000".into());
            for (method, path) in [
                ("GET", format!("/v1/sandboxes/{id}")),
                ("GET", format!("/v1/sandboxes/{id}/files/in/data.bin")),
                ("DELETE", format!("/v1/sandboxes/{id}")),
            ] {
                let a = request(agent, method, &format!("{url}{path}"), key, None)?;
                if a.status != 404 {
                    bail!("{method} of another tenant's {path}: status {}", a.status);
                }
            }
        }
        1 => {
            for body in [&b"{\"code\": "[..], b"{\"code\": 5}", b"\xff\xfe"] {
                let a = request(agent, "POST", &format!("{url}/v1/run"), key, Some(body))?;
                if a.status != 400 {
                    bail!("a malformed body answered {}", a.status);
                }
            }
        }
        _ => {
            // A streamed one-shot run whose reader goes away after the first line.
            let response = agent
                .post(&format!("{url}/v1/run"))
                .set("Authorization", &format!("Bearer {key}"))
                .set("Accept", "application/x-ndjson")
                .send_bytes(&json_bytes(&json!({
                    "code": "import time\nfor i in range(100):\n    print(i, flush=True); time.sleep(0.1)",
                    "limits": {"timeout_s": 20},
                })));
            if let Ok(r) = response {
                let mut first = [0u8; 64];
                let _ = r.into_reader().read(&mut first);
            }
        }
    }
    Ok(())
}

type Cycle = fn(&Ctx, &Tally, &ureq::Agent, u64) -> Result<()>;

/// The client kinds, with how many of every ten clients run each.
const KINDS: [(&str, Cycle, usize, bool); 5] = [
    (
        "session (create, execute, upload, read back, kill)",
        good_session,
        5,
        true,
    ),
    ("one-shot run with a file", good_run, 2, true),
    (
        "hostile one-shot (floods, bombs, sleeps)",
        evil_run,
        1,
        false,
    ),
    (
        "hostile session (over-limit upload, result flood, memory bomb)",
        evil_session,
        1,
        false,
    ),
    (
        "hostile requests (other tenant, malformed, abandoned stream)",
        evil_misc,
        1,
        false,
    ),
];

pub fn run(args: &BenchArgs) -> Result<()> {
    let server = start_server(
        args,
        // Half the clients hold a default session and a fifth run default one-shot programs
        // (512 MiB of memory and 2 x 256 MiB of tmpfs promised each): on a 24 GiB host that
        // is three times the default budget (1.5 x MemTotal), so the budget is set to hold
        // them; the hostile tenant's requests are still refused past its shares.
        &format!(
            "pool_size = 32\nmax_sessions_per_key = {}\nmemory_overcommit = 4.0\n",
            args.clients + 16
        ),
    )?;
    let ctx = Arc::new(Ctx {
        url: server.url.clone(),
        good: [server.key("good-a")?, server.key("good-b")?],
        evil: server.key("evil")?,
        live_good: Mutex::default(),
    });
    let pid = server.child.id();
    println!(
        "soak: image `{}`, {} clients for {} s",
        args.image, args.clients, args.duration
    );
    let rss_start = rss_mib(pid);
    let tallies: Arc<Vec<Tally>> = Arc::new(KINDS.iter().map(|_| Tally::default()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    // About 30 samples whatever the duration (one every 1 to 10 s), so that each third of the
    // run has enough of them for its median to be the typical level, not one flood's peak.
    let every_s = (args.duration / 30).clamp(1, 10);
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut series = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_secs(every_s));
                series.push(rss_mib(pid));
            }
            series
        })
    };
    let started = Instant::now();
    let clients: Vec<_> = (0..args.clients)
        .map(|i| {
            // Client i runs the kind that owns slot i % 10.
            let mut slot = i % 10;
            let kind = KINDS
                .iter()
                .position(|k| {
                    let mine = slot < k.2;
                    slot = slot.saturating_sub(k.2);
                    mine
                })
                .expect("the shares add up to ten");
            let (ctx, tallies, stop) = (ctx.clone(), tallies.clone(), stop.clone());
            std::thread::spawn(move || {
                let agent = ureq::AgentBuilder::new()
                    .timeout(Duration::from_secs(120))
                    .build();
                let tally = &tallies[kind];
                let mut n = i as u64;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    match KINDS[kind].1(&ctx, tally, &agent, n) {
                        Ok(()) => {
                            tally.cycles.fetch_add(1, Ordering::Relaxed);
                            tally.latencies.lock().push(t.elapsed());
                        }
                        Err(e) => tally.failed(e),
                    }
                    n += CYCLE_STRIDE;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(args.duration));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let _ = c.join();
    }
    let elapsed = started.elapsed();
    let series = sampler.join().expect("sampler");
    // Sandboxes end asynchronously after their last request (abandoned streams, kills).
    let settle = Instant::now() + Duration::from_secs(30);
    while metric(&server.url, "corral_sessions_live").unwrap_or(0.0) > 0.0
        && Instant::now() < settle
    {
        std::thread::sleep(Duration::from_millis(250));
    }
    std::thread::sleep(Duration::from_secs(3));
    let rss_end = rss_mib(pid);
    let live_after = metric(&server.url, "corral_sessions_live").unwrap_or(f64::NAN);

    let mut failures = Vec::new();
    for ((name, _, _, good), tally) in KINDS.iter().zip(tallies.iter()) {
        let mut lat = std::mem::take(&mut *tally.latencies.lock());
        lat.sort();
        let (cycles, errors) = (
            tally.cycles.load(Ordering::Relaxed),
            tally.errors.load(Ordering::Relaxed),
        );
        println!(
            "  {name:<64} cycles {cycles:>6}  errors {errors:>3}  retries {:>5}  p50 {:>8.1} ms  p99 {:>8.1} ms",
            tally.retries.load(Ordering::Relaxed),
            percentile(&lat, 0.50),
            percentile(&lat, 0.99),
        );
        for e in tally.first_errors.lock().iter() {
            println!("      error: {e}");
        }
        if errors > 0 {
            failures.push(format!(
                "{errors} {} cycles of `{name}` failed",
                if *good { "well-behaved" } else { "hostile" }
            ));
        }
        if cycles == 0 {
            failures.push(format!("no cycle of `{name}` completed"));
        }
    }
    let formatted: Vec<String> = series.iter().map(|m| format!("{m:.1}")).collect();
    println!(
        "server RSS (MiB): {rss_start:.1} at start, every {every_s} s [{}], {rss_end:.1} after; \
         {:.0} s; sessions live after: {live_after}",
        formatted.join(", "),
        elapsed.as_secs_f64()
    );
    // Flat: the server's memory is bounded under the load (its own bounds: the rich results it
    // may hold at once, frames and upload queues) and does not creep up with the work done.
    let peak = series.iter().copied().fold(rss_start, f64::max);
    println!("server RSS peak under the load: {peak:.1} MiB (bound {RSS_CEILING_MIB} MiB)");
    if peak > RSS_CEILING_MIB {
        failures.push(format!(
            "the server's RSS reached {peak:.1} MiB under the load"
        ));
    }
    if let Some(grown) = growth(&series) {
        println!("server RSS growth, from the middle to the last third's level: {grown:.1} MiB");
        if grown > 16.0 {
            failures.push(format!(
                "the server's typical RSS rose {grown:.1} MiB under the load"
            ));
        }
    }
    if rss_end > rss_start + 16.0 {
        failures.push(format!(
            "the server kept {:.1} MiB more than at the start once the load was gone",
            rss_end - rss_start
        ));
    }
    if live_after != 0.0 {
        failures.push(format!(
            "{live_after} sessions were still live after the soak"
        ));
    }
    // Every sandbox is gone, so its cgroup is too (the pool's warm sessions keep theirs until
    // the server stops, and a graceful stop removes them).
    drop(server);
    let left = cgroups_of(pid);
    if !left.is_empty() {
        failures.push(format!("cgroups left behind: {left:?}"));
    }
    if failures.is_empty() {
        println!("soak: passed");
        Ok(())
    } else {
        bail!("soak failed: {}", failures.join("; "))
    }
}

/// How far the typical level of the server's RSS rose from the middle third of the run to the
/// last third: a leak raises it. The level of a third is the mean of its samples, the highest
/// and the lowest left out when there are five or more: the hostile floods make the RSS swing
/// between two levels (results held, results freed) in cycles of some seconds, and a mean over
/// the cycles moves with neither one flood's peak nor the phase at which a third happens to
/// end, which a median of such a two-level series does (it jumps from one level to the other).
fn growth(series: &[f64]) -> Option<f64> {
    if series.len() < 3 {
        return None;
    }
    let third = series.len() / 3;
    let level = |s: &[f64]| {
        let mut v = s.to_vec();
        v.sort_by(f64::total_cmp);
        let kept = if v.len() >= 5 {
            &v[1..v.len() - 1]
        } else {
            &v[..]
        };
        kept.iter().sum::<f64>() / kept.len() as f64
    };
    let middle = level(&series[third..series.len() - third]);
    let last = level(&series[series.len() - third..]);
    Some((last - middle).max(0.0))
}

/// The sandbox cgroups that belong to the server process `pid` (named `<owner pid>-...`).
fn cgroups_of(pid: u32) -> Vec<String> {
    corral_sandbox::cgroup::Layout::detect()
        .map(|layout| layout.sandbox_cgroups())
        .unwrap_or_default()
        .into_iter()
        .filter(|name| name.split('-').next() == Some(pid.to_string().as_str()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::growth;

    #[test]
    fn growth_follows_the_typical_level_not_peaks_or_dips() {
        assert_eq!(growth(&[10.0, 30.0]), None);
        // Hostile floods make peaks that are freed again, pauses make dips: no growth worth
        // the name (the two thirds' levels, 71.8 and 77.7 MiB, are 6 apart; the bound is 16).
        let swing = growth(&[90.0, 27.0, 89.0, 88.0, 38.0, 89.5, 90.0, 54.0, 89.0]).unwrap();
        assert!(swing < 6.0, "{swing}");
        // A leak: the level keeps rising with the work done.
        assert_eq!(growth(&[10.0, 20.0, 30.0, 40.0, 50.0, 60.0]), Some(20.0));
        // The one-minute run of the CI of 2026-11-26, 7 samples: a median took one flood's
        // peak for the last third's level (38.6 MiB); the mean does not.
        assert_eq!(
            growth(&[103.8, 40.6, 102.8, 65.1, 102.2, 140.7, 34.6]),
            Some(0.0)
        );
        // The next run, 30 samples in cycles between about 40 and 103 MiB: the thirds'
        // medians were 11.7 MiB apart, their levels are 6 apart.
        let cycles = [
            42.8, 68.0, 88.0, 101.0, 102.0, 102.1, 101.0, 119.4, 47.4, 39.9, 38.9, 58.7, 78.6,
            103.7, 103.6, 103.8, 102.3, 103.8, 63.1, 49.5, 40.1, 47.2, 70.9, 102.5, 102.6, 102.6,
            101.8, 103.5, 122.2, 80.0,
        ];
        let grown = growth(&cycles).unwrap();
        assert!((5.0..7.0).contains(&grown), "{grown}");
        // A leak under the same cycles: every sample of the last third 20 MiB higher.
        let mut leaking = cycles;
        for m in &mut leaking[20..] {
            *m += 20.0;
        }
        assert!(growth(&leaking).unwrap() > 16.0);
    }

    #[test]
    fn kinds_share_ten_slots() {
        assert_eq!(super::KINDS.iter().map(|k| k.2).sum::<usize>(), 10);
    }
}
