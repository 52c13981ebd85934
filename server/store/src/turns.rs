//! Turns: admission, the queue, dispatch to workers, steps, settling, stop.

use berth_protocol::{
    Cause, CauseCode, Diagnostic, DiagnosticKind, ErrorCode, EventPayload, MAX_QUEUE_LENGTH, ModelCompleted, NewRow,
    Nothing, Notice, NoticeCode, NoticeLevel, QUEUE_PREVIEW_BYTES, QueueEntry, QueueState, QueuedPrompt, Removed,
    RowKind, SessionDiagnosticsResult, SessionSendResult, TitleChanged, TurnEnded, TurnQueued, TurnRef, TurnState,
    worker::{TurnRun, Usage},
};
use deadpool_postgres::GenericClient;
use serde_json::json;

use crate::{
    CHANNEL_CONTROL, CHANNEL_DELTAS, CHANNEL_DISPATCH, Cached, Param, Principal, Result, Store, StoreError,
    attachments::{check_attachment_ids, turn_attachments},
    fmt_time,
    history::{EventRecord, append_event},
    not_found,
    receipts::{Receipt, finish},
    sessions::{lock_session, queue_changed},
    tenant_tx, token,
    workspaces::{PRESENCE_TTL, online_sql},
};

/// A step's usage (`$u`, the `{inputTokens, outputTokens}` object of `turns.step_usage`, or
/// null) with `$input` and `$output` tokens added.
macro_rules! usage_plus_sql {
    ($u:literal, $input:literal, $output:literal) => {
        concat!(
            "jsonb_build_object('inputTokens', coalesce((",
            $u,
            "->>'inputTokens')::bigint, 0) + ",
            $input,
            ", 'outputTokens', coalesce((",
            $u,
            "->>'outputTokens')::bigint, 0) + ",
            $output,
            ")"
        )
    };
}

/// A turn handed to a worker connection, with the session's tenant.
#[derive(Debug, Clone)]
pub struct ClaimedTurn {
    pub tenant_id: String,
    /// The provider profile the turn was dispatched with (None: the default profile).
    pub provider: Option<String>,
    pub run: TurnRun,
}

/// Where a `session.send` is admitted ([`Store::admit`]).
#[derive(Debug, Clone, Copy)]
pub struct Admission<'a> {
    /// The admitting replica, named in the dispatch notification when it kicks its own
    /// worker connections itself after the commit ([`crate::dispatch_payload`]).
    pub replica: &'a str,
    /// Also return `turn.started` as written, for the admitting replica's own watchers (as
    /// [`Store::append_step`]; empty when the prompt queues or has attachments, whose names
    /// are added to its row after the append).
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

/// What an automatic title is made from.
#[derive(Debug, Clone)]
pub struct TitleSource {
    pub provider: Option<String>,
    pub model: Option<String>,
    pub base_url: Option<String>,
    pub prompt: String,
    pub answer: String,
}

/// What the model proxy holds a turn's calls to.
#[derive(Debug, Clone)]
pub struct ProxyTurn {
    pub model: Option<String>,
    pub provider: Option<String>,
    /// A client-chosen endpoint (only stored for a profile that allows one).
    pub base_url: Option<String>,
    pub session_id: String,
}

/// Usage the model proxy metered for one call of a turn, handed to the replica that holds
/// the turn's worker connection and stored with the turn's next step (see
/// [`Store::append_step`]) instead of in a transaction of its own ([`Store::meter_usage`]).
#[derive(Debug, Clone)]
pub struct Metered {
    /// The call's `session.context` record, which gets the input usage.
    pub context: Option<String>,
    pub usage: Usage,
}

