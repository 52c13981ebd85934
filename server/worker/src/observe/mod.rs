//! Observations the API tier asks for on behalf of clients (`call` requests): git status
//! and diffs, file listings, watches and reads, path completion. Each runs as its own task;
//! subscription items go out as `call.item` within the credit the server grants
//! (`call.ack`), and `call.cancel` stops a call. One module per observation.

mod complete;
mod files;
pub(crate) mod git;
mod watcher;

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use base64::Engine;
use berth_protocol::{
    ErrorCode, FilesListParams, FilesReadParams, FilesWatchParams, GitDiffParams, Method, RpcError,
    WorkspaceFilesParams, WorkspacePath,
    jsonrpc::{Request, Response},
    method,
    worker::{self as wp, Call, CallAck, CallCancel},
};
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use crate::{Link, workspace::Workspace};

/// A call in progress: its credit and its cancellation.
struct Running {
    credit: Arc<Semaphore>,
    cancel: CancellationToken,
    /// A `files.watch`, which ends only when closed or with its connection.
    watch: bool,
}

/// Answers the server's `call`s for this connection's workspaces.
#[derive(Clone)]
pub(crate) struct Observer {
    link: Link,
    /// Workspace roots by workspace id.
    roots: Arc<HashMap<String, PathBuf>>,
    calls: Arc<Mutex<HashMap<u32, Running>>>,
    /// Cancelled when the connection ends.
    closed: CancellationToken,
}

impl Observer {
    pub(crate) fn new(link: Link, roots: HashMap<String, PathBuf>, closed: CancellationToken) -> Observer {
        Observer {
            link,
            roots: Arc::new(roots),
            calls: Arc::default(),
            closed,
        }
    }

    /// Calls in progress other than watches.
    pub(crate) fn busy(&self) -> usize {
        self.calls
            .lock()
            .expect("calls lock")
            .values()
            .filter(|c| !c.watch)
            .count()
    }

    /// Handle `text` if it is a `call`, `call.ack` or `call.cancel`; false otherwise.
    pub(crate) fn handle(&self, text: &str) -> bool {
        // Cheap test first: most messages are turn traffic.
        if !text.contains("\"call") {
            return false;
        }
        let Ok(req) = serde_json::from_str::<Request>(text) else {
            return false;
        };
        match req.method.as_str() {
            wp::CALL => {
                let Some(id) = req.id else { return true };
                match serde_json::from_value::<Call>(req.params) {
                    Ok(call) => self.start(id, call),
                    Err(_) => self.answer(id, Err(RpcError::new(ErrorCode::BadParams))),
                }
            }
            wp::CALL_ACK => {
                if let Ok(ack) = serde_json::from_value::<CallAck>(req.params)
                    && let Some(c) = self.calls.lock().expect("calls lock").get(&ack.call_id)
                {
                    c.credit.add_permits(ack.items.min(wp::CALL_WINDOW) as usize);
                }
            }
            wp::CALL_CANCEL => {
                if let Ok(cancel) = serde_json::from_value::<CallCancel>(req.params)
                    && let Some(c) = self.calls.lock().expect("calls lock").remove(&cancel.call_id)
                {
                    c.cancel.cancel();
                }
            }
            _ => return false,
        }
        true
    }

    fn start(&self, id: u32, call: Call) {
        let Some(root) = self.roots.get(&call.workspace_id).cloned() else {
            self.answer(id, Err(RpcError::new(ErrorCode::WorkspaceOffline)));
            return;
        };
        let credit = Arc::new(Semaphore::new(wp::CALL_WINDOW as usize));
        let cancel = self.closed.child_token();
        self.calls.lock().expect("calls lock").insert(
            id,
            Running {
                credit: credit.clone(),
                cancel: cancel.clone(),
                watch: call.method == method::FilesWatch::NAME,
            },
        );
        let this = self.clone();
        tokio::spawn(async move {
            let items = Items {
                link: this.link.clone(),
                id,
                credit,
                cancel: cancel.clone(),
            };
            let result = tokio::select! {
                r = run(root, call, &items) => r,
                _ = cancel.cancelled() => return,
            };
            this.calls.lock().expect("calls lock").remove(&id);
            this.answer(id, result);
        });
    }

