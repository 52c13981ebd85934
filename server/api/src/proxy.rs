//! The streaming model proxy: workers call the provider through the API tier, so provider
//! keys never leave it and workspace machines need no internet egress.
//!
//! `POST /v1/model/chat/completions` with a worker credential and the `berth-turn` header.
//! The call must be for a running turn handed to a connection of that credential; the
//! proxy sets the model the turn was dispatched with, forces streaming with usage, caps
//! `max_tokens`, adds the provider key and streams the provider's SSE body back unchanged,
//! metering the usage it reports as it passes. Per-tenant concurrency and rate limits hold
//! on each replica; the body limit follows the model's context window. Failures answer
//! `{"error": {code, status?}}` with a typed cause and never the provider's body.

use berth_protocol::CauseCode;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    Json,
    body::{Body, Bytes},
    extract::State,
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
};
use berth_protocol::{
    Cause, ErrorCode,
    worker::{MODEL_PROXY_TURN_HEADER, ProxyError, Usage},
};
use berth_store::CredentialKind;
use futures_util::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::{
    AppState,
    auth::{BucketConfig, KeyedLimiter},
    config::{ModelConfig, ProviderProfile, Resilience, WireApi},
    providers,
    rpc::bearer,
};

/// Per-tenant limits of the proxy on this replica.
pub struct ProxyLimits {
    max_concurrent: usize,
    rate: KeyedLimiter,
    running: Mutex<HashMap<String, Arc<Semaphore>>>,
    /// One clone per model stream this replica serves to a worker ([`ProxyLimits::streams`]).
    streams: Arc<()>,
}

impl ProxyLimits {
    /// Model streams this replica is serving to workers now: a draining replica waits for
    /// them (their turns may have moved to another replica meanwhile).
    pub fn streams(&self) -> usize {
        Arc::strong_count(&self.streams) - 1
    }

    pub fn new(model: &ModelConfig) -> ProxyLimits {
        let per_min = model.requests_per_min.max(1);
        ProxyLimits {
            max_concurrent: model.max_concurrent.max(1),
            rate: KeyedLimiter::new(BucketConfig {
                // A minute's worth may come in a burst (a team starting turns together).
                capacity: per_min,
                refill_every: Duration::from_secs(60) / per_min,
            }),
            running: Mutex::new(HashMap::new()),
            streams: Arc::new(()),
        }
    }

    /// A slot for one call of `tenant`, or None at the tenant's limits. Every model call
    /// Berth makes counts: a worker's through the proxy, and the API tier's own (titles,
    /// summaries), whose [`crate::complete::complete`] takes the permit.
    pub(crate) fn admit(&self, tenant: &str) -> Option<OwnedSemaphorePermit> {
        self.rate.check(tenant).ok()?;
        let sem = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(tenant.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(self.max_concurrent)))
            .clone();
        sem.try_acquire_owned().ok()
    }
}

fn fail(status: StatusCode, code: &str, provider_status: Option<u16>) -> Response {
    tracing::debug!(code, "model proxy call refused");
    (
        status,
        Json(ProxyError {
            error: Cause {
                code: code.into(),
                status: provider_status,
            },
        }),
    )
        .into_response()
}