/// The live output of a session's running step (for watchers joining mid-turn).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Partial {
    pub turn_id: String,
    pub step: i32,
    pub text: String,
    pub thinking: String,
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

    /// Stop exactly this turn: a running one is cancelled (its worker told to stop), a
    /// queued one leaves the queue. A settled turn is `turn-not-running`.
    pub async fn stop_turn(
        &self,
        tenant_id: &str,
        session_id: &str,
        turn_id: &str,
        op: Option<&Receipt>,
    ) -> Result<TurnRef> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        crate::coordinator::lock_coordinator_of(&tx, tenant_id, session_id).await?;
        lock_session(&tx, tenant_id, session_id).await?;
        cancel_turn(&tx, tenant_id, session_id, turn_id.to_string(), true, true).await?;
        let result = TurnRef {
            turn_id: turn_id.to_string(),
            state: TurnState::Cancelled,
        };
        finish(&tx, op, &result).await?;
        tx.commit().await?;
        Ok(result)
    }

    /// Edit a queued prompt, guarded by its revision.
    pub async fn queue_update(
        &self,
        tenant_id: &str,
        session_id: &str,
        queue_id: &str,
        revision: i64,
        prompt: &str,
        op: Option<&Receipt>,
    ) -> Result<QueueEntry> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        lock_session(&tx, tenant_id, session_id).await?;
        check_queued(&tx, session_id, queue_id, revision).await?;
        tx.ex(
            "UPDATE turns SET prompt = $2, queue_revision = queue_revision + 1 WHERE id = $1",
            &[&queue_id, &prompt],
        )
        .await?;
        queue_changed(&tx, tenant_id, session_id).await?;
        let entry = QueueEntry {
            queue_id: queue_id.into(),
            turn_id: queue_id.into(),
            queue_revision: revision + 1,
            preview: berth_protocol::text::prefix(prompt, QUEUE_PREVIEW_BYTES).to_string(),
            prompt_bytes: prompt.len() as u64,
        };
        finish(&tx, op, &entry).await?;
        tx.commit().await?;
        Ok(entry)
    }

    /// A queued turn's whole prompt (queue entries carry a preview).
    pub async fn queue_get(&self, tenant_id: &str, session_id: &str, queue_id: &str) -> Result<QueuedPrompt> {
        let mut client = self.pool.get().await?;
        let client = tenant_tx(&mut client, tenant_id).await?;
        let row = client
            .qo(
                "SELECT t.prompt, t.queue_revision FROM turns t JOIN sessions s ON s.id = t.session_id
                  WHERE t.id = $1 AND t.session_id = $2 AND t.tenant_id = $3 AND t.state = 'queued'
                    AND s.removed_at IS NULL",
                &[&queue_id, &session_id, &tenant_id],
            )
            .await?;
        let Some(row) = row else { return not_found() };
        Ok(QueuedPrompt {
            queue_id: queue_id.into(),
            turn_id: queue_id.into(),
            queue_revision: row.get(1),
            prompt: row.get(0),
        })
    }

    /// Move a queued prompt before another (or to the end), guarded by its revision.
    pub async fn queue_move(
        &self,
        tenant_id: &str,
        session_id: &str,
        queue_id: &str,
        revision: i64,
        before: Option<&str>,
        op: Option<&Receipt>,
    ) -> Result<QueueState> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        lock_session(&tx, tenant_id, session_id).await?;
        check_queued(&tx, session_id, queue_id, revision).await?;
        let mut order: Vec<String> = tx
            .qa(
                "SELECT id FROM turns WHERE session_id = $1 AND state = 'queued' ORDER BY queue_position",
                &[&session_id],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .filter(|id: &String| id != queue_id)
            .collect();
        let at = match before {
            Some(b) if b == queue_id => return Err(StoreError::Code(ErrorCode::BadParams)),
            Some(b) => order
                .iter()
                .position(|id| id == b)
                .ok_or(StoreError::Code(ErrorCode::NotFound))?,
            None => order.len(),
        };
        order.insert(at, queue_id.to_string());
        let base: i64 = tx
            .q1(
                "SELECT coalesce((SELECT queue_position FROM turns WHERE session_id = $1
                                   ORDER BY queue_position DESC LIMIT 1), 0)",
                &[&session_id],
            )
            .await?
            .get(0);
        for (i, id) in order.iter().enumerate() {
            tx.ex(
                "UPDATE turns SET queue_position = $2 WHERE id = $1",
                &[id, &(base + 1 + i as i64)],
            )
            .await?;
        }
        tx.ex(
            "UPDATE turns SET queue_revision = queue_revision + 1 WHERE id = $1",
            &[&queue_id],
        )
        .await?;
        let state = queue_changed(&tx, tenant_id, session_id).await?;
        finish(&tx, op, &state).await?;
        tx.commit().await?;
        Ok(state)
    }

    /// Remove a queued prompt, guarded by its revision; the turn settles `cancelled`.
    pub async fn queue_remove(
        &self,
        tenant_id: &str,
        session_id: &str,
        queue_id: &str,
        revision: i64,
        op: Option<&Receipt>,
    ) -> Result<Removed> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        crate::coordinator::lock_coordinator_of(&tx, tenant_id, session_id).await?;
        lock_session(&tx, tenant_id, session_id).await?;
        check_queued(&tx, session_id, queue_id, revision).await?;
        cancel_turn(&tx, tenant_id, session_id, queue_id.to_string(), true, false).await?;
        let result = Removed { removed: true };
        finish(&tx, op, &result).await?;
        tx.commit().await?;
        Ok(result)
    }

    /// Hand out work to a worker connection serving `workspace_ids`: claim up to `limit`
    /// running turns not yet handed out, recording the model each is dispatched with (the
    /// session's, else `default_model`); start the next queued turn of every idle session
    /// there and claim those too, within the limit. Everything runs under the tenant's
    /// transactions; the worker reads each turn's conversation with `turn.history`.
    pub async fn claim_turns(
        &self,
        connection_id: &str,
        tenant_id: &str,
        workspace_ids: &[String],
        default_model: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ClaimedTurn>> {
        let mut client = self.pool.get().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        // `BEGIN`, the tenant switch, the sessions whose queued turn may start, and the
        // claim of the running turns not yet handed out go out together: one wait.
        let candidate_params: [Param; 2] = [&tenant_id, &workspace_ids];
        let claim_params: [Param; 5] = [&connection_id, &tenant_id, &workspace_ids, &default_model, &limit];
        let tx = crate::Begun::new(&client);
        let mut results = crate::pipelined(
            tx.client(),
            Some((crate::TENANT_SQL, tenant_id)),
            &[
                (
                    "SELECT DISTINCT ON (t.session_id) t.session_id FROM turns t JOIN sessions s ON s.id = t.session_id
                      WHERE s.tenant_id = $1 AND s.workspace_id = ANY($2) AND t.state = 'queued' AND NOT s.paused AND s.removed_at IS NULL
                        AND NOT EXISTS (SELECT 1 FROM turns r WHERE r.session_id = t.session_id AND r.state = 'running')
                      ORDER BY t.session_id, t.queue_position",
                    &candidate_params,
                ),
                (CLAIM_SQL, &claim_params),
            ],
        )
        .await?;
        let claimed = results.pop().unwrap_or_default();
        let candidates = results.pop().unwrap_or_default();
        let c = tx.client();
        // The claimed turns' settings are read with the `COMMIT`: one wait.
        let mut turns = claimed_turns(c, tenant_id, claimed, Some(tx)).await?;
        // Usually none: a turn started by `session.send` is running already.
        if candidates.is_empty() {
            return Ok(turns);
        }
        match self
            .start_queued(
                &mut client,
                connection_id,
                tenant_id,
                workspace_ids,
                default_model,
                limit,
                &mut turns,
                candidates,
            )
            .await
        {
            Ok(()) => Ok(turns),
            // The turns claimed above are committed as handed to this connection: they must
            // go out. The queued ones are started and claimed by a later claim (the
            // claimer's next wake-up or safety tick).
            Err(e) if !turns.is_empty() => {
                tracing::warn!(error = %e, "starting queued turns failed; handing out the claimed ones");
                Ok(turns)
            }
            Err(e) => Err(e),
        }
    }

    /// The running turns recorded as handed to connection `connection_id` that are not
    /// among `held` (the turns the connection's replica holds for it), as a claim returns
    /// them: hand-outs whose `COMMIT` went through while the replica saw an error (its
    /// answer lost with the database connection), so that no `turn.run` went out. Read
    /// under the tenant's transaction, with the claim's reads.
    pub async fn unannounced_turns(
        &self,
        connection_id: &str,
        tenant_id: &str,
        held: &[String],
    ) -> Result<Vec<ClaimedTurn>> {
        let client = self.pool.get().await?;
        let tx = crate::Begun::new(&client);
        let params: [Param; 3] = [&connection_id, &tenant_id, &held];
        let mut rows = crate::pipelined(
            tx.client(),
            Some((crate::TENANT_SQL, tenant_id)),
            &[(UNANNOUNCED_SQL, &params)],
        )
        .await?;
        let rows = rows.pop().unwrap_or_default();
        claimed_turns(tx.client(), tenant_id, rows, Some(tx)).await
    }

    /// Start the next queued turn of each candidate session, then claim what was started,
    /// within what is left of `limit` after `turns`.
    #[allow(clippy::too_many_arguments)]
    async fn start_queued(
        &self,
        client: &mut deadpool_postgres::Object,
        connection_id: &str,
        tenant_id: &str,
        workspace_ids: &[String],
        default_model: Option<&str>,
        limit: i64,
        turns: &mut Vec<ClaimedTurn>,
        candidates: Vec<tokio_postgres::Row>,
    ) -> Result<()> {
        for c in candidates {
            let session_id: String = c.get(0);
            let tx = tenant_tx(client, tenant_id).await?;
            // Re-check under the session lock: another replica may have started one, or the
            // queue may have changed order.
            tx.q1("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", &[&session_id])
                .await?;
            let next = tx
                .qo(
                    "SELECT id, prompt FROM turns WHERE session_id = $1 AND state = 'queued'
                        AND NOT EXISTS (SELECT 1 FROM turns WHERE session_id = $1 AND state = 'running')
                        AND NOT (SELECT paused FROM sessions WHERE id = $1)
                      ORDER BY queue_position LIMIT 1",
                    &[&session_id],
                )
                .await?;
            if let Some(next) = next {
                start_turn(&tx, tenant_id, &session_id, next.get(0), next.get(1), true).await?;
            }
            tx.commit().await?;
        }
        let room = limit.saturating_sub(turns.len() as i64);
        if room > 0 {
            let tx = tenant_tx(client, tenant_id).await?;
            let claimed = tx
                .qa(
                    CLAIM_SQL,
                    &[&connection_id, &tenant_id, &workspace_ids, &default_model, &room],
                )
                .await?;
            let claimed = claimed_turns(&tx, tenant_id, claimed, None).await?;
            tx.commit().await?;
            turns.extend(claimed);
        }
        Ok(())
    }

    /// Record the usage the model proxy metered from the provider's stream: added to the
    /// turn's totals, and kept as the running step's usage for its `model.completed`. (A
    /// replica that holds the turn's worker connection stores it with the step instead,
    /// see [`Metered`]; this is for the others, and for usage no step carried.)
    ///
    /// Also sets the input usage of the request's `session.context` record (`context`), in
    /// the same transaction. The commit does not wait for the disk (`synchronous_commit =
    /// off`): this runs before the proxy passes `[DONE]` on, so on the turn's critical
    /// path. Losing it is bounded and harmless to history: the step's own `model.completed`
    /// comes later on the same turn and commits durably, which flushes the log past this
    /// commit; so a meter is lost only with a step that was never acknowledged, in a
    /// database crash (ARCHITECTURE.md, "Durable where acknowledged").
    pub async fn meter_usage(
        &self,
        tenant_id: &str,
        turn_id: Option<&str>,
        context: Option<&str>,
        usage: Usage,
    ) -> Result<()> {
        let (input, output) = (tokens(usage.input_tokens), tokens(usage.output_tokens));
        let client = self.pool.get().await?;
        // Both updates in one statement, sent with `BEGIN`, the tenant switch and `COMMIT`:
        // one wait in all. A missing context record or turn updates nothing, as before.
        crate::tenant_write_unflushed(
            &client,
            tenant_id,
            concat!(
                "WITH c AS (UPDATE context_records SET input_tokens = $3 WHERE id = $5 AND tenant_id = $2)
                 UPDATE turns SET input_tokens = input_tokens + $3, output_tokens = output_tokens + $4,
                        step_usage = ",
                usage_plus_sql!("step_usage", "$3", "$4"),
                " WHERE id = $1 AND tenant_id = $2"
            ),
            &[&turn_id, &tenant_id, &input, &output, &context],
        )
        .await?;
        Ok(())
    }

    /// Persist a completed model step as one `model.completed` event. Only the connection
    /// the turn was handed to may write to it, and only while it runs. `relay`: the step's
    /// live output not yet relayed (payloads on [`CHANNEL_DELTAS`]), notified before the
    /// step's event and only if the step is written.
    ///
    /// One round trip: the transaction goes out whole (`BEGIN`, the tenant, the session
    /// lock, the relay, [`STEP_SQL`], `COMMIT`), the checks being in the statements' own
    /// `WHERE` clauses, read after the lock.
    ///
    /// `replica` (the caller's replica id) wakes its own watchers itself once this returns:
    /// the event's `NOTIFY` then goes out only if a watcher held by another replica is
    /// recorded. None: it always goes out. `local`: return the event as written, rows and
    /// all, for the caller's own watchers ([`crate::history::events_from_lines`]: what a
    /// catch-up would read); else only its sequence. `metered`: the step's model calls'
    /// usage metered on the caller's replica, added to the turn's totals, the step's
    /// `model.completed` and the calls' context records by the step's statement.
    #[allow(clippy::too_many_arguments)]
    pub async fn append_step(
        &self,
        connection_id: &str,
        tenant_id: &str,
        turn_id: &str,
        rows: &[NewRow],
        metered: &[Metered],
        relay: &[String],
        replica: Option<&str>,
        local: bool,
    ) -> Result<(i64, Vec<EventRecord>)> {
        let client = self.pool.get().await?;
        let step = StepParams::new(rows, metered);
        let conn = Some(connection_id);
        let lock_params: [Param; 2] = [&turn_id, &tenant_id];
        let relay_params: [Param; 6] = [&turn_id, &tenant_id, &conn, &CHANNEL_DELTAS, &relay, &replica];
        let step_params = step.params(&turn_id, &tenant_id, &conn, &replica, &true, &local);
        let mut statements: Vec<(&str, &[Param])> = vec![(LOCK_SESSION_OF_TURN, &lock_params)];
        if !relay.is_empty() {
            statements.push((RELAY_SQL, &relay_params));
        }
        statements.push((STEP_SQL, &step_params));
        let results = crate::tenant_pipeline(&client, tenant_id, &statements).await?;
        if results[0].is_empty() {
            return not_found();
        }
        let written = results.last().map(Vec::as_slice).unwrap_or_default();
        let Some(seq) = written.first().map(|r| r.get(0)) else {
            return Err(StoreError::Code(ErrorCode::TurnNotRunning));
        };
        let mut events = Vec::new();
        if local {
            crate::history::events_from_lines(written, 0, true, &mut events)?;
        }
        Ok((seq, events))
    }

    /// Append coalesced live output to the running step and relay it to other replicas in
    /// the same transaction (`payloads` go on [`CHANNEL_DELTAS`]), so that the stored partial text
    /// and the relayed deltas never disagree. `replica` (the caller's replica id) relays to
    /// its own watchers itself: the payloads then go out only if a watcher held by another
    /// replica is recorded. None: they always go out.
    pub async fn append_partial(
        &self,
        tenant_id: &str,
        turn_id: &str,
        text: &str,
        thinking: &str,
        payloads: &[String],
        replica: Option<&str>,
    ) -> Result<()> {
        let client = self.pool.get().await?;
        // Live output is not history (the completed step is): no need to wait for the disk.
        // The session lock, then the update and the relay in one statement (its snapshot
        // taken once the lock is held), sent with `BEGIN`, the tenant switch and `COMMIT`:
        // one round trip, the locks held inside PostgreSQL only, never across a wait for
        // this process. A turn that was stopped updates nothing and relays nothing (its late
        // output goes nowhere).
        let (text, thinking) = (crate::history::pg_text(text), crate::history::pg_text(thinking));
        let lock_params: [Param; 2] = [&turn_id, &tenant_id];
        let params: [Param; 7] = [
            &turn_id,
            &tenant_id,
            &text,
            &thinking,
            &CHANNEL_DELTAS,
            &payloads,
            &replica,
        ];
        crate::tenant_pipeline_unflushed(
            &client,
            tenant_id,
            &[(LOCK_SESSION_FOR_RELAY, &lock_params), (PARTIAL_SQL, &params)],
        )
        .await?;
        Ok(())
    }

    /// The running step's stored partial output, if a turn runs.
    pub async fn partial(&self, tenant_id: &str, session_id: &str) -> Result<Option<Partial>> {
        let client = self.pool.get().await?;
        let rows = crate::tenant_read(
            &client,
            tenant_id,
            "SELECT id, step, partial_text, partial_thinking FROM turns
              WHERE session_id = $1 AND tenant_id = $2 AND state = 'running'",
            &[&session_id, &tenant_id],
        )
        .await?;
        Ok(rows.first().map(|r| Partial {
            turn_id: r.get(0),
            step: r.get(1),
            text: r.get(2),
            thinking: r.get(3),
        }))
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

    /// The worker connection is gone: its presence row is deleted and its running turns end
    /// `interrupted` (never retried). A turn that cannot be settled now is left to the sweep,
    /// which interrupts every running turn whose connection has no live presence.
    ///
    /// The delete and the read of the turns stay two statements (each autocommit): an
    /// admission handing a turn to this connection holds its presence row (`FOR KEY
    /// SHARE`), so the delete waits for that admission's commit, and the read's snapshot,
    /// taken after the delete, then holds the turn. One statement or one snapshot for both
    /// would miss it (the same holds for the sweep and [`Store::abandon_connection`]).
    pub async fn interrupt_connection(&self, connection_id: &str) -> Result<Vec<String>> {
        let client = self.pool.get().await?;
        client
            .ex(
                "DELETE FROM worker_presence WHERE connection_id = $1",
                &[&connection_id],
            )
            .await?;
        let rows = client
            .qa(
                "SELECT id, tenant_id FROM turns WHERE dispatched_to = $1 AND state = 'running'",
                &[&connection_id],
            )
            .await?;
        drop(client);
        Ok(self.interrupt(rows).await)
    }

    /// A worker reconnected and says it gave up its connection `old`: forget that
    /// connection and interrupt its running turns now. Only a connection of the same
    /// credential is touched; one whose presence is already gone is left to the sweep.
    pub async fn abandon_connection(&self, principal: &Principal, old: &str) -> Result<Vec<String>> {
        let client = self.pool.get().await?;
        let forgotten = client
            .ex(
                "DELETE FROM worker_presence WHERE connection_id = $1 AND credential_id = $2",
                &[&old, &principal.credential_id],
            )
            .await?;
        if forgotten == 0 {
            return Ok(Vec::new());
        }
        let rows = client
            .qa(
                "SELECT id, tenant_id FROM turns WHERE dispatched_to = $1 AND tenant_id = $2 AND state = 'running'",
                &[&old, &principal.tenant_id],
            )
            .await?;
        drop(client);
        Ok(self.interrupt(rows).await)
    }

    /// A worker hands its running turns over from its connection `from` (on a draining
    /// replica, which released them) to its connection `to`: the turns among `turns` still
    /// running and handed to `from` are handed to `to`; returns them with their sessions.
    /// Both connections must be live and the credential's. The old presence row is held
    /// (`FOR KEY SHARE`) until `COMMIT`, so that its connection's cleanup — delete the
    /// presence, then interrupt the turns still handed to it — waits for this and then no
    /// longer sees the turns carried; once it has deleted the row, nothing is carried.
    pub async fn carry_turns(
        &self,
        principal: &Principal,
        from: &str,
        to: &str,
        turns: &[String],
    ) -> Result<Vec<(String, String)>> {
        if turns.is_empty() || from == to {
            return Ok(Vec::new());
        }
        let mut client = self.pool.get().await?;
        let tx = crate::tenant_tx(&mut client, &principal.tenant_id).await?;
        let live = tx
            .qa(
                "SELECT connection_id FROM worker_presence
                 WHERE connection_id IN ($1, $2) AND credential_id = $3 AND tenant_id = $4 FOR KEY SHARE",
                &[&from, &to, &principal.credential_id, &principal.tenant_id],
            )
            .await?;
        if live.len() != 2 {
            return Ok(Vec::new());
        }
        let rows = tx
            .qa(
                "UPDATE turns SET dispatched_to = $1
                 WHERE id = ANY($2) AND dispatched_to = $3 AND tenant_id = $4 AND state = 'running'
                 RETURNING id, session_id",
                &[&to, &turns, &from, &principal.tenant_id],
            )
            .await?;
        tx.commit().await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// Forget worker connections whose replica stopped heartbeating (it died), then
    /// interrupt every running turn handed to a connection with no live presence row —
    /// whatever left it so (a crash or an error between deleting the presence and
    /// interrupting). Any replica may run this; it is idempotent.
    pub async fn sweep_stale_presence(&self) -> Result<Vec<String>> {
        let client = self.pool.get().await?;
        client
            .ex(
                &format!("DELETE FROM worker_presence WHERE heartbeat_at < now() - interval '{PRESENCE_TTL}'"),
                &[],
            )
            .await?;
        let orphans = client
            .qa(
                "SELECT t.id, t.tenant_id FROM turns t
                  WHERE t.state = 'running' AND t.dispatched_to IS NOT NULL
                    AND NOT EXISTS (SELECT 1 FROM worker_presence p WHERE p.connection_id = t.dispatched_to)",
                &[],
            )
            .await?;
        drop(client);
        Ok(self.interrupt(orphans).await)
    }

    /// End these `(turn, tenant)` rows `interrupted`, each in its own transaction; one that
    /// fails is logged and left for the next sweep, and the others still end.
    async fn interrupt(&self, rows: Vec<tokio_postgres::Row>) -> Vec<String> {
        let cause = Cause {
            code: CauseCode::WorkerLost.as_str().into(),
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
                Err(e) => {
                    tracing::warn!(turn.id = %turn, error = %e, "interrupting a lost worker's turn failed; the sweep retries")
                }
            }
        }
        ended
    }

    /// Claim the session's one automatic title attempt: only while its title is empty and
    /// no attempt was made. Returns what to name it from (the first prompt and answer,
    /// cut to `max` bytes each) and the session's provider choice.
    pub async fn claim_title(&self, tenant_id: &str, session_id: &str, max: i32) -> Result<Option<TitleSource>> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let claimed = tx
            .qo(
                // The model the session's turns use: the session's own, else its agent's
                // (with the agent's provider), as the claim resolves it.
                "WITH claimed AS (
                   UPDATE sessions SET title_attempted = true
                    WHERE id = $1 AND tenant_id = $2 AND title = '' AND NOT title_attempted AND removed_at IS NULL
                    RETURNING agent_id, provider, model, base_url)
                 SELECT CASE WHEN c.model IS NULL AND a.model IS NOT NULL THEN a.provider ELSE c.provider END,
                        coalesce(c.model, a.model),
                        CASE WHEN c.model IS NULL AND a.model IS NOT NULL THEN NULL ELSE c.base_url END
                   FROM claimed c LEFT JOIN agents a ON a.id = c.agent_id",
                &[&session_id, &tenant_id],
            )
            .await?;
        let Some(claimed) = claimed else {
            tx.commit().await?;
            return Ok(None);
        };
        let first = |kind: &'static str| {
            let tx = &tx;
            async move {
                tx.qo(
                    "SELECT left(body, $3) FROM rows WHERE session_id = $1 AND kind = $2 AND NOT hidden
                      ORDER BY source_sequence, item_index LIMIT 1",
                    &[&session_id, &kind, &max],
                )
                .await
                .map(|r| r.map(|r| r.get::<_, String>(0)).unwrap_or_default())
            }
        };
        let prompt = first("user").await?;
        let answer = first("assistant").await?;
        tx.commit().await?;
        Ok(Some(TitleSource {
            provider: claimed.get(0),
            model: claimed.get(1),
            base_url: claimed.get(2),
            prompt,
            answer,
        }))
    }

    /// Set an automatic title unless the session has one by now (a human's rename wins);
    /// returns the `session.titleChanged` sequence when set.
    pub async fn set_auto_title(&self, tenant_id: &str, session_id: &str, title: &str) -> Result<Option<i64>> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let n = tx
            .ex(
                "UPDATE sessions SET title = $3 WHERE id = $1 AND tenant_id = $2 AND title = '' AND removed_at IS NULL",
                &[&session_id, &tenant_id, &title],
            )
            .await?;
        let seq = if n == 1 {
            let event = EventPayload::SessionTitleChanged(TitleChanged { title: title.into() });
            Some(append_event(&tx, tenant_id, session_id, None, &event, &[]).await?)
        } else {
            None
        };
        tx.commit().await?;
        Ok(seq)
    }

    /// A running turn goes on without something (`turn.notice`): a `session.notice`
    /// `{level: "warning", code, params}` and a `tool` diagnostic with cause `code`, in one
    /// transaction. Only the connection running the turn may write it. Returns the sequence.
    pub async fn turn_notice(
        &self,
        connection_id: &str,
        tenant_id: &str,
        turn_id: &str,
        code: NoticeCode,
        params: serde_json::Value,
    ) -> Result<i64> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let session_id = lock_running_turn(&tx, Some(connection_id), tenant_id, turn_id).await?;
        let event = EventPayload::SessionNotice(Notice {
            level: NoticeLevel::Warning.as_str().into(),
            code: code.as_str().into(),
            params,
        });
        let seq = append_event(&tx, tenant_id, &session_id, Some(turn_id), &event, &[]).await?;
        let cause = Cause {
            code: code.as_str().into(),
            status: None,
        };
        diagnostic(
            &tx,
            tenant_id,
            &session_id,
            DiagnosticKind::Tool,
            Some(turn_id),
            Some(seq),
            &cause,
        )
        .await?;
        tx.commit().await?;
        Ok(seq)
    }

    /// Record a failure that belongs to no turn (a `title` diagnostic).
    pub async fn session_diagnostic(
        &self,
        tenant_id: &str,
        session_id: &str,
        kind: DiagnosticKind,
        cause: &Cause,
    ) -> Result<()> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        diagnostic(&tx, tenant_id, session_id, kind, None, None, cause).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The session's diagnostic revision (not-found for another tenant's or a removed session).
    pub async fn diagnostic_revision(&self, tenant_id: &str, session_id: &str) -> Result<i64> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let row = tx
            .qo(
                "SELECT diagnostic_revision FROM sessions WHERE id = $1 AND tenant_id = $2 AND removed_at IS NULL",
                &[&session_id, &tenant_id],
            )
            .await?;
        tx.commit().await?;
        row.map(|r| r.get(0)).ok_or(StoreError::Code(ErrorCode::NotFound))
    }

    /// Diagnostics newest first, under a fixed revision fence.
    pub async fn diagnostics(
        &self,
        tenant_id: &str,
        session_id: &str,
        through: Option<i64>,
        before: Option<i64>,
        limit: u32,
    ) -> Result<SessionDiagnosticsResult> {
        let mut client = self.pool.get().await?;
        let client = tenant_tx(&mut client, tenant_id).await?;
        let current: i64 = client
            .qo(
                "SELECT diagnostic_revision FROM sessions WHERE id = $1 AND tenant_id = $2 AND removed_at IS NULL",
                &[&session_id, &tenant_id],
            )
            .await?
            .map(|r| r.get(0))
            .ok_or(StoreError::Code(ErrorCode::NotFound))?;
        let through = through.unwrap_or(current).min(current);
        let before = before.unwrap_or(i64::MAX);
        let limit = i64::from(limit.clamp(1, 200));
        let rows = client
            .qa(
                "SELECT id, revision, kind, turn_id, sequence, cause, at FROM diagnostics
                  WHERE session_id = $1 AND tenant_id = $2 AND revision <= $3 AND revision < $4
                  ORDER BY revision DESC LIMIT $5",
                &[&session_id, &tenant_id, &through, &before, &(limit + 1)],
            )
            .await?;
        let more = rows.len() as i64 > limit;
        let diagnostics: Vec<Diagnostic> = rows
            .iter()
            .take(limit as usize)
            .map(|r| Diagnostic {
                diagnostic_id: r.get(0),
                diagnostic_revision: r.get(1),
                kind: r.get(2),
                turn_id: r.get(3),
                sequence: r.get(4),
                cause: serde_json::from_value(r.get(5)).unwrap_or(Cause {
                    code: CauseCode::Internal.as_str().into(),
                    status: None,
                }),
                at: fmt_time(r.get(6)),
            })
            .collect();
        let next_before = if more {
            diagnostics.last().map(|d| d.diagnostic_revision)
        } else {
            None
        };
        Ok(SessionDiagnosticsResult {
            through_revision: through,
            diagnostics,
            next_before,
        })
    }
}

