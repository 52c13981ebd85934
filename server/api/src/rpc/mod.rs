//! The client WebSocket (`GET /v1/rpc`): JSON-RPC 2.0, one message per text frame.
//!
//! Authentication is the `Authorization` header on the upgrade (HTTP 401 when wrong) or a
//! `hello` request. Every request runs as its own task; responses and subscription items
//! go through one bounded outbound queue drained by a writer task, so a slow client slows
//! its own subscriptions (which then read from the database at their own pace) and never
//! makes the server buffer without bound.

mod admin;
mod connection;
mod fork;
mod queue;
mod receipts;
mod search;
mod session;
mod workspace;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Instant,
};

use axum::{
    extract::{
        State, WebSocketUpgrade,
        ws::{CloseFrame, Message, WebSocket},
    },
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
};
use berth_protocol::{
    ErrorCode, Method, RpcError,
    jsonrpc::{Request, Response as RpcResponse, SUBSCRIPTION_ITEM},
    method,
};
use berth_store::{CredentialKind, Principal};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{
    AppState,
    error::{ApiError, ApiResult},
};

/// Outbound messages queued per connection before senders wait.
const OUTBOUND_QUEUE: usize = 512;

/// The bearer token of an `Authorization` header.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

pub async fn upgrade(State(state): State<AppState>, headers: HeaderMap, ws: WebSocketUpgrade) -> Response {
    if let Some(origin) = headers.get(header::ORIGIN) {
        let allowed = origin
            .to_str()
            .is_ok_and(|o| state.config.allowed_origins.iter().any(|a| a == o));
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
            .has_room(&p.credential_id, state.config.limits.max_connections_per_credential)
    {
        return StatusCode::TOO_MANY_REQUESTS.into_response();
    }
    // Leave room above the limit so that an oversized message is refused by us, with 1009.
    let max = state.config.max_text_message.saturating_add(64 << 10);
    ws.max_message_size(max)
        .max_frame_size(max)
        .on_upgrade(move |socket| run(state, principal, socket))
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

/// Per-connection state.
pub struct Conn {
    pub principal: Mutex<Option<Principal>>,
    pub out: mpsc::Sender<Message>,
    /// Open subscriptions by request id.
    pub subs: Mutex<HashMap<u32, CancellationToken>>,
    pub closed: CancellationToken,
    /// Cancelled when the principal is revoked (credential revoked, user disabled).
    pub revoked: CancellationToken,
    /// This connection's entry in the replica's connection registry.
    pub registration: Mutex<Option<crate::connections::Registration>>,
    /// Requests being answered (subscriptions excluded).
    pub in_flight: Arc<tokio::sync::Semaphore>,
}

impl Conn {
    /// Authenticate the connection as `principal` (registering it for revocation and the
    /// per-credential connection limit).
    pub fn sign_in(&self, state: &AppState, principal: Principal) -> ApiResult<()> {
        let max = state.config.limits.max_connections_per_credential;
        let mut reg = self.registration.lock().expect("conn lock");
        // Replacing the registration drops (unregisters) the previous one.
        reg.take();
        let registration = crate::connections::Registration::new(state, &principal, max, self.revoked.clone())
            .ok_or_else(|| ApiError::with(ErrorCode::RateLimited, json!({"limit": "connections"})))?;
        *reg = Some(registration);
        *self.principal.lock().expect("conn lock") = Some(principal);
        Ok(())
    }
}

impl Ctx {
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
        let note = Request::notification(SUBSCRIPTION_ITEM, json!({"id": self.id, "item": item}));
        self.conn.out.send(text(&note)).await.is_ok()
    }
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

async fn run(state: AppState, principal: Option<Principal>, socket: WebSocket) {
    state.metrics.connections.with_label_values(&["client"]).inc();
    let limits = state.config.limits.clone();
    let (mut sink, mut stream) = socket.split();
    let (tx, mut rx) = mpsc::channel::<Message>(OUTBOUND_QUEUE);
    let conn = Arc::new(Conn {
        principal: Mutex::new(None),
        out: tx,
        subs: Mutex::new(HashMap::new()),
        closed: CancellationToken::new(),
        revoked: CancellationToken::new(),
        registration: Mutex::new(None),
        in_flight: Arc::new(tokio::sync::Semaphore::new(limits.max_in_flight)),
    });
    if let Some(p) = principal
        && conn.sign_in(&state, p).is_err()
    {
        let _ = sink.send(close(1008, "too many connections")).await;
        state.metrics.connections.with_label_values(&["client"]).dec();
        return;
    }
    let writer = tokio::spawn(async move {
        while let Some(msg) = rx.recv().await {
            let last = matches!(msg, Message::Close(_));
            if sink.send(msg).await.is_err() || last {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let mut ping = tokio::time::interval(limits.ping_interval);
    let mut last_heard = Instant::now();
    loop {
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
            _ = conn.revoked.cancelled() => {
                let _ = conn.out.send(close(1008, "revoked")).await;
                break;
            }
            _ = state.shutdown.cancelled() => {
                let _ = conn.out.send(close(1001, "shutting down")).await;
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
        match msg {
            Message::Text(t) if t.len() > state.config.max_text_message => {
                let _ = conn.out.send(close(1009, "message too big")).await;
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
            // No upload is in flight (content.upload is not offered yet): drop the connection.
            Message::Binary(_) => {
                let _ = conn.out.send(close(1003, "unexpected binary message")).await;
                break;
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    // Closing handshake: if we sent a Close, wait (briefly) for the peer's, so that the
    // peer reads our close code before the socket goes away.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
        while let Some(Ok(m)) = stream.next().await {
            if matches!(m, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
    conn.closed.cancel();
    for (_, sub) in conn.subs.lock().expect("conn lock").drain() {
        sub.cancel();
    }
    conn.registration.lock().expect("conn lock").take();
    drop(conn);
    let _ = writer.await;
    state.metrics.connections.with_label_values(&["client"]).dec();
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
    if text_msg.contains("\\u0000") {
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
    let permit = if req.method == method::SessionWatch::NAME {
        let mut subs = conn.subs.lock().expect("conn lock");
        if subs.contains_key(&id) {
            return Err(fail(
                Some(id),
                ApiError::with(ErrorCode::BadParams, json!({"reason": "id-in-use"})),
            ));
        }
        if subs.len() >= state.config.limits.max_subscriptions {
            return Err(fail(
                Some(id),
                ApiError::with(ErrorCode::RateLimited, json!({"limit": "subscriptions"})),
            ));
        }
        subs.insert(id, conn.closed.child_token());
        None
    } else {
        let permit = conn.in_flight.clone().try_acquire_owned().map_err(|_| {
            fail(
                Some(id),
                ApiError::with(ErrorCode::RateLimited, json!({"limit": "in-flight"})),
            )
        })?;
        Some(permit)
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
    }))
}

async fn run_job(job: Job) {
    let Job { ctx, req, _permit } = job;
    let started = Instant::now();
    let result = dispatch(&ctx, &req.method, req.params).await;
    if req.method == method::SessionWatch::NAME
        && let Some(id) = ctx.id
    {
        ctx.conn.subs.lock().expect("conn lock").remove(&id);
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

async fn respond(ctx: &Ctx, id: Option<u32>, result: ApiResult<serde_json::Value>) {
    let resp = match result {
        Ok(v) => RpcResponse::ok(id, v),
        Err(e) => RpcResponse::err(id, e.0),
    };
    let _ = ctx.conn.out.send(text(&resp)).await;
}

/// Decode params (null means `{}`), call the handler, encode the result.
async fn call<M, F, Fut>(ctx: &Ctx, params: serde_json::Value, f: F) -> ApiResult<serde_json::Value>
where
    M: Method,
    F: FnOnce(Ctx, M::Params) -> Fut,
    Fut: std::future::Future<Output = ApiResult<M::Result>>,
{
    let params = if params.is_null() { json!({}) } else { params };
    if receipts::is_mutation(M::NAME)
        && let Some(op) = params.get("operationId").and_then(|o| o.as_str()).map(str::to_string)
    {
        return receipts::with_receipt::<M, F, Fut>(ctx, params, op, f).await;
    }
    decode_and_run::<M, F, Fut>(ctx.clone(), params, f).await
}

/// Decode params, run the handler, encode the result.
async fn decode_and_run<M, F, Fut>(ctx: Ctx, params: serde_json::Value, f: F) -> ApiResult<serde_json::Value>
where
    M: Method,
    F: FnOnce(Ctx, M::Params) -> Fut,
    Fut: std::future::Future<Output = ApiResult<M::Result>>,
{
    let params: M::Params = serde_json::from_value(params).map_err(|e| {
        ApiError::with(
            ErrorCode::BadParams,
            json!({"method": M::NAME, "line": e.line(), "column": e.column()}),
        )
    })?;
    let result = f(ctx, params).await?;
    serde_json::to_value(result).map_err(|_| ApiError::code(ErrorCode::Internal))
}

/// Every client method, by its declared name. A method before a successful `hello` (or an
/// authenticated upgrade) answers `unauthorized`.
async fn dispatch(ctx: &Ctx, name: &str, params: serde_json::Value) -> ApiResult<serde_json::Value> {
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
        method::SessionCreate::NAME => call::<method::SessionCreate, _, _>(ctx, params, session::create).await,
        method::SessionGet::NAME => call::<method::SessionGet, _, _>(ctx, params, session::get).await,
        method::SessionSend::NAME => call::<method::SessionSend, _, _>(ctx, params, session::send).await,
        method::SessionHistory::NAME => call::<method::SessionHistory, _, _>(ctx, params, session::history).await,
        method::SessionWatch::NAME => call::<method::SessionWatch, _, _>(ctx, params, session::watch).await,
        method::SessionList::NAME => call::<method::SessionList, _, _>(ctx, params, session::list).await,
        method::SessionRename::NAME => call::<method::SessionRename, _, _>(ctx, params, session::rename).await,
        method::SessionSetModel::NAME => call::<method::SessionSetModel, _, _>(ctx, params, session::set_model).await,
        method::SessionRemove::NAME => call::<method::SessionRemove, _, _>(ctx, params, session::remove).await,
        method::SessionClear::NAME => call::<method::SessionClear, _, _>(ctx, params, session::clear).await,
        method::SessionPause::NAME => call::<method::SessionPause, _, _>(ctx, params, session::pause).await,
        method::SessionStop::NAME => call::<method::SessionStop, _, _>(ctx, params, session::stop).await,
        method::SessionSource::NAME => call::<method::SessionSource, _, _>(ctx, params, session::source).await,
        method::SessionSearch::NAME => call::<method::SessionSearch, _, _>(ctx, params, search::search).await,
        method::SessionFork::NAME => call::<method::SessionFork, _, _>(ctx, params, fork::fork).await,
        method::SessionForkReceipt::NAME => {
            call::<method::SessionForkReceipt, _, _>(ctx, params, fork::fork_receipt).await
        }
        method::SessionDiagnostics::NAME => {
            call::<method::SessionDiagnostics, _, _>(ctx, params, session::diagnostics).await
        }
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
        _ => Err(ApiError::with(ErrorCode::Internal, json!({}))).inspect_err(|_| {
            tracing::error!(method = name, "declared method has no handler");
        }),
    }
}

/// Error when the subscription's connection is gone.
pub fn gone() -> RpcError {
    RpcError::new(ErrorCode::Unavailable)
}

#[cfg(test)]
mod tests {
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
        "SessionCreate",
        "SessionGet",
        "SessionSend",
        "SessionHistory",
        "SessionWatch",
        "SubscriptionClose",
        "SessionList",
        "SessionRename",
        "SessionSetModel",
        "SessionRemove",
        "SessionClear",
        "SessionPause",
        "SessionStop",
        "SessionSource",
        "SessionSearch",
        "SessionFork",
        "SessionForkReceipt",
        "SessionDiagnostics",
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
