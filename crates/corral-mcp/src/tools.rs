//! The MCP tools of docs/mcp.md and the per-connection state behind them (the default session).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;
use corral_kernel::Language;
use corral_sandbox::{ExecutionResult, Status};
use corral_service::service::{
    CommandRequest, CreateSandboxRequest, ExecuteRequest, NetworkRequest, PolicyRequest,
    SandboxInfo,
};
use corral_service::Tenant;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Extensions, Implementation, ServerCapabilities, ServerConfig,
};
use rmcp::{tool, tool_handler, tool_router, ErrorData, ServerHandler};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::backend::{Backend, BackendError, Caller};

mod processes;

/// The network of every sandbox the tools make: the server's default policy (`[network]
/// default`; none when it has none). Tool arguments, which a model writes, never widen it.
fn server_network() -> NetworkRequest {
    NetworkRequest {
        default: true,
        ..Default::default()
    }
}

/// What the sandbox offers, repeated in the descriptions of the tools that run code.
macro_rules! sandbox {
    () => {
        "The sandbox is an isolated Linux container with python3 (numpy, pandas, \
matplotlib, scipy, seaborn, openpyxl), Node.js and bash. It has NO network access unless the \
server's operator allows some hosts (then only those, through the HTTP(S)_PROXY it sets): \
expect nothing to download or install, and use what is there. The working directory is /workspace (256 MiB); \
each execution may take up to 30 s, 512 MiB of memory and 1 CPU; output beyond 1 MiB per \
stream is cut."
    };
}

const RUN_CODE: &str = concat!(
    "Run code in a persistent sandbox session and return its output. Variables, imports, \
functions and files persist from one call to the next, like cells of a Jupyter notebook, so \
load data once and reuse it. The value of the last Python expression is returned, as in \
Jupyter. Plots are returned as images: call plt.show() (or leave a figure as the last \
expression) and each figure comes back as a PNG. An exception comes back as an error with its \
traceback: fix the code and call again (earlier state is kept). ",
    sandbox!()
);

const CREATE_SESSION: &str = concat!(
    "Create a new, empty sandbox session and return its session_id. \
Only needed for a separate, fresh environment or for a language other than Python alongside it: \
run_code and the file tools already use a default session when no session_id is given. Pass \
the session_id to the other tools; close it with close_session when done. A session left idle \
for 10 minutes is closed. ",
    sandbox!()
);

const CLOSE_SESSION: &str = "Close a session made by create_session: its processes, variables \
and /workspace files are gone for good.";

const PAUSE_SESSION: &str = "Pause a session between runs: its processes are frozen and use no \
CPU, its variables, memory and files are kept, and it is not closed for being idle. Only \
resume_session and close_session work on it until it is resumed.";

const RESUME_SESSION: &str = "Resume a paused session: its variables, memory and files are as \
they were when it was paused.";

const WRITE_FILE: &str = "Write a text file into the sandbox's /workspace, creating parent directories and replacing an existing file. \
path is relative to /workspace (e.g. \"data/sales.csv\"); code run afterwards reads it with \
that relative path.";

const READ_FILE: &str = "Read a file from the sandbox's /workspace. Text comes back as text, a PNG as an image; at most 1 MiB is returned.";

const LIST_FILES: &str = "List the files below a directory of the sandbox's /workspace \
(default: all of it), with their sizes in bytes.";

const RUN_COMMAND: &str = concat!(
    "Run a shell command line (bash -c) in the sandbox, e.g. \"ls -la\", \"wc -l data.csv\" or \
\"python3 script.py\". It shares the session's /workspace and limits but not the interpreter's \
variables. Returns stdout, stderr and the exit code; a non-zero exit is reported as an error. ",
    sandbox!()
);

const INSTRUCTIONS: &str = "Corral runs code in locked-down sandboxes. Use run_code for \
Python (state persists between calls in the default session), write_file/read_file/list_files \
for /workspace, run_command for shell commands, start_process/read_process_output/\
send_process_input/kill_process for programs that run in the background (a server, a long \
job). Plots made with matplotlib come back as images \
(plt.show()). The sandbox has no network unless the server's operator allows some hosts.";

/// Largest file `read_file` returns.
const READ_LIMIT: u64 = 1 << 20;

