//! The client WebSocket (`GET /v1/rpc`): JSON-RPC 2.0, one message per text frame.
//!
//! Authentication is the `Authorization` header on the upgrade (HTTP 401 when wrong) or a
//! `hello` request (within the hello timeout, or the connection closes). Every request runs
//! as its own task; responses and subscription items go through one outbound queue bounded
//! in bytes and drained by a writer task, so a slow client slows its own subscriptions
//! (which then read from the database at their own pace) and never makes the server buffer
//! without bound. A write the client does not take within the write timeout closes the
//! connection; its registration (which counts against the per-credential limit) is dropped
//! only after the writer has ended.

mod admin;
mod agent;
mod connection;
mod files;
mod fork;
mod git;
pub(crate) mod interaction;
mod mcp;
mod patch;
mod queue;
mod receipts;
mod search;
mod session;
mod skill;
pub(crate) mod upload;
mod workspace;

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Instant,
};

use axum::{
    extract::{
        ConnectInfo, State, WebSocketUpgrade,
        ws::{CloseFrame, Message, WebSocket},
    },
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
};
use berth_protocol::{
    ErrorCode, Method, RpcError,
    jsonrpc::{NotificationRef, Request, Response as RpcResponse, SUBSCRIPTION_ITEM},
    method,
};
use berth_store::{CredentialKind, Principal};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::{
    AppState,
    error::{ApiError, ApiResult},
    workers::calls::{self, CallStream},
};

/// What a queued message costs beyond its payload (framing, bookkeeping), so that a flood
/// of empty messages is bounded too.
const MESSAGE_OVERHEAD: usize = 64;

/// The bearer token of an `Authorization` header. The scheme is case-insensitive (RFC 7235).
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim_start();
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Whether a browser page at `origin` may open the WebSocket: an origin in the allow-list,
/// or the server's own origin (its authority is the `Host` the browser sent the upgrade
/// to), which is where the embedded console is served from. A page elsewhere sends its own
/// origin, which matches neither. Authentication never rides on ambient credentials
/// (cookies), so this is defence in depth, not the only guard.
fn origin_allowed(origin: &str, host: Option<&str>, allowed: &[String]) -> bool {
    if allowed.iter().any(|a| a == origin) {
        return true;
    }
    let Some(host) = host else { return false };
    let authority = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"));
    authority.is_some_and(|a| !a.is_empty() && !a.contains('/') && a.eq_ignore_ascii_case(host))
}

pub async fn upgrade(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    if let Some(origin) = headers.get(header::ORIGIN) {
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
        let allowed = origin
            .to_str()
            .is_ok_and(|o| origin_allowed(o, host, &state.config.allowed_origins));
        if !allowed {
            state.metrics.auth_failures.with_label_values(&["origin"]).inc();
            return StatusCode::FORBIDDEN.into_response();
        }
    }
    let principal = match bearer(&headers) {
        None => None,
        Some(t) => match state.authenticate(t).await {
            Ok(Some(p)) if p.kind == CredentialKind::User => Some(p),
            Ok(_) => {
                state.metrics.auth_failures.with_label_values(&["invalid"]).inc();
                return StatusCode::UNAUTHORIZED.into_response();
            }
            Err(_) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
        },
    };
    if let Some(p) = &principal
        && !state
            .connections
            .has_room(p, state.config.limits.max_connections_per_credential)
    {
        return StatusCode::TOO_MANY_REQUESTS.into_response();
    }
    // A connection that will authenticate by `hello` counts against its address until then.
    let pending = if principal.is_none() {
        let addr = crate::login::client_addr(peer, &headers, &state.config.trusted_proxies);
        match state
            .connections
            .pending(addr, state.config.limits.max_unauthenticated_per_address)
        {
            Some(p) => Some(p),
            None => {
                state
                    .metrics
                    .auth_failures
                    .with_label_values(&["unauthenticated-limit"])
                    .inc();
                return StatusCode::TOO_MANY_REQUESTS.into_response();
            }
        }
    } else {
        None
    };
    // Leave room above the limits so that an oversized message is refused by us (1009 for
    // text; a typed error for an upload).
    let max = state
        .config
        .max_text_message
        .max(state.config.max_attachment_bytes.saturating_add(4))
        .saturating_add(64 << 10);
    ws.max_message_size(max)
        .max_frame_size(max)
        .on_upgrade(move |socket| run(state, principal, pending, socket))
}

/// What a request handler gets.
#[derive(Clone)]
pub struct Ctx {
    pub state: AppState,
    pub conn: Arc<Conn>,
    /// The request's id.
    pub id: Option<u32>,
    /// The operation receipt this call owns (mutations called with an `operationId`).
    pub op: Option<berth_store::Receipt>,
}

/// A connection's outbound queue, bounded in bytes: a message takes its size (plus
/// [`MESSAGE_OVERHEAD`]) from the budget until the writer has handed it to the socket. A
/// message larger than the whole budget waits for an empty queue.
pub struct Outbound {
    tx: mpsc::UnboundedSender<(Message, OwnedSemaphorePermit)>,
    budget: Arc<Semaphore>,
    max: usize,
}

impl Outbound {
    fn new(max: usize) -> (Outbound, mpsc::UnboundedReceiver<(Message, OwnedSemaphorePermit)>) {
        let max = max.clamp(4 * MESSAGE_OVERHEAD, u32::MAX as usize);
        let (tx, rx) = mpsc::unbounded_channel();
        let budget = Arc::new(Semaphore::new(max));
        (Outbound { tx, budget, max }, rx)
    }

    fn cost(&self, msg: &Message) -> u32 {
        let len = match msg {
            Message::Text(t) => t.len(),
            Message::Binary(b) => b.len(),
            _ => 0,
        };
        // `max` fits in u32 (clamped in `new`).
        (len.saturating_add(MESSAGE_OVERHEAD).min(self.max)) as u32
    }

    /// Queue `msg`, waiting for room; false once the connection's writer has ended.
    pub async fn send(&self, msg: Message) -> bool {
        let Ok(permit) = self.budget.clone().acquire_many_owned(self.cost(&msg)).await else {
            return false;
        };
        self.tx.send((msg, permit)).is_ok()
    }