/// A session-level notice event `{level, code, params}`.
pub(crate) async fn notice(
    tx: &impl GenericClient,
    tenant_id: &str,
    session_id: &str,
    level: NoticeLevel,
    code: NoticeCode,
    params: serde_json::Value,
) -> Result<i64> {
    let notice = EventPayload::SessionNotice(Notice {
        level: level.as_str().into(),
        code: code.as_str().into(),
        params,
    });
    append_event(tx, tenant_id, session_id, None, &notice, &[]).await
}

async fn diagnostic(
    tx: &impl GenericClient,
    tenant_id: &str,
    session_id: &str,
    kind: DiagnosticKind,
    turn_id: Option<&str>,
    sequence: Option<i64>,
    cause: &Cause,
) -> Result<()> {
    let revision: i64 = tx
        .q1(
            "UPDATE sessions SET diagnostic_revision = diagnostic_revision + 1 WHERE id = $1 RETURNING diagnostic_revision",
            &[&session_id],
        )
        .await?
        .get(0);
    tx.ex(
        "INSERT INTO diagnostics (id, tenant_id, session_id, revision, kind, turn_id, sequence, cause)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        &[
            &token::new_id("dia"),
            &tenant_id,
            &session_id,
            &revision,
            &kind.as_str(),
            &turn_id,
            &sequence,
            &serde_json::to_value(cause).unwrap_or_default(),
        ],
    )
    .await?;
    Ok(())
}

