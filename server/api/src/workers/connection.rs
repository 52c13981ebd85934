//! The per-connection loop: `worker.hello`, then the reader routes each message to its
//! turn's task while pings, stops, shutdown and revocation are watched; cleanup afterwards.

use std::{sync::Arc, time::Duration};

use axum::extract::ws::{Message, WebSocket};
use berth_protocol::{
    ErrorCode, PROTOCOL_VERSION, RpcError,
    jsonrpc::{Request, Response as RpcResponse},
    worker::{self as wp, WorkerHello, WorkerHelloResult},
};
use berth_store::Principal;
use futures_util::{SinkExt, StreamExt, stream::SplitSink};
use serde_json::json;
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::{Conn, LocalWorker, claim, text_msg, turn::Queued};
use crate::{AppState, error::ApiError};

/// Messages waiting for the socket.
const OUT_QUEUE: usize = 256;

pub(super) async fn serve(
    state: AppState,
    principal: Principal,
    connection_id: String,
    revoked: CancellationToken,
    socket: WebSocket,
) {
    let (mut sink, mut stream) = socket.split();
    let (ids, instance, draining) = match hello(&state, &principal, &connection_id, &mut sink, &mut stream).await {
        Ok(hello) => hello,
        Err(e) => {
            tracing::info!(worker.connection = %connection_id, error = %e, "worker connection ended");
            // Nothing was claimed, but presence may have been recorded.
            cleanup_presence(&state, &connection_id).await;
            return;
        }
    };
    let (out, out_rx) = mpsc::channel::<Message>(OUT_QUEUE);
    let writer = tokio::spawn(write_loop(sink, out_rx, state.config.limits.idle_timeout));
    let conn = Arc::new(Conn {
        state: state.clone(),
        principal,
        connection_id: connection_id.clone(),
        workspaces: ids,
        instance,
        out: out.clone(),
        turns: Default::default(),
        writes: Arc::new(Semaphore::new(state.config.limits.worker_max_writes.max(1))),
        closing: CancellationToken::new(),
        calls: super::calls::CallTable::new(out.clone()),
        worker_draining: draining.into(),
    });
    let kick = Arc::new(Notify::new());
    let (stop_tx, stop_rx) = mpsc::unbounded_channel();
    state.workers.conns.lock().expect("registry lock").insert(
        connection_id.clone(),
        LocalWorker {
            tenant_id: conn.principal.tenant_id.clone(),
            workspaces: conn.workspaces.clone(),
            calls: conn.calls.clone(),
            kick: kick.clone(),
            stop: stop_tx,
            conn: Arc::downgrade(&conn),
        },
    );
    kick.notify_one();
    // Cancelled by the claimer when the connection's presence cannot be kept.
    let lost = CancellationToken::new();
    let claimer = tokio::spawn(claim::claimer(conn.clone(), kick, lost.clone()));
    if let Err(e) = read_loop(&conn, &mut stream, stop_rx, writer, &revoked, &lost).await {
        tracing::info!(worker.connection = %connection_id, error = %e, "worker connection ended");
    }
    conn.closing.cancel();
    conn.calls.close();
    let _ = claimer.await;
    state
        .workers
        .conns
        .lock()
        .expect("registry lock")
        .remove(&connection_id);
    cleanup_presence(&state, &connection_id).await;
}

