//! Worker calls: a client method (git, files) answered by the worker that holds the
//! workspace, through whichever replica holds that worker's connection.
//!
//! - **Local**: this replica holds a connection serving the workspace. The call goes to the
//!   connection loop, which sends the worker a `call` request and passes its `call.item`s
//!   and its answer back through a channel sized to the worker's credit window
//!   ([`wp::CALL_WINDOW`]); the consumer returns credit (`call.ack`) as it takes items, so a
//!   slow reader slows the worker instead of growing a buffer.
//! - **Remote**: presence names another replica. This replica POSTs the call to that
//!   replica's `/v1/internal/call` (its address from the `replicas` table, authenticated with
//!   the cluster secret), which runs it locally and streams the events back over the HTTP
//!   response as length-prefixed frames ([`super::frames`]; JSON lines to and from an older
//!   replica); TCP carries the back-pressure. Large answers never touch PostgreSQL or NOTIFY.
//!
//! A `files.read` chunk crosses as raw bytes from the worker (a binary frame) to the replica
//! that writes the client's `subscription.item`, which base64-encodes it once.
//!
//! Every call is bounded: a worker connection serves at most [`CALLS_PER_WORKER`] at once;
//! unary calls time out, streams time out when idle; a worker or replica that goes away
//! mid-call ends the call with a typed error.

use std::{
    collections::HashMap,
    pin::Pin,
    sync::{Arc, Mutex, atomic::Ordering},
    time::Duration,
};

use axum::extract::ws::Message;
use berth_protocol::{ErrorCode, FILES_READ_CHUNK, Method, RpcError, jsonrpc::Request, method, worker as wp};
use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json, value::RawValue};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use super::{
    Registry,
    frames::{self, FrameDecoder, Line},
};
use crate::{
    AppState,
    error::{ApiError, ApiResult},
};

/// Calls one worker connection serves at once (watches included).
pub const CALLS_PER_WORKER: usize = 256;
/// Watches among them: a watch never ends by itself, and watches alone must not take every
/// slot (each other call would then be `rate-limited`).
pub const WATCHES_PER_WORKER: usize = 192;
/// The path replicas forward calls to.
pub const INTERNAL_CALL_PATH: &str = "/v1/internal/call";
/// The header carrying the cluster secret.
pub(super) const SECRET_HEADER: &str = "x-berth-cluster-secret";
/// How long a unary call (status, diff, list) may take.
const UNARY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a stream (a file read) may go without an item.
const STREAM_IDLE: Duration = Duration::from_secs(60);
/// How often a forwarding replica shows it is alive on a quiet stream (a watch).
pub(super) const KEEPALIVE: Duration = Duration::from_secs(15);
/// A forwarded stream with nothing, not even a keepalive, for this long is dead.
const REMOTE_IDLE: Duration = Duration::from_secs(45);

/// What a call yields: items (subscriptions), then its answer.
#[derive(Debug)]
pub enum CallEvent {
    Item(Item),
    Done(Result<Value, RpcError>),
}

/// One subscription item of a call, as the replicas pass it on without looking into it.
#[derive(Debug, Clone)]
pub enum Item {
    /// The JSON text the worker wrote.
    Json(Box<RawValue>),
    /// `files.read` chunks as raw bytes from a binary frame: one chunk (the item `{type:
    /// "chunk", offset, dataBase64}`), or a run of whole chunks starting at `offset` that
    /// [`Item::chunks`] cuts into the client's items (`text`: on UTF-8 boundaries).
    Chunk { offset: u64, data: Bytes, text: bool },
}

