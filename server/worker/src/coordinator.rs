//! A coordinator session's tools (SPEC §4.15): list the tenant's workspaces, start a child
//! session in one of them, send to a child, wait for a child's turn and read its answer,
//! stop a child. Children may run on other workers, so every call goes through the API
//! tier (`turn.workspaces`, `turn.childStart`, …), which checks the tenant, the bounds and
//! that the session is a child of this coordinator; this worker never reaches another.

use berth_protocol::{
    TurnState, Workspace,
    worker::{
        self as wp, ChildTurn, ChildWaitResult, TurnChildSend, TurnChildStart, TurnChildStop, TurnChildStopResult,
        TurnChildWait, TurnWorkspaces, TurnWorkspacesResult,
    },
};
use serde::{Deserialize, de::DeserializeOwned};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{
    model::ToolCall,
    tools::Outcome,
    turn::{Halt, TurnLink, rpc_code},
};

pub(crate) const LIST_WORKSPACES: &str = "list_workspaces";
pub(crate) const START_CHILD: &str = "start_child";
pub(crate) const SEND_CHILD: &str = "send_child";
pub(crate) const WAIT_CHILD: &str = "wait_child";
pub(crate) const STOP_CHILD: &str = "stop_child";

pub(crate) fn is_tool(name: &str) -> bool {
    matches!(
        name,
        LIST_WORKSPACES | START_CHILD | SEND_CHILD | WAIT_CHILD | STOP_CHILD
    )
}

pub(crate) fn schemas() -> Vec<Value> {
    let f = |name: &str, description: &str, parameters: Value| json!({"type": "function", "function": {"name": name, "description": description, "parameters": parameters}});
    vec![
        f(
            LIST_WORKSPACES,
            "List the workspaces child sessions can work in: id, title, host, path and whether its worker is online.",
            json!({"type": "object", "properties": {}}),
        ),
        f(
            START_CHILD,
            "Start a child session (an agent of its own) in a workspace with a self-contained task; returns its session id at once, while it works.",
            json!({"type": "object", "properties": {
                "workspace_id": {"type": "string", "description": "From list_workspaces."},
                "prompt": {"type": "string", "description": "The task, with everything the child needs to know."},
                "title": {"type": "string", "description": "A short title for the child session."},
                "agent": {"type": "string", "description": "Optional: the name (or id) of one of the team's agent definitions for the child to run as."}
            }, "required": ["workspace_id", "prompt"]}),
        ),
        f(
            SEND_CHILD,
            "Send a follow-up prompt to a child session (it queues behind a turn that runs).",
            json!({"type": "object", "properties": {
                "session_id": {"type": "string"},
                "prompt": {"type": "string"}
            }, "required": ["session_id", "prompt"]}),
        ),
        f(
            WAIT_CHILD,
            "Wait until a child's turn (default: its latest) ends; returns how it ended and its final answer. Returns at once if the child's workspace is offline.",
            json!({"type": "object", "properties": {
                "session_id": {"type": "string"},
                "turn_id": {"type": "string", "description": "A turn returned by start_child or send_child."},
                "timeout_secs": {"type": "integer", "description": "Give up waiting after this many seconds (the child keeps working)."}
            }, "required": ["session_id"]}),
        ),
        f(
            STOP_CHILD,
            "Stop a child session's running and queued turns.",
            json!({"type": "object", "properties": {
                "session_id": {"type": "string"}
            }, "required": ["session_id"]}),
        ),
    ]
}

#[derive(Deserialize)]
struct Start {
    workspace_id: String,
    prompt: String,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    agent: Option<String>,
}

#[derive(Deserialize)]
struct Send {
    session_id: String,
    prompt: String,
}

#[derive(Deserialize)]
struct Wait {
    session_id: String,
    #[serde(default)]
    turn_id: Option<String>,
    #[serde(default)]
    timeout_secs: Option<u64>,
}

#[derive(Deserialize)]
struct Stop {
    session_id: String,
}

fn args<A: DeserializeOwned>(arguments: &str) -> Result<A, Outcome> {
    let text = if arguments.trim().is_empty() { "{}" } else { arguments };
    serde_json::from_str(text).map_err(|e| Outcome::error(format!("invalid arguments: {e}")))
}

