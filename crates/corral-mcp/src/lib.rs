//! Corral's MCP server (docs/mcp.md): sandbox tools for agents over stdio and streamable HTTP,
//! backed by an in-process [`corral_service::Service`] or a running `corral serve`, plus the
//! same tools as function-calling definitions for OpenAI- and Anthropic-style APIs.

pub mod backend;
pub mod http;
pub mod schema;
pub mod tools;

pub use backend::{Backend, BackendError, Caller, InProcess, Remote};
pub use tools::{CorralMcp, Shared};

/// Serves the tools on stdin/stdout until the client hangs up; the connection's sessions are
/// closed when its handler is dropped, before this returns.
pub async fn serve_stdio(shared: std::sync::Arc<Shared>) -> Result<(), McpError> {
    use rmcp::ServiceExt as _;
    let running = CorralMcp::new(shared)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| McpError::Stdio(e.to_string()))?;
    running
        .waiting()
        .await
        .map_err(|e| McpError::Stdio(e.to_string()))?;
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("MCP over stdio: {0}")]
    Stdio(String),
}
