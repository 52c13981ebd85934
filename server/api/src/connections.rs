//! Live connections of this replica, by principal: so that revoking a credential or
//! disabling a user closes their connections at once (every replica hears the revocation
//! through `LISTEN berth_revoke`), so that expired credentials and login tokens close when
//! they expire, and so that connections per credential are bounded.

use std::{
    collections::HashMap,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use berth_store::Principal;
use tokio_util::sync::CancellationToken;

use crate::AppState;

#[derive(Default)]
pub struct Connections {
    next: AtomicU64,
    live: Mutex<HashMap<u64, Entry>>,
}

struct Entry {
    credential_id: String,
    user_id: Option<String>,
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
    close: CancellationToken,
}

/// A registered connection that unregisters itself when dropped.
pub struct Registration {
    state: AppState,
    id: u64,
}

impl Registration {
    pub fn new(state: &AppState, principal: &Principal, max: usize, close: CancellationToken) -> Option<Registration> {
        let id = state.connections.register(principal, max, close)?;
        verify_soon(state, Some(principal));
        Some(Registration {
            state: state.clone(),
            id,
        })
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.state.connections.unregister(self.id);
    }
}

/// Re-check live connections right away — those of `principal`, or all of them. A
/// revocation that committed between a connection's authentication and its registration
/// would otherwise have found nothing to close, and so would one sent while the LISTEN
/// connection was down.
pub fn verify_soon(state: &AppState, principal: Option<&Principal>) {
    let state = state.clone();
    let only = principal.map(|p| (p.credential_id.clone(), p.user_id.clone()));
    tokio::spawn(async move { state.connections.revalidate(&state, only).await });
}

impl Connections {
    /// Register a connection of `principal` whose `close` token is cancelled on revocation,
    /// unless the credential already has `max` connections on this replica. Returns the
    /// registration id for [`Connections::unregister`].
    pub fn register(&self, principal: &Principal, max: usize, close: CancellationToken) -> Option<u64> {
        let mut live = self.live.lock().expect("connections lock");
        let count = live
            .values()
            .filter(|e| e.credential_id == principal.credential_id)
            .count();
        if count >= max {
            return None;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let entry = Entry {
            credential_id: principal.credential_id.clone(),
            user_id: principal.user_id.clone(),
            expires_at: principal.expires_at,
            close,
        };
        live.insert(id, entry);
        Some(id)
    }

    pub fn unregister(&self, id: u64) {
        self.live.lock().expect("connections lock").remove(&id);
    }

    /// Wait until every connection has unregistered (each does so after its own cleanup,
    /// e.g. a worker's turns recorded `interrupted`), for at most `grace`. Shutdown waits
    /// for this before the database may go away. Returns whether all were gone in time.
    pub async fn drained(&self, grace: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            if self.live.lock().expect("connections lock").is_empty() {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Whether the credential has room for one more connection on this replica.
    pub fn has_room(&self, credential_id: &str, max: usize) -> bool {
        let live = self.live.lock().expect("connections lock");
        live.values().filter(|e| e.credential_id == credential_id).count() < max
    }

    /// Close connections whose principal is no longer valid: expired, or revoked or
    /// disabled (in case the revocation notice was missed).
    pub async fn revalidate(&self, state: &AppState, only: Option<(String, Option<String>)>) {
        let now = chrono::Utc::now();
        let (creds, users) = if let Some((cred, user)) = only {
            let creds = if cred.starts_with("jwt:") {
                Vec::new()
            } else {
                vec![cred]
            };
            (creds, user.into_iter().collect())
        } else {
            let live = self.live.lock().expect("connections lock");
            for e in live.values() {
                if e.expires_at.is_some_and(|t| t <= now) {
                    e.close.cancel();
                }
            }
            let creds: Vec<String> = live
                .values()
                .filter(|e| !e.credential_id.starts_with("jwt:"))
                .map(|e| e.credential_id.clone())
                .collect();
            let users: Vec<String> = live.values().filter_map(|e| e.user_id.clone()).collect();
            (creds, users)
        };
        if creds.is_empty() && users.is_empty() {
            return;
        }
        match state.store.invalid_principals(&creds, &users).await {
            Ok((creds, users)) => {
                for c in creds {
                    self.revoke(&format!("cred:{c}"));
                }
                for u in users {
                    self.revoke(&format!("user:{u}"));
                }
            }
            Err(e) => tracing::warn!(error = %e, "revalidating connections failed"),
        }
    }

    /// A revocation from `berth_revoke`: `cred:<id>` or `user:<id>`. Returns how many closed.
    pub fn revoke(&self, payload: &str) -> usize {
        let live = self.live.lock().expect("connections lock");
        let matches: Vec<&Entry> = match payload.split_once(':') {
            Some(("cred", id)) => live.values().filter(|e| e.credential_id == id).collect(),
            Some(("user", id)) => live.values().filter(|e| e.user_id.as_deref() == Some(id)).collect(),
            _ => Vec::new(),
        };
        for e in &matches {
            e.close.cancel();
        }
        matches.len()
    }
}
