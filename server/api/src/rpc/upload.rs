//! `content.upload` and `content.read` (SPEC §3, §4.13), the worker's fetch of a turn's
//! attachment bytes, and its store of a file a channel session's model attached.
//!
//! An upload is a text request followed by one binary message whose first four bytes are
//! that request's id (big-endian u32). The reader registers the id when it admits the
//! request (before the handler task runs, so a binary message sent right behind its request
//! always finds its slot) and hands the binary message to that slot; a binary message whose
//! id has no slot is answered with a typed error (`id: null`, the id in `data.requestId`)
//! and the connection stays usable. Bytes go to object storage first, then the row: a
//! crash in between leaves an orphan blob, never a row without bytes.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use axum::{
    body::Body,
    extract::{Query, State},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
};
use base64::Engine;
use berth_protocol::{
    CONTENT_PAGE_BYTES, ContentReadParams, ContentReadResult, ContentUploadParams, ContentUploadResult, ErrorCode,
    RowAttachment,
    worker::{self as wp, MODEL_PROXY_TURN_HEADER, ProxyError},
};
use berth_store::{CredentialKind, NewAttachment, StoreError};
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use super::Ctx;
use crate::{
    AppState,
    error::{ApiError, ApiResult},
};

/// Refused uploads whose binary message is still expected, kept per connection so that
/// the message is swallowed silently; beyond this many they are forgotten (their binary
/// message is then answered as one for no upload).
const MAX_DISCARDED: usize = 64;

/// Longest name and content type accepted, in bytes.
const MAX_NAME: usize = 255;

/// The uploaded bytes a replica holds at once: `BERTH_UPLOAD_MEMORY_BYTES`, never less than
/// the largest message a connection takes (one upload always fits an idle replica).
pub fn memory_budget(config: &crate::Config) -> usize {
    config.upload_memory_bytes.max(super::max_message(config))
}

/// `n` bytes in whole KiB, rounded up: the unit of the replica's upload memory.
pub fn kib(n: usize) -> u32 {
    u32::try_from(n.div_ceil(1024)).unwrap_or(u32::MAX)
}

/// What an upload's binary message brings its handler.
pub enum Uploaded {
    /// The bytes, with their share of the replica's upload memory, held until stored.
    Held(Bytes, OwnedSemaphorePermit),
    /// The replica holds as many uploaded bytes as it may: the bytes were dropped.
    OverBudget,
}

/// One connection's uploads awaiting their binary message, by request id.
#[derive(Default)]
pub struct Uploads {
    slots: Mutex<HashMap<u32, Slot>>,
}

struct Slot {
    /// Taken when the binary message arrives.
    tx: Option<oneshot::Sender<Uploaded>>,
    /// Taken by the handler; None once the handler is done (the bytes are then dropped).
    rx: Option<oneshot::Receiver<Uploaded>>,
}

impl Uploads {
    /// Register request `id` as an upload whose binary message may come next.
    pub fn begin(&self, id: u32) {
        let (tx, rx) = oneshot::channel();
        let slot = Slot {
            tx: Some(tx),
            rx: Some(rx),
        };
        self.slots.lock().expect("uploads lock").insert(id, slot);
    }

    fn take_receiver(&self, id: u32) -> Option<oneshot::Receiver<Uploaded>> {
        self.slots.lock().expect("uploads lock").get_mut(&id)?.rx.take()
    }

    /// The request `id` is answered (or refused): a binary message still to come is
    /// swallowed; one that came already is released.
    pub fn end(&self, id: u32) {
        let mut slots = self.slots.lock().expect("uploads lock");
        let discarded = slots.values().filter(|s| s.rx.is_none() && s.tx.is_some()).count();
        match slots.get_mut(&id) {
            Some(slot) if slot.tx.is_some() && discarded < MAX_DISCARDED => slot.rx = None,
            Some(_) => {
                slots.remove(&id);
            }
            None => {}
        }
    }

