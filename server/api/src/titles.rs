//! Automatic titles (SPEC §4.3): after a session's first turn settles, if its title is
//! still empty, the session's model names it from the first prompt and answer. One attempt
//! per session, bounded by [`TITLE_BOUND`]; a human title is never overwritten (the title
//! is only set while still empty); a failure is a `title` diagnostic, never an error. The
//! call counts against the tenant's model-call limits: refused there, it is not attempted
//! (nor claimed), and the session's next completed turn tries again.

use berth_protocol::CauseCode;
use std::time::Duration;

use berth_protocol::Cause;
use serde_json::json;
use tokio::sync::OwnedSemaphorePermit;

use crate::{AppState, complete, providers};

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
        let outcomes = &state.metrics.auto_titles;
        // A title is a model call like a worker's, within the tenant's proxy limits. Refused
        // before the claim, so that the session's next completed turn tries again.
        let Some(permit) = state.proxy.admit(&tenant) else {
            outcomes.with_label_values(&["refused"]).inc();
            tracing::debug!(session.id = %session, "automatic title refused at the tenant's model-call limits");
            return;
        };
        let source = match state.store.claim_title(&tenant, &session, SOURCE_MAX).await {
            Ok(Some(s)) => s,
            Ok(None) => {
                outcomes.with_label_values(&["taken"]).inc();
                return;
            }
            Err(e) => {
                tracing::warn!(session.id = %session, error = %e, "automatic title not claimed");
                return;
            }
        };
        let outcome = match tokio::time::timeout(TITLE_BOUND, ask(&state, &tenant, permit, &source)).await {
            Ok(r) => r,
            Err(_) => Err(providers::cause(CauseCode::ProviderTimeout)),
        };
        outcomes
            .with_label_values(&[if outcome.is_ok() { "named" } else { "failed" }])
            .inc();
        let written = match outcome {
            Ok(title) => state.store.set_auto_title(&tenant, &session, &title).await.map(|_| ()),
            Err(cause) => {
                tracing::info!(session.id = %session, code = %cause.code, "automatic title failed");
                state
                    .store
                    .session_diagnostic(&tenant, &session, berth_protocol::DiagnosticKind::Title, &cause)
                    .await
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
async fn ask(
    state: &AppState,
    tenant: &str,
    permit: OwnedSemaphorePermit,
    source: &berth_store::TitleSource,
) -> Result<String, Cause> {
    let target = complete::Target {
        provider: source.provider.as_deref(),
        model: source.model.as_deref(),
        base_url: source.base_url.as_deref(),
    };
    let messages = json!([
        {"role": "system", "content": INSTRUCTION},
        {"role": "user", "content": format!("User: {}\n\nAssistant: {}", source.prompt, source.answer)},
    ]);
    let text = complete::complete(state, tenant, permit, target, messages, 32, 4096).await?;
    clean(&text).ok_or_else(|| providers::cause(CauseCode::TitleEmpty))
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
