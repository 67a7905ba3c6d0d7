//! The native processes API (docs/api.md#processes): programs in a sandbox beside its
//! interpreter, run by the sandbox's process agent, with pipes or a terminal.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use base64::Engine as _;
use corral_kernel::agent::{
    OutputStream, ProcessAgent, ProcessEvent, ProcessSpec, PtySize, Subscription,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{blocking, pump, ApiJson, AppState};
use crate::error::{ApiError, ErrorBody};
use crate::service::{ServiceError, Tenant};
pub use corral_wire::output::OutputEvent;

/// How often an output stream without output sends a `keepalive` line.
const KEEPALIVE: Duration = Duration::from_secs(20);

/// `POST /v1/sandboxes/{id}/processes`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartProcessRequest {
    /// The program (looked up in `PATH` unless it holds a `/`).
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    /// An absolute path inside the sandbox (default `/workspace`).
    cwd: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    tag: Option<String>,
    /// A pipe as stdin (else `/dev/null`).
    #[serde(default)]
    stdin: bool,
    /// A pseudo-terminal of this size as its standard streams.
    pty: Option<TerminalSize>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TerminalSize {
    rows: u16,
    cols: u16,
}

impl From<TerminalSize> for PtySize {
    fn from(s: TerminalSize) -> PtySize {
        PtySize {
            rows: s.rows,
            cols: s.cols,
        }
    }
}

fn line(event: &OutputEvent) -> Bytes {
    let mut bytes = serde_json::to_vec(event).expect("events serialize");
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// Streams a subscription as NDJSON: `start`, then `stdout`/`stderr`/`pty` lines (`data` in
/// base64), `lost` when the client read too slowly, `keepalive`, and `end` last. A client
/// that goes away leaves the program running. The stream holds no thread ([`pump`]).
fn output_stream(sub: Subscription) -> Response {
    pump::stream("application/x-ndjson", sub, |pump| async move {
        pump.send(line(&OutputEvent::Start { pid: pump.pid() }))
            .await?;
        loop {
            let event = match pump.next(KEEPALIVE).await? {
                None => OutputEvent::Keepalive,
                Some(ProcessEvent::Lost { bytes }) => OutputEvent::Lost { bytes },
                Some(ProcessEvent::Output { stream, data }) => {
                    let data = base64::engine::general_purpose::STANDARD.encode(data);
                    match stream {
                        OutputStream::Stdout => OutputEvent::Stdout { data },
                        OutputStream::Stderr => OutputEvent::Stderr { data },
                        OutputStream::Pty => OutputEvent::Pty { data },
                    }
                }
                Some(ProcessEvent::End(exit)) => {
                    let end = match exit {
                        Some(exit) => OutputEvent::End {
                            exit_code: exit.exit_code,
                            signal: exit.signal,
                            error: None,
                        },
                        None => OutputEvent::End {
                            exit_code: None,
                            signal: None,
                            error: Some("the sandbox's process agent went away".into()),
                        },
                    };
                    return pump.send(line(&end)).await;
                }
            };
            pump.send(line(&event)).await?;
        }
    })
}

/// Start a program in the sandbox, beside its interpreter (no shell: `cmd` is the program):
/// an NDJSON stream of its output that leaves it running when the client goes away.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes", operation_id = "start_process", tag = "processes",
    request_body = StartProcessRequest,
    responses(
        (status = 200, description = "NDJSON output events (application/x-ndjson): `start`, \
            output, `end` last", body = OutputEvent, content_type = "application/x-ndjson"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "`sandbox_paused`", body = ErrorBody),
        (status = 422, description = "`process_not_started` (no such program…)", body = ErrorBody),
        (status = 429, description = "`too_many_processes` (32 run)", body = ErrorBody),
        (status = 501, description = "`processes_unsupported`", body = ErrorBody)))]
