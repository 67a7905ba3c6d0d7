//! Precompiled bytecode of the one-shot Python runtime, one cache per image.
//!
//! Python compiles the script it starts, and every module without bytecode, on every run: for
//! the one-shot runtime that is about 1 ms before `print(1)` runs and 4 ms more when a result
//! has to be formatted. So a sandbox of the image compiles the runtime once, before any user
//! code runs in it, and the host keeps the bytecode in its data directory, beside the sources
//! it writes from its own copies; later runs get that directory bound read-only. The files are
//! hash-checked `.pyc` (PEP 552): Python ignores a module's bytecode whose source differs, and
//! one made by another Python version carries another name and magic number. The runner
//! itself runs from its bytecode as the script, which Python does not check, so the host
//! checks it the same way (see [`compiled_from`]). A stale or mismatched cache costs speed,
//! never correctness. A cache is only ever used with the image whose sandbox made it.

use std::fs;
use std::hash::Hasher;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use base64::Engine;
use corral_sandbox::rootfs::RUNTIME_DIR;
use corral_sandbox::{Rootfs, SandboxSpec, Status};
use siphasher::sip::{SipHasher13, SipHasher24};
use siphasher::sip128::{Hasher128, SipHasher13 as SipHasher128};

use crate::runtime::{as_support_files, PYTHON_COMPILER, PYTHON_ONESHOT, PYTHON_ONESHOT_RUNTIME};

const MAX_PYC_BYTES: usize = 1 << 20;

/// SHA-256 of the one-shot runtime's file names and sources, computed by `build.rs`.
const ONESHOT_RUNTIME_SHA256: &str = env!("CORRAL_ONESHOT_RUNTIME_SHA256");

/// A filled cache, as a one-shot run uses it: a directory with the runtime's sources and, in
/// `__pycache__/`, their bytecode, bound read-only at [`RUNTIME_DIR`] (no per-run copies).
#[derive(Debug, Clone)]
pub struct Bytecode {
    pub dir: PathBuf,
    /// The runner as the sandbox sees it: its bytecode when that was compiled from this
    /// runtime's runner (see [`compiled_from`]), else its source.
    pub runner: String,
}

#[derive(Debug, Clone)]
pub struct BytecodeCache {
    dir: PathBuf,
}

impl BytecodeCache {
    /// The cache for sandboxes of `rootfs`, under `data_dir`.
    pub fn new(data_dir: &Path, rootfs: &Rootfs) -> BytecodeCache {
        let image = match rootfs {
            // The host's Python can be upgraded in place: its binary's identity is the key.
            Rootfs::Host => {
                let python = fs::metadata("/usr/bin/python3");
                let identity = python.map_or((0, 0), |m| {
                    use std::os::unix::fs::MetadataExt;
                    (m.len(), m.mtime())
                });
                format!("host {identity:?}")
            }
            // Built images are content-addressed: the path names the content.
            Rootfs::Directory(path) => format!("dir {}", path.display()),
        };
        // The runtime's digest is the build's; a run only names the directory, for which
        // SipHash is enough (no name here is chosen by an adversary).
        let mut key = SipHasher128::new();
        key.write(ONESHOT_RUNTIME_SHA256.as_bytes());
        key.write(image.as_bytes());
        key.write(b"sources beside __pycache__/");
        BytecodeCache {
            dir: data_dir
                .join("bytecode")
                .join(format!("{:032x}", key.finish128().as_u128())),
        }
    }

    /// The cached runtime, once filled.
    pub fn load(&self) -> Option<Bytecode> {
        let pycache = self.dir.join("__pycache__");
        let mut runner = format!("{RUNTIME_DIR}/{}", PYTHON_ONESHOT.0);
        let mut filled = false;
        for entry in fs::read_dir(&pycache).ok()? {
            let name = entry.ok()?.file_name().into_string().ok()?;
            if !valid_name(&name) {
                continue;
            }
            filled = true;
            if module_of(&name) == Some(stem(PYTHON_ONESHOT.0))
                && header_of(&pycache.join(&name))
                    .is_some_and(|header| compiled_from(&header, PYTHON_ONESHOT.1.as_bytes()))
            {
                runner = format!("{RUNTIME_DIR}/__pycache__/{name}");
            }
        }
        filled.then(|| Bytecode {
            dir: self.dir.clone(),
            runner,
        })
    }

