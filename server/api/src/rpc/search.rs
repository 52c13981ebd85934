//! `session.search`.

use berth_protocol::{SessionSearchParams, SessionSearchResult};

use super::Ctx;
use crate::error::ApiResult;

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn search(ctx: Ctx, p: SessionSearchParams) -> ApiResult<SessionSearchResult> {
    let me = ctx.principal()?;
    Ok(ctx.state.store.search(&me.tenant_id, &p).await?)
}
