//! The process tools of docs/mcp.md: background programs (a web server, a long job) that an
//! agent starts, reads the output of, feeds input and kills, in its own sessions only.
//!
//! A program a connection starts (or reads) is *followed*: a thread reads its output into a
//! [`ProcessLog`] that keeps the last [`LOG_KEEP`] bytes, addressed by byte offsets, so
//! `read_process_output` returns what came since a cursor. Every byte is bounded: at most
//! [`MAX_FOLLOWED`] programs per connection, [`LOG_KEEP`] bytes each, [`READ_MAX`] bytes per
//! read, waits of at most [`WAIT_MAX_S`].

use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_kernel::agent::{ProcessEvent, ProcessExit};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Extensions};
use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;

use super::{flatten, plain_optionals, CorralMcp, Language, ToolResult};
use crate::backend::{
    Backend, BackendError, Caller, OutputSource, ProcessSignal, ProcessStart, RunningProcess,
};

/// The most output kept per followed program (older output is dropped, and reads say so).
pub const LOG_KEEP: usize = 256 << 10;
/// The most programs one connection follows at once.
pub const MAX_FOLLOWED: usize = 16;
/// What one read returns by default, and at most.
pub const READ_DEFAULT: usize = 16 << 10;
pub const READ_MAX: usize = 64 << 10;
/// The longest a read waits for output.
pub const WAIT_MAX_S: f64 = 30.0;
/// How long `start_process` waits for a program that fails at once, and `kill_process` for
/// the end of the program it signalled.
const START_WAIT: Duration = Duration::from_millis(500);
const KILL_WAIT: Duration = Duration::from_secs(2);
/// How often a reader thread looks whether it was stopped.
const READER_POLL: Duration = Duration::from_secs(1);
/// The most of a command line a listing shows.
const COMMAND_SHOWN: usize = 200;

const START_PROCESS: &str = "Start a shell command line (bash -c) in the background in the \
sandbox, e.g. \"python3 -m http.server 8000\" or \"python3 train.py\", and return its pid at \
once; it runs beside run_code and run_command until it ends or kill_process ends it. Read its \
output (stdout and stderr together) with read_process_output. With stdin=true it reads input \
from send_process_input; otherwise its stdin is empty. The sandbox has no network unless the server's \
operator allows some hosts.";

const LIST_PROCESSES: &str = "List the background programs of a session: the running ones, \
and those this connection started that have ended, with their exit codes.";

const READ_PROCESS_OUTPUT: &str = "Read a background program's output (stdout and stderr \
together) from byte offset cursor (0: the start; pass the next_cursor of the previous read to \
get only what is new). At most max_bytes (default 16384, at most 65536) come back; the answer \
says whether more is waiting and whether the program is still running or how it ended. \
wait_s (at most 30) waits for new output first. Only the last 256 KiB of a program's output \
are kept.";

const SEND_PROCESS_INPUT: &str = "Send text to the stdin of a background program started with \
stdin=true (add \"\\n\" to end a line). close_stdin=true closes its stdin afterwards (the \
program reads end of file).";

const KILL_PROCESS: &str = "Stop a background program: SIGKILL by default, or SIGTERM, SIGINT \
or SIGHUP; the signal goes to its whole process group.";

/// What a followed program wrote, by byte offset from its start, and how it ended.
#[derive(Default)]
pub struct ProcessLog {
    state: Mutex<LogState>,
    changed: Condvar,
}

#[derive(Default)]
struct LogState {
    /// The last [`LOG_KEEP`] bytes of output.
    kept: VecDeque<u8>,
    /// The offset of `kept[0]`.
    first: u64,
    /// Output the server dropped because it was read too slowly.
    lost: u64,
    end: Option<Option<ProcessExit>>,
}

impl LogState {
    fn total(&self) -> u64 {
        self.first + self.kept.len() as u64
    }
}

/// What a read of a [`ProcessLog`] returns.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    /// The offset of `data`'s first byte (past `cursor` when output was dropped).
    pub from: u64,
    pub data: Vec<u8>,
    /// Bytes after `data` that this read did not return.
    pub more: u64,
    /// Output between the cursor and `from` no longer kept.
    pub skipped: u64,
    pub lost: u64,
    /// `None`: running; `Some(None)`: ended without a status (the session went away).
    pub end: Option<Option<ProcessExit>>,
}

