//! Benchmark: every path a turn takes, each against a baseline measured in the same run.
//!
//! `cargo build --release -p berth && cargo bench -p berth-e2e --bench latency`
//! (runs `target/release/berth` as child processes, like the tests do; about a minute).
//! Prints one Markdown table (`docs/performance.md` explains the method and the figures);
//! asserts nothing about time. `BERTH_BENCH_TURNS` sets the number of turns (default 60).
//!
//! The setup is `berth dev` (API tier and worker in one process, its own PostgreSQL cluster
//! with durable commits), a second replica (`berth serve`) on the same database, and the
//! scripted provider in this process.

use std::time::{Duration, Instant};

use berth_e2e::{
    Client, MockProvider, Part, Reply, TestServer,
    harness::{berth_bin, db, fresh_database, log_events, scratch_dir, spawn_listening, wall_us},
    mock_provider::epoch,
    procstat::{cpu_ticks, stat_fields, stat_ticks, ticks_time, tree_ticks},
};
use berth_store::cluster::{ClusterOptions, PrivateCluster};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::process::Command;
use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest, http::HeaderValue};

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Limits raised so that the bench measures speed, not admission control.
const ENV: &[(&str, &str)] = &[
    ("RUST_LOG", "info"),
    ("BERTH_RATE_PER_SEC", "1000000"),
    ("BERTH_RATE_BURST", "1000000"),
    ("BERTH_MAX_CONNECTIONS_PER_CREDENTIAL", "100000"),
    ("BERTH_MAX_SUBSCRIPTIONS", "100000"),
    ("BERTH_MODEL_MAX_CONCURRENT", "100000"),
    ("BERTH_MODEL_RATE_PER_MIN", "100000000"),
];

/// Chunks of the scripted reply, and the pause before each (the six chunks 5 ms apart).
const CHUNKS: usize = 6;
const CHUNK_GAP_MS: u64 = 5;

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    if std::env::var_os("BERTH_BENCH_ECHO").is_some() {
        return echo_server().await;
    }
    if let Ok(upstream) = std::env::var("BERTH_BENCH_RELAY") {
        return relay_server(upstream).await;
    }
    let turns: usize = std::env::var("BERTH_BENCH_TURNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(60);
    let started = Instant::now();
    let mock = MockProvider::start().await;
    let mut table = Table::default();
    let only = std::env::var("BERTH_BENCH_ONLY").unwrap_or_default();
    // `BERTH_BENCH_ONLY=concurrency`: only the concurrency and observation rows.
    // `BERTH_BENCH_ONLY=workspace`: only the `git.status` and `files.read` rows.
    if only == "workspace" {
        workspace_rows(&mut table, &mock).await;
        println!();
        table.print();
        return;
    }
    if only == "concurrency" {
        concurrency(&mut table).await;
        println!();
        table.print();
        return;
    }
    // `BERTH_BENCH_ONLY=trace`: every statement one turn sends to PostgreSQL, timed.
    if only == "trace" {
        return trace_turn(&mock).await;
    }

    // `BERTH_BENCH_ONLY=turns,history,…`: only these sections (turns, append, fanout, history,
    // websocket, sessions, concurrency); all of them by default.
    let want = |section: &str| only.is_empty() || only.split(',').any(|o| o == section);

    if want("turns") {
        host_floor(&mut table).await;
    }

    // 1. `berth dev` exactly as a user runs it: its own cluster, every commit on disk.
    let mut scratch = None;
    if want("turns") || want("append") {
        let durable = "berth dev, durable commits";
        let (dev, database_url) = start_dev(&mock, None).await;
        let token = dev.admin_token();
        let workspace_id = wait_online(&dev, &token).await;
        let commit = commit_cost(&database_url).await;
        table.add(
            &format!("{durable}: one commit (median of 50 one-row INSERTs)"),
            "—".into(),
            format!("{commit:.2} ms"),
            "—".into(),
            "— (the disk's floor)",
            None,
        );
        if want("turns") {
            turn_overhead(&mut table, durable, &dev, &token, &workspace_id, &mock, turns).await;
        }
        if want("append") {
            append_path(&mut table, durable, &dev, &token, &database_url).await;
        }
        scratch = dev.data_dir.parent().map(std::path::Path::to_path_buf);
        stop(dev).await;
    }

    // 2. The same on the test cluster (no fsync), where what is left is Berth's own cost;
    //    with a second replica for fan-out.
    if ["turns", "append", "fanout", "history", "websocket", "sessions"]
        .iter()
        .any(|s| want(s))
    {
        let fast = "no fsync (test cluster)";
        let database_url = fresh_database().await;
        let (dev, _) = start_dev(&mock, Some(&database_url)).await;
        let replica = TestServer::start_with(&database_url, &mock.base_url(), ENV)
            .await
            .expect("second replica");
        let token = dev.admin_token();
        let workspace_id = wait_online(&dev, &token).await;
        if want("turns") {
            turn_overhead(&mut table, fast, &dev, &token, &workspace_id, &mock, turns).await;
        }
        if want("append") {
            append_path(&mut table, fast, &dev, &token, &database_url).await;
        }
        if want("fanout") {
            fan_out(&mut table, &dev, &replica, &token, &workspace_id, &database_url).await;
        }
        if want("history") {
            history_page(&mut table, &dev, &token, &workspace_id, &database_url).await;
        }
        if want("websocket") {
            websocket(&mut table, &replica, &token).await;
        }
        if want("sessions") {
            idle_sessions(&mut table, &replica, &token, &workspace_id).await;
        }
        stop(dev).await;
        stop(replica).await;
    }

    // 3. Many turns at once, and the worker's observations (two replicas, two workers).
    if want("concurrency") && std::env::var_os("BERTH_BENCH_SKIP_CONCURRENCY").is_none() {
        concurrency(&mut table).await;
    }

    println!();
    table.print();
    println!("\n(bench ran {:.0} s)", started.elapsed().as_secs_f64());
    // The dev cluster's data; the test cluster cleans up after itself on the next run.
    if let Some(dir) = scratch {
        let _ = std::fs::remove_dir_all(dir);
    }
}

async fn stop(mut server: TestServer) {
    server.terminate().await;
}

// ---------------------------------------------------------------------------------------
// Setup

/// `berth dev`: the API tier with its worker in one process, serving a scratch directory
/// as its workspace. With no `database_url` it starts its own private PostgreSQL cluster
/// (durable commits), as a new user runs it. Returns the server and its database.
async fn start_dev(mock: &MockProvider, database_url: Option<&str>) -> (TestServer, String) {
    let data_dir = scratch_dir("dev");
    let workspace = scratch_dir("proj");
    let log = data_dir.join("dev.log");
    let mut cmd = Command::new(berth_bin());
    cmd.arg("dev")
        .current_dir(&workspace)
        .env("BERTH_DATA_DIR", &data_dir)
        .env("BERTH_LISTEN", "127.0.0.1:0")
        .env("BERTH_METRICS_LISTEN", "127.0.0.1:0")
        .env("BERTH_MODEL_BASE_URL", mock.base_url())
        .env("BERTH_MODEL", "mock-model")
        .env("BERTH_MODEL_API_KEY", "sk-bench")
        // A session's automatic title is a model request of its own after its first turn:
        // it would take the next turn's scripted reply (the tests' harness turns them off too).
        .env("BERTH_AUTO_TITLES", "false");
    match database_url {
        Some(url) => cmd.env("DATABASE_URL", url),
        None => cmd.env_remove("DATABASE_URL"),
    };
    for (k, v) in ENV {
        cmd.env(k, v);
    }
    // The worker's TRACE event for each chunk of model output, with the wall-clock time it
    // arrived (JSON lines, in the log): the worker → watcher figure of a live delta. The API
    // tier's events of each delta (the slowest deltas step by step) only with
    // `BERTH_BENCH_DELTA_STEPS=1`: they are written on the delta's path, which they slow.
    let relay = if std::env::var_os("BERTH_BENCH_DELTA_STEPS").is_some() {
        format!(",{RELAY_TARGET}=trace")
    } else {
        String::new()
    };
    cmd.env("RUST_LOG", format!("info,{WORKER_RECEIPT_TARGET}=trace{relay}"))
        .env("BERTH_LOG_FORMAT", "json");
    let (child, addr, metrics_addr) = spawn_listening(cmd, &log).await.expect("berth dev");
    let database_url = match database_url {
        Some(url) => url.to_string(),
        // Attach to the cluster `berth dev` started (this handle leaves it running).
        None => PrivateCluster::start(&data_dir, &ClusterOptions::default())
            .expect("attach to the dev cluster")
            .url("berth"),
    };
    let server = TestServer {
        child,
        addr,
        metrics_addr,
        data_dir,
        database_url: database_url.clone(),
        log,
    };
    (server, database_url)
}

/// One durable commit: a one-row INSERT in autocommit (median of 50).
async fn commit_cost(database_url: &str) -> f64 {
    let db = db(database_url).await;
    db.batch_execute("CREATE TABLE bench_commit (n int)")
        .await
        .expect("table");
    let insert = db
        .prepare("INSERT INTO bench_commit VALUES ($1)")
        .await
        .expect("prepare");
    let mut took = Vec::new();
    for i in 0..50i32 {
        let t0 = Instant::now();
        db.execute(&insert, &[&i]).await.expect("insert");
        took.push(ms(t0.elapsed()));
    }
    median(&mut took)
}

async fn wait_online(server: &TestServer, token: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let mut c = Client::authed(&server.ws_url(), token).await.expect("client");
        let list = c.ok("workspace.list", json!({})).await;
        if let Some(w) = list.as_array().and_then(|l| l.iter().find(|w| w["online"] == true)) {
            return w["workspaceId"].as_str().expect("id").to_string();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("berth dev's workspace never came online");
}

async fn session(client: &mut Client, workspace_id: &str) -> String {
    let s = client.ok("session.create", json!({"workspaceId": workspace_id})).await;
    s["sessionId"].as_str().expect("sessionId").to_string()
}

/// A raw WebSocket (Nagle off), optionally with a bearer token.
async fn ws_connect(url: &str, bearer: Option<&str>) -> Ws {
    let mut req = url.into_client_request().expect("request");
    if let Some(t) = bearer {
        req.headers_mut().insert(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {t}")).expect("header"),
        );
    }
    tokio_tungstenite::connect_async_with_config(req, None, true)
        .await
        .expect("websocket connect")
        .0
}

/// The next text frame, as received (control frames are answered by tungstenite as it reads).
async fn next_text(ws: &mut Ws) -> tokio_tungstenite::tungstenite::Utf8Bytes {
    loop {
        match ws.next().await.expect("open").expect("frame") {
            Message::Text(t) => return t,
            Message::Close(c) => panic!("closed: {c:?}"),
            _ => {}
        }
    }
}

fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace()
        .nth(1)
        .expect("kB")
        .parse::<u64>()
        .expect("number")
        * 1024
}

// ---------------------------------------------------------------------------------------
// Statistics and the table

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The `p`-quantile (0..=1) of `v` (sorted in place), nearest rank.
fn quantile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

fn median(v: &mut [f64]) -> f64 {
    quantile(v, 0.5)
}

