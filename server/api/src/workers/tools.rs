//! What a worker's agent loop asks of the API tier besides steps and ends: the session's
//! rows before a turn (`turn.history`, in pages, so no conversation size breaks the link),
//! tool calls' status changes and ends (`turn.toolStatus` → `tool.status`,
//! `turn.toolEnded` → `tool.ended` with the result row), notices (`turn.notice` →
//! `session.notice` and a `tool` diagnostic), sub-agents (`turn.delegate`) and a
//! coordinator's children (`turn.workspaces`, `turn.childStart`, `turn.childSend`,
//! `turn.childStop`; `turn.childWait` is in `children.rs`). Each is answered only for a turn
//! that runs and is handed to this connection.

use berth_protocol::{
    ErrorCode,
    worker::{
        self as wp, TurnChildSend, TurnChildStart, TurnChildStop, TurnChildStopResult, TurnDelegate,
        TurnDelegateResult, TurnHistory, TurnNotice, TurnSkill, TurnSkillResult, TurnSource, TurnToolEnded,
        TurnToolStatus, TurnWorkspacesResult,
    },
};
use berth_store::{NewChild, StoreError};
use serde::de::DeserializeOwned;
use serde_json::{Value, json, value::RawValue};

use super::turn::TurnTask;
use crate::error::ApiError;

/// A child's prompt is bounded like a client's (`session.send`).
fn check_prompt(prompt: &str) -> Result<(), ApiError> {
    if prompt.len() > berth_protocol::MAX_PROMPT_BYTES {
        return Err(ApiError::with(
            ErrorCode::PayloadTooLarge,
            json!({"limit": "prompt", "max": berth_protocol::MAX_PROMPT_BYTES}),
        ));
    }
    Ok(())
}

fn params<T: DeserializeOwned>(v: Value) -> Result<T, ApiError> {
    serde_json::from_value(v).map_err(|_| ApiError::code(ErrorCode::BadParams))
}

impl TurnTask {
    /// `turn.history`: a page of the session's rows, answered with the JSON the store wrote
    /// straight from PostgreSQL's rows.
    /// The first page also relays the turn's running phase to other replicas' watchers
    /// ([`TurnTask::running`]).
    pub(super) async fn history(&mut self, p: Value) -> Result<Box<RawValue>, ApiError> {
        let h: TurnHistory = params(p)?;
        let first = h.after.is_none();
        let conn = &self.conn;
        let replica = conn.state.config.replica_id.as_str();
        let running = self.running.as_deref().filter(|_| first).map(|r| (r, replica));
        let page = conn
            .state
            .store
            .turn_history_json(
                &conn.connection_id,
                &conn.principal.tenant_id,
                &self.turn_id,
                &self.live.session,
                h.after,
                running,
            )
            .await?;
        if first {
            self.running = None;
        }
        Ok(page)
    }

