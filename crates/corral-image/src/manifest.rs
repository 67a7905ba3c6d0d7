//! The manifest: what a built image is, written next to its root filesystem.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::recipe::CanonicalRecipe;

/// `manifest.json` of a built image (also what `corral image inspect` prints).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub name: String,
    /// The recipe's hash: the image's id and directory name.
    pub hash: String,
    /// The recipe as built (suite resolved, lists sorted).
    pub recipe: CanonicalRecipe,
    /// `sha256:` of the root filesystem's tree (paths, modes, link targets, file contents),
    /// to check an image is still what was built.
    pub content_hash: String,
    /// Disk usage of the root filesystem (hard links counted once).
    pub size_bytes: u64,
    /// RFC 3339, UTC.
    pub created: String,
    pub build_seconds: f64,
    /// The archive the image was bootstrapped from (read from the host's apt sources).
    pub mirror: String,
    /// Languages `corral run --lang` accepts with this image (`python`, `javascript`, `bash`).
    pub languages: Vec<String>,
    /// Every installed Debian package and its version.
    pub packages: BTreeMap<String, String>,
    /// Packages installed from PyPI and their versions.
    pub pypi_packages: BTreeMap<String, String>,
    /// Optional packages the suite does not have (so were not installed).
    pub skipped_packages: Vec<String>,
    /// Environment of every sandbox using the image.
    pub env: BTreeMap<String, String>,
}
