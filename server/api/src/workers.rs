//! Worker connections (`GET /v1/worker`): registration, presence, turn hand-out and the
//! events a worker streams back.
//!
//! A worker connects outbound with a worker credential, declares its workspaces in
//! `worker.hello`, and is then handed turns. Hand-out is driven by the database: any
//! replica that admits or settles a turn sends `NOTIFY berth_dispatch, '<workspace>'`, and
//! the replica that holds a connection for that workspace claims the turns
//! ([`berth_store::Store::claim_turns`]) and sends `turn.run`.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    extract::{
        State, WebSocketUpgrade,
        ws::{Message, WebSocket},
    },
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use berth_protocol::{
    ErrorCode, PROTOCOL_VERSION, RpcError,
    jsonrpc::{Request, Response as RpcResponse},
    worker::{self as wp, TurnDelta, TurnEnd, TurnStep, WorkerHello, WorkerHelloResult},
};
use berth_store::{CHANNEL_DELTAS, CredentialKind, Principal, token};
use futures_util::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::{Notify, mpsc};

use crate::{AppState, connections::Registration, error::ApiError, rpc::bearer};

pub mod interaction;

/// Worker connections held by this replica, by connection id.
#[derive(Default)]
pub struct Registry {
    conns: Mutex<HashMap<String, LocalWorker>>,
}

/// A worker connection held by this replica.
struct LocalWorker {
    workspaces: Vec<String>,
    /// Makes the connection claim turns.
    kick: Arc<Notify>,
    /// Turns to stop (cancelled by a client on any replica).
    stop: mpsc::UnboundedSender<String>,
}

impl Registry {
    /// Wake the connections serving `workspace_id` to claim turns.
    pub fn kick(&self, workspace_id: &str) {
        for w in self.conns.lock().expect("registry lock").values() {
            if w.workspaces.iter().any(|id| id == workspace_id) {
                w.kick.notify_one();
            }
        }
    }

    pub fn kick_all(&self) {
        for w in self.conns.lock().expect("registry lock").values() {
            w.kick.notify_one();
        }
    }

    /// Tell the worker on `connection_id` (if this replica holds it) to stop `turn_id`.
    pub fn stop(&self, connection_id: &str, turn_id: &str) {
        if let Some(w) = self.conns.lock().expect("registry lock").get(connection_id) {
            let _ = w.stop.send(turn_id.to_string());
        }
    }
}

/// A live item relayed to the other replicas' watchers.
#[derive(Debug, Serialize, Deserialize)]
pub struct RelayedDelta {
    pub replica: String,
    pub session: String,
    pub item: serde_json::Value,
}

/// NOTIFY payloads must stay under 8000 bytes, after JSON escaping (up to 6 bytes per
/// input byte for control characters) and the envelope.
const RELAY_TEXT_MAX: usize = 1200;

