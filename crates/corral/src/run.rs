//! `corral run`: one program, one fresh sandbox (docs/cli.md#corral-run).

use std::fs::File;
use std::io::{IsTerminal, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use corral_egress::PolicyError;
use corral_image::{ImageError, Recipe, ResolvedImage, Store};
use corral_kernel::bytecode::BytecodeCache;
use corral_kernel::policy::{CodePolicy, PolicyField};
use corral_kernel::Language;
use corral_sandbox::workspace::{CopyError, CopyLimits, OutDir, MAX_ENTRIES};
use corral_sandbox::{
    Egress, ExecutionResult, InputFile, Limits, NetworkPolicy, Policy, SandboxSpec, Status, Stream,
};

/// Files skipped by a copy that are named one by one in `warnings`; the rest are counted.
const MAX_SKIP_WARNINGS: usize = 20;

/// A line for the user on stderr. A reader that went away (`corral run ... 2>&1 | head`) costs
/// the line, never the run's files or its exit code: nothing here panics on a closed pipe.
macro_rules! tell {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stderr(), "corral: {}", format_args!($($arg)*));
    }};
}

/// The language a program file's name says.
fn language_of_path(path: &Path) -> Option<Language> {
    match path.extension()?.to_str()? {
        "py" => Some(Language::Python),
        "js" | "mjs" | "cjs" => Some(Language::Javascript),
        "sh" | "bash" => Some(Language::Bash),
        _ => None,
    }
}

/// The language a `#!` first line names (`#!/usr/bin/env node`, `#!/bin/bash`,
/// `#!/usr/bin/python3 -u`): `Ok(None)` without one, an error naming an interpreter Corral
/// does not run.
fn language_of_shebang(code: &[u8]) -> Result<Option<Language>> {
    let Some(rest) = code.strip_prefix(b"#!") else {
        return Ok(None);
    };
    let line = rest.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_whitespace();
    let mut program = words.next().unwrap_or_default();
    if program.rsplit('/').next() == Some("env") {
        // `env [-S] [-i] [NAME=VALUE]... PROGRAM`
        program = words
            .find(|w| !w.starts_with('-') && !w.contains('='))
            .unwrap_or_default();
    }
    let name = program.rsplit('/').next().unwrap_or_default();
    let base = name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
    match base {
        "python" => Ok(Some(Language::Python)),
        "node" | "nodejs" => Ok(Some(Language::Javascript)),
        "bash" | "sh" | "dash" => Ok(Some(Language::Bash)),
        _ => bail!(
            "the program's #! line names `{}`, which Corral does not run: pass --lang \
             python, javascript or bash",
            name.escape_debug()
        ),
    }
}

