//! `session.*`: create, get, send, history, watch.

use std::time::Duration;

use berth_protocol::{
    ErrorCode, SessionCreateParams, SessionHistoryParams, SessionHistoryResult, SessionRef,
    SessionSendParams, SessionSendResult, SessionSnapshot, SessionWatchParams,
};
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
        .create_session(&me.tenant_id, &p, default_model(&ctx))
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

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn send(ctx: Ctx, p: SessionSendParams) -> ApiResult<SessionSendResult> {
    let me = ctx.principal()?;
    if !p.attachments.is_empty() {
        return Err(ApiError::with(
            ErrorCode::Unsupported,
            serde_json::json!({"field": "attachments"}),
        ));
    }
    let r = ctx
        .state
        .store
        .send(&me.tenant_id, &p.session_id, &p.prompt)
        .await?;
    tracing::info!(turn.id = %r.turn_id, state = r.state.as_str(), "turn admitted");
    Ok(r)
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn history(ctx: Ctx, p: SessionHistoryParams) -> ApiResult<SessionHistoryResult> {
    let me = ctx.principal()?;
    let limit = p.limit.unwrap_or(100);
    Ok(ctx
        .state
        .store
        .history(&me.tenant_id, &p.session_id, p.through, p.after, limit)
        .await?)
}

/// Subscription: catch up from the database, then follow wake-ups from the hub. The cursor
/// only moves forward over events read from the database, so there are no gaps and no
/// duplicates whichever replica appended them.
#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn watch(ctx: Ctx, p: SessionWatchParams) -> ApiResult<serde_json::Value> {
    let me = ctx.principal()?;
    let id = ctx.id.ok_or(ApiError::code(ErrorCode::InvalidRequest))?;
    if p.after < 0 {
        return Err(ApiError::code(ErrorCode::BadParams));
    }
    let store = &ctx.state.store;
    // Subscribe before the first read so no wake-up can fall between the two.
    let mut sub = ctx.state.hub.subscribe(&p.session_id);
    store.last_sequence(&me.tenant_id, &p.session_id).await?;
    let cancel = ctx.conn.closed.child_token();
    ctx.conn
        .subs
        .lock()
        .expect("conn lock")
        .insert(id, cancel.clone());
    let mut cursor = p.after;
    let mut safety = tokio::time::interval(Duration::from_secs(5));
    let result = 'watch: loop {
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
            for e in &events {
                if !ctx.item(e).await {
                    break 'watch Err(ApiError(super::gone()));
                }
            }
            cursor = last;
        }
        tokio::select! {
            changed = sub.events.changed() => if changed.is_err() { break Ok(serde_json::Value::Null) },
            live = sub.live.recv() => match live {
                Ok(item) => { ctx.try_item(&item); }
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => break Ok(serde_json::Value::Null),
            },
            _ = safety.tick() => {}
            _ = cancel.cancelled() => break Ok(serde_json::Value::Null),
        }
    };
    ctx.conn.subs.lock().expect("conn lock").remove(&id);
    result
}
