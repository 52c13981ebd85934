//! Admission (`session.send`): a prompt starts at once, handed to a worker connection of the
//! admitting replica when it holds one, or queues.

use berth_protocol::{
    ErrorCode, EventPayload, MAX_QUEUE_LENGTH, NewRow, Nothing, NoticeCode, NoticeLevel, QUEUE_PREVIEW_BYTES,
    QueueEntry, SessionSendResult, TurnQueued, TurnState,
};
use deadpool_postgres::GenericClient;
use serde_json::json;

use super::{
    claim::{ClaimedTurn, claim_reads, claimed_from, prepare_claim_reads},
    diagnostics::notice,
};
use crate::{
    CHANNEL_DISPATCH, Cached, Param, Result, Store, StoreError,
    attachments::check_attachment_ids,
    history::{EventRecord, append_event},
    not_found,
    receipts::{Receipt, finish},
    sessions::queue_changed,
    token,
    workspaces::online_sql,
};

/// Where a `session.send` is admitted ([`Store::admit`]).
#[derive(Debug, Clone, Copy)]
pub struct Admission<'a> {
    /// The admitting replica, named in the dispatch notification when it kicks its own
    /// worker connections itself after the commit ([`crate::dispatch_payload`]).
    pub replica: &'a str,
    /// Also return `turn.started` as written, for the admitting replica's own watchers (as
    /// [`Store::append_step`]; empty when the prompt queues or has attachments, whose names
    /// are added to its row after the append). The caller then hands it to them
    /// (`Hub::committed` in the API tier), and its notice goes out only when a watcher
    /// another replica holds is recorded.
    pub watched: bool,
    /// Worker connections this replica holds with room for one more turn: `(connection id,
    /// its workspace ids)`. A turn that starts at once in one of those workspaces is handed
    /// to that connection by the admission's own transaction, without a claim.
    pub workers: &'a [(&'a str, &'a [String])],
    /// The model a turn is dispatched with when neither its session nor its agent names one.
    pub default_model: Option<&'a str>,
}

/// A prompt admitted by [`Store::admit`].
#[derive(Debug)]
pub struct Admitted {
    pub result: SessionSendResult,
    /// The session's workspace.
    pub workspace_id: String,
    /// `turn.started` as written, when [`Admission::watched`] asked for it.
    pub events: Vec<EventRecord>,
    /// The turn, when the admission handed it to one of [`Admission::workers`]: that
    /// connection's id and what goes out in its `turn.run`.
    pub handed: Option<(String, ClaimedTurn)>,
}

impl Store {
    /// Admit a prompt. It starts at once when nothing runs in the session, the session is
    /// not paused and the workspace's worker is online; otherwise it queues.
    pub async fn send(
        &self,
        tenant_id: &str,
        session_id: &str,
        prompt: &str,
        op: Option<&Receipt>,
    ) -> Result<SessionSendResult> {
        Ok(self.admit(tenant_id, session_id, prompt, &[], op, None).await?.result)
    }

    /// [`Store::send`] with attachments (ids of the tenant's uploads, in the order the
    /// worker receives them; another tenant's id is `not-found`), also returning the
    /// session's workspace (so that a replica holding its worker can hand the started turn
    /// out at once). `from`: the admitting replica and what it holds ([`Admission`]).
    pub async fn admit(
        &self,
        tenant_id: &str,
        session_id: &str,
        prompt: &str,
        attachments: &[String],
        op: Option<&Receipt>,
        from: Option<&Admission<'_>>,
    ) -> Result<Admitted> {
        let client = self.pool.get().await?;
        // `BEGIN` and the tenant switch go out with admission's first statements: one wait.
        let tx = crate::Begun::new(&client);
        admit_in(
            tx.client(),
            Some(tx),
            tenant_id,
            session_id,
            prompt,
            attachments,
            None,
            op,
            from,
        )
        .await
    }
}

