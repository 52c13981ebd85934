//! Sessions, turns and the dispatch of turns to workers.

use berth_protocol::{
    Cause, ErrorCode, ModelLevel, NewRow, QueueEntry, RowKind, SessionCreateParams,
    SessionSendResult, SessionSnapshot, TurnState,
    worker::{ChatMessage, TurnRun, Usage},
};
use deadpool_postgres::GenericClient;
use serde_json::json;

use crate::{
    CHANNEL_DISPATCH, Result, Store, StoreError, fmt_time, history::append_event, not_found, token,
    workspaces::online_sql,
};

/// A turn handed to a worker connection, with the session's tenant.
#[derive(Debug, Clone)]
pub struct ClaimedTurn {
    pub tenant_id: String,
    pub run: TurnRun,
}

impl Store {
    /// Create a session in one of the tenant's workspaces.
    pub async fn create_session(
        &self,
        tenant_id: &str,
        p: &SessionCreateParams,
        default_model: Option<&str>,
    ) -> Result<SessionSnapshot> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let exists = tx
            .query_opt(
                "SELECT 1 FROM workspaces WHERE id = $1 AND tenant_id = $2",
                &[&p.workspace_id, &tenant_id],
            )
            .await?;
        if exists.is_none() {
            return not_found();
        }
        let id = token::new_id("ses");
        tx.execute(
            "INSERT INTO sessions (id, tenant_id, workspace_id, title, model, no_tools, auto_approve)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &[
                &id,
                &tenant_id,
                &p.workspace_id,
                &p.title.clone().unwrap_or_default(),
                &p.model,
                &p.no_tools.unwrap_or(false),
                &p.auto_approve.unwrap_or(false),
            ],
        )
        .await?;
        append_event(
            &tx,
            tenant_id,
            &id,
            "session.created",
            None,
            json!({"workspaceId": p.workspace_id}),
            &[],
        )
        .await?;
        let snapshot = snapshot(&tx, tenant_id, &id, default_model).await?;
        tx.commit().await?;
        Ok(snapshot)
    }

    /// A session's snapshot.
    pub async fn get_session(
        &self,
        tenant_id: &str,
        session_id: &str,
        default_model: Option<&str>,
    ) -> Result<SessionSnapshot> {
        let client = self.pool.get().await?;
        snapshot(&client, tenant_id, session_id, default_model).await
    }

    /// Admit a prompt. It starts at once when nothing runs in the session, the session is
    /// not paused and the workspace's worker is online; otherwise it queues.
    pub async fn send(
        &self,
        tenant_id: &str,
        session_id: &str,
        prompt: &str,
    ) -> Result<SessionSendResult> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let session = tx
            .query_opt(
                &format!(
                    "SELECT workspace_id, paused, {} AS online FROM sessions s
                      WHERE id = $1 AND tenant_id = $2 AND removed_at IS NULL FOR UPDATE",
                    online_sql("s.workspace_id")
                ),
                &[&session_id, &tenant_id],
            )
            .await?;
        let Some(session) = session else {
            return not_found();
        };
        let workspace_id: String = session.get(0);
        let paused: bool = session.get(1);
        let online: bool = session.get(2);
        let running: bool = tx
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM turns WHERE session_id = $1 AND state = 'running')",
                &[&session_id],
            )
            .await?
            .get(0);
        let turn_id = token::new_id("trn");
        let position: i64 = tx
            .query_one(
                "SELECT coalesce(max(queue_position), 0) + 1 FROM turns WHERE session_id = $1",
                &[&session_id],
            )
            .await?
            .get(0);
        tx.execute(
            "INSERT INTO turns (id, tenant_id, session_id, state, prompt, queue_position) VALUES ($1, $2, $3, 'queued', $4, $5)",
            &[&turn_id, &tenant_id, &session_id, &prompt, &position],
        )
        .await?;
        let result = if !running && !paused && online {
            start_turn(&tx, tenant_id, session_id, &turn_id, prompt).await?;
            tx.execute(
                "SELECT pg_notify($1, $2)",
                &[&CHANNEL_DISPATCH, &workspace_id],
            )
            .await?;
            SessionSendResult {
                turn_id,
                state: TurnState::Running,
                queue_id: None,
                revision: None,
            }
        } else {
            append_event(
                &tx,
                tenant_id,
                session_id,
                "turn.queued",
                Some(&turn_id),
                json!({}),
                &[],
            )
            .await?;
            if !online {
                append_event(
                    &tx,
                    tenant_id,
                    session_id,
                    "session.notice",
                    None,
                    json!({"level": "warning", "code": "workspace-offline", "params": {"workspaceId": workspace_id}}),
                    &[],
                )
                .await?;
            }
            SessionSendResult {
                queue_id: Some(turn_id.clone()),
                turn_id,
                state: TurnState::Queued,
                revision: Some(0),
            }
        };
        tx.commit().await?;
        Ok(result)
    }

    /// Hand out work to a worker connection serving `workspace_ids`: start the next queued
    /// turn of every idle session there, then claim every running turn not yet handed out.
    pub async fn claim_turns(
        &self,
        connection_id: &str,
        tenant_id: &str,
        workspace_ids: &[String],
    ) -> Result<Vec<ClaimedTurn>> {
        let mut client = self.pool.get().await?;
        let candidates = client
            .query(
                "SELECT DISTINCT ON (t.session_id) t.id, t.session_id, t.prompt FROM turns t JOIN sessions s ON s.id = t.session_id
                  WHERE s.tenant_id = $1 AND s.workspace_id = ANY($2) AND t.state = 'queued' AND NOT s.paused AND s.removed_at IS NULL
                    AND NOT EXISTS (SELECT 1 FROM turns r WHERE r.session_id = t.session_id AND r.state = 'running')
                  ORDER BY t.session_id, t.queue_position",
                &[&tenant_id, &workspace_ids],
            )
            .await?;
        for c in candidates {
            let (turn_id, session_id, prompt): (String, String, String) =
                (c.get(0), c.get(1), c.get(2));
            let tx = client.transaction().await?;
            // Re-check under the session lock: another replica may have started one.
            tx.query_one(
                "SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE",
                &[&session_id],
            )
            .await?;
            let still: bool = tx
                .query_one(
                    "SELECT (SELECT state FROM turns WHERE id = $1) = 'queued'
                        AND NOT EXISTS (SELECT 1 FROM turns WHERE session_id = $2 AND state = 'running')",
                    &[&turn_id, &session_id],
                )
                .await?
                .get(0);
            if still {
                start_turn(&tx, tenant_id, &session_id, &turn_id, &prompt).await?;
            }
            tx.commit().await?;
        }
        let claimed = client
            .query(
                "UPDATE turns t SET dispatched_to = $1 FROM sessions s
                  WHERE s.id = t.session_id AND s.tenant_id = $2 AND s.workspace_id = ANY($3)
                    AND t.state = 'running' AND t.dispatched_to IS NULL AND s.removed_at IS NULL
                  RETURNING t.id, t.session_id, s.workspace_id, s.model",
                &[&connection_id, &tenant_id, &workspace_ids],
            )
            .await?;
        let mut out = Vec::with_capacity(claimed.len());
        for c in claimed {
            let session_id: String = c.get(1);
            let messages = messages(&client, tenant_id, &session_id).await?;
            out.push(ClaimedTurn {
                tenant_id: tenant_id.to_string(),
                run: TurnRun {
                    turn_id: c.get(0),
                    session_id,
                    workspace_id: c.get(2),
                    model: c.get(3),
                    messages,
                },
            });
        }
        Ok(out)
    }

    /// Persist a completed model step as one `model.completed` event. Only the connection
    /// the turn was handed to may write to it.
    pub async fn append_step(
        &self,
        connection_id: &str,
        tenant_id: &str,
        turn_id: &str,
        rows: &[NewRow],
        usage: Option<Usage>,
    ) -> Result<i64> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let session_id = running_turn_session(&tx, connection_id, tenant_id, turn_id).await?;
        let payload = json!({ "usage": usage });
        let seq = append_event(
            &tx,
            tenant_id,
            &session_id,
            "model.completed",
            Some(turn_id),
            payload,
            rows,
        )
        .await?;
        tx.commit().await?;
        Ok(seq)
    }

    /// Settle a running turn; the next queued turn of the session may then start.
    /// Returns the session id and the `turn.ended` sequence.
    pub async fn end_turn(
        &self,
        connection_id: Option<&str>,
        tenant_id: &str,
        turn_id: &str,
        state: TurnState,
        cause: Option<&Cause>,
    ) -> Result<(String, i64)> {
        if !state.is_settled() {
            return Err(StoreError::Code(ErrorCode::BadParams));
        }
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let session_id = match connection_id {
            Some(conn) => running_turn_session(&tx, conn, tenant_id, turn_id).await?,
            None => tx
                .query_opt("SELECT session_id FROM turns WHERE id = $1 AND tenant_id = $2 AND state = 'running'", &[&turn_id, &tenant_id])
                .await?
                .map(|r| r.get(0))
                .ok_or(StoreError::Code(ErrorCode::TurnNotRunning))?,
        };
        tx.query_one(
            "SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE",
            &[&session_id],
        )
        .await?;
        let cause_json = cause.map(|c| serde_json::to_value(c).unwrap_or_default());
        tx.execute(
            "UPDATE turns SET state = $2, cause = $3, ended_at = now() WHERE id = $1",
            &[&turn_id, &state.as_str(), &cause_json],
        )
        .await?;
        let mut payload = json!({ "state": state });
        if let Some(c) = cause {
            payload["cause"] = serde_json::to_value(c).unwrap_or_default();
        }
        let seq = append_event(
            &tx,
            tenant_id,
            &session_id,
            "turn.ended",
            Some(turn_id),
            payload,
            &[],
        )
        .await?;
        let workspace_id: String = tx
            .query_one(
                "SELECT workspace_id FROM sessions WHERE id = $1",
                &[&session_id],
            )
            .await?
            .get(0);
        tx.execute(
            "SELECT pg_notify($1, $2)",
            &[&CHANNEL_DISPATCH, &workspace_id],
        )
        .await?;
        tx.commit().await?;
        Ok((session_id, seq))
    }

    /// The worker connection is gone: its running turns end `interrupted` (never retried).
    pub async fn interrupt_connection(&self, connection_id: &str) -> Result<Vec<String>> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "SELECT id, tenant_id FROM turns WHERE dispatched_to = $1 AND state = 'running'",
                &[&connection_id],
            )
            .await?;
        drop(client);
        let cause = Cause {
            code: "worker-lost".into(),
            status: None,
        };
        let mut ended = Vec::new();
        for r in rows {
            let (turn, tenant): (String, String) = (r.get(0), r.get(1));
            match self
                .end_turn(None, &tenant, &turn, TurnState::Interrupted, Some(&cause))
                .await
            {
                Ok(_) => ended.push(turn),
                Err(StoreError::Code(ErrorCode::TurnNotRunning)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(ended)
    }

    /// The session of a running turn (for routing live deltas), tenant-scoped.
    pub async fn turn_session(&self, tenant_id: &str, turn_id: &str) -> Result<String> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt(
                "SELECT session_id FROM turns WHERE id = $1 AND tenant_id = $2",
                &[&turn_id, &tenant_id],
            )
            .await?;
        row.map(|r| r.get(0))
            .ok_or(StoreError::Code(ErrorCode::NotFound))
    }
}

