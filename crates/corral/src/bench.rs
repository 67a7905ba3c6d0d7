//! `corral bench`: the performance promises of docs/benchmarks.md, each measured as a ratio against
//! a baseline timed in the same run, with the runs interleaved so that machine noise hits
//! every contender alike.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Timed runs per contender (after 3 warm-up runs each).
    #[arg(long, default_value_t = 60)]
    pub runs: usize,
    /// Which benchmarks: all, oneshot, sessions, density, server, egress, router, or soak
    /// (not part of all).
    #[arg(long, default_value = "all")]
    only: String,
    /// Image for the session benchmarks.
    #[arg(long, default_value = "host")]
    pub image: String,
    /// Data directory holding built images (default: $CORRAL_DATA_DIR or the XDG data dir).
    #[arg(long)]
    pub data_dir: Option<std::path::PathBuf>,
    /// Sessions for the density benchmark.
    #[arg(long, default_value_t = 200)]
    density_sessions: usize,
    /// Concurrent clients of the server load test, the router benchmark and the soak.
    #[arg(long, default_value_t = 100)]
    pub clients: usize,
    /// Seconds the server load test, the router benchmark and the soak run their clients.
    #[arg(long, default_value_t = 120)]
    pub duration: u64,
}

/// Median and 95th percentile of a set of durations.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub p50: Duration,
    pub p95: Duration,
}

pub fn summarize(mut samples: Vec<Duration>) -> Summary {
    assert!(!samples.is_empty(), "no samples");
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    Summary {
        p50: at(0.50),
        p95: at(0.95),
    }
}

struct Contender {
    name: &'static str,
    command: Vec<String>,
    /// Stop the clock when every process the command started is gone, not when the command
    /// returns (bwrap returns while its sandbox's pid 1 is still being torn down).
    until_gone: bool,
    samples: Vec<Duration>,
}

