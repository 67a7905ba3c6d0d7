//! `corral mcp` (the MCP server of docs/mcp.md) and `corral tools` (its tools as
//! function-calling definitions).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use corral_mcp::http::{Auth, KeyCheck};
use corral_mcp::schema::{function_tools, Format};
use corral_mcp::{Backend, InProcess, Remote, Shared};
use corral_service::service::PolicyRequest;
use corral_service::{Config, Service, Tenant};
use corral_wire::shutdown_signal;

/// Warm sessions kept ready when neither `--pool-size` nor a config file says otherwise: an
/// MCP server usually serves one user.
const DEFAULT_POOL_SIZE: usize = 2;

#[derive(Debug, Args)]
pub struct McpArgs {
    /// Serve streamable HTTP at http://ADDR/mcp instead of stdio; anything but loopback
    /// requires API keys (`Authorization: Bearer KEY`).
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// Use a running `corral serve` at URL instead of running sandboxes in this process.
    #[arg(long, value_name = "URL")]
    server: Option<String>,
    /// The API key for --server (callers over --http that bring their own key use theirs).
    #[arg(
        long,
        env = "CORRAL_API_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    api_key: Option<String>,
    /// A TOML file of server settings (as for `corral serve`); flags override it.
    #[arg(long, value_name = "FILE", conflicts_with = "server")]
    config: Option<PathBuf>,
    /// The image store (as for `corral image`).
    #[arg(long, env = "CORRAL_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// The SQLite database of keys, sessions and the audit log (default: DATA_DIR/corral.db).
    #[arg(long, value_name = "FILE", conflicts_with = "server")]
    db: Option<PathBuf>,
    /// Python sessions of the default image kept forked ahead (default 2 here; 0: none).
    #[arg(long, value_name = "N", conflicts_with = "server")]
    pool_size: Option<usize>,
    /// Code policy of the sessions the tools make: a module the code may import (repeatable,
    /// or comma-separated); given any, it may import only these. It narrows the key's policy
    /// (`[code_policy]` of the config, or the server's). Defence in depth, not a boundary.
    #[arg(long = "allow-module", value_name = "MODULE", value_delimiter = ',')]
    allow_modules: Vec<String>,
    /// Code policy: a module the code may not import (repeatable, or comma-separated).
    #[arg(long = "deny-module", value_name = "MODULE", value_delimiter = ',')]
    deny_modules: Vec<String>,
    /// Code policy: the longest code of one call (e.g. 100K).
    #[arg(long, value_name = "SIZE", value_parser = crate::run::parse_size)]
    max_code_bytes: Option<u64>,
}

/// The code policy the flags ask for, if any, checked before anything starts.
fn policy(args: &McpArgs) -> Result<Option<PolicyRequest>> {
    let (allow, deny) = (&args.allow_modules, &args.deny_modules);
    if allow.is_empty() && deny.is_empty() && args.max_code_bytes.is_none() {
        return Ok(None);
    }
    crate::run::policy_of_flags(allow, deny, args.max_code_bytes)?;
    Ok(Some(PolicyRequest {
        allowed_modules: (!allow.is_empty()).then(|| allow.clone()),
        denied_modules: (!deny.is_empty()).then(|| deny.clone()),
        max_code_bytes: args.max_code_bytes,
    }))
}

fn config(args: &McpArgs) -> Result<Config> {
    let mut config = match &args.config {
        Some(path) => Config::from_file(path)?,
        None => Config {
            pool_size: DEFAULT_POOL_SIZE,
            ..Config::default()
        },
    };
    if args.data_dir.is_some() {
        config.data_dir = args.data_dir.clone();
    }
    if args.db.is_some() {
        config.db = args.db.clone();
    }
    if let Some(n) = args.pool_size {
        config.pool_size = n;
    }
    Ok(config)
}

pub fn mcp(args: McpArgs) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let policy = policy(&args)?;
    // `header_timeout_s` of the config file (or its default), for `--http` in either mode.
    let header_timeout = config(&args)?.header_timeout();
    runtime.block_on(async move {
        let listener = match args.http {
            Some(addr) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("listening on {addr}"))?,
            ),
            None => None,
        };
        let (backend, service, check): (Arc<dyn Backend>, Option<Arc<Service>>, KeyCheck) =
            match &args.server {
                Some(url) => {
                    // The server checks the keys: callers are told apart by their key.
                    let check: KeyCheck =
                        Arc::new(|k| Ok(Some(Tenant(corral_service::db::hash_key(k)))));
                    (
                        Arc::new(Remote::new(url, args.api_key.clone())),
                        None,
                        check,
                    )
                }
                None => {
                    let config = config(&args)?;
                    let service =
                        tokio::task::spawn_blocking(move || Service::start(config)).await??;
                    let db = service.clone();
                    let check: KeyCheck = Arc::new(move |k| {
                        db.db()
                            .verify_key(k)
                            .map(|id| id.map(Tenant))
                            .map_err(|e| e.to_string())
                    });
                    (
                        Arc::new(InProcess::new(service.clone())),
                        Some(service),
                        check,
                    )
                }
            };
        let shared = Shared::new(backend, policy);
        let served = match listener {
            Some(listener) => {
                let addr = listener.local_addr()?;
                let required = !addr.ip().is_loopback();
                eprintln!(
                    "corral: MCP on http://{addr}/mcp{}",
                    if required {
                        " (API keys required)"
                    } else {
                        " (loopback: requests without a key act as tenant `local`)"
                    }
                );
                let auth = Auth { required, check };
                corral_mcp::http::serve(shared, listener, auth, header_timeout, shutdown_signal())
                    .await
                    .map_err(anyhow::Error::from)
            }
            None => tokio::select! {
                r = corral_mcp::serve_stdio(shared) => r.map_err(anyhow::Error::from),
                _ = shutdown_signal() => Ok(()),
            },
        };
        if let Some(service) = service {
            tokio::task::spawn_blocking(move || service.close_all()).await?;
        }
        served
    })
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ToolFormat {
    /// Chat Completions / Responses-style `{"type": "function", "function": {...}}`.
    Openai,
    /// Messages API `{"name", "description", "input_schema"}`.
    Anthropic,
}

#[derive(Debug, Args)]
pub struct ToolsArgs {
    #[arg(long, value_enum, default_value = "openai")]
    format: ToolFormat,
}

pub fn tools(args: ToolsArgs) -> Result<()> {
    let format = match args.format {
        ToolFormat::Openai => Format::Openai,
        ToolFormat::Anthropic => Format::Anthropic,
    };
    println!("{}", serde_json::to_string_pretty(&function_tools(format))?);
    Ok(())
}