/// What this machine lets any process promise, measured before Berth starts: how late a
/// thread sleeping 1 ms is woken, and how long a thread that never sleeps is kept off the
/// CPU (by the host under this virtual machine, or by anything else running). A bound such
/// as "each live delta within 2 ms" is out of reach of any program when these exceed it.
async fn host_floor(table: &mut Table) {
    let (mut late, gaps) = tokio::task::spawn_blocking(|| {
        let mut late = Vec::new();
        for _ in 0..2000 {
            let t = Instant::now();
            std::thread::sleep(Duration::from_millis(1));
            late.push(ms(t.elapsed()) - 1.0);
        }
        let (end, mut last, mut gaps) = (Instant::now() + Duration::from_secs(3), Instant::now(), Vec::new());
        while last < end {
            let now = Instant::now();
            let gap = ms(now - last);
            if gap > 0.1 {
                gaps.push(gap);
            }
            last = now;
        }
        (late, gaps)
    })
    .await
    .expect("host probe");
    table.add(
        "host: a thread sleeping 1 ms, woken late by (p50 / p99 / max of 2000; over 2 ms)",
        "—".into(),
        format!("{}; {}", spread(&mut late), over(&late, 2.0)),
        "—".into(),
        "— (the machine's floor)",
        None,
    );
    table.add(
        "host: a thread that never sleeps, longest time off the CPU in 3 s (times over 2 ms)",
        "—".into(),
        format!(
            "{:.2} ms ({})",
            gaps.iter().copied().fold(0.0, f64::max),
            over(&gaps, 2.0)
        ),
        "—".into(),
        "— (the machine's floor)",
        None,
    );
}

/// `v`'s p50 / p99 / max (sorted in place), in ms.
fn spread(v: &mut [f64]) -> String {
    format!(
        "{:.2} / {:.2} / {:.2} ms",
        median(v),
        quantile(v, 0.99),
        quantile(v, 1.0)
    )
}

/// How many of `v` exceed `limit`.
fn over(v: &[f64], limit: f64) -> usize {
    v.iter().filter(|&&x| x > limit).count()
}

struct Line {
    figure: String,
    berth: String,
    baseline: String,
    ratio: String,
    goal: String,
    met: Option<bool>,
}

#[derive(Default)]
struct Table(Vec<Line>);

impl Table {
    fn add(&mut self, figure: &str, berth: String, baseline: String, ratio: String, goal: &str, met: Option<bool>) {
        let line = Line {
            figure: figure.into(),
            berth,
            baseline,
            ratio,
            goal: goal.into(),
            met,
        };
        println!(
            "{}: berth {} | baseline {} | {} | goal {}",
            line.figure, line.berth, line.baseline, line.ratio, line.goal
        );
        self.0.push(line);
    }

