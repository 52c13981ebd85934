//! `patch.snapshot` and `patch.read` (SPEC §4.11). The worker that holds the session's
//! workspace computes the patch and streams its text through the worker-call routing (never
//! PostgreSQL or NOTIFY); this replica stores the text in object storage, then records the
//! row (with the receipt, in one transaction): a crash in between leaves an orphan blob for
//! the sweep, never a row without its text. Pages are read back from object storage by
//! byte range, on any replica.

use berth_protocol::{
    ErrorCode, MAX_PATCH_BYTES, Method, PATCH_PAGE_BYTES, PatchInfo, PatchReadParams, PatchReadResult,
    PatchSnapshotParams, method,
    worker::{PatchCaptured, PatchChunk},
};
use berth_store::NewPatch;
use bytes::Bytes;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::Ctx;
use crate::{
    error::{ApiError, ApiResult},
    workers::calls::{CallEvent, Item},
};

/// Patches one replica captures at once: each is held whole (up to `MAX_PATCH_BYTES`) until
/// it is stored, so past them `patch.snapshot` is refused `rate-limited {limit:
/// "patch-snapshots"}` rather than buffered.
pub const SNAPSHOTS_AT_ONCE: usize = 4;

fn too_large() -> ApiError {
    ApiError::with(
        ErrorCode::PayloadTooLarge,
        json!({"limit": "patch", "max": MAX_PATCH_BYTES}),
    )
}

fn malformed(what: &str) -> ApiError {
    tracing::warn!(what, "worker answered patch.snapshot with a malformed message");
    ApiError::code(ErrorCode::Internal)
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn snapshot(ctx: Ctx, p: PatchSnapshotParams) -> ApiResult<PatchInfo> {
    let me = ctx.principal()?;
    let store = &ctx.state.store;
    let ready_at = store
        .patch_ready(&me.tenant_id, &p.session_id, p.turn_id.as_deref())
        .await?;
    let Ok(_capturing) = ctx.state.patch_snapshots.clone().try_acquire_owned() else {
        return Err(ApiError::with(
            ErrorCode::RateLimited,
            json!({"limit": "patch-snapshots", "max": SNAPSHOTS_AT_ONCE}),
        ));
    };
    let params = json!({"sessionId": p.session_id});
    let mut stream = ctx
        .session_call(&p.session_id, method::PatchSnapshot::NAME, &params)
        .await?;
    let mut text = String::new();
    let answer = loop {
        match stream.next().await {
            Some(CallEvent::Item(Item::Json(v))) => {
                let chunk: PatchChunk = serde_json::from_str(v.get()).map_err(|_| malformed("chunk"))?;
                if text.len() + chunk.text.len() > MAX_PATCH_BYTES {
                    return Err(too_large());
                }
                text.push_str(&chunk.text);
            }
            // A patch's items are JSON; raw chunks belong to `files.read`.
            Some(CallEvent::Item(Item::Chunk { .. })) => return Err(malformed("chunk")),
            Some(CallEvent::Done(r)) => break r.map_err(ApiError)?,
            None => return Err(ApiError(super::gone())),
        }
    };
    let captured: PatchCaptured = serde_json::from_value(answer).map_err(|_| malformed("answer"))?;
    let data = Bytes::from(text);
    let (data, sha256) = tokio::task::spawn_blocking(move || {
        let hex: String = Sha256::digest(&data).iter().map(|b| format!("{b:02x}")).collect();
        (data, hex)
    })
    .await
    .map_err(|_| ApiError::code(ErrorCode::Internal))?;
    let id = berth_store::token::new_id("pch");
    let patch = NewPatch {
        object_key: format!("{}/patches/{id}", me.tenant_id),
        id,
        session_id: p.session_id,
        turn_id: p.turn_id,
        base: captured.base,
        files: captured.files,
        bytes: data.len() as u64,
        sha256,
        ready_at,
    };
    let blobs = &ctx.state.blobs;
    if let Err(e) = blobs.put(&patch.object_key, data).await {
        tracing::warn!(error = %e, "object store write failed");
        return Err(ApiError::code(ErrorCode::Unavailable));
    }
    match store.insert_patch(&me.tenant_id, &patch, ctx.op.as_ref()).await {
        Ok(info) => {
            tracing::info!(patch.id = %info.patch_id, bytes = info.bytes, files = info.files, "patch captured");
            Ok(info)
        }
        Err(e) => {
            if let Err(e) = blobs.delete(&patch.object_key).await {
                tracing::warn!(error = %e, "unrecorded patch blob left behind");
            }
            Err(e.into())
        }
    }
}

#[tracing::instrument(skip_all, fields(patch.id = %p.patch_id))]
pub async fn read(ctx: Ctx, p: PatchReadParams) -> ApiResult<PatchReadResult> {
    let me = ctx.principal()?;
    let (patch, key) = ctx.state.store.get_patch(&me.tenant_id, &p.patch_id).await?;
    let (offset, data) = super::blob_page(&ctx, &key, patch.bytes, p.after.as_deref(), PATCH_PAGE_BYTES).await?;
    let end = offset + data.len() as u64;
    let bad_cursor = || ApiError::with(ErrorCode::BadParams, json!({"field": "after"}));
    let (text, used) = page(&data, end == patch.bytes).ok_or_else(bad_cursor)?;
    let next = offset + used as u64;
    let patch_bytes = patch.bytes;
    Ok(PatchReadResult {
        patch,
        offset,
        text: text.to_string(),
        next_after: (next < patch_bytes).then(|| next.to_string()),
    })
}

/// The text of a page read from `data`: everything when it is the patch's last piece,
/// otherwise up to its last line end (or its last whole character if it holds no line
/// end). None when `data` does not start on a character boundary (a cursor that did not
/// come from `nextAfter`).
fn page(data: &[u8], last: bool) -> Option<(&str, usize)> {
    let valid = match std::str::from_utf8(data) {
        Ok(_) => data.len(),
        // Cut inside the final character: read it with the next page.
        Err(e) if e.error_len().is_none() && !last => e.valid_up_to(),
        Err(_) => return None,
    };
    if valid == 0 && !data.is_empty() {
        return None;
    }
    let cut = if last && valid == data.len() {
        valid
    } else {
        data[..valid].iter().rposition(|b| *b == b'\n').map_or(valid, |i| i + 1)
    };
    let text = std::str::from_utf8(&data[..cut]).ok()?;
    Some((text, cut))
}

#[cfg(test)]
mod tests {
    use super::page;

    #[test]
    fn pages_end_on_line_ends_or_whole_characters() {
        assert_eq!(page(b"a\nb\nc", false), Some(("a\nb\n", 4)));
        assert_eq!(page(b"a\nb\nc", true), Some(("a\nb\nc", 5)));
        // No line end: the whole characters, leaving a cut one for the next page.
        let euro = "\u{20ac}".as_bytes();
        let cut = [b"ab".as_slice(), &euro[..2]].concat();
        assert_eq!(page(&cut, false), Some(("ab", 2)));
        // A cursor inside a character is refused.
        assert_eq!(page(&euro[1..], false), None);
        assert_eq!(page(b"", true), Some(("", 0)));
    }
}
