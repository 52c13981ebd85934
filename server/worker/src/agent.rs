//! The agent loop: model step → tool calls → results → next step, until the model answers
//! without calling a tool (the turn completes) or the step limit is reached (it fails with
//! `step-limit`). Tool calls of one step run in the order given; their results go back to
//! the model in that order.
//!
//! Every status change of a call is an event: the step publishes it `requested`, running
//! it appends `tool.status running`, and its end appends `tool.ended` with the result row
//! (`completed`, `failed`, or `denied` when approval was refused and it never ran).

use berth_protocol::{
    NewRow, Position, RowKind, ToolInfo,
    worker::{self as wp, ToolStatus, TurnDelta, TurnRun},
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{
    coordinator,
    delegate::{self, DELEGATE},
    model::{self, Completion, ToolCall, messages::Conversation},
    policy::{self, Answer},
    tools::Tools,
    turn::{Halt, TurnLink, cause},
};

/// The loop's limits (worker configuration).
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Model steps one turn may take.
    pub max_steps: u32,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig { max_steps: 50 }
    }
}

/// How the loop finished: the final answer, and the last step's rows when they are to be
/// stored with the turn's end (the server takes them in `turn.end`) rather than on their own.
pub(crate) struct Finished {
    pub answer: String,
    pub last_step: Option<Vec<NewRow>>,
}

pub(crate) async fn run(
    t: &TurnLink,
    run: &TurnRun,
    tools: Option<&Tools>,
    config: &AgentConfig,
    cancel: &CancellationToken,
) -> Result<Finished, Halt> {
    let mut conv = Conversation::new(tools.is_some(), run.coordinator);
    let history = tokio::select! {
        h = t.history() => h?,
        _ = cancel.cancelled() => return Err(Halt::Stopped),
    };
    for row in &history {
        conv.push_row(row);
    }
    conv.close_open();
    // This turn's attachments join its prompt (the last user message).
    let attachments = tokio::select! {
        a = crate::attachments::fetch(&t.link.http, &t.link.proxy_url, &t.link.token, run) => a.map_err(Halt::Failed)?,
        _ = cancel.cancelled() => return Err(Halt::Stopped),
    };
    conv.attach(&attachments);
    for _ in 0..config.max_steps {
        let mut body = json!({"model": run.model, "messages": conv.messages(), "stream": true});
        if tools.is_some() {
            let mut schemas = Tools::schemas();
            if run.delegation_depth > 0 {
                schemas.push(delegate::schema());
            }
            if run.coordinator {
                schemas.extend(coordinator::schemas());
            }
            body["tools"] = Value::Array(schemas);
        }
        let completion = tokio::select! {
            c = model::stream(&t.link, t.turn_id(), &body, |text, thinking| delta(t, text, thinking)) => c?,
            _ = cancel.cancelled() => return Err(Halt::Stopped),
        };
        let (rows, first_call) = step_rows(&completion);
        if completion.tool_calls.is_empty() && t.link.end_carries_step {
            // The last step: stored with `turn.ended`, in one commit.
            return Ok(Finished {
                answer: completion.text,
                last_step: Some(rows),
            });
        }
        let sequence = t.step(rows, completion.usage).await?;
        conv.push_step(&completion);
        if completion.tool_calls.is_empty() {
            return Ok(Finished {
                answer: completion.text,
                last_step: None,
            });
        }
        for (i, call) in completion.tool_calls.iter().enumerate() {
            let position = Position {
                source_sequence: sequence,
                item_index: (first_call + i) as i32,
            };
            let output = call_tool(t, run, tools, call, position, cancel).await?;
            conv.push_result(&call.id, &output);
        }
    }
    Err(Halt::Failed(cause("step-limit")))
}

/// Live output, best effort.
async fn delta(t: &TurnLink, text: Option<String>, thinking: Option<String>) -> bool {
    let d = TurnDelta {
        turn_id: t.turn_id().to_string(),
        text,
        thinking,
    };
    t.link
        .notify(wp::TURN_DELTA, serde_json::to_value(&d).unwrap_or_default())
        .await
        .is_ok()
}

/// A step's rows (the assistant's text and thinking, then one `toolCall` row per call) and
/// the index of the first call row.
fn step_rows(c: &Completion) -> (Vec<NewRow>, usize) {
    let mut rows = Vec::new();
    if !c.text.is_empty() || !c.thinking.is_empty() || c.tool_calls.is_empty() {
        rows.push(NewRow {
            kind: RowKind::Assistant,
            body: c.text.clone(),
            thinking: (!c.thinking.is_empty()).then(|| c.thinking.clone()),
            tool: None,
            hidden: None,
        });
    }
    let first_call = rows.len();
    for call in &c.tool_calls {
        rows.push(NewRow {
            kind: RowKind::ToolCall,
            body: call.arguments.clone(),
            thinking: None,
            tool: Some(ToolInfo {
                name: call.name.clone(),
                call_id: call.id.clone(),
                status: ToolStatus::Requested.as_str().into(),
            }),
            hidden: None,
        });
    }
    (rows, first_call)
}

/// Ask if needed, run, publish the end; returns the output the model reads.
async fn call_tool(
    t: &TurnLink,
    run: &TurnRun,
    tools: Option<&Tools>,
    call: &ToolCall,
    position: Position,
    cancel: &CancellationToken,
) -> Result<String, Halt> {
    if cancel.is_cancelled() {
        return Err(Halt::Stopped);
    }
    let Some(tools) = tools else {
        let output = "This session has no tools; the call did not run.".to_string();
        t.tool_ended(position, &call.id, ToolStatus::Failed, output.clone())
            .await?;
        return Ok(output);
    };
    if policy::needs_approval(&call.name, run.auto_approve) {
        match policy::ask(t, call, cancel).await? {
            Answer::Approved => {}
            Answer::Denied(output) => {
                t.tool_ended(position, &call.id, ToolStatus::Denied, output.clone())
                    .await?;
                return Ok(output);
            }
            Answer::Unavailable(output) => {
                t.tool_ended(position, &call.id, ToolStatus::Failed, output.clone())
                    .await?;
                return Ok(output);
            }
        }
    }
    t.tool_status(position, &call.id, ToolStatus::Running).await?;
    let outcome = if call.name == DELEGATE {
        delegate::run(t, call, cancel).await?
    } else if run.coordinator && coordinator::is_tool(&call.name) {
        coordinator::run(t, call, cancel).await?
    } else {
        tools.call(&call.name, &call.arguments, cancel).await
    };
    if cancel.is_cancelled() {
        return Err(Halt::Stopped);
    }
    let status = if outcome.ok {
        ToolStatus::Completed
    } else {
        ToolStatus::Failed
    };
    t.tool_ended(position, &call.id, status, outcome.output.clone()).await?;
    Ok(outcome.output)
}