impl ProcessLog {
    fn push(&self, data: &[u8]) {
        let mut s = self.state.lock();
        s.kept.extend(data);
        let over = s.kept.len().saturating_sub(LOG_KEEP);
        s.kept.drain(..over);
        s.first += over as u64;
        self.changed.notify_all();
    }

    fn lose(&self, bytes: u64) {
        self.state.lock().lost += bytes;
    }

    fn finish(&self, exit: Option<ProcessExit>) {
        let mut s = self.state.lock();
        s.end.get_or_insert(exit);
        self.changed.notify_all();
    }

    fn ended(&self) -> bool {
        self.state.lock().end.is_some()
    }

    /// At most `max` bytes from `cursor` on, waiting up to `wait` for output past `cursor`
    /// (or the end) when there is none yet.
    pub fn read(&self, cursor: u64, max: usize, wait: Duration) -> Chunk {
        let deadline = Instant::now() + wait;
        let mut s = self.state.lock();
        while s.total() <= cursor && s.end.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            self.changed.wait_for(&mut s, left);
        }
        let from = cursor.clamp(s.first, s.total());
        let start = (from - s.first) as usize;
        let take = max.min(s.kept.len() - start);
        Chunk {
            from,
            data: s.kept.range(start..start + take).copied().collect(),
            more: s.total() - from - take as u64,
            skipped: from.saturating_sub(cursor.min(s.total())),
            lost: s.lost,
            end: s.end,
        }
    }

    /// Waits up to `wait` for the program's end.
    fn wait_end(&self, wait: Duration) -> Option<Option<ProcessExit>> {
        let deadline = Instant::now() + wait;
        let mut s = self.state.lock();
        while s.end.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            self.changed.wait_for(&mut s, left);
        }
        s.end
    }
}

/// A followed program: its log and the flag that stops its reader thread.
struct Followed {
    log: Arc<ProcessLog>,
    stop: Arc<AtomicBool>,
    /// When it was followed (the oldest ended program is forgotten first).
    serial: u64,
}

/// The programs of a connection by session and pid, and the serial of the last one followed.
type FollowedMap = (u64, BTreeMap<(String, i32), Followed>);

/// The programs one connection follows.
#[derive(Default)]
pub struct Followers {
    map: Mutex<FollowedMap>,
}

impl Followers {
    fn log(&self, session: &str, pid: i32) -> Option<Arc<ProcessLog>> {
        let map = self.map.lock();
        map.1
            .get(&(session.to_string(), pid))
            .map(|f| f.log.clone())
    }

    /// Whether another program can be followed: fewer than [`MAX_FOLLOWED`], or one ended.
    fn has_room(&self) -> bool {
        let map = self.map.lock();
        map.1.len() < MAX_FOLLOWED || map.1.values().any(|f| f.log.ended())
    }

