//! One turn's task: the worker's messages for that turn, handled in order and apart from
//! every other turn's, so a slow write of one turn never holds up another.

use std::{sync::Arc, time::Duration};

use berth_protocol::{
    ErrorCode,
    jsonrpc::{Request, Response as RpcResponse},
    worker::{self as wp, TurnDelta, TurnEnd, TurnStep},
};
use serde_json::{json, value::RawValue};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{Conn, relay::Pending, text_msg, usage::UsageSlot};
use crate::error::ApiError;

/// Messages queued for one turn; when full, the reader waits (backpressure to the worker).
const TURN_QUEUE: usize = 64;
/// How long live output is coalesced before it is stored and relayed to other replicas,
/// counted from the first delta not yet stored: a step shorter than this stores its output
/// once, with the step (which relays what is pending in its own transaction).
pub(super) const FLUSH_EVERY: Duration = Duration::from_millis(50);

/// What a turn's queue carries.
pub(super) enum Queued {
    /// A message of the worker's for the turn.
    Msg(Request),
    /// `worker.release`: the turn leaves this connection once everything queued before is
    /// handled (it runs on, carried to another connection); answered with where its live
    /// output stands.
    Release(oneshot::Sender<wp::ReleasedTurn>),
}

/// The reader's handle on a turn's task.
pub(super) struct TurnHandle {
    pub queue: mpsc::Sender<Queued>,
    /// Cancelled when the turn is stopped or the connection ends.
    pub cancel: CancellationToken,
}

/// Methods that carry a `turnId` and go to the turn's task.
pub(super) fn is_turn_method(method: &str) -> bool {
    matches!(
        method,
        wp::TURN_DELTA
            | wp::TURN_STEP
            | wp::TURN_END
            | wp::TURN_HISTORY
            | wp::TURN_SOURCE
            | wp::TURN_TOOL_STATUS
            | wp::TURN_TOOL_ENDED
            | wp::TURN_DELEGATE
            | wp::TURN_INTERACTION
            | wp::TURN_WORKSPACES
            | wp::TURN_CHILD_START
            | wp::TURN_CHILD_SEND
            | wp::TURN_CHILD_WAIT
            | wp::TURN_CHILD_STOP
            | wp::TURN_COMPACT
            | wp::TURN_SKILL
            | wp::TURN_NOTICE
            | wp::TURN_PLAN
    )
}

/// Where a running turn's live output is: the step and how many bytes of text and
/// thinking it has streamed (the offsets carried by `model.delta`).
pub(super) struct LiveTurn {
    pub session: String,
    /// When the turn was handed to the worker.
    pub started: std::time::Instant,
    pub step: i32,
    pub text: u64,
    pub thinking: u64,
}

/// One turn's state, owned by its task.
pub(super) struct TurnTask {
    pub conn: Arc<Conn>,
    pub turn_id: String,
    pub live: LiveTurn,
    /// Output not yet stored and relayed to other replicas.
    pub pending: Option<Pending>,
    /// The running phase's `NOTIFY` payload for other replicas' watchers, not yet written:
    /// it goes with the first `turn.history` read, in that transaction and only if another
    /// replica records a watcher of the session; a turn whose worker sends anything else
    /// first has it relayed before that message is handled.
    pub running: Option<String>,
    /// The write of relayed output (or of the running phase) in flight, if any: its own
    /// task, so that deltas keep reaching local watchers while it waits for the database;
    /// one at a time, in order, and finished before a step or the end is stored.
    pub flushing: Option<tokio::task::JoinHandle<()>>,
    /// Cancelled when the turn is stopped or the connection ends.
    pub cancel: CancellationToken,
    /// Usage the model proxy metered for the turn on this replica, for its next step.
    pub usage: Arc<UsageSlot>,
}

/// What a turn's task reads: its queue's receiving end, and its cancellation.
pub(super) struct Inbox {
    rx: mpsc::Receiver<Queued>,
    cancel: CancellationToken,
}

/// A turn's queue and cancellation on `conn`: the reader's handle, and the inbox its task
/// reads once started ([`spawn`], when the connection has registered the handle).
pub(super) fn handle(conn: &Conn) -> (TurnHandle, Inbox) {
    let (queue, rx) = mpsc::channel(TURN_QUEUE);
    let cancel = conn.closing.child_token();
    (
        TurnHandle {
            queue,
            cancel: cancel.clone(),
        },
        Inbox { rx, cancel },
    )
}