pub async fn chat_completions(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let turn_id = headers
        .get(MODEL_PROXY_TURN_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    // The credential and the turn are checked in one round trip (this runs before every
    // model request); without a turn header, the credential alone.
    let checked = match (bearer(&headers), &turn_id) {
        (Some(t), Some(turn_id)) => state.store.authenticate_for_turn(t, turn_id).await,
        (Some(t), None) => state.store.authenticate(t).await.map(|p| p.map(|p| (p, None))),
        (None, _) => Ok(None),
    };
    let checked = match checked {
        Ok(Some((p, turn))) if p.kind == CredentialKind::Worker => Some((p, turn)),
        Ok(_) => None,
        Err(_) => return fail(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable.as_str(), None),
    };
    let Some((principal, turn)) = checked else {
        state.metrics.auth_failures.with_label_values(&["model-proxy"]).inc();
        return fail(StatusCode::UNAUTHORIZED, "unauthorized", None);
    };
    let Some(turn_id) = turn_id else {
        return fail(StatusCode::BAD_REQUEST, ErrorCode::BadParams.as_str(), None);
    };
    let model_cfg = &state.config.model;
    let Some(permit) = state.proxy.admit(&principal.tenant_id) else {
        return fail(StatusCode::TOO_MANY_REQUESTS, ErrorCode::RateLimited.as_str(), None);
    };
    let Some(turn) = turn else {
        return fail(StatusCode::FORBIDDEN, ErrorCode::TurnNotRunning.as_str(), None);
    };
    // The profiles as they are now (a reload during the call does not change it).
    let providers = state.config.providers.current();
    let Some(profile) = providers.get(turn.provider.as_deref()) else {
        return fail(StatusCode::SERVICE_UNAVAILABLE, "provider-unconfigured", None);
    };
    let Some(model) = turn.model.or_else(|| model_cfg.model.clone()) else {
        return fail(StatusCode::SERVICE_UNAVAILABLE, "provider-unconfigured", None);
    };
    // Only a model the profile offers (or the configured default) goes out with its key:
    // sessions are checked when they choose one, and this holds whatever chose it since.
    if !profile.offers(&model) && model_cfg.model.as_deref() != Some(model.as_str()) {
        return fail(StatusCode::FORBIDDEN, ErrorCode::UnknownModel.as_str(), None);
    }
    let Some((base, with_key)) = endpoint(profile, turn.base_url.as_deref()) else {
        return fail(StatusCode::FORBIDDEN, ErrorCode::BaseUrlNotAllowed.as_str(), None);
    };
    // The body may hold a full context window of this model (and no more), besides the
    // images it shows as base64.
    let spec = model_cfg.spec(profile, &model);
    let too_large = || fail(StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::PayloadTooLarge.as_str(), None);
    let room = spec.body_limit().saturating_add(crate::config::IMAGE_ROOM as usize);
    let body = match axum::body::to_bytes(body, room).await {
        Ok(b) => b,
        Err(_) => return too_large(),
    };
    if body.len() > spec.body_limit() && body.len() - image_data_bytes(&body) > spec.body_limit() {
        return too_large();
    }
    // The turn's model, one choice, streamed with usage, output capped: whatever was asked.
    let (context_cap, max_output) = (spec.context_tokens, model_cfg.max_output_tokens);
    let rewrite = |obj: &mut serde_json::Map<String, serde_json::Value>| {
        server_terms(obj, &model, context_cap, max_output);
    };
    let images = profile.takes_images(&model);
    // A chat-completions provider gets the worker's messages as they came when none needs
    // rewriting (the usual case): no tree of the conversation is built, measured and written
    // again. Other formats, and messages to rewrite, go through the parsed body.
    let forwarded = match profile.api {
        WireApi::ChatCompletions => providers::chat::forward(&body, images, spec.level, rewrite),
        _ => None,
    };
    // What the request holds (`measured`), for `session.context`.
    let (outgoing, measured) = match forwarded {
        Some(f) => f,
        None => {
            let Ok(serde_json::Value::Object(mut obj)) = serde_json::from_slice::<serde_json::Value>(&body) else {
                return fail(StatusCode::BAD_REQUEST, ErrorCode::BadParams.as_str(), None);
            };
            rewrite(&mut obj);
            // Images reach only a model that takes them; others read a note in their place.
            if !images {
                strip_images(&mut obj);
            }
            let measured = providers::measure(&obj);
            (providers::request(profile.api, obj, spec.level).encode(), measured)
        }
    };
    drop(body);
    let label = model_label(model_cfg, profile, &model);
    // The context record is best effort: the call goes on without. Written while the
    // provider is asked, not before: only the meter at the stream's end needs its id.
    let record = async {
        match state
            .store
            .record_context(&principal.tenant_id, &turn_id, &profile.name, &model, &measured)
            .await
        {
            Ok(id) => Some(id),
            Err(e) => {
                tracing::warn!(turn.id = %turn_id, error = %e, "context record not written");
                None
            }
        }
    };
    let build = outgoing.builder(client_for(&state, profile, with_key), profile, base, with_key);
    let send = async {
        let started = Instant::now();
        let resp = send_with_retries(build, &model_cfg.resilience).await;
        state
            .metrics
            .model_latency
            .with_label_values(&[&profile.name, &label])
            .observe(started.elapsed().as_secs_f64());
        resp
    };
    let (context, resp) = tokio::join!(record, send);
    let resp = match resp {
        Ok(r) => r,
        Err(cause) => {
            return fail(StatusCode::BAD_GATEWAY, &cause.code, cause.status);
        }
    };
    drop(outgoing);
    let meter = Meter {
        state: state.clone(),
        tenant: principal.tenant_id,
        turn: Some(turn_id),
        context,
        provider: profile.name.clone(),
        label,
        scan: UsageScanner::default(),
        recorded: false,
        _permit: Some(permit),
        _stream: Some(state.proxy.streams.clone()),
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    tokio::spawn(pump(
        resp,
        providers::translator(profile.api),
        model_cfg.resilience.idle_timeout,
        tx,
        meter,
    ));
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<Bytes, std::convert::Infallible>(b), rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// The bytes of the base64 images (`"url":"data:image/…"`, as the worker writes an image
/// part) in a model request's body; text that only looks like one is escaped (`\"`) and
/// does not count.
fn image_data_bytes(body: &[u8]) -> usize {
    const NEEDLE: &[u8] = b"\"url\":\"data:image/";
    let mut total = 0;
    let mut rest = body;
    while let Some(at) = memchr::memmem::find(rest, NEEDLE) {
        let url = &rest[at + NEEDLE.len() - b"data:image/".len()..];
        let len = memchr::memchr(b'"', url).unwrap_or(url.len());
        total += len;
        rest = &url[len..];
    }
    total
}

/// The server's terms on the top-level fields of a worker's request: only the fields a turn
/// needs go on (a worker on a compromised machine must not switch on paid extras, storage
/// or web access with the tenant's key: `n`, `store`, `service_tier`, … are dropped), the
/// turn's `model`, and an output never asked for beyond one context window
/// (`context_cap`) or the configured `max_output` (then always set).
fn server_terms(
    obj: &mut serde_json::Map<String, serde_json::Value>,
    model: &str,
    context_cap: u64,
    max_output: Option<u64>,
) {
    obj.retain(|k, _| FORWARDED_FIELDS.contains(&k.as_str()));
    obj.insert("model".into(), model.into());
    let cap = max_output.map_or(context_cap, |m| m.min(context_cap));
    for key in ["max_tokens", "max_completion_tokens"] {
        if let Some(v) = obj.get_mut(key) {
            *v = v.as_u64().map_or(cap, |n| n.min(cap)).into();
        }
    }
    if max_output.is_some() && !obj.contains_key("max_completion_tokens") {
        obj.entry("max_tokens").or_insert(cap.into());
    }
}

/// The top-level fields of a worker's request the proxy passes on (the rest are dropped):
/// what a turn's request is made of, and sampling parameters an agent definition sets.
const FORWARDED_FIELDS: &[&str] = &[
    "model",
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "reasoning_effort",
];

/// Metric labels stay bounded: a configured model, or "other".
pub(crate) fn model_label(cfg: &ModelConfig, profile: &ProviderProfile, model: &str) -> String {
    if cfg.model.as_deref() == Some(model) || profile.models.iter().any(|m| m.id == model) {
        model.to_string()
    } else {
        "other".to_string()
    }
}

/// Where a call of `profile` goes and whether it carries the key: a client-chosen endpoint
/// only where the profile allows one, and then never with the key, and on the public
/// internet unless the profile allows private ones (None: not allowed).
pub(crate) fn endpoint<'a>(profile: &'a ProviderProfile, chosen: Option<&'a str>) -> Option<(&'a str, bool)> {
    match chosen {
        Some(url) if profile.allow_base_url && (profile.allow_private_base_url || crate::net::public_url(url)) => {
            Some((url, false))
        }
        Some(_) => None,
        None => Some((profile.base_url.as_str(), true)),
    }
}

/// The client a call of `profile` to an endpoint goes through: a session's own endpoint
/// resolves to public addresses only, unless the profile allows private ones.
pub(crate) fn client_for<'a>(state: &'a crate::App, profile: &ProviderProfile, with_key: bool) -> &'a reqwest::Client {
    if with_key || profile.allow_private_base_url {
        &state.provider_http
    } else {
        &state.public_http
    }
}

