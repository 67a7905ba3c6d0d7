//! `corral bench --only egress`: the throughput of a sandbox's egress proxy (docs/network.md)
//! against the host's own. A server of the bench's on the host's loopback serves 10 MB; the
//! same Python client fetches it on the host directly and inside `corral run --net
//! allow:localhost:PORT` (the operator opt-in lets `localhost` be reached) through the proxy,
//! the runs interleaved; each run times its own download, so the sandbox's start-up is not
//! counted.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::bench::{summarize, BenchArgs};

/// The download's size.
const SIZE: usize = 10_000_000;

/// Fetches `$URL` through the proxy the environment names (none on the host), timing the
/// download alone: prints the bytes and the seconds.
const CLIENT: &str = r#"
import os, time, urllib.request
for k in ("NO_PROXY", "no_proxy"):
    os.environ.pop(k, None)
opener = urllib.request.build_opener(urllib.request.ProxyHandler())
t = time.perf_counter()
r = opener.open(os.environ["URL"])
n = 0
while True:
    b = r.read(1 << 20)
    if not b:
        break
    n += len(b)
print(n, time.perf_counter() - t)
"#;

/// Serves `SIZE` bytes to every connection, after reading its request.
fn serve(listener: TcpListener) {
    let body = vec![b'x'; SIZE];
    for conn in listener.incoming().flatten() {
        let body = body.clone();
        std::thread::spawn(move || {
            let mut conn = conn;
            let mut buf = [0u8; 8192];
            let _ = conn.read(&mut buf);
            let head =
                format!("HTTP/1.1 200 OK\r\nContent-Length: {SIZE}\r\nConnection: close\r\n\r\n");
            let _ = conn.write_all(head.as_bytes());
            let _ = conn.write_all(&body);
        });
    }
}

/// Runs `command` and reads the client's `BYTES SECONDS` line.
fn download(command: &mut Command) -> Result<Duration> {
    let out = command
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .context("running the download")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    match line.split_once(' ') {
        Some((bytes, secs)) if bytes == SIZE.to_string() => Ok(Duration::from_secs_f64(
            secs.trim().parse().context("the client's time")?,
        )),
        _ => bail!(
            "the download failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || serve(listener));
    let me = std::env::current_exe()?;
    let url = format!("http://localhost:{port}/10mb");
    let host = || {
        let mut c = Command::new("/usr/bin/python3");
        c.args(["-c", CLIENT]).env("URL", &url);
        for k in [
            "HTTP_PROXY",
            "http_proxy",
            "HTTPS_PROXY",
            "https_proxy",
            "ALL_PROXY",
            "all_proxy",
        ] {
            c.env_remove(k);
        }
        c
    };
    let sandboxed = || {
        let mut c = Command::new(&me);
        c.args(["run", "--image", "host", "--net"])
            .arg(format!("allow:localhost:{port}"))
            .args(["--net-allow-private", "localhost", "--env"])
            .arg(format!("URL={url}"))
            .args(["-c", CLIENT]);
        c
    };
    let runs = args.runs.clamp(3, 30);
    for _ in 0..2 {
        download(&mut host())?;
        download(&mut sandboxed())?;
    }
    let (mut direct, mut proxied) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        direct.push(download(&mut host())?);
        proxied.push(download(&mut sandboxed())?);
    }
    let (d, p) = (summarize(direct), summarize(proxied));
    let mbps = |t: Duration| SIZE as f64 / t.as_secs_f64() / 1e6;
    println!("egress: a 10 MB download over the host's loopback, {runs} interleaved runs each");
    println!("{:46} {:>9} {:>9}", "contender", "p50 MB/s", "p95 ms");
    println!(
        "{:46} {:>9.0} {:>9.2}",
        "on the host, directly",
        mbps(d.p50),
        d.p95.as_secs_f64() * 1e3
    );
    println!(
        "{:46} {:>9.0} {:>9.2}",
        "in a sandbox, through its egress proxy",
        mbps(p.p50),
        p.p95.as_secs_f64() * 1e3
    );
    println!(
        "proxy / host throughput, p50: {:.3}x   (goal >= 0.9x)",
        d.p50.as_secs_f64() / p.p50.as_secs_f64()
    );
    Ok(())
}