/// Start the task of a turn registered on `conn` with the handle of `inbox`: a turn just
/// handed out, or one `carried` from another connection of its worker (released there, its
/// live output standing where the release said; its running phase went out already).
pub(super) fn spawn(
    conn: Arc<Conn>,
    turn_id: &str,
    session_id: &str,
    inbox: Inbox,
    carried: Option<&wp::ReleasedTurn>,
) {
    let Inbox { rx, cancel } = inbox;
    let usage = conn.state.workers.metered.open(turn_id);
    let at = carried.cloned().unwrap_or_default();
    let mut task = TurnTask {
        conn,
        turn_id: turn_id.to_string(),
        live: LiveTurn {
            session: session_id.to_string(),
            started: std::time::Instant::now(),
            step: at.step,
            text: at.text,
            thinking: at.thinking,
        },
        pending: None,
        running: None,
        flushing: None,
        cancel: cancel.clone(),
        usage,
    };
    if carried.is_none() {
        // Local watchers get the running phase now; other replicas' with the turn's first
        // message (`turn.history`).
        let running = json!({"type": "phase", "phase": "running", "turnId": task.turn_id});
        task.conn.state.hub.live(&task.live.session, running.clone());
        task.running = Some(task.relayed(running));
    }
    tokio::spawn(task.run(rx, cancel));
}

impl TurnTask {
    async fn run(mut self, rx: mpsc::Receiver<Queued>, cancel: CancellationToken) {
        self.serve(rx, cancel).await;
        // Usage metered for the turn but never stored with a step (the turn was stopped, or
        // ended without one) is metered in the database; later calls of the turn are too.
        let left = self.conn.state.workers.metered.close(&self.turn_id, &self.usage);
        if let Err((lost, e)) = self.meter_in_database(left).await {
            tracing::warn!(turn.id = %self.turn_id, calls = lost.len(), error = %e, "recording metered usage failed");
        }
    }

    /// Meter `calls` of this turn in the database, in order; on a failure, the calls not
    /// metered come back with the error.
    pub(super) async fn meter_in_database(
        &self,
        calls: Vec<berth_store::Metered>,
    ) -> Result<(), (Vec<berth_store::Metered>, berth_store::StoreError)> {
        let (store, tenant) = (&self.conn.state.store, &self.conn.principal.tenant_id);
        for (i, m) in calls.iter().enumerate() {
            let (turn, context) = (Some(self.turn_id.as_str()), m.context.as_deref());
            if let Err(e) = store.meter_usage(tenant, turn, context, m.usage).await {
                return Err((calls[i..].to_vec(), e));
            }
        }
        Ok(())
    }

