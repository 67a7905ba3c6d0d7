//! Corral's isolation engine.
//!
//! [`Sandbox::create`] builds a disposable sandbox (docs/baseline.md): new user, pid, mount, net,
//! ipc, uts and cgroup namespaces; a read-only root assembled from an image; fresh `/proc`,
//! minimal `/dev`, size-limited tmpfs `/tmp` and `/workspace`; cgroup (v1 or v2) or rlimit
//! limits; and for the program itself no capabilities, `no_new_privs`, Landlock and a
//! seccomp allow-list. [`Sandbox::wait`] runs it under a wall-clock limit; dropping the
//! sandbox leaves nothing behind. This crate is synchronous and holds all of Corral's `unsafe`.

pub mod agent;
mod agent_fork;
pub mod budget;
pub mod cgroup;
mod charge;
mod child;
pub mod doctor;
pub mod env;
pub mod ids;
mod landlock_rules;
pub mod limits;
pub mod lockdown;
mod owner;
pub mod ports;
pub mod result;
pub mod rootfs;
mod sandbox;
pub mod seccomp;
pub mod session;
pub mod setup;
pub mod subids;
pub use sys::{
    end_quietly_on_closed_pipe, recv_message, recv_with_credentials, send_fds, Received,
};
#[cfg(test)]
mod seccomp_profile;
mod sparse;
pub mod spec;
mod sys;
pub mod workspace;

pub use budget::{Reservation, ResultBudget};
pub use charge::Charge;
pub use corral_egress::{Egress, NetworkPolicy, NetworkReport};
pub use ids::{caller_uid_warning, host_ids, HostIds, ROOT_MODE_ID_BASE};
pub use limits::{LimitError, LimitField};
pub use owner::Owner;
pub use result::{
    ExecutionResult, FileEntry, LanguageError, RichResult, Status, Violation, ViolationRule,
    POLICY_VIOLATION,
};
pub use sandbox::{
    cgroup_layout, children_peak_memory, hit_rlimit_data, landlock_warning, rlimit_data_message,
    run, sandbox_cgroup, sweep_stale_cgroups_once, unique_name, wait_for_program, Capture, Finish,
    Outcome, Report, Sandbox, SandboxError, SocketSink, Stream, Supervised,
};
pub use spec::{
    workload_rlimits, ControlSocket, InputFile, Limits, Policy, Role, Rootfs, SandboxSpec,
    CORE_LIMIT, ROOTLESS_INOTIFY_LIMITS,
};
pub use workspace::{Workspace, WorkspaceError};
