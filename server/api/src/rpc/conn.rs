//! Per-connection state: the outbound queue bounded in bytes, the subscription slots and
//! the connection itself (its principal, registration, in-flight slots and uploads).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use axum::extract::ws::Message;
use berth_protocol::ErrorCode;
use berth_store::Principal;
use serde_json::json;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::upload;
use crate::{
    AppState,
    error::{ApiError, ApiResult},
};

/// What a queued message costs beyond its payload (framing, bookkeeping), so that a flood
/// of empty messages is bounded too.
const MESSAGE_OVERHEAD: usize = 64;

/// A connection's outbound queue, bounded in bytes: a message takes its size (plus
/// [`MESSAGE_OVERHEAD`]) from the budget until the writer has handed it to the socket. A
/// message larger than the whole budget waits for an empty queue.
pub struct Outbound {
    tx: mpsc::UnboundedSender<(Message, OwnedSemaphorePermit)>,
    pub(super) budget: Arc<Semaphore>,
    max: usize,
}

impl Outbound {
    pub(super) fn new(max: usize) -> (Outbound, mpsc::UnboundedReceiver<(Message, OwnedSemaphorePermit)>) {
        let max = max.clamp(4 * MESSAGE_OVERHEAD, u32::MAX as usize);
        let (tx, rx) = mpsc::unbounded_channel();
        let budget = Arc::new(Semaphore::new(max));
        (Outbound { tx, budget, max }, rx)
    }

    fn cost(&self, msg: &Message) -> u32 {
        let len = match msg {
            Message::Text(t) => t.len(),
            Message::Binary(b) => b.len(),
            _ => 0,
        };
        // `max` fits in u32 (clamped in `new`).
        (len.saturating_add(MESSAGE_OVERHEAD).min(self.max)) as u32
    }

    /// Queue `msg`, waiting for room; false once the connection's writer has ended.
    pub async fn send(&self, msg: Message) -> bool {
        let Ok(permit) = self.budget.clone().acquire_many_owned(self.cost(&msg)).await else {
            return false;
        };
        self.tx.send((msg, permit)).is_ok()
    }

    /// Queue `msg` if there is room now.
    pub fn try_send(&self, msg: Message) -> bool {
        let Ok(permit) = self.budget.clone().try_acquire_many_owned(self.cost(&msg)) else {
            return false;
        };
        self.tx.send((msg, permit)).is_ok()
    }
}

/// A connection's subscriptions by request id. A slot is freed only when the task it was
/// reserved for ends (and only if the slot is still that task's); `subscription.close` just
/// cancels it, so the id stays in use and counted until the task has really stopped.
#[derive(Default)]
pub struct Subs {
    slots: HashMap<u32, Slot>,
    next: u64,
}

struct Slot {
    token: CancellationToken,
    serial: u64,
}

impl Subs {
    /// The cancellation token of subscription `id`.
    pub fn get(&self, id: &u32) -> Option<&CancellationToken> {
        self.slots.get(id).map(|s| &s.token)
    }

    /// Reserve a slot for a new subscription under `id`; returns its serial and token.
    pub(super) fn reserve(
        &mut self,
        id: u32,
        parent: &CancellationToken,
        max: usize,
    ) -> Result<(u64, CancellationToken), ApiError> {
        if self.slots.contains_key(&id) {
            return Err(ApiError::with(ErrorCode::BadParams, json!({"reason": "id-in-use"})));
        }
        if self.slots.len() >= max {
            return Err(ApiError::with(
                ErrorCode::RateLimited,
                json!({"limit": "subscriptions"}),
            ));
        }
        self.next += 1;
        let token = parent.child_token();
        self.slots.insert(
            id,
            Slot {
                token: token.clone(),
                serial: self.next,
            },
        );
        Ok((self.next, token))
    }

    /// Ask subscription `id` to end; false if there is none.
    pub fn close(&self, id: u32) -> bool {
        self.slots.get(&id).map(|s| s.token.cancel()).is_some()
    }

    /// The task holding slot `serial` under `id` has ended.
    pub(super) fn finish(&mut self, id: u32, serial: u64) {
        if self.slots.get(&id).is_some_and(|s| s.serial == serial) {
            self.slots.remove(&id);
        }
    }