fn time_once(command: &[String], until_gone: bool) -> Result<Duration> {
    let start = Instant::now();
    let out = Command::new(&command[0])
        .args(&command[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("running {}", command[0]))?;
    if until_gone {
        // We are a child subreaper: the command's orphans are ours to wait for.
        while nix::sys::wait::waitpid(None, None) != Err(nix::errno::Errno::ECHILD) {}
    }
    let elapsed = start.elapsed();
    if !out.status.success() || out.stdout != b"1\n" {
        bail!(
            "{:?} failed ({}): {}",
            command,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(elapsed)
}

fn bwrap_command() -> Option<Vec<String>> {
    let bwrap = ["/usr/bin/bwrap", "/usr/local/bin/bwrap"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())?;
    // The same view of the host as Corral's host image: /usr and the same /etc entries
    // read-only, fresh /proc, /dev, /tmp. (Python's start-up runs site-packages' .pth files,
    // which may read files under /etc: without them, bwrap's Python did 0.4 ms less work on
    // the test machine, where one .pth file reads a CA certificate from /etc/ssl.)
    let mut cmd: Vec<String> = [
        bwrap,
        "--unshare-all",
        "--die-with-parent",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    .map(String::from)
    .to_vec();
    for dir in ["bin", "sbin", "lib", "lib64"] {
        if let Ok(link) = std::fs::read_link(format!("/{dir}")) {
            cmd.extend([
                "--symlink".into(),
                link.to_string_lossy().into_owned(),
                format!("/{dir}"),
            ]);
        }
    }
    for name in corral_sandbox::rootfs::HOST_ETC_WHITELIST {
        let path = format!("/etc/{name}");
        if std::path::Path::new(&path).exists() {
            cmd.extend(["--ro-bind".into(), path.clone(), path]);
        }
    }
    cmd.extend(
        [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
            "/usr/bin/python3",
            "-c",
            "print(1)",
        ]
        .map(String::from),
    );
    Some(cmd)
}

pub fn main(args: BenchArgs) -> Result<()> {
    let all = args.only == "all";
    if all || args.only == "oneshot" {
        oneshot(&args)?;
    }
    if all || args.only == "sessions" {
        crate::bench_sessions::sessions(&args.image, args.data_dir.as_deref())?;
    }
    if all || args.only == "density" {
        crate::bench_sessions::density(
            &args.image,
            args.data_dir.as_deref(),
            args.density_sessions,
        )?;
    }
    if all || args.only == "server" {
        crate::bench_server::run(&args)?;
    }
    if all || args.only == "egress" {
        crate::bench_egress::run(&args)?;
    }
    if all || args.only == "router" {
        crate::bench_router::run(&args)?;
    }
    // The soak runs for minutes and fails on any error: only when asked for by name.
    if args.only == "soak" {
        crate::bench_soak::run(&args)?;
    }
    let known = [
        "all", "oneshot", "sessions", "density", "server", "egress", "router", "soak",
    ];
    if !known.contains(&args.only.as_str()) {
        bail!("--only takes all, oneshot, sessions, density, server, egress, router or soak");
    }
    Ok(())
}

fn oneshot(args: &BenchArgs) -> Result<()> {
    let me = std::env::current_exe()?.to_string_lossy().into_owned();
    let mut contenders = vec![
        Contender {
            name: "python3 -c 'print(1)' (bare)",
            command: ["/usr/bin/python3", "-c", "print(1)"]
                .map(String::from)
                .to_vec(),
            until_gone: false,
            samples: Vec::new(),
        },
        Contender {
            name: "corral run -c 'print(1)' (host image)",
            command: vec![
                me,
                "run".into(),
                "--image".into(),
                "host".into(),
                "-c".into(),
                "print(1)".into(),
            ],
            until_gone: false,
            samples: Vec::new(),
        },
    ];
    nix::sys::prctl::set_child_subreaper(true).context("becoming a child subreaper")?;
    match bwrap_command() {
        Some(command) => {
            contenders.push(Contender {
                name: "bwrap --unshare-all python3 -c 'print(1)'",
                command: command.clone(),
                until_gone: false,
                samples: Vec::new(),
            });
            contenders.push(Contender {
                name: "  the same, until its sandbox is gone",
                command,
                until_gone: true,
                samples: Vec::new(),
            });
        }
        None => eprintln!("bench: bubblewrap is not installed (apt-get install bubblewrap); its baseline is skipped"),
    }
    for c in &contenders {
        for _ in 0..3 {
            time_once(&c.command, c.until_gone)?;
        }
    }
    for _ in 0..args.runs {
        for c in &mut contenders {
            let t = time_once(&c.command, c.until_gone)?;
            c.samples.push(t);
        }
    }
    // The build decides part of the start-up (glibc's loader probes the CPU before main).
    let build = if cfg!(target_env = "musl") {
        "static musl build"
    } else {
        "dynamic glibc build"
    };
    println!(
        "one-shot print(1), {} interleaved runs each; corral is the {build}",
        args.runs
    );
    println!("{:46} {:>9} {:>9}", "contender", "p50 ms", "p95 ms");
    let summaries: Vec<Summary> = contenders
        .iter()
        .map(|c| summarize(c.samples.clone()))
        .collect();
    for (c, s) in contenders.iter().zip(&summaries) {
        println!(
            "{:46} {:>9.2} {:>9.2}",
            c.name,
            s.p50.as_secs_f64() * 1e3,
            s.p95.as_secs_f64() * 1e3
        );
    }
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    let (bare, corral) = (summaries[0], summaries[1]);
    println!(
        "corral / bare python:  p50 {:.3}x  p95 {:.3}x   (required <= 1.3x, goal <= 1.15x)",
        ratio(corral.p50, bare.p50),
        ratio(corral.p95, bare.p95)
    );
    // The ratio to bare Python moves with the machine's state (a VM whose vCPUs idle runs
    // Python slower); the fixed cost each sandbox adds is what Corral controls.
    let over = |a: Duration, b: Duration| (a.as_secs_f64() - b.as_secs_f64()) * 1e3;
    println!(
        "fixed cost over bare python, p50: corral {:.2} ms{}",
        over(corral.p50, bare.p50),
        summaries
            .get(2)
            .map(|bwrap| format!(", bwrap {:.2} ms", over(bwrap.p50, bare.p50)))
            .unwrap_or_default()
    );
    if let [_, _, returned, gone] = &summaries[..] {
        println!(
            "corral / bwrap:        p50 {:.3}x  p95 {:.3}x   (required <= 1.0x)",
            ratio(corral.p50, returned.p50),
            ratio(corral.p95, returned.p95)
        );
        // Corral returns only once its sandbox is gone: this is the like-for-like ratio.
        println!(
            "corral / bwrap, both until the sandbox is gone:  p50 {:.3}x  p95 {:.3}x",
            ratio(corral.p50, gone.p50),
            ratio(corral.p95, gone.p95)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_the_right_samples() {
        let samples: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let s = summarize(samples);
        assert_eq!(s.p50, Duration::from_millis(51));
        assert_eq!(s.p95, Duration::from_millis(95));
    }
}
