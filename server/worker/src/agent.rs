//! The agent loop: model step → tool calls → results → next step, until the model answers
//! without calling a tool (the turn completes). At the step limit the model gets one last
//! step to summarise, without running tools (the turn completes, with a `step-limit`
//! notice). Tool calls of one step run in the order given; their results go back to
//! the model in that order.
//!
//! Every status change of a call is an event: the step publishes it `requested`, running
//! it appends `tool.status running`, and its end appends `tool.ended` with the result row
//! (`completed`, `failed`, or `denied` when approval was refused and it never ran).

use berth_protocol::{
    CauseCode, NewRow, Position, RowKind, SkillInfo, ToolInfo,
    worker::{self as wp, ToolStatus, TurnDelta, TurnRun},
};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::{
    coordinator,
    delegate::{self, DELEGATE},
    model::{
        self, Completion, ToolCall,
        messages::{self, Conversation},
    },
    policy::{self, Answer},
    skills,
    tools::{
        Tools, ask, attach,
        image::Image,
        mcp::{Mcp, Problem},
        plan,
    },
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
    // The turn's MCP servers live as long as the turn; one that cannot be used is a notice.
    let mcp = match tools {
        Some(tools) => {
            // Only servers whose tools the agent's definition could offer are started.
            let offerable = run.agent.as_ref().and_then(|a| a.tools.as_deref());
            let (mcp, problems) = tools.connect_mcp(&run.mcp_servers, offerable, cancel).await;
            for p in &problems {
                if let Err(h) = t.notice(Problem::CODE, p.params()).await {
                    mcp.shutdown().await;
                    return Err(h);
                }
            }
            mcp
        }
        None => Mcp::default(),
    };
    let result = steps(t, run, tools, &mcp, config, cancel).await;
    mcp.shutdown().await;
    result
}