/// Optional parameters as plain types (`"type": "string"`, not a union with null): a model
/// leaves them out, and plain schemas suit every function-calling API.
fn plain_optionals(schema: &mut schemars::Schema) {
    let Some(props) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) else {
        return;
    };
    let null = serde_json::json!("null");
    for prop in props.values_mut() {
        let Some(p) = prop.as_object_mut() else {
            continue;
        };
        if p.get("default") == Some(&serde_json::Value::Null) {
            p.remove("default");
        }
        if let Some(serde_json::Value::Array(types)) = p.get("type") {
            let kept: Vec<_> = types.iter().filter(|t| **t != null).cloned().collect();
            if let [only] = kept.as_slice() {
                p.insert("type".into(), only.clone());
            }
        }
        if let Some(serde_json::Value::Array(values)) = p.get_mut("enum") {
            values.retain(|v| !v.is_null());
        }
        if let Some(serde_json::Value::Array(any)) = p.remove("anyOf") {
            let mut kept: Vec<_> = any
                .into_iter()
                .filter(|s| s.get("type") != Some(&null))
                .collect();
            match (kept.len(), kept.first_mut()) {
                (1, Some(serde_json::Value::Object(inner))) => {
                    for (k, v) in std::mem::take(inner) {
                        p.entry(k).or_insert(v);
                    }
                }
                _ => {
                    p.insert("anyOf".into(), serde_json::Value::Array(kept));
                }
            }
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = plain_optionals)]
pub struct RunCodeParams {
    /// The code to run, e.g. "import pandas as pd\ndf = pd.read_csv('data.csv')\ndf.describe()".
    pub code: String,
    /// python (default), javascript (Node.js) or bash; each language has its own session.
    pub language: Option<Language>,
    /// A session from create_session; omit it to use this connection's default session.
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = plain_optionals)]
pub struct CreateSessionParams {
    /// python (default), javascript or bash.
    pub language: Option<Language>,
    /// The sandbox image; omit it for the default image (the packages listed above).
    pub image: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = plain_optionals)]
pub struct SessionIdParams {
    /// The session_id create_session returned.
    pub session_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = plain_optionals)]
pub struct WriteFileParams {
    /// Path relative to /workspace, e.g. "data.csv" or "out/report.md".
    pub path: String,
    /// The file's text content.
    pub content: String,
    /// A session from create_session; omit it to use this connection's default session.
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = plain_optionals)]
pub struct ReadFileParams {
    /// Path relative to /workspace.
    pub path: String,
    /// A session from create_session; omit it to use this connection's default session.
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = plain_optionals)]
pub struct ListFilesParams {
    /// A directory relative to /workspace; omit it to list the whole workspace.
    pub dir: Option<String>,
    /// A session from create_session; omit it to use this connection's default session.
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = plain_optionals)]
pub struct RunCommandParams {
    /// A shell command line, run by bash -c.
    pub cmd: String,
    /// A session from create_session; omit it to use this connection's default session.
    pub session_id: Option<String>,
    /// Working directory, an absolute path inside the sandbox (default /workspace).
    pub cwd: Option<String>,
    /// Time limit in seconds (default 30).
    pub timeout_s: Option<f64>,
}

/// The sessions one MCP connection made: its default session per language and those it made
/// with `create_session`, all closed when the connection ends.
#[derive(Default)]
pub struct Conn {
    caller: Mutex<Option<Caller>>,
    /// Held while a default session is being created, so concurrent calls share one.
    defaults: tokio::sync::Mutex<HashMap<Language, String>>,
    created: Mutex<Vec<String>>,
    /// The background programs it follows (the process tools).
    processes: processes::Followers,
}

impl Conn {
    /// Binds the connection to the first caller that uses it; another caller is refused.
    fn bind(&self, caller: &Caller) -> Result<(), String> {
        let mut bound = self.caller.lock();
        match &*bound {
            None => {
                *bound = Some(caller.clone());
                Ok(())
            }
            Some(c) if c.tenant == caller.tenant => Ok(()),
            Some(_) => Err("this MCP connection belongs to another API key".into()),
        }
    }

    /// Forgets every session of this connection; returns them, with their caller.
    fn drain(&self) -> Option<(Caller, Vec<String>)> {
        self.processes.forget(None);
        let caller = self.caller.lock().clone()?;
        let mut ids: Vec<String> = std::mem::take(&mut *self.created.lock());
        if let Ok(mut defaults) = self.defaults.try_lock() {
            ids.extend(defaults.drain().map(|(_, id)| id));
        }
        Some((caller, ids))
    }
}