/// `worker.hello`: bind the host, register the workspaces and the presence; returns the
/// workspace ids.
async fn hello(
    state: &AppState,
    principal: &Principal,
    connection_id: &str,
    sink: &mut SplitSink<WebSocket, Message>,
    stream: &mut futures_util::stream::SplitStream<WebSocket>,
) -> anyhow::Result<(Vec<String>, Option<String>, bool)> {
    let hello = tokio::time::timeout(Duration::from_secs(30), stream.next()).await;
    let Ok(Some(Ok(Message::Text(text)))) = hello else {
        anyhow::bail!("no worker.hello")
    };
    let req: Request = serde_json::from_str(&text)?;
    let params: WorkerHello = match (req.method.as_str(), serde_json::from_value(req.params)) {
        (wp::WORKER_HELLO, Ok(p)) => p,
        _ => {
            let err = RpcResponse::err(req.id, RpcError::new(ErrorCode::BadParams));
            sink.send(Message::Text(serde_json::to_string(&err)?.into())).await?;
            anyhow::bail!("bad worker.hello");
        }
    };
    if params.protocol != PROTOCOL_VERSION {
        let err = RpcError::with_fields(
            ErrorCode::UnsupportedProtocol,
            json!({"supported": berth_protocol::SUPPORTED_PROTOCOLS})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        );
        sink.send(Message::Text(
            serde_json::to_string(&RpcResponse::err(req.id, err))?.into(),
        ))
        .await?;
        anyhow::bail!("unsupported worker protocol {}", params.protocol);
    }
    if let Err(e) = check_hello(&params) {
        sink.send(text_msg(&RpcResponse::err(req.id, e.0))).await?;
        anyhow::bail!("worker.hello past its bounds");
    }
    let store = &state.store;
    let instance = params.instance.as_deref();
    // Before anything is changed for it: a second worker process on this credential (a
    // command that read the token file, say) is refused while the first one is connected.
    if let Err(e) = store.check_worker_process(principal, instance).await {
        let err = refused_process(e);
        sink.send(text_msg(&RpcResponse::err(req.id, err.0))).await?;
        anyhow::bail!("worker.hello refused: another worker process holds this credential");
    }
    if let Err(e) = store.bind_worker_host(principal, &params.host).await {
        let err = ApiError::from(e);
        sink.send(text_msg(&RpcResponse::err(req.id, err.0))).await?;
        anyhow::bail!("worker.hello refused for host {}", params.host);
    }
    if let Some(old) = &params.replaces {
        // The worker knows its previous connection is gone (its replica may have died
        // without a word): end its turns now, not when its presence goes stale.
        for t in store.abandon_connection(principal, old).await? {
            state.metrics.turns.with_label_values(&["interrupted"]).inc();
            tracing::warn!(turn.id = %t, worker.connection = %old, "worker reconnected; its lost connection's turn interrupted");
        }
    }
    let ids = store
        .register_workspaces(principal, &params.host, &params.workspaces)
        .await?;
    if let Err(e) = store
        .presence_insert(connection_id, principal, &state.config.replica_id, &ids, instance)
        .await
    {
        let err = refused_process(e);
        sink.send(text_msg(&RpcResponse::err(req.id, err.0))).await?;
        anyhow::bail!("worker.hello refused: another worker process holds this credential");
    }
    let result = WorkerHelloResult {
        workspaces: params
            .workspaces
            .iter()
            .zip(&ids)
            .map(|(d, id)| wp::RegisteredWorkspace {
                name: d.name.clone(),
                workspace_id: id.clone(),
            })
            .collect(),
        end_carries_step: true,
        binary_chunks: true,
        chunk_runs: true,
        connection_id: Some(connection_id.to_string()),
    };
    sink.send(text_msg(&RpcResponse::ok(req.id, serde_json::to_value(result)?)))
        .await?;
    tracing::info!(worker.connection = %connection_id, host = %params.host, workspaces = ids.len(), "worker connected");
    Ok((ids, params.instance, params.draining))
}

/// A hello refused because another worker process holds the credential:
/// `conflict {reason: "worker-running"}` (other store errors as they are).
fn refused_process(e: berth_store::StoreError) -> ApiError {
    match e.code() {
        ErrorCode::Conflict => ApiError::with(ErrorCode::Conflict, json!({"reason": "worker-running"})),
        _ => e.into(),
    }
}

/// A hello's declarations are bounded before any is stored: how many workspaces, and how
/// long the host and each name and path are (`bad-params {field, max}`).
fn check_hello(hello: &WorkerHello) -> Result<(), ApiError> {
    let past = |field: &str, max: usize| {
        Err(ApiError::with(
            ErrorCode::BadParams,
            json!({"field": field, "max": max}),
        ))
    };
    if hello.host.len() > wp::HELLO_HOST_BYTES_MAX {
        return past("host", wp::HELLO_HOST_BYTES_MAX);
    }
    if hello
        .replaces
        .as_ref()
        .is_some_and(|r| r.len() > wp::HELLO_HOST_BYTES_MAX)
    {
        return past("replaces", wp::HELLO_HOST_BYTES_MAX);
    }
    if hello.workspaces.len() > wp::HELLO_WORKSPACES_MAX {
        return past("workspaces", wp::HELLO_WORKSPACES_MAX);
    }
    if hello.workspaces.iter().any(|w| w.name.len() > wp::HELLO_NAME_BYTES_MAX) {
        return past("workspaces.name", wp::HELLO_NAME_BYTES_MAX);
    }
    if hello.workspaces.iter().any(|w| w.path.len() > wp::HELLO_PATH_BYTES_MAX) {
        return past("workspaces.path", wp::HELLO_PATH_BYTES_MAX);
    }
    Ok(())
}

