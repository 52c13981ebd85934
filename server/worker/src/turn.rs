//! One turn on the wire: read the session's history, run the agent loop, settle. Every
//! write goes through [`TurnLink`], whose requests the server answers only while the turn
//! runs and is handed to this connection; so a stopped or interrupted turn gets nothing
//! more written, and settling writes history before `turn.ended` goes out.

use berth_protocol::CauseCode;
use berth_protocol::{
    Cause, NewRow, Position, Row, RowField, SessionSourceResult, TurnState,
    worker::{
        self as wp, Handoff, ToolStatus, TurnEnd, TurnHistory, TurnHistoryResult, TurnNotice, TurnRun, TurnSource,
        TurnStep, TurnToolEnded, TurnToolStatus, Usage,
    },
};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::{Link, agent, delegate::Ended, model::StreamError, tools::Tools};

/// Why a turn stops before completing.
#[derive(Debug)]
pub(crate) enum Halt {
    /// A typed failure; the turn settles `failed` with this cause.
    Failed(Cause),
    /// Stopped (by a client, or the connection went away): the server settles it.
    Stopped,
    /// The server already settled the turn (stopped, session removed): nothing to write.
    Settled,
    /// The connection to the API tier broke; the server interrupts the turn.
    Link(anyhow::Error),
    /// The server answered a request with this error code.
    Refused(String),
}

impl From<StreamError> for Halt {
    fn from(e: StreamError) -> Halt {
        match e {
            StreamError::Failed(c) => Halt::Failed(c),
        }
    }
}

pub(crate) fn cause(code: CauseCode) -> Cause {
    Cause {
        code: code.as_str().into(),
        status: None,
    }
}

/// The turn's side of the connection.
pub(crate) struct TurnLink {
    pub(crate) link: Link,
    turn_id: String,
}

impl TurnLink {
    pub(crate) fn turn_id(&self) -> &str {
        &self.turn_id
    }

    /// A request about this turn; a refusal because the turn is over is `Settled`.
    pub(crate) async fn request(&self, method: &str, params: Value) -> Result<Value, Halt> {
        self.link.request(method, params).await.map_err(halt)
    }

    /// A request about this turn whose answer is read straight into `T` (a refusal as
    /// [`TurnLink::request`]'s; an answer that does not read as `T` fails the turn with
    /// `unreadable`).
    async fn request_as<T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        params: Value,
        unreadable: CauseCode,
    ) -> Result<T, Halt> {
        let result = self.link.request_raw(method, params).await.map_err(halt)?;
        serde_json::from_str(result.as_deref().map_or("null", serde_json::value::RawValue::get))
            .map_err(|_| Halt::Failed(cause(unreadable)))
    }

    /// The session's rows so far (ending with this turn's prompt), page by page, each field
    /// a page cut read on to its end; in a compacted session, the latest compaction's
    /// handoff and the rows from its `keepFrom` on.
    pub(crate) async fn history(&self) -> Result<(Option<Handoff>, Vec<Row>), Halt> {
        let mut rows = Vec::new();
        let mut handoff = None;
        let mut after: Option<Position> = None;
        loop {
            let p = TurnHistory {
                turn_id: self.turn_id.clone(),
                after,
            };
            let page: TurnHistoryResult = self
                .request_as(wp::TURN_HISTORY, to_value(&p), CauseCode::HistoryUnreadable)
                .await?;
            if after.is_none() {
                handoff = page.handoff;
            }
            for mut row in page.rows {
                self.complete(&mut row).await?;
                rows.push(row);
            }
            match page.next {
                Some(n) if Some(n) != after => after = Some(n),
                _ => return Ok((handoff, rows)),
            }
        }
    }

    /// Read the rest of the fields a history page cut (`turn.source`).
    async fn complete(&self, row: &mut Row) -> Result<(), Halt> {
        let Some(cut) = row.truncated.take() else {
            return Ok(());
        };
        for (field, t) in cut {
            let mut offset = t.returned;
            while offset < t.bytes {
                let p = TurnSource {
                    turn_id: self.turn_id.clone(),
                    position: row.position,
                    field,
                    offset,
                };
                let part: SessionSourceResult = self
                    .request_as(wp::TURN_SOURCE, to_value(&p), CauseCode::HistoryUnreadable)
                    .await?;
                let text = match field {
                    RowField::Body => &mut row.body,
                    RowField::Thinking => row.thinking.get_or_insert_with(String::new),
                };
                text.push_str(&part.data);
                match part.next_offset {
                    Some(n) if n > offset => offset = n,
                    _ => break,
                }
            }
        }
        Ok(())
    }

    /// Publish a completed model step (one `model.completed` event); returns its sequence.
    pub(crate) async fn step(&self, rows: Vec<NewRow>, usage: Option<Usage>) -> Result<i64, Halt> {
        let step = TurnStep {
            turn_id: self.turn_id.clone(),
            rows,
            usage,
        };
        match self.request(wp::TURN_STEP, to_value(&step)).await {
            Ok(v) => Ok(v.get("sequence").and_then(Value::as_i64).unwrap_or_default()),
            // The server refused the step (e.g. it could not store it): settle `failed`.
            Err(Halt::Refused(_)) => Err(Halt::Failed(cause(CauseCode::StepRejected))),
            Err(h) => Err(h),
        }
    }

    /// Something the turn goes on without (`turn.notice` → `session.notice` and a
    /// diagnostic). A refusal is logged and the turn goes on.
    pub(crate) async fn notice(&self, code: &str, params: Value) -> Result<(), Halt> {
        let n = TurnNotice {
            turn_id: self.turn_id.clone(),
            code: code.into(),
            params,
        };
        match self.request(wp::TURN_NOTICE, to_value(&n)).await {
            Ok(_) => Ok(()),
            Err(Halt::Refused(refused)) => {
                tracing::warn!(turn.id = %self.turn_id, code, refused, "a notice was refused");
                Ok(())
            }
            Err(h) => Err(h),
        }
    }

    pub(crate) async fn tool_status(&self, position: Position, call_id: &str, status: ToolStatus) -> Result<(), Halt> {
        let p = TurnToolStatus {
            turn_id: self.turn_id.clone(),
            position,
            call_id: call_id.to_string(),
            status,
        };
        self.request(wp::TURN_TOOL_STATUS, to_value(&p)).await.map(drop)
    }

    pub(crate) async fn tool_ended(
        &self,
        position: Position,
        call_id: &str,
        status: ToolStatus,
        output: String,
    ) -> Result<(), Halt> {
        let p = TurnToolEnded {
            turn_id: self.turn_id.clone(),
            position,
            call_id: call_id.to_string(),
            status,
            output,
        };
        self.request(wp::TURN_TOOL_ENDED, to_value(&p)).await.map(drop)
    }
}

