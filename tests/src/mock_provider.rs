//! A scripted mock model provider for end-to-end tests.
//!
//! [`MockProvider`] is a real HTTP server bound to `127.0.0.1:0` that speaks the
//! OpenAI Chat Completions *streaming* format on `POST /v1/chat/completions`
//! (and `POST /chat/completions`). Each request pops the next scripted
//! [`Reply`] from a FIFO queue; when the queue is empty the request is answered
//! with HTTP 500 and `{"error":{"message":"mock provider: no scripted reply"}}`.
//!
//! Streams are sent as Server-Sent Events (`Content-Type: text/event-stream`),
//! one `data: {json}\n\n` event per chunk, terminated by `data: [DONE]\n\n`.
//! The body is produced lazily, so [`Part::Delay`] really pauses the wire.
//!
//! The server shuts down when the [`MockProvider`] is dropped; streams that are
//! hanging ([`Reply::StreamThenHang`]) are ended at that point too.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tokio::sync::{oneshot, watch};

/// One scripted answer to one request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// Stream these parts in order (each part = one or more SSE chunks), then a
    /// finish-reason chunk (`"tool_calls"` if any [`Part::ToolCall`] is present,
    /// else `"stop"`), then any [`Part::Usage`] chunks, then `data: [DONE]`.
    Stream(Vec<Part>),
    /// Answer with this HTTP status and a JSON error body (not streaming).
    Status(u16),
    /// Stream the given parts exactly in order (no finish chunk, no `[DONE]`),
    /// then hang until the client disconnects or the provider is dropped.
    StreamThenHang(Vec<Part>),
    /// Answer with this HTTP status, a JSON error body and `Retry-After: secs`.
    StatusRetryAfter { status: u16, secs: u64 },
    /// Answer `307 Temporary Redirect` to this URL (a client that follows it sends the same
    /// request there, body and all).
    Redirect(String),
    /// The reply computed from the request's JSON body (e.g. from tool results the test
    /// cannot know in advance, like the ids of sessions a turn started).
    Computed(Compute),
}

/// A function from a request body to the reply (see [`Reply::Computed`]).
#[derive(Clone)]
pub struct Compute(pub Arc<dyn Fn(&Value) -> Reply + Send + Sync>);

impl std::fmt::Debug for Compute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Compute(..)")
    }
}

/// The wire format a request came in on (by its path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `POST …/chat/completions`: OpenAI Chat Completions chunks, `data: [DONE]`.
    Chat,
    /// `POST …/responses`: OpenAI Responses API typed events, ending `response.completed`.
    Responses,
    /// `POST …/messages`: Anthropic Messages content-block events, ending `message_stop`.
    Anthropic,
}

/// One piece of a streamed reply.
#[derive(Debug, Clone)]
pub enum Part {
    /// One chunk with `delta.content`.
    Text(String),
    /// One chunk with `delta.reasoning_content`.
    Reasoning(String),
    /// A tool call whose `arguments` string is split into the given pieces, one
    /// chunk each; the first chunk also carries `id`, `type: "function"` and
    /// `function.name`. With no pieces, a single chunk with `arguments: ""`.
    ToolCall {
        index: u32,
        id: String,
        name: String,
        argument_pieces: Vec<String>,
    },
    /// A usage chunk (`"choices": []`, `"usage": {...}`).
    Usage { prompt: u64, completion: u64 },
    /// Pause between chunks, in milliseconds (lets tests observe live deltas).
    Delay(u64),
    /// One chunk with `delta.content` = `<µs since [`epoch`]>` taken as it is sent, so that
    /// a reader in the same process can tell how long the chunk took to reach it.
    Stamp,
}

/// Text every compaction summary request of Berth's holds (its instruction), for
/// [`MockProvider::push_matching`]: scripted turns stay in order whether or not a turn compacts.
pub const SUMMARY_REQUEST: &str = "You compact a long conversation";

/// The process-wide instant that [`Part::Stamp`] counts from.
pub fn epoch() -> std::time::Instant {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(std::time::Instant::now)
}

