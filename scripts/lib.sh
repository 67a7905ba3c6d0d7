# scripts/lib.sh: shell functions shared by scripts/setup, scripts/corral and scripts/test.
# Sourced, never run.

# use_rustup_cargo: puts rustup's ~/.cargo/bin on PATH when cargo is not on it already
# (non-login shells and sudo's secure_path leave it out).
use_rustup_cargo() {
    if ! command -v cargo >/dev/null 2>&1 && [[ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ]]; then
        export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
    fi
}

# musl_target: the musl target triple for this machine's architecture.
musl_target() {
    printf '%s\n' "$(uname -m)-unknown-linux-musl"
}

# has_rust_std TRIPLE: true when rustc has the standard library for TRIPLE installed.
has_rust_std() {
    local libdir
    libdir="$(rustc --print target-libdir --target "$1" 2>/dev/null || true)"
    compgen -G "$libdir/libstd-*.rlib" >/dev/null
}

# release_target prints the target triple Corral's binary is built for. That is a static musl
# binary for this machine's architecture: it starts about 0.7 ms sooner than the default glibc
# build, whose dynamic loader probes the CPU with CPUID (each one traps to the hypervisor on a
# VM) before main runs, and it runs on any Linux (docs/benchmarks.md, seventh round). It needs
# Rust's standard library for that target and a musl C compiler for the bundled SQLite, which
# scripts/setup installs. Without them it prints the host's own target and says so on stderr.
release_target() {
    local musl
    musl="$(musl_target)"
    if has_rust_std "$musl" && command -v musl-gcc >/dev/null; then
        printf '%s\n' "$musl"
        return
    fi
    printf 'note: no Rust standard library for %s or no musl-gcc (scripts/setup installs both): building a dynamic glibc binary for the host instead\n' "$musl" >&2
    rustc -vV | sed -n 's/^host: //p'
}
