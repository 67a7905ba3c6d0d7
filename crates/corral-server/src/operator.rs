//! Who a key is, the audit log, and what only an operator may do (docs/api.md, "Operators"):
//! list, make and revoke keys, and see every key's sandboxes. An operator is a live key made
//! with `corral key create --operator`; keyless local use is never one (on a shared host any
//! local user can reach a loopback server), and the API cannot make another operator key.

use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::routing::{delete, get};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use crate::db::{
    AuditQuery, AuditRecord, Db, DbError, EgressQuery, EgressRecord, AUDIT_DEFAULT, AUDIT_LIMIT,
};
use crate::error::ApiError;
use crate::http::{blocking, ApiJson, AppState};
use crate::service::{ListQuery, SandboxInfo, SandboxMetric, Tenant};

/// The longest key name, in bytes.
pub const KEY_NAME_BYTES: usize = 64;
/// The largest body these routes read (`{"name": ...}` is all they take).
pub const BODY_BYTES: usize = 4096;

/// A request of an operator key; any other tenant is refused with 403.
pub struct Operator(pub Tenant);

impl FromRequestParts<AppState> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let tenant = Tenant::from_request_parts(parts, state).await?;
        if is_operator(state, &tenant).await? {
            Ok(Operator(tenant))
        } else {
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "this needs an operator key (make one on the server's host with \
                 `corral key create --operator`)",
            ))
        }
    }
}

/// Runs `f` on the server's database off the async runtime.
async fn with_db<T: Send + 'static>(
    state: &AppState,
    tenant: &Tenant,
    f: impl FnOnce(&Db) -> Result<T, DbError> + Send + 'static,
) -> Result<T, ApiError> {
    let service = state.service.clone();
    crate::threads::run(state.service.admit(tenant)?, move |_call| f(service.db()))
        .await
        .map_err(|e| ApiError::internal(format!("internal error: {e}")))?
        .map_err(|e| ApiError::internal(e.to_string()))
}

async fn is_operator(state: &AppState, tenant: &Tenant) -> Result<bool, ApiError> {
    let id = tenant.0.clone();
    with_db(state, tenant, move |db| db.is_operator(&id)).await
}

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/whoami", get(whoami))
        .route("/v1/audit", get(audit))
        .route("/v1/audit/egress", get(egress_audit))
        .route("/v1/keys", get(list_keys).post(create_key))
        .route("/v1/keys/{id}", delete(revoke_key))
        .route("/v1/operator/sandboxes", get(all_sandboxes))
        .layer(DefaultBodyLimit::max(BODY_BYTES))
}

/// Who the request acts as.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Whoami {
    /// The key's id, or `local` for keyless use on a loopback server.
    pub key_id: String,
    /// The key's name (absent for `local`).
    pub name: Option<String>,
    pub operator: bool,
}

/// Who the request acts as: its key's id and name, and whether it is an operator's.
#[utoipa::path(get, path = "/v1/whoami", tag = "operators",
    responses((status = 200, body = Whoami), (status = 401, body = crate::error::ErrorBody)))]
pub(crate) async fn whoami(
    State(state): State<AppState>,
    tenant: Tenant,
) -> Result<Json<Whoami>, ApiError> {
    let id = tenant.0.clone();
    let (name, operator) = with_db(&state, &tenant, move |db| {
        Ok((db.key_name(&id)?, db.is_operator(&id)?))
    })
    .await?;
    Ok(Json(Whoami {
        key_id: tenant.0,
        name,
        operator,
    }))
}

/// The query of `GET /v1/audit`.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AuditParams {
    /// Only this key's lines (`local`: keyless use). A key other than an operator may only
    /// name itself.
    key: Option<String>,
    /// Only this session's lines.
    session: Option<String>,
    /// `run`, `execute` or `command`.
    kind: Option<String>,
    /// A result status: `ok`, `error`, `timeout`, ...
    status: Option<String>,
    /// Only lines at or after this time, in seconds since the Unix epoch.
    since: Option<i64>,
    /// Only lines older than this one: the `next` of the previous page.
    before: Option<i64>,
    /// 1 to 1000; default 100.
    limit: Option<usize>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct AuditPage {
    /// Newest first.
    entries: Vec<AuditRecord>,
    /// Present when there may be more: pass it as `before` for the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<i64>,
}

/// Whose lines a request of `tenant` naming `key` reads: an operator's, `key`'s (every key's
/// without one); any other key's, its own only (naming another is 403).
async fn audit_scope(
    state: &AppState,
    tenant: &Tenant,
    key: Option<String>,
) -> Result<Option<String>, ApiError> {
    if is_operator(state, tenant).await? {
        return Ok(key);
    }
    match key {
        Some(key) if key != tenant.0 => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "only an operator key sees another key's audit log",
        )),
        _ => Ok(Some(tenant.0.clone())),
    }
}