async fn steps(
    t: &TurnLink,
    run: &TurnRun,
    tools: Option<&Tools>,
    mcp: &Mcp,
    config: &AgentConfig,
    cancel: &CancellationToken,
) -> Result<Finished, Halt> {
    // The conversation is asked for first and read while the workspace's skills are listed
    // and the attachments fetched: one wait for the three.
    let skills = async {
        match tools {
            Some(tools) => skills::offered(tools.workspace().clone(), &run.skills).await,
            None => Vec::new(),
        }
    };
    let attachments = crate::attachments::fetch(&t.link.http, &t.link.proxy_url, &t.link.token, run);
    // Where the model works (the working directory, git, AGENTS.md), read meanwhile too.
    let environment = async {
        let Some(tools) = tools else { return String::new() };
        let ws = tools.workspace().clone();
        tokio::task::spawn_blocking(move || crate::prompt::environment(&ws))
            .await
            .unwrap_or_default()
    };
    let (history, skills, attachments, environment) = tokio::select! {
        biased;
        r = async { tokio::join!(t.history(), skills, attachments, environment) } => r,
        _ = cancel.cancelled() => return Err(Halt::Stopped),
    };
    let attachments = attachments.map_err(Halt::Failed)?;
    let schemas = tools.map(|tools| offered(tools, run, !skills.is_empty(), mcp));
    let mut system = system_prompt(run, tools.is_some());
    if is_offered(schemas.as_deref(), skills::READ_SKILL) {
        system.push_str(&skills::prompt_section(&skills));
    }
    // Where the model works, last (after its instructions and skills).
    system.push_str(&environment);
    let mut conv = conversation(&system, history?, &attachments);
    // A compaction only ever moves forward: one that did not help is not asked for again.
    let mut compacted_to: Option<Position> = None;
    // Every call id the turn's steps used so far (see `unique_in_turn`).
    let mut call_ids = std::collections::HashSet::new();
    for step in 0..=config.max_steps {
        // Past the limit: one last step to summarise, its tool calls not run.
        let last = step == config.max_steps;
        if last {
            t.notice(STEP_LIMIT, serde_json::json!({"maxSteps": config.max_steps}))
                .await?;
            conv.push_note(&step_limit_note(config.max_steps));
        }
        let mut body = request(run, &conv, schemas.as_deref(), last);
        if let Some(window) = run.context_tokens
            && estimated_tokens(&body, &conv) > window * COMPACT_AT_PERCENT / 100
            && let Some(keep_from) = conv.cut(window * KEEP_PERCENT / 100)
            && compacted_to.is_none_or(|c| keep_from > c)
        {
            compacted_to = Some(keep_from);
            if compact(t, keep_from, cancel).await? {
                conv = load(t, &system, &attachments, cancel).await?;
                if last {
                    conv.push_note(&step_limit_note(config.max_steps));
                }
                body = request(run, &conv, schemas.as_deref(), last);
            }
        }
        let mut completion = tokio::select! {
            c = model::stream(&t.link, t.turn_id(), body, |text, thinking| delta(t, text, thinking)) => c?,
            _ = cancel.cancelled() => return Err(Halt::Stopped),
        };
        if last {
            completion.tool_calls.clear();
        }
        unique_in_turn(&mut completion.tool_calls, &mut call_ids, step);
        let (rows, first_call) = step_rows(&completion);
        if completion.tool_calls.is_empty() && t.link.end_carries_step {
            // The last step: stored with `turn.ended`, in one commit.
            return Ok(Finished {
                answer: completion.text,
                last_step: Some(rows),
            });
        }
        let sequence = t.step(rows, completion.usage).await?;
        conv.push_step(&completion, sequence);
        if completion.tool_calls.is_empty() {
            return Ok(Finished {
                answer: completion.text,
                last_step: None,
            });
        }
        let mut viewed = Vec::new();
        let calls = &completion.tool_calls;
        let position = |i: usize| Position {
            source_sequence: sequence,
            item_index: (first_call + i) as i32,
        };
        let mut i = 0;
        while i < calls.len() {
            // Reads in a row run together (a model often reads several files, or searches
            // several ways, in one step); anything else runs alone, in its order.
            let reads = calls[i..]
                .iter()
                .take_while(|c| Tools::runs_alongside(&c.name) && is_offered(schemas.as_deref(), &c.name))
                .count();
            if let (Some(tools), 2..) = (tools, reads) {
                let batch: Vec<_> = (i..i + reads).map(|k| (position(k), &calls[k])).collect();
                for ((_, call), (output, image)) in batch.iter().zip(call_reads(t, tools, &batch, cancel).await?) {
                    conv.push_result(&call.id, &output);
                    viewed.extend(image);
                }
                i += reads;
                continue;
            }
            let call = &calls[i];
            // A delegate call past the depth bound is answered by the delegate tool (which
            // says why); any other call to a tool not offered does not run.
            let depth_spent = call.name == DELEGATE && run.delegation_depth == 0;
            let tools = tools.filter(|_| depth_spent || is_offered(schemas.as_deref(), &call.name));
            let (output, image) = call_tool(t, run, tools, mcp, &skills, call, position(i), cancel).await?;
            conv.push_result(&call.id, &output);
            viewed.extend(image);
            i += 1;
        }
        // Images the calls showed come after all the step's results (a result is text).
        conv.push_images(viewed);
    }
    Err(Halt::Failed(cause(CauseCode::StepLimit)))
}

/// A call id names one call for its whole turn: the server answers an approval asked again
/// under the same id (a retry) with its first answer, and a delegate call with its first
/// child. So a call whose id an earlier step of the turn used (a model writing its own ids,
/// a provider sending none, whose calls the stream names `call_0`, … in every step) gets a
/// fresh one before anything is stored or asked, and the model sees it so from then on.
fn unique_in_turn(calls: &mut [ToolCall], used: &mut std::collections::HashSet<String>, step: u32) {
    for call in calls {
        let mut n = 0u32;
        while used.contains(&call.id) {
            n += 1;
            // Within the server's 200 bytes for an id, cut at a character boundary.
            let mut base = call.id.split('~').next().unwrap_or_default().to_string();
            while base.len() > 150 {
                base.pop();
            }
            call.id = format!("{base}~{step}.{n}");
        }
        used.insert(call.id.clone());
    }
}

/// The notice of a turn that reached its step limit (and its cause, were it to fail there).
const STEP_LIMIT: &str = berth_protocol::NoticeCode::StepLimit.as_str();

