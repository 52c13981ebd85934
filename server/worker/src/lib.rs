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
    /// Paths holding Berth's own credentials and settings on this machine, never read or
    /// listed in a workspace (see [`workspace::keep_out`]).
    pub keep_out: Vec<PathBuf>,
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
            .field("keep_out", &self.keep_out)
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
    run_reporting(config, CancellationToken::new(), shutdown, Arc::default()).await
}

/// [`run`], keeping `connected` true while the worker is registered with the API tier (from
/// an accepted `worker.hello` until that connection ends, or it drains): what its readiness
/// probe reports. `drain` shuts the worker down without interrupting its turns: it tells
/// the server (`worker.draining`: it is handed no more turns), lets the turns it runs go on
/// to their ends, and returns once none is left (or at `shutdown`, which ends them
/// `interrupted`).
pub async fn run_reporting(
    config: WorkerConfig,
    drain: CancellationToken,
    shutdown: CancellationToken,
    connected: Arc<std::sync::atomic::AtomicBool>,
) -> anyhow::Result<()> {
    let roots: Vec<PathBuf> = config.workspaces.iter().map(|(_, p)| p.clone()).collect();
    workspace::keep_out(&config.keep_out, &roots);
    let http = net::http_client()?;
    let shared = Shared {
        draining: drain.clone(),
        ..Shared::default()
    };
    let mut backoff = Duration::from_millis(200);
    // The last connection's id: the next hello says it was given up.
    let mut previous = None;
    let stop = Stop {
        shutdown: &shutdown,
        connected: &connected,
    };
    loop {
        // Read once: the hello says it, and `serve` knows the server was told.
        let draining = drain.is_cancelled();
        if draining && shared.running() == 0 {
            return Ok(());
        }
        let outcome = match Connection::open(&config, &http, &shared, previous.take(), draining).await {
            Ok(conn) => {
                previous = Some(conn.id.to_string());
                connected.store(!draining, std::sync::atomic::Ordering::Relaxed);
                serve(conn, &config, &http, &shared, &stop, draining, &mut previous).await
            }
            Err(e) => Err(e),
        };
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
        if drain.is_cancelled() && shared.running() == 0 {
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff + Duration::from_millis(jitter)) => {}
            _ = drain.cancelled(), if !drain.is_cancelled() => {}
            _ = shutdown.cancelled() => return Ok(()),
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

/// How the worker stops at once (`shutdown`; a drain is [`Shared::draining`]), and the
/// readiness it reports.
struct Stop<'a> {
    shutdown: &'a CancellationToken,
    connected: &'a std::sync::atomic::AtomicBool,
}

/// How often a draining worker looks whether its turns have ended.
const DRAIN_LOOK: Duration = Duration::from_millis(200);

/// Tell `conn`'s server the worker drains (`worker.draining`) and wait for its answer while
/// the connection lasts (the caller sees its end next) and until `shutdown`.
async fn tell_draining(conn: &Connection, shared: &Shared, shutdown: &CancellationToken) {
    let out = Out::new(&conn.id, conn.out.clone());
    let asked = tokio::time::timeout(
        MOVE_ANSWER,
        shared.request(&out, wp::WORKER_DRAINING, serde_json::json!({})),
    );
    tokio::pin!(asked);
    loop {
        tokio::select! {
            answer = &mut asked => {
                match answer {
                    Ok(Ok(_)) => tracing::info!("the server hands this worker no more turns"),
                    // An older server: turns handed out meanwhile run here too.
                    outcome => tracing::warn!(?outcome, "the server did not take worker.draining"),
                }
                return;
            }
            _ = tokio::time::sleep(DRAIN_LOOK) => {
                if conn.done.is_finished() || shutdown.is_cancelled() {
                    return;
                }
            }
        }
    }
}

/// Serve on `conn` until it ends, or `shutdown`, or the worker drains and its turns have
/// ended; when its replica drains (`worker.reconnect`), open another connection and carry the
/// running turns over to it, then go on with that one.
async fn serve(
    mut conn: Connection,
    config: &WorkerConfig,
    http: &reqwest::Client,
    shared: &Shared,
    stop: &Stop<'_>,
    told: bool,
    previous: &mut Option<String>,
) -> anyhow::Result<()> {
    let shutdown = stop.shutdown;
    // Whether this connection's server was told the worker drains (`told`: its hello said
    // so).
    let mut told = told;
    loop {
        tokio::select! {
            ended = &mut conn.done => {
                shared.connection_ended(&conn.id);
                return ended.unwrap_or_else(|e| Err(anyhow::anyhow!("connection task failed: {e}")));
            }
            _ = shared.draining.cancelled(), if !told => {
                told = true;
                stop.connected.store(false, std::sync::atomic::Ordering::Relaxed);
                tracing::info!(turns = shared.running(), "shutting down: finishing the running turns");
                tell_draining(&conn, shared, shutdown).await;
            }
            _ = tokio::time::sleep(DRAIN_LOOK), if told => {
                if shared.running() == 0 {
                    tracing::info!("shutting down: no turn is running");
                    conn.close.cancel();
                    let _ = (&mut conn.done).await;
                    shared.connection_ended(&conn.id);
                    return Ok(());
                }
            }
            _ = conn.reconnect.notified() => {
                if let Some(next) = move_to_another(&conn, config, http, shared, stop).await {
                    *previous = Some(next.id.to_string());
                    let old = std::mem::replace(&mut conn, next);
                    let shared = shared.clone();
                    tokio::spawn(async move {
                        // The calls the old connection has (a file read through another
                        // replica, say) finish there; new ones come on the new connection.
                        // Its watches end with it. Idle twice, a moment apart: a call's
                        // answer is written after the call leaves the observer's table.
                        let mut idle = 0;
                        while idle < 2 && !old.done.is_finished() {
                            idle = if old.observer.busy() == 0 { idle + 1 } else { 0 };
                            tokio::time::sleep(Duration::from_millis(250)).await;
                        }
                        old.close.cancel();
                        let _ = old.done.await;
                        shared.connection_ended(&old.id);
                    });
                }
            }
            _ = shutdown.cancelled() => {
                conn.close.cancel();
                let _ = (&mut conn.done).await;
                shared.connection_ended(&conn.id);
                return Ok(());
            }
        }
    }
}

/// How soon a worker asked to reconnect tries again when no other replica takes it yet.
const MOVE_RETRY: Duration = Duration::from_millis(250);
/// How long `worker.release` and `worker.carry` may take to be answered.
const MOVE_ANSWER: Duration = Duration::from_secs(15);

/// `from`'s replica drains: connect again (through the load balancer, which reaches a
/// replica that is not draining; the draining one refuses) while `from` lasts, then carry
/// `from`'s running turns over to the new connection. None: `from` ended (or `shutdown`)
/// before another connection was made; its turns end with it.
async fn move_to_another(
    from: &Connection,
    config: &WorkerConfig,
    http: &reqwest::Client,
    shared: &Shared,
    stop: &Stop<'_>,
) -> Option<Connection> {
    tracing::info!(worker.connection = %from.id, "the server drains; moving to another replica");
    let next = loop {
        if from.done.is_finished() || stop.shutdown.is_cancelled() {
            return None;
        }
        match Connection::open(config, http, shared, None, shared.draining.is_cancelled()).await {
            Ok(next) => break next,
            Err(e) => tracing::debug!(error = %e, "no other replica took the connection yet"),
        }
        tokio::time::sleep(MOVE_RETRY).await;
    };
    carry(shared, from, &next).await;
    Some(next)
}

/// Hand the turns running on `from` over to `to`: hold their messages, have `from`'s replica
/// release them once it has handled what they sent before (`worker.release`), have `to`'s
/// take them (`worker.carry`), then let their messages go to `to` — with the requests still
/// waiting on `from` for an answer that comes in its own time (an approval, a child's end, a
/// compaction) asked again there (each is idempotent). A turn released but not taken (it
/// ended or was stopped meanwhile) stops here; one not released stays on `from` and ends
/// with it.
async fn carry(shared: &Shared, from: &Connection, to: &Connection) {
    let owned: Vec<(String, Route)> = shared
        .turns
        .lock()
        .expect("running lock")
        .running
        .iter()
        .filter(|(_, t)| *t.conn == *from.id)
        .map(|(id, t)| (id.clone(), t.route.clone()))
        .collect();
    if owned.is_empty() {
        return;
    }
    let mut held = Vec::new();
    for (id, route) in &owned {
        held.push((id.clone(), route.clone().write_owned().await));
    }
    let ids: Vec<&String> = owned.iter().map(|(id, _)| id).collect();
    let from_out = Out::new(&from.id, from.out.clone());
    let released = tokio::time::timeout(
        MOVE_ANSWER,
        shared.request(&from_out, wp::WORKER_RELEASE, serde_json::json!({"turns": ids})),
    )
    .await;
    let released: Vec<wp::ReleasedTurn> = match released {
        Ok(Ok(r)) => parse::<wp::WorkerReleased>(r).map(|r| r.turns).unwrap_or_default(),
        _ => Vec::new(),
    };
    let to_out = Out::new(&to.id, to.out.clone());
    let carried: Vec<String> = if released.is_empty() {
        Vec::new()
    } else {
        let params = serde_json::to_value(wp::WorkerCarry {
            from: from.id.to_string(),
            turns: released.clone(),
        })
        .unwrap_or_default();
        match tokio::time::timeout(MOVE_ANSWER, shared.request(&to_out, wp::WORKER_CARRY, params)).await {
            Ok(Ok(r)) => parse::<wp::WorkerCarried>(r).map(|r| r.turns).unwrap_or_default(),
            _ => Vec::new(),
        }
    };
    {
        let mut turns = shared.turns.lock().expect("running lock");
        for (id, guard) in &mut held {
            if carried.contains(id) {
                **guard = to_out.clone();
                if let Some(t) = turns.running.get_mut(id.as_str()) {
                    t.conn = to.id.clone();
                }
            } else if released.iter().any(|r| r.turn_id == *id)
                && let Some(t) = turns.running.remove(id.as_str())
            {
                tracing::warn!(turn.id = %id, "turn released but not carried over; stopping it");
                t.cancel.cancel();
            }
        }
    }
    drop(held);
    shared.ask_again(&from.id, &to_out, &carried).await;
    tracing::info!(carried = carried.len(), of = owned.len(), worker.connection = %to.id, "running turns carried over to the new connection");
}

/// This worker process's key for `worker.hello` (`instance`): random, made once, kept in
/// memory only (the process is not dumpable), so a command that reads the token file cannot
/// present it.
fn instance() -> &'static str {
    static INSTANCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    INSTANCE.get_or_init(|| {
        let bytes: [u8; 16] = rand::rng().random();
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    })
}