/// Connections that are not tied to a transport connection: stateless streamable HTTP
/// requests (protocol 2026-07-28 has no sessions), grouped by tenant.
#[derive(Default)]
pub struct Conns(Mutex<HashMap<String, Arc<Conn>>>);

impl Conns {
    fn for_tenant(&self, tenant: &Tenant) -> Arc<Conn> {
        self.0.lock().entry(tenant.0.clone()).or_default().clone()
    }
}

/// What every handler of one server shares.
pub struct Shared {
    pub backend: Arc<dyn Backend>,
    /// The code policy every session the tools make asks for (docs/code-policy.md): it
    /// narrows the caller's key's (`corral mcp --allow-module ...`).
    pub policy: Option<PolicyRequest>,
    pub stateless: Conns,
}

impl Shared {
    pub fn new(backend: Arc<dyn Backend>, policy: Option<PolicyRequest>) -> Arc<Shared> {
        Arc::new(Shared {
            backend,
            policy,
            stateless: Conns::default(),
        })
    }

    /// Closes the sessions of every stateless connection (at shutdown).
    pub async fn close_stateless(&self) {
        let conns: Vec<Arc<Conn>> = self.stateless.0.lock().drain().map(|(_, c)| c).collect();
        for conn in conns {
            close_conn(self.backend.clone(), &conn).await;
        }
    }
}

async fn close_conn(backend: Arc<dyn Backend>, conn: &Conn) {
    if let Some((caller, ids)) = conn.drain() {
        let _ = tokio::task::spawn_blocking(move || {
            for id in ids {
                let _ = backend.close_session(&caller, &id);
            }
        })
        .await;
    }
}

/// The MCP server handler: one per stdio connection or streamable-HTTP session (or, for
/// stateless HTTP requests, one per request, sharing state by tenant).
pub struct CorralMcp {
    shared: Arc<Shared>,
    /// This connection's own state (stdio, or an HTTP session with `Mcp-Session-Id`).
    own: Arc<Conn>,
    tool_router: ToolRouter<CorralMcp>,
}

/// The tools as MCP lists them: the one source of the exported function-calling schemas too.
pub fn tool_list() -> Vec<rmcp::model::Tool> {
    CorralMcp::all_tools().list_all()
}

impl Drop for CorralMcp {
    /// The connection ended (a streamable-HTTP session closed, stdio hung up): its sandboxes
    /// are closed, on a thread of their own since the backend blocks.
    fn drop(&mut self) {
        let Some((caller, ids)) = self.own.drain() else {
            return;
        };
        if ids.is_empty() {
            return;
        }
        let backend = self.shared.backend.clone();
        let closing = std::thread::spawn(move || {
            for id in ids {
                let _ = backend.close_session(&caller, &id);
            }
        });
        let _ = closing.join();
    }
}

/// A tool error the model reads (`is_error: true`), not a protocol error.
fn tool_error(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message.into())])
}

/// Removes terminal colour codes (IPython colours its tracebacks).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// An execution result as MCP content: text for output, values and errors, an image per PNG,
/// and the whole result object (docs/results.md) as structured content. Anything but `success` is a
/// tool error.
pub fn execution_content(r: &ExecutionResult, notes: &[String]) -> CallToolResult {
    let mut content = Vec::new();
    for note in notes {
        content.push(ContentBlock::text(note.clone()));
    }
    if !r.stdout.is_empty() {
        let cut = if r.stdout_truncated {
            "\n[stdout truncated]"
        } else {
            ""
        };
        content.push(ContentBlock::text(format!("{}{cut}", r.stdout)));
    }
    if !r.stderr.is_empty() {
        let cut = if r.stderr_truncated {
            "\n[stderr truncated]"
        } else {
            ""
        };
        content.push(ContentBlock::text(format!("stderr:\n{}{cut}", r.stderr)));
    }
    for result in &r.results {
        if let Some(png) = &result.png {
            content.push(ContentBlock::image(png.clone(), "image/png"));
            continue;
        }
        let text = result
            .text
            .as_ref()
            .or(result.markdown.as_ref())
            .or(result.html.as_ref())
            .cloned()
            .or_else(|| result.json.as_ref().map(|j| j.to_string()));
        if let Some(text) = text {
            content.push(ContentBlock::text(text));
        }
    }
    if let Some(e) = &r.error {
        let traceback = strip_ansi(&e.traceback);
        content.push(ContentBlock::text(format!(
            "{}: {}\n{}",
            e.name,
            e.value,
            traceback.trim_end()
        )));
    }
    // The reason, unless the exception above already says it all (a timeout or a memory kill
    // also interrupts the code with an exception, and the reason matters more).
    if r.status != Status::Success && !(r.status == Status::Error && r.error.is_some()) {
        match (&r.error_message, r.exit_code) {
            (Some(m), _) => content.push(ContentBlock::text(m.clone())),
            (None, Some(code)) => content.push(ContentBlock::text(format!("exit code: {code}"))),
            (None, None) => {}
        }
    }
    if content.is_empty() {
        content.push(ContentBlock::text("(no output)"));
    }
    let mut out = if r.status == Status::Success {
        CallToolResult::success(content)
    } else {
        CallToolResult::error(content)
    };
    out.structured_content = serde_json::to_value(r).ok();
    out
}

