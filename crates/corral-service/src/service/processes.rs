//! Programs in a session's sandbox beside its interpreter, through the session's process
//! agent ([`corral_kernel::agent`]): started, listed, connected to, fed input, resized and
//! signalled, by the session's owner only.

use std::sync::Arc;

use corral_kernel::agent::{AgentError, ProcessAgent, ProcessSpec, Subscription};

use super::{Admitted, Service, ServiceError};
use crate::db::AuditEntry;

impl Service {
    /// The process agent of `tenant`'s running session `id` (another tenant's session is
    /// "not found", a paused one a conflict).
    pub fn process_agent(
        &self,
        call: &Admitted,
        id: &str,
    ) -> Result<Arc<ProcessAgent>, ServiceError> {
        self.check_running()?;
        self.check_session(call.tenant(), id)?;
        self.manager
            .agent(id)
            .map_err(|e| self.manager_error(id, e))
    }

    /// Starts a program in session `id`; the subscription streams all of its output, held in
    /// the key's share of the server's output bytes. The start is written to the audit log
    /// (kind `process`).
    pub fn start_process(
        &self,
        call: &Admitted,
        id: &str,
        spec: ProcessSpec,
    ) -> Result<(Arc<ProcessAgent>, Subscription), ServiceError> {
        let tenant = call.tenant();
        let agent = self.process_agent(call, id)?;
        let line = spec.argv.join(" ");
        let started = agent.start(spec, &self.output_share(tenant));
        let entry = AuditEntry {
            key_id: &tenant.0,
            session_id: Some(id),
            kind: "process",
            code: &line,
            status: if started.is_ok() {
                "started"
            } else {
                "refused"
            },
            execution_time_ms: 0,
            cpu_time_ms: 0,
            peak_memory_bytes: 0,
        };
        if let Err(e) = self.db.audit(&entry) {
            eprintln!("corral: audit log: {e}");
        }
        Ok((agent, started?))
    }
}

impl From<AgentError> for ServiceError {
    fn from(e: AgentError) -> ServiceError {
        ServiceError::Process(e)
    }
}
