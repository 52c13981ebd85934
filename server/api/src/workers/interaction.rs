//! `turn.interaction`: the worker holds a tool call for approval or asks a question, and its
//! request stays open until the interaction is resolved.
//!
//! Each request runs as its own task, apart from its turn's ordered queue (the turn and the
//! connection keep flowing meanwhile), and sends its response through the connection's
//! writer. Resolution may happen on any replica: the resolving transaction sends
//! `NOTIFY berth_interactions, '<id>'`, this replica's LISTEN connection wakes the waiting
//! task through [`Waiters`], and the task reads the outcome from the table. Wake-ups are only hints: the task re-reads after a LISTEN
//! reconnect ([`Waiters::wake_all`]) and every few seconds, and at `expiresAt` it records the
//! fallback itself. Nothing is kept in memory that the table does not hold.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use berth_protocol::{
    ErrorCode, Interaction, InteractionState,
    jsonrpc::{Request, Response as RpcResponse},
    worker::{TurnInteraction, TurnInteractionResult},
};
use tokio::sync::watch;

use super::{Conn, text_msg};
use crate::{AppState, error::ApiError};

/// How often a waiting request re-reads its interaction even without a wake-up.
const RECHECK: Duration = Duration::from_secs(5);

/// Local wake-ups for open `turn.interaction` requests, by interaction id.
#[derive(Default)]
pub struct Waiters {
    map: Mutex<HashMap<String, Arc<watch::Sender<u64>>>>,
}

/// A waiting request's handle; the last one dropped for an id removes the entry.
struct Waiter<'a> {
    waiters: &'a Waiters,
    id: String,
    rx: watch::Receiver<u64>,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut map = self.waiters.map.lock().expect("waiters lock");
        // This waiter's receiver is still alive here: 1 means it was the last.
        if map.get(&self.id).is_some_and(|tx| tx.receiver_count() <= 1) {
            map.remove(&self.id);
        }
    }
}

impl Waiters {
    fn subscribe(&self, id: &str) -> Waiter<'_> {
        let mut map = self.map.lock().expect("waiters lock");
        let tx = map
            .entry(id.to_string())
            .or_insert_with(|| Arc::new(watch::channel(0).0));
        Waiter {
            waiters: self,
            id: id.to_string(),
            rx: tx.subscribe(),
        }
    }

    /// The interaction was resolved (on any replica): its waiting requests re-read it.
    pub fn wake(&self, id: &str) {
        if let Some(tx) = self.map.lock().expect("waiters lock").get(id) {
            tx.send_modify(|n| *n += 1);
        }
    }

    /// Notifications may have been missed (LISTEN reconnected): every waiter re-reads.
    pub fn wake_all(&self) {
        for tx in self.map.lock().expect("waiters lock").values() {
            tx.send_modify(|n| *n += 1);
        }
    }
}

/// `turn.interaction` (routed here by the turn's task): answered by its own task once the
/// interaction is resolved, so the turn's other messages and the connection keep flowing.
/// The task ends with the connection (whose turns are then interrupted, which closes their
/// interactions); stopping the turn closes the interaction, which answers it.
pub(super) fn ask(conn: &Arc<Conn>, req: Request) {
    let conn = conn.clone();
    tokio::spawn(async move {
        let closing = conn.closing.clone();
        let state = &conn.state;
        let answer = tokio::select! {
            r = answer(state, &conn.connection_id, &conn.principal.tenant_id, req.params) => r,
            _ = closing.cancelled() => return,
        };
        if req.id.is_none() {
            return;
        }
        let response = match answer {
            Ok(r) => RpcResponse::ok(req.id, serde_json::to_value(r).unwrap_or_default()),
            Err(e) => RpcResponse::err(req.id, e.0),
        };
        conn.send(text_msg(&response)).await;
    });
}

#[tracing::instrument(skip_all, fields(worker.connection = %connection_id))]
async fn answer(
    state: &AppState,
    connection_id: &str,
    tenant_id: &str,
    params: serde_json::Value,
) -> Result<TurnInteractionResult, ApiError> {
    let ask: TurnInteraction = serde_json::from_value(params).map_err(|_| ApiError::code(ErrorCode::BadParams))?;
    let store = &state.store;
    let timeout = state.config.interaction_timeout;
    let asked = store.ask_interaction(connection_id, tenant_id, &ask, timeout).await?;
    tracing::info!(turn.id = %ask.turn_id, interaction.id = %asked.interaction_id, kind = %asked.kind,
        state = asked.state.as_str(), "interaction asked");
    let mut waiter = state.interactions.subscribe(&asked.interaction_id);
    let mut current = asked;
    let mut expiry_tried = false;
    loop {
        if let Some(done) = outcome(&current) {
            return Ok(done);
        }
        let until_expiry = chrono::DateTime::parse_from_rfc3339(&current.expires_at)
            .map(|at| {
                (at.with_timezone(&chrono::Utc) - chrono::Utc::now())
                    .to_std()
                    .unwrap_or_default()
            })
            .unwrap_or(RECHECK);
        // After an expiry attempt the database's clock decides; do not spin on ours.
        let until_expiry = if expiry_tried {
            until_expiry.max(RECHECK)
        } else {
            until_expiry
        };
        tokio::select! {
            _ = waiter.rx.changed() => {}
            _ = tokio::time::sleep(until_expiry) => {
                current = store.expire_interaction(tenant_id, &current.interaction_id).await?;
                expiry_tried = true;
                continue;
            }
            _ = tokio::time::sleep(RECHECK) => {}
        }
        current = store.interaction(tenant_id, &current.interaction_id).await?;
    }
}

fn outcome(i: &Interaction) -> Option<TurnInteractionResult> {
    if i.state == InteractionState::Pending {
        return None;
    }
    Some(TurnInteractionResult {
        interaction_id: i.interaction_id.clone(),
        outcome: i.outcome.clone()?,
        state: i.state,
    })
}

/// Periodic interaction work any replica may do (idempotent): record the fallback of
/// interactions that expired with nobody waiting on them, and keep this replica's
/// session-watcher rows counting (forgetting lapsed ones).
pub fn spawn_housekeeping(state: AppState) {
    tokio::spawn(async move {
        let mut expiry = tokio::time::interval(Duration::from_secs(5));
        let mut watchers = tokio::time::interval(Duration::from_secs(10));
        loop {
            tokio::select! {
                _ = expiry.tick() => match state.store.expire_overdue_interactions().await {
                    Ok(n) if n > 0 => tracing::info!(expired = n, "overdue interactions answered by their fallback"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "interaction expiry sweep failed"),
                },
                _ = watchers.tick() => if let Err(e) = crate::rpc::interaction::heartbeat(&state).await {
                    tracing::warn!(error = %e, "session watcher heartbeat failed");
                },
                _ = state.shutdown.cancelled() => return,
            }
        }
    });
}