/// The page size `limit` asks for (1 to [`AUDIT_LIMIT`], default [`AUDIT_DEFAULT`]).
fn audit_limit(limit: Option<usize>) -> Result<usize, ApiError> {
    let limit = limit.unwrap_or(AUDIT_DEFAULT);
    if limit == 0 || limit > AUDIT_LIMIT {
        return Err(ApiError::bad_request(format!(
            "`limit` must be between 1 and {AUDIT_LIMIT}"
        )));
    }
    Ok(limit)
}

/// The audit log of executions, newest first: a key sees its own lines, an operator
/// everyone's (filtered by `key` if given).
#[utoipa::path(get, path = "/v1/audit", tag = "operators", params(AuditParams),
    responses((status = 200, body = AuditPage), (status = 400, body = crate::error::ErrorBody),
        (status = 403, description = "Another key's lines, asked for by a key that is not an operator's", body = crate::error::ErrorBody)))]
pub(crate) async fn audit(
    State(state): State<AppState>,
    tenant: Tenant,
    query: Result<Query<AuditParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<AuditPage>, ApiError> {
    let Query(params) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let limit = audit_limit(params.limit)?;
    let key_id = audit_scope(&state, &tenant, params.key).await?;
    let query = AuditQuery {
        key_id,
        session_id: params.session,
        kind: params.kind,
        status: params.status,
        since: params.since,
        before: params.before,
        limit,
    };
    let entries = with_db(&state, &tenant, move |db| db.query_audit(&query)).await?;
    let next = (entries.len() == limit)
        .then(|| entries.last().map(|e| e.id))
        .flatten();
    Ok(Json(AuditPage { entries, next }))
}

/// The query of `GET /v1/audit/egress`.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EgressAuditParams {
    /// Only this key's decisions (`local`: keyless use). A key other than an operator may
    /// only name itself.
    key: Option<String>,
    /// Only this session's decisions.
    session: Option<String>,
    /// `allowed`, `denied` or `failed`.
    decision: Option<String>,
    /// Only decisions on this name (or address), as the program asked for it.
    host: Option<String>,
    /// Only decisions at or after this time, in seconds since the Unix epoch.
    since: Option<i64>,
    /// Only decisions older than this one: the `next` of the previous page.
    before: Option<i64>,
    /// 1 to 1000; default 100.
    limit: Option<usize>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct EgressAuditPage {
    /// Newest first.
    entries: Vec<EgressRecord>,
    /// Present when there may be more: pass it as `before` for the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<i64>,
}

/// Every decision of the sandboxes' egress proxies (docs/network.md), newest first: a key sees
/// its own sandboxes' decisions, an operator everyone's (filtered by `key` if given).
#[utoipa::path(get, path = "/v1/audit/egress", tag = "operators", params(EgressAuditParams),
    responses((status = 200, body = EgressAuditPage), (status = 400, body = crate::error::ErrorBody),
        (status = 403, description = "Another key's decisions, asked for by a key that is not an operator's", body = crate::error::ErrorBody)))]
pub(crate) async fn egress_audit(
    State(state): State<AppState>,
    tenant: Tenant,
    query: Result<Query<EgressAuditParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<EgressAuditPage>, ApiError> {
    let Query(params) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let limit = audit_limit(params.limit)?;
    let query = EgressQuery {
        key_id: audit_scope(&state, &tenant, params.key).await?,
        session_id: params.session,
        decision: params.decision,
        host: params.host,
        since: params.since,
        before: params.before,
        limit,
    };
    let entries = with_db(&state, &tenant, move |db| db.query_egress(&query)).await?;
    let next = (entries.len() == limit)
        .then(|| entries.last().map(|e| e.id))
        .flatten();
    Ok(Json(EgressAuditPage { entries, next }))
}

/// A key as the API shows it (never its secret).
#[derive(Serialize, utoipa::ToSchema)]
pub struct KeyView {
    pub id: String,
    pub name: String,
    /// Seconds since the Unix epoch.
    pub created_at: i64,
    pub revoked: bool,
    pub operator: bool,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct KeyList {
    keys: Vec<KeyView>,
}

/// Every key, revoked ones too (operators only).
#[utoipa::path(get, path = "/v1/keys", tag = "operators",
    responses((status = 200, body = KeyList), (status = 403, body = crate::error::ErrorBody)))]