    fn answer(&self, id: u32, result: Result<Value, RpcError>) {
        let resp = match result {
            Ok(v) => Response::ok(Some(id), v),
            Err(e) => Response::err(Some(id), e),
        };
        let link = self.link.clone();
        tokio::spawn(async move {
            let Ok(mut text) = serde_json::to_string(&resp) else {
                return;
            };
            if text.len() > wp::CALL_ANSWER_MAX {
                tracing::warn!(
                    call.id = id,
                    bytes = text.len(),
                    "a call's answer is too large to send; refused instead"
                );
                let refused = failure(ErrorCode::PayloadTooLarge, "limit", "answer");
                let refused = Response::err(Some(id), refused);
                let Ok(t) = serde_json::to_string(&refused) else { return };
                text = t;
            }
            let _ = link.out.tx.send(Message::Text(text.into())).await;
        });
    }
}

/// Where a call's subscription items go.
pub(crate) struct Items {
    link: Link,
    id: u32,
    credit: Arc<Semaphore>,
    cancel: CancellationToken,
}

impl Items {
    /// Wait for credit for one item; false once the call is cancelled or the connection is
    /// gone.
    async fn credit(&self) -> bool {
        self.credits(1).await
    }

    /// Wait for credit for `n` items (see [`Items::credit`]).
    async fn credits(&self, n: u32) -> bool {
        let permit = tokio::select! {
            p = self.credit.acquire_many(n) => p,
            _ = self.cancel.cancelled() => return false,
        };
        let Ok(permit) = permit else { return false };
        // Returned by the server's `call.ack`, not on drop.
        permit.forget();
        true
    }

    /// Send one item within the call's credit; false once the call is cancelled or the
    /// connection is gone.
    pub(crate) async fn send(&self, item: &impl serde::Serialize) -> bool {
        if !self.credit().await {
            return false;
        }
        // Written in one pass, without a `Value` copy of the item.
        #[derive(serde::Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Params<'a, T> {
            call_id: u32,
            item: &'a T,
        }
        let note = berth_protocol::jsonrpc::NotificationRef::new(wp::CALL_ITEM, Params { call_id: self.id, item });
        let Ok(text) = serde_json::to_string(&note) else {
            return false;
        };
        self.link.out.tx.send(Message::Text(text.into())).await.is_ok()
    }

    /// Send one item that `write_item` writes as JSON text (about `len` bytes) straight into
    /// the message: a file chunk's base64 goes into the frame in one pass, with no serde
    /// escaping pass over it and no reallocation.
    pub(crate) async fn send_written(&self, len: usize, write_item: impl FnOnce(&mut String)) -> bool {
        if !self.credit().await {
            return false;
        }
        self.link
            .out
            .tx
            .send(Message::Text(call_item_text(self.id, len, write_item).into()))
            .await
            .is_ok()
    }

    /// Send one `files.read` chunk within the call's credit: as a binary chunk frame (raw
    /// bytes, no base64) when the server takes them, else as a `call.item` text frame.
    pub(crate) async fn send_chunk(&self, offset: usize, piece: &[u8]) -> bool {
        if !self.link.binary_chunks {
            return self
                .send_written(piece.len().div_ceil(3) * 4 + 64, |out| {
                    files::write_chunk(out, offset, piece)
                })
                .await;
        }
        if !self.credit().await {
            return false;
        }
        let frame = wp::chunk_frame(self.id, offset as u64, piece);
        self.link.out.tx.send(Message::Binary(frame.into())).await.is_ok()
    }
}

impl Items {
    /// The server takes runs of chunks ([`Items::send_run`]).
    pub(crate) fn chunk_runs(&self) -> bool {
        self.link.chunk_runs
    }