/// What a turn handed out is run with ([`claimed_from`] reads them by position), from the turn
/// `t`, its session `s` and the session's agent `a`.
macro_rules! claimed_columns {
    () => {
        concat!(
            "t.id, t.session_id, s.workspace_id, t.model, s.no_tools, ",
            effective_auto_approve!(),
            ", s.delegation_depth,
         s.kind IS NOT DISTINCT FROM 'coordinator', t.provider, a.id, a.system_prompt, a.tools, a.params,
         s.channel"
        )
    };
}

/// The model, provider and endpoint a turn of session `s` (with its agent `a`) is dispatched
/// with, the default model being `$default`. The model resolves session > agent > tenant
/// default; the agent's model comes with its provider (and without the session's endpoint).
macro_rules! dispatch_values {
    ($default:literal) => {
        concat!(
            "coalesce(s.model, a.model, ",
            $default,
            "),
             CASE WHEN s.model IS NULL AND a.model IS NOT NULL THEN a.provider ELSE s.provider END,
             CASE WHEN s.model IS NULL AND a.model IS NOT NULL THEN NULL ELSE s.base_url END"
        )
    };
}

/// Claim up to `$5` running turns not yet handed out in workspaces `$3` of tenant `$2` for
/// connection `$1`, recording the model each is dispatched with (the session's, else `$4`,
/// the default).
const CLAIM_SQL: &str = concat!(
    // A fork never takes its agent's auto-approval (forks start narrowed).
    "UPDATE turns t SET (dispatched_to, model, provider, base_url) = ($1, ",
    dispatch_values!("$4"),
    ")
       FROM sessions s LEFT JOIN agents a ON a.id = s.agent_id
      WHERE s.id = t.session_id AND t.dispatched_to IS NULL AND t.state = 'running'
        AND t.id IN (SELECT u.id FROM turns u JOIN sessions v ON v.id = u.session_id
                      WHERE v.tenant_id = $2 AND v.workspace_id = ANY($3) AND v.removed_at IS NULL
                        AND u.state = 'running' AND u.dispatched_to IS NULL
                      ORDER BY u.started_at LIMIT $5 FOR UPDATE OF u SKIP LOCKED)
      RETURNING ",
    claimed_columns!()
);

