//! envd's `process.Process` Connect service (commands and PTYs of the E2B SDKs), served by the
//! sandbox's process agent ([`corral_kernel::agent`]): programs run beside `run_code`,
//! concurrently with it and with each other. Pids are the programs' pids inside the sandbox;
//! every call finds them in the sandbox its token names, and no other.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use corral_kernel::agent::{
    AgentError, AgentRefusal, OutputStream, ProcessAgent, ProcessEvent, ProcessExit, ProcessSpec,
    PtySize, Subscription,
};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{
    connect_end_of_stream, connect_error, connect_failure, connect_message, connect_timeout_s,
    connect_unary_error, read_request_message, sandbox_cwd, signal_name, unimplemented_rpc,
    E2bError, PlaneSandbox, CONNECT_JSON, E2B_HOME, PROCESS_SERVICE,
};
use crate::connect::Code;
use crate::http::{blocking, parse_json, pump, AppState};
use crate::service::ServiceError;

/// How often a stream without output says it is alive (envd's keepalive event).
const KEEPALIVE: Duration = Duration::from_secs(20);

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The Connect code of a failed process call.
pub(super) fn connect_code(e: &AgentError) -> Code {
    match e {
        AgentError::Refused(refusal) => match refusal {
            AgentRefusal::TooManyProcesses | AgentRefusal::InputFull(_) => Code::ResourceExhausted,
            AgentRefusal::NoSuchProcess(_) => Code::NotFound,
            AgentRefusal::NoStdin(_) | AgentRefusal::NoTerminal(_) => Code::FailedPrecondition,
            AgentRefusal::Start(_) | AgentRefusal::Invalid(_) => Code::InvalidArgument,
        },
        AgentError::Invalid(_) => Code::InvalidArgument,
        AgentError::TooManySubscribers(_) | AgentError::Busy => Code::ResourceExhausted,
        AgentError::Unavailable => Code::Unimplemented,
        AgentError::Gone | AgentError::NoAnswer(_) | AgentError::Io(_) => Code::Internal,
    }
}

/// envd's message for a process that is not there.
fn not_found(selector: &Selector) -> Value {
    let what = match selector {
        Selector::Pid(pid) => format!("process with pid {pid}"),
        Selector::Tag(tag) => format!("process with tag {tag}"),
    };
    connect_error(Code::NotFound, format!("{what} not found"))
}

fn error_of(e: &ServiceError) -> Value {
    match e {
        ServiceError::Process(e) => connect_error(connect_code(e), e.to_string()),
        other => super::connect_error_of(other),
    }
}

fn unary_failure(error: Value) -> Response {
    let code = match error["code"].as_str() {
        Some("not_found") => Code::NotFound,
        Some("invalid_argument") => Code::InvalidArgument,
        Some("resource_exhausted") => Code::ResourceExhausted,
        Some("failed_precondition") => Code::FailedPrecondition,
        Some("unimplemented") => Code::Unimplemented,
        Some("unavailable") => Code::Unavailable,
        Some("permission_denied") => Code::PermissionDenied,
        _ => Code::Internal,
    };
    connect_unary_error(code, error["message"].as_str().unwrap_or_default())
}

/// `ProcessSelector`: a pid or a tag.
#[derive(Debug, Deserialize)]
struct SelectorJson {
    pid: Option<u32>,
    tag: Option<String>,
}

enum Selector {
    Pid(u32),
    Tag(String),
}

impl SelectorJson {
    fn selector(self) -> Result<Selector, Value> {
        match (self.pid, self.tag) {
            (Some(pid), _) => Ok(Selector::Pid(pid)),
            (None, Some(tag)) => Ok(Selector::Tag(tag)),
            (None, None) => Err(connect_error(
                Code::InvalidArgument,
                "the process selector is empty",
            )),
        }
    }
}

/// The pid a selector names in `agent`'s sandbox.
fn resolve(agent: &ProcessAgent, selector: &Selector) -> Result<i32, Value> {
    let pid = match selector {
        Selector::Pid(pid) => i32::try_from(*pid).ok(),
        Selector::Tag(tag) => agent.find_tag(tag),
    };
    pid.filter(|pid| agent.list().iter().any(|p| p.pid == *pid))
        .ok_or_else(|| not_found(selector))
}

