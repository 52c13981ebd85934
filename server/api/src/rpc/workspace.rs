//! `workspace.*`.

use berth_protocol::{Empty, Workspace, WorkspaceRef};

use super::Ctx;
use crate::error::ApiResult;

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
