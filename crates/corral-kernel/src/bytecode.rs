//! Precompiled bytecode of the one-shot Python runtime, one cache per image.
//!
//! Python compiles the script it starts, and every module without bytecode, on every run: for
//! the one-shot runtime that is about 1 ms before `print(1)` runs and 4 ms more when a result
//! has to be formatted. So a sandbox of the image compiles the runtime once, before any user
//! code runs in it, and the host keeps the bytecode in its data directory. The files are
//! hash-checked `.pyc` (PEP 552): Python ignores one whose source differs, and one made by
//! another Python version carries another name and magic number, so a stale or mismatched
//! cache costs speed, never correctness. A cache is only ever used with the image whose
//! sandbox made it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use base64::Engine;
use corral_sandbox::{Rootfs, SandboxSpec, Status};
use sha2::{Digest, Sha256};

use crate::runtime::{PYTHON_COMPILER, PYTHON_KERNEL, PYTHON_KERNEL_LIB};

/// Modules whose bytecode is cached, by the file name stem `.pyc` files start with.
const CACHED_MODULES: [&str; 2] = ["corral_kernel", "corral_kernel_lib"];
const MAX_PYC_BYTES: usize = 1 << 20;

#[derive(Debug, Clone)]
pub struct BytecodeCache {
    dir: PathBuf,
}

impl BytecodeCache {
    /// The cache for sandboxes of `rootfs`, under `data_dir`.
    pub fn new(data_dir: &Path, rootfs: &Rootfs) -> BytecodeCache {
        let mut key = Sha256::new();
        match rootfs {
            // The host's Python can be upgraded in place: its binary's identity is the key.
            Rootfs::Host => {
                let python = fs::metadata("/usr/bin/python3");
                let identity = python.map_or((0, 0), |m| {
                    use std::os::unix::fs::MetadataExt;
                    (m.len(), m.mtime())
                });
                key.update(format!("host {identity:?}"));
            }
            // Built images are content-addressed: the path names the content.
            Rootfs::Directory(path) => key.update(format!("dir {}", path.display())),
        }
        for (name, source) in [PYTHON_KERNEL, PYTHON_KERNEL_LIB] {
            key.update(name);
            key.update(source);
        }
        let key = hex::encode(&key.finalize()[..16]);
        BytecodeCache {
            dir: data_dir.join("bytecode").join(key),
        }
    }

    /// The cached bytecode as `/run/corral` support files (`__pycache__/NAME`), once filled.
    pub fn support_files(&self) -> Option<Vec<(String, Vec<u8>)>> {
        let mut files = Vec::new();
        for entry in fs::read_dir(&self.dir).ok()? {
            let entry = entry.ok()?;
            let name = entry.file_name().into_string().ok()?;
            if valid_name(&name) {
                files.push((format!("__pycache__/{name}"), fs::read(entry.path()).ok()?));
            }
        }
        (!files.is_empty()).then_some(files)
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
        for (name, _) in [PYTHON_KERNEL, PYTHON_KERNEL_LIB] {
            spec.argv.push(format!("/run/corral/{name}"));
        }
        spec.rootfs = rootfs;
        spec.env = env;
        spec.policy = policy;
        spec.support_files = [PYTHON_COMPILER, PYTHON_KERNEL, PYTHON_KERNEL_LIB]
            .iter()
            .map(|(name, text)| (name.to_string(), text.as_bytes().to_vec()))
            .collect();
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
        for (name, encoded) in compiled {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|e| FillError::Compile(format!("{name}: {e}")))?;
            if !valid_name(&name) || bytes.len() > MAX_PYC_BYTES {
                return Err(FillError::Compile(format!("unexpected file {name:?}")));
            }
            fs::write(staging.path().join(name), bytes)?;
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

/// `corral_kernel.cpython-311.pyc` and the like: one of our modules, a plain file name.
fn valid_name(name: &str) -> bool {
    name.len() <= 100
        && name.ends_with(".pyc")
        && CACHED_MODULES.iter().any(|m| {
            name.strip_prefix(m)
                .is_some_and(|rest| rest.starts_with('.'))
        })
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_modules_bytecode_file_names_are_accepted() {
        assert!(valid_name("corral_kernel.cpython-311.pyc"));
        assert!(valid_name("corral_kernel_lib.cpython-312.pyc"));
        for bad in [
            "corral_kernel.py",
            "../corral_kernel.cpython-311.pyc",
            "corral_kernel/x.pyc",
            "sitecustomize.cpython-311.pyc",
            "corral_kernelx.cpython-311.pyc",
            "corral_kernel.cpython 311.pyc",
        ] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn caches_differ_per_image() {
        let data = Path::new("/data");
        let a = BytecodeCache::new(data, &Rootfs::Directory("/images/a/rootfs".into()));
        let b = BytecodeCache::new(data, &Rootfs::Directory("/images/b/rootfs".into()));
        let host = BytecodeCache::new(data, &Rootfs::Host);
        assert_ne!(a.dir, b.dir);
        assert_ne!(a.dir, host.dir);
        assert!(a.dir.starts_with("/data/bytecode"));
    }
}
