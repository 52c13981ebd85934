//! `session.*`.

use std::time::Duration;

use berth_protocol::{
    Cleared, ErrorCode, QueueState, Removed, SessionCreateParams, SessionDiagnosticsParams, SessionDiagnosticsResult,
    SessionHistoryParams, SessionHistoryResult, SessionListParams, SessionListResult, SessionOpParams,
    SessionPauseParams, SessionRef, SessionRenameParams, SessionSendParams, SessionSendResult, SessionSetModelParams,
    SessionSnapshot, SessionSourceParams, SessionSourceResult, SessionStopParams, SessionWatchParams, TurnRef,
};
use berth_store::Partial;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use super::Ctx;
use crate::error::{ApiError, ApiResult};

/// Events read per catch-up query.
const CATCH_UP_BATCH: i64 = 200;

fn default_model(ctx: &Ctx) -> Option<&str> {
    ctx.state.config.model.model.as_deref()
}

#[tracing::instrument(skip_all, fields(workspace.id = %p.workspace_id))]
pub async fn create(ctx: Ctx, p: SessionCreateParams) -> ApiResult<SessionSnapshot> {
    let me = ctx.principal()?;
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
    if p.parent.is_some() {
        // No session has a parent until coordinator sessions exist.
        return Ok(SessionListResult {
            entries: Vec::new(),
            next_after: None,
        });
    }
    let limit = p.limit.unwrap_or(50);
    let store = &ctx.state.store;
    Ok(store
        .list_sessions(
            &me.tenant_id,
            p.workspace_id.as_deref(),
            p.after.as_deref(),
            limit,
            default_model(&ctx),
        )
        .await?)
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn rename(ctx: Ctx, p: SessionRenameParams) -> ApiResult<SessionSnapshot> {
    let me = ctx.principal()?;
    if p.title.len() > 1000 {
        return Err(ApiError::with(
            ErrorCode::BadParams,
            json!({"field": "title", "max": 1000}),
        ));
    }
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
    let store = &ctx.state.store;
    let (provider, model) = (p.provider.as_deref(), p.model.as_deref());
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
        .remove_session(&me.tenant_id, &p.session_id, ctx.op.as_ref())
        .await?;
    if r.removed {
        tracing::info!("session removed");
    }
    Ok(r)
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn clear(ctx: Ctx, p: SessionOpParams) -> ApiResult<Cleared> {
    let me = ctx.principal()?;
    Ok(ctx
        .state
        .store
        .clear_session(&me.tenant_id, &p.session_id, ctx.op.as_ref())
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
    let r = ctx
        .state
        .store
        .stop_turn(&me.tenant_id, &p.session_id, &p.turn_id, ctx.op.as_ref())
        .await?;
    ctx.state.metrics.turns.with_label_values(&["cancelled"]).inc();
    Ok(r)
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn send(ctx: Ctx, p: SessionSendParams) -> ApiResult<SessionSendResult> {
    let me = ctx.principal()?;
    if !p.attachments.is_empty() {
        return Err(ApiError::with(ErrorCode::Unsupported, json!({"field": "attachments"})));
    }
    let r = ctx
        .state
        .store
        .send(&me.tenant_id, &p.session_id, &p.prompt, ctx.op.as_ref())
        .await?;
    tracing::info!(turn.id = %r.turn_id, state = r.state.as_str(), "turn admitted");
    Ok(r)
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn history(ctx: Ctx, p: SessionHistoryParams) -> ApiResult<SessionHistoryResult> {
    let me = ctx.principal()?;
    Ok(ctx.state.store.history(&me.tenant_id, &p).await?)
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn source(ctx: Ctx, p: SessionSourceParams) -> ApiResult<SessionSourceResult> {
    let me = ctx.principal()?;
    Ok(ctx.state.store.source(&me.tenant_id, &p).await?)
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn diagnostics(ctx: Ctx, p: SessionDiagnosticsParams) -> ApiResult<SessionDiagnosticsResult> {
    let me = ctx.principal()?;
    let limit = p.limit.unwrap_or(50);
    Ok(ctx
        .state
        .store
        .diagnostics(&me.tenant_id, &p.session_id, p.through, p.before, limit)
        .await?)
}

/// What a watcher has delivered of the running step's live output, to drop the overlap
/// between the partial text read at join time and deltas that were already in flight.
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

    /// The part of a `model.delta` this watcher has not seen, or None.
    fn admit(&mut self, item: &Value) -> Option<Value> {
        let turn = item["turnId"].as_str()?;
        let step = item["step"].as_i64().unwrap_or(0);
        if turn != self.turn || step > self.step {
            *self = LiveCursor {
                turn: turn.to_string(),
                step,
                text: 0,
                thinking: 0,
            };
        } else if step < self.step {
            return None;
        }
        let mut out = item.clone();
        let mut any = false;
        for (field, offset_field, seen) in [
            ("text", "textOffset", &mut self.text),
            ("thinking", "thinkingOffset", &mut self.thinking),
        ] {
            let Some(s) = item[field].as_str() else { continue };
            let offset = item[offset_field].as_u64().unwrap_or(*seen);
            let end = offset + s.len() as u64;
            if end <= *seen {
                out[field] = Value::Null;
                continue;
            }
            let skip = seen.saturating_sub(offset) as usize;
            if skip > 0 {
                let Some(rest) = s.get(skip..) else { continue };
                out[field] = rest.into();
                out[offset_field] = (*seen).into();
            }
            *seen = end;
            any = true;
        }
        any.then_some(out)
    }
}

/// Subscription: catch up from the database, then follow wake-ups from the hub. The cursor
/// only moves forward over events read from the database, so there are no gaps and no
/// duplicates whichever replica appended them. A watcher joining mid-turn first gets the
/// running step's text so far as one `model.delta`.
#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn watch(ctx: Ctx, p: SessionWatchParams) -> ApiResult<Value> {
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
    let mut cursor = p.after;
    let mut live = LiveCursor::default();
    let mut joined = false;
    let mut safety = tokio::time::interval(Duration::from_secs(5));
    'watch: loop {
        loop {
            let events = match store
                .events_after(&me.tenant_id, &p.session_id, cursor, CATCH_UP_BATCH)
                .await
            {
                Ok(e) => e,
                Err(e) => break 'watch Err(e.into()),
            };
            let Some(last) = events.last().map(|e| e.sequence) else {
                break;
            };
            // A short batch is everything there was: no need to ask again until woken.
            let caught_up = (events.len() as i64) < CATCH_UP_BATCH;
            for e in &events {
                if !ctx.item(e).await {
                    break 'watch Err(ApiError(super::gone()));
                }
                if joined && let Ok(at) = chrono::DateTime::parse_from_rfc3339(&e.at) {
                    let lag = chrono::Utc::now().signed_duration_since(at).num_milliseconds().max(0);
                    ctx.state.metrics.fanout_lag.observe(lag as f64 / 1000.0);
                }
            }
            cursor = last;
            if caught_up {
                break;
            }
        }
        if !joined {
            joined = true;
            let partial = match sub.partial.take() {
                Some(p) => Some(p),
                None => store.partial(&me.tenant_id, &p.session_id).await.ok().flatten(),
            };
            if let Some(partial) = partial {
                live = LiveCursor::start(&partial);
                if !partial.text.is_empty() || !partial.thinking.is_empty() {
                    let item = json!({
                        "type": "model.delta", "turnId": partial.turn_id, "step": partial.step,
                        "text": partial.text, "textOffset": 0, "thinking": partial.thinking, "thinkingOffset": 0,
                    });
                    ctx.try_item(&item);
                }
            }
        }
        tokio::select! {
            changed = sub.events.changed() => if changed.is_err() { break Ok(Value::Null) },
            item = sub.live.recv() => match item {
                Ok(item) if item["type"] == "model.delta" => {
                    if let Some(fresh) = live.admit(&item) {
                        ctx.try_item(&fresh);
                    }
                }
                Ok(item) => { ctx.try_item(&item); }
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => break Ok(Value::Null),
            },
            _ = safety.tick() => {}
            _ = cancel.cancelled() => break Ok(Value::Null),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(step: i64, text: &str, offset: u64) -> Value {
        json!({"type": "model.delta", "turnId": "t", "step": step, "text": text, "textOffset": offset})
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
        assert_eq!(clipped["text"], ", w");
        assert_eq!(clipped["textOffset"], 5);
        assert_eq!(c.admit(&delta(0, "orld", 8)).unwrap()["text"], "orld");
        // A new step starts from zero; an old step is ignored.
        assert_eq!(c.admit(&delta(1, "Next", 0)).unwrap()["text"], "Next");
        assert!(c.admit(&delta(0, "late", 12)).is_none());
    }
}
