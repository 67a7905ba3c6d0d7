//! One-shot Python runs in real sandboxes (host image), with the runtime's bytecode cache.

use corral_kernel::bytecode::BytecodeCache;
use corral_kernel::oneshot;
use corral_kernel::Language;
use corral_sandbox::{ExecutionResult, Rootfs, SandboxSpec, Status};

fn run(code: &str, cache: &BytecodeCache) -> ExecutionResult {
    let mut spec = SandboxSpec::new(Vec::new());
    // Python names every module it loads from bytecode on stderr.
    spec.env.push(("PYTHONVERBOSE".into(), "1".into()));
    let (result, _) = oneshot::run(
        spec,
        Language::Python,
        "main.py",
        code.as_bytes().to_vec(),
        Some(cache),
        &mut |_, _| {},
    );
    result
}

fn loaded_from_bytecode(result: &ExecutionResult, module: &str) -> bool {
    result.stderr.contains(&format!(
        "code object from '/run/corral/__pycache__/{module}."
    ))
}

#[test]
fn the_first_run_fills_the_cache_and_later_runs_load_the_runtime_from_it() {
    let data = tempfile::tempdir().unwrap();
    let cache = BytecodeCache::new(data.path(), &Rootfs::Host);
    assert!(cache.support_files().is_none());

    let first = run("6 * 7", &cache);
    assert_eq!(first.status, Status::Success, "{first:?}");
    assert!(!loaded_from_bytecode(&first, "corral_kernel"));
    let files = cache
        .support_files()
        .expect("the first run filled the cache");
    assert_eq!(
        files.len(),
        2,
        "{:?}",
        files.iter().map(|f| &f.0).collect::<Vec<_>>()
    );

    let second = run("6 * 7", &cache);
    assert_eq!(second.status, Status::Success, "{second:?}");
    assert!(
        loaded_from_bytecode(&second, "corral_kernel"),
        "{}",
        second.stderr
    );
    // A final value is formatted by the library module, which came precompiled too.
    assert!(
        loaded_from_bytecode(&second, "corral_kernel_lib"),
        "{}",
        second.stderr
    );
    assert_eq!(second.results[0].text.as_deref(), Some("42"));
}

#[test]
fn bytecode_that_does_not_match_the_runtime_is_ignored() {
    let data = tempfile::tempdir().unwrap();
    let cache = BytecodeCache::new(data.path(), &Rootfs::Host);
    assert_eq!(run("1", &cache).status, Status::Success);
    let (name, _) = &cache.support_files().unwrap()[0];
    let path = std::fs::read_dir(data.path().join("bytecode"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
        .join(name.trim_start_matches("__pycache__/"));
    // Hash-checked bytecode of some other source: Python must compile the real source.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8..16].copy_from_slice(&[0xff; 8]);
    std::fs::write(&path, bytes).unwrap();

    let result = run("print('still right')", &cache);
    assert_eq!(result.status, Status::Success, "{result:?}");
    assert_eq!(result.stdout, "still right\n");
    let module = name
        .trim_start_matches("__pycache__/")
        .split('.')
        .next()
        .unwrap();
    assert!(!loaded_from_bytecode(&result, module), "{}", result.stderr);
}
