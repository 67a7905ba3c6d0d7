//! Recipes: the small TOML description an image is built from, and its hash.
//!
//! A recipe is checked completely when it is parsed, so a mistake is reported with the
//! field that holds it before any minutes are spent bootstrapping.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ImageError;

/// Changes whenever the build procedure changes what ends up in an image, so that every
/// image is rebuilt by the new procedure (the version is part of every recipe's hash).
pub const BUILDER_VERSION: u32 = 1;

/// The suite value meaning "the host's own Debian suite".
pub const HOST_SUITE: &str = "host";

const DEFAULT_RECIPE: &str = include_str!("../recipes/default.toml");

/// Names of the built-in recipes; user recipes cannot take them.
pub const BUILTIN_NAMES: [&str; 2] = ["default", "host"];

/// How an image's root filesystem comes to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Bootstrapped from Debian packages and stored.
    Debian,
    /// The host's own `/usr`, bound read-only: nothing to build.
    Host,
}

/// A file the recipe copies into the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopiedFile {
    /// Absolute host path (relative paths in the recipe are relative to the recipe file).
    pub src: PathBuf,
    /// Absolute path inside the image.
    pub dest: PathBuf,
    pub mode: u32,
    /// SHA-256 of the contents when the recipe was read: the hash covers the contents, so
    /// editing a copied file rebuilds the image.
    pub sha256: String,
}

/// A checked recipe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipe {
    pub name: String,
    pub kind: Kind,
    /// A Debian suite name, or [`HOST_SUITE`] until [`Recipe::with_host_suite`] resolves it.
    pub suite: String,
    /// Sorted and without duplicates: apt's result does not depend on the order.
    pub packages: Vec<String>,
    pub optional_packages: Vec<String>,
    pub pypi: Vec<String>,
    pub files: Vec<CopiedFile>,
    pub env: BTreeMap<String, String>,
}

/// What a recipe file may contain. Unknown keys are errors, so a typo never silently
/// drops a package.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecipeFile {
    name: String,
    #[serde(default = "host_suite")]
    suite: String,
    #[serde(default)]
    packages: Vec<String>,
    #[serde(default)]
    optional_packages: Vec<String>,
    #[serde(default)]
    pypi: Vec<String>,
    #[serde(default)]
    files: Vec<FileEntry>,
    #[serde(default)]
    env: BTreeMap<String, String>,
}

