//! The `corral` command line: a thin layer over the `corral-sandbox` library.

mod bench;
mod bench_egress;
mod bench_router;
mod bench_server;
mod bench_sessions;
mod bench_soak;
mod image;
mod mcp;
mod route;
mod run;
mod serve;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "corral",
    version,
    about = "Run untrusted code in disposable, locked-down sandboxes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Only the chosen subcommand's arguments are built: building all of them is a measurable
// part of `corral run`'s start-up.
#[derive(Subcommand)]
#[command(defer = true)]
enum Command {
    /// Run a program in a fresh sandbox and report its output and status.
    Run(Box<run::RunArgs>),
    /// Build, list, inspect and remove images.
    Image(image::ImageArgs),
    /// Show which protection layers this host can apply, and which not.
    Doctor(DoctorArgs),
    /// Serve the HTTP API (native and E2B-compatible) until SIGTERM.
    Serve(serve::ServeArgs),
    /// Route requests to several `corral serve` nodes by the node each sandbox id names.
    Route(route::RouteArgs),
    /// Manage the API keys of `corral serve`.
    Key(serve::KeyArgs),
    /// Serve the sandbox tools to MCP clients, on stdio or streamable HTTP.
    Mcp(mcp::McpArgs),
    /// Print the tools as function-calling definitions (JSON) for agent frameworks.
    Tools(mcp::ToolsArgs),
    /// Measure the performance promises of docs/benchmarks.md against in-run baselines.
    Bench(bench::BenchArgs),
}

fn main() {
    let cli = Cli::parse();
    // Listings end quietly when their reader goes away (`corral image ls | head`). `corral
    // run` keeps going instead (its files are still copied out), and the servers answer
    // their other clients.
    if matches!(
        cli.command,
        Command::Image(_) | Command::Doctor(_) | Command::Key(_) | Command::Tools(_)
    ) {
        corral_sandbox::end_quietly_on_closed_pipe();
    }
    let code = match cli.command {
        Command::Run(args) => run::main(*args),
        Command::Image(args) => image::main(args),
        Command::Doctor(args) => doctor(&args),
        Command::Serve(args) => report_error("corral serve", serve::serve(args)),
        Command::Route(args) => report_error("corral route", route::route(args)),
        Command::Key(args) => report_error("corral key", serve::key(args)),
        Command::Mcp(args) => report_error("corral mcp", mcp::mcp(args)),
        Command::Tools(args) => report_error("corral tools", mcp::tools(args)),
        Command::Bench(args) => report_error("corral bench", bench::main(args)),
    };
    std::process::exit(code);
}

fn report_error(what: &str, result: anyhow::Result<()>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{what}: {e:#}");
            1
        }
    }
}

#[derive(clap::Args)]
struct DoctorArgs {
    /// Check a Kubernetes pod (or any container) meant to run a node: fail unless every layer
    /// a node needs is there, and say which pod settings are missing (docs/scale-out.md).
    #[arg(long)]
    pod: bool,
}

/// What a node of a cluster must have: no degraded mode in a pod, where a missing layer is a
/// missing pod setting, not a property of the host.
const POD_LAYERS: &[&str] = &[
    "user namespace",
    "mount namespace",
    "pid namespace",
    "network namespace",
    "ipc namespace",
    "uts namespace",
    "cgroup namespace",
    "seccomp",
    "landlock",
    "cgroup creation",
    "isolation",
];

/// Where doctor's sandbox runs `/bin/true`: the host's, or in a node's container (which holds
/// nothing but the binary and the store) the `default` image's.
fn doctor_rootfs() -> corral_sandbox::Rootfs {
    if std::path::Path::new("/bin/true").exists() {
        return corral_sandbox::Rootfs::Host;
    }
    match corral_image::Store::open(None).resolve("default") {
        Ok(image) => image.rootfs,
        Err(e) => {
            eprintln!("doctor: no /bin/true on this host, and no `default` image: {e}");
            corral_sandbox::Rootfs::Host
        }
    }
}

fn doctor(args: &DoctorArgs) -> i32 {
    let checks = corral_sandbox::doctor::run_checks(doctor_rootfs());
    let width = checks.iter().map(|c| c.layer.len()).max().unwrap_or(0);
    for c in &checks {
        let state = if c.active { "active " } else { "MISSING" };
        println!("{:width$}  {state}  {}", c.layer, c.detail);
    }
    if args.pod {
        let missing: Vec<&str> = POD_LAYERS
            .iter()
            .copied()
            .filter(|layer| !checks.iter().any(|c| c.layer == *layer && c.active))
            .collect();
        if missing.is_empty() {
            println!("pod: every layer a node needs is active");
            return 0;
        }
        println!(
            "pod: this container cannot run a Corral node: missing {}. A node makes user, \
             mount, pid and network namespaces, installs seccomp filters and Landlock rules and \
             writes cgroups of its own: run its container with securityContext.privileged: true \
             on a kernel with Landlock and cgroups (docs/scale-out.md, \"Pod security\")",
            missing.join(", ")
        );
        return 1;
    }
    let isolation_ok = checks.iter().any(|c| c.layer == "isolation" && c.active);
    if isolation_ok {
        0
    } else {
        1
    }
}