fn parse<T: serde::de::DeserializeOwned>(answer: Option<Box<RawValue>>) -> Option<T> {
    serde_json::from_str(answer.as_deref().map_or("null", RawValue::get)).ok()
}

/// A request as it goes out, its params borrowed (a step's rows are not copied).
#[derive(serde::Serialize)]
struct OutgoingRequest<'a> {
    jsonrpc: &'static str,
    id: u32,
    method: &'a str,
    params: &'a serde_json::Value,
}

impl<'a> OutgoingRequest<'a> {
    fn new(id: u32, method: &'a str, params: &'a serde_json::Value) -> Self {
        OutgoingRequest {
            jsonrpc: "2.0",
            id,
            method,
            params,
        }
    }
}

/// Where a turn's messages go: the writer of the connection it runs on, switched when the
/// turn is carried over to another connection (senders hold it for reading while they send,
/// so that a switch waits for a message in flight).
type Route = Arc<tokio::sync::RwLock<Out>>;

/// A connection's writer, and the connection's id.
#[derive(Clone)]
pub(crate) struct Out {
    conn: Arc<str>,
    pub(crate) tx: mpsc::Sender<Message>,
}

impl Out {
    fn new(conn: &Arc<str>, tx: mpsc::Sender<Message>) -> Out {
        Out { conn: conn.clone(), tx }
    }
}