/// The program's file name when the user gave none.
fn default_file_name(lang: Language) -> &'static str {
    match lang {
        Language::Python => "main.py",
        Language::Javascript => "main.js",
        Language::Bash => "main.sh",
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Program file to run; `-` (or nothing, with -c absent) reads the program from stdin.
    file: Option<PathBuf>,
    /// Program text.
    #[arg(short = 'c', long = "code", conflicts_with = "file")]
    code: Option<String>,
    /// Language; default: from the file's extension, else from a `#!` line, else python.
    #[arg(long)]
    lang: Option<Language>,
    /// Image to run in (`corral image ls`); `host` binds the host's own /usr.
    #[arg(long, default_value = "default")]
    image: String,
    /// Wall-clock limit in seconds.
    #[arg(long, default_value_t = 30.0)]
    timeout: f64,
    /// Memory limit (e.g. 512M, 1G).
    #[arg(long, default_value = "512M", value_parser = parse_size)]
    memory: u64,
    /// CPU quota in CPUs.
    #[arg(long, default_value_t = 1.0)]
    cpus: f64,
    /// Maximum number of processes and threads.
    #[arg(long, default_value_t = 256)]
    pids: u64,
    /// Size of /workspace (and of /tmp).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    disk: u64,
    /// Rich results (plots, tables: the frames the program sends) kept per run, in bytes;
    /// past it they are dropped with a warning; 0 keeps none.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    result_bytes: u64,
    /// Rich results kept per run; later ones are dropped with a warning.
    #[arg(long, default_value_t = 256)]
    result_count: u64,
    /// Network: `none` (a loopback interface of the sandbox's own, nothing else), or
    /// `allow:HOST[,HOST...]`: these hosts through the host's egress proxy (HOST is NAME,
    /// *.SUFFIX or CIDR, each with :PORT or ports 80 and 443; docs/network.md).
    #[arg(long, value_name = "none|allow:HOST[,HOST...]")]
    net: Option<String>,
    /// The network policy from a TOML or JSON file: `allow` (names), `cidrs` (address
    /// ranges), `allow_private` (names that may resolve to internal addresses).
    #[arg(long, value_name = "FILE", conflicts_with = "net")]
    net_policy: Option<PathBuf>,
    /// An allowed name that may resolve to internal addresses (loopback, private,
    /// link-local, the host's own); repeatable. You are the operator: only for names you
    /// trust to point there.
    #[arg(long = "net-allow-private", value_name = "HOST")]
    net_allow_private: Vec<String>,
    /// Bytes the sandbox may move through the egress proxy, both ways together.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    net_bytes: u64,
    /// Connections the egress proxy accepts from the sandbox in all.
    #[arg(long, default_value_t = 1024)]
    net_connections: u64,
    /// Code policy: a module the program may import (repeatable, or comma-separated); given
    /// any, it may import only these. Defence in depth, not a boundary (docs/code-policy.md).
    #[arg(long = "allow-module", value_name = "MODULE", value_delimiter = ',')]
    allow_modules: Vec<String>,
    /// Code policy: a module the program may not import (repeatable, or comma-separated).
    #[arg(long = "deny-module", value_name = "MODULE", value_delimiter = ',')]
    deny_modules: Vec<String>,
    /// Code policy: the longest program (e.g. 100K), refused before anything starts.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_code_bytes: Option<u64>,
    /// Environment variable for the program (repeatable).
    #[arg(long = "env", value_name = "K=V", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// Copy a host file into the workspace (repeatable); DEST is relative to /workspace.
    #[arg(long = "file", value_name = "LOCAL[:DEST]")]
    files: Vec<String>,
    /// Copy the workspace's files back into DIR after the run, as new files only (a name that
    /// exists in DIR is left as it is and reported; symlinks are never copied), up to --disk
    /// bytes in all.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Print one JSON result object instead of streaming output.
    #[arg(long)]
    json: bool,
    /// Refuse to run rather than fall back to rlimits when cgroups are unavailable.
    #[arg(long)]
    strict: bool,
    /// Run even if the kernel lacks Landlock (reported as a warning).
    #[arg(long)]
    allow_degraded: bool,
    /// Build the image first if it is not built yet, without asking.
    #[arg(long)]
    yes: bool,
    /// Where images are stored (as for `corral image`).
    #[arg(long, env = "CORRAL_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

pub fn parse_size(s: &str) -> Result<u64, String> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s)
        .map_err(|e| format!("{e} (use e.g. 512M or 1G)"))
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected K=V, got {s:?}")),
    }
}

/// The limits the flags ask for, checked by the engine's one set of bounds (the server's too);
/// the error names the flag.
fn checked_limits(args: &RunArgs) -> Result<Limits> {
    let flag = |e: corral_sandbox::LimitError| anyhow::anyhow!(e.naming(&format!("--{}", e.field)));
    let limits = Limits {
        timeout: corral_sandbox::limits::timeout_from_secs(args.timeout).map_err(flag)?,
        memory_bytes: args.memory,
        cpus: args.cpus,
        pids: args.pids,
        disk_bytes: args.disk,
        result_bytes: usize::try_from(args.result_bytes).unwrap_or(usize::MAX),
        result_count: usize::try_from(args.result_count).unwrap_or(usize::MAX),
        net_bytes: args.net_bytes,
        net_connections: args.net_connections,
        ..Limits::default()
    };
    limits.validate().map_err(flag)?;
    Ok(limits)
}

