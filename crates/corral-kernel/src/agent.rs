//! The host's side of a session's process agent ([`corral_sandbox::agent`]): programs that
//! run inside the session's sandbox beside its interpreter, concurrently with its executions
//! and with each other (docs/kernel-protocol.md, "Process agent").
//!
//! One reader thread per agent takes every frame the agent sends and hands it on, so the
//! agent never waits for a client: a program's output goes to each of its subscribers'
//! queues, which hold at most [`SUBSCRIBER_BYTES`] each (a subscriber that does not read
//! loses output, counted, and never makes the host hold more).
//!
//! Every byte a queue holds is also counted in a pool of output bytes shared by keys (a
//! [`corral_share::Share`] given with each subscription: the server's `max_output_bytes` and
//! its per-key share), at [`held_cost`] a chunk, which is what the chunk takes once encoded
//! for the client; a chunk the pool refuses is lost like one past the queue's bound, so the
//! output held for all of a key's subscribers has a bound, and so has all of it. The units
//! move on with the chunk ([`Subscription::next_held`]) until the server has written it to
//! its client.

use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use corral_sandbox::agent::{
    encode, receive, FrameReader, Message, Request, MAX_FRAME, OUTPUT_CHUNK,
};
pub use corral_sandbox::agent::{
    AgentRefusal, OutputStream, PtySize, MAX_INPUT, MAX_PENDING_INPUT, MAX_PROCESSES,
};
use corral_share::{Grant, Share};

/// The most output one subscriber's queue holds.
pub const SUBSCRIBER_BYTES: usize = 256 << 10;
/// What a frame to a client adds to a chunk of output besides its base64 (the event's name,
/// its JSON or its Connect envelope), at most.
pub const FRAME_OVERHEAD: u64 = 64;
/// The most subscribers (output streams) one program has at once.
pub const MAX_SUBSCRIBERS: usize = 4;
/// How long a request waits for the agent's answer (a paused session's agent answers none).
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// The most requests that wait for the agent's answers at once; more are refused
/// ([`AgentError::Busy`]). Each waits on a thread of its caller for up to [`REPLY_TIMEOUT`],
/// and the session's code can stop its agent (`SIGSTOP`: the same uid): without this bound
/// one key's requests to it would hold every thread of the server's blocking pool.
pub const MAX_REQUESTS: usize = 8;

/// What a request to the agent can fail with.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Refused(#[from] AgentRefusal),
    /// A session without an agent: every session the engine makes has one, forked from the
    /// zygote or in a sandbox of its own (a code context uses its session's).
    #[error("this session has no process agent")]
    Unavailable,
    #[error("the session's process agent is gone")]
    Gone,
    #[error("the session's process agent did not answer within {0:?} (is the sandbox paused?)")]
    NoAnswer(Duration),
    #[error("process {0} has {MAX_SUBSCRIBERS} output streams already, the most it may have")]
    TooManySubscribers(i32),
    #[error(
        "the session's process agent has {MAX_REQUESTS} requests waiting for its answers \
         already (is it stopped?): retry when one is answered"
    )]
    Busy,
    #[error("invalid process request: {0}")]
    Invalid(String),
    #[error("talking to the process agent: {0}")]
    Io(#[from] io::Error),
}

/// What starts a program.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ProcessSpec {
    pub argv: Vec<String>,
    /// Relative to `/workspace` (none: `/workspace`); an absolute path stays.
    pub cwd: Option<String>,
    pub env: Vec<(String, String)>,
    /// A name the program can be found by, besides its pid.
    pub tag: Option<String>,
    /// A pseudo-terminal of this size as its standard streams.
    pub pty: Option<PtySize>,
    /// A pipe as stdin (else `/dev/null`); a terminal always takes input.
    pub stdin: bool,
}

/// A running program, as listed.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessInfo {
    /// Its pid inside the sandbox.
    pub pid: i32,
    pub spec: ProcessSpec,
}

/// How a program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessExit {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
}