/// What outlives a connection: the requests waiting for an answer (ids unique across
/// connections) and the running turns.
#[derive(Clone, Default)]
struct Shared {
    pending: Arc<Mutex<HashMap<u32, Waiting>>>,
    next_id: Arc<std::sync::atomic::AtomicU32>,
    turns: Running,
    /// How turns ended (for parents waiting on sub-agents).
    endings: Arc<delegate::Endings>,
    /// The sessions' background commands (`shell` with `background`).
    jobs: Arc<tools::jobs::Jobs>,
    /// Cancelled when the worker starts shutting down (`run_reporting`'s `drain`): no new
    /// sub-agent is started (its turn would not be handed to this worker any more).
    draining: CancellationToken,
}

/// A request waiting for its answer.
struct Waiting {
    answer: oneshot::Sender<Answer>,
    /// The connection it was sent on.
    conn: Arc<str>,
    /// A turn's request answered in its own time by the server (an approval, a child's end, a
    /// compaction), asked again on the connection its turn is carried to: (turn, method,
    /// params).
    again: Option<(String, String, serde_json::Value)>,
}

/// Turn requests the server answers in their own time, apart from the turn's ordered queue:
/// asked again when their turn is carried to another connection (each is idempotent).
fn asked_again(method: &str) -> bool {
    matches!(method, wp::TURN_INTERACTION | wp::TURN_CHILD_WAIT | wp::TURN_COMPACT)
}

