//! Settling a turn: its end (with its last step), a stop or cancel, and the lock on a running
//! turn that every writer of a turn takes.

use berth_protocol::{
    Cause, DiagnosticKind, ErrorCode, EventPayload, NewRow, RowKind, TurnEnded, TurnRef, TurnState, worker::Usage,
};
use deadpool_postgres::GenericClient;

use super::{
    diagnostics::diagnostic,
    sql::{LOCK_SESSION_OF_TURN, RELAY_SQL, STEP_SQL},
    steps::{Metered, Partial, StepParams},
};
use crate::{
    CHANNEL_CONTROL, CHANNEL_DELTAS, CHANNEL_DISPATCH, Cached, Param, Result, Store, StoreError,
    history::{EventRecord, append_event},
    not_found,
    receipts::{Receipt, finish},
    sessions::{lock_session, queue_changed},
    tenant_tx,
};

/// A settled turn: its session, the sequence of `turn.ended`, and — when asked for — the
/// events the end wrote, as a catch-up would read them (empty otherwise).
#[derive(Debug)]
pub struct Ended {
    pub session_id: String,
    pub sequence: i64,
    pub events: Vec<EventRecord>,
    /// The session may still get its automatic title (untitled, never attempted): only
    /// then is the attempt worth a transaction of its own.
    pub untitled: bool,
}

