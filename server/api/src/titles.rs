//! Automatic titles (SPEC §4.3): after a session's first turn settles, if its title is
//! still empty, the session's model names it from the first prompt and answer. One attempt
//! per session, bounded by [`TITLE_BOUND`]; a human title is never overwritten (the title
//! is only set while still empty); a failure is a `title` diagnostic, never an error.

use std::time::Duration;

use berth_protocol::Cause;
use serde_json::{Value, json};

use crate::{AppState, providers, proxy};

/// The whole attempt's bound.
const TITLE_BOUND: Duration = Duration::from_secs(10);
/// Bytes of the first prompt and answer the title is made from.
const SOURCE_MAX: i32 = 2000;
/// Characters of a title at most.
const TITLE_MAX: usize = 80;

const INSTRUCTION: &str = "Name this conversation in at most six words. Answer with the title only: \
                           no quotes, no punctuation at the end.";

/// Try the session's automatic title in the background.
pub(crate) fn spawn(state: AppState, tenant: String, session: String) {
    if !state.config.auto_titles {
        return;
    }
    tokio::spawn(async move {
        let source = match state.store.claim_title(&tenant, &session, SOURCE_MAX).await {
            Ok(Some(s)) => s,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(session.id = %session, error = %e, "automatic title not claimed");
                return;
            }
        };
        let outcome = match tokio::time::timeout(TITLE_BOUND, ask(&state, &tenant, &source)).await {
            Ok(r) => r,
            Err(_) => Err(providers::cause("provider-timeout")),
        };
        let written = match outcome {
            Ok(title) => state.store.set_auto_title(&tenant, &session, &title).await.map(|_| ()),
            Err(cause) => {
                tracing::info!(session.id = %session, code = %cause.code, "automatic title failed");
                state.store.session_diagnostic(&tenant, &session, "title", &cause).await
            }
        };
        match written {
            // Wakes this replica's diagnostic watchers (the title event notifies all replicas).
            Ok(()) => state.hub.event(&session, 0),
            Err(e) => tracing::warn!(session.id = %session, error = %e, "automatic title not recorded"),
        }
    });
}

/// One model call for the title, through the session's profile, metered like any other.
async fn ask(state: &AppState, tenant: &str, source: &berth_store::TitleSource) -> Result<String, Cause> {
    let providers_now = state.config.providers.current();
    let profile = providers_now
        .get(source.provider.as_deref())
        .ok_or_else(|| providers::cause("provider-unconfigured"))?;
    let model = source
        .model
        .clone()
        .or_else(|| state.config.model.model.clone())
        .ok_or_else(|| providers::cause("provider-unconfigured"))?;
    let (base, with_key) =
        proxy::endpoint(profile, source.base_url.as_deref()).ok_or_else(|| providers::cause("base-url-not-allowed"))?;
    let chat = json!({
        "model": model,
        "max_tokens": 32,
        "messages": [
            {"role": "system", "content": INSTRUCTION},
            {"role": "user", "content": format!("User: {}\n\nAssistant: {}", source.prompt, source.answer)},
        ],
    });
    let Value::Object(chat) = chat else {
        return Err(providers::cause("internal"));
    };
    let outgoing = providers::request(profile.api, chat, None);
    let url = format!("{}{}", base.trim_end_matches('/'), outgoing.path);
    let build = || {
        let req = state.provider_http.post(&url).json(&outgoing.body);
        let req = providers::headers(profile.api, req);
        if with_key {
            providers::authorize(profile, req)
        } else {
            req
        }
    };
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
        _permit: None,
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
                && text.len() < 4096
            {
                text.push_str(piece);
            }
        })?;
    }
    if let Some(cause) = failure {
        return Err(cause);
    }
    if !done {
        return Err(providers::cause("provider-stream-ended"));
    }
    clean(&text).ok_or_else(|| providers::cause("title-empty"))
}

/// The first line, unquoted, trimmed and cut to [`TITLE_MAX`] characters.
fn clean(text: &str) -> Option<String> {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    let line = line.trim_matches(|c| matches!(c, '"' | '\'' | '`' | '*' | '#')).trim();
    let line = line.strip_prefix("Title:").map(str::trim).unwrap_or(line);
    let title: String = line.chars().take(TITLE_MAX).collect();
    let title = title.trim().trim_end_matches('.').trim().to_string();
    (!title.is_empty()).then_some(title)
}

#[cfg(test)]
mod tests {
    use super::clean;

    #[test]
    fn titles_are_one_clean_line() {
        assert_eq!(
            clean("\n \"Fixing the build.\"\nmore").as_deref(),
            Some("Fixing the build")
        );
        assert_eq!(clean("Title: Greeting").as_deref(), Some("Greeting"));
        assert_eq!(clean("  \n "), None);
        assert_eq!(clean(&"x".repeat(500)).map(|t| t.len()), Some(80));
    }
}
