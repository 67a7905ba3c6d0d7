//! The code policy through the engine, in real sandboxes (host image): one-shot runs (a fresh
//! interpreter, with and without the bytecode cache, and a fork of the zygote) and sessions
//! (started directly, forked, taken from the warm pool, restarted), in Python, JavaScript and
//! bash. docs/code-policy.md.

use corral_kernel::bytecode::BytecodeCache;
use corral_kernel::{oneshot, CodePolicy, Language, Session, SessionOptions};
use corral_sandbox::{ExecutionResult, Rootfs, SandboxSpec, Status, Violation, ViolationRule};

mod support;
use support::{full_pool, python_sessions_with, run, strings};

fn policy(allowed: Option<&[&str]>, denied: &[&str], max: Option<u64>) -> CodePolicy {
    CodePolicy::new(allowed.map(strings), strings(denied), max).unwrap()
}

fn violation(rule: ViolationRule, line: u32, module: &str) -> Violation {
    Violation {
        rule,
        line: Some(line),
        module: Some(module.into()),
    }
}

fn oneshot_run(
    language: Language,
    code: &str,
    policy: &CodePolicy,
    cache: Option<&BytecodeCache>,
) -> ExecutionResult {
    let file = match language {
        Language::Python => "main.py",
        Language::Javascript => "main.js",
        Language::Bash => "main.sh",
    };
    let spec = SandboxSpec::new(Vec::new());
    let code = code.as_bytes().to_vec();
    oneshot::run(
        spec,
        language,
        file,
        code,
        policy,
        cache,
        None,
        &mut |_, _| {},
    )
    .0
}

/// What every refusal of the pre-check looks like, whatever ran it.
fn assert_refused(r: &ExecutionResult, violations: &[Violation], how: &str) {
    assert_eq!(r.status, Status::Error, "{how}: {r:?}");
    let e = r.error.as_ref().expect("an error");
    assert_eq!(e.name, "PolicyViolation", "{how}: {r:?}");
    assert_eq!(e.violations, violations, "{how}: {r:?}");
    assert!(
        e.value.ends_with("The code was not run."),
        "{how}: {}",
        e.value
    );
    assert_eq!(
        r.error_message.as_deref(),
        Some(format!("PolicyViolation: {}", e.value).as_str()),
        "{how}"
    );
    assert_eq!(r.stdout, "", "{how}: nothing ran");
}

const PYTHON_PROGRAM: &str = "print('started')\nimport json, socket\n";

#[test]
fn a_python_program_breaking_the_policy_never_starts_and_one_that_keeps_it_runs_hooked() {
    let data = tempfile::tempdir().unwrap();
    let cache = BytecodeCache::new(data.path(), &Rootfs::Host);
    let p = policy(Some(&["json", "pandas"]), &[], None);
    // Without the cache (the first run fills it), and from it.
    for how in ["fresh runtime", "runtime from the bytecode cache"] {
        let r = oneshot_run(Language::Python, PYTHON_PROGRAM, &p, Some(&cache));
        assert_refused(
            &r,
            &[violation(ViolationRule::NotAllowed, 2, "socket")],
            how,
        );
        assert_eq!(r.exit_code, Some(1), "{how}");
        // Allowed pandas imports numpy, which the program may not import itself.
        let code = "import pandas as pd\nprint(pd.Series([1, 2]).sum())\n\
                    m = 'num' + 'py'\n__import__(m)\n";
        let r = oneshot_run(Language::Python, code, &p, Some(&cache));
        assert_eq!(r.stdout, "3\n", "{how}: {r:?}");
        let e = r.error.as_ref().expect("the hook refused numpy");
        assert_eq!(
            e.violations,
            [violation(ViolationRule::NotAllowed, 4, "numpy")],
            "{how}"
        );
        assert!(
            cache.load().is_some(),
            "{how}: the first run filled the cache"
        );
    }
}

#[test]
fn code_over_max_code_bytes_is_refused_before_any_sandbox_exists() {
    for language in [Language::Python, Language::Javascript, Language::Bash] {
        let r = oneshot_run(
            language,
            "echo 'twelve bytes'",
            &policy(None, &[], Some(11)),
            None,
        );
        assert_eq!(r.status, Status::Error, "{language:?}: {r:?}");
        assert_eq!((r.exit_code, r.signal), (None, None), "nothing started");
        let e = r.error.expect("an error");
        assert_eq!(e.name, "PolicyViolation");
        assert_eq!(
            e.violations,
            [Violation {
                rule: ViolationRule::MaxCodeBytes,
                line: None,
                module: None
            }]
        );
        assert_eq!(r.execution_time_ms, 0);
    }
    // Bash has no modules: only the length applies to it.
    let r = oneshot_run(
        Language::Bash,
        "echo ok",
        &policy(Some(&[]), &["socket"], Some(100)),
        None,
    );
    assert_eq!((r.status, r.stdout.as_str()), (Status::Success, "ok\n"));
}

#[test]
fn a_javascript_program_is_checked_by_nodes_parser_and_hooked() {
    let p = policy(None, &["child_process"], None);
    let r = oneshot_run(
        Language::Javascript,
        "console.log('started')\nconst { execSync } = require('node:child_process')\n",
        &p,
        None,
    );
    assert_refused(
        &r,
        &[violation(ViolationRule::Denied, 2, "child_process")],
        "javascript",
    );
    let r = oneshot_run(
        Language::Javascript,
        "console.log(require('path').sep)\nrequire(['child', 'process'].join('_'))\n",
        &p,
        None,
    );
    assert_eq!((r.status, r.stdout.as_str()), (Status::Error, "/\n"));
    assert!(
        r.stderr
            .contains("PolicyViolation: line 2: import of 'child_process' is denied"),
        "{r:?}"
    );
}