    /// Send a run of `chunks` whole `files.read` chunks starting at `offset` as one binary
    /// message, within the call's credit for that many items (only when
    /// [`Items::chunk_runs`]).
    pub(crate) async fn send_run(&self, offset: usize, text: bool, run: &[u8], chunks: u32) -> bool {
        if !self.credits(chunks).await {
            return false;
        }
        let frame = wp::chunk_run_frame(self.id, offset as u64, text, run);
        self.link.out.tx.send(Message::Binary(frame.into())).await.is_ok()
    }
}

/// A `call.item` notification around an item written by `write_item`.
fn call_item_text(call_id: u32, len: usize, write_item: impl FnOnce(&mut String)) -> String {
    use std::fmt::Write;
    let mut text = String::with_capacity(len + 96);
    let _ = write!(
        text,
        r#"{{"jsonrpc":"2.0","method":"{}","params":{{"callId":{call_id},"item":"#,
        wp::CALL_ITEM
    );
    write_item(&mut text);
    text.push_str("}}");
    text
}

fn params<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, RpcError> {
    serde_json::from_value(v).map_err(|_| RpcError::new(ErrorCode::BadParams))
}

/// Blocking observation work (a status, a listing, a read's capture) that runs at once in
/// the whole worker. A call that is cancelled or times out stops waiting for its work, but
/// work already running cannot be stopped: without a bound, a client repeating a slow call
/// would pile up abandoned work until the blocking pool and the memory ran out.
const BLOCKING_AT_ONCE: usize = 8;
static BLOCKING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(BLOCKING_AT_ONCE);

/// Run blocking filesystem work off the async threads, at most [`BLOCKING_AT_ONCE`] at a
/// time (a slot is held until the work itself ends, whether or not anyone still waits).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, RpcError> + Send + 'static) -> Result<T, RpcError> {
    let slot = BLOCKING
        .acquire()
        .await
        .map_err(|_| RpcError::new(ErrorCode::Internal))?;
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        f()
    })
    .await
    .unwrap_or_else(|_| Err(RpcError::new(ErrorCode::Internal)))
}

fn to_value(v: impl serde::Serialize) -> Result<Value, RpcError> {
    serde_json::to_value(v).map_err(|_| RpcError::new(ErrorCode::Internal))
}

async fn run(root: PathBuf, call: Call, items: &Items) -> Result<Value, RpcError> {
    let workspace = || -> Result<Arc<Workspace>, RpcError> {
        Workspace::open(&root)
            .map(Arc::new)
            .map_err(|_| failure(ErrorCode::Unavailable, "reason", "workspace-unreadable"))
    };
    match call.method.as_str() {
        method::FilesList::NAME => {
            let p: FilesListParams = params(call.params)?;
            let ws = workspace()?;
            to_value(blocking(move || files::list(&ws, &p)).await?)
        }
        method::FilesRead::NAME => {
            files::read(workspace()?, params::<FilesReadParams>(call.params)?, items).await?;
            Ok(Value::Null)
        }
        method::FilesWatch::NAME => {
            to_value(files::watch(workspace()?, params::<FilesWatchParams>(call.params)?, items).await?)
        }
        method::WorkspaceFiles::NAME => {
            let p: WorkspaceFilesParams = params(call.params)?;
            let prefix = p.prefix.unwrap_or_default();
            to_value(blocking(move || complete::files(&root, &prefix)).await?)
        }
        method::GitStatusGet::NAME => to_value(blocking(move || git::status(&root)).await?),
        method::GitDiffGet::NAME => {
            let p: GitDiffParams = params(call.params)?;
            let path = decode_path(&p.path)?;
            to_value(blocking(move || git::diff(&root, &path, p.area)).await?)
        }
        method::PatchSnapshot::NAME => {
            let (text, captured) = blocking(move || git::patch(&root, berth_protocol::MAX_PATCH_BYTES)).await?;
            for piece in chunks(&text, wp::PATCH_CHUNK_BYTES) {
                if !items
                    .send(&wp::PatchChunk {
                        text: piece.to_string(),
                    })
                    .await
                {
                    return Err(RpcError::new(ErrorCode::Unavailable));
                }
            }
            to_value(captured)
        }
        method::SkillList::NAME => {
            let ws = workspace()?;
            to_value(blocking(move || Ok(crate::skills::list(&ws))).await?)
        }
        _ => Err(RpcError::new(ErrorCode::MethodNotFound)),
    }
}

