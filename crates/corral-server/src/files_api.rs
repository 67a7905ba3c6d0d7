//! The native API's filesystem calls beside the file routes of [`crate::http`] (which read,
//! write and delete regular files): stat, a listing with depth, mkdir, move and remove of
//! anything, as E2B's filesystem service has them (docs/api.md, "Filesystem").
//!
//! `GET …/files:stat?path=`, `GET …/files:list?path=&depth=`, `POST …/files:mkdir`,
//! `POST …/files:move`, `POST …/files:remove`. The `files:` names are their own segment, so
//! no workspace file's name (`files/stat`) is taken from the file routes.
//!
//! Every path goes through the workspace's checks ([`corral_sandbox::Workspace`]): relative
//! to `/workspace`, no `..`, never through a link the sandbox planted (a link is reported,
//! moved or removed as itself, never followed); a listing is at most
//! [`MAX_ENTRIES`](corral_sandbox::workspace::MAX_ENTRIES) entries and [`MAX_DEPTH`] levels, or it fails whole; a move never replaces
//! anything.

use std::time::{Duration, SystemTime};

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use corral_sandbox::workspace::{EntryInfo, EntryKind, MAX_DEPTH};
use serde::{Deserialize, Serialize};

use crate::error::{ApiError, ErrorBody};
use crate::http::{blocking, ApiJson, AppState};
use crate::service::Tenant;

/// The routes, with the state of [`crate::http::router`].
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/sandboxes/{id}/files:stat", get(stat))
        .route("/v1/sandboxes/{id}/files:list", get(list))
        .route("/v1/sandboxes/{id}/files:mkdir", post(make_dir))
        .route("/v1/sandboxes/{id}/files:move", post(move_entry))
        .route("/v1/sandboxes/{id}/files:remove", post(remove))
}

/// What a workspace entry is. A link is a link: its target is never looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EntryType {
    File,
    Dir,
    Symlink,
    /// A FIFO, socket or device node.
    Other,
}

/// One entry of the workspace, as `lstat` sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Entry {
    /// Relative to `/workspace`; empty for the workspace itself.
    pub path: String,
    pub name: String,
    #[serde(rename = "type")]
    pub kind: EntryType,
    pub size: u64,
    /// The permission bits (`0o644` is 420).
    pub mode: u32,
    /// The modification time, RFC 3339.
    pub modified: String,
    /// A link's target as stored, never resolved; only for links.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
}

