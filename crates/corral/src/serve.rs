//! `corral serve` (the HTTP API) and `corral key` (its API keys).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use corral_server::db::Db;
use corral_server::{Config, Service};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on; anything but loopback requires API keys.
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// A TOML file of settings (docs/api.md lists them); flags override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The image store (as for `corral image`).
    #[arg(long, env = "CORRAL_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// The SQLite database of keys, sessions and the audit log (default: DATA_DIR/corral.db).
    #[arg(long, value_name = "FILE")]
    db: Option<PathBuf>,
    /// Python sessions of the default image kept forked ahead (0: none).
    #[arg(long, value_name = "N")]
    pool_size: Option<usize>,
}

pub fn serve(args: ServeArgs) -> Result<()> {
    let mut config = match &args.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if args.data_dir.is_some() {
        config.data_dir = args.data_dir;
    }
    if args.db.is_some() {
        config.db = args.db;
    }
    if let Some(n) = args.pool_size {
        config.pool_size = n;
    }
    let listen = config.listen;
    let requires_keys = config.requires_keys();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        // Bind first: a taken port fails before any sandbox starts.
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        let service = tokio::task::spawn_blocking(move || Service::start(config)).await??;
        let address = listener.local_addr()?;
        eprintln!(
            "corral: listening on http://{address}{}",
            if requires_keys {
                " (API keys required)"
            } else {
                " (loopback: requests without a key act as tenant `local`)"
            }
        );
        eprintln!("corral: the web console is at http://{address}/ (docs/console.md)");
        corral_server::serve(service, listener).await
    })
}

#[derive(Debug, Args)]
pub struct KeyArgs {
    #[command(subcommand)]
    command: KeyCommand,
    /// The server's database (default: DATA_DIR/corral.db, as `corral serve` uses).
    #[arg(long, global = true, value_name = "FILE")]
    db: Option<PathBuf>,
    /// The data directory whose corral.db to use.
    #[arg(long, global = true, env = "CORRAL_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum KeyCommand {
    /// Make a key; its secret is printed once, on stdout, and stored only hashed.
    Create {
        #[arg(long, default_value = "default")]
        name: String,
        /// An operator key: it also sees every key's sandboxes and audit log, and lists,
        /// makes and revokes keys through the API (docs/api.md, "Operators").
        #[arg(long)]
        operator: bool,
    },
    /// List keys (never their secrets).
    Ls,
    /// Revoke a key by id.
    Revoke { id: String },
}

pub fn key(args: KeyArgs) -> Result<()> {
    let path = args.db.unwrap_or_else(|| {
        corral_image::Store::open(args.data_dir.as_deref())
            .data_dir()
            .join("corral.db")
    });
    // Only `create` may start a database; listing or revoking keys of one that does not exist
    // is a mistaken path, not an empty list.
    if !matches!(args.command, KeyCommand::Create { .. }) && !path.exists() {
        anyhow::bail!(
            "no database at {} (`corral serve` and `corral key create` make one; pass the \
             server's --db or --data-dir)",
            path.display()
        );
    }
    let db = Db::open(&path).with_context(|| format!("opening {}", path.display()))?;
    match args.command {
        KeyCommand::Create { name, operator } => {
            let (id, secret) = db.create_key(&name, operator)?;
            let role = if operator { ", an operator key" } else { "" };
            eprintln!("corral: created key {id} ({name}{role}); the secret is shown only now:");
            println!("{secret}");
        }
        KeyCommand::Ls => {
            for k in db.list_keys()? {
                let created =
                    std::time::UNIX_EPOCH + std::time::Duration::from_secs(k.created_at as u64);
                println!(
                    "{}  {}  created {}{}{}",
                    k.id,
                    k.name,
                    humantime::format_rfc3339_seconds(created),
                    if k.operator { "  OPERATOR" } else { "" },
                    if k.revoked { "  REVOKED" } else { "" }
                );
            }
        }
        KeyCommand::Revoke { id } => {
            if !db.revoke_key(&id)? {
                anyhow::bail!("no live key {id} (`corral key ls` lists them)");
            }
            eprintln!("corral: revoked {id}");
        }
    }
    Ok(())
}