impl Part {
    /// A tool call whose JSON `arguments` are sent in pieces of at most `piece` bytes.
    pub fn tool_call(index: u32, id: &str, name: &str, arguments: &Value, piece: usize) -> Part {
        let text = arguments.to_string();
        let mut pieces = Vec::new();
        let mut rest = text.as_str();
        while !rest.is_empty() {
            let mut end = rest.len().min(piece.max(1));
            while !rest.is_char_boundary(end) {
                end += 1;
            }
            pieces.push(rest[..end].to_owned());
            rest = &rest[end..];
        }
        Part::ToolCall {
            index,
            id: id.to_owned(),
            name: name.to_owned(),
            argument_pieces: pieces,
        }
    }
}

impl Reply {
    /// One step that calls the given tools (each `(id, name, arguments)`), the arguments
    /// split into pieces of at most `piece` bytes.
    pub fn tools(calls: &[(&str, &str, Value)], piece: usize) -> Reply {
        let parts = calls
            .iter()
            .enumerate()
            .map(|(i, (id, name, args))| Part::tool_call(i as u32, id, name, args, piece))
            .collect();
        Reply::Stream(parts)
    }

    /// A reply computed from the request body.
    pub fn computed(f: impl Fn(&Value) -> Reply + Send + Sync + 'static) -> Reply {
        Reply::Computed(Compute(Arc::new(f)))
    }

    /// A stream of `Text` parts followed by `Usage { prompt: 10, completion: 5 }`.
    pub fn text(chunks: &[&str]) -> Reply {
        let mut parts: Vec<Part> = chunks.iter().map(|c| Part::Text((*c).to_owned())).collect();
        parts.push(Part::Usage {
            prompt: 10,
            completion: 5,
        });
        Reply::Stream(parts)
    }
}

#[derive(Default)]
struct Shared {
    replies: Mutex<VecDeque<Reply>>,
    /// Replies for requests whose whole JSON body contains a text, tried first.
    matching: Mutex<Vec<(String, Reply)>>,
    /// Replies reserved for requests whose first user message contains the key, in order
    /// per key; they go before the shared queue.
    keyed: Mutex<Vec<(String, Reply)>>,
    requests: Mutex<Vec<Value>>,
    authorizations: Mutex<Vec<Option<String>>>,
    /// Every request's credential header (`Authorization` or `x-api-key`) and format.
    credentials: Mutex<Vec<(Format, Option<String>)>>,
    counter: AtomicU64,
}

struct AppState {
    shared: Arc<Shared>,
    /// Resolves (changes or closes) when the provider is dropped.
    closed: watch::Receiver<()>,
}

/// Locks a mutex, ignoring poisoning (a panicking test must not cascade).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running scripted provider. Dropping it stops the server.
pub struct MockProvider {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    _closed: watch::Sender<()>,
}