/// Runs a blocking backend call off the async runtime.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BackendError> + Send + 'static,
) -> Result<T, BackendError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(BackendError::Other(format!("internal error: {e}"))))
}

impl CorralMcp {
    pub fn new(shared: Arc<Shared>) -> CorralMcp {
        CorralMcp {
            shared,
            own: Arc::new(Conn::default()),
            tool_router: Self::all_tools(),
        }
    }

    /// Every tool: those of sessions, code and files, and the process tools.
    fn all_tools() -> ToolRouter<CorralMcp> {
        Self::tool_router() + Self::process_tools()
    }

    /// The code policy a session of `language` asks for: the server's own (`--allow-module`
    /// ...), without its module rules for bash, which has no modules.
    fn policy_for(&self, language: Language) -> Option<PolicyRequest> {
        let policy = self.shared.policy.clone()?;
        Some(match language {
            Language::Bash => PolicyRequest {
                max_code_bytes: policy.max_code_bytes,
                ..PolicyRequest::default()
            },
            Language::Python | Language::Javascript => policy,
        })
    }

    /// Who calls, and the connection state the call belongs to: stdio and HTTP sessions
    /// (`Mcp-Session-Id`) have their own; stateless HTTP requests share their tenant's.
    fn context(&self, ext: &Extensions) -> Result<(Caller, Arc<Conn>), CallToolResult> {
        let parts = ext.get::<http::request::Parts>();
        let caller = parts
            .and_then(|p| p.extensions.get::<Caller>())
            .cloned()
            .unwrap_or_else(Caller::local);
        let conn = match parts {
            Some(p) if !p.headers.contains_key("mcp-session-id") => {
                self.shared.stateless.for_tenant(&caller.tenant)
            }
            _ => self.own.clone(),
        };
        conn.bind(&caller).map_err(tool_error)?;
        Ok((caller, conn))
    }

    fn record(conn: &Conn, id: &str) {
        conn.created.lock().push(id.to_string());
    }

    /// The default session of `language` for `conn`, created when there is none yet (or the
    /// old one expired or died: then a note says so).
    async fn default_session(
        &self,
        caller: &Caller,
        conn: &Conn,
        language: Language,
        replace: Option<&str>,
        notes: &mut Vec<String>,
    ) -> Result<String, BackendError> {
        let mut defaults = conn.defaults.lock().await;
        if let Some(old) = replace {
            if defaults.get(&language).map(String::as_str) == Some(old) {
                defaults.remove(&language);
                // It expired or its kernel died: nothing of it may outlive its replacement
                // (a dead session still holds its sandbox until it is closed).
                let (backend, c, old) =
                    (self.shared.backend.clone(), caller.clone(), old.to_string());
                let _ = blocking(move || backend.close_session(&c, &old)).await;
                notes.push(format!(
                    "note: the previous default {} session had ended (idle timeout or a \
                     killed kernel); this ran in a fresh one, so earlier variables and files \
                     are gone",
                    language.name()
                ));
            }
        }
        if let Some(id) = defaults.get(&language) {
            return Ok(id.clone());
        }
        let backend = self.shared.backend.clone();
        let c = caller.clone();
        let req = CreateSandboxRequest {
            language: Some(language.name().into()),
            policy: self.policy_for(language),
            network: Some(server_network()),
            ..Default::default()
        };
        let info = blocking(move || backend.create_session(&c, &req)).await?;
        defaults.insert(language, info.id.clone());
        Ok(info.id)
    }