/// The running turns handed to connection `$1` of tenant `$2` other than `$3`, as
/// [`CLAIM_SQL`] returns them.
const UNANNOUNCED_SQL: &str = concat!(
    "SELECT ",
    claimed_columns!(),
    " FROM turns t JOIN sessions s ON s.id = t.session_id LEFT JOIN agents a ON a.id = s.agent_id
     WHERE t.dispatched_to = $1 AND t.tenant_id = $2 AND t.state = 'running' AND t.id <> ALL($3)
       AND s.removed_at IS NULL"
);

/// The turns a [`CLAIM_SQL`] returned, with their attachments, the tenant's skills and MCP
/// servers (read together: one wait), and `commit` committed with those reads.
async fn claimed_turns(
    tx: &impl GenericClient,
    tenant_id: &str,
    claimed: Vec<tokio_postgres::Row>,
    commit: Option<crate::Begun<'_>>,
) -> Result<Vec<ClaimedTurn>> {
    if claimed.is_empty() {
        crate::commit_if(commit).await?;
        return Ok(Vec::new());
    }
    let turn_ids: Vec<String> = claimed.iter().map(|c| c.get(0)).collect();
    // A failing read fails the call, and the `COMMIT` then rolls the claim back.
    prepare_claim_reads(tx).await?;
    let commit = crate::commit_if(commit);
    let (reads, ()) = tokio::try_join!(biased; claim_reads(tx, tenant_id, &turn_ids), commit)?;
    Ok(claimed_from(tenant_id, &claimed, reads))
}