/// How a failed request stops the turn: a refusal because the turn is over is `Settled`.
fn halt(e: anyhow::Error) -> Halt {
    match rpc_code(&e) {
        Some("turn-not-running") | Some("not-found") => Halt::Settled,
        Some(code) => Halt::Refused(code.to_string()),
        None => Halt::Link(e),
    }
}

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or_default()
}

/// Run the turn and settle it.
pub(crate) async fn run(
    link: Link,
    run: TurnRun,
    tools: Option<Tools>,
    config: agent::AgentConfig,
    cancel: CancellationToken,
) {
    tracing::info!(turn.id = %run.turn_id, session.id = %run.session_id, "turn started");
    let t = TurnLink {
        link,
        turn_id: run.turn_id.clone(),
    };
    let outcome = agent::run(&t, &run, tools.as_ref(), &config, &cancel).await;
    let (state, cause, answer, last_step) = match outcome {
        Ok(done) => (TurnState::Completed, None, done.answer, done.last_step),
        Err(Halt::Failed(cause)) => (TurnState::Failed, Some(cause), String::new(), None),
        Err(Halt::Refused(code)) => (
            TurnState::Failed,
            Some(Cause {
                code: CauseCode::refused(&code),
                status: None,
            }),
            String::new(),
            None,
        ),
        Err(Halt::Stopped) | Err(Halt::Settled) => {
            tracing::info!(turn.id = %run.turn_id, "turn was settled by the server (stopped)");
            record_settled(&t.link, &run.turn_id);
            return;
        }
        Err(Halt::Link(e)) => {
            tracing::warn!(turn.id = %run.turn_id, error = %e, "lost the server mid-turn");
            t.link
                .endings
                .record(&run.turn_id, ended(TurnState::Interrupted, None, String::new()));
            return;
        }
    };
    let end = TurnEnd {
        turn_id: t.turn_id.clone(),
        state,
        cause,
        step: last_step,
    };
    let (state, code) = match settle(&t, &end).await {
        Settled::Refused if end.step.is_some() => {
            // The server would not store the last step: settle `failed` without it, as a
            // refused `turn.step` does.
            let failed = TurnEnd {
                turn_id: t.turn_id.clone(),
                state: TurnState::Failed,
                cause: Some(self::cause(CauseCode::StepRejected)),
                step: None,
            };
            settle(&t, &failed).await;
            (TurnState::Failed, Some("step-rejected".to_string()))
        }
        _ => (state, end.cause.as_ref().map(|c| c.code.clone())),
    };
    let answer = if state == TurnState::Completed {
        answer
    } else {
        String::new()
    };
    t.link.endings.record(&run.turn_id, ended(state, code, answer));
}

/// A turn the server settled (stopped) ends here as cancelled, for whoever waits for its
/// end (a turn that delegated to it).
pub(crate) fn record_settled(link: &Link, turn_id: &str) {
    link.endings
        .record(turn_id, ended(TurnState::Cancelled, None, String::new()));
}

fn ended(state: TurnState, cause: Option<String>, answer: String) -> Ended {
    Ended { state, answer, cause }
}

/// How a `turn.end` went.
enum Settled {
    Done,
    /// Settled some other way meanwhile, or the connection is gone.
    Gone,
    /// Refused each time it was sent.
    Refused,
}

/// A turn left running would hold its session's queue: retry a failed settle a few times
/// (the server answers `turn-not-running` once it is settled some other way). The end is
/// one transaction with the step it carries, so a retry never stores the step twice.
async fn settle(t: &TurnLink, end: &TurnEnd) -> Settled {
    for attempt in 1..=5u32 {
        match t.link.request(wp::TURN_END, to_value(end)).await {
            Ok(_) => {
                tracing::info!(turn.id = %t.turn_id, state = end.state.as_str(), "turn settled");
                return Settled::Done;
            }
            Err(e) if rpc_code(&e) == Some("turn-not-running") || rpc_code(&e).is_none() => {
                tracing::warn!(turn.id = %t.turn_id, error = %e, "could not settle the turn");
                return Settled::Gone;
            }
            Err(e) => {
                tracing::warn!(turn.id = %t.turn_id, error = %e, attempt, "settling the turn failed; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(250 * u64::from(attempt))).await;
            }
        }
    }
    Settled::Refused
}

/// The typed code of a server's error answer (None: the connection failed instead).
pub(crate) fn rpc_code(e: &anyhow::Error) -> Option<&str> {
    e.downcast_ref::<berth_protocol::RpcError>()
        .map(|r| r.data_code().unwrap_or("internal"))
}