/// Send a provider request, retrying 429, 5xx and unreachable with jittered exponential
/// backoff (or the provider's `Retry-After`), within the configured bounds. The answer is
/// a successful response or a typed cause; a provider's error body is read only to tell a
/// context overflow and never logged or passed on.
pub(crate) async fn send_with_retries(
    build: impl Fn() -> reqwest::RequestBuilder,
    res: &Resilience,
) -> Result<reqwest::Response, Cause> {
    let mut attempt = 0u32;
    loop {
        let retry_after = match tokio::time::timeout(res.first_byte_timeout, build().send()).await {
            Err(_) => return Err(cause(CauseCode::ProviderTimeout, None)),
            Ok(Err(e)) if e.is_timeout() => return Err(cause(CauseCode::ProviderTimeout, None)),
            Ok(Err(e)) => {
                tracing::warn!(error = %without_url(&e), attempt, "provider unreachable");
                if attempt >= res.max_retries {
                    return Err(cause(CauseCode::ProviderUnreachable, None));
                }
                None
            }
            Ok(Ok(resp)) if resp.status().is_success() => return Ok(resp),
            Ok(Ok(resp)) => {
                let status = resp.status().as_u16();
                tracing::warn!(status, attempt, "provider answered with an error status");
                let retryable = status == 429 || status >= 500;
                let wait = retry_after(resp.headers());
                if !retryable || attempt >= res.max_retries || wait.is_some_and(|w| w > res.max_retry_wait) {
                    return Err(match status {
                        429 => cause(CauseCode::ProviderRateLimited, Some(status)),
                        400 | 413 => {
                            if overflowed(resp).await {
                                cause(CauseCode::ContextOverflow, None)
                            } else {
                                cause(CauseCode::ProviderStatus, Some(status))
                            }
                        }
                        _ => cause(CauseCode::ProviderStatus, Some(status)),
                    });
                }
                wait
            }
        };
        let wait = retry_after.unwrap_or_else(|| backoff(attempt)).min(res.max_retry_wait);
        tokio::time::sleep(wait).await;
        attempt += 1;
    }
}

