//! The E2B-compatible face's wire items that the router shares: its error body and the
//! header that names a sandbox.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use corral_service::ServiceError;
use serde_json::json;

use crate::error::ApiError;

/// The header of a request to one sandbox's envd (E2B's sandbox face).
pub const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";

/// An error in E2B's shape: `{"code": <HTTP status>, "message": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct E2bError {
    pub status: StatusCode,
    pub message: String,
    pub retry_after_s: Option<u64>,
}

impl E2bError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> E2bError {
        E2bError {
            status,
            message: message.into(),
            retry_after_s: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> E2bError {
        E2bError::new(StatusCode::BAD_REQUEST, message)
    }

    /// A sandbox that is unknown, killed or expired, as E2B's edge proxy says it.
    pub fn not_running(id: &str) -> E2bError {
        E2bError::new(
            StatusCode::BAD_GATEWAY,
            format!("The sandbox {id} was not found"),
        )
    }
}

impl From<ApiError> for E2bError {
    fn from(e: ApiError) -> E2bError {
        E2bError {
            status: e.status,
            message: e.message,
            retry_after_s: e.retry_after_s,
        }
    }
}

impl From<ServiceError> for E2bError {
    fn from(e: ServiceError) -> E2bError {
        ApiError::from(e).into()
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let body = json!({"code": self.status.as_u16(), "message": self.message});
        let mut response = (self.status, Json(body)).into_response();
        if let Some(s) = self.retry_after_s {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        response
    }
}