impl Shared {
    /// Send request `method` on `out` and wait for its answer (on whichever connection it
    /// comes).
    async fn request(
        &self,
        out: &Out,
        method: &str,
        params: serde_json::Value,
    ) -> anyhow::Result<Option<Box<RawValue>>> {
        let (tx, rx) = oneshot::channel();
        self.send(out, method, &params, tx, None).await?;
        Ok(rx.await.context("connection closed before the response")??)
    }

    /// Send request `method` on `out` under a new id, its answer to go to `answer`; `again`:
    /// the turn whose request it is, when it is asked again if that turn is carried over
    /// ([`asked_again`]).
    async fn send(
        &self,
        out: &Out,
        method: &str,
        params: &serde_json::Value,
        answer: oneshot::Sender<Answer>,
        again: Option<String>,
    ) -> anyhow::Result<()> {
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let msg = serde_json::to_string(&OutgoingRequest::new(id, method, params))?;
        let again = again.map(|turn| (turn, method.to_string(), params.clone()));
        self.pending.lock().expect("pending lock").insert(
            id,
            Waiting {
                answer,
                conn: out.conn.clone(),
                again,
            },
        );
        out.tx
            .send(Message::Text(msg.into()))
            .await
            .context("connection closed")
    }

    /// An answer came for request `id`.
    fn answered(&self, id: u32, answer: Answer) {
        if let Some(w) = self.pending.lock().expect("pending lock").remove(&id) {
            let _ = w.answer.send(answer);
        }
    }

    /// The requests of the `carried` turns still waiting on connection `from`, asked again
    /// on `to` (under new ids; a late answer on `from` finds nobody waiting).
    async fn ask_again(&self, from: &str, to: &Out, carried: &[String]) {
        let moved: Vec<Waiting> = {
            let mut pending = self.pending.lock().expect("pending lock");
            let ids: Vec<u32> = pending
                .iter()
                .filter(|(_, w)| *w.conn == *from && w.again.as_ref().is_some_and(|(t, ..)| carried.contains(t)))
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| pending.remove(id)).collect()
        };
        for w in moved {
            let Some((turn, method, params)) = w.again else {
                continue;
            };
            let _ = self.send(to, &method, &params, w.answer, Some(turn)).await;
        }
    }

    /// How many turns run here.
    fn running(&self) -> usize {
        self.turns.lock().expect("running lock").running.len()
    }

    /// Connection `conn` ended: the turns still running on it stop (its replica interrupts
    /// them), and requests still waiting for an answer on it fail.
    fn connection_ended(&self, conn: &str) {
        let stopped: Vec<CancellationToken> = {
            let mut turns = self.turns.lock().expect("running lock");
            let ids: Vec<String> = turns
                .running
                .iter()
                .filter(|(_, t)| *t.conn == *conn)
                .map(|(id, _)| id.clone())
                .collect();
            ids.iter()
                .filter_map(|id| turns.running.remove(id))
                .map(|t| t.cancel)
                .collect()
        };
        for cancel in stopped {
            cancel.cancel();
        }
        self.pending
            .lock()
            .expect("pending lock")
            .retain(|_, w| *w.conn != *conn);
    }
}

/// One connection to the API tier, registered (`worker.hello` answered), its messages read
/// and written by a task of its own.
struct Connection {
    id: Arc<str>,
    out: mpsc::Sender<Message>,
    /// The server asked the worker to move to another replica (`worker.reconnect`).
    reconnect: Arc<tokio::sync::Notify>,
    /// Cancel to close the connection.
    close: CancellationToken,
    /// The connection's task: ends with the connection.
    done: tokio::task::JoinHandle<anyhow::Result<()>>,
    /// The connection's workspace calls.
    observer: observe::Observer,
}

