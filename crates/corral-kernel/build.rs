//! Digests the one-shot runtime (the files of `runtime::PYTHON_ONESHOT_RUNTIME`), so that a
//! run names its bytecode cache without hashing 60 KB of source, and probing the CPU for SHA
//! instructions, every time (see `bytecode.rs`).

use sha2::{Digest, Sha256};

fn main() {
    let mut digest = Sha256::new();
    for name in ["corral_oneshot.py", "corral_kernel_lib.py"] {
        let path = format!("runtime/{name}");
        println!("cargo:rerun-if-changed={path}");
        let source = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
        digest.update(name);
        digest.update(&source);
    }
    println!(
        "cargo:rustc-env=CORRAL_ONESHOT_RUNTIME_SHA256={}",
        hex::encode(digest.finalize())
    );
}