/// `text` in pieces of at most `max` bytes (at least one character each), cut on
/// character boundaries.
fn chunks(text: &str, max: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut cut = rest.len().min(max);
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        if cut == 0 {
            cut = rest.chars().next().map_or(rest.len(), char::len_utf8);
        }
        let (piece, tail) = rest.split_at(cut);
        rest = tail;
        Some(piece)
    })
}

/// An error with its typed code and one safe field.
pub(crate) fn failure(code: ErrorCode, field: &str, value: &str) -> RpcError {
    let mut fields = serde_json::Map::new();
    fields.insert(field.into(), value.into());
    RpcError::with_fields(code, fields)
}

pub(crate) fn encode_path(bytes: &[u8]) -> WorkspacePath {
    WorkspacePath {
        bytes_base64: base64::engine::general_purpose::STANDARD.encode(bytes),
    }
}

/// A path's bytes as the worker itself encoded them (no checks).
pub(crate) fn decode_raw(p: &WorkspacePath) -> Result<Vec<u8>, base64::DecodeError> {
    base64::engine::general_purpose::STANDARD.decode(&p.bytes_base64)
}

/// A client's path: relative, no `.`/`..` components, no NUL, not empty.
pub(crate) fn decode_path(p: &WorkspacePath) -> Result<Vec<u8>, RpcError> {
    let invalid = || failure(ErrorCode::BadParams, "reason", "invalid-path");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&p.bytes_base64)
        .map_err(|_| invalid())?;
    if bytes.is_empty() || bytes.starts_with(b"/") || bytes.contains(&0) {
        return Err(invalid());
    }
    if bytes
        .split(|b| *b == b'/')
        .any(|c| c.is_empty() || c == b"." || c == b"..")
    {
        return Err(invalid());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::chunks;

    /// However many calls wait for blocking work, at most [`super::BLOCKING_AT_ONCE`] of
    /// them run it at once, and a slot is freed only when its work ends, not when its caller
    /// stops waiting.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn blocking_work_runs_a_bounded_number_at_once() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        static RUNNING: AtomicUsize = AtomicUsize::new(0);
        static MOST: AtomicUsize = AtomicUsize::new(0);
        static RELEASE: AtomicBool = AtomicBool::new(false);
        let mut waiting = Vec::new();
        for _ in 0..3 * super::BLOCKING_AT_ONCE {
            waiting.push(tokio::spawn(super::blocking(|| {
                let now = RUNNING.fetch_add(1, Ordering::SeqCst) + 1;
                MOST.fetch_max(now, Ordering::SeqCst);
                while !RELEASE.load(Ordering::SeqCst) {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                RUNNING.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            })));
        }
        for _ in 0..3000 {
            if super::BLOCKING.available_permits() == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        // Room for more to start, were they not bounded; then the callers give up.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        for w in &waiting {
            w.abort();
        }
        // (Another test's work may hold a slot meanwhile: at most, not exactly.)
        let most = MOST.load(Ordering::SeqCst);
        assert!(most <= super::BLOCKING_AT_ONCE && most > 0, "{most} at once");
        // The work that started goes on to its end, and holds its slot until then.
        assert_eq!(super::BLOCKING.available_permits(), 0);
        RELEASE.store(true, Ordering::SeqCst);
        for _ in 0..3000 {
            if super::BLOCKING.available_permits() == super::BLOCKING_AT_ONCE {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(super::BLOCKING.available_permits(), super::BLOCKING_AT_ONCE);
    }

    #[test]
    fn chunks_cut_on_character_boundaries_and_cover_the_text() {
        let text = "aé€😀".repeat(10);
        for max in 1..8 {
            let pieces: Vec<&str> = chunks(&text, max).collect();
            assert_eq!(pieces.concat(), text);
            assert!(
                pieces
                    .iter()
                    .all(|p| !p.is_empty() && (p.len() <= max || p.chars().count() == 1))
            );
        }
        assert_eq!(chunks("", 4).count(), 0);
    }
}