fn host_suite() -> String {
    HOST_SUITE.to_string()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileEntry {
    src: PathBuf,
    dest: PathBuf,
    mode: Option<u32>,
}

/// The part of a recipe that determines the image: what is hashed, and what the manifest
/// records as the recipe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CanonicalRecipe {
    pub builder_version: u32,
    pub name: String,
    pub kind: Kind,
    pub suite: String,
    pub packages: Vec<String>,
    pub optional_packages: Vec<String>,
    pub pypi: Vec<String>,
    pub files: Vec<CanonicalFile>,
    pub env: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CanonicalFile {
    pub dest: PathBuf,
    pub mode: u32,
    pub sha256: String,
}

impl Recipe {
    /// A built-in recipe by name.
    pub fn builtin(name: &str) -> Option<Recipe> {
        match name {
            "default" => Some(
                parse(DEFAULT_RECIPE, Path::new("/"), Origin::Builtin)
                    .expect("the built-in default recipe is valid"),
            ),
            "host" => Some(Recipe {
                name: "host".into(),
                kind: Kind::Host,
                suite: HOST_SUITE.into(),
                packages: Vec::new(),
                optional_packages: Vec::new(),
                pypi: Vec::new(),
                files: Vec::new(),
                env: BTreeMap::new(),
            }),
            _ => None,
        }
    }

    /// Reads a user's recipe file.
    pub fn from_file(path: &Path) -> Result<Recipe, ImageError> {
        let text = std::fs::read_to_string(path).map_err(|e| ImageError::Recipe {
            path: path.to_path_buf(),
            message: format!("cannot read it: {e}"),
        })?;
        let base = path
            .canonicalize()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .unwrap_or_else(|| PathBuf::from("."));
        parse(&text, &base, Origin::File).map_err(|message| ImageError::Recipe {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Parses recipe text; relative `files` sources are taken relative to `base`.
    pub fn parse(text: &str, base: &Path) -> Result<Recipe, String> {
        parse(text, base, Origin::File)
    }

    /// Replaces the suite `host` with the host's codename (the hash then names the suite
    /// actually built).
    pub fn with_host_suite(mut self, codename: &str) -> Recipe {
        if self.suite == HOST_SUITE {
            self.suite = codename.to_string();
        }
        self
    }

    pub fn canonical(&self) -> CanonicalRecipe {
        CanonicalRecipe {
            builder_version: BUILDER_VERSION,
            name: self.name.clone(),
            kind: self.kind,
            suite: self.suite.clone(),
            packages: self.packages.clone(),
            optional_packages: self.optional_packages.clone(),
            pypi: self.pypi.clone(),
            files: self
                .files
                .iter()
                .map(|f| CanonicalFile {
                    dest: f.dest.clone(),
                    mode: f.mode,
                    sha256: f.sha256.clone(),
                })
                .collect(),
            env: self.env.clone(),
        }
    }

    /// The image's id: SHA-256 of the canonical recipe as JSON (fields in a fixed order,
    /// lists sorted, maps ordered), as 64 lowercase hex digits.
    pub fn hash(&self) -> String {
        let json = serde_json::to_vec(&self.canonical()).expect("a recipe serializes");
        hex::encode(Sha256::digest(&json))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Builtin,
    File,
}

fn parse(text: &str, base: &Path, origin: Origin) -> Result<Recipe, String> {
    let file: RecipeFile = toml::from_str(text).map_err(|e| e.to_string())?;

    check_name(&file.name)?;
    if origin == Origin::File && BUILTIN_NAMES.contains(&file.name.as_str()) {
        return Err(format!(
            "name = {:?} is reserved for the built-in image; choose another name",
            file.name
        ));
    }
    if file.suite != HOST_SUITE && !is_simple_word(&file.suite) {
        return Err(format!(
            "suite = {:?}: expected a Debian suite such as \"bookworm\", or \"host\"",
            file.suite
        ));
    }
    let packages = debian_packages("packages", file.packages)?;
    let optional_packages = debian_packages("optional_packages", file.optional_packages)?;
    let mut pypi = Vec::new();
    for req in file.pypi {
        if req.trim().is_empty() || req.starts_with('-') || req.chars().any(char::is_control) {
            return Err(format!(
                "pypi: {req:?} is not a requirement (expected e.g. \"polars==1.2\"; pip \
                 options are not allowed)"
            ));
        }
        pypi.push(req);
    }
    pypi.sort();
    pypi.dedup();

    let mut files = Vec::new();
    for entry in file.files {
        files.push(copied_file(entry, base)?);
    }
    for (key, value) in &file.env {
        let valid = key
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!(
                "env: {key:?} is not a variable name (letters, digits and _)"
            ));
        }
        if value.contains('\0') {
            return Err(format!("env: the value of {key} contains a NUL byte"));
        }
    }

    Ok(Recipe {
        name: file.name,
        kind: Kind::Debian,
        suite: file.suite,
        packages,
        optional_packages,
        pypi,
        files,
        env: file.env,
    })
}

fn check_name(name: &str) -> Result<(), String> {
    let valid = (1..=64).contains(&name.len())
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c));
    if valid {
        Ok(())
    } else {
        Err(format!(
            "name = {name:?}: use 1 to 64 lowercase letters, digits, '.', '_' or '-', \
             starting with a letter or digit"
        ))
    }
}

fn is_simple_word(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// Debian package names (policy §5.6.1), optionally pinned as `name=version`. Checked
/// strictly because they become apt-get arguments.
fn debian_packages(field: &str, list: Vec<String>) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for p in list {
        let (name, version) = match p.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (p.as_str(), None),
        };
        let name_ok = name.len() >= 2
            && name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c));
        let version_ok = version.is_none_or(|v| {
            !v.is_empty()
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".+~:-".contains(c))
        });
        if !name_ok || !version_ok {
            return Err(format!(
                "{field}: {p:?} is not a Debian package name (expected e.g. \"python3-numpy\" \
                 or \"python3-numpy=1:1.24.2-1\")"
            ));
        }
        out.push(p);
    }
    out.sort();
    out.dedup();
    Ok(out)
}

