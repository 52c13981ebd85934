//! Faults an operator will meet, behind the real nginx: a replica killed mid-turn, a
//! replica stopped with SIGTERM mid-turn, PostgreSQL restarted under load.

use std::time::Duration;

use berth_e2e::{
    Client, MockProvider, Part, Reply, Stack,
    client::{Subscription, code},
    harness::{eventually, scratch_dir},
    nginx::Nginx,
};
use berth_store::cluster::{ClusterOptions, PrivateCluster, create_database};
use serde_json::{Value, json};

fn nginx_installed() -> bool {
    if berth_e2e::nginx::nginx_bin().is_some() {
        return true;
    }
    // CI installs nginx (.ci/run); on a developer machine without it, say so loudly.
    assert!(std::env::var_os("CI").is_none(), "nginx must be installed in CI");
    eprintln!("SKIPPED: nginx is not installed (apt-get install nginx)");
    false
}

/// A `session.watch` that behaves like a client library: when its connection drops or the
/// watch ends, it reconnects through `url` and resumes after the last sequence it received.
/// Every event it receives must be the one right after the previous: no gap, no duplicate.
struct Resuming {
    url: String,
    token: String,
    session: String,
    client: Client,
    sub: Subscription,
    last: i64,
    events: Vec<Value>,
    resumes: usize,
}

impl Resuming {
    async fn open(url: &str, token: &str, session: &str) -> Resuming {
        let (client, sub) = Self::subscribe(url, token, session, 0).await.expect("watch");
        Resuming {
            url: url.to_string(),
            token: token.to_string(),
            session: session.to_string(),
            client,
            sub,
            last: 0,
            events: Vec::new(),
            resumes: 0,
        }
    }

    async fn subscribe(url: &str, token: &str, session: &str, after: i64) -> Option<(Client, Subscription)> {
        let mut client = Client::authed(url, token).await.ok()?;
        let sub = client.subscribe("session.watch", json!({"sessionId": session, "after": after}));
        Some((client, sub))
    }

    /// The replica this watch is on now.
    async fn replica(&mut self) -> String {
        self.client.ok("status", json!({})).await["replicaId"]
            .as_str()
            .expect("replicaId")
            .to_string()
    }

