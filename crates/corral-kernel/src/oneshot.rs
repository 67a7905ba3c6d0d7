//! One-shot runs (`corral run`, `POST /v1/run`): a fresh sandbox per program. Python programs
//! run under the one-shot runner (`corral_oneshot.py`), which adds the rich value of a final
//! expression, the plots left open and the exception as structured results, at no cost for
//! plain scripts.

use std::os::fd::AsFd;
use std::sync::Arc;

use corral_sandbox::{
    ControlSocket, ExecutionResult, LanguageError, Limits, ResultBudget, SandboxError, SandboxSpec,
    SocketSink, Status, Stream, Workspace, POLICY_VIOLATION,
};

use crate::bytecode::BytecodeCache;
use crate::event::into_rich_result;
use crate::policy::CodePolicy;
use crate::pool::Pool;
use crate::protocol::{Decoder, KernelMessage, ResultLimits};
use crate::runtime::{
    as_support_files, JAVASCRIPT_POLICY, POLICY_RULES, PYTHON_ONESHOT, PYTHON_ONESHOT_RUNTIME,
};
use crate::session::Language;
use crate::zygote::ZygoteKind;

/// Runs `code` (named `file_name` inside the sandbox) in a fresh sandbox built from `spec`
/// (whose argv, program file and control socket this function sets), under the code `policy`
/// (docs/code-policy.md): code longer than its `max_code_bytes` is refused here, before any
/// sandbox exists; its module rules go to the runtime in the sandbox, which refuses a program
/// that breaks them before any of it runs (bash has no modules: only the length applies).
/// Python runs use and, after their first successful run, fill `bytecode`, the image's
/// runtime bytecode cache. Rich results take their room from `result_budget`, the host's
/// budget of results held at once, when there is one.
#[allow(clippy::too_many_arguments)]
pub fn run(
    mut spec: SandboxSpec,
    language: Language,
    file_name: &str,
    code: Vec<u8>,
    policy: &CodePolicy,
    bytecode: Option<&BytecodeCache>,
    result_budget: Option<Arc<ResultBudget>>,
    on_output: &mut dyn FnMut(Stream, &[u8]),
) -> (ExecutionResult, Option<Workspace>) {
    if let Some(refusal) = refused(policy, &code) {
        return (refusal, None);
    }
    let program = format!("/run/corral/{file_name}");
    spec.program_file = Some((file_name.to_string(), code));
    let rules = policy.module_rules(language).map(|rules| {
        let json = serde_json::to_vec(&rules).expect("module rules serialize");
        spec.support_files.push((POLICY_RULES.into(), json));
        format!("/run/corral/{POLICY_RULES}")
    });
    let mut fill = None;
    spec.argv = match language {
        Language::Python => {
            let runner = match bytecode.map(|cache| (cache, cache.load())) {
                Some((_, Some(compiled))) => {
                    spec.runtime_dir = Some(compiled.dir);
                    compiled.runner
                }
                unfilled => {
                    if let Some((cache, None)) = unfilled {
                        fill = Some((cache, spec.rootfs.clone(), spec.env.clone(), spec.policy));
                    }
                    spec.support_files
                        .extend(as_support_files(PYTHON_ONESHOT_RUNTIME));
                    format!("/run/corral/{}", PYTHON_ONESHOT.0)
                }
            };
            spec.control_socket = Some(ControlSocket::Stream);
            match rules {
                Some(rules) => vec!["python3".into(), runner, "--policy".into(), rules, program],
                None => vec!["python3".into(), runner, program],
            }
        }
        // Under module rules, the policy's preload checks the program first (its parser is
        // one of Node's internal modules) and reports a refusal on the control socket.
        Language::Javascript if rules.is_some() => {
            spec.support_files
                .extend(as_support_files([JAVASCRIPT_POLICY]));
            spec.control_socket = Some(ControlSocket::Stream);
            vec![
                "node".into(),
                "--expose-internals".into(),
                "--require".into(),
                format!("/run/corral/{}", JAVASCRIPT_POLICY.0),
                program,
            ]
        }
        Language::Javascript => vec!["node".into(), program],
        Language::Bash => vec!["bash".into(), program],
    };
    if spec.control_socket.is_none() {
        return corral_sandbox::run(&spec, on_output, None);
    }
    let (result, workspace) = with_frames(&spec.limits, result_budget, &mut |on_socket| {
        corral_sandbox::run(&spec, on_output, Some(on_socket))
    });
    if let Some((cache, rootfs, env, policy)) = fill {
        // Only an image that can run Python at all is worth compiling for. Without a cache
        // runs are slower, not wrong, so a failure to fill it is not the run's concern.
        if matches!(result.status, Status::Success | Status::Error) {
            let _ = cache.fill(rootfs, env, policy);
        }
    }
    (result, workspace)
}

/// Variables that the Python interpreter or the libraries a zygote preloads read while they
/// start or are imported (by name prefix): a run whose `env` sets one is not served from a
/// fork, where it would come too late, but by a fresh interpreter.
pub const READ_AT_START: &[&str] = &[
    "PYTHON",
    "LD_",
    "LC_",
    "LANG",
    "TZ",
    "HOME",
    "PATH",
    "TMP",
    "TEMP",
    "XDG_",
    "MPL",
    "MATPLOTLIB",
    "OMP_",
    "OPENBLAS",
    "GOTO",
    "MKL_",
    "BLIS",
    "NUMEXPR",
    "NPY_",
    "NUMPY",
    "PANDAS",
    "IPYTHON",
    "JUPYTER",
    "MALLOC",
    "GLIBC_",
    "FONTCONFIG",
];

