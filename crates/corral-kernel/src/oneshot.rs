//! One-shot runs (`corral run`, `POST /v1/run`): a fresh sandbox per program. Python programs
//! run under the kernel's one-shot mode, which adds the rich value of a final expression, the
//! plots left open and the exception as structured results, at no cost for plain scripts.

use corral_sandbox::{
    ControlSocket, ExecutionResult, LanguageError, SandboxSpec, Stream, Workspace,
};

use crate::event::rich_result;
use crate::protocol::{Decoder, KernelMessage};
use crate::runtime::{support_files, PYTHON_KERNEL};
use crate::session::Language;

/// Runs `code` (named `file_name` inside the sandbox) in a fresh sandbox built from `spec`
/// (whose argv, program file and control socket this function sets).
pub fn run(
    mut spec: SandboxSpec,
    language: Language,
    file_name: &str,
    code: Vec<u8>,
    on_output: &mut dyn FnMut(Stream, &[u8]),
) -> (ExecutionResult, Option<Workspace>) {
    let program = format!("/run/corral/{file_name}");
    spec.program_file = Some((file_name.to_string(), code));
    spec.argv = match language {
        Language::Python => {
            spec.support_files.extend(support_files(Language::Python));
            spec.control_socket = Some(ControlSocket::Stream);
            vec![
                "python3".into(),
                format!("/run/corral/{}", PYTHON_KERNEL.0),
                "--oneshot".into(),
                program,
            ]
        }
        Language::Javascript => vec!["node".into(), program],
        Language::Bash => vec!["bash".into(), program],
    };
    if spec.control_socket.is_none() {
        return corral_sandbox::run(&spec, on_output, None);
    }
    let mut decoder = Decoder::new();
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
                })) => results.push(rich_result(is_main_result, &data)),
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
    result.results = results;
    result.error = error;
    if let Some(e) = protocol_error {
        result
            .warnings
            .push(format!("rich results were dropped: {e}"));
    }
    (result, workspace)
}