#[derive(Debug, Deserialize)]
struct PtyJson {
    size: Option<SizeJson>,
}

#[derive(Debug, Deserialize)]
struct SizeJson {
    #[serde(default)]
    cols: u16,
    #[serde(default)]
    rows: u16,
}

impl PtyJson {
    fn size(&self) -> PtySize {
        match &self.size {
            Some(s) => PtySize {
                rows: s.rows,
                cols: s.cols,
            },
            None => PtySize { rows: 24, cols: 80 },
        }
    }
}

#[derive(Debug, Deserialize)]
struct StartRequest {
    process: ProcessConfig,
    pty: Option<PtyJson>,
    tag: Option<String>,
    stdin: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct ProcessConfig {
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

/// The end of a program as envd reports it (Go's `ProcessState`).
fn end_event(exit: Option<ProcessExit>) -> Result<Value, Value> {
    let Some(exit) = exit else {
        return Err(connect_error(
            Code::Internal,
            "the sandbox's process agent went away (the sandbox was closed or restarted)",
        ));
    };
    let (exit_code, exited, status) = match (exit.exit_code, exit.signal) {
        (Some(code), _) => (code, true, format!("exit status {code}")),
        (None, Some(signal)) => (-1, false, format!("signal: {}", signal_name(signal))),
        (None, None) => (-1, false, "unknown".to_string()),
    };
    let mut end = json!({"exitCode": exit_code, "exited": exited, "status": status});
    if exit_code != 0 {
        end["error"] = json!(status);
    }
    Ok(json!({"event": {"end": end}}))
}

/// Streams a subscription as `start`, `data`…, `end` events, until the program ends, the
/// client goes away, or `deadline` passes (the stream ends with `deadline_exceeded`; the
/// program goes on, as envd's does when its connection times out). The stream holds no
/// thread ([`pump`]).
fn stream_process(sub: Subscription, deadline: Option<Duration>) -> Response {
    pump::stream(CONNECT_JSON, sub, move |pump| async move {
        pump.send(connect_message(
            &json!({"event": {"start": {"pid": pump.pid()}}}),
        ))
        .await?;
        let deadline = deadline.map(|d| Instant::now() + d);
        let error = loop {
            let wait = match deadline {
                Some(at) => {
                    let left = at.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break Some(connect_error(
                            Code::DeadlineExceeded,
                            "the stream's timeout passed; the process goes on (connect to it \
                             again, or kill it)",
                        ));
                    }
                    left.min(KEEPALIVE)
                }
                None => KEEPALIVE,
            };
            match pump.next(wait).await? {
                None => {
                    if deadline.is_none_or(|at| Instant::now() < at) {
                        pump.send(connect_message(&json!({"event": {"keepalive": {}}})))
                            .await?;
                    }
                }
                // What the client did not read in time is gone; the rest follows.
                Some(ProcessEvent::Lost { .. }) => {}
                Some(ProcessEvent::Output { stream, data }) => {
                    let key = match stream {
                        OutputStream::Stdout => "stdout",
                        OutputStream::Stderr => "stderr",
                        OutputStream::Pty => "pty",
                    };
                    pump.send(connect_message(
                        &json!({"event": {"data": {key: b64(&data)}}}),
                    ))
                    .await?;
                }
                Some(ProcessEvent::End(exit)) => match end_event(exit) {
                    Ok(end) => {
                        pump.send(connect_message(&end)).await?;
                        break None;
                    }
                    Err(error) => break Some(error),
                },
            }
        };
        pump.send(connect_end_of_stream(error)).await
    })
}

/// `commands.run` and `pty.create`: the Connect server-streaming RPC, JSON codec.
pub(super) async fn start(
    State(state): State<AppState>,
    sandbox: Result<PlaneSandbox, E2bError>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, E2bError> {
    let payload = read_request_message(body, state.service.config().max_json_bytes).await;
    // Refused only now that the body is read (as `execute` is), before anything of it counts.
    let PlaneSandbox { id, tenant } = sandbox?;
    let payload = match payload {
        Ok(payload) => payload,
        Err(error) => return Ok(connect_failure(error)),
    };
    let start: StartRequest = match parse_json(&payload) {
        Ok(start) => start,
        Err(e) => {
            return Ok(connect_failure(connect_error(
                Code::InvalidArgument,
                format!("StartRequest: {e}"),
            )))
        }
    };
    let config = start.process;
    let spec = ProcessSpec {
        argv: std::iter::once(config.cmd).chain(config.args).collect(),
        cwd: Some(sandbox_cwd(config.cwd.as_deref().unwrap_or(E2B_HOME))),
        env: config.envs.into_iter().collect(),
        tag: start.tag,
        pty: start.pty.as_ref().map(PtyJson::size),
        stdin: start.stdin.unwrap_or(false),
    };
    let service = state.service.clone();
    let call = match service.admit(&tenant) {
        Ok(call) => call,
        Err(e) => return Ok(connect_failure(error_of(&e))),
    };
    let started =
        crate::threads::run(call, move |call| service.start_process(&call, &id, spec)).await;
    let (_, sub) = match started {
        Ok(Ok(started)) => started,
        Ok(Err(e)) => return Ok(connect_failure(error_of(&e))),
        Err(e) => {
            return Ok(connect_failure(connect_error(
                Code::Internal,
                format!("internal error: {e}"),
            )))
        }
    };
    let deadline = connect_timeout_s(&headers).map(Duration::from_secs_f64);
    Ok(stream_process(sub, deadline))
}

#[derive(Debug, Deserialize)]
struct ConnectRequest {
    process: SelectorJson,
}

/// `commands.connect` and `pty.connect`: the running program's output from now on.
pub(super) async fn connect(
    State(state): State<AppState>,
    sandbox: Result<PlaneSandbox, E2bError>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, E2bError> {
    let payload = read_request_message(body, state.service.config().max_json_bytes).await;
    let PlaneSandbox { id, tenant } = sandbox?;
    let request: Result<ConnectRequest, Value> = payload.and_then(|p| {
        parse_json(&p)
            .map_err(|e| connect_error(Code::InvalidArgument, format!("ConnectRequest: {e}")))
    });
    let selector = match request.and_then(|r| r.process.selector()) {
        Ok(selector) => selector,
        Err(error) => return Ok(connect_failure(error)),
    };
    let service = state.service.clone();
    let subscribed = blocking(service.admit(&tenant)?, move |call| {
        let agent = service.process_agent(call, &id)?;
        Ok(match resolve(&agent, &selector) {
            Ok(pid) => agent
                .subscribe(pid, &service.output_share(&tenant))
                .map_err(|e| error_of(&e.into())),
            Err(error) => Err(error),
        })
    })
    .await;
    match subscribed {
        Ok(Ok(sub)) => Ok(stream_process(
            sub,
            connect_timeout_s(&headers).map(Duration::from_secs_f64),
        )),
        Ok(Err(error)) => Ok(connect_failure(error)),
        Err(e) => Ok(connect_failure(connect_error(Code::Internal, e.message))),
    }
}

/// Runs a unary call against the sandbox's agent: its answer as JSON, or the Connect error.
async fn unary<T: for<'de> Deserialize<'de> + Send + 'static>(
    state: AppState,
    sandbox: PlaneSandbox,
    body: &[u8],
    name: &'static str,
    call: impl FnOnce(&ProcessAgent, T) -> Result<Value, Value> + Send + 'static,
) -> Response {
    let request: T = match parse_json(body) {
        Ok(request) => request,
        Err(e) => {
            return connect_unary_error(Code::InvalidArgument, format!("{name}: {e}"));
        }
    };
    let PlaneSandbox { id, tenant } = sandbox;
    let service = state.service.clone();
    let admitted = match service.admit(&tenant) {
        Ok(admitted) => admitted,
        Err(e) => return unary_failure(error_of(&e)),
    };
    let outcome = crate::threads::run(admitted, move |admitted| {
        let agent = service
            .process_agent(&admitted, &id)
            .map_err(|e| error_of(&e))?;
        call(&agent, request)
    })
    .await;
    match outcome {
        Ok(Ok(answer)) => Json(answer).into_response(),
        Ok(Err(error)) => unary_failure(error),
        Err(e) => connect_unary_error(Code::Internal, format!("internal error: {e}")),
    }
}

fn agent_error(e: AgentError) -> Value {
    error_of(&ServiceError::Process(e))
}

/// `commands.list`: the running programs, as envd lists them.
pub(super) async fn list(
    State(state): State<AppState>,
    sandbox: Result<PlaneSandbox, E2bError>,
    body: Bytes,
) -> Result<Response, E2bError> {
    let sandbox = sandbox?;
    Ok(
        unary(state, sandbox, &body, "ListRequest", |agent, _: Value| {
            let processes: Vec<Value> = agent
                .list()
                .into_iter()
                .map(|p| {
                    let (cmd, args) = p.spec.argv.split_first().expect("a started argv");
                    let envs: BTreeMap<String, String> = p.spec.env.into_iter().collect();
                    let mut info = json!({
                        "pid": p.pid,
                        "config": {"cmd": cmd, "args": args, "envs": envs, "cwd": p.spec.cwd},
                    });
                    if let Some(tag) = p.spec.tag {
                        info["tag"] = json!(tag);
                    }
                    info
                })
                .collect();
            Ok(json!({"processes": processes}))
        })
        .await,
    )
}

#[derive(Debug, Deserialize)]
struct SendInputRequest {
    process: SelectorJson,
    input: InputJson,
}

#[derive(Debug, Deserialize)]
struct InputJson {
    stdin: Option<String>,
    pty: Option<String>,
}

/// `commands.send_stdin` and `pty.send_stdin`: bounded by the agent (input a program does not
/// read is refused with `resource_exhausted` once 64 KiB of it wait).
pub(super) async fn send_input(
    State(state): State<AppState>,
    sandbox: Result<PlaneSandbox, E2bError>,
    body: Bytes,
) -> Result<Response, E2bError> {
    let sandbox = sandbox?;
    Ok(unary(
        state,
        sandbox,
        &body,
        "SendInputRequest",
        |agent, r: SendInputRequest| {
            let selector = r.process.selector()?;
            let pid = resolve(agent, &selector)?;
            let data = r.input.stdin.or(r.input.pty).unwrap_or_default();
            let data = base64::engine::general_purpose::STANDARD
                .decode(data)
                .map_err(|e| connect_error(Code::InvalidArgument, format!("input: {e}")))?;
            agent.send_input(pid, &data).map_err(agent_error)?;
            Ok(json!({}))
        },
    )
    .await)
}

#[derive(Debug, Deserialize)]
struct SelectorRequest {
    process: SelectorJson,
}

/// `close_stdin`: EOF on a program's stdin.
pub(super) async fn close_stdin(
    State(state): State<AppState>,
    sandbox: Result<PlaneSandbox, E2bError>,
    body: Bytes,
) -> Result<Response, E2bError> {
    let sandbox = sandbox?;
    Ok(unary(
        state,
        sandbox,
        &body,
        "CloseStdinRequest",
        |agent, r: SelectorRequest| {
            let pid = resolve(agent, &r.process.selector()?)?;
            agent.close_stdin(pid).map_err(agent_error)?;
            Ok(json!({}))
        },
    )
    .await)
}

#[derive(Debug, Deserialize)]
struct SendSignalRequest {
    process: SelectorJson,
    #[serde(default)]
    signal: Value,
}

/// The signal of a `SendSignalRequest`: envd's enum by name or number.
fn signal_of(value: &Value) -> Option<i32> {
    match value {
        Value::String(name) => match name.as_str() {
            "SIGNAL_SIGKILL" => Some(libc::SIGKILL),
            "SIGNAL_SIGTERM" => Some(libc::SIGTERM),
            _ => None,
        },
        Value::Number(n) => match n.as_i64() {
            Some(n) if n == libc::SIGKILL as i64 || n == libc::SIGTERM as i64 => Some(n as i32),
            _ => None,
        },
        _ => None,
    }
}

/// `commands.kill` and a handle's `kill()`: the signal to the program's process group; a
/// program that has ended is `not_found` (the SDK returns `False`).
pub(super) async fn send_signal(
    State(state): State<AppState>,
    sandbox: Result<PlaneSandbox, E2bError>,
    body: Bytes,
) -> Result<Response, E2bError> {
    let sandbox = sandbox?;
    Ok(unary(
        state,
        sandbox,
        &body,
        "SendSignalRequest",
        |agent, r: SendSignalRequest| {
            let selector = r.process.selector()?;
            let pid = resolve(agent, &selector)?;
            let Some(signal) = signal_of(&r.signal) else {
                return Err(connect_error(
                    Code::InvalidArgument,
                    format!("an unknown signal: {}", r.signal),
                ));
            };
            match agent.signal(pid, signal) {
                Ok(()) => Ok(json!({})),
                Err(AgentError::Refused(AgentRefusal::NoSuchProcess(_))) => {
                    Err(not_found(&selector))
                }
                Err(e) => Err(agent_error(e)),
            }
        },
    )
    .await)
}

#[derive(Debug, Deserialize)]
struct UpdateRequest {
    process: SelectorJson,
    pty: Option<PtyJson>,
}

/// `pty.resize`.
pub(super) async fn update(
    State(state): State<AppState>,
    sandbox: Result<PlaneSandbox, E2bError>,
    body: Bytes,
) -> Result<Response, E2bError> {
    let sandbox = sandbox?;
    Ok(unary(
        state,
        sandbox,
        &body,
        "UpdateRequest",
        |agent, r: UpdateRequest| {
            let pid = resolve(agent, &r.process.selector()?)?;
            if let Some(pty) = r.pty {
                agent.resize(pid, pty.size()).map_err(agent_error)?;
            }
            Ok(json!({}))
        },
    )
    .await)
}

/// One message of `StreamInput`: `start` (the process), `data` (input), or `keepalive`.
#[derive(Debug, Deserialize)]
struct StreamInputMessage {
    start: Option<SelectorRequest>,
    data: Option<StreamInputData>,
}

#[derive(Debug, Deserialize)]
struct StreamInputData {
    input: InputJson,
}

/// `commands.stream_input` and `pty.stream_input` (Connect client streaming): a `start`
/// message naming the process, then its input in order, each piece passed on as it arrives
/// (the agent's bound applies: input the process does not read ends the call with
/// `resource_exhausted`). The host holds one message at a time; the body is read to its end
/// whatever happens, so the connection stays usable.
pub(super) async fn stream_input(
    State(state): State<AppState>,
    sandbox: Result<PlaneSandbox, E2bError>,
    body: Body,
) -> Result<Response, E2bError> {
    let mut decoder = crate::connect::Decoder::new(state.service.config().max_json_bytes);
    let mut chunks = body.into_data_stream();
    let mut error: Option<Value> = None;
    let mut target: Option<(Arc<ProcessAgent>, i32)> = None;
    let plane = sandbox
        .as_ref()
        .ok()
        .map(|s| (s.id.clone(), s.tenant.clone()));
    let invalid = |m: String| connect_error(Code::InvalidArgument, m);
    while let Some(chunk) = futures_util::StreamExt::next(&mut chunks).await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => {
                error.get_or_insert(invalid(format!("reading the request body: {e}")));
                break;
            }
        };
        if error.is_some() {
            continue; // read to the end, nothing more done
        }
        let mut messages = Vec::new();
        if let Err(e) = decoder.push(&chunk, &mut messages) {
            error = Some(invalid(e.to_string()));
            continue;
        }
        for message in messages {
            let parsed: Result<StreamInputMessage, Value> = parse_json(&message.payload)
                .map_err(|e| invalid(format!("StreamInputRequest: {e}")));
            let step = match (parsed, &target, &plane) {
                (Err(e), _, _) => Err(e),
                (_, _, None) => break,
                (
                    Ok(StreamInputMessage {
                        start: Some(start), ..
                    }),
                    None,
                    Some((id, tenant)),
                ) => {
                    let (service, id, tenant) = (state.service.clone(), id.clone(), tenant.clone());
                    let found = match service.admit(&tenant) {
                        Err(e) => Err(error_of(&e)),
                        Ok(call) => crate::threads::run(call, move |call| {
                            let agent = service
                                .process_agent(&call, &id)
                                .map_err(|e| error_of(&e))?;
                            let pid = resolve(&agent, &start.process.selector()?)?;
                            Ok::<_, Value>((agent, pid))
                        })
                        .await
                        .unwrap_or_else(|e| Err(connect_error(Code::Internal, e.to_string()))),
                    };
                    found.map(|t| target = Some(t))
                }
                (
                    Ok(StreamInputMessage {
                        data: Some(data), ..
                    }),
                    Some((agent, pid)),
                    Some((_, tenant)),
                ) => {
                    let (agent, pid) = (agent.clone(), *pid);
                    let bytes = data.input.stdin.or(data.input.pty).unwrap_or_default();
                    match state.service.admit(tenant) {
                        Err(e) => Err(error_of(&e)),
                        Ok(call) => crate::threads::run(call, move |_call| {
                            let bytes = base64::engine::general_purpose::STANDARD
                                .decode(bytes)
                                .map_err(|e| {
                                    connect_error(Code::InvalidArgument, format!("input: {e}"))
                                })?;
                            agent.send_input(pid, &bytes).map_err(agent_error)
                        })
                        .await
                        .unwrap_or_else(|e| Err(connect_error(Code::Internal, e.to_string()))),
                    }
                }
                (Ok(StreamInputMessage { data: Some(_), .. }), None, _) => {
                    Err(invalid("StreamInput: data before the start message".into()))
                }
                // keepalive, or a second start
                (Ok(_), _, _) => Ok(()),
            };
            if let Err(e) = step {
                error = Some(e);
                break;
            }
        }
    }
    let _ = sandbox?; // an unknown sandbox: answered as every plane call, body read
    if error.is_none() {
        if let Err(e) = decoder.finish() {
            error = Some(invalid(e.to_string()));
        }
    }
    let mut body = Vec::new();
    if error.is_none() {
        body.extend_from_slice(&connect_message(&json!({})));
    }
    body.extend_from_slice(&connect_end_of_stream(error));
    Ok(([(axum::http::header::CONTENT_TYPE, CONNECT_JSON)], body).into_response())
}

