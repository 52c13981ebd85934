//! The per-connection loop: `worker.hello`, then messages, hand-out wake-ups, stops,
//! heartbeats and pings until the worker goes away; cleanup afterwards.

use std::{sync::Arc, time::Duration};

use axum::extract::ws::{Message, WebSocket};
use berth_protocol::{
    ErrorCode, PROTOCOL_VERSION, RpcError,
    jsonrpc::{Request, Response as RpcResponse},
    worker::{self as wp, TurnDelta, TurnEnd, TurnStep, WorkerHello, WorkerHelloResult},
};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::sync::{Notify, mpsc};

use super::{LocalWorker, WorkerConn, text_msg};
use crate::error::ApiError;

impl WorkerConn {
    pub(super) async fn run(&mut self, socket: WebSocket) -> anyhow::Result<()> {
        let (mut sink, mut stream) = socket.split();
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
        let state = self.state.clone();
        let store = &state.store;
        if let Err(e) = store.bind_worker_host(&self.principal, &params.host).await {
            let err = ApiError::from(e);
            sink.send(text_msg(&RpcResponse::err(req.id, err.0))).await?;
            anyhow::bail!("worker.hello refused for host {}", params.host);
        }
        let ids = store
            .register_workspaces(&self.principal, &params.host, &params.workspaces)
            .await?;
        store
            .presence_insert(
                &self.connection_id,
                &self.principal,
                &self.state.config.replica_id,
                &ids,
            )
            .await?;
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
        };
        sink.send(text_msg(&RpcResponse::ok(req.id, serde_json::to_value(result)?)))
            .await?;
        tracing::info!(worker.connection = %self.connection_id, host = %params.host, workspaces = ids.len(), "worker connected");

        let kick = Arc::new(Notify::new());
        let (stop_tx, mut stop_rx) = mpsc::unbounded_channel();
        let (calls_tx, mut calls_rx) = mpsc::unbounded_channel();
        let local = LocalWorker {
            tenant_id: self.principal.tenant_id.clone(),
            workspaces: ids.clone(),
            calls: calls_tx,
            call_slots: super::calls::call_slots(),
            kick: kick.clone(),
            stop: stop_tx,
        };
        self.state
            .workers
            .conns
            .lock()
            .expect("registry lock")
            .insert(self.connection_id.clone(), local);
        kick.notify_one();
        let mut heartbeat = tokio::time::interval(Duration::from_secs(10));
        let mut flush = tokio::time::interval(Duration::from_millis(50));
        let mut safety = tokio::time::interval(Duration::from_secs(5));
        let limits = self.state.config.limits.clone();
        let mut ping = tokio::time::interval(limits.ping_interval);
        let mut last_heard = std::time::Instant::now();
        loop {
            tokio::select! {
                msg = stream.next() => {
                    let Some(msg) = msg else { break };
                    last_heard = std::time::Instant::now();
                    match msg? {
                        Message::Text(text) => {
                            if let Some(reply) = self.handle(&text).await {
                                sink.send(text_msg(&reply)).await?;
                            }
                        }
                        Message::Close(_) => break,
                        _ => {}
                    }
                }
                _ = kick.notified() => self.claim(&ids, &mut sink).await?,
                Some(msg) = calls_rx.recv() => self.send_to_worker(msg, &mut sink).await?,
                Some(turn) = stop_rx.recv() => {
                    if let Some(live) = self.turns.remove(&turn) {
                        self.relay.remove(&turn);
                        self.state.hub.end_step(&live.session);
                        self.relay_now(&live.session, json!({"type": "phase", "phase": "idle", "turnId": turn})).await;
                    }
                    let stop = Request::notification(wp::TURN_STOP, json!({"turnId": turn}));
                    sink.send(text_msg(&stop)).await?;
                }
                _ = safety.tick() => self.claim(&ids, &mut sink).await?,
                _ = heartbeat.tick() => {
                    if !store.presence_heartbeat(&self.connection_id).await? {
                        tracing::warn!(worker.connection = %self.connection_id, "presence was swept; restoring it");
                        store.presence_insert(&self.connection_id, &self.principal, &self.state.config.replica_id, &ids).await?;
                    }
                }
                // A worker that vanished without closing (sleep, NAT timeout) answers no pings:
                // drop it so that its turns end `interrupted` and it can reconnect cleanly.
                _ = ping.tick() => {
                    if last_heard.elapsed() > limits.idle_timeout {
                        tracing::warn!(worker.connection = %self.connection_id, "worker silent; closing");
                        break;
                    }
                    sink.send(Message::Ping(Default::default())).await?;
                }
                _ = flush.tick() => self.flush_relay().await,
                _ = self.state.shutdown.cancelled() => break,
                _ = self.revoked.cancelled() => {
                    let frame = axum::extract::ws::CloseFrame { code: 1008, reason: "revoked".into() };
                    let _ = sink.send(Message::Close(Some(frame))).await;
                    break;
                }
            }
        }
        Ok(())
    }

    /// One message from the worker; returns the response for requests.
    pub(super) async fn handle(&mut self, text: &str) -> Option<RpcResponse> {
        let req: Request = match serde_json::from_str(text) {
            Ok(r) => r,
            Err(_) if self.call_answer(text) => return None,
            Err(_) => return Some(RpcResponse::err(None, RpcError::new(ErrorCode::ParseError))),
        };
        let result: Result<serde_json::Value, ApiError> = match req.method.as_str() {
            wp::TURN_DELTA => {
                if let Ok(d) = serde_json::from_value::<TurnDelta>(req.params) {
                    self.delta(d);
                }
                return None;
            }
            wp::CALL_ITEM => {
                self.call_item(req.params);
                return None;
            }
            wp::TURN_STEP => match serde_json::from_value::<TurnStep>(req.params) {
                Ok(step) => self.step(step).await,
                Err(_) => Err(ApiError::code(ErrorCode::BadParams)),
            },
            wp::TURN_END => match serde_json::from_value::<TurnEnd>(req.params) {
                Ok(end) => self.end(end).await,
                Err(_) => Err(ApiError::code(ErrorCode::BadParams)),
            },
            _ => Err(ApiError::code(ErrorCode::MethodNotFound)),
        };
        req.id?;
        Some(match result {
            Ok(v) => RpcResponse::ok(req.id, v),
            Err(e) => RpcResponse::err(req.id, e.0),
        })
    }

    pub(super) async fn cleanup(&mut self) {
        // Calls in progress end now with a typed error (their channels close).
        self.calls.clear();
        self.state
            .workers
            .conns
            .lock()
            .expect("registry lock")
            .remove(&self.connection_id);
        let store = &self.state.store;
        if let Err(e) = store.presence_remove(&self.connection_id).await {
            tracing::warn!(error = %e, "removing worker presence failed");
        }
        match store.interrupt_connection(&self.connection_id).await {
            Ok(turns) => {
                for t in turns {
                    self.state.metrics.turns.with_label_values(&["interrupted"]).inc();
                    tracing::warn!(turn.id = %t, "worker lost mid-turn; turn interrupted");
                }
            }
            Err(e) => tracing::error!(error = %e, "interrupting the lost worker's turns failed"),
        }
    }
}
