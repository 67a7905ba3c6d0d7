//! 1. Digests the one-shot runtime (the files of `runtime::PYTHON_ONESHOT_RUNTIME`), so that a
//!    run names its bytecode cache without hashing 60 KB of source, and probing the CPU for
//!    SHA instructions, every time (see `bytecode.rs`).
//! 2. Builds `libcorral_session.so` (crates/corral-session) for the target's glibc twin: the
//!    zygote's Python loads it to lock each forked session down with the engine's own code.
//!    The binary embeds it (`runtime::SESSION_LIBRARY`).

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

fn main() {
    let mut digest = Sha256::new();
    for name in [
        "corral_oneshot.py",
        "corral_kernel_lib.py",
        "corral_policy.py",
    ] {
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
    build_session_library();
}

/// Runs cargo for crates/corral-session, into a target directory of its own beside the
/// workspace's (so the two builds never wait for each other's lock), and copies the library
/// into OUT_DIR.
fn build_session_library() {
    let manifest_dir = PathBuf::from(env("CARGO_MANIFEST_DIR"));
    let workspace = manifest_dir.join("../..");
    let crate_dir = workspace.join("crates/corral-session");
    for watched in [
        crate_dir.join("src"),
        crate_dir.join("Cargo.toml"),
        crate_dir.join("Cargo.lock"),
        workspace.join("crates/corral-sandbox/src"),
        workspace.join("crates/corral-sandbox/seccomp"),
        workspace.join("crates/corral-sandbox/build.rs"),
        workspace.join("crates/corral-sandbox/Cargo.toml"),
        workspace.join("crates/corral-egress/src"),
        workspace.join("crates/corral-egress/Cargo.toml"),
        workspace.join("crates/corral-share/src"),
    ] {
        println!("cargo:rerun-if-changed={}", watched.display());
    }
    // The Python in an image links glibc: a musl target's twin is its -gnu triple.
    let target = env("TARGET").replace("-musl", "-gnu");
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"))
        .join("corral-session");
    let mut cargo = Command::new(env("CARGO"));
    cargo
        .arg("build")
        .arg("--release")
        .arg("--locked")
        .arg("--manifest-path")
        .arg(crate_dir.join("Cargo.toml"))
        .arg("--target")
        .arg(&target)
        .arg("--target-dir")
        .arg(&target_dir);
    // What the outer cargo set for this build script (the musl target, clippy as the
    // compiler wrapper, its flags) is not for this build.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let outer = [
            "CARGO_BUILD_",
            "CARGO_PROFILE_",
            "CARGO_ENCODED_RUSTFLAGS",
            "CARGO_TARGET_DIR",
            "RUSTC_WRAPPER",
            "RUSTC_WORKSPACE_WRAPPER",
            "RUSTFLAGS",
        ];
        if outer.iter().any(|prefix| key.starts_with(prefix)) {
            cargo.env_remove(key.as_ref());
        }
    }
    let status = cargo
        .status()
        .unwrap_or_else(|e| panic!("running cargo for corral-session: {e}"));
    assert!(status.success(), "building corral-session failed: {status}");
    let built = target_dir
        .join(&target)
        .join("release/libcorral_session.so");
    let out = Path::new(&env("OUT_DIR")).join("libcorral_session.so");
    std::fs::copy(&built, &out)
        .unwrap_or_else(|e| panic!("copying {} to {}: {e}", built.display(), out.display()));
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("cargo sets {name}"))
}