    /// Compiles the runtime in a sandbox of `rootfs` (with the image's environment and the
    /// caller's policy) and stores the result.
    pub fn fill(
        &self,
        rootfs: Rootfs,
        env: Vec<(String, String)>,
        policy: corral_sandbox::Policy,
    ) -> Result<(), FillError> {
        let mut spec = SandboxSpec::new(vec!["python3".into()]);
        spec.argv.push(format!("/run/corral/{}", PYTHON_COMPILER.0));
        for (name, _) in PYTHON_ONESHOT_RUNTIME {
            spec.argv.push(format!("/run/corral/{name}"));
        }
        spec.rootfs = rootfs;
        spec.env = env;
        spec.policy = policy;
        spec.support_files =
            as_support_files(std::iter::once(PYTHON_COMPILER).chain(PYTHON_ONESHOT_RUNTIME));
        let (result, _) = corral_sandbox::run(&spec, &mut |_, _| {}, None);
        if result.status != Status::Success {
            return Err(FillError::Compile(format!(
                "{:?}: {}{}",
                result.status,
                result.stderr,
                result.error_message.unwrap_or_default()
            )));
        }
        let compiled: std::collections::BTreeMap<String, String> =
            serde_json::from_str(&result.stdout)
                .map_err(|e| FillError::Compile(format!("unreadable output: {e}")))?;
        let parent = self.dir.parent().expect("the cache directory has a parent");
        fs::create_dir_all(parent)?;
        let staging = tempfile::Builder::new()
            .prefix(".staging-")
            .tempdir_in(parent)?;
        for (name, source) in PYTHON_ONESHOT_RUNTIME {
            fs::write(staging.path().join(name), source)?;
        }
        let pycache = staging.path().join("__pycache__");
        fs::create_dir(&pycache)?;
        for (name, encoded) in compiled {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|e| FillError::Compile(format!("{name}: {e}")))?;
            if !valid_name(&name) || bytes.len() > MAX_PYC_BYTES {
                return Err(FillError::Compile(format!("unexpected file {name:?}")));
            }
            fs::write(pycache.join(name), bytes)?;
        }
        // Another process may have filled it meanwhile; either copy is as good.
        match fs::rename(staging.path(), &self.dir) {
            Ok(()) => {
                let _ = staging.keep();
                Ok(())
            }
            Err(_) if self.dir.is_dir() => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FillError {
    #[error("compiling the runtime in the image failed: {0}")]
    Compile(String),
    #[error("storing the bytecode: {0}")]
    Io(#[from] io::Error),
}

/// `corral_oneshot.cpython-311.pyc` and the like: one of our modules, a plain file name.
fn valid_name(name: &str) -> bool {
    name.len() <= 100
        && name.ends_with(".pyc")
        && module_of(name).is_some_and(|m| PYTHON_ONESHOT_RUNTIME.iter().any(|(s, _)| stem(s) == m))
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// The module a bytecode file name is for: `corral_oneshot` for `corral_oneshot.cpython-311.pyc`.
fn module_of(pyc_name: &str) -> Option<&str> {
    pyc_name.split_once('.').map(|(module, _)| module)
}

fn stem(source_name: &str) -> &str {
    source_name.trim_end_matches(".py")
}

/// The 16-byte header of a `.pyc` file.
fn header_of(path: &Path) -> Option<[u8; 16]> {
    let mut header = [0u8; 16];
    fs::File::open(path).ok()?.read_exact(&mut header).ok()?;
    Some(header)
}

/// Whether `pyc` is hash-checked bytecode (PEP 552) of `source`: its header records the
/// source's SipHash keyed with the bytecode's magic number, as CPython's `_imp.source_hash`
/// computes it (SipHash-1-3 since Python 3.11, SipHash-2-4 before).
fn compiled_from(pyc: &[u8], source: &[u8]) -> bool {
    let Some(header) = pyc.get(..16) else {
        return false;
    };
    let word = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().expect("4 bytes"));
    let (magic, hash_based) = (u64::from(word(0)), word(4) & 1 == 1);
    let recorded = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
    let mut sip13 = SipHasher13::new_with_keys(magic, 0);
    sip13.write(source);
    let mut sip24 = SipHasher24::new_with_keys(magic, 0);
    sip24.write(source);
    hash_based && (recorded == sip13.finish() || recorded == sip24.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_digest_covers_exactly_the_oneshot_runtime() {
        use sha2::{Digest, Sha256};
        let mut digest = Sha256::new();
        for (name, source) in PYTHON_ONESHOT_RUNTIME {
            digest.update(name);
            digest.update(source);
        }
        assert_eq!(ONESHOT_RUNTIME_SHA256, hex::encode(digest.finalize()));
    }

    #[test]
    fn only_our_modules_bytecode_file_names_are_accepted() {
        assert!(valid_name("corral_oneshot.cpython-311.pyc"));
        assert!(valid_name("corral_kernel_lib.cpython-312.pyc"));
        for bad in [
            "corral_oneshot.py",
            "../corral_oneshot.cpython-311.pyc",
            "corral_oneshot/x.pyc",
            "corral_kernel.cpython-311.pyc",
            "sitecustomize.cpython-311.pyc",
            "corral_oneshotx.cpython-311.pyc",
            "corral_oneshot.cpython 311.pyc",
        ] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn the_runner_bytecode_check_is_cpythons() {
        // The header Python 3.11 writes for hash-checked bytecode of "print(1)\n":
        // magic, flags (hash-based, checked), `_imp.source_hash(_RAW_MAGIC_NUMBER, source)`.
        let header = hex::decode("a70d0d0a03000000da812d7f407a3059").unwrap();
        assert!(compiled_from(&header, b"print(1)\n"));
        assert!(!compiled_from(&header, b"print(2)\n"));
        let mut timestamp_based = header.clone();
        timestamp_based[4] = 0;
        assert!(!compiled_from(&timestamp_based, b"print(1)\n"));
        assert!(!compiled_from(&header[..12], b"print(1)\n"));
    }

    #[test]
    fn caches_differ_per_image() {
        let data = Path::new("/data");
        let a = BytecodeCache::new(data, &Rootfs::Directory("/images/a/rootfs".into()));
        let b = BytecodeCache::new(data, &Rootfs::Directory("/images/b/rootfs".into()));
        let host = BytecodeCache::new(data, &Rootfs::Host);
        assert_ne!(a.dir, b.dir);
        assert_ne!(a.dir, host.dir);
        let again = BytecodeCache::new(data, &Rootfs::Directory("/images/a/rootfs".into()));
        assert_eq!(a.dir, again.dir);
        assert!(a.dir.starts_with("/data/bytecode"));
    }
}