/// The code policy the flags ask for, checked by the engine's one validator (the server's
/// too) for the program's language; the error names the flag.
fn checked_policy(args: &RunArgs, lang: Language) -> Result<CodePolicy> {
    let policy = policy_of_flags(&args.allow_modules, &args.deny_modules, args.max_code_bytes)?;
    policy
        .check_language(lang)
        .context("--allow-module and --deny-module")?;
    Ok(policy)
}

/// The code policy of `--allow-module`, `--deny-module` and `--max-code-bytes` (of `corral
/// run` and `corral mcp`), checked; the error names the flag.
pub fn policy_of_flags(allow: &[String], deny: &[String], max: Option<u64>) -> Result<CodePolicy> {
    let allowed = (!allow.is_empty()).then(|| allow.to_vec());
    CodePolicy::new(allowed, deny.to_vec(), max).map_err(|e| {
        let flag = match e.field() {
            Some(PolicyField::AllowedModules) => "--allow-module",
            Some(PolicyField::DeniedModules) => "--deny-module",
            Some(PolicyField::MaxCodeBytes) | None => "--max-code-bytes",
        };
        anyhow::anyhow!(e.naming(flag))
    })
}

/// A policy file (`--net-policy`): TOML, or JSON when its name ends in `.json`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    cidrs: Vec<String>,
    #[serde(default)]
    allow_private: Vec<String>,
}

/// Why a `--net` flag was refused.
#[derive(Debug, thiserror::Error)]
enum NetFlagError {
    #[error("--net {0:?}: use `none` or `allow:HOST[,HOST...]`")]
    Syntax(String),
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

/// `--net none` or `--net allow:ITEM[,ITEM...]`, with the `--net-allow-private` names.
fn parse_net_flag(flag: &str, private_hosts: &[String]) -> Result<NetworkPolicy, NetFlagError> {
    if flag == "none" {
        if let Some(name) = private_hosts.first() {
            return Err(PolicyError::PrivateNotAllowed { name: name.clone() }.into());
        }
        return Ok(NetworkPolicy::None);
    }
    let Some(list) = flag.strip_prefix("allow:") else {
        return Err(NetFlagError::Syntax(flag.to_string()));
    };
    let items: Vec<&str> = list.split(',').filter(|s| !s.trim().is_empty()).collect();
    if items.is_empty() {
        return Err(NetFlagError::Syntax(flag.to_string()));
    }
    let private: Vec<&str> = private_hosts.iter().map(String::as_str).collect();
    Ok(NetworkPolicy::from_items(&items, &private)?)
}

/// The network policy `--net`, `--net-policy` and `--net-allow-private` ask for. Its user is
/// the operator of their own run: its ranges that name internal addresses are opted in.
fn network_policy(args: &RunArgs) -> Result<NetworkPolicy> {
    let Some(path) = &args.net_policy else {
        let flag = args.net.as_deref().unwrap_or("none");
        return parse_net_flag(flag, &args.net_allow_private)
            .map(NetworkPolicy::with_own_opt_ins)
            .map_err(|e| anyhow::anyhow!("--net: {e}"));
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--net-policy {}", path.display()))?;
    let file: PolicyFile = if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).map_err(anyhow::Error::from)
    } else {
        toml::from_str(&text).map_err(anyhow::Error::from)
    }
    .with_context(|| format!("--net-policy {}", path.display()))?;
    let private: Vec<String> = file
        .allow_private
        .into_iter()
        .chain(args.net_allow_private.iter().cloned())
        .collect();
    NetworkPolicy::from_lists(&file.allow, &file.cidrs, &private)
        .map(NetworkPolicy::with_own_opt_ins)
        .map_err(|e| anyhow::anyhow!("--net-policy {}: {e}", path.display()))
}

