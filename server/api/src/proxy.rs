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
use berth_store::{CredentialKind, StoreError};
use futures_util::{Stream, StreamExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::{
    AppState,
    auth::{BucketConfig, KeyedLimiter},
    config::ModelConfig,
    rpc::bearer,
};

/// Per-tenant limits of the proxy on this replica.
pub struct ProxyLimits {
    max_concurrent: usize,
    rate: KeyedLimiter,
    running: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl ProxyLimits {
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
        }
    }

    /// A slot for one call of `tenant`, or None at the tenant's limits.
    fn admit(&self, tenant: &str) -> Option<OwnedSemaphorePermit> {
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
    let principal = match bearer(&headers) {
        Some(t) => match state.store.authenticate(t).await {
            Ok(Some(p)) if p.kind == CredentialKind::Worker => Some(p),
            Ok(_) => None,
            Err(_) => return fail(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable.as_str(), None),
        },
        None => None,
    };
    let Some(principal) = principal else {
        state.metrics.auth_failures.with_label_values(&["model-proxy"]).inc();
        return fail(StatusCode::UNAUTHORIZED, "unauthorized", None);
    };
    let Some(turn_id) = headers
        .get(MODEL_PROXY_TURN_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        return fail(StatusCode::BAD_REQUEST, ErrorCode::BadParams.as_str(), None);
    };
    let model_cfg = &state.config.model;
    let Some(base) = model_cfg.base_url.as_deref() else {
        return fail(StatusCode::SERVICE_UNAVAILABLE, "provider-unconfigured", None);
    };
    let Some(permit) = state.proxy.admit(&principal.tenant_id) else {
        return fail(StatusCode::TOO_MANY_REQUESTS, ErrorCode::RateLimited.as_str(), None);
    };
    let body = match axum::body::to_bytes(body, model_cfg.body_limit()).await {
        Ok(b) => b,
        Err(_) => return fail(StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::PayloadTooLarge.as_str(), None),
    };
    let Ok(serde_json::Value::Object(mut obj)) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return fail(StatusCode::BAD_REQUEST, ErrorCode::BadParams.as_str(), None);
    };
    drop(body);
    let model = match state.store.proxy_turn(&principal, &turn_id).await {
        Ok(m) => m.or_else(|| model_cfg.model.clone()),
        Err(StoreError::Code(code)) => return fail(StatusCode::FORBIDDEN, code.as_str(), None),
        Err(e) => {
            tracing::warn!(error = %e, "model proxy could not check the turn");
            return fail(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable.as_str(), None);
        }
    };
    let Some(model) = model else {
        return fail(StatusCode::SERVICE_UNAVAILABLE, "provider-unconfigured", None);
    };
    // The turn's model, one choice, streamed with usage, output capped: whatever was asked.
    obj.insert("model".into(), model.clone().into());
    obj.remove("n");
    obj.insert("stream".into(), true.into());
    obj.insert("stream_options".into(), serde_json::json!({"include_usage": true}));
    if let Some(cap) = model_cfg.max_output_tokens {
        for key in ["max_tokens", "max_completion_tokens"] {
            if let Some(v) = obj.get_mut(key) {
                *v = v.as_u64().map_or(cap, |n| n.min(cap)).into();
            }
        }
        if !obj.contains_key("max_completion_tokens") {
            obj.insert(
                "max_tokens".into(),
                obj.get("max_tokens").cloned().unwrap_or(cap.into()),
            );
        }
    }
    // Metric labels stay bounded: the configured model, or "other".
    let label = match &model_cfg.model {
        Some(m) if *m == model => m.clone(),
        _ => "other".to_string(),
    };

    let url = format!("{}/chat/completions", base.trim_end_matches('/'));
    let mut req = state.http.post(url).json(&obj).timeout(Duration::from_secs(600));
    drop(obj);
    if let Some(key) = &model_cfg.api_key {
        req = req.bearer_auth(&key.0);
    }
    let started = Instant::now();
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) if e.is_timeout() => {
            return fail(StatusCode::GATEWAY_TIMEOUT, "provider-timeout", None);
        }
        Err(e) => {
            tracing::warn!(error = %without_url(&e), "provider unreachable");
            return fail(StatusCode::BAD_GATEWAY, "provider-unreachable", None);
        }
    };
    state
        .metrics
        .model_latency
        .with_label_values(&["default", &label])
        .observe(started.elapsed().as_secs_f64());
    if !resp.status().is_success() {
        let status = resp.status().as_u16();
        tracing::warn!(status, "provider answered with an error status");
        return fail(StatusCode::BAD_GATEWAY, "provider-status", Some(status));
    }
    let meter = Meter {
        state: state.clone(),
        tenant: principal.tenant_id,
        turn: turn_id,
        label,
        scan: UsageScanner::default(),
        recorded: false,
        _permit: permit,
    };
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(metered(resp.bytes_stream(), meter)))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// Meters one call's usage from the provider's stream; holds the tenant's slot until the
/// stream ends or the worker goes away.
struct Meter {
    state: AppState,
    tenant: String,
    turn: String,
    label: String,
    scan: UsageScanner,
    recorded: bool,
    _permit: OwnedSemaphorePermit,
}

impl Meter {
    /// Record the call's usage (the last one the provider reported), once.
    async fn record(&mut self) {
        let Some(usage) = self.scan.usage.filter(|_| !self.recorded) else {
            return;
        };
        self.recorded = true;
        let m = &self.state.metrics.model_tokens;
        m.with_label_values(&["default", &self.label, "input"])
            .inc_by(usage.input_tokens);
        m.with_label_values(&["default", &self.label, "output"])
            .inc_by(usage.output_tokens);
        if let Err(e) = self.state.store.meter_usage(&self.tenant, &self.turn, usage).await {
            tracing::warn!(turn.id = %self.turn, error = %e, "recording metered usage failed");
        }
    }
}

/// The provider's body, passed through unchanged. Usage is recorded before the chunk that
/// ends the stream (`[DONE]`) goes on, so it is stored by the time the worker reports the step.
fn metered(
    inner: impl Stream<Item = reqwest::Result<Bytes>> + Send + 'static,
    meter: Meter,
) -> impl Stream<Item = reqwest::Result<Bytes>> + Send + 'static {
    futures_util::stream::unfold((Box::pin(inner), meter), |(mut inner, mut meter)| async move {
        let Some(item) = inner.next().await else {
            meter.record().await;
            return None;
        };
        if let Ok(chunk) = &item
            && meter.scan.feed(chunk)
        {
            meter.record().await;
        }
        Some((item, (inner, meter)))
    })
}

/// Follows the `data:` lines of an SSE byte stream for the provider's usage.
#[derive(Default)]
struct UsageScanner {
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