impl Item {
    /// A chunk run's chunks as the client gets them: each one's offset and bytes (≤ 32 KiB,
    /// the same cuts the worker made). Empty for a JSON item.
    pub fn chunks(&self) -> Vec<(u64, Bytes)> {
        let Item::Chunk { offset, data, text } = self else {
            return Vec::new();
        };
        if data.len() <= FILES_READ_CHUNK {
            // One chunk (all an older worker sends, an empty one included).
            return vec![(*offset, data.clone())];
        }
        let mut start = 0;
        berth_protocol::files_read_chunk_ends(data, *text)
            .into_iter()
            .map(|end| {
                let piece = (*offset + start as u64, data.slice(start..end));
                start = end;
                piece
            })
            .collect()
    }

    /// How many items this counts for against the worker's credit (a run: its chunks).
    pub fn credits(&self) -> u32 {
        match self {
            Item::Json(_) => 1,
            Item::Chunk { data, .. } if data.len() <= FILES_READ_CHUNK => 1,
            Item::Chunk { .. } => self.chunks().len() as u32,
        }
    }
}

/// About how long [`write_chunk_json`] makes a chunk of `len` bytes.
pub fn chunk_json_len(len: usize) -> usize {
    len.div_ceil(3) * 4 + 64
}

/// A chunk item's JSON text, its base64 encoded straight into `out` (base64 needs no JSON
/// escaping). SIMD base64: this is the one encoding of every chunk a client reads.
pub fn write_chunk_json(out: &mut String, offset: u64, data: &[u8]) {
    use std::fmt::Write;
    let _ = write!(out, r#"{{"type":"chunk","offset":{offset},"dataBase64":""#);
    base64_simd::STANDARD.encode_append(data, out);
    out.push_str("\"}");
}

/// The calls in progress on one worker connection, shared by the connection (which
/// routes the worker's items and answers here) and the calls' consumers.
pub(super) struct CallTable {
    /// None once the connection has ended: no call starts, and every consumer's channel
    /// is closed (which its stream reports as `worker-disconnected`).
    calls: Mutex<Option<HashMap<u32, mpsc::Sender<CallEvent>>>>,
    /// To the worker (the connection's writer).
    out: mpsc::Sender<Message>,
    slots: Arc<Semaphore>,
    watch_slots: Arc<Semaphore>,
}

fn to_message(req: &berth_protocol::jsonrpc::Request) -> Message {
    Message::Text(serde_json::to_string(req).unwrap_or_default().into())
}

impl CallTable {
    pub(super) fn new(out: mpsc::Sender<Message>) -> Arc<CallTable> {
        Arc::new(CallTable {
            calls: Mutex::new(Some(HashMap::new())),
            out,
            slots: Arc::new(Semaphore::new(CALLS_PER_WORKER)),
            watch_slots: Arc::new(Semaphore::new(WATCHES_PER_WORKER)),
        })
    }

    /// Calls in progress other than watches (a watch ends only with its connection).
    pub(super) fn busy(&self) -> usize {
        let calls = CALLS_PER_WORKER - self.slots.available_permits();
        let watches = WATCHES_PER_WORKER - self.watch_slots.available_permits();
        calls.saturating_sub(watches)
    }

    /// The connection ended: every call in progress ends with a typed error.
    pub(super) fn close(&self) {
        self.calls.lock().expect("calls lock").take();
    }

    fn remove(&self, id: u32) -> Option<mpsc::Sender<CallEvent>> {
        self.calls.lock().expect("calls lock").as_mut()?.remove(&id)
    }

    fn contains(&self, id: u32) -> bool {
        self.calls
            .lock()
            .expect("calls lock")
            .as_ref()
            .is_some_and(|m| m.contains_key(&id))
    }

    /// A `call.item` from the worker, taken from its text without building a `Value` of
    /// the item; false when `text` is not one (the caller then routes it as usual).
    pub(super) fn item_text(&self, text: &str) -> bool {
        #[derive(Deserialize)]
        struct Note<'a> {
            #[serde(borrow)]
            method: &'a str,
            params: RawItem,
        }
        match serde_json::from_str::<Note>(text) {
            Ok(note) if note.method == wp::CALL_ITEM => {
                self.item(note.params.call_id, Item::Json(note.params.item));
                true
            }
            _ => false,
        }
    }

    /// A `call.item` from the worker, already parsed.
    pub(super) fn item_value(&self, params: Value) {
        let Ok(item) = serde_json::from_value::<wp::CallItem>(params) else {
            return;
        };
        if let Ok(raw) = serde_json::value::to_raw_value(&item.item) {
            self.item(item.call_id, Item::Json(raw));
        }
    }

    /// A binary chunk frame or chunk run from the worker; false when `frame` is neither.
    pub(super) fn chunk_frame(&self, frame: &Bytes) -> bool {
        let (call_id, item) = if let Some((call_id, offset)) = wp::chunk_frame_header(frame) {
            let data = frame.slice(wp::CHUNK_FRAME_HEADER..);
            (
                call_id,
                Item::Chunk {
                    offset,
                    data,
                    text: false,
                },
            )
        } else if let Some((call_id, offset, text)) = wp::chunk_run_header(frame) {
            let data = frame.slice(wp::CHUNK_RUN_HEADER..);
            (call_id, Item::Chunk { offset, data, text })
        } else {
            return false;
        };
        self.item(call_id, item);
        true
    }

    fn item(&self, call_id: u32, item: Item) {
        let mut calls = self.calls.lock().expect("calls lock");
        let Some(map) = calls.as_mut() else { return };
        let Some(tx) = map.get(&call_id) else { return };
        // The worker keeps within its credit, so the channel has room; a worker that does
        // not ends the call instead of growing a buffer.
        if tx.try_send(CallEvent::Item(item)).is_err() {
            tracing::warn!("worker overran a call's credit; call ended");
            if let Some(tx) = map.remove(&call_id) {
                let _ = tx.try_send(CallEvent::Done(Err(unavailable("worker-overran"))));
            }
        }
    }

    /// A response from the worker; true if it answered a call.
    pub(super) fn answer(&self, text: &str) -> bool {
        let Ok(resp) = serde_json::from_str::<berth_protocol::jsonrpc::Response>(text) else {
            return false;
        };
        let Some(tx) = resp.id.and_then(|id| self.remove(id)) else {
            return false;
        };
        let done = match (resp.result, resp.error) {
            (_, Some(e)) => Err(e),
            (r, None) => Ok(r.unwrap_or(Value::Null)),
        };
        let _ = tx.try_send(CallEvent::Done(done));
        true
    }
}

