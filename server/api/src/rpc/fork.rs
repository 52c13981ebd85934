//! `session.fork` and `session.forkReceipt`.

use berth_protocol::{ErrorCode, SessionForkParams, SessionForkReceiptParams, SessionForkResult};
use serde_json::json;

use super::{Ctx, receipts};
use crate::error::{ApiError, ApiResult};

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn fork(ctx: Ctx, p: SessionForkParams) -> ApiResult<SessionForkResult> {
    let me = ctx.principal()?;
    // The receipt is what makes a lost response recoverable: no receipt, no fork.
    if ctx.op.is_none() {
        return Err(ApiError::with(ErrorCode::BadParams, json!({"field": "operationId"})));
    }
    let forked = ctx.state.store.fork_session(&me.tenant_id, &p, ctx.op.as_ref()).await?;
    ctx.state.metrics.events_appended.inc();
    tracing::info!(fork.id = %forked.session_id, through = forked.branch.sequence, "session forked");
    Ok(forked)
}

/// The fork published under `operationId` by this principal, or null. Null does not prove
/// that nothing happened (the first attempt may still be in flight).
#[tracing::instrument(skip_all)]
pub async fn fork_receipt(ctx: Ctx, p: SessionForkReceiptParams) -> ApiResult<Option<SessionForkResult>> {
    let Some(view) = receipts::lookup(&ctx, &p.operation_id).await? else {
        return Ok(None);
    };
    if view.method != "session.fork" || view.state != berth_protocol::ReceiptState::Done {
        return Ok(None);
    }
    Ok(view.result.and_then(|r| serde_json::from_value(r).ok()))
}
