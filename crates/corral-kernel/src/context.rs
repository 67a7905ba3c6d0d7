//! Code contexts: more interpreters in a session's sandbox, each a kernel its process agent
//! starts ([`crate::agent::ProcessAgent::start_kernel`]), speaking the same kernel protocol as
//! the session's own kernel and sharing its filesystem, limits and lockdown
//! (docs/kernel-protocol.md, "Code contexts").

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use corral_sandbox::{Report, Workspace};

use crate::agent::{KernelChannel, ProcessAgent};
use crate::runtime;
use crate::session::{KernelError, KernelHost, KernelProcess, Session, SessionOptions};

/// The most code contexts one session has besides its own kernel.
pub const MAX_CONTEXTS: usize = 8;

/// A kernel of a code context, as the session machinery drives it.
pub(crate) struct ContextKernel {
    agent: Arc<ProcessAgent>,
    pid: i32,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    exited: OwnedFd,
    pub workspace: Workspace,
    /// Its working directory (relative to `/workspace`), kept for a restart.
    pub cwd: Option<String>,
    killed: bool,
}

impl ContextKernel {
    pub fn report_fd(&self) -> BorrowedFd<'_> {
        self.exited.as_fd()
    }

    pub fn read_report(&mut self) -> Report {
        let mut status = [0u8; 4];
        match nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(&self.exited), &mut status) {
            Ok(4) => Report::Exited(i32::from_le_bytes(status)),
            _ => Report::Closed,
        }
    }

    pub fn interrupt(&self) -> io::Result<()> {
        self.agent
            .signal_kernel(self.pid, libc::SIGINT)
            .map_err(io::Error::other)
    }

    pub fn kill(&mut self) {
        if !self.killed {
            self.killed = true;
            let _ = self.agent.signal_kernel(self.pid, libc::SIGKILL);
        }
    }

    pub fn agent(&self) -> &Arc<ProcessAgent> {
        &self.agent
    }
}

impl Drop for ContextKernel {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Session {
    /// Starts a code context: a kernel of `options.language` started by `agent` in the
    /// session's sandbox, in `cwd` (relative to `/workspace`), with the session's workspace
    /// and warnings, and ready (its code policy sent) when this returns.
    pub fn start_context(
        agent: Arc<ProcessAgent>,
        options: SessionOptions,
        workspace: Workspace,
        cwd: Option<String>,
        warnings: Vec<String>,
    ) -> Result<Session, KernelError> {
        let KernelChannel {
            pid,
            socket,
            stdout,
            stderr,
            exited,
        } = agent.start_kernel(runtime::kernel_argv(options.language), cwd.clone(), vec![])?;
        let kernel = ContextKernel {
            agent,
            pid,
            stdout,
            stderr,
            exited,
            workspace,
            cwd,
            killed: false,
        };
        Session::from_kernel(
            KernelProcess {
                host: KernelHost::Context(kernel),
                socket,
            },
            options,
            warnings,
        )
    }
}