    /// Items until an event matching `pred` (returned), resuming as often as needed.
    async fn until(&mut self, secs: u64, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let item = tokio::select! {
                item = self.sub.items.recv() => item,
                _ = &mut self.sub.done => None,
                _ = tokio::time::sleep_until(deadline) => panic!(
                    "no matching event within {secs} s; events so far: {:?}",
                    self.events.iter().map(|e| &e["type"]).collect::<Vec<_>>()
                ),
            };
            let Some(item) = item else {
                self.resume(deadline).await;
                continue;
            };
            let Some(seq) = item.get("sequence").and_then(Value::as_i64) else {
                continue;
            };
            assert_eq!(
                seq,
                self.last + 1,
                "events arrive once each, in order: got {item} after {}",
                self.last
            );
            self.last = seq;
            self.events.push(item.clone());
            if pred(&item) {
                return item;
            }
        }
    }

    async fn resume(&mut self, deadline: tokio::time::Instant) {
        loop {
            assert!(tokio::time::Instant::now() < deadline, "the watch could not resume");
            if let Some((client, sub)) = Self::subscribe(&self.url, &self.token, &self.session, self.last).await {
                self.client = client;
                self.sub = sub;
                self.resumes += 1;
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Two replicas behind nginx, the worker connected through it: the stack, nginx, the
/// replicas' ids, and which replica holds the worker's connection (`lost`) and which not.
struct BehindNginx {
    stack: Stack,
    nginx: Nginx,
    ids: Vec<String>,
    lost: usize,
    survivor: usize,
}

async fn behind_nginx(mock: &MockProvider, env: &[(&str, &str)]) -> BehindNginx {
    let mut stack = Stack::start_with(mock, 2, env).await;
    let upstreams: Vec<&str> = stack.servers.iter().map(|s| s.addr.as_str()).collect();
    let nginx = Nginx::start(&upstreams).await.unwrap();
    let ids = replica_ids(&stack).await;
    stack.kill_worker().await;
    stack.start_worker_at(&nginx.addr).await;
    let lost = holder(&stack, &ids).await;
    BehindNginx {
        stack,
        nginx,
        ids,
        lost,
        survivor: 1 - lost,
    }
}

/// A watch of `sid` through nginx on each replica of `ids`, the first on replica `first`.
async fn watcher_per_replica(nginx: &Nginx, token: &str, sid: &str, ids: &[String], first: usize) -> Vec<Resuming> {
    let mut order: Vec<&String> = ids.iter().collect();
    order.swap(0, first);
    let mut watchers = Vec::new();
    for replica in order {
        let mut w = Resuming::open(&nginx.ws_url(), token, sid).await;
        while w.replica().await != *replica {
            w = Resuming::open(&nginx.ws_url(), token, sid).await;
        }
        watchers.push(w);
    }
    watchers
}

/// A new watch of `sid` through nginx, read up to sequence `last`.
async fn fresh_reader(nginx: &Nginx, token: &str, sid: &str, last: i64) -> Resuming {
    let mut fresh = Resuming::open(&nginx.ws_url(), token, sid).await;
    fresh.until(30, |e| e["sequence"] == last).await;
    fresh
}

/// The replica id of each server, in `stack.servers` order.
async fn replica_ids(stack: &Stack) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..stack.servers.len() {
        let mut c = stack.client(i).await;
        ids.push(
            c.ok("status", json!({})).await["replicaId"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    ids
}

/// Which server (index) holds the worker's live connection.
async fn holder(stack: &Stack, ids: &[String]) -> usize {
    let db = berth_e2e::harness::db(&stack.database_url).await;
    let row = db
        .query_one("SELECT replica_id FROM worker_presence", &[])
        .await
        .expect("one worker connection");
    let replica: String = row.get(0);
    ids.iter().position(|r| *r == replica).expect("a known replica")
}

/// The last user prompt of a model request.
fn prompt_of(request: &Value) -> String {
    request["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// A replica killed (kill -9) mid-turn with the worker connected to it through nginx: the
/// worker reconnects through nginx to the other replica, the turn it was running ends
/// `interrupted` and is not run again, the queued turn runs, and watchers that resume from
/// their last sequence see every event once.
async fn replica_killed_mid_turn() {
    let mock = MockProvider::start().await;
    let BehindNginx {
        mut stack,
        nginx,
        ids,
        lost,
        survivor,
    } = behind_nginx(&mock, &[]).await;
    let sid = stack.session(&mut stack.client(0).await).await;
    // A watcher on each replica, both through nginx, the first on the one that will be lost.
    let mut watchers = watcher_per_replica(&nginx, &stack.token, &sid, &ids, lost).await;

    mock.push(Reply::StreamThenHang(vec![Part::Text("half an answ".into())]));
    mock.push(Reply::text(&["second ", "answer"]));
    let mut sender = stack.client(survivor).await;
    let first = sender
        .ok("session.send", json!({"sessionId": sid, "prompt": "one"}))
        .await;
    let second = sender
        .ok("session.send", json!({"sessionId": sid, "prompt": "two"}))
        .await;
    assert_eq!(second["state"], "queued", "{second}");
    // Mid-turn: the worker is streaming the first answer.
    eventually(30, || async { (!mock.requests().is_empty()).then_some(()) })
        .await
        .expect("the first turn reached the model");

    let victim = &mut stack.servers[lost];
    victim.child.start_kill().unwrap();
    victim.child.wait().await.unwrap();

    for w in &mut watchers {
        // Well before the lost connection's presence could go stale (45 s) and be swept.
        let end = w
            .until(30, |e| e["type"] == "turn.ended" && e["turnId"] == first["turnId"])
            .await;
        assert_eq!(end["state"], "interrupted", "{end}");
        let end = w
            .until(60, |e| e["type"] == "turn.ended" && e["turnId"] == second["turnId"])
            .await;
        assert_eq!(end["state"], "completed", "the queue moves on: {end}");
    }
    assert!(watchers[0].resumes > 0, "the lost replica's watcher had to resume");

    // Never silently retried: the model saw the first prompt once, then the second.
    let prompts: Vec<String> = mock.requests().iter().map(prompt_of).collect();
    assert_eq!(prompts, ["one", "two"]);
    // The worker is on the survivor now, through nginx.
    assert_eq!(holder(&stack, &ids).await, survivor);

    // Both watchers saw exactly the stored history, and a fresh reader agrees.
    let fresh = fresh_reader(&nginx, &stack.token, &sid, watchers[0].last).await;
    let seqs = |w: &Resuming| w.events.iter().map(|e| e.to_string()).collect::<Vec<_>>();
    assert_eq!(seqs(&watchers[0]), seqs(&fresh));
    assert_eq!(seqs(&watchers[1]), seqs(&fresh));
    let mut c = stack.client(survivor).await;
    assert_eq!(c.history_bodies(&sid).await, ["one", "two", "second answer"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_killed_mid_turn_interrupts_the_turn_and_the_worker_moves_on_through_nginx() {
    if nginx_installed() {
        replica_killed_mid_turn().await;
    }
}

/// A rollout's SIGTERM of the replica holding the worker's connection, mid-turn, behind
/// nginx: the replica asks the worker to reconnect (`worker.reconnect`), the worker connects
/// through nginx to the other replica and carries its running turn over (`worker.release`,
/// `worker.carry`), the turn finishes there — its tool call, which was running during the
/// move, and the model's answer after it — and the queued turn runs; the replica exits by
/// itself, and watchers on both replicas see the whole history once, without a gap.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_mid_turn_hands_the_turn_over_to_another_replica() {
    if nginx_installed() {
        hand_over(false).await;
    }
}

/// The same with the turn waiting for an approval during the move: the worker asks again on
/// the new connection, and the answer given afterwards through the other replica reaches it.
#[tokio::test(flavor = "multi_thread")]
async fn a_turn_waiting_for_approval_survives_the_hand_over() {
    if nginx_installed() {
        hand_over(true).await;
    }
}

/// A rollout's SIGTERM of the replica holding the worker's connection while a `files.read`
/// through the other replica is mid-file: the read arrives whole, since the worker's old
/// connection finishes the calls it has before it closes and the draining replica waits for
/// them; a call made after the move goes to the worker's new connection.
#[tokio::test(flavor = "multi_thread")]
async fn a_file_read_through_the_other_replica_survives_the_hand_over() {
    if !nginx_installed() {
        return;
    }
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let mock = MockProvider::start().await;
    let BehindNginx {
        mut stack,
        nginx: _nginx,
        ids,
        lost,
        survivor,
    } = behind_nginx(&mock, &[("BERTH_DRAIN_TIMEOUT_SECS", "30")]).await;
    let line = "moving — naïve café 0123456789\n";
    let content = line.repeat((48 << 20) / line.len() + 1).into_bytes();
    std::fs::write(stack.workspace_dir.join("big.txt"), &content).unwrap();
    let mut reader = stack.client(survivor).await;
    let sid = stack.session(&mut reader).await;
    let mut sub = reader.subscribe(
        "files.read",
        json!({"sessionId": sid, "path": {"bytesBase64": b64(b"big.txt")}}),
    );
    let begin = sub.next(60).await.expect("begin");
    assert_eq!(begin["type"], "begin", "{begin}");
    // The reader stops reading: the worker is held back mid-file by its credit.
    reader.pause_reading(true);
    let pid = stack.servers[lost].child.id().expect("running");
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let db = berth_e2e::harness::db(&stack.database_url).await;
    let (db, there) = (&db, &ids[survivor]);
    let moved = eventually(30, || async move {
        let n: i64 = db
            .query_one("SELECT count(*) FROM worker_presence WHERE replica_id = $1", &[there])
            .await
            .unwrap()
            .get(0);
        (n > 0).then_some(())
    })
    .await;
    assert!(moved.is_some(), "the worker connected to the other replica");
    // A call made now is answered, while the read waits.
    let mut other = stack.client(survivor).await;
    let listed = other.ok("files.list", json!({"sessionId": sid})).await;
    assert!(listed.to_string().contains(&b64(b"big.txt")), "{listed}");

    reader.pause_reading(false);
    let mut got = Vec::new();
    let end = loop {
        let item = sub
            .next(60)
            .await
            .unwrap_or_else(|| panic!("the read ended after {} of {} bytes", got.len(), content.len()));
        match item["type"].as_str() {
            Some("chunk") => {
                assert_eq!(item["offset"].as_u64().unwrap(), got.len() as u64);
                got.extend_from_slice(
                    &base64::engine::general_purpose::STANDARD
                        .decode(item["dataBase64"].as_str().unwrap())
                        .unwrap(),
                );
            }
            Some("end") => break item,
            other => panic!("unexpected {other:?}: {item}"),
        }
    };
    assert!(
        got == content,
        "the file arrives whole ({} of {} bytes)",
        got.len(),
        content.len()
    );
    use sha2::Digest as _;
    let sha: String = sha2::Sha256::digest(&content)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(end["sha256"], sha);
    let done = sub.done.await.unwrap();
    assert!(done.error.is_none(), "{:?}", done.error);
    let status = stack.servers[lost].terminate().await;
    assert!(status.success(), "the replica drains and exits by itself: {status}");
    assert_eq!(holder(&stack, &ids).await, survivor);
}

/// A rollout's SIGTERM of the replica holding the worker's connection while a client watches
/// a directory through the other replica: the watch goes on. It is opened again on the
/// worker's new connection, the client is told `changed` once for whatever changed during
/// the move (not a second `ready`), and changes after the move still reach it.
#[tokio::test(flavor = "multi_thread")]
async fn a_files_watch_through_the_other_replica_survives_the_hand_over() {
    if !nginx_installed() {
        return;
    }
    let mock = MockProvider::start().await;
    let BehindNginx {
        mut stack,
        nginx: _nginx,
        ids,
        lost,
        survivor,
    } = behind_nginx(&mock, &[("BERTH_DRAIN_TIMEOUT_SECS", "15")]).await;
    let mut watcher = stack.client(survivor).await;
    let sid = stack.session(&mut watcher).await;
    let mut sub = watcher.subscribe("files.watch", json!({"sessionId": sid}));
    let ready = sub.next(60).await.expect("ready");
    assert_eq!(ready["type"], "ready", "{ready}");
    assert_eq!(
        holder(&stack, &ids).await,
        lost,
        "the worker is on the replica that drains"
    );

    let status = stack.servers[lost].terminate().await;
    assert!(status.success(), "the replica drains and exits by itself: {status}");
    // Opened again on the new connection: one `changed` for the move, no second `ready`.
    let moved = sub.next(30).await.expect("the watch goes on after the move");
    assert_eq!(moved["type"], "changed", "{moved}");
    // And it still watches: a file made now is a change.
    std::fs::write(stack.workspace_dir.join("after-the-move.txt"), "x").unwrap();
    let changed = sub.next(30).await.expect("a change after the move reaches the watch");
    assert_eq!(changed["type"], "changed", "{changed}");
    // Closing it ends it with null, as before the move.
    watcher.ok("subscription.close", json!({"id": sub.id})).await;
    let done = sub.done.await.unwrap();
    assert!(done.error.is_none(), "{:?}", done.error);
    assert_eq!(holder(&stack, &ids).await, survivor);
}

async fn hand_over(approval: bool) {
    let mock = MockProvider::start().await;
    let BehindNginx {
        mut stack,
        nginx,
        ids,
        lost,
        survivor,
    } = behind_nginx(&mock, &[("BERTH_DRAIN_TIMEOUT_SECS", "15")]).await;
    let sid = stack
        .client(survivor)
        .await
        .ok(
            "session.create",
            json!({"workspaceId": stack.workspace_id, "autoApprove": !approval}),
        )
        .await["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    let mut watchers = watcher_per_replica(&nginx, &stack.token, &sid, &ids, lost).await;

    // The first turn runs a command that outlasts the move, then answers.
    let command = "touch started; sleep 4; echo slept-through-the-move";
    mock.push(Reply::tools(&[("c1", "shell", json!({"command": command}))], 8));
    mock.push(Reply::text(&["after ", "the move"]));
    mock.push(Reply::text(&["second ", "answer"]));
    let mut sender = stack.client(survivor).await;
    let first = sender
        .ok("session.send", json!({"sessionId": sid, "prompt": "one"}))
        .await;
    let second = sender
        .ok("session.send", json!({"sessionId": sid, "prompt": "two"}))
        .await;
    assert_eq!(second["state"], "queued", "{second}");
    let started = stack.workspace_dir.join("started");
    let interaction = if approval {
        let asked = watchers[1].until(30, |e| e["type"] == "interaction.requested").await;
        Some(asked["interaction"]["interactionId"].as_str().unwrap().to_string())
    } else {
        eventually(30, || {
            let started = started.clone();
            async move { started.exists().then_some(()) }
        })
        .await
        .expect("the command started");
        None
    };

    let status = stack.servers[lost].terminate().await;
    // A SIGKILL after the harness's wait would not be success.
    assert!(status.success(), "the replica drains and exits by itself: {status}");
    if let Some(iid) = interaction {
        assert!(!started.exists(), "the command waits for its approval");
        let answered = sender
            .ok(
                "session.respond",
                json!({"interactionId": iid, "answer": {"approved": true}}),
            )
            .await;
        assert_eq!(answered["state"], "answered");
    }

    for w in &mut watchers {
        let end = w
            .until(60, |e| e["type"] == "turn.ended" && e["turnId"] == first["turnId"])
            .await;
        assert_eq!(end["state"], "completed", "the turn survived the rollout: {end}");
        let end = w
            .until(60, |e| e["type"] == "turn.ended" && e["turnId"] == second["turnId"])
            .await;
        assert_eq!(end["state"], "completed", "{end}");
    }
    assert!(watchers[0].resumes > 0, "the drained replica's watcher had to resume");

    // Nothing was run twice: the model saw the first prompt, its tool result, then the second.
    let prompts: Vec<String> = mock.requests().iter().map(prompt_of).collect();
    assert_eq!(prompts, ["one", "one", "two"]);
    // The command's output, not its text (which names the words too): the result of the one
    // run that went on through the move.
    let second = &mock.requests()[1];
    let tool_result = second["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "tool"))
        .unwrap_or_else(|| panic!("no tool result in {second}"));
    let output = tool_result["content"].as_str().unwrap_or_default();
    assert!(
        output.contains("slept-through-the-move") && !output.contains("echo slept"),
        "{tool_result}"
    );
    assert_eq!(holder(&stack, &ids).await, survivor);
    let log = std::fs::read_to_string(&stack.servers[lost].log).unwrap();
    assert!(log.contains("turn released to move to another connection"), "{log}");

    // Both watchers saw exactly the stored history, and a fresh reader agrees.
    let fresh = fresh_reader(&nginx, &stack.token, &sid, watchers[0].last).await;
    // Each event once, in order, with the same rows (a tool call's row carries the status it
    // had when the event went out live, and its current one when read later: left out).
    let seqs = |w: &Resuming| {
        w.events
            .iter()
            .map(|e| {
                let bodies: Vec<&Value> = e["rows"].as_array().into_iter().flatten().map(|r| &r["body"]).collect();
                (
                    e["sequence"].clone(),
                    e["type"].clone(),
                    e["turnId"].clone(),
                    json!(bodies),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(seqs(&watchers[0]), seqs(&fresh));
    assert_eq!(seqs(&watchers[1]), seqs(&fresh));
    let mut c = stack.client(survivor).await;
    let rows = c.history(&sid).await;
    let result = rows
        .iter()
        .find(|r| r["kind"] == "toolResult")
        .expect("the tool's result is stored");
    assert!(result.to_string().contains("slept-through-the-move"), "{result}");
    let bodies = c.history_bodies(&sid).await;
    assert_eq!(bodies.first().map(String::as_str), Some("one"));
    assert!(bodies.iter().any(|b| b == "after the move"), "{bodies:?}");
    assert_eq!(bodies[bodies.len() - 2..], ["two", "second answer"]);
}

async fn status(url: &str) -> u16 {
    match reqwest::get(url).await {
        Ok(r) => r.status().as_u16(),
        Err(_) => 0,
    }
}

/// PostgreSQL restarted under load: requests fail fast with `unavailable` (never
/// `internal`), `/readyz` flips, and once the database is back every replica recovers by
/// itself — new pooled connections, LISTEN re-established with catch-up, turns dispatched.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_restarted_under_load_fails_fast_and_recovers_without_a_restart() {
    let mock = MockProvider::start().await;
    // A cluster of this test's own: the shared one serves the other tests.
    let dir = scratch_dir("pgrestart");
    let options = ClusterOptions {
        unsafe_no_fsync: true,
        ..ClusterOptions::default()
    };
    let start = {
        let (dir, options) = (dir.clone(), options.clone());
        move || {
            let (dir, options) = (dir.clone(), options.clone());
            tokio::task::spawn_blocking(move || PrivateCluster::start(&dir, &options).expect("cluster"))
        }
    };
    let mut cluster = start().await.unwrap();
    create_database(&cluster.url("postgres"), "berth", None).await.unwrap();
    let stack = Stack::start_on(cluster.url("berth"), &mock.base_url(), 2, &[]).await;
    let readyz: Vec<String> = stack
        .servers
        .iter()
        .map(|s| format!("http://{}/readyz", s.addr))
        .collect();

    // A watcher on replica 0 (which holds the worker); prompts go through replica 1.
    let mut c = stack.client(1).await;
    let sid = stack.session(&mut c).await;
    let mut watch = Resuming::open(&stack.servers[0].ws_url(), &stack.token, &sid).await;
    mock.push(Reply::text(&["before"]));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "one"})).await;
    let end = watch.until(30, |e| e["type"] == "turn.ended").await;
    assert_eq!(end["state"], "completed");

    // Load: a client on each replica reading the session in a loop, noting each outcome.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for server in &stack.servers {
        let (url, token) = (server.ws_url(), stack.token.clone());
        let mut client = Client::authed(&url, &token).await.unwrap();
        let (stop, sid) = (stop.clone(), sid.clone());
        load.push(tokio::spawn(async move {
            let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(20)).await;
                if client.is_closed() {
                    // Authenticating needs the database too: refused while it is down.
                    match Client::authed(&url, &token).await {
                        Ok(c) => client = c,
                        Err(_) => continue,
                    }
                }
                let outcome = match client.call_or_closed("session.get", json!({"sessionId": sid})).await {
                    None => continue,
                    Some(Ok(_)) => "ok".to_string(),
                    Some(Err(e)) => code(&e).to_string(),
                };
                *outcomes.entry(outcome).or_default() += 1;
            }
            outcomes
        }));
    }

    // Down: requests are refused as `unavailable`, and /readyz says so.
    cluster = tokio::task::spawn_blocking(move || {
        cluster.stop();
        cluster
    })
    .await
    .unwrap();
    for url in &readyz {
        let down = eventually(30, || async { (status(url).await == 503).then_some(()) }).await;
        assert!(down.is_some(), "{url} flips to 503 while the database is down");
    }
    let err = c
        .call("session.get", json!({"sessionId": sid}))
        .await
        .expect_err("no database, no answer");
    assert_eq!(code(&err), "unavailable", "{err}");

    // Back: within 10 s both replicas are ready and serve again, without a restart.
    drop(cluster);
    let _cluster = start().await.unwrap();
    for url in &readyz {
        let up = eventually(10, || async { (status(url).await == 200).then_some(()) }).await;
        assert!(up.is_some(), "{url} is ready again within 10 s of the database");
    }
    let served = eventually(10, || {
        let (url, token, sid) = (stack.servers[1].ws_url(), stack.token.clone(), sid.clone());
        async move {
            let mut c = Client::authed(&url, &token).await.ok()?;
            c.call("session.get", json!({"sessionId": sid})).await.ok()
        }
    })
    .await;
    assert!(served.is_some(), "requests are served again within 10 s");
    // An append right away: replica 0 may not be listening again yet, so its watcher gets
    // it by catch-up after LISTEN is back, and the worker's replica dispatches the turn.
    mock.push(Reply::text(&["after"]));
    let sent = eventually(10, || {
        let url = stack.servers[1].ws_url();
        let (token, sid) = (stack.token.clone(), sid.clone());
        async move {
            let mut c = Client::authed(&url, &token).await.ok()?;
            c.call("session.send", json!({"sessionId": sid, "prompt": "two"}))
                .await
                .ok()
        }
    })
    .await
    .expect("a prompt is accepted again");
    let end = watch
        .until(30, |e| e["type"] == "turn.ended" && e["turnId"] == sent["turnId"])
        .await;
    assert_eq!(end["state"], "completed", "{end}");
    assert!(
        stack.servers[0]
            .metrics()
            .await
            .lines()
            .any(|l| l.starts_with("berth_db_listen_reconnects_total") && !l.ends_with(" 0")),
        "replica 0's LISTEN connection was re-established"
    );

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in load {
        let outcomes = task.await.unwrap();
        assert!(
            outcomes.keys().all(|k| k == "ok" || k == "unavailable"),
            "a database outage is `unavailable`, never anything else: {outcomes:?}"
        );
        assert!(outcomes.contains_key("ok"), "{outcomes:?}");
    }
    let mut c = stack.client(0).await;
    assert_eq!(c.history_bodies(&sid).await, ["one", "before", "two", "after"]);
}
