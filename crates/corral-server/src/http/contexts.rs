//! The native code contexts API (docs/api.md#code-contexts): more interpreters in a sandbox,
//! of any language its image has, on the sandbox's files.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use corral_kernel::ContextInfo;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{blocking, ApiJson, AppState};
use crate::error::ApiError;
use crate::service::Tenant;

fn context_json(info: &ContextInfo) -> Value {
    json!({"id": info.id, "language": info.language.name(), "cwd": info.cwd})
}

/// `POST /v1/sandboxes/{id}/contexts`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateContextRequest {
    language: String,
    /// An absolute path inside the sandbox (default `/workspace`).
    cwd: Option<String>,
}

pub async fn create(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<CreateContextRequest>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let service = state.service.clone();
    let info =
        blocking(move || service.create_context(&tenant, &id, &req.language, req.cwd)).await?;
    Ok((StatusCode::CREATED, Json(context_json(&info))))
}

pub async fn list(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let service = state.service.clone();
    let contexts = blocking(move || service.list_contexts(&tenant, &id)).await?;
    let contexts: Vec<Value> = contexts.iter().map(context_json).collect();
    Ok(Json(json!({ "contexts": contexts })))
}

pub async fn restart(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((id, context)): Path<(String, String)>,
    _body: Bytes,
) -> Result<StatusCode, ApiError> {
    let service = state.service.clone();
    blocking(move || service.restart_context(&tenant, &id, &context)).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn remove(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((id, context)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let service = state.service.clone();
    blocking(move || service.remove_context(&tenant, &id, &context)).await?;
    Ok(StatusCode::NO_CONTENT)
}