/// The one task that writes to the socket; a close frame is the last thing it sends. A
/// worker that stops reading for the idle timeout ends the connection (its queue is bounded,
/// so everything waiting on it stops instead of growing).
async fn write_loop(mut sink: SplitSink<WebSocket, Message>, mut out: mpsc::Receiver<Message>, timeout: Duration) {
    while let Some(msg) = out.recv().await {
        let more = || out.try_recv().ok();
        match tokio::time::timeout(timeout, crate::net::write_batch(&mut sink, msg, more)).await {
            Ok(Ok(false)) => {}
            _ => return,
        }
    }
}

async fn read_loop(
    conn: &Arc<Conn>,
    stream: &mut futures_util::stream::SplitStream<WebSocket>,
    mut stop_rx: mpsc::UnboundedReceiver<String>,
    mut writer: tokio::task::JoinHandle<()>,
    revoked: &CancellationToken,
    lost: &CancellationToken,
) -> anyhow::Result<()> {
    let limits = conn.state.config.limits.clone();
    let mut ping = tokio::time::interval(limits.ping_interval);
    let mut last_heard = std::time::Instant::now();
    let mut asked_to_move = false;
    loop {
        tokio::select! {
            // The replica drains: the worker is to move its turns to another replica; this
            // connection keeps relaying them until they are released (or the drain times out).
            _ = conn.state.draining.cancelled(), if !asked_to_move => {
                asked_to_move = true;
                tracing::info!(worker.connection = %conn.connection_id, "draining: asking the worker to reconnect elsewhere");
                conn.send(text_msg(&Request::notification(wp::WORKER_RECONNECT, json!({})))).await;
            }
            msg = stream.next() => {
                let Some(msg) = msg else { break };
                last_heard = std::time::Instant::now();
                match msg? {
                    Message::Text(text) => route(conn, &text).await,
                    // A `files.read` chunk as raw bytes (announced in the hello's result).
                    Message::Binary(frame) if !conn.calls.chunk_frame(&frame) => {
                        let err = RpcResponse::err(None, RpcError::new(ErrorCode::ParseError));
                        conn.send(text_msg(&err)).await;
                    }
                    Message::Close(_) => break,
                    _ => {}
                }
            }
            Some(turn) = stop_rx.recv() => {
                if let Some(h) = conn.stop_turn(&turn) {
                    h.cancel.cancel();
                }
                let stop = Request::notification(wp::TURN_STOP, json!({"turnId": turn}));
                conn.send(text_msg(&stop)).await;
            }
            // A worker that vanished without closing (sleep, NAT timeout) answers no pings:
            // drop it so that its turns end `interrupted` and it can reconnect cleanly.
            _ = ping.tick() => {
                if last_heard.elapsed() > limits.idle_timeout {
                    tracing::warn!(worker.connection = %conn.connection_id, "worker silent; closing");
                    break;
                }
                conn.send(Message::Ping(Default::default())).await;
            }
            _ = &mut writer => break,
            _ = lost.cancelled() => {
                tracing::warn!(worker.connection = %conn.connection_id, "presence could not be kept; closing");
                break;
            }
            _ = conn.state.shutdown.cancelled() => break,
            _ = revoked.cancelled() => {
                let frame = axum::extract::ws::CloseFrame { code: 1008, reason: "revoked".into() };
                conn.send(Message::Close(Some(frame))).await;
                let _ = tokio::time::timeout(Duration::from_secs(1), &mut writer).await;
                break;
            }
        }
    }
    writer.abort();
    Ok(())
}

