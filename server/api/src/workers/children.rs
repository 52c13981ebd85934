//! `turn.childWait`: a coordinator's turn waits for a child's turn to end. Like
//! `turn.interaction`, each request is answered by its own task, apart from its turn's
//! ordered queue. The end of a child's turn is appended to the coordinator's history
//! (`child.turnEnded`) in the transaction that ends it, so the task wakes on the
//! coordinator's events and reads the child's turn from the table; it also re-reads every
//! few seconds, which notices a child's workspace going offline (reported, not waited on).

use std::{sync::Arc, time::Duration};

use berth_protocol::{
    ErrorCode,
    jsonrpc::{Request, Response as RpcResponse},
    worker::{ChildWaitResult, TurnChildWait},
};
use tokio_util::sync::CancellationToken;

use super::{Conn, text_msg};
use crate::{AppState, error::ApiError};

/// How often a waiting request re-reads the child's turn even without a wake-up.
const RECHECK: Duration = Duration::from_secs(5);
/// How long one wait lasts unless it asks for less (it may then wait again).
const DEFAULT_WAIT: Duration = Duration::from_secs(600);
const MAX_WAIT: Duration = Duration::from_secs(3600);

/// Answer `turn.childWait` from its own task. It ends unanswered with the connection, and
/// answers `turn-not-running` when the coordinator's turn is stopped.
pub(super) fn wait(conn: &Arc<Conn>, coordinator: &str, turn_cancel: CancellationToken, req: Request) {
    let conn = conn.clone();
    let coordinator = coordinator.to_string();
    tokio::spawn(async move {
        let closing = conn.closing.clone();
        let answer = tokio::select! {
            r = answer(&conn.state, &conn.principal.tenant_id, &coordinator, req.params) => r,
            _ = turn_cancel.cancelled() => Err(ApiError::code(ErrorCode::TurnNotRunning)),
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

#[tracing::instrument(skip_all, fields(session.id = %coordinator))]
async fn answer(
    state: &AppState,
    tenant_id: &str,
    coordinator: &str,
    params: serde_json::Value,
) -> Result<ChildWaitResult, ApiError> {
    let w: TurnChildWait = serde_json::from_value(params).map_err(|_| ApiError::code(ErrorCode::BadParams))?;
    let limit = w
        .timeout_secs
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_WAIT)
        .min(MAX_WAIT);
    let deadline = tokio::time::Instant::now() + limit;
    let store = &state.store;
    let read = || store.child_wait_state(tenant_id, &w.turn_id, &w.session_id, w.child_turn_id.as_deref());
    // The first read checks the tenant and the relation before anything is subscribed to.
    read().await?;
    let mut sub = state.hub.subscribe(coordinator);
    loop {
        // Read after subscribing, so that an end committed in between still wakes us.
        let (result, coordinator_running) = read().await?;
        if !coordinator_running {
            return Err(ApiError::code(ErrorCode::TurnNotRunning));
        }
        if result.state.is_settled() || !result.online {
            return Ok(result);
        }
        tokio::select! {
            changed = sub.events.changed() => if changed.is_err() {
                return Err(ApiError::code(ErrorCode::TurnNotRunning));
            },
            _ = tokio::time::sleep(RECHECK) => {}
            _ = tokio::time::sleep_until(deadline) => {
                return Ok(ChildWaitResult { timed_out: true, ..result });
            }
        }
    }
}