fn cause(code: CauseCode, status: Option<u16>) -> Cause {
    Cause {
        code: code.as_str().into(),
        status,
    }
}

/// 0.5 s, 1 s, 2 s, … (capped at 8 s), each between half and all of it.
fn backoff(attempt: u32) -> Duration {
    let full = Duration::from_millis(500) * 2u32.pow(attempt.min(4));
    full.mul_f64(rand::random_range(0.5..=1.0))
}

/// `Retry-After`: seconds, or an HTTP date (a date already past means now).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = v.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).ok();
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(std::time::SystemTime::now()).unwrap_or_default())
}

/// Whether an error answer says the request outgrew the model's context (the body is read
/// up to a bound, inspected and dropped).
async fn overflowed(resp: reqwest::Response) -> bool {
    let mut body = resp.bytes_stream();
    let mut seen = Vec::new();
    while seen.len() < 16 << 10 {
        match tokio::time::timeout(Duration::from_secs(2), body.next()).await {
            Ok(Some(Ok(b))) => seen.extend_from_slice(&b),
            _ => break,
        }
    }
    let text = String::from_utf8_lossy(&seen).to_ascii_lowercase();
    [
        "context_length_exceeded",
        "context length",
        "context window",
        "prompt is too long",
        "too many tokens",
    ]
    .iter()
    .any(|m| text.contains(m))
}