impl Store {
    /// Stop exactly this turn: a running one is cancelled (its worker told to stop), a
    /// queued one leaves the queue. A settled turn is `turn-not-running`.
    pub async fn stop_turn(
        &self,
        tenant_id: &str,
        session_id: &str,
        turn_id: &str,
        seen: Option<&Partial>,
        op: Option<&Receipt>,
    ) -> Result<TurnRef> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        crate::coordinator::lock_coordinator_of(&tx, tenant_id, session_id).await?;
        lock_session(&tx, tenant_id, session_id).await?;
        let keep = match seen {
            Some(p) if p.turn_id == turn_id => KeepText::Seen(p),
            _ => KeepText::Stored,
        };
        cancel_turn(&tx, tenant_id, session_id, turn_id.to_string(), true, keep).await?;
        let result = TurnRef {
            turn_id: turn_id.to_string(),
            state: TurnState::Cancelled,
        };
        finish(&tx, op, &result).await?;
        tx.commit().await?;
        Ok(result)
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
        let ended = self
            .end_turn_with_step(connection_id, tenant_id, turn_id, None, state, cause, &[], None, false)
            .await?;
        Ok((ended.session_id, ended.sequence))
    }

    /// [`Store::end_turn`], first appending the turn's last step (`model.completed`, as
    /// [`Store::append_step`]) in the same transaction: one commit on the turn's critical
    /// path instead of two, and no reader ever sees the answer without the end or the
    /// reverse. `relay`: live output for other replicas' watchers (payloads on
    /// [`CHANNEL_DELTAS`]), notified before the end's events. `replica`: as in
    /// [`Store::append_step`]; an end with a cause always notifies, since its diagnostic
    /// wakes `session.watchDiagnostics` on every replica through the session's notice.
    /// `local`: return the step's and the end's events as written, for the caller's own
    /// watchers (as [`Store::append_step`]; none when interactions of the turn had to be
    /// closed first, whose events the watchers read). The step comes with its metered
    /// usage, as [`Store::append_step`]'s.
    #[allow(clippy::too_many_arguments)]
    pub async fn end_turn_with_step(
        &self,
        connection_id: Option<&str>,
        tenant_id: &str,
        turn_id: &str,
        step: Option<(&[NewRow], &[Metered])>,
        state: TurnState,
        cause: Option<&Cause>,
        relay: &[String],
        replica: Option<&str>,
        local: bool,
    ) -> Result<Ended> {
        if !state.is_settled() {
            return Err(StoreError::Code(ErrorCode::BadParams));
        }
        let client = self.pool.get().await?;
        let cause_json = cause.map(|c| serde_json::to_value(c).unwrap_or_default());
        // `turn.ended` without its usage, which END_SQL adds from the turn's totals.
        let mut ended = serde_json::to_value(TurnEnded {
            state,
            cause: cause.cloned(),
            usage: None,
        })
        .map_err(|e| StoreError::Other(e.into()))?;
        if let Some(fields) = ended.as_object_mut() {
            fields.remove("type");
        }
        let ended_type = EventPayload::TurnEnded(TurnEnded {
            state,
            cause: None,
            usage: None,
        })
        .type_name();
        let step = step.map(|(rows, metered)| StepParams::new(rows, metered));
        // Live output concerns watches only, which record themselves (`relay_params`).
        let relay_replica = replica;
        let replica = replica.filter(|_| cause.is_none());
        // The end's notice (a later sequence) wakes whoever the step's would have.
        let step_params = step
            .as_ref()
            .map(|s| s.params(&turn_id, &tenant_id, &connection_id, &replica, &false, &local));
        // Everything up to the commit goes out with the tenant switch, in order: the
        // coordinator's lock (if the session is a child), the session's lock and the turn read
        // under it, the relay, the step and the end — each written only if the turn runs (and
        // the end only if no interaction of the turn is pending, which must be closed first).
        let key: [Param; 2] = [&turn_id, &tenant_id];
        let relay_params: [Param; 6] = [
            &turn_id,
            &tenant_id,
            &connection_id,
            &CHANNEL_DELTAS,
            &relay,
            &relay_replica,
        ];
        let state_str = state.as_str();
        let end_params: [Param; 10] = [
            &turn_id,
            &tenant_id,
            &connection_id,
            &state_str,
            &cause_json,
            &ended,
            &ended_type,
            &CHANNEL_DISPATCH,
            &crate::CHANNEL_EVENTS,
            &replica,
        ];
        let mut statements: Vec<(&str, &[Param])> = vec![
            (crate::coordinator::LOCK_COORDINATOR_OF_TURN, &key),
            (LOCK_SESSION_OF_TURN, &key),
            (READ_TURN, &key),
        ];
        if !relay.is_empty() {
            statements.push((RELAY_SQL, &relay_params));
        }
        if let Some(p) = &step_params {
            statements.push((STEP_SQL, p));
        }
        statements.push((END_SQL, &end_params));
        // `BEGIN` goes out with them rather than awaited alone: one wait less. Dropped without
        // its commit (an error, a cancelled caller), the transaction is rolled back.
        let tx = crate::Begun::new(&client);
        let results = crate::pipelined(tx.client(), Some((crate::TENANT_SQL, tenant_id)), &statements).await?;
        let session_id = check_running(results[1].first(), results[2].first(), connection_id)?;
        let child = !results[0].is_empty();
        let mut events = Vec::new();
        let ended = results.last().and_then(|r| r.first());
        // END_SQL's last column; unknown when interactions had to be closed first (no line):
        // the title's claim decides then.
        let untitled = ended.is_none_or(|r| r.get(8));
        let seq = match ended {
            Some(r) => {
                if local {
                    if step_params.is_some() {
                        crate::history::events_from_lines(&results[results.len() - 2], 0, true, &mut events)?;
                    }
                    crate::history::events_from_lines(&results[results.len() - 1], 0, false, &mut events)?;
                }
                r.get(0)
            }
            // An interaction of the turn is pending: closed first (its resolution comes
            // before `turn.ended`), then the turn settles as before.
            None => {
                settle_after_interactions(tx.client(), tenant_id, &session_id, turn_id, state, cause, &cause_json)
                    .await?
            }
        };
        if child {
            crate::coordinator::child_ended(tx.client(), tenant_id, &session_id, turn_id, state, cause).await?;
        }
        if let Some(c) = cause {
            let kind = if state == TurnState::Interrupted {
                DiagnosticKind::Execution
            } else {
                DiagnosticKind::ModelStep
            };
            diagnostic(tx.client(), tenant_id, &session_id, kind, Some(turn_id), Some(seq), c).await?;
        }
        tx.commit().await?;
        Ok(Ended {
            session_id,
            sequence: seq,
            events,
            untitled,
        })
    }
}

