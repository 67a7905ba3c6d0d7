//! `corral serve` (the HTTP API) and `corral key` (its API keys).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use corral_service::db::{Db, KeyAdded};
use corral_service::{Config, Service};

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
    /// This node's name in a cluster behind `corral route` (its sandbox ids end in it;
    /// docs/scale-out.md). In Kubernetes, the pod's name.
    #[arg(long, env = "CORRAL_NODE_NAME", value_name = "NAME")]
    node_name: Option<corral_kernel::NodeName>,
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
    if args.node_name.is_some() {
        config.node_name = args.node_name;
    }
    let listen = config.listen;
    let requires_keys = config.requires_keys();
    // Checked before the runtime is sized from it (Service::start checks it again).
    config.check()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(config.blocking_threads)
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
    /// Add a key made elsewhere (the same key on every node of a cluster): its secret is
    /// read from stdin (or --secret-file) and stored only hashed. Adding a key that is already there with the
    /// same name and secret changes nothing.
    Add {
        /// The key's id, as `corral key create` printed it (`key-` and 12 hex digits).
        #[arg(long)]
        id: String,
        #[arg(long, default_value = "default")]
        name: String,
        /// Read the secret from this file (a mounted Kubernetes Secret) instead of stdin.
        #[arg(long, value_name = "FILE")]
        secret_file: Option<PathBuf>,
        /// The key is an operator's (made with `corral key create --operator`).
        #[arg(long)]
        operator: bool,
    },
    /// List keys (never their secrets).
    Ls,
    /// Revoke a key by id.
    Revoke { id: String },
}

/// The longest secret `corral key add` takes (a secret of `corral key create` is 52 bytes).
const MAX_SECRET_BYTES: u64 = 256;

pub fn key(args: KeyArgs) -> Result<()> {
    let path = args.db.unwrap_or_else(|| {
        corral_image::Store::open(args.data_dir.as_deref())
            .data_dir()
            .join("corral.db")
    });
    // Only `create` may start a database; listing or revoking keys of one that does not exist
    // is a mistaken path, not an empty list.
    if !matches!(
        args.command,
        KeyCommand::Create { .. } | KeyCommand::Add { .. }
    ) && !path.exists()
    {
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
        KeyCommand::Add {
            id,
            name,
            secret_file,
            operator,
        } => {
            let mut secret = String::new();
            let source: Box<dyn std::io::Read> = match &secret_file {
                // A regular file only: a FIFO or a device is not a Secret's file.
                Some(path) => {
                    let file = std::fs::File::open(path)
                        .with_context(|| format!("opening {}", path.display()))?;
                    if !file.metadata()?.is_file() {
                        anyhow::bail!("{} is not a regular file", path.display());
                    }
                    Box::new(file)
                }
                None => Box::new(std::io::stdin()),
            };
            std::io::Read::read_to_string(
                &mut std::io::Read::take(source, MAX_SECRET_BYTES + 1),
                &mut secret,
            )
            .context("reading the secret")?;
            let secret = secret.trim_end_matches(['\n', '\r']);
            if secret.len() as u64 > MAX_SECRET_BYTES {
                anyhow::bail!("the secret is longer than {MAX_SECRET_BYTES} bytes");
            }
            let well_formed = id
                .strip_prefix("key-")
                .is_some_and(|hex| hex.len() == 12 && hex.bytes().all(|c| c.is_ascii_hexdigit()));
            if !well_formed {
                anyhow::bail!("key id {id:?}: ids are `key-` and 12 hex digits");
            }
            if secret.is_empty() {
                anyhow::bail!("the secret is empty");
            }
            match db.add_key(&id, &name, secret, operator)? {
                KeyAdded::New => eprintln!("corral: added key {id} ({name})"),
                KeyAdded::Unchanged => eprintln!("corral: key {id} ({name}) is already there"),
                KeyAdded::Differs => anyhow::bail!(
                    "key {id}: a key of that id with another name, secret or role (operator or \
                     not), or another key with that secret, is there already; nothing changed"
                ),
                KeyAdded::Revoked => anyhow::bail!("key {id} is revoked; it stays revoked"),
            }
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