impl MockProvider {
    /// Binds `127.0.0.1:0` and starts serving in a background task.
    pub async fn start() -> MockProvider {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("mock provider: bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("mock provider: local_addr");
        let shared = Arc::new(Shared::default());
        let (closed_tx, closed_rx) = watch::channel(());
        let state = Arc::new(AppState {
            shared: shared.clone(),
            closed: closed_rx,
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(handle))
            .route("/chat/completions", post(handle))
            .route("/v1/responses", post(handle_responses))
            .route("/responses", post(handle_responses))
            .route("/v1/messages", post(handle_messages))
            .route("/messages", post(handle_messages))
            // Conversations past 2 MB are legitimate; a real provider takes them too.
            .layer(axum::extract::DefaultBodyLimit::disable())
            .with_state(state);
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
        // Like a real provider: each chunk goes out as it is written (no Nagle delay).
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = shutdown_rx.await;
                })
                .await;
        });
        MockProvider {
            addr,
            shared,
            shutdown: Some(shutdown_tx),
            _closed: closed_tx,
        }
    }

    /// `http://127.0.0.1:PORT/v1`
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Queues a scripted reply; replies are consumed one per request, FIFO.
    pub fn push(&self, reply: Reply) {
        lock(&self.shared.replies).push_back(reply);
    }

    /// Queues a reply for the first later request whose JSON body contains `needle` (such
    /// replies are tried before keyed ones and the shared queue, in the order pushed).
    pub fn push_matching(&self, needle: &str, reply: Reply) {
        lock(&self.shared.matching).push((needle.to_owned(), reply));
    }

    /// Queues a reply for the next request whose first user message contains `key`
    /// (so that sessions running at once each get their own script).
    pub fn push_for(&self, key: &str, reply: Reply) {
        lock(&self.shared.keyed).push((key.to_owned(), reply));
    }

    /// JSON bodies of the requests received so far, in order (a body that is
    /// not valid JSON is recorded as a JSON string of its raw text).
    pub fn requests(&self) -> Vec<Value> {
        lock(&self.shared.requests).clone()
    }

    /// The `Authorization` header of each request received so far, in order.
    pub fn authorizations(&self) -> Vec<Option<String>> {
        lock(&self.shared.authorizations).clone()
    }

    /// Each request's format and credential (`Authorization`, else `x-api-key`), in order.
    pub fn credentials(&self) -> Vec<(Format, Option<String>)> {
        lock(&self.shared.credentials).clone()
    }
}

impl Drop for MockProvider {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        // `_closed` is dropped right after this, which ends hanging streams.
    }
}

/// The text of a request's first user message (chat format; empty if none).
fn first_user_text(body: &Value) -> String {
    let Some(m) = body["messages"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["role"] == "user"))
    else {
        return String::new();
    };
    match &m["content"] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn error_response(status: StatusCode, message: &str) -> Response {
    let body = json!({
        "error": {
            "message": message,
            "type": "mock_error",
            "param": null,
            "code": status.as_u16(),
        }
    });
    (status, axum::Json(body)).into_response()
}

async fn handle(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    serve_format(state, headers, body, Format::Chat).await
}

async fn handle_responses(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    serve_format(state, headers, body, Format::Responses).await
}

async fn handle_messages(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    serve_format(state, headers, body, Format::Anthropic).await
}

