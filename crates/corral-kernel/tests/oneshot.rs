//! One-shot Python runs in real sandboxes (host image), with the runtime's bytecode cache.

use corral_kernel::bytecode::BytecodeCache;
use corral_kernel::oneshot;
use corral_kernel::{CodePolicy, Language};
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
        &CodePolicy::default(),
        Some(cache),
        None,
        &mut |_, _| {},
    );
    result
}

fn loaded_from_bytecode(result: &ExecutionResult, module: &str) -> bool {
    result.stderr.contains(&format!(
        "code object from '/run/corral/lib/__pycache__/{module}."
    ))
}

/// The script Python was started with (the runner), as the program saw it.
const PRINT_RUNNER: &str = "import sys\nprint(sys.orig_argv[1])\n6 * 7";

#[test]
fn the_first_run_fills_the_cache_and_later_runs_load_the_runtime_from_it() {
    let data = tempfile::tempdir().unwrap();
    let cache = BytecodeCache::new(data.path(), &Rootfs::Host);
    assert!(cache.load().is_none());

    let first = run(PRINT_RUNNER, &cache);
    assert_eq!(first.status, Status::Success, "{first:?}");
    assert_eq!(first.stdout, "/run/corral/corral_oneshot.py\n");
    let compiled = cache.load().expect("the first run filled the cache");
    let pycs: Vec<_> = std::fs::read_dir(compiled.dir.join("__pycache__"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        pycs.len(),
        3,
        "the runner, its library and the code policy: {pycs:?}"
    );
    let runner = compiled.runner;
    assert!(
        runner.starts_with("/run/corral/lib/__pycache__/corral_oneshot.")
            && runner.ends_with(".pyc"),
        "the runner's bytecode matches its source: {runner}"
    );

    // The runner now runs from its bytecode, and the program sees no difference.
    let second = run(PRINT_RUNNER, &cache);
    assert_eq!(second.status, Status::Success, "{second:?}");
    assert_eq!(second.stdout, format!("{runner}\n"));
    // A final value is formatted by the library module, which came precompiled too.
    assert!(
        loaded_from_bytecode(&second, "corral_kernel_lib"),
        "{}",
        second.stderr
    );
    assert_eq!(second.results[0].text.as_deref(), Some("42"));

    // Tracebacks still quote the program's source and name no runner frame.
    let failed = run("x = 1\nraise ValueError('bad')", &cache);
    assert_eq!(failed.status, Status::Error, "{failed:?}");
    let error = failed.error.expect("the exception is reported");
    assert!(
        error.traceback.contains("raise ValueError('bad')"),
        "{}",
        error.traceback
    );
    assert!(
        !error.traceback.contains("corral_oneshot"),
        "{}",
        error.traceback
    );
}

#[test]
fn bytecode_that_does_not_match_the_runtime_is_ignored() {
    let data = tempfile::tempdir().unwrap();
    let cache = BytecodeCache::new(data.path(), &Rootfs::Host);
    assert_eq!(run("1", &cache).status, Status::Success);
    let dir = std::fs::read_dir(data.path().join("bytecode"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    // Hash-checked bytecode of some other source: Python (for the library module) and the
    // host (for the runner) must fall back to the real source.
    for entry in std::fs::read_dir(dir.join("__pycache__")).unwrap() {
        let path = entry.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[8..16].copy_from_slice(&[0xff; 8]);
        std::fs::write(&path, bytes).unwrap();
    }
    assert_eq!(
        cache.load().unwrap().runner,
        "/run/corral/lib/corral_oneshot.py"
    );

    let result = run(PRINT_RUNNER, &cache);
    assert_eq!(result.status, Status::Success, "{result:?}");
    assert_eq!(result.stdout, "/run/corral/lib/corral_oneshot.py\n");
    assert_eq!(result.results[0].text.as_deref(), Some("42"));
    assert!(
        !loaded_from_bytecode(&result, "corral_kernel_lib"),
        "{}",
        result.stderr
    );
}

/// A program imports the modules given to it in the workspace, as a script there would, while
/// Python itself starts without searching the workspace (no `PYTHONPATH`).
#[test]
fn workspace_modules_are_importable() {
    let data = tempfile::tempdir().unwrap();
    let cache = BytecodeCache::new(data.path(), &Rootfs::Host);
    let helper = data.path().join("helper.py");
    std::fs::write(&helper, "VALUE = 42\n").unwrap();
    let mut spec = SandboxSpec::new(Vec::new());
    spec.input_files.push(corral_sandbox::InputFile {
        source: std::fs::File::open(&helper).unwrap(),
        dest: "helper.py".into(),
    });
    let code = "import os, sys, helper\n\
                print(helper.__file__, 'PYTHONPATH' in os.environ, sys.path[:2])\n";
    let (result, _) = oneshot::run(
        spec,
        Language::Python,
        "main.py",
        code.as_bytes().to_vec(),
        &CodePolicy::default(),
        Some(&cache),
        None,
        &mut |_, _| {},
    );
    assert_eq!(result.status, Status::Success, "{result:?}");
    assert_eq!(
        result.stdout,
        "/workspace/helper.py False ['/run/corral', '/workspace']\n"
    );
}