/// Moves the provider's stream to the worker as the normalized stream (translated when
/// the profile speaks another format), metering usage, ending a stream that goes silent
/// for the idle timeout with a typed failure, and stopping as soon as the worker is gone.
pub(crate) async fn pump(
    resp: reqwest::Response,
    mut translate: Option<Box<dyn providers::Translate>>,
    idle: Duration,
    tx: tokio::sync::mpsc::Sender<Bytes>,
    mut meter: Meter,
) {
    let mut body = std::pin::pin!(resp.bytes_stream());
    let mut sse = providers::SseParser::default();
    let failure = loop {
        let next = tokio::select! {
            _ = tx.closed() => return,
            next = tokio::time::timeout(idle, body.next()) => next,
        };
        let chunk = match next {
            Err(_) => break cause(CauseCode::ProviderTimeout, None),
            Ok(None) if translate.is_none() => {
                meter.record().await;
                return;
            }
            Ok(None) => break cause(CauseCode::ProviderStreamEnded, None),
            Ok(Some(Err(_))) => break cause(CauseCode::ProviderUnreachable, None),
            Ok(Some(Ok(b))) => b,
        };
        let Some(t) = translate.as_mut() else {
            if meter.scan.feed(&chunk) {
                meter.record().await;
            }
            if tx.send(chunk).await.is_err() {
                return;
            }
            continue;
        };
        let mut chunks = Vec::new();
        let mut outcome: Result<bool, Cause> = Ok(false);
        let parsed = sse.feed(&chunk, |event, data| {
            if matches!(outcome, Ok(false)) {
                outcome = t.event(event, data, &mut chunks);
            }
        });
        let mut out = Vec::new();
        for c in &chunks {
            out.extend_from_slice(format!("data: {c}\n\n").as_bytes());
        }
        meter.scan.feed(&out);
        if !out.is_empty() && tx.send(Bytes::from(out)).await.is_err() {
            return;
        }
        match (parsed, outcome) {
            (Err(c), _) | (_, Err(c)) => break c,
            (Ok(()), Ok(true)) => {
                meter.record().await;
                let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
                return;
            }
            (Ok(()), Ok(false)) => {}
        }
    };
    tracing::warn!(code = %failure.code, "provider stream failed");
    meter.record().await;
    let err = serde_json::to_string(&ProxyError { error: failure }).unwrap_or_default();
    let _ = tx.send(Bytes::from(format!("\n\ndata: {err}\n\n"))).await;
}

/// The most tokens one call counts for in the metrics (far past any model's window).
const TOKENS_A_CALL_MAX: u64 = 100_000_000;

/// Meters one call's usage from the provider's stream; holds the tenant's slot until the
/// stream ends or the worker goes away. The usage of a turn whose worker connection this
/// replica holds goes to the turn's task, stored with its next step; else to the database.
pub(crate) struct Meter {
    pub(crate) state: AppState,
    pub(crate) tenant: String,
    /// The turn the usage counts to (None: a call of the API tier's own, e.g. a title).
    pub(crate) turn: Option<String>,
    /// The `session.context` record the input usage belongs to.
    pub(crate) context: Option<String>,
    pub(crate) provider: String,
    pub(crate) label: String,
    pub(crate) scan: UsageScanner,
    pub(crate) recorded: bool,
    pub(crate) _permit: Option<OwnedSemaphorePermit>,
    /// Counts the stream among [`ProxyLimits::streams`] until it ends.
    pub(crate) _stream: Option<Arc<()>>,
}

impl Meter {
    /// Record the call's usage (the last one the provider reported), once.
    async fn record(&mut self) {
        let Some(usage) = self.scan.usage.filter(|_| !self.recorded) else {
            return;
        };
        self.recorded = true;
        // What a provider reports is its word (a session's own endpoint says anything): no
        // one call moves the operator's counters by more than any call could use.
        let m = &self.state.metrics.model_tokens;
        m.with_label_values(&[&self.provider, &self.label, "input"])
            .inc_by(usage.input_tokens.min(TOKENS_A_CALL_MAX));
        m.with_label_values(&[&self.provider, &self.label, "output"])
            .inc_by(usage.output_tokens.min(TOKENS_A_CALL_MAX));
        if self.turn.is_none() && self.context.is_none() {
            return;
        }
        // A turn this replica's worker connection runs stores the usage with its next step.
        let usage = match &self.turn {
            Some(turn) => {
                let m = berth_store::Metered {
                    context: self.context.clone(),
                    usage,
                };
                match self.state.workers.meter(turn, m) {
                    Ok(()) => return,
                    Err(m) => m.usage,
                }
            }
            None => usage,
        };
        let (turn, context) = (self.turn.as_deref(), self.context.as_deref());
        if let Err(e) = self.state.store.meter_usage(&self.tenant, turn, context, usage).await {
            tracing::warn!(turn.id = ?turn, error = %e, "recording metered usage failed");
        }
    }
}

