//! Where the tools' work is done: an in-process [`Service`] or a running `corral serve` reached
//! over its native HTTP API. Both are synchronous; the MCP handler calls them from blocking
//! threads.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use corral_kernel::Stopper;
use corral_sandbox::{ExecutionResult, FileEntry};
use corral_service::service::{
    CommandRequest, CreateSandboxRequest, ExecuteRequest, SandboxInfo, ServiceError,
};
use corral_service::{Admitted, Service, Tenant};
use serde::Deserialize;

mod processes;
pub use processes::{OutputSource, ProcessBackend, ProcessSignal, ProcessStart, RunningProcess};

/// Who a tool call acts for: the tenant (in-process) and the API key it came with, if any
/// (passed on to a remote server).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub tenant: Tenant,
    pub key: Option<String>,
}

impl Caller {
    /// The keyless local user (stdio, or HTTP on loopback without a key).
    pub fn local() -> Caller {
        Caller {
            tenant: Tenant::local(),
            key: None,
        }
    }
}

/// Why a backend call failed; the message is written for the model that made the call.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// No such session (or another tenant's): it may have expired.
    #[error("{0}")]
    NotFound(String),
    /// The session's kernel died (memory limit, killed).
    #[error("{0}")]
    Dead(String),
    #[error("{0}")]
    Other(String),
}

impl From<ServiceError> for BackendError {
    fn from(e: ServiceError) -> Self {
        match e {
            ServiceError::NotFound(m) => BackendError::NotFound(m),
            // The session is there: this is the tool's error, not a reason to replace it.
            ServiceError::FileNotFound(m) => BackendError::Other(m),
            ServiceError::SandboxDead(m) => BackendError::Dead(m),
            other => BackendError::Other(other.to_string()),
        }
    }
}

/// The operations the MCP tools need, on sessions owned by `caller` (those on a session's
/// programs: [`ProcessBackend`]).
pub trait Backend: ProcessBackend + Send + Sync {
    fn create_session(
        &self,
        caller: &Caller,
        req: &CreateSandboxRequest,
    ) -> Result<SandboxInfo, BackendError>;
    fn close_session(&self, caller: &Caller, id: &str) -> Result<(), BackendError>;
    fn pause_session(&self, caller: &Caller, id: &str) -> Result<SandboxInfo, BackendError>;
    fn resume_session(&self, caller: &Caller, id: &str) -> Result<SandboxInfo, BackendError>;
    fn execute(
        &self,
        caller: &Caller,
        id: &str,
        req: &ExecuteRequest,
    ) -> Result<ExecutionResult, BackendError>;
    fn run_command(
        &self,
        caller: &Caller,
        id: &str,
        req: &CommandRequest,
    ) -> Result<ExecutionResult, BackendError>;
    fn write_file(
        &self,
        caller: &Caller,
        id: &str,
        path: &str,
        data: &[u8],
    ) -> Result<FileEntry, BackendError>;
    /// At most `limit` bytes of the file, and whether there was more.
    fn read_file(
        &self,
        caller: &Caller,
        id: &str,
        path: &str,
        limit: u64,
    ) -> Result<(Vec<u8>, bool), BackendError>;
    fn list_files(
        &self,
        caller: &Caller,
        id: &str,
        dir: Option<&str>,
    ) -> Result<Vec<FileEntry>, BackendError>;
}

/// Reads at most `limit` bytes; the flag tells whether more followed.
fn read_limited(reader: impl Read, limit: u64) -> std::io::Result<(Vec<u8>, bool)> {
    let mut data = Vec::new();
    reader.take(limit + 1).read_to_end(&mut data)?;
    let more = data.len() as u64 > limit;
    data.truncate(limit as usize);
    Ok((data, more))
}

/// Sandboxes run by a [`Service`] in this process.
pub struct InProcess {
    service: Arc<Service>,
}

impl InProcess {
    pub fn new(service: Arc<Service>) -> InProcess {
        InProcess { service }
    }

    /// Admits a call of `caller`'s (its key's budget of blocking calls, as `corral serve`
    /// admits each request's): the thread it runs on is the tool call's.
    fn admit(&self, caller: &Caller) -> Result<Admitted, ServiceError> {
        self.service.admit(&caller.tenant)
    }
}

impl Backend for InProcess {
    fn create_session(
        &self,
        caller: &Caller,
        req: &CreateSandboxRequest,
    ) -> Result<SandboxInfo, BackendError> {
        Ok(self.service.create_session(&self.admit(caller)?, req)?)
    }