/// A `call.item`'s params with the item left as text.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawItem {
    call_id: u32,
    item: Box<RawValue>,
}

/// How long a call may wait for its worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// One answer within [`UNARY_TIMEOUT`].
    Unary,
    /// Items, each within [`STREAM_IDLE`].
    Stream,
    /// Items whenever they come (a watch): only a lost worker or replica ends it.
    Open,
}

impl Wait {
    fn of(method_name: &str) -> Wait {
        match method_name {
            method::FilesWatch::NAME => Wait::Open,
            method::FilesRead::NAME | method::PatchSnapshot::NAME => Wait::Stream,
            _ => Wait::Unary,
        }
    }
}

/// The consumer's end of a call.
pub struct CallStream {
    inner: Inner,
    wait: Wait,
    deadline: tokio::time::Instant,
    finished: bool,
}

enum Inner {
    Local {
        id: u32,
        rx: mpsc::Receiver<CallEvent>,
        table: Arc<CallTable>,
        /// Items taken but not yet acknowledged to the worker.
        unacked: u32,
        _slot: OwnedSemaphorePermit,
        /// A watch's own slot ([`WATCHES_PER_WORKER`]).
        _watch: Option<OwnedSemaphorePermit>,
    },
    Remote {
        body: Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>,
        /// Received and not yet taken; frames are split off its front without moving the rest.
        buf: BytesMut,
        body_kind: BodyKind,
    },
}