    /// Route a binary message to its upload, with its share of `memory` (KiB the replica
    /// may hold; without it the bytes are dropped at once and the upload is refused). A
    /// message too short to hold an id, or whose id matches no upload in flight (or one
    /// whose bytes came already), is refused.
    pub fn deliver(&self, msg: Bytes, memory: &Arc<Semaphore>) -> Result<(), Stray> {
        let Some(head) = msg.get(..4) else {
            return Err(Stray { request_id: None });
        };
        let id = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let stray = Stray { request_id: Some(id) };
        let mut slots = self.slots.lock().expect("uploads lock");
        let Some(slot) = slots.get_mut(&id) else {
            return Err(stray);
        };
        let Some(tx) = slot.tx.take() else {
            return Err(stray);
        };
        // The handler may be gone already (refused, timed out): the bytes are dropped.
        let body = match memory.clone().try_acquire_many_owned(kib(msg.len())) {
            Ok(held) => Uploaded::Held(msg.slice(4..), held),
            Err(_) => Uploaded::OverBudget,
        };
        let _ = tx.send(body);
        if slot.rx.is_none() {
            slots.remove(&id);
        }
        Ok(())
    }
}

/// A binary message that belongs to no upload in flight.
#[derive(Debug, PartialEq, Eq)]
pub struct Stray {
    /// The id it named; None when it was shorter than the 4-byte id.
    pub request_id: Option<u32>,
}

