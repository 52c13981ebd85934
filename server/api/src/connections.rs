//! Live connections of this replica, by principal: so that revoking a credential or
//! disabling a user closes their connections at once (every replica hears the revocation
//! through `LISTEN berth_revoke`), so that expired credentials and login tokens close when
//! they expire, and so that connections per credential are bounded. It also counts
//! connections that have not authenticated yet, per source address.
//!
//! Every count here is per replica: a client spread over N replicas may hold N times each
//! limit.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{
        Arc, Mutex,
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
    /// Connections not authenticated yet, by source address.
    pending: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

struct Entry {
    /// What the per-credential limit counts: the credential, or for login tokens the user
    /// (each login mints a new token; they must not multiply the limit).
    key: String,
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
    /// This registration's id in the registry.
    pub fn id(&self) -> u64 {
        self.id
    }

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

/// The key the per-credential connection limit counts under.
pub fn limit_key(principal: &Principal) -> String {
    match (&principal.user_id, principal.credential_id.starts_with("jwt:")) {
        (Some(user), true) => format!("user:{user}"),
        _ => principal.credential_id.clone(),
    }
}

/// One connection from `addr` that has not authenticated yet; uncounted when dropped.
pub struct Pending {
    pending: Arc<Mutex<HashMap<IpAddr, usize>>>,
    addr: IpAddr,
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut pending = self.pending.lock().expect("connections lock");
        if let Some(n) = pending.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                pending.remove(&self.addr);
            }
        }
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
        let key = limit_key(principal);
        let mut live = self.live.lock().expect("connections lock");
        let count = live.values().filter(|e| e.key == key).count();
        if count >= max {
            return None;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let entry = Entry {
            key,
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

    /// Point registration `id` at a fresher token of the same principal (same limit key):
    /// a login token presented again with a later expiry. Returns false if `principal`
    /// counts under another key (the caller must not switch principals in place).
    pub fn refresh(&self, id: u64, principal: &Principal) -> bool {
        let mut live = self.live.lock().expect("connections lock");
        match live.get_mut(&id) {
            Some(e) if e.key == limit_key(principal) && e.user_id == principal.user_id => {
                e.credential_id = principal.credential_id.clone();
                e.expires_at = principal.expires_at;
                true
            }
            _ => false,
        }
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

    /// Whether the principal has room for one more connection on this replica.
    pub fn has_room(&self, principal: &Principal, max: usize) -> bool {
        let key = limit_key(principal);
        let live = self.live.lock().expect("connections lock");
        live.values().filter(|e| e.key == key).count() < max
    }

    /// Count one unauthenticated connection from `addr`, unless it already has `max`.
    pub fn pending(&self, addr: IpAddr, max: usize) -> Option<Pending> {
        // IPv6 clients are counted by /64, as a client usually holds a whole one.
        let addr = crate::auth::addr_key(addr);
        let mut pending = self.pending.lock().expect("connections lock");
        let n = pending.entry(addr).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Pending {
            pending: self.pending.clone(),
            addr,
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(credential: &str, user: &str) -> Principal {
        Principal {
            tenant_id: "ten_1".into(),
            credential_id: credential.into(),
            kind: berth_store::CredentialKind::User,
            user_id: Some(user.into()),
            role: "member".into(),
            expires_at: None,
        }
    }

    /// Each login mints a new token (`jwt:<jti>`); the connection limit counts the user.
    #[test]
    fn login_tokens_of_one_user_share_the_connection_limit() {
        let c = Connections::default();
        let close = CancellationToken::new;
        assert!(c.register(&principal("jwt:a", "usr_1"), 2, close()).is_some());
        assert!(c.register(&principal("jwt:b", "usr_1"), 2, close()).is_some());
        assert!(!c.has_room(&principal("jwt:c", "usr_1"), 2));
        assert!(c.register(&principal("jwt:c", "usr_1"), 2, close()).is_none());
        // Another user, and a credential of the same user, count on their own.
        assert!(c.register(&principal("jwt:d", "usr_2"), 2, close()).is_some());
        assert!(c.register(&principal("crd_1", "usr_1"), 2, close()).is_some());
    }

    #[test]
    fn refresh_keeps_the_principal() {
        let c = Connections::default();
        let id = c
            .register(&principal("jwt:a", "usr_1"), 2, CancellationToken::new())
            .unwrap();
        assert!(c.refresh(id, &principal("jwt:b", "usr_1")));
        assert!(!c.refresh(id, &principal("jwt:c", "usr_2")));
        assert!(!c.refresh(id, &principal("crd_1", "usr_1")));
        let cid = c
            .register(&principal("crd_1", "usr_1"), 2, CancellationToken::new())
            .unwrap();
        assert!(c.refresh(cid, &principal("crd_1", "usr_1")));
        assert!(!c.refresh(cid, &principal("crd_2", "usr_1")));
    }

    #[test]
    fn unauthenticated_connections_are_capped_per_address() {
        let c = Connections::default();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let first = c.pending(a, 2).unwrap();
        let _second = c.pending(a, 2).unwrap();
        assert!(c.pending(a, 2).is_none());
        assert!(c.pending("192.0.2.2".parse().unwrap(), 2).is_some());
        // One /64 is one client.
        let _v6 = c.pending("2001:db8::1".parse().unwrap(), 1).unwrap();
        assert!(c.pending("2001:db8::2".parse().unwrap(), 1).is_none());
        drop(first);
        assert!(c.pending(a, 2).is_some());
    }
}
