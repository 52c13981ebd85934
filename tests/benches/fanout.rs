//! Benchmark: history appends and their fan-out to watchers, against a raw PostgreSQL
//! baseline measured in the same run; and the server's memory while a watcher is stalled.
//!
//! `cargo build --release -p berth && cargo bench -p berth-e2e --bench fanout`
//! (the bench runs `target/release/berth` as a child process, like the tests do).
//! Prints ratios; asserts nothing about time.

use std::time::{Duration, Instant};

use berth_e2e::{Client, MockProvider, Stack};
use serde_json::json;

const N: usize = 400;

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;

    // Baseline: what one append costs PostgreSQL itself — a transaction that bumps a
    // per-session counter, inserts the event and notifies, observed by a LISTENer.
    let db = berth_e2e::harness::db(&stack.database_url).await;
    db.batch_execute(
        "CREATE TABLE bench_counter (id int PRIMARY KEY, n bigint); INSERT INTO bench_counter VALUES (1, 0);
         CREATE TABLE bench_events (n bigint PRIMARY KEY, payload jsonb)",
    )
    .await
    .unwrap();
    let (listener, mut lconn) = tokio_postgres::connect(&stack.database_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(m)) = futures_util::future::poll_fn(|cx| lconn.poll_message(cx))
            .await
            .map(Some)
            .unwrap_or(None)
        {
            if let tokio_postgres::AsyncMessage::Notification(_) = m {
                let _ = tx.send(Instant::now());
            }
        }
    });
    listener.batch_execute("LISTEN bench").await.unwrap();
    let started = Instant::now();
    let mut raw_latency = Duration::ZERO;
    for _ in 0..N {
        let t0 = Instant::now();
        db.batch_execute(
            "BEGIN; WITH c AS (UPDATE bench_counter SET n = n + 1 WHERE id = 1 RETURNING n)
             INSERT INTO bench_events SELECT n, '{\"title\": \"x\"}' FROM c; SELECT pg_notify('bench', 'x'); COMMIT",
        )
        .await
        .unwrap();
        let seen = rx.recv().await.unwrap();
        raw_latency += seen - t0;
    }
    let raw_total = started.elapsed();

    // Berth: the same append as an RPC (session.rename → session.titleChanged), delivered to
    // a watcher on another connection.
    let mut writer = stack.client(0).await;
    let sid = stack.session(&mut writer).await;
    let mut watcher = stack.client(0).await;
    let mut sub = watcher.subscribe("session.watch", json!({"sessionId": sid, "after": 1}));
    let started = Instant::now();
    let mut berth_latency = Duration::ZERO;
    let mut rpc_latency = Duration::ZERO;
    for i in 0..N {
        let t0 = Instant::now();
        writer
            .ok("session.rename", json!({"sessionId": sid, "title": format!("t{i}")}))
            .await;
        rpc_latency += t0.elapsed();
        loop {
            let item = sub.next(30).await.expect("delivered");
            if item["type"] == "session.titleChanged" {
                break;
            }
        }
        berth_latency += t0.elapsed();
    }
    let berth_total = started.elapsed();

    let per = |d: Duration| d.as_secs_f64() * 1e6 / N as f64;
    println!("appends: {N} sequential, each observed by a listener before the next");
    println!(
        "  raw postgres (txn + notify, seen by LISTEN): {:>8.0} µs/op",
        per(raw_latency)
    );
    println!(
        "  berth (rpc → append → watch delivery):       {:>8.0} µs/op",
        per(berth_latency)
    );
    println!(
        "    of which the rpc round trip:               {:>8.0} µs/op",
        per(rpc_latency)
    );
    println!(
        "  ratio berth/raw: {:.2}",
        berth_total.as_secs_f64() / raw_total.as_secs_f64()
    );

    // Memory: a stalled watcher while ~5 MiB of events are appended must not grow the
    // server by anything like that amount (its outbound queue is bounded).
    let pid = stack.servers[0].child.id().expect("server pid");
    let rss = || {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap().to_string();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    };
    let mut stalled = stack.client(0).await;
    let _stalled_sub = stalled.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    tokio::time::sleep(Duration::from_millis(200)).await;
    stalled.pause_reading(true);
    let before = rss();
    let title = "x".repeat(900);
    let mut appended = 0u64;
    let mut c = Client::authed(&stack.servers[0].ws_url(), &stack.token).await.unwrap();
    for i in 0..6000 {
        c.ok(
            "session.rename",
            json!({"sessionId": sid, "title": format!("{i}{title}")}),
        )
        .await;
        appended += title.len() as u64;
    }
    let after = rss();
    let growth = after.saturating_sub(before);
    println!("stalled watcher: {} MiB appended", appended >> 20);
    println!(
        "  server RSS {} MiB → {} MiB (growth {} MiB)",
        before >> 20,
        after >> 20,
        growth >> 20
    );
    println!("  ratio growth/appended: {:.2}", growth as f64 / appended as f64);
}