pub(crate) async fn list_keys(
    State(state): State<AppState>,
    operator: Operator,
) -> Result<Json<KeyList>, ApiError> {
    let keys = with_db(&state, &operator.0, |db| db.list_keys()).await?;
    Ok(Json(KeyList {
        keys: keys
            .into_iter()
            .map(|k| KeyView {
                id: k.id,
                name: k.name,
                created_at: k.created_at,
                revoked: k.revoked,
                operator: k.operator,
            })
            .collect(),
    }))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateKeyRequest {
    /// 1 to 64 bytes of printable text.
    pub name: String,
}

/// A new key: its secret is in this answer only.
#[derive(Serialize, utoipa::ToSchema)]
pub struct CreatedKey {
    pub id: String,
    pub name: String,
    pub secret: String,
}

/// Make a key that is not an operator's (operators only; an operator key is made on the
/// server's host with `corral key create --operator`). The secret is shown once.
#[utoipa::path(post, path = "/v1/keys", tag = "operators", request_body = CreateKeyRequest,
    responses((status = 201, body = CreatedKey), (status = 400, body = crate::error::ErrorBody),
        (status = 403, body = crate::error::ErrorBody)))]
pub(crate) async fn create_key(
    State(state): State<AppState>,
    operator: Operator,
    ApiJson(req): ApiJson<CreateKeyRequest>,
) -> Result<(StatusCode, Json<CreatedKey>), ApiError> {
    let name = req.name;
    if name.is_empty() || name.len() > KEY_NAME_BYTES || name.chars().any(char::is_control) {
        return Err(ApiError::bad_request(format!(
            "`name` must be 1 to {KEY_NAME_BYTES} bytes of printable text"
        )));
    }
    let made = name.clone();
    let (id, secret) = with_db(&state, &operator.0, move |db| db.create_key(&made, false)).await?;
    Ok((StatusCode::CREATED, Json(CreatedKey { id, name, secret })))
}

/// Revoke a key (operators only): requests with it are refused from now on.
#[utoipa::path(delete, path = "/v1/keys/{id}", tag = "operators",
    responses((status = 204), (status = 403, body = crate::error::ErrorBody),
        (status = 404, description = "No live key of that id", body = crate::error::ErrorBody)))]
pub(crate) async fn revoke_key(
    State(state): State<AppState>,
    operator: Operator,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let revoked = {
        let id = id.clone();
        with_db(&state, &operator.0, move |db| db.revoke_key(&id)).await?
    };
    if revoked {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("no live key {id}")))
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AllSandboxesParams {
    /// Only this key's sandboxes (`local`: keyless use).
    key: Option<String>,
    /// 1 to 1000; default 1000.
    limit: Option<usize>,
    /// Only sandboxes after this cursor: the `next` of the previous page.
    after: Option<String>,
}

/// A sandbox, the key it belongs to, and its latest usage reading.
#[derive(Serialize, utoipa::ToSchema)]
pub struct OwnedSandbox {
    pub key_id: String,
    /// The newest sample of `GET /v1/sandboxes/{id}/metrics` (absent for a dead sandbox).
    pub usage: Option<SandboxMetric>,
    #[serde(flatten)]
    pub sandbox: SandboxInfo,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct OwnedSandboxList {
    /// In creation order, every key's together.
    sandboxes: Vec<OwnedSandbox>,
    /// Present when there are more: pass it as `after` for the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<String>,
}

/// Every key's sandboxes, or one key's (operators only), in creation order a page at a time:
/// what each is and its latest usage, not its contents.
#[utoipa::path(get, path = "/v1/operator/sandboxes", tag = "operators", params(AllSandboxesParams),
    responses((status = 200, body = OwnedSandboxList), (status = 400, body = crate::error::ErrorBody),
        (status = 403, body = crate::error::ErrorBody)))]
pub(crate) async fn all_sandboxes(
    State(state): State<AppState>,
    operator: Operator,
    query: Result<Query<AllSandboxesParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<OwnedSandboxList>, ApiError> {
    let Query(params) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let service = state.service.clone();
    let list = blocking(service.admit(&operator.0)?, move |call| {
        let key = params.key.map(Tenant);
        let page = service.list_owned(
            key.as_ref(),
            &ListQuery {
                limit: params.limit,
                after: params.after,
                ..Default::default()
            },
        )?;
        let sandboxes = page
            .sandboxes
            .into_iter()
            .map(|(tenant, sandbox)| {
                // A sandbox that ended meanwhile has no reading: it is listed without one.
                let usage = match sandbox.state.as_str() {
                    "dead" => None,
                    _ => service.latest_usage(call, &tenant, &sandbox.id),
                };
                OwnedSandbox {
                    key_id: tenant.0,
                    usage,
                    sandbox,
                }
            })
            .collect();
        Ok(OwnedSandboxList {
            sandboxes,
            next: page.next,
        })
    })
    .await?;
    Ok(Json(list))
}