    pub(super) fn cancel_all(&self) {
        for s in self.slots.values() {
            s.token.cancel();
        }
    }
}

/// Per-connection state.
pub struct Conn {
    pub principal: Mutex<Option<Principal>>,
    pub out: Outbound,
    /// Open subscriptions by request id.
    pub subs: Mutex<Subs>,
    pub closed: CancellationToken,
    /// Cancelled when the principal is revoked (credential revoked, user disabled).
    pub revoked: CancellationToken,
    /// This connection's entry in the replica's connection registry.
    pub registration: Mutex<Option<crate::connections::Registration>>,
    /// Requests being answered (subscriptions excluded).
    pub in_flight: Arc<tokio::sync::Semaphore>,
    /// `content.upload` requests awaiting their binary message.
    pub uploads: upload::Uploads,
    /// While not authenticated: this connection's place in its address's count.
    pub(super) pending: Mutex<Option<crate::connections::Pending>>,
}

impl Conn {
    /// Authenticate the connection as `principal` (registering it for revocation and the
    /// per-credential connection limit). A connection already signed in stays who it is:
    /// the same principal may present a fresher token (a new login token of the same user
    /// moves the expiry), any other principal is refused with `conflict` — so the
    /// registration, and the watches running under it, always belong to the principal
    /// the connection acts as.
    pub fn sign_in(&self, state: &AppState, principal: Principal) -> ApiResult<()> {
        let max = state.config.limits.max_connections_per_credential;
        let mut reg = self.registration.lock().expect("conn lock");
        if let Some(current) = reg.as_ref() {
            if !state.connections.refresh(current.id(), &principal) {
                return Err(ApiError::with(ErrorCode::Conflict, json!({"reason": "signed-in"})));
            }
        } else {
            let registration = crate::connections::Registration::new(state, &principal, max, self.revoked.clone())
                .ok_or_else(|| ApiError::with(ErrorCode::RateLimited, json!({"limit": "connections"})))?;
            *reg = Some(registration);
            self.pending.lock().expect("conn lock").take();
        }
        *self.principal.lock().expect("conn lock") = Some(principal);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `subscription.close` does not free the slot: it stays taken (and counted) until its
    /// own task ends, and a finished task never frees a slot that is no longer its own.
    #[test]
    fn subscription_slots_are_freed_only_by_their_task() {
        let parent = CancellationToken::new();
        let mut subs = Subs::default();
        let (a, token_a) = subs.reserve(7, &parent, 1).unwrap();
        assert!(subs.close(7));
        assert!(token_a.is_cancelled());
        // Still running: the id is in use and the slot counts.
        assert_eq!(subs.reserve(7, &parent, 2).unwrap_err().data_code(), "bad-params");
        assert_eq!(subs.reserve(8, &parent, 1).unwrap_err().data_code(), "rate-limited");
        subs.finish(7, a);
        let (b, token_b) = subs.reserve(7, &parent, 1).unwrap();
        // A stale finish (the old task's serial) leaves the new slot alone.
        subs.finish(7, a);
        assert!(subs.get(&7).is_some());
        assert!(!token_b.is_cancelled());
        subs.finish(7, b);
        assert!(subs.get(&7).is_none());
        assert!(!subs.close(7));
    }

    /// The outbound queue holds at most its byte budget; a message larger than the whole
    /// budget still goes out alone.
    #[tokio::test]
    async fn outbound_queue_is_bounded_in_bytes() {
        let (out, mut rx) = Outbound::new(64 << 10);
        let msg = || Message::Text("x".repeat(1000).into());
        let mut queued = 0;
        while out.try_send(msg()) {
            queued += 1;
        }
        assert!(queued * 1000 <= 64 << 10, "{queued}");
        assert!(queued >= 50, "{queued}");
        // Writing one frees its bytes.
        drop(rx.recv().await);
        assert!(out.try_send(msg()));
        assert!(!out.try_send(msg()));
        while rx.try_recv().is_ok() {}
        assert!(out.send(Message::Text("y".repeat(1 << 20).into())).await);
        assert!(!out.try_send(msg()), "the oversized message takes the whole budget");
        drop(rx.recv().await);
        // Once the writer has ended, senders give up instead of waiting.
        out.budget.close();
        assert!(!out.send(msg()).await);
    }
}