async fn serve_format(state: Arc<AppState>, headers: HeaderMap, body: Bytes, format: Format) -> Response {
    let shared = &state.shared;
    let value: Value =
        serde_json::from_slice(&body).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    let model = value
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("mock-model")
        .to_owned();
    let auth = headers
        .get(header::AUTHORIZATION)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    // Record both under the reply lock so the three logs stay aligned.
    let reply = {
        let mut replies = lock(&shared.replies);
        lock(&shared.requests).push(value.clone());
        let credential = auth.clone().or_else(|| {
            headers
                .get("x-api-key")
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        });
        lock(&shared.credentials).push((format, credential));
        lock(&shared.authorizations).push(auth);
        let text = String::from_utf8_lossy(&body);
        let mut matching = lock(&shared.matching);
        let first_user = first_user_text(&value);
        let mut keyed = lock(&shared.keyed);
        if let Some(i) = matching.iter().position(|(n, _)| text.contains(n.as_str())) {
            Some(matching.remove(i).1)
        } else {
            match keyed.iter().position(|(k, _)| first_user.contains(k.as_str())) {
                Some(i) => Some(keyed.remove(i).1),
                None => replies.pop_front(),
            }
        }
    };
    let reply = match reply {
        Some(Reply::Computed(f)) => Some((f.0)(&value)),
        other => other,
    };
    let n = shared.counter.fetch_add(1, Ordering::Relaxed) + 1;

    let (parts, hang) = match reply {
        None => {
            return error_response(StatusCode::INTERNAL_SERVER_ERROR, "mock provider: no scripted reply");
        }
        Some(Reply::Status(code)) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return error_response(status, &format!("mock provider: scripted status {code}"));
        }
        Some(Reply::StatusRetryAfter { status, secs }) => {
            let code = StatusCode::from_u16(status).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
            let mut r = error_response(code, &format!("mock provider: scripted status {status}"));
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
            return r;
        }
        Some(Reply::Redirect(to)) => {
            let mut r = error_response(StatusCode::TEMPORARY_REDIRECT, "mock provider: scripted redirect");
            if let Ok(v) = HeaderValue::from_str(&to) {
                r.headers_mut().insert(header::LOCATION, v);
            }
            return r;
        }
        Some(Reply::Stream(parts)) => (parts, false),
        Some(Reply::StreamThenHang(parts)) => (parts, true),
        Some(Reply::Computed(_)) => {
            return error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "mock provider: computed a computed reply",
            );
        }
    };

    let ctx = ChunkCtx {
        id: format!("chatcmpl-mock{n}"),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        model,
    };
    let steps = match format {
        Format::Chat => plan(&ctx, parts, hang),
        Format::Responses => plan_responses(&ctx, parts, hang),
        Format::Anthropic => plan_anthropic(&ctx, parts, hang),
    };
    let stream = futures_util::stream::unfold((steps, state.closed.clone()), |(mut steps, mut closed)| async move {
        loop {
            match steps.pop_front()? {
                Step::Sleep(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                Step::Send(bytes) => {
                    return Some((Ok::<Bytes, Infallible>(bytes), (steps, closed)));
                }
                Step::Stamp(mut chunk) => {
                    chunk["choices"][0]["delta"]["content"] = format!("<{}>", epoch().elapsed().as_micros()).into();
                    return Some((Ok(Bytes::from(format!("data: {chunk}\n\n"))), (steps, closed)));
                }
                Step::Hang => {
                    // Ends (error or change) only once the provider is dropped.
                    let _ = closed.changed().await;
                    return None;
                }
            }
        }
    });

    let mut response = Response::new(Body::from_stream(stream));
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

struct ChunkCtx {
    id: String,
    created: u64,
    model: String,
}

impl ChunkCtx {
    fn envelope(&self, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    fn choice(&self, delta: Value, finish_reason: Option<&str>) -> Value {
        self.envelope(json!([{
            "index": 0,
            "delta": delta,
            "finish_reason": finish_reason,
        }]))
    }

    fn usage(&self, prompt: u64, completion: u64) -> Value {
        let mut v = self.envelope(json!([]));
        v["usage"] = json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        });
        v
    }
}

enum Step {
    Send(Bytes),
    /// A content chunk whose text is filled in with the time it is sent.
    Stamp(Value),
    Sleep(u64),
    Hang,
}

fn sse(v: &Value) -> Step {
    Step::Send(Bytes::from(format!("data: {v}\n\n")))
}

/// Turns scripted parts into the exact sequence of wire events and pauses.
fn plan(ctx: &ChunkCtx, parts: Vec<Part>, hang: bool) -> VecDeque<Step> {
    let mut steps = VecDeque::new();
    let mut usages = Vec::new();
    let mut any_tool = false;
    let mut first_delta = true;
    // The first choice delta of a stream carries `role: "assistant"`, as OpenAI's does.
    let mut delta = |mut d: Value| {
        if first_delta {
            first_delta = false;
            d["role"] = json!("assistant");
        }
        d
    };
    for part in parts {
        match part {
            Part::Text(t) => steps.push_back(sse(&ctx.choice(delta(json!({"content": t})), None))),
            Part::Reasoning(t) => steps.push_back(sse(&ctx.choice(delta(json!({"reasoning_content": t})), None))),
            Part::ToolCall {
                index,
                id,
                name,
                argument_pieces,
            } => {
                any_tool = true;
                let mut pieces = argument_pieces.into_iter();
                let first = pieces.next().unwrap_or_default();
                let head = json!({"tool_calls": [{
                    "index": index,
                    "id": id,
                    "type": "function",
                    "function": {"name": name, "arguments": first},
                }]});
                steps.push_back(sse(&ctx.choice(delta(head), None)));
                for piece in pieces {
                    let d = json!({"tool_calls": [{
                        "index": index,
                        "function": {"arguments": piece},
                    }]});
                    steps.push_back(sse(&ctx.choice(delta(d), None)));
                }
            }
            Part::Usage { prompt, completion } => {
                if hang {
                    steps.push_back(sse(&ctx.usage(prompt, completion)));
                } else {
                    usages.push((prompt, completion));
                }
            }
            Part::Delay(ms) => steps.push_back(Step::Sleep(ms)),
            Part::Stamp => steps.push_back(Step::Stamp(ctx.choice(delta(json!({"content": ""})), None))),
        }
    }
    if hang {
        steps.push_back(Step::Hang);
        return steps;
    }
    let reason = if any_tool { "tool_calls" } else { "stop" };
    steps.push_back(sse(&ctx.choice(delta(json!({})), Some(reason))));
    for (prompt, completion) in usages {
        steps.push_back(sse(&ctx.usage(prompt, completion)));
    }
    steps.push_back(Step::Send(Bytes::from_static(b"data: [DONE]\n\n")));
    steps
}

