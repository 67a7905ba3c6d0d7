//! The process agent of a session: a small process inside the session's sandbox that starts
//! programs (with pipes or a pseudo-terminal), feeds their input, resizes their terminal,
//! signals them and streams their output and exit to the host, over a socket of its own, so
//! that programs run beside the session's interpreter and not through it
//! (docs/kernel-protocol.md, "Process agent").
//!
//! The session's init forks the agent before it locks itself down; the agent takes the same
//! lockdown as the kernel ([`crate::lockdown`]) before it reads anything of the host's, so
//! every program it starts descends from a locked-down process of the sandbox: same
//! namespaces, cgroup, limits, uid and workspace as the kernel.
//!
//! Both sides of the socket use the types and the framing of this module. A frame is a
//! 4-byte big-endian length `N` (at most [`MAX_FRAME`]), then a 4-byte big-endian length `H`,
//! `H` bytes of one JSON object ([`Request`] or [`Message`]), and `N - 4 - H` bytes of
//! payload (a program's input or output; empty for the other frames).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{send, MsgFlags};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// The largest frame either side sends or accepts.
pub const MAX_FRAME: usize = 256 << 10;
/// The most programs an agent runs at once; a start beyond it is refused.
pub const MAX_PROCESSES: usize = 32;
/// The most input the agent holds for one program that does not read it; input beyond it is
/// refused (the sender learns so and may retry), and never buffered.
pub const MAX_PENDING_INPUT: usize = 64 << 10;
/// The most input one [`Request::Input`] carries.
pub const MAX_INPUT: usize = 64 << 10;
/// The most output one [`Message::Output`] carries.
pub const OUTPUT_CHUNK: usize = 32 << 10;
/// How long the agent waits, after a program has exited, for the end of its output (a
/// background child may hold its pipes open forever).
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(200);
/// The most arguments and environment bytes of one start.
const MAX_START_BYTES: usize = 128 << 10;

/// A terminal's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySize {
    pub rows: u16,
    pub cols: u16,
}

/// What the host asks of the agent. Every request carries a `req` number, which the agent's
/// [`Message::Reply`] repeats.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Start `argv` (`argv[0]` looked up in `PATH` unless it holds a `/`) in `cwd` (relative
    /// to `/workspace`; an absolute path stays), with the agent's environment plus `env`; in
    /// a new session (process group) of its own. With `pty` its standard streams are a new
    /// pseudo-terminal of that size; else stdin is a pipe when `stdin`, `/dev/null`
    /// otherwise, and stdout and stderr are pipes.
    Start {
        req: u64,
        argv: Vec<String>,
        cwd: Option<String>,
        env: Vec<(String, String)>,
        pty: Option<PtySize>,
        stdin: bool,
    },
    /// Start an interpreter kernel (`argv`, `cwd` and `env` as for a start) with stdin
    /// `/dev/null`, stdout and stderr pipes and a socket at fd 3 ([`crate`]'s kernel
    /// protocol). The reply carries, with `SCM_RIGHTS`, the host's ends: the socket, stdout
    /// and stderr, in that order. Its exit is reported as a program's; it has no output here.
    StartKernel {
        req: u64,
        argv: Vec<String>,
        cwd: Option<String>,
        env: Vec<(String, String)>,
    },
    /// The frame's payload to the program's stdin (or terminal).
    Input { req: u64, pid: i32 },
    /// Close the program's stdin (not a terminal's: send ^D to it instead).
    CloseStdin { req: u64, pid: i32 },
    /// Send `signal` to the program's process group.
    Signal { req: u64, pid: i32, signal: i32 },
    /// Resize the program's terminal.
    Resize { req: u64, pid: i32, size: PtySize },
}

/// Which of a program's streams an output frame comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputStream {
    Stdout,
    Stderr,
    Pty,
}

/// What the agent tells the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    /// The answer to request `req`: the program's pid (in the sandbox) for a start, or why
    /// the request failed.
    Reply {
        req: u64,
        pid: Option<i32>,
        error: Option<AgentRefusal>,
    },
    /// The frame's payload, output of program `pid`.
    Output { pid: i32, stream: OutputStream },
    /// Program `pid` has exited with this raw wait status; no output of it follows.
    Exit { pid: i32, status: i32 },
}

