//! Links the unwinder statically on glibc targets, as `gcc -static-libgcc` does.
//!
//! Rust's standard library otherwise links `libgcc_s.so.1` for unwinding, and loading it runs
//! its constructor, which probes the CPU with a series of `CPUID` instructions. A virtual
//! machine may trap every `CPUID` to the hypervisor: on the test VM, loading libgcc_s cost
//! every `corral` command 0.17-0.3 ms before `main` (docs/benchmarks.md, fourth round).
//! `libgcc_eh.a` has the same unwinder without the probe. Placed on the link line before the
//! standard library's `-lgcc_s`, it resolves the `_Unwind_*` symbols, and `--as-needed`
//! drops libgcc_s. (With `crt-static`, or on musl, the standard library links statically
//! already.)

fn main() {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let crt_static = var("CARGO_CFG_TARGET_FEATURE")
        .split(',')
        .any(|f| f == "crt-static");
    if var("CARGO_CFG_TARGET_OS") == "linux" && var("CARGO_CFG_TARGET_ENV") == "gnu" && !crt_static
    {
        println!("cargo:rustc-link-lib=static:-bundle=gcc_eh");
    }
}
