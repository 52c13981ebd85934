//! Interactions: tool calls held for approval and questions put to the user (SPEC §4.6).
//!
//! The worker asks ([`Store::ask_interaction`]); the row is resolved exactly once — by a
//! user ([`Store::respond_interaction`]), by its fallback at expiry
//! ([`Store::expire_interaction`]) or at once when nobody watches the session, by
//! `autoApprove`, or by its turn ending ([`close_for_turn`]). Each change appends
//! `interaction.requested` / `interaction.resolved` in the same transaction and a resolution
//! sends `NOTIFY berth_interactions, '<interaction id>'` (a pointer: the outcome is read from
//! the table), which wakes the worker's open request on whichever replica holds it.
//!
//! Lock order is the session row, then the interaction row (as for turns), so that answering
//! and a turn ending never deadlock.

use berth_protocol::{
    ErrorCode, EventPayload, INTERACTION_APPROVAL, Interaction, InteractionOutcome, InteractionRequested,
    InteractionResolution, InteractionState, worker::TurnInteraction,
};
use deadpool_postgres::GenericClient;
use serde_json::{Value, json};

use crate::{
    CHANNEL_INTERACTIONS, Cached, Result, Store, StoreError,
    history::append_event,
    not_found,
    receipts::{Receipt, finish},
    sessions::lock_session,
    tenant_tx, token,
    turns::lock_running_turn,
};

/// A watcher row whose heartbeat is older than this no longer counts (its replica died).
const WATCHER_STALE: &str = "45 seconds";

/// One interaction rendered as the client's JSON, so that every read (including the
/// session snapshot's single statement) builds it the same way.
const INTERACTION_JSON: &str = "(jsonb_build_object(
        'interactionId', i.id, 'kind', i.kind, 'sessionId', i.session_id, 'turnId', i.turn_id,
        'fallback', i.fallback, 'state', i.state, 'outcome', i.answer,
        'createdAt', to_char(i.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
        'expiresAt', to_char(i.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
        'resolvedAt', to_char(i.resolved_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'))
    || i.request)";

/// The JSON array of a session's pending interactions, oldest first (`s` is the session).
pub(crate) fn pending_json_sql() -> String {
    format!(
        "coalesce((SELECT jsonb_agg({INTERACTION_JSON} ORDER BY i.created_at, i.id) FROM interactions i
                    WHERE i.session_id = s.id AND i.state = 'pending' AND i.expires_at > now()), '[]'::jsonb)"
    )
}

pub(crate) fn parse_list(v: Value) -> Result<Vec<Interaction>> {
    serde_json::from_value(v).map_err(|e| StoreError::Other(e.into()))
}

fn parse_one(v: Value) -> Result<Interaction> {
    serde_json::from_value(v).map_err(|e| StoreError::Other(e.into()))
}

fn bad() -> StoreError {
    StoreError::Code(ErrorCode::BadParams)
}

/// PostgreSQL's jsonb cannot hold U+0000: model-made input that contains it is stored with
/// U+FFFD, as history text is.
fn without_nul(v: &mut Value) {
    match v {
        Value::String(s) if s.contains('\0') => *s = s.replace('\0', "\u{FFFD}"),
        Value::Array(items) => items.iter_mut().for_each(without_nul),
        Value::Object(map) => {
            if map.keys().any(|k| k.contains('\0')) {
                *map = std::mem::take(map)
                    .into_iter()
                    .map(|(k, v)| (k.replace('\0', "\u{FFFD}"), v))
                    .collect();
            }
            map.values_mut().for_each(without_nul);
        }
        _ => {}
    }
}

/// Is `outcome` a valid answer to an interaction of `kind` offering `options`?
fn fits(kind: &str, options: Option<&[String]>, outcome: &InteractionOutcome) -> bool {
    match outcome {
        InteractionOutcome::Approval { .. } => kind == INTERACTION_APPROVAL,
        InteractionOutcome::Choice { choice } => {
            kind != INTERACTION_APPROVAL
                && match (choice, options) {
                    (Some(c), Some(opts)) if !opts.is_empty() => opts.contains(c),
                    _ => true,
                }
        }
    }
}

