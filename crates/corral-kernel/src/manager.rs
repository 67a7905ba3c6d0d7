//! Sessions by id, as the server and the MCP server use them: create (from the warm pool
//! where possible), execute, run commands, interrupt, restart, close, list, inspect, and
//! idle expiry.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use corral_sandbox::egress::EgressMonitor;
use corral_sandbox::{ExecutionResult, NetworkReport, Workspace};

use crate::event::Event;
use crate::pool::Pool;
use crate::session::{Interrupter, KernelError, Session, SessionOptions, Stopper};

/// What a caller may see of a session.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionInfo {
    pub id: String,
    pub language: &'static str,
    pub created_at: SystemTime,
    pub last_used: SystemTime,
    pub idle_timeout: Duration,
    pub executions: u64,
    /// `None` while alive; why it died otherwise.
    pub death: Option<String>,
    /// Protections weaker than requested for this session.
    pub warnings: Vec<String>,
    /// What its egress proxy has done since the kernel started (none without a network
    /// policy).
    pub network: Option<NetworkReport>,
}

struct Entry {
    session: Mutex<Session>,
    interrupter: Interrupter,
    /// The session's workspace, reachable without waiting for the session's lock (a restart
    /// replaces it).
    workspace: Mutex<Workspace>,
    info: Mutex<SessionInfo>,
    last_used: Mutex<Instant>,
    /// Reads the session's egress report without waiting for the session (a restart
    /// replaces it).
    network: Mutex<Option<EgressMonitor>>,
}

impl Entry {
    /// The session's info, with its egress report as of now.
    fn info(&self) -> SessionInfo {
        let mut info = self.info.lock().expect("lock").clone();
        info.network = self
            .network
            .lock()
            .expect("lock")
            .as_ref()
            .map(EgressMonitor::report);
        info
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error("no session {0}")]
    NotFound(String),
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

/// All live sessions of a process.
pub struct SessionManager {
    sessions: Mutex<HashMap<String, Arc<Entry>>>,
    pools: Mutex<Vec<Arc<Pool>>>,
    next: AtomicU64,
}

impl SessionManager {
    /// A manager whose background thread closes sessions idle past their timeout.
    pub fn new() -> Arc<SessionManager> {
        let manager = Arc::new(SessionManager {
            sessions: Mutex::new(HashMap::new()),
            pools: Mutex::new(Vec::new()),
            next: AtomicU64::new(1),
        });
        let weak = Arc::downgrade(&manager);
        thread::Builder::new()
            .name("corral-idle".into())
            .spawn(move || expire_idle(weak))
            .expect("spawning the idle reaper");
        manager
    }

    /// Serves Python sessions on the pool's image from it.
    pub fn add_pool(&self, pool: Arc<Pool>) {
        self.pools.lock().expect("lock").push(pool);
    }

    /// Closes every session and tears every pool down (see [`Pool::shutdown`]): nothing of
    /// this manager's is left on the host.
    pub fn shutdown(&self) {
        let ids: Vec<String> = self
            .sessions
            .lock()
            .expect("lock")
            .keys()
            .cloned()
            .collect();
        for id in ids {
            let _ = self.close(&id);
        }
        let pools: Vec<Arc<Pool>> = self.pools.lock().expect("lock").drain(..).collect();
        for pool in pools {
            pool.shutdown();
        }
    }

    pub fn create(
        &self,
        options: &SessionOptions,
        idle_timeout: Duration,
    ) -> Result<SessionInfo, ManagerError> {
        let pool = self
            .pools
            .lock()
            .expect("lock")
            .iter()
            .find(|p| p.serves(options))
            .cloned();
        let mut session = match pool {
            Some(pool) => pool.acquire(options)?,
            None => Session::create(options)?,
        };
        // A pooled session was made before its owner was known.
        session.set_result_budget(options.result_budget.clone());
        let id = format!(
            "sbx-{:x}{:04x}",
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
                & 0xffff_ffff,
            self.next.fetch_add(1, Ordering::Relaxed) & 0xffff
        );
        let now = SystemTime::now();
        let info = SessionInfo {
            id: id.clone(),
            language: session.language().name(),
            created_at: now,
            last_used: now,
            idle_timeout,
            executions: 0,
            death: None,
            warnings: session.warnings().to_vec(),
            network: None,
        };
        let entry = Arc::new(Entry {
            network: Mutex::new(session.network_monitor()),
            interrupter: session.interrupter(),
            workspace: Mutex::new(session.workspace().clone()),
            session: Mutex::new(session),
            info: Mutex::new(info.clone()),
            last_used: Mutex::new(Instant::now()),
        });
        let info = entry.info();
        self.sessions.lock().expect("lock").insert(id, entry);
        Ok(info)
    }

    fn entry(&self, id: &str) -> Result<Arc<Entry>, ManagerError> {
        self.sessions
            .lock()
            .expect("lock")
            .get(id)
            .cloned()
            .ok_or_else(|| ManagerError::NotFound(id.to_string()))
    }