    /// Queue `msg` if there is room now.
    pub fn try_send(&self, msg: Message) -> bool {
        let Ok(permit) = self.budget.clone().try_acquire_many_owned(self.cost(&msg)) else {
            return false;
        };
        self.tx.send((msg, permit)).is_ok()
    }
}

/// A connection's subscriptions by request id. A slot is freed only when the task it was
/// reserved for ends (and only if the slot is still that task's); `subscription.close` just
/// cancels it, so the id stays in use and counted until the task has really stopped.
#[derive(Default)]
pub struct Subs {
    slots: HashMap<u32, Slot>,
    next: u64,
}

struct Slot {
    token: CancellationToken,
    serial: u64,
}

impl Subs {
    /// The cancellation token of subscription `id`.
    pub fn get(&self, id: &u32) -> Option<&CancellationToken> {
        self.slots.get(id).map(|s| &s.token)
    }

    /// Reserve a slot for a new subscription under `id`; returns its serial and token.
    fn reserve(
        &mut self,
        id: u32,
        parent: &CancellationToken,
        max: usize,
    ) -> Result<(u64, CancellationToken), ApiError> {
        if self.slots.contains_key(&id) {
            return Err(ApiError::with(ErrorCode::BadParams, json!({"reason": "id-in-use"})));
        }
        if self.slots.len() >= max {
            return Err(ApiError::with(
                ErrorCode::RateLimited,
                json!({"limit": "subscriptions"}),
            ));
        }
        self.next += 1;
        let token = parent.child_token();
        self.slots.insert(
            id,
            Slot {
                token: token.clone(),
                serial: self.next,
            },
        );
        Ok((self.next, token))
    }

    /// Ask subscription `id` to end; false if there is none.
    pub fn close(&self, id: u32) -> bool {
        self.slots.get(&id).map(|s| s.token.cancel()).is_some()
    }

    /// The task holding slot `serial` under `id` has ended.
    fn finish(&mut self, id: u32, serial: u64) {
        if self.slots.get(&id).is_some_and(|s| s.serial == serial) {
            self.slots.remove(&id);
        }
    }

    fn cancel_all(&self) {
        for s in self.slots.values() {
            s.token.cancel();
        }
    }
}

/// Per-connection state.
pub struct Conn {
    pub principal: Mutex<Option<Principal>>,
    pub out: Outbound,
    /// Open subscriptions by request id.
    pub subs: Mutex<Subs>,
    pub closed: CancellationToken,
    /// Cancelled when the principal is revoked (credential revoked, user disabled).
    pub revoked: CancellationToken,
    /// This connection's entry in the replica's connection registry.
    pub registration: Mutex<Option<crate::connections::Registration>>,
    /// Requests being answered (subscriptions excluded).
    pub in_flight: Arc<tokio::sync::Semaphore>,
    /// `content.upload` requests awaiting their binary message.
    pub uploads: upload::Uploads,
    /// While not authenticated: this connection's place in its address's count.
    pending: Mutex<Option<crate::connections::Pending>>,
}

impl Conn {
    /// Authenticate the connection as `principal` (registering it for revocation and the
    /// per-credential connection limit). A connection already signed in stays who it is:
    /// the same principal may present a fresher token (a new login token of the same user
    /// moves the expiry), any other principal is refused with `conflict` — so the
    /// registration, and the watches running under it, always belong to the principal
    /// the connection acts as.
    pub fn sign_in(&self, state: &AppState, principal: Principal) -> ApiResult<()> {
        let max = state.config.limits.max_connections_per_credential;
        let mut reg = self.registration.lock().expect("conn lock");
        if let Some(current) = reg.as_ref() {
            if !state.connections.refresh(current.id(), &principal) {
                return Err(ApiError::with(ErrorCode::Conflict, json!({"reason": "signed-in"})));
            }
        } else {
            let registration = crate::connections::Registration::new(state, &principal, max, self.revoked.clone())
                .ok_or_else(|| ApiError::with(ErrorCode::RateLimited, json!({"limit": "connections"})))?;
            *reg = Some(registration);
            self.pending.lock().expect("conn lock").take();
        }
        *self.principal.lock().expect("conn lock") = Some(principal);
        Ok(())
    }
}

impl Ctx {
    /// Start `method` on the worker holding session `session_id`'s workspace, with `params`
    /// passed on as they came (`workers::calls`).
    pub async fn session_call(
        &self,
        session_id: &str,
        method: &str,
        params: &impl serde::Serialize,
    ) -> ApiResult<CallStream> {
        let me = self.principal()?;
        let params = serde_json::to_value(params).unwrap_or_default();
        calls::call(
            &self.state,
            &me.tenant_id,
            calls::To::Session(session_id),
            method,
            params,
        )
        .await
    }

    /// [`Ctx::session_call`] of a unary method: its answer, decoded.
    pub async fn session_unary<T: serde::de::DeserializeOwned>(
        &self,
        session_id: &str,
        method: &str,
        params: &impl serde::Serialize,
    ) -> ApiResult<T> {
        calls::decoded(self.session_call(session_id, method, params).await?, method).await
    }

    pub fn principal(&self) -> ApiResult<Principal> {
        self.conn
            .principal
            .lock()
            .expect("conn lock")
            .clone()
            .ok_or(ApiError::code(ErrorCode::Unauthorized))
    }

