//! Programs in a session's sandbox beside its interpreter, for the process tools: started
//! (`bash -c` a command line), listed, fed input, signalled, and their output read as
//! [`ProcessEvent`]s from an in-process subscription or the native API's NDJSON stream.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::time::Duration;

use base64::Engine as _;
use corral_kernel::agent::{OutputStream, ProcessEvent, ProcessExit, ProcessSpec, Subscription};
use corral_service::service::ServiceError;
use corral_wire::output::OutputEvent;
use serde::{Deserialize, Serialize};

use super::{encode_path, BackendError, Caller, InProcess, Remote};

/// The longest line of an output stream a [`Remote`] reads: an output chunk (32 KiB) in
/// base64 fits many times over; a longer line ends the stream.
const MAX_LINE: u64 = 1 << 20;
/// How long a [`Remote`] output stream may be silent: the server says it is alive every 20 s.
const STREAM_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// What starts a program: `bash -c command`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessStart {
    pub command: String,
    /// An absolute path inside the sandbox (none: `/workspace`).
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    /// A pipe as stdin (else `/dev/null`).
    pub stdin: bool,
}

impl ProcessStart {
    fn argv(&self) -> Vec<String> {
        vec!["bash".into(), "-c".into(), self.command.clone()]
    }
}

/// A running program of a session, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningProcess {
    pub pid: i32,
    pub cmd: String,
    #[serde(default)]
    pub args: Vec<String>,
    pub cwd: Option<String>,
}

/// The signals the tools send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessSignal {
    Term,
    Kill,
    Int,
    Hup,
}

impl ProcessSignal {
    pub fn name(self) -> &'static str {
        match self {
            ProcessSignal::Term => "SIGTERM",
            ProcessSignal::Kill => "SIGKILL",
            ProcessSignal::Int => "SIGINT",
            ProcessSignal::Hup => "SIGHUP",
        }
    }

    /// Its number on Linux.
    fn number(self) -> i32 {
        match self {
            ProcessSignal::Hup => 1,
            ProcessSignal::Int => 2,
            ProcessSignal::Kill => 9,
            ProcessSignal::Term => 15,
        }
    }
}

/// A program's output and end, read on a blocking thread.
pub trait OutputSource: Send {
    /// The next event, waiting at most about `wait` (a remote stream: at most until its next
    /// keepalive); `None` when there was none. After the end it returns the end again.
    fn next(&mut self, wait: Duration) -> Option<ProcessEvent>;
}

impl OutputSource for Subscription {
    fn next(&mut self, wait: Duration) -> Option<ProcessEvent> {
        Subscription::next(self, wait)
    }
}

/// The program operations of the process tools, on sessions owned by `caller`.
pub trait ProcessBackend {
    /// Starts a program; returns its pid and all of its output.
    fn start_process(
        &self,
        caller: &Caller,
        id: &str,
        req: &ProcessStart,
    ) -> Result<(i32, Box<dyn OutputSource>), BackendError>;
    /// A running program's output from now on.
    fn attach_process(
        &self,
        caller: &Caller,
        id: &str,
        pid: i32,
    ) -> Result<Box<dyn OutputSource>, BackendError>;
    fn list_processes(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<Vec<RunningProcess>, BackendError>;
    fn send_process_input(
        &self,
        caller: &Caller,
        id: &str,
        pid: i32,
        data: &[u8],
    ) -> Result<(), BackendError>;
    fn close_process_stdin(&self, caller: &Caller, id: &str, pid: i32) -> Result<(), BackendError>;
    fn signal_process(
        &self,
        caller: &Caller,
        id: &str,
        pid: i32,
        signal: ProcessSignal,
    ) -> Result<(), BackendError>;
}

fn agent_error(e: corral_kernel::agent::AgentError) -> BackendError {
    ServiceError::from(e).into()
}

impl ProcessBackend for InProcess {
    fn start_process(
        &self,
        caller: &Caller,
        id: &str,
        req: &ProcessStart,
    ) -> Result<(i32, Box<dyn OutputSource>), BackendError> {
        let spec = ProcessSpec {
            argv: req.argv(),
            cwd: req.cwd.clone(),
            env: req.env.clone().into_iter().collect(),
            tag: None,
            pty: None,
            stdin: req.stdin,
        };
        let (_, sub) = self.service.start_process(&self.admit(caller)?, id, spec)?;
        Ok((sub.pid(), Box::new(sub)))
    }

    fn attach_process(
        &self,
        caller: &Caller,
        id: &str,
        pid: i32,
    ) -> Result<Box<dyn OutputSource>, BackendError> {
        let call = self.admit(caller)?;
        let agent = self.service.process_agent(&call, id)?;
        let share = self.service.output_share(&caller.tenant);
        Ok(Box::new(agent.subscribe(pid, &share).map_err(agent_error)?))
    }

