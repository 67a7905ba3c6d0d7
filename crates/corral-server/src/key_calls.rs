//! Each key's share of the calls that hold one of the server's blocking threads while they
//! wait on a sandbox: an execution or command (running, or waiting for its sandbox's turn), a
//! restart, a resume, a code context's start or restart, a program's start. Each holds a
//! thread of tokio's blocking pool (512, shared by every key, and used by every request's
//! authentication too) for as long as it lasts. The bounds per sandbox (one running and
//! [`corral_kernel::MAX_WAITING`] waiting per session and per code context, eight requests per
//! process agent) add up across a key's sandboxes: twelve sessions with eight contexts each,
//! every kernel running a long cell with four more waiting, held every thread, and no other
//! key's request was even authenticated until they ended. A key holds at most [`PER_KEY`] such
//! calls at once; more are refused at once (503 `key_busy`, `Retry-After: 1`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::service::{ServiceError, Tenant, Unavailability};

/// The blocking threads of the server's runtime (tokio's default).
pub const BLOCKING_THREADS: usize = 512;
/// The most such calls one key holds at once: half of the pool, as one key's one-shot runs
/// take at most half of the run slots.
pub const PER_KEY: usize = BLOCKING_THREADS / 2;

/// The calls each key holds now.
#[derive(Debug, Default)]
pub struct KeyCalls {
    by_key: Arc<Mutex<HashMap<String, usize>>>,
}

/// A call counted against its key until it is dropped.
#[derive(Debug)]
pub struct KeyCall {
    by_key: Arc<Mutex<HashMap<String, usize>>>,
    key: String,
}

impl KeyCalls {
    /// Counts a call of `tenant`'s: refused when the key holds [`PER_KEY`] already.
    pub fn enter(&self, tenant: &Tenant) -> Result<KeyCall, ServiceError> {
        let mut by_key = self.by_key.lock().expect("lock");
        let held = by_key.entry(tenant.0.clone()).or_default();
        if *held >= PER_KEY {
            return Err(ServiceError::Unavailable {
                reason: Unavailability::KeyBusy,
                message: format!(
                    "this key has {PER_KEY} calls waiting on its sandboxes already (executions, \
                     commands, restarts, resumes, starts), the most one key may: retry when one \
                     has ended"
                ),
                retry_after_s: 1,
            });
        }
        *held += 1;
        Ok(KeyCall {
            by_key: self.by_key.clone(),
            key: tenant.0.clone(),
        })
    }

    /// The calls `tenant` holds now.
    #[cfg(test)]
    fn held(&self, tenant: &Tenant) -> usize {
        self.by_key
            .lock()
            .expect("lock")
            .get(&tenant.0)
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for KeyCall {
    fn drop(&mut self) {
        let mut by_key = self.by_key.lock().expect("lock");
        if let Some(held) = by_key.get_mut(&self.key) {
            *held -= 1;
            if *held == 0 {
                by_key.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_holds_at_most_its_share_and_others_keep_theirs() {
        let calls = KeyCalls::default();
        let (a, b) = (Tenant("key-a".into()), Tenant("key-b".into()));
        let held: Vec<KeyCall> = (0..PER_KEY).map(|_| calls.enter(&a).unwrap()).collect();
        assert!(matches!(
            calls.enter(&a),
            Err(ServiceError::Unavailable {
                reason: Unavailability::KeyBusy,
                ..
            })
        ));
        let b_call = calls.enter(&b).unwrap();
        assert_eq!((calls.held(&a), calls.held(&b)), (PER_KEY, 1));
        drop(held);
        drop(b_call);
        assert_eq!((calls.held(&a), calls.held(&b)), (0, 0));
        assert!(calls.enter(&a).is_ok());
    }
}