/// A person's `{choice: null}` to a question that says `allowSkip: false` in its params
/// (only its fallback may leave it unanswered).
fn skips_unskippable(params: Option<&Value>, outcome: &InteractionOutcome) -> bool {
    matches!(outcome, InteractionOutcome::Choice { choice: None })
        && params.and_then(|p| p.get("allowSkip")).and_then(Value::as_bool) == Some(false)
}

/// A client's `answer`: exactly `{approved: bool}` or `{choice: string|null}`.
fn parse_answer(answer: &Value) -> Option<InteractionOutcome> {
    let obj = answer.as_object()?;
    if obj.len() != 1 {
        return None;
    }
    if let Some(a) = obj.get("approved") {
        return Some(InteractionOutcome::Approval { approved: a.as_bool()? });
    }
    match obj.get("choice")? {
        Value::Null => Some(InteractionOutcome::Choice { choice: None }),
        Value::String(s) => Some(InteractionOutcome::Choice {
            choice: Some(s.clone()),
        }),
        _ => None,
    }
}

/// The locked interaction (session row first) with whether it is overdue.
async fn lock_interaction(tx: &impl GenericClient, tenant_id: &str, id: &str) -> Result<(Interaction, bool)> {
    let session_id: String = tx
        .qo(
            "SELECT session_id FROM interactions WHERE id = $1 AND tenant_id = $2",
            &[&id, &tenant_id],
        )
        .await?
        .map(|r| r.get(0))
        .ok_or(StoreError::Code(ErrorCode::NotFound))?;
    lock_session(tx, tenant_id, &session_id).await?;
    let row = tx
        .q1(
            &format!("SELECT {INTERACTION_JSON}, i.expires_at <= now() FROM interactions i WHERE i.id = $1 FOR UPDATE"),
            &[&id],
        )
        .await?;
    Ok((parse_one(row.get(0))?, row.get(1)))
}

fn resolution_of(i: &Interaction, answered_by: Option<String>) -> Option<InteractionResolution> {
    Some(InteractionResolution {
        interaction_id: i.interaction_id.clone(),
        state: i.state,
        outcome: i.outcome.clone()?,
        answered_by,
    })
}

/// Resolve a pending interaction (the caller holds its lock): record the outcome, append
/// `interaction.resolved`, and wake the worker's open request wherever it waits.
async fn resolve(
    tx: &impl GenericClient,
    tenant_id: &str,
    i: &Interaction,
    state: InteractionState,
    outcome: InteractionOutcome,
    answered_by: Option<&str>,
) -> Result<InteractionResolution> {
    let answer = serde_json::to_value(&outcome).map_err(|e| StoreError::Other(e.into()))?;
    let n = tx
        .ex(
            "UPDATE interactions SET state = $2, answer = $3, answered_by = $4, resolved_at = now()
              WHERE id = $1 AND state = 'pending'",
            &[&i.interaction_id, &state.as_str(), &answer, &answered_by],
        )
        .await?;
    if n != 1 {
        return Err(StoreError::Other(anyhow::anyhow!(
            "interaction was not pending under its lock"
        )));
    }
    let resolution = InteractionResolution {
        interaction_id: i.interaction_id.clone(),
        state,
        outcome,
        answered_by: answered_by.map(str::to_string),
    };
    let event = EventPayload::InteractionResolved(resolution.clone());
    append_event(tx, tenant_id, &i.session_id, Some(&i.turn_id), &event, &[]).await?;
    tx.ex("SELECT pg_notify($1, $2)", &[&CHANNEL_INTERACTIONS, &i.interaction_id])
        .await?;
    Ok(resolution)
}