/// How a forwarded call's response body is cut into events.
enum BodyKind {
    Frames(FrameDecoder),
    /// JSON lines (an older replica); how much of the buffer is known to hold no line end.
    Lines {
        scanned: usize,
    },
}

/// One line of a forwarded call's response body in the JSON-lines form.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) enum JsonLine {
    Item(Box<RawValue>),
    Result(Value),
    Error(RpcError),
    Keepalive,
}

impl From<JsonLine> for Line {
    fn from(l: JsonLine) -> Line {
        match l {
            JsonLine::Item(v) => Line::Item(Item::Json(v)),
            JsonLine::Result(v) => Line::Result(v),
            JsonLine::Error(e) => Line::Error(e),
            JsonLine::Keepalive => Line::Keepalive,
        }
    }
}

fn unavailable(reason: &str) -> RpcError {
    let mut fields = serde_json::Map::new();
    fields.insert("reason".into(), reason.into());
    RpcError::with_fields(ErrorCode::Unavailable, fields)
}

impl CallStream {
    /// The next item or the answer; None after the answer.
    pub async fn next(&mut self) -> Option<CallEvent> {
        if self.finished {
            return None;
        }
        let limit = match (self.wait, &self.inner) {
            (Wait::Unary, _) => Some(self.deadline),
            (_, Inner::Remote { .. }) => Some(tokio::time::Instant::now() + REMOTE_IDLE.max(STREAM_IDLE)),
            (Wait::Stream, _) => Some(tokio::time::Instant::now() + STREAM_IDLE),
            (Wait::Open, _) => None,
        };
        let event = match limit {
            Some(at) => match tokio::time::timeout_at(at, self.recv()).await {
                Ok(e) => e,
                Err(_) => CallEvent::Done(Err(unavailable("timeout"))),
            },
            None => self.recv().await,
        };
        if let CallEvent::Done(_) = event {
            self.finish();
        }
        Some(event)
    }

    async fn recv(&mut self) -> CallEvent {
        match &mut self.inner {
            Inner::Local {
                id, rx, table, unacked, ..
            } => match rx.recv().await {
                Some(CallEvent::Item(v)) => {
                    *unacked += v.credits();
                    if *unacked >= wp::CALL_WINDOW / 2 && table.contains(*id) {
                        let ack = wp::CallAck {
                            call_id: *id,
                            items: *unacked,
                        };
                        let req = Request::notification(wp::CALL_ACK, serde_json::to_value(ack).unwrap_or_default());
                        let _ = table.out.send(to_message(&req)).await;
                        *unacked = 0;
                    }
                    CallEvent::Item(v)
                }
                Some(done) => done,
                // The connection loop dropped the call: the worker went away.
                None => CallEvent::Done(Err(unavailable("worker-disconnected"))),
            },
            Inner::Remote { body, buf, body_kind } => loop {
                let parsed = match body_kind {
                    BodyKind::Frames(decoder) => decoder.decode(buf).map_err(|e| e.to_string()),
                    BodyKind::Lines { scanned } => match memchr::memchr(b'\n', &buf[*scanned..]) {
                        Some(at) => {
                            let line = buf.split_to(*scanned + at + 1);
                            *scanned = 0;
                            serde_json::from_slice::<JsonLine>(&line[..line.len() - 1])
                                .map(|l| Some(l.into()))
                                .map_err(|e| e.to_string())
                        }
                        None => {
                            *scanned = buf.len();
                            Ok(None)
                        }
                    },
                };
                match parsed {
                    Ok(Some(Line::Item(v))) => return CallEvent::Item(v),
                    Ok(Some(Line::Result(v))) => return CallEvent::Done(Ok(v)),
                    Ok(Some(Line::Error(e))) => return CallEvent::Done(Err(e)),
                    Ok(Some(Line::Keepalive)) => continue,
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "a forwarded call's response was malformed");
                        return CallEvent::Done(Err(unavailable("replica-unreachable")));
                    }
                }
                match body.next().await {
                    Some(Ok(bytes)) => buf.extend_from_slice(&bytes),
                    // The forwarding replica went away mid-call.
                    Some(Err(_)) | None => return CallEvent::Done(Err(unavailable("replica-unreachable"))),
                }
            },
        }
    }

    fn finish(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        if let Inner::Local { id, table, .. } = &self.inner
            && table.remove(*id).is_some()
        {
            // Still running on the worker: tell it to stop (from a task, as this may run in
            // `drop`).
            let cancel = wp::CallCancel { call_id: *id };
            let req = Request::notification(wp::CALL_CANCEL, serde_json::to_value(cancel).unwrap_or_default());
            let out = table.out.clone();
            tokio::spawn(async move {
                let _ = out.send(to_message(&req)).await;
            });
        }
    }

    /// Wait for the answer, dropping items (unary methods have none).
    pub async fn answer(mut self) -> Result<Value, RpcError> {
        loop {
            match self.next().await {
                Some(CallEvent::Done(r)) => return r,
                Some(CallEvent::Item(_)) => {}
                None => return Err(unavailable("worker-disconnected")),
            }
        }
    }
}