/// Why the agent refused a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", content = "detail", rename_all = "snake_case")]
pub enum AgentRefusal {
    #[error("this sandbox runs {MAX_PROCESSES} processes already, the most it may")]
    TooManyProcesses,
    #[error("no process with pid {0}")]
    NoSuchProcess(i32),
    #[error(
        "the input of process {0} is full ({MAX_PENDING_INPUT} bytes wait): it does not read \
         its input; retry later"
    )]
    InputFull(i32),
    #[error("process {0} has no stdin (start it with stdin)")]
    NoStdin(i32),
    #[error("process {0} has no terminal")]
    NoTerminal(i32),
    #[error("{0}")]
    Start(String),
    #[error("{0}")]
    Invalid(String),
}

/// A decoded frame: its header and its payload.
#[derive(Debug, PartialEq)]
pub struct Frame<T> {
    pub header: T,
    pub payload: Vec<u8>,
}

/// A frame that cannot be decoded.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("a frame of {0} bytes (at most {MAX_FRAME})")]
    TooLarge(usize),
    #[error("a malformed frame: {0}")]
    Malformed(String),
}

/// Encodes one frame.
pub fn encode<T: Serialize>(header: &T, payload: &[u8]) -> Vec<u8> {
    let json = serde_json::to_vec(header).expect("agent frames serialize");
    let len = 4 + json.len() + payload.len();
    let mut out = Vec::with_capacity(4 + len);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(payload);
    out
}

/// Takes frames out of a byte stream; holds at most one frame's bytes.
#[derive(Debug, Default)]
pub struct FrameReader {
    buf: Vec<u8>,
}

impl FrameReader {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// How many bytes it holds that are not a whole frame yet: less than one frame's bound
    /// once [`FrameReader::next_frame`] has taken every whole frame.
    pub fn held(&self) -> usize {
        self.buf.len()
    }

    /// The next complete frame, if there is one.
    pub fn next_frame<T: for<'de> Deserialize<'de>>(
        &mut self,
    ) -> Result<Option<Frame<T>>, FrameError> {
        let Some(len) = self.buf.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
        if len > MAX_FRAME {
            return Err(FrameError::TooLarge(len));
        }
        if len < 4 {
            return Err(FrameError::Malformed(
                "shorter than its header length".into(),
            ));
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let frame: Vec<u8> = self.buf.drain(..4 + len).skip(4).collect();
        let json_len = u32::from_be_bytes(frame[..4].try_into().expect("4 bytes")) as usize;
        let Some(json) = frame.get(4..4 + json_len) else {
            return Err(FrameError::Malformed(
                "a header longer than its frame".into(),
            ));
        };
        let header =
            serde_json::from_slice(json).map_err(|e| FrameError::Malformed(e.to_string()))?;
        Ok(Some(Frame {
            header,
            payload: frame[4 + json_len..].to_vec(),
        }))
    }
}

/// One program the agent started.
#[derive(Default)]
struct Program {
    /// Where input goes: a pipe, or the terminal's master side.
    input: Option<OwnedFd>,
    pending: Vec<u8>,
    close_when_written: bool,
    /// Open output descriptors.
    outputs: Vec<(OutputStream, OwnedFd)>,
    /// The terminal's master side (for a resize).
    terminal: Option<BorrowedRawFd>,
    exited: Option<(i32, Instant)>,
}

/// A descriptor number kept only while its owner (in `outputs`) is.
#[derive(Clone, Copy)]
struct BorrowedRawFd(RawFd);

/// Runs the agent on `socket` until the host hangs up, every program started with `env` (the
/// session's environment) below the request's own. Called in a locked-down process of the
/// session, single-threaded; never returns.
pub fn serve(socket: OwnedFd, env: Vec<(String, String)>) -> ! {
    let status = match Agent::new(socket, env) {
        Ok(mut agent) => agent.run(),
        Err(_) => 1,
    };
    // SAFETY: _exit ends this process without running the zygote's exit handlers.
    unsafe { libc::_exit(status) }
}

struct Agent {
    socket: OwnedFd,
    env: Vec<(String, String)>,
    reader: FrameReader,
    children: SignalFd,
    programs: HashMap<i32, Program>,
}

impl Agent {
    fn new(socket: OwnedFd, env: Vec<(String, String)>) -> io::Result<Agent> {
        let mut sigchld = SigSet::empty();
        sigchld.add(Signal::SIGCHLD);
        sigchld.thread_block()?;
        let children =
            SignalFd::with_flags(&sigchld, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)?;
        set_nonblocking(socket.as_fd())?;
        Ok(Agent {
            socket,
            env,
            reader: FrameReader::default(),
            children,
            programs: HashMap::new(),
        })
    }