/// Wake the replica holding the session's workspace worker: turns may be handed out.
pub(crate) async fn notify_dispatch(tx: &impl GenericClient, session_id: &str) -> Result<()> {
    tx.ex(
        "SELECT pg_notify($1, workspace_id) FROM sessions WHERE id = $2",
        &[&CHANNEL_DISPATCH, &session_id],
    )
    .await?;
    Ok(())
}

/// What a cancelled running turn keeps of its running step's text.
pub(crate) enum KeepText<'a> {
    /// Nothing (a removal or a clear).
    No,
    /// The text stored so far (`partial_text`, written a little behind the live stream).
    Stored,
    /// The text the stopping replica's watchers were shown, when it holds the turn's
    /// worker: ahead of the stored text by what is not written yet, so that the stop keeps
    /// what was seen. Taken only for the turn's current step and when it extends the
    /// stored text.
    Seen(&'a Partial),
}

/// Cancel one running or queued turn of a locked session. A running turn's worker is told
/// to stop (`berth_control`); whatever it sends afterwards is refused. Unless `keep_text`
/// is [`KeepText::No`] (a stop, not a removal or clear), the running step's text so far
/// becomes the assistant row of its `turn.ended`.
pub(crate) async fn cancel_turn(
    tx: &impl GenericClient,
    tenant_id: &str,
    session_id: &str,
    turn_id: String,
    queue_event: bool,
    keep_text: KeepText<'_>,
) -> Result<()> {
    let row = tx
        .qo(
            "SELECT state, dispatched_to, partial_text, partial_thinking, step FROM turns
              WHERE id = $1 AND session_id = $2 AND tenant_id = $3 FOR UPDATE",
            &[&turn_id, &session_id, &tenant_id],
        )
        .await?;
    let Some(row) = row else { return not_found() };
    let state: String = row.get(0);
    let dispatched: Option<String> = row.get(1);
    // What the running step had written when it was stopped stays in the history, as the
    // turn's last answer (issue 52: a stopped turn's text is kept, live and on reopen).
    let (mut text, mut thinking): (String, String) = (row.get(2), row.get(3));
    // The same step only: a step stored just before the stop cleared the stored text,
    // and the replica's copy of that step (not cleared yet) is in the history already.
    let step: i32 = row.get(4);
    if let KeepText::Seen(seen) = keep_text
        && seen.step == step
        && seen.text.starts_with(&text)
        && seen.thinking.starts_with(&thinking)
    {
        text.clone_from(&seen.text);
        thinking.clone_from(&seen.thinking);
    }
    let keep = !matches!(keep_text, KeepText::No);
    let kept: Vec<NewRow> = if keep && state == "running" && !(text.is_empty() && thinking.is_empty()) {
        vec![NewRow {
            kind: RowKind::Assistant,
            body: text,
            thinking: (!thinking.is_empty()).then_some(thinking),
            tool: None,
            hidden: None,
        }]
    } else {
        Vec::new()
    };
    match state.as_str() {
        "running" | "queued" => {}
        _ => return Err(StoreError::Code(ErrorCode::TurnNotRunning)),
    }
    tx.ex(
        "UPDATE turns SET state = 'cancelled', ended_at = now(), partial_text = '', partial_thinking = '' WHERE id = $1",
        &[&turn_id],
    )
    .await?;
    let ended = EventPayload::TurnEnded(TurnEnded {
        state: TurnState::Cancelled,
        cause: None,
        usage: None,
    });
    crate::interactions::close_for_turn(tx, tenant_id, &turn_id).await?;
    append_event(tx, tenant_id, session_id, Some(&turn_id), &ended, &kept).await?;
    crate::coordinator::child_ended(tx, tenant_id, session_id, &turn_id, TurnState::Cancelled, None).await?;
    if state == "running" {
        if let Some(conn) = dispatched {
            tx.ex(
                "SELECT pg_notify($1, $2)",
                &[&CHANNEL_CONTROL, &format!("stop:{conn}:{turn_id}")],
            )
            .await?;
        }
        notify_dispatch(tx, session_id).await?;
        // Sub-agents it started stop with it.
        crate::delegate::cancel_children(tx, tenant_id, &turn_id).await?;
    } else if queue_event {
        queue_changed(tx, tenant_id, session_id).await?;
    }
    Ok(())
}