/// One named SSE event (`event: NAME` + `data: JSON`), as Responses and Anthropic send them.
fn named(v: Value) -> Step {
    let name = v["type"].as_str().unwrap_or("message").to_owned();
    Step::Send(Bytes::from(format!("event: {name}\ndata: {v}\n\n")))
}

/// The scripted parts as OpenAI Responses API stream events.
fn plan_responses(ctx: &ChunkCtx, parts: Vec<Part>, hang: bool) -> VecDeque<Step> {
    let mut steps = VecDeque::new();
    let response = |status: &str| json!({"id": format!("resp_{}", ctx.id), "object": "response", "status": status, "model": ctx.model});
    steps.push_back(named(
        json!({"type": "response.created", "response": response("in_progress")}),
    ));
    let mut usage = None;
    // The output item being written: (output_index, kind).
    let mut open: Option<(u64, &str)> = None;
    let mut next_index = 0u64;
    // The reasoning item being written, finished (with its encrypted form) when the next
    // item starts or the response ends.
    let mut reasoning = String::new();
    let mut start = |kind: &'static str,
                     item: Value,
                     open: &mut Option<(u64, &str)>,
                     reasoning: &mut String,
                     steps: &mut VecDeque<Step>| {
        finish_responses_reasoning(ctx, *open, reasoning, steps);
        let index = next_index;
        next_index += 1;
        *open = Some((index, kind));
        steps.push_back(named(
            json!({"type": "response.output_item.added", "output_index": index, "item": item}),
        ));
        index
    };
    for part in parts {
        match part {
            Part::Text(t) => {
                let index = match open {
                    Some((i, "message")) => i,
                    _ => start(
                        "message",
                        json!({"type": "message", "id": "msg_1", "role": "assistant", "content": []}),
                        &mut open,
                        &mut reasoning,
                        &mut steps,
                    ),
                };
                steps.push_back(named(json!({"type": "response.output_text.delta", "item_id": "msg_1",
                    "output_index": index, "content_index": 0, "delta": t})));
            }
            Part::Reasoning(t) => {
                let index = match open {
                    Some((i, "reasoning")) => i,
                    _ => start(
                        "reasoning",
                        json!({"type": "reasoning", "id": "rs_1", "summary": []}),
                        &mut open,
                        &mut reasoning,
                        &mut steps,
                    ),
                };
                reasoning.push_str(&t);
                steps.push_back(named(
                    json!({"type": "response.reasoning_summary_text.delta", "item_id": "rs_1",
                    "output_index": index, "summary_index": 0, "delta": t}),
                ));
            }
            Part::ToolCall {
                id,
                name,
                argument_pieces,
                ..
            } => {
                let item = json!({"type": "function_call", "id": format!("fc_{id}"), "call_id": id, "name": name, "arguments": ""});
                let index = start("function_call", item, &mut open, &mut reasoning, &mut steps);
                for piece in argument_pieces {
                    steps.push_back(named(json!({"type": "response.function_call_arguments.delta",
                        "item_id": format!("fc_{id}"), "output_index": index, "delta": piece})));
                }
            }
            Part::Usage { prompt, completion } => usage = Some((prompt, completion)),
            Part::Delay(ms) => steps.push_back(Step::Sleep(ms)),
            // The latency bench's stamps are chat-completions only.
            Part::Stamp => {}
        }
    }
    if hang {
        steps.push_back(Step::Hang);
        return steps;
    }
    finish_responses_reasoning(ctx, open, &mut reasoning, &mut steps);
    let mut done = response("completed");
    if let Some((input, output)) = usage {
        done["usage"] = json!({"input_tokens": input, "output_tokens": output, "total_tokens": input + output});
    }
    steps.push_back(named(json!({"type": "response.completed", "response": done})));
    steps
}