fn copied_file(entry: FileEntry, base: &Path) -> Result<CopiedFile, String> {
    let shown = entry.src.display().to_string();
    let src = base.join(&entry.src);
    let meta = std::fs::metadata(&src).map_err(|e| format!("files: src {shown:?}: {e}"))?;
    if !meta.is_file() {
        return Err(format!(
            "files: src {shown:?} is not a regular file (list each file to copy)"
        ));
    }
    let dest = &entry.dest;
    let normal: Vec<_> = dest.components().skip(1).collect();
    if !dest.is_absolute()
        || normal.is_empty()
        || normal.iter().any(|c| !matches!(c, Component::Normal(_)))
    {
        return Err(format!(
            "files: dest {:?} must be an absolute path without '..' (e.g. \"/opt/data/x.csv\")",
            dest.display()
        ));
    }
    if let Some(Component::Normal(top)) = normal.first() {
        // What the engine never binds from an image is invisible in a sandbox, except /etc,
        // which it binds on its own.
        if corral_sandbox::rootfs::IMAGE_SKIPPED
            .iter()
            .any(|d| top == d && *d != "etc")
        {
            return Err(format!(
                "files: dest {:?} is under /{}, which sandboxes never see from the image",
                dest.display(),
                top.to_string_lossy()
            ));
        }
    }
    let mode = entry.mode.unwrap_or(0o644);
    if mode > 0o777 {
        return Err(format!(
            "files: mode {mode:#o} for {:?}: only permission bits (at most 0o777) are allowed",
            dest.display()
        ));
    }
    let contents = std::fs::read(&src).map_err(|e| format!("files: src {shown:?}: {e}"))?;
    Ok(CopiedFile {
        src,
        dest: dest.clone(),
        mode,
        sha256: hex::encode(Sha256::digest(&contents)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(text: &str) -> Result<Recipe, String> {
        Recipe::parse(text, Path::new("/nonexistent"))
    }

    #[test]
    fn default_recipe_has_the_data_science_stack() {
        let r = Recipe::builtin("default").unwrap();
        assert_eq!(r.kind, Kind::Debian);
        assert_eq!(r.suite, HOST_SUITE);
        for p in [
            "python3",
            "python3-numpy",
            "python3-pandas",
            "python3-matplotlib",
            "python3-scipy",
            "python3-seaborn",
            "ipython3",
            "python3-openpyxl",
            "python3-pil",
            "nodejs",
            "bash",
            "coreutils",
            "ca-certificates",
            "fonts-dejavu-core",
        ] {
            assert!(r.packages.iter().any(|x| x == p), "{p} missing");
        }
        assert_eq!(r.optional_packages, ["python3-pyarrow"]);
        assert_eq!(r.env.get("MPLBACKEND").map(String::as_str), Some("Agg"));
        assert_eq!(Recipe::builtin("host").unwrap().kind, Kind::Host);
        assert!(Recipe::builtin("nope").is_none());
    }

    #[test]
    fn minimal_recipe_gets_defaults() {
        let r = parse_str("name = \"tiny\"").unwrap();
        assert_eq!(r.suite, "host");
        assert!(r.packages.is_empty() && r.pypi.is_empty() && r.files.is_empty());
        assert_eq!(r.with_host_suite("bookworm").suite, "bookworm");
        let r = parse_str("name = \"tiny\"\nsuite = \"trixie\"").unwrap();
        assert_eq!(r.with_host_suite("bookworm").suite, "trixie");
    }

    #[test]
    fn bad_recipes_have_clear_errors() {
        let cases = [
            ("packages = [\"x\"]", "missing field `name`"),
            (
                "name = \"a\"\npackage = [\"python3\"]",
                "unknown field `package`",
            ),
            ("name = \"a\"\npackages = \"python3\"", "invalid type"),
            ("name = \"a\"\npackages = [\"python3\"", "expected"),
            (
                "name = \"Big Name\"",
                "name = \"Big Name\": use 1 to 64 lowercase",
            ),
            ("name = \"default\"", "reserved for the built-in image"),
            ("name = \"host\"", "reserved for the built-in image"),
            ("name = \"a\"\nsuite = \"../x\"", "expected a Debian suite"),
            (
                "name = \"a\"\npackages = [\"--allow-unauthenticated\"]",
                "packages: \"--allow-unauthenticated\" is not a Debian package name",
            ),
            (
                "name = \"a\"\noptional_packages = [\"Py Arrow\"]",
                "optional_packages: \"Py Arrow\" is not a Debian package name",
            ),
            (
                "name = \"a\"\npypi = [\"--index-url=http://evil\"]",
                "pip options are not allowed",
            ),
            (
                "name = \"a\"\n[env]\n\"A-B\" = \"1\"",
                "env: \"A-B\" is not a variable name",
            ),
            (
                "name = \"a\"\n[[files]]\nsrc = \"nope.csv\"\ndest = \"/opt/x\"",
                "files: src \"nope.csv\"",
            ),
            (
                "name = \"a\"\n[[files]]\ndest = \"/opt/x\"",
                "missing field `src`",
            ),
        ];
        for (text, expected) in cases {
            let err = parse_str(text).expect_err(text);
            assert!(
                err.contains(expected),
                "recipe {text:?}: error {err:?} does not contain {expected:?}"
            );
        }
    }

    #[test]
    fn toml_errors_point_at_the_line() {
        let err = parse_str("name = \"a\"\n\npackages = [\"python3\",\n  oops]\n").unwrap_err();
        assert!(err.contains("line 4"), "{err}");
    }

    #[test]
    fn copied_files_are_checked_and_hashed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("data.csv"), "a,b\n1,2\n").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let ok = "name = \"a\"\n[[files]]\nsrc = \"data.csv\"\ndest = \"/opt/data.csv\"\n";
        let r = Recipe::parse(ok, dir.path()).unwrap();
        assert_eq!(r.files[0].src, dir.path().join("data.csv"));
        assert_eq!(r.files[0].mode, 0o644);
        assert_eq!(
            r.files[0].sha256,
            hex::encode(Sha256::digest(b"a,b\n1,2\n"))
        );
        for (dest_and_mode, expected) in [
            ("dest = \"opt/data.csv\"", "must be an absolute path"),
            ("dest = \"/opt/../etc/x\"", "must be an absolute path"),
            ("dest = \"/\"", "must be an absolute path"),
            (
                "dest = \"/tmp/data.csv\"",
                "under /tmp, which sandboxes never see",
            ),
            ("dest = \"/workspace/d\"", "under /workspace"),
            ("dest = \"/opt/d\"\nmode = 0o4755", "only permission bits"),
        ] {
            let text = format!("name = \"a\"\n[[files]]\nsrc = \"data.csv\"\n{dest_and_mode}\n");
            let err = Recipe::parse(&text, dir.path()).unwrap_err();
            assert!(err.contains(expected), "{dest_and_mode}: {err}");
        }
        let text = "name = \"a\"\n[[files]]\nsrc = \"sub\"\ndest = \"/opt/sub\"\n";
        let err = Recipe::parse(text, dir.path()).unwrap_err();
        assert!(err.contains("not a regular file"), "{err}");
    }

    #[test]
    fn from_file_names_the_file_in_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.toml");
        std::fs::write(&path, "name = 3\n").unwrap();
        let err = Recipe::from_file(&path).unwrap_err().to_string();
        assert!(
            err.contains("r.toml") && err.contains("invalid type"),
            "{err}"
        );
        let err = Recipe::from_file(&dir.path().join("missing.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing.toml: cannot read it"), "{err}");
    }

    const SAMPLE: &str = r#"
        name = "sample"
        suite = "bookworm"
        packages = ["python3", "python3-numpy"]
        optional_packages = ["python3-pyarrow"]
        pypi = ["tabulate==0.9.0"]
        [env]
        A = "1"
        B = "2"
    "#;

    #[test]
    fn hash_is_stable() {
        // Pinned: a change here means every existing image of this recipe is rebuilt.
        // Bump it only together with BUILDER_VERSION or a deliberate format change.
        assert_eq!(
            parse_str(SAMPLE).unwrap().hash(),
            "e512eca1f815c20195aa0de28bb189c7a136db1977f9ab06f8dc08bd71b04f02"
        );
    }

    #[test]
    fn hash_ignores_order_formatting_and_comments() {
        let reordered = r#"
            # the same recipe, written differently
            pypi = [ "tabulate==0.9.0" ]
            packages = ["python3-numpy", "python3", "python3"]
            name = "sample"
            optional_packages = ["python3-pyarrow"]
            suite = "bookworm"
            env = { B = "2", A = "1" }
        "#;
        assert_eq!(
            parse_str(SAMPLE).unwrap().hash(),
            parse_str(reordered).unwrap().hash()
        );
    }

    #[test]
    fn hash_changes_with_what_is_built() {
        let base = parse_str(SAMPLE).unwrap().hash();
        for changed in [
            SAMPLE.replace("\"python3\", ", ""),
            SAMPLE.replace("bookworm", "trixie"),
            SAMPLE.replace("0.9.0", "0.9.1"),
            SAMPLE.replace("B = \"2\"", "B = \"3\""),
            SAMPLE.replace("sample", "sample2"),
        ] {
            assert_ne!(parse_str(&changed).unwrap().hash(), base, "{changed}");
        }
        let dir = tempfile::tempdir().unwrap();
        let with_file = format!("{SAMPLE}\n[[files]]\nsrc = \"f\"\ndest = \"/opt/f\"\n");
        std::fs::write(dir.path().join("f"), "one").unwrap();
        let one = Recipe::parse(&with_file, dir.path()).unwrap().hash();
        std::fs::write(dir.path().join("f"), "two").unwrap();
        let two = Recipe::parse(&with_file, dir.path()).unwrap().hash();
        assert_ne!(one, two, "editing a copied file must change the hash");
        assert_ne!(
            parse_str(SAMPLE).unwrap().with_host_suite("x").hash(),
            parse_str(&SAMPLE.replace("bookworm", "host"))
                .unwrap()
                .with_host_suite("trixie")
                .hash()
        );
    }
}
