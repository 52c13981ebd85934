//! Sessions: create, snapshot, list, rename, model, pause, remove, clear.

use berth_protocol::{
    Cleared, ErrorCode, EventPayload, ModelChanged, ModelLevel, Nothing, QUEUE_PREVIEW_BYTES, QueueEntry, QueueState,
    Removed, SessionCreateParams, SessionCreated, SessionKind, SessionListEntry, SessionListResult, SessionPhase,
    SessionSnapshot, TitleChanged,
};
use deadpool_postgres::GenericClient;

use crate::{
    Cached, Result, Store, StoreError,
    admin::{Actor, audit},
    fmt_time,
    history::append_event,
    not_found,
    receipts::{Receipt, finish},
    tenant_tx, token,
    turns::{KeepText, cancel_turn},
};

/// The model a session's turns use and where it comes from: the session's own choice, else
/// its agent's, else the tenant default (none: left out, never guessed).
fn effective(
    model: &Option<String>,
    agent_model: Option<String>,
    default_model: Option<&str>,
) -> (Option<String>, Option<ModelLevel>) {
    match (model, agent_model, default_model) {
        (Some(m), _, _) => (Some(m.clone()), Some(ModelLevel::Session)),
        (None, Some(a), _) => (Some(a), Some(ModelLevel::Agent)),
        (None, None, Some(d)) => (Some(d.to_string()), Some(ModelLevel::Tenant)),
        (None, None, None) => (None, None),
    }
}

/// A change to a session's own columns: `SET` clause (parameters from `$2`) and its values.
struct Change<'a> {
    set: &'static str,
    values: crate::Params<'a>,
}

/// Lock a live session of the tenant for the rest of the transaction; not-found otherwise.
pub(crate) async fn lock_session(tx: &impl GenericClient, tenant_id: &str, session_id: &str) -> Result<()> {
    let row = tx
        .qo(
            "SELECT 1 FROM sessions WHERE id = $1 AND tenant_id = $2 AND removed_at IS NULL FOR UPDATE",
            &[&session_id, &tenant_id],
        )
        .await?;
    if row.is_none() {
        return not_found();
    }
    Ok(())
}

/// Cancel the session's running and queued turns (removal, clearing); true when a queued
/// one was among them (the queue changed).
async fn cancel_active(tx: &impl GenericClient, tenant_id: &str, session_id: &str) -> Result<bool> {
    let active = tx
        .qa(
            "SELECT id, state = 'queued' FROM turns WHERE session_id = $1 AND state IN ('running', 'queued')",
            &[&session_id],
        )
        .await?;
    let mut queue_changed = false;
    for t in active {
        queue_changed |= t.get::<_, bool>(1);
        cancel_turn(tx, tenant_id, session_id, t.get(0), false, KeepText::No).await?;
    }
    Ok(queue_changed)
}

/// A queued turn's columns as a queue entry (`t` is `turns`): the prompt's first characters
/// only, so that no queue view ever copies whole prompts.
pub(crate) fn entry_columns() -> String {
    format!("t.id, substring(t.prompt for {QUEUE_PREVIEW_BYTES}), octet_length(t.prompt)::bigint, t.queue_revision")
}

/// A queue entry from [`entry_columns`] starting at column `at`.
pub(crate) fn entry_from(r: &tokio_postgres::Row, at: usize) -> QueueEntry {
    let id: String = r.get(at);
    let head: String = r.get(at + 1);
    QueueEntry {
        queue_id: id.clone(),
        turn_id: id,
        preview: berth_protocol::text::prefix(&head, QUEUE_PREVIEW_BYTES).to_string(),
        prompt_bytes: r.get::<_, i64>(at + 2) as u64,
        queue_revision: r.get(at + 3),
    }
}

