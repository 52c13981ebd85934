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
    match link
        .request(wp::TURN_END, serde_json::to_value(&end).unwrap_or_default())
        .await
    {
        Ok(_) => tracing::info!(turn.id = %run.turn_id, state = state.as_str(), "turn settled"),
        Err(e) => tracing::warn!(turn.id = %run.turn_id, error = %e, "could not settle the turn"),
    }
}

pub(crate) enum StepError {
    /// The step failed for a typed reason; the turn settles `failed`.
    Failed(Cause),
    /// The connection to the API tier broke; the server interrupts the turn.
    Link(anyhow::Error),
}

async fn step(link: &Link, run: &TurnRun) -> Result<(), StepError> {
    let turn_id = run.turn_id.clone();
    let delta_link = link.clone();
    let completion = model::stream(link, run, move |text, thinking| {
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
    link.request(wp::TURN_STEP, serde_json::to_value(&step).unwrap_or_default())
        .await
        .map_err(StepError::Link)?;
    Ok(())
}