/// Follows the `data:` lines of an SSE byte stream for the provider's usage.
#[derive(Default)]
pub(crate) struct UsageScanner {
    line: Vec<u8>,
    /// The current line outgrew the bound: skip to its end (usage chunks are small).
    skipping: bool,
    /// The latest usage reported (some providers repeat a running total in every chunk).
    usage: Option<Usage>,
}

/// Longest SSE line inspected for usage.
const USAGE_LINE_MAX: usize = 64 << 10;

#[derive(serde::Deserialize)]
struct UsageChunk {
    usage: Option<ProviderUsage>,
}

#[derive(serde::Deserialize)]
struct ProviderUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

impl UsageScanner {
    /// Feed bytes; true when the stream's `[DONE]` went by.
    fn feed(&mut self, bytes: &[u8]) -> bool {
        let mut done = false;
        for &b in bytes {
            if b == b'\n' || b == b'\r' {
                if !self.skipping {
                    match self.line.strip_prefix(b"data:").map(<[u8]>::trim_ascii) {
                        Some(b"[DONE]") => done = true,
                        Some(data) => {
                            if let Some(u) = parse_usage(data) {
                                self.usage = Some(u);
                            }
                        }
                        None => {}
                    }
                }
                self.line.clear();
                self.skipping = false;
            } else if !self.skipping {
                if self.line.len() >= USAGE_LINE_MAX {
                    self.line.clear();
                    self.skipping = true;
                } else {
                    self.line.push(b);
                }
            }
        }
        done
    }
}

fn parse_usage(data: &[u8]) -> Option<Usage> {
    // Only chunks that mention usage are parsed (content chunks pass untouched).
    if !data.windows(7).any(|w| w == b"\"usage\"") {
        return None;
    }
    let u = serde_json::from_slice::<UsageChunk>(data).ok()?.usage?;
    Some(Usage {
        input_tokens: u.prompt_tokens,
        output_tokens: u.completion_tokens,
    })
}

