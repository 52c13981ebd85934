//! Berth's worker: runs on the machine that holds the workspaces, connects outbound to the
//! API tier over one WebSocket (reconnecting forever with backoff), registers its
//! workspaces and runs the turns it is handed. Model calls go through the API tier's
//! streaming proxy, so this machine needs no provider key and no internet egress.

mod agent;
mod attachments;
mod coordinator;
mod delegate;
mod model;
mod net;
mod observe;
mod policy;
mod prompt;
mod skills;
mod tools;
mod turn;
mod workspace;

pub use agent::AgentConfig;
pub use tools::{McpConfig, ServerSpec, ToolLimits, shell::is_secret_env};

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context, bail};
use berth_protocol::{
    PROTOCOL_VERSION, RpcError,
    jsonrpc::{Request, Response},
    worker::{self as wp, TurnRun, WorkerHello, WorkerHelloResult, WorkspaceDecl},
};
use futures_util::{SinkExt, StreamExt};
use rand::Rng;
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest, http::HeaderValue};
use tokio_util::sync::CancellationToken;

use crate::{tools::Tools, workspace::Workspace};

/// What the worker needs to run.
#[derive(Clone)]
pub struct WorkerConfig {
    /// The API tier's base URL (`ws://`, `wss://`, `http://` or `https://`).
    pub server: String,
    /// The worker credential.
    pub token: String,
    /// This machine's stable name.
    pub host: String,
    /// Workspaces served: (name, absolute path).
    pub workspaces: Vec<(String, PathBuf)>,
    /// The agent loop's limits.
    pub agent: AgentConfig,
    /// The tools' limits.
    pub tools: ToolLimits,
    /// MCP servers and their bounds.
    pub mcp: McpConfig,
}

impl std::fmt::Debug for WorkerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerConfig")
            .field("server", &self.server)
            .field("token", &"<redacted>")
            .field("host", &self.host)
            .field("workspaces", &self.workspaces)
            .field("agent", &self.agent)
            .field("tools", &self.tools)
            .field("mcp", &self.mcp)
            .finish()
    }
}

impl WorkerConfig {
    fn base(&self) -> (String, String) {
        let s = self.server.trim_end_matches('/');
        let (ws, http) = if let Some(rest) = s.strip_prefix("https://").or_else(|| s.strip_prefix("wss://")) {
            (format!("wss://{rest}"), format!("https://{rest}"))
        } else if let Some(rest) = s.strip_prefix("http://").or_else(|| s.strip_prefix("ws://")) {
            (format!("ws://{rest}"), format!("http://{rest}"))
        } else {
            (format!("ws://{s}"), format!("http://{s}"))
        };
        (format!("{ws}/v1/worker"), http)
    }
}

/// Run until `shutdown`, reconnecting with exponential backoff (capped, jittered).
pub async fn run(config: WorkerConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    run_reporting(config, shutdown, Arc::default()).await
}