    fn print(&self) {
        println!("| figure | Berth | baseline (same run) | ratio / difference | goal | met |");
        println!("|---|---|---|---|---|---|");
        for l in &self.0 {
            let met = match l.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "—",
            };
            println!(
                "| {} | {} | {} | {} | {} | {} |",
                l.figure, l.berth, l.baseline, l.ratio, l.goal, met
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// 1. Per-turn overhead and live delta latency

fn script() -> Reply {
    let mut parts = Vec::new();
    for _ in 0..CHUNKS {
        parts.push(Part::Delay(CHUNK_GAP_MS));
        parts.push(Part::Stamp);
    }
    parts.push(Part::Usage {
        prompt: 10,
        completion: 5,
    });
    Reply::Stream(parts)
}

/// The `<µs>` stamps in a text, each the instant (since [`epoch`]) the provider sent it.
fn stamps(text: &str) -> Vec<u64> {
    text.split('<')
        .filter_map(|s| s.split_once('>').and_then(|(n, _)| n.parse().ok()))
        .collect()
}

/// The worker's log target whose TRACE events say when each chunk of model output arrived.
const WORKER_RECEIPT_TARGET: &str = "berth_worker::model";
/// The API tier's log target whose TRACE events say when a delta reached it, and when it
/// was handed to the local watchers.
const RELAY_TARGET: &str = "berth_api::workers";

/// A stamped chunk at the watcher: its stamp, the wall-clock time (µs since the Unix epoch)
/// it arrived, and the wall-clock time of [`epoch`] read at the same moment (so that a
/// stamp maps to wall-clock time without drift between the two clocks over the run).
#[derive(Clone, Copy)]
struct Arrival {
    stamp: u64,
    wall: u64,
    epoch_wall: u64,
}

/// The stamps of `text` read off the watcher's socket at wall-clock `read`, `now` and
/// `wall` being the instant and the wall-clock time read together later.
fn arrivals(text: &str, read: u64, now: Instant, wall: u64) -> Vec<Arrival> {
    let epoch_wall = wall.saturating_sub(now.duration_since(epoch()).as_micros() as u64);
    stamps(text)
        .into_iter()
        .map(|stamp| Arrival {
            stamp,
            wall: read,
            epoch_wall,
        })
        .collect()
}

/// A subscription's items, each with the wall-clock time a runtime thread took it from the
/// client's reader task (the task that reads the socket hands it over at once). The
/// bench's own task, which reads the clock for the other figures, runs on the main thread
/// and may wake later: up to 2.5 ms later in the runs of 2026-12-01 13:48.
type Timed = tokio::sync::mpsc::UnboundedReceiver<(Value, u64)>;

fn timed(mut items: tokio::sync::mpsc::UnboundedReceiver<Value>) -> Timed {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(item) = items.recv().await {
            if tx.send((item, wall_us())).is_err() {
                return;
            }
        }
    });
    rx
}

/// The worker's receipt of each stamped chunk (stamp → wall-clock µs), from the JSON lines
/// of `berth dev`'s log.
fn worker_receipts(log: &std::path::Path) -> std::collections::HashMap<u64, u64> {
    let mut receipts = std::collections::HashMap::new();
    for v in log_events(log, WORKER_RECEIPT_TARGET) {
        let (Some(at), Some(text)) = (v["fields"]["received_us"].as_u64(), v["fields"]["text"].as_str()) else {
            continue;
        };
        for stamp in stamps(text) {
            receipts.insert(stamp, at);
        }
    }
    receipts
}

/// The API tier's steps of each stamped delta (stamp → (step, wall-clock µs)), from the
/// JSON lines of `berth dev`'s log.
fn relay_steps(log: &std::path::Path) -> std::collections::HashMap<u64, Vec<(String, u64)>> {
    let mut steps: std::collections::HashMap<u64, Vec<(String, u64)>> = std::collections::HashMap::new();
    for v in log_events(log, RELAY_TARGET) {
        let f = &v["fields"];
        let (Some(what), Some(at), Some(text)) = (f["message"].as_str(), f["at_us"].as_u64(), f["text"].as_str())
        else {
            continue;
        };
        for stamp in stamps(text) {
            steps.entry(stamp).or_default().push((what.to_string(), at));
        }
    }
    steps
}

/// How long after its stamp each chunk reached us (ms).
fn stamp_lags(text: &str, now: Instant) -> Vec<f64> {
    let now_us = now.duration_since(epoch()).as_micros() as u64;
    stamps(text)
        .into_iter()
        .map(|s| now_us.saturating_sub(s) as f64 / 1e3)
        .collect()
}

/// The provider alone: one streamed completion read from `base_url` (the provider's, or a
/// relay chain's in front of it), its wall time and each chunk's delay from provider to
/// reader.
async fn raw_provider(http: &reqwest::Client, mock: &MockProvider, base_url: &str) -> (Duration, Vec<f64>) {
    mock.push(script());
    let t0 = Instant::now();
    let resp = http
        .post(format!("{base_url}/chat/completions"))
        .json(&json!({"model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "stream": true}))
        .send()
        .await
        .expect("provider");
    let mut body = resp.bytes_stream();
    let mut lags = Vec::new();
    let mut seen = String::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.expect("chunk");
        let now = Instant::now();
        let text = String::from_utf8_lossy(&chunk);
        lags.extend(stamp_lags(&text, now));
        seen.push_str(&text);
        if seen.contains("[DONE]") {
            break;
        }
    }
    (t0.elapsed(), lags)
}

#[derive(Default)]
struct TurnTimes {
    total: f64,
    answered: f64,
    started: f64,
    first_delta: f64,
    /// From the last delta to `turn.ended`.
    settle: f64,
    lags: Vec<f64>,
    arrivals: Vec<Arrival>,
}

/// One turn through Berth: `session.send` on `sender`, observed by `watch` up to `turn.ended`.
async fn berth_turn(sender: &mut Client, watch: &mut Timed, mock: &MockProvider, session_id: &str) -> TurnTimes {
    mock.push(script());
    while watch.try_recv().is_ok() {}
    let t0 = Instant::now();
    let send = async {
        let r = sender
            .call("session.send", json!({"sessionId": session_id, "prompt": "hi"}))
            .await;
        r.expect("session.send");
        ms(t0.elapsed())
    };
    let observe = async {
        let mut t = TurnTimes::default();
        let mut last_delta = 0.0;
        loop {
            let (item, read) = tokio::time::timeout(Duration::from_secs(30), watch.recv())
                .await
                .expect("turn within 30 s")
                .expect("subscription open");
            let now = Instant::now();
            let wall = wall_us();
            let at = ms(now - t0);
            match item["type"].as_str() {
                Some("turn.started") => t.started = at,
                Some("model.delta") => {
                    if t.first_delta == 0.0 {
                        t.first_delta = at;
                    }
                    last_delta = at;
                    let text = item["text"].as_str().unwrap_or("");
                    t.lags.extend(stamp_lags(text, now));
                    t.arrivals.extend(arrivals(text, read, now, wall));
                }
                Some("turn.ended") => {
                    assert_eq!(item["state"], "completed", "turn failed: {item}");
                    t.total = at;
                    t.settle = at - last_delta;
                    return t;
                }
                _ => {}
            }
        }
    };
    let (answered, mut t) = tokio::join!(send, observe);
    t.answered = answered;
    t
}

/// `BERTH_BENCH_ONLY=trace`: `berth dev` on the test cluster, a few warm-up turns, then one
/// turn with every statement logged (`log_min_duration_statement = 0`). Prints each
/// statement PostgreSQL finished between `session.send` and `turn.ended` at the watcher
/// (ms after the send; backend; duration), and the counts: what a turn's critical path
/// costs in round trips.
async fn trace_turn(mock: &MockProvider) {
    let database_url = fresh_database().await;
    let (dev, _) = start_dev(mock, Some(&database_url)).await;
    let token = dev.admin_token();
    let workspace_id = wait_online(&dev, &token).await;
    let mut sender = Client::authed(&dev.ws_url(), &token).await.expect("client");
    let mut watcher = Client::authed(&dev.ws_url(), &token).await.expect("client");
    let sid = session(&mut sender, &workspace_id).await;
    let mut items = timed(
        watcher
            .subscribe("session.watch", json!({"sessionId": sid, "after": 0}))
            .items,
    );
    // `BERTH_BENCH_TRACE_WARM=N`: N turns before the traced one (3 by default; 63 traces
    // the last turn of the one-session row).
    let warm = std::env::var("BERTH_BENCH_TRACE_WARM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    for _ in 0..warm {
        berth_turn(&mut sender, &mut items, mock, &sid).await;
    }
    let admin = db(&database_url).await;
    let data: String = admin
        .query_one("SELECT current_setting('data_directory')", &[])
        .await
        .expect("data directory")
        .get(0);
    let log = std::path::Path::new(&data).join("../run/postgres.log");
    // One statement per call: ALTER SYSTEM cannot run in the implicit transaction of a batch.
    for sql in [
        "ALTER SYSTEM SET log_min_duration_statement = 0",
        "ALTER SYSTEM SET log_line_prefix = '%n [%p] '",
        "SELECT pg_reload_conf()",
    ] {
        admin.batch_execute(sql).await.expect("log statements");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let from = std::fs::metadata(&log).expect("log").len();
    let wall = std::time::SystemTime::now();
    let t = berth_turn(&mut sender, &mut items, mock, &sid).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for sql in [
        "ALTER SYSTEM RESET log_min_duration_statement",
        "SELECT pg_reload_conf()",
    ] {
        admin.batch_execute(sql).await.expect("reset");
    }
    let start = wall.duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs_f64() * 1e3;
    let text = std::fs::read_to_string(&log).expect("read log");
    let (mut statements, mut backends) = (0, std::collections::BTreeSet::new());
    println!(
        "turn: {:.1} ms (send answered {:.1}, turn.started {:.1}, first delta {:.1}, settle {:.1})",
        t.total, t.answered, t.started, t.first_delta, t.settle
    );
    for line in text.get(from as usize..).unwrap_or("").lines() {
        // `<epoch s.ms> [pid] LOG:  duration: 0.123 ms  execute s1: SELECT …` (`%n` is
        // seconds with milliseconds)
        let Some((at, rest)) = line.split_once(' ') else {
            continue;
        };
        let Ok(at) = at.parse::<f64>().map(|s| s * 1e3) else {
            continue;
        };
        let offset = at - start;
        if offset < 0.0 || offset > t.total + 1.0 || !rest.contains("duration:") {
            continue;
        }
        if rest.contains(" parse ") || rest.contains(" bind ") {
            continue;
        }
        statements += 1;
        backends.insert(rest.split(']').next().unwrap_or("").to_string());
        let short: String = rest
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .chars()
            .take(170)
            .collect();
        println!("{offset:7.2} {short}");
    }
    println!("{statements} statements on {} backends within the turn", backends.len());
    stop(dev).await;
}

/// Figures of one kind of turn, each turn beside a raw provider stream run just before it.
#[derive(Default)]
struct Turns {
    raw: Vec<f64>,
    berth: Vec<f64>,
    overhead: Vec<f64>,
    raw_lags: Vec<f64>,
    /// Each chunk's delay from the provider through two relay processes ([`relay_server`]).
    relayed_lags: Vec<f64>,
    berth_lags: Vec<f64>,
    arrivals: Vec<Arrival>,
    answered: Vec<f64>,
    started: Vec<f64>,
    first: Vec<f64>,
    settle: Vec<f64>,
    creates: Vec<f64>,
}

impl Turns {
    fn push(&mut self, raw: (Duration, Vec<f64>), relayed: Vec<f64>, t: TurnTimes) {
        let raw_ms = ms(raw.0);
        self.raw.push(raw_ms);
        self.raw_lags.extend(raw.1);
        self.relayed_lags.extend(relayed);
        self.berth.push(t.total);
        self.overhead.push(t.total - raw_ms);
        self.berth_lags.extend(t.lags);
        self.arrivals.extend(t.arrivals);
        self.answered.push(t.answered);
        self.started.push(t.started);
        self.first.push(t.first_delta);
        self.settle.push(t.settle);
    }
}

/// Turns in one long-lived session and turns in a new session each, interleaved (so that
/// both see the same load), each beside a raw provider stream.
async fn turn_overhead(
    table: &mut Table,
    setup: &str,
    dev: &TestServer,
    token: &str,
    workspace_id: &str,
    mock: &MockProvider,
    turns: usize,
) {
    let http = reqwest::Client::builder().tcp_nodelay(true).build().expect("http");
    let direct = mock.base_url();
    // Two relay processes in front of the provider: as many hops as a delta takes.
    let provider_addr = direct
        .strip_prefix("http://")
        .and_then(|a| a.strip_suffix("/v1"))
        .expect("http://ADDR/v1");
    let (_r1, r1) = start_helper("BERTH_BENCH_RELAY", provider_addr, "relay ").await;
    let (_r2, r2) = start_helper("BERTH_BENCH_RELAY", &r1, "relay ").await;
    let relayed = format!("http://{r2}/v1");
    let mut sender = Client::authed(&dev.ws_url(), token).await.expect("client");
    let mut watcher = Client::authed(&dev.ws_url(), token).await.expect("client");
    // Warm up both paths (connections, statement caches).
    let sid = session(&mut sender, workspace_id).await;
    let mut items = timed(
        watcher
            .subscribe("session.watch", json!({"sessionId": sid, "after": 0}))
            .items,
    );
    for _ in 0..3 {
        raw_provider(&http, mock, &direct).await;
        raw_provider(&http, mock, &relayed).await;
        berth_turn(&mut sender, &mut items, mock, &sid).await;
    }
    let (mut one, mut fresh) = (Turns::default(), Turns::default());
    for _ in 0..turns {
        let raw = raw_provider(&http, mock, &direct).await;
        let (_, hops) = raw_provider(&http, mock, &relayed).await;
        one.push(raw, hops, berth_turn(&mut sender, &mut items, mock, &sid).await);

        let raw = raw_provider(&http, mock, &direct).await;
        let (_, hops) = raw_provider(&http, mock, &relayed).await;
        let t0 = Instant::now();
        let new_sid = session(&mut sender, workspace_id).await;
        let new_sub = watcher.subscribe("session.watch", json!({"sessionId": new_sid, "after": 0}));
        let (new_id, mut new_items) = (new_sub.id, timed(new_sub.items));
        fresh.creates.push(ms(t0.elapsed()));
        fresh.push(raw, hops, berth_turn(&mut sender, &mut new_items, mock, &new_sid).await);
        let _ = watcher.call("subscription.close", json!({"id": new_id})).await;
    }
    for (what, t) in [("one session", &mut one), ("a new session per turn", &mut fresh)] {
        let (b, r, o) = (median(&mut t.berth), median(&mut t.raw), median(&mut t.overhead));
        table.add(
            &format!("{setup}: turn wall time, {what} (median of {turns}; `session.send` → `turn.ended` at a watcher)"),
            format!("{b:.1} ms"),
            format!("{r:.1} ms provider stream"),
            // Best case: the fastest turn against the fastest raw stream (what the path
            // costs when no process waits for a core).
            format!(
                "overhead {o:.1} ms (p90 {:.1}; best {:.1} ms)",
                quantile(&mut t.overhead, 0.9),
                quantile(&mut t.berth, 0.0) - quantile(&mut t.raw, 0.0)
            ),
            "overhead ≤ 10 ms",
            Some(o <= 10.0),
        );
        println!(
            "  timeline medians ({setup}, {what}): send answered {:.1} ms, turn.started {:.1} ms, first delta {:.1} ms, last delta → turn.ended {:.1} ms{}",
            median(&mut t.answered),
            median(&mut t.started),
            median(&mut t.first),
            median(&mut t.settle),
            if t.creates.is_empty() {
                String::new()
            } else {
                format!("; session.create + watch {:.1} ms", median(&mut t.creates))
            }
        );
    }
    let mut berth_lags = one.berth_lags;
    berth_lags.extend(fresh.berth_lags);
    let mut raw_lags = one.raw_lags;
    raw_lags.extend(fresh.raw_lags);
    let (bp50, bp99, bmax) = (
        median(&mut berth_lags),
        quantile(&mut berth_lags, 0.99),
        quantile(&mut berth_lags, 1.0),
    );
    let (rp50, rp99) = (median(&mut raw_lags), quantile(&mut raw_lags, 0.99));
    let mut hops = one.relayed_lags;
    hops.extend(fresh.relayed_lags);
    table.add(
        &format!(
            "{setup}: live delta, provider → watcher (p50 / p99 / max of {}; over 2 ms)",
            berth_lags.len()
        ),
        format!("{bp50:.2} / {bp99:.2} / {bmax:.2} ms; {}", over(&berth_lags, 2.0)),
        format!(
            "{rp50:.2} / {rp99:.2} ms provider → direct reader; {}, {} through two relay processes",
            spread(&mut hops),
            over(&hops, 2.0)
        ),
        format!("+{:.2} / +{:.2} ms", bp50 - rp50, bp99 - rp99),
        "p99 ≤ raw + 2 ms",
        Some(bp99 - rp99 <= 2.0),
    );
    // The same deltas from the worker's receipt (its TRACE event), and the leg before it.
    let receipts = worker_receipts(&dev.log);
    let (mut to_watcher, mut to_worker) = (Vec::new(), Vec::new());
    for a in one.arrivals.iter().chain(&fresh.arrivals) {
        if let Some(&at) = receipts.get(&a.stamp) {
            to_watcher.push(a.wall.saturating_sub(at) as f64 / 1e3);
            to_worker.push(at.saturating_sub(a.epoch_wall + a.stamp) as f64 / 1e3);
        }
    }
    // The slowest deltas, step by step from the worker's receipt (ms).
    let relay = relay_steps(&dev.log);
    let mut slow: Vec<(u64, &Arrival)> = one
        .arrivals
        .iter()
        .chain(&fresh.arrivals)
        .filter_map(|a| receipts.get(&a.stamp).map(|&at| (at, a)))
        .collect();
    slow.sort_by_key(|(at, a)| std::cmp::Reverse(a.wall.saturating_sub(*at)));
    for (at, a) in slow.iter().take(5) {
        let since = |us: u64| us.saturating_sub(*at) as f64 / 1e3;
        let steps: String = relay
            .get(&a.stamp)
            .map(|s| {
                s.iter()
                    .map(|(what, us)| format!("{what} +{:.2}, ", since(*us)))
                    .collect()
            })
            .unwrap_or_default();
        println!(
            "  slow delta ({setup}): provider → worker {:.2} ms; then {steps}watcher +{:.2} ms",
            at.saturating_sub(a.epoch_wall + a.stamp) as f64 / 1e3,
            since(a.wall)
        );
    }
    // Where in its turn each delta over 2 ms came (the turn's chunks in order).
    let mut by_position = [0usize; CHUNKS];
    for (i, a) in one.arrivals.iter().chain(&fresh.arrivals).enumerate() {
        if receipts
            .get(&a.stamp)
            .is_some_and(|&at| a.wall.saturating_sub(at) > 2000)
        {
            by_position[i % CHUNKS] += 1;
        }
    }
    println!("  deltas over 2 ms from the worker's receipt, by chunk of the turn ({setup}): {by_position:?}");
    let missing = berth_lags.len() - to_watcher.len();
    let wmax = quantile(&mut to_watcher, 1.0);
    table.add(
        &format!(
            "{setup}: live delta, worker → watcher (p50 / p99 / max of {}{})",
            to_watcher.len(),
            if missing > 0 {
                format!("; {missing} not in the worker's log")
            } else {
                String::new()
            }
        ),
        format!(
            "{:.2} / {:.2} / {wmax:.2} ms; {} over 2 ms",
            median(&mut to_watcher),
            quantile(&mut to_watcher, 0.99),
            over(&to_watcher, 2.0)
        ),
        format!(
            "{:.2} / {:.2} / {:.2} ms provider → worker",
            median(&mut to_worker),
            quantile(&mut to_worker, 0.99),
            quantile(&mut to_worker, 1.0)
        ),
        "—".into(),
        "each ≤ 2 ms",
        Some(missing == 0 && wmax <= 2.0),
    );
}

// ---------------------------------------------------------------------------------------
// 2. Event append path: worker → API tier → PostgreSQL

/// Rows per appended step (an answer and a few tool calls).
const STEP_ROWS: usize = 4;

fn step_rows() -> Vec<Value> {
    (0..STEP_ROWS)
        .map(|i| {
            if i == 0 {
                json!({"kind": "assistant", "body": "Let me look at the failing test first. ".repeat(4)})
            } else {
                json!({"kind": "toolCall", "body": format!("{{\"path\": \"src/lib{i}.rs\"}}"),
                       "tool": {"name": "read_file", "callId": format!("call_{i}"), "status": "requested"}})
            }
        })
        .collect()
}

async fn append_path(table: &mut Table, setup: &str, dev: &TestServer, token: &str, database_url: &str) {
    const N: usize = 300;
    // This process plays a worker on its own host and workspace, so that it is handed the
    // turn and appends its steps exactly as `berth worker` does.
    let worker_token = dev.worker_token().await;
    let mut ws = ws_connect(&format!("ws://{}/v1/worker", dev.addr), Some(&worker_token)).await;
    let dir = scratch_dir("bench-ws");
    let hello = json!({"jsonrpc": "2.0", "id": 0, "method": "worker.hello", "params": {
        "protocol": berth_protocol::PROTOCOL_VERSION, "host": format!("bench-host-{}", dev.addr),
        "workspaces": [{"name": "bench", "path": dir.display().to_string()}]}});
    ws.send(Message::Text(hello.to_string().into())).await.expect("hello");
    let reply: Value = serde_json::from_str(&next_text(&mut ws).await).expect("json");
    let workspace_id = reply["result"]["workspaces"][0]["workspaceId"]
        .as_str()
        .unwrap_or_else(|| panic!("worker.hello: {reply}"))
        .to_string();
    let mut client = Client::authed(&dev.ws_url(), token).await.expect("client");
    let sid = session(&mut client, &workspace_id).await;
    client
        .ok("session.send", json!({"sessionId": sid, "prompt": "go"}))
        .await;
    let turn_id = loop {
        let msg: Value = serde_json::from_str(&next_text(&mut ws).await).expect("json");
        if msg["method"] == "turn.run" {
            break msg["params"]["turnId"].as_str().expect("turnId").to_string();
        }
    };
    let rows = step_rows();
    let mut berth = Vec::new();
    for i in 0..N + 10 {
        let step = json!({"jsonrpc": "2.0", "id": i + 1, "method": "turn.step",
                          "params": {"turnId": turn_id, "rows": rows}});
        let t0 = Instant::now();
        ws.send(Message::Text(step.to_string().into())).await.expect("step");
        let reply: Value = serde_json::from_str(&next_text(&mut ws).await).expect("json");
        assert!(reply["result"]["sequence"].is_i64(), "turn.step: {reply}");
        if i >= 10 {
            berth.push(ms(t0.elapsed()));
        }
    }
    let end = json!({"jsonrpc": "2.0", "id": 0, "method": "turn.end",
                     "params": {"turnId": turn_id, "state": "completed"}});
    ws.send(Message::Text(end.to_string().into())).await.expect("end");
    let _ = next_text(&mut ws).await;

    // Baseline: the same rows as one prepared multi-row INSERT into a copy of `rows`.
    let db = db(database_url).await;
    db.batch_execute("CREATE TABLE bench_rows (LIKE rows INCLUDING ALL)")
        .await
        .expect("bench table");
    let values: Vec<String> = (0..STEP_ROWS)
        .map(|r| {
            let b = r * 9;
            format!(
                "(${}, ${}, ${}, ${}, ${}, ${}, ${}, NULL, ${}, ${})",
                b + 1,
                b + 2,
                b + 3,
                b + 4,
                b + 5,
                b + 6,
                b + 7,
                b + 8,
                b + 9
            )
        })
        .collect();
    let insert = db
        .prepare(&format!(
            "INSERT INTO bench_rows (session_id, source_sequence, item_index, tenant_id, turn_id, kind, body, thinking, tool, hidden) VALUES {}",
            values.join(", ")
        ))
        .await
        .expect("prepare");
    let bodies: Vec<(String, String, Option<Value>)> = rows
        .iter()
        .map(|r| {
            (
                r["kind"].as_str().unwrap_or("").to_string(),
                r["body"].as_str().unwrap_or("").to_string(),
                r.get("tool").cloned(),
            )
        })
        .collect();
    let (tenant, hidden) = ("tnt_bench".to_string(), false);
    let item_indexes: Vec<i32> = (0..STEP_ROWS as i32).collect();
    let mut raw = Vec::new();
    for i in 0..N + 10 {
        let seq = i as i64;
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = Vec::new();
        for (r, (kind, body, tool)) in bodies.iter().enumerate() {
            params.extend([
                &sid as &(dyn tokio_postgres::types::ToSql + Sync),
                &seq,
                &item_indexes[r],
                &tenant,
                &turn_id,
                kind,
                body,
                tool,
                &hidden,
            ]);
        }
        let t0 = Instant::now();
        db.execute(&insert, &params).await.expect("insert");
        if i >= 10 {
            raw.push(ms(t0.elapsed()));
        }
    }
    let (b, r) = (median(&mut berth), median(&mut raw));
    table.add(
        &format!(
            "{setup}: append one step of {STEP_ROWS} rows (median of {N}; worker `turn.step` → stored → answered)"
        ),
        format!("{b:.2} ms"),
        format!("{r:.2} ms prepared multi-row INSERT"),
        format!("{:.2}× raw throughput", r / b),
        "≥ 0.5×",
        Some(r / b >= 0.5),
    );
}

// ---------------------------------------------------------------------------------------
// 3. Cross-replica fan-out

async fn fan_out(
    table: &mut Table,
    dev: &TestServer,
    replica: &TestServer,
    token: &str,
    workspace_id: &str,
    database_url: &str,
) {
    const N: usize = 300;
    const IDLE: usize = 100;
    let mut creator = Client::authed(&dev.ws_url(), token).await.expect("client");
    // Idle watchers on the receiving replica, each on a session of its own.
    let mut idle = Vec::new();
    for _ in 0..IDLE {
        let sid = session(&mut creator, workspace_id).await;
        let mut c = Client::authed(&replica.ws_url(), token).await.expect("client");
        let sub = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
        idle.push((c, sub));
    }
    let sid = session(&mut creator, workspace_id).await;
    let mut watcher = Client::authed(&replica.ws_url(), token).await.expect("client");
    let mut sub = watcher.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    // The raw baseline: a LISTENer of this process on the channel appends notify.
    let (listener, mut conn) = tokio_postgres::connect(database_url, tokio_postgres::NoTls)
        .await
        .expect("listen connection");
    let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(m)) = futures_util::future::poll_fn(|cx| conn.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = tx.send((Instant::now(), n.payload().to_string()));
            }
        }
    });
    listener
        .batch_execute(&format!("LISTEN {}", berth_store::CHANNEL_EVENTS))
        .await
        .expect("listen");
    // Commits come from Berth's own append code (the store), run in this process so that
    // the commit instant and both observers share one clock.
    let store = berth_store::Store::connect(database_url, 2).expect("store");
    let db = db(database_url).await;
    let tenant: String = db
        .query_one("SELECT tenant_id FROM sessions WHERE id = $1", &[&sid])
        .await
        .expect("tenant")
        .get(0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    while sub.items.try_recv().is_ok() {}
    let (mut raw, mut berth, mut diff) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..N + 10 {
        let t0 = Instant::now();
        let snap = store
            .rename_session(&tenant, &sid, &format!("t{i}"), Some("mock-model"), None)
            .await
            .expect("append");
        let want = format!("{sid}:{}", snap.sequence);
        let raw_at = loop {
            let (at, payload) = heard.recv().await.expect("listen");
            if payload == want {
                break at;
            }
        };
        let berth_at = loop {
            let item = tokio::time::timeout(Duration::from_secs(10), sub.items.recv())
                .await
                .expect("delivered")
                .expect("open");
            if item["type"] == "session.titleChanged" {
                break Instant::now();
            }
        };
        if i >= 10 {
            raw.push(ms(raw_at - t0));
            berth.push(ms(berth_at - t0));
            diff.push(ms(berth_at - t0) - ms(raw_at - t0));
        }
    }
    let (b50, b99) = (median(&mut berth), quantile(&mut berth, 0.99));
    let (r50, r99) = (median(&mut raw), quantile(&mut raw, 0.99));
    table.add(
        &format!("cross-replica fan-out, append → frame at a watcher on the other replica, {IDLE} idle watchers (p50 / p99 of {N})"),
        format!("{b50:.2} / {b99:.2} ms"),
        format!("{r50:.2} / {r99:.2} ms raw LISTEN"),
        format!("+{:.2} / +{:.2} ms", b50 - r50, b99 - r99),
        "≤ raw + 1 ms",
        Some(b50 - r50 <= 1.0 && b99 - r99 <= 1.0),
    );
    println!(
        "  per-append difference berth − raw: p50 {:.2} ms, p99 {:.2} ms",
        median(&mut diff),
        quantile(&mut diff, 0.99)
    );
    drop(idle);
}

// ---------------------------------------------------------------------------------------
// 4. A history page

/// A row decoded the way the store decodes it (the baseline does the same work).
struct RawRow {
    _position: (i64, i32),
    _turn: Option<String>,
    _kind: String,
    _body: String,
    _thinking: Option<String>,
    _tool: Option<Value>,
    _hidden: bool,
    _attachments: Option<Value>,
}

/// A `session.history` answer decoded the way a typed client does (`berth-client`'s
/// `call::<SessionHistory>`): straight into the protocol's rows, the same information the
/// baseline's rows hold.
#[derive(serde::Deserialize)]
struct HistoryAnswer {
    id: u32,
    result: berth_protocol::SessionHistoryResult,
}

async fn history_page(table: &mut Table, dev: &TestServer, token: &str, workspace_id: &str, database_url: &str) {
    const EVENTS: i64 = 100_000;
    const N: usize = 200;
    let mut client = Client::authed(&dev.ws_url(), token).await.expect("client");
    let sid = session(&mut client, workspace_id).await;
    let db = db(database_url).await;
    let row = db
        .query_one("SELECT tenant_id, last_sequence FROM sessions WHERE id = $1", &[&sid])
        .await
        .expect("session");
    let (tenant, first): (String, i64) = (row.get(0), row.get(1));
    let last = first + EVENTS;
    // Bulk setup straight in SQL: one event with one assistant row per sequence.
    db.execute(
        "INSERT INTO events (session_id, sequence, tenant_id, type, payload)
         SELECT $1, g, $2, 'model.completed', '{\"usage\": null}' FROM generate_series($3::bigint, $4::bigint) g",
        &[&sid, &tenant, &(first + 1), &last],
    )
    .await
    .expect("events");
    db.execute(
        "INSERT INTO rows (session_id, source_sequence, item_index, tenant_id, kind, body)
         SELECT $1, g, 0, $2, 'assistant', 'answer ' || g || ': ' || repeat('lorem ipsum ', 8)
           FROM generate_series($3::bigint, $4::bigint) g",
        &[&sid, &tenant, &(first + 1), &last],
    )
    .await
    .expect("rows");
    db.execute("UPDATE sessions SET last_sequence = $2 WHERE id = $1", &[&sid, &last])
        .await
        .expect("fence");
    db.batch_execute("ANALYZE events; ANALYZE rows").await.expect("analyze");
    let from = first + EVENTS / 2;
    // The same through the tests' client, which parses every frame into a `Value` tree and
    // hands answers between tasks: reported beside the figure, for what such a client costs.
    let mut through_value = Vec::new();
    for i in 0..N + 10 {
        let t0 = Instant::now();
        let page = client
            .ok(
                "session.history",
                json!({"sessionId": sid, "after": {"sourceSequence": from, "itemIndex": 0}, "limit": 200}),
            )
            .await;
        let took = ms(t0.elapsed());
        assert_eq!(page["rows"].as_array().map(Vec::len), Some(200), "page: {page}");
        if i >= 10 {
            through_value.push(took);
        }
    }
    // The page as a client asks for it and gets it: one request on its own WebSocket, the
    // answer decoded into typed rows (no test-client routing tasks in between).
    let mut ws = ws_connect(&dev.ws_url(), Some(token)).await;
    let mut berth = Vec::new();
    for i in 0..N + 10 {
        let id = i as u32 + 1;
        let t0 = Instant::now();
        let request = json!({"jsonrpc": "2.0", "id": id, "method": "session.history",
            "params": {"sessionId": sid, "after": {"sourceSequence": from, "itemIndex": 0}, "limit": 200}});
        ws.send(Message::text(request.to_string())).await.expect("send");
        let answer = loop {
            match ws.next().await.expect("open").expect("frame") {
                Message::Text(t) => break serde_json::from_str::<HistoryAnswer>(&t).expect("a history page"),
                Message::Close(c) => panic!("closed: {c:?}"),
                _ => {}
            }
        };
        let took = ms(t0.elapsed());
        assert_eq!((answer.id, answer.result.rows.len()), (id, 200));
        if i >= 10 {
            berth.push(took);
        }
    }
    let select = db
        .prepare(
            "SELECT source_sequence, item_index, turn_id, kind, body, thinking, tool, hidden, attachments FROM rows
              WHERE session_id = $1 AND tenant_id = $2 AND NOT hidden AND (source_sequence, item_index) > ($3, 0)
              ORDER BY source_sequence, item_index LIMIT 200",
        )
        .await
        .expect("prepare");
    let mut raw = Vec::new();
    for i in 0..N + 10 {
        let t0 = Instant::now();
        let rows = db.query(&select, &[&sid, &tenant, &from]).await.expect("select");
        let decoded: Vec<RawRow> = rows
            .iter()
            .map(|r| RawRow {
                _position: (r.get(0), r.get(1)),
                _turn: r.get(2),
                _kind: r.get(3),
                _body: r.get(4),
                _thinking: r.get(5),
                _tool: r.get(6),
                _hidden: r.get(7),
                _attachments: r.get(8),
            })
            .collect();
        let took = ms(t0.elapsed());
        assert_eq!(decoded.len(), 200);
        if i >= 10 {
            raw.push(took);
        }
    }
    let (b, r, v) = (median(&mut berth), median(&mut raw), median(&mut through_value));
    table.add(
        &format!("`session.history` page of 200 rows in a {EVENTS}-event session (median of {N})"),
        format!("{b:.2} ms"),
        format!("{r:.2} ms indexed SELECT"),
        format!("{:.2}×", b / r),
        "≤ 2×",
        Some(b / r <= 2.0),
    );
    table.add(
        &format!("`session.history` page, the same, through the tests' `Value`-tree client (median of {N})"),
        format!("{v:.2} ms"),
        format!("{r:.2} ms indexed SELECT"),
        format!("{:.2}×", v / r),
        "report",
        None,
    );
}

// ---------------------------------------------------------------------------------------
// 5. WebSocket throughput and memory; 6. memory per idle session

/// A plain tokio-tungstenite echo server (the bench binary re-run as a child process, so
/// that its memory is its own): prints `echo ADDR`, then echoes text frames.
async fn echo_server() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    println!("echo {}", listener.local_addr().expect("addr"));
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let _ = tcp.set_nodelay(true);
        tokio::spawn(async move {
            let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                return;
            };
            while let Some(Ok(m)) = ws.next().await {
                if m.is_text() && ws.send(m).await.is_err() {
                    break;
                }
            }
        });
    }
}

