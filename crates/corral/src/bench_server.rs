//! `corral bench --only server`: the load test of docs/benchmarks.md. It starts `corral serve`
//! on loopback and measures, over HTTP: warm executions one at a time, one-shot throughput,
//! and many clients creating, using and killing sessions at once, counting every error and
//! the server's memory before and after. Bounded in clients and time; loopback only.

use parking_lot::Mutex;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::bench::BenchArgs;

pub struct Server {
    pub child: Child,
    pub url: String,
    dir: tempfile::TempDir,
}

impl Server {
    /// `corral key create --name NAME` on this server's database: the key's secret.
    pub fn key(&self, name: &str) -> Result<String> {
        let out = Command::new(std::env::current_exe()?)
            .args(["key", "create", "--name", name, "--db"])
            .arg(self.dir.path().join("corral.db"))
            .stderr(Stdio::inherit())
            .output()
            .context("running corral key create")?;
        let key = String::from_utf8(out.stdout)?.trim().to_string();
        if !out.status.success() || key.is_empty() {
            bail!("corral key create failed: {}", out.status);
        }
        Ok(key)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

/// Starts `corral serve` on a free loopback port with a fresh database and `config` (TOML).
pub fn start_server(args: &BenchArgs, config: &str) -> Result<Server> {
    let dir = tempfile::tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let config_file = dir.path().join("corral.toml");
    std::fs::write(
        &config_file,
        format!("default_image = {:?}\n{config}", args.image),
    )?;
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--db"])
        .arg(dir.path().join("corral.db"))
        .arg("--config")
        .arg(&config_file)
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    if let Some(d) = &args.data_dir {
        command.arg("--data-dir").arg(d);
    }
    let server = Server {
        child: command.spawn().context("starting corral serve")?,
        url: format!("http://127.0.0.1:{port}"),
        dir,
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while ureq::get(&format!("{}/healthz", server.url))
        .call()
        .is_err()
    {
        if Instant::now() > deadline {
            bail!("corral serve did not come up");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(server)
}

/// A metric's value from the server's Prometheus text.
pub fn metric(url: &str, name: &str) -> Option<f64> {
    let text = ureq::get(&format!("{url}/metrics"))
        .call()
        .ok()?
        .into_string()
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

pub fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// User and system CPU time of process `pid`, in milliseconds.
fn process_cpu_ms(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split(' ').collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    Some(ticks * 1000.0 / hz as f64)
}

/// The CPU accounting files (cgroup v1 `cpuacct.usage` or v2 `cpu.stat`) of the cgroups of the
/// zygotes below the server `pid`: its descendants running `corral_zygote.py` whose parent does
/// not run it (the sessions they fork run it too, one process further down).
fn zygote_cgroups(pid: u32) -> Vec<std::path::PathBuf> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let mut parents = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = read(&format!("/proc/{p}/stat"));
        if let Some(ppid) = stat
            .rfind(')')
            .and_then(|i| stat.get(i + 2..)?.split(' ').nth(1)?.parse::<u32>().ok())
        {
            parents.insert(p, ppid);
        }
    }
    let below_server = |mut p: u32| {
        while let Some(&parent) = parents.get(&p) {
            if parent == pid {
                return true;
            }
            p = parent;
        }
        false
    };
    let runs_zygote = |p: u32| read(&format!("/proc/{p}/cmdline")).contains("corral_zygote.py");
    let mut files: Vec<std::path::PathBuf> = parents
        .iter()
        .filter(|&(&p, &parent)| below_server(p) && runs_zygote(p) && !runs_zygote(parent))
        .filter_map(|(&p, _)| {
            let cgroups = read(&format!("/proc/{p}/cgroup"));
            let v1 = cgroups.lines().find_map(|l| {
                let (_, rest) = l.split_once(':')?;
                let (controllers, path) = rest.split_once(':')?;
                controllers
                    .split(',')
                    .any(|c| c == "cpuacct")
                    .then(|| format!("/sys/fs/cgroup/{controllers}{path}/cpuacct.usage").into())
            });
            v1.or_else(|| {
                let path = cgroups.lines().find_map(|l| l.strip_prefix("0::"))?;
                Some(format!("/sys/fs/cgroup{path}/cpu.stat").into())
            })
        })
        .collect();
    files.sort();
    files.dedup();
    files
}

/// The CPU time the cgroups of [`zygote_cgroups`] used, in milliseconds.
fn cgroups_cpu_ms(files: &[std::path::PathBuf]) -> Option<f64> {
    if files.is_empty() {
        return None;
    }
    files.iter().try_fold(0.0, |sum, file| {
        let text = std::fs::read_to_string(file).ok()?;
        let ms = match text.lines().find_map(|l| l.strip_prefix("usage_usec ")) {
            Some(usec) => usec.trim().parse::<f64>().ok()? / 1000.0,
            None => text.trim().parse::<f64>().ok()? / 1e6,
        };
        Some(sum + ms)
    })
}

pub fn percentile(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1000.0
}

fn row(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "  {name:<44} n={:<7} p50 {:>8.2} ms  p99 {:>8.2} ms",
        samples.len(),
        percentile(&samples, 0.50),
        percentile(&samples, 0.99)
    );
}

/// POSTs JSON and returns the JSON answer, failing on anything but the expected status.
pub(crate) fn post(agent: &ureq::Agent, url: &str, body: &Value, expect: u16) -> Result<Value> {
    let response = agent
        .post(url)
        .set("Accept", "application/json")
        .send_json(body)
        .map_err(|e| anyhow::anyhow!("POST {url}: {e}"))?;
    if response.status() != expect {
        bail!("POST {url}: status {}", response.status());
    }
    Ok(response.into_json()?)
}

pub(crate) fn execute(agent: &ureq::Agent, url: &str, id: &str, code: &str) -> Result<Value> {
    let r = post(
        agent,
        &format!("{url}/v1/sandboxes/{id}/execute"),
        &json!({"code": code}),
        200,
    )?;
    if r["status"] != "success" {
        bail!("execution ended {}: {}", r["status"], r["error_message"]);
    }
    Ok(r)
}

pub(crate) fn create(agent: &ureq::Agent, url: &str) -> Result<String> {
    let info = post(agent, &format!("{url}/v1/sandboxes"), &json!({}), 201)?;
    Ok(info["id"].as_str().context("no id")?.to_string())
}

pub(crate) fn kill(agent: &ureq::Agent, url: &str, id: &str) -> Result<()> {
    let r = agent
        .delete(&format!("{url}/v1/sandboxes/{id}"))
        .call()
        .map_err(|e| anyhow::anyhow!("DELETE: {e}"))?;
    if r.status() != 204 {
        bail!("DELETE: status {}", r.status());
    }
    Ok(())
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let server = start_server(
        args,
        // The load test measures throughput, not admission: its clients' idle sessions may be
        // promised more memory than the host's default budget holds.
        &format!(
            "pool_size = 64\nmax_sessions_per_key = {}\nmemory_overcommit = 1000.0\n",
            args.clients + 16
        ),
    )?;
    let url = server.url.clone();
    let pid = server.child.id();
    println!(
        "server benchmark: image `{}`, {} clients for {} s (pool of 64 sessions)",
        args.image, args.clients, args.duration
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while metric(&url, "corral_pool_ready").unwrap_or(0.0) < 64.0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let rss_start = rss_mib(pid);

    // 1. Warm executions, one client, keep-alive.
    let agent = ureq::AgentBuilder::new().build();
    let id = create(&agent, &url)?;
    for _ in 0..20 {
        execute(&agent, &url, &id, "1+1")?;
    }
    let mut warm = Vec::new();
    for _ in 0..500 {
        let t = Instant::now();
        let r = execute(&agent, &url, &id, "1+1")?;
        warm.push(t.elapsed());
        if r["results"][0]["text"] != "2" {
            bail!("1+1 gave {r}");
        }
    }
    kill(&agent, &url, &id)?;

    // 2. One-shot throughput: as many `print(1)` runs as 8 clients can push in 20 s, and the
    // CPU they took: the server's, the zygotes' (their cgroups, which hold each forked child
    // until it joins its run's) and each run's own (its cgroup, as the result reports it).
    let zygote_cgroups = zygote_cgroups(pid);
    let cpu_before = (process_cpu_ms(pid), cgroups_cpu_ms(&zygote_cgroups));
    let run_cpu_ms = Arc::new(AtomicU64::new(0));
    let oneshot = load(8, Duration::from_secs(20), {
        let url = url.clone();
        let run_cpu_ms = run_cpu_ms.clone();
        move |agent, samples| {
            let t = Instant::now();
            let r = post(
                agent,
                &format!("{url}/v1/run"),
                &json!({"code": "print(1)"}),
                200,
            )?;
            if r["stdout"] != "1\n" {
                bail!("print(1) gave {r}");
            }
            samples.lock().push(("run", t.elapsed()));
            run_cpu_ms.fetch_add(r["cpu_time_ms"].as_u64().unwrap_or(0), Ordering::Relaxed);
            Ok(())
        }
    });
    let per_run = |before: Option<f64>, after: Option<f64>| match (before, after) {
        (Some(b), Some(a)) if oneshot.done > 0 => format!("{:.2}", (a - b) / oneshot.done as f64),
        _ => "-".into(),
    };
    let oneshot_cpu = format!(
        "CPU per run: server {} ms, zygotes {} ms, the run's own cgroup {} ms",
        per_run(cpu_before.0, process_cpu_ms(pid)),
        per_run(cpu_before.1, cgroups_cpu_ms(&zygote_cgroups)),
        per_run(Some(0.0), Some(run_cpu_ms.load(Ordering::Relaxed) as f64)),
    );

    // 3. Many clients: create a session, execute four times, kill; over and over. The server's
    // memory is sampled throughout: it must not grow with the work done.
    let rss_before_load = rss_mib(pid);
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let sampling = sampling.clone();
        std::thread::spawn(move || {
            let mut series = Vec::new();
            while sampling.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_secs(10));
                series.push(rss_mib(pid));
            }
            series
        })
    };
    let sessions = load(args.clients, Duration::from_secs(args.duration), {
        let url = url.clone();
        move |agent, samples| {
            let t = Instant::now();
            let id = create(agent, &url)?;
            let created = t.elapsed();
            let mut times = vec![("create", created)];
            let t = Instant::now();
            execute(agent, &url, &id, "x = 41")?;
            times.push(("first execute", t.elapsed()));
            for _ in 0..3 {
                let t = Instant::now();
                let r = execute(agent, &url, &id, "x + 1")?;
                times.push(("execute", t.elapsed()));
                if r["results"][0]["text"] != "42" {
                    bail!("x + 1 gave {r}");
                }
            }
            let t = Instant::now();
            kill(agent, &url, &id)?;
            times.push(("kill", t.elapsed()));
            samples.lock().extend(times);
            Ok(())
        }
    });
    sampling.store(false, Ordering::Relaxed);
    let series = sampler.join().expect("sampler");
    std::thread::sleep(Duration::from_secs(3));
    let rss_end = rss_mib(pid);
    let live_after = metric(&url, "corral_sessions_live").unwrap_or(f64::NAN);

    println!("warm `1+1` over HTTP (one client, folded JSON):");
    row("execute", warm);
    println!(
        "one-shot `print(1)`, 8 clients, 20 s: {:.1} runs/s, {} errors",
        oneshot.done as f64 / oneshot.elapsed.as_secs_f64(),
        oneshot.errors
    );
    row("run", oneshot.by("run"));
    println!("  {oneshot_cpu}");
    println!(
        "{} clients x (create, 4 executions, kill) for {:.0} s: {} cycles ({:.1}/s, {:.1} executions/s), {} errors",
        args.clients,
        sessions.elapsed.as_secs_f64(),
        sessions.done,
        sessions.done as f64 / sessions.elapsed.as_secs_f64(),
        4.0 * sessions.done as f64 / sessions.elapsed.as_secs_f64(),
        sessions.errors
    );
    for op in ["create", "first execute", "execute", "kill"] {
        row(op, sessions.by(op));
    }
    for e in oneshot.first_errors.iter().chain(&sessions.first_errors) {
        println!("  error: {e}");
    }
    let series: Vec<String> = series.iter().map(|m| format!("{m:.1}")).collect();
    println!(
        "server RSS (MiB): {rss_start:.1} idle at start, {rss_before_load:.1} before the \
         many-client load, every 10 s during it [{}], {rss_end:.1} at the end; sessions live at \
         the end: {live_after}",
        series.join(", ")
    );
    Ok(())
}

pub(crate) struct Load {
    pub done: u64,
    pub errors: u64,
    pub first_errors: Vec<String>,
    pub elapsed: Duration,
    samples: Vec<(&'static str, Duration)>,
}

impl Load {
    pub fn by(&self, op: &str) -> Vec<Duration> {
        self.samples
            .iter()
            .filter(|(o, _)| *o == op)
            .map(|(_, d)| *d)
            .collect()
    }
}

pub(crate) type Samples = Arc<Mutex<Vec<(&'static str, Duration)>>>;

/// Runs `cycle` on `clients` threads until `duration` has passed; every failed cycle counts.
pub(crate) fn load(
    clients: usize,
    duration: Duration,
    cycle: impl Fn(&ureq::Agent, &Samples) -> Result<()> + Send + Sync + 'static,
) -> Load {
    let cycle = Arc::new(cycle);
    let samples: Samples = Arc::default();
    let (done, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let first_errors = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (cycle, samples, done, errors, first_errors, stop) = (
                cycle.clone(),
                samples.clone(),
                done.clone(),
                errors.clone(),
                first_errors.clone(),
                stop.clone(),
            );
            std::thread::spawn(move || {
                let agent = ureq::AgentBuilder::new()
                    .timeout(Duration::from_secs(120))
                    .build();
                while !stop.load(Ordering::Relaxed) {
                    match cycle(&agent, &samples) {
                        Ok(()) => done.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            let mut first = first_errors.lock();
                            if first.len() < 5 {
                                first.push(format!("{e:#}"));
                            }
                            errors.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            })
        })
        .collect();
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let elapsed = started.elapsed();
    let samples = std::mem::take(&mut *samples.lock());
    let first_errors = std::mem::take(&mut *first_errors.lock());
    Load {
        done: done.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        first_errors,
        elapsed,
        samples,
    }
}
