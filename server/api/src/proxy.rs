//! The streaming model proxy: workers call the provider through the API tier, so provider
//! keys never leave it and workspace machines need no internet egress.
//!
//! `POST /v1/model/chat/completions` with a worker credential. The body is an OpenAI Chat
//! Completions request; the proxy fills in the default model, forces streaming with usage,
//! adds the provider key and streams the provider's SSE body back unchanged. Failures answer
//! `{"error": {code, status?}}` with a typed cause and never the provider's body.

use std::time::{Duration, Instant};

use axum::{
    Json,
    body::Body,
    extract::State,
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
};
use berth_protocol::{Cause, worker::ProxyError};
use berth_store::CredentialKind;

use crate::{AppState, rpc::bearer};

fn fail(status: StatusCode, code: &str, provider_status: Option<u16>) -> Response {
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

pub async fn chat_completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    Json(mut body): Json<serde_json::Value>,
) -> Response {
    let authorized = match bearer(&headers) {
        Some(t) => {
            matches!(state.store.authenticate(t).await, Ok(Some(p)) if p.kind == CredentialKind::Worker)
        }
        None => false,
    };
    if !authorized {
        state.metrics.auth_failures.with_label_values(&["model-proxy"]).inc();
        return fail(StatusCode::UNAUTHORIZED, "unauthorized", None);
    }
    let model_cfg = &state.config.model;
    let Some(base) = model_cfg.base_url.as_deref() else {
        return fail(StatusCode::SERVICE_UNAVAILABLE, "provider-unconfigured", None);
    };
    let Some(obj) = body.as_object_mut() else {
        return fail(StatusCode::BAD_REQUEST, "bad-params", None);
    };
    if obj.get("model").is_none_or(|m| m.is_null())
        && let Some(m) = &model_cfg.model
    {
        obj.insert("model".into(), m.clone().into());
    }
    obj.insert("stream".into(), true.into());
    obj.insert("stream_options".into(), serde_json::json!({"include_usage": true}));
    // Metric labels stay bounded: the configured model, or "other" for anything a worker asks.
    let requested = obj.get("model").and_then(|m| m.as_str()).unwrap_or("");
    let model = match &model_cfg.model {
        Some(m) if m == requested => m.clone(),
        _ => "other".to_string(),
    };

    let url = format!("{}/chat/completions", base.trim_end_matches('/'));
    let mut req = state.http.post(url).json(&body).timeout(Duration::from_secs(600));
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
        .with_label_values(&["default", &model])
        .observe(started.elapsed().as_secs_f64());
    if !resp.status().is_success() {
        let status = resp.status().as_u16();
        tracing::warn!(status, "provider answered with an error status");
        return fail(StatusCode::BAD_GATEWAY, "provider-status", Some(status));
    }
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(resp.bytes_stream()))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
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