impl Stray {
    /// The answer: a `bad-params` error without a request id (the id it named may belong
    /// to another request of this connection, which must not get a second answer).
    pub fn error(&self) -> ApiError {
        match self.request_id {
            Some(id) => ApiError::with(
                ErrorCode::BadParams,
                json!({"reason": "no-upload-in-flight", "requestId": id}),
            ),
            None => ApiError::with(ErrorCode::BadParams, json!({"reason": "short-binary-message"})),
        }
    }
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn content_upload(ctx: Ctx, p: ContentUploadParams) -> ApiResult<ContentUploadResult> {
    let me = ctx.principal()?;
    let rx = ctx
        .id
        .and_then(|id| ctx.conn.uploads.take_receiver(id))
        .ok_or(ApiError::code(ErrorCode::Internal))?;
    let wait = ctx.state.config.limits.idle_timeout;
    let body = tokio::select! {
        r = rx => r.map_err(|_| ApiError::code(ErrorCode::Unavailable))?,
        _ = tokio::time::sleep(wait) => {
            return Err(ApiError::with(ErrorCode::BadParams, json!({"reason": "no-binary-message"})));
        }
        _ = ctx.conn.closed.cancelled() => return Err(ApiError(super::gone())),
    };
    // Held until the bytes are stored (or the upload is refused).
    let Uploaded::Held(data, _held) = body else {
        return Err(ApiError::with(
            ErrorCode::RateLimited,
            json!({"limit": "upload-memory", "max": memory_budget(&ctx.state.config)}),
        ));
    };
    let max = ctx.state.config.max_attachment_bytes;
    if data.len() > max {
        return Err(ApiError::with(
            ErrorCode::PayloadTooLarge,
            json!({"limit": "attachment", "max": max}),
        ));
    }
    if let Some(declared) = p.bytes
        && declared != data.len() as u64
    {
        return Err(ApiError::with(
            ErrorCode::BadParams,
            json!({"reason": "size-mismatch", "bytes": data.len()}),
        ));
    }
    check_text("filename", &p.filename)?;
    check_text("mime", &p.mime)?;
    if p.filename.contains(['/', '\\']) || p.filename == "." || p.filename == ".." {
        return Err(ApiError::with(ErrorCode::BadParams, json!({"field": "filename"})));
    }
    let store = &ctx.state.store;
    store.check_session(&me.tenant_id, &p.session_id).await?;
    let (data, sha256) = tokio::task::spawn_blocking(move || {
        let digest = Sha256::digest(&data);
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        (data, hex)
    })
    .await
    .map_err(|_| ApiError::code(ErrorCode::Internal))?;
    let attachment = NewAttachment {
        id: berth_store::token::new_id("att"),
        session_id: p.session_id.clone(),
        name: p.filename,
        mime_type: p.mime,
        bytes: data.len() as u64,
        sha256,
        object_key: String::new(),
    };
    let attachment = NewAttachment {
        object_key: format!("{}/attachments/{}", me.tenant_id, attachment.id),
        ..attachment
    };
    let blobs = &ctx.state.blobs;
    if let Err(e) = blobs.put(&attachment.object_key, data).await {
        tracing::warn!(error = %e, "object store write failed");
        return Err(ApiError::code(ErrorCode::Unavailable));
    }
    if let Err(e) = store.insert_attachment(&me.tenant_id, &attachment).await {
        if let Err(e) = blobs.delete(&attachment.object_key).await {
            tracing::warn!(error = %e, "unrecorded attachment blob left behind");
        }
        return Err(e.into());
    }
    tracing::info!(attachment.id = %attachment.id, bytes = attachment.bytes, "attachment uploaded");
    Ok(ContentUploadResult {
        attachment_id: attachment.id,
        bytes: attachment.bytes,
        sha256: attachment.sha256,
    })
}

/// Delete a removed session's attachments and patches: rows first, then bytes (a failure
/// leaves an orphan blob, never a row without bytes). Best effort: the removal itself has
/// succeeded.
pub async fn release_session(state: &AppState, tenant_id: &str, session_id: &str) {
    let mut keys = match state.store.release_session_attachments(tenant_id, session_id).await {
        Ok(k) => k,
        Err(e) => {
            tracing::warn!(error = %e, "could not release a removed session's attachments");
            Vec::new()
        }
    };
    match state.store.release_session_patches(tenant_id, session_id).await {
        Ok(k) => keys.extend(k),
        Err(e) => tracing::warn!(error = %e, "could not release a removed session's patches"),
    }
    delete_blobs(state, keys).await;
}

/// Delete blobs whose rows are gone (best effort: the sweep removes what is left).
pub async fn delete_blobs(state: &AppState, keys: Vec<String>) {
    for key in keys {
        if let Err(e) = state.blobs.delete(&key).await {
            tracing::warn!(error = %e, "could not delete a released blob");
        }
    }
}

/// Remove blobs older than the orphan age that no attachment row names (a crash between
/// storing the bytes and recording the row). Returns how many were removed.
pub async fn sweep_orphans(state: &AppState) -> anyhow::Result<usize> {
    let age = chrono::Duration::from_std(state.config.object_store.orphan_age)?;
    let keys = state.blobs.owned_older_than(chrono::Utc::now() - age).await?;
    let mut removed = 0;
    for batch in keys.chunks(500) {
        for key in state.store.unrecorded_object_keys(batch).await? {
            state.blobs.delete(&key).await?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// A name or content type: present, bounded, no control characters.
fn check_text(field: &str, value: &str) -> ApiResult<()> {
    if value.is_empty() || value.len() > MAX_NAME || value.chars().any(char::is_control) {
        return Err(ApiError::with(
            ErrorCode::BadParams,
            json!({"field": field, "max": MAX_NAME}),
        ));
    }
    Ok(())
}

#[derive(serde::Deserialize)]
pub struct FetchQuery {
    /// Only the first `count` attachments.
    count: Option<usize>,
}

fn refuse(status: StatusCode, code: &str) -> Response {
    let cause = berth_protocol::Cause {
        code: code.to_string(),
        status: None,
    };
    (status, axum::Json(ProxyError { error: cause })).into_response()
}

/// `GET /v1/worker/attachments`: a running turn's attachment bytes, concatenated in order,
/// for the worker it was handed to.
pub async fn worker_fetch(State(state): State<AppState>, headers: HeaderMap, Query(q): Query<FetchQuery>) -> Response {
    let principal = match super::bearer(&headers) {
        Some(t) => match state.store.authenticate(t).await {
            Ok(Some(p)) if p.kind == CredentialKind::Worker => Some(p),
            Ok(_) => None,
            Err(_) => return refuse(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable.as_str()),
        },
        None => None,
    };
    let Some(principal) = principal else {
        state.metrics.auth_failures.with_label_values(&["attachments"]).inc();
        return refuse(StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized.as_str());
    };
    let Some(turn_id) = headers.get(MODEL_PROXY_TURN_HEADER).and_then(|v| v.to_str().ok()) else {
        return refuse(StatusCode::BAD_REQUEST, ErrorCode::BadParams.as_str());
    };
    let mut list = match state.store.worker_turn_attachments(&principal, turn_id).await {
        Ok(l) => l,
        Err(StoreError::Code(code)) => return refuse(StatusCode::FORBIDDEN, code.as_str()),
        Err(e) => {
            tracing::warn!(error = %e, "attachment fetch could not check the turn");
            return refuse(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable.as_str());
        }
    };
    list.truncate(q.count.unwrap_or(usize::MAX));
    let total: u64 = list.iter().map(|a| a.meta.bytes).sum();
    let blobs = state.blobs.clone();
    let body = futures_util::stream::iter(list)
        .then(move |a| {
            let blobs = blobs.clone();
            async move { blobs.stream(&a.object_key).await }
        })
        .try_flatten()
        .map_err(|e| {
            tracing::warn!(error = %e, "object store read failed");
            std::io::Error::other("object store read failed")
        });
    (
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, total.to_string()),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

/// Files workers attach that one replica holds in memory at once (each at most the
/// attachment limit); past them a file is refused `rate-limited` (the model reads why and may
/// try again).
pub const WORKER_ATTACH_BODIES: usize = 4;

/// How long an attached file's bytes may take to arrive.
const WORKER_ATTACH_READ: std::time::Duration = std::time::Duration::from_secs(60);

/// `POST /v1/worker/attachments`: a file the model of a channel session's running turn
/// attached (`attach_file`), from the worker the turn was handed to. Checked like an upload
/// (size limit, name and type, the digest the worker computed), stored in object storage,
/// then recorded as an attachment of the session produced by the turn. At most
/// [`MAX_ATTACHMENTS_PER_TURN`](berth_protocol::MAX_ATTACHMENTS_PER_TURN) a turn, and at most
/// [`WORKER_ATTACH_BODIES`] held at once by this replica.
pub async fn worker_attach(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<wp::AttachQuery>,
    body: Body,
) -> Response {
    let principal = match super::bearer(&headers) {
        Some(t) => match state.store.authenticate(t).await {
            Ok(Some(p)) if p.kind == CredentialKind::Worker => Some(p),
            Ok(_) => None,
            Err(_) => return refuse(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable.as_str()),
        },
        None => None,
    };
    let Some(principal) = principal else {
        state.metrics.auth_failures.with_label_values(&["attachments"]).inc();
        return refuse(StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized.as_str());
    };
    let Some(turn_id) = headers.get(MODEL_PROXY_TURN_HEADER).and_then(|v| v.to_str().ok()) else {
        return refuse(StatusCode::BAD_REQUEST, ErrorCode::BadParams.as_str());
    };
    if check_text("filename", &q.name).is_err()
        || check_text("mime", &q.mime).is_err()
        || q.name.contains(['/', '\\'])
        || q.name == "."
        || q.name == ".."
    {
        return refuse(StatusCode::BAD_REQUEST, ErrorCode::BadParams.as_str());
    }
    let store = &state.store;
    // Checked before the bytes are taken, so a refused turn costs no storage.
    if let Err(e) = store.worker_attach_session(&principal, turn_id).await {
        return store_refusal(e);
    }
    // A worker's machine may be compromised: what its files hold in this replica's memory is
    // bounded, and a body that does not come is not waited for.
    let Ok(_held) = state.worker_attach_bodies.clone().try_acquire_owned() else {
        return refuse(StatusCode::TOO_MANY_REQUESTS, ErrorCode::RateLimited.as_str());
    };
    let max = state.config.max_attachment_bytes;
    let data = match tokio::time::timeout(WORKER_ATTACH_READ, axum::body::to_bytes(body, max)).await {
        Ok(Ok(data)) => data,
        Ok(Err(_)) => return refuse(StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::PayloadTooLarge.as_str()),
        Err(_) => return refuse(StatusCode::REQUEST_TIMEOUT, ErrorCode::Unavailable.as_str()),
    };
    let (data, sha256) = match tokio::task::spawn_blocking(move || {
        let hex: String = Sha256::digest(&data).iter().map(|b| format!("{b:02x}")).collect();
        (data, hex)
    })
    .await
    {
        Ok(d) => d,
        Err(_) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal.as_str()),
    };
    if sha256 != q.sha256 {
        return refuse(StatusCode::BAD_REQUEST, "attachment-corrupt");
    }
    let id = berth_store::token::new_id("att");
    let attachment = NewAttachment {
        object_key: format!("{}/attachments/{id}", principal.tenant_id),
        id,
        session_id: String::new(),
        name: q.name,
        mime_type: q.mime,
        bytes: data.len() as u64,
        sha256,
    };
    if let Err(e) = state.blobs.put(&attachment.object_key, data).await {
        tracing::warn!(error = %e, "object store write failed");
        return refuse(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable.as_str());
    }
    if let Err(e) = store.insert_worker_attachment(&principal, turn_id, &attachment).await {
        if let Err(e) = state.blobs.delete(&attachment.object_key).await {
            tracing::warn!(error = %e, "unrecorded attachment blob left behind");
        }
        return store_refusal(e);
    }
    tracing::info!(turn.id = %turn_id, attachment.id = %attachment.id, bytes = attachment.bytes, "file attached");
    axum::Json(RowAttachment {
        attachment_id: attachment.id,
        name: attachment.name,
        mime_type: attachment.mime_type,
        bytes: attachment.bytes,
        sha256: attachment.sha256,
    })
    .into_response()
}

fn store_refusal(e: StoreError) -> Response {
    match e {
        StoreError::Code(code) => refuse(StatusCode::FORBIDDEN, code.as_str()),
        e => {
            tracing::warn!(error = %e, "attaching a file could not check the turn");
            refuse(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable.as_str())
        }
    }
}

/// `content.read`: a page of an attachment's bytes, read from object storage by byte range
/// on any replica (as `patch.read` pages a patch).
#[tracing::instrument(skip_all, fields(attachment.id = %p.attachment_id))]
pub async fn content_read(ctx: Ctx, p: ContentReadParams) -> ApiResult<ContentReadResult> {
    let me = ctx.principal()?;
    let (attachment, key) = ctx.state.store.get_attachment(&me.tenant_id, &p.attachment_id).await?;
    let (offset, data) = super::blob_page(&ctx, &key, attachment.bytes, p.after.as_deref(), CONTENT_PAGE_BYTES).await?;
    let end = offset + data.len() as u64;
    let total = attachment.bytes;
    Ok(ContentReadResult {
        attachment,
        offset,
        data: base64::engine::general_purpose::STANDARD.encode(&data),
        next_after: (end < total).then(|| end.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(id: u32, payload: &[u8]) -> Bytes {
        let mut v = id.to_be_bytes().to_vec();
        v.extend_from_slice(payload);
        Bytes::from(v)
    }

    fn memory(kib: usize) -> Arc<Semaphore> {
        Arc::new(Semaphore::new(kib))
    }

    async fn held(rx: oneshot::Receiver<Uploaded>) -> Option<(Bytes, OwnedSemaphorePermit)> {
        match rx.await.expect("body") {
            Uploaded::Held(bytes, permit) => Some((bytes, permit)),
            Uploaded::OverBudget => None,
        }
    }

    #[tokio::test]
    async fn a_binary_message_reaches_its_upload_whenever_the_handler_asks() {
        let uploads = Uploads::default();
        let memory = memory(1024);
        uploads.begin(7);
        assert!(
            uploads.deliver(frame(7, b"abc"), &memory).is_ok(),
            "delivered before the handler waits"
        );
        let rx = uploads.take_receiver(7).expect("receiver");
        let (bytes, _held) = held(rx).await.expect("within the replica's memory");
        assert_eq!(bytes, Bytes::from_static(b"abc"));
        uploads.end(7);
        assert_eq!(
            uploads.deliver(frame(7, b"again"), &memory),
            Err(Stray { request_id: Some(7) }),
            "one binary message per upload"
        );
    }

    #[test]
    fn unknown_ids_and_short_messages_are_refused() {
        let uploads = Uploads::default();
        uploads.begin(1);
        assert_eq!(
            uploads.deliver(frame(2, b"x"), &memory(1)),
            Err(Stray { request_id: Some(2) })
        );
        assert_eq!(
            uploads.deliver(Bytes::from_static(b"\0\0\0"), &memory(1)),
            Err(Stray { request_id: None })
        );
    }

    #[test]
    fn a_refused_upload_swallows_its_binary_message() {
        let uploads = Uploads::default();
        uploads.begin(3);
        uploads.end(3);
        assert!(uploads.deliver(frame(3, b"late"), &memory(1)).is_ok());
        assert!(uploads.slots.lock().expect("lock").is_empty());
    }

    #[tokio::test]
    async fn uploaded_bodies_are_held_within_the_replicas_memory_until_stored() {
        let uploads = Uploads::default();
        let memory = memory(2);
        for id in 1..=3 {
            uploads.begin(id);
        }
        // 1.5 KiB takes both KiB: the next body is dropped, its upload refused.
        uploads.deliver(frame(1, &[b'a'; 1536]), &memory).expect("delivered");
        uploads.deliver(frame(2, b"b"), &memory).expect("delivered");
        let first = held(uploads.take_receiver(1).expect("receiver")).await.expect("held");
        assert_eq!(first.0.len(), 1536);
        assert!(held(uploads.take_receiver(2).expect("receiver")).await.is_none());
        assert_eq!(memory.available_permits(), 0);
        // Once the first is stored (its body let go), the next fits again.
        drop(first);
        uploads.deliver(frame(3, b"c"), &memory).expect("delivered");
        let third = held(uploads.take_receiver(3).expect("receiver")).await;
        assert_eq!(third.expect("held").0, Bytes::from_static(b"c"));
        assert_eq!(memory.available_permits(), 2);
    }
}