    /// Follows program `pid` of `session`: a thread reads `source` into its log. The oldest
    /// ended program is forgotten to make room; when all [`MAX_FOLLOWED`] run, it is refused.
    fn follow(
        &self,
        session: &str,
        pid: i32,
        mut source: Box<dyn OutputSource>,
    ) -> Result<Arc<ProcessLog>, String> {
        let mut map = self.map.lock();
        if map.1.len() >= MAX_FOLLOWED {
            let oldest_ended = map
                .1
                .iter()
                .filter(|(_, f)| f.log.ended())
                .min_by_key(|(_, f)| f.serial)
                .map(|(k, _)| k.clone());
            match oldest_ended {
                Some(key) => {
                    if let Some(f) = map.1.remove(&key) {
                        f.stop.store(true, Ordering::Relaxed);
                    }
                }
                None => {
                    return Err(format!(
                        "this connection already follows {MAX_FOLLOWED} running programs, the \
                         most it may: kill_process one first"
                    ))
                }
            }
        }
        let log = Arc::new(ProcessLog::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (thread_log, thread_stop) = (log.clone(), stop.clone());
        std::thread::Builder::new()
            .name(format!("mcp-process-{pid}"))
            .spawn(move || {
                while !thread_stop.load(Ordering::Relaxed) {
                    match source.next(READER_POLL) {
                        None => {}
                        Some(ProcessEvent::Output { data, .. }) => thread_log.push(&data),
                        Some(ProcessEvent::Lost { bytes }) => thread_log.lose(bytes),
                        Some(ProcessEvent::End(exit)) => {
                            thread_log.finish(exit);
                            break;
                        }
                    }
                }
            })
            .map_err(|e| format!("cannot follow the program's output: {e}"))?;
        map.0 += 1;
        let serial = map.0;
        map.1.insert(
            (session.to_string(), pid),
            Followed {
                log: log.clone(),
                stop,
                serial,
            },
        );
        Ok(log)
    }

    /// The followed programs of `session` that have ended, with how.
    fn ended(&self, session: &str) -> Vec<(i32, Option<ProcessExit>)> {
        let map = self.map.lock();
        map.1
            .iter()
            .filter(|((s, _), _)| s == session)
            .filter_map(|((_, pid), f)| {
                let end = f.log.state.lock().end?;
                Some((*pid, end))
            })
            .collect()
    }

    /// Stops following the programs of `session` (`None`: of every session).
    pub fn forget(&self, session: Option<&str>) {
        let mut map = self.map.lock();
        map.1.retain(|(s, _), f| {
            let keep = session.is_some_and(|session| s != session);
            if !keep {
                f.stop.store(true, Ordering::Relaxed);
            }
            keep
        });
    }
}

/// The log of program `pid` of session `id`, following it (output from now on) when this
/// connection did not yet.
fn log_of(
    backend: &dyn Backend,
    caller: &Caller,
    followers: &Followers,
    id: &str,
    pid: i32,
) -> Result<Arc<ProcessLog>, BackendError> {
    if let Some(log) = followers.log(id, pid) {
        return Ok(log);
    }
    if !followers.has_room() {
        return Err(BackendError::Other(format!(
            "this connection already follows {MAX_FOLLOWED} running programs, the most it may: \
             kill_process one first"
        )));
    }
    let source = backend.attach_process(caller, id, pid)?;
    followers
        .follow(id, pid, source)
        .map_err(BackendError::Other)
}

/// A UTF-8 text of `data`, and how many bytes of it that is: an incomplete character at the
/// end is left for the next read; invalid bytes become U+FFFD.
fn text_of(data: &[u8], more_may_come: bool) -> (String, usize) {
    match std::str::from_utf8(data) {
        Ok(text) => (text.to_string(), data.len()),
        Err(e) if e.error_len().is_none() && e.valid_up_to() > 0 && more_may_come => {
            let valid = e.valid_up_to();
            (String::from_utf8_lossy(&data[..valid]).into_owned(), valid)
        }
        Err(_) => (String::from_utf8_lossy(data).into_owned(), data.len()),
    }
}

fn ending(end: Option<ProcessExit>) -> String {
    match end {
        Some(ProcessExit {
            exit_code: Some(code),
            ..
        }) => format!("exited with code {code}"),
        Some(ProcessExit {
            signal: Some(signal),
            ..
        }) => format!("was killed by signal {signal}"),
        _ => "ended (its session went away)".into(),
    }
}

/// A read as the tool answers it: the text, a status line, and the numbers as structured
/// content.
fn output_answer(pid: i32, cursor: u64, chunk: Chunk, notes: Vec<String>) -> CallToolResult {
    let more_may_come = chunk.more > 0 || chunk.end.is_none();
    let (text, used) = text_of(&chunk.data, more_may_come);
    let next = chunk.from + used as u64;
    let more = chunk.more + (chunk.data.len() - used) as u64;
    let mut content: Vec<ContentBlock> = notes.into_iter().map(ContentBlock::text).collect();
    if chunk.skipped > 0 {
        content.push(ContentBlock::text(format!(
            "[{} bytes after cursor {cursor} are gone: only the last {LOG_KEEP} bytes of output \
             are kept]",
            chunk.skipped
        )));
    }
    content.push(ContentBlock::text(if text.is_empty() {
        "(no new output)".to_string()
    } else {
        text
    }));
    let state = match chunk.end {
        None => "is running".to_string(),
        Some(end) => ending(end),
    };
    let mut status = format!("[pid {pid} {state}; next_cursor {next}");
    if more > 0 {
        status.push_str(&format!(
            "; {more} more bytes: read again with cursor={next}"
        ));
    }
    if chunk.lost > 0 {
        status.push_str(&format!(
            "; {} bytes were lost because they came faster than they were read",
            chunk.lost
        ));
    }
    status.push(']');
    content.push(ContentBlock::text(status));
    let (exit_code, signal) = match chunk.end {
        Some(Some(exit)) => (exit.exit_code, exit.signal),
        _ => (None, None),
    };
    let mut out = CallToolResult::success(content);
    out.structured_content = Some(serde_json::json!({
        "pid": pid,
        "cursor": chunk.from,
        "next_cursor": next,
        "more_bytes": more,
        "skipped_bytes": chunk.skipped,
        "lost_bytes": chunk.lost,
        "running": chunk.end.is_none(),
        "exit_code": exit_code,
        "signal": signal,
    }));
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
#[schemars(inline)]
pub enum SignalName {
    Sigkill,
    Sigterm,
    Sigint,
    Sighup,
}

impl From<SignalName> for ProcessSignal {
    fn from(s: SignalName) -> ProcessSignal {
        match s {
            SignalName::Sigkill => ProcessSignal::Kill,
            SignalName::Sigterm => ProcessSignal::Term,
            SignalName::Sigint => ProcessSignal::Int,
            SignalName::Sighup => ProcessSignal::Hup,
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = plain_optionals)]
pub struct StartProcessParams {
    /// A shell command line, run by bash -c, e.g. "python3 -m http.server 8000".
    pub command: String,
    /// Working directory, an absolute path inside the sandbox (default /workspace).
    pub cwd: Option<String>,
    /// Environment variables for it.
    pub env: Option<BTreeMap<String, String>>,
    /// Give it a stdin that send_process_input writes to (default false: stdin is empty).
    pub stdin: Option<bool>,
    /// A session from create_session; omit it to use this connection's default session.
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = plain_optionals)]
pub struct ListProcessesParams {
    /// A session from create_session; omit it to use this connection's default session.
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = plain_optionals)]
pub struct ReadProcessOutputParams {
    /// The pid start_process returned.
    pub pid: i32,
    /// Byte offset to read from: 0 (default) for the start, or the previous read's next_cursor.
    pub cursor: Option<u64>,
    /// At most this many bytes (default 16384, at most 65536).
    pub max_bytes: Option<usize>,
    /// Wait up to this many seconds (at most 30) for output past cursor (default 0).
    pub wait_s: Option<f64>,
    /// A session from create_session; omit it to use this connection's default session.
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = plain_optionals)]
pub struct SendProcessInputParams {
    /// The pid start_process returned.
    pub pid: i32,
    /// The text to write to its stdin.
    pub text: String,
    /// Close its stdin after the text (default false).
    pub close_stdin: Option<bool>,
    /// A session from create_session; omit it to use this connection's default session.
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = plain_optionals)]
pub struct KillProcessParams {
    /// The pid start_process returned.
    pub pid: i32,
    /// SIGKILL (default), SIGTERM, SIGINT or SIGHUP.
    pub signal: Option<SignalName>,
    /// A session from create_session; omit it to use this connection's default session.
    pub session_id: Option<String>,
}

