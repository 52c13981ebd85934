//! Which tool calls need a person's approval, and asking for it.
//!
//! Without `autoApprove`, calls that change the workspace or run commands (shell, write,
//! edit, apply_patch) and MCP servers' tools are held until answered; reading, listing and searching never
//! are. The worker asks
//! the server with `turn.interaction`; the server persists the interaction, shows it to the
//! session's clients and answers when someone responds (or its fallback does).

use berth_protocol::worker as wp;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{
    model::ToolCall,
    tools,
    turn::{Halt, TurnLink},
};

/// Times an approval request answered `unavailable` is asked again.
const ASK_RETRIES: u32 = 5;

pub(crate) fn needs_approval(tool: &str, auto_approve: bool) -> bool {
    // An MCP tool can do anything its server can: held like a command.
    !auto_approve
        && (matches!(
            tool,
            tools::SHELL | tools::WRITE_FILE | tools::EDIT_FILE | tools::APPLY_PATCH
        ) || tool.starts_with(tools::mcp::PREFIX))
}

/// The answer to an approval request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    Approved,
    /// Not approved; the text is the call's result for the model.
    Denied(String),
    /// The question could not be asked; the text is the call's (failed) result.
    Unavailable(String),
}

/// Ask the server whether `call` may run; waits until answered or the turn is stopped.
pub(crate) async fn ask(t: &TurnLink, call: &ToolCall, cancel: &CancellationToken) -> Result<Answer, Halt> {
    let input =
        serde_json::from_str::<Value>(&call.arguments).unwrap_or_else(|_| Value::String(call.arguments.clone()));
    let params = json!({
        "turnId": t.turn_id(),
        "callId": call.id,
        "kind": "approval",
        "tool": {"name": call.name, "callId": call.id},
        "input": input,
    });
    match interaction(t, params, cancel).await {
        Ok(v) => {
            let approved = v.pointer("/outcome/approved").and_then(Value::as_bool).unwrap_or(false);
            Ok(if approved {
                Answer::Approved
            } else {
                Answer::Denied(denied(v.get("state").and_then(Value::as_str)).into())
            })
        }
        Err(Halt::Refused(code)) => Ok(Answer::Unavailable(format!(
            "Approval could not be asked ({code}); the call did not run."
        ))),
        Err(h) => Err(h),
    }
}

/// Ask the server an interaction (`turn.interaction` params) and wait for its resolution
/// (`{interactionId, outcome, state}`) or the turn's stop. `unavailable` is transient (the
/// server asks to be asked again; the same call waits on the same interaction).
pub(crate) async fn interaction(t: &TurnLink, params: Value, cancel: &CancellationToken) -> Result<Value, Halt> {
    let mut attempt = 0u32;
    loop {
        let answer = tokio::select! {
            a = t.request(wp::TURN_INTERACTION, params.clone()) => a,
            _ = cancel.cancelled() => return Err(Halt::Stopped),
        };
        match answer {
            Err(Halt::Refused(code)) if code == "unavailable" && attempt < ASK_RETRIES => {
                attempt += 1;
                tokio::select! {
                    _ = tokio::time::sleep(std::time::Duration::from_millis(500 * u64::from(attempt))) => {}
                    _ = cancel.cancelled() => return Err(Halt::Stopped),
                }
            }
            other => return other,
        }
    }
}

/// What the model reads for a call that was not approved, by how the question ended: a
/// person said no, nobody was there to ask (the session's fallback answered), or nobody
/// answered in time.
fn denied(state: Option<&str>) -> &'static str {
    match state {
        Some("unwatched") => {
            "Nobody was watching this session to approve this call, so it did not run (the session's fallback \
answered for them). Go on without it if you can, or finish and say what needs approval."
        }
        Some("expired") => "Nobody answered the approval request in time, so this call did not run.",
        _ => "The user denied this call; it did not run.",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_commands_need_approval_unless_auto_approved() {
        for t in [tools::SHELL, tools::WRITE_FILE, tools::EDIT_FILE, "mcp__fs__read"] {
            assert!(needs_approval(t, false));
            assert!(!needs_approval(t, true));
        }
        for t in [tools::READ_FILE, tools::LIST_DIRECTORY, tools::SEARCH_FILES, "unknown"] {
            assert!(!needs_approval(t, false));
        }
    }
}
