//! Benchmark: the CPU time a turn costs each process it crosses — the API tier (`berth
//! serve`), the worker (`berth worker`) and PostgreSQL (the postmaster and its children) —
//! for a text turn and for a turn with one tool call (`read_file`), one after another and
//! 50 at once (50 sessions, one turn each, sent together).
//!
//! `cargo build --release -p berth && cargo bench -p berth-e2e --bench cpu`
//! (runs `target/release/berth` as child processes, like the tests do). CPU is user + system
//! time from `/proc/<pid>/stat` (clock ticks) before and after; a row is
//! (after − before) / turns. Prints one Markdown table; asserts nothing about time.
//! `BERTH_BENCH_TURNS=N`: turns one after another (default 100); `BERTH_BENCH_ROUNDS=N`:
//! rounds of 50 at once (default 4); `BERTH_BENCH_STATEMENTS=1`: statements per turn from
//! `pg_stat_statements` (the test cluster must load it: `BERTH_TEST_PG_SETTINGS=
//! "shared_preload_libraries=pg_stat_statements"`; it costs PostgreSQL CPU of its own).
//!
//! One more row, optional: Codex's `codex app-server` running the same text turns one after
//! another (see `cpu/codex.rs`: `BERTH_BENCH_CODEX=/path/to/codex`, or the npm package under
//! `/var/tmp/berth-codex`; skipped with a line saying why otherwise).
//! `BERTH_BENCH_ONLY=codex`: that row alone, without starting Berth.

use std::time::{Duration, Instant};

use berth_e2e::{
    Client, MockProvider, Part, Reply, TestServer, TestWorker,
    client::Subscription,
    harness::{db, fresh_database, scratch_dir},
    procstat::{clock_ticks, cpu_ticks, pid_stat, tree_ticks},
};
use serde_json::{Value, json};

#[path = "cpu/codex.rs"]
mod codex;

/// Limits raised so that the bench measures CPU, not admission control; logs at `info`.
const ENV: &[(&str, &str)] = &[
    ("RUST_LOG", "info"),
    ("BERTH_RATE_PER_SEC", "1000000"),
    ("BERTH_RATE_BURST", "1000000"),
    ("BERTH_MAX_CONNECTIONS_PER_CREDENTIAL", "100000"),
    ("BERTH_MAX_SUBSCRIPTIONS", "100000"),
    ("BERTH_MODEL_MAX_CONCURRENT", "100000"),
    ("BERTH_MODEL_RATE_PER_MIN", "100000000"),
    // Sized to the database's 2 cores, as in the latency bench's concurrency rows.
    ("BERTH_DB_POOL_SIZE", "4"),
];

const AT_ONCE: usize = 50;
/// The tool call's id: a request that carries it is the turn's second step.
const CALL_ID: &str = "call_bench_read";

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Text,
    Tool,
}

/// The text answer: six chunks 5 ms apart, as in the latency bench.
fn text_reply() -> Reply {
    let mut parts = Vec::new();
    for i in 0..6 {
        parts.push(Part::Delay(5));
        parts.push(Part::Text(format!("chunk {i} ")));
    }
    parts.push(Part::Usage {
        prompt: 10,
        completion: 5,
    });
    Reply::Stream(parts)
}

/// One reply of a tool turn, whichever step asks: the `read_file` call first, the text
/// answer once the request carries the call's result.
fn tool_turn_reply() -> Reply {
    Reply::computed(|body: &Value| {
        if body.to_string().contains(CALL_ID) {
            text_reply()
        } else {
            Reply::Stream(vec![
                Part::tool_call(0, CALL_ID, "read_file", &json!({"path": "README.md"}), 64),
                Part::Usage {
                    prompt: 20,
                    completion: 7,
                },
            ])
        }
    })
}