/// The session's queue, in order.
pub(crate) async fn queue_state(tx: &impl GenericClient, session_id: &str) -> Result<QueueState> {
    let paused: bool = tx
        .q1("SELECT paused FROM sessions WHERE id = $1", &[&session_id])
        .await?
        .get(0);
    let rows = tx
        .qa(
            &format!(
                "SELECT {} FROM turns t WHERE t.session_id = $1 AND t.state = 'queued' ORDER BY t.queue_position",
                entry_columns()
            ),
            &[&session_id],
        )
        .await?;
    let queue = rows.iter().map(|r| entry_from(r, 0)).collect();
    Ok(QueueState { queue, paused })
}

/// Append `queue.changed` with the queue as it now is.
pub(crate) async fn queue_changed(tx: &impl GenericClient, tenant_id: &str, session_id: &str) -> Result<QueueState> {
    let state = queue_state(tx, session_id).await?;
    append_event(
        tx,
        tenant_id,
        session_id,
        None,
        &EventPayload::QueueChanged(state.clone()),
        &[],
    )
    .await?;
    Ok(state)
}

impl Store {
    /// Create a session in one of the tenant's workspaces.
    pub async fn create_session(
        &self,
        tenant_id: &str,
        p: &SessionCreateParams,
        default_model: Option<&str>,
        op: Option<&Receipt>,
    ) -> Result<SessionSnapshot> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let exists = tx
            .qo(
                "SELECT 1 FROM workspaces WHERE id = $1 AND tenant_id = $2",
                &[&p.workspace_id, &tenant_id],
            )
            .await?;
        if exists.is_none() {
            return not_found();
        }
        if let Some(agent) = &p.agent {
            crate::agents::agent_name(&tx, tenant_id, agent).await?;
        }
        let id = token::new_id("ses");
        let kind = p.kind.map(|k| k.as_str());
        // A coordinator's children keep the default depth of an ordinary session.
        let default_depth = if p.kind == Some(SessionKind::Coordinator) { 2 } else { 1 };
        let depth = i32::try_from(p.delegation_depth.unwrap_or(default_depth)).unwrap_or(i32::MAX);
        tx.ex(
            "INSERT INTO sessions (id, tenant_id, workspace_id, title, model, no_tools, auto_approve, provider, base_url,
                                   kind, delegation_depth, agent_id, channel)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
            &[
                &id,
                &tenant_id,
                &p.workspace_id,
                &p.title.clone().unwrap_or_default(),
                &p.model,
                &p.no_tools.unwrap_or(false),
                &p.auto_approve.unwrap_or(false),
                &p.provider,
                &p.base_url,
                &kind,
                &depth,
                &p.agent,
                &p.channel,
            ],
        )
        .await?;
        let created = EventPayload::SessionCreated(SessionCreated {
            workspace_id: p.workspace_id.clone(),
            parent: None,
        });
        append_event(&tx, tenant_id, &id, None, &created, &[]).await?;
        let snapshot = snapshot(&tx, tenant_id, &id, default_model).await?;
        finish(&tx, op, &snapshot).await?;
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
        let mut client = self.pool.get().await?;
        let client = tenant_tx(&mut client, tenant_id).await?;
        snapshot(&client, tenant_id, session_id, default_model).await
    }

    /// Sessions by `updatedAt` desc then id desc; `after` is the previous page's cursor.
    pub async fn list_sessions(
        &self,
        tenant_id: &str,
        workspace_id: Option<&str>,
        parent: Option<&str>,
        after: Option<&str>,
        limit: u32,
        default_model: Option<&str>,
    ) -> Result<SessionListResult> {
        let (after_us, after_id) = match after {
            None => (i64::MAX, String::new()),
            Some(c) => {
                let (us, id) = c.split_once(':').ok_or(StoreError::Code(ErrorCode::BadParams))?;
                (
                    us.parse().map_err(|_| StoreError::Code(ErrorCode::BadParams))?,
                    id.to_string(),
                )
            }
        };
        let limit = i64::from(limit.clamp(1, 200));
        let mut client = self.pool.get().await?;
        let client = tenant_tx(&mut client, tenant_id).await?;
        let rows = client
            .qa(
                "SELECT s.id, s.workspace_id, s.title, s.model, s.updated_at,
                        (extract(epoch from s.updated_at) * 1000000)::bigint AS us,
                        (SELECT count(*) FROM rows r WHERE r.session_id = s.id AND NOT r.hidden AND r.kind IN ('user', 'assistant')),
                        (SELECT t.id FROM turns t WHERE t.session_id = s.id AND t.state = 'running'),
                        (SELECT count(*) FROM turns t WHERE t.session_id = s.id AND t.state = 'queued'),
                        s.branch, s.kind, s.parent_id, s.agent_id, a.model, s.channel
                   FROM sessions s LEFT JOIN agents a ON a.id = s.agent_id
                  WHERE s.tenant_id = $1 AND s.removed_at IS NULL AND ($2::text IS NULL OR s.workspace_id = $2)
                    AND ($6::text IS NULL OR s.parent_id = $6)
                    AND ((extract(epoch from s.updated_at) * 1000000)::bigint, s.id) < ($3, $4)
                  ORDER BY s.updated_at DESC, s.id DESC LIMIT $5",
                &[&tenant_id, &workspace_id, &after_us, &after_id, &(limit + 1), &parent],
            )
            .await?;
        let more = rows.len() as i64 > limit;
        let mut entries = Vec::new();
        let mut next_after = None;
        for r in rows.iter().take(limit as usize) {
            let model: Option<String> = r.get(3);
            let (effective_model_id, effective_model_level) = effective(&model, r.get(13), default_model);
            let running: Option<String> = r.get(7);
            let id: String = r.get(0);
            next_after = Some(format!("{}:{}", r.get::<_, i64>(5), id));
            entries.push(SessionListEntry {
                session_id: id,
                workspace_id: r.get(1),
                title: r.get(2),
                model_id: model,
                effective_model_id,
                effective_model_level,
                agent_id: r.get(12),
                message_count: r.get(6),
                updated_at: fmt_time(r.get(4)),
                phase: if running.is_some() {
                    SessionPhase::Running
                } else {
                    SessionPhase::Idle
                },
                running,
                queued: r.get::<_, i64>(8) as u32,
                branch: branch_of(r.get(9)),
                kind: r.get::<_, Option<&str>>(10).and_then(SessionKind::parse),
                parent: r.get(11),
                channel: r.get(14),
            });
        }
        Ok(SessionListResult {
            entries,
            next_after: if more { next_after } else { None },
        })
    }

    pub async fn rename_session(
        &self,
        tenant_id: &str,
        session_id: &str,
        title: &str,
        default_model: Option<&str>,
        op: Option<&Receipt>,
    ) -> Result<SessionSnapshot> {
        let change = Change {
            set: "title = $2",
            values: &[&title],
        };
        let event = EventPayload::SessionTitleChanged(TitleChanged { title: title.into() });
        self.change_session(tenant_id, session_id, change, event, default_model, op)
            .await
    }

    pub async fn set_model(
        &self,
        tenant_id: &str,
        session_id: &str,
        provider: Option<&str>,
        model: Option<&str>,
        default_model: Option<&str>,
        op: Option<&Receipt>,
    ) -> Result<SessionSnapshot> {
        let change = Change {
            // Another profile forgets the client-chosen endpoint of the previous one.
            set: "base_url = CASE WHEN $2::text IS NOT DISTINCT FROM provider THEN base_url END,
                  provider = $2, model = $3",
            values: &[&provider, &model],
        };
        let event = EventPayload::SessionModelChanged(ModelChanged {
            provider: provider.map(Into::into),
            model: model.map(Into::into),
        });
        self.change_session(tenant_id, session_id, change, event, default_model, op)
            .await
    }

    /// Update session columns, record the change as an event, and answer the new snapshot.
    async fn change_session(
        &self,
        tenant_id: &str,
        session_id: &str,
        change: Change<'_>,
        event: EventPayload,
        default_model: Option<&str>,
        op: Option<&Receipt>,
    ) -> Result<SessionSnapshot> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        lock_session(&tx, tenant_id, session_id).await?;
        let mut values: Vec<crate::Param> = vec![&session_id];
        values.extend_from_slice(change.values);
        tx.ex(&format!("UPDATE sessions SET {} WHERE id = $1", change.set), &values)
            .await?;
        append_event(&tx, tenant_id, session_id, None, &event, &[]).await?;
        let snap = snapshot(&tx, tenant_id, session_id, default_model).await?;
        finish(&tx, op, &snap).await?;
        tx.commit().await?;
        Ok(snap)
    }

    /// Hold or release the queue; releasing lets the next queued turn start.
    pub async fn pause(
        &self,
        tenant_id: &str,
        session_id: &str,
        paused: bool,
        op: Option<&Receipt>,
    ) -> Result<QueueState> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        lock_session(&tx, tenant_id, session_id).await?;
        tx.ex("UPDATE sessions SET paused = $2 WHERE id = $1", &[&session_id, &paused])
            .await?;
        let state = queue_changed(&tx, tenant_id, session_id).await?;
        if !paused {
            crate::turns::notify_dispatch(&tx, session_id).await?;
        }
        finish(&tx, op, &state).await?;
        tx.commit().await?;
        Ok(state)
    }

    /// Remove a session (idempotent). A running turn is cancelled and its worker told to
    /// stop; anything it sends afterwards is refused, so nothing reappears.
    /// Audited as `actor`'s.
    pub async fn remove_session(
        &self,
        tenant_id: &str,
        session_id: &str,
        actor: &Actor<'_>,
        op: Option<&Receipt>,
    ) -> Result<Removed> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        crate::coordinator::lock_coordinator_of(&tx, tenant_id, session_id).await?;
        let live = tx
            .qo(
                "SELECT 1 FROM sessions WHERE id = $1 AND tenant_id = $2 AND removed_at IS NULL FOR UPDATE",
                &[&session_id, &tenant_id],
            )
            .await?;
        let result = Removed {
            removed: live.is_some(),
        };
        if live.is_some() {
            cancel_active(&tx, tenant_id, session_id).await?;
            tx.ex(
                "UPDATE sessions SET removed_at = now(), updated_at = now() WHERE id = $1",
                &[&session_id],
            )
            .await?;
            // Wake watchers so they notice the session is gone.
            tx.ex(
                "SELECT pg_notify($1, $2)",
                &[&crate::CHANNEL_EVENTS, &format!("{session_id}:0")],
            )
            .await?;
            audit(&tx, tenant_id, actor.0, "session.remove", session_id).await?;
        }
        finish(&tx, op, &result).await?;
        tx.commit().await?;
        Ok(result)
    }

    /// Forget history and queue (a running turn is stopped); `session.cleared` is the first
    /// event of what remains. Audited as `actor`'s.
    pub async fn clear_session(
        &self,
        tenant_id: &str,
        session_id: &str,
        actor: &Actor<'_>,
        op: Option<&Receipt>,
    ) -> Result<Cleared> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        crate::coordinator::lock_coordinator_of(&tx, tenant_id, session_id).await?;
        lock_session(&tx, tenant_id, session_id).await?;
        // Forget what exists now; the clear's own events (active turns ending, then
        // `session.cleared`) follow it, so a watcher caught up to this point sees no gap.
        let before: i64 = tx
            .q1("SELECT last_sequence FROM sessions WHERE id = $1", &[&session_id])
            .await?
            .get(0);
        // The rows with their events (no key cascades from one to the other: migration 0021).
        tx.ex("DELETE FROM rows WHERE session_id = $1", &[&session_id]).await?;
        tx.ex("DELETE FROM events WHERE session_id = $1", &[&session_id])
            .await?;
        let queue_was_cancelled = cancel_active(&tx, tenant_id, session_id).await?;
        let cleared = EventPayload::SessionCleared(Nothing {});
        let seq = append_event(&tx, tenant_id, session_id, None, &cleared, &[]).await?;
        if queue_was_cancelled {
            // Watchers drawing the queue see it empty (after the clear, so it is kept).
            queue_changed(&tx, tenant_id, session_id).await?;
        }
        tx.ex(
            "UPDATE sessions SET cleared_at_sequence = $2, revision = revision + 1 WHERE id = $1",
            &[&session_id, &(before + 1)],
        )
        .await?;
        audit(&tx, tenant_id, actor.0, "session.clear", session_id).await?;
        let result = Cleared { sequence: seq };
        finish(&tx, op, &result).await?;
        tx.commit().await?;
        Ok(result)
    }
}