/// Feeds the program's standard input from Corral's own when the program did not come from
/// there and it is a pipe, a file or a socket (never a terminal or a device such as
/// `/dev/null`): a thread copies it into a pipe of the sandbox's own, up to `limit` bytes (the
/// workspace size, as for every other input), and says on the returned flag if it cut there.
/// No descriptor of the host's reaches the sandbox.
fn feed_stdin(limit: u64) -> Result<Option<(OwnedFd, Arc<AtomicBool>)>> {
    use nix::sys::stat::SFlag;
    let stdin = std::io::stdin();
    let kind = nix::sys::stat::fstat(std::os::fd::AsRawFd::as_raw_fd(&stdin))
        .map(|st| SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT)
        .context("looking at stdin")?;
    if stdin.is_terminal() || ![SFlag::S_IFIFO, SFlag::S_IFREG, SFlag::S_IFSOCK].contains(&kind) {
        return Ok(None);
    }
    let (read, write) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("a pipe for stdin")?;
    let cut = Arc::new(AtomicBool::new(false));
    let flag = cut.clone();
    std::thread::spawn(move || {
        // The run's stop signals go to the main thread's signalfd, never to this thread.
        let _ = stop_signals().thread_block();
        let mut sink = File::from(write);
        let mut input = std::io::stdin().lock();
        let mut buf = vec![0u8; 64 << 10];
        let mut left = limit;
        loop {
            let n = match input.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if n as u64 > left {
                // More than the limit: the program gets the first `limit` bytes, then EOF
                // (the flag is set before the pipe closes, so the run's report sees it).
                let _ = sink.write_all(&buf[..left as usize]);
                flag.store(true, Ordering::Relaxed);
                break;
            }
            if sink.write_all(&buf[..n]).is_err() {
                break; // the program closed its stdin or ended
            }
            left -= n as u64;
        }
    });
    Ok(Some((read, cut)))
}

/// The signals that stop a run (Ctrl-C, `kill`, a closed terminal): while the program runs
/// they are blocked and read from a signalfd, so that the sandbox is torn down before Corral
/// exits (128 + the signal's number) and leaves nothing behind.
fn stop_signals() -> nix::sys::signal::SigSet {
    use nix::sys::signal::Signal;
    let mut set = nix::sys::signal::SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(s);
    }
    set
}

/// A checked request: the sandbox and the program to run in it.
struct Prepared {
    spec: SandboxSpec,
    /// Set when the program's stdin was cut at the workspace size.
    stdin_cut: Option<Arc<AtomicBool>>,
    language: Language,
    file_name: String,
    code: Vec<u8>,
    policy: CodePolicy,
    bytecode: BytecodeCache,
}