fn script(mock: &MockProvider, kind: Kind, turns: usize) {
    for _ in 0..turns {
        match kind {
            Kind::Text => mock.push(text_reply()),
            Kind::Tool => {
                mock.push(tool_turn_reply());
                mock.push(tool_turn_reply());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// /proc

struct Procs {
    api: u32,
    worker: u32,
    postmaster: u32,
}

/// Clock ticks used so far: API tier, worker, PostgreSQL.
#[derive(Clone, Copy, Default)]
struct Cpu([u64; 3]);

impl Procs {
    fn read(&self) -> Cpu {
        Cpu([cpu_ticks(self.api), cpu_ticks(self.worker), tree_ticks(self.postmaster)])
    }
}

impl Cpu {
    fn since(&self, before: &Cpu) -> Cpu {
        Cpu(std::array::from_fn(|i| self.0[i].saturating_sub(before.0[i])))
    }

    fn plus(&self, o: &Cpu) -> Cpu {
        Cpu(std::array::from_fn(|i| self.0[i] + o.0[i]))
    }

    /// Milliseconds per turn, for each process.
    fn per_turn(&self, turns: usize) -> [f64; 3] {
        std::array::from_fn(|i| self.0[i] as f64 * 1000.0 / clock_ticks() / turns as f64)
    }
}

// ---------------------------------------------------------------------------------------
// Turns

/// One prepared session: a client of its own, sending and watching.
struct Seat {
    client: Client,
    sub: Subscription,
    session: String,
}

/// Where the turns run: the API tier, a credential, the worker's workspace.
struct Workspace<'a> {
    server: &'a TestServer,
    token: &'a str,
    id: &'a str,
}

async fn seats(to: &Workspace<'_>, n: usize) -> Vec<Seat> {
    let mut out = Vec::new();
    for _ in 0..n {
        let mut client = Client::authed(&to.server.ws_url(), to.token).await.expect("client");
        let s = client.ok("session.create", json!({"workspaceId": to.id})).await;
        let session = s["sessionId"].as_str().expect("sessionId").to_string();
        let sub = client.subscribe("session.watch", json!({"sessionId": session, "after": 0}));
        out.push(Seat { client, sub, session });
    }
    out
}

/// Send one turn on `seat` and wait for its `turn.ended` at the seat's watcher; checks that
/// it completed and, for a tool turn, that `read_file` completed. Returns its wall time (ms).
async fn turn(seat: &mut Seat, kind: Kind) -> f64 {
    let t0 = Instant::now();
    seat.client
        .call("session.send", json!({"sessionId": seat.session, "prompt": "hi"}))
        .await
        .expect("session.send");
    let mut tool_done = false;
    loop {
        let item = seat.sub.next(120).await.expect("turn within 120 s");
        match item["type"].as_str() {
            Some("tool.ended") => {
                assert_eq!(item["rows"][0]["tool"]["status"], "completed", "read_file: {item}");
                tool_done = true;
            }
            Some("turn.ended") => {
                assert_eq!(item["state"], "completed", "turn failed: {item}");
                assert!(kind == Kind::Text || tool_done, "the tool turn ran no tool");
                return t0.elapsed().as_secs_f64() * 1000.0;
            }
            _ => {}
        }
    }
}

/// `turns` sessions, one turn each, one after another. CPU and the turns' wall times.
async fn sequential(
    procs: &Procs,
    mock: &MockProvider,
    to: &Workspace<'_>,
    kind: Kind,
    turns: usize,
    stats: &mut Statements,
) -> (Cpu, Vec<f64>) {
    let mut seated = seats(to, turns).await;
    script(mock, kind, turns);
    let mut walls = Vec::new();
    stats.open().await;
    let before = procs.read();
    for seat in &mut seated {
        walls.push(turn(seat, kind).await);
    }
    let cpu = procs.read().since(&before);
    stats.close().await;
    (cpu, walls)
}

/// `rounds` rounds of [`AT_ONCE`] sessions, one turn each, sent together.
async fn at_once(
    procs: &Procs,
    mock: &MockProvider,
    to: &Workspace<'_>,
    kind: Kind,
    rounds: usize,
    stats: &mut Statements,
) -> (Cpu, Vec<f64>) {
    let mut cpu = Cpu::default();
    let mut walls = Vec::new();
    for _ in 0..rounds {
        let seated = seats(to, AT_ONCE).await;
        script(mock, kind, AT_ONCE);
        let gate = std::sync::Arc::new(tokio::sync::Barrier::new(AT_ONCE + 1));
        let tasks: Vec<_> = seated
            .into_iter()
            .map(|mut seat| {
                let gate = gate.clone();
                tokio::spawn(async move {
                    gate.wait().await;
                    (turn(&mut seat, kind).await, seat)
                })
            })
            .collect();
        stats.open().await;
        let before = procs.read();
        gate.wait().await;
        let mut done = Vec::new();
        for t in tasks {
            let (wall, seat) = t.await.expect("turn task");
            walls.push(wall);
            done.push(seat);
        }
        cpu = cpu.plus(&procs.read().since(&before));
        stats.close().await;
        drop(done);
    }
    (cpu, walls)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `BERTH_BENCH_STATEMENTS=1`: the statements sent inside the CPU windows
/// (`pg_stat_statements`, reset as each window opens and read as it closes).
#[derive(Default)]
struct Statements {
    db: Option<tokio_postgres::Client>,
    /// Query → (calls, execution ms), summed over the windows since the last print.
    seen: std::collections::HashMap<String, (i64, f64)>,
}

impl Statements {
    async fn start(database_url: &str) -> Statements {
        if std::env::var_os("BERTH_BENCH_STATEMENTS").is_none() {
            return Statements::default();
        }
        let c = db(database_url).await;
        match c
            .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .await
        {
            Ok(()) => Statements {
                db: Some(c),
                ..Statements::default()
            },
            Err(e) => {
                println!("pg_stat_statements unavailable (set BERTH_TEST_PG_SETTINGS): {e}");
                Statements::default()
            }
        }
    }

    async fn open(&self) {
        if let Some(c) = &self.db {
            c.batch_execute("SELECT pg_stat_statements_reset()")
                .await
                .expect("reset");
        }
    }

    async fn close(&mut self) {
        let Some(c) = &self.db else { return };
        let rows = c
            .query(
                "SELECT calls, total_exec_time, left(regexp_replace(query, '\\s+', ' ', 'g'), 110)
                   FROM pg_stat_statements
                  WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                    AND query NOT LIKE '%pg_stat_statements%'",
                &[],
            )
            .await
            .expect("pg_stat_statements");
        for r in rows {
            let e = self.seen.entry(r.get(2)).or_default();
            e.0 += r.get::<_, i64>(0);
            e.1 += r.get::<_, f64>(1);
        }
    }

    /// Statements per turn over the windows since the last print, the most called first.
    fn print(&mut self, what: &str, turns: usize) {
        if self.db.is_none() {
            return;
        }
        let mut rows: Vec<_> = self.seen.drain().collect();
        rows.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(b.1.1.total_cmp(&a.1.1)));
        let n = turns as f64;
        let (mut calls, mut exec) = (0i64, 0.0);
        println!("\n{what}: statements per turn (calls, exec ms; query)");
        for (q, (k, e)) in &rows {
            calls += k;
            exec += e;
            println!("{:6.2} {:7.3} | {q}", *k as f64 / n, e / n);
        }
        println!(
            "all: {:.1} statements, {:.3} ms execution a turn",
            calls as f64 / n,
            exec / n
        );
    }
}

/// The Codex row (its CPU, one process tree, in the API tier column), or a line saying why
/// it was skipped. Never fails the bench.
async fn codex_row(turns: usize, dir: &std::path::Path) -> String {
    match codex::measure(turns, text_reply, dir).await {
        Ok(m) => format!(
            "| Codex app-server, text turn, one after another ({} turns; {}; Responses API, \
             {:.1} model requests a turn; the whole app-server) | {:.2} | — | — | {:.1} ms |",
            m.turns, m.version, m.requests, m.ms, m.wall
        ),
        Err(why) => format!("\nCodex app-server row skipped: {why}"),
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let env_n = |name: &str, default: usize| std::env::var(name).ok().and_then(|n| n.parse().ok()).unwrap_or(default);
    let turns = env_n("BERTH_BENCH_TURNS", 100);
    let rounds = env_n("BERTH_BENCH_ROUNDS", 4);
    let codex_turns = env_n("BERTH_BENCH_CODEX_TURNS", 50);
    if std::env::var("BERTH_BENCH_ONLY").as_deref() == Ok("codex") {
        let dir = scratch_dir("bench-cpu-codex");
        let row = codex_row(codex_turns, &dir).await;
        println!("\n| CPU per turn (user + system, ms) | API tier | worker | PostgreSQL | median turn wall time |");
        println!("|---|---|---|---|---|");
        println!("{row}");
        return;
    }
    let mock = MockProvider::start().await;
    let database_url = fresh_database().await;
    let server = TestServer::start_with(&database_url, &mock.base_url(), ENV)
        .await
        .expect("berth serve");
    let token = server.admin_token();
    let dir = scratch_dir("bench-cpu-ws");
    std::fs::write(dir.join("README.md"), "# bench\n\nA small file for `read_file`.\n").expect("README");
    let worker = TestWorker::start_with_env(
        &server,
        &server.worker_token().await,
        "bench",
        &dir,
        &[],
        &[("RUST_LOG", "info")],
    )
    .await
    .expect("berth worker");
    let ws = {
        let mut c = Client::authed(&server.ws_url(), &token).await.expect("client");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let list = c.ok("workspace.list", json!({})).await;
            if let Some(w) = list.as_array().and_then(|l| l.iter().find(|w| w["online"] == true)) {
                break w["workspaceId"].as_str().expect("id").to_string();
            }
            assert!(Instant::now() < deadline, "the workspace never came online");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let postmaster = {
        let c = db(&database_url).await;
        let backend: i32 = c
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .expect("backend pid")
            .get(0);
        pid_stat(backend as u32).expect("backend stat")[1]
            .parse()
            .expect("ppid")
    };
    let procs = Procs {
        api: server.child.id().expect("pid"),
        worker: worker.child.id().expect("pid"),
        postmaster,
    };
    println!(
        "clock ticks: {} a second; API tier pid {}, worker pid {}, postmaster pid {}",
        clock_ticks(),
        procs.api,
        procs.worker,
        procs.postmaster
    );

    let to = Workspace {
        server: &server,
        token: &token,
        id: &ws,
    };
    // Warm-up: pools, prepared statements, the worker's connection.
    let mut none = Statements::default();
    sequential(&procs, &mock, &to, Kind::Text, 5, &mut none).await;
    sequential(&procs, &mock, &to, Kind::Tool, 5, &mut none).await;
    at_once(&procs, &mock, &to, Kind::Text, 1, &mut none).await;

    // Idle: what the processes spend with no turn (heartbeats, timers, the checkpointer).
    let idle_secs = 5.0;
    let before = procs.read();
    tokio::time::sleep(Duration::from_secs_f64(idle_secs)).await;
    let idle = procs.read().since(&before).per_turn(1).map(|ms| ms / idle_secs);

    let mut stats = Statements::start(&database_url).await;
    let mut rows = Vec::new();
    for (kind, name) in [(Kind::Text, "text turn"), (Kind::Tool, "one-tool-call turn")] {
        let (cpu, mut seq_walls) = sequential(&procs, &mock, &to, kind, turns, &mut stats).await;
        stats.print(&format!("{name}, one after another"), turns);
        let seq_wall = median(&mut seq_walls);
        rows.push((
            format!("{name}, one after another ({turns} turns)"),
            cpu.per_turn(turns),
            None,
        ));
        let (cpu, mut walls) = at_once(&procs, &mock, &to, kind, rounds, &mut stats).await;
        let n = rounds * AT_ONCE;
        stats.print(&format!("{name}, {AT_ONCE} at once"), n);
        let wall = median(&mut walls);
        rows.push((
            format!("{name}, {AT_ONCE} at once ({rounds} rounds, {n} turns)"),
            cpu.per_turn(n),
            Some(format!(
                "{wall:.1} ms against {seq_wall:.1} ms one after another: {:.2}×",
                wall / seq_wall
            )),
        ));
    }

    let codex = codex_row(codex_turns, &dir).await;

    println!("\n| CPU per turn (user + system, ms) | API tier | worker | PostgreSQL | median turn wall time |");
    println!("|---|---|---|---|---|");
    println!(
        "| idle, per second of wall time | {:.2} | {:.2} | {:.2} | — |",
        idle[0], idle[1], idle[2]
    );
    for (name, ms, wall) in rows {
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {} |",
            ms[0],
            ms[1],
            ms[2],
            wall.unwrap_or_else(|| "—".into())
        );
    }
    println!("{codex}");
    println!(
        "\nGoals: API tier ≤ 1 ms and PostgreSQL ≤ 1 ms a text turn. One tick is {:.0} ms: \
         {:.2} ms a turn over {turns} turns.",
        1000.0 / clock_ticks(),
        1000.0 / clock_ticks() / turns as f64
    );
    drop(worker);
    let mut server = server;
    server.terminate().await;
}
