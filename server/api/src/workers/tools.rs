//! What a worker's agent loop asks of the API tier besides steps and ends: the session's
//! rows before a turn (`turn.history`, in pages, so no conversation size breaks the link),
//! tool calls' status changes and ends (`turn.toolStatus` → `tool.status`,
//! `turn.toolEnded` → `tool.ended` with the result row) and sub-agents (`turn.delegate`). Each is answered only for a turn
//! that runs and is handed to this connection.

use berth_protocol::{
    ErrorCode,
    worker::{
        self as wp, TurnDelegate, TurnDelegateResult, TurnHistory, TurnHistoryResult, TurnSkill, TurnSkillResult,
        TurnSource, TurnToolEnded, TurnToolStatus,
    },
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::turn::TurnTask;
use crate::error::ApiError;

fn params<T: DeserializeOwned>(v: Value) -> Result<T, ApiError> {
    serde_json::from_value(v).map_err(|_| ApiError::code(ErrorCode::BadParams))
}

impl TurnTask {
    /// `turn.history`, `turn.source`, `turn.toolStatus`, `turn.toolEnded`, `turn.delegate`.
    pub(super) async fn agent_request(&mut self, method: &str, p: Value) -> Result<Value, ApiError> {
        let conn = self.conn.clone();
        let (store, tenant, id) = (
            &conn.state.store,
            &conn.principal.tenant_id,
            conn.connection_id.as_str(),
        );
        let turn = self.turn_id.as_str();
        match method {
            wp::TURN_HISTORY => {
                let h: TurnHistory = params(p)?;
                let (rows, next, handoff) = store.turn_history(id, tenant, turn, h.after).await?;
                Ok(serde_json::to_value(TurnHistoryResult { rows, next, handoff }).unwrap_or_default())
            }
            wp::TURN_SOURCE => {
                let s: TurnSource = params(p)?;
                let r = store
                    .turn_source(id, tenant, turn, s.position, s.field, s.offset)
                    .await?;
                Ok(serde_json::to_value(r).unwrap_or_default())
            }
            wp::TURN_TOOL_STATUS => {
                let s: TurnToolStatus = params(p)?;
                let seq = {
                    let _permits = conn.write_permits().await;
                    store
                        .tool_status(id, tenant, turn, s.position, &s.call_id, s.status)
                        .await?
                };
                conn.state.metrics.events_appended.inc();
                Ok(json!({"sequence": seq}))
            }
            wp::TURN_TOOL_ENDED => {
                let e: TurnToolEnded = params(p)?;
                let seq = {
                    let _permits = conn.write_permits().await;
                    store
                        .tool_ended(id, tenant, turn, e.position, &e.call_id, e.status, &e.output)
                        .await?
                };
                conn.state.metrics.events_appended.inc();
                Ok(json!({"sequence": seq}))
            }
            wp::TURN_DELEGATE => {
                let d: TurnDelegate = params(p)?;
                // The child's turn is handed out like any (its send notifies the dispatchers).
                let (session_id, turn_id) = {
                    let _permits = conn.write_permits().await;
                    store.delegate(id, tenant, turn, &d.call_id, &d.prompt).await?
                };
                Ok(serde_json::to_value(TurnDelegateResult { session_id, turn_id }).unwrap_or_default())
            }
            wp::TURN_SKILL => {
                let s: TurnSkill = params(p)?;
                let body = store.turn_skill(id, tenant, turn, &s.name).await?;
                Ok(serde_json::to_value(TurnSkillResult { body }).unwrap_or_default())
            }
            _ => Err(ApiError::code(ErrorCode::MethodNotFound)),
        }
    }
}
