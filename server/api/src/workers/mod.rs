//! Worker connections (`GET /v1/worker`): registration, presence, turn hand-out and the
//! events a worker streams back.
//!
//! A worker connects outbound with a worker credential, declares its workspaces in
//! `worker.hello`, and is then handed turns. Hand-out is driven by the database: any
//! replica that admits a turn, or settles one whose session has a queued turn, sends
//! `NOTIFY berth_dispatch, '<workspace>'`, and the replica that holds a connection for that
//! workspace claims the turns ([`berth_store::Store::claim_turns`]) and sends `turn.run`.
//! A turn ending on a connection that was full kicks that replica's claimer directly
//! (turns left unclaimed for lack of room are this connection's business). `session.send`
//! kicks this replica's connections itself and names itself in the payload
//! ([`berth_store::dispatch_payload`]), so that it does not claim again when its own
//! notification comes back. When this replica holds a connection serving the session's
//! workspace with room, and no other admission is handing a turn to it, the admission's
//! own transaction hands the turn out ([`Registry::reserve`], [`berth_store::Admission`]):
//! a turn sent alone skips the claim's transaction, while a burst of admissions is still
//! handed out by claims of many turns each.
//!
//! One connection carries many turns, and they must not wait for each other: the reader
//! routes each message to its turn's own task (an ordered queue, so a turn's messages keep
//! their order), claims and heartbeats run in a task of their own, and one writer task owns
//! the socket. Work is bounded: turns handed to a connection, queued messages per turn, and
//! database writes in flight per connection and per replica; at a bound the reader stops
//! reading, which pushes back on the worker instead of growing memory.

pub(crate) mod calls;
mod children;
mod claim;
mod connection;
pub mod forwarded;
mod frames;
pub(crate) mod interaction;
mod relay;
mod steps;
mod tools;
mod turn;
mod usage;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, Weak},
};

