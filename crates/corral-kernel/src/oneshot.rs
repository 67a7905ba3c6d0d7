//! One-shot runs (`corral run`, `POST /v1/run`): a fresh sandbox per program. Python programs
//! run under the one-shot runner (`corral_oneshot.py`), which adds the rich value of a final
//! expression, the plots left open and the exception as structured results, at no cost for
//! plain scripts.

use std::sync::Arc;

use corral_sandbox::{
    ControlSocket, ExecutionResult, LanguageError, ResultBudget, SandboxSpec, Status, Stream,
    Workspace,
};

use crate::bytecode::BytecodeCache;
use crate::event::into_rich_result;
use crate::protocol::{Decoder, KernelMessage, ResultLimits};
use crate::runtime::{as_support_files, PYTHON_ONESHOT, PYTHON_ONESHOT_RUNTIME};
use crate::session::Language;

/// Runs `code` (named `file_name` inside the sandbox) in a fresh sandbox built from `spec`
/// (whose argv, program file and control socket this function sets). Python runs use and,
/// after their first successful run, fill `bytecode`, the image's runtime bytecode cache.
/// Rich results take their room from `result_budget`, the host's budget of results held at
/// once, when there is one.
pub fn run(
    mut spec: SandboxSpec,
    language: Language,
    file_name: &str,
    code: Vec<u8>,
    bytecode: Option<&BytecodeCache>,
    result_budget: Option<Arc<ResultBudget>>,
    on_output: &mut dyn FnMut(Stream, &[u8]),
) -> (ExecutionResult, Option<Workspace>) {
    let program = format!("/run/corral/{file_name}");
    spec.program_file = Some((file_name.to_string(), code));
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
            vec!["python3".into(), runner, program]
        }
        Language::Javascript => vec!["node".into(), program],
        Language::Bash => vec!["bash".into(), program],
    };
    if spec.control_socket.is_none() {
        return corral_sandbox::run(&spec, on_output, None);
    }
    // Results are bounded while they are decoded (docs/kernel-protocol.md): a frame that does
    // not fit in what is left of the run's budget, or of the host's, is discarded as it arrives.
    let mut decoder =
        Decoder::with_limits(ResultLimits::of(&spec.limits)).with_budget(result_budget);
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
                    ..
                })) => {
                    error = Some(LanguageError {
                        name,
                        value,
                        traceback,
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
    let (mut result, workspace) = corral_sandbox::run(&spec, on_output, Some(&mut on_socket));
    if let Some((cache, rootfs, env, policy)) = fill {
        // Only an image that can run Python at all is worth compiling for. Without a cache
        // runs are slower, not wrong, so a failure to fill it is not the run's concern.
        if matches!(result.status, Status::Success | Status::Error) {
            let _ = cache.fill(rootfs, env, policy);
        }
    }
    result.results = results;
    result.error = error;
    result.warnings.extend(decoder.warnings());
    result.reservation = decoder.take_held();
    if let Some(e) = protocol_error {
        result
            .warnings
            .push(format!("rich results were dropped: {e}"));
    }
    (result, workspace)
}