    /// Pauses or resumes (`op`) session `id` of this connection's caller: the answer says the
    /// session's state as `done`, or the error.
    async fn change_state(
        &self,
        ext: &Extensions,
        id: String,
        done: &'static str,
        op: impl FnOnce(&dyn Backend, &Caller, &str) -> Result<SandboxInfo, BackendError>
            + Send
            + 'static,
    ) -> ToolResult {
        let (caller, _) = match self.context(ext) {
            Ok(c) => c,
            Err(e) => return Ok(e),
        };
        let backend = self.shared.backend.clone();
        let changed = blocking(move || op(backend.as_ref(), &caller, &id)).await;
        Ok(state_change(changed, done))
    }

    /// Runs `op` on the given session, or on the default one (replaced once if it has ended).
    async fn on_session<T: Send + 'static>(
        &self,
        ext: &Extensions,
        session_id: Option<String>,
        language: Language,
        op: impl Fn(&dyn Backend, &Caller, &str) -> Result<T, BackendError> + Send + Sync + 'static,
    ) -> Result<(T, Vec<String>), CallToolResult> {
        let (caller, conn) = self.context(ext)?;
        let op = Arc::new(op);
        let run = |id: String| {
            let backend = self.shared.backend.clone();
            let caller = caller.clone();
            let op = op.clone();
            blocking(move || op(backend.as_ref(), &caller, &id))
        };
        let mut notes = Vec::new();
        if let Some(id) = session_id {
            return run(id)
                .await
                .map(|t| (t, notes))
                .map_err(|e| tool_error(e.to_string()));
        }
        let id = self
            .default_session(&caller, &conn, language, None, &mut notes)
            .await
            .map_err(|e| tool_error(format!("could not start a sandbox session: {e}")))?;
        match run(id.clone()).await {
            Err(BackendError::NotFound(_) | BackendError::Dead(_)) => {
                let id = self
                    .default_session(&caller, &conn, language, Some(&id), &mut notes)
                    .await
                    .map_err(|e| tool_error(format!("could not start a sandbox session: {e}")))?;
                run(id).await
            }
            other => other,
        }
        .map(|t| (t, notes))
        .map_err(|e| tool_error(e.to_string()))
    }
}

/// `Ok` either way: failures are tool results the model reads.
type ToolResult = Result<CallToolResult, ErrorData>;

/// The answer of pause_session and resume_session: the session's state, or the error.
fn state_change(r: Result<SandboxInfo, BackendError>, done: &str) -> CallToolResult {
    match r {
        Ok(info) => {
            let mut out = CallToolResult::success(vec![ContentBlock::text(format!(
                "{done} {} (state: {})",
                info.id, info.state
            ))]);
            out.structured_content = serde_json::to_value(&info).ok();
            out
        }
        Err(e) => tool_error(e.to_string()),
    }
}

fn flatten(r: Result<CallToolResult, CallToolResult>) -> ToolResult {
    Ok(r.unwrap_or_else(|e| e))
}

#[tool_router]
impl CorralMcp {
    #[tool(description = RUN_CODE)]
    async fn run_code(
        &self,
        Parameters(p): Parameters<RunCodeParams>,
        ext: Extensions,
    ) -> ToolResult {
        let language = p.language.unwrap_or(Language::Python);
        let req = ExecuteRequest {
            code: p.code,
            language: Some(language.name().into()),
            timeout_s: None,
            env: None,
            context: None,
        };
        flatten(
            self.on_session(&ext, p.session_id, language, move |b, c, id| {
                b.execute(c, id, &req)
            })
            .await
            .map(|(r, notes)| execution_content(&r, &notes)),
        )
    }