/// The connection's outbound side, for a turn or an observation call.
#[derive(Clone)]
pub(crate) struct Link {
    /// The connection's writer (observation calls are answered on the connection they came
    /// on).
    pub(crate) out: Out,
    /// Where the turn's messages go ([`Route`]).
    route: Route,
    shared: Shared,
    pub(crate) http: reqwest::Client,
    pub(crate) proxy_url: String,
    pub(crate) token: String,
    /// How turns ended (for parents waiting on sub-agents).
    pub(crate) endings: Arc<delegate::Endings>,
    /// The server stores a turn's last step with its end (`turn.end` carries it).
    pub(crate) end_carries_step: bool,
    /// The server takes `files.read` chunks as binary frames.
    pub(crate) binary_chunks: bool,
    /// The server takes runs of `files.read` chunks as one binary frame.
    pub(crate) chunk_runs: bool,
}

impl Link {
    /// This link with a route of its own (a turn's, which a carry switches alone).
    fn for_turn(&self) -> Link {
        Link {
            route: Arc::new(tokio::sync::RwLock::new(self.out.clone())),
            ..self.clone()
        }
    }

    pub(crate) async fn notify(&self, method: &str, params: serde_json::Value) -> anyhow::Result<()> {
        let msg = serde_json::to_string(&Request::notification(method, params))?;
        let route = self.route.read().await;
        route
            .tx
            .send(Message::Text(msg.into()))
            .await
            .context("connection closed")
    }

    /// Whether the worker is shutting down (see [`run_reporting`]).
    pub(crate) fn draining(&self) -> bool {
        self.shared.draining.is_cancelled()
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
        let again = asked_again(method)
            .then(|| params.get("turnId").and_then(|t| t.as_str()).map(str::to_string))
            .flatten();
        let (tx, rx) = oneshot::channel();
        // Sent while the route is held for reading (not while its answer is awaited): a carry,
        // which takes it for writing, finds the request sent on the old connection, or not
        // sent yet.
        {
            let route = self.route.read().await;
            self.shared.send(&route, method, &params, tx, again).await?;
        }
        Ok(rx.await.context("connection closed before the response")??)
    }
}

impl Connection {
    /// Connect, say `worker.hello` (`replaces`: the connection given up before), and start
    /// the connection's task.
    async fn open(
        config: &WorkerConfig,
        http: &reqwest::Client,
        shared: &Shared,
        replaces: Option<String>,
        draining: bool,
    ) -> anyhow::Result<Connection> {
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
            replaces,
            instance: Some(instance().to_string()),
            draining,
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
        let id: Arc<str> = Arc::from(registered.connection_id.clone().unwrap_or_default().as_str());
        tracing::info!(workspaces = registered.workspaces.len(), worker.connection = %id, "worker connected");
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
        let (out_tx, out_rx) = mpsc::channel::<Message>(256);
        let out = Out::new(&id, out_tx.clone());
        let link = Link {
            out: out.clone(),
            route: Arc::new(tokio::sync::RwLock::new(out)),
            shared: shared.clone(),
            http: http.clone(),
            proxy_url: format!("{http_base}{}", wp::MODEL_PROXY_PATH),
            token: config.token.clone(),
            endings: shared.endings.clone(),
            end_carries_step: registered.end_carries_step,
            binary_chunks: registered.binary_chunks,
            chunk_runs: registered.chunk_runs,
        };
        let roots = registered
            .workspaces
            .iter()
            .filter_map(|r| {
                let (_, path) = config.workspaces.iter().find(|(name, _)| *name == r.name)?;
                Some((r.workspace_id.clone(), path.clone()))
            })
            .collect();
        let calls = CancellationToken::new();
        let observer = observe::Observer::new(link.clone(), roots, calls.clone());
        let reconnect = Arc::new(tokio::sync::Notify::new());
        let close = CancellationToken::new();
        let drive = Drive {
            link,
            ctx,
            observer,
            reconnect: reconnect.clone(),
            id: id.clone(),
        };
        let observer = drive.observer.clone();
        let done = tokio::spawn(drive.run(sink, stream, out_rx, close.clone(), calls));
        Ok(Connection {
            id,
            out: out_tx,
            reconnect,
            close,
            done,
            observer,
        })
    }
}

type Sink = futures_util::stream::SplitSink<
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    Message,
>;
type Stream = futures_util::stream::SplitStream<
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
>;

/// A connection's task: what it reads goes to the turns, the observer and the waiting
/// requests; what they send it writes.
struct Drive {
    link: Link,
    ctx: TurnContext,
    observer: observe::Observer,
    reconnect: Arc<tokio::sync::Notify>,
    id: Arc<str>,
}

