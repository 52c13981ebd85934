//! Compaction (SPEC §4.17): the session's older history summarized by a model call into a
//! handoff row that later requests send instead of those rows (which stay readable). A
//! worker asks for it when a turn nears the model's declared context window
//! (`turn.compact`), a client with `session.compact`; both come here, so there is one
//! summary and one way of writing it.

use berth_protocol::CauseCode;
use std::time::Duration;

use berth_protocol::{Cause, Compaction, ErrorCode, Position, RowKind, SessionCompactResult};
use berth_store::{CompactionSource, Receipt};
use serde_json::json;

use crate::{
    AppState,
    complete::{self, Target},
    error::{ApiError, ApiResult},
    providers,
};

/// The whole summary call's bound.
const BOUND: Duration = Duration::from_secs(180);
/// The summary's length at most, in tokens and bytes.
const SUMMARY_TOKENS: u64 = 4096;
const SUMMARY_BYTES: usize = 64 << 10;
/// Bytes of history text a summary is made from, at most (the newest rows are kept).
const SOURCE_BYTES_MAX: usize = 2 << 20;

const INSTRUCTION: &str = "You compact a long conversation between a user and a coding agent so that the agent \
can go on with the work without it. Write a handoff note: what the user asked for and still wants, what has been \
done (files changed, commands run, results and findings), decisions made, open questions and the next steps. Keep \
exact file paths, names, identifiers and numbers. Answer with the note only.";

/// The context window of `model` on `provider`'s profile, in tokens, as the model proxy
/// takes it too (the profile's figure for the model, else `BERTH_MODEL_CONTEXT_TOKENS`).
/// None: no such profile or no model to ask.
pub(crate) fn context_window(state: &AppState, provider: Option<&str>, model: Option<&str>) -> Option<u64> {
    let providers = state.config.providers.current();
    let profile = providers.get(provider)?;
    let model = model.or(state.config.model.model.as_deref())?;
    Some(state.config.model.spec(profile, model).context_tokens)
}

/// Summarize the session's history before `keep_from` (None: all of it) and write the
/// compaction. None: nothing new to summarize, or already compacted that far. A failed
/// summary is a `compaction` diagnostic and an `unavailable {cause}` error; one refused
/// at the tenant's model-call limits, a diagnostic and `rate-limited`.
pub(crate) async fn compact(
    state: &AppState,
    tenant: &str,
    session_id: &str,
    keep_from: Option<Position>,
    automatic: bool,
    op: Option<&Receipt>,
) -> ApiResult<Option<Compaction>> {
    let store = &state.store;
    let mut source = store
        .compaction_source(tenant, session_id, keep_from, SOURCE_BYTES_MAX)
        .await?;
    if source.rows.is_empty() && source.omitted == 0 {
        if let Some(op) = op {
            let nothing = SessionCompactResult {
                compacted: false,
                compaction: None,
            };
            store.receipt_done(op, &nothing).await?;
        }
        return Ok(None);
    }
    let window = context_window(state, source.provider.as_deref(), source.model.as_deref()).unwrap_or(200_000);
    // The source is about half the window's worth of text (four bytes a token), the
    // newest rows kept; the summary at most a quarter of the window.
    let budget = usize::try_from(window.saturating_mul(2))
        .unwrap_or(usize::MAX)
        .clamp(16 << 10, SOURCE_BYTES_MAX);
    let mut used: usize = source.rows.iter().map(|(_, _, text)| text.len()).sum();
    let mut drop = 0;
    while used > budget && drop < source.rows.len() {
        used -= source.rows[drop].2.len();
        drop += 1;
    }
    source.rows.drain(..drop);
    source.omitted += drop as u64;
    let summary_tokens = (window / 4).clamp(256, SUMMARY_TOKENS);
    let keep_from = keep_from.unwrap_or(source.end);
    let target = Target {
        provider: source.provider.as_deref(),
        model: source.model.as_deref(),
        base_url: source.base_url.as_deref(),
    };
    let messages = json!([
        {"role": "system", "content": INSTRUCTION},
        {"role": "user", "content": transcript(&source)},
    ]);
    // A summary is a model call like a worker's: it takes one of the tenant's proxy slots
    // or is refused (`rate-limited`), so compactions cannot spend past the tenant's limits.
    let permit = match complete::admit(state, tenant) {
        Ok(permit) => permit,
        Err(refused) => {
            let cause = providers::cause(CauseCode::RateLimited);
            return Err(failed(state, tenant, session_id, cause, refused).await);
        }
    };
    let asked = complete::complete(state, tenant, permit, target, messages, summary_tokens, SUMMARY_BYTES);
    let outcome = match tokio::time::timeout(BOUND, asked).await {
        Ok(Ok(text)) if !text.trim().is_empty() => Ok(text.trim().to_string()),
        Ok(Ok(_)) => Err(providers::cause(CauseCode::SummaryEmpty)),
        Ok(Err(cause)) => Err(cause),
        Err(_) => Err(providers::cause(CauseCode::ProviderTimeout)),
    };
    let summary = match outcome {
        Ok(s) => s,
        Err(cause) => {
            let unavailable = ApiError::with(ErrorCode::Unavailable, json!({"cause": cause}));
            return Err(failed(state, tenant, session_id, cause, unavailable).await);
        }
    };
    let written = store
        .compact(tenant, session_id, keep_from, &summary, automatic, op)
        .await?;
    if let Some(c) = &written {
        tracing::info!(session.id = %session_id, keep_from = ?c.keep_from, automatic, "history compacted");
    }
    Ok(written)
}

/// Record the failed compaction as a `compaction` diagnostic; answers `error`.
async fn failed(state: &AppState, tenant: &str, session_id: &str, cause: Cause, error: ApiError) -> ApiError {
    tracing::info!(session.id = %session_id, code = %cause.code, "compaction failed");
    match state
        .store
        .session_diagnostic(tenant, session_id, berth_protocol::DiagnosticKind::Compaction, &cause)
        .await
    {
        Ok(()) => state.hub.event(session_id, 0),
        Err(e) => tracing::warn!(session.id = %session_id, error = %e, "compaction diagnostic not recorded"),
    }
    error
}

/// The history to summarize as plain text, oldest first.
fn transcript(s: &CompactionSource) -> String {
    let mut out = String::new();
    if let Some(previous) = &s.previous {
        out.push_str("[Summary of the conversation before this part]\n");
        out.push_str(previous);
        out.push_str("\n\n");
    }
    if s.omitted > 0 {
        out.push_str(&format!("[… {} earlier items left out …]\n\n", s.omitted));
    }
    for (kind, tool, text) in &s.rows {
        let tool = tool.as_deref().unwrap_or("?");
        let head = match kind {
            RowKind::User => "[User]".to_string(),
            RowKind::Assistant => "[Assistant]".to_string(),
            RowKind::ToolCall => format!("[Tool call: {tool}]"),
            RowKind::ToolResult => format!("[Tool result: {tool}]"),
            RowKind::Notice | RowKind::Handoff => "[Note]".to_string(),
        };
        out.push_str(&head);
        out.push('\n');
        out.push_str(text);
        out.push_str("\n\n");
    }
    out
}