/// reqwest errors can carry the URL; keep only the kind of failure in logs.
fn without_url(e: &reqwest::Error) -> String {
    let mut e2 = String::new();
    if e.is_connect() {
        e2.push_str("connect error");
    } else if e.is_request() {
        e2.push_str("request error");
    } else {
        e2.push_str("transport error");
    }
    e2
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Images' base64 does not count against the body limit; everything else does.
    #[test]
    fn a_requests_image_data_is_measured_apart() {
        let b64 = "QUJD".repeat(1000);
        let body = serde_json::json!({"messages": [
            {"role": "user", "content": "see data:image/png here"},
            {"role": "user", "content": [
                {"type": "text", "text": "two"},
                {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{b64}")}},
                {"type": "image_url", "image_url": {"url": format!("data:image/jpeg;base64,{b64}")}},
            ]},
        ]})
        .to_string();
        let urls = "data:image/png;base64,".len() + "data:image/jpeg;base64,".len() + 2 * b64.len();
        assert_eq!(image_data_bytes(body.as_bytes()), urls);
        // Text that looks like an image part is escaped inside its string: not counted.
        let forged =
            serde_json::json!({"messages": [{"role": "user", "content": format!("\"url\":\"data:image/{b64}")}]})
                .to_string();
        assert_eq!(image_data_bytes(forged.as_bytes()), 0);
        assert_eq!(image_data_bytes(b"{\"messages\": []}"), 0);
    }

    #[test]
    fn only_a_turns_fields_go_on_with_the_output_capped() {
        let mut obj = serde_json::json!({
            "model": "expensive", "n": 4, "store": true, "service_tier": "priority",
            "web_search_options": {}, "metadata": {"a": "b"}, "user": "x",
            "messages": [], "tools": [], "temperature": 0.2, "top_p": 0.9, "stream": false,
            "max_tokens": 10_000_000u64, "max_completion_tokens": "lots",
        });
        let map = obj.as_object_mut().unwrap();
        super::server_terms(map, "turn-model", 8000, None);
        let mut keys: Vec<&str> = map.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "max_completion_tokens",
                "max_tokens",
                "messages",
                "model",
                "stream",
                "temperature",
                "tools",
                "top_p"
            ]
        );
        assert_eq!(map["model"], "turn-model");
        assert_eq!(map["max_tokens"], 8000);
        assert_eq!(map["max_completion_tokens"], 8000);

        let mut obj = serde_json::json!({"messages": [], "max_tokens": 50});
        let map = obj.as_object_mut().unwrap();
        super::server_terms(map, "m", 8000, Some(100));
        assert_eq!(map["max_tokens"], 50);
        let mut obj = serde_json::json!({"messages": []});
        let map = obj.as_object_mut().unwrap();
        super::server_terms(map, "m", 8000, Some(100));
        assert_eq!(map["max_tokens"], 100);
        let mut obj = serde_json::json!({"messages": []});
        let map = obj.as_object_mut().unwrap();
        super::server_terms(map, "m", 8000, None);
        assert!(
            map.get("max_tokens").is_none(),
            "left to the provider when nothing is configured"
        );
    }

    #[test]
    fn retry_after_takes_seconds_and_http_dates() {
        let at = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::RETRY_AFTER, v.parse().unwrap());
            retry_after(&h)
        };
        assert_eq!(at("2"), Some(Duration::from_secs(2)));
        assert_eq!(at("0.5"), Some(Duration::from_millis(500)));
        let soon = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(30));
        let wait = at(&soon).expect("a date parses");
        assert!(
            wait > Duration::from_secs(25) && wait <= Duration::from_secs(30),
            "{wait:?}"
        );
        assert_eq!(at("Wed, 21 Oct 2015 07:28:00 GMT"), Some(Duration::ZERO));
        assert_eq!(at("soon"), None);
        assert_eq!(at("-1"), None);
    }

    fn usage(s: &UsageScanner) -> Option<(u64, u64)> {
        s.usage.map(|u| (u.input_tokens, u.output_tokens))
    }

    #[test]
    fn usage_is_found_across_chunk_boundaries_and_line_endings() {
        let mut s = UsageScanner::default();
        assert!(!s.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"usage\"}}],\"usage\":null}\n\n"));
        assert_eq!(usage(&s), None);
        assert!(!s.feed(b"data: {\"choices\":[],\"us"));
        assert!(s.feed(b"age\":{\"prompt_tokens\":10,\"completion_tokens\":5}}\r\n\r\ndata: [DONE]\r\n\r\n"));
        assert_eq!(usage(&s), Some((10, 5)));
    }

    #[test]
    fn a_running_total_counts_once() {
        let mut s = UsageScanner::default();
        s.feed(b"data: {\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":1}}\n");
        s.feed(b"data: {\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":2}}\n");
        assert_eq!(usage(&s), Some((10, 2)));
    }

    #[test]
    fn an_oversized_line_is_skipped_not_buffered() {
        let mut s = UsageScanner::default();
        let big = vec![b'x'; USAGE_LINE_MAX * 2];
        s.feed(b"data: ");
        s.feed(&big);
        assert!(s.line.len() <= USAGE_LINE_MAX);
        s.feed(b"\ndata: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n");
        assert_eq!(usage(&s), Some((1, 2)));
    }
}

/// For a model without image input: every image part of the messages becomes a text part
/// saying so (the attachment's description stays beside it).
fn strip_images(obj: &mut serde_json::Map<String, serde_json::Value>) {
    let Some(messages) = obj.get_mut("messages").and_then(|m| m.as_array_mut()) else {
        return;
    };
    for part in messages
        .iter_mut()
        .filter_map(|m| m.get_mut("content").and_then(|c| c.as_array_mut()))
        .flatten()
    {
        if part.get("type").and_then(|t| t.as_str()) == Some("image_url") {
            *part =
                serde_json::json!({"type": "text", "text": "[image omitted: this model does not take image input]"});
        }
    }
}

#[cfg(test)]
mod image_tests {
    #[test]
    fn image_parts_become_text_for_a_model_without_image_input() {
        let mut obj = serde_json::json!({"messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
            ]},
            {"role": "assistant", "content": "ok"},
        ]});
        let map = obj.as_object_mut().expect("object");
        super::strip_images(map);
        let parts = &obj["messages"][0]["content"];
        assert_eq!(parts[0]["text"], "look");
        assert_eq!(parts[1]["type"], "text");
        assert!(!obj.to_string().contains("base64"));
    }
}