    fn list_processes(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<Vec<RunningProcess>, BackendError> {
        let call = self.admit(caller)?;
        let agent = self.service.process_agent(&call, id)?;
        Ok(agent
            .list()
            .into_iter()
            .map(|p| {
                let mut argv = p.spec.argv.into_iter();
                RunningProcess {
                    pid: p.pid,
                    cmd: argv.next().unwrap_or_default(),
                    args: argv.collect(),
                    cwd: p.spec.cwd,
                }
            })
            .collect())
    }

    fn send_process_input(
        &self,
        caller: &Caller,
        id: &str,
        pid: i32,
        data: &[u8],
    ) -> Result<(), BackendError> {
        let call = self.admit(caller)?;
        let agent = self.service.process_agent(&call, id)?;
        agent.send_input(pid, data).map_err(agent_error)
    }

    fn close_process_stdin(&self, caller: &Caller, id: &str, pid: i32) -> Result<(), BackendError> {
        let call = self.admit(caller)?;
        let agent = self.service.process_agent(&call, id)?;
        agent.close_stdin(pid).map_err(agent_error)
    }

    fn signal_process(
        &self,
        caller: &Caller,
        id: &str,
        pid: i32,
        signal: ProcessSignal,
    ) -> Result<(), BackendError> {
        let call = self.admit(caller)?;
        let agent = self.service.process_agent(&call, id)?;
        agent.signal(pid, signal.number()).map_err(agent_error)
    }
}

/// The NDJSON output stream of a program of a running `corral serve`.
struct RemoteStream {
    reader: BufReader<Box<dyn Read + Send + Sync>>,
    ended: Option<Option<ProcessExit>>,
}

impl RemoteStream {
    /// The next line, at most [`MAX_LINE`] long (`None`: the stream ended or broke).
    fn line(&mut self) -> Option<OutputEvent> {
        let mut buf = Vec::new();
        let read = (&mut self.reader)
            .take(MAX_LINE)
            .read_until(b'\n', &mut buf)
            .ok()?;
        if read == 0 || buf.last() != Some(&b'\n') {
            return None;
        }
        serde_json::from_slice(&buf).ok()
    }

    fn end(&mut self, exit: Option<ProcessExit>) -> ProcessEvent {
        self.ended = Some(exit);
        ProcessEvent::End(exit)
    }
}

impl OutputSource for RemoteStream {
    fn next(&mut self, _wait: Duration) -> Option<ProcessEvent> {
        if let Some(exit) = self.ended {
            return Some(ProcessEvent::End(exit));
        }
        let output =
            |stream, data: String| match base64::engine::general_purpose::STANDARD.decode(data) {
                Ok(data) => Some(ProcessEvent::Output { stream, data }),
                Err(_) => None,
            };
        let event = match self.line() {
            None | Some(OutputEvent::Start { .. }) => None,
            Some(OutputEvent::Keepalive) => return None,
            Some(OutputEvent::Lost { bytes }) => Some(ProcessEvent::Lost { bytes }),
            Some(OutputEvent::Stdout { data }) => output(OutputStream::Stdout, data),
            Some(OutputEvent::Stderr { data }) => output(OutputStream::Stderr, data),
            Some(OutputEvent::Pty { data }) => output(OutputStream::Pty, data),
            Some(OutputEvent::End {
                exit_code,
                signal,
                error: None,
            }) => return Some(self.end(Some(ProcessExit { exit_code, signal }))),
            Some(OutputEvent::End { .. }) => None,
        };
        // A broken stream (or a line that is not the API's) ends it: the program is unknown.
        Some(match event {
            Some(event) => event,
            None => self.end(None),
        })
    }
}

impl Remote {
    fn process_path(id: &str, suffix: &str) -> String {
        format!("/v1/sandboxes/{}/processes{suffix}", encode_path(id))
    }

    /// Opens an output stream (`POST …/processes` or `GET …/{pid}/output`): its `start` pid
    /// and the rest of it.
    fn open_stream(
        &self,
        caller: &Caller,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<(i32, RemoteStream), BackendError> {
        // An agent of its own: a stream is read for as long as the program runs.
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(10))
            .timeout_read(STREAM_READ_TIMEOUT)
            .build();
        let mut req = agent
            .request(method, &format!("{}{path}", self.base))
            .set("Accept", "application/x-ndjson");
        if let Some(key) = caller.key.as_ref().or(self.api_key.as_ref()) {
            req = req.set("Authorization", &format!("Bearer {key}"));
        }
        let sent = match body {
            Some(body) => req.send_json(body),
            None => req.call(),
        };
        let response = self.send(sent)?;
        let mut stream = RemoteStream {
            reader: BufReader::new(response.into_reader()),
            ended: None,
        };
        match stream.line() {
            Some(OutputEvent::Start { pid }) => Ok((pid, stream)),
            _ => Err(BackendError::Other(
                "the Corral server's process stream did not start".into(),
            )),
        }
    }
}

impl ProcessBackend for Remote {
    fn start_process(
        &self,
        caller: &Caller,
        id: &str,
        req: &ProcessStart,
    ) -> Result<(i32, Box<dyn OutputSource>), BackendError> {
        let mut argv = req.argv().into_iter();
        let body = serde_json::json!({
            "cmd": argv.next(),
            "args": argv.collect::<Vec<_>>(),
            "cwd": req.cwd,
            "env": req.env,
            "stdin": req.stdin,
        });
        let (pid, stream) =
            self.open_stream(caller, "POST", &Self::process_path(id, ""), Some(body))?;
        Ok((pid, Box::new(stream)))
    }