/// What the model is told when its steps are used up.
fn step_limit_note(max_steps: u32) -> String {
    format!(
        "[Berth: this turn has used all {max_steps} of its steps, so tools no longer run. Answer now without \
calling a tool: summarise what you did, what is left to do, and anything the user should check.]"
    )
}

/// A turn nearing its model's declared context window compacts once the request's
/// estimate passes this share of the window, keeping about [`KEEP_PERCENT`] of it whole.
const COMPACT_AT_PERCENT: u64 = 80;
const KEEP_PERCENT: u64 = 30;

/// The conversation as the model gets it: the system prompt, the latest compaction's
/// summary, the rows after it, this turn's attachments with its prompt.
async fn load(
    t: &TurnLink,
    system: &str,
    attachments: &[crate::attachments::Received],
    cancel: &CancellationToken,
) -> Result<Conversation, Halt> {
    let history = tokio::select! {
        h = t.history() => h?,
        _ = cancel.cancelled() => return Err(Halt::Stopped),
    };
    Ok(conversation(system, history, attachments))
}

/// The conversation from the session's history (`turn.history`: the hand-off, then the rows).
fn conversation(
    system: &str,
    (handoff, history): (Option<berth_protocol::worker::Handoff>, Vec<berth_protocol::Row>),
    attachments: &[crate::attachments::Received],
) -> Conversation {
    let mut conv = Conversation::new(system.to_string());
    if let Some(h) = &handoff {
        conv.push_handoff(&h.summary);
    }
    for row in &history {
        conv.push_row(row);
    }
    conv.close_open();
    conv.attach(attachments);
    conv
}

/// A model request for the conversation so far, written out once: sent as it is, and its
/// length is the compaction's estimate (the conversation is borrowed, not copied into a
/// request tree).
fn request(run: &TurnRun, conv: &Conversation, schemas: Option<&[Value]>, no_tool_calls: bool) -> Vec<u8> {
    let params = run.agent.as_ref().and_then(|a| a.params.as_ref());
    let body = ModelRequest {
        model: run.model.as_deref(),
        messages: conv.messages(),
        stream: true,
        tools: schemas,
        // The tools stay declared (the history has calls to them), but none is to be called.
        tool_choice: (no_tool_calls && schemas.is_some()).then_some("none"),
        // The agent's sampling parameters (the proxy still caps the output).
        temperature: params.and_then(|p| p.temperature),
        top_p: params.and_then(|p| p.top_p),
        max_tokens: params.and_then(|p| p.max_tokens),
    };
    serde_json::to_vec(&body).unwrap_or_default()
}

/// A chat-completions request as the worker sends it to the proxy.
#[derive(serde::Serialize)]
struct ModelRequest<'a> {
    model: Option<&'a str>,
    messages: &'a [Value],
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a [Value]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u64>,
}

/// About four bytes a token (as `session.context` estimates), an image shown as what it
/// costs a model rather than its base64 text.
fn estimated_tokens(body: &[u8], conv: &Conversation) -> u64 {
    let (images, image_bytes) = conv.images();
    (body.len().saturating_sub(image_bytes) as u64).div_ceil(4) + images as u64 * messages::IMAGE_TOKENS
}

/// Ask the server to summarize the history before `keep_from` (`turn.compact`); true when
/// the history changed. A failure is not the turn's: it goes on uncompacted.
async fn compact(t: &TurnLink, keep_from: Position, cancel: &CancellationToken) -> Result<bool, Halt> {
    let p = wp::TurnCompact {
        turn_id: t.turn_id().to_string(),
        keep_from,
    };
    let answer = tokio::select! {
        a = t.request(wp::TURN_COMPACT, serde_json::to_value(&p).unwrap_or_default()) => a,
        _ = cancel.cancelled() => return Err(Halt::Stopped),
    };
    match answer {
        Ok(v) => Ok(v.get("compacted").and_then(Value::as_bool).unwrap_or(false)),
        Err(Halt::Refused(code)) => {
            tracing::warn!(turn.id = %t.turn_id(), code, "compaction failed; going on without it");
            Ok(false)
        }
        Err(h) => Err(h),
    }
}