pub async fn upgrade(State(state): State<AppState>, headers: HeaderMap, ws: WebSocketUpgrade) -> Response {
    let Some(presented) = bearer(&headers) else {
        state.metrics.auth_failures.with_label_values(&["missing"]).inc();
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let principal = match state.store.authenticate(presented).await {
        Ok(Some(p)) if p.kind == CredentialKind::Worker => p,
        Ok(Some(_)) => {
            state.metrics.auth_failures.with_label_values(&["not-a-worker"]).inc();
            return StatusCode::FORBIDDEN.into_response();
        }
        Ok(None) => {
            state.metrics.auth_failures.with_label_values(&["invalid"]).inc();
            return StatusCode::UNAUTHORIZED.into_response();
        }
        Err(_) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
    };
    let revoked = tokio_util::sync::CancellationToken::new();
    let max = state.config.limits.max_connections_per_credential;
    // Unregistered when dropped: also when the upgrade never completes.
    let Some(registration) = Registration::new(&state, &principal, max, revoked.clone()) else {
        return StatusCode::TOO_MANY_REQUESTS.into_response();
    };
    ws.max_message_size(state.config.max_text_message)
        .on_upgrade(move |socket| async move {
            let connection_id = token::new_id("wcn");
            state.metrics.workers_connected.inc();
            state.metrics.connections.with_label_values(&["worker"]).inc();
            let mut conn = WorkerConn {
                state: state.clone(),
                principal,
                connection_id,
                turns: HashMap::new(),
                relay: HashMap::new(),
                revoked,
            };
            if let Err(e) = conn.run(socket).await {
                tracing::info!(worker.connection = %conn.connection_id, error = %e, "worker connection ended");
            }
            conn.cleanup().await;
            drop(registration);
            state.metrics.workers_connected.dec();
            state.metrics.connections.with_label_values(&["worker"]).dec();
        })
}

struct WorkerConn {
    state: AppState,
    principal: Principal,
    connection_id: String,
    /// Turns handed to this connection, with their live-output position.
    turns: HashMap<String, LiveTurn>,
    /// Deltas waiting to be relayed to other replicas (and stored as partial output), by turn.
    relay: HashMap<String, Pending>,
    /// Cancelled when the worker's credential is revoked.
    revoked: tokio_util::sync::CancellationToken,
}

/// Where a running turn's live output is: the step and how many bytes of text and
/// thinking it has streamed (the offsets carried by `model.delta`).
struct LiveTurn {
    session: String,
    /// When the turn was handed to the worker.
    started: std::time::Instant,
    step: i32,
    text: u64,
    thinking: u64,
}

/// Coalesced output not yet relayed.
struct Pending {
    session: String,
    step: i32,
    text_offset: u64,
    text: String,
    thinking_offset: u64,
    thinking: String,
}

impl WorkerConn {
    async fn run(&mut self, socket: WebSocket) -> anyhow::Result<()> {
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
        let local = LocalWorker {
            workspaces: ids.clone(),
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

    async fn claim(
        &mut self,
        workspaces: &[String],
        sink: &mut futures_util::stream::SplitSink<WebSocket, Message>,
    ) -> anyhow::Result<()> {
        let claimed = self
            .state
            .store
            .claim_turns(&self.connection_id, &self.principal.tenant_id, workspaces)
            .await?;
        for c in claimed {
            tracing::info!(turn.id = %c.run.turn_id, session.id = %c.run.session_id, "turn handed to worker");
            let live = LiveTurn {
                session: c.run.session_id.clone(),
                started: std::time::Instant::now(),
                step: 0,
                text: 0,
                thinking: 0,
            };
            self.turns.insert(c.run.turn_id.clone(), live);
            self.relay_now(
                &c.run.session_id,
                json!({"type": "phase", "phase": "running", "turnId": c.run.turn_id}),
            )
            .await;
            let mut run = c.run;
            if run.model.is_none() {
                run.model = self.state.config.model.model.clone();
            }
            sink.send(text_msg(&Request::notification(
                wp::TURN_RUN,
                serde_json::to_value(run)?,
            )))
            .await?;
        }
        Ok(())
    }

    /// One message from the worker; returns the response for requests.
    async fn handle(&mut self, text: &str) -> Option<RpcResponse> {
        let req: Request = match serde_json::from_str(text) {
            Ok(r) => r,
            Err(_) => return Some(RpcResponse::err(None, RpcError::new(ErrorCode::ParseError))),
        };
        let tenant = self.principal.tenant_id.clone();
        let state = self.state.clone();
        let store = &state.store;
        let result: Result<serde_json::Value, ApiError> = match req.method.as_str() {
            wp::TURN_DELTA => {
                if let Ok(d) = serde_json::from_value::<TurnDelta>(req.params) {
                    self.delta(d);
                }
                return None;
            }
            wp::TURN_STEP => match serde_json::from_value::<TurnStep>(req.params) {
                Ok(step) => {
                    self.flush_relay().await;
                    let conn = &self.connection_id;
                    let r = store
                        .append_step(conn, &tenant, &step.turn_id, &step.rows, step.usage)
                        .await;
                    if let Some(live) = self.turns.get_mut(&step.turn_id) {
                        self.state.hub.end_step(&live.session);
                        live.step += 1;
                        live.text = 0;
                        live.thinking = 0;
                    }
                    if let (Ok(_), Some(u)) = (&r, step.usage) {
                        let model = self.state.config.model.model.clone().unwrap_or_default();
                        let m = &self.state.metrics.model_tokens;
                        m.with_label_values(&["default", &model, "input"])
                            .inc_by(u.input_tokens);
                        m.with_label_values(&["default", &model, "output"])
                            .inc_by(u.output_tokens);
                    }
                    r.map(|seq| {
                        self.state.metrics.events_appended.inc();
                        json!({"sequence": seq})
                    })
                    .map_err(ApiError::from)
                }
                Err(_) => Err(ApiError::code(ErrorCode::BadParams)),
            },
            wp::TURN_END => match serde_json::from_value::<TurnEnd>(req.params) {
                Ok(end) => {
                    self.flush_relay().await;
                    let r = store
                        .end_turn(
                            Some(&self.connection_id),
                            &tenant,
                            &end.turn_id,
                            end.state,
                            end.cause.as_ref(),
                        )
                        .await;
                    if let Some(live) = self.turns.remove(&end.turn_id) {
                        self.state
                            .metrics
                            .turn_duration
                            .observe(live.started.elapsed().as_secs_f64());
                        self.state.hub.end_step(&live.session);
                        let idle = json!({"type": "phase", "phase": "idle", "turnId": end.turn_id});
                        self.relay_now(&live.session, idle).await;
                    }
                    r.map(|(_, seq)| {
                        self.state.metrics.events_appended.inc();
                        self.state.metrics.turns.with_label_values(&[end.state.as_str()]).inc();
                        tracing::info!(turn.id = %end.turn_id, state = end.state.as_str(), "turn settled");
                        json!({"sequence": seq})
                    })
                    .map_err(ApiError::from)
                }
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

    fn delta(&mut self, d: TurnDelta) {
        let Some(live) = self.turns.get_mut(&d.turn_id) else {
            return;
        };
        let text = d.text.unwrap_or_default();
        let thinking = d.thinking.unwrap_or_default();
        if text.is_empty() && thinking.is_empty() {
            return;
        }
        let item = json!({
            "type": "model.delta", "turnId": d.turn_id, "step": live.step,
            "text": text, "textOffset": live.text, "thinking": thinking, "thinkingOffset": live.thinking,
        });
        let pending = self.relay.entry(d.turn_id.clone()).or_insert_with(|| Pending {
            session: live.session.clone(),
            step: live.step,
            text_offset: live.text,
            text: String::new(),
            thinking_offset: live.thinking,
            thinking: String::new(),
        });
        pending.text.push_str(&text);
        pending.thinking.push_str(&thinking);
        live.text += text.len() as u64;
        live.thinking += thinking.len() as u64;
        self.state
            .hub
            .local_delta(&live.session, &d.turn_id, live.step, &text, &thinking, item);
    }

    /// Store coalesced output as the step's partial text and relay it to other replicas,
    /// in one transaction (live only; the completed step is what history keeps).
    async fn flush_relay(&mut self) {
        for (turn, p) in std::mem::take(&mut self.relay) {
            let mut payloads = Vec::new();
            for (field, offset_field, value, mut offset) in [
                ("text", "textOffset", &p.text, p.text_offset),
                ("thinking", "thinkingOffset", &p.thinking, p.thinking_offset),
            ] {
                for piece in berth_protocol::text::chunks(value, RELAY_TEXT_MAX) {
                    let item = json!({"type": "model.delta", "turnId": turn, "step": p.step, field: piece, offset_field: offset});
                    offset += piece.len() as u64;
                    let msg = RelayedDelta {
                        replica: self.state.config.replica_id.clone(),
                        session: p.session.clone(),
                        item,
                    };
                    payloads.push(serde_json::to_string(&msg).unwrap_or_default());
                }
            }
            let tenant = &self.principal.tenant_id;
            if let Err(e) = self
                .state
                .store
                .append_partial(tenant, &turn, &p.text, &p.thinking, CHANNEL_DELTAS, &payloads)
                .await
            {
                tracing::warn!(error = %e, "relaying live deltas failed");
            }
        }
    }

    async fn relay_now(&self, session: &str, item: serde_json::Value) {
        self.state.hub.live(session, item.clone());
        self.notify_others(session, item).await;
    }

    async fn notify_others(&self, session: &str, item: serde_json::Value) {
        let msg = RelayedDelta {
            replica: self.state.config.replica_id.clone(),
            session: session.to_string(),
            item,
        };
        if let Ok(payload) = serde_json::to_string(&msg)
            && let Err(e) = self.state.store.notify(CHANNEL_DELTAS, &payload).await
        {
            tracing::warn!(error = %e, "relaying live deltas failed");
        }
    }

    async fn cleanup(&mut self) {
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

fn text_msg<T: Serialize>(v: &T) -> Message {
    Message::Text(serde_json::to_string(v).unwrap_or_default().into())
}