    /// An event of the turn appended by `append` (given this replica, which wakes its own
    /// watchers, and whether they want the event as written), handed to this replica's
    /// watchers without their reading it back, as a step's is.
    async fn appended<'a, F, Fut>(&'a self, append: F) -> Result<Value, ApiError>
    where
        F: FnOnce(Option<&'a str>, bool) -> Fut,
        Fut: std::future::Future<Output = berth_store::Result<(i64, Vec<berth_store::EventRecord>)>>,
    {
        let conn = &self.conn;
        let (guard, r) = {
            let _permits = conn.write_permits().await;
            // Local watchers wait for the event from here (so not while waiting for a permit).
            let guard = conn.state.hub.appending(&self.live.session);
            let local = guard.is_some();
            (guard, append(Some(conn.state.config.replica_id.as_str()), local).await)
        };
        let seq = conn.state.hub.written(guard, &self.live.session, r)?;
        conn.state.metrics.events_appended.inc();
        Ok(json!({"sequence": seq}))
    }

    /// `turn.source`, `turn.toolStatus`, `turn.toolEnded`, `turn.delegate`, …
    pub(super) async fn agent_request(&mut self, method: &str, p: Value) -> Result<Value, ApiError> {
        let conn = self.conn.clone();
        let (store, tenant, id) = (
            &conn.state.store,
            &conn.principal.tenant_id,
            conn.connection_id.as_str(),
        );
        let turn = self.turn_id.as_str();
        match method {
            wp::TURN_SOURCE => {
                let s: TurnSource = params(p)?;
                let r = store
                    .turn_source(id, tenant, turn, s.position, s.field, s.offset)
                    .await?;
                Ok(serde_json::to_value(r).unwrap_or_default())
            }
            wp::TURN_TOOL_STATUS => {
                let s: TurnToolStatus = params(p)?;
                self.appended(|replica, local| {
                    store.tool_status(id, tenant, turn, s.position, &s.call_id, s.status, replica, local)
                })
                .await
            }
            wp::TURN_TOOL_ENDED => {
                let e: TurnToolEnded = params(p)?;
                // An output too large for the hub to keep is not returned by the append.
                let keeps = conn.state.hub.keeps(e.output.len());
                self.appended(|replica, local| {
                    let local = local && keeps;
                    store.tool_ended(
                        id, tenant, turn, e.position, &e.call_id, e.status, &e.output, replica, local,
                    )
                })
                .await
            }
            wp::TURN_PLAN => {
                let p: wp::TurnPlan = params(p)?;
                let plan = p.plan;
                let too_long = |s: &str| s.len() > berth_protocol::PLAN_STEP_BYTES_MAX || s.contains('\0');
                let in_progress = plan
                    .plan
                    .iter()
                    .filter(|s| s.status == berth_protocol::PlanStepStatus::InProgress)
                    .count();
                if plan.plan.len() > berth_protocol::PLAN_STEPS_MAX
                    || plan.plan.iter().any(|s| s.step.trim().is_empty() || too_long(&s.step))
                    || plan.explanation.as_deref().is_some_and(too_long)
                    || in_progress > 1
                {
                    return Err(ApiError::code(ErrorCode::BadParams));
                }
                self.appended(|replica, local| store.turn_plan(id, tenant, turn, plan, replica, local))
                    .await
            }
            wp::TURN_NOTICE => {
                let n: TurnNotice = params(p)?;
                // Only codes the protocol lists reach clients (a newer worker's other code
                // is refused; the turn goes on without its notice).
                let Some(code) = berth_protocol::NoticeCode::parse(&n.code) else {
                    return Err(ApiError::code(ErrorCode::BadParams));
                };
                if n.params.to_string().len() > wp::TURN_NOTICE_PARAMS_MAX {
                    return Err(ApiError::code(ErrorCode::BadParams));
                }
                let seq = {
                    let _permits = conn.write_permits().await;
                    store.turn_notice(id, tenant, turn, code, n.params).await?
                };
                conn.state.metrics.events_appended.inc();
                Ok(json!({"sequence": seq}))
            }
            wp::TURN_DELEGATE => {
                let d: TurnDelegate = params(p)?;
                check_prompt(&d.prompt)?;
                // Sub-agents one turn may start: the bound a coordinator's turn has.
                let max_children = conn.state.config.coordinator_max_children;
                // The child's turn is handed out like any (its send notifies the dispatchers).
                let started = {
                    let _permits = conn.write_permits().await;
                    store
                        .delegate(id, tenant, turn, &d.call_id, &d.prompt, max_children)
                        .await
                };
                match started {
                    Ok((session_id, turn_id)) => {
                        Ok(serde_json::to_value(TurnDelegateResult { session_id, turn_id }).unwrap_or_default())
                    }
                    Err(StoreError::Code(ErrorCode::ChildLimit)) => {
                        Err(ApiError::with(ErrorCode::ChildLimit, json!({"max": max_children})))
                    }
                    Err(e) => Err(e.into()),
                }
            }
            wp::TURN_WORKSPACES => {
                let workspaces = store.coordinator_workspaces(id, tenant, turn).await?;
                Ok(serde_json::to_value(TurnWorkspacesResult { workspaces }).unwrap_or_default())
            }
            wp::TURN_CHILD_START => {
                let c: TurnChildStart = params(p)?;
                check_prompt(&c.prompt)?;
                let max_children = conn.state.config.coordinator_max_children;
                let new = NewChild {
                    call_id: &c.call_id,
                    workspace_id: &c.workspace_id,
                    prompt: &c.prompt,
                    // A title past the clients' bound is left out (the child still starts).
                    title: c
                        .title
                        .as_deref()
                        .map(str::trim)
                        .filter(|t| t.len() <= berth_protocol::MAX_SESSION_TITLE_BYTES),
                    agent: c.agent.as_deref(),
                    max_children,
                };
                let started = {
                    let _permits = conn.write_permits().await;
                    store.child_start(id, tenant, turn, &new).await
                };
                match started {
                    Ok(child) => {
                        tracing::info!(turn.id = %turn, child.session = %child.session_id, "coordinator started a child");
                        Ok(serde_json::to_value(child).unwrap_or_default())
                    }
                    Err(StoreError::Code(ErrorCode::ChildLimit)) => {
                        Err(ApiError::with(ErrorCode::ChildLimit, json!({"max": max_children})))
                    }
                    Err(e) => Err(e.into()),
                }
            }
            wp::TURN_CHILD_SEND => {
                let c: TurnChildSend = params(p)?;
                check_prompt(&c.prompt)?;
                let _permits = conn.write_permits().await;
                let child = store.child_send(id, tenant, turn, &c.session_id, &c.prompt).await?;
                Ok(serde_json::to_value(child).unwrap_or_default())
            }
            wp::TURN_CHILD_STOP => {
                let c: TurnChildStop = params(p)?;
                let _permits = conn.write_permits().await;
                let stopped = store.child_stop(id, tenant, turn, &c.session_id).await?;
                Ok(serde_json::to_value(TurnChildStopResult { stopped }).unwrap_or_default())
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