/// Turns the arguments into a sandbox spec (everything the user can get wrong is checked here).
fn build_spec(args: &RunArgs) -> Result<Prepared> {
    if let Some(dir) = &args.out {
        OutDir::check(dir).context("--out")?;
    }
    let network = network_policy(args)?;
    let limits = checked_limits(args)?;
    let from_stdin =
        args.code.is_none() && args.file.as_deref().is_none_or(|f| f == Path::new("-"));
    if from_stdin && std::io::stdin().is_terminal() {
        bail!("no program given: pass FILE, -c CODE, or pipe the program into stdin");
    }
    let store = Store::open(args.data_dir.as_deref());
    let image = resolve_image(&store, args)?;
    let bytecode = BytecodeCache::new(store.data_dir(), &image.rootfs);
    let (code, file_name) = if let Some(code) = &args.code {
        (code.clone().into_bytes(), None)
    } else if from_stdin {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .context("reading the program from stdin")?;
        (buf, None)
    } else {
        let path = args.file.as_ref().expect("not stdin");
        let code = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        (code, Some(path))
    };
    // --lang, else the file's extension, else a #! line, else Python.
    let lang = match args
        .lang
        .or_else(|| file_name.and_then(|p| language_of_path(p)))
    {
        Some(lang) => lang,
        None => language_of_shebang(&code)?.unwrap_or(Language::Python),
    };
    let policy = checked_policy(args, lang)?;
    if !image.languages.iter().any(|l| l == lang.name()) {
        bail!(
            "image `{}` has no {} interpreter (it has: {}): choose another --lang, or an image \
             with {}",
            image.name,
            lang.name(),
            image.languages.join(", "),
            lang.name()
        );
    }
    let name = file_name
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str())
        .filter(|n| {
            // Not a name of Corral's runtime beside it in /run/corral.
            !n.starts_with('.')
                && !n.starts_with("corral_")
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        })
        .unwrap_or(default_file_name(lang))
        .to_string();

    let mut input_files = Vec::new();
    for spec in &args.files {
        let (local, dest) = match spec.split_once(':') {
            Some((l, d)) => (PathBuf::from(l), PathBuf::from(d)),
            None => {
                let l = PathBuf::from(spec);
                let base = l
                    .file_name()
                    .map(PathBuf::from)
                    .with_context(|| format!("--file {spec}: no file name"))?;
                (l, base)
            }
        };
        let source = File::open(&local).with_context(|| format!("--file {}", local.display()))?;
        if !source.metadata()?.is_file() {
            bail!("--file {}: not a regular file", local.display());
        }
        corral_sandbox::workspace::checked_components(&dest)
            .with_context(|| format!("--file {spec}"))?;
        input_files.push(InputFile { source, dest });
    }

    // The one-shot runner sets the command line for the language.
    let mut spec = SandboxSpec::new(Vec::new());
    spec.rootfs = image.rootfs;
    // The image's environment first, so that --env overrides it.
    spec.env = image.env;
    spec.env.extend(args.env.iter().cloned());
    spec.limits = limits;
    spec.policy = Policy {
        strict: args.strict,
        allow_degraded: args.allow_degraded,
    };
    spec.egress = Egress::new(network);
    spec.input_files = input_files;
    let mut stdin_cut = None;
    if !from_stdin {
        if let Some((read, cut)) = feed_stdin(spec.limits.disk_bytes)? {
            spec.stdin = Some(read);
            stdin_cut = Some(cut);
        }
    }
    Ok(Prepared {
        spec,
        stdin_cut,
        language: lang,
        file_name: name,
        code,
        policy,
        bytecode,
    })
}

/// The image to run in. A built-in image that is not built yet is built first when the user
/// agrees (on a terminal, or with --yes); it is never replaced by another image.
fn resolve_image(store: &Store, args: &RunArgs) -> Result<ResolvedImage> {
    match store.resolve(&args.image) {
        Err(ImageError::NotBuilt {
            name,
            builtin: true,
        }) => {
            let command = crate::image::build_command(&name, args.data_dir.as_deref());
            if !(args.yes || crate::image::confirm_build(&name, &command)?) {
                bail!(
                    "image `{name}` is not built yet: build it once with `{command}` (a few \
                     minutes; needs root and the Debian mirror), or pass --yes to build it now"
                );
            }
            let recipe = Recipe::builtin(&name).expect("a built-in image has a recipe");
            crate::image::build(store, recipe)?;
            Ok(store.resolve(&name)?)
        }
        Err(ImageError::NotBuilt {
            name,
            builtin: false,
        }) => bail!(
            "no image named `{name}`: `corral image ls` lists the built ones; build yours with \
             `corral image build --recipe FILE`"
        ),
        other => Ok(other?),
    }
}