impl Drive {
    async fn run(
        self,
        mut sink: Sink,
        mut stream: Stream,
        mut out_rx: mpsc::Receiver<Message>,
        close: CancellationToken,
        calls: CancellationToken,
    ) -> anyhow::Result<()> {
        let result = loop {
            tokio::select! {
                msg = stream.next() => {
                    let msg = match msg {
                        Some(Ok(m)) => m,
                        Some(Err(e)) => break Err(e.into()),
                        None => break Err(anyhow::anyhow!("server closed the connection")),
                    };
                    if let Message::Text(text) = msg {
                        self.on_message(&text);
                    }
                }
                out = out_rx.recv() => if let Some(m) = out
                    && let Err(e) = berth_protocol::batch::write_batch(&mut sink, m, || out_rx.try_recv().ok(), Message::is_close).await
                {
                    break Err(e.into())
                },
                _ = close.cancelled() => {
                    // What was queued for the server goes out before the close.
                    while let Ok(m) = out_rx.try_recv() {
                        if sink.feed(m).await.is_err() {
                            break;
                        }
                    }
                    let _ = sink.send(Message::Close(None)).await;
                    break Ok(());
                }
            }
        };
        // Observation calls end with their connection.
        calls.cancel();
        result
    }

    fn on_message(&self, text: &str) {
        let Ok(msg) = serde_json::from_str::<Incoming>(text) else {
            return;
        };
        let (link, ctx, shared) = (&self.link, &self.ctx, &self.link.shared);
        if let Some(method) = msg.method {
            let params = msg.params.map_or("null", RawValue::get);
            match method.as_ref() {
                // `call`, `call.ack`, `call.cancel`: the observer reads them itself.
                m if m.starts_with("call") => {
                    self.observer.handle(text);
                }
                wp::WORKER_RECONNECT => self.reconnect.notify_one(),
                wp::TURN_RUN => match serde_json::from_str::<TurnRun>(params) {
                    Ok(run) => {
                        let cancel = CancellationToken::new();
                        let link = link.for_turn();
                        let started = shared.turns.lock().expect("running lock").start(
                            &run.turn_id,
                            RunningTurn {
                                cancel: cancel.clone(),
                                route: link.route.clone(),
                                conn: self.id.clone(),
                            },
                        );
                        match started {
                            Started::Now => {}
                            Started::Stopped => {
                                tracing::info!(turn.id = %run.turn_id, "turn stopped by the server before it ran");
                                turn::record_settled(&link, &run.turn_id);
                                return;
                            }
                            Started::Already => {
                                // It runs here already (carried over from another
                                // connection, say): a second run would do its work twice.
                                tracing::warn!(turn.id = %run.turn_id, "turn.run for a turn already running here; ignored");
                                return;
                            }
                        }
                        let tools = match ctx.workspaces.get(&run.workspace_id) {
                            _ if run.no_tools => None,
                            Some(ws) => Some(Tools::new(
                                ws.clone(),
                                ctx.tools.clone(),
                                ctx.mcp.clone(),
                                shared.jobs.clone(),
                                &run.session_id,
                            )),
                            None => {
                                // Registered but not openable (removed since start): the model is
                                // offered no tools rather than tools that cannot work.
                                tracing::error!(turn.id = %run.turn_id, "the turn's workspace is not open on this worker");
                                None
                            }
                        };
                        let agent = ctx.agent.clone();
                        let running = shared.turns.clone();
                        tokio::spawn(async move {
                            let turn_id = run.turn_id.clone();
                            let jobs = tools.clone();
                            turn::run(link, run, tools, agent, cancel.clone()).await;
                            // A stopped turn stops its session's background commands too.
                            if cancel.is_cancelled()
                                && let Some(tools) = jobs
                            {
                                tools.stop_jobs();
                            }
                            running.lock().expect("running lock").finish(&turn_id);
                        });
                    }
                    Err(e) => tracing::warn!(error = %e, "malformed turn.run"),
                },
                wp::TURN_STOP => {
                    if let Ok(stop) = serde_json::from_str::<TurnStop>(params)
                        && let Some(t) = shared.turns.lock().expect("running lock").stop(&stop.turn_id)
                    {
                        tracing::info!(turn.id = %stop.turn_id, "turn stopped by the server");
                        t.cancel.cancel();
                    }
                }
                _ => {}
            }
        } else if let Some(id) = msg.id {
            let answer = match msg.error {
                Some(e) => Err(e),
                None => Ok(msg.result.map(RawValue::to_owned)),
            };
            shared.answered(id, answer);
        }
    }
}

