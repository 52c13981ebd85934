//! `session.fork`: a side session from a settled turn or all current history.

use berth_protocol::{Branch, ErrorCode, EventPayload, Forked, SessionForkParams, SessionForkResult};

use crate::{
    Cached, Result, Store, StoreError,
    history::append_event,
    not_found,
    receipts::{Receipt, finish},
    sessions::lock_session,
    tenant_tx, token,
};

impl Store {
    /// Copy the source's history up to the fork point into a new session of the same
    /// workspace, in one transaction (so the fork and its receipt commit together). The
    /// fork keeps the source's sequences and positions, starts with no active work and
    /// without auto-approve, and inherits no diagnostics; a last `session.forked` event
    /// names the source.
    pub async fn fork_session(
        &self,
        tenant_id: &str,
        p: &SessionForkParams,
        op: Option<&Receipt>,
    ) -> Result<SessionForkResult> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let source = p.session_id.as_str();
        // Holding the source's row lock, no append can move the fork point under us.
        lock_session(&tx, tenant_id, source).await?;
        let s = tx
            .q1(
                "SELECT revision, last_sequence, cleared_at_sequence,
                        EXISTS (SELECT 1 FROM turns t WHERE t.session_id = s.id AND t.state = 'running')
                   FROM sessions s WHERE s.id = $1",
                &[&source],
            )
            .await?;
        let (revision, last, cleared, running): (i64, i64, i64, bool) = (s.get(0), s.get(1), s.get(2), s.get(3));
        if revision != p.source_revision {
            return Err(StoreError::Code(ErrorCode::StaleRevision));
        }
        let through = match &p.turn_id {
            Some(turn_id) => {
                let ended = tx
                    .qo(
                        "SELECT sequence FROM events
                          WHERE session_id = $1 AND tenant_id = $2 AND turn_id = $3 AND type = 'turn.ended'",
                        &[&source, &tenant_id, turn_id],
                    )
                    .await?;
                match ended {
                    Some(r) => r.get::<_, i64>(0),
                    None => {
                        // Known but not settled: its work cannot be included yet.
                        let active = tx
                            .qo(
                                "SELECT 1 FROM turns WHERE id = $1 AND session_id = $2 AND state IN ('running', 'queued')",
                                &[turn_id, &source],
                            )
                            .await?;
                        return match active {
                            Some(_) => Err(StoreError::Code(ErrorCode::TurnBusy)),
                            None => not_found(),
                        };
                    }
                }
            }
            None if running => return Err(StoreError::Code(ErrorCode::TurnBusy)),
            None => last,
        };
        let id = token::new_id("ses");
        let branch = Branch {
            session_id: source.to_string(),
            turn_id: p.turn_id.clone(),
            sequence: through,
        };
        let branch_json = serde_json::to_value(&branch).unwrap_or_default();
        tx.ex(
            "INSERT INTO sessions (id, tenant_id, workspace_id, title, model, provider, base_url, no_tools, auto_approve,
                                   last_sequence, cleared_at_sequence, branch, agent_id, channel)
             SELECT $1, tenant_id, workspace_id, title, model, provider, base_url, no_tools, false, $3, $4, $5, agent_id,
                    channel
               FROM sessions WHERE id = $2",
            &[&id, &source, &through, &cleared, &branch_json],
        )
        .await?;
        tx.ex(
            "INSERT INTO events (session_id, sequence, tenant_id, type, turn_id, payload, at)
             SELECT $1, sequence, tenant_id, type, turn_id, payload, at FROM events
              WHERE session_id = $2 AND tenant_id = $3 AND sequence <= $4",
            &[&id, &source, &tenant_id, &through],
        )
        .await?;
        tx.ex(
            "INSERT INTO rows (session_id, source_sequence, item_index, tenant_id, turn_id, kind, body, thinking, tool, hidden, attachments)
             SELECT $1, source_sequence, item_index, tenant_id, turn_id, kind, body, thinking, tool, hidden, attachments FROM rows
              WHERE session_id = $2 AND tenant_id = $3 AND source_sequence <= $4",
            &[&id, &source, &tenant_id, &through],
        )
        .await?;
        append_event(
            &tx,
            tenant_id,
            &id,
            None,
            &EventPayload::SessionForked(Forked { branch: branch.clone() }),
            &[],
        )
        .await?;
        let result = SessionForkResult { session_id: id, branch };
        finish(&tx, op, &result).await?;
        tx.commit().await?;
        Ok(result)
    }
}
