//! `files.list`, `files.watch`, `files.read`: answered by the worker that holds the
//! session's workspace. The two subscriptions relay the worker's items as they come and end
//! with its answer; closing one (or the connection) cancels the worker's side.

use std::time::Duration;

use berth_protocol::{
    ErrorCode, FilesListParams, FilesListResult, FilesReadParams, FilesWatchEnd, FilesWatchItem, FilesWatchParams,
    Method, RpcError, method,
};
use serde_json::Value;

use super::Ctx;
use crate::{
    error::{ApiError, ApiResult},
    workers::calls::{CallEvent, CallStream, Item},
};

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn list(ctx: Ctx, p: FilesListParams) -> ApiResult<FilesListResult> {
    let mut r: FilesListResult = ctx.session_unary(&p.session_id, method::FilesList::NAME, &p).await?;
    // From a worker that wrote it under SPEC's name.
    r.next_after = r.next_after.or(r.next.take());
    Ok(r)
}

/// How long a watch whose worker connection ended looks for the worker's next one (a
/// rollout's hand-over opens it before the old one closes; a restarted worker takes longer).
const WATCH_REOPEN_WINDOW: Duration = Duration::from_secs(20);

/// A `files.watch` outlives its worker connection: when the connection it runs on ends (a
/// replica drained in a rollout, a worker that reconnects), the watch is opened again on the
/// worker's next connection. If that one watches the same directory, the client sees one
/// `changed` (whatever changed in between is then listed), not a second `ready`; a directory
/// replaced in between ends the watch `unavailable`, as it would have live.
#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn watch(ctx: Ctx, p: FilesWatchParams) -> ApiResult<Option<FilesWatchEnd>> {
    let mut stream = ctx.session_call(&p.session_id, method::FilesWatch::NAME, &p).await?;
    let mut identity: Option<String> = None;
    loop {
        let lost = match relay_watch(&ctx, &mut stream, &mut identity).await? {
            Watched::Ended(v) => return decode(v),
            Watched::Lost(e) => e,
        };
        // Only a watch that was set up is carried over; one lost before its `ready` fails as
        // any call does.
        if identity.is_none() {
            return Err(ApiError(lost));
        }
        tracing::info!(reason = %lost.data, "a watch's worker connection ended; opening it again");
        stream = reopen(&ctx, &p, lost).await?;
    }
}

/// How a watch's call ended.
enum Watched {
    /// The worker's answer.
    Ended(Value),
    /// The connection it ran on ended (`unavailable {reason}`).
    Lost(RpcError),
}

/// Relay a watch's items; the first `ready` records the directory's identity, and the
/// `ready` of a watch opened again becomes `changed` (or ends the watch when the directory is
/// another one now).
async fn relay_watch(ctx: &Ctx, stream: &mut CallStream, identity: &mut Option<String>) -> ApiResult<Watched> {
    loop {
        let raw = match stream.next().await {
            Some(CallEvent::Item(Item::Json(raw))) => raw,
            Some(CallEvent::Item(Item::Chunk { .. })) => return Err(ApiError::code(ErrorCode::Internal)),
            Some(CallEvent::Done(Ok(v))) => return Ok(Watched::Ended(v)),
            Some(CallEvent::Done(Err(e))) if connection_lost(&e) => return Ok(Watched::Lost(e)),
            Some(CallEvent::Done(Err(e))) => return Err(ApiError(e)),
            None => return Err(ApiError(super::gone())),
        };
        let sent = match serde_json::from_str::<FilesWatchItem>(raw.get()) {
            Ok(FilesWatchItem::Ready { directory_identity }) => match identity {
                None => {
                    *identity = Some(directory_identity);
                    ctx.item_raw(&raw).await
                }
                Some(known) if *known == directory_identity => ctx.item(&FilesWatchItem::Changed).await,
                Some(_) => {
                    return Ok(Watched::Ended(
                        serde_json::to_value(FilesWatchEnd::Unavailable).unwrap_or_default(),
                    ));
                }
            },
            _ => ctx.item_raw(&raw).await,
        };
        if !sent {
            return Err(ApiError(super::gone()));
        }
    }
}

/// Whether a call ended because the worker connection (or the replica holding it) did.
fn connection_lost(e: &RpcError) -> bool {
    e.data_code() == Some(ErrorCode::Unavailable.as_str())
        && matches!(
            e.data.get("reason").and_then(Value::as_str),
            Some("worker-disconnected" | "replica-unreachable")
        )
}

/// Open a lost watch again on the worker's next connection, trying for
/// [`WATCH_REOPEN_WINDOW`] while the workspace is offline or its replica unreachable; past
/// that, the watch fails with the error that ended it.
async fn reopen(ctx: &Ctx, p: &FilesWatchParams, lost: RpcError) -> ApiResult<CallStream> {
    let until = tokio::time::Instant::now() + WATCH_REOPEN_WINDOW;
    let mut pause = Duration::from_millis(100);
    loop {
        match ctx.session_call(&p.session_id, method::FilesWatch::NAME, p).await {
            Ok(stream) => return Ok(stream),
            Err(e)
                if matches!(e.0.data_code(), Some(c) if c == ErrorCode::WorkspaceOffline.as_str())
                    || connection_lost(&e.0) => {}
            Err(e) => return Err(e),
        }
        if tokio::time::Instant::now() + pause > until {
            return Err(ApiError(lost));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
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
