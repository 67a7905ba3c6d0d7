//! The native code contexts API (docs/api.md#code-contexts): more interpreters in a sandbox,
//! of any language its image has, on the sandbox's files.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use corral_kernel::ContextInfo;
use serde::{Deserialize, Serialize};

use super::{blocking, ApiJson, AppState};
use crate::error::{ApiError, ErrorBody};
use crate::service::Tenant;

/// A code context: an interpreter of the sandbox.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Context {
    /// `default-<language>` for the session's own kernels, else generated.
    id: String,
    language: &'static str,
    /// Its working directory, relative to `/workspace` (null: `/workspace`).
    cwd: Option<String>,
}

impl From<&ContextInfo> for Context {
    fn from(info: &ContextInfo) -> Context {
        Context {
            id: info.id.clone(),
            language: info.language.name(),
            cwd: info.cwd.clone(),
        }
    }
}

/// `GET /v1/sandboxes/{id}/contexts`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ContextList {
    contexts: Vec<Context>,
}

/// `POST /v1/sandboxes/{id}/contexts`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateContextRequest {
    language: String,
    /// An absolute path inside the sandbox (default `/workspace`).
    cwd: Option<String>,
}

/// Start a new interpreter of `language` in the sandbox, on its files; run code in it with
/// `execute`'s `context`.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/contexts", operation_id = "create_context", tag = "contexts",
    request_body = CreateContextRequest,
    responses((status = 201, body = Context),
        (status = 400, description = "a bad `cwd`, or too many contexts", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "`sandbox_paused`", body = ErrorBody),
        (status = 422, description = "`unsupported_language`", body = ErrorBody)))]
pub async fn create(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<CreateContextRequest>,
) -> Result<(StatusCode, Json<Context>), ApiError> {
    let service = state.service.clone();
    let info = blocking(service.admit(&tenant)?, move |call| {
        service.create_context(call, &id, &req.language, req.cwd)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(Context::from(&info))))
}

/// The session's contexts, its own kernel's first.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/contexts", operation_id = "list_contexts", tag = "contexts",
    responses((status = 200, body = ContextList), (status = 404, body = ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> Result<Json<ContextList>, ApiError> {
    let service = state.service.clone();
    let contexts = blocking(service.admit(&tenant)?, move |call| {
        service.list_contexts(call, &id)
    })
    .await?;
    let contexts = contexts.iter().map(Context::from).collect();
    Ok(Json(ContextList { contexts }))
}

/// Restart a context's interpreter: its variables are gone, the sandbox's files stay.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/contexts/{context}/restart", operation_id = "restart_context", tag = "contexts",
    responses((status = 204),
        (status = 404, description = "no such sandbox or context", body = ErrorBody)))]
pub async fn restart(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((id, context)): Path<(String, String)>,
    _body: Bytes,
) -> Result<StatusCode, ApiError> {
    let service = state.service.clone();
    blocking(service.admit(&tenant)?, move |call| {
        service.restart_context(call, &id, &context)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Stop a context's interpreter and forget the context.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/contexts/{context}", operation_id = "remove_context", tag = "contexts",
    responses((status = 204),
        (status = 404, description = "no such sandbox or context", body = ErrorBody)))]
pub async fn remove(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((id, context)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let service = state.service.clone();
    blocking(service.admit(&tenant)?, move |call| {
        service.remove_context(call, &id, &context)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}