async fn start_echo() -> (tokio::process::Child, String) {
    start_helper("BERTH_BENCH_ECHO", "1", "echo ").await
}

/// This bench run again as a helper process (`env` set to `value`), which prints
/// `{prefix}ADDR` once it listens.
async fn start_helper(env: &str, value: &str, prefix: &str) -> (tokio::process::Child, String) {
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .env(env, value)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("helper process");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let line = lines.next_line().await.expect("read").expect("helper's line");
    let addr = line.strip_prefix(prefix).expect("helper's ADDR").to_string();
    (child, addr)
}

/// `BERTH_BENCH_RELAY=ADDR`: forwards each TCP connection to `ADDR`, each read written on
/// at once (no delay on either socket). A hop that does none of Berth's work: two of them
/// between the provider and a reader are the live delta's raw baseline (a delta crosses two
/// processes, the worker and the API tier, between the provider and a watcher).
async fn relay_server(upstream: String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    println!("relay {}", listener.local_addr().expect("addr"));
    loop {
        let Ok((mut down, _)) = listener.accept().await else {
            continue;
        };
        let upstream = upstream.clone();
        tokio::spawn(async move {
            let Ok(mut up) = tokio::net::TcpStream::connect(&upstream).await else {
                return;
            };
            let _ = down.set_nodelay(true);
            let _ = up.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
        });
    }
}