    fn close_session(&self, caller: &Caller, id: &str) -> Result<(), BackendError> {
        // Never refused, as `corral serve`'s kill: a key can close its sandboxes while its calls
        // hold its every thread.
        let call = self.service.admit_unmetered(&caller.tenant);
        Ok(self.service.kill(&call, id)?)
    }

    fn pause_session(&self, caller: &Caller, id: &str) -> Result<SandboxInfo, BackendError> {
        Ok(self.service.pause(&self.admit(caller)?, id)?)
    }

    fn resume_session(&self, caller: &Caller, id: &str) -> Result<SandboxInfo, BackendError> {
        Ok(self.service.resume(&self.admit(caller)?, id)?)
    }

    fn execute(
        &self,
        caller: &Caller,
        id: &str,
        req: &ExecuteRequest,
    ) -> Result<ExecutionResult, BackendError> {
        let call = self.admit(caller)?;
        let prepared = self.service.prepare_execute(&call, id, req.clone())?;
        Ok(self.service.execute(&call, prepared, &mut |_| {})?)
    }

    fn run_command(
        &self,
        caller: &Caller,
        id: &str,
        req: &CommandRequest,
    ) -> Result<ExecutionResult, BackendError> {
        let call = self.admit(caller)?;
        let prepared = self.service.prepare_command(&call, id, req.clone())?;
        Ok(self
            .service
            .run_command(&call, prepared, &Stopper::default(), &mut |_| {})?)
    }

    fn write_file(
        &self,
        caller: &Caller,
        id: &str,
        path: &str,
        data: &[u8],
    ) -> Result<FileEntry, BackendError> {
        Ok(self
            .service
            .write_file(&self.admit(caller)?, id, path, data)?)
    }

    fn read_file(
        &self,
        caller: &Caller,
        id: &str,
        path: &str,
        limit: u64,
    ) -> Result<(Vec<u8>, bool), BackendError> {
        let call = self.admit(caller)?;
        let file = self.service.open_file(&call, id, path)?;
        read_limited(file, limit).map_err(|e| BackendError::Other(format!("reading {path}: {e}")))
    }

    fn list_files(
        &self,
        caller: &Caller,
        id: &str,
        dir: Option<&str>,
    ) -> Result<Vec<FileEntry>, BackendError> {
        Ok(self.service.list_files(&self.admit(caller)?, id, dir)?)
    }
}

/// Sandboxes of a running `corral serve`, through its native API (docs/api.md).
pub struct Remote {
    base: String,
    api_key: Option<String>,
    agent: ureq::Agent,
}

#[derive(Deserialize)]
struct ApiError {
    error: ApiErrorBody,
}

#[derive(Deserialize)]
struct ApiErrorBody {
    code: String,
    message: String,
}

#[derive(Deserialize)]
struct FileList {
    files: Vec<FileEntry>,
}

/// Percent-encodes a workspace path for a URL, keeping its `/` separators.
fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Remote {
    /// `url` is the server's base URL (`http://127.0.0.1:8420`); `api_key` is used for callers
    /// that brought none of their own.
    pub fn new(url: &str, api_key: Option<String>) -> Remote {
        Remote {
            base: url.trim_end_matches('/').to_string(),
            api_key,
            // Executions may run as long as their timeout: no read timeout of our own.
            agent: ureq::AgentBuilder::new()
                .timeout_connect(Duration::from_secs(10))
                .build(),
        }
    }

    fn request(&self, caller: &Caller, method: &str, path: &str) -> ureq::Request {
        let req = self
            .agent
            .request(method, &format!("{}{path}", self.base))
            .set("Accept", "application/json");
        match caller.key.as_ref().or(self.api_key.as_ref()) {
            Some(key) => req.set("Authorization", &format!("Bearer {key}")),
            None => req,
        }
    }

    /// A request's outcome, with the server's error answers turned into [`BackendError`]s.
    fn send(
        &self,
        sent: Result<ureq::Response, ureq::Error>,
    ) -> Result<ureq::Response, BackendError> {
        match sent {
            Ok(r) => Ok(r),
            Err(ureq::Error::Status(status, r)) => {
                let body = r.into_string().unwrap_or_default();
                let (code, message) = match serde_json::from_str::<ApiError>(&body) {
                    Ok(e) => (e.error.code, e.error.message),
                    Err(_) => (
                        String::new(),
                        format!("the server answered {status}: {body}"),
                    ),
                };
                Err(match (status, code.as_str()) {
                    // A missing file is the tool's error; the session is still there.
                    (404, "file_not_found" | "process_not_found") => BackendError::Other(message),
                    (404, _) => BackendError::NotFound(message),
                    // As in-process: only a dead session is; a paused one, or a program
                    // without stdin, is the tool's error, never a reason to replace the session.
                    (409, "sandbox_dead") => BackendError::Dead(message),
                    _ => BackendError::Other(message),
                })
            }
            Err(e) => Err(BackendError::Other(format!(
                "cannot reach the Corral server at {}: {e}",
                self.base
            ))),
        }
    }

    fn json<T: serde::de::DeserializeOwned>(
        &self,
        sent: Result<ureq::Response, ureq::Error>,
    ) -> Result<T, BackendError> {
        self.send(sent)?.into_json().map_err(|e| {
            BackendError::Other(format!("unreadable answer from the Corral server: {e}"))
        })
    }
}

