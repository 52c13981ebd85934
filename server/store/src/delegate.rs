//! Sub-agents: a delegate call of a running turn starts a child session in the same
//! workspace (`parent` set, one level less of delegation) and its first turn; stopping the
//! parent's turn stops the turns of the children it started.

use std::{future::Future, pin::Pin};

use berth_protocol::{ErrorCode, EventPayload, SessionCreated};
use deadpool_postgres::GenericClient;

use crate::{
    Cached, Result, Store, StoreError,
    history::append_event,
    sessions::lock_session,
    tenant_tx, token,
    turns::{KeepText, cancel_turn, lock_running_turn},
};

impl Store {
    /// Start the child of `turn_id`'s delegate call `call_id` (or find the one already
    /// started for it) and its first turn with `prompt`. Returns (child session, its turn).
    /// A session with no delegation depth left is `forbidden`; a turn that already started
    /// `max_children` children is `child-limit`.
    pub async fn delegate(
        &self,
        connection_id: &str,
        tenant_id: &str,
        turn_id: &str,
        call_id: &str,
        prompt: &str,
        max_children: u32,
    ) -> Result<(String, String)> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let parent = lock_running_turn(&tx, Some(connection_id), tenant_id, turn_id).await?;
        let existing = tx
            .qo(
                "SELECT s.id, (SELECT t.id FROM turns t WHERE t.session_id = s.id ORDER BY t.created_at LIMIT 1),
                        (SELECT t.prompt FROM turns t WHERE t.session_id = s.id ORDER BY t.created_at LIMIT 1)
                          IS NOT DISTINCT FROM $4
                   FROM sessions s WHERE s.tenant_id = $1 AND s.parent_turn_id = $2 AND s.parent_call_id = $3",
                &[&tenant_id, &turn_id, &call_id, &prompt],
            )
            .await?;
        // The same call asked again (a retry) finds its child; another call under its id (a
        // model repeating an earlier step's call id) is refused, never answered with it. A
        // child left without its turn (none: the turn went in with it) takes this one.
        if existing
            .as_ref()
            .is_some_and(|r| r.get::<_, Option<String>>(1).is_some() && !r.get::<_, bool>(2))
        {
            return Err(StoreError::Code(ErrorCode::Conflict));
        }
        let child = match existing {
            Some(r) => {
                let (child, first): (String, Option<String>) = (r.get(0), r.get(1));
                if let Some(first) = first {
                    return Ok((child, first));
                }
                child
            }
            None => {
                // The children counted under the parent session's lock (held since
                // `lock_running_turn`): two delegate calls cannot both pass the bound.
                let s = tx
                    .q1(
                        concat!(
                            "SELECT s.workspace_id, s.model, s.no_tools, s.auto_approve, s.delegation_depth, ",
                            effective_auto_approve!(),
                            ", (SELECT count(*) FROM sessions c WHERE c.tenant_id = $2 AND c.parent_turn_id = $3)",
                            ", s.provider, s.base_url, ",
                            child_auto_approve_within!(),
                            ", s.agent_id FROM sessions s LEFT JOIN agents a ON a.id = s.agent_id WHERE s.id = $1"
                        ),
                        &[&parent, &tenant_id, &turn_id],
                    )
                    .await?;
                let depth: i32 = s.get(4);
                if depth <= 0 {
                    return Err(StoreError::Code(ErrorCode::Forbidden));
                }
                if s.get::<_, i64>(6) >= i64::from(max_children) {
                    return Err(StoreError::Code(ErrorCode::ChildLimit));
                }
                let child = token::new_id("ses");
                let workspace_id: String = s.get(0);
                tx.ex(
                    "INSERT INTO sessions (id, tenant_id, workspace_id, title, model, no_tools, auto_approve,
                                           parent_id, parent_turn_id, parent_call_id, delegation_depth,
                                           may_auto_approve, provider, base_url, auto_approve_within, agent_id)
                     VALUES ($1, $2, $3, '', $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
                    &[
                        &child,
                        &tenant_id,
                        &workspace_id,
                        &s.get::<_, Option<String>>(1),
                        &s.get::<_, bool>(2),
                        // The parent's own `autoApprove` only where it took effect: a session
                        // that asks (its agent beyond its bound) starts children that ask.
                        &(s.get::<_, bool>(3) && s.get::<_, bool>(5)),
                        &parent,
                        &turn_id,
                        &call_id,
                        &(depth - 1),
                        // A child's agent (set later) may not approve more than its parent.
                        &s.get::<_, bool>(5),
                        // The parent's provider and endpoint with its model: the model was
                        // vetted for them, not for the default profile (and its key).
                        &s.get::<_, Option<String>>(7),
                        &s.get::<_, Option<String>>(8),
                        // Nor auto-run more tools than the parent could.
                        &s.get::<_, Option<serde_json::Value>>(9),
                        // The parent's agent: its tools (a sub-agent gets no tool its parent's
                        // definition leaves out), instructions and model.
                        &s.get::<_, Option<String>>(10),
                    ],
                )
                .await?;
                let created = EventPayload::SessionCreated(SessionCreated {
                    workspace_id,
                    parent: Some(parent.clone()),
                });
                append_event(&tx, tenant_id, &child, None, &created, &[]).await?;
                child
            }
        };
        // The child's first turn goes in with the child, under the parent session's lock and
        // naming the parent's turn: a stop of the parent, which waits for that lock, finds
        // the child's turn and stops it too (admitted after the commit, it could start after
        // the stop had looked for it), and a failed admission leaves no child behind.
        let sent = crate::turns::admit(&tx, tenant_id, &child, prompt, &[], Some(turn_id)).await?;
        tx.commit().await?;
        Ok((child, sent.turn_id))
    }
}

/// Stop the running and queued turns of the sessions `turn_id` started (and theirs, in
/// turn), and the turns it sent to sessions started earlier (a coordinator's `send`). The
/// caller holds the parent session's lock; children are locked after it.
pub(crate) fn cancel_children<'a, C: GenericClient>(
    tx: &'a C,
    tenant_id: &'a str,
    turn_id: &'a str,
) -> Pin<Box<dyn Future<Output = Result<()>> + Send + 'a>> {
    Box::pin(async move {
        let children = tx
            .qa(
                "SELECT id, parent_turn_id IS NOT DISTINCT FROM $2 FROM sessions
                  WHERE tenant_id = $1 AND removed_at IS NULL
                    AND (parent_turn_id = $2
                         OR id IN (SELECT session_id FROM turns WHERE parent_turn_id = $2 AND state IN ('running', 'queued')))
                  ORDER BY id",
                &[&tenant_id, &turn_id],
            )
            .await?;
        for c in children {
            let (child, started_here): (String, bool) = (c.get(0), c.get(1));
            lock_session(tx, tenant_id, &child).await?;
            let active = tx
                .qa(
                    "SELECT id FROM turns WHERE session_id = $1 AND state IN ('running', 'queued')
                        AND ($2 OR parent_turn_id = $3) ORDER BY queue_position",
                    &[&child, &started_here, &turn_id],
                )
                .await?;
            for t in active {
                cancel_turn(tx, tenant_id, &child, t.get(0), true, KeepText::Stored).await?;
            }
        }
        Ok(())
    })
}
