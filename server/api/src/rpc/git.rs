//! `git.status`, `git.diff`: answered by the worker that holds the session's workspace.

use berth_protocol::{GitDiff, GitDiffParams, GitStatus, GitStatusParams, Method, method};

use super::Ctx;
use crate::{error::ApiResult, workers::calls};

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn status(ctx: Ctx, p: GitStatusParams) -> ApiResult<Option<GitStatus>> {
    let me = ctx.principal()?;
    let params = serde_json::to_value(&p).unwrap_or_default();
    calls::unary(
        &ctx.state,
        &me.tenant_id,
        calls::To::Session(&p.session_id),
        method::GitStatusGet::NAME,
        params,
    )
    .await
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn diff(ctx: Ctx, p: GitDiffParams) -> ApiResult<GitDiff> {
    let me = ctx.principal()?;
    let params = serde_json::to_value(&p).unwrap_or_default();
    calls::unary(
        &ctx.state,
        &me.tenant_id,
        calls::To::Session(&p.session_id),
        method::GitDiffGet::NAME,
        params,
    )
    .await
}