pub async fn start(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<StartProcessRequest>,
) -> Result<Response, ApiError> {
    if req.cmd.is_empty() {
        return Err(ApiError::bad_request("cmd must not be empty"));
    }
    if let Some(cwd) = &req.cwd {
        if !cwd.starts_with('/') {
            return Err(ApiError::bad_request(
                "cwd must be an absolute path inside the sandbox",
            ));
        }
    }
    let spec = ProcessSpec {
        argv: std::iter::once(req.cmd).chain(req.args).collect(),
        cwd: req.cwd,
        env: req.env.into_iter().collect(),
        tag: req.tag,
        pty: req.pty.map(PtySize::from),
        stdin: req.stdin,
    };
    let service = state.service.clone();
    let (_, sub) = blocking(service.admit(&tenant)?, move |call| {
        service.start_process(call, &id, spec)
    })
    .await?;
    Ok(output_stream(sub))
}

/// A running program, as listed.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ProcessJson {
    pid: i32,
    tag: Option<String>,
    cmd: String,
    args: Vec<String>,
    cwd: Option<String>,
    env: BTreeMap<String, String>,
    pty: bool,
}

/// `GET /v1/sandboxes/{id}/processes`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ProcessList {
    processes: Vec<ProcessJson>,
}

/// The sandbox's running programs.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes", operation_id = "list_processes", tag = "processes",
    responses((status = 200, body = ProcessList), (status = 404, body = ErrorBody),
        (status = 409, description = "`sandbox_paused`", body = ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> Result<Json<ProcessList>, ApiError> {
    let service = state.service.clone();
    let agent = blocking(service.admit(&tenant)?, move |call| {
        service.process_agent(call, &id)
    })
    .await?;
    let processes: Vec<ProcessJson> = agent
        .list()
        .into_iter()
        .map(|p| {
            let mut argv = p.spec.argv.into_iter();
            ProcessJson {
                pid: p.pid,
                tag: p.spec.tag,
                cmd: argv.next().unwrap_or_default(),
                args: argv.collect(),
                cwd: p.spec.cwd,
                env: p.spec.env.into_iter().collect(),
                pty: p.spec.pty.is_some(),
            }
        })
        .collect();
    Ok(Json(ProcessList { processes }))
}

/// Runs `call` with the agent of `tenant`'s sandbox `id` on a blocking thread.
async fn with_agent<T: Send + 'static>(
    state: &AppState,
    tenant: Tenant,
    id: String,
    call: impl FnOnce(&ProcessAgent) -> Result<T, ServiceError> + Send + 'static,
) -> Result<T, ApiError> {
    let service = state.service.clone();
    blocking(service.admit(&tenant)?, move |admitted| {
        let agent = service.process_agent(admitted, &id)?;
        call(&agent)
    })
    .await
}

/// A running program's output from now on (at most 4 streams per program at once).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}/output", operation_id = "process_output", tag = "processes",
    responses(
        (status = 200, description = "NDJSON output events, as from starting it",
            body = OutputEvent, content_type = "application/x-ndjson"),
        (status = 404, description = "`not_found` or `process_not_found`", body = ErrorBody),
        (status = 429, description = "`too_many_streams`", body = ErrorBody)))]
pub async fn output(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((id, pid)): Path<(String, i32)>,
) -> Result<Response, ApiError> {
    let share = state.service.output_share(&tenant);
    let sub = with_agent(&state, tenant, id, move |agent| {
        Ok(agent.subscribe(pid, &share)?)
    })
    .await?;
    Ok(output_stream(sub))
}

/// `POST …/processes/{pid}/input`: `data` (text) or `data_base64` (bytes).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InputRequest {
    data: Option<String>,
    data_base64: Option<String>,
}

/// Input for a program started with `stdin` or `pty`: exactly one of `data` and
/// `data_base64`. At most 64 KiB wait for a program that does not read (then 429).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/input", operation_id = "process_input", tag = "processes",
    request_body = InputRequest,
    responses((status = 204), (status = 400, body = ErrorBody),
        (status = 404, description = "`not_found` or `process_not_found`", body = ErrorBody),
        (status = 409, description = "`process_has_no_input`", body = ErrorBody),
        (status = 429, description = "`process_input_full`", body = ErrorBody)))]