    /// Send one subscription item; waits when the outbound queue is full.
    pub async fn item(&self, item: &impl serde::Serialize) -> bool {
        // Written in one pass: an item may be a worker's raw JSON (a file chunk), which a
        // `Value` in between would parse again.
        #[derive(serde::Serialize)]
        struct Params<'a, T> {
            id: Option<u32>,
            item: &'a T,
        }
        let note = NotificationRef::new(SUBSCRIPTION_ITEM, Params { id: self.id, item });
        self.conn.out.send(text(&note)).await
    }

    /// Send one subscription item that is already JSON text (a worker's file chunk, ~44 KiB):
    /// copied once into a message sized for it, not grown through a serializer.
    pub async fn item_raw(&self, item: &serde_json::value::RawValue) -> bool {
        self.conn.out.send(Message::Text(item_text(self.id, item).into())).await
    }

    /// Send one `files.read` chunk item from its raw bytes: base64-encoded straight into a
    /// message sized for it (the one place a chunk is encoded).
    pub async fn item_chunk(&self, offset: u64, data: &[u8]) -> bool {
        let mut text = item_prefix(self.id, calls::chunk_json_len(data.len()));
        calls::write_chunk_json(&mut text, offset, data);
        text.push_str("}}");
        self.conn.out.send(Message::Text(text.into())).await
    }

    /// Send a run's chunk items (each ≤ 32 KiB, see [`calls::Item::chunks`]).
    pub async fn item_chunks(&self, chunks: &[(u64, bytes::Bytes)]) -> bool {
        for (offset, data) in chunks {
            if !self.item_chunk(*offset, data).await {
                return false;
            }
        }
        true
    }
}

/// A `subscription.item` notification around `item`, as [`Ctx::item`] writes it.
fn item_text(id: Option<u32>, item: &serde_json::value::RawValue) -> String {
    let mut text = item_prefix(id, item.get().len());
    text.push_str(item.get());
    text.push_str("}}");
    text
}

