//! One turn: a model step through the API tier's proxy, its rows published as one event,
//! then the turn settles. Settling writes history before `turn.ended` goes out.

use berth_protocol::{
    Cause, NewRow, RowKind, ToolInfo, TurnState,
    worker::{self as wp, TurnDelta, TurnEnd, TurnRun, TurnStep},
};
use tokio_util::sync::CancellationToken;

use crate::{Link, model};

pub(crate) async fn run(link: Link, run: TurnRun, cancel: CancellationToken) {
    tracing::info!(turn.id = %run.turn_id, session.id = %run.session_id, "turn started");
    let outcome = tokio::select! {
        r = step(&link, &run) => r,
        _ = cancel.cancelled() => return,
    };
    let (state, cause) = match outcome {
        Ok(()) => (TurnState::Completed, None),
        Err(StepError::Failed(cause)) => (TurnState::Failed, Some(cause)),
        Err(StepError::Settled) => {
            tracing::info!(turn.id = %run.turn_id, "turn was settled by the server (stopped)");
            return;
        }
        Err(StepError::Link(e)) => {
            tracing::warn!(turn.id = %run.turn_id, error = %e, "lost the server mid-turn");
            return;
        }
    };
    let end = TurnEnd {
        turn_id: run.turn_id.clone(),
        state,
        cause,
    };
    // A turn left running would hold its session's queue: retry a failed settle a few
    // times (the server answers `turn-not-running` once it is settled some other way).
    for attempt in 1..=5u32 {
        match link
            .request(wp::TURN_END, serde_json::to_value(&end).unwrap_or_default())
            .await
        {
            Ok(_) => {
                tracing::info!(turn.id = %run.turn_id, state = state.as_str(), "turn settled");
                return;
            }
            Err(e) if rpc_code(&e) == Some("turn-not-running") || rpc_code(&e).is_none() => {
                tracing::warn!(turn.id = %run.turn_id, error = %e, "could not settle the turn");
                return;
            }
            Err(e) => {
                tracing::warn!(turn.id = %run.turn_id, error = %e, attempt, "settling the turn failed; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(250 * u64::from(attempt))).await;
            }
        }
    }
}

/// The typed code of a server's error answer (None: the connection failed instead).
fn rpc_code(e: &anyhow::Error) -> Option<&str> {
    e.downcast_ref::<berth_protocol::RpcError>()
        .map(|r| r.data_code().unwrap_or("internal"))
}

pub(crate) enum StepError {
    /// The step failed for a typed reason; the turn settles `failed`.
    Failed(Cause),
    /// The connection to the API tier broke; the server interrupts the turn.
    Link(anyhow::Error),
    /// The server already settled the turn (stopped, session removed): nothing to write.
    Settled,
}

async fn step(link: &Link, run: &TurnRun) -> Result<(), StepError> {
    let attachments = crate::attachments::fetch(&link.http, &link.proxy_url, &link.token, run)
        .await
        .map_err(StepError::Failed)?;
    let turn_id = run.turn_id.clone();
    let delta_link = link.clone();
    let completion = model::stream(link, run, &attachments, move |text, thinking| {
        let d = TurnDelta {
            turn_id: turn_id.clone(),
            text,
            thinking,
        };
        let link = delta_link.clone();
        async move {
            link.notify(wp::TURN_DELTA, serde_json::to_value(&d).unwrap_or_default())
                .await
                .is_ok()
        }
    })
    .await?;
    let mut rows = Vec::new();
    if !completion.text.is_empty() || !completion.thinking.is_empty() || completion.tool_calls.is_empty() {
        rows.push(NewRow {
            kind: RowKind::Assistant,
            body: completion.text,
            thinking: (!completion.thinking.is_empty()).then_some(completion.thinking),
            tool: None,
            hidden: None,
        });
    }
    for call in completion.tool_calls {
        rows.push(NewRow {
            kind: RowKind::ToolCall,
            body: call.arguments,
            thinking: None,
            tool: Some(ToolInfo {
                name: call.name,
                call_id: call.id,
                status: "requested".into(),
            }),
            hidden: None,
        });
    }
    let step = TurnStep {
        turn_id: run.turn_id.clone(),
        rows,
        usage: completion.usage,
    };
    match link
        .request(wp::TURN_STEP, serde_json::to_value(&step).unwrap_or_default())
        .await
    {
        Ok(_) => {}
        Err(e) => {
            return Err(match rpc_code(&e) {
                Some("turn-not-running") | Some("not-found") => StepError::Settled,
                // The server refused the step (e.g. it could not store it): settle `failed`.
                Some(_) => StepError::Failed(Cause {
                    code: "step-rejected".into(),
                    status: None,
                }),
                None => StepError::Link(e),
            });
        }
    }
    Ok(())
}