    fn attach_process(
        &self,
        caller: &Caller,
        id: &str,
        pid: i32,
    ) -> Result<Box<dyn OutputSource>, BackendError> {
        let path = Self::process_path(id, &format!("/{pid}/output"));
        let (_, stream) = self.open_stream(caller, "GET", &path, None)?;
        Ok(Box::new(stream))
    }

    fn list_processes(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<Vec<RunningProcess>, BackendError> {
        #[derive(Deserialize)]
        struct List {
            processes: Vec<RunningProcess>,
        }
        let list: List = self.json(
            self.request(caller, "GET", &Self::process_path(id, ""))
                .call(),
        )?;
        Ok(list.processes)
    }

    fn send_process_input(
        &self,
        caller: &Caller,
        id: &str,
        pid: i32,
        data: &[u8],
    ) -> Result<(), BackendError> {
        let path = Self::process_path(id, &format!("/{pid}/input"));
        let body = serde_json::json!({
            "data_base64": base64::engine::general_purpose::STANDARD.encode(data),
        });
        self.send(self.request(caller, "POST", &path).send_json(body))
            .map(drop)
    }

    fn close_process_stdin(&self, caller: &Caller, id: &str, pid: i32) -> Result<(), BackendError> {
        let path = Self::process_path(id, &format!("/{pid}/close-stdin"));
        self.send(
            self.request(caller, "POST", &path)
                .send_json(serde_json::json!({})),
        )
        .map(drop)
    }

    fn signal_process(
        &self,
        caller: &Caller,
        id: &str,
        pid: i32,
        signal: ProcessSignal,
    ) -> Result<(), BackendError> {
        let path = Self::process_path(id, &format!("/{pid}/signal"));
        let body = serde_json::json!({ "signal": signal.name() });
        self.send(self.request(caller, "POST", &path).send_json(body))
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(bytes: Vec<u8>) -> RemoteStream {
        RemoteStream {
            reader: BufReader::new(Box::new(std::io::Cursor::new(bytes))),
            ended: None,
        }
    }

    fn next(s: &mut RemoteStream) -> Option<ProcessEvent> {
        OutputSource::next(s, Duration::ZERO)
    }

    #[test]
    fn a_remote_stream_is_read_as_events() {
        let mut s = stream(
            concat!(
                "{\"type\":\"keepalive\"}\n",
                "{\"type\":\"stdout\",\"data\":\"aGk=\"}\n",
                "{\"type\":\"lost\",\"bytes\":7}\n",
                "{\"type\":\"end\",\"exit_code\":3,\"signal\":null}\n",
            )
            .into(),
        );
        assert_eq!(next(&mut s), None);
        assert_eq!(
            next(&mut s),
            Some(ProcessEvent::Output {
                stream: OutputStream::Stdout,
                data: b"hi".to_vec()
            })
        );
        assert_eq!(next(&mut s), Some(ProcessEvent::Lost { bytes: 7 }));
        let end = ProcessEvent::End(Some(ProcessExit {
            exit_code: Some(3),
            signal: None,
        }));
        assert_eq!(next(&mut s), Some(end.clone()));
        assert_eq!(next(&mut s), Some(end));
    }

    #[test]
    fn a_broken_or_overlong_remote_stream_ends_without_a_status() {
        let overlong = [
            b"{\"type\":\"stdout\",\"data\":\"".to_vec(),
            vec![b'A'; MAX_LINE as usize],
            b"\"}\n".to_vec(),
        ]
        .concat();
        for bytes in [
            overlong,
            b"{\"type\":\"stdout\",\"data\":\"not base64!\"}\n".to_vec(),
            b"not json\n".to_vec(),
            b"{\"type\":\"stdout\",\"data\":\"aGk=\"}".to_vec(), // cut before its newline
            b"{\"type\":\"end\",\"exit_code\":null,\"signal\":null,\"error\":\"gone\"}\n".to_vec(),
            Vec::new(),
        ] {
            let mut s = stream(bytes);
            assert_eq!(next(&mut s), Some(ProcessEvent::End(None)));
            assert_eq!(next(&mut s), Some(ProcessEvent::End(None)));
        }
    }
}