fn shown(p: &RunningProcess) -> String {
    let line = std::iter::once(p.cmd.as_str())
        .chain(p.args.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(" ");
    match line.char_indices().nth(COMMAND_SHOWN) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line,
    }
}

#[tool_router(router = process_tools, vis = "pub(super)")]
impl CorralMcp {
    #[tool(description = START_PROCESS)]
    async fn start_process(
        &self,
        Parameters(p): Parameters<StartProcessParams>,
        ext: Extensions,
    ) -> ToolResult {
        let conn = match self.context(&ext) {
            Ok((_, conn)) => conn,
            Err(e) => return Ok(e),
        };
        let req = ProcessStart {
            command: p.command,
            cwd: p.cwd,
            env: p.env.unwrap_or_default(),
            stdin: p.stdin.unwrap_or(false),
        };
        let followers = conn.clone();
        flatten(
            self.on_session(&ext, p.session_id, Language::Python, move |b, c, id| {
                let followers = &followers.processes;
                if !followers.has_room() {
                    return Err(BackendError::Other(format!(
                        "this connection already follows {MAX_FOLLOWED} running programs, the \
                         most it may: kill_process one first"
                    )));
                }
                let (pid, source) = b.start_process(c, id, &req)?;
                let log = followers
                    .follow(id, pid, source)
                    .map_err(|e| BackendError::Other(format!("started pid {pid}, but {e}")))?;
                log.wait_end(START_WAIT);
                Ok((
                    id.to_string(),
                    pid,
                    log.read(0, READ_DEFAULT, Duration::ZERO),
                ))
            })
            .await
            .map(|((session, pid, chunk), mut notes)| {
                notes.push(match chunk.end {
                    None => format!(
                        "started pid {pid}; it runs in the background: read its output with \
                         read_process_output (pid {pid}), stop it with kill_process"
                    ),
                    Some(end) => format!("pid {pid} {} already", ending(end)),
                });
                let mut out = output_answer(pid, 0, chunk, notes);
                if let Some(serde_json::Value::Object(o)) = out.structured_content.as_mut() {
                    o.insert("session_id".into(), session.into());
                }
                out
            }),
        )
    }