/// What a subscriber receives.
#[derive(Debug, Clone, PartialEq)]
pub enum ProcessEvent {
    Output {
        stream: OutputStream,
        data: Vec<u8>,
    },
    /// Output dropped for this subscriber: it did not read it in time, or its key's (or the
    /// server's) output bytes were all held.
    Lost {
        bytes: u64,
    },
    /// The program ended (`None`: the agent, or the session, went away first). Last.
    End(Option<ProcessExit>),
}

/// What a subscriber that waits without a thread is told when an event arrives.
type Wake = Arc<dyn Fn() + Send + Sync>;

/// What a chunk of `len` bytes of output holds of the pool of output bytes, in its queue and
/// then in its frame to the client: its base64 and the frame's overhead.
pub fn held_cost(len: usize) -> u64 {
    4 * (len as u64).div_ceil(3) + FRAME_OVERHEAD
}

struct QueueState {
    items: VecDeque<(OutputStream, Vec<u8>)>,
    bytes: usize,
    /// What the items hold of the pool of output bytes.
    held: Grant,
    lost: u64,
    end: Option<Option<ProcessExit>>,
    wake: Option<Wake>,
}

impl QueueState {
    fn woken(&self) {
        if let Some(wake) = &self.wake {
            wake();
        }
    }
}

struct Queue {
    state: Mutex<QueueState>,
    ready: Condvar,
}

impl Queue {
    /// An empty queue whose output is counted in `share`'s pool.
    fn new(share: &Share) -> Arc<Queue> {
        let held = share.take(0).expect("nothing is always admitted");
        Arc::new(Queue {
            state: Mutex::new(QueueState {
                items: VecDeque::new(),
                bytes: 0,
                held,
                lost: 0,
                end: None,
                wake: None,
            }),
            ready: Condvar::new(),
        })
    }

    fn push(&self, stream: OutputStream, data: &[u8]) {
        let mut q = self.state.lock();
        if q.bytes + data.len() > SUBSCRIBER_BYTES
            || q.held.try_grow(held_cost(data.len())).is_err()
        {
            q.lost += data.len() as u64;
        } else {
            q.bytes += data.len();
            q.items.push_back((stream, data.to_vec()));
        }
        q.woken();
        self.ready.notify_all();
    }

    fn end(&self, exit: Option<ProcessExit>) {
        let mut q = self.state.lock();
        if q.end.is_none() {
            q.end = Some(exit);
        }
        q.woken();
        self.ready.notify_all();
    }
}

/// One subscriber's stream of a program's output and end; dropping it unsubscribes.
pub struct Subscription {
    pid: i32,
    queue: Arc<Queue>,
}