    async fn serve(&mut self, mut rx: mpsc::Receiver<Queued>, cancel: CancellationToken) {
        // One timer for the turn, set to the pending output's due time whenever new output
        // starts pending.
        let flush = tokio::time::sleep(FLUSH_EVERY);
        tokio::pin!(flush);
        let mut armed = None;
        loop {
            let due = self.pending.as_ref().map(|p| p.due);
            if let Some(at) = due
                && armed != due
            {
                flush.as_mut().reset(at);
                armed = due;
            }
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {
                    // Stopped (already settled by the server) or the connection ended: the
                    // idle phase follows whatever was relayed.
                    self.pending = None;
                    self.running = None;
                    self.conn.state.hub.end_step(&self.live.session);
                    let idle = json!({"type": "phase", "phase": "idle", "turnId": self.turn_id});
                    self.relay_now(idle).await;
                    rx.close();
                    while let Some(queued) = rx.recv().await {
                        if let Queued::Msg(req) = queued {
                            self.reply(req.id, Err(ApiError::code(ErrorCode::TurnNotRunning))).await;
                        }
                    }
                    return;
                }
                req = rx.recv() => match req {
                    Some(Queued::Msg(req)) => self.handle(req).await,
                    Some(Queued::Release(answer)) => return self.release(answer).await,
                    // The turn ended: the reader dropped its queue.
                    None => return,
                },
                _ = &mut flush, if due.is_some() && self.flushing.is_none() => self.flush_relay(),
                _ = self.flushed(), if self.flushing.is_some() => {}
            }
        }
    }

    async fn handle(&mut self, req: Request) {
        if req.method != wp::TURN_HISTORY
            && let Some(running) = self.running.take()
        {
            self.flushed().await;
            self.notify_soon(running);
        }
        let result = match req.method.as_str() {
            wp::TURN_DELTA => {
                if let Ok(d) = serde_json::from_value::<TurnDelta>(req.params) {
                    self.delta(d);
                }
                return;
            }
            wp::TURN_STEP => match serde_json::from_value::<TurnStep>(req.params) {
                Ok(step) => self.step(step).await,
                Err(_) => Err(ApiError::code(ErrorCode::BadParams)),
            },
            wp::TURN_INTERACTION => return super::interaction::ask(&self.conn, req),
            wp::TURN_CHILD_WAIT => {
                return super::children::wait(&self.conn, &self.live.session, self.cancel.clone(), req);
            }
            // A model call: answered by its own task, so the turn's queue keeps flowing.
            wp::TURN_COMPACT => return compact(&self.conn, &self.turn_id, req),
            wp::TURN_END => match serde_json::from_value::<TurnEnd>(req.params) {
                Ok(end) => self.end(end).await,
                Err(_) => Err(ApiError::code(ErrorCode::BadParams)),
            },
            wp::TURN_HISTORY => {
                let page = self.history(req.params).await;
                return self.reply_raw(req.id, page).await;
            }
            wp::TURN_SOURCE
            | wp::TURN_TOOL_STATUS
            | wp::TURN_TOOL_ENDED
            | wp::TURN_DELEGATE
            | wp::TURN_WORKSPACES
            | wp::TURN_CHILD_START
            | wp::TURN_CHILD_SEND
            | wp::TURN_CHILD_STOP
            | wp::TURN_SKILL
            | wp::TURN_NOTICE
            | wp::TURN_PLAN => self.agent_request(&req.method, req.params).await,
            _ => Err(ApiError::code(ErrorCode::MethodNotFound)),
        };
        self.reply(req.id, result).await;
    }

    /// `worker.release` reached this turn: everything the worker sent for it before was
    /// handled. Its output not yet relayed goes out (and its running phase, if that has not),
    /// then it leaves this connection without an idle phase — it runs on — and the release is
    /// answered with where its live output stands.
    async fn release(&mut self, answer: oneshot::Sender<wp::ReleasedTurn>) {
        self.flushed().await;
        if let Some(running) = self.running.take() {
            self.notify_soon(running);
            self.flushed().await;
        }
        self.flush_relay();
        self.flushed().await;
        self.conn.release_turn(&self.turn_id);
        tracing::info!(turn.id = %self.turn_id, worker.connection = %self.conn.connection_id, "turn released to move to another connection");
        let _ = answer.send(wp::ReleasedTurn {
            turn_id: self.turn_id.clone(),
            step: self.live.step,
            text: self.live.text,
            thinking: self.live.thinking,
        });
    }

    async fn reply(&self, id: Option<u32>, result: Result<serde_json::Value, ApiError>) {
        if id.is_none() {
            return;
        }
        let resp = match result {
            Ok(v) => RpcResponse::ok(id, v),
            Err(e) => RpcResponse::err(id, e.0),
        };
        self.conn.send(text_msg(&resp)).await;
    }

    /// [`TurnTask::reply`] with a result already written as JSON.
    async fn reply_raw(&self, id: Option<u32>, result: Result<Box<RawValue>, ApiError>) {
        if id.is_none() {
            return;
        }
        let msg = match result {
            Ok(v) => text_msg(&Answered {
                jsonrpc: "2.0",
                id,
                result: &v,
            }),
            Err(e) => text_msg(&RpcResponse::err(id, e.0)),
        };
        self.conn.send(msg).await;
    }
}

/// A success response around a result already written; the same fields, in the same order,
/// as [`RpcResponse`].
#[derive(serde::Serialize)]
struct Answered<'a> {
    jsonrpc: &'static str,
    id: Option<u32>,
    result: &'a RawValue,
}

/// `turn.compact`: summarize the session's history before `keepFrom` (the worker's turn
/// nears the context window), answered once written.
fn compact(conn: &Arc<Conn>, turn_id: &str, req: Request) {
    let (conn, turn_id) = (conn.clone(), turn_id.to_string());
    tokio::spawn(async move {
        let (id, params) = (req.id, req.params);
        let run = async {
            let p: wp::TurnCompact =
                serde_json::from_value(params).map_err(|_| ApiError::code(ErrorCode::BadParams))?;
            if p.turn_id != turn_id {
                return Err(ApiError::code(ErrorCode::BadParams));
            }
            let (state, tenant) = (&conn.state, &conn.principal.tenant_id);
            let session = state
                .store
                .running_turn_session(&conn.connection_id, tenant, &turn_id)
                .await?;
            let written = crate::compaction::compact(state, tenant, &session, Some(p.keep_from), true, None).await?;
            Ok(json!(wp::TurnCompactResult {
                compacted: written.is_some()
            }))
        };
        let result = tokio::select! {
            r = run => r,
            _ = conn.closing.cancelled() => return,
        };
        if id.is_none() {
            return;
        }
        let resp = match result {
            Ok(v) => RpcResponse::ok(id, v),
            Err(e) => RpcResponse::err(id, e.0),
        };
        conn.send(text_msg(&resp)).await;
    });
}