/// Every execution of a session is held to its policy: refused cells never run (the state
/// they would have changed is as it was), the others run under the hook.
fn check_session(how: &str, s: &mut Session) {
    assert_eq!(run(s, "x = 1").status, Status::Success, "{how}");
    let r = run(s, "x = 2\nimport os\nimport socket");
    assert_refused(&r, &[violation(ViolationRule::Denied, 3, "socket")], how);
    let r = run(s, "print(x)\nm = 'sock' + 'et'\n__import__(m)");
    assert_eq!(r.stdout, "1\n", "{how}: the refused cell did not run");
    assert_eq!(
        r.error.map(|e| e.violations),
        Some(vec![violation(ViolationRule::Denied, 3, "socket")]),
        "{how}"
    );
    let r = run(s, &"#".repeat(101));
    assert_eq!(
        r.error.map(|e| e.violations[0].rule),
        Some(ViolationRule::MaxCodeBytes),
        "{how}"
    );
    assert_eq!(s.executions(), 4, "{how}: refused executions count");
}

fn policed(language: Language) -> SessionOptions {
    let mut options = SessionOptions::new(language);
    options.code_policy = policy(None, &["socket", "child_process"], Some(100));
    options
}

#[test]
fn every_execution_of_a_session_is_checked_however_the_session_was_made() {
    let options = policed(Language::Python);
    let mut direct = Session::create(&options).unwrap();
    check_session("direct", &mut direct);
    direct.restart().unwrap();
    let r = run(&mut direct, "import socket");
    assert_refused(
        &r,
        &[violation(ViolationRule::Denied, 1, "socket")],
        "restarted",
    );

    let pool = full_pool(1);
    let mut pooled = pool.acquire(&options).unwrap();
    assert_eq!(pool.ready_count(), 0, "the session came from the pool");
    check_session("pooled", &mut pooled);
    let mut forked = pool.fork_session(&options).unwrap();
    check_session("forked", &mut forked);

    // A one-shot run forked from the zygote gets the policy with `run`, after the fork.
    let spec = SandboxSpec::new(Vec::new());
    let p = policy(Some(&["json"]), &[], None);
    let run_forked = |code: &str| {
        oneshot::run_forked(
            &pool,
            &spec,
            "main.py",
            code.as_bytes(),
            &p,
            None,
            &mut |_, _| {},
        )
        .expect("the zygote serves it")
        .0
    };
    assert_refused(
        &run_forked(PYTHON_PROGRAM),
        &[violation(ViolationRule::NotAllowed, 2, "socket")],
        "forked run",
    );
    let r = run_forked("import json\nprint(json.dumps(1))\n__import__('o' + 's')\n");
    assert_eq!(r.stdout, "1\n", "{r:?}");
    assert_eq!(
        r.error.map(|e| e.violations),
        Some(vec![violation(ViolationRule::NotAllowed, 3, "os")])
    );
    pool.shutdown();
}

#[test]
fn javascript_and_bash_sessions_take_what_applies_to_them() {
    let mut js = Session::create(&policed(Language::Javascript)).unwrap();
    let r = run(&mut js, "let x = 1\nrequire('child_process')");
    assert_refused(
        &r,
        &[violation(ViolationRule::Denied, 2, "child_process")],
        "javascript",
    );
    let r = run(&mut js, "require('path').sep");
    assert_eq!(r.results[0].text.as_deref(), Some("'/'"), "{r:?}");

    let mut options = SessionOptions::new(Language::Bash);
    options.code_policy = policy(None, &[], Some(10));
    let mut bash = Session::create(&options).unwrap();
    assert_eq!(run(&mut bash, "echo ok").stdout, "ok\n");
    let r = run(&mut bash, "echo 'over ten bytes'");
    assert_eq!(r.status, Status::Error);
    assert_eq!(r.error.map(|e| e.name).as_deref(), Some("PolicyViolation"));
}

/// The hook lives in the cells' own interpreter, so a cell can undo it; doing so in the
/// obvious ways does not undo the pre-check of the cells after it (docs/code-policy.md says
/// what can).
#[test]
fn a_cell_that_undoes_the_hook_does_not_undo_the_pre_check() {
    let mut options = SessionOptions::new(Language::Python);
    options.code_policy = policy(None, &["socket"], None);
    let sessions = python_sessions_with(&options);
    let undo = "import builtins, importlib, sys, ast\n\
                sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != 'Finder']\n\
                builtins.__import__ = importlib.__import__\n\
                p = sys.modules['corral_policy']\n\
                p.precheck = p.refusal = p._search = lambda *a, **k: []\n\
                ast.parse = lambda *a, **k: ast.Module([], [])\n";
    for (how, mut s) in sessions {
        assert_eq!(run(&mut s, undo).status, Status::Success, "{how}");
        let r = run(&mut s, "import socket\nprint('ran')");
        assert_refused(&r, &[violation(ViolationRule::Denied, 1, "socket")], how);
        // What the hook no longer sees, nothing sees: the hook is not a boundary.
        let r = run(&mut s, "m = 'sock' + 'et'\nprint(__import__(m).__name__)");
        assert_eq!(r.stdout, "socket\n", "{how}: {r:?}");
    }
}
