//! What a worker's agent loop asks of the API tier besides steps and ends: the session's
//! rows before a turn (`turn.history`, in pages, so no conversation size breaks the link),
//! tool calls' status changes and ends (`turn.toolStatus` → `tool.status`,
//! `turn.toolEnded` → `tool.ended` with the result row) and sub-agents (`turn.delegate`). Each is answered only for a turn
//! that runs and is handed to this connection.

use berth_protocol::{
    ErrorCode,
    worker::{
        self as wp, TurnDelegate, TurnDelegateResult, TurnHistory, TurnHistoryResult, TurnToolEnded, TurnToolStatus,
    },
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::WorkerConn;
use crate::error::ApiError;

fn params<T: DeserializeOwned>(v: Value) -> Result<T, ApiError> {
    serde_json::from_value(v).map_err(|_| ApiError::code(ErrorCode::BadParams))
}

impl WorkerConn {
    /// `turn.history`, `turn.toolStatus`, `turn.toolEnded`, `turn.delegate`.
    pub(super) async fn agent_request(&mut self, method: &str, p: Value) -> Result<Value, ApiError> {
        let tenant = self.principal.tenant_id.clone();
        let state = self.state.clone();
        let store = &state.store;
        let conn = self.connection_id.as_str();
        match method {
            wp::TURN_HISTORY => {
                let h: TurnHistory = params(p)?;
                let (rows, next) = store.turn_history(conn, &tenant, &h.turn_id, h.after).await?;
                Ok(serde_json::to_value(TurnHistoryResult { rows, next }).unwrap_or_default())
            }
            wp::TURN_TOOL_STATUS => {
                let s: TurnToolStatus = params(p)?;
                let seq = store
                    .tool_status(conn, &tenant, &s.turn_id, s.position, &s.call_id, s.status)
                    .await?;
                self.state.metrics.events_appended.inc();
                Ok(json!({"sequence": seq}))
            }
            wp::TURN_TOOL_ENDED => {
                let e: TurnToolEnded = params(p)?;
                let seq = store
                    .tool_ended(conn, &tenant, &e.turn_id, e.position, &e.call_id, e.status, &e.output)
                    .await?;
                self.state.metrics.events_appended.inc();
                Ok(json!({"sequence": seq}))
            }
            wp::TURN_DELEGATE => {
                let d: TurnDelegate = params(p)?;
                let (session_id, turn_id) = store.delegate(conn, &tenant, &d.turn_id, &d.call_id, &d.prompt).await?;
                // The child's turn is handed out like any (the send notified the dispatchers).
                Ok(serde_json::to_value(TurnDelegateResult { session_id, turn_id }).unwrap_or_default())
            }
            _ => Err(ApiError::code(ErrorCode::MethodNotFound)),
        }
    }
}
