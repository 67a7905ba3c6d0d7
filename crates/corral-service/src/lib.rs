//! Corral's service: what every face (the native HTTP API, the E2B-compatible face, MCP)
//! calls, whatever its transport. It holds tenants and their admission, the sandboxes and
//! the work done in them, the audit log, saved sandboxes and the counters of metrics. The
//! engine is synchronous: a face admits a tenant's call ([`Service::admit`]) and runs it on a
//! blocking thread of its own runtime.

pub mod admission;
pub mod config;
pub mod db;
pub mod metrics;
pub mod network;
pub mod persist;
pub mod service;
pub mod threads;
pub mod watch;

pub use config::Config;
pub use service::{Admitted, Service, ServiceError, Tenant};
