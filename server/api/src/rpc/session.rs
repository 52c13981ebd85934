//! `session.*`.

use std::time::Duration;

use berth_protocol::{
    Cleared, DiagnosticsRevision, ErrorCode, LiveItem, MAX_PROMPT_BYTES, MAX_SESSION_TITLE_BYTES, ModelDelta,
    QueueState, Removed, Resync, ResyncReason, SessionCompactParams, SessionCompactResult, SessionContextParams,
    SessionContextResult, SessionCreateParams, SessionDiagnosticsParams, SessionDiagnosticsResult,
    SessionHistoryParams, SessionListParams, SessionListResult, SessionOpParams, SessionPauseParams, SessionRef,
    SessionRenameParams, SessionSendParams, SessionSendResult, SessionSetModelParams, SessionSnapshot,
    SessionSourceParams, SessionSourceResult, SessionStopParams, SessionWatchParams, TurnRef, TurnState, WatchState,
};
use berth_store::{Admission, Partial, admin::Actor};
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;

use super::{Ctx, admin::actor};
use crate::error::{ApiError, ApiResult};

/// Events read per catch-up query, and the byte budget of one batch (payloads and row
/// text; one event larger than the budget still goes whole): what one watcher holds in
/// memory while catching up.
const CATCH_UP_BATCH: i64 = 200;
const CATCH_UP_BYTES: usize = 1 << 20;

fn default_model(ctx: &Ctx) -> Option<&str> {
    ctx.state.config.model.model.as_deref()
}

/// Check a `{provider, model}` choice against the configured profiles (SPEC §4.3): an
/// unknown profile or a model the profile does not offer is a typed error. A profile named
/// without a model gets its first model.
pub(super) fn choose_model(ctx: &Ctx, provider: Option<&str>, model: Option<String>) -> ApiResult<Option<String>> {
    let providers = ctx.state.config.providers.current();
    let profile = match (provider, providers.get(provider)) {
        (Some(name), None) => {
            return Err(ApiError::with(ErrorCode::UnknownProvider, json!({"provider": name})));
        }
        (_, profile) => profile,
    };
    let Some(profile) = profile else { return Ok(model) };
    match model {
        Some(m) if !profile.offers(&m) => Err(ApiError::with(ErrorCode::UnknownModel, json!({"model": m}))),
        Some(m) => Ok(Some(m)),
        None if provider.is_some() => Ok(profile.models.first().map(|m| m.id.clone())),
        None => Ok(None),
    }
}

/// A session title a client sets is at most [`MAX_SESSION_TITLE_BYTES`].
fn check_title(title: &str) -> ApiResult<()> {
    if title.len() > MAX_SESSION_TITLE_BYTES {
        return Err(ApiError::with(
            ErrorCode::BadParams,
            json!({"field": "title", "max": MAX_SESSION_TITLE_BYTES}),
        ));
    }
    Ok(())
}

#[tracing::instrument(skip_all, fields(workspace.id = %p.workspace_id))]
pub async fn create(ctx: Ctx, mut p: SessionCreateParams) -> ApiResult<SessionSnapshot> {
    let me = ctx.principal()?;
    if let Some(title) = &p.title {
        check_title(title)?;
    }
    if let Some(channel) = &p.channel
        && (channel.trim().is_empty()
            || channel.len() > berth_protocol::MAX_CHANNEL_BYTES
            || channel.chars().any(char::is_control))
    {
        return Err(ApiError::with(
            ErrorCode::BadParams,
            json!({"field": "channel", "max": berth_protocol::MAX_CHANNEL_BYTES}),
        ));
    }
    if p.delegation_depth
        .is_some_and(|d| d > berth_protocol::MAX_DELEGATION_DEPTH)
    {
        return Err(ApiError::with(
            ErrorCode::BadParams,
            json!({"field": "delegationDepth", "max": berth_protocol::MAX_DELEGATION_DEPTH}),
        ));
    }
    p.model = choose_model(&ctx, p.provider.as_deref(), p.model.take())?;
    if let Some(url) = &p.base_url {
        let providers = ctx.state.config.providers.current();
        let profile = providers.get(p.provider.as_deref());
        if !profile.is_some_and(|pr| pr.allow_base_url) {
            return Err(ApiError::with(
                ErrorCode::BaseUrlNotAllowed,
                json!({"field": "baseUrl"}),
            ));
        }
        let ok = reqwest::Url::parse(url).is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.has_host());
        if !ok || url.len() > 2000 {
            return Err(ApiError::with(ErrorCode::BadParams, json!({"field": "baseUrl"})));
        }
        if !profile.is_some_and(|pr| pr.allow_private_base_url) && !crate::net::public_url(url) {
            return Err(ApiError::with(
                ErrorCode::BaseUrlNotAllowed,
                json!({"field": "baseUrl", "reason": "private-address"}),
            ));
        }
    }
    let snap = ctx
        .state
        .store
        .create_session(&me.tenant_id, &p, default_model(&ctx), ctx.op.as_ref())
        .await?;
    ctx.state.metrics.events_appended.inc();
    tracing::info!(session.id = %snap.session_id, "session created");
    Ok(snap)
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn get(ctx: Ctx, p: SessionRef) -> ApiResult<SessionSnapshot> {
    let me = ctx.principal()?;
    Ok(ctx
        .state
        .store
        .get_session(&me.tenant_id, &p.session_id, default_model(&ctx))
        .await?)
}