pub fn main(args: RunArgs) -> i32 {
    let prepared = match build_spec(&args) {
        Ok(p) => p,
        Err(e) => return fail(&args, &format!("{e:#}")),
    };
    // Everything written on the host (--out, result-N.png) shares one budget: what the
    // workspace could hold.
    let disk_bytes = prepared.spec.limits.disk_bytes;
    let limits = CopyLimits::for_workspace(disk_bytes);
    let mut out_dir = match args.out.as_deref().map(|dir| OutDir::create(dir, limits)) {
        None => None,
        Some(Ok(out)) => Some(out),
        Some(Err(e)) => return fail(&args, &format!("--out: {e}")),
    };
    let live = !args.json;
    let stdin_cut = prepared.stdin_cut;
    let mut spec = prepared.spec;
    // From here on a stop signal tears the sandbox down before Corral exits.
    let stop = match stop_signals().thread_block().and_then(|()| {
        nix::sys::signalfd::SignalFd::with_flags(
            &stop_signals(),
            nix::sys::signalfd::SfdFlags::SFD_CLOEXEC | nix::sys::signalfd::SfdFlags::SFD_NONBLOCK,
        )
    }) {
        Ok(fd) => fd,
        Err(e) => return fail(&args, &format!("setting up signal handling: {e}")),
    };
    match std::os::fd::AsFd::as_fd(&stop).try_clone_to_owned() {
        Ok(fd) => spec.stop = Some(fd),
        Err(e) => return fail(&args, &format!("setting up signal handling: {e}")),
    }
    let (mut stdout, mut stderr) = (std::io::stdout(), std::io::stderr());
    let (mut result, workspace) = corral_kernel::oneshot::run(
        spec,
        prepared.language,
        &prepared.file_name,
        prepared.code,
        &prepared.policy,
        Some(&prepared.bytecode),
        None,
        &mut |stream, bytes| {
            if live {
                let _ = match stream {
                    Stream::Stdout => stdout.write_all(bytes).and_then(|_| stdout.flush()),
                    Stream::Stderr => stderr.write_all(bytes).and_then(|_| stderr.flush()),
                };
            }
        },
    );
    // Stopped by a signal: the sandbox is gone already; nothing is copied, and Corral ends
    // as the signal asked (128 + its number, as a shell reports it).
    if let Ok(Some(siginfo)) = stop.read_signal() {
        drop(workspace);
        tell!(
            "stopped by signal {}: the sandbox was torn down",
            siginfo.ssi_signo
        );
        return 128 + siginfo.ssi_signo as i32;
    }
    let mut warnings = Vec::new();
    if stdin_cut.is_some_and(|cut| cut.load(Ordering::Relaxed)) {
        warnings.push(format!(
            "stdin was cut after {disk_bytes} bytes (--disk): the program read that much, then \
             end of file"
        ));
    }
    // The workspace's files first, so that an image never takes the name of one of them.
    if let (Some(out), Some(ws)) = (out_dir.as_mut(), &workspace) {
        let shown = format!("--out {}", out.path().display());
        match ws.copy_out(out) {
            Ok(report) => {
                if live {
                    for f in &report.copied {
                        // Names come from the sandbox: escape them before they reach a terminal.
                        let saved = out.path().join(&f.path).display().to_string();
                        tell!("saved {}", saved.escape_debug());
                    }
                }
                warnings.extend(skip_warnings(&shown, &report.skipped));
            }
            Err(e) => warnings.push(format!("{shown}: copying the workspace: {e}")),
        }
    }
    drop(workspace);
    if live {
        save_images(&result, out_dir.as_mut(), limits, &mut warnings);
    } else {
        // The result's `warnings` carry them too; stdout is the result object alone.
        for w in &warnings {
            tell!("warning: {w}");
        }
    }
    result.warnings.extend(warnings);
    report(&args, &result)
}

/// Warnings for the files a copy skipped: one per file for the first few, then how many
/// more; the files past a cap in one warning (the first, and how many more).
fn skip_warnings(what: &str, skipped: &[CopyError]) -> Vec<String> {
    let (mut over_bytes, mut over_entries, mut others) = (Vec::new(), Vec::new(), Vec::new());
    for e in skipped {
        match e {
            CopyError::OverByteCap { .. } => over_bytes.push(e),
            CopyError::TooManyEntries { .. } => over_entries.push(e),
            _ => others.push(e),
        }
    }
    let mut warnings: Vec<String> = others
        .iter()
        .take(MAX_SKIP_WARNINGS)
        .map(|e| format!("{what}: {e}"))
        .collect();
    if others.len() > MAX_SKIP_WARNINGS {
        warnings.push(format!(
            "{what}: {} more files were not copied",
            others.len() - MAX_SKIP_WARNINGS
        ));
    }
    for group in [over_bytes, over_entries] {
        match group.as_slice() {
            [] => {}
            [only] => warnings.push(format!("{what}: {only}")),
            [first, rest @ ..] => warnings.push(format!(
                "{what}: {first}; {} more files were not copied past the same cap",
                rest.len()
            )),
        }
    }
    warnings
}

