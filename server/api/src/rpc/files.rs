//! `files.list`, `files.watch`, `files.read`: answered by the worker that holds the
//! session's workspace. The two subscriptions relay the worker's items as they come and end
//! with its answer; closing one (or the connection) cancels the worker's side.

use berth_protocol::{
    ErrorCode, FilesListParams, FilesListResult, FilesReadParams, FilesWatchEnd, FilesWatchParams, Method, method,
};
use serde_json::Value;

use super::Ctx;
use crate::{
    error::{ApiError, ApiResult},
    workers::calls::{CallEvent, CallStream, Item},
};

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn list(ctx: Ctx, p: FilesListParams) -> ApiResult<FilesListResult> {
    ctx.session_unary(&p.session_id, method::FilesList::NAME, &p).await
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn watch(ctx: Ctx, p: FilesWatchParams) -> ApiResult<Option<FilesWatchEnd>> {
    let stream = ctx.session_call(&p.session_id, method::FilesWatch::NAME, &p).await?;
    decode(relay(&ctx, stream).await?)
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn read(ctx: Ctx, p: FilesReadParams) -> ApiResult<()> {
    let stream = ctx.session_call(&p.session_id, method::FilesRead::NAME, &p).await?;
    relay(&ctx, stream).await?;
    Ok(())
}

/// Pass a call's items on as subscription items until its answer. Closing the
/// subscription (or the connection) drops this future, and with it the call: the worker is
/// told to stop.
async fn relay(ctx: &Ctx, mut stream: CallStream) -> ApiResult<Value> {
    loop {
        match stream.next().await {
            Some(CallEvent::Item(item)) => {
                let sent = match &item {
                    Item::Json(item) => ctx.item_raw(item).await,
                    Item::Chunk { .. } => ctx.item_chunks(&item.chunks()).await,
                };
                if !sent {
                    return Err(ApiError(super::gone()));
                }
            }
            Some(CallEvent::Done(result)) => return result.map_err(ApiError),
            None => return Err(ApiError(super::gone())),
        }
    }
}

fn decode<T: serde::de::DeserializeOwned>(v: Value) -> ApiResult<T> {
    serde_json::from_value(v).map_err(|_| ApiError::code(ErrorCode::Internal))
}