/// Requests per second over `conns` connections, each sending `ping` and awaiting the
/// answer in a loop for `secs`.
async fn ping_rate(url: &str, bearer: Option<&str>, conns: usize, secs: f64) -> f64 {
    let mut sockets = Vec::new();
    for _ in 0..conns {
        sockets.push(ws_connect(url, bearer).await);
    }
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let tasks: Vec<_> = sockets
        .into_iter()
        .map(|mut ws| {
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let ping = json!({"jsonrpc": "2.0", "id": n + 1, "method": "ping"});
                    ws.send(Message::Text(ping.to_string().into())).await.expect("send");
                    let reply = next_text(&mut ws).await;
                    debug_assert!(reply.contains("\"id\""));
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("ping task");
    }
    total as f64 / secs
}

/// Resident memory per idle connection (bytes): `n` connections opened and held.
async fn memory_per_connection(pid: u32, url: &str, bearer: Option<&str>, n: usize) -> f64 {
    let mut hold = Vec::new();
    // Warm up (runtime, allocator arenas), then measure the growth for `n` more.
    for _ in 0..50 {
        hold.push(ws_connect(url, bearer).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = rss(pid);
    for _ in 0..n {
        hold.push(ws_connect(url, bearer).await);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss(pid);
    drop(hold);
    after.saturating_sub(before) as f64 / n as f64
}

async fn websocket(table: &mut Table, replica: &TestServer, token: &str) {
    const CONNS: usize = 100;
    const SECS: f64 = 3.0;
    const IDLE: usize = 1000;
    let (mut echo, echo_addr) = start_echo().await;
    let echo_url = format!("ws://{echo_addr}/");
    let raw = ping_rate(&echo_url, None, CONNS, SECS).await;
    let berth = ping_rate(&replica.ws_url(), Some(token), CONNS, SECS).await;
    table.add(
        &format!("WebSocket `ping` round trips/s, {CONNS} connections ({SECS} s)"),
        format!("{berth:.0}/s"),
        format!("{raw:.0}/s tokio-tungstenite echo"),
        format!("{:.2}×", berth / raw),
        "≥ 0.5×",
        Some(berth / raw >= 0.5),
    );
    let echo_pid = echo.id().expect("echo pid");
    let raw_mem = memory_per_connection(echo_pid, &echo_url, None, IDLE).await;
    let berth_pid = replica.child.id().expect("replica pid");
    let berth_mem = memory_per_connection(berth_pid, &replica.ws_url(), Some(token), IDLE).await;
    table.add(
        &format!("API-tier memory per idle connection (RSS growth over {IDLE})"),
        format!("{:.1} KiB", berth_mem / 1024.0),
        format!("{:.1} KiB tokio-tungstenite echo", raw_mem / 1024.0),
        format!("{:.2}×", berth_mem / raw_mem),
        "≤ 2×",
        Some(berth_mem <= 2.0 * raw_mem),
    );
    echo.kill().await.ok();
}

async fn idle_sessions(table: &mut Table, replica: &TestServer, token: &str, workspace_id: &str) {
    const N: usize = 2000;
    let pid = replica.child.id().expect("replica pid");
    let mut client = Client::authed(&replica.ws_url(), token).await.expect("client");
    for _ in 0..200 {
        session(&mut client, workspace_id).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = rss(pid);
    for _ in 0..N {
        session(&mut client, workspace_id).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = rss(pid);
    let per = after.saturating_sub(before) as f64 / N as f64;
    table.add(
        &format!("API-tier memory per idle session (RSS growth over {N} created)"),
        format!("{per:.0} B"),
        "0 B (nothing kept)".into(),
        format!("{per:.0} B"),
        "zero (allocator noise only)",
        Some(per < 64.0),
    );
}

// ---------------------------------------------------------------------------------------
// 7. Many turns at once (issue 20): two replicas, two `berth worker` processes; and the
//    worker's observations (issue 11): `git.status` and `files.read` against their raw
//    baselines.

/// A `berth worker` process serving `dir` as workspace `name`, on a host of its own, with a
/// credential of its own, connected to `server`.
async fn spawn_worker(server: &TestServer, host: &str, name: &str, dir: &std::path::Path) -> tokio::process::Child {
    let token = server.worker_token().await;
    let home = scratch_dir("bench-worker");
    let token_file = home.join("token");
    std::fs::write(&token_file, token).expect("token file");
    let log = std::fs::File::create(home.join("worker.log")).expect("log");
    Command::new(berth_bin())
        .args([
            "worker",
            "--server",
            &format!("http://{}/", server.addr),
            "--host",
            host,
        ])
        .arg("--token-file")
        .arg(&token_file)
        .arg("--workspace")
        .arg(format!("{name}={}", dir.display()))
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("berth worker")
}

/// The id of the online workspace of worker host `host`.
async fn online_workspace(server: &TestServer, token: &str, host: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let mut c = Client::authed(&server.ws_url(), token).await.expect("client");
        let list = c.ok("workspace.list", json!({})).await;
        if let Some(w) = list
            .as_array()
            .and_then(|l| l.iter().find(|w| w["online"] == true && w["host"] == host))
        {
            return w["workspaceId"].as_str().expect("id").to_string();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the workspace of {host} never came online");
}

/// CPU time (user + system) a process has used so far (zero once it is gone).
fn cpu_time(pid: u32) -> Duration {
    ticks_time(cpu_ticks(pid))
}

/// CPU time of a process and all its children (PostgreSQL: the postmaster and its
/// backends).
fn tree_cpu(root: u32) -> Duration {
    ticks_time(tree_ticks(root))
}

/// CPU time of this process's threads whose name starts with `prefix`.
fn threads_cpu(prefix: &str) -> Duration {
    let mut sum = Duration::ZERO;
    for entry in std::fs::read_dir("/proc/self/task").expect("tasks").flatten() {
        let dir = entry.path();
        let named = std::fs::read_to_string(dir.join("comm")).is_ok_and(|c| c.starts_with(prefix));
        if named && let Some(f) = stat_fields(&format!("{}/stat", dir.display())) {
            sum += ticks_time(stat_ticks(&f));
        }
    }
    sum
}

/// Thread name of the scripted provider's runtime, so that its CPU is told apart from the
/// bench client's in this process.
const MOCK_THREADS: &str = "mock-provider";

/// The scripted provider on a runtime (one thread) of its own.
fn isolated_mock() -> MockProvider {
    std::thread::spawn(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(MOCK_THREADS)
            .enable_all()
            .build()
            .expect("provider runtime");
        let mock = rt.block_on(MockProvider::start());
        // Serves until the bench exits.
        Box::leak(Box::new(rt));
        mock
    })
    .join()
    .expect("provider thread")
}

/// CPU used so far by each process a turn crosses.
#[derive(Clone, Copy, Default)]
struct Cpu {
    api: Duration,
    worker: Duration,
    postgres: Duration,
    provider: Duration,
    client: Duration,
}

impl Cpu {
    fn total(&self) -> Duration {
        self.api + self.worker + self.postgres + self.provider + self.client
    }

    fn plus(&self, o: &Cpu) -> Cpu {
        Cpu {
            api: self.api + o.api,
            worker: self.worker + o.worker,
            postgres: self.postgres + o.postgres,
            provider: self.provider + o.provider,
            client: self.client + o.client,
        }
    }

    fn minus(&self, o: &Cpu) -> Cpu {
        Cpu {
            api: self.api.saturating_sub(o.api),
            worker: self.worker.saturating_sub(o.worker),
            postgres: self.postgres.saturating_sub(o.postgres),
            provider: self.provider.saturating_sub(o.provider),
            client: self.client.saturating_sub(o.client),
        }
    }

    /// "API a · worker b · … = total ms per turn".
    fn per_turn(&self, turns: usize) -> String {
        let f = |d: Duration| ms(d) / turns as f64;
        format!(
            "API {:.2} · worker {:.2} · PostgreSQL {:.2} · provider {:.2} · bench client {:.2} = {:.2} ms",
            f(self.api),
            f(self.worker),
            f(self.postgres),
            f(self.provider),
            f(self.client),
            f(self.total())
        )
    }
}

/// The processes of the concurrency rows, read together.
struct Meters {
    replicas: Vec<u32>,
    workers: Vec<u32>,
    postmaster: u32,
}

impl Meters {
    fn read(&self) -> Cpu {
        let provider = threads_cpu(MOCK_THREADS);
        Cpu {
            api: self.replicas.iter().map(|p| cpu_time(*p)).sum(),
            worker: self.workers.iter().map(|p| cpu_time(*p)).sum(),
            postgres: tree_cpu(self.postmaster),
            provider,
            client: cpu_time(std::process::id()).saturating_sub(provider),
        }
    }
}

/// The postmaster of the cluster holding `database_url` (the parent of a backend).
async fn postmaster(database_url: &str) -> u32 {
    let c = db(database_url).await;
    let backend: i32 = c
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("backend pid")
        .get(0);
    let f = stat_fields(&format!("/proc/{backend}/stat")).expect("backend stat");
    f[1].parse().expect("ppid")
}

/// `BERTH_BENCH_DB_SET="name=value …"`: settings for every later connection to the
/// database (`ALTER DATABASE … SET`), to compare a server setting with the same binary.
async fn database_settings(database_url: &str) {
    let c = db(database_url).await;
    if let Ok(sql) = std::env::var("BERTH_BENCH_DB_SQL") {
        c.batch_execute(&sql).await.expect("BERTH_BENCH_DB_SQL");
        println!("database changed: {sql}");
    }
    let Ok(settings) = std::env::var("BERTH_BENCH_DB_SET") else {
        return;
    };
    let name: String = c
        .query_one("SELECT current_database()", &[])
        .await
        .expect("database")
        .get(0);
    for setting in settings.split_whitespace() {
        let (key, value) = setting.split_once('=').expect("name=value");
        c.batch_execute(&format!("ALTER DATABASE \"{name}\" SET {key} = '{value}'"))
            .await
            .expect("database setting");
        println!("database setting: {key} = {value}");
    }
}

/// `BERTH_BENCH_STATEMENTS=1`: `pg_stat_statements` over the 50-turn rounds (the test
/// cluster must load it: `BERTH_TEST_PG_SETTINGS="shared_preload_libraries=pg_stat_statements
/// pg_stat_statements.track_planning=on"`). Resets the counters; the connection reads them
/// afterwards.
async fn statements_start(database_url: &str) -> Option<tokio_postgres::Client> {
    std::env::var_os("BERTH_BENCH_STATEMENTS")?;
    let c = db(database_url).await;
    let ready = c
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements; SELECT pg_stat_statements_reset()")
        .await;
    match ready {
        Ok(()) => Some(c),
        Err(e) => {
            println!("pg_stat_statements unavailable (set BERTH_TEST_PG_SETTINGS): {e}");
            None
        }
    }
}

/// The statements of this database since [`statements_start`], by total (planning +
/// execution) time: calls per turn, planning and execution time per call and in all.
async fn statements_print(c: &tokio_postgres::Client, turns: usize) {
    let rows = c
        .query(
            "SELECT calls, plans, total_plan_time, total_exec_time, rows,
                    left(regexp_replace(query, '\\s+', ' ', 'g'), 150)
               FROM pg_stat_statements
              WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
              ORDER BY total_plan_time + total_exec_time DESC",
            &[],
        )
        .await
        .expect("pg_stat_statements");
    let turns = turns as f64;
    let (mut calls, mut plan, mut exec) = (0i64, 0.0, 0.0);
    println!(
        "\npg_stat_statements over {turns} turns (per turn: calls, plan ms, exec ms; per call: plan µs, exec µs; plans; query)"
    );
    for r in &rows {
        let (n, plans, p, e): (i64, i64, f64, f64) = (r.get(0), r.get(1), r.get(2), r.get(3));
        calls += n;
        plan += p;
        exec += e;
        let q: String = r.get(5);
        println!(
            "{:6.2} {:7.3} {:7.3} | {:6.1} {:6.1} | {:6} | {q}",
            n as f64 / turns,
            p / turns,
            e / turns,
            p * 1e3 / n.max(1) as f64,
            e * 1e3 / n.max(1) as f64,
            plans
        );
    }
    println!(
        "all: {:.1} statements, {:.3} ms planning, {:.3} ms execution per turn",
        calls as f64 / turns,
        plan / turns,
        exec / turns
    );
}

/// `BERTH_BENCH_PERF=FILE`: `perf record` of the given processes while the 50-turn rounds
/// run, into FILE, and while `files.read` runs, into FILE`suffix` (the figures of that run
/// are then perturbed by perf itself).
fn perf_start(pids: &[u32], suffix: &str) -> Option<std::process::Child> {
    let out = std::env::var("BERTH_BENCH_PERF").ok()? + suffix;
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    let child = std::process::Command::new("perf")
        .args(["record", "-F", "999", "--call-graph", "dwarf,16384", "-o", &out, "-p"])
        .arg(pids.join(","))
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("perf record");
    // perf needs a moment to attach.
    std::thread::sleep(Duration::from_millis(500));
    Some(child)
}

fn perf_stop(child: Option<std::process::Child>) {
    if let Some(mut child) = child {
        let _ = std::process::Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status();
        let _ = child.wait();
    }
}

/// Backends of the cluster (for `perf record`).
fn children_of(root: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if stat_fields(&format!("/proc/{pid}/stat")).is_some_and(|f| f[1].parse::<u32>().ok() == Some(root)) {
            out.push(pid);
        }
    }
    out
}

/// One prepared session: a client of its own (sending and watching) on some replica.
struct Seat {
    client: Client,
    sub: berth_e2e::client::Subscription,
    session: String,
}

async fn seats(replicas: &[&TestServer], token: &str, workspaces: &[&str], n: usize) -> Vec<Seat> {
    let mut out = Vec::new();
    for i in 0..n {
        // Sessions alternate between workspaces, clients between replicas, so that half the
        // watchers sit on the replica that does not hold their worker.
        let server = replicas[(i / workspaces.len()) % replicas.len()];
        let mut client = Client::authed(&server.ws_url(), token).await.expect("client");
        let session = session(&mut client, workspaces[i % workspaces.len()]).await;
        let sub = client.subscribe("session.watch", json!({"sessionId": session, "after": 0}));
        out.push(Seat { client, sub, session });
    }
    out
}

/// All seats send at once; each turn's wall time is its `session.send` until `turn.ended`
/// at its watcher (ms).
async fn concurrent_round(seats: Vec<Seat>, mock: &MockProvider) -> (Vec<f64>, Vec<Seat>) {
    let (walls, seats, _) = concurrent_round_timed(seats, mock).await;
    (walls, seats)
}

/// When a turn's milestones reached its client (ms after `session.send`): the answer,
/// `turn.started`, the first and last `model.delta`, `turn.ended`.
#[derive(Default, Clone, Copy)]
struct Milestones([f64; 5]);

/// [`concurrent_round`], with each turn's milestones.
async fn concurrent_round_timed(seats: Vec<Seat>, mock: &MockProvider) -> (Vec<f64>, Vec<Seat>, Vec<Milestones>) {
    for _ in 0..seats.len() {
        mock.push(script());
    }
    let gate = std::sync::Arc::new(tokio::sync::Barrier::new(seats.len()));
    let tasks: Vec<_> = seats
        .into_iter()
        .map(|mut seat| {
            let gate = gate.clone();
            tokio::spawn(async move {
                while seat.sub.items.try_recv().is_ok() {}
                gate.wait().await;
                let t0 = Instant::now();
                let sent = async {
                    let r = seat
                        .client
                        .call("session.send", json!({"sessionId": seat.session, "prompt": "hi"}))
                        .await;
                    (r, ms(t0.elapsed()))
                };
                let mut marks = Milestones::default();
                let ended = async {
                    loop {
                        let item = tokio::time::timeout(Duration::from_secs(120), seat.sub.items.recv())
                            .await
                            .expect("turn within 120 s")
                            .expect("subscription open");
                        let at = ms(t0.elapsed());
                        match item["type"].as_str() {
                            Some("turn.started") => marks.0[1] = at,
                            Some("model.delta") => {
                                if marks.0[2] == 0.0 {
                                    marks.0[2] = at;
                                }
                                marks.0[3] = at;
                            }
                            Some("turn.ended") => {
                                assert_eq!(item["state"], "completed", "turn failed: {item}");
                                marks.0[4] = at;
                                return;
                            }
                            _ => {}
                        }
                    }
                };
                let ((r, answered), ()) = tokio::join!(sent, ended);
                r.expect("session.send");
                marks.0[0] = answered;
                (marks.0[4], seat, marks)
            })
        })
        .collect();
    let mut walls = Vec::new();
    let mut back = Vec::new();
    let mut marks = Vec::new();
    for t in tasks {
        let (wall, seat, m) = t.await.expect("turn task");
        walls.push(wall);
        back.push(seat);
        marks.push(m);
    }
    (walls, back, marks)
}

/// The median of each milestone over `marks`, as a line of the bench's output.
fn milestones_line(marks: &[Milestones]) -> String {
    let names = ["answered", "turn.started", "first delta", "last delta", "turn.ended"];
    let parts: Vec<String> = (0..5)
        .map(|i| {
            let mut v: Vec<f64> = marks.iter().map(|m| m.0[i]).collect();
            let (p10, p90) = (quantile(&mut v, 0.1), quantile(&mut v, 0.9));
            format!("{} {p10:.1}/{:.1}/{p90:.1}", names[i], median(&mut v))
        })
        .collect();
    parts.join(", ")
}

async fn concurrency(table: &mut Table) {
    const ONE_WORKER: usize = 50;
    const ROUNDS: usize = 3;
    const SPREAD: usize = 200;
    // A provider of its own, on its own thread, so that its CPU is measured apart.
    let mock = &isolated_mock();
    let database_url = fresh_database().await;
    database_settings(&database_url).await;
    // Each replica's pool sized to the database's 2 cores (twice as many connections), as
    // an operator sizes it (docs/deploy.md, "Sizing the pool"); `BERTH_BENCH_POOL=N` to
    // compare. The default of 16 a replica made 32 backends contend for 2 cores.
    let pool = std::env::var("BERTH_BENCH_POOL").unwrap_or_else(|_| "4".into());
    println!("replicas' database pool: {pool} connections each");
    let env: Vec<(&str, &str)> = ENV
        .iter()
        .copied()
        .chain([("BERTH_DB_POOL_SIZE", pool.as_str())])
        .collect();
    let a = TestServer::start_with(&database_url, &mock.base_url(), &env)
        .await
        .expect("replica A");
    let b = TestServer::start_with(&database_url, &mock.base_url(), &env)
        .await
        .expect("replica B");
    let token = a.admin_token();
    let (dir_a, dir_b) = (scratch_dir("bench-repo"), scratch_dir("bench-ws-b"));
    let repo_files = git_repo(&dir_a);
    let wa = spawn_worker(&a, "bench-a", "wa", &dir_a).await;
    let wb = spawn_worker(&b, "bench-b", "wb", &dir_b).await;
    let ws_a = online_workspace(&a, &token, "bench-a").await;
    let ws_b = online_workspace(&a, &token, "bench-b").await;
    let (pid_a, pid_b) = (a.child.id().expect("pid"), b.child.id().expect("pid"));
    let (pid_wa, pid_wb) = (wa.id().expect("pid"), wb.id().expect("pid"));
    let postmaster = postmaster(&database_url).await;
    // Replica B, worker B and their clients are idle in the first two rows: counting them
    // adds only their idle ticks.
    let meters = Meters {
        replicas: vec![pid_a, pid_b],
        workers: vec![pid_wa, pid_wb],
        postmaster,
    };
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    let load = || {
        std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };
    println!("load average before the concurrency rows: {}", load());

    // The single turn alone, in this run: one session on worker A, client on replica A.
    let mut alone = seats(&[&a], &token, &[&ws_a], 1).await;
    let mut single = Vec::new();
    let mut single_marks = Vec::new();
    let mut single_cpu = Cpu::default();
    for i in 0..13 {
        let c0 = meters.read();
        let (w, back, m) = concurrent_round_timed(alone, mock).await;
        alone = back;
        if i >= 3 {
            single.extend(w);
            single_marks.extend(m);
            single_cpu = single_cpu.plus(&meters.read().minus(&c0));
        }
    }
    let single_median = median(&mut single);
    println!(
        "median milestones of one turn alone (ms after `session.send`, at its client): {}",
        milestones_line(&single_marks)
    );
    table.add(
        "CPU per turn, one turn alone (10 turns; user + system)",
        single_cpu.per_turn(10),
        "—".into(),
        "—".into(),
        "report",
        None,
    );

    // 50 at once on worker A (clients on replica A, which holds it).
    let mut seated = seats(&[&a], &token, &[&ws_a], ONE_WORKER).await;
    let (_, back) = concurrent_round(seated, mock).await; // warm-up
    seated = back;
    let mut walls = Vec::new();
    let statements = statements_start(&database_url).await;
    let perf = perf_start(&[&[pid_a, pid_wa][..], &children_of(postmaster)].concat(), "");
    let c0 = meters.read();
    let mut marks = Vec::new();
    for _ in 0..ROUNDS {
        let (w, back, m) = concurrent_round_timed(seated, mock).await;
        seated = back;
        walls.extend(w);
        marks.extend(m);
    }
    let cpu = meters.read().minus(&c0);
    perf_stop(perf);
    if let Some(c) = statements {
        statements_print(&c, ONE_WORKER * ROUNDS).await;
    }
    drop(seated);
    let (m, p99) = (median(&mut walls), quantile(&mut walls, 0.99));
    table.add(
        &format!("{ONE_WORKER} concurrent turns on one worker ({ROUNDS} rounds; median / p99 turn wall time)"),
        format!("{m:.1} / {p99:.1} ms"),
        format!("{single_median:.1} ms one turn alone (median of 10)"),
        format!("{:.2}× / {:.2}×", m / single_median, p99 / single_median),
        "median ≤ 2×, p99 ≤ 3×",
        Some(m <= 2.0 * single_median && p99 <= 3.0 * single_median),
    );
    let turns = ONE_WORKER * ROUNDS;
    table.add(
        &format!("CPU per turn, {ONE_WORKER} concurrent on one worker (user + system)"),
        cpu.per_turn(turns),
        "—".into(),
        format!(
            "{ONE_WORKER} turns × {:.2} ms / {cores} cores = {:.1} ms of CPU a round",
            ms(cpu.total()) / turns as f64,
            ms(cpu.total()) / ROUNDS as f64 / cores as f64
        ),
        "report",
        None,
    );
    println!(
        "median milestones at {ONE_WORKER} at once (ms after `session.send`, at its client): {}",
        milestones_line(&marks)
    );
    println!("load average after the {ONE_WORKER}-turn rounds: {}", load());

    // 200 at once across both workers and both replicas.
    let mut seated = seats(&[&a, &b], &token, &[&ws_a, &ws_b], SPREAD).await;
    let (_, back) = concurrent_round(seated, mock).await; // warm-up
    seated = back;
    let c0 = meters.read();
    let (mut walls, back) = concurrent_round(seated, mock).await;
    let cpu = meters.read().minus(&c0);
    drop(back);
    let (m, p99) = (median(&mut walls), quantile(&mut walls, 0.99));
    table.add(
        &format!("{SPREAD} concurrent sessions across 2 workers and 2 replicas (median / p99 turn wall time)"),
        format!("{m:.1} / {p99:.1} ms"),
        format!("{single_median:.1} ms one turn alone (median of 10)"),
        format!("{:.2}× / {:.2}×", m / single_median, p99 / single_median),
        "median ≤ 2×, p99 ≤ 3×",
        Some(m <= 2.0 * single_median && p99 <= 3.0 * single_median),
    );
    table.add(
        &format!("CPU per turn, {SPREAD} concurrent (both replicas, both workers; user + system)"),
        cpu.per_turn(SPREAD),
        "—".into(),
        format!(
            "{SPREAD} turns × {:.2} ms / {cores} cores = {:.1} ms of CPU",
            ms(cpu.total()) / SPREAD as f64,
            ms(cpu.total()) / cores as f64
        ),
        "report",
        None,
    );
    println!("load average after the {SPREAD}-turn round: {}", load());

    git_status(table, &a, &token, &ws_a, &dir_a, repo_files).await;
    files_read(table, &b, &token, &ws_a, &dir_a, [pid_wa, pid_a, pid_b]).await;
    stop(a).await;
    stop(b).await;
}

/// The `git.status` and `files.read` rows alone: two replicas, one worker on A holding the
/// repository, as in [`concurrency`] but without its turns.
async fn workspace_rows(table: &mut Table, mock: &MockProvider) {
    let database_url = fresh_database().await;
    let a = TestServer::start_with(&database_url, &mock.base_url(), ENV)
        .await
        .expect("replica A");
    let b = TestServer::start_with(&database_url, &mock.base_url(), ENV)
        .await
        .expect("replica B");
    let token = a.admin_token();
    let dir = scratch_dir("bench-repo");
    let files = git_repo(&dir);
    let w = spawn_worker(&a, "bench-a", "wa", &dir).await;
    let ws = online_workspace(&a, &token, "bench-a").await;
    git_status(table, &a, &token, &ws, &dir, files).await;
    let pids = [
        w.id().expect("pid"),
        a.child.id().expect("pid"),
        b.child.id().expect("pid"),
    ];
    files_read(table, &b, &token, &ws, &dir, pids).await;
    stop(a).await;
    stop(b).await;
}

/// A committed repository of `FILES` small files in 200 directories, then a few changes
/// (modified, deleted, untracked) so that the status has something to say.
fn git_repo(dir: &std::path::Path) -> usize {
    const FILES: usize = 20_000;
    for i in 0..FILES {
        let sub = dir.join(format!("d{:03}", i % 200));
        if i < 200 {
            std::fs::create_dir_all(&sub).expect("dir");
        }
        std::fs::write(sub.join(format!("f{i}.txt")), format!("file {i}\n")).expect("file");
    }
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=bench", "-c", "user.email=bench@localhost"])
            .args(args)
            .current_dir(dir)
            .output()
            .expect("git");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    git(&["init", "-q"]);
    git(&["add", "-A"]);
    git(&["commit", "-q", "-m", "bench"]);
    for i in 0..10 {
        std::fs::write(dir.join(format!("d{:03}/f{i}.txt", i % 200)), "changed\n").expect("modify");
    }
    std::fs::remove_file(dir.join("d010/f10.txt")).expect("delete");
    for i in 0..5 {
        std::fs::write(dir.join(format!("new{i}.txt")), "new\n").expect("untracked");
    }
    FILES
}

async fn git_status(
    table: &mut Table,
    server: &TestServer,
    token: &str,
    workspace: &str,
    dir: &std::path::Path,
    files: usize,
) {
    const N: usize = 15;
    let mut client = Client::authed(&server.ws_url(), token).await.expect("client");
    let sid = session(&mut client, workspace).await;
    let raw_once = || {
        let t0 = Instant::now();
        let out = std::process::Command::new("git")
            .args(["status", "--porcelain"])
            .current_dir(dir)
            .output()
            .expect("git status");
        assert!(out.status.success());
        (ms(t0.elapsed()), out.stdout.iter().filter(|b| **b == b'\n').count())
    };
    let (mut berth, mut raw) = (Vec::new(), Vec::new());
    let mut entries = (0, 0);
    for i in 0..N + 3 {
        let (r, lines) = raw_once();
        let t0 = Instant::now();
        let st = client.ok("git.status", json!({"sessionId": sid})).await;
        let b = ms(t0.elapsed());
        if i >= 3 {
            raw.push(r);
            berth.push(b);
        }
        let count = |k: &str| st[k].as_array().map_or(0, Vec::len);
        entries = (count("staged") + count("worktree") + count("untracked"), lines);
    }
    let (b, r) = (median(&mut berth), median(&mut raw));
    println!(
        "  git.status entries: berth {}, git status --porcelain lines {}",
        entries.0, entries.1
    );
    table.add(
        &format!("`git.status` through the worker, {files}-file repository, warm (median of {N})"),
        format!("{b:.1} ms"),
        format!("{r:.1} ms `git status --porcelain`"),
        format!("{:.2}×", b / r),
        "≤ 1.0×",
        Some(b <= r),
    );
}

/// One frame of a `files.read` subscription as a careful client reads it: typed and
/// borrowed (a chunk's base64 is not copied out of the frame), fields it does not use skipped.
#[derive(serde::Deserialize)]
struct ReadFrame<'a> {
    /// The final answer's id (a response); absent on items.
    id: Option<u32>,
    #[serde(borrow)]
    params: Option<ReadParams<'a>>,
    #[serde(borrow)]
    error: Option<&'a serde_json::value::RawValue>,
}

#[derive(serde::Deserialize)]
struct ReadParams<'a> {
    id: u32,
    #[serde(borrow)]
    item: ReadItem<'a>,
}

/// `begin`, `chunk` or `end` (one flat struct: the fields of all three, by `type`).
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReadItem<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    size: Option<u64>,
    offset: Option<u64>,
    data_base64: Option<&'a str>,
    sha256: Option<&'a str>,
}

/// One `files.read` as a careful client does it, on its own WebSocket: every frame parsed
/// typed and borrowed, offsets checked contiguous, each chunk's base64 decoded into one
/// buffer and fed to a SHA-256 that must match `end`'s. The file's bytes and the time to
/// `begin`.
async fn read_checked(ws: &mut Ws, id: u32, session: &str, path_b64: &str) -> (Vec<u8>, Duration) {
    use sha2::Digest;
    let t0 = Instant::now();
    let request = json!({"jsonrpc": "2.0", "id": id, "method": "files.read",
        "params": {"sessionId": session, "path": {"bytesBase64": path_b64}}});
    ws.send(Message::text(request.to_string())).await.expect("send");
    let mut data = Vec::new();
    let mut hasher = sha2::Sha256::new();
    let mut to_begin = Duration::ZERO;
    let mut ended = false;
    loop {
        let text = next_text(ws).await;
        let frame: ReadFrame = serde_json::from_str(&text).expect("a files.read frame");
        if let Some(e) = frame.error {
            panic!("files.read failed: {e}");
        }
        let Some(params) = frame.params else {
            assert_eq!(frame.id, Some(id), "answer of another request: {text}");
            assert!(ended, "files.read answered before its end item");
            return (data, to_begin);
        };
        assert_eq!(params.id, id);
        let item = params.item;
        match item.kind {
            "begin" => {
                to_begin = t0.elapsed();
                data.reserve_exact(item.size.expect("begin size") as usize);
            }
            "chunk" => {
                assert_eq!(item.offset, Some(data.len() as u64), "offsets not contiguous");
                let at = data.len();
                base64_simd::STANDARD
                    .decode_append(item.data_base64.expect("chunk data"), &mut data)
                    .expect("chunk base64");
                hasher.update(&data[at..]);
            }
            "end" => {
                assert_eq!(item.size, Some(data.len() as u64), "end size");
                let digest: String = hasher.clone().finalize().iter().map(|b| format!("{b:02x}")).collect();
                assert_eq!(item.sha256, Some(digest.as_str()), "end sha256");
                ended = true;
            }
            other => panic!("files.read: {other} {text}"),
        }
    }
}

/// CPU time of a process to the nanosecond: the sum of its threads' time on a CPU
/// (`/proc/<pid>/task/*/schedstat`), where `/proc/<pid>/stat` counts 10 ms ticks, too coarse
/// for a read of ~10 ms a process. A thread that exits takes its time with it (the tokio
/// pools keep theirs for 10 s, longer than a read).
fn thread_cpu(pid: u32) -> Duration {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Duration::ZERO;
    };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(ns)
}

/// `pids`: the worker, the replica holding it and the client's replica, whose CPU per read
/// is printed (and recorded by `perf` with `BERTH_BENCH_PERF=FILE`).
///
/// The row is a careful client's read ([`read_checked`]); a second row reports the same
/// read through the tests' client (a `serde_json::Value` tree of every item, handed between
/// tasks, offsets and digest not checked), interleaved with the first so both see the same
/// load.
async fn files_read(
    table: &mut Table,
    server: &TestServer,
    token: &str,
    workspace: &str,
    dir: &std::path::Path,
    pids: [u32; 3],
) {
    use base64::Engine;
    use sha2::Digest;
    // `BERTH_BENCH_READS=N`: more reads than the default 8, for comparing two builds.
    let n_reads: usize = std::env::var("BERTH_BENCH_READS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    const SIZE: usize = 8 << 20;
    let line = "files.read bench — naïve café ✓ 0123456789 abcdefghijklmnopqrstuvwxyz\n";
    let content = line.repeat(SIZE / line.len() + 1);
    let path = dir.join("big.txt");
    std::fs::write(&path, &content).expect("big file");
    let mut client = Client::authed(&server.ws_url(), token).await.expect("client");
    let sid = session(&mut client, workspace).await;
    let mut ws = ws_connect(&server.ws_url(), Some(token)).await;
    let b64 = base64::engine::general_purpose::STANDARD.encode("big.txt");
    let (mut berth, mut through_value, mut raw) = (Vec::new(), Vec::new(), Vec::new());
    let cpu = || {
        let mut c = pids.map(thread_cpu).to_vec();
        c.push(thread_cpu(std::process::id()));
        c
    };
    let add = |sum: &mut Vec<Duration>, before: &[Duration], after: &[Duration]| {
        sum.resize(after.len(), Duration::ZERO);
        for ((s, b), a) in sum.iter_mut().zip(before).zip(after) {
            *s += a.saturating_sub(*b);
        }
    };
    // A small file first: what a read costs before and besides its bytes (the routing
    // through both replicas to the worker and back).
    let cut = content.floor_char_boundary(1024);
    std::fs::write(dir.join("small.txt"), &content[..cut]).expect("small file");
    let small = base64::engine::general_purpose::STANDARD.encode("small.txt");
    let mut small_reads = Vec::new();
    for i in 0..40 {
        let t0 = Instant::now();
        let (bytes, _) = read_checked(&mut ws, 1000 + i, &sid, &small).await;
        assert_eq!(bytes, content.as_bytes()[..cut]);
        if i >= 10 {
            small_reads.push(ms(t0.elapsed()));
        }
    }
    println!(
        "  files.read of a 1 KiB file through the other replica: {:.2} ms (median of 30)",
        median(&mut small_reads)
    );
    let mut perf = None;
    let (mut cpu_checked, mut cpu_value) = (Vec::new(), Vec::new());
    let (mut to_begin, mut to_begin_value) = (Vec::new(), Vec::new());
    for i in 0..n_reads + 2 {
        if i == 2 {
            perf = perf_start(&[&pids[..], &[std::process::id()]].concat(), ".read");
        }
        let t0 = Instant::now();
        let data = std::fs::read(&path).expect("read");
        let digest = sha2::Sha256::digest(&data);
        let encoded = base64::engine::general_purpose::STANDARD.encode(&data);
        let r = t0.elapsed();
        std::hint::black_box((digest, encoded));

        let c0 = cpu();
        let t0 = Instant::now();
        let (bytes, begin) = read_checked(&mut ws, i as u32 + 1, &sid, &b64).await;
        let b = t0.elapsed();
        let c1 = cpu();
        assert!(
            bytes == content.as_bytes(),
            "read {} of {} bytes, or other bytes",
            bytes.len(),
            content.len()
        );

        // The tests' client: a `Value` tree per item.
        let t0 = Instant::now();
        let mut sub = client.subscribe("files.read", json!({"sessionId": sid, "path": {"bytesBase64": b64}}));
        let mut bytes = 0usize;
        let mut begin_value = Duration::ZERO;
        loop {
            let item = sub.next(60).await.expect("files.read item");
            match item["type"].as_str() {
                Some("chunk") => bytes += item["dataBase64"].as_str().map_or(0, str::len) * 3 / 4,
                Some("end") => break,
                Some("begin") => begin_value = t0.elapsed(),
                other => panic!("files.read: {other:?} {item}"),
            }
        }
        let v = t0.elapsed();
        let c2 = cpu();
        assert!(bytes + 4 >= content.len(), "read {bytes} of {}", content.len());
        if i >= 2 {
            raw.push(content.len() as f64 / r.as_secs_f64() / 1e6);
            berth.push(content.len() as f64 / b.as_secs_f64() / 1e6);
            through_value.push(content.len() as f64 / v.as_secs_f64() / 1e6);
            to_begin.push(ms(begin));
            to_begin_value.push(ms(begin_value));
            add(&mut cpu_checked, &c0, &c1);
            add(&mut cpu_value, &c1, &c2);
        }
    }
    perf_stop(perf);
    let per_read = |sum: &[Duration]| {
        sum.iter()
            .zip(["worker", "replica A", "replica B", "bench client"])
            .map(|(c, name)| format!("{name} {:.1} ms", ms(*c) / n_reads as f64))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "  files.read CPU per read (careful client): {}; first item (begin) after {:.1} ms (median)",
        per_read(&cpu_checked),
        median(&mut to_begin)
    );
    println!(
        "  files.read CPU per read (tests' Value-tree client): {}; first item (begin) after {:.1} ms (median)",
        per_read(&cpu_value),
        median(&mut to_begin_value)
    );
    let (b, v, r) = (median(&mut berth), median(&mut through_value), median(&mut raw));
    table.add(
        &format!(
            "`files.read` of an {} MiB file through the other replica (median of {n_reads}; a client that checks offsets, decodes and verifies the SHA-256)",
            SIZE >> 20
        ),
        format!("{b:.0} MB/s"),
        format!("{r:.0} MB/s read + SHA-256 + base64 in process"),
        format!("{:.2}×", b / r),
        "≥ 0.5×",
        Some(b >= 0.5 * r),
    );
    table.add(
        &format!(
            "`files.read`, the same, through the tests' `Value`-tree client (median of {n_reads}; no decoding, no digest check)"
        ),
        format!("{v:.0} MB/s"),
        format!("{r:.0} MB/s read + SHA-256 + base64 in process"),
        format!("{:.2}×", v / r),
        "report",
        None,
    );
}