/// [`run`], keeping `connected` true while the worker is registered with the API tier (from
/// an accepted `worker.hello` until that connection ends): what its readiness probe reports.
pub async fn run_reporting(
    config: WorkerConfig,
    shutdown: CancellationToken,
    connected: Arc<std::sync::atomic::AtomicBool>,
) -> anyhow::Result<()> {
    let http = net::http_client()?;
    let mut backoff = Duration::from_millis(200);
    // The last connection's id: the next hello says it was given up.
    let mut previous = None;
    loop {
        let outcome = connect_once(&config, &http, &shutdown, &connected, &mut previous).await;
        connected.store(false, std::sync::atomic::Ordering::Relaxed);
        match outcome {
            Ok(()) => return Ok(()),
            Err(e) => {
                // An authoritative refusal of the credential will not fix itself quickly, but
                // an operator may re-issue it: keep trying, slowly.
                tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "worker connection lost");
            }
        }
        let jitter = rand::rng().random_range(0..=backoff.as_millis() as u64 / 4);
        tokio::select! {
            _ = tokio::time::sleep(backoff + Duration::from_millis(jitter)) => {}
            _ = shutdown.cancelled() => return Ok(()),
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

/// The connection's outbound side, shared by turn tasks.
#[derive(Clone)]
pub(crate) struct Link {
    out: mpsc::Sender<Message>,
    pending: Arc<Mutex<HashMap<u32, oneshot::Sender<Answer>>>>,
    next_id: Arc<std::sync::atomic::AtomicU32>,
    pub(crate) http: reqwest::Client,
    pub(crate) proxy_url: String,
    pub(crate) token: String,
    /// How this connection's turns ended (for parents waiting on sub-agents).
    pub(crate) endings: Arc<delegate::Endings>,
    /// The server stores a turn's last step with its end (`turn.end` carries it).
    pub(crate) end_carries_step: bool,
    /// The server takes `files.read` chunks as binary frames.
    pub(crate) binary_chunks: bool,
    /// The server takes runs of `files.read` chunks as one binary frame.
    pub(crate) chunk_runs: bool,
}

impl Link {
    pub(crate) async fn notify(&self, method: &str, params: serde_json::Value) -> anyhow::Result<()> {
        let msg = serde_json::to_string(&Request::notification(method, params))?;
        self.out
            .send(Message::Text(msg.into()))
            .await
            .context("connection closed")
    }

    pub(crate) async fn request(&self, method: &str, params: serde_json::Value) -> anyhow::Result<serde_json::Value> {
        let result = self.request_raw(method, params).await?;
        Ok(serde_json::from_str(result.as_deref().map_or("null", RawValue::get))?)
    }

    /// [`Link::request`] answering with the result's JSON text (None: `null`), for a caller
    /// that reads it straight into its own type.
    pub(crate) async fn request_raw(
        &self,
        method: &str,
        params: serde_json::Value,
    ) -> anyhow::Result<Option<Box<RawValue>>> {
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().expect("pending lock").insert(id, tx);
        let msg = serde_json::to_string(&Request::new(id, method, params))?;
        self.out
            .send(Message::Text(msg.into()))
            .await
            .context("connection closed")?;
        Ok(rx.await.context("connection closed before the response")??)
    }
}

async fn connect_once(
    config: &WorkerConfig,
    http: &reqwest::Client,
    shutdown: &CancellationToken,
    connected: &std::sync::atomic::AtomicBool,
    previous: &mut Option<String>,
) -> anyhow::Result<()> {
    let (ws_url, http_base) = config.base();
    let mut req = ws_url.as_str().into_client_request()?;
    req.headers_mut().insert(
        "authorization",
        HeaderValue::from_str(&format!("Bearer {}", config.token))?,
    );
    let (socket, _) = net::connect(req).await.context("connecting to the API tier")?;
    let (mut sink, mut stream) = socket.split();

    let hello = WorkerHello {
        protocol: PROTOCOL_VERSION,
        host: config.host.clone(),
        workspaces: config
            .workspaces
            .iter()
            .map(|(name, path)| WorkspaceDecl {
                name: name.clone(),
                path: path.display().to_string(),
            })
            .collect(),
        replaces: previous.clone(),
    };
    let msg = serde_json::to_string(&Request::new(0, wp::WORKER_HELLO, serde_json::to_value(&hello)?))?;
    sink.send(Message::Text(msg.into())).await?;
    let reply = tokio::time::timeout(Duration::from_secs(30), stream.next())
        .await
        .context("no answer to worker.hello")?;
    let Some(Ok(Message::Text(text))) = reply else {
        bail!("connection closed during worker.hello")
    };
    let resp: Response = serde_json::from_str(&text)?;
    if let Some(e) = resp.error {
        bail!("worker.hello refused: {e}");
    }
    let registered: WorkerHelloResult = serde_json::from_value(resp.result.unwrap_or_default())?;
    *previous = registered.connection_id.clone();
    tracing::info!(workspaces = registered.workspaces.len(), "worker connected");
    connected.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut workspaces = HashMap::new();
    for r in &registered.workspaces {
        let Some((_, path)) = config.workspaces.iter().find(|(name, _)| *name == r.name) else {
            continue;
        };
        match Workspace::open(path) {
            Ok(ws) => {
                workspaces.insert(r.workspace_id.clone(), Arc::new(ws));
            }
            Err(e) => tracing::error!(workspace = %r.name, error = %e, "cannot open the workspace"),
        }
    }
    let ctx = TurnContext {
        workspaces,
        agent: config.agent.clone(),
        tools: config.tools.clone(),
        mcp: Arc::new(config.mcp.clone()),
    };

    let (out_tx, mut out_rx) = mpsc::channel::<Message>(256);
    let link = Link {
        out: out_tx,
        pending: Arc::default(),
        next_id: Arc::new(1.into()),
        http: http.clone(),
        proxy_url: format!("{http_base}{}", wp::MODEL_PROXY_PATH),
        token: config.token.clone(),
        endings: Arc::default(),
        end_carries_step: registered.end_carries_step,
        binary_chunks: registered.binary_chunks,
        chunk_runs: registered.chunk_runs,
    };
    let turns = CancellationToken::new();
    let running: Running = Arc::default();
    let roots = registered
        .workspaces
        .iter()
        .filter_map(|r| {
            let (_, path) = config.workspaces.iter().find(|(name, _)| *name == r.name)?;
            Some((r.workspace_id.clone(), path.clone()))
        })
        .collect();
    let observer = observe::Observer::new(link.clone(), roots, turns.child_token());
    let result = loop {
        tokio::select! {
            msg = stream.next() => {
                let msg = match msg {
                    Some(Ok(m)) => m,
                    Some(Err(e)) => break Err(e.into()),
                    None => break Err(anyhow::anyhow!("server closed the connection")),
                };
                if let Message::Text(text) = msg {
                    on_message(&link, &ctx, &turns, &running, &observer, &text);
                }
            }
            out = out_rx.recv() => if let Some(m) = out
                && let Err(e) = berth_protocol::batch::write_batch(&mut sink, m, || out_rx.try_recv().ok(), Message::is_close).await
            {
                break Err(e.into())
            },
            _ = shutdown.cancelled() => {
                let _ = sink.send(Message::Close(None)).await;
                break Ok(());
            }
        }
    };
    // The server interrupts this connection's running turns; stop working on them, and
    // fail requests still waiting for an answer that can no longer come.
    turns.cancel();
    link.pending.lock().expect("pending lock").clear();
    result
}

/// A connection's turns ([`Turns`]).
type Running = Arc<Mutex<Turns>>;

/// A connection's running turns (their cancellation tokens, by turn id), and the turns the
/// server stopped that were not running here: a `turn.stop` can overtake its turn's
/// `turn.run` (a stop that reaches the server's connection while the hand-out is in
/// flight), and such a turn must not run.
#[derive(Default)]
struct Turns {
    running: HashMap<String, CancellationToken>,
    stopped: wp::EarlyStops,
}

impl Turns {
    /// Register a turn about to run; false when it was stopped before its `turn.run` came.
    fn start(&mut self, turn_id: &str, cancel: CancellationToken) -> bool {
        if self.stopped.take(turn_id) {
            return false;
        }
        self.running.insert(turn_id.to_string(), cancel);
        true
    }

    /// The server stopped `turn_id`: its token if it runs here, else the stop is kept for
    /// [`Turns::start`].
    fn stop(&mut self, turn_id: &str) -> Option<CancellationToken> {
        let cancel = self.running.remove(turn_id);
        if cancel.is_none() {
            self.stopped.remember(turn_id);
        }
        cancel
    }

    /// The turn's task is done.
    fn finish(&mut self, turn_id: &str) {
        self.running.remove(turn_id);
    }
}

/// What a connection's turns run with.
struct TurnContext {
    /// The registered workspaces, by id.
    workspaces: HashMap<String, Arc<Workspace>>,
    agent: AgentConfig,
    tools: ToolLimits,
    mcp: Arc<tools::McpConfig>,
}

/// A message from the server, read in one pass that builds no tree: a request's params and a
/// response's result stay JSON text until whoever takes them reads them into their own type
/// (a `turn.history` page goes straight into its rows).
#[derive(serde::Deserialize)]
struct Incoming<'a> {
    #[serde(default)]
    id: Option<u32>,
    #[serde(default, borrow)]
    method: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    params: Option<&'a RawValue>,
    #[serde(default, borrow)]
    result: Option<&'a RawValue>,
    #[serde(default)]
    error: Option<RpcError>,
}

/// An answer to one of the worker's requests: its result's JSON text (None: `null` or none).
type Answer = Result<Option<Box<RawValue>>, RpcError>;

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct TurnStop {
    turn_id: String,
}

fn on_message(
    link: &Link,
    ctx: &TurnContext,
    turns: &CancellationToken,
    running: &Running,
    observer: &observe::Observer,
    text: &str,
) {
    let Ok(msg) = serde_json::from_str::<Incoming>(text) else {
        return;
    };
    if let Some(method) = msg.method {
        let params = msg.params.map_or("null", RawValue::get);
        match method.as_ref() {
            // `call`, `call.ack`, `call.cancel`: the observer reads them itself.
            m if m.starts_with("call") => {
                observer.handle(text);
            }
            wp::TURN_RUN => match serde_json::from_str::<TurnRun>(params) {
                Ok(run) => {
                    let cancel = turns.child_token();
                    if !running
                        .lock()
                        .expect("running lock")
                        .start(&run.turn_id, cancel.clone())
                    {
                        tracing::info!(turn.id = %run.turn_id, "turn stopped by the server before it ran");
                        turn::record_settled(link, &run.turn_id);
                        return;
                    }
                    let link = link.clone();
                    let tools = match ctx.workspaces.get(&run.workspace_id) {
                        _ if run.no_tools => None,
                        Some(ws) => Some(Tools::new(ws.clone(), ctx.tools.clone(), ctx.mcp.clone())),
                        None => {
                            // Registered but not openable (removed since start): the model is
                            // offered no tools rather than tools that cannot work.
                            tracing::error!(turn.id = %run.turn_id, "the turn's workspace is not open on this worker");
                            None
                        }
                    };
                    let agent = ctx.agent.clone();
                    let running = running.clone();
                    tokio::spawn(async move {
                        let turn_id = run.turn_id.clone();
                        turn::run(link, run, tools, agent, cancel).await;
                        running.lock().expect("running lock").finish(&turn_id);
                    });
                }
                Err(e) => tracing::warn!(error = %e, "malformed turn.run"),
            },
            wp::TURN_STOP => {
                if let Ok(stop) = serde_json::from_str::<TurnStop>(params)
                    && let Some(cancel) = running.lock().expect("running lock").stop(&stop.turn_id)
                {
                    tracing::info!(turn.id = %stop.turn_id, "turn stopped by the server");
                    cancel.cancel();
                }
            }
            _ => {}
        }
    } else if let Some(id) = msg.id
        && let Some(tx) = link.pending.lock().expect("pending lock").remove(&id)
    {
        let answer = match msg.error {
            Some(e) => Err(e),
            None => Ok(msg.result.map(RawValue::to_owned)),
        };
        let _ = tx.send(answer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_stopped_before_its_run_came_does_not_run() {
        let mut turns = Turns::default();
        // A stop that overtook its turn's `turn.run`.
        assert!(turns.stop("t1").is_none());
        assert!(!turns.start("t1", CancellationToken::new()), "a stopped turn started");
        // Kept once: the same id again (never sent by the server) would run.
        assert!(turns.start("t1", CancellationToken::new()));
        // A running turn is stopped through its token.
        let cancel = CancellationToken::new();
        assert!(turns.start("t2", cancel.clone()));
        turns.stop("t2").expect("running turn's token").cancel();
        assert!(cancel.is_cancelled());
        // A stop after its turn ended is kept, but within a bound.
        turns.finish("t1");
        for i in 0..wp::EARLY_STOPS_KEPT + 10 {
            turns.stop(&format!("late-{i}"));
        }
        assert_eq!(turns.stopped.len(), wp::EARLY_STOPS_KEPT);
        assert!(turns.running.is_empty());
        assert!(!turns.start(&format!("late-{}", wp::EARLY_STOPS_KEPT + 9), CancellationToken::new()));
        assert!(
            turns.start("late-0", CancellationToken::new()),
            "the oldest stop is forgotten first"
        );
    }
}
