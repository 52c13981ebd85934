//! `queue.*`: revision-guarded edits of queued prompts.

use berth_protocol::{
    QueueEntry, QueueGetParams, QueueMoveParams, QueueRemoveParams, QueueState, QueueUpdateParams, QueuedPrompt,
    Removed,
};

use super::Ctx;
use crate::error::ApiResult;

#[tracing::instrument(skip_all, fields(session.id = %p.session_id, queue.id = %p.queue_id))]
pub async fn update(ctx: Ctx, p: QueueUpdateParams) -> ApiResult<QueueEntry> {
    let me = ctx.principal()?;
    super::session::check_prompt(&p.prompt)?;
    let store = &ctx.state.store;
    Ok(store
        .queue_update(
            &me.tenant_id,
            &p.session_id,
            &p.queue_id,
            p.queue_revision,
            &p.prompt,
            ctx.op.as_ref(),
        )
        .await?)
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id, queue.id = %p.queue_id))]
pub async fn move_entry(ctx: Ctx, p: QueueMoveParams) -> ApiResult<QueueState> {
    let me = ctx.principal()?;
    let store = &ctx.state.store;
    let before = p.before_queue_id.as_deref();
    Ok(store
        .queue_move(
            &me.tenant_id,
            &p.session_id,
            &p.queue_id,
            p.queue_revision,
            before,
            ctx.op.as_ref(),
        )
        .await?)
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id, queue.id = %p.queue_id))]
pub async fn remove(ctx: Ctx, p: QueueRemoveParams) -> ApiResult<Removed> {
    let me = ctx.principal()?;
    Ok(ctx
        .state
        .store
        .queue_remove(
            &me.tenant_id,
            &p.session_id,
            &p.queue_id,
            p.queue_revision,
            ctx.op.as_ref(),
        )
        .await?)
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id, queue.id = %p.queue_id))]
pub async fn get(ctx: Ctx, p: QueueGetParams) -> ApiResult<QueuedPrompt> {
    let me = ctx.principal()?;
    Ok(ctx
        .state
        .store
        .queue_get(&me.tenant_id, &p.session_id, &p.queue_id)
        .await?)
}