/// Saves every PNG result in `out` (the current directory without --out) under the next free
/// name `result-N.png`, as a new file (an existing name, whatever it is, is passed over) and
/// within the budget left by the copy; names what it saved, warns about what it could not.
fn save_images(
    result: &ExecutionResult,
    out: Option<&mut OutDir>,
    limits: CopyLimits,
    warnings: &mut Vec<String>,
) {
    use base64::Engine as _;
    let mut pngs = result
        .results
        .iter()
        .filter_map(|r| r.png.as_deref())
        .peekable();
    if pngs.peek().is_none() {
        return;
    }
    let mut cwd;
    let dir = match out {
        Some(out) => out,
        None => match OutDir::open(Path::new("."), limits) {
            Ok(dir) => {
                cwd = dir;
                &mut cwd
            }
            Err(e) => {
                warnings.push(format!("images not saved: the current directory: {e}"));
                return;
            }
        },
    };
    let mut n = 0;
    for png in pngs {
        let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(png) else {
            continue;
        };
        loop {
            n += 1;
            if n > MAX_ENTRIES {
                warnings.push(format!(
                    "an image was not saved: {} has no free name result-N.png with N <= \
                     {MAX_ENTRIES}",
                    dir.path().display()
                ));
                return;
            }
            let name = PathBuf::from(format!("result-{n}.png"));
            match dir.write_new(&name, &mut &bytes[..], bytes.len() as u64) {
                Ok(_) => tell!("saved {}", dir.path().join(&name).display()),
                Err(CopyError::Exists(_)) => continue,
                Err(e) => warnings.push(format!(
                    "an image was not saved in {}: {e}",
                    dir.path().display()
                )),
            }
            break;
        }
    }
}

/// Prints the result (the object with `--json`, else warnings and notes on stderr) and returns
/// the exit code, which follows the status the same way with and without `--json`.
fn report(args: &RunArgs, result: &ExecutionResult) -> i32 {
    if args.json {
        let json = serde_json::to_string(result).expect("result serializes");
        let _ = writeln!(std::io::stdout(), "{json}");
    } else {
        for w in &result.warnings {
            tell!("warning: {w}");
        }
        // What the egress proxy refused, in the words a model or a person can act on.
        for d in result.network.iter().flat_map(|n| &n.denials) {
            tell!(
                "egress {}:{} refused ({}): {}",
                printable(&d.host),
                d.port,
                d.reason.name(),
                printable(&d.message)
            );
        }
        // A cut stream ends with a marker in the stream itself, where its reader looks.
        let cap = Limits::default().output_bytes;
        if result.stdout_truncated {
            let _ = write!(
                std::io::stdout(),
                "\n[corral: stdout was cut at {cap} bytes; the rest was dropped]\n"
            );
        }
        if result.stderr_truncated {
            tell!("stderr was cut at {cap} bytes; the rest was dropped");
        }
        // A program that ran said what went wrong itself; one refused before it started
        // (the code policy's max_code_bytes) did not.
        let started = result.exit_code.is_some() || result.signal.is_some();
        if result.status != Status::Success && (result.status != Status::Error || !started) {
            if let Some(msg) = &result.error_message {
                tell!("{msg}");
            }
        }
    }
    exit_code(result)
}

/// The exit code of `corral run`: the program's own (128 + the signal that killed it, as a
/// shell says), else one that names the status, as `timeout(1)` and the shells do.
fn exit_code(result: &ExecutionResult) -> i32 {
    match result.status {
        Status::Timeout => 124,
        Status::MemoryLimit => 137,
        Status::SandboxError => 125,
        Status::Success | Status::Error => result
            .exit_code
            .or(result.signal.map(|s| 128 + s))
            .unwrap_or(1),
    }
}