impl Drop for CallStream {
    fn drop(&mut self) {
        // An unfinished call's answer is no longer wanted: the worker stops working on it.
        self.finish();
    }
}

impl Registry {
    /// Start `call` on a connection this replica holds for the tenant's workspace (None: it
    /// holds none).
    pub(crate) async fn call_local(&self, tenant_id: &str, call: wp::Call) -> ApiResult<Option<CallStream>> {
        let table = {
            let conns = self.conns.lock().expect("registry lock");
            let worker = conns
                .values()
                .find(|w| w.tenant_id == tenant_id && w.workspaces.contains(&call.workspace_id));
            match worker {
                Some(w) => w.calls.clone(),
                None => return Ok(None),
            }
        };
        let watch = if call.method == method::FilesWatch::NAME {
            let slot = table.watch_slots.clone().try_acquire_owned();
            Some(slot.map_err(|_| ApiError::with(ErrorCode::RateLimited, json!({"limit": "worker-watches"})))?)
        } else {
            None
        };
        let slot = table
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| ApiError::with(ErrorCode::RateLimited, json!({"limit": "worker-calls"})))?;
        let id = self.next_call.fetch_add(1, Ordering::Relaxed);
        // Room for a full credit window plus the answer: the worker never sends more.
        let (tx, rx) = mpsc::channel(wp::CALL_WINDOW as usize + 2);
        let wait = Wait::of(&call.method);
        let req = Request::new(id, wp::CALL, serde_json::to_value(&call).unwrap_or_default());
        {
            let mut calls = table.calls.lock().expect("calls lock");
            let Some(map) = calls.as_mut() else {
                return Ok(None);
            };
            map.insert(id, tx);
        }
        let stream = CallStream {
            inner: Inner::Local {
                id,
                rx,
                table: table.clone(),
                unacked: 0,
                _slot: slot,
                _watch: watch,
            },
            wait,
            deadline: tokio::time::Instant::now() + UNARY_TIMEOUT,
            finished: false,
        };
        // If the connection is gone meanwhile, the stream reports it.
        let _ = table.out.send(to_message(&req)).await;
        Ok(Some(stream))
    }
}

/// The request body of a forwarded call.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Forwarded {
    pub(super) tenant_id: String,
    pub(super) call: wp::Call,
}