/// One message from the worker: to its turn's queue (waiting while that queue is full), or
/// answered here when it names no turn this connection holds.
async fn route(conn: &Arc<Conn>, text: &str) {
    let received = tracing::enabled!(tracing::Level::TRACE).then(std::time::SystemTime::now);
    // A call's item (a file chunk, mostly) passes on as text; the cheap test keeps turn
    // traffic off this path.
    if text.contains("\"call.item\"") && conn.calls.item_text(text) {
        return;
    }
    let req: Request = match serde_json::from_str(text) {
        Ok(r) => r,
        Err(_) if conn.calls.answer(text) => return,
        Err(_) => {
            let err = RpcResponse::err(None, RpcError::new(ErrorCode::ParseError));
            conn.send(text_msg(&err)).await;
            return;
        }
    };
    if let Some(at) = received
        && req.method == wp::TURN_DELTA
    {
        let p = &req.params;
        let text = |k: &str| p[k].as_str().unwrap_or("");
        trace_delta(
            "turn.delta received",
            text("turnId"),
            text("text"),
            text("thinking"),
            at,
        );
    }
    let turn_id = req.params.get("turnId").and_then(|t| t.as_str()).map(str::to_string);
    let code = match turn_id {
        Some(turn_id) => {
            let queue = conn.turn_queue(&turn_id);
            let Some(queue) = queue else {
                // Settled or stopped already (or never handed here): nothing to write.
                return reply_err(conn, req, ErrorCode::TurnNotRunning).await;
            };
            match queue.send(Queued::Msg(req)).await {
                Ok(()) => return,
                Err(mpsc::error::SendError(Queued::Msg(req))) => {
                    return reply_err(conn, req, ErrorCode::TurnNotRunning).await;
                }
                Err(_) => return,
            }
        }
        None if req.method == wp::CALL_ITEM => return conn.calls.item_value(req.params),
        None if req.method == wp::WORKER_RELEASE => return release(conn, req).await,
        None if req.method == wp::WORKER_CARRY => return carry(conn, req),
        None if req.method == wp::WORKER_DRAINING => {
            tracing::info!(worker.connection = %conn.connection_id, "the worker is shutting down: handing it no more turns");
            conn.worker_draining.store(true, std::sync::atomic::Ordering::Relaxed);
            tokio::spawn(answer_draining(conn.clone(), req));
            return;
        }
        None if super::turn::is_turn_method(&req.method) => ErrorCode::BadParams,
        None => ErrorCode::MethodNotFound,
    };
    reply_err(conn, req, code).await;
}