impl Subscription {
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Calls `wake` (from the agent's reader thread, so it must not block) whenever an event
    /// arrives from now on: a caller that waits for events without a thread of its own (an
    /// async task, which then takes them with `next(Duration::ZERO)`) is told when to look.
    pub fn on_event(&self, wake: impl Fn() + Send + Sync + 'static) {
        self.queue.state.lock().wake = Some(Arc::new(wake));
    }

    /// The next event, waiting at most `timeout` (none: `None`). After [`ProcessEvent::End`]
    /// it returns `End` again. An output's bytes leave the pool of output bytes at once.
    pub fn next(&self, timeout: Duration) -> Option<ProcessEvent> {
        self.next_held(timeout).map(|(event, _)| event)
    }

    /// As [`Subscription::next`], with what an output still holds of the pool of output
    /// bytes ([`held_cost`]; nothing for other events): the caller drops it once the output
    /// is written to its client.
    pub fn next_held(&self, timeout: Duration) -> Option<(ProcessEvent, Grant)> {
        let deadline = Instant::now() + timeout;
        let mut q = self.queue.state.lock();
        loop {
            if q.lost > 0 {
                let bytes = std::mem::take(&mut q.lost);
                return Some((ProcessEvent::Lost { bytes }, q.held.split(0)));
            }
            if let Some((stream, data)) = q.items.pop_front() {
                q.bytes -= data.len();
                let held = q.held.split(held_cost(data.len()));
                return Some((ProcessEvent::Output { stream, data }, held));
            }
            if let Some(end) = q.end {
                return Some((ProcessEvent::End(end), q.held.split(0)));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.queue.ready.wait_for(&mut q, left);
        }
    }
}

struct Entry {
    spec: ProcessSpec,
    subscribers: Vec<Weak<Queue>>,
}

impl Entry {
    fn live_subscribers(&mut self) -> Vec<Arc<Queue>> {
        self.subscribers.retain(|w| w.strong_count() > 0);
        self.subscribers.iter().filter_map(Weak::upgrade).collect()
    }
}

type ReplySender = SyncSender<Result<Option<i32>, AgentError>>;

/// A start waiting for its pid: what becomes its entry, and its first subscriber.
struct PendingStart {
    spec: ProcessSpec,
    queue: Arc<Queue>,
}

/// What a request waiting for its reply becomes.
enum Pending {
    /// Nothing but the reply.
    Reply,
    /// A program's start (see [`PendingStart`]).
    Start(PendingStart),
    /// A kernel's start: where its descriptors go, and the write end of its exit pipe.
    Kernel(Arc<Mutex<Vec<OwnedFd>>>, OwnedFd),
}

#[derive(Default)]
struct State {
    replies: HashMap<u64, (ReplySender, Pending)>,
    processes: BTreeMap<i32, Entry>,
    /// Kernels started for code contexts: the write end of each one's exit pipe.
    kernels: HashMap<i32, OwnedFd>,
    gone: bool,
}

/// The host's side of an interpreter kernel the agent started ([`ProcessAgent::start_kernel`]).
pub struct KernelChannel {
    /// Its pid in the sandbox.
    pub pid: i32,
    /// The host's end of its fd 3.
    pub socket: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// Readable once it has exited: 4 bytes, its raw wait status (little-endian), or EOF when
    /// the agent went away first.
    pub exited: OwnedFd,
}

/// A session's process agent.
pub struct ProcessAgent {
    socket: Mutex<OwnedFd>,
    /// The session's environment, below each program's own.
    env: Mutex<Vec<(String, String)>>,
    state: Arc<Mutex<State>>,
    next_req: AtomicU64,
}

impl std::fmt::Debug for ProcessAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessAgent").finish_non_exhaustive()
    }
}

impl ProcessAgent {
    /// Takes the host's end of an agent's socket and starts reading it.
    pub fn new(socket: OwnedFd) -> io::Result<Arc<ProcessAgent>> {
        nix::sys::socket::setsockopt(
            &socket,
            nix::sys::socket::sockopt::SendTimeout,
            &nix::sys::time::TimeVal::new(REPLY_TIMEOUT.as_secs() as i64, 0),
        )
        .map_err(io::Error::from)?;
        let reader = socket.try_clone()?;
        let state = Arc::new(Mutex::new(State::default()));
        let thread_state = state.clone();
        std::thread::Builder::new()
            .name("corral-agent".into())
            .spawn(move || read_agent(reader, thread_state))?;
        Ok(Arc::new(ProcessAgent {
            socket: Mutex::new(socket),
            env: Mutex::new(Vec::new()),
            state,
            next_req: AtomicU64::new(1),
        }))
    }

    /// Sets the session's environment, which every program gets below its own.
    pub fn set_env(&self, env: Vec<(String, String)>) {
        *self.env.lock() = env;
    }