/// Whose worker a call goes to.
#[derive(Debug, Clone, Copy)]
pub enum To<'a> {
    /// The worker holding this workspace.
    Workspace(&'a str),
    /// The worker holding this live session's workspace (`not-found` for another tenant's
    /// or a removed session); the session and the route are looked up in one round trip.
    Session(&'a str),
}

/// Start `method` on the worker that holds the workspace `to` names, wherever it is
/// connected. `workspace-offline` when no worker holds it.
pub async fn call(
    state: &AppState,
    tenant_id: &str,
    to: To<'_>,
    method_name: &str,
    params: Value,
) -> ApiResult<CallStream> {
    let (workspace_id, route) = match to {
        To::Workspace(w) => (w.to_string(), None),
        To::Session(s) => {
            let (w, route) = state.store.session_route(tenant_id, s).await?;
            (w, Some(route))
        }
    };
    let call = wp::Call {
        workspace_id,
        method: method_name.to_string(),
        params,
    };
    // A draining replica's workers are moving to other replicas: once the worker's newest
    // connection is elsewhere, calls go there, and the old connection only finishes the
    // calls it has (it closes when they are done).
    let draining = state.draining.is_cancelled();
    if !draining && let Some(stream) = state.workers.call_local(tenant_id, call.clone()).await? {
        return Ok(stream);
    }
    let offline = || ApiError::code(ErrorCode::WorkspaceOffline);
    let route = match route {
        Some(route) => route,
        None => state.store.worker_route(tenant_id, &call.workspace_id).await?,
    };
    let route = match route {
        Some(route) if route.replica_id != state.config.replica_id => route,
        // None elsewhere (yet), or presence not yet cleaned up after our connection ended.
        _ => {
            if draining && let Some(stream) = state.workers.call_local(tenant_id, call).await? {
                return Ok(stream);
            }
            return Err(offline());
        }
    };
    let Some(url) = route.internal_url else {
        return Err(ApiError(unavailable("replica-unreachable")));
    };
    let body = Forwarded {
        tenant_id: tenant_id.to_string(),
        call,
    };
    let resp = state
        .http
        .post(format!("{}{INTERNAL_CALL_PATH}", url.trim_end_matches('/')))
        .header(SECRET_HEADER, &state.cluster.secret)
        .header(reqwest::header::ACCEPT, frames::CONTENT_TYPE)
        .header(frames::RUNS_HEADER, "1")
        .json(&body)
        .send()
        .await;
    let resp = match resp {
        Ok(r) if r.status().is_success() => r,
        Ok(r) => {
            tracing::warn!(replica = %route.replica_id, status = %r.status(), "forwarding a worker call was refused");
            return Err(ApiError(unavailable("replica-unreachable")));
        }
        Err(e) => {
            tracing::warn!(replica = %route.replica_id, error = %e, "forwarding a worker call failed");
            return Err(ApiError(unavailable("replica-unreachable")));
        }
    };
    let framed = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == frames::CONTENT_TYPE.as_bytes());
    Ok(CallStream {
        inner: Inner::Remote {
            body: Box::pin(resp.bytes_stream()),
            buf: BytesMut::new(),
            body_kind: if framed {
                BodyKind::Frames(FrameDecoder::default())
            } else {
                BodyKind::Lines { scanned: 0 }
            },
        },
        wait: Wait::of(method_name),
        deadline: tokio::time::Instant::now() + UNARY_TIMEOUT,
        finished: false,
    })
}

/// A unary call's answer, decoded.
pub async fn unary<T: serde::de::DeserializeOwned>(
    state: &AppState,
    tenant_id: &str,
    to: To<'_>,
    method_name: &str,
    params: Value,
) -> ApiResult<T> {
    decoded(call(state, tenant_id, to, method_name, params).await?, method_name).await
}

/// A unary call's answer (`method_name`'s), decoded.
pub async fn decoded<T: serde::de::DeserializeOwned>(stream: CallStream, method_name: &str) -> ApiResult<T> {
    let value = stream.answer().await.map_err(ApiError)?;
    serde_json::from_value(value).map_err(|e| {
        tracing::warn!(method = method_name, error = %e, "worker answered with a malformed result");
        ApiError::code(ErrorCode::Internal)
    })
}

#[cfg(test)]
mod tests {
    use base64::Engine;

