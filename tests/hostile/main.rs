//! Hostile test suite: every test runs a real attack inside a real Corral
//! sandbox (`corral run --json`) and asserts both that the attack failed
//! and that the host is unchanged. See README.md for the attack table.
//!
//! Runs as root and as an unprivileged user (set `CORRAL_BIN` to the corral
//! binary to use). Where cgroups are unavailable the result's `warnings`
//! decide the expected status; the security assertion is never skipped.

mod harness;
mod host;

mod concurrency;
mod files_io;
mod filesystem;
mod host_bounds;
mod multitenant;
mod network;
mod network_egress;
mod out_copies;
mod privileges;
mod processes;
mod resources;
mod secrets;
mod syscalls;
