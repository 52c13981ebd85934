//! Worker connections (`GET /v1/worker`): registration, presence, turn hand-out and the
//! events a worker streams back.
//!
//! A worker connects outbound with a worker credential, declares its workspaces in
//! `worker.hello`, and is then handed turns. Hand-out is driven by the database: any
//! replica that admits or settles a turn sends `NOTIFY berth_dispatch, '<workspace>'`, and
//! the replica that holds a connection for that workspace claims the turns
//! ([`berth_store::Store::claim_turns`]) and sends `turn.run`.

pub(crate) mod calls;
mod claim;
mod connection;
mod relay;
mod steps;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use axum::{
    extract::{State, WebSocketUpgrade, ws::Message},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use berth_store::{CredentialKind, Principal, token};
use serde::Serialize;
use tokio::sync::{Notify, mpsc};

pub use relay::RelayedDelta;

use crate::{AppState, connections::Registration, rpc::bearer};
use relay::Pending;

/// Worker connections held by this replica, by connection id.
#[derive(Default)]
pub struct Registry {
    conns: Mutex<HashMap<String, LocalWorker>>,
    /// Ids of worker calls started here.
    next_call: std::sync::atomic::AtomicU32,
}

/// A worker connection held by this replica.
struct LocalWorker {
    tenant_id: String,
    workspaces: Vec<String>,
    /// Calls, credit and cancellations for the worker.
    calls: mpsc::UnboundedSender<calls::ToWorker>,
    call_slots: Arc<tokio::sync::Semaphore>,
    /// Makes the connection claim turns.
    kick: Arc<Notify>,
    /// Turns to stop (cancelled by a client on any replica).
    stop: mpsc::UnboundedSender<String>,
}

impl Registry {
    /// Wake the connections serving `workspace_id` to claim turns.
    pub fn kick(&self, workspace_id: &str) {
        for w in self.conns.lock().expect("registry lock").values() {
            if w.workspaces.iter().any(|id| id == workspace_id) {
                w.kick.notify_one();
            }
        }
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
            let mut conn = WorkerConn {
                state: state.clone(),
                principal,
                connection_id,
                turns: HashMap::new(),
                relay: HashMap::new(),
                calls: HashMap::new(),
                revoked,
            };
            if let Err(e) = conn.run(socket).await {
                tracing::info!(worker.connection = %conn.connection_id, error = %e, "worker connection ended");
            }
            conn.cleanup().await;
            drop(registration);
            state.metrics.workers_connected.dec();
            state.metrics.connections.with_label_values(&["worker"]).dec();
        })
}

struct WorkerConn {
    state: AppState,
    principal: Principal,
    connection_id: String,
    /// Turns handed to this connection, with their live-output position.
    turns: HashMap<String, LiveTurn>,
    /// Deltas waiting to be relayed to other replicas (and stored as partial output), by turn.
    relay: HashMap<String, Pending>,
    /// Worker calls in progress on this connection, by call id.
    calls: HashMap<u32, mpsc::Sender<calls::CallEvent>>,
    /// Cancelled when the worker's credential is revoked.
    revoked: tokio_util::sync::CancellationToken,
}

/// Where a running turn's live output is: the step and how many bytes of text and
/// thinking it has streamed (the offsets carried by `model.delta`).
struct LiveTurn {
    session: String,
    /// When the turn was handed to the worker.
    started: std::time::Instant,
    step: i32,
    text: u64,
    thinking: u64,
}

fn text_msg<T: Serialize>(v: &T) -> Message {
    Message::Text(serde_json::to_string(v).unwrap_or_default().into())
}