#[tracing::instrument(skip_all)]
pub async fn list(ctx: Ctx, p: SessionListParams) -> ApiResult<SessionListResult> {
    let me = ctx.principal()?;
    let limit = p.limit.unwrap_or(50);
    let store = &ctx.state.store;
    Ok(store
        .list_sessions(
            &me.tenant_id,
            p.workspace_id.as_deref(),
            p.parent.as_deref(),
            p.after.as_deref(),
            limit,
            default_model(&ctx),
        )
        .await?)
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn rename(ctx: Ctx, p: SessionRenameParams) -> ApiResult<SessionSnapshot> {
    let me = ctx.principal()?;
    check_title(&p.title)?;
    let store = &ctx.state.store;
    Ok(store
        .rename_session(
            &me.tenant_id,
            &p.session_id,
            p.title.trim(),
            default_model(&ctx),
            ctx.op.as_ref(),
        )
        .await?)
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn set_model(ctx: Ctx, p: SessionSetModelParams) -> ApiResult<SessionSnapshot> {
    let me = ctx.principal()?;
    let model = choose_model(&ctx, p.provider.as_deref(), p.model)?;
    let store = &ctx.state.store;
    let (provider, model) = (p.provider.as_deref(), model.as_deref());
    Ok(store
        .set_model(
            &me.tenant_id,
            &p.session_id,
            provider,
            model,
            default_model(&ctx),
            ctx.op.as_ref(),
        )
        .await?)
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn remove(ctx: Ctx, p: SessionOpParams) -> ApiResult<Removed> {
    let me = ctx.principal()?;
    let r = ctx
        .state
        .store
        .remove_session(&me.tenant_id, &p.session_id, &Actor(actor(&me)), ctx.op.as_ref())
        .await?;
    if r.removed {
        tracing::info!("session removed");
    }
    crate::rpc::upload::release_session(&ctx.state, &me.tenant_id, &p.session_id).await;
    Ok(r)
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn clear(ctx: Ctx, p: SessionOpParams) -> ApiResult<Cleared> {
    let me = ctx.principal()?;
    Ok(ctx
        .state
        .store
        .clear_session(&me.tenant_id, &p.session_id, &Actor(actor(&me)), ctx.op.as_ref())
        .await?)
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn pause(ctx: Ctx, p: SessionPauseParams) -> ApiResult<QueueState> {
    let me = ctx.principal()?;
    Ok(ctx
        .state
        .store
        .pause(&me.tenant_id, &p.session_id, p.paused, ctx.op.as_ref())
        .await?)
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id, turn.id = %p.turn_id))]
pub async fn stop(ctx: Ctx, p: SessionStopParams) -> ApiResult<TurnRef> {
    let me = ctx.principal()?;
    // The running step's text this replica's watchers were shown (when it holds the turn's
    // worker): the stop keeps it, though part of it may not be stored yet.
    let seen = ctx.state.hub.partial(&p.session_id);
    let r = ctx
        .state
        .store
        .stop_turn(&me.tenant_id, &p.session_id, &p.turn_id, seen.as_ref(), ctx.op.as_ref())
        .await?;
    ctx.state.metrics.turns.with_label_values(&["cancelled"]).inc();
    Ok(r)
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn send(ctx: Ctx, p: SessionSendParams) -> ApiResult<SessionSendResult> {
    let me = ctx.principal()?;
    if p.attachments.len() > berth_protocol::MAX_ATTACHMENTS_PER_TURN {
        return Err(ApiError::with(
            ErrorCode::PayloadTooLarge,
            json!({"limit": "attachments", "max": berth_protocol::MAX_ATTACHMENTS_PER_TURN}),
        ));
    }
    check_prompt(&p.prompt)?;
    // Local watchers get `turn.started` as written, without reading it back.
    let append = ctx.state.hub.appending(&p.session_id);
    // A turn that starts at once goes to a worker connection of this replica with the
    // admission's own transaction, when one serves the session's workspace.
    let reserved = ctx.state.workers.reserve(&me.tenant_id);
    let workers: Vec<(&str, &[String])> = reserved.iter().map(|r| (r.connection_id(), r.workspaces())).collect();
    let from = Admission {
        replica: &ctx.state.config.replica_id,
        watched: append.is_some(),
        workers: &workers,
        default_model: ctx.state.config.model.model.as_deref(),
    };
    let admitted = match ctx
        .state
        .store
        .admit(
            &me.tenant_id,
            &p.session_id,
            &p.prompt,
            &p.attachments,
            ctx.op.as_ref(),
            Some(&from),
        )
        .await
    {
        Ok(admitted) => admitted,
        Err(e) => {
            ctx.state.hub.failed(append, &p.session_id, &e);
            return Err(e.into());
        }
    };
    let r = admitted.result;
    // Without events (a queued prompt) the watchers read what was written, woken by its
    // notice once the guard is gone.
    if let Some(last) = admitted.events.last().map(|e| e.sequence) {
        ctx.state.hub.committed(append, &p.session_id, admitted.events, last);
    }
    match admitted.handed {
        Some((connection, turn)) => ctx.state.workers.hand_out(reserved, &connection, turn).await,
        // When this replica holds the workspace's worker, hand the turn out now rather than
        // when this replica hears its own `NOTIFY berth_dispatch` back. The notification
        // names this replica, which skips it (a second, empty claim); other replicas still
        // kick on it.
        None if r.state == TurnState::Running => {
            drop(reserved);
            ctx.state.workers.kick(&admitted.workspace_id);
        }
        None => {}
    }
    tracing::info!(turn.id = %r.turn_id, state = r.state.as_str(), "turn admitted");
    Ok(r)
}

/// The prompt limit of `session.send` and `queue.update`.
pub fn check_prompt(prompt: &str) -> ApiResult<()> {
    if prompt.len() > MAX_PROMPT_BYTES {
        return Err(ApiError::with(
            ErrorCode::PayloadTooLarge,
            json!({"limit": "prompt", "max": MAX_PROMPT_BYTES}),
        ));
    }
    Ok(())
}

/// `session.history`, answered with the JSON of its `SessionHistoryResult` written by the
/// store straight from the page's rows.
#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn history(ctx: Ctx, p: SessionHistoryParams) -> ApiResult<Box<serde_json::value::RawValue>> {
    let me = ctx.principal()?;
    Ok(ctx.state.store.history_json(&me.tenant_id, &p).await?)
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn source(ctx: Ctx, p: SessionSourceParams) -> ApiResult<SessionSourceResult> {
    let me = ctx.principal()?;
    Ok(ctx.state.store.source(&me.tenant_id, &p).await?)
}

/// `session.context`: the latest main model request the session prepared (SPEC §4.10).
#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn context(ctx: Ctx, p: SessionContextParams) -> ApiResult<SessionContextResult> {
    let me = ctx.principal()?;
    let (through, request) = ctx.state.store.context(&me.tenant_id, &p.session_id, p.through).await?;
    Ok(SessionContextResult { through, request })
}

/// `session.compact`: summarize the history so far into a handoff row (SPEC §4.17).
#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn compact(ctx: Ctx, p: SessionCompactParams) -> ApiResult<SessionCompactResult> {
    let me = ctx.principal()?;
    let compaction =
        crate::compaction::compact(&ctx.state, &me.tenant_id, &p.session_id, None, false, ctx.op.as_ref()).await?;
    Ok(SessionCompactResult {
        compacted: compaction.is_some(),
        compaction,
    })
}

/// `session.watchDiagnostics`: the diagnostic revision on subscribe, then after each
/// change. Diagnostics written with an event wake it through the session's channel; others
/// (titles) poke the channel on the replica that wrote them, and a periodic re-read covers
/// the rest.
#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn watch_diagnostics(ctx: Ctx, p: SessionRef) -> ApiResult<()> {
    let me = ctx.principal()?;
    let id = ctx.id.ok_or(ApiError::code(ErrorCode::InvalidRequest))?;
    let store = &ctx.state.store;
    store.diagnostic_revision(&me.tenant_id, &p.session_id).await?;
    let mut sub = ctx.state.hub.subscribe(&p.session_id);
    let cancel = ctx
        .conn
        .subs
        .lock()
        .expect("conn lock")
        .get(&id)
        .cloned()
        .unwrap_or_else(|| ctx.conn.closed.child_token());
    let mut sent = None;
    let mut safety = tokio::time::interval(Duration::from_secs(2));
    loop {
        let revision = match store.diagnostic_revision(&me.tenant_id, &p.session_id).await {
            Ok(r) => r,
            // Removed meanwhile: the subscription ends.
            Err(berth_store::StoreError::Code(ErrorCode::NotFound)) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        if sent != Some(revision) {
            sent = Some(revision);
            let item = DiagnosticsRevision {
                diagnostic_revision: revision,
            };
            if !ctx.item(&item).await {
                return Err(ApiError(super::gone()));
            }
        }
        tokio::select! {
            changed = sub.events.changed() => if changed.is_err() { return Ok(()) },
            _ = safety.tick() => {}
            _ = cancel.cancelled() => return Ok(()),
        }
    }
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn diagnostics(ctx: Ctx, p: SessionDiagnosticsParams) -> ApiResult<SessionDiagnosticsResult> {
    let me = ctx.principal()?;
    let limit = p.limit.unwrap_or(50);
    Ok(ctx
        .state
        .store
        .diagnostics(&me.tenant_id, &p.session_id, p.through_revision, p.before, limit)
        .await?)
}

/// What a watcher has delivered of the running step's live output, to drop the overlap
/// between the partial text read at join (or resync) time and deltas already in flight.
#[derive(Default)]
struct LiveCursor {
    turn: String,
    step: i64,
    text: u64,
    thinking: u64,
}

impl LiveCursor {
    fn start(p: &Partial) -> LiveCursor {
        LiveCursor {
            turn: p.turn_id.clone(),
            step: i64::from(p.step),
            text: p.text.len() as u64,
            thinking: p.thinking.len() as u64,
        }
    }

    /// The watcher was sent `model.completed` for `step` of `turn`: that step's live output
    /// (and any before it) is history now, and none of it is to be sent again.
    fn completed(&mut self, turn: &str, step: i64) {
        if self.turn.is_empty() || (self.turn == turn && self.step <= step) {
            *self = LiveCursor {
                turn: turn.to_string(),
                step: step + 1,
                text: 0,
                thinking: 0,
            };
        }
    }

    /// The part of a `model.delta` this watcher has not seen, or None.
    fn admit(&mut self, item: &ModelDelta) -> Option<ModelDelta> {
        if item.turn_id != self.turn || item.step > self.step {
            *self = LiveCursor {
                turn: item.turn_id.clone(),
                step: item.step,
                text: 0,
                thinking: 0,
            };
        } else if item.step < self.step {
            return None;
        }
        let mut out = ModelDelta {
            turn_id: item.turn_id.clone(),
            step: item.step,
            text: None,
            text_offset: None,
            thinking: None,
            thinking_offset: None,
        };
        for (piece, offset, seen, out_piece, out_offset) in [
            (
                &item.text,
                item.text_offset,
                &mut self.text,
                &mut out.text,
                &mut out.text_offset,
            ),
            (
                &item.thinking,
                item.thinking_offset,
                &mut self.thinking,
                &mut out.thinking,
                &mut out.thinking_offset,
            ),
        ] {
            let Some(s) = piece.as_deref().filter(|s| !s.is_empty()) else {
                continue;
            };
            let offset = offset.unwrap_or(*seen);
            let end = offset + s.len() as u64;
            if end <= *seen {
                continue;
            }
            let skip = seen.saturating_sub(offset) as usize;
            let Some(rest) = s.get(skip..) else { continue };
            *out_piece = Some(rest.to_string());
            *out_offset = Some(offset.max(*seen));
            *seen = end;
        }
        (out.text.is_some() || out.thinking.is_some()).then_some(out)
    }
}

/// The turn and step of a `model.completed` event (None for any other event, or one stored
/// before the event named its step).
fn completed_step(e: &berth_store::EventRecord) -> Option<(&str, i64)> {
    match &e.payload {
        berth_protocol::EventPayload::ModelCompleted(c) => Some((e.turn_id.as_deref()?, c.step?)),
        _ => None,
    }
}

/// The running step's output so far unless the watcher has already been sent that step's
/// `model.completed` (`completed`): a partial taken when the watcher joined may be older
/// than the catch-up that followed, and its step's text would then be shown twice.
fn unless_completed(partial: Option<Partial>, completed: Option<&(String, i64)>) -> Option<Partial> {
    partial.filter(|p| !completed.is_some_and(|(turn, step)| *turn == p.turn_id && i64::from(p.step) <= *step))
}

/// The running step's output so far as one `model.delta` from offset 0 (None when empty).
fn partial_item(p: &Partial) -> Option<ModelDelta> {
    let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
    let (text, thinking) = (some(&p.text), some(&p.thinking));
    (text.is_some() || thinking.is_some()).then(|| ModelDelta {
        turn_id: p.turn_id.clone(),
        step: i64::from(p.step),
        text_offset: text.as_ref().map(|_| 0),
        text,
        thinking_offset: thinking.as_ref().map(|_| 0),
        thinking,
    })
}

/// Subscription: catch up from the database, then follow wake-ups from the hub. The cursor
/// only moves forward over events read from the database, so there are no gaps and no
/// duplicates whichever replica appended them. Once caught up, the watcher gets a `state`
/// item (phase, queue, pending interactions) and the running step's text so far; live items
/// are awaited like events (a slow reader slows its own subscription), and a watcher that
/// still falls behind the live stream gets `resync`, then `state` and the text again.
#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn watch(ctx: Ctx, p: SessionWatchParams) -> ApiResult<()> {
    let me = ctx.principal()?;
    let id = ctx.id.ok_or(ApiError::code(ErrorCode::InvalidRequest))?;
    if p.after < 0 {
        return Err(ApiError::code(ErrorCode::BadParams));
    }
    let store = &ctx.state.store;
    // Only sessions of the caller's tenant get a hub entry; then subscribe before the first
    // read of events, so that no wake-up can fall between the two.
    store.last_sequence(&me.tenant_id, &p.session_id).await?;
    // Recorded for every replica: an interaction asked while nobody watches is answered by its fallback.
    let _watcher = super::interaction::Watcher::register(&ctx.state, &me.tenant_id, &p.session_id).await?;
    let mut sub = ctx.state.hub.subscribe(&p.session_id);
    // The slot was reserved under this request id when the frame was admitted.
    let cancel = ctx
        .conn
        .subs
        .lock()
        .expect("conn lock")
        .get(&id)
        .cloned()
        .unwrap_or_else(|| ctx.conn.closed.child_token());
    let gone = || ApiError(super::gone());
    let mut cursor = p.after;
    let mut live = LiveCursor::default();
    // The last `model.completed` sent (turn, step): that step's text is not sent live again.
    let mut completed: Option<(String, i64)> = None;
    // Whether the client's live view needs drawing from scratch (on join, after a lag).
    let mut sync = true;
    let mut joined = false;
    let mut safety = tokio::time::interval(Duration::from_secs(5));
    // Whether the database may hold events this watcher has not sent: live items never
    // add any, so only an event wake-up, a lag or the safety tick reads the database.
    let mut catch_up = true;
    // Whether the wake-up came from an event commit (not a lag, the safety tick or the
    // join), so that the hub's copies of this replica's appends may serve it; and the pokes
    // already covered by a read of the database.
    let mut woken = false;
    let mut pokes = 0;
    // An idle phase heard live waits for the events committed before it (the turn's last
    // step and its end): a client that stops at idle has the answer by then.
    let mut idle: Option<LiveItem> = None;
    let (from_append, from_read) = (
        ctx.state.metrics.watch_events.with_label_values(&["append"]),
        ctx.state.metrics.watch_events.with_label_values(&["read"]),
    );
    let send = async |e: &berth_store::EventRecord, joined: bool, source: &prometheus::IntCounter| {
        if !ctx.item(e).await {
            return false;
        }
        source.inc();
        if joined && let Ok(at) = chrono::DateTime::parse_from_rfc3339(&e.at) {
            let lag = chrono::Utc::now().signed_duration_since(at).num_milliseconds().max(0);
            ctx.state.metrics.fanout_lag.observe(lag as f64 / 1000.0);
        }
        true
    };
    loop {
        while std::mem::take(&mut catch_up) {
            if cancel.is_cancelled() {
                return Ok(());
            }
            let mark = *sub.events.borrow_and_update();
            // This replica's own appends, right after the cursor and up to the latest
            // sequence known, are sent as they were written: no read (see `Hub::committed`).
            if std::mem::take(&mut woken) && mark.pokes == pokes {
                for e in ctx.state.hub.recent_after(&p.session_id, cursor) {
                    if !send(&e, joined, &from_append).await {
                        return Err(gone());
                    }
                    cursor = e.sequence;
                    if let Some((turn, step)) = completed_step(&e) {
                        live.completed(turn, step);
                        completed = Some((turn.to_string(), step));
                    }
                }
                if cursor >= mark.sequence {
                    continue;
                }
            }
            pokes = mark.pokes;
            let (events, more) = store
                .events_after(&me.tenant_id, &p.session_id, cursor, CATCH_UP_BATCH, CATCH_UP_BYTES)
                .await?;
            for e in &events {
                if !send(e, joined, &from_read).await {
                    return Err(gone());
                }
                if let Some((turn, step)) = completed_step(e) {
                    live.completed(turn, step);
                    completed = Some((turn.to_string(), step));
                }
            }
            if let Some(last) = events.last() {
                cursor = last.sequence;
            }
            catch_up = more;
        }
        if let Some(item) = idle.take()
            && !ctx.item(&item).await
        {
            return Err(gone());
        }
        joined = true;
        if sync {
            sync = false;
            let snap = store
                .get_session(&me.tenant_id, &p.session_id, ctx.state.config.model.model.as_deref())
                .await?;
            let state = LiveItem::State(WatchState {
                through: snap.sequence,
                phase: snap.phase,
                running: snap.running,
                queued: snap.queued,
                queue: snap.queue,
                paused: snap.paused,
                pending_interactions: snap.pending_interactions,
            });
            if !ctx.item(&state).await {
                return Err(gone());
            }
            // The output so far: what this replica holds when it holds the turn's worker,
            // taken together with the live stream's position; else what the database holds.
            let partial = match sub.partial.take().or_else(|| ctx.state.hub.partial(&p.session_id)) {
                Some(p) => Some(p),
                None => store.partial(&me.tenant_id, &p.session_id).await?,
            };
            live = LiveCursor::default();
            if let Some((turn, step)) = &completed {
                live.completed(turn, *step);
            }
            if let Some(partial) = unless_completed(partial, completed.as_ref()) {
                live = LiveCursor::start(&partial);
                if let Some(item) = partial_item(&partial)
                    && !ctx.item(&LiveItem::ModelDelta(item)).await
                {
                    return Err(gone());
                }
            }
        }
        // Live items first: a step's last delta is published before the event that ends
        // it (in NOTIFY order, or locally before the commit), so a watcher that finds both
        // ready delivers the delta, not the catch-up that would overtake it.
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return Ok(()),
            item = sub.live.recv() => match item {
                Ok(item) => {
                    // Read in place: every watcher of the session shares the one item.
                    let item = match <LiveItem as serde::Deserialize>::deserialize(&*item) {
                        Ok(LiveItem::ModelDelta(d)) => live.admit(&d).map(LiveItem::ModelDelta),
                        Ok(LiveItem::Phase(p)) if p.phase == berth_protocol::SessionPhase::Idle => {
                            idle = Some(LiveItem::Phase(p));
                            catch_up = true;
                            // The end's commit woke the watch too (this replica's end
                            // publishes it before the idle phase, and the live branch is
                            // taken first): its events are the hub's copies, no read.
                            woken |= sub.events.has_changed().unwrap_or(false);
                            None
                        }
                        Ok(LiveItem::Resync(r)) => {
                            // Live items relayed from elsewhere were lost: start the live
                            // view again, after whatever history it missed.
                            tracing::debug!(reason = ?r.reason, "live stream interrupted; resync");
                            sync = true;
                            catch_up = true;
                            Some(LiveItem::Resync(r))
                        }
                        Ok(other) => Some(other),
                        Err(e) => {
                            tracing::warn!(error = %e, "live item outside the protocol dropped");
                            None
                        }
                    };
                    if let Some(item) = item && !ctx.item(&item).await {
                        return Err(gone());
                    }
                }
                Err(RecvError::Lagged(_)) => {
                    tracing::debug!("watcher fell behind the live stream; resync");
                    let resync = LiveItem::Resync(Resync { reason: ResyncReason::Lagged });
                    if !ctx.item(&resync).await {
                        return Err(gone());
                    }
                    sync = true;
                    catch_up = true;
                }
                Err(RecvError::Closed) => return Ok(()),
            },
            changed = sub.events.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
                catch_up = true;
                woken = true;
            }
            _ = safety.tick() => catch_up = true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partial(step: i32, text: &str) -> Partial {
        Partial {
            turn_id: "t".into(),
            step,
            text: text.into(),
            thinking: String::new(),
        }
    }

    /// A joiner takes the running step's text when it subscribes; if that step completes
    /// while it catches up, the catch-up sends the step's `model.completed`, and the text
    /// taken before must not follow it (the step would be shown twice), nor its late deltas.
    #[test]
    fn a_step_completed_during_catch_up_is_not_sent_again() {
        let done = ("t".to_string(), 0);
        assert_eq!(unless_completed(Some(partial(0, "Hello")), Some(&done)), None);
        assert_eq!(
            unless_completed(Some(partial(1, "Next")), Some(&done)),
            Some(partial(1, "Next")),
            "the step after it is live"
        );
        let other = ("u".to_string(), 3);
        assert_eq!(
            unless_completed(Some(partial(0, "Hello")), Some(&other)),
            Some(partial(0, "Hello")),
            "another turn's step says nothing of this one"
        );
        let mut c = LiveCursor::default();
        c.completed("t", 0);
        assert!(c.admit(&delta(0, "lo", 3)).is_none(), "the completed step's late delta");
        assert_eq!(c.admit(&delta(1, "Next", 0)).unwrap().text.as_deref(), Some("Next"));
        // A completion heard after the next step started streaming leaves its cursor alone.
        c.completed("t", 0);
        assert!(c.admit(&delta(1, "Ne", 0)).is_none(), "already delivered");
    }

    fn delta(step: i64, text: &str, offset: u64) -> ModelDelta {
        ModelDelta {
            turn_id: "t".into(),
            step,
            text: Some(text.into()),
            text_offset: Some(offset),
            thinking: Some(String::new()),
            thinking_offset: Some(0),
        }
    }

    #[test]
    fn live_cursor_drops_overlap_and_keeps_new_text() {
        let mut c = LiveCursor::start(&Partial {
            turn_id: "t".into(),
            step: 0,
            text: "Hello".into(),
            thinking: String::new(),
        });
        assert!(c.admit(&delta(0, "Hel", 0)).is_none(), "already delivered");
        let clipped = c.admit(&delta(0, "lo, w", 3)).unwrap();
        assert_eq!(clipped.text.as_deref(), Some(", w"));
        assert_eq!(clipped.text_offset, Some(5));
        assert_eq!(clipped.thinking, None, "empty pieces are left out");
        assert_eq!(c.admit(&delta(0, "orld", 8)).unwrap().text.as_deref(), Some("orld"));
        // A new step starts from zero; an old step is ignored.
        assert_eq!(c.admit(&delta(1, "Next", 0)).unwrap().text.as_deref(), Some("Next"));
        assert!(c.admit(&delta(0, "late", 12)).is_none());
    }
}
