//! `git.status`, `git.diff`: answered by the worker that holds the session's workspace.

use berth_protocol::{GitDiff, GitDiffParams, GitStatus, GitStatusParams, Method, method};

use super::Ctx;
use crate::error::ApiResult;

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn status(ctx: Ctx, p: GitStatusParams) -> ApiResult<Option<GitStatus>> {
    ctx.session_unary(&p.session_id, method::GitStatusGet::NAME, &p).await
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn diff(ctx: Ctx, p: GitDiffParams) -> ApiResult<GitDiff> {
    ctx.session_unary(&p.session_id, method::GitDiffGet::NAME, &p).await
}