/// What every turn handed out is sent with besides its own settings.
struct ClaimReads {
    attachments: std::collections::HashMap<String, Vec<crate::attachments::StoredAttachment>>,
    skills: Vec<berth_protocol::SkillInfo>,
    mcp_servers: Vec<berth_protocol::McpServerRun>,
}

/// Prepares [`claim_reads`]'s statements (cached after the first use on a connection), so
/// that they go out, and run, in order with what is sent beside them (a `COMMIT`).
async fn prepare_claim_reads(tx: &impl GenericClient) -> Result<()> {
    tokio::try_join!(
        tx.prepare_cached(crate::attachments::TURN_ATTACHMENTS_SQL),
        tx.prepare_cached(crate::skills::TENANT_SKILLS_SQL),
        tx.prepare_cached(crate::mcp::ENABLED_SERVERS_SQL),
    )?;
    Ok(())
}

/// The attachments of `turn_ids`, the tenant's skills and MCP servers: three reads, all sent
/// on the first poll ([`prepare_claim_reads`] first).
async fn claim_reads(tx: &impl GenericClient, tenant_id: &str, turn_ids: &[String]) -> Result<ClaimReads> {
    let (attachments, skills, mcp_servers) = tokio::try_join!(
        biased;
        turn_attachments(tx, tenant_id, turn_ids),
        crate::skills::tenant_skills(tx, tenant_id),
        crate::mcp::enabled_servers(tx, tenant_id),
    )?;
    Ok(ClaimReads {
        attachments,
        skills,
        mcp_servers,
    })
}