async fn running_turn_session(
    tx: &impl GenericClient,
    connection_id: &str,
    tenant_id: &str,
    turn_id: &str,
) -> Result<String> {
    let row = tx
        .query_opt(
            "SELECT session_id, state, dispatched_to FROM turns WHERE id = $1 AND tenant_id = $2",
            &[&turn_id, &tenant_id],
        )
        .await?;
    let Some(row) = row else { return not_found() };
    let state: String = row.get(1);
    let to: Option<String> = row.get(2);
    if state != "running" || to.as_deref() != Some(connection_id) {
        return Err(StoreError::Code(ErrorCode::TurnNotRunning));
    }
    Ok(row.get(0))
}

/// queued → running, publishing the prompt as the user row of `turn.started`.
async fn start_turn(
    tx: &impl GenericClient,
    tenant_id: &str,
    session_id: &str,
    turn_id: &str,
    prompt: &str,
) -> Result<i64> {
    tx.execute(
        "UPDATE turns SET state = 'running', started_at = now() WHERE id = $1",
        &[&turn_id],
    )
    .await?;
    let row = NewRow {
        kind: RowKind::User,
        body: prompt.to_string(),
        thinking: None,
        tool: None,
        hidden: None,
    };
    append_event(
        tx,
        tenant_id,
        session_id,
        "turn.started",
        Some(turn_id),
        json!({}),
        &[row],
    )
    .await
}