/// Admit a prompt to a session (locked here): it starts at once when nothing runs, the
/// session is not paused and its workspace's worker is online; otherwise it queues.
/// `parent_turn` is the coordinator turn that sent it (stopping that turn stops this one).
pub(crate) async fn admit(
    tx: &impl GenericClient,
    tenant_id: &str,
    session_id: &str,
    prompt: &str,
    attachments: &[String],
    parent_turn: Option<&str>,
) -> Result<SessionSendResult> {
    Ok(admit_in(
        tx,
        None,
        tenant_id,
        session_id,
        prompt,
        attachments,
        parent_turn,
        None,
        None,
    )
    .await?
    .result)
}

/// A turn admitted running: `$1` id, `$2` tenant, `$3` session, `$4` prompt, `$5` queue
/// position, `$6` attachment ids, `$7` parent turn; the dispatch notice `$9` goes out on
/// channel `$8` when `$10`.
const ADMIT_RUNNING_SQL: &str =
    "INSERT INTO turns (id, tenant_id, session_id, state, started_at, prompt, queue_position,
                                    attachment_ids, parent_turn_id)
                 SELECT $1, $2, $3, 'running', now(), $4, $5, $6, $7
                   FROM (SELECT (SELECT pg_notify($8, $9) WHERE $10)) wake";

/// [`ADMIT_RUNNING_SQL`] handed to worker connection `$11` at once (as [`CLAIM_SQL`] does,
/// `$12` the default model) if its presence row is there (locked, see [`admit_in`]);
/// returns [`claimed_columns`] and whether it was handed out.
///
/// [`CLAIM_SQL`]: super::claim::CLAIM_SQL
const ADMIT_HANDED_SQL: &str = concat!(
    "WITH t AS (
       INSERT INTO turns (id, tenant_id, session_id, state, started_at, prompt, queue_position,
                          attachment_ids, parent_turn_id, dispatched_to, model, provider, base_url)
       SELECT $1, $2, $3, 'running', now(), $4, $5, $6, $7,
              (SELECT connection_id FROM worker_presence WHERE connection_id = $11 AND tenant_id = $2 FOR KEY SHARE), ",
    dispatch_values!("$12"),
    "  FROM sessions s LEFT JOIN agents a ON a.id = s.agent_id, (SELECT (SELECT pg_notify($8, $9) WHERE $10)) wake
        WHERE s.id = $3
       RETURNING *)
     SELECT ",
    claimed_columns!(),
    ", t.dispatched_to IS NOT NULL
       FROM t JOIN sessions s ON s.id = t.session_id LEFT JOIN agents a ON a.id = s.agent_id"
);

/// The session's live turns and the next queue position, read under its lock. The
/// position is the last entry of `turns_session` (`ORDER BY … LIMIT 1`): the planner ran
/// `max()` over every turn of the session (its statistics see one turn a session).
const ADMIT_ACTIVE_SQL: &str = "SELECT
        (SELECT count(*) FROM turns WHERE session_id = $1 AND state = 'queued'),
        (SELECT count(*) FROM turns WHERE session_id = $1 AND state = 'running'),
        coalesce((SELECT queue_position FROM turns WHERE session_id = $1
                   ORDER BY queue_position DESC LIMIT 1), 0) + 1";