/// A `subscription.item` notification up to its item, in a buffer with room for `len` more.
fn item_prefix(id: Option<u32>, len: usize) -> String {
    use std::fmt::Write;
    let mut text = String::with_capacity(len + 80);
    let _ = write!(
        text,
        r#"{{"jsonrpc":"2.0","method":"{SUBSCRIPTION_ITEM}","params":{{"id":"#
    );
    match id {
        Some(id) => {
            let _ = write!(text, "{id}");
        }
        None => text.push_str("null"),
    }
    text.push_str(r#","item":"#);
    text
}

fn text<T: serde::Serialize>(v: &T) -> Message {
    Message::Text(serde_json::to_string(v).unwrap_or_default().into())
}

fn close(code: u16, reason: &'static str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

/// The largest message a connection may send before `hello` succeeds (a `hello` with a
/// login token is well under 4 KiB).
const PRE_HELLO_MAX: usize = 64 << 10;

async fn run(
    state: AppState,
    principal: Option<Principal>,
    pending: Option<crate::connections::Pending>,
    socket: WebSocket,
) {
    state.metrics.connections.with_label_values(&["client"]).inc();
    let limits = state.config.limits.clone();
    let (mut sink, mut stream) = socket.split();
    let (out, mut rx) = Outbound::new(limits.outbound_bytes);
    let conn = Arc::new(Conn {
        principal: Mutex::new(None),
        out,
        subs: Mutex::new(Subs::default()),
        closed: CancellationToken::new(),
        revoked: CancellationToken::new(),
        registration: Mutex::new(None),
        in_flight: Arc::new(tokio::sync::Semaphore::new(limits.max_in_flight)),
        uploads: upload::Uploads::default(),
        pending: Mutex::new(pending),
    });
    if let Some(p) = principal
        && conn.sign_in(&state, p).is_err()
    {
        let _ = sink.send(close(1008, "too many connections")).await;
        state.metrics.connections.with_label_values(&["client"]).dec();
        return;
    }
    // The writer hands queued messages to the socket, a batch within the write timeout; a
    // client that stops reading is dropped then. Messages stay counted against the byte
    // budget until written.
    let writer_done = CancellationToken::new();
    let writer = tokio::spawn({
        let (done, closed, budget) = (writer_done.clone(), conn.closed.clone(), conn.out.budget.clone());
        let write_timeout = limits.write_timeout;
        async move {
            let mut held = Vec::with_capacity(berth_protocol::batch::WRITE_BATCH);
            loop {
                // Once the connection is closing, send what is queued and stop.
                let next = tokio::select! {
                    biased;
                    m = rx.recv() => m,
                    _ = closed.cancelled() => rx.try_recv().ok(),
                };
                let Some((first, permit)) = next else { break };
                held.push(permit);
                // The permits are kept until the batch is flushed.
                let more = || {
                    rx.try_recv().ok().map(|(msg, permit)| {
                        held.push(permit);
                        msg
                    })
                };
                match tokio::time::timeout(write_timeout, crate::net::write_batch(&mut sink, first, more)).await {
                    Ok(Ok(false)) => held.clear(),
                    _ => break,
                }
            }
            // Senders waiting for room give up; the read loop ends.
            budget.close();
            done.cancel();
            let _ = tokio::time::timeout(write_timeout, sink.close()).await;
        }
    });
    let mut ping = tokio::time::interval(limits.ping_interval);
    let mut last_heard = Instant::now();
    let hello_deadline = tokio::time::sleep(limits.hello_timeout);
    tokio::pin!(hello_deadline);
    let mut writer_gone = false;
    loop {
        let unauthenticated = conn.principal.lock().expect("conn lock").is_none();
        let msg = tokio::select! {
            m = stream.next() => m,
            _ = ping.tick() => {
                if last_heard.elapsed() > limits.idle_timeout {
                    let _ = conn.out.try_send(close(1000, "idle"));
                    break;
                }
                let _ = conn.out.try_send(Message::Ping(Default::default()));
                continue;
            }
            _ = &mut hello_deadline, if unauthenticated => {
                // A `hello` may have succeeded while we waited.
                if conn.principal.lock().expect("conn lock").is_some() {
                    continue;
                }
                let _ = conn.out.try_send(close(1008, "not authenticated"));
                break;
            }
            _ = conn.revoked.cancelled() => {
                let _ = conn.out.send(close(1008, "revoked")).await;
                break;
            }
            _ = state.shutdown.cancelled() => {
                let _ = conn.out.send(close(1001, "shutting down")).await;
                break;
            }
            _ = writer_done.cancelled() => {
                writer_gone = true;
                break;
            }
        };
        last_heard = Instant::now();
        let msg = match msg {
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                // The only read error we can still answer is an oversized message.
                if e.to_string().contains("too long") || e.to_string().contains("Space limit") {
                    let _ = conn.out.send(close(1009, "message too big")).await;
                }
                break;
            }
            None => break,
        };
        // As of now (a `hello` may have succeeded while this message was awaited).
        let unauthenticated = conn.principal.lock().expect("conn lock").is_none();
        match msg {
            Message::Text(t) if t.len() > state.config.max_text_message => {
                let _ = conn.out.send(close(1009, "message too big")).await;
                break;
            }
            // Before `hello` a peer is nobody: it gets a hello's worth of room, not a
            // prompt's, and no upload.
            Message::Text(t) if unauthenticated && t.len() > PRE_HELLO_MAX => {
                let _ = conn.out.send(close(1009, "message too big before hello")).await;
                break;
            }
            Message::Binary(_) if unauthenticated => {
                let _ = conn.out.send(close(1008, "not authenticated")).await;
                break;
            }
            Message::Text(t) => match admit_frame(&state, &conn, t.as_str()) {
                Ok(Some(job)) => {
                    tokio::spawn(run_job(job));
                }
                Ok(None) => {}
                // Refusals wait for room in the outbound queue: a flood slows its own reads.
                Err(refusal) => {
                    let _ = conn.out.send(text(&refusal)).await;
                }
            },
            // An upload's bytes; one whose id matches no upload in flight is a typed error
            // and the connection goes on. (Cloning `Bytes` shares the buffer.)
            Message::Binary(b) => {
                if let Err(stray) = conn.uploads.deliver(b) {
                    let refusal = RpcResponse::err(None, stray.error().0);
                    let _ = conn.out.send(text(&refusal)).await;
                }
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    // Closing handshake: if we sent a Close, wait (briefly) for the peer's, so that the
    // peer reads our close code before the socket goes away. A peer whose writes failed or
    // timed out is not waited for.
    if !writer_gone {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
            while let Some(Ok(m)) = stream.next().await {
                if matches!(m, Message::Close(_)) {
                    break;
                }
            }
        })
        .await;
    }
    conn.closed.cancel();
    conn.subs.lock().expect("conn lock").cancel_all();
    // The connection counts (per credential, or per address before hello) until its
    // writer has let go of the socket.
    let registration = conn.registration.lock().expect("conn lock").take();
    let pending = conn.pending.lock().expect("conn lock").take();
    drop(conn);
    let _ = writer.await;
    drop(stream);
    state.metrics.connections.with_label_values(&["client"]).dec();
    drop(registration);
    drop(pending);
}

/// Nesting depth of a JSON text (brackets outside strings), without parsing it.
fn json_depth(text: &str) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in text.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// A request that passed the per-frame checks, with what it holds while it runs.
struct Job {
    ctx: Ctx,
    req: Request,
    /// The connection's in-flight slot (None for subscriptions, which have their own count).
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
    /// A subscription's slot: its serial and cancellation token.
    sub: Option<(u64, CancellationToken)>,
}

/// Whether a decoded JSON value holds a NUL character anywhere (PostgreSQL text cannot).
/// Checked on decoded strings: the JSON text `\\u0000` is a backslash and `u0000`.
fn has_nul(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(a) => a.iter().any(has_nul),
        serde_json::Value::Object(o) => o.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

/// Per-frame checks, done in the read loop before anything is spawned, so that a client
/// that floods requests gets typed refusals and never piles up tasks: nesting depth, JSON,
/// the envelope, NUL characters (PostgreSQL text cannot hold them), the credential's request
/// rate, and a slot — in flight, or as a subscription under a request id not in use.
fn admit_frame(state: &AppState, conn: &Arc<Conn>, text_msg: &str) -> Result<Option<Job>, Box<RpcResponse>> {
    let fail = |id: Option<u32>, e: ApiError| Box::new(RpcResponse::err(id, e.0));
    let max_depth = state.config.limits.max_json_depth;
    if json_depth(text_msg) > max_depth {
        return Err(fail(
            None,
            ApiError::with(ErrorCode::PayloadTooLarge, json!({"limit": "depth", "max": max_depth})),
        ));
    }
    let value: serde_json::Value =
        serde_json::from_str(text_msg).map_err(|_| fail(None, ApiError::code(ErrorCode::ParseError)))?;
    let id = value
        .get("id")
        .and_then(|i| i.as_u64())
        .and_then(|i| u32::try_from(i).ok());
    let req: Request = match serde_json::from_value::<Request>(value) {
        Ok(r) if r.jsonrpc == "2.0" => r,
        _ => return Err(fail(id, ApiError::code(ErrorCode::InvalidRequest))),
    };
    // Notifications from clients carry nothing we act on.
    let Some(id) = req.id else { return Ok(None) };
    // An upload's binary message may follow at once: its slot exists before anything can
    // refuse the request (a refused upload's message is then swallowed, see `upload`).
    let upload = req.method == method::ContentUpload::NAME;
    if upload {
        conn.uploads.begin(id);
    }
    let refuse_upload = |e| {
        if upload {
            conn.uploads.end(id);
        }
        e
    };
    admit_checked(state, conn, req, id).map_err(refuse_upload)
}

/// The checks of [`admit_frame`] after the envelope.
fn admit_checked(state: &AppState, conn: &Arc<Conn>, req: Request, id: u32) -> Result<Option<Job>, Box<RpcResponse>> {
    let fail = |id: Option<u32>, e: ApiError| Box::new(RpcResponse::err(id, e.0));
    if has_nul(&req.params) {
        return Err(fail(
            Some(id),
            ApiError::with(ErrorCode::BadParams, json!({"reason": "nul-character"})),
        ));
    }
    let credential = conn
        .principal
        .lock()
        .expect("conn lock")
        .as_ref()
        .map(|p| p.credential_id.clone());
    if let Some(credential) = credential
        && let Err(wait) = state.request_limiter.check(&credential)
    {
        let ms = (wait.0.as_millis() as u64).max(1);
        return Err(fail(
            Some(id),
            ApiError::with(ErrorCode::RateLimited, json!({"limit": "requests", "retryAfterMs": ms})),
        ));
    }
    let (permit, sub) = if is_subscription(&req.method) {
        let sub = conn
            .subs
            .lock()
            .expect("conn lock")
            .reserve(id, &conn.closed, state.config.limits.max_subscriptions)
            .map_err(|e| fail(Some(id), e))?;
        (None, Some(sub))
    } else {
        let permit = conn.in_flight.clone().try_acquire_owned().map_err(|_| {
            fail(
                Some(id),
                ApiError::with(ErrorCode::RateLimited, json!({"limit": "in-flight"})),
            )
        })?;
        (Some(permit), None)
    };
    let ctx = Ctx {
        state: state.clone(),
        conn: conn.clone(),
        id: Some(id),
        op: None,
    };
    Ok(Some(Job {
        ctx,
        req,
        _permit: permit,
        sub,
    }))
}

/// Methods answered by a subscription (items until closed), as the protocol declares them.
fn is_subscription(method: &str) -> bool {
    berth_protocol::SUBSCRIPTION_NAMES.contains(&method)
}

async fn run_job(job: Job) {
    let Job { ctx, req, _permit, sub } = job;
    let started = Instant::now();
    let result = match &sub {
        // A subscription stops wherever it is (catching up included) once cancelled.
        Some((_, token)) => tokio::select! {
            r = dispatch(&ctx, &req.method, req.params) => r,
            _ = token.cancelled() => encode(&()),
        },
        None => dispatch(&ctx, &req.method, req.params).await,
    };
    if let (Some((serial, _)), Some(id)) = (&sub, ctx.id) {
        ctx.conn.subs.lock().expect("conn lock").finish(id, *serial);
    }
    if req.method == method::ContentUpload::NAME
        && let Some(id) = ctx.id
    {
        ctx.conn.uploads.end(id);
    }
    let code = match &result {
        Ok(_) => "ok",
        Err(e) => e.data_code(),
    };
    let label = if berth_protocol::METHOD_NAMES.contains(&req.method.as_str()) {
        req.method.as_str()
    } else {
        "unknown"
    };
    ctx.state.metrics.rpc_requests.with_label_values(&[label, code]).inc();
    ctx.state
        .metrics
        .rpc_duration
        .with_label_values(&[label])
        .observe(started.elapsed().as_secs_f64());
    respond(&ctx, ctx.id, result).await;
}

/// A method's result, already written out as JSON: the handler's typed result is
/// serialized once, straight into the text the response frame carries (no `Value` tree in
/// between, which for a history page of 200 rows was most of the encoding cost).
type Answer = Box<serde_json::value::RawValue>;

fn encode<T: serde::Serialize>(result: &T) -> ApiResult<Answer> {
    serde_json::value::to_raw_value(result).map_err(|_| ApiError::code(ErrorCode::Internal))
}

/// The success envelope around an [`Answer`], written once into a buffer of its size (a
/// history page is tens of kilobytes): the same text as serializing [`RpcResponse::ok`]
/// (its fields, in its order).
fn answered_text(id: Option<u32>, result: &serde_json::value::RawValue) -> String {
    use std::fmt::Write;
    let mut text = String::with_capacity(result.get().len() + 40);
    text.push_str(r#"{"jsonrpc":"2.0","id":"#);
    match id {
        Some(id) => {
            let _ = write!(text, "{id}");
        }
        None => text.push_str("null"),
    }
    text.push_str(r#","result":"#);
    text.push_str(result.get());
    text.push('}');
    text
}

async fn respond(ctx: &Ctx, id: Option<u32>, result: ApiResult<Answer>) {
    let msg = match result {
        Ok(result) => Message::Text(answered_text(id, &result).into()),
        Err(e) => text(&RpcResponse::err(id, e.0)),
    };
    let _ = ctx.conn.out.send(msg).await;
}

/// Decode params (null means `{}`), call the handler, encode the result.
async fn call<M, F, Fut>(ctx: &Ctx, params: serde_json::Value, f: F) -> ApiResult<Answer>
where
    M: Method,
    F: FnOnce(Ctx, M::Params) -> Fut,
    Fut: std::future::Future<Output = ApiResult<M::Result>>,
{
    let params = if params.is_null() { json!({}) } else { params };
    if receipts::is_mutation(M::NAME)
        && let Some(op) = params.get("operationId").and_then(|o| o.as_str()).map(str::to_string)
    {
        return encode(&receipts::with_receipt::<M, F, Fut>(ctx, params, op, f).await?);
    }
    decode_and_run::<M, F, Fut>(ctx.clone(), params, f).await
}

/// Decode params, run the handler, encode the result.
async fn decode_and_run<M, F, Fut>(ctx: Ctx, params: serde_json::Value, f: F) -> ApiResult<Answer>
where
    M: Method,
    F: FnOnce(Ctx, M::Params) -> Fut,
    Fut: std::future::Future<Output = ApiResult<M::Result>>,
{
    let result = f(ctx, decode::<M>(params)?).await?;
    encode(&result)
}

/// Typed params, or `bad-params` naming where they failed to decode.
pub(super) fn decode<M: Method>(params: serde_json::Value) -> ApiResult<M::Params> {
    serde_json::from_value(params).map_err(|e| {
        ApiError::with(
            ErrorCode::BadParams,
            json!({"method": M::NAME, "line": e.line(), "column": e.column()}),
        )
    })
}

/// [`call`] for a read whose handler writes its result's JSON itself (the text of
/// `M::Result`), straight from what it read.
async fn call_written<M, F, Fut>(ctx: &Ctx, params: serde_json::Value, f: F) -> ApiResult<Answer>
where
    M: Method,
    F: FnOnce(Ctx, M::Params) -> Fut,
    Fut: std::future::Future<Output = ApiResult<Answer>>,
{
    let params = if params.is_null() { json!({}) } else { params };
    f(ctx.clone(), decode::<M>(params)?).await
}

/// Every client method, by its declared name. A method before a successful `hello` (or an
/// authenticated upgrade) answers `unauthorized`.
async fn dispatch(ctx: &Ctx, name: &str, params: serde_json::Value) -> ApiResult<Answer> {
    if name == method::Hello::NAME {
        return call::<method::Hello, _, _>(ctx, params, connection::hello).await;
    }
    // Before sign-in every other name, known or not, is `unauthorized`: an anonymous peer
    // learns nothing about the method set.
    ctx.principal()?;
    if !berth_protocol::METHOD_NAMES.contains(&name) {
        return Err(ApiError::code(ErrorCode::MethodNotFound));
    }
    match name {
        method::Ping::NAME => call::<method::Ping, _, _>(ctx, params, connection::ping).await,
        method::Status::NAME => call::<method::Status, _, _>(ctx, params, connection::status).await,
        method::SubscriptionClose::NAME => {
            call::<method::SubscriptionClose, _, _>(ctx, params, connection::close).await
        }
        method::WorkspaceList::NAME => call::<method::WorkspaceList, _, _>(ctx, params, workspace::list).await,
        method::WorkspaceGet::NAME => call::<method::WorkspaceGet, _, _>(ctx, params, workspace::get).await,
        method::WorkspaceRename::NAME => call::<method::WorkspaceRename, _, _>(ctx, params, workspace::rename).await,
        method::WorkspaceRemove::NAME => call::<method::WorkspaceRemove, _, _>(ctx, params, workspace::remove).await,
        method::WorkspaceFiles::NAME => call::<method::WorkspaceFiles, _, _>(ctx, params, workspace::files).await,
        method::GitStatusGet::NAME => call::<method::GitStatusGet, _, _>(ctx, params, git::status).await,
        method::GitDiffGet::NAME => call::<method::GitDiffGet, _, _>(ctx, params, git::diff).await,
        method::PatchSnapshot::NAME => call::<method::PatchSnapshot, _, _>(ctx, params, patch::snapshot).await,
        method::PatchRead::NAME => call::<method::PatchRead, _, _>(ctx, params, patch::read).await,
        method::FilesList::NAME => call::<method::FilesList, _, _>(ctx, params, files::list).await,
        method::FilesWatch::NAME => call::<method::FilesWatch, _, _>(ctx, params, files::watch).await,
        method::FilesRead::NAME => call::<method::FilesRead, _, _>(ctx, params, files::read).await,
        method::SessionCreate::NAME => call::<method::SessionCreate, _, _>(ctx, params, session::create).await,
        method::SessionGet::NAME => call::<method::SessionGet, _, _>(ctx, params, session::get).await,
        method::SessionSend::NAME => call::<method::SessionSend, _, _>(ctx, params, session::send).await,
        method::SessionHistory::NAME => {
            call_written::<method::SessionHistory, _, _>(ctx, params, session::history).await
        }
        method::ContentUpload::NAME => call::<method::ContentUpload, _, _>(ctx, params, upload::content_upload).await,
        method::ContentRead::NAME => call::<method::ContentRead, _, _>(ctx, params, upload::content_read).await,
        method::SessionWatch::NAME => call::<method::SessionWatch, _, _>(ctx, params, session::watch).await,
        method::SessionList::NAME => call::<method::SessionList, _, _>(ctx, params, session::list).await,
        method::SessionRename::NAME => call::<method::SessionRename, _, _>(ctx, params, session::rename).await,
        method::SessionSetModel::NAME => call::<method::SessionSetModel, _, _>(ctx, params, session::set_model).await,
        method::SessionSetAgent::NAME => call::<method::SessionSetAgent, _, _>(ctx, params, agent::set_agent).await,
        method::SessionRemove::NAME => call::<method::SessionRemove, _, _>(ctx, params, session::remove).await,
        method::SessionClear::NAME => call::<method::SessionClear, _, _>(ctx, params, session::clear).await,
        method::SessionPause::NAME => call::<method::SessionPause, _, _>(ctx, params, session::pause).await,
        method::SessionStop::NAME => call::<method::SessionStop, _, _>(ctx, params, session::stop).await,
        method::SessionSource::NAME => call::<method::SessionSource, _, _>(ctx, params, session::source).await,
        method::SessionWatchDiagnostics::NAME => {
            call::<method::SessionWatchDiagnostics, _, _>(ctx, params, session::watch_diagnostics).await
        }
        method::SessionContext::NAME => call::<method::SessionContext, _, _>(ctx, params, session::context).await,
        method::SessionCompact::NAME => call::<method::SessionCompact, _, _>(ctx, params, session::compact).await,
        method::SessionSearch::NAME => call::<method::SessionSearch, _, _>(ctx, params, search::search).await,
        method::SessionFork::NAME => call::<method::SessionFork, _, _>(ctx, params, fork::fork).await,
        method::SessionForkReceipt::NAME => {
            call::<method::SessionForkReceipt, _, _>(ctx, params, fork::fork_receipt).await
        }
        method::SessionDiagnostics::NAME => {
            call::<method::SessionDiagnostics, _, _>(ctx, params, session::diagnostics).await
        }
        method::SessionPendingInteractions::NAME => {
            call::<method::SessionPendingInteractions, _, _>(ctx, params, interaction::pending).await
        }
        method::SessionInteraction::NAME => {
            call::<method::SessionInteraction, _, _>(ctx, params, interaction::get).await
        }
        method::SessionRespond::NAME => call::<method::SessionRespond, _, _>(ctx, params, interaction::respond).await,
        method::QueueUpdate::NAME => call::<method::QueueUpdate, _, _>(ctx, params, queue::update).await,
        method::QueueMove::NAME => call::<method::QueueMove, _, _>(ctx, params, queue::move_entry).await,
        method::QueueRemove::NAME => call::<method::QueueRemove, _, _>(ctx, params, queue::remove).await,
        method::QueueGet::NAME => call::<method::QueueGet, _, _>(ctx, params, queue::get).await,
        method::OperationReceipt::NAME => call::<method::OperationReceipt, _, _>(ctx, params, receipts::receipt).await,
        method::AdminCredentialCreate::NAME => {
            call::<method::AdminCredentialCreate, _, _>(ctx, params, admin::credential_create).await
        }
        method::AdminCredentialList::NAME => {
            call::<method::AdminCredentialList, _, _>(ctx, params, admin::credential_list).await
        }
        method::AdminCredentialRevoke::NAME => {
            call::<method::AdminCredentialRevoke, _, _>(ctx, params, admin::credential_revoke).await
        }
        method::AdminUserCreate::NAME => call::<method::AdminUserCreate, _, _>(ctx, params, admin::user_create).await,
        method::AdminUserList::NAME => call::<method::AdminUserList, _, _>(ctx, params, admin::user_list).await,
        method::AdminUserDisable::NAME => {
            call::<method::AdminUserDisable, _, _>(ctx, params, admin::user_disable).await
        }
        method::AdminStatusGet::NAME => call::<method::AdminStatusGet, _, _>(ctx, params, admin::status).await,
        method::AdminUserSetRole::NAME => {
            call::<method::AdminUserSetRole, _, _>(ctx, params, admin::user_set_role).await
        }
        method::AdminAuditList::NAME => call::<method::AdminAuditList, _, _>(ctx, params, admin::audit_list).await,
        method::AdminWorkerList::NAME => call::<method::AdminWorkerList, _, _>(ctx, params, admin::worker_list).await,
        method::AgentList::NAME => call::<method::AgentList, _, _>(ctx, params, agent::list).await,
        method::AgentGet::NAME => call::<method::AgentGet, _, _>(ctx, params, agent::get).await,
        method::AgentSave::NAME => call::<method::AgentSave, _, _>(ctx, params, agent::save).await,
        method::AgentRemove::NAME => call::<method::AgentRemove, _, _>(ctx, params, agent::remove).await,
        method::SkillList::NAME => call::<method::SkillList, _, _>(ctx, params, skill::list).await,
        method::SkillGet::NAME => call::<method::SkillGet, _, _>(ctx, params, skill::get).await,
        method::SkillSave::NAME => call::<method::SkillSave, _, _>(ctx, params, skill::save).await,
        method::SkillRemove::NAME => call::<method::SkillRemove, _, _>(ctx, params, skill::remove).await,
        method::McpList::NAME => call::<method::McpList, _, _>(ctx, params, mcp::list).await,
        method::McpSave::NAME => call::<method::McpSave, _, _>(ctx, params, mcp::save).await,
        method::McpRemove::NAME => call::<method::McpRemove, _, _>(ctx, params, mcp::remove).await,
        _ => Err(ApiError::with(ErrorCode::Internal, json!({}))).inspect_err(|_| {
            tracing::error!(method = name, "declared method has no handler");
        }),
    }
}

/// Error when the subscription's connection is gone.
pub fn gone() -> RpcError {
    RpcError::new(ErrorCode::Unavailable)
}

/// The bytes of a stored blob of `total` bytes from the cursor `after` (a byte offset as a
/// string; absent: the start), at most `page` of them, read by byte range on any replica.
/// Returns the page's offset and bytes; a cursor past the end is `bad-params {field:"after"}`.
pub(super) async fn blob_page(
    ctx: &Ctx,
    key: &str,
    total: u64,
    after: Option<&str>,
    page: usize,
) -> ApiResult<(u64, bytes::Bytes)> {
    let offset = match after {
        None => 0,
        Some(a) => a
            .parse::<u64>()
            .ok()
            .filter(|o| *o <= total)
            .ok_or_else(|| ApiError::with(ErrorCode::BadParams, json!({"field": "after"})))?,
    };
    let end = (offset + page as u64).min(total);
    if offset == end {
        return Ok((offset, bytes::Bytes::new()));
    }
    let data = ctx.state.blobs.get_range(key, offset..end).await.map_err(|e| {
        tracing::warn!(error = %e, "object store read failed");
        ApiError::code(ErrorCode::Unavailable)
    })?;
    if data.len() as u64 != end - offset {
        tracing::warn!("object store returned a short range");
        return Err(ApiError::code(ErrorCode::Unavailable));
    }
    Ok((offset, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raw_item_is_written_as_the_serialized_notification() {
        let item =
            serde_json::value::RawValue::from_string(r#"{"type":"chunk","offset":0,"dataBase64":"aGk="}"#.into())
                .unwrap();
        for id in [Some(7), None] {
            #[derive(serde::Serialize)]
            struct Params<'a> {
                id: Option<u32>,
                item: &'a serde_json::value::RawValue,
            }
            let serialized =
                serde_json::to_value(NotificationRef::new(SUBSCRIPTION_ITEM, Params { id, item: &item })).unwrap();
            let written: serde_json::Value = serde_json::from_str(&item_text(id, &item)).unwrap();
            assert_eq!(written, serialized);
        }
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            bearer(&h).map(str::to_owned)
        };
        for v in ["Bearer tok", "bearer tok", "BEARER tok", "  bEaReR   tok "] {
            assert_eq!(with(v).as_deref(), Some("tok"), "{v:?}");
        }
        for v in ["Basic tok", "Bearertok", "Bearer", "tok"] {
            assert_eq!(with(v), None, "{v:?}");
        }
    }

    #[test]
    fn only_listed_origins_and_the_servers_own_may_open_the_socket() {
        let listed = vec!["https://editor.example".to_string()];
        let ok = |o: &str, h: Option<&str>| origin_allowed(o, h, &listed);
        assert!(ok("https://editor.example", Some("berth.example")));
        // The console, served by the server itself.
        assert!(ok("https://berth.example", Some("berth.example")));
        assert!(ok("http://127.0.0.1:8790", Some("127.0.0.1:8790")));
        assert!(ok("http://Berth.Example:8443", Some("berth.example:8443")));
        // Anything else: another site, another port, a suffix trick, no Host, opaque origins.
        assert!(!ok("https://evil.example", Some("berth.example")));
        assert!(!ok("http://127.0.0.1:9999", Some("127.0.0.1:8790")));
        assert!(!ok("https://berth.example.evil.example", Some("berth.example")));
        assert!(!ok("https://berth.example/x", Some("berth.example")));
        assert!(!ok("https://berth.example", None));
        assert!(!ok("null", Some("null")));
        assert!(!ok("file://", Some("")));
    }

    #[test]
    fn nul_is_checked_in_decoded_strings() {
        let parse = |t: &str| serde_json::from_str::<serde_json::Value>(t).unwrap();
        // The JSON text `\\u0000`: a backslash followed by `u0000`, legitimate.
        assert!(!has_nul(&parse(r#"{"prompt": "type \\u0000 here"}"#)));
        assert!(has_nul(&parse(r#"{"prompt": "a\u0000b"}"#)));
        assert!(has_nul(&parse(r#"{"a": [1, {"b": ["x\u0000"]}]}"#)));
        assert!(has_nul(&parse(r#"{"k\u0000": 1}"#)));
        assert!(!has_nul(&parse(r#"{"a": [1, null, true, "ok"]}"#)));
    }

    /// `subscription.close` does not free the slot: it stays taken (and counted) until its
    /// own task ends, and a finished task never frees a slot that is no longer its own.
    #[test]
    fn subscription_slots_are_freed_only_by_their_task() {
        let parent = CancellationToken::new();
        let mut subs = Subs::default();
        let (a, token_a) = subs.reserve(7, &parent, 1).unwrap();
        assert!(subs.close(7));
        assert!(token_a.is_cancelled());
        // Still running: the id is in use and the slot counts.
        assert_eq!(subs.reserve(7, &parent, 2).unwrap_err().data_code(), "bad-params");
        assert_eq!(subs.reserve(8, &parent, 1).unwrap_err().data_code(), "rate-limited");
        subs.finish(7, a);
        let (b, token_b) = subs.reserve(7, &parent, 1).unwrap();
        // A stale finish (the old task's serial) leaves the new slot alone.
        subs.finish(7, a);
        assert!(subs.get(&7).is_some());
        assert!(!token_b.is_cancelled());
        subs.finish(7, b);
        assert!(subs.get(&7).is_none());
        assert!(!subs.close(7));
    }

    /// The outbound queue holds at most its byte budget; a message larger than the whole
    /// budget still goes out alone.
    #[tokio::test]
    async fn outbound_queue_is_bounded_in_bytes() {
        let (out, mut rx) = Outbound::new(64 << 10);
        let msg = || Message::Text("x".repeat(1000).into());
        let mut queued = 0;
        while out.try_send(msg()) {
            queued += 1;
        }
        assert!(queued * 1000 <= 64 << 10, "{queued}");
        assert!(queued >= 50, "{queued}");
        // Writing one frees its bytes.
        drop(rx.recv().await);
        assert!(out.try_send(msg()));
        assert!(!out.try_send(msg()));
        while rx.try_recv().is_ok() {}
        assert!(out.send(Message::Text("y".repeat(1 << 20).into())).await);
        assert!(!out.try_send(msg()), "the oversized message takes the whole budget");
        drop(rx.recv().await);
        // Once the writer has ended, senders give up instead of waiting.
        out.budget.close();
        assert!(!out.send(msg()).await);
    }
    /// A result written once (no `Value` in between) goes out as the same response as the
    /// `Value` it stands for, for a struct result and for `null` (keys now in the struct's
    /// order rather than sorted, as JSON leaves it open).
    #[test]
    fn written_results_make_the_same_response_text() {
        let page = berth_protocol::SessionHistoryResult {
            through: 7,
            rows: Vec::new(),
            next_after: Some(berth_protocol::Position {
                source_sequence: 3,
                item_index: 1,
            }),
        };
        for (written, value) in [
            (encode(&page).unwrap(), serde_json::to_value(&page).unwrap()),
            (encode(&()).unwrap(), serde_json::Value::Null),
        ] {
            for id in [Some(9), None] {
                let Message::Text(old) = text(&RpcResponse::ok(id, value.clone())) else {
                    panic!("text")
                };
                let parse = |t: &str| serde_json::from_str::<serde_json::Value>(t).unwrap();
                assert_eq!(parse(&answered_text(id, &written)), parse(old.as_str()));
            }
        }
    }

    /// Every declared method must appear in the dispatcher's match.
    #[test]
    fn every_declared_method_is_dispatched() {
        let src = include_str!("mod.rs");
        let dispatch = &src[src.find("async fn dispatch").expect("dispatch")..];
        for (name, ty) in berth_protocol::METHOD_NAMES.iter().zip(METHOD_TYPES) {
            assert!(
                dispatch.contains(&format!("method::{ty}::NAME")),
                "{name} ({ty}) is not dispatched"
            );
        }
    }

    const METHOD_TYPES: &[&str] = &[
        "Hello",
        "Ping",
        "Status",
        "WorkspaceList",
        "WorkspaceGet",
        "WorkspaceRename",
        "WorkspaceRemove",
        "WorkspaceFiles",
        "GitStatusGet",
        "GitDiffGet",
        "PatchSnapshot",
        "PatchRead",
        "FilesList",
        "FilesWatch",
        "FilesRead",
        "SessionCreate",
        "SessionGet",
        "SessionSend",
        "ContentUpload",
        "ContentRead",
        "SessionHistory",
        "SessionWatch",
        "SubscriptionClose",
        "SessionList",
        "SessionRename",
        "SessionSetModel",
        "SessionSetAgent",
        "SessionRemove",
        "SessionClear",
        "SessionPause",
        "SessionStop",
        "SessionSource",
        "SessionSearch",
        "SessionFork",
        "SessionForkReceipt",
        "SessionDiagnostics",
        "SessionWatchDiagnostics",
        "SessionContext",
        "SessionCompact",
        "SessionPendingInteractions",
        "SessionInteraction",
        "SessionRespond",
        "QueueUpdate",
        "QueueMove",
        "QueueRemove",
        "QueueGet",
        "OperationReceipt",
        "AdminCredentialCreate",
        "AdminCredentialList",
        "AdminCredentialRevoke",
        "AdminUserCreate",
        "AdminUserList",
        "AdminUserDisable",
        "AdminStatusGet",
        "AdminUserSetRole",
        "AdminAuditList",
        "AdminWorkerList",
        "AgentList",
        "AgentGet",
        "AgentSave",
        "AgentRemove",
        "SkillList",
        "SkillGet",
        "SkillSave",
        "SkillRemove",
        "McpList",
        "McpSave",
        "McpRemove",
    ];

    #[test]
    fn method_names_are_unique() {
        let mut names = berth_protocol::METHOD_NAMES.to_vec();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), berth_protocol::METHOD_NAMES.len());
        assert_eq!(names.len(), METHOD_TYPES.len());
    }
}