    use super::{super::forwarded::line_bytes, *};

    /// Watches take at most [`WATCHES_PER_WORKER`] of a connection's call slots: past them
    /// a watch is `rate-limited`, and other calls still start.
    #[tokio::test]
    async fn watches_leave_slots_for_other_calls() {
        let registry = Registry::new(&crate::config::Limits::default());
        let (out, mut sent) = mpsc::channel(CALLS_PER_WORKER * 2);
        tokio::spawn(async move { while sent.recv().await.is_some() {} });
        let (stop, _stop_rx) = mpsc::unbounded_channel();
        registry.conns.lock().unwrap().insert(
            "wcn_test".into(),
            super::super::LocalWorker {
                tenant_id: "ten".into(),
                workspaces: vec!["wsp".into()],
                calls: CallTable::new(out),
                kick: Default::default(),
                stop,
                conn: std::sync::Weak::new(),
            },
        );
        let call = |method: &str| wp::Call {
            workspace_id: "wsp".into(),
            method: method.into(),
            params: json!({}),
        };
        let mut open = Vec::new();
        for _ in 0..WATCHES_PER_WORKER {
            open.push(
                registry
                    .call_local("ten", call(method::FilesWatch::NAME))
                    .await
                    .unwrap()
                    .unwrap(),
            );
        }
        let Err(refused) = registry.call_local("ten", call(method::FilesWatch::NAME)).await else {
            panic!("a watch past the bound started")
        };
        assert_eq!(refused.0.data_code(), Some("rate-limited"));
        assert_eq!(refused.0.data.get("limit"), Some(&json!("worker-watches")));
        for _ in WATCHES_PER_WORKER..CALLS_PER_WORKER {
            open.push(registry.call_local("ten", call("git.status")).await.unwrap().unwrap());
        }
        let Err(refused) = registry.call_local("ten", call("git.status")).await else {
            panic!("a call past the bound started")
        };
        assert_eq!(refused.0.data.get("limit"), Some(&json!("worker-calls")));
        // A watch ended frees its slot.
        open.remove(0);
        open.remove(WATCHES_PER_WORKER);
        registry
            .call_local("ten", call(method::FilesWatch::NAME))
            .await
            .unwrap()
            .unwrap();
    }

