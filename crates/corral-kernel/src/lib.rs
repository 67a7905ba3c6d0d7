//! Stateful interpreter sessions on top of `corral-sandbox`: kernels for Python (IPython),
//! JavaScript (Node) and bash running inside sandboxes, the framed protocol to them, and the
//! one-shot runner that returns rich results.

pub mod agent;
pub mod bytecode;
pub mod context;
pub mod event;
pub mod imports;
pub mod manager;
pub mod node;
pub mod oneshot;
pub mod policy;
pub mod pool;
pub mod protocol;
mod runtime;
pub mod session;
pub mod zygote;

pub use event::{End, Event};
pub use manager::{
    default_context_id, ContextInfo, ManagerError, MetricSample, SessionInfo, SessionManager,
    MAX_WAITING,
};
pub use node::NodeName;
pub use policy::{CodePolicy, PolicyError, Widening};
pub use pool::{Pool, ZygoteStatus};
pub use session::{Death, Interrupter, KernelError, Language, Session, SessionOptions, Stopper};
pub use zygote::{Zygote, ZygoteKind};