    fn request(
        &self,
        make: impl FnOnce(u64) -> Request,
        payload: &[u8],
        pending: Pending,
    ) -> Result<Option<i32>, AgentError> {
        let req = self.next_req.fetch_add(1, Ordering::Relaxed);
        let frame = encode(&make(req), payload);
        // The agent ends a connection that carries a frame past its bound: refused here, so
        // that a request too large (a start's argv and environment) is the client's error
        // and the session keeps its agent.
        if frame.len() > 4 + MAX_FRAME {
            return Err(AgentError::Invalid(format!(
                "a request of {} bytes (at most {MAX_FRAME} with the command, its directory \
                 and its environment)",
                frame.len() - 4
            )));
        }
        let (tx, rx) = sync_channel(1);
        {
            let mut state = self.state.lock();
            if state.gone {
                return Err(AgentError::Gone);
            }
            if state.replies.len() >= MAX_REQUESTS {
                return Err(AgentError::Busy);
            }
            state.replies.insert(req, (tx, pending));
        }
        let written = {
            let socket = self.socket.lock();
            write_all(socket.as_fd(), &frame)
        };
        if let Err(e) = written {
            self.state.lock().replies.remove(&req);
            return Err(e.into());
        }
        match rx.recv_timeout(REPLY_TIMEOUT) {
            Ok(outcome) => outcome,
            Err(_) => {
                self.state.lock().replies.remove(&req);
                Err(AgentError::NoAnswer(REPLY_TIMEOUT))
            }
        }
    }

    /// Starts a program; the subscription receives all of its output from its start, and
    /// counts what it holds of it in `share`.
    pub fn start(&self, spec: ProcessSpec, share: &Share) -> Result<Subscription, AgentError> {
        validate(&spec)?;
        let queue = Queue::new(share);
        let pending = PendingStart {
            spec: spec.clone(),
            queue: queue.clone(),
        };
        let env: Vec<(String, String)> = self.env.lock().iter().chain(&spec.env).cloned().collect();
        let pid = self.request(
            |req| Request::Start {
                req,
                argv: spec.argv,
                cwd: spec.cwd,
                env,
                pty: spec.pty,
                stdin: spec.stdin,
            },
            &[],
            Pending::Start(pending),
        )?;
        let pid = pid.ok_or(AgentError::Gone)?;
        Ok(Subscription { pid, queue })
    }

