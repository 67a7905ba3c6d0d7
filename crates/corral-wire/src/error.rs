//! The API's JSON errors: `{"error": {"code": "...", "message": "..."}}` with the right status.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use corral_kernel::agent::{AgentError, AgentRefusal};
use corral_service::service::{Conflict, ServiceError, Unavailability};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub retry_after_s: Option<u64>,
}

/// The body of every error answer.
#[derive(Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorDetail {
    /// Machine-readable: `bad_request`, `invalid_path`, `unauthorized`, `forbidden`, `not_found`,
    /// `file_not_found`, `method_not_allowed`, `sandbox_dead`, `payload_too_large`,
    /// `insufficient_storage`, `unknown_image`, `unsupported_language`, `too_many_sandboxes`,
    /// `sandbox_error`, `zygote_restarting`, `memory_budget_committed`, `uploads_busy`,
    /// `shutting_down`, and of the port proxy `too_many_connections`, `port_closed`,
    /// `port_error`, `port_timeout`.
    pub code: String,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after_s: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn payload_too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "sandbox_error", message)
    }
}

/// The status and code of a failed call to a program in a sandbox.
pub fn process_status(e: &AgentError) -> (StatusCode, &'static str) {
    match e {
        AgentError::Refused(refusal) => match refusal {
            AgentRefusal::TooManyProcesses => (StatusCode::TOO_MANY_REQUESTS, "too_many_processes"),
            AgentRefusal::InputFull(_) => (StatusCode::TOO_MANY_REQUESTS, "process_input_full"),
            AgentRefusal::NoSuchProcess(_) => (StatusCode::NOT_FOUND, "process_not_found"),
            AgentRefusal::NoStdin(_) | AgentRefusal::NoTerminal(_) => {
                (StatusCode::CONFLICT, "process_has_no_input")
            }
            AgentRefusal::Start(_) => (StatusCode::UNPROCESSABLE_ENTITY, "process_not_started"),
            AgentRefusal::Invalid(_) => (StatusCode::BAD_REQUEST, "bad_request"),
        },
        AgentError::Invalid(_) => (StatusCode::BAD_REQUEST, "bad_request"),
        AgentError::TooManySubscribers(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_streams"),
        AgentError::Busy => (StatusCode::TOO_MANY_REQUESTS, "agent_busy"),
        AgentError::Unavailable => (StatusCode::NOT_IMPLEMENTED, "processes_unsupported"),
        AgentError::Gone | AgentError::NoAnswer(_) | AgentError::Io(_) => {
            (StatusCode::INTERNAL_SERVER_ERROR, "sandbox_error")
        }
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        let message = e.to_string();
        let (status, code) = match &e {
            ServiceError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ServiceError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ServiceError::InvalidPath(_) => (StatusCode::BAD_REQUEST, "invalid_path"),
            ServiceError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ServiceError::FileNotFound(_) => (StatusCode::NOT_FOUND, "file_not_found"),
            ServiceError::FileExists(_) => (StatusCode::CONFLICT, "file_exists"),
            ServiceError::SandboxDead(_) => (StatusCode::CONFLICT, "sandbox_dead"),
            ServiceError::UnknownImage(_) => (StatusCode::UNPROCESSABLE_ENTITY, "unknown_image"),
            ServiceError::UnsupportedLanguage(_) => {
                (StatusCode::UNPROCESSABLE_ENTITY, "unsupported_language")
            }
            ServiceError::TooManySandboxes { .. } => {
                (StatusCode::TOO_MANY_REQUESTS, "too_many_sandboxes")
            }
            ServiceError::KeyBusy { .. } => (StatusCode::TOO_MANY_REQUESTS, "key_busy"),
            ServiceError::Sandbox(_) => (StatusCode::INTERNAL_SERVER_ERROR, "sandbox_error"),
            ServiceError::PayloadTooLarge(_) => {
                (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
            }
            ServiceError::InsufficientStorage(_) => {
                (StatusCode::INSUFFICIENT_STORAGE, "insufficient_storage")
            }
            ServiceError::Unavailable { reason, .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                match reason {
                    Unavailability::ZygoteRestarting => "zygote_restarting",
                    Unavailability::MemoryBudget => "memory_budget_committed",
                    Unavailability::Uploads => "uploads_busy",
                    Unavailability::SandboxBusy => "sandbox_busy",
                    Unavailability::ServerBusy => "server_busy",
                },
            ),
            ServiceError::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
            ServiceError::Conflict { state, .. } => (
                StatusCode::CONFLICT,
                match state {
                    Conflict::Paused => "sandbox_paused",
                    Conflict::NotPaused => "sandbox_not_paused",
                    Conflict::Busy => "sandbox_busy",
                    Conflict::PauseUnsupported => "pause_unsupported",
                },
            ),
            ServiceError::NetworkNotAllowed(_) => (StatusCode::FORBIDDEN, "network_not_allowed"),
            ServiceError::Process(e) => process_status(e),
        };
        let retry_after_s = match e {
            ServiceError::TooManySandboxes { retry_after_s, .. }
            | ServiceError::KeyBusy { retry_after_s, .. }
            | ServiceError::Unavailable { retry_after_s, .. } => Some(retry_after_s),
            _ => None,
        };
        ApiError {
            status,
            code,
            message,
            retry_after_s,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_string(),
                message: self.message,
            },
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after_s {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restarting_zygote_is_503_with_retry_after() {
        let e = ApiError::from(ServiceError::Unavailable {
            reason: Unavailability::ZygoteRestarting,
            message: "restarting".into(),
            retry_after_s: 3,
        });
        assert_eq!(
            (e.status, e.code, e.retry_after_s),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "zygote_restarting",
                Some(3)
            )
        );
        let response = e.into_response();
        assert_eq!(response.headers()[header::RETRY_AFTER], "3");
    }
}
