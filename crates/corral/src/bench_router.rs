//! `corral bench --only router`: what `corral route` adds. Three nodes (`corral serve` with a
//! node name) and a router, all on loopback; `--clients` clients each hold a session (placed by
//! the router) and, for `--duration` seconds, ask for it directly from its node and through the
//! router in turn (the order alternating), a session's info (`GET /v1/sandboxes/{id}`) and a
//! warm execution of `1`. The router's cost is the difference of the medians, measured in the
//! same run; any failed request fails the benchmark.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::bench::{summarize, BenchArgs};
use crate::bench_server::{create, execute, kill, load, start_server, Server};

const NODES: usize = 3;

struct Router(Child);

impl Drop for Router {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.0.wait();
    }
}

fn get(agent: &ureq::Agent, url: &str) -> Result<Value> {
    let r = agent
        .get(url)
        .call()
        .map_err(|e| anyhow::anyhow!("GET {url}: {e}"))?;
    Ok(r.into_json()?)
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let nodes: Vec<Server> = (0..NODES)
        .map(|i| {
            start_server(
                args,
                &format!(
                    "node_name = \"bench-node-{i}\"\npool_size = 8\nmax_sessions_per_key = {}\n\
                     memory_overcommit = 1000.0\n",
                    args.clients + 16
                ),
            )
        })
        .collect::<Result<_>>()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let node_list: Vec<&str> = nodes
        .iter()
        .map(|n| n.url.trim_start_matches("http://"))
        .collect();
    let _router = Router(
        Command::new(std::env::current_exe()?)
            .args(["route", "--listen", &format!("127.0.0.1:{port}"), "--node"])
            .arg(node_list.join(","))
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting corral route")?,
    );
    let router = format!("http://127.0.0.1:{port}");
    let agent = ureq::AgentBuilder::new().build();
    let deadline = Instant::now() + Duration::from_secs(60);
    while get(&agent, &format!("{router}/healthz"))
        .ok()
        .and_then(|h| h["nodes_up"].as_u64())
        != Some(NODES as u64)
    {
        if Instant::now() > deadline {
            bail!("corral route did not see its {NODES} nodes");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "router benchmark: image `{}`, {NODES} nodes, {} clients for {} s, each request directly \
         to the node and through `corral route`, in turn",
        args.image, args.clients, args.duration
    );
    // One session a client, placed by the router; each client talks to its node directly, too.
    let mut sessions = Vec::new();
    for _ in 0..args.clients {
        let id = create(&agent, &router)?;
        let node = corral_kernel::node::node_of(&id).context("the id names no node")?;
        let index: usize = node
            .as_str()
            .rsplit('-')
            .next()
            .and_then(|i| i.parse().ok())
            .context("a node of this benchmark")?;
        execute(&agent, &router, &id, "1")?;
        sessions.push((id, nodes[index].url.clone()));
    }
    let mut per_node = [0usize; NODES];
    for (_, url) in &sessions {
        per_node[nodes.iter().position(|n| &n.url == url).unwrap_or(0)] += 1;
    }
    let sessions = Arc::new(sessions);
    let next = Arc::new(AtomicUsize::new(0));
    let result = load(args.clients, Duration::from_secs(args.duration), {
        let (sessions, router) = (sessions.clone(), router.clone());
        move |agent, samples| {
            let turn = next.fetch_add(1, Ordering::Relaxed);
            let (id, node) = &sessions[turn % sessions.len()];
            let mut bases = [("direct", node.as_str()), ("routed", router.as_str())];
            if turn % 2 == 1 {
                bases.reverse();
            }
            for (how, base) in bases {
                let t = Instant::now();
                let info = get(agent, &format!("{base}/v1/sandboxes/{id}"))?;
                let took = t.elapsed();
                if info["id"] != id.as_str() {
                    bail!("GET {id} via {how} gave {info}");
                }
                let op = if how == "direct" {
                    "direct-get"
                } else {
                    "routed-get"
                };
                samples.lock().push((op, took));
            }
            for (how, base) in bases {
                let t = Instant::now();
                let r = execute(agent, base, id, "1")?;
                let took = t.elapsed();
                if r["results"][0]["text"] != "1" {
                    bail!("1 via {how} gave {r}");
                }
                let op = if how == "direct" {
                    "direct-exec"
                } else {
                    "routed-exec"
                };
                samples.lock().push((op, took));
            }
            Ok(())
        }
    });
    for (id, _) in sessions.iter() {
        kill(&agent, &router, id)?;
    }
    println!(
        "  sessions per node: {per_node:?}; {} cycles of 4 requests in {:.1} s, {} errors",
        result.done,
        result.elapsed.as_secs_f64(),
        result.errors
    );
    for (what, direct, routed) in [
        ("GET /v1/sandboxes/{id}", "direct-get", "routed-get"),
        ("execute `1`", "direct-exec", "routed-exec"),
    ] {
        let (d, r) = (result.by(direct), result.by(routed));
        if d.is_empty() || r.is_empty() {
            bail!("no samples of {what}");
        }
        let (d, r) = (summarize(d), summarize(r));
        let ms = |x: Duration| x.as_secs_f64() * 1000.0;
        println!(
            "  {what}: direct p50 {:.2} ms p95 {:.2} ms; routed p50 {:.2} ms p95 {:.2} ms; \
             added p50 {:+.2} ms (routed/direct {:.2}x)",
            ms(d.p50),
            ms(d.p95),
            ms(r.p50),
            ms(r.p95),
            ms(r.p50) - ms(d.p50),
            r.p50.as_secs_f64() / d.p50.as_secs_f64().max(1e-9),
        );
    }
    if result.errors > 0 {
        bail!(
            "{} requests failed; the first: {:?}",
            result.errors,
            result.first_errors
        );
    }
    Ok(())
}