impl Backend for Remote {
    fn create_session(
        &self,
        caller: &Caller,
        req: &CreateSandboxRequest,
    ) -> Result<SandboxInfo, BackendError> {
        self.json(self.request(caller, "POST", "/v1/sandboxes").send_json(req))
    }

    fn close_session(&self, caller: &Caller, id: &str) -> Result<(), BackendError> {
        let path = format!("/v1/sandboxes/{}", encode_path(id));
        self.send(self.request(caller, "DELETE", &path).call())
            .map(drop)
    }

    fn pause_session(&self, caller: &Caller, id: &str) -> Result<SandboxInfo, BackendError> {
        let path = format!("/v1/sandboxes/{}/pause", encode_path(id));
        self.json(self.request(caller, "POST", &path).call())
    }

    fn resume_session(&self, caller: &Caller, id: &str) -> Result<SandboxInfo, BackendError> {
        let path = format!("/v1/sandboxes/{}/resume", encode_path(id));
        self.json(self.request(caller, "POST", &path).call())
    }

    fn execute(
        &self,
        caller: &Caller,
        id: &str,
        req: &ExecuteRequest,
    ) -> Result<ExecutionResult, BackendError> {
        let path = format!("/v1/sandboxes/{}/execute", encode_path(id));
        self.json(self.request(caller, "POST", &path).send_json(req))
    }

    fn run_command(
        &self,
        caller: &Caller,
        id: &str,
        req: &CommandRequest,
    ) -> Result<ExecutionResult, BackendError> {
        let path = format!("/v1/sandboxes/{}/commands", encode_path(id));
        self.json(self.request(caller, "POST", &path).send_json(req))
    }

    fn write_file(
        &self,
        caller: &Caller,
        id: &str,
        path: &str,
        data: &[u8],
    ) -> Result<FileEntry, BackendError> {
        let url = format!(
            "/v1/sandboxes/{}/files/{}",
            encode_path(id),
            encode_path(path)
        );
        self.json(self.request(caller, "PUT", &url).send_bytes(data))
    }

    fn read_file(
        &self,
        caller: &Caller,
        id: &str,
        path: &str,
        limit: u64,
    ) -> Result<(Vec<u8>, bool), BackendError> {
        let url = format!(
            "/v1/sandboxes/{}/files/{}",
            encode_path(id),
            encode_path(path)
        );
        let response = self.send(self.request(caller, "GET", &url).call())?;
        read_limited(response.into_reader(), limit)
            .map_err(|e| BackendError::Other(format!("reading {path}: {e}")))
    }

    fn list_files(
        &self,
        caller: &Caller,
        id: &str,
        dir: Option<&str>,
    ) -> Result<Vec<FileEntry>, BackendError> {
        let path = format!("/v1/sandboxes/{}/files", encode_path(id));
        let list: FileList = self.json({
            let req = self.request(caller, "GET", &path);
            match dir {
                Some(d) => req.query("dir", d).call(),
                None => req.call(),
            }
        })?;
        Ok(list.files)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_encoded_but_keep_separators() {
        assert_eq!(encode_path("sub dir/a+b.csv"), "sub%20dir/a%2Bb.csv");
        assert_eq!(encode_path("sbx-1a2b"), "sbx-1a2b");
    }

    #[test]
    fn reads_are_limited() {
        let (data, more) = read_limited(&b"hello"[..], 3).unwrap();
        assert_eq!((data.as_slice(), more), (&b"hel"[..], true));
        let (data, more) = read_limited(&b"hi"[..], 3).unwrap();
        assert_eq!((data.as_slice(), more), (&b"hi"[..], false));
    }
}