/// The system prompt: the agent's own, else the built-in one.
fn system_prompt(run: &TurnRun, tools: bool) -> String {
    let mut prompt = match run.agent.as_ref().and_then(|a| a.system_prompt.clone()) {
        Some(prompt) => prompt,
        None => messages::default_system_prompt(tools).to_string(),
    };
    if tools && run.coordinator {
        prompt.push(' ');
        prompt.push_str(messages::COORDINATOR_PROMPT);
    }
    if let Some(channel) = &run.channel {
        prompt.push_str("\n\n");
        prompt.push_str(&messages::channel_prompt(channel, tools));
    }
    prompt
}

/// The tool schemas the model is offered: the built-in tools (`delegate` while the session
/// may still delegate, `read_skill` when there are skills) and the turn's MCP tools
/// (`mcp__<server>__<tool>`), narrowed to the agent's tool set when it names one.
fn offered(tools: &Tools, run: &TurnRun, with_skills: bool, mcp: &Mcp) -> Vec<Value> {
    let mut schemas = tools.schemas();
    schemas.push(plan::schema());
    schemas.push(ask::schema());
    if run.delegation_depth > 0 {
        schemas.push(delegate::schema());
    }
    if with_skills {
        schemas.push(skills::schema());
    }
    schemas.extend(mcp.schemas());
    if let Some(names) = run.agent.as_ref().and_then(|a| a.tools.as_ref()) {
        // `shell_output` reads what `shell` started: it comes with it.
        let named = |name: &str| {
            names
                .iter()
                .any(|n| n == name || (name == crate::tools::jobs::SHELL_OUTPUT && n == crate::tools::SHELL))
        };
        schemas.retain(|s| schema_name(s).is_some_and(named));
    }
    // A coordinator's own tools are what the session is for: no tool set takes them away;
    // nor a channel session's way to send its reader a file.
    if run.coordinator {
        schemas.extend(coordinator::schemas());
    }
    if run.channel.is_some() {
        schemas.push(attach::schema());
    }
    schemas
}

fn schema_name(schema: &Value) -> Option<&str> {
    schema.pointer("/function/name").and_then(Value::as_str)
}