/// The conversation so far as chat messages (visible user and assistant rows, in order).
async fn messages(
    client: &impl GenericClient,
    tenant_id: &str,
    session_id: &str,
) -> Result<Vec<ChatMessage>> {
    let rows = client
        .query(
            "SELECT kind, body FROM rows WHERE session_id = $1 AND tenant_id = $2 AND kind IN ('user', 'assistant')
              ORDER BY source_sequence, item_index",
            &[&session_id, &tenant_id],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| ChatMessage {
            role: r.get(0),
            content: r.get(1),
        })
        .collect())
}

async fn snapshot(
    client: &impl GenericClient,
    tenant_id: &str,
    session_id: &str,
    default_model: Option<&str>,
) -> Result<SessionSnapshot> {
    let row = client
        .query_opt(
            "SELECT id, workspace_id, title, model, revision, last_sequence, created_at, updated_at FROM sessions
              WHERE id = $1 AND tenant_id = $2 AND removed_at IS NULL",
            &[&session_id, &tenant_id],
        )
        .await?;
    let Some(row) = row else { return not_found() };
    let turns = client
        .query(
            "SELECT id, state, prompt, queue_revision FROM turns WHERE session_id = $1 AND state IN ('running', 'queued')
              ORDER BY queue_position",
            &[&session_id],
        )
        .await?;
    let running = turns
        .iter()
        .find(|t| t.get::<_, &str>(1) == "running")
        .map(|t| t.get::<_, String>(0));
    let queued = turns
        .iter()
        .filter(|t| t.get::<_, &str>(1) == "queued")
        .map(|t| QueueEntry {
            queue_id: t.get(0),
            turn_id: t.get(0),
            prompt: t.get(2),
            revision: t.get(3),
        })
        .collect();
    let model: Option<String> = row.get(3);
    let (effective_model_id, effective_model_level) = match (&model, default_model) {
        (Some(m), _) => (Some(m.clone()), Some(ModelLevel::Session)),
        (None, Some(d)) => (Some(d.to_string()), Some(ModelLevel::Tenant)),
        (None, None) => (None, None),
    };
    Ok(SessionSnapshot {
        session_id: row.get(0),
        workspace_id: row.get(1),
        title: row.get(2),
        model_id: model,
        effective_model_id,
        effective_model_level,
        phase: if running.is_some() { "running" } else { "idle" }.into(),
        running,
        queued,
        revision: row.get(4),
        sequence: row.get(5),
        created_at: fmt_time(row.get(6)),
        updated_at: fmt_time(row.get(7)),
    })
}
