//! The result object of docs/results.md, shared by every interface.

use serde::{Deserialize, Serialize};

use crate::budget::Reservation;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Success,
    Error,
    Timeout,
    MemoryLimit,
    SandboxError,
}

/// One rich result (a MIME bundle); keys are present only for the types that exist.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RichResult {
    pub is_main_result: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub png: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub svg: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub markdown: Option<String>,
}

/// A language-level exception.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LanguageError {
    pub name: String,
    pub value: String,
    pub traceback: String,
    /// Only in a `PolicyViolation` (docs/code-policy.md): what the code policy refused, one
    /// entry per import (empty when the policy could not check the code at all). Absent from
    /// every other error.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub violations: Vec<Violation>,
}

/// The `name` of the error a code policy refuses code with.
pub const POLICY_VIOLATION: &str = "PolicyViolation";

/// One thing a code policy refused (docs/code-policy.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Violation {
    pub rule: ViolationRule,
    /// The line of the code (1-based); `null` for `max_code_bytes`.
    pub line: Option<u32>,
    /// The module as the code names it (`socket`, `os.path`, `node:fs` as `fs`, `.helpers`
    /// for a relative import); `null` for `max_code_bytes`.
    pub module: Option<String>,
}

/// Which rule of a code policy was broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ViolationRule {
    /// An import of a module outside `allowed_modules`.
    NotAllowed,
    /// An import of a module of `denied_modules`.
    Denied,
    /// A relative import (Python), which the policy cannot judge in submitted code.
    Relative,
    /// Code longer than `max_code_bytes`; nothing was started.
    MaxCodeBytes,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileEntry {
    pub path: String,
    pub size: u64,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExecutionResult {
    pub status: Status,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub results: Vec<RichResult>,
    pub error: Option<LanguageError>,
    pub files: Vec<FileEntry>,
    pub execution_time_ms: u64,
    pub cpu_time_ms: u64,
    pub peak_memory_bytes: u64,
    pub error_message: Option<String>,
    /// Protections that were weaker than requested for this run (e.g. the rlimit fallback).
    pub warnings: Vec<String>,
    /// What the sandbox's egress proxy did during the execution; `null` without a network
    /// policy (docs/network.md).
    pub network: Option<corral_egress::NetworkReport>,
    /// The room its results and error take in the host's budget of results held at once
    /// (none without a budget); not part of the result object. An answer made of the result
    /// takes it over, so that it is given back only once the answer is gone.
    #[serde(skip)]
    pub reservation: Reservation,
}

impl ExecutionResult {
    /// A result for a sandbox that could not be built or run.
    pub fn sandbox_error(message: impl Into<String>) -> Self {
        ExecutionResult {
            status: Status::SandboxError,
            exit_code: None,
            signal: None,
            stdout: String::new(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            results: Vec::new(),
            error: None,
            files: Vec::new(),
            execution_time_ms: 0,
            cpu_time_ms: 0,
            peak_memory_bytes: 0,
            error_message: Some(message.into()),
            warnings: Vec::new(),
            network: None,
            reservation: Reservation::default(),
        }
    }
}