impl From<&EntryInfo> for Entry {
    fn from(e: &EntryInfo) -> Entry {
        let (secs, nanos) = e.modified;
        let modified = match u64::try_from(secs) {
            Ok(s) => SystemTime::UNIX_EPOCH + Duration::new(s, nanos.min(999_999_999)),
            Err(_) => SystemTime::UNIX_EPOCH,
        };
        // humantime writes years up to 9999; a later time the sandbox set is clamped.
        let latest = SystemTime::UNIX_EPOCH + Duration::from_secs(253_402_300_799);
        Entry {
            path: e.path.to_string_lossy().into_owned(),
            name: e.name(),
            kind: match e.kind {
                EntryKind::File => EntryType::File,
                EntryKind::Dir => EntryType::Dir,
                EntryKind::Symlink => EntryType::Symlink,
                EntryKind::Other => EntryType::Other,
            },
            size: e.size,
            mode: e.mode & 0o7777,
            modified: humantime::format_rfc3339_nanos(modified.min(latest)).to_string(),
            symlink_target: e
                .link_target
                .as_ref()
                .map(|t| t.to_string_lossy().into_owned()),
        }
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct PathQuery {
    /// A workspace path (empty or absent: the workspace itself).
    #[serde(default)]
    path: String,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    /// A workspace directory (empty or absent: the workspace itself).
    #[serde(default)]
    path: String,
    /// How many levels to list: 1 (the default) is the directory's own entries; at most 32.
    depth: Option<usize>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct PathBody {
    path: String,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct MoveBody {
    from: String,
    to: String,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct EntryList {
    entries: Vec<Entry>,
}

fn query<T>(q: Result<Query<T>, axum::extract::rejection::QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(q)| q)
        .map_err(|e| ApiError::bad_request(e.body_text()))
}

/// What is at a workspace path; a link is reported as a link, never followed.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files:stat", tag = "files", params(PathQuery),
    responses((status = 200, body = Entry), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
async fn stat(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    q: Result<Query<PathQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Entry>, ApiError> {
    let q = query(q)?;
    let service = state.service.clone();
    let entry = blocking(service.admit(&tenant)?, move |call| {
        service.stat(call, &id, &q.path)
    })
    .await?;
    Ok(Json(Entry::from(&entry)))
}

/// The entries of a workspace directory, `depth` levels of them, each directory followed by
/// its entries, names sorted; links are listed, never entered.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files:list", operation_id = "list_entries", tag = "files", params(ListQuery),
    responses((status = 200, body = EntryList), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
async fn list(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    q: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<EntryList>, ApiError> {
    let q = query(q)?;
    let depth = q.depth.unwrap_or(1);
    if !(1..=MAX_DEPTH).contains(&depth) {
        return Err(ApiError::bad_request(format!(
            "depth must be 1 to {MAX_DEPTH}, not {depth}"
        )));
    }
    let service = state.service.clone();
    let entries = blocking(service.admit(&tenant)?, move |call| {
        service.list_dir(call, &id, &q.path, depth)
    })
    .await?;
    Ok(Json(EntryList {
        entries: entries.iter().map(Entry::from).collect(),
    }))
}

/// Makes a directory and its missing parents: 201 when made, 200 when it was already a
/// directory; a file or a link in the way is 400.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files:mkdir", tag = "files",
    request_body = PathBody,
    responses((status = 201, body = Entry), (status = 200, body = Entry),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn make_dir(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<PathBody>,
) -> Result<(StatusCode, Json<Entry>), ApiError> {
    let service = state.service.clone();
    let (made, entry) = blocking(service.admit(&tenant)?, move |call| {
        let made = service.make_dir(call, &id, &body.path)?;
        Ok((made, service.stat(call, &id, &body.path)?))
    })
    .await?;
    let status = if made {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(Entry::from(&entry))))
}

/// Moves (renames) an entry, making the missing directories on the way to `to`; never
/// replaces anything (409 `file_exists`). A link is moved as itself.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files:move", tag = "files",
    request_body = MoveBody,
    responses((status = 200, body = Entry), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn move_entry(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<MoveBody>,
) -> Result<Json<Entry>, ApiError> {
    let service = state.service.clone();
    let entry = blocking(service.admit(&tenant)?, move |call| {
        service.move_path(call, &id, &body.from, &body.to)
    })
    .await?;
    Ok(Json(Entry::from(&entry)))
}

/// Removes a file, a link (as itself) or a directory with everything in it (at most 100,000
/// names and 128 levels).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files:remove", operation_id = "remove_path", tag = "files",
    request_body = PathBody,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn remove(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<PathBody>,
) -> Result<StatusCode, ApiError> {
    let service = state.service.clone();
    blocking(service.admit(&tenant)?, move |call| {
        service.remove_path(call, &id, &body.path)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(utoipa::OpenApi)]
#[openapi(paths(stat, list, make_dir, move_entry, remove))]
pub struct FilesApiDoc;

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn entries_say_what_lstat_saw() {
        let link = EntryInfo {
            path: PathBuf::from("sub/link"),
            kind: EntryKind::Symlink,
            size: 11,
            mode: 0o120777,
            uid: 1,
            gid: 1,
            ino: 7,
            modified: (0, 5),
            link_target: Some(PathBuf::from("/etc/passwd")),
        };
        let json = serde_json::to_value(Entry::from(&link)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "path": "sub/link", "name": "link", "type": "symlink", "size": 11,
                "mode": 0o777, "modified": "1970-01-01T00:00:00.000000005Z",
                "symlink_target": "/etc/passwd",
            })
        );
        let far = EntryInfo {
            modified: (i64::MAX, 0),
            link_target: None,
            kind: EntryKind::File,
            ..link
        };
        let json = serde_json::to_value(Entry::from(&far)).unwrap();
        assert_eq!(json["modified"], "9999-12-31T23:59:59.000000000Z");
        assert!(json.get("symlink_target").is_none());
    }
}