    /// Starts an interpreter kernel in the sandbox (a code context's): its pid and the
    /// host's ends of its socket and output pipes. It is no program of [`ProcessAgent::list`].
    pub fn start_kernel(
        &self,
        argv: Vec<String>,
        cwd: Option<String>,
        env: Vec<(String, String)>,
    ) -> Result<KernelChannel, AgentError> {
        let env: Vec<(String, String)> = self.env.lock().iter().cloned().chain(env).collect();
        let (exited, exit_write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
                .map_err(io::Error::from)?;
        let fds = Arc::new(Mutex::new(Vec::new()));
        let pid = self
            .request(
                |req| Request::StartKernel {
                    req,
                    argv,
                    cwd,
                    env,
                },
                &[],
                Pending::Kernel(fds.clone(), exit_write),
            )?
            .ok_or(AgentError::Gone)?;
        let mut fds = std::mem::take(&mut *fds.lock()).into_iter();
        match (fds.next(), fds.next(), fds.next()) {
            (Some(socket), Some(stdout), Some(stderr)) => Ok(KernelChannel {
                pid,
                socket,
                stdout,
                stderr,
                exited,
            }),
            _ => Err(AgentError::Gone),
        }
    }

    /// Sends `signal` to kernel `pid` (and its process group).
    pub fn signal_kernel(&self, pid: i32, signal: i32) -> Result<(), AgentError> {
        if !self.state.lock().kernels.contains_key(&pid) {
            return Err(AgentRefusal::NoSuchProcess(pid).into());
        }
        self.request(
            |req| Request::Signal { req, pid, signal },
            &[],
            Pending::Reply,
        )
        .map(drop)
    }

    /// The running programs, by pid.
    pub fn list(&self) -> Vec<ProcessInfo> {
        self.state
            .lock()
            .processes
            .iter()
            .map(|(&pid, e)| ProcessInfo {
                pid,
                spec: e.spec.clone(),
            })
            .collect()
    }

    /// The pid of the running program tagged `tag`.
    pub fn find_tag(&self, tag: &str) -> Option<i32> {
        let state = self.state.lock();
        state
            .processes
            .iter()
            .find(|(_, e)| e.spec.tag.as_deref() == Some(tag))
            .map(|(&pid, _)| pid)
    }

    /// A new subscriber to a running program's output from now on, which counts what it
    /// holds of it in `share`.
    pub fn subscribe(&self, pid: i32, share: &Share) -> Result<Subscription, AgentError> {
        let mut state = self.state.lock();
        let entry = state
            .processes
            .get_mut(&pid)
            .ok_or(AgentRefusal::NoSuchProcess(pid))?;
        if entry.live_subscribers().len() >= MAX_SUBSCRIBERS {
            return Err(AgentError::TooManySubscribers(pid));
        }
        let queue = Queue::new(share);
        entry.subscribers.push(Arc::downgrade(&queue));
        Ok(Subscription { pid, queue })
    }

    fn known(&self, pid: i32) -> Result<(), AgentError> {
        match self.state.lock().processes.contains_key(&pid) {
            true => Ok(()),
            false => Err(AgentRefusal::NoSuchProcess(pid).into()),
        }
    }

    /// Input to a program's stdin or terminal: at most [`MAX_INPUT`] bytes at once, refused
    /// ([`AgentRefusal::InputFull`]) while [`MAX_PENDING_INPUT`] bytes wait for the program.
    pub fn send_input(&self, pid: i32, data: &[u8]) -> Result<(), AgentError> {
        self.known(pid)?;
        for chunk in data.chunks(MAX_INPUT) {
            self.request(|req| Request::Input { req, pid }, chunk, Pending::Reply)?;
        }
        Ok(())
    }

    pub fn close_stdin(&self, pid: i32) -> Result<(), AgentError> {
        self.known(pid)?;
        self.request(|req| Request::CloseStdin { req, pid }, &[], Pending::Reply)
            .map(drop)
    }

    /// Sends `signal` to the program's process group.
    pub fn signal(&self, pid: i32, signal: i32) -> Result<(), AgentError> {
        self.known(pid)?;
        self.request(
            |req| Request::Signal { req, pid, signal },
            &[],
            Pending::Reply,
        )
        .map(drop)
    }

    pub fn resize(&self, pid: i32, size: PtySize) -> Result<(), AgentError> {
        self.known(pid)?;
        if size.rows == 0 || size.cols == 0 {
            return Err(AgentError::Invalid(
                "a terminal of 0 rows or columns".into(),
            ));
        }
        self.request(
            |req| Request::Resize { req, pid, size },
            &[],
            Pending::Reply,
        )
        .map(drop)
    }
}

/// The longest tag a program may carry, in bytes.
const MAX_TAG_BYTES: usize = 1024;

fn validate(spec: &ProcessSpec) -> Result<(), AgentError> {
    let invalid = |m: &str| Err(AgentError::Invalid(m.to_string()));
    if spec.argv.is_empty() || spec.argv[0].is_empty() {
        return invalid("an empty command");
    }
    if spec
        .argv
        .iter()
        .chain(spec.cwd.iter())
        .any(|s| s.contains('\0'))
    {
        return invalid("a NUL byte in the command or its directory");
    }
    corral_sandbox::env::check(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map_err(|e| AgentError::Invalid(format!("environment: {e}")))?;
    // The host keeps a running program's tag (and lists it); the agent never sees it.
    if spec.tag.as_ref().is_some_and(|t| t.len() > MAX_TAG_BYTES) {
        return Err(AgentError::Invalid(format!(
            "a tag longer than {MAX_TAG_BYTES} bytes"
        )));
    }
    if let Some(size) = spec.pty {
        if size.rows == 0 || size.cols == 0 {
            return invalid("a terminal of 0 rows or columns");
        }
    }
    Ok(())
}

fn write_all(fd: std::os::fd::BorrowedFd<'_>, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match nix::sys::socket::send(
            fd.as_raw_fd(),
            bytes,
            nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
        ) {
            Ok(n) => bytes = &bytes[n..],
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The reader thread: every frame of the agent, until it hangs up.
fn read_agent(socket: OwnedFd, state: Arc<Mutex<State>>) {
    let mut reader = FrameReader::default();
    let mut buf = vec![0u8; OUTPUT_CHUNK + 4096];
    let mut fds = VecDeque::new();
    'read: loop {
        let n = match receive(socket.as_fd(), &mut buf, &mut fds) {
            Ok(0) => break,
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
        };
        reader.push(&buf[..n]);
        loop {
            match reader.next_frame::<Message>() {
                Ok(Some(frame)) => dispatch(&state, frame.header, &frame.payload, &mut fds),
                Ok(None) => break,
                // An agent that breaks the protocol is not listened to any more.
                Err(_) => break 'read,
            }
        }
    }
    let mut state = state.lock();
    state.gone = true;
    for (_, (reply, pending)) in state.replies.drain() {
        let _ = reply.try_send(Err(AgentError::Gone));
        if let Pending::Start(start) = pending {
            start.queue.end(None);
        }
    }
    // Their exit pipes close: EOF, the agent is gone.
    state.kernels.clear();
    for (_, mut entry) in std::mem::take(&mut state.processes) {
        for queue in entry.live_subscribers() {
            queue.end(None);
        }
    }
}

fn dispatch(state: &Mutex<State>, message: Message, payload: &[u8], fds: &mut VecDeque<OwnedFd>) {
    let mut state = state.lock();
    match message {
        Message::Reply { req, pid, error } => {
            let Some((reply, pending)) = state.replies.remove(&req) else {
                return;
            };
            match (pending, pid, &error) {
                (Pending::Start(start), Some(pid), None) => {
                    state.processes.insert(
                        pid,
                        Entry {
                            spec: start.spec,
                            subscribers: vec![Arc::downgrade(&start.queue)],
                        },
                    );
                }
                (Pending::Kernel(slot, exit_write), Some(pid), None) => {
                    *slot.lock() = fds.drain(..).collect();
                    state.kernels.insert(pid, exit_write);
                }
                _ => {}
            }
            let _ = reply.try_send(match error {
                Some(refusal) => Err(refusal.into()),
                None => Ok(pid),
            });
        }
        Message::Output { pid, stream } => {
            if let Some(entry) = state.processes.get_mut(&pid) {
                for queue in entry.live_subscribers() {
                    queue.push(stream, payload);
                }
            }
        }
        Message::Exit { pid, status } => {
            if let Some(exit_write) = state.kernels.remove(&pid) {
                let _ = nix::unistd::write(&exit_write, &status.to_le_bytes());
            }
            if let Some(mut entry) = state.processes.remove(&pid) {
                let (exit_code, signal) = decode_status(status);
                for queue in entry.live_subscribers() {
                    queue.end(Some(ProcessExit { exit_code, signal }));
                }
            }
        }
    }
}

fn decode_status(raw: i32) -> (Option<i32>, Option<i32>) {
    if raw & 0x7f == 0 {
        (Some((raw >> 8) & 0xff), None)
    } else {
        (None, Some(raw & 0x7f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A share of a pool larger than any test's output.
    fn roomy() -> Share {
        corral_share::Pool::new(
            "output",
            "bytes",
            corral_share::Limits::new(1 << 30, 1 << 30, 0, 0),
        )
        .share("k")
    }

    #[test]
    fn a_keys_unread_queues_hold_its_share_and_leave_other_keys_theirs() {
        let chunk = vec![b'x'; 3000];
        let cost = held_cost(chunk.len());
        let pool = corral_share::Pool::new(
            "output",
            "bytes",
            corral_share::Limits::new(10 * cost, 6 * cost, 2 * cost, 2 * cost),
        );
        // Key a's three subscribers read nothing: together they hold a's share, no more.
        let a: Vec<_> = (0..3).map(|_| Queue::new(&pool.share("a"))).collect();
        for _ in 0..10 {
            for q in &a {
                q.push(OutputStream::Stdout, &chunk);
            }
        }
        assert_eq!(pool.held_by("a"), 6 * cost);
        let lost: u64 = a.iter().map(|q| q.state.lock().lost).sum();
        assert_eq!(lost, 24 * 3000, "what did not fit is lost, and counted");
        // Key b takes the rest of the pool; key c still gets its floor.
        let b = Queue::new(&pool.share("b"));
        for _ in 0..10 {
            b.push(OutputStream::Stdout, &chunk);
        }
        assert_eq!(pool.held_by("b"), 4 * cost);
        let c = Subscription {
            pid: 1,
            queue: Queue::new(&pool.share("c")),
        };
        c.queue.push(OutputStream::Stdout, &chunk);
        let (event, held) = c.next_held(Duration::ZERO).unwrap();
        assert!(matches!(event, ProcessEvent::Output { .. }));
        // The chunk's units go with it until its frame is written.
        assert_eq!((held.amount(), pool.held_by("c")), (cost, cost));
        drop(held);
        assert_eq!(pool.held_by("c"), 0);
        // Read, a's output leaves the pool, and a's subscribers take output again.
        let first = Subscription {
            pid: 1,
            queue: a[0].clone(),
        };
        assert!(matches!(
            first.next(Duration::ZERO),
            Some(ProcessEvent::Lost { .. })
        ));
        while let Some(ProcessEvent::Output { .. }) = first.next(Duration::ZERO) {}
        assert!(pool.held_by("a") < 6 * cost);
        a[1].push(OutputStream::Stdout, &chunk);
        assert_eq!(a[1].state.lock().items.len(), 3);
        drop((a, b, c, first));
        assert_eq!(pool.held(), 0, "a queue gives its units back when it goes");
    }

    #[test]
    fn a_subscriber_that_does_not_read_holds_a_bounded_queue() {
        let queue = Queue::new(&roomy());
        let chunk = vec![b'x'; 1000];
        for _ in 0..10_000 {
            queue.push(OutputStream::Stdout, &chunk);
        }
        let state = queue.state.lock();
        assert!(state.bytes <= SUBSCRIBER_BYTES);
        assert_eq!(state.bytes as u64 + state.lost, 10_000 * 1000);
    }

    #[test]
    fn lost_output_is_reported_before_the_rest_and_the_end_comes_last() {
        let queue = Queue::new(&roomy());
        let sub = Subscription {
            pid: 5,
            queue: queue.clone(),
        };
        queue.push(OutputStream::Stdout, b"a");
        queue.push(OutputStream::Stderr, &vec![0; SUBSCRIBER_BYTES]);
        queue.end(Some(ProcessExit {
            exit_code: Some(3),
            signal: None,
        }));
        let t = Duration::from_millis(10);
        assert_eq!(
            sub.next(t),
            Some(ProcessEvent::Lost {
                bytes: SUBSCRIBER_BYTES as u64
            })
        );
        assert_eq!(
            sub.next(t),
            Some(ProcessEvent::Output {
                stream: OutputStream::Stdout,
                data: b"a".to_vec()
            })
        );
        let end = ProcessEvent::End(Some(ProcessExit {
            exit_code: Some(3),
            signal: None,
        }));
        assert_eq!(sub.next(t), Some(end.clone()));
        assert_eq!(sub.next(t), Some(end));
    }

    #[test]
    fn a_subscriber_is_told_of_every_event_and_takes_it_without_waiting() {
        let queue = Queue::new(&roomy());
        let sub = Subscription {
            pid: 5,
            queue: queue.clone(),
        };
        assert_eq!(sub.next(Duration::ZERO), None);
        let told = Arc::new(AtomicU64::new(0));
        let counter = told.clone();
        sub.on_event(move || {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        queue.push(OutputStream::Stdout, b"a");
        // Output past the queue's bound is lost, and the subscriber is told of that too.
        queue.push(OutputStream::Stdout, &vec![0; SUBSCRIBER_BYTES]);
        queue.end(None);
        assert_eq!(told.load(Ordering::SeqCst), 3);
        assert!(matches!(
            sub.next(Duration::ZERO),
            Some(ProcessEvent::Lost { .. })
        ));
        assert!(matches!(
            sub.next(Duration::ZERO),
            Some(ProcessEvent::Output { .. })
        ));
        assert_eq!(sub.next(Duration::ZERO), Some(ProcessEvent::End(None)));
    }

    #[test]
    fn requests_to_an_agent_that_does_not_answer_are_bounded() {
        let (host, silent) = std::os::unix::net::UnixStream::pair().unwrap();
        let agent = ProcessAgent::new(host.into()).unwrap();
        let spec = ProcessSpec {
            argv: vec!["true".into()],
            ..ProcessSpec::default()
        };
        let waiting: Vec<_> = (0..MAX_REQUESTS)
            .map(|_| {
                let (agent, spec) = (agent.clone(), spec.clone());
                std::thread::spawn(move || agent.start(spec, &roomy()).map(|_| ()))
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(5);
        while agent.state.lock().replies.len() < MAX_REQUESTS {
            assert!(Instant::now() < deadline, "the requests were not sent");
            std::thread::sleep(Duration::from_millis(10));
        }
        let started = Instant::now();
        assert!(matches!(agent.start(spec, &roomy()), Err(AgentError::Busy)));
        assert!(started.elapsed() < Duration::from_secs(1));
        for t in waiting {
            assert!(matches!(t.join().unwrap(), Err(AgentError::NoAnswer(_))));
        }
        drop(silent);
    }

    /// A start larger than the agent's frame bound (an argv, environment or directory of
    /// hundreds of KiB) is refused before a byte is sent: the agent, which ends a connection
    /// that breaks its bound, keeps serving the session.
    #[test]
    fn a_request_beyond_the_frame_bound_is_refused_before_it_is_sent() {
        use std::io::Read as _;
        let (host, mut fake) = std::os::unix::net::UnixStream::pair().unwrap();
        let agent = ProcessAgent::new(host.into()).unwrap();
        for spec in [
            ProcessSpec {
                argv: vec!["x".repeat(MAX_FRAME)],
                ..ProcessSpec::default()
            },
            ProcessSpec {
                argv: vec!["true".into()],
                env: vec![("BIG".into(), "y".repeat(MAX_FRAME / 2)); 2],
                ..ProcessSpec::default()
            },
            ProcessSpec {
                argv: vec!["true".into()],
                cwd: Some("d/".repeat(MAX_FRAME / 2)),
                ..ProcessSpec::default()
            },
        ] {
            let started = Instant::now();
            assert!(matches!(
                agent.start(spec, &roomy()),
                Err(AgentError::Invalid(_))
            ));
            assert!(started.elapsed() < Duration::from_secs(1));
        }
        assert!(!agent.state.lock().gone);
        assert!(agent.state.lock().replies.is_empty());
        fake.set_nonblocking(true).unwrap();
        let read = fake.read(&mut [0u8; 1]);
        assert!(
            matches!(&read, Err(e) if e.kind() == io::ErrorKind::WouldBlock),
            "a frame reached the agent: {read:?}"
        );
    }

    #[test]
    fn wait_statuses_decode() {
        assert_eq!(decode_status(7 << 8), (Some(7), None));
        assert_eq!(decode_status(9), (None, Some(9)));
        assert_eq!(decode_status(15 | 0x80), (None, Some(15)));
    }

    #[test]
    fn malformed_specs_are_refused_before_anything_is_sent() {
        let ok = ProcessSpec {
            argv: vec!["true".into()],
            ..ProcessSpec::default()
        };
        assert!(validate(&ok).is_ok());
        let tagged = ProcessSpec {
            tag: Some("t".repeat(MAX_TAG_BYTES)),
            ..ok.clone()
        };
        assert!(validate(&tagged).is_ok());
        for bad in [
            ProcessSpec::default(),
            ProcessSpec {
                argv: vec!["a\0b".into()],
                ..ProcessSpec::default()
            },
            ProcessSpec {
                env: vec![("A=B".into(), "c".into())],
                ..ok.clone()
            },
            ProcessSpec {
                pty: Some(PtySize { rows: 0, cols: 80 }),
                ..ok.clone()
            },
            ProcessSpec {
                tag: Some("t".repeat(MAX_TAG_BYTES + 1)),
                ..ok.clone()
            },
        ] {
            assert!(matches!(validate(&bad), Err(AgentError::Invalid(_))));
        }
    }
}