/// The turns of `rows` ([`claimed_columns`]) as they go out in `turn.run`: the settings
/// only, the worker reads the conversation with `turn.history`.
fn claimed_from(tenant_id: &str, rows: &[tokio_postgres::Row], mut reads: ClaimReads) -> Vec<ClaimedTurn> {
    rows.iter()
        .map(|c| ClaimedTurn {
            tenant_id: tenant_id.to_string(),
            provider: c.get(8),
            run: TurnRun {
                turn_id: c.get(0),
                session_id: c.get(1),
                workspace_id: c.get(2),
                model: c.get(3),
                no_tools: c.get(4),
                auto_approve: c.get(5),
                delegation_depth: c.get::<_, i32>(6).max(0) as u32,
                coordinator: c.get(7),
                agent: turn_agent(c),
                skills: reads.skills.clone(),
                // Only a turn with tools uses them (and gets their secrets).
                mcp_servers: if c.get::<_, bool>(4) {
                    Vec::new()
                } else {
                    reads.mcp_servers.clone()
                },
                // The API tier fills it from the turn's provider profile.
                context_tokens: None,
                channel: c.get(13),
                // The API tier fills it from its configuration.
                max_attachment_bytes: None,
                attachments: reads
                    .attachments
                    .remove(&c.get::<_, String>(0))
                    .unwrap_or_default()
                    .into_iter()
                    .map(|a| a.meta)
                    .collect(),
            },
        })
        .collect()
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
                from.is_some_and(|a| a.watched) && attachments.is_empty(),
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

/// Wake the replica holding the session's workspace worker: turns may be handed out.
pub(crate) async fn notify_dispatch(tx: &impl GenericClient, session_id: &str) -> Result<()> {
    tx.ex(
        "SELECT pg_notify($1, workspace_id) FROM sessions WHERE id = $2",
        &[&CHANNEL_DISPATCH, &session_id],
    )
    .await?;
    Ok(())
}

/// Cancel one running or queued turn of a locked session. A running turn's worker is told
/// to stop (`berth_control`); whatever it sends afterwards is refused. With `keep_text` (a
/// stop, not a removal or clear), the running step's text so far becomes the assistant row
/// of its `turn.ended`.
pub(crate) async fn cancel_turn(
    tx: &impl GenericClient,
    tenant_id: &str,
    session_id: &str,
    turn_id: String,
    queue_event: bool,
    keep_text: bool,
) -> Result<()> {
    let row = tx
        .qo(
            "SELECT state, dispatched_to, partial_text, partial_thinking FROM turns
              WHERE id = $1 AND session_id = $2 AND tenant_id = $3 FOR UPDATE",
            &[&turn_id, &session_id, &tenant_id],
        )
        .await?;
    let Some(row) = row else { return not_found() };
    let state: String = row.get(0);
    let dispatched: Option<String> = row.get(1);
    // What the running step had written when it was stopped stays in the history, as the
    // turn's last answer (issue 52: a stopped turn's text is kept, live and on reopen).
    let (text, thinking): (String, String) = (row.get(2), row.get(3));
    let kept: Vec<NewRow> = if keep_text && state == "running" && !(text.is_empty() && thinking.is_empty()) {
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

async fn check_queued(tx: &impl GenericClient, session_id: &str, queue_id: &str, revision: i64) -> Result<()> {
    let row = tx
        .qo(
            "SELECT state, queue_revision FROM turns WHERE id = $1 AND session_id = $2 FOR UPDATE",
            &[&queue_id, &session_id],
        )
        .await?;
    let Some(row) = row else { return not_found() };
    let state: String = row.get(0);
    let current: i64 = row.get(1);
    // An entry that left the queue (started, removed) is stale for the client too.
    if state != "queued" || current != revision {
        return Err(StoreError::Code(ErrorCode::StaleRevision));
    }
    Ok(())
}

/// The session row of turn `$1` of tenant `$2`, by key (no row: no such turn), for the
/// locks below.
macro_rules! session_of_turn_sql {
    () => {
        "SELECT id FROM sessions WHERE id = (SELECT session_id FROM turns WHERE id = $1 AND tenant_id = $2)"
    };
}

/// Locks the session of turn `$1` of tenant `$2` (the session row first, as stop, clear and
/// remove do); no row: no such turn.
const LOCK_SESSION_OF_TURN: &str = concat!(session_of_turn_sql!(), " FOR UPDATE");

/// The session of turn `$1` (tenant `$2`) if it runs, its session is not removed and, when
/// `$3` names a worker connection, it was handed to that connection. Read in a statement
/// after [`LOCK_SESSION_OF_TURN`], so under the lock.
///
/// The turn and its session are each read by primary key, in subqueries the planner keeps
/// (`OFFSET 0`) so that the conditions on them are checked after the probe: joined flat, a
/// generic plan made while the tables were small (a connection keeps its plan until the
/// statistics change) scanned every running turn (the partial indexes on running turns
/// match `state = 'running'`) and every session of the tenant, on each call.
macro_rules! running_turn_sql {
    () => {
        "SELECT t.session_id
           FROM (SELECT session_id, state, dispatched_to FROM turns WHERE id = $1 AND tenant_id = $2 OFFSET 0) t
           JOIN LATERAL (SELECT id, removed_at FROM sessions WHERE id = t.session_id OFFSET 0) s ON true
          WHERE t.state = 'running' AND s.removed_at IS NULL AND ($3::text IS NULL OR t.dispatched_to = $3)"
    };
}

/// Token counts as PostgreSQL's `bigint` (saturating).
fn tokens(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Live output relayed to other replicas (payloads `$5` on channel `$4`, in order) if the
/// turn runs ([`running_turn_sql`]) and a watcher that replica `$6` does not hold is
/// recorded (or `$6` is null): the appending replica relays to its own watchers itself.
/// Read after [`LOCK_SESSION_OF_TURN`], so a watcher registering meanwhile is either seen
/// or reads the stored output after this commits (`watched_elsewhere_sql`).
const RELAY_SQL: &str = concat!(
    "SELECT pg_notify($4, p) FROM unnest($5::text[]) WITH ORDINALITY AS n(p, i)
      WHERE EXISTS (",
    running_turn_sql!(),
    " AND (",
    watched_elsewhere_sql!("$6"),
    ")) ORDER BY i"
);

/// Locks the session of turn `$1` of tenant `$2` for live output ([`PARTIAL_SQL`]): against a
/// watcher's registration (`FOR SHARE`, `Store::watcher_add`), as an append's lock is. It
/// changes no key of the row, so it does not block the inserts of events that reference it;
/// taken before the turn's row, as every writer of a turn does.
const LOCK_SESSION_FOR_RELAY: &str = concat!(session_of_turn_sql!(), " FOR NO KEY UPDATE");

/// Live output (`$3` text, `$4` thinking) appended to running turn `$1` (tenant `$2`), and its
/// payloads `$6` relayed on channel `$5` in order, but only when a watcher another replica
/// holds is recorded (`$7`: the appending replica, or null for always;
/// `watched_elsewhere_sql`). Read after [`LOCK_SESSION_FOR_RELAY`]. The turn's state is
/// checked as `(…) IS TRUE`, which no partial index on running turns matches, so that the
/// update finds the turn by primary key whatever the statistics (see [`running_turn_sql`]).
const PARTIAL_SQL: &str = concat!(
    "WITH u AS (UPDATE turns SET partial_text = partial_text || $3, partial_thinking = partial_thinking || $4
                 WHERE id = $1 AND tenant_id = $2 AND (state = 'running') IS TRUE RETURNING session_id)
     SELECT pg_notify($5, p) FROM unnest($6::text[]) WITH ORDINALITY AS n(p, i)
      WHERE EXISTS (SELECT 1 FROM u JOIN sessions s ON s.id = u.session_id WHERE ",
    watched_elsewhere_sql!("$7"),
    ") ORDER BY i"
);

/// A completed step of a running turn ([`running_turn_sql`]; nothing is written otherwise)
/// in one statement: the turn's step moves on and its metered usage is read and reset (read
/// under the turn row's lock, `FOR UPDATE`: a meter of another replica committed while the
/// step waited for the row is the step's, not lost to the reset), the session's sequence is
/// bumped (gapless: the session row is locked), and the `model.completed` event (`$10`,
/// naming the step it completed, with that usage), its rows (`$4`..`$8` by item) and the
/// notice go in. Usage metered on the appending replica comes as parameters: `$15` input
/// and `$16` output tokens (null: none) are added to the turn's totals and the step's, and
/// each context record `$17` gets its call's input tokens `$18`. The reply row (`$9`, a step without tool calls) names the
/// turn's files not named yet. Returns the event as a catch-up reads it
/// (`history::events_from_lines` from column 0: the sequence first), one line per row when
/// `$14` is set (else one line, without the rows), or no line when the turn does not run.
///
/// The event's notice (`$11`) goes out only when `$13` is set and someone may need it: any
/// watcher when `$12` (the appending replica, which wakes its own watchers itself) is null,
/// else only a watcher another replica recorded (`watched_elsewhere_sql`). It is computed
/// once (`n`, materialized), whatever the number of lines.
const STEP_SQL: &str = concat!(
    "WITH t AS (",
    running_turn_sql!(),
    "),
     u AS (UPDATE turns x SET step = x.step + 1, partial_text = '', partial_thinking = '', step_usage = NULL,
                              input_tokens = x.input_tokens + coalesce($15::bigint, 0),
                              output_tokens = x.output_tokens + coalesce($16::bigint, 0)
             FROM (SELECT step_usage FROM turns WHERE id = $1 FOR UPDATE) old
            WHERE x.id = $1 AND EXISTS (SELECT 1 FROM t)
           RETURNING x.step - 1 AS step,
                     CASE WHEN $15::bigint IS NULL THEN old.step_usage
                          ELSE ",
    usage_plus_sql!("old.step_usage", "$15", "$16"),
    " END AS usage),
     c AS (UPDATE context_records x SET input_tokens = ($18::bigint[])[array_position($17::text[], x.id)]
            WHERE x.id = ANY($17::text[]) AND x.tenant_id = $2 AND EXISTS (SELECT 1 FROM t)),
     s AS (UPDATE sessions SET last_sequence = last_sequence + 1, updated_at = now()
            WHERE id = (SELECT session_id FROM t) AND tenant_id = $2 RETURNING id, last_sequence),
     e AS (INSERT INTO events (session_id, sequence, tenant_id, type, turn_id, payload)
           SELECT s.id, s.last_sequence, $2, $10, $1,
                  jsonb_build_object('step', u.step) ||
                  CASE WHEN u.usage IS NULL THEN '{}'::jsonb
                       ELSE jsonb_build_object('usage', jsonb_build_object(
                                'inputTokens', (u.usage->>'inputTokens')::bigint,
                                'outputTokens', (u.usage->>'outputTokens')::bigint)) END
             FROM s, u
           RETURNING type, turn_id, payload, at),
     named AS (SELECT jsonb_agg(jsonb_build_object('attachmentId', a.id, 'name', a.name, 'mimeType', a.mime_type,
                                                   'bytes', a.bytes, 'sha256', a.sha256) ORDER BY a.created_at, a.id) AS list
                 FROM attachments a
                WHERE $9::int IS NOT NULL AND a.turn_id = $1 AND a.tenant_id = $2
                  AND NOT EXISTS (SELECT 1 FROM rows r WHERE r.session_id = (SELECT session_id FROM t) AND r.tenant_id = $2
                                     AND r.attachments @> jsonb_build_array(jsonb_build_object('attachmentId', a.id)))),
     r AS (INSERT INTO rows (session_id, source_sequence, item_index, tenant_id, turn_id, kind, body, thinking, tool, hidden,
                             attachments)
           SELECT s.id, s.last_sequence, (v.n - 1)::int, $2, $1, v.kind, v.body, v.thinking, v.tool, v.hidden,
                  CASE WHEN v.n - 1 = $9::int THEN (SELECT list FROM named) END
             FROM s, unnest($4::text[], $5::text[], $6::text[], $7::jsonb[], $8::bool[])
                     WITH ORDINALITY AS v(kind, body, thinking, tool, hidden, n)
           RETURNING ", row_columns!(), "),
     n AS MATERIALIZED (SELECT (SELECT pg_notify($11, s.id || ':' || s.last_sequence) WHERE $13::bool AND (",
    watched_elsewhere_sql!("$12"),
    ")) FROM s)
     SELECT s.last_sequence, true, e.type, e.turn_id, e.payload, e.at, r.*
       FROM s CROSS JOIN e CROSS JOIN n LEFT JOIN r ON $14::bool ORDER BY r.item_index"
);

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

/// A step's rows and metered usage as the columns [`STEP_SQL`] takes.
struct StepParams<'a> {
    rows: crate::history::RowArrays<'a>,
    /// The reply row, which names the turn's files: the last answer of a step without tool
    /// calls.
    reply: Option<i32>,
    event: &'static str,
    /// The usage metered on this replica, summed (None: none).
    input: Option<i64>,
    output: Option<i64>,
    /// The context records of the metered calls, and their input tokens.
    contexts: Vec<&'a str>,
    context_inputs: Vec<i64>,
}

impl<'a> StepParams<'a> {
    fn new(rows: &'a [NewRow], metered: &'a [Metered]) -> StepParams<'a> {
        let reply = rows
            .iter()
            .rposition(|r| r.kind == RowKind::Assistant)
            .filter(|_| !rows.iter().any(|r| r.kind == RowKind::ToolCall))
            .map(|i| i as i32);
        let sum = |f: fn(&Usage) -> u64| {
            (!metered.is_empty()).then(|| metered.iter().fold(0i64, |a, m| a.saturating_add(tokens(f(&m.usage)))))
        };
        let (contexts, context_inputs) = metered
            .iter()
            .filter_map(|m| Some((m.context.as_deref()?, tokens(m.usage.input_tokens))))
            .unzip();
        StepParams {
            rows: crate::history::RowArrays::new(rows),
            reply,
            event: EventPayload::ModelCompleted(ModelCompleted {
                step: None,
                usage: None,
            })
            .type_name(),
            input: sum(|u| u.input_tokens),
            output: sum(|u| u.output_tokens),
            contexts,
            context_inputs,
        }
    }

    /// [`STEP_SQL`]'s parameters.
    fn params<'p>(
        &'p self,
        turn_id: &'p &str,
        tenant_id: &'p &str,
        connection_id: &'p Option<&str>,
        replica: &'p Option<&str>,
        notify: &'p bool,
        local: &'p bool,
    ) -> [Param<'p>; 18] {
        [
            turn_id,
            tenant_id,
            connection_id,
            &self.rows.kinds,
            &self.rows.bodies,
            &self.rows.thinking,
            &self.rows.tools,
            &self.rows.hidden,
            &self.reply,
            &self.event,
            &crate::CHANNEL_EVENTS,
            replica,
            notify,
            local,
            &self.input,
            &self.output,
            &self.contexts,
            &self.context_inputs,
        ]
    }
}

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

/// queued → running, publishing the prompt as the user row of `turn.started`; a turn that
/// waited in the queue (`from_queue`) also changes the queue that watchers draw.
async fn start_turn(
    tx: &impl GenericClient,
    tenant_id: &str,
    session_id: &str,
    turn_id: &str,
    prompt: &str,
    from_queue: bool,
) -> Result<i64> {
    tx.ex(
        "UPDATE turns SET state = 'running', started_at = now() WHERE id = $1",
        &[&turn_id],
    )
    .await?;
    let row = NewRow::user(prompt);
    let started = EventPayload::TurnStarted(Nothing {});
    let seq = append_event(tx, tenant_id, session_id, Some(turn_id), &started, &[row]).await?;
    crate::attachments::name_in_prompt_row(tx, tenant_id, session_id, turn_id, seq).await?;
    if from_queue {
        queue_changed(tx, tenant_id, session_id).await?;
    }
    Ok(seq)
}

/// What a claimed turn takes from its session's agent (columns 9..=12 of the claim).
fn turn_agent(c: &tokio_postgres::Row) -> Option<berth_protocol::TurnAgent> {
    let agent_id: String = c.get::<_, Option<String>>(9)?;
    let tools: Option<serde_json::Value> = c.get(11);
    let params: Option<serde_json::Value> = c.get(12);
    Some(berth_protocol::TurnAgent {
        agent_id,
        system_prompt: c.get(10),
        tools: tools.and_then(|t| serde_json::from_value(t).ok()),
        params: params.and_then(|p| serde_json::from_value(p).ok()),
    })
}