    #[tool(description = CREATE_SESSION)]
    async fn create_session(
        &self,
        Parameters(p): Parameters<CreateSessionParams>,
        ext: Extensions,
    ) -> ToolResult {
        let (caller, conn) = match self.context(&ext) {
            Ok(c) => c,
            Err(e) => return Ok(e),
        };
        let language = p.language.unwrap_or(Language::Python);
        let req = CreateSandboxRequest {
            language: Some(language.name().into()),
            image: p.image,
            policy: self.policy_for(language),
            network: Some(server_network()),
            ..Default::default()
        };
        let backend = self.shared.backend.clone();
        let created = blocking(move || backend.create_session(&caller, &req)).await;
        Ok(match created {
            Ok(info) => {
                Self::record(&conn, &info.id);
                let mut out = CallToolResult::success(vec![ContentBlock::text(format!(
                    "session_id: {} ({} in image `{}`; working directory /workspace)",
                    info.id, info.language, info.image
                ))]);
                out.structured_content = serde_json::to_value(&info).ok();
                out
            }
            Err(e) => tool_error(format!("could not create a session: {e}")),
        })
    }

    #[tool(description = CLOSE_SESSION)]
    async fn close_session(
        &self,
        Parameters(p): Parameters<SessionIdParams>,
        ext: Extensions,
    ) -> ToolResult {
        let (caller, conn) = match self.context(&ext) {
            Ok(c) => c,
            Err(e) => return Ok(e),
        };
        conn.created.lock().retain(|id| *id != p.session_id);
        conn.defaults
            .lock()
            .await
            .retain(|_, id| *id != p.session_id);
        conn.processes.forget(Some(&p.session_id));
        let backend = self.shared.backend.clone();
        let id = p.session_id.clone();
        Ok(
            match blocking(move || backend.close_session(&caller, &id)).await {
                Ok(()) => CallToolResult::success(vec![ContentBlock::text(format!(
                    "closed {}",
                    p.session_id
                ))]),
                Err(e) => tool_error(e.to_string()),
            },
        )
    }

    #[tool(description = PAUSE_SESSION)]
    async fn pause_session(
        &self,
        Parameters(p): Parameters<SessionIdParams>,
        ext: Extensions,
    ) -> ToolResult {
        self.change_state(&ext, p.session_id, "paused", |b, c, id| {
            b.pause_session(c, id)
        })
        .await
    }

    #[tool(description = RESUME_SESSION)]
    async fn resume_session(
        &self,
        Parameters(p): Parameters<SessionIdParams>,
        ext: Extensions,
    ) -> ToolResult {
        self.change_state(&ext, p.session_id, "resumed", |b, c, id| {
            b.resume_session(c, id)
        })
        .await
    }

    #[tool(description = WRITE_FILE)]
    async fn write_file(
        &self,
        Parameters(p): Parameters<WriteFileParams>,
        ext: Extensions,
    ) -> ToolResult {
        let (path, content) = (p.path, p.content);
        flatten(
            self.on_session(&ext, p.session_id, Language::Python, move |b, c, id| {
                b.write_file(c, id, &path, content.as_bytes())
            })
            .await
            .map(|(entry, notes)| {
                let mut text = notes;
                text.push(format!(
                    "wrote /workspace/{} ({} bytes)",
                    entry.path, entry.size
                ));
                let mut out =
                    CallToolResult::success(text.into_iter().map(ContentBlock::text).collect());
                out.structured_content = serde_json::to_value(&entry).ok();
                out
            }),
        )
    }

    #[tool(description = READ_FILE)]
    async fn read_file(
        &self,
        Parameters(p): Parameters<ReadFileParams>,
        ext: Extensions,
    ) -> ToolResult {
        let path = p.path.clone();
        flatten(
            self.on_session(&ext, p.session_id, Language::Python, move |b, c, id| {
                b.read_file(c, id, &path, READ_LIMIT)
            })
            .await
            .map(|((data, more), notes)| {
                let mut content: Vec<ContentBlock> =
                    notes.into_iter().map(ContentBlock::text).collect();
                if data.starts_with(b"\x89PNG\r\n\x1a\n") && !more {
                    content.push(ContentBlock::image(
                        base64::engine::general_purpose::STANDARD.encode(&data),
                        "image/png",
                    ));
                } else {
                    match String::from_utf8(data) {
                        Ok(text) => content.push(ContentBlock::text(text)),
                        Err(e) => content.push(ContentBlock::text(format!(
                            "{} is binary ({} bytes read); its bytes in base64:\n{}",
                            p.path,
                            e.as_bytes().len(),
                            base64::engine::general_purpose::STANDARD.encode(e.as_bytes())
                        ))),
                    }
                    if more {
                        content.push(ContentBlock::text(format!(
                            "[truncated: only the first {READ_LIMIT} bytes are shown; use \
                             run_code or run_command to look at the rest]"
                        )));
                    }
                }
                CallToolResult::success(content)
            }),
        )
    }