/// The reasoning item the Responses API would give response `response` (stored nowhere:
/// its reasoning comes back encrypted).
pub fn responses_reasoning_item(response: &str, text: &str) -> Value {
    json!({"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": text}],
           "encrypted_content": format!("enc-{response}")})
}

fn finish_responses_reasoning(
    ctx: &ChunkCtx,
    open: Option<(u64, &str)>,
    reasoning: &mut String,
    steps: &mut VecDeque<Step>,
) {
    if let Some((index, "reasoning")) = open {
        let text = std::mem::take(reasoning);
        steps.push_back(named(
            json!({"type": "response.output_item.done", "output_index": index,
            "item": responses_reasoning_item(&ctx.id, &text)}),
        ));
    }
}

/// The signature Anthropic would give the thinking block `index` of response `ctx`.
pub fn anthropic_signature(response: &str, index: u64) -> String {
    format!("sig-{response}-{index}")
}

/// Close content block `index`; a thinking block gets its signature first, as Anthropic
/// sends it.
fn close_anthropic(ctx: &ChunkCtx, index: u64, kind: &str, steps: &mut VecDeque<Step>) {
    if kind == "thinking" {
        steps.push_back(named(json!({"type": "content_block_delta", "index": index,
            "delta": {"type": "signature_delta", "signature": anthropic_signature(&ctx.id, index)}})));
    }
    steps.push_back(named(json!({"type": "content_block_stop", "index": index})));
}

