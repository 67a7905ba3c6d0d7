//! Corral's images: read-only root filesystems described by TOML recipes, built from Debian
//! packages with debootstrap, stored content-addressed by recipe hash.
//!
//! - [`Recipe`]: the description (built-ins `default` and `host`, or a user's file) and its
//!   hash, which names the image.
//! - [`Store`]: where images live; builds under a per-image lock in a temporary directory
//!   that is renamed into place only when complete; `list`, `remove`, `inspect`, `resolve`.
//! - the builder (`Store::build`): debootstrap, apt, pip, matplotlib's font cache, and a
//!   stripped, checked, manifested result, reporting [`progress::Event`]s as it goes.

mod builder;
pub mod debian;
mod manifest;
pub mod progress;
pub mod recipe;
mod store;

use std::io;
use std::path::PathBuf;

pub use manifest::Manifest;
pub use progress::{Event, Phase, Progress};
pub use recipe::{Kind, Recipe};
pub use store::{Built, ResolvedImage, Store, StoredImage, SHARED_DATA_DIR};

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("recipe {}: {message}", path.display())]
    Recipe { path: PathBuf, message: String },
    /// Something about the host prevents building (no suite, no mirror).
    #[error("{message}")]
    Host { message: String },
    /// A build step went wrong outside any tool.
    #[error("{0}")]
    Build(String),
    /// No image of that name is built (`builtin`: a built-in recipe exists for it).
    #[error("image `{name}` is not built")]
    NotBuilt { name: String, builtin: bool },
    #[error("`{name}` matches several images ({}); give more of the hash", candidates.join(", "))]
    Ambiguous {
        name: String,
        candidates: Vec<String>,
    },
    #[error(
        "building an image needs root (debootstrap, chroot and apt run as root): run it as \
         root or through sudo"
    )]
    NeedsRoot,
    #[error("the `host` image is the host's own /usr, bound read-only: there is nothing to build")]
    NothingToBuild,
    #[error("{0}")]
    Tool(Box<ToolFailure>),
    #[error(
        "image `{name}` is stored under {}, which the sandbox's unprivileged user cannot \
         enter ({} is not searchable by others): store images elsewhere with --data-dir \
         (or CORRAL_DATA_DIR), e.g. {SHARED_DATA_DIR}, and build it there",
        path.display(),
        blocker.display()
    )]
    Unreachable {
        name: String,
        path: PathBuf,
        blocker: PathBuf,
    },
    #[error(
        "image `{name}` is in the shared store {}, not in {}: remove it there as root \
         (`sudo corral image rm {name}`)",
        shared.display(),
        own.display()
    )]
    InSharedStore {
        name: String,
        shared: PathBuf,
        own: PathBuf,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

impl ImageError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> ImageError {
        let what = what.into();
        move |source| ImageError::Io { what, source }
    }
}

/// A build tool that failed: what ran, how it ended, its last lines of output, and what to do.
#[derive(Debug)]
pub struct ToolFailure {
    pub phase: Phase,
    pub command: String,
    pub status: String,
    pub tail: Vec<String>,
    pub log: PathBuf,
    pub hint: String,
}

impl std::fmt::Display for ToolFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} failed: `{}` {}",
            self.phase, self.command, self.status
        )?;
        if !self.tail.is_empty() {
            f.write_str("\nlast lines of its output:")?;
            for line in &self.tail {
                write!(f, "\n  | {line}")?;
            }
        }
        write!(
            f,
            "\nfull build log: {}\nwhat to do: {}",
            self.log.display(),
            self.hint
        )
    }
}