/// A fork's stored `branch` (the `Branch` its fork answered with).
fn branch_of(stored: Option<serde_json::Value>) -> Option<berth_protocol::search::Branch> {
    serde_json::from_value(stored?).ok()
}

pub(crate) async fn snapshot(
    client: &impl GenericClient,
    tenant_id: &str,
    session_id: &str,
    default_model: Option<&str>,
) -> Result<SessionSnapshot> {
    // One statement: the session, its running turn and its queue.
    let row = client
        .qo(
            &format!("SELECT s.id, s.workspace_id, s.title, s.model, s.revision, s.last_sequence, s.created_at, s.updated_at,
                    s.paused, s.provider, s.kind, s.parent_id, s.delegation_depth,
                    (SELECT t.id FROM turns t WHERE t.session_id = s.id AND t.state = 'running'),
                    coalesce((SELECT json_agg(json_build_object('queueId', t.id, 'turnId', t.id,
                                                                'queueRevision', t.queue_revision,
                                                                'preview', substring(t.prompt for $3),
                                                                'promptBytes', octet_length(t.prompt)) ORDER BY t.queue_position)
                                FROM turns t WHERE t.session_id = s.id AND t.state = 'queued'), '[]'::json),
                    {}, s.agent_id, (SELECT a.model FROM agents a WHERE a.id = s.agent_id), s.channel, s.branch
               FROM sessions s WHERE s.id = $1 AND s.tenant_id = $2 AND s.removed_at IS NULL",
                crate::interactions::pending_json_sql()
            ),
            &[&session_id, &tenant_id, &(QUEUE_PREVIEW_BYTES as i32)],
        )
        .await?;
    let Some(row) = row else { return not_found() };
    let running: Option<String> = row.get(13);
    let mut queue: Vec<QueueEntry> = serde_json::from_value(row.get(14)).map_err(|e| StoreError::Other(e.into()))?;
    for e in &mut queue {
        let kept = berth_protocol::text::prefix(&e.preview, QUEUE_PREVIEW_BYTES).len();
        e.preview.truncate(kept);
    }
    let model: Option<String> = row.get(3);
    let (effective_model_id, effective_model_level) = effective(&model, row.get(17), default_model);
    Ok(SessionSnapshot {
        session_id: row.get(0),
        workspace_id: row.get(1),
        title: row.get(2),
        model_id: model,
        effective_model_id,
        effective_model_level,
        agent_id: row.get(16),
        phase: if running.is_some() {
            SessionPhase::Running
        } else {
            SessionPhase::Idle
        },
        running,
        queued: queue.len() as u32,
        queue,
        history_revision: row.get(4),
        revision: row.get(4),
        sequence: row.get(5),
        paused: row.get(8),
        pending_interactions: crate::interactions::parse_list(row.get(15))?,
        provider: row.get(9),
        kind: row.get::<_, Option<&str>>(10).and_then(SessionKind::parse),
        parent: row.get(11),
        channel: row.get(18),
        branch: branch_of(row.get(19)),
        delegation_depth: row.get::<_, i32>(12).max(0) as u32,
        created_at: fmt_time(row.get(6)),
        updated_at: fmt_time(row.get(7)),
    })
}