    #[tool(description = LIST_PROCESSES)]
    async fn list_processes(
        &self,
        Parameters(p): Parameters<ListProcessesParams>,
        ext: Extensions,
    ) -> ToolResult {
        let conn = match self.context(&ext) {
            Ok((_, conn)) => conn,
            Err(e) => return Ok(e),
        };
        flatten(
            self.on_session(&ext, p.session_id, Language::Python, move |b, c, id| {
                Ok((b.list_processes(c, id)?, conn.processes.ended(id)))
            })
            .await
            .map(|((running, ended), notes)| {
                let mut lines = notes;
                let mut listed = Vec::new();
                for p in &running {
                    lines.push(format!("pid {} running: {}", p.pid, shown(p)));
                    listed.push(serde_json::json!({
                        "pid": p.pid, "command": shown(p), "running": true,
                    }));
                }
                for (pid, end) in ended {
                    if running.iter().any(|p| p.pid == pid) {
                        continue;
                    }
                    lines.push(format!("pid {pid} {}", ending(end)));
                    listed.push(serde_json::json!({
                        "pid": pid, "running": false,
                        "exit_code": end.and_then(|e| e.exit_code),
                        "signal": end.and_then(|e| e.signal),
                    }));
                }
                if listed.is_empty() {
                    lines.push("(no background programs)".into());
                }
                let mut out =
                    CallToolResult::success(lines.into_iter().map(ContentBlock::text).collect());
                out.structured_content = Some(serde_json::json!({ "processes": listed }));
                out
            }),
        )
    }

    #[tool(description = READ_PROCESS_OUTPUT)]
    async fn read_process_output(
        &self,
        Parameters(p): Parameters<ReadProcessOutputParams>,
        ext: Extensions,
    ) -> ToolResult {
        let conn = match self.context(&ext) {
            Ok((_, conn)) => conn,
            Err(e) => return Ok(e),
        };
        let (pid, cursor) = (p.pid, p.cursor.unwrap_or(0));
        let max = p.max_bytes.unwrap_or(READ_DEFAULT).clamp(1, READ_MAX);
        let wait = Duration::from_secs_f64(p.wait_s.unwrap_or(0.0).clamp(0.0, WAIT_MAX_S));
        flatten(
            self.on_session(&ext, p.session_id, Language::Python, move |b, c, id| {
                let log = log_of(b, c, &conn.processes, id, pid)?;
                Ok(log.read(cursor, max, wait))
            })
            .await
            .map(|(chunk, notes)| output_answer(pid, cursor, chunk, notes)),
        )
    }

    #[tool(description = SEND_PROCESS_INPUT)]
    async fn send_process_input(
        &self,
        Parameters(p): Parameters<SendProcessInputParams>,
        ext: Extensions,
    ) -> ToolResult {
        let (pid, text, close) = (p.pid, p.text, p.close_stdin.unwrap_or(false));
        let sent = text.len();
        flatten(
            self.on_session(&ext, p.session_id, Language::Python, move |b, c, id| {
                if !text.is_empty() {
                    b.send_process_input(c, id, pid, text.as_bytes())?;
                }
                if close {
                    b.close_process_stdin(c, id, pid)?;
                }
                Ok(())
            })
            .await
            .map(|((), mut notes)| {
                notes.push(format!(
                    "sent {sent} bytes to pid {pid}{}",
                    if close { " and closed its stdin" } else { "" }
                ));
                CallToolResult::success(notes.into_iter().map(ContentBlock::text).collect())
            }),
        )
    }