/// The worker's turns ([`Turns`]).
type Running = Arc<Mutex<Turns>>;

/// A running turn: its cancellation, its route and the connection it runs on.
struct RunningTurn {
    cancel: CancellationToken,
    route: Route,
    conn: Arc<str>,
}

/// The worker's running turns (by turn id), and the turns the
/// server stopped that were not running here: a `turn.stop` can overtake its turn's
/// `turn.run` (a stop that reaches the server's connection while the hand-out is in
/// flight), and such a turn must not run.
#[derive(Default)]
struct Turns {
    running: HashMap<String, RunningTurn>,
    stopped: wp::EarlyStops,
}

impl Turns {
    /// Register a turn about to run, unless it was stopped before its `turn.run` came or it
    /// runs here already.
    fn start(&mut self, turn_id: &str, turn: RunningTurn) -> Started {
        if self.running.contains_key(turn_id) {
            return Started::Already;
        }
        if self.stopped.take(turn_id) {
            return Started::Stopped;
        }
        self.running.insert(turn_id.to_string(), turn);
        Started::Now
    }

    /// The server stopped `turn_id`: its token if it runs here, else the stop is kept for
    /// [`Turns::start`].
    fn stop(&mut self, turn_id: &str) -> Option<RunningTurn> {
        let turn = self.running.remove(turn_id);
        if turn.is_none() {
            self.stopped.remember(turn_id);
        }
        turn
    }

    /// The turn's task is done.
    fn finish(&mut self, turn_id: &str) {
        self.running.remove(turn_id);
    }
}

/// What [`Turns::start`] did with a `turn.run`.
#[derive(Debug, PartialEq)]
enum Started {
    /// Registered: the turn runs now.
    Now,
    /// Stopped by the server before its `turn.run` came: it does not run.
    Stopped,
    /// It runs here already: the `turn.run` is a duplicate and does not start it again.
    Already,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn running(cancel: CancellationToken) -> RunningTurn {
        let (tx, _) = mpsc::channel(1);
        RunningTurn {
            cancel,
            route: Arc::new(tokio::sync::RwLock::new(Out::new(&Arc::from("c"), tx))),
            conn: Arc::from("c"),
        }
    }

    #[test]
    fn a_turn_stopped_before_its_run_came_does_not_run() {
        let mut turns = Turns::default();
        // A stop that overtook its turn's `turn.run`.
        assert!(turns.stop("t1").is_none());
        assert_eq!(
            turns.start("t1", running(CancellationToken::new())),
            Started::Stopped,
            "a stopped turn started"
        );
        // Kept once: the same id again (never sent by the server) would run.
        assert_eq!(turns.start("t1", running(CancellationToken::new())), Started::Now);
        // A running turn is stopped through its token.
        let cancel = CancellationToken::new();
        assert_eq!(turns.start("t2", running(cancel.clone())), Started::Now);
        turns.stop("t2").expect("running turn's token").cancel.cancel();
        assert!(cancel.is_cancelled());
        // A stop after its turn ended is kept, but within a bound.
        turns.finish("t1");
        for i in 0..wp::EARLY_STOPS_KEPT + 10 {
            turns.stop(&format!("late-{i}"));
        }
        assert_eq!(turns.stopped.len(), wp::EARLY_STOPS_KEPT);
        assert!(turns.running.is_empty());
        assert_eq!(
            turns.start(
                &format!("late-{}", wp::EARLY_STOPS_KEPT + 9),
                running(CancellationToken::new())
            ),
            Started::Stopped
        );
        assert_eq!(
            turns.start("late-0", running(CancellationToken::new())),
            Started::Now,
            "the oldest stop is forgotten first"
        );
    }

    #[test]
    fn a_second_run_of_a_running_turn_does_not_start_it_again() {
        // A `turn.run` sent again for a turn carried over from another connection.
        let mut turns = Turns::default();
        let first = CancellationToken::new();
        assert_eq!(turns.start("t1", running(first.clone())), Started::Now);
        assert_eq!(turns.start("t1", running(CancellationToken::new())), Started::Already);
        // The first run keeps its registration: a stop reaches it.
        turns.stop("t1").expect("the first run").cancel.cancel();
        assert!(first.is_cancelled());
    }
}