    fn run(&mut self) -> i32 {
        let mut buf = vec![0u8; OUTPUT_CHUNK];
        loop {
            self.reap();
            if self.finish_exited().is_err() {
                return 0;
            }
            // What to wait for: the host, SIGCHLD, every output, every input with bytes
            // waiting.
            let mut watched: Vec<(i32, Option<OutputStream>)> = Vec::new();
            let mut fds = vec![
                PollFd::new(self.socket.as_fd(), PollFlags::POLLIN),
                PollFd::new(self.children.as_fd(), PollFlags::POLLIN),
            ];
            for (&pid, program) in &self.programs {
                for (stream, fd) in &program.outputs {
                    fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                    watched.push((pid, Some(*stream)));
                }
                if let Some(input) = &program.input {
                    if !program.pending.is_empty() {
                        fds.push(PollFd::new(input.as_fd(), PollFlags::POLLOUT));
                        watched.push((pid, None));
                    }
                }
            }
            let draining = self.programs.values().any(|p| p.exited.is_some());
            let timeout = if draining {
                PollTimeout::from(50u8)
            } else {
                PollTimeout::NONE
            };
            match poll(&mut fds, timeout) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(_) => return 1,
            }
            let ready: Vec<bool> = fds
                .iter()
                .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                .collect();
            drop(fds);
            if ready[1] {
                while self.children.read_signal().is_ok_and(|s| s.is_some()) {}
            }
            for (i, (pid, stream)) in watched.into_iter().enumerate() {
                if !ready[i + 2] {
                    continue;
                }
                let sent = match stream {
                    Some(stream) => self.forward_output(pid, stream, &mut buf),
                    None => {
                        self.write_input(pid);
                        Ok(())
                    }
                };
                if sent.is_err() {
                    return 0;
                }
            }
            if ready[0] {
                match nix::unistd::read(self.socket.as_raw_fd(), &mut buf) {
                    Ok(0) => return 0,
                    Ok(n) => self.reader.push(&buf[..n]),
                    Err(Errno::EAGAIN | Errno::EINTR) => {}
                    Err(_) => return 0,
                }
                loop {
                    match self.reader.next_frame::<Request>() {
                        Ok(Some(frame)) => {
                            if self.handle(frame).is_err() {
                                return 0;
                            }
                        }
                        Ok(None) => break,
                        // The host speaks this protocol or is gone.
                        Err(_) => return 2,
                    }
                }
            }
        }
    }

    /// Sends a frame to the host, whole (the host always reads).
    fn send(&self, header: &Message, payload: &[u8]) -> io::Result<()> {
        self.send_from(&encode(header, payload), 0)
    }

