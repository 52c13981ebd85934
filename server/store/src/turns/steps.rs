//! A running turn's output: its completed steps, its live partial output and the usage the
//! model proxy metered.

use berth_protocol::{ErrorCode, EventPayload, ModelCompleted, NewRow, RowKind, worker::Usage};

use super::sql::{LOCK_SESSION_OF_TURN, RELAY_SQL, STEP_SQL};
use crate::{CHANNEL_DELTAS, Param, Result, Store, StoreError, history::EventRecord, not_found};

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
}

/// Token counts as PostgreSQL's `bigint` (saturating).
fn tokens(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

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

/// A step's rows and metered usage as the columns [`STEP_SQL`] takes.
pub(super) struct StepParams<'a> {
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
    pub(super) fn new(rows: &'a [NewRow], metered: &'a [Metered]) -> StepParams<'a> {
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
    pub(super) fn params<'p>(
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
