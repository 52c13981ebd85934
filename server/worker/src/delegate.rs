//! Sub-agents: the `delegate` tool starts a child session (same workspace, one level less
//! of delegation) through the server, waits for the child's turn — which this worker runs
//! like any other — to end, and returns its final answer as the call's result.

use std::{
    collections::{HashMap, VecDeque},
    sync::Mutex,
};

use berth_protocol::{
    TurnState,
    worker::{self as wp, TurnDelegate, TurnDelegateResult},
};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::{
    model::ToolCall,
    tools::Outcome,
    turn::{Halt, TurnLink},
};

pub(crate) const DELEGATE: &str = "delegate";

/// Ended turns remembered for a waiting parent (a child may end before its parent asks).
const REMEMBERED: usize = 256;

pub(crate) fn schema() -> Value {
    json!({"type": "function", "function": {
        "name": DELEGATE,
        "description": "Hand a self-contained task to a sub-agent working in the same workspace; returns its final answer.",
        "parameters": {"type": "object", "properties": {
            "prompt": {"type": "string", "description": "The task, with everything the sub-agent needs to know."}
        }, "required": ["prompt"]}
    }})
}

/// How a turn this worker ran ended.
#[derive(Debug, Clone)]
pub(crate) struct Ended {
    pub state: TurnState,
    /// The last model step's text (a completed turn's answer).
    pub answer: String,
    pub cause: Option<String>,
}

/// Turns that ended on this worker, for parents waiting on their children.
#[derive(Default)]
pub(crate) struct Endings {
    ended: Mutex<(HashMap<String, Ended>, VecDeque<String>)>,
    changed: Notify,
}

impl Endings {
    pub(crate) fn record(&self, turn_id: &str, e: Ended) {
        let mut g = self.ended.lock().expect("endings lock");
        let (map, order) = &mut *g;
        map.insert(turn_id.to_string(), e);
        order.push_back(turn_id.to_string());
        while order.len() > REMEMBERED {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
        drop(g);
        self.changed.notify_waiters();
    }

    async fn wait(&self, turn_id: &str) -> Ended {
        loop {
            // Registered before the check, so an ending recorded in between still wakes us.
            let changed = self.changed.notified();
            if let Some(e) = self.ended.lock().expect("endings lock").0.remove(turn_id) {
                return e;
            }
            changed.await;
        }
    }
}

#[derive(Deserialize)]
struct Args {
    prompt: String,
}

pub(crate) async fn run(t: &TurnLink, call: &ToolCall, cancel: &CancellationToken) -> Result<Outcome, Halt> {
    let args: Args = match serde_json::from_str(&call.arguments) {
        Ok(a) => a,
        Err(e) => return Ok(Outcome::error(format!("invalid arguments: {e}"))),
    };
    // A worker shutting down is handed no new turn: a sub-agent's would wait for its next
    // process, and this turn with it, until the drain's timeout.
    if t.link.draining() {
        return Ok(Outcome::error(
            "the worker is shutting down (a restart or an upgrade), so no sub-agent can start now; \
do the work yourself, or finish and say what is left",
        ));
    }
    let p = TurnDelegate {
        turn_id: t.turn_id().to_string(),
        call_id: call.id.clone(),
        prompt: args.prompt,
    };
    let started = tokio::select! {
        r = t.request(wp::TURN_DELEGATE, serde_json::to_value(&p).unwrap_or_default()) => r,
        _ = cancel.cancelled() => return Err(Halt::Stopped),
    };
    let child: TurnDelegateResult = match started {
        Ok(v) => match serde_json::from_value(v) {
            Ok(c) => c,
            Err(_) => return Ok(Outcome::error("the sub-agent could not be started")),
        },
        Err(Halt::Refused(code)) if code == "forbidden" => {
            return Ok(Outcome::error(
                "delegation depth reached: this session may not start sub-agents",
            ));
        }
        Err(Halt::Refused(code)) if code == "child-limit" => {
            return Ok(Outcome::error(
                "sub-agent limit reached: this turn may start no more sub-agents",
            ));
        }
        Err(Halt::Refused(code)) => return Ok(Outcome::error(format!("the sub-agent could not be started ({code})"))),
        Err(h) => return Err(h),
    };
    tracing::info!(turn.id = %t.turn_id(), child.session = %child.session_id, child.turn = %child.turn_id, "sub-agent started");
    // Stopping the parent stops the child on the server, which tells this worker.
    let ended = tokio::select! {
        e = t.link.endings.wait(&child.turn_id) => e,
        _ = cancel.cancelled() => return Err(Halt::Stopped),
    };
    Ok(match ended.state {
        TurnState::Completed => Outcome::ok(ended.answer),
        state => Outcome::error(format!(
            "the sub-agent's turn ended {}{}",
            state.as_str(),
            ended.cause.map(|c| format!(" ({c})")).unwrap_or_default()
        )),
    })
}