/// The refusal of `code` by `policy`'s `max_code_bytes`, before anything starts.
fn refused(policy: &CodePolicy, code: &[u8]) -> Option<ExecutionResult> {
    let error = policy.length_violation(code.len())?;
    Some(ExecutionResult {
        status: Status::Error,
        error_message: Some(format!("{}: {}", error.name, error.value)),
        error: Some(error),
        ..ExecutionResult::sandbox_error("")
    })
}

/// A Python one-shot run ([`run`]'s `spec`, `file_name`, `code` and `policy`) served by a
/// sandbox forked from one of `pool`'s zygotes instead of a fresh interpreter, with the same
/// result (its `files` listed, the workspace gone with the sandbox), and which zygote forked it
/// (none: `policy` refused the code before anything started): `None` when the pool cannot
/// serve it so (another image, policy or image environment, a network policy (which needs a
/// proxy endpoint of the run's own), or an `env` naming a variable of [`READ_AT_START`]) or
/// when the fork failed (the zygote is being replaced, say); run it with [`run`] then. The
/// lean zygote forks it unless the program imports the data stack (see `Pool::fork_run`). The
/// fork has the run's limits, its own uid, cgroup, namespaces and workspace, and the lockdown
/// of a session; the code, `env` and the code policy reach only the forked child, after the
/// fork.
pub fn run_forked(
    pool: &Pool,
    spec: &SandboxSpec,
    file_name: &str,
    code: &[u8],
    policy: &CodePolicy,
    result_budget: Option<Arc<ResultBudget>>,
    on_output: &mut dyn FnMut(Stream, &[u8]),
) -> Option<(ExecutionResult, Option<ZygoteKind>)> {
    if let Some(refusal) = refused(policy, code) {
        return Some((refusal, None));
    }
    let env = pool.run_env(spec)?;
    if env
        .iter()
        .any(|(name, _)| READ_AT_START.iter().any(|p| name.starts_with(p)))
    {
        return None;
    }
    let (mut forked, kind) = pool.fork_run(&spec.limits, env, file_name, code).ok()?;
    forked.set_code_policy(policy.clone());
    for input in &spec.input_files {
        let mut source = &input.source;
        if let Err(e) = forked.workspace().write_file(&input.dest, &mut source) {
            let setup = SandboxError::InputFile(e);
            let mut result = ExecutionResult::sandbox_error(setup.to_string());
            result.warnings = forked.warnings().to_vec();
            return Some((result, Some(kind)));
        }
    }
    let socket = forked.socket().try_clone_to_owned().ok()?;
    let (result, ()) = with_frames(&spec.limits, result_budget, &mut |on_socket| {
        let outcome = corral_sandbox::wait_for_program(
            &mut forked,
            on_output,
            Some((socket.as_fd(), on_socket)),
        );
        let warnings = forked.warnings().to_vec();
        (outcome.into_result(forked.workspace(), warnings), ())
    });
    Some((result, Some(kind)))
}

/// Runs `f` with a sink that decodes the frames a one-shot runner sends on its fd 3, and adds
/// their rich results, error and warnings to the result `f` returns. Results are bounded while
/// they are decoded (docs/kernel-protocol.md): a frame that does not fit in what is left of
/// the run's budget, or of the host's (`result_budget`), is discarded as it arrives; the room
/// kept results take travels with the result.
fn with_frames<T>(
    limits: &Limits,
    result_budget: Option<Arc<ResultBudget>>,
    f: &mut dyn FnMut(SocketSink<'_>) -> (ExecutionResult, T),
) -> (ExecutionResult, T) {
    let mut decoder = Decoder::with_limits(ResultLimits::of(limits)).with_budget(result_budget);
    let mut protocol_error = None;
    let mut results = Vec::new();
    let mut error = None;
    let mut on_socket = |bytes: &[u8]| {
        if protocol_error.is_some() {
            return;
        }
        decoder.push(bytes);
        loop {
            match decoder.next_message() {
                Ok(Some(KernelMessage::Result {
                    is_main_result,
                    data,
                    ..
                })) => results.push(into_rich_result(is_main_result, data)),
                Ok(Some(KernelMessage::Error {
                    name,
                    value,
                    traceback,
                    violations,
                    ..
                })) => {
                    error = Some(LanguageError {
                        name,
                        value,
                        traceback,
                        violations,
                    })
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => {
                    protocol_error = Some(e.to_string());
                    break;
                }
            }
        }
    };
    let (mut result, rest) = f(&mut on_socket);
    result.results = results;
    // A program the code policy refused: what the policy said, not only its exit code.
    if let Some(e) = error.as_ref().filter(|e| e.name == POLICY_VIOLATION) {
        result.error_message = Some(format!("{}: {}", e.name, e.value));
    }
    result.error = error;
    result.warnings.extend(decoder.warnings());
    result.reservation = decoder.take_held();
    if let Some(e) = protocol_error {
        result
            .warnings
            .push(format!("rich results were dropped: {e}"));
    }
    (result, rest)
}