use axum::{
    extract::{State, WebSocketUpgrade, ws::Message},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use berth_protocol::worker as wp;
use berth_store::{CredentialKind, Principal, token};
use serde::Serialize;
use tokio::sync::{Notify, Semaphore, mpsc};

pub use relay::RelayedDelta;

use crate::{AppState, config::Limits, connections::Registration, rpc::bearer};

/// Worker connections held by this replica, by connection id.
pub struct Registry {
    conns: Mutex<HashMap<String, LocalWorker>>,
    /// Database writes in flight for turns, across this replica's worker connections.
    writes: Arc<Semaphore>,
    /// Ids of worker calls started here.
    next_call: std::sync::atomic::AtomicU32,
    /// Usage metered for the turns this replica's connections run, not stored yet.
    metered: usage::Slots,
}

/// A worker connection held by this replica.
struct LocalWorker {
    tenant_id: String,
    workspaces: Vec<String>,
    /// Worker calls (git, files) in progress on this connection.
    calls: Arc<calls::CallTable>,
    /// Makes the connection claim turns.
    kick: Arc<Notify>,
    /// Turns to stop (cancelled by a client on any replica).
    stop: mpsc::UnboundedSender<String>,
    /// The connection, for turns handed to it at admission.
    conn: Weak<Conn>,
}

/// A slot held on a worker connection of this replica for a turn being admitted here
/// ([`Registry::reserve`]); freed when dropped unless a turn took it ([`Conn::register`]).
pub struct Reservation {
    conn: Arc<Conn>,
    filled: bool,
}

impl Reservation {
    pub fn connection_id(&self) -> &str {
        &self.conn.connection_id
    }

    /// The workspaces the connection serves.
    pub fn workspaces(&self) -> &[String] {
        &self.conn.workspaces
    }
}

/// A carry under way on a connection ([`Conn::begin_carry`]).
pub(super) struct Carrying(Arc<Conn>);

impl Drop for Carrying {
    fn drop(&mut self) {
        self.0.handed().carrying -= 1;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.filled {
            self.conn.unreserve();
        }
    }
}

/// The turns handed to a connection and the slots held for more: under one lock, so that
/// the bound (`BERTH_WORKER_MAX_TURNS`) counts them together.
#[derive(Default)]
struct Handed {
    /// Each turn's queue.
    turns: HashMap<String, turn::TurnHandle>,
    /// Slots held for turns being admitted on this replica ([`Reservation`]).
    reserved: usize,
    /// A claim is in flight: it may fill all the room it saw, so no slot is reserved
    /// meanwhile.
    claiming: bool,
    /// Carries (`worker.carry`) between their `COMMIT` and their turns' registration.
    carrying: usize,
    /// Slots ever reserved and carries ever begun: tells whether a hand-out began since.
    hand_outs: u64,
    /// Turns stopped while not held here: a stop that reaches the connection between a
    /// hand-out's `COMMIT` and its registration (the turn is then not handed out).
    stopped: wp::EarlyStops,
}

impl Handed {
    fn used(&self) -> usize {
        self.turns.len() + self.reserved
    }

    /// The turns held and a mark of the hand-outs begun, when no hand-out is between its
    /// `COMMIT` and its registration ([`Conn::held_turns`]).
    fn held(&self) -> Option<(Vec<String>, u64)> {
        (self.reserved == 0 && self.carrying == 0).then(|| (self.turns.keys().cloned().collect(), self.hand_outs))
    }

    /// No hand-out is under way, and none began since `mark` ([`Handed::held`]).
    fn quiet_since(&self, mark: u64) -> bool {
        self.reserved == 0 && self.carrying == 0 && self.hand_outs == mark
    }

    fn begin_carry(&mut self) {
        self.carrying += 1;
        self.hand_outs += 1;
    }

    /// Hold a turn handed to the connection, in a reserved slot if `reserved` (the slot is
    /// used up either way), unless the turn was stopped before: then its handle is given
    /// back, since the stop went out to the worker already and `turn.run` must not follow.
    fn hold(&mut self, turn_id: &str, handle: turn::TurnHandle, reserved: bool) -> Result<(), turn::TurnHandle> {
        if reserved {
            self.reserved -= 1;
        }
        if self.stopped.take(turn_id) {
            return Err(handle);
        }
        self.turns.insert(turn_id.to_string(), handle);
        Ok(())
    }

    /// A stop of `turn_id`: its handle if it is held, else the stop is remembered for
    /// [`Handed::hold`].
    fn stop(&mut self, turn_id: &str) -> Option<turn::TurnHandle> {
        let handle = self.turns.remove(turn_id);
        if handle.is_none() {
            self.stopped.remember(turn_id);
        }
        handle
    }
}

impl Registry {
    pub fn new(limits: &Limits) -> Registry {
        Registry {
            conns: Mutex::default(),
            writes: Arc::new(Semaphore::new(limits.replica_max_turn_writes.max(1))),
            next_call: Default::default(),
            metered: Default::default(),
        }
    }

    /// Hand the usage the model proxy metered for `turn_id` to the turn's task, which stores
    /// it with the turn's next step, if a connection of this replica runs the turn; else it
    /// is given back, to be metered in the database.
    pub fn meter(&self, turn_id: &str, m: berth_store::Metered) -> Result<(), berth_store::Metered> {
        self.metered.offer(turn_id, m)
    }

    /// A slot on each connection of `tenant_id` this replica holds that has room for one
    /// more turn: `session.send` passes them to the admission, which hands a turn that
    /// starts at once to the one serving its workspace ([`berth_store::Admission`]).
    pub fn reserve(&self, tenant_id: &str) -> Vec<Reservation> {
        let conns = self.conns.lock().expect("registry lock");
        conns
            .values()
            .filter(|w| w.tenant_id == tenant_id)
            .filter_map(|w| w.conn.upgrade())
            .filter(|conn| conn.reserve())
            .map(|conn| Reservation { conn, filled: false })
            .collect()
    }

    /// Send out `turn`, handed at admission to the connection `connection_id` of
    /// `reserved`, in that connection's slot; the other slots are freed.
    pub async fn hand_out(&self, reserved: Vec<Reservation>, connection_id: &str, turn: berth_store::ClaimedTurn) {
        let Some(slot) = reserved.into_iter().find(|r| r.connection_id() == connection_id) else {
            // Not reserved here: the admission only hands out to connections passed to it.
            tracing::error!(worker.connection = %connection_id, "turn handed to a connection not reserved");
            return;
        };
        let conn = slot.conn.clone();
        claim::hand_out(&conn, turn, claim::Via::Admission(slot)).await;
    }

    /// Wake the connections serving `workspace_id` to claim turns.
    pub fn kick(&self, workspace_id: &str) {
        for w in self.conns.lock().expect("registry lock").values() {
            if w.workspaces.iter().any(|id| id == workspace_id) {
                w.kick.notify_one();
            }
        }
    }

    /// The turns this replica's worker connections relay now (a draining replica waits for
    /// none to be left).
    pub fn held_turns(&self) -> usize {
        let conns: Vec<_> = self
            .conns
            .lock()
            .expect("registry lock")
            .values()
            .filter_map(|w| w.conn.upgrade())
            .collect();
        conns.iter().map(|c| c.handed().turns.len()).sum()
    }

    /// Calls other than watches in progress on this replica's worker connections (a
    /// draining replica waits for none to be left, within its drain timeout).
    pub fn held_calls(&self) -> usize {
        let conns = self.conns.lock().expect("registry lock");
        conns.values().map(|w| w.calls.busy()).sum()
    }

    pub fn kick_all(&self) {
        for w in self.conns.lock().expect("registry lock").values() {
            w.kick.notify_one();
        }
    }

    /// Tell the worker on `connection_id` (if this replica holds it) to stop `turn_id`.
    pub fn stop(&self, connection_id: &str, turn_id: &str) {
        if let Some(w) = self.conns.lock().expect("registry lock").get(connection_id) {
            let _ = w.stop.send(turn_id.to_string());
        }
    }
}

pub async fn upgrade(State(state): State<AppState>, headers: HeaderMap, ws: WebSocketUpgrade) -> Response {
    // Draining: the worker is to connect to another replica (its retry goes through the load
    // balancer again).
    if state.draining.is_cancelled() {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let Some(presented) = bearer(&headers) else {
        state.metrics.auth_failures.with_label_values(&["missing"]).inc();
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let principal = match state.store.authenticate(presented).await {
        Ok(Some(p)) if p.kind == CredentialKind::Worker => p,
        Ok(Some(_)) => {
            state.metrics.auth_failures.with_label_values(&["not-a-worker"]).inc();
            return StatusCode::FORBIDDEN.into_response();
        }
        Ok(None) => {
            state.metrics.auth_failures.with_label_values(&["invalid"]).inc();
            return StatusCode::UNAUTHORIZED.into_response();
        }
        Err(_) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
    };
    let revoked = tokio_util::sync::CancellationToken::new();
    let max = state.config.limits.max_connections_per_credential;
    // Unregistered when dropped: also when the upgrade never completes.
    let Some(registration) = Registration::new(&state, &principal, max, revoked.clone()) else {
        return StatusCode::TOO_MANY_REQUESTS.into_response();
    };
    ws.max_message_size(state.config.max_text_message)
        .on_upgrade(move |socket| async move {
            let connection_id = token::new_id("wcn");
            state.metrics.workers_connected.inc();
            state.metrics.connections.with_label_values(&["worker"]).inc();
            connection::serve(state.clone(), principal, connection_id, revoked, socket).await;
            drop(registration);
            state.metrics.workers_connected.dec();
            state.metrics.connections.with_label_values(&["worker"]).dec();
        })
}

/// One worker connection, shared by its reader, claimer and turn tasks.
struct Conn {
    state: AppState,
    principal: Principal,
    connection_id: String,
    /// The workspace ids the worker serves.
    workspaces: Vec<String>,
    /// The worker process's key (`worker.hello`'s `instance`).
    instance: Option<String>,
    /// Messages to the worker (the writer task owns the socket).
    out: mpsc::Sender<Message>,
    /// Turns handed to this connection (the queue of each one's task), and slots held.
    turns: Mutex<Handed>,
    /// Database writes in flight for this connection's turns.
    writes: Arc<Semaphore>,
    /// Cancelled when the connection ends: turn tasks and the claimer stop.
    closing: tokio_util::sync::CancellationToken,
    /// Worker calls (git, files) in progress.
    calls: Arc<calls::CallTable>,
    /// The worker is shutting down ([`wp::WORKER_DRAINING`]): nothing more is handed to it.
    worker_draining: std::sync::atomic::AtomicBool,
}

impl Conn {
    /// Send to the worker (dropped if the connection is gone: it ends anyway).
    async fn send(&self, msg: Message) {
        let _ = self.out.send(msg).await;
    }

    /// Permits for one database write: this connection's and the replica's.
    async fn write_permits(&self) -> (tokio::sync::SemaphorePermit<'_>, tokio::sync::SemaphorePermit<'_>) {
        let own = self.writes.acquire().await.expect("never closed");
        let replica = self.state.workers.writes.acquire().await.expect("never closed");
        (own, replica)
    }

    fn handed(&self) -> std::sync::MutexGuard<'_, Handed> {
        self.turns.lock().expect("turns lock")
    }

    /// Whether the worker said it is shutting down.
    fn worker_draining(&self) -> bool {
        self.worker_draining.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn max_turns(&self) -> usize {
        self.state.config.limits.worker_max_turns
    }

    /// A claim begins: how many more turns it may hand to this connection. Until
    /// [`Conn::end_claim`], no slot is reserved (the claim may fill all the room).
    fn begin_claim(&self) -> usize {
        let mut handed = self.handed();
        handed.claiming = true;
        self.max_turns().saturating_sub(handed.used())
    }

    fn end_claim(&self) {
        self.handed().claiming = false;
    }

    /// Hold a slot for a turn being admitted. False: the connection is full or closing, a
    /// claim is in flight, or another admission holds a slot: in a burst the claim hands the
    /// turns out together (one transaction for many), while a turn admitted alone goes out
    /// with its admission.
    fn reserve(&self) -> bool {
        let mut handed = self.handed();
        if self.closing.is_cancelled()
            || self.state.draining.is_cancelled()
            || self.worker_draining()
            || handed.claiming
            || handed.reserved > 0
            || handed.used() >= self.max_turns()
        {
            return false;
        }
        handed.reserved += 1;
        handed.hand_outs += 1;
        true
    }

    /// The turns this connection holds, and a mark of its hand-outs, when no admission
    /// holds a slot and no carry is under way (none is between its `COMMIT` and
    /// [`Conn::register`]); else `None`.
    fn held_turns(&self) -> Option<(Vec<String>, u64)> {
        self.handed().held()
    }

    /// No admission has held a slot, and no carry has begun, since `mark`
    /// ([`Conn::held_turns`]).
    fn no_hand_out_since(&self, mark: u64) -> bool {
        self.handed().quiet_since(mark)
    }

    /// A carry is about to hand turns to this connection in the database: until the guard
    /// drops (after their registration), the safety tick's check for turns handed here
    /// without their `turn.run` ([`Conn::held_turns`]) waits, as it does for an admission.
    /// Without it, a tick between the carry's `COMMIT` and its registration would send
    /// `turn.run` for a turn the worker runs already.
    fn begin_carry(self: &Arc<Self>) -> Carrying {
        self.handed().begin_carry();
        Carrying(self.clone())
    }

    /// Free a slot no turn took. On a full connection it may have kept a claim from
    /// handing out a waiting turn: the claimer runs again.
    fn unreserve(&self) {
        let full = {
            let mut handed = self.handed();
            let full = handed.used() >= self.max_turns();
            handed.reserved -= 1;
            full
        };
        if full {
            self.kick_claims();
        }
    }

    /// Register a turn handed to this connection (before its `turn.run` goes out, so that
    /// the worker's first message finds it), in the reserved `slot` if it has one. False:
    /// the turn was stopped before ([`Handed::hold`]) and is not to be sent out.
    fn register(&self, turn_id: &str, handle: turn::TurnHandle, slot: Option<Reservation>) -> bool {
        let mut handed = self.handed();
        let full = handed.used() >= self.max_turns();
        let held = handed.hold(turn_id, handle, slot.is_some());
        if let Some(mut slot) = slot {
            slot.filled = true;
        }
        drop(handed);
        // Not held: the slot it would have taken is free, as when a turn leaves.
        if held.is_err() && full {
            self.kick_claims();
        }
        held.is_ok()
    }

    /// The queue of a turn handed to this connection.
    fn turn_queue(&self, turn_id: &str) -> Option<mpsc::Sender<turn::Queued>> {
        self.handed().turns.get(turn_id).map(|h| h.queue.clone())
    }

    /// The turn leaves this connection (ended). If that frees a slot of a full connection,
    /// the claimer runs again: a turn left unclaimed while the connection was full may be
    /// handed out now, and the NOTIFY that woke a claim may have come first.
    fn release_turn(&self, turn_id: &str) -> Option<turn::TurnHandle> {
        self.leave(|handed| handed.turns.remove(turn_id))
    }

    /// The turn was stopped: [`Conn::release_turn`], or if it is not held (yet), the stop
    /// is remembered so that a hand-out in flight does not send it out after the stop.
    fn stop_turn(&self, turn_id: &str) -> Option<turn::TurnHandle> {
        self.leave(|handed| handed.stop(turn_id))
    }

    fn leave(&self, remove: impl FnOnce(&mut Handed) -> Option<turn::TurnHandle>) -> Option<turn::TurnHandle> {
        let (handle, full) = {
            let mut handed = self.handed();
            let full = handed.used() >= self.max_turns();
            (remove(&mut handed), full)
        };
        if full && handle.is_some() {
            self.kick_claims();
        }
        handle
    }

    fn kick_claims(&self) {
        for workspace in &self.workspaces {
            self.state.workers.kick(workspace);
        }
    }
}

fn text_msg<T: Serialize>(v: &T) -> Message {
    Message::Text(serde_json::to_string(v).unwrap_or_default().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle() -> turn::TurnHandle {
        let (queue, _) = mpsc::channel(1);
        turn::TurnHandle {
            queue,
            cancel: Default::default(),
        }
    }

    #[test]
    fn a_turn_stopped_before_it_is_registered_is_not_held() {
        // The stop reaches the connection between the hand-out's commit and its registration.
        let mut h = Handed {
            reserved: 1,
            ..Default::default()
        };
        assert!(h.stop("t1").is_none());
        assert!(h.hold("t1", handle(), true).is_err(), "stopped first: not handed out");
        assert!(h.turns.is_empty() && h.stopped.is_empty());
        assert_eq!(h.used(), 0, "its reserved slot is freed");
        // Registered first, then stopped: released.
        assert!(h.hold("t2", handle(), false).is_ok());
        assert_eq!(h.used(), 1);
        assert!(h.stop("t2").is_some());
        assert!(h.turns.is_empty() && h.stopped.is_empty());
        assert_eq!(h.used(), 0);
    }

    #[test]
    fn a_carry_under_way_holds_off_the_check_for_turns_sent_without_their_run() {
        let mut h = Handed::default();
        assert!(h.hold("t1", handle(), false).is_ok());
        let (held, mark) = h.held().expect("nothing under way");
        assert_eq!(held, ["t1"]);
        assert!(h.quiet_since(mark));
        // A carry between its `COMMIT` and its registration: no check now.
        h.begin_carry();
        assert!(h.held().is_none(), "a carried turn would look sent without its run");
        assert!(!h.quiet_since(mark));
        // Registered and done: a check that read the held turns before it still does not act.
        assert!(h.hold("t2", handle(), false).is_ok());
        h.carrying -= 1;
        assert!(!h.quiet_since(mark), "a carry began since the mark");
        let (_, later) = h.held().expect("nothing under way");
        assert!(h.quiet_since(later));
    }

    #[test]
    fn stops_of_turns_not_held_are_remembered_within_a_bound() {
        let mut h = Handed::default();
        for i in 0..wp::EARLY_STOPS_KEPT + 10 {
            assert!(h.stop(&format!("t{i}")).is_none());
        }
        assert_eq!(h.stopped.len(), wp::EARLY_STOPS_KEPT);
        assert!(h.hold("t0", handle(), false).is_ok(), "the oldest stops are forgotten");
        assert!(
            h.hold(&format!("t{}", wp::EARLY_STOPS_KEPT + 9), handle(), false)
                .is_err()
        );
    }
}