    /// Runs code in session `id`; executions in one session are serialized.
    pub fn execute(
        &self,
        id: &str,
        code: &str,
        timeout: Duration,
        on_event: &mut dyn FnMut(&Event),
    ) -> Result<ExecutionResult, ManagerError> {
        let entry = self.entry(id)?;
        let mut session = entry.session.lock().expect("session lock");
        let result = session.execute(code, timeout, on_event);
        *entry.last_used.lock().expect("lock") = Instant::now();
        let mut info = entry.info.lock().expect("lock");
        info.last_used = SystemTime::now();
        info.executions = session.executions();
        info.death = session.death().map(|d| d.message.clone());
        Ok(result)
    }

    /// Runs a program in session `id`'s sandbox (see [`Session::run_command`]); serialized
    /// with its executions, and stopped by `stop` whether it waits for them or runs. It does
    /// not count as an execution.
    #[allow(clippy::too_many_arguments)]
    pub fn run_command(
        &self,
        id: &str,
        argv: &[String],
        cwd: Option<&str>,
        env: &[(String, String)],
        timeout: Duration,
        stop: &Stopper,
        on_event: &mut dyn FnMut(&Event),
    ) -> Result<ExecutionResult, ManagerError> {
        let entry = self.entry(id)?;
        let mut session = entry.session.lock().expect("session lock");
        let result = session.run_command(argv, cwd, env, timeout, stop, on_event)?;
        *entry.last_used.lock().expect("lock") = Instant::now();
        let mut info = entry.info.lock().expect("lock");
        info.last_used = SystemTime::now();
        info.death = session.death().map(|d| d.message.clone());
        Ok(result)
    }

    /// Interrupts the running execution of session `id`, if any.
    pub fn interrupt(&self, id: &str) -> Result<(), ManagerError> {
        self.entry(id)?.interrupter.interrupt();
        Ok(())
    }

    /// Sets how long session `id` may stay idle from now on.
    pub fn set_idle_timeout(&self, id: &str, idle_timeout: Duration) -> Result<(), ManagerError> {
        self.entry(id)?.info.lock().expect("lock").idle_timeout = idle_timeout;
        Ok(())
    }

    /// Replaces the kernel of session `id` (state is lost, files are kept).
    pub fn restart(&self, id: &str) -> Result<SessionInfo, ManagerError> {
        let entry = self.entry(id)?;
        let mut session = entry.session.lock().expect("session lock");
        session.restart()?;
        *entry.workspace.lock().expect("lock") = session.workspace().clone();
        *entry.network.lock().expect("lock") = session.network_monitor();
        {
            let mut info = entry.info.lock().expect("lock");
            info.death = None;
            info.executions = 0;
        }
        Ok(entry.info())
    }

    /// The workspace of session `id` (for the files API). It is not the session: using it
    /// neither waits for the session's executions nor holds them up, and closing the session
    /// meanwhile kills whatever is writing into it.
    pub fn workspace(&self, id: &str) -> Result<Workspace, ManagerError> {
        Ok(self.entry(id)?.workspace.lock().expect("lock").clone())
    }

    /// Closes session `id`: its sandbox is torn down and nothing of it remains.
    pub fn close(&self, id: &str) -> Result<(), ManagerError> {
        let entry = self
            .sessions
            .lock()
            .expect("lock")
            .remove(id)
            .ok_or_else(|| ManagerError::NotFound(id.to_string()))?;
        entry.interrupter.interrupt();
        drop(entry.session.lock().expect("session lock"));
        Ok(())
    }

    pub fn get(&self, id: &str) -> Result<SessionInfo, ManagerError> {
        Ok(self.entry(id)?.info())
    }

    pub fn list(&self) -> Vec<SessionInfo> {
        let entries: Vec<Arc<Entry>> = self
            .sessions
            .lock()
            .expect("lock")
            .values()
            .cloned()
            .collect();
        let mut infos: Vec<SessionInfo> = entries.iter().map(|e| e.info()).collect();
        infos.sort_by(|a, b| a.id.cmp(&b.id));
        infos
    }

    /// Closes every session idle longer than its timeout; returns how many.
    pub fn expire_idle(&self) -> usize {
        let expired: Vec<String> = self
            .sessions
            .lock()
            .expect("lock")
            .iter()
            .filter(|(_, e)| {
                let idle = e.last_used.lock().expect("lock").elapsed();
                // A session busy executing holds its lock; it is not idle.
                e.session.try_lock().is_ok() && idle > e.info.lock().expect("lock").idle_timeout
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            let _ = self.close(id);
        }
        expired.len()
    }
}

fn expire_idle(manager: Weak<SessionManager>) {
    loop {
        thread::sleep(Duration::from_secs(1));
        match manager.upgrade() {
            Some(m) => {
                m.expire_idle();
            }
            None => return,
        }
    }
}