/// Whether the model was offered tool `name` (a call to any other does not run).
fn is_offered(schemas: Option<&[Value]>, name: &str) -> bool {
    schemas.is_some_and(|s| s.iter().any(|s| schema_name(s) == Some(name)))
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

/// Read-only calls of one step (see [`Tools::runs_alongside`]; none asks for approval), run
/// together: each is announced running in its order, they run at once, and their ends are
/// published in their order, so history holds their results as if they had run one after
/// another. Returns what the model reads of each, and the image it is shown.
async fn call_reads(
    t: &TurnLink,
    tools: &Tools,
    calls: &[(Position, &ToolCall)],
    cancel: &CancellationToken,
) -> Result<Vec<(String, Option<Image>)>, Halt> {
    for (position, call) in calls {
        if cancel.is_cancelled() {
            return Err(Halt::Stopped);
        }
        t.tool_status(*position, &call.id, ToolStatus::Running).await?;
    }
    let outcomes = futures_util::future::join_all(
        calls
            .iter()
            .map(|(_, call)| tools.call(&call.name, &call.arguments, cancel)),
    )
    .await;
    let mut out = Vec::with_capacity(calls.len());
    for ((position, call), outcome) in calls.iter().zip(outcomes) {
        if cancel.is_cancelled() {
            return Err(Halt::Stopped);
        }
        t.tool_ended(*position, &call.id, ended(&outcome), outcome.output.clone())
            .await?;
        out.push((outcome.output, outcome.image));
    }
    Ok(out)
}

/// How a call that ran ended, by its outcome.
fn ended(outcome: &crate::tools::Outcome) -> ToolStatus {
    if outcome.ok {
        ToolStatus::Completed
    } else {
        ToolStatus::Failed
    }
}

/// Ask if needed, run, publish the end; returns the output the model reads and the image
/// it is shown (`view_image`).
#[allow(clippy::too_many_arguments)] // the turn's tool families, each passed as it is
async fn call_tool(
    t: &TurnLink,
    run: &TurnRun,
    tools: Option<&Tools>,
    mcp: &Mcp,
    skills: &[SkillInfo],
    call: &ToolCall,
    position: Position,
    cancel: &CancellationToken,
) -> Result<(String, Option<Image>), Halt> {
    if cancel.is_cancelled() {
        return Err(Halt::Stopped);
    }
    let Some(tools) = tools else {
        let output = format!(
            "The tool {:?} is not offered in this session; the call did not run.",
            call.name
        );
        t.tool_ended(position, &call.id, ToolStatus::Failed, output.clone())
            .await?;
        return Ok((output, None));
    };
    if policy::needs_approval(&call.name, run.auto_approve) {
        match policy::ask(t, call, cancel).await? {
            Answer::Approved => {}
            Answer::Denied(output) => {
                t.tool_ended(position, &call.id, ToolStatus::Denied, output.clone())
                    .await?;
                return Ok((output, None));
            }
            Answer::Unavailable(output) => {
                t.tool_ended(position, &call.id, ToolStatus::Failed, output.clone())
                    .await?;
                return Ok((output, None));
            }
        }
    }
    t.tool_status(position, &call.id, ToolStatus::Running).await?;
    let outcome = if call.name == DELEGATE {
        delegate::run(t, call, cancel).await?
    } else if call.name == skills::READ_SKILL {
        tokio::select! {
            o = skills::run(t, tools.workspace().clone(), skills, &call.arguments) => o?,
            _ = cancel.cancelled() => return Err(Halt::Stopped),
        }
    } else if run.coordinator && coordinator::is_tool(&call.name) {
        coordinator::run(t, call, cancel).await?
    } else if call.name == ask::ASK_USER {
        ask::run(t, call, cancel).await?
    } else if call.name == plan::UPDATE_PLAN {
        plan::run(t, &call.arguments).await?
    } else if call.name == attach::ATTACH_FILE {
        let max = run.max_attachment_bytes.unwrap_or(0);
        tokio::select! {
            o = attach::run(t, tools.workspace().clone(), max, &call.arguments) => o,
            _ = cancel.cancelled() => return Err(Halt::Stopped),
        }
    } else if mcp.offers(&call.name) {
        mcp.call(&call.name, &call.arguments, cancel).await
    } else {
        tools.call(&call.name, &call.arguments, cancel).await
    };
    if cancel.is_cancelled() {
        return Err(Halt::Stopped);
    }
    t.tool_ended(position, &call.id, ended(&outcome), outcome.output.clone())
        .await?;
    Ok((outcome.output, outcome.image))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calls(ids: &[&str]) -> Vec<ToolCall> {
        ids.iter()
            .map(|id| ToolCall {
                id: id.to_string(),
                name: "shell".into(),
                arguments: "{}".into(),
            })
            .collect()
    }

    /// A later step's call never reuses an id of the turn (its approval or its delegate
    /// child would be the earlier call's), however the model or provider named it.
    #[test]
    fn call_ids_are_unique_within_a_turn() {
        let mut used = std::collections::HashSet::new();
        let mut first = calls(&["call_0", "call_1"]);
        unique_in_turn(&mut first, &mut used, 0);
        assert_eq!(first[0].id, "call_0", "a fresh id is kept");
        let mut second = calls(&["call_0", "call_9"]);
        unique_in_turn(&mut second, &mut used, 1);
        assert_eq!(second[0].id, "call_0~1.1");
        assert_eq!(second[1].id, "call_9");
        let mut third = calls(&["call_0~1.1", "call_0"]);
        unique_in_turn(&mut third, &mut used, 2);
        assert_eq!(third[0].id, "call_0~2.1");
        assert_eq!(third[1].id, "call_0~2.2");
        let long = "é".repeat(150);
        let mut fourth = calls(&[&long, &long]);
        unique_in_turn(&mut fourth, &mut used, 3);
        assert!(fourth[1].id.len() <= 200 && fourth[1].id.ends_with("~3.1"));
        assert_eq!(used.len(), 8, "every id distinct");
    }
}