    #[test]
    fn a_hand_written_item_line_reads_back_as_the_item() {
        let item = RawValue::from_string(r#"{"type":"chunk","offset":0,"dataBase64":"aGk="}"#.into()).unwrap();
        let bytes = line_bytes(&Line::Item(Item::Json(item.clone())));
        assert_eq!(bytes.last(), Some(&b'\n'));
        assert_eq!(bytes.iter().filter(|b| **b == b'\n').count(), 1);
        match serde_json::from_slice::<JsonLine>(&bytes[..bytes.len() - 1]).unwrap() {
            JsonLine::Item(back) => assert_eq!(back.get(), item.get()),
            other => panic!("{other:?}"),
        }
        // A binary chunk goes to an older replica as the same JSON item.
        let chunk = line_bytes(&Line::Item(Item::Chunk {
            offset: 0,
            data: Bytes::from_static(b"hi"),
            text: true,
        }));
        match serde_json::from_slice::<JsonLine>(&chunk[..chunk.len() - 1]).unwrap() {
            JsonLine::Item(back) => assert_eq!(back.get(), item.get()),
            other => panic!("{other:?}"),
        }
        // A run goes as one line per chunk, cut on UTF-8 boundaries.
        let text = "aé✓😀".repeat(7_000);
        let run = line_bytes(&Line::Item(Item::Chunk {
            offset: 5,
            data: Bytes::from(text.clone()),
            text: true,
        }));
        let mut joined = Vec::new();
        let mut at = 5;
        for line in run[..run.len() - 1].split(|b| *b == b'\n') {
            let JsonLine::Item(back) = serde_json::from_slice::<JsonLine>(line).unwrap() else {
                panic!("not an item")
            };
            let berth_protocol::FilesReadItem::Chunk { offset, data_base64 } =
                serde_json::from_str(back.get()).unwrap()
            else {
                panic!("not a chunk")
            };
            let piece = base64::engine::general_purpose::STANDARD.decode(data_base64).unwrap();
            assert_eq!(offset, at);
            assert!(piece.len() <= FILES_READ_CHUNK && std::str::from_utf8(&piece).is_ok());
            at += piece.len() as u64;
            joined.extend(piece);
        }
        assert_eq!(joined, text.as_bytes());
        let keepalive = line_bytes(&Line::Keepalive);
        assert!(matches!(
            serde_json::from_slice::<JsonLine>(&keepalive[..keepalive.len() - 1]).unwrap(),
            JsonLine::Keepalive
        ));
    }

    #[test]
    fn a_chunk_written_as_json_is_the_protocols_chunk_item() {
        let data = b"\x00\xff naive \"quoted\"\n\xc3";
        let mut item = String::new();
        write_chunk_json(&mut item, 1 << 33, data);
        let parsed: berth_protocol::FilesReadItem = serde_json::from_str(&item).unwrap();
        let expected = berth_protocol::FilesReadItem::Chunk {
            offset: 1 << 33,
            data_base64: base64::engine::general_purpose::STANDARD.encode(data),
        };
        assert_eq!(
            serde_json::to_value(parsed).unwrap(),
            serde_json::to_value(expected).unwrap()
        );
        assert!(item.len() <= chunk_json_len(data.len()));
    }

    #[test]
    fn a_binary_chunk_frame_becomes_a_chunk_item_of_its_call() {
        let (out, _rx) = mpsc::channel(1);
        let table = CallTable::new(out);
        let (tx, mut rx) = mpsc::channel(4);
        table.calls.lock().unwrap().as_mut().unwrap().insert(9, tx);
        let frame = Bytes::from(wp::chunk_frame(9, 32768, b"raw \xff"));
        assert!(table.chunk_frame(&frame));
        match rx.try_recv().unwrap() {
            CallEvent::Item(Item::Chunk { offset, data, text }) => {
                assert_eq!(offset, 32768);
                assert_eq!(&data[..], b"raw \xff");
                assert!(!text);
            }
            other => panic!("{other:?}"),
        }
        // A chunk run: one item, counting for each of its chunks.
        let run = "é".repeat(100_000);
        let frame = Bytes::from(wp::chunk_run_frame(9, 65536, true, run.as_bytes()));
        assert!(table.chunk_frame(&frame));
        match rx.try_recv().unwrap() {
            CallEvent::Item(
                item @ Item::Chunk {
                    offset: 65536,
                    text: true,
                    ..
                },
            ) => {
                assert_eq!(item.credits(), 7);
                let chunks = item.chunks();
                assert_eq!(chunks[1].0, 65536 + chunks[0].1.len() as u64);
                assert_eq!(
                    chunks.iter().map(|c| &c.1[..]).collect::<Vec<_>>().concat(),
                    run.as_bytes()
                );
            }
            other => panic!("{other:?}"),
        }
        // An older worker's text `call.item` of the same chunk still arrives, as its JSON.
        let text = r#"{"jsonrpc":"2.0","method":"call.item","params":{"callId":9,"item":{"type":"chunk","offset":0,"dataBase64":"aGk="}}}"#;
        assert!(table.item_text(text));
        match rx.try_recv().unwrap() {
            CallEvent::Item(Item::Json(v)) => assert_eq!(v.get(), r#"{"type":"chunk","offset":0,"dataBase64":"aGk="}"#),
            other => panic!("{other:?}"),
        }
        // Not a chunk frame: refused, nothing delivered.
        assert!(!table.chunk_frame(&Bytes::from_static(b"\x02short")));
        assert!(rx.try_recv().is_err());
    }
}