/// [`admit`], also returning the session's workspace. `commit`: the transaction is fresh
/// (`tx` is its client) and is committed here: the tenant switch is sent ahead of the first
/// statements (one wait for all of them), and a prompt that starts at once without
/// attachments or receipt is committed with its writes (one wait less; a receipt is
/// finished first, since a receipt this attempt no longer owns must roll the work back).
/// Without it, the caller's transaction is left open. `op` is finished with the result in
/// the same transaction. `from`: see [`Store::admit`].
#[allow(clippy::too_many_arguments)]
async fn admit_in(
    tx: &impl GenericClient,
    commit: Option<crate::Begun<'_>>,
    tenant_id: &str,
    session_id: &str,
    prompt: &str,
    attachments: &[String],
    parent_turn: Option<&str>,
    op: Option<&Receipt>,
    from: Option<&Admission<'_>>,
) -> Result<Admitted> {
    let replica = from.map(|a| a.replica);
    // Also whether the dispatch notice is needed: a worker connection serving the
    // workspace is recorded on another replica than `replica` (`$3`; which kicks its own
    // once this returns), stale rows included, or `replica` is null.
    let lock_sql = format!(
        "SELECT workspace_id, paused, {} AS online,
                $3::text IS NULL OR EXISTS (SELECT 1 FROM worker_presence p
                                             WHERE s.workspace_id = ANY(p.workspace_ids) AND p.replica_id <> $3)
           FROM sessions s
          WHERE id = $1 AND tenant_id = $2 AND (removed_at IS NULL) IS TRUE FOR UPDATE",
        online_sql("s.workspace_id")
    );
    // The tenant switch (on a fresh transaction), the session lock and the turns read again
    // under it (the read's snapshot is taken once the lock is held) go out together.
    let lock_params: [Param; 3] = [&session_id, &tenant_id, &replica];
    let active_params: [Param; 1] = [&session_id];
    let mut results = crate::pipelined(
        tx,
        commit.is_some().then_some((crate::TENANT_SQL, tenant_id)),
        &[(&lock_sql, &lock_params), (ADMIT_ACTIVE_SQL, &active_params)],
    )
    .await?;
    let active = results.pop().unwrap_or_default().into_iter().next();
    let session = results.pop().unwrap_or_default().into_iter().next();
    let Some(session) = session else { return not_found() };
    // Scalar subqueries: always one row.
    let active = active.ok_or(StoreError::Code(ErrorCode::Internal))?;
    let workspace_id: String = session.get(0);
    let paused: bool = session.get(1);
    let online: bool = session.get(2);
    let wake_elsewhere: bool = session.get(3);
    let (queued, running, position): (i64, i64, i64) = (active.get(0), active.get(1), active.get(2));
    let busy = queued + running > 0;
    if queued >= MAX_QUEUE_LENGTH as i64 {
        return Err(StoreError::Code(ErrorCode::QueueFull));
    }
    check_attachment_ids(tx, tenant_id, attachments).await?;
    let turn_id = token::new_id("trn");
    // The new turn's row, running or queued.
    let turn_values: [Param; 7] = [
        &turn_id,
        &tenant_id,
        &session_id,
        &prompt,
        &position,
        &attachments,
        &parent_turn,
    ];
    if !busy && !paused && online {
        let result = SessionSendResult {
            turn_id: turn_id.clone(),
            state: TurnState::Running,
            queue_id: None,
            queue_revision: None,
            revision: None,
        };
        // The turn goes in running (as `start_turn` leaves it), with the wake-up of the
        // replica holding the worker (delivered on commit) in the same statement; then
        // `turn.started` and the receipt, sent together. The insert is prepared first so
        // that it goes out, and runs, before the event that names the turn. The wake-up
        // goes out only when another replica may hold the worker (`wake_elsewhere`): it
        // wakes every replica's listener.
        //
        // When the admitting replica holds a connection serving the workspace, the insert
        // also hands the turn to it (as a claim would), and what its `turn.run` needs is
        // read with the writes: no claim transaction. The connection's presence row is
        // locked (`FOR KEY SHARE`) so that a connection ending meanwhile either sees the turn
        // when it interrupts its turns or has no row left, and then the turn goes in
        // unassigned, for a claim.
        let connection = from.and_then(|a| {
            a.workers
                .iter()
                .find(|(_, workspaces)| workspaces.contains(&workspace_id))
                .map(|(connection, _)| *connection)
        });
        let default_model = from.and_then(|a| a.default_model);
        let insert = tx
            .prepare_cached(if connection.is_some() {
                ADMIT_HANDED_SQL
            } else {
                ADMIT_RUNNING_SQL
            })
            .await?;
        let rows = [NewRow::user(prompt)];
        let started = EventPayload::TurnStarted(Nothing {});
        let wake = crate::dispatch_payload(&workspace_id, replica);
        // The `COMMIT` goes out with the writes when nothing has to be checked before it;
        // the append is prepared first (cached after the first use on a connection) so that
        // it is sent, and runs, before that `COMMIT`.
        let (commit_now, commit_after) = match commit {
            Some(c) if attachments.is_empty() && op.is_none() => (Some(c), None),
            other => (None, other),
        };
        if commit_now.is_some() {
            tx.prepare_cached(crate::history::APPEND_SQL).await?;
        }
        if connection.is_some() {
            prepare_claim_reads(tx).await?;
        }
        let commit_now = crate::commit_if(commit_now);
        let running: Vec<Param> = turn_values
            .iter()
            .copied()
            .chain([&CHANNEL_DISPATCH as Param, &wake, &wake_elsewhere])
            .collect();
        let handed: Vec<Param> = running
            .iter()
            .copied()
            .chain([&connection as Param, &default_model])
            .collect();
        // Attachments are read only for a prompt that has some.
        let turn_ids = if attachments.is_empty() {
            Vec::new()
        } else {
            vec![turn_id.clone()]
        };
        // `turn.started` is returned as written when the admitting replica has watchers to
        // hand it to (a prompt with attachments has its row named after the append).
        let local = from.filter(|a| a.watched && attachments.is_empty());
        let (handed, (seq, events), _, reads, ()) = tokio::try_join!(
            biased;
            async {
                if connection.is_some() {
                    tx.query_opt(&insert, &handed).await.map_err(StoreError::from)
                } else {
                    tx.execute(&insert, &running).await.map(|_| None).map_err(StoreError::from)
                }
            },
            crate::history::append_event_as_written(
                tx,
                tenant_id,
                session_id,
                Some(&turn_id),
                &started,
                &rows,
                // The admitting replica wakes its own watchers with the event as written
                // (the session is locked above): the notice is for other replicas' only.
                local.map(|a| a.replica),
                local.is_some(),
            ),
            finish(tx, op, &result),
            async {
                match connection {
                    Some(_) => claim_reads(tx, tenant_id, &turn_ids).await.map(Some),
                    None => Ok(None),
                }
            },
            commit_now,
        )?;
        if !attachments.is_empty() {
            crate::attachments::name_in_prompt_row(tx, tenant_id, session_id, &turn_id, seq).await?;
        }
        crate::commit_if(commit_after).await?;
        // Handed out unless the connection's presence was gone (`claimed_columns` and
        // whether it was assigned).
        let handed = match (handed, reads, connection) {
            (Some(row), Some(reads), Some(connection)) if row.get::<_, bool>(14) => {
                claimed_from(tenant_id, &[row], reads)
                    .pop()
                    .map(|turn| (connection.to_string(), turn))
            }
            _ => None,
        };
        return Ok(Admitted {
            result,
            workspace_id,
            events,
            handed,
        });
    }
    tx.ex(
        "INSERT INTO turns (id, tenant_id, session_id, state, prompt, queue_position, attachment_ids, parent_turn_id)
         VALUES ($1, $2, $3, 'queued', $4, $5, $6, $7)",
        &turn_values,
    )
    .await?;
    let entry = QueueEntry {
        queue_id: turn_id.clone(),
        turn_id: turn_id.clone(),
        queue_revision: 0,
        preview: berth_protocol::text::prefix(prompt, QUEUE_PREVIEW_BYTES).to_string(),
        prompt_bytes: prompt.len() as u64,
    };
    let queued = EventPayload::TurnQueued(TurnQueued { entry });
    append_event(tx, tenant_id, session_id, Some(&turn_id), &queued, &[]).await?;
    queue_changed(tx, tenant_id, session_id).await?;
    if !online {
        notice(
            tx,
            tenant_id,
            session_id,
            NoticeLevel::Warning,
            NoticeCode::WorkspaceOffline,
            json!({"workspaceId": workspace_id}),
        )
        .await?;
    }
    let result = SessionSendResult {
        queue_id: Some(turn_id.clone()),
        turn_id,
        state: TurnState::Queued,
        queue_revision: Some(0),
        revision: Some(0),
    };
    finish(tx, op, &result).await?;
    crate::commit_if(commit).await?;
    Ok(Admitted {
        result,
        workspace_id,
        events: Vec::new(),
        handed: None,
    })
}