/// Any other RPC of envd's `process.Process` service: not served (Connect `unimplemented`).
/// The body is read first: a connection whose request was not read to its end is closed,
/// and the SDK would find its next request cut off.
pub(super) async fn other(Path(method): Path<String>, _body: Bytes) -> Response {
    unimplemented_rpc(PROCESS_SERVICE, method)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_requests_parse_as_the_sdk_sends_them() {
        let pty: StartRequest = serde_json::from_value(json!({
            "process": {"cmd": "/bin/bash", "args": ["-i", "-l"], "envs": {"TERM": "xterm"}},
            "pty": {"size": {"cols": 100, "rows": 40}},
            "tag": "t",
        }))
        .unwrap();
        assert_eq!(
            pty.pty.as_ref().map(PtyJson::size),
            Some(PtySize {
                rows: 40,
                cols: 100
            })
        );
        assert_eq!(pty.process.envs["TERM"], "xterm");
        assert_eq!(pty.stdin, None);
        let plain: StartRequest =
            serde_json::from_value(json!({"process": {"cmd": "ls"}, "stdin": true})).unwrap();
        assert!(plain.pty.is_none() && plain.process.args.is_empty());
        assert_eq!(plain.stdin, Some(true));
    }

    #[test]
    fn signals_are_envds_two() {
        assert_eq!(signal_of(&json!("SIGNAL_SIGKILL")), Some(9));
        assert_eq!(signal_of(&json!("SIGNAL_SIGTERM")), Some(15));
        assert_eq!(signal_of(&json!(15)), Some(15));
        assert_eq!(signal_of(&json!("SIGNAL_UNSPECIFIED")), None);
        assert_eq!(signal_of(&json!(2)), None);
    }

    #[test]
    fn ends_are_envds() {
        let end = |exit_code, signal| end_event(Some(ProcessExit { exit_code, signal })).unwrap();
        assert_eq!(
            end(Some(0), None),
            json!({"event": {"end": {"exitCode": 0, "exited": true, "status": "exit status 0"}}})
        );
        assert_eq!(end(Some(3), None)["event"]["end"]["error"], "exit status 3");
        assert_eq!(
            end(None, Some(9))["event"]["end"],
            json!({"exitCode": -1, "exited": false, "status": "signal: killed", "error": "signal: killed"})
        );
        assert_eq!(end_event(None).unwrap_err()["code"], "internal");
    }
}
