//! The code interpreter's `/contexts` (E2B's `create_code_context`, `list_code_contexts`,
//! `restart_code_context`, `remove_code_context`): code contexts of the sandbox
//! ([`corral_kernel::context`]), each a separate interpreter on the sandbox's files.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use corral_kernel::ContextInfo;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{sandbox_cwd, E2bError, PlaneSandbox, E2B_HOME, WORKSPACE};
use crate::http::{blocking, parse_json, AppState};

/// A context as the SDK reads it: `id`, `language`, `cwd` (E2B's paths: the workspace is
/// `/home/user`).
fn context_json(info: &ContextInfo) -> Value {
    let cwd = match info.cwd.as_deref() {
        None => E2B_HOME.to_string(),
        Some(cwd) => match cwd.strip_prefix(WORKSPACE) {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("{E2B_HOME}{rest}"),
            _ => cwd.to_string(),
        },
    };
    json!({"id": info.id, "language": info.language.name(), "cwd": cwd})
}

#[derive(Debug, Default, Deserialize)]
struct CreateContext {
    language: Option<String>,
    cwd: Option<String>,
}

/// `POST /contexts {language?, cwd?}`: a new context (Python without a language).
pub(super) async fn create(
    State(state): State<AppState>,
    sandbox: Result<PlaneSandbox, E2bError>,
    body: Bytes,
) -> Result<Json<Value>, E2bError> {
    let sandbox = sandbox?; // once the body is read (see `execute`)
    let req: CreateContext = if body.is_empty() {
        CreateContext::default()
    } else {
        parse_json(&body).map_err(E2bError::bad_request)?
    };
    let PlaneSandbox { id, tenant } = sandbox;
    let language = req.language.unwrap_or_else(|| "python".into());
    let cwd = Some(sandbox_cwd(req.cwd.as_deref().unwrap_or(E2B_HOME)));
    let service = state.service.clone();
    let info = blocking(service.admit(&tenant)?, move |call| {
        service.create_context(call, &id, &language, cwd)
    })
    .await?;
    Ok(Json(context_json(&info)))
}

/// `GET /contexts`: the sandbox's contexts, its own kernel's first.
pub(super) async fn list(
    State(state): State<AppState>,
    sandbox: Result<PlaneSandbox, E2bError>,
) -> Result<Json<Value>, E2bError> {
    let PlaneSandbox { id, tenant } = sandbox?;
    let service = state.service.clone();
    let contexts = blocking(service.admit(&tenant)?, move |call| {
        service.list_contexts(call, &id)
    })
    .await?;
    Ok(Json(Value::Array(
        contexts.iter().map(context_json).collect(),
    )))
}

/// `POST /contexts/{id}/restart`: a fresh interpreter, the files kept.
pub(super) async fn restart(
    State(state): State<AppState>,
    sandbox: Result<PlaneSandbox, E2bError>,
    Path(context): Path<String>,
    _body: Bytes,
) -> Result<StatusCode, E2bError> {
    let PlaneSandbox { id, tenant } = sandbox?;
    let service = state.service.clone();
    blocking(service.admit(&tenant)?, move |call| {
        service.restart_context(call, &id, &context)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /contexts/{id}`: the context's interpreter is killed.
pub(super) async fn remove(
    State(state): State<AppState>,
    sandbox: Result<PlaneSandbox, E2bError>,
    Path(context): Path<String>,
    _body: Bytes,
) -> Result<StatusCode, E2bError> {
    let PlaneSandbox { id, tenant } = sandbox?;
    let service = state.service.clone();
    blocking(service.admit(&tenant)?, move |call| {
        service.remove_context(call, &id, &context)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}
