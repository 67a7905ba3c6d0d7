//! The lines of a program's output stream, as `corral serve` writes them and `corral mcp
//! --server` reads them back.

use serde::{Deserialize, Serialize};

/// A line of a program's output stream (read back by `corral mcp --server`).
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputEvent {
    /// First: the program runs, with this pid inside the sandbox.
    Start {
        pid: i32,
    },
    /// Output, in base64.
    Stdout {
        data: String,
    },
    Stderr {
        data: String,
    },
    /// A terminal's output (a program started with `pty`).
    Pty {
        data: String,
    },
    /// Output this stream did not read in time and that was dropped.
    Lost {
        bytes: u64,
    },
    /// Nothing happened for 20 s.
    Keepalive,
    /// Last: how the program ended; `error` when the sandbox's process agent went away first.
    End {
        exit_code: Option<i32>,
        signal: Option<i32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
}