    #[tool(description = LIST_FILES)]
    async fn list_files(
        &self,
        Parameters(p): Parameters<ListFilesParams>,
        ext: Extensions,
    ) -> ToolResult {
        let dir = p.dir;
        flatten(
            self.on_session(&ext, p.session_id, Language::Python, move |b, c, id| {
                b.list_files(c, id, dir.as_deref())
            })
            .await
            .map(|(files, notes)| {
                let mut text: Vec<String> = notes;
                text.push(if files.is_empty() {
                    "(no files)".into()
                } else {
                    files
                        .iter()
                        .map(|f| format!("{}\t{} bytes", f.path, f.size))
                        .collect::<Vec<_>>()
                        .join("\n")
                });
                let mut out =
                    CallToolResult::success(text.into_iter().map(ContentBlock::text).collect());
                out.structured_content = Some(serde_json::json!({ "files": files }));
                out
            }),
        )
    }

    #[tool(description = RUN_COMMAND)]
    async fn run_command(
        &self,
        Parameters(p): Parameters<RunCommandParams>,
        ext: Extensions,
    ) -> ToolResult {
        let req = CommandRequest {
            cmd: p.cmd,
            args: None,
            cwd: p.cwd,
            env: None,
            timeout_s: p.timeout_s,
        };
        flatten(
            self.on_session(&ext, p.session_id, Language::Python, move |b, c, id| {
                b.run_command(c, id, &req)
            })
            .await
            .map(|(r, notes)| execution_content(&r, &notes)),
        )
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for CorralMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("corral", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_sandbox::{LanguageError, RichResult};

    #[test]
    fn a_language_is_one_of_three_plain_strings_in_the_tools_schemas() {
        let schema = serde_json::to_value(schemars::schema_for!(RunCodeParams)).unwrap();
        assert_eq!(
            schema["properties"]["language"],
            serde_json::json!({
                "description": "python (default), javascript (Node.js) or bash; each language \
                                has its own session.",
                "type": "string",
                "enum": ["python", "javascript", "bash"],
            })
        );
        let params: RunCodeParams =
            serde_json::from_value(serde_json::json!({"code": "1", "language": "javascript"}))
                .unwrap();
        assert_eq!(params.language, Some(Language::Javascript));
        assert!(serde_json::from_value::<RunCodeParams>(
            serde_json::json!({"code": "1", "language": "ruby"})
        )
        .is_err());
    }

    #[test]
    fn ansi_codes_are_removed() {
        assert_eq!(
            strip_ansi("\u{1b}[0;31mZeroDivisionError\u{1b}[0m: x"),
            "ZeroDivisionError: x"
        );
    }

    #[test]
    fn results_become_text_images_and_structured_content() {
        let mut r = ExecutionResult::sandbox_error("");
        r.status = Status::Error;
        r.error_message = Some("the code raised ZeroDivisionError".into());
        r.stdout = "hi\n".into();
        r.results = vec![
            RichResult {
                png: Some("iVBORw0KGgo=".into()),
                text: Some("<Figure>".into()),
                ..Default::default()
            },
            RichResult {
                is_main_result: true,
                text: Some("42".into()),
                ..Default::default()
            },
        ];
        r.error = Some(LanguageError {
            name: "ZeroDivisionError".into(),
            value: "division by zero".into(),
            traceback: "Traceback...\n".into(),
            violations: Vec::new(),
        });
        let out = execution_content(&r, &[]);
        assert_eq!(out.is_error, Some(true));
        let json = serde_json::to_value(&out).unwrap();
        let content = json["content"].as_array().unwrap();
        assert_eq!(content[0]["text"], "hi\n");
        assert_eq!(content[1]["type"], "image");
        assert_eq!(content[1]["mimeType"], "image/png");
        assert_eq!(content[2]["text"], "42");
        assert!(content[3]["text"]
            .as_str()
            .unwrap()
            .starts_with("ZeroDivisionError: division by zero\nTraceback"));
        assert_eq!(json["structuredContent"]["status"], "error");
    }
}