    /// Sends `bytes[at..]` to the host, waiting while its socket is full.
    fn send_from(&self, bytes: &[u8], mut at: usize) -> io::Result<()> {
        while at < bytes.len() {
            match send(
                self.socket.as_raw_fd(),
                &bytes[at..],
                MsgFlags::MSG_NOSIGNAL,
            ) {
                Ok(n) => at += n,
                Err(Errno::EAGAIN) => {
                    let mut pfd = [PollFd::new(self.socket.as_fd(), PollFlags::POLLOUT)];
                    let _ = poll(&mut pfd, PollTimeout::NONE);
                }
                Err(Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn reply(&self, req: u64, outcome: Result<Option<i32>, AgentRefusal>) -> io::Result<()> {
        let (pid, error) = match outcome {
            Ok(pid) => (pid, None),
            Err(e) => (None, Some(e)),
        };
        self.send(&Message::Reply { req, pid, error }, &[])
    }

    fn handle(&mut self, frame: Frame<Request>) -> io::Result<()> {
        match frame.header {
            Request::Start {
                req,
                argv,
                cwd,
                env,
                pty,
                stdin,
            } => {
                let started = self.start(argv, cwd, env, pty, stdin);
                self.reply(req, started.map(Some))
            }
            Request::StartKernel {
                req,
                argv,
                cwd,
                env,
            } => match self.start_kernel(argv, cwd, env) {
                Ok((pid, ends)) => {
                    let fds: Vec<RawFd> = ends.iter().map(AsRawFd::as_raw_fd).collect();
                    let reply = Message::Reply {
                        req,
                        pid: Some(pid),
                        error: None,
                    };
                    self.send_with_fds(&reply, &fds)
                }
                Err(refusal) => self.reply(req, Err(refusal)),
            },
            Request::Input { req, pid } => {
                let outcome = self.queue_input(pid, frame.payload);
                self.reply(req, outcome.map(|()| None))
            }
            Request::CloseStdin { req, pid } => {
                let outcome = match self.programs.get_mut(&pid) {
                    None => Err(AgentRefusal::NoSuchProcess(pid)),
                    Some(p) if p.terminal.is_some() => Err(AgentRefusal::NoStdin(pid)),
                    Some(p) if p.input.is_none() => Err(AgentRefusal::NoStdin(pid)),
                    Some(p) => {
                        if p.pending.is_empty() {
                            p.input = None;
                        } else {
                            p.close_when_written = true;
                        }
                        Ok(None)
                    }
                };
                self.reply(req, outcome)
            }
            Request::Signal { req, pid, signal } => {
                let outcome = match self.programs.get(&pid) {
                    Some(p) if p.exited.is_none() => {
                        // SAFETY: kill with integer arguments only; the group is the
                        // program's own session (it was started with setsid).
                        let r = unsafe { libc::kill(-pid, signal) };
                        if r == 0 {
                            Ok(None)
                        } else {
                            Err(AgentRefusal::Invalid(format!(
                                "signal {signal}: {}",
                                io::Error::last_os_error()
                            )))
                        }
                    }
                    _ => Err(AgentRefusal::NoSuchProcess(pid)),
                };
                self.reply(req, outcome)
            }
            Request::Resize { req, pid, size } => {
                let outcome = match self.programs.get(&pid) {
                    None => Err(AgentRefusal::NoSuchProcess(pid)),
                    Some(Program {
                        terminal: Some(master),
                        ..
                    }) => set_size(master.0, size)
                        .map(|()| None)
                        .map_err(|e| AgentRefusal::Invalid(format!("resizing the terminal: {e}"))),
                    Some(_) => Err(AgentRefusal::NoTerminal(pid)),
                };
                self.reply(req, outcome)
            }
        }
    }

    fn start(
        &mut self,
        argv: Vec<String>,
        cwd: Option<String>,
        env: Vec<(String, String)>,
        pty: Option<PtySize>,
        stdin: bool,
    ) -> Result<i32, AgentRefusal> {
        if self.programs.len() >= MAX_PROCESSES {
            return Err(AgentRefusal::TooManyProcesses);
        }
        let size: usize = argv.iter().map(String::len).sum::<usize>()
            + env.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        if size > MAX_START_BYTES {
            return Err(AgentRefusal::Invalid(format!(
                "arguments and environment of {size} bytes (at most {MAX_START_BYTES})"
            )));
        }
        let Some((program, args)) = argv.split_first() else {
            return Err(AgentRefusal::Invalid("an empty argv".into()));
        };
        let mut command = Command::new(program);
        command.args(args).envs(self.env.iter().cloned()).envs(env);
        command.current_dir(workspace_dir(cwd.as_deref()));
        let terminal = match pty {
            Some(size) => {
                let winsize = nix::pty::Winsize {
                    ws_row: size.rows,
                    ws_col: size.cols,
                    ws_xpixel: 0,
                    ws_ypixel: 0,
                };
                let pair = nix::pty::openpty(Some(&winsize), None)
                    .map_err(|e| AgentRefusal::Start(format!("opening a terminal: {e}")))?;
                let dup = |fd: &OwnedFd| {
                    fd.try_clone()
                        .map_err(|e| AgentRefusal::Start(format!("opening a terminal: {e}")))
                };
                command
                    .stdin(Stdio::from(dup(&pair.slave)?))
                    .stdout(Stdio::from(dup(&pair.slave)?))
                    .stderr(Stdio::from(pair.slave));
                if !env_has(&command, "TERM") {
                    command.env("TERM", "xterm-256color");
                }
                Some(pair.master)
            }
            None => {
                command
                    .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                None
            }
        };
        let with_terminal = terminal.is_some();
        // SAFETY: the closure runs in the forked child before exec and makes only
        // async-signal-safe calls (sigprocmask, signal, setsid, ioctl).
        unsafe {
            command.pre_exec(move || {
                let empty = SigSet::empty();
                empty.thread_set_mask().map_err(io::Error::from)?;
                crate::sys::reset_signal_dispositions();
                nix::unistd::setsid().map_err(io::Error::from)?;
                if with_terminal && libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command
            .spawn()
            .map_err(|e| AgentRefusal::Start(format!("{program}: {e}")))?;
        let pid = child.id() as i32;
        let mut program = Program::default();
        match terminal {
            Some(master) => {
                let _ = set_nonblocking(master.as_fd());
                program.terminal = Some(BorrowedRawFd(master.as_raw_fd()));
                program.input = master.try_clone().ok();
                program.outputs.push((OutputStream::Pty, master));
            }
            None => {
                if let Some(stdin) = child.stdin.take() {
                    let fd = OwnedFd::from(stdin);
                    let _ = set_nonblocking(fd.as_fd());
                    program.input = Some(fd);
                }
                for (stream, fd) in [
                    (OutputStream::Stdout, child.stdout.take().map(OwnedFd::from)),
                    (OutputStream::Stderr, child.stderr.take().map(OwnedFd::from)),
                ] {
                    if let Some(fd) = fd {
                        let _ = set_nonblocking(fd.as_fd());
                        program.outputs.push((stream, fd));
                    }
                }
            }
        }
        // The agent reaps it itself (by pid); `Child` would otherwise be waited for on drop
        // by nobody, which is what we want.
        drop(child);
        self.programs.insert(pid, program);
        Ok(pid)
    }

    /// Starts a kernel: its pid and the host's ends of its socket, stdout and stderr.
    fn start_kernel(
        &mut self,
        argv: Vec<String>,
        cwd: Option<String>,
        env: Vec<(String, String)>,
    ) -> Result<(i32, [OwnedFd; 3]), AgentRefusal> {
        if self.programs.len() >= MAX_PROCESSES {
            return Err(AgentRefusal::TooManyProcesses);
        }
        let Some((program, args)) = argv.split_first() else {
            return Err(AgentRefusal::Invalid("an empty argv".into()));
        };
        let failed = |e: io::Error| AgentRefusal::Start(format!("{program}: {e}"));
        let (host_end, kernel_end) = socket_pair().map_err(failed)?;
        let mut command = Command::new(program);
        command
            .args(args)
            .envs(self.env.iter().cloned())
            .envs(env)
            .current_dir(workspace_dir(cwd.as_deref()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let socket = kernel_end.as_raw_fd();
        // SAFETY: the closure runs in the forked child before exec and makes only
        // async-signal-safe calls (sigprocmask, signal, setsid, dup2, fcntl).
        unsafe {
            command.pre_exec(move || {
                SigSet::empty().thread_set_mask().map_err(io::Error::from)?;
                crate::sys::reset_signal_dispositions();
                nix::unistd::setsid().map_err(io::Error::from)?;
                if socket == 3 {
                    fcntl(3, FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()))?;
                } else {
                    nix::unistd::dup2(socket, 3)?;
                }
                Ok(())
            });
        }
        let mut child = command.spawn().map_err(failed)?;
        drop(kernel_end);
        let pid = child.id() as i32;
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(AgentRefusal::Start("no pipes".into()));
        };
        self.programs.insert(pid, Program::default());
        Ok((
            pid,
            [host_end, OwnedFd::from(stdout), OwnedFd::from(stderr)],
        ))
    }

    /// Sends a frame whose first byte carries `fds` (`SCM_RIGHTS`).
    fn send_with_fds(&self, header: &Message, fds: &[RawFd]) -> io::Result<()> {
        use nix::sys::socket::{sendmsg, ControlMessage};
        let bytes = encode(header, &[]);
        let rights = [ControlMessage::ScmRights(fds)];
        let sent = loop {
            let iov = [io::IoSlice::new(&bytes)];
            match sendmsg::<()>(
                self.socket.as_raw_fd(),
                &iov,
                &rights,
                MsgFlags::MSG_NOSIGNAL,
                None,
            ) {
                Ok(n) => break n,
                Err(Errno::EAGAIN) => {
                    let mut pfd = [PollFd::new(self.socket.as_fd(), PollFlags::POLLOUT)];
                    let _ = poll(&mut pfd, PollTimeout::NONE);
                }
                Err(Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        };
        self.send_from(&bytes, sent)
    }

    fn queue_input(&mut self, pid: i32, data: Vec<u8>) -> Result<(), AgentRefusal> {
        let program = self
            .programs
            .get_mut(&pid)
            .filter(|p| p.exited.is_none())
            .ok_or(AgentRefusal::NoSuchProcess(pid))?;
        if program.input.is_none() || program.close_when_written {
            return Err(AgentRefusal::NoStdin(pid));
        }
        if data.len() > MAX_INPUT || program.pending.len() + data.len() > MAX_PENDING_INPUT {
            return Err(AgentRefusal::InputFull(pid));
        }
        program.pending.extend_from_slice(&data);
        self.write_input(pid);
        Ok(())
    }

    /// Writes what it can of a program's pending input, without blocking.
    fn write_input(&mut self, pid: i32) {
        let Some(program) = self.programs.get_mut(&pid) else {
            return;
        };
        let Some(input) = &program.input else {
            program.pending.clear();
            return;
        };
        while !program.pending.is_empty() {
            match nix::unistd::write(input, &program.pending) {
                Ok(n) => {
                    program.pending.drain(..n);
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => return,
                // The reader is gone: the input is dropped, as a shell's would be.
                Err(_) => {
                    program.pending.clear();
                    program.input = None;
                    return;
                }
            }
        }
        if program.close_when_written {
            program.input = None;
        }
    }

    fn forward_output(&mut self, pid: i32, stream: OutputStream, buf: &mut [u8]) -> io::Result<()> {
        let Some(program) = self.programs.get_mut(&pid) else {
            return Ok(());
        };
        let Some(at) = program.outputs.iter().position(|(s, _)| *s == stream) else {
            return Ok(());
        };
        match nix::unistd::read(program.outputs[at].1.as_raw_fd(), buf) {
            Ok(0) => {
                self.close_output(pid, at);
                Ok(())
            }
            Ok(n) => self.send(&Message::Output { pid, stream }, &buf[..n]),
            Err(Errno::EAGAIN | Errno::EINTR) => Ok(()),
            // EIO: a terminal whose every slave side is closed.
            Err(_) => {
                self.close_output(pid, at);
                Ok(())
            }
        }
    }

    fn close_output(&mut self, pid: i32, at: usize) {
        if let Some(program) = self.programs.get_mut(&pid) {
            let (stream, _) = program.outputs.remove(at);
            if stream == OutputStream::Pty {
                program.terminal = None;
                program.input = None;
            }
        }
    }

    /// Reaps every program that has exited.
    fn reap(&mut self) {
        for (&pid, program) in self.programs.iter_mut() {
            if program.exited.is_some() {
                continue;
            }
            match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(_, code)) => {
                    program.exited = Some(((code & 0xff) << 8, Instant::now()));
                }
                Ok(WaitStatus::Signaled(_, signal, core)) => {
                    let status = signal as i32 | if core { 0x80 } else { 0 };
                    program.exited = Some((status, Instant::now()));
                }
                Ok(_) => {}
                Err(_) => program.exited = Some((0, Instant::now())),
            }
        }
    }

    /// Reports the programs that have exited and whose output has ended (or that have
    /// waited [`DRAIN_AFTER_EXIT`] for it), and forgets them.
    fn finish_exited(&mut self) -> io::Result<()> {
        let done: Vec<(i32, i32)> = self
            .programs
            .iter()
            .filter_map(|(&pid, p)| match p.exited {
                Some((status, at)) if p.outputs.is_empty() || at.elapsed() >= DRAIN_AFTER_EXIT => {
                    Some((pid, status))
                }
                _ => None,
            })
            .collect();
        for (pid, status) in done {
            // What is left of its output, read now, before its end.
            let mut buf = vec![0u8; OUTPUT_CHUNK];
            let streams: Vec<OutputStream> = self.programs[&pid]
                .outputs
                .iter()
                .map(|(s, _)| *s)
                .collect();
            for stream in streams {
                self.forward_output(pid, stream, &mut buf)?;
            }
            self.programs.remove(&pid);
            self.send(&Message::Exit { pid, status }, &[])?;
        }
        Ok(())
    }
}

/// A program's working directory: relative to `/workspace`, absolute paths as they are.
fn workspace_dir(cwd: Option<&str>) -> String {
    match cwd {
        None | Some("") => "/workspace".to_string(),
        Some(dir) if dir.starts_with('/') => dir.to_string(),
        Some(dir) => format!("/workspace/{dir}"),
    }
}

fn env_has(command: &Command, name: &str) -> bool {
    command.get_envs().any(|(k, _)| k == name) || std::env::var_os(name).is_some()
}

fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    let flags = OFlag::from_bits_retain(fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL)?);
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

fn set_size(master: RawFd, size: PtySize) -> io::Result<()> {
    let winsize = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a valid winsize from the pointer, which outlives the call.
    if unsafe { libc::ioctl(master, libc::TIOCSWINSZ, &winsize) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The most descriptors [`receive`] keeps waiting (a kernel's three); more are closed at
/// once.
pub const MAX_RECEIVED_FDS: usize = 3;

/// The most descriptors one message can carry (the kernel's `SCM_MAX_FD`): [`receive`] has
/// room for them all, so that a message with more than [`MAX_RECEIVED_FDS`] is never cut
/// short (`MSG_CTRUNC`), which would leave the descriptors the kernel did install in the
/// host's table with nothing to close them.
const SCM_MAX_FD: usize = 253;

/// Reads from an agent's socket (the host's side), keeping the descriptors that came with the
/// bytes in `fds` (at most [`MAX_RECEIVED_FDS`] waiting; an agent cannot make the host hold
/// more). 0 at EOF.
pub fn receive(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut std::collections::VecDeque<OwnedFd>,
) -> nix::Result<usize> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned};
    use std::os::fd::FromRawFd;
    let mut iov = [io::IoSliceMut::new(buf)];
    let mut space = nix::cmsg_space!([RawFd; SCM_MAX_FD]);
    let msg = recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let n = msg.bytes;
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(received) = cmsg {
            for fd in received {
                // SAFETY: the kernel just installed this descriptor for us; nothing else owns
                // it.
                let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                if fds.len() < MAX_RECEIVED_FDS {
                    fds.push_back(fd);
                }
            }
        }
    }
    Ok(n)
}

/// Makes the socket pair between the host and an agent: (host's end, agent's end).
pub fn socket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    Ok(socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An agent that sends more descriptors in one message than a kernel's three (here the
    /// most one message carries): the host keeps three, closes the rest at once, leaves none
    /// in its table, and reads on.
    #[test]
    fn descriptors_beyond_three_are_closed_as_they_arrive() {
        use nix::sys::socket::{sendmsg, ControlMessage};
        let (host, agent) = socket_pair().unwrap();
        let (readers, writers): (Vec<OwnedFd>, Vec<OwnedFd>) = (0..SCM_MAX_FD)
            .map(|_| nix::unistd::pipe().unwrap())
            .unzip();
        let raw: Vec<RawFd> = writers.iter().map(|w| w.as_raw_fd()).collect();
        for message in [&raw[..], &raw[..1]] {
            let rights = [ControlMessage::ScmRights(message)];
            sendmsg::<()>(
                agent.as_raw_fd(),
                &[io::IoSlice::new(b"x")],
                &rights,
                MsgFlags::empty(),
                None,
            )
            .unwrap();
        }
        drop(writers);
        // A pipe reads its end at once when no write end is left anywhere.
        let at_end = |r: &OwnedFd| {
            fcntl(r.as_raw_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).unwrap();
            match nix::unistd::read(r.as_raw_fd(), &mut [0u8; 1]) {
                Ok(0) => true,
                Err(Errno::EAGAIN) => false,
                other => panic!("{other:?}"),
            }
        };
        let mut fds = std::collections::VecDeque::new();
        let mut buf = [0u8; 1];
        assert_eq!(receive(host.as_fd(), &mut buf, &mut fds), Ok(1));
        assert_eq!(fds.len(), MAX_RECEIVED_FDS);
        assert!(readers[..MAX_RECEIVED_FDS].iter().all(|r| !at_end(r)));
        assert!(readers[MAX_RECEIVED_FDS..].iter().all(at_end));
        // The next message is read; its descriptor is closed too (three are waiting).
        assert_eq!(receive(host.as_fd(), &mut buf, &mut fds), Ok(1));
        assert_eq!(fds.len(), MAX_RECEIVED_FDS);
        drop(fds);
        assert!(readers.iter().all(at_end));
    }

    #[test]
    fn frames_round_trip_in_any_chunking() {
        let a = encode(&Request::Input { req: 7, pid: 12 }, b"hello\x00world");
        let b = encode(
            &Request::Resize {
                req: 8,
                pid: 12,
                size: PtySize {
                    rows: 40,
                    cols: 100,
                },
            },
            &[],
        );
        let all: Vec<u8> = a.iter().chain(&b).copied().collect();
        for split in 0..all.len() {
            let mut reader = FrameReader::default();
            let mut got = Vec::new();
            for part in [&all[..split], &all[split..]] {
                reader.push(part);
                while let Some(frame) = reader.next_frame::<Request>().unwrap() {
                    got.push(frame);
                }
            }
            assert_eq!(got.len(), 2, "split at {split}");
            assert_eq!(got[0].payload, b"hello\x00world");
            assert_eq!(got[0].header, Request::Input { req: 7, pid: 12 });
            assert!(got[1].payload.is_empty());
        }
    }

    #[test]
    fn frames_over_the_limit_or_malformed_are_refused_before_they_are_buffered() {
        let mut reader = FrameReader::default();
        reader.push(&((MAX_FRAME + 1) as u32).to_be_bytes());
        assert!(matches!(
            reader.next_frame::<Request>(),
            Err(FrameError::TooLarge(_))
        ));
        let mut reader = FrameReader::default();
        reader.push(&[0, 0, 0, 8, 0, 0, 0, 9, b'{', b'}', 0, 0]);
        assert!(matches!(
            reader.next_frame::<Request>(),
            Err(FrameError::Malformed(_))
        ));
        let mut reader = FrameReader::default();
        reader.push(&[0, 0, 0, 2, 0, 0]);
        assert!(matches!(
            reader.next_frame::<Request>(),
            Err(FrameError::Malformed(_))
        ));
    }
}