/// Run a coordinator tool call; a refusal is a tool error the model reads.
pub(crate) async fn run(t: &TurnLink, call: &ToolCall, cancel: &CancellationToken) -> Result<Outcome, Halt> {
    let turn_id = t.turn_id().to_string();
    let (method, params) = match call.name.as_str() {
        LIST_WORKSPACES => (wp::TURN_WORKSPACES, json!(TurnWorkspaces { turn_id })),
        START_CHILD => match args::<Start>(&call.arguments) {
            Ok(a) => (
                wp::TURN_CHILD_START,
                json!(TurnChildStart {
                    turn_id,
                    call_id: call.id.clone(),
                    workspace_id: a.workspace_id,
                    prompt: a.prompt,
                    title: a.title,
                    agent: a.agent,
                }),
            ),
            Err(o) => return Ok(o),
        },
        SEND_CHILD => match args::<Send>(&call.arguments) {
            Ok(a) => (
                wp::TURN_CHILD_SEND,
                json!(TurnChildSend {
                    turn_id,
                    session_id: a.session_id,
                    prompt: a.prompt,
                }),
            ),
            Err(o) => return Ok(o),
        },
        WAIT_CHILD => match args::<Wait>(&call.arguments) {
            Ok(a) => (
                wp::TURN_CHILD_WAIT,
                json!(TurnChildWait {
                    turn_id,
                    session_id: a.session_id,
                    child_turn_id: a.turn_id,
                    timeout_secs: a.timeout_secs,
                }),
            ),
            Err(o) => return Ok(o),
        },
        STOP_CHILD => match args::<Stop>(&call.arguments) {
            Ok(a) => (
                wp::TURN_CHILD_STOP,
                json!(TurnChildStop {
                    turn_id,
                    session_id: a.session_id,
                }),
            ),
            Err(o) => return Ok(o),
        },
        other => return Ok(Outcome::error(format!("unknown tool {other:?}"))),
    };
    // Not `TurnLink::request`: here `not-found` names a child or workspace, not the turn.
    let answer = tokio::select! {
        r = t.link.request(method, params) => r,
        _ = cancel.cancelled() => return Err(Halt::Stopped),
    };
    let value = match answer {
        Ok(v) => v,
        Err(e) => match rpc_code(&e) {
            Some("turn-not-running") => return Err(Halt::Settled),
            Some(code) => return Ok(refused(&call.name, code)),
            None => return Err(Halt::Link(e)),
        },
    };
    Ok(match call.name.as_str() {
        LIST_WORKSPACES => read::<TurnWorkspacesResult>(value, |r| Outcome::ok(workspaces(&r.workspaces))),
        START_CHILD | SEND_CHILD => read::<ChildTurn>(value, |c| {
            let note = if c.online {
                "The child is working; wait_child returns its answer."
            } else {
                "The child's workspace has no worker online: its turn waits queued until one connects."
            };
            Outcome::ok(
                json!({"session_id": c.session_id, "turn_id": c.turn_id, "state": c.state, "note": note}).to_string(),
            )
        }),
        WAIT_CHILD => read::<ChildWaitResult>(value, waited),
        _ => read::<TurnChildStopResult>(value, |r| Outcome::ok(json!({"stopped_turns": r.stopped}).to_string())),
    })
}

fn read<T: DeserializeOwned>(v: Value, f: impl FnOnce(T) -> Outcome) -> Outcome {
    match serde_json::from_value(v) {
        Ok(t) => f(t),
        Err(_) => Outcome::error("the server's answer could not be read"),
    }
}

fn workspaces(list: &[Workspace]) -> String {
    let list: Vec<Value> = list
        .iter()
        .map(|w| json!({"workspace_id": w.workspace_id, "title": w.title, "host": w.host, "path": w.path, "online": w.online}))
        .collect();
    Value::Array(list).to_string()
}

/// A child's turn as the model reads it: completed is a result, anything else an error.
fn waited(r: ChildWaitResult) -> Outcome {
    let mut v = json!({"session_id": r.session_id, "turn_id": r.turn_id, "state": r.state});
    if let Some(a) = &r.answer {
        v["answer"] = a.clone().into();
    }
    if let Some(c) = &r.cause {
        v["cause"] = c.code.clone().into();
    }
    if r.timed_out {
        v["note"] = "Still working; wait again or stop it.".into();
        return Outcome::ok(v.to_string());
    }
    match r.state {
        TurnState::Completed => Outcome::ok(v.to_string()),
        TurnState::Queued | TurnState::Running if !r.online => {
            v["note"] =
                "The child's workspace has no worker online; its turn does not progress until one connects.".into();
            Outcome::error(v.to_string())
        }
        _ => Outcome::error(v.to_string()),
    }
}

fn refused(tool: &str, code: &str) -> Outcome {
    Outcome::error(match code {
        "depth-exceeded" => "depth limit reached: this session may not start child sessions".to_string(),
        "child-limit" => "child limit reached: this turn may start no more child sessions".to_string(),
        "forbidden" => format!("{tool} is only available to coordinator sessions"),
        "not-found" => "no such workspace, agent or child session".to_string(),
        other => format!("{tool} failed ({other})"),
    })
}