/// A running turn ([`running_turn_sql`]) with no pending interaction settles in one
/// statement: state `$4` and cause `$5`, the session's sequence bumped, `turn.ended` (`$7`;
/// payload `$6` plus the turn's metered usage, if any) appended, the dispatch notice (`$8`)
/// when a turn of the session is queued (the next one may start now; the turn's own
/// connection freeing a slot for another session's turn is its replica's business, see
/// `workers/steps.rs`), and the event's notice (`$9`) when someone may need it (as in
/// [`STEP_SQL`], `$10` the appending replica or null). Returns the event as a catch-up reads
/// it (the sequence first; as [`STEP_SQL`], without rows), or no row when nothing was
/// written.
const END_SQL: &str = concat!(
    "WITH t AS (",
    running_turn_sql!(),
    "),
     u AS (UPDATE turns x SET state = $4, cause = $5, ended_at = now(), partial_text = '', partial_thinking = ''
            WHERE x.id = $1 AND EXISTS (SELECT 1 FROM t)
              AND NOT EXISTS (SELECT 1 FROM interactions i WHERE i.turn_id = $1 AND i.tenant_id = $2 AND i.state = 'pending')
           RETURNING x.input_tokens, x.output_tokens),
     s AS (UPDATE sessions SET last_sequence = last_sequence + 1, updated_at = now()
            WHERE id = (SELECT session_id FROM t) AND tenant_id = $2 AND EXISTS (SELECT 1 FROM u)
           RETURNING id, last_sequence, workspace_id, title = '' AND NOT title_attempted AS untitled),
     e AS (INSERT INTO events (session_id, sequence, tenant_id, type, turn_id, payload)
           SELECT s.id, s.last_sequence, $2, $7, $1,
                  $6::jsonb || CASE WHEN u.input_tokens > 0 OR u.output_tokens > 0
                                    THEN jsonb_build_object('usage', jsonb_build_object(
                                             'inputTokens', greatest(u.input_tokens, 0),
                                             'outputTokens', greatest(u.output_tokens, 0)))
                                    ELSE '{}'::jsonb END
             FROM s, u
           RETURNING type, turn_id, payload, at)
     SELECT s.last_sequence, true, e.type, e.turn_id, e.payload, e.at,
            (SELECT pg_notify($8, s.workspace_id)
              WHERE EXISTS (SELECT 1 FROM turns q WHERE q.session_id = s.id AND q.state = 'queued')),
            (SELECT pg_notify($9, s.id || ':' || s.last_sequence) WHERE ",
    watched_elsewhere_sql!("$10"),
    "), s.untitled FROM s CROSS JOIN e"
);

/// Lock the session of a running turn and return its id: the session row first (as stop,
/// clear and remove do), then the turn is checked under that lock — still running, its
/// session not removed, and, when a worker connection writes, handed to that connection. A
/// turn settled meanwhile is `turn-not-running`, so nothing is written after `turn.ended`.
pub(crate) async fn lock_running_turn(
    tx: &impl GenericClient,
    connection_id: Option<&str>,
    tenant_id: &str,
    turn_id: &str,
) -> Result<String> {
    // The lock, then the turn read again under it (the next statement's snapshot is taken
    // after the lock is held): sent together, one wait. Both are prepared first (cached
    // after the first use on a connection) so that they go out, and run, in this order.
    let (lock, read) = tokio::try_join!(tx.prepare_cached(LOCK_SESSION_OF_TURN), tx.prepare_cached(READ_TURN))?;
    let params: [Param; 2] = [&turn_id, &tenant_id];
    let (locked, row) = tokio::try_join!(biased; tx.query_opt(&lock, &params), tx.query_opt(&read, &params))?;
    check_running(locked.as_ref(), row.as_ref(), connection_id)
}

/// [`lock_running_turn`] as the first statements of a transaction just begun on `tx`
/// ([`crate::Begun`]), sent with the tenant switch, and `more` after them (run under the
/// lock): one wait. Returns the session and the rows of each of `more`.
pub(crate) async fn lock_running_turn_then(
    tx: &deadpool_postgres::Object,
    connection_id: Option<&str>,
    tenant_id: &str,
    turn_id: &str,
    more: &[(&str, &[Param<'_>])],
) -> Result<(String, Vec<Vec<tokio_postgres::Row>>)> {
    let key: [Param; 2] = [&turn_id, &tenant_id];
    let mut statements: Vec<(&str, &[Param])> = vec![(LOCK_SESSION_OF_TURN, &key), (READ_TURN, &key)];
    statements.extend_from_slice(more);
    let mut results = crate::pipelined(tx, Some((crate::TENANT_SQL, tenant_id)), &statements).await?;
    let session_id = check_running(results[0].first(), results[1].first(), connection_id)?;
    Ok((session_id, results.split_off(2)))
}

/// A turn's state, where it was handed and whether its session is live (`$1` turn, `$2`
/// tenant).
const READ_TURN: &str =
    "SELECT t.state, t.dispatched_to, s.removed_at IS NULL FROM turns t JOIN sessions s ON s.id = t.session_id
  WHERE t.id = $1 AND t.tenant_id = $2";

/// The session of a turn given [`LOCK_SESSION_OF_TURN`]'s and then [`READ_TURN`]'s row:
/// `not-found` without them; `turn-not-running` unless it runs, its session is live and,
/// when a worker connection writes, it was handed to that connection.
fn check_running(
    locked: Option<&tokio_postgres::Row>,
    turn: Option<&tokio_postgres::Row>,
    connection_id: Option<&str>,
) -> Result<String> {
    let session_id: String = locked.map(|r| r.get(0)).ok_or(StoreError::Code(ErrorCode::NotFound))?;
    let row = turn.ok_or(StoreError::Code(ErrorCode::NotFound))?;
    let (state, to, live): (String, Option<String>, bool) = (row.get(0), row.get(1), row.get(2));
    let handed_elsewhere = connection_id.is_some_and(|c| to.as_deref() != Some(c));
    if state != "running" || !live || handed_elsewhere {
        return Err(StoreError::Code(ErrorCode::TurnNotRunning));
    }
    Ok(session_id)
}

/// Settle a locked running turn whose interactions are pending: they are closed before
/// `turn.ended` is appended, so their resolutions come first. Returns its sequence.
async fn settle_after_interactions(
    tx: &impl GenericClient,
    tenant_id: &str,
    session_id: &str,
    turn_id: &str,
    state: TurnState,
    cause: Option<&Cause>,
    cause_json: &Option<serde_json::Value>,
) -> Result<i64> {
    let (totals, ()) = tokio::try_join!(
        async {
            tx.q1(
                "UPDATE turns SET state = $2, cause = $3, ended_at = now(), partial_text = '', partial_thinking = ''
                  WHERE id = $1 RETURNING input_tokens, output_tokens",
                &[&turn_id, &state.as_str(), cause_json],
            )
            .await
            .map_err(StoreError::from)
        },
        notify_dispatch(tx, session_id),
    )?;
    let (input, output): (i64, i64) = (totals.get(0), totals.get(1));
    let ended = EventPayload::TurnEnded(TurnEnded {
        state,
        cause: cause.cloned(),
        usage: (input > 0 || output > 0).then(|| Usage {
            input_tokens: u64::try_from(input).unwrap_or(0),
            output_tokens: u64::try_from(output).unwrap_or(0),
        }),
    });
    crate::interactions::close_for_turn(tx, tenant_id, turn_id).await?;
    append_event(tx, tenant_id, session_id, Some(turn_id), &ended, &[]).await
}