pub async fn input(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((id, pid)): Path<(String, i32)>,
    ApiJson(req): ApiJson<InputRequest>,
) -> Result<StatusCode, ApiError> {
    let data = match (req.data, req.data_base64) {
        (Some(text), None) => text.into_bytes(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| ApiError::bad_request(format!("data_base64: {e}")))?,
        _ => {
            return Err(ApiError::bad_request(
                "send exactly one of data and data_base64",
            ))
        }
    };
    with_agent(&state, tenant, id, move |agent| {
        Ok(agent.send_input(pid, &data)?)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Close a program's stdin (it reads end of file).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/close-stdin", operation_id = "close_process_stdin", tag = "processes",
    responses((status = 204),
        (status = 404, description = "`not_found` or `process_not_found`", body = ErrorBody),
        (status = 409, description = "`process_has_no_input`", body = ErrorBody)))]
pub async fn close_stdin(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((id, pid)): Path<(String, i32)>,
    _body: Bytes,
) -> Result<StatusCode, ApiError> {
    with_agent(&state, tenant, id, move |agent| Ok(agent.close_stdin(pid)?)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST …/processes/{pid}/signal`: a signal by name (`SIGTERM`, `TERM`) or number.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// A name (`SIGTERM`, `term`) or a number.
    #[schema(schema_with = signal_schema)]
    signal: Value,
}

/// A signal's schema: a name or a number.
fn signal_schema() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
    Schema::OneOf(
        OneOfBuilder::new()
            .item(ObjectBuilder::new().schema_type(Type::String))
            .item(ObjectBuilder::new().schema_type(Type::Integer))
            .build(),
    )
}

fn signal_number(value: &Value) -> Option<i32> {
    use nix::sys::signal::Signal;
    let signal = match value {
        Value::Number(n) => Signal::try_from(i32::try_from(n.as_i64()?).ok()?).ok()?,
        Value::String(name) => {
            let name = name.to_ascii_uppercase();
            let full = if name.starts_with("SIG") {
                name
            } else {
                format!("SIG{name}")
            };
            full.parse::<Signal>().ok()?
        }
        _ => return None,
    };
    Some(signal as i32)
}

/// Send a signal to a program's process group.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/signal", operation_id = "signal_process", tag = "processes",
    request_body = SignalRequest,
    responses((status = 204), (status = 400, description = "not a signal", body = ErrorBody),
        (status = 404, description = "`not_found` or `process_not_found`", body = ErrorBody)))]
pub async fn signal(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((id, pid)): Path<(String, i32)>,
    ApiJson(req): ApiJson<SignalRequest>,
) -> Result<StatusCode, ApiError> {
    let signal = signal_number(&req.signal).ok_or_else(|| {
        ApiError::bad_request(format!(
            "signal: {} is not a signal (a name such as SIGTERM, or a number)",
            req.signal
        ))
    })?;
    with_agent(&state, tenant, id, move |agent| {
        Ok(agent.signal(pid, signal)?)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Resize a program's terminal.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/resize", operation_id = "resize_process", tag = "processes",
    request_body = TerminalSize,
    responses((status = 204),
        (status = 404, description = "`not_found` or `process_not_found`", body = ErrorBody),
        (status = 409, description = "`process_has_no_input` (no terminal)", body = ErrorBody)))]
pub async fn resize(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((id, pid)): Path<(String, i32)>,
    ApiJson(size): ApiJson<TerminalSize>,
) -> Result<StatusCode, ApiError> {
    with_agent(&state, tenant, id, move |agent| {
        Ok(agent.resize(pid, size.into())?)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn signals_are_named_or_numbered() {
        assert_eq!(signal_number(&json!("SIGTERM")), Some(15));
        assert_eq!(signal_number(&json!("kill")), Some(9));
        assert_eq!(signal_number(&json!(2)), Some(2));
        assert_eq!(signal_number(&json!("SIGNOPE")), None);
        assert_eq!(signal_number(&json!(0)), None);
        assert_eq!(signal_number(&json!(99)), None);
        assert_eq!(signal_number(&json!(null)), None);
    }
}