/// Close the turn's pending interactions with their fallbacks (the turn is ending: stopped,
/// interrupted or settled). The caller holds the session lock and appends `turn.ended`
/// afterwards, so `interaction.resolved` comes before the turn's end.
pub(crate) async fn close_for_turn(tx: &impl GenericClient, tenant_id: &str, turn_id: &str) -> Result<()> {
    let rows = tx
        .qa(
            &format!(
                "SELECT {INTERACTION_JSON} FROM interactions i
                  WHERE i.turn_id = $1 AND i.tenant_id = $2 AND i.state = 'pending' ORDER BY i.created_at, i.id FOR UPDATE"
            ),
            &[&turn_id, &tenant_id],
        )
        .await?;
    for r in rows {
        let i = parse_one(r.get(0))?;
        let fallback = i.fallback.clone();
        resolve(tx, tenant_id, &i, InteractionState::Closed, fallback, None).await?;
    }
    Ok(())
}

impl Store {
    /// The worker on `connection_id` asks. Returns the interaction — already resolved when
    /// the session auto-approves or nobody watches it, or when this `(turn, callId)` was
    /// asked before. The turn must be running and handed to that connection.
    pub async fn ask_interaction(
        &self,
        connection_id: &str,
        tenant_id: &str,
        ask: &TurnInteraction,
        timeout: std::time::Duration,
    ) -> Result<Interaction> {
        let well_formed = |s: &str, max: usize| !s.is_empty() && s.len() <= max && !s.contains('\0');
        if berth_protocol::InteractionKind::parse(&ask.kind).is_none() || !well_formed(&ask.call_id, 200) {
            return Err(bad());
        }
        let approval = ask.kind == INTERACTION_APPROVAL;
        let fallback = match &ask.fallback {
            Some(f) => f.clone(),
            None if approval => InteractionOutcome::Approval { approved: false },
            None => InteractionOutcome::Choice { choice: None },
        };
        if !fits(&ask.kind, ask.options.as_deref(), &fallback) {
            return Err(bad());
        }
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let session_id = lock_running_turn(&tx, Some(connection_id), tenant_id, &ask.turn_id).await?;
        let mut request = json!({"input": ask.input});
        if let Some(t) = &ask.tool {
            request["tool"] = serde_json::to_value(t).map_err(|e| StoreError::Other(e.into()))?;
        }
        if let Some(o) = &ask.options {
            request["options"] = json!(o);
        }
        if let Some(p) = &ask.params {
            request["params"] = p.clone();
        }
        without_nul(&mut request);
        // Asked again (a retry, a turn carried to another connection): the same question
        // gets its first answer. A call id names one call for its whole turn, so another
        // question under it is refused, never answered with an approval given for something
        // else (a model or provider repeating an earlier step's call id).
        let existing = tx
            .qo(
                &format!(
                    "SELECT {INTERACTION_JSON}, i.kind = $3 AND i.request = $4::jsonb
                       FROM interactions i WHERE i.turn_id = $1 AND i.call_id = $2"
                ),
                &[&ask.turn_id, &ask.call_id, &ask.kind, &request],
            )
            .await?;
        if let Some(row) = existing {
            if !row.get::<_, bool>(1) {
                return Err(StoreError::Code(ErrorCode::Conflict));
            }
            return parse_one(row.get(0));
        }
        let row = tx
            .q1(
                &format!(
                    // A watcher of an ancestor (a coordinator watching its tree) counts too;
                    // the walk is bounded like nesting is.
                    "WITH RECURSIVE up (id, parent_id, depth) AS (
                         SELECT id, parent_id, 0 FROM sessions WHERE id = $1
                         UNION ALL
                         SELECT p.id, p.parent_id, up.depth + 1 FROM sessions p JOIN up ON p.id = up.parent_id
                          WHERE up.depth < 8)
                     SELECT {effective},
                            (SELECT count(*) FROM session_watchers w
                              WHERE w.session_id IN (SELECT id FROM up) AND w.heartbeat_at > now() - interval '{WATCHER_STALE}')
                       FROM sessions s LEFT JOIN agents a ON a.id = s.agent_id WHERE s.id = $1",
                    // What the session may auto-approve now, as a hand-out decides it.
                    effective = effective_auto_approve!(),
                ),
                &[&session_id],
            )
            .await?;
        let (auto_approve, watchers): (bool, i64) = (row.get(0), row.get(1));
        let id = token::new_id("int");
        let fallback_json = serde_json::to_value(&fallback).map_err(|e| StoreError::Other(e.into()))?;
        let row = tx
            .q1(
                &format!(
                    "INSERT INTO interactions AS i (id, tenant_id, session_id, turn_id, call_id, kind, request, fallback, state, expires_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'pending', now() + make_interval(secs => $9))
                     RETURNING {INTERACTION_JSON}"
                ),
                &[
                    &id,
                    &tenant_id,
                    &session_id,
                    &ask.turn_id,
                    &ask.call_id,
                    &ask.kind,
                    &request,
                    &fallback_json,
                    &timeout.as_secs_f64(),
                ],
            )
            .await?;
        let mut interaction = parse_one(row.get(0))?;
        let event = EventPayload::InteractionRequested(InteractionRequested {
            interaction: Box::new(interaction.clone()),
        });
        append_event(&tx, tenant_id, &session_id, Some(&ask.turn_id), &event, &[]).await?;
        let settle = if approval && auto_approve {
            Some((InteractionState::Auto, InteractionOutcome::Approval { approved: true }))
        } else if watchers == 0 {
            Some((InteractionState::Unwatched, fallback))
        } else {
            None
        };
        if let Some((state, outcome)) = settle {
            let r = resolve(&tx, tenant_id, &interaction, state, outcome, None).await?;
            interaction.state = r.state;
            interaction.outcome = Some(r.outcome);
        }
        tx.commit().await?;
        Ok(interaction)
    }

    /// The session's interactions waiting for an answer, oldest first.
    pub async fn pending_interactions(&self, tenant_id: &str, session_id: &str) -> Result<Vec<Interaction>> {
        let mut client = self.pool.get().await?;
        let client = tenant_tx(&mut client, tenant_id).await?;
        let row = client
            .qo(
                &format!(
                    "SELECT {} FROM sessions s WHERE s.id = $1 AND s.tenant_id = $2 AND s.removed_at IS NULL",
                    pending_json_sql()
                ),
                &[&session_id, &tenant_id],
            )
            .await?;
        match row {
            Some(r) => parse_list(r.get(0)),
            None => not_found(),
        }
    }

    /// One interaction as asked, with its outcome once resolved.
    pub async fn interaction(&self, tenant_id: &str, id: &str) -> Result<Interaction> {
        let mut client = self.pool.get().await?;
        let client = tenant_tx(&mut client, tenant_id).await?;
        let row = client
            .qo(
                &format!(
                    "SELECT {INTERACTION_JSON} FROM interactions i JOIN sessions s ON s.id = i.session_id
                      WHERE i.id = $1 AND i.tenant_id = $2 AND s.removed_at IS NULL"
                ),
                &[&id, &tenant_id],
            )
            .await?;
        match row {
            Some(r) => parse_one(r.get(0)),
            None => not_found(),
        }
    }

    /// Answer an interaction. `Ok(Err(recorded))` when it was already resolved — or had
    /// expired, in which case its fallback is recorded now — so the caller answers
    /// `interaction-closed` with the recorded outcome.
    pub async fn respond_interaction(
        &self,
        tenant_id: &str,
        id: &str,
        answer: &Value,
        answered_by: &str,
        op: Option<&Receipt>,
    ) -> Result<Result<InteractionResolution, InteractionResolution>> {
        let outcome = parse_answer(answer).ok_or_else(bad)?;
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let (i, overdue) = lock_interaction(&tx, tenant_id, id).await?;
        if i.state != InteractionState::Pending {
            return resolution_of(&i, None)
                .map(Err)
                .ok_or_else(|| StoreError::Other(anyhow::anyhow!("resolved interaction without outcome")));
        }
        if overdue {
            let fallback = i.fallback.clone();
            let r = resolve(&tx, tenant_id, &i, InteractionState::Expired, fallback, None).await?;
            tx.commit().await?;
            return Ok(Err(r));
        }
        if !fits(&i.kind, i.options.as_deref(), &outcome) || skips_unskippable(i.params.as_ref(), &outcome) {
            return Err(bad());
        }
        let r = resolve(
            &tx,
            tenant_id,
            &i,
            InteractionState::Answered,
            outcome,
            Some(answered_by),
        )
        .await?;
        finish(&tx, op, &r).await?;
        tx.commit().await?;
        Ok(Ok(r))
    }

    /// Resolve the interaction with its fallback if it is still pending and overdue;
    /// returns it as it now is.
    pub async fn expire_interaction(&self, tenant_id: &str, id: &str) -> Result<Interaction> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let (mut i, overdue) = lock_interaction(&tx, tenant_id, id).await?;
        if i.state == InteractionState::Pending && overdue {
            let fallback = i.fallback.clone();
            let r = resolve(&tx, tenant_id, &i, InteractionState::Expired, fallback, None).await?;
            i.state = r.state;
            i.outcome = Some(r.outcome);
            tx.commit().await?;
        }
        Ok(i)
    }

    /// Expire every overdue interaction of every tenant (housekeeping; any replica may run
    /// it, it is idempotent). Returns how many were expired.
    pub async fn expire_overdue_interactions(&self) -> Result<usize> {
        let client = self.pool.get().await?;
        let rows = client
            .qa(
                "SELECT id, tenant_id FROM interactions WHERE state = 'pending' AND expires_at <= now()
                  ORDER BY expires_at LIMIT 500",
                &[],
            )
            .await?;
        drop(client);
        let mut n = 0;
        for r in rows {
            let (id, tenant): (String, String) = (r.get(0), r.get(1));
            match self.expire_interaction(&tenant, &id).await {
                Ok(i) if i.state == InteractionState::Expired => n += 1,
                Ok(_) | Err(StoreError::Code(ErrorCode::NotFound)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }

    /// Record an open `session.watch` held by `replica_id`; returns the watcher's id.
    ///
    /// The row is what makes other replicas' appends send their `NOTIFY` and relay their
    /// live output (both skipped when no other replica watches), so the session row is
    /// share-locked while it goes in: an append holds that row `FOR UPDATE` (live output
    /// `FOR NO KEY UPDATE`), so it either commits before this (and the watch's first reads,
    /// after this returns, see its event or the stored partial text) or takes its snapshot
    /// after this commits (and sees the row).
    pub async fn watcher_add(&self, tenant_id: &str, session_id: &str, replica_id: &str) -> Result<String> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let id = token::new_id("wat");
        let n = tx
            .ex(
                "INSERT INTO session_watchers (id, tenant_id, session_id, replica_id)
                 SELECT $1, $2, id, $4 FROM sessions WHERE id = $3 AND tenant_id = $2 AND removed_at IS NULL
                 FOR SHARE",
                &[&id, &tenant_id, &session_id, &replica_id],
            )
            .await?;
        if n == 0 {
            return not_found();
        }
        tx.commit().await?;
        Ok(id)
    }

    /// The watch ended.
    pub async fn watcher_remove(&self, tenant_id: &str, id: &str) -> Result<()> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        tx.ex(
            "DELETE FROM session_watchers WHERE id = $1 AND tenant_id = $2",
            &[&id, &tenant_id],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Keep these watcher rows (replica `replica_id`'s open watches) counting, and forget
    /// rows whose heartbeat lapsed (their replica died, or their removal failed). A row of
    /// a watch still open that was forgotten (this replica's heartbeats failed for that
    /// long) is recorded again, under the same share lock as [`Store::watcher_add`], and
    /// returned: appends may have skipped their `NOTIFY` meanwhile, so its watch must read
    /// again (and a watch that ended meanwhile must remove its row again). System work
    /// across tenants, like the worker presence sweep.
    pub async fn watchers_heartbeat(&self, replica_id: &str, watchers: &[WatcherKey]) -> Result<Vec<WatcherKey>> {
        let client = self.pool.get().await?;
        let mut restored = Vec::new();
        if !watchers.is_empty() {
            let ids: Vec<&str> = watchers.iter().map(|w| w.id.as_str()).collect();
            let tenants: Vec<&str> = watchers.iter().map(|w| w.tenant_id.as_str()).collect();
            let sessions: Vec<&str> = watchers.iter().map(|w| w.session_id.as_str()).collect();
            restored = client
                .qa(
                    "WITH k AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[]) AS k(id, tenant_id, session_id)),
                          beat AS (UPDATE session_watchers w SET heartbeat_at = now() FROM k WHERE w.id = k.id RETURNING w.id)
                     INSERT INTO session_watchers (id, tenant_id, session_id, replica_id)
                     SELECT k.id, k.tenant_id, k.session_id, $4 FROM k JOIN sessions s ON s.id = k.session_id AND s.tenant_id = k.tenant_id
                      WHERE s.removed_at IS NULL AND k.id NOT IN (SELECT id FROM beat)
                        FOR SHARE OF s
                     ON CONFLICT (id) DO NOTHING
                     RETURNING id, tenant_id, session_id",
                    &[&ids, &tenants, &sessions, &replica_id],
                )
                .await?
                .into_iter()
                .map(|r| WatcherKey {
                    id: r.get(0),
                    tenant_id: r.get(1),
                    session_id: r.get(2),
                })
                .collect();
        }
        client
            .ex(
                &format!("DELETE FROM session_watchers WHERE heartbeat_at < now() - interval '{WATCHER_STALE}'"),
                &[],
            )
            .await?;
        Ok(restored)
    }
}

/// One open `session.watch` as its replica knows it, for [`Store::watchers_heartbeat`].
#[derive(Clone, Debug)]
pub struct WatcherKey {
    pub id: String,
    pub tenant_id: String,
    pub session_id: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_must_match_the_kind_and_the_options() {
        let yes = InteractionOutcome::Approval { approved: true };
        let pick = |c: Option<&str>| InteractionOutcome::Choice {
            choice: c.map(str::to_string),
        };
        let opts = vec!["a".to_string(), "b".to_string()];
        assert!(fits("approval", None, &yes));
        assert!(!fits("approval", None, &pick(None)));
        assert!(!fits("choice", Some(&opts), &yes));
        assert!(fits("choice", Some(&opts), &pick(Some("b"))));
        assert!(fits("choice", Some(&opts), &pick(None)), "null declines");
        assert!(!fits("choice", Some(&opts), &pick(Some("c"))));
        assert!(fits("text", None, &pick(Some("anything"))), "no options: free text");
    }

    #[test]
    fn answers_have_exactly_one_typed_field() {
        assert_eq!(
            parse_answer(&json!({"approved": false})),
            Some(InteractionOutcome::Approval { approved: false })
        );
        assert_eq!(
            parse_answer(&json!({"choice": null})),
            Some(InteractionOutcome::Choice { choice: None })
        );
        for bad in [
            json!({}),
            json!({"approved": "yes"}),
            json!({"choice": 3}),
            json!({"choice": "a", "approved": true}),
            json!(true),
        ] {
            assert_eq!(parse_answer(&bad), None, "{bad}");
        }
    }

    #[test]
    fn nul_characters_are_replaced_everywhere() {
        let mut v = json!({"a\u{0}": ["x\u{0}y", {"k": "\u{0}"}], "n": 1});
        without_nul(&mut v);
        assert_eq!(v, json!({"a\u{FFFD}": ["x\u{FFFD}y", {"k": "\u{FFFD}"}], "n": 1}));
    }
}