    #[tool(description = KILL_PROCESS)]
    async fn kill_process(
        &self,
        Parameters(p): Parameters<KillProcessParams>,
        ext: Extensions,
    ) -> ToolResult {
        let conn = match self.context(&ext) {
            Ok((_, conn)) => conn,
            Err(e) => return Ok(e),
        };
        let pid = p.pid;
        let signal = ProcessSignal::from(p.signal.unwrap_or(SignalName::Sigkill));
        flatten(
            self.on_session(&ext, p.session_id, Language::Python, move |b, c, id| {
                b.signal_process(c, id, pid, signal)?;
                Ok(conn
                    .processes
                    .log(id, pid)
                    .and_then(|log| log.wait_end(KILL_WAIT)))
            })
            .await
            .map(|(end, mut notes)| {
                notes.push(match end {
                    Some(end) => format!("sent {} to pid {pid}; it {}", signal.name(), ending(end)),
                    None => format!("sent {} to pid {pid}", signal.name()),
                });
                CallToolResult::success(notes.into_iter().map(ContentBlock::text).collect())
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_keeps_its_last_bytes_and_reads_from_a_cursor() {
        let log = ProcessLog::default();
        log.push(b"hello ");
        log.push(b"world");
        let c = log.read(0, 5, Duration::ZERO);
        assert_eq!((c.from, c.data.as_slice(), c.more), (0, &b"hello"[..], 6));
        let c = log.read(5, READ_MAX, Duration::ZERO);
        assert_eq!(
            (c.data.as_slice(), c.more, c.end),
            (&b" world"[..], 0, None)
        );
        // Past the end: nothing, at the end.
        let c = log.read(99, READ_MAX, Duration::ZERO);
        assert_eq!((c.from, c.data.len(), c.skipped), (11, 0, 0));

        // Crossing the bound: only the last LOG_KEEP bytes stay, and a read says what it skipped.
        log.push(&vec![b'x'; LOG_KEEP]);
        let c = log.read(0, READ_MAX, Duration::ZERO);
        assert_eq!((c.from, c.skipped), (11, 11));
        assert_eq!(c.data.len(), READ_MAX);
        assert_eq!(c.more, (LOG_KEEP - READ_MAX) as u64);
        assert_eq!(log.state.lock().kept.len(), LOG_KEEP);
        log.lose(3);
        log.finish(Some(ProcessExit {
            exit_code: Some(0),
            signal: None,
        }));
        let c = log.read(11 + LOG_KEEP as u64, READ_MAX, Duration::from_secs(5));
        assert_eq!((c.data.len(), c.lost), (0, 3));
        assert!(c.end.is_some());
    }

    #[test]
    fn a_read_waits_for_output_at_most_its_wait() {
        let log = Arc::new(ProcessLog::default());
        let started = Instant::now();
        assert!(log.read(0, 10, Duration::from_millis(50)).data.is_empty());
        assert!(started.elapsed() >= Duration::from_millis(50));
        let writer = log.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            writer.push(b"late");
        });
        assert_eq!(log.read(0, 10, Duration::from_secs(30)).data, b"late");
        t.join().unwrap();
    }

    #[test]
    fn text_is_cut_before_an_incomplete_character() {
        let euro = "€".as_bytes(); // 3 bytes
        let data = [b"ab".as_slice(), &euro[..2]].concat();
        assert_eq!(text_of(&data, true), ("ab".to_string(), 2));
        // At the very end of the output it is shown as it is.
        assert_eq!(text_of(&data, false).1, 4);
        assert_eq!(text_of(&[0xff, b'a'], true), ("\u{fffd}a".to_string(), 2));
    }

    struct Script(VecDeque<ProcessEvent>);

    impl OutputSource for Script {
        fn next(&mut self, _: Duration) -> Option<ProcessEvent> {
            self.0.pop_front()
        }
    }

    fn ended_source() -> Box<dyn OutputSource> {
        Box::new(Script(VecDeque::from([
            ProcessEvent::Output {
                stream: corral_kernel::agent::OutputStream::Stdout,
                data: b"out".to_vec(),
            },
            ProcessEvent::End(Some(ProcessExit {
                exit_code: Some(0),
                signal: None,
            })),
        ])))
    }

    fn running_source() -> Box<dyn OutputSource> {
        Box::new(Script(VecDeque::new()))
    }

    #[test]
    fn a_connection_follows_at_most_max_followed_running_programs() {
        let followers = Followers::default();
        let done = followers.follow("s", 1, ended_source()).unwrap();
        assert_eq!(
            done.wait_end(Duration::from_secs(5))
                .unwrap()
                .unwrap()
                .exit_code,
            Some(0)
        );
        for pid in 2..=MAX_FOLLOWED as i32 {
            followers.follow("s", pid, running_source()).unwrap();
        }
        // Full, with one ended: it makes room.
        assert!(followers.has_room());
        followers.follow("s", 100, running_source()).unwrap();
        assert!(followers.log("s", 1).is_none());
        // Full of running programs: refused.
        assert!(!followers.has_room());
        assert!(followers.follow("s", 101, running_source()).is_err());
        followers.forget(Some("s"));
        assert!(followers.has_room() && followers.log("s", 2).is_none());
    }
}
