//! A failing step of building a sandbox surfaces as its own error, typed on the host's side
//! and on the side of the sandbox's own processes (host image: no root needed).

use std::time::Duration;

use corral_sandbox::setup::Step;
use corral_sandbox::{InputFile, Report, Sandbox, SandboxError, SandboxSpec, WorkspaceError};
use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

#[test]
fn an_input_file_that_cannot_be_copied_is_its_own_error() {
    let source = tempfile::tempfile().expect("a temporary file");
    let mut spec = SandboxSpec::new(vec!["true".into()]);
    // Out of the workspace: refused by the workspace, which the host writes into.
    spec.input_files.push(InputFile {
        source,
        dest: "../outside".into(),
    });
    let err = Sandbox::create(&spec).expect_err("the input file cannot be copied");
    assert!(
        matches!(
            err,
            SandboxError::InputFile(WorkspaceError::OutsideWorkspace(_))
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("sandbox setup failed: copying an input file: "),
        "{err}"
    );
    let source = std::error::Error::source(&err).expect("the workspace's error is the source");
    assert!(source.downcast_ref::<WorkspaceError>().is_some());
}

#[test]
fn a_program_that_is_not_there_is_reported_as_the_exec_step_with_its_errno() {
    let spec = SandboxSpec::new(vec!["/nonexistent/program".into()]);
    let mut sandbox = Sandbox::create(&spec).expect("the sandbox is built");
    sandbox.start().expect("the program is released");
    let mut ready = [PollFd::new(sandbox.report_fd(), PollFlags::POLLIN)];
    let waited = poll(
        &mut ready,
        PollTimeout::try_from(Duration::from_secs(30)).unwrap(),
    );
    assert_eq!(waited, Ok(1), "no report within 30 s");
    let Report::SetupError(failure) = sandbox.read_report() else {
        panic!("no setup error reported");
    };
    assert_eq!(failure.step, Step::Exec);
    assert_eq!(failure.errno, Some(Errno::ENOENT));
    assert_eq!(
        failure.to_string(),
        "executing /nonexistent/program (is it installed in this image?): \
         No such file or directory (os error 2)"
    );
    let err = SandboxError::from(failure);
    assert!(matches!(err, SandboxError::Child(_)));
    // The whole chain down to the errno.
    let errno = std::error::Error::source(&err)
        .and_then(std::error::Error::source)
        .and_then(|e| e.downcast_ref::<Errno>());
    assert_eq!(errno, Some(&Errno::ENOENT));
}

#[test]
fn a_run_of_a_program_that_is_not_there_says_so_as_before() {
    let spec = SandboxSpec::new(vec!["/nonexistent/program".into()]);
    let (result, _) = corral_sandbox::run(&spec, &mut |_, _| {}, None);
    assert_eq!(result.status, corral_sandbox::Status::SandboxError);
    assert_eq!(
        result.error_message.as_deref(),
        Some(
            "executing /nonexistent/program (is it installed in this image?): \
             No such file or directory (os error 2)"
        )
    );
}