/// The scripted parts as Anthropic Messages stream events.
fn plan_anthropic(ctx: &ChunkCtx, parts: Vec<Part>, hang: bool) -> VecDeque<Step> {
    let mut steps = VecDeque::new();
    let usage = parts.iter().rev().find_map(|p| match p {
        Part::Usage { prompt, completion } => Some((*prompt, *completion)),
        _ => None,
    });
    let (input, output) = usage.unwrap_or((0, 0));
    steps.push_back(named(json!({"type": "message_start", "message": {
        "id": format!("msg_{}", ctx.id), "type": "message", "role": "assistant", "model": ctx.model,
        "content": [], "stop_reason": null, "usage": {"input_tokens": input, "output_tokens": 1}}})));
    steps.push_back(named(json!({"type": "ping"})));
    // The content block being written: (index, kind).
    let mut open: Option<(u64, &str)> = None;
    let mut next = 0u64;
    let mut any_tool = false;
    let mut start = |kind: &'static str, block: Value, open: &mut Option<(u64, &str)>, steps: &mut VecDeque<Step>| {
        if let Some((i, was)) = open.take() {
            close_anthropic(ctx, i, was, steps);
        }
        let index = next;
        next += 1;
        *open = Some((index, kind));
        steps.push_back(named(
            json!({"type": "content_block_start", "index": index, "content_block": block}),
        ));
        index
    };
    for part in parts {
        match part {
            Part::Text(t) => {
                let index = match open {
                    Some((i, "text")) => i,
                    _ => start("text", json!({"type": "text", "text": ""}), &mut open, &mut steps),
                };
                steps.push_back(named(json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "text_delta", "text": t}})));
            }
            Part::Reasoning(t) => {
                let index = match open {
                    Some((i, "thinking")) => i,
                    _ => start(
                        "thinking",
                        json!({"type": "thinking", "thinking": ""}),
                        &mut open,
                        &mut steps,
                    ),
                };
                steps.push_back(named(json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "thinking_delta", "thinking": t}})));
            }
            Part::ToolCall {
                id,
                name,
                argument_pieces,
                ..
            } => {
                any_tool = true;
                let block = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
                let index = start("tool_use", block, &mut open, &mut steps);
                for piece in argument_pieces {
                    steps.push_back(named(json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": piece}})));
                }
            }
            Part::Usage { .. } | Part::Stamp => {}
            Part::Delay(ms) => steps.push_back(Step::Sleep(ms)),
        }
    }
    if hang {
        steps.push_back(Step::Hang);
        return steps;
    }
    if let Some((i, was)) = open {
        close_anthropic(ctx, i, was, &mut steps);
    }
    let reason = if any_tool { "tool_use" } else { "end_turn" };
    steps.push_back(named(
        json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": null},
        "usage": {"output_tokens": output}}),
    ));
    steps.push_back(named(json!({"type": "message_stop"})));
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    fn client() -> reqwest::Client {
        reqwest::Client::new()
    }

    async fn post(mock: &MockProvider, body: Value) -> reqwest::Response {
        client()
            .post(format!("{}/chat/completions", mock.base_url()))
            .bearer_auth("sk-test")
            .json(&body)
            .send()
            .await
            .expect("request")
    }

    /// Splits an SSE body into its `data:` payloads.
    fn events(body: &str) -> Vec<String> {
        body.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                e.strip_prefix("data: ")
                    .unwrap_or_else(|| panic!("not a data event: {e:?}"))
                    .to_owned()
            })
            .collect()
    }

    fn json_events(evs: &[String]) -> Vec<Value> {
        evs.iter()
            .filter(|e| e.as_str() != "[DONE]")
            .map(|e| serde_json::from_str(e).expect("chunk json"))
            .collect()
    }

    #[tokio::test]
    async fn text_chunks_then_done() {
        let mock = MockProvider::start().await;
        mock.push(Reply::text(&["Hel", "lo"]));
        let resp = post(&mock, json!({"model": "m1", "stream": true})).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()[reqwest::header::CONTENT_TYPE], "text/event-stream");
        let body = resp.text().await.unwrap();
        let evs = events(&body);
        assert_eq!(evs.last().map(String::as_str), Some("[DONE]"));
        assert!(body.ends_with("data: [DONE]\n\n"));
        let chunks = json_events(&evs);
        assert_eq!(chunks.len(), 4, "{body}");
        assert_eq!(chunks[0]["object"], "chat.completion.chunk");
        assert_eq!(chunks[0]["model"], "m1");
        assert!(chunks[0]["id"].as_str().unwrap().starts_with("chatcmpl-"));
        assert_eq!(chunks[0]["choices"][0]["delta"]["content"], "Hel");
        assert_eq!(chunks[0]["choices"][0]["finish_reason"], Value::Null);
        assert_eq!(chunks[1]["choices"][0]["delta"]["content"], "lo");
        assert_eq!(chunks[2]["choices"][0]["finish_reason"], "stop");
        assert_eq!(chunks[3]["choices"], json!([]));
        assert_eq!(
            chunks[3]["usage"],
            json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15})
        );
    }

    #[tokio::test]
    async fn split_tool_call_reassembles() {
        let mock = MockProvider::start().await;
        mock.push(Reply::Stream(vec![
            Part::Reasoning("thinking".into()),
            Part::ToolCall {
                index: 0,
                id: "call_1".into(),
                name: "read_file".into(),
                argument_pieces: vec!["{\"pa".into(), "th\":\"a".into(), ".txt\"}".into()],
            },
            Part::Usage {
                prompt: 3,
                completion: 4,
            },
        ]));
        let body = post(&mock, json!({"model": "m"})).await.text().await.unwrap();
        let chunks = json_events(&events(&body));
        assert_eq!(chunks[0]["choices"][0]["delta"]["reasoning_content"], "thinking");
        let (mut id, mut name, mut args) = (String::new(), String::new(), String::new());
        let mut finish = None;
        let mut usage = None;
        for c in &chunks {
            if let Some(u) = c.get("usage") {
                usage = Some(u.clone());
            }
            let Some(choice) = c["choices"].get(0) else {
                continue;
            };
            if let Some(f) = choice["finish_reason"].as_str() {
                finish = Some(f.to_owned());
            }
            for tc in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
                assert_eq!(tc["index"], 0);
                if let Some(s) = tc["id"].as_str() {
                    id.push_str(s);
                    assert_eq!(tc["type"], "function");
                }
                if let Some(s) = tc["function"]["name"].as_str() {
                    name.push_str(s);
                }
                if let Some(s) = tc["function"]["arguments"].as_str() {
                    args.push_str(s);
                }
            }
        }
        assert_eq!(id, "call_1");
        assert_eq!(name, "read_file");
        let parsed: Value = serde_json::from_str(&args).unwrap();
        assert_eq!(parsed, json!({"path": "a.txt"}));
        assert_eq!(finish.as_deref(), Some("tool_calls"));
        assert_eq!(usage.unwrap()["total_tokens"], 7);
        // Usage comes after the finish chunk.
        assert_eq!(chunks.last().unwrap()["choices"], json!([]));
    }

    #[tokio::test]
    async fn scripted_status_is_returned() {
        let mock = MockProvider::start().await;
        mock.push(Reply::Status(500));
        mock.push(Reply::Status(429));
        let resp = post(&mock, json!({})).await;
        assert_eq!(resp.status(), 500);
        let v: Value = resp.json().await.unwrap();
        assert!(v["error"]["message"].is_string());
        let resp = post(&mock, json!({})).await;
        assert_eq!(resp.status(), 429);
    }

    #[tokio::test]
    async fn empty_queue_returns_500() {
        let mock = MockProvider::start().await;
        let resp = post(&mock, json!({})).await;
        assert_eq!(resp.status(), 500);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["message"], "mock provider: no scripted reply");
    }

    #[tokio::test]
    async fn records_requests_and_authorizations() {
        let mock = MockProvider::start().await;
        mock.push(Reply::text(&["a"]));
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        post(&mock, body.clone()).await.text().await.unwrap();
        // Also accepted without the /v1 prefix; no Authorization header here.
        let root = mock.base_url().trim_end_matches("/v1").to_owned();
        let resp = client()
            .post(format!("{root}/chat/completions"))
            .json(&json!({"n": 2}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 500); // queue now empty
        assert_eq!(mock.requests(), vec![body, json!({"n": 2})]);
        assert_eq!(mock.authorizations(), vec![Some("Bearer sk-test".to_owned()), None]);
    }

    #[tokio::test]
    async fn delay_streams_live_and_hang_never_finishes() {
        let mock = MockProvider::start().await;
        mock.push(Reply::StreamThenHang(vec![
            Part::Text("first".into()),
            Part::Delay(50),
            Part::Text("second".into()),
        ]));
        let resp = post(&mock, json!({})).await;
        assert_eq!(resp.status(), 200);
        let mut stream = resp.bytes_stream();
        let mut buf = String::new();
        let deadline = Duration::from_secs(5);
        while !buf.contains("second") {
            let chunk = tokio::time::timeout(deadline, stream.next())
                .await
                .expect("chunk before timeout")
                .expect("stream open")
                .unwrap();
            buf.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        assert!(!buf.contains("[DONE]"));
        assert!(!buf.contains("finish_reason\":\"stop"));
        let next = tokio::time::timeout(Duration::from_millis(200), stream.next()).await;
        assert!(next.is_err(), "hanging stream produced more data");
        // Dropping the provider ends the hanging stream.
        drop(mock);
        let end = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("stream ends after drop");
        assert!(!matches!(end, Some(Ok(_))));
    }
}
