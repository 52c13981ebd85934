//! `workspace.*`.

use berth_protocol::{
    Empty, ErrorCode, Method, Removed, Workspace, WorkspaceFilesParams, WorkspaceFilesResult, WorkspaceRef,
    WorkspaceRemoveParams, WorkspaceRenameParams, method,
};
use serde_json::json;

use berth_store::admin::Actor;

use super::{
    Ctx,
    admin::{actor, admin},
};
use crate::{
    error::{ApiError, ApiResult},
    workers::calls,
};

/// The longest workspace title, in bytes.
const MAX_TITLE_BYTES: usize = 200;

#[tracing::instrument(skip_all)]
pub async fn list(ctx: Ctx, _p: Empty) -> ApiResult<Vec<Workspace>> {
    let me = ctx.principal()?;
    Ok(ctx.state.store.list_workspaces(&me.tenant_id).await?)
}

#[tracing::instrument(skip_all, fields(workspace.id = %p.workspace_id))]
pub async fn get(ctx: Ctx, p: WorkspaceRef) -> ApiResult<Workspace> {
    let me = ctx.principal()?;
    Ok(ctx.state.store.get_workspace(&me.tenant_id, &p.workspace_id).await?)
}

#[tracing::instrument(skip_all, fields(workspace.id = %p.workspace_id))]
pub async fn rename(ctx: Ctx, p: WorkspaceRenameParams) -> ApiResult<Workspace> {
    let me = ctx.principal()?;
    let title = p.title.trim();
    if title.is_empty() || title.len() > MAX_TITLE_BYTES {
        return Err(ApiError::with(
            ErrorCode::BadParams,
            json!({"field": "title", "maxBytes": MAX_TITLE_BYTES}),
        ));
    }
    Ok(ctx
        .state
        .store
        .rename_workspace(&me.tenant_id, &p.workspace_id, title, ctx.op.as_ref())
        .await?)
}

#[tracing::instrument(skip_all, fields(workspace.id = %p.workspace_id))]
pub async fn remove(ctx: Ctx, p: WorkspaceRemoveParams) -> ApiResult<Removed> {
    // Removing a workspace removes every member's sessions in it: admins only.
    let me = admin(&ctx)?;
    let (removed, keys) = ctx
        .state
        .store
        .remove_workspace(&me.tenant_id, &p.workspace_id, &Actor(actor(&me)), ctx.op.as_ref())
        .await?;
    // The rows are gone; now the bytes (a failure leaves an orphan for the sweep).
    crate::rpc::upload::delete_blobs(&ctx.state, keys).await;
    Ok(removed)
}

/// Completion candidates, answered by the workspace's worker.
#[tracing::instrument(skip_all, fields(workspace.id = %p.workspace_id))]
pub async fn files(ctx: Ctx, p: WorkspaceFilesParams) -> ApiResult<WorkspaceFilesResult> {
    let me = ctx.principal()?;
    // The workspace must be the caller's tenant's (not-found otherwise), online or not.
    ctx.state.store.get_workspace(&me.tenant_id, &p.workspace_id).await?;
    let params = serde_json::to_value(&p).unwrap_or_default();
    calls::unary(
        &ctx.state,
        &me.tenant_id,
        calls::To::Workspace(&p.workspace_id),
        method::WorkspaceFiles::NAME,
        params,
    )
    .await
}