/// Answer `worker.draining` once nothing is being handed to the connection: a claim in
/// flight, a reserved admission slot or a carry between its `COMMIT` and its registration
/// sends its `turn.run` first, so the worker counts that turn before it reads the answer
/// (and does not leave with it unrun). Bounded: a hand-out takes milliseconds.
async fn answer_draining(conn: Arc<Conn>, req: Request) {
    for _ in 0..500 {
        let busy = {
            let h = conn.handed();
            h.claiming || h.reserved > 0 || h.carrying > 0
        };
        if !busy {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    conn.send(text_msg(&RpcResponse::ok(req.id, json!({})))).await;
}

/// The most turns one `worker.release` or `worker.carry` names.
const MOVE_MAX: usize = 4096;

/// `worker.release`: each named turn this connection holds leaves it once the messages the
/// worker sent for it before are handled (a marker queued behind them, here, in the
/// reader's order); answered, from a task of its own, with the turns released and where
/// their live output stands. Turns not held here are left out.
async fn release(conn: &Arc<Conn>, req: Request) {
    let Ok(p) = serde_json::from_value::<wp::WorkerRelease>(req.params.clone()) else {
        return reply_err(conn, req, ErrorCode::BadParams).await;
    };
    if p.turns.len() > MOVE_MAX {
        return reply_err(conn, req, ErrorCode::BadParams).await;
    }
    let mut waits = Vec::new();
    for turn_id in &p.turns {
        let Some(queue) = conn.turn_queue(turn_id) else {
            continue;
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        if queue.send(Queued::Release(tx)).await.is_ok() {
            waits.push(rx);
        }
    }
    let conn = conn.clone();
    tokio::spawn(async move {
        let mut turns = Vec::new();
        for rx in waits {
            // A turn that ended or was stopped first is not released.
            if let Ok(released) = rx.await {
                turns.push(released);
            }
        }
        let result = serde_json::to_value(wp::WorkerReleased { turns }).unwrap_or_default();
        conn.send(text_msg(&RpcResponse::ok(req.id, result))).await;
    });
}

/// `worker.carry`: take over the turns the worker released on its connection `from` (on a
/// draining replica): each still running there is handed to this connection in the
/// database ([`berth_store::Store::carry_turns`]) and gets its task here, going on from where
/// the release left its live output. Answered with the turns taken.
fn carry(conn: &Arc<Conn>, req: Request) {
    let conn = conn.clone();
    tokio::spawn(async move {
        let p = match serde_json::from_value::<wp::WorkerCarry>(req.params.clone()) {
            Ok(p) if p.turns.len() <= MOVE_MAX && p.from != conn.connection_id => p,
            _ => return reply_err(&conn, req, ErrorCode::BadParams).await,
        };
        let ids: Vec<String> = p.turns.iter().map(|t| t.turn_id.clone()).collect();
        // Until the carried turns are registered below.
        let _carrying = conn.begin_carry();
        let carried = match conn
            .state
            .store
            .carry_turns(&conn.principal, &p.from, &conn.connection_id, &ids)
            .await
        {
            Ok(c) => c,
            Err(e) => {
                let err = ApiError::from(e);
                return conn.send(text_msg(&RpcResponse::err(req.id, err.0))).await;
            }
        };
        let mut turns = Vec::new();
        for (turn_id, session_id) in carried {
            let at = p.turns.iter().find(|t| t.turn_id == turn_id);
            let (handle, inbox) = super::turn::handle(&conn);
            if conn.register(&turn_id, handle, None) {
                super::turn::spawn(conn.clone(), &turn_id, &session_id, inbox, at);
                tracing::info!(turn.id = %turn_id, worker.connection = %conn.connection_id, from = %p.from, "turn carried over from a draining connection");
                turns.push(turn_id);
            }
        }
        let result = serde_json::to_value(wp::WorkerCarried { turns }).unwrap_or_default();
        conn.send(text_msg(&RpcResponse::ok(req.id, result))).await;
    });
}

/// TRACE (target `berth_api::workers`): a worker's `turn.delta` at a step of its way, `at_us`
/// the wall-clock time (µs since the Unix epoch); its turn and live output only.
pub(super) fn trace_delta(what: &'static str, turn: &str, text: &str, thinking: &str, at: std::time::SystemTime) {
    let at_us = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    tracing::trace!(
        target: "berth_api::workers",
        turn,
        at_us,
        text,
        thinking,
        "{what}"
    );
}

async fn reply_err(conn: &Conn, req: Request, code: ErrorCode) {
    if req.id.is_some() {
        conn.send(text_msg(&RpcResponse::err(req.id, RpcError::new(code))))
            .await;
    }
}

/// The connection is gone: delete its presence and interrupt its running turns. What fails
/// here is left to the sweep, which interrupts every running turn without a live presence.
async fn cleanup_presence(state: &AppState, connection_id: &str) {
    match state.store.interrupt_connection(connection_id).await {
        Ok(turns) => {
            for t in turns {
                state.metrics.turns.with_label_values(&["interrupted"]).inc();
                tracing::warn!(turn.id = %t, "worker lost mid-turn; turn interrupted");
            }
        }
        Err(e) => tracing::error!(error = %e, "cleaning up the lost worker failed; the sweep will"),
    }
}

#[cfg(test)]
mod tests {
    use berth_protocol::{
        PROTOCOL_VERSION,
        worker::{self as wp, WorkerHello, WorkspaceDecl},
    };

    use super::check_hello;

    fn hello(host: &str, workspaces: Vec<WorkspaceDecl>) -> WorkerHello {
        WorkerHello {
            protocol: PROTOCOL_VERSION,
            host: host.into(),
            workspaces,
            replaces: None,
            instance: None,
            draining: false,
        }
    }

    fn decl(name: &str, path: &str) -> WorkspaceDecl {
        WorkspaceDecl {
            name: name.into(),
            path: path.into(),
        }
    }

    /// The field and bound a refused hello names.
    fn refused(h: &WorkerHello) -> (String, u64) {
        let e = check_hello(h).expect_err("refused");
        let data = e.0.data;
        assert_eq!(data["code"], "bad-params", "{data}");
        (
            data["field"].as_str().unwrap().to_string(),
            data["max"].as_u64().unwrap(),
        )
    }

    #[test]
    fn a_hello_is_bounded_in_workspaces_and_string_lengths() {
        let at_bounds = hello(
            &"h".repeat(wp::HELLO_HOST_BYTES_MAX),
            (0..wp::HELLO_WORKSPACES_MAX)
                .map(|i| decl(&format!("{i:0>256}"), &"p".repeat(wp::HELLO_PATH_BYTES_MAX)))
                .collect(),
        );
        assert!(check_hello(&at_bounds).is_ok());

        let host = hello(&"h".repeat(wp::HELLO_HOST_BYTES_MAX + 1), vec![decl("a", "/a")]);
        assert_eq!(refused(&host), ("host".into(), 256));
        let mut replaces = hello("host", vec![decl("a", "/a")]);
        replaces.replaces = Some("w".repeat(wp::HELLO_HOST_BYTES_MAX + 1));
        assert_eq!(refused(&replaces), ("replaces".into(), 256));
        let many = hello(
            "host",
            (0..=wp::HELLO_WORKSPACES_MAX)
                .map(|i| decl(&i.to_string(), "/a"))
                .collect(),
        );
        assert_eq!(refused(&many), ("workspaces".into(), 256));
        let name = hello("host", vec![decl(&"n".repeat(wp::HELLO_NAME_BYTES_MAX + 1), "/a")]);
        assert_eq!(refused(&name), ("workspaces.name".into(), 256));
        let path = hello("host", vec![decl("a", &"p".repeat(wp::HELLO_PATH_BYTES_MAX + 1))]);
        assert_eq!(refused(&path), ("workspaces.path".into(), 4096));
    }
}