/// `text` (which may carry names a sandbox chose) with its control characters escaped, for a
/// terminal.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| match c.is_control() {
            true => c.escape_default().to_string(),
            false => c.to_string(),
        })
        .collect()
}

/// A failure before any sandbox existed: still a result object in --json mode.
fn fail(args: &RunArgs, message: &str) -> i32 {
    report(args, &ExecutionResult::sandbox_error(message))
}

#[cfg(test)]
mod tests {
    use corral_egress::policy::NameRefusal;

    use super::{
        exit_code, language_of_shebang, parse_net_flag, ExecutionResult, Language, NetFlagError,
        NetworkPolicy, PolicyError, Status,
    };

    #[test]
    fn the_exit_code_is_the_programs_or_names_the_status() {
        let result = |status, exit_code, signal| {
            let mut result = ExecutionResult::sandbox_error("");
            (result.status, result.exit_code, result.signal) = (status, exit_code, signal);
            result
        };
        assert_eq!(exit_code(&result(Status::Success, Some(0), None)), 0);
        assert_eq!(exit_code(&result(Status::Error, Some(7), None)), 7);
        assert_eq!(exit_code(&result(Status::Error, None, Some(9))), 137);
        assert_eq!(exit_code(&result(Status::Error, None, None)), 1);
        assert_eq!(exit_code(&result(Status::Timeout, None, Some(9))), 124);
        assert_eq!(exit_code(&result(Status::MemoryLimit, None, Some(9))), 137);
        assert_eq!(exit_code(&result(Status::SandboxError, Some(0), None)), 125);
    }

    #[test]
    fn the_flag_takes_none_or_an_allow_list() {
        assert!(matches!(
            parse_net_flag("none", &[]),
            Ok(NetworkPolicy::None)
        ));
        assert!(matches!(
            parse_net_flag("all", &[]),
            Err(NetFlagError::Syntax(_))
        ));
        assert!(matches!(
            parse_net_flag("allow:", &[]),
            Err(NetFlagError::Syntax(_))
        ));
        let p = parse_net_flag("allow:a.com,b.com:22", &["a.com".into()]).unwrap();
        assert_eq!(p.check_name("a.com", 443), Ok(true));
        assert_eq!(p.check_name("b.com", 22), Ok(false));
        assert_eq!(p.check_name("b.com", 443), Err(NameRefusal::Port));
        assert_eq!(p.check_name("c.com", 443), Err(NameRefusal::NotListed));
        assert!(matches!(
            parse_net_flag("allow:a.com", &["b.com".into()]),
            Err(NetFlagError::Policy(PolicyError::PrivateNotAllowed { .. }))
        ));
        assert!(parse_net_flag("none", &["a.com".into()]).is_err());
    }

    #[test]
    fn a_shebang_names_the_language() {
        let cases: [(&[u8], Option<Language>); 9] = [
            (
                b"#!/usr/bin/env node\nconsole.log(1)",
                Some(Language::Javascript),
            ),
            (
                b"#!/usr/bin/env -S node --no-warnings\n",
                Some(Language::Javascript),
            ),
            (b"#!/usr/bin/nodejs", Some(Language::Javascript)),
            (b"#!/bin/bash -e\necho", Some(Language::Bash)),
            (b"#!/bin/sh\n", Some(Language::Bash)),
            (b"#!/usr/bin/python3.11 -u\n", Some(Language::Python)),
            (
                b"#! /usr/bin/env PYTHONHASHSEED=0 python3\n",
                Some(Language::Python),
            ),
            (b"print(1)\n", None),
            (b"", None),
        ];
        for (code, want) in cases {
            assert_eq!(
                language_of_shebang(code).unwrap(),
                want,
                "{}",
                String::from_utf8_lossy(code)
            );
        }
        let err = language_of_shebang(b"#!/usr/bin/env ruby\n").unwrap_err();
        assert!(err.to_string().contains("`ruby`"), "{err}");
    }
}
