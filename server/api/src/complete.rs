//! One model call the API tier makes itself (automatic titles, compaction summaries):
//! through a session's provider profile, metered like any other, read back into text.

use berth_protocol::Cause;
use berth_protocol::CauseCode;
use berth_protocol::ErrorCode;
use serde_json::{Value, json};
use tokio::sync::OwnedSemaphorePermit;

use crate::{AppState, error::ApiError, providers, proxy};

/// A slot for one model call of `tenant` the API tier makes itself (a compaction's summary,
/// a model probe), or `rate-limited {limit: "model-calls"}` at the tenant's limits
/// ([`proxy::ProxyLimits::admit`]).
pub(crate) fn admit(state: &AppState, tenant: &str) -> Result<OwnedSemaphorePermit, ApiError> {
    state
        .proxy
        .admit(tenant)
        .ok_or_else(|| ApiError::with(ErrorCode::RateLimited, json!({"limit": "model-calls"})))
}

/// The model a call goes to: a profile (None: the default), a model (None: the tenant
/// default) and a session's own endpoint.
pub(crate) struct Target<'a> {
    pub provider: Option<&'a str>,
    pub model: Option<&'a str>,
    pub base_url: Option<&'a str>,
}

/// Ask for one answer to `messages` (chat-completions shape) of at most `max_tokens`;
/// answers its text (at most `max_bytes` of it). `permit` is the tenant's proxy slot
/// ([`proxy::ProxyLimits::admit`]), held until the provider's stream ends: the API tier's
/// own calls count against the tenant's limits like a worker's.
pub(crate) async fn complete(
    state: &AppState,
    tenant: &str,
    permit: OwnedSemaphorePermit,
    target: Target<'_>,
    messages: Value,
    max_tokens: u64,
    max_bytes: usize,
) -> Result<String, Cause> {
    let providers_now = state.config.providers.current();
    let profile = providers_now
        .get(target.provider)
        .ok_or_else(|| providers::cause(CauseCode::ProviderUnconfigured))?;
    let model = target
        .model
        .map(str::to_string)
        .or_else(|| state.config.model.model.clone())
        .ok_or_else(|| providers::cause(CauseCode::ProviderUnconfigured))?;
    let (base, with_key) =
        proxy::endpoint(profile, target.base_url).ok_or_else(|| providers::cause(CauseCode::BaseUrlNotAllowed))?;
    let mut max_tokens = max_tokens;
    if let Some(cap) = state.config.model.max_output_tokens {
        max_tokens = max_tokens.min(cap);
    }
    let chat = json!({"model": model, "max_tokens": max_tokens, "messages": messages});
    let Value::Object(chat) = chat else {
        return Err(providers::cause(CauseCode::Internal));
    };
    // No reasoning asked for: a title or a summary needs none.
    let outgoing = providers::request(profile.api, chat, None).encode();
    let build = outgoing.builder(proxy::client_for(state, profile, with_key), profile, base, with_key);
    let resp = proxy::send_with_retries(build, &state.config.model.resilience).await?;
    let meter = proxy::Meter {
        state: state.clone(),
        tenant: tenant.to_string(),
        turn: None,
        context: None,
        provider: profile.name.clone(),
        label: proxy::model_label(&state.config.model, profile, &model),
        scan: Default::default(),
        recorded: false,
        _permit: Some(permit),
        _stream: None,
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(proxy::pump(
        resp,
        providers::translator(profile.api),
        state.config.model.resilience.idle_timeout,
        tx,
        meter,
    ));
    // Read the normalized stream back into text.
    let mut sse = providers::SseParser::default();
    let mut text = String::new();
    let mut failure = None;
    let mut done = false;
    while let Some(bytes) = rx.recv().await {
        sse.feed(&bytes, |_, data| {
            if data == "[DONE]" {
                done = true;
                return;
            }
            let Ok(chunk) = serde_json::from_str::<Value>(data) else {
                return;
            };
            if let Some(err) = chunk
                .get("error")
                .and_then(|e| serde_json::from_value::<Cause>(e.clone()).ok())
            {
                failure = Some(err);
            }
            if let Some(piece) = chunk.pointer("/choices/0/delta/content").and_then(Value::as_str)
                && text.len() < max_bytes
            {
                text.push_str(piece);
            }
        })?;
    }
    if let Some(cause) = failure {
        return Err(cause);
    }
    if !done {
        return Err(providers::cause(CauseCode::ProviderStreamEnded));
    }
    Ok(text)
}
