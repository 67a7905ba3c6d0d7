//! The HTTP wire items that every face of Corral shares (`corral serve`, `corral mcp
//! --listen`, `corral route`): the native and E2B error bodies, how a request presents its
//! key, the header that names a sandbox, the lines of a program's output stream, the body
//! helper of every server, the server loop and the signal that ends it. It depends on no face.

pub mod e2b;
pub mod error;
pub mod keys;
mod linger;
pub mod output;
mod serve;
mod shutdown;

pub use linger::close_if_body_unread;
pub use serve::serve_app;
pub use shutdown::shutdown_signal;
