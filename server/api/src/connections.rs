//! Live connections of this replica, by principal: so that revoking a credential or
//! disabling a user closes their connections at once (every replica hears the revocation
//! through `LISTEN berth_revoke`), and so that connections per credential are bounded.

use std::{
    collections::HashMap,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use berth_store::Principal;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
pub struct Connections {
    next: AtomicU64,
    live: Mutex<HashMap<u64, Entry>>,
}

struct Entry {
    credential_id: String,
    user_id: Option<String>,
    close: CancellationToken,
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
        live.insert(
            id,
            Entry {
                credential_id: principal.credential_id.clone(),
                user_id: principal.user_id.clone(),
                close,
            },
        );
        Some(id)
    }

    pub fn unregister(&self, id: u64) {
        self.live.lock().expect("connections lock").remove(&id);
    }

    /// Whether the credential has room for one more connection on this replica.
    pub fn has_room(&self, credential_id: &str, max: usize) -> bool {
        let live = self.live.lock().expect("connections lock");
        live.values().filter(|e| e.credential_id == credential_id).count() < max
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
