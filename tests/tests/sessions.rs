//! Sessions, queue, history, watch and receipts: the complete semantics (issue 4), against
//! real processes, with two API replicas on one database where it matters.

use std::time::Duration;

use berth_e2e::{
    Client, MockProvider, Part, Reply, Stack,
    client::code,
    harness::{A_TOOL_TURN, event_types, eventually, metric},
};
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde_json::{Value, json};

fn is_turn_end(v: &Value) -> bool {
    v["type"] == "turn.ended"
}

/// Every watcher, whatever replica it is on and however often it reconnects, sees sequences
/// 1..N exactly once, in order.
#[tokio::test(flavor = "multi_thread")]
async fn watchers_see_every_sequence_once_across_replicas_and_reconnects() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    let mut writers = [stack.client(0).await, stack.client(1).await];
    let sid = stack.session(&mut writers[0]).await;

    struct Watcher {
        client: Client,
        sub: berth_e2e::client::Subscription,
        seen: Vec<i64>,
    }
    async fn open(stack: &Stack, replica: usize, sid: &str, after: i64) -> (Client, berth_e2e::client::Subscription) {
        let mut client = stack.client(replica).await;
        let sub = client.subscribe("session.watch", json!({"sessionId": sid, "after": after}));
        (client, sub)
    }
    fn drain(w: &mut Watcher) {
        while let Ok(item) = w.sub.items.try_recv() {
            if let Some(seq) = item["sequence"].as_i64() {
                w.seen.push(seq);
            }
        }
    }

    for seed in [7u64, 42, 2026] {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut watchers = Vec::new();
        for i in 0..4 {
            let (client, sub) = open(&stack, i % 2, &sid, 0).await;
            watchers.push(Watcher {
                client,
                sub,
                seen: Vec::new(),
            });
        }
        let mut renames = 0;
        for step in 0..60 {
            match rng.random_range(0..10) {
                0..=5 => {
                    let w = rng.random_range(0..2);
                    renames += 1;
                    writers[w]
                        .ok(
                            "session.rename",
                            json!({"sessionId": sid, "title": format!("t{seed}-{step}")}),
                        )
                        .await;
                }
                6 | 7 => {
                    // Disconnect a watcher and resume on a random replica from its last sequence.
                    let i = rng.random_range(0..watchers.len());
                    drain(&mut watchers[i]);
                    let last = watchers[i].seen.last().copied().unwrap_or(0);
                    let (client, sub) = open(&stack, rng.random_range(0..2), &sid, last).await;
                    let old = std::mem::replace(&mut watchers[i].client, client);
                    drop(old);
                    watchers[i].sub = sub;
                }
                8 => {
                    let w = rng.random_range(0..2);
                    let paused = rng.random_bool(0.5);
                    writers[w]
                        .ok("session.pause", json!({"sessionId": sid, "paused": paused}))
                        .await;
                }
                _ => tokio::time::sleep(Duration::from_millis(rng.random_range(0..20))).await,
            }
        }
        assert!(renames > 0);
        let last = writers[0].ok("session.get", json!({"sessionId": sid})).await["sequence"]
            .as_i64()
            .unwrap();
        for (i, w) in watchers.iter_mut().enumerate() {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            while w.seen.last().copied().unwrap_or(0) < last && tokio::time::Instant::now() < deadline {
                if let Ok(Some(item)) = tokio::time::timeout(Duration::from_millis(200), w.sub.items.recv()).await
                    && let Some(seq) = item["sequence"].as_i64()
                {
                    w.seen.push(seq);
                }
            }
            let expected: Vec<i64> = (1..=last).collect();
            assert_eq!(w.seen, expected, "seed {seed}, watcher {i}");
        }
    }
}

/// 50 concurrent sends with one operationId across two replicas make exactly one turn; a
/// retry after a lost response returns the same turn.
#[tokio::test(flavor = "multi_thread")]
async fn one_operation_id_makes_exactly_one_turn_across_replicas() {
    let mock = MockProvider::start().await;
    let mut stack = Stack::start(&mock, 2).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    // Keep the turn from running so that nothing but the receipt decides.
    stack.kill_worker().await;

    let mut tasks = Vec::new();
    for i in 0..50 {
        let url = stack.servers[i % 2].ws_url();
        let token = stack.token.clone();
        let sid = sid.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Client::authed(&url, &token).await.unwrap();
            c.call(
                "session.send",
                json!({"sessionId": sid, "prompt": "once", "operationId": "op-send-1"}),
            )
            .await
        }));
    }
    let mut turn_ids = std::collections::BTreeSet::new();
    let mut in_progress = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(v) => {
                turn_ids.insert(v["turnId"].as_str().unwrap().to_string());
            }
            Err(e) => {
                assert_eq!(code(&e), "operation-in-progress", "{e}");
                in_progress += 1;
            }
        }
    }
    assert!(turn_ids.len() <= 1, "one turn id at most: {turn_ids:?}");
    let turns = stack
        .sql_i64("SELECT count(*) FROM turns WHERE session_id = $1", &sid)
        .await;
    assert_eq!(turns, 1, "exactly one turn ({in_progress} answered in-progress)");

    // A retry after a dropped response: the original outcome, not a second turn.
    let retry = c
        .ok(
            "session.send",
            json!({"sessionId": sid, "prompt": "once", "operationId": "op-send-1"}),
        )
        .await;
    let original = turn_ids
        .iter()
        .next()
        .cloned()
        .unwrap_or_else(|| retry["turnId"].as_str().unwrap().to_string());
    assert_eq!(retry["turnId"], original.as_str());
    let retry_b = stack
        .client(1)
        .await
        .ok(
            "session.send",
            json!({"sessionId": sid, "prompt": "once", "operationId": "op-send-1"}),
        )
        .await;
    assert_eq!(retry_b, retry);
    assert_eq!(
        stack
            .sql_i64("SELECT count(*) FROM turns WHERE session_id = $1", &sid)
            .await,
        1
    );
    // Same id, other params: conflict. The stored receipt can be read back.
    let e = c
        .call(
            "session.send",
            json!({"sessionId": sid, "prompt": "twice", "operationId": "op-send-1"}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "operation-conflict");
    let receipt = c.ok("operation.receipt", json!({"operationId": "op-send-1"})).await;
    assert_eq!(receipt["state"], "done");
    assert_eq!(receipt["method"], "session.send");
    assert_eq!(receipt["result"]["turnId"], original.as_str());
    assert_eq!(
        c.ok("operation.receipt", json!({"operationId": "never-used"})).await,
        Value::Null
    );
    // A failed mutation's outcome is kept too: the retry gets the same error without work.
    let e = c
        .call(
            "session.rename",
            json!({"sessionId": "ses_nope", "title": "x", "operationId": "op-2"}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "not-found");
    let e2 = c
        .call(
            "session.rename",
            json!({"sessionId": "ses_nope", "title": "x", "operationId": "op-2"}),
        )
        .await
        .unwrap_err();
    assert_eq!(e2, e);
}

/// Queue: revisions guard edits; two racing clients → one wins, one `stale-revision`; an
/// offline worker holds turns with a notice, and they start when it comes back.
#[tokio::test(flavor = "multi_thread")]
async fn queue_revisions_pause_and_offline_worker() {
    let mock = MockProvider::start().await;
    let mut stack = Stack::start(&mock, 2).await;
    let mut a = stack.client(0).await;
    let mut b = stack.client(1).await;
    let sid = stack.session(&mut a).await;
    stack.kill_worker().await;
    let mut watch = a.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));

    let first = a.ok("session.send", json!({"sessionId": sid, "prompt": "first"})).await;
    assert_eq!(first["state"], "queued");
    assert_eq!(first["queueRevision"], 0);
    let notice = watch
        .until(10, |i| i["type"] == "session.notice")
        .await
        .expect("offline notice");
    let notice = notice.last().unwrap();
    assert_eq!(notice["code"], "workspace-offline");
    assert_eq!(notice["level"], "warning");
    assert_eq!(notice["params"]["workspaceId"], stack.workspace_id.as_str());
    let second = a
        .ok("session.send", json!({"sessionId": sid, "prompt": "second"}))
        .await;
    let third = a.ok("session.send", json!({"sessionId": sid, "prompt": "third"})).await;
    let (q1, q2, q3) = (
        first["queueId"].clone(),
        second["queueId"].clone(),
        third["queueId"].clone(),
    );

    // Race: both edit revision 0 of the same entry.
    let (ra, rb) = tokio::join!(
        a.call(
            "queue.update",
            json!({"sessionId": sid, "queueId": q2, "queueRevision": 0, "prompt": "from A"})
        ),
        b.call(
            "queue.update",
            json!({"sessionId": sid, "queueId": q2, "queueRevision": 0, "prompt": "from B"})
        ),
    );
    let (won, lost) = match (ra, rb) {
        (Ok(w), Err(l)) | (Err(l), Ok(w)) => (w, l),
        other => panic!("exactly one must win: {other:?}"),
    };
    assert_eq!(code(&lost), "stale-revision");
    assert_eq!(won["queueRevision"], 1);
    let winner_prompt = won["preview"].as_str().unwrap().to_string();
    // Stale revisions are refused for move and remove too.
    let e = a
        .call(
            "queue.move",
            json!({"sessionId": sid, "queueId": q2, "queueRevision": 0}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "stale-revision");
    let e = a
        .call(
            "queue.remove",
            json!({"sessionId": sid, "queueId": q2, "queueRevision": 0}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "stale-revision");
    // Move third before first; remove nothing else. SPEC §4.4 names the revision `revision`:
    // that name is taken too, and a send's answer carries it.
    assert_eq!(third["revision"], third["queueRevision"], "{third}");
    let moved = a
        .ok(
            "queue.move",
            json!({"sessionId": sid, "queueId": q3, "revision": 0, "beforeQueueId": q1}),
        )
        .await;
    let order: Vec<&Value> = moved["queue"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["queueId"])
        .collect();
    assert_eq!(order, [&q3, &q1, &q2]);
    let snap = b.ok("session.get", json!({"sessionId": sid})).await;
    assert_eq!(snap["revision"], snap["historyRevision"], "SPEC §4.3's name: {snap}");
    assert_eq!(snap["queued"], 3);
    assert_eq!(snap["queue"].as_array().unwrap().len(), 3);
    assert_eq!(snap["queue"][2]["preview"], winner_prompt.as_str());
    // Remove the first entry (now in the middle).
    assert_eq!(
        a.ok(
            "queue.remove",
            json!({"sessionId": sid, "queueId": q1, "queueRevision": 0})
        )
        .await["removed"],
        true
    );
    let e = a
        .call(
            "queue.update",
            json!({"sessionId": sid, "queueId": q1, "queueRevision": 0, "prompt": "x"}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "stale-revision", "a removed entry is stale");

    // Paused: the worker comes back but nothing starts.
    a.ok("session.pause", json!({"sessionId": sid, "paused": true})).await;
    mock.push(Reply::text(&["third done"]));
    mock.push(Reply::text(&["second done"]));
    stack.start_worker(1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(b.ok("session.get", json!({"sessionId": sid})).await["phase"], "idle");
    assert!(mock.requests().is_empty());
    // Released: the queue drains in order, each turn once.
    a.ok("session.pause", json!({"sessionId": sid, "paused": false})).await;
    let mut ended = Vec::new();
    while ended.len() < 2 {
        let items = watch
            .until(30, |i| is_turn_end(i) && i["state"] != "cancelled")
            .await
            .expect("turns run after release");
        ended.push(items.last().unwrap().clone());
    }
    assert_eq!(ended[0]["turnId"], q3);
    assert_eq!(ended[1]["turnId"], q2);
    assert!(ended.iter().all(|e| e["state"] == "completed"));
    let bodies = a.history_bodies(&sid).await;
    assert_eq!(bodies, ["third", "third done", winner_prompt.as_str(), "second done"]);
}

/// `session.remove` during a running turn: the turn is stopped and nothing reappears.
#[tokio::test(flavor = "multi_thread")]
async fn remove_during_a_running_turn_writes_nothing_back() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    let mut a = stack.client(0).await;
    let mut b = stack.client(1).await;
    let sid = stack.session(&mut a).await;
    mock.push(Reply::StreamThenHang(vec![
        Part::Text("partial ".into()),
        Part::Text("answer".into()),
    ]));
    let mut watch = b.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let sent = a.ok("session.send", json!({"sessionId": sid, "prompt": "go"})).await;
    watch
        .until(20, |i| i["type"] == "model.delta")
        .await
        .expect("the turn is streaming");

    assert_eq!(
        b.ok("session.remove", json!({"sessionId": sid})).await,
        json!({"removed": true})
    );
    assert_eq!(
        a.ok("session.remove", json!({"sessionId": sid})).await,
        json!({"removed": false}),
        "idempotent"
    );
    let done = tokio::time::timeout(Duration::from_secs(10), &mut watch.done)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.error.unwrap().data_code(), Some("not-found"));
    assert_eq!(
        code(&a.call("session.get", json!({"sessionId": sid})).await.unwrap_err()),
        "not-found"
    );
    let list = a.ok("session.list", json!({})).await;
    assert!(
        list["entries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["sessionId"] != sid.as_str())
    );
    let turn_state = {
        let client = berth_e2e::harness::db(&stack.database_url).await;
        let t: String = client
            .query_one(
                "SELECT state FROM turns WHERE id = $1",
                &[&sent["turnId"].as_str().unwrap()],
            )
            .await
            .unwrap()
            .get(0);
        t
    };
    assert_eq!(turn_state, "cancelled");
    let events_then = stack
        .sql_i64("SELECT count(*) FROM events WHERE session_id = $1", &sid)
        .await;
    // The worker was told to stop; whatever it had in flight is refused.
    let stopped = eventually(10, || async {
        let log = std::fs::read_to_string(&stack.worker.as_ref().unwrap().log).unwrap_or_default();
        log.contains("turn stopped by the server").then_some(())
    })
    .await;
    assert!(stopped.is_some(), "the worker stopped the turn");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        stack
            .sql_i64("SELECT count(*) FROM events WHERE session_id = $1", &sid)
            .await,
        events_then
    );
    assert_eq!(
        stack
            .sql_i64(
                "SELECT count(*) FROM rows WHERE session_id = $1 AND kind = 'assistant'",
                &sid
            )
            .await,
        0
    );
    // The worker is free for other sessions.
    let other = stack.session(&mut a).await;
    mock.push(Reply::text(&["still here"]));
    let mut w2 = a.subscribe("session.watch", json!({"sessionId": other, "after": 0}));
    a.ok("session.send", json!({"sessionId": other, "prompt": "hi"})).await;
    let items = w2.until(20, is_turn_end).await.unwrap();
    assert_eq!(items.last().unwrap()["state"], "completed");
}

/// `session.stop` stops exactly the named turn; the queue then moves on.
#[tokio::test(flavor = "multi_thread")]
async fn stop_cancels_exactly_that_turn() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    mock.push(Reply::StreamThenHang(vec![Part::Text("thinking about it".into())]));
    mock.push(Reply::text(&["next one"]));
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let t1 = c.ok("session.send", json!({"sessionId": sid, "prompt": "long"})).await;
    let t2 = c.ok("session.send", json!({"sessionId": sid, "prompt": "short"})).await;
    assert_eq!(t2["state"], "queued");
    watch.until(20, |i| i["type"] == "model.delta").await.unwrap();
    let e = c
        .call("session.stop", json!({"sessionId": sid, "turnId": "trn_nope"}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "not-found");
    let stopped = c
        .ok("session.stop", json!({"sessionId": sid, "turnId": t1["turnId"]}))
        .await;
    assert_eq!(stopped, json!({"turnId": t1["turnId"], "state": "cancelled"}));
    let items = watch.until(10, is_turn_end).await.unwrap();
    assert_eq!(items.last().unwrap()["turnId"], t1["turnId"]);
    assert_eq!(items.last().unwrap()["state"], "cancelled");
    let e = c
        .call("session.stop", json!({"sessionId": sid, "turnId": t1["turnId"]}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "turn-not-running");
    let items = watch.until(20, is_turn_end).await.unwrap();
    let end = items.last().unwrap();
    assert_eq!(end["turnId"], t2["turnId"]);
    assert_eq!(end["state"], "completed");
}

/// A 2 MiB assistant message comes back exactly through truncated history plus `session.source`.
#[tokio::test(flavor = "multi_thread")]
async fn a_two_mib_message_reads_back_exactly() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    let unit = "Grüße, wörld ✓ — 漢字 🚢 "; // multi-byte characters of every width
    let mut text = String::new();
    while text.len() < 2 << 20 {
        text.push_str(unit);
    }
    let chunks: Vec<Part> = berth_protocol::text::chunks(&text, 32 << 10)
        .into_iter()
        .map(|c| Part::Text(c.to_string()))
        .collect();
    mock.push(Reply::Stream(chunks));
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "write a lot"}))
        .await;
    let items = watch.until(60, is_turn_end).await.unwrap();
    assert_eq!(items.last().unwrap()["state"], "completed");

    let page = c.ok("session.history", json!({"sessionId": sid})).await;
    let rows = page["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "the prompt fits; the big row goes to the next page");
    let page = c
        .ok(
            "session.history",
            json!({"sessionId": sid, "through": page["through"], "after": page["nextAfter"]}),
        )
        .await;
    let row = &page["rows"][0];
    let returned = row["body"].as_str().unwrap().to_string();
    let mark = &row["truncated"]["body"];
    assert_eq!(mark["truncated"], true);
    assert_eq!(mark["bytes"], text.len() as u64);
    assert_eq!(mark["returned"], returned.len() as u64);
    assert!(returned.len() < text.len());
    let mut read = returned;
    let mut offset = Some(read.len() as u64);
    while let Some(o) = offset {
        let part = c
            .ok(
                "session.source",
                json!({"sessionId": sid, "position": row["position"], "field": "body", "offset": o}),
            )
            .await;
        assert_eq!(part["offset"], o);
        assert_eq!(part["bytes"], text.len() as u64);
        read.push_str(part["data"].as_str().unwrap());
        offset = part["nextOffset"].as_u64();
    }
    assert_eq!(read.len(), text.len());
    assert!(read == text, "the message reads back exactly");
    // Targeting the row opens it under the same fence; a bad offset is a typed error.
    let target = json!({"kind": "row", "position": row["position"], "field": "body"});
    let opened = c
        .ok("session.history", json!({"sessionId": sid, "target": target}))
        .await;
    assert_eq!(opened["rows"][0]["position"], row["position"]);
    let e = c
        .call(
            "session.source",
            json!({"sessionId": sid, "position": row["position"], "field": "body", "offset": 3}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "bad-params", "offset 3 is inside 'ü'");

    // An event target opens that event's rows.
    let event = c
        .ok(
            "session.history",
            json!({"sessionId": sid, "target": {"kind": "event", "sequence": 2}}),
        )
        .await;
    assert_eq!(event["rows"].as_array().unwrap().len(), 1);
    assert_eq!(event["rows"][0]["body"], "write a lot");
    let e = c
        .call(
            "session.history",
            json!({"sessionId": sid, "target": {"kind": "event", "sequence": 99}}),
        )
        .await;
    assert_eq!(code(&e.unwrap_err()), "not-found");

    // Rows of internal tools are hidden unless targeted (written here as a worker would).
    let db = berth_e2e::harness::db(&stack.database_url).await;
    db.execute(
        "INSERT INTO rows (session_id, source_sequence, item_index, tenant_id, turn_id, kind, body, hidden)
         SELECT session_id, 3, 1, tenant_id, turn_id, 'toolResult', 'internal bookkeeping', true FROM rows
          WHERE session_id = $1 AND source_sequence = 3 AND item_index = 0",
        &[&sid],
    )
    .await
    .unwrap();
    let all = c
        .ok(
            "session.history",
            json!({"sessionId": sid, "maxBytes": 1048576, "limit": 500}),
        )
        .await;
    assert!(
        all["rows"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["body"] != "internal bookkeeping")
    );
    let target = json!({"kind": "row", "position": {"sourceSequence": 3, "itemIndex": 1}, "field": "body"});
    let hidden = c
        .ok("session.history", json!({"sessionId": sid, "target": target}))
        .await;
    assert_eq!(hidden["rows"][0]["body"], "internal bookkeeping");
    assert_eq!(hidden["rows"][0]["hidden"], true);
}

/// A prompt is handed to the worker when it is admitted, whether the client is on the
/// replica holding the worker (which kicks it directly and skips its own dispatch
/// notification) or on another one (which reaches the worker's replica only through
/// `NOTIFY berth_dispatch`). Without either path a turn would start only on the claimer's
/// 5 s safety tick: two turns in a row, each ended within 3 s, cannot both be that.
#[tokio::test(flavor = "multi_thread")]
async fn a_prompt_is_handed_out_at_once_through_either_replica() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    for replica in [1, 0] {
        let mut c = stack.client(replica).await;
        let sid = stack.session(&mut c).await;
        let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
        for round in 0..2 {
            mock.push(Reply::Stream(vec![Part::Text("done".into())]));
            c.ok("session.send", json!({"sessionId": sid, "prompt": "go"})).await;
            let items = watch.until(3, is_turn_end).await;
            let ended = items.as_ref().and_then(|i| i.last());
            assert!(
                ended.is_some_and(|e| e["state"] == "completed"),
                "replica {replica}, turn {round}: handed out and ended at once: {items:?}"
            );
        }
    }
}

/// A session with a client on each of the first two replicas, each watching it from the
/// start and caught up (its `session.created` read).
async fn watched_on_both(stack: &Stack) -> (Client, Client, String, [berth_e2e::client::Subscription; 2]) {
    let mut a = stack.client(0).await;
    let sid = stack.session(&mut a).await;
    let mut b = stack.client(1).await;
    let mut watches = [
        a.subscribe("session.watch", json!({"sessionId": sid, "after": 0})),
        b.subscribe("session.watch", json!({"sessionId": sid, "after": 0})),
    ];
    for watch in &mut watches {
        watch
            .until(10, |e| e["type"] == "session.created")
            .await
            .expect("watch catches up");
    }
    (a, b, sid, watches)
}

/// Watchers on either replica see the turn's live phase go `running` and, once it ends,
/// `idle` (relayed to the other replica in the end's own transaction).
#[tokio::test(flavor = "multi_thread")]
async fn watchers_on_either_replica_see_the_phase_go_idle_at_the_end() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    // The phase is live output, not history: each watch must be in place (caught up)
    // before the turn starts, or its `running` may go out before it listens.
    let (mut a, _b, sid, mut watches) = watched_on_both(&stack).await;
    for round in 0..2 {
        mock.push(Reply::Stream(vec![Part::Text("done".into())]));
        let sent = a.ok("session.send", json!({"sessionId": sid, "prompt": "go"})).await;
        let turn = sent["turnId"].clone();
        for (replica, watch) in watches.iter_mut().enumerate() {
            let phase = |p: &'static str| {
                let turn = turn.clone();
                move |i: &Value| i["type"] == "phase" && i["phase"] == p && i["turnId"] == turn
            };
            let items = watch.until(10, phase("running")).await;
            assert!(items.is_some(), "replica {replica}, turn {round}: phase running");
            let items = watch.until(10, phase("idle")).await;
            assert!(
                items.is_some(),
                "replica {replica}, turn {round}: phase idle after the end"
            );
        }
    }
}

/// A turn whose worker, client and watcher are all on one replica wakes no other replica:
/// the dispatch notice and the running phase go out only when another replica holds the
/// workspace's worker or a watcher of the session (`berth_db_notices_total`). Sent from the
/// other replica and watched there, the worker's replica is woken and the watcher there gets
/// the running phase.
#[tokio::test(flavor = "multi_thread")]
async fn a_turn_wakes_another_replica_only_when_it_holds_the_worker_or_a_watcher() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    let notices = |metrics: &str, channel: &str| {
        metric(metrics, &format!("berth_db_notices_total{{channel=\"{channel}\"}}")).unwrap_or(0)
    };
    let mut a = stack.client(0).await;
    let sid = stack.session(&mut a).await;
    mock.push(Reply::text(&["one"]));
    let mut wa = a.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    a.ok("session.send", json!({"sessionId": sid, "prompt": "first"})).await;
    wa.until(20, is_turn_end).await.expect("first turn ends");
    let other = stack.servers[1].metrics().await;
    assert_eq!(notices(&other, "berth_dispatch"), 0, "no dispatch notice: {other}");
    assert_eq!(notices(&other, "berth_deltas"), 0, "no live relay: {other}");

    let woken = notices(&stack.servers[0].metrics().await, "berth_dispatch");
    let mut b = stack.client(1).await;
    let mut wb = b.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    wb.until(10, is_turn_end).await.expect("the watch catches up");
    mock.push(Reply::text(&["two"]));
    let sent = b
        .ok("session.send", json!({"sessionId": sid, "prompt": "second"}))
        .await;
    let items = wb.until(20, is_turn_end).await.expect("second turn ends");
    assert!(
        items
            .iter()
            .any(|i| i["type"] == "phase" && i["phase"] == "running" && i["turnId"] == sent["turnId"]),
        "the running phase reached the other replica's watcher: {items:?}"
    );
    assert!(notices(&stack.servers[0].metrics().await, "berth_dispatch") > woken);
    assert!(notices(&stack.servers[1].metrics().await, "berth_deltas") > 0);
}

/// A turn watched only on the replica that admits it and holds its worker sends no event
/// notice at all: that replica hands its watchers `turn.started`, each step and the end as
/// the appends wrote them, and the notices are for other replicas' watchers only. (The
/// session is titled: an automatic title is an append of its own.)
#[tokio::test(flavor = "multi_thread")]
async fn a_turn_watched_only_where_it_runs_sends_no_event_notice() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut a = stack.client(0).await;
    let s = a
        .ok(
            "session.create",
            json!({"workspaceId": stack.workspace_id, "title": "Quiet"}),
        )
        .await;
    let sid = s["sessionId"].as_str().unwrap().to_string();
    let mut watch = a.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    watch
        .until(10, |e| e["type"] == "session.created")
        .await
        .expect("the watch catches up");
    let (notices, appended) = berth_e2e::harness::event_notices_and_appends(&stack.servers[0].metrics().await);
    mock.push(Reply::text(&["one", " two"]));
    a.ok("session.send", json!({"sessionId": sid, "prompt": "first"})).await;
    let items = watch.until(20, is_turn_end).await.expect("the turn ends");
    let events: Vec<&str> = items
        .iter()
        .filter(|e| e.get("sequence").is_some())
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(events, ["turn.started", "model.completed", "turn.ended"]);
    let (notices_after, appended_after) =
        berth_e2e::harness::event_notices_and_appends(&stack.servers[0].metrics().await);
    assert_eq!(notices_after, notices, "no event notice");
    assert_eq!(appended_after - appended, 3, "each event sent as its append wrote it");
}

/// A watcher on the replica that holds the worker is sent the turn's steps and end as the
/// append statements wrote them, without reading them back
/// (`berth_watch_events_total{source="append"}`), and they are exactly the events a read
/// returns: the same items as a watcher on the other replica (which reads them) and as a
/// watch opened afterwards from the start. The one field that may differ is a tool call's
/// `status`, which later events change in its row (a read shows the status at its time).
#[tokio::test(flavor = "multi_thread")]
async fn a_watcher_where_the_worker_is_gets_each_append_as_a_read_returns_it() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    let (mut a, mut b, sid, mut watches) = watched_on_both(&stack).await;
    let appended =
        |metrics: &str| berth_e2e::harness::metric(metrics, "berth_watch_events_total{source=\"append\"}").unwrap_or(0);
    // A step of its own (a tool call), with thinking and usage; then the answer, whose step
    // goes with the end. Each reply waits a little first, so that the watches have read what
    // came before (an append is sent from memory only right after the watcher's cursor).
    mock.push(Reply::Stream(vec![
        Part::Delay(200),
        Part::Reasoning("let me look".into()),
        Part::tool_call(0, "call_1", "read_file", &json!({"path": "README.md"}), 8),
        Part::Usage {
            prompt: 20,
            completion: 7,
        },
    ]));
    mock.push(Reply::Stream(vec![
        Part::Delay(200),
        Part::Reasoning("nothing there".into()),
        Part::Text("There is no readme.".into()),
        Part::Usage {
            prompt: 30,
            completion: 5,
        },
    ]));
    a.ok("session.send", json!({"sessionId": sid, "prompt": "Read the readme"}))
        .await;
    let events = |items: Vec<Value>| -> Vec<Value> {
        items
            .into_iter()
            .filter(|e| e.get("sequence").is_some())
            .map(|mut e| {
                for row in e["rows"].as_array_mut().into_iter().flatten() {
                    if let Some(tool) = row["tool"].as_object_mut() {
                        tool.remove("status");
                    }
                }
                e
            })
            .collect()
    };
    let here = events(watches[0].until(30, is_turn_end).await.expect("the turn ends here"));
    let there = events(watches[1].until(30, is_turn_end).await.expect("the turn ends there"));
    assert_eq!(event_types(&here), A_TOOL_TURN);
    assert_eq!(here, there, "the same events on either replica");
    let mut fresh = b.subscribe("session.watch", json!({"sessionId": sid, "after": 1}));
    let read = events(fresh.until(30, is_turn_end).await.expect("read from the start"));
    assert_eq!(here, read, "the events a read returns");
    // What the answer's step carried: rows with thinking, usage as metered.
    let answer = &here[4];
    assert_eq!(answer["rows"][0]["body"], "There is no readme.");
    assert_eq!(answer["rows"][0]["thinking"], "nothing there");
    let call = here[1]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "toolCall");
    assert_eq!(call.expect("the step's tool call")["tool"]["name"], "read_file");
    // The steps and the end (three events) were each sent from the append on the worker's
    // replica unless a watch was still reading what came before; the other replica read
    // everything.
    assert!(appended(&stack.servers[0].metrics().await) >= 1);
    assert_eq!(appended(&stack.servers[1].metrics().await), 0);
}

/// A turn's end wakes a claim only when its session has a queued turn (issue 20): the next
/// queued turn then starts at once, whichever replica admitted it, three times in a row
/// (without a wake-up it would wait for the claimer's safety read, every 5 s).
#[tokio::test(flavor = "multi_thread")]
async fn the_next_queued_turn_starts_at_once_when_a_turn_ends() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    let slow = |text: String| Reply::Stream(vec![Part::Delay(2000), Part::Text(text)]);
    for replica in [1, 0] {
        let mut c = stack.client(replica).await;
        let sid = stack.session(&mut c).await;
        let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
        mock.push(slow("first".into()));
        c.ok("session.send", json!({"sessionId": sid, "prompt": "first"})).await;
        watch
            .until(20, |e| e["type"] == "turn.started")
            .await
            .expect("the first turn starts");
        for round in 0..3 {
            mock.push(slow(format!("next {round}")));
            let sent = c
                .ok(
                    "session.send",
                    json!({"sessionId": sid, "prompt": format!("next {round}")}),
                )
                .await;
            assert_eq!(sent["state"], "queued", "replica {replica}, round {round}");
            watch.until(30, is_turn_end).await.expect("the running turn ends");
            let started = watch.until(3, |e| e["type"] == "turn.started").await;
            assert!(
                started.is_some(),
                "replica {replica}, round {round}: the queued turn starts at once"
            );
        }
        let last = watch.until(30, is_turn_end).await.expect("the last turn ends");
        assert_eq!(last.last().unwrap()["state"], "completed");
    }
}

/// A watcher joining mid-turn, on another replica than the worker's, gets the text so far
/// and then the rest, with nothing doubled.
#[tokio::test(flavor = "multi_thread")]
async fn a_watcher_joining_mid_turn_sees_the_partial_text_on_any_replica() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    let mut a = stack.client(0).await;
    let sid = stack.session(&mut a).await;
    mock.push(Reply::Stream(vec![
        Part::Text("Hello ".into()),
        Part::Reasoning("hmm".into()),
        Part::Delay(800),
        Part::Text("wor".into()),
        Part::Delay(50),
        Part::Text("ld".into()),
        Part::Delay(800),
        Part::Text("!".into()),
    ]));
    let mut first = a.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    a.ok("session.send", json!({"sessionId": sid, "prompt": "greet"})).await;
    first.until(20, |i| i["type"] == "model.delta").await.unwrap();
    // Let the coalesced partial reach the database, then join on both replicas.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut joiners = Vec::new();
    for replica in [1, 0] {
        let mut c = stack.client(replica).await;
        let sub = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
        joiners.push((c, sub));
    }
    for (i, (_c, sub)) in joiners.iter_mut().enumerate() {
        let items = sub.until(30, is_turn_end).await.unwrap();
        let deltas: Vec<&Value> = items.iter().filter(|i| i["type"] == "model.delta").collect();
        let text: String = deltas.iter().filter_map(|d| d["text"].as_str()).collect();
        let thinking: String = deltas.iter().filter_map(|d| d["thinking"].as_str()).collect();
        assert_eq!(text, "Hello world!", "joiner {i}: {deltas:?}");
        assert_eq!(thinking, "hmm", "joiner {i}");
        assert!(
            deltas[0]["text"].as_str().unwrap().starts_with("Hello"),
            "joiner {i} starts with the text so far"
        );
        let completed = items.iter().find(|i| i["type"] == "model.completed").unwrap();
        assert_eq!(completed["rows"][0]["body"], "Hello world!");
    }
}

/// Clearing forgets history and queue; old cursors answer `history-cleared`.
#[tokio::test(flavor = "multi_thread")]
async fn clear_forgets_history_and_old_cursors_say_so() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    mock.push(Reply::text(&["one"]));
    let mut w = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "first"})).await;
    w.until(20, is_turn_end).await.unwrap();
    let before = c.ok("session.history", json!({"sessionId": sid})).await;
    assert_eq!(before["rows"].as_array().unwrap().len(), 2);
    let cleared = c.ok("session.clear", json!({"sessionId": sid})).await;
    let seq = cleared["sequence"].as_i64().unwrap();
    // The live watcher simply sees the clear.
    let items = w.until(10, |i| i["type"] == "session.cleared").await.unwrap();
    assert_eq!(items.last().unwrap()["sequence"], seq);
    // Old cursors: history-cleared.
    let e = c
        .call(
            "session.history",
            json!({"sessionId": sid, "through": before["through"]}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "history-cleared");
    let mut old = c.subscribe("session.watch", json!({"sessionId": sid, "after": 2}));
    let done = tokio::time::timeout(Duration::from_secs(10), &mut old.done)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.error.unwrap().data_code(), Some("history-cleared"));
    // Fresh reads: nothing before the clear, which is gone from the database too (the rows
    // with their events: no key cascades from one to the other).
    let after = c.ok("session.history", json!({"sessionId": sid})).await;
    assert_eq!(after["rows"], json!([]));
    assert_eq!(
        stack
            .sql_i64("SELECT count(*) FROM rows WHERE session_id = $1", &sid)
            .await,
        0
    );
    assert_eq!(
        stack
            .sql_i64("SELECT count(*) FROM events WHERE session_id = $1", &sid)
            .await,
        1,
        "only session.cleared"
    );
    let mut fresh = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    assert_eq!(fresh.next(10).await.unwrap()["type"], "session.cleared");
    // The session works on: the next turn does not see the forgotten history.
    mock.push(Reply::text(&["two"]));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "second"}))
        .await;
    fresh.until(20, is_turn_end).await.unwrap();
    let reqs = mock.requests();
    assert_eq!(
        reqs.last().unwrap()["messages"].as_array().unwrap()[1..],
        [json!({"role": "user", "content": "second"})]
    );
}

/// A worker lost mid-turn: the turn ends `interrupted` and a diagnostic records why.
#[tokio::test(flavor = "multi_thread")]
async fn worker_lost_mid_turn_interrupts_with_a_diagnostic() {
    let mock = MockProvider::start().await;
    let mut stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    mock.push(Reply::StreamThenHang(vec![Part::Text("working".into())]));
    let mut w = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let sent = c.ok("session.send", json!({"sessionId": sid, "prompt": "go"})).await;
    w.until(20, |i| i["type"] == "model.delta").await.unwrap();
    stack.kill_worker().await;
    let items = w.until(20, is_turn_end).await.unwrap();
    let end = items.last().unwrap();
    assert_eq!(end["state"], "interrupted");
    assert_eq!(end["cause"], json!({"code": "worker-lost"}));
    let diags = c.ok("session.diagnostics", json!({"sessionId": sid})).await;
    let d = &diags["diagnostics"][0];
    assert_eq!(d["kind"], "execution");
    assert_eq!(d["turnId"], sent["turnId"]);
    assert_eq!(d["cause"]["code"], "worker-lost");
    assert_eq!(d["sequence"], end["sequence"]);
    // A provider failure is a model-step diagnostic, newest first.
    stack.start_worker(0).await;
    mock.push(Reply::Status(503));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "again"})).await;
    w.until(20, is_turn_end).await.unwrap();
    let diags = c.ok("session.diagnostics", json!({"sessionId": sid})).await;
    assert_eq!(diags["diagnostics"][0]["kind"], "model-step");
    assert_eq!(
        diags["diagnostics"][0]["cause"],
        json!({"code": "provider-status", "status": 503})
    );
    assert_eq!(diags["diagnostics"][1]["kind"], "execution");
    let older = c
        .ok(
            "session.diagnostics",
            json!({"sessionId": sid, "throughRevision": diags["throughRevision"], "limit": 1}),
        )
        .await;
    assert_eq!(older["diagnostics"].as_array().unwrap().len(), 1);
    let next = c
        .ok(
            "session.diagnostics",
            // `through`, its earlier name, is still read.
            json!({"sessionId": sid, "through": diags["throughRevision"], "before": older["nextBefore"]}),
        )
        .await;
    assert_eq!(next["diagnostics"][0]["kind"], "execution");
    assert_eq!(next["throughRevision"], diags["throughRevision"]);
}

/// `session.list`: `updatedAt` desc then id desc, paged, with phase and queue counts.
#[tokio::test(flavor = "multi_thread")]
async fn session_list_orders_pages_and_summarises() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(stack.session(&mut c).await);
    }
    // Touch the oldest: it moves to the front.
    c.ok("session.rename", json!({"sessionId": ids[0], "title": "renamed"}))
        .await;
    let set = c
        .ok("session.setModel", json!({"sessionId": ids[1], "model": "other-model"}))
        .await;
    assert_eq!(set["effectiveModelId"], "other-model");
    assert_eq!(set["effectiveModelLevel"], "session");
    let mut seen = Vec::new();
    let mut after = Value::Null;
    loop {
        let page = c.ok("session.list", json!({"limit": 2, "after": after})).await;
        for e in page["entries"].as_array().unwrap() {
            seen.push(e.clone());
        }
        after = page["nextAfter"].clone();
        if after.is_null() {
            break;
        }
    }
    let order: Vec<&str> = seen.iter().map(|e| e["sessionId"].as_str().unwrap()).collect();
    assert_eq!(order.len(), 5);
    assert_eq!(order[0], ids[1].as_str());
    assert_eq!(order[1], ids[0].as_str());
    let stamps: Vec<&str> = seen.iter().map(|e| e["updatedAt"].as_str().unwrap()).collect();
    assert!(stamps.windows(2).all(|w| w[0] >= w[1]), "{stamps:?}");
    assert_eq!(seen[1]["title"], "renamed");
    assert_eq!(seen[0]["modelId"], "other-model");
    assert!(seen.iter().all(|e| e["phase"] == "idle"
        && e.get("running") == Some(&Value::Null)
        && e["queued"] == 0
        && e["messageCount"] == 0));
    let e = c.call("session.list", json!({"after": "garbage"})).await.unwrap_err();
    assert_eq!(code(&e), "bad-params");
}

/// A watcher that stops reading never makes the server buffer without bound: its watch
/// waits (the outbound queue is bounded) and then catches up from the database, losing
/// nothing and doubling nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_watcher_catches_up_without_loss() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut writer = stack.client(0).await;
    let sid = stack.session(&mut writer).await;
    let mut slow = stack.client(0).await;
    let mut sub = slow.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    assert_eq!(sub.next(10).await.unwrap()["sequence"], 1);
    slow.pause_reading(true);
    // Far more than socket buffers and the outbound queue hold.
    let title = "t".repeat(900);
    for i in 0..1500 {
        writer
            .ok(
                "session.rename",
                json!({"sessionId": sid, "title": format!("{i}{title}")}),
            )
            .await;
    }
    let last = writer.ok("session.get", json!({"sessionId": sid})).await["sequence"]
        .as_i64()
        .unwrap();
    assert!(last > 1500);
    // Other clients were served all along; now the stalled one reads again.
    slow.pause_reading(false);
    let mut seen = vec![1];
    while *seen.last().unwrap() < last {
        let item = sub.next(30).await.expect("the stalled watcher catches up");
        if let Some(seq) = item["sequence"].as_i64() {
            seen.push(seq);
        }
    }
    assert_eq!(seen, (1..=last).collect::<Vec<_>>());
}

/// A watcher joining late reads history whose events add up to more than one catch-up
/// batch's byte budget (1 MiB): every event once, in order, each with all of its rows.
#[tokio::test(flavor = "multi_thread")]
async fn a_late_watcher_catches_up_over_the_byte_budget_with_every_row() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    let mut done = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    // Two answers of 600 KiB: the second one does not fit the first batch. (A third would
    // make the turn compact its history instead.)
    let replies: Vec<String> = (0..2).map(|i| format!("{i}").repeat(600 << 10)).collect();
    for (i, reply) in replies.iter().enumerate() {
        let chunks: Vec<Part> = berth_protocol::text::chunks(reply, 64 << 10)
            .into_iter()
            .map(|c| Part::Text(c.to_string()))
            .collect();
        mock.push(Reply::Stream(chunks));
        c.ok("session.send", json!({"sessionId": sid, "prompt": format!("p{i}")}))
            .await;
        done.until(60, is_turn_end).await.unwrap();
    }
    let last = c.ok("session.get", json!({"sessionId": sid})).await["sequence"]
        .as_i64()
        .unwrap();
    let mut late = stack.client(0).await;
    let mut sub = late.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let (mut seen, mut prompts, mut answers) = (Vec::new(), Vec::new(), Vec::new());
    while seen.last().copied().unwrap_or(0) < last {
        let item = sub.next(30).await.expect("the late watcher catches up");
        let Some(seq) = item["sequence"].as_i64() else { continue };
        seen.push(seq);
        for row in item["rows"].as_array().into_iter().flatten() {
            match row["kind"].as_str() {
                Some("user") => prompts.push(row["body"].as_str().unwrap().to_string()),
                Some("assistant") => answers.push(row["body"].as_str().unwrap().to_string()),
                _ => {}
            }
        }
    }
    assert_eq!(seen, (1..=last).collect::<Vec<_>>());
    assert_eq!(prompts, ["p0", "p1"]);
    assert_eq!(answers, replies, "each answer whole, once, in order");
}

/// Receipts expire after the retention period.
#[tokio::test(flavor = "multi_thread")]
async fn receipts_are_deleted_after_the_retention_period() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    c.ok(
        "session.rename",
        json!({"sessionId": sid, "title": "x", "operationId": "op-old"}),
    )
    .await;
    assert_eq!(
        c.ok("operation.receipt", json!({"operationId": "op-old"})).await["state"],
        "done"
    );
    let store = berth_store::Store::connect(&stack.database_url, 1).unwrap();
    assert_eq!(
        store.receipts_cleanup(3600).await.unwrap(),
        0,
        "younger than the retention: kept"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(store.receipts_cleanup(1).await.unwrap(), 1);
    assert_eq!(
        c.ok("operation.receipt", json!({"operationId": "op-old"})).await,
        Value::Null
    );
}

/// A worker that goes silent without closing (a sleeping laptop) is dropped after the idle
/// timeout: its turn ends `interrupted`, and it reconnects when it wakes.
#[tokio::test(flavor = "multi_thread")]
async fn a_silent_worker_is_dropped_and_its_turn_interrupted() {
    let mock = MockProvider::start().await;
    let env = [("BERTH_WS_PING_SECS", "1"), ("BERTH_WS_IDLE_SECS", "3")];
    let stack = Stack::start_with(&mock, 1, &env).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    mock.push(Reply::StreamThenHang(vec![Part::Text("working".into())]));
    let mut w = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "go"})).await;
    w.until(20, |i| i["type"] == "model.delta").await.unwrap();
    let pid = stack.worker.as_ref().unwrap().child.id().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap();
    let items = w.until(20, is_turn_end).await;
    std::process::Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .unwrap();
    let end = items.expect("the silent worker's turn ends").last().unwrap().clone();
    assert_eq!(end["state"], "interrupted");
    assert_eq!(end["cause"]["code"], "worker-lost");
    // Awake again, it reconnects and takes new work.
    mock.push(Reply::text(&["awake"]));
    stack.wait_online(true).await;
    c.ok("session.send", json!({"sessionId": sid, "prompt": "again"})).await;
    let items = w.until(30, is_turn_end).await.unwrap();
    assert_eq!(items.last().unwrap()["state"], "completed");
}

/// `session.history` pages cut by `limit` and by the byte budget (one statement reads the
/// fence, the sizes and the rows) are exactly the whole history in order: every page has at
/// least one row, a page of several rows stays within `maxBytes`, and `nextAfter` is absent
/// only on the last page.
#[tokio::test(flavor = "multi_thread")]
async fn history_pages_cut_by_rows_and_bytes_cover_the_whole_history() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    for size in [300, 900, 200, 700, 100] {
        let answer = "x".repeat(size);
        mock.push(Reply::text(&[&answer]));
        c.ok(
            "session.send",
            json!({"sessionId": sid, "prompt": format!("answer {size}")}),
        )
        .await;
        watch.until(30, is_turn_end).await.expect("turn ends");
    }
    let whole = c.ok("session.history", json!({"sessionId": sid, "limit": 500})).await;
    assert_eq!(whole["nextAfter"], Value::Null, "SPEC: null ends");
    assert!(whole.get("nextAfter").is_some(), "present, as null");
    let all: Vec<Value> = whole["rows"].as_array().unwrap().clone();
    assert_eq!(all.len(), 10, "a prompt and an answer per turn");
    for (limit, max_bytes) in [(1, 1 << 20), (3, 1 << 20), (500, 1024), (2, 1024)] {
        let mut got = Vec::new();
        let mut after = Value::Null;
        loop {
            let page = c
                .ok(
                    "session.history",
                    json!({"sessionId": sid, "through": whole["through"], "after": after,
                           "limit": limit, "maxBytes": max_bytes}),
                )
                .await;
            let rows = page["rows"].as_array().unwrap();
            assert!(!rows.is_empty() && rows.len() <= limit, "{limit}/{max_bytes}: {page}");
            if rows.len() > 1 {
                let bytes: usize = rows.iter().map(|r| r["body"].as_str().unwrap().len()).sum();
                assert!(bytes <= max_bytes, "{limit}/{max_bytes}: {bytes} bytes");
            }
            got.extend(rows.iter().cloned());
            match page.get("nextAfter").filter(|n| !n.is_null()) {
                Some(n) => after = n.clone(),
                None => break,
            }
        }
        assert_eq!(got, all, "pages of {limit} rows / {max_bytes} bytes");
    }
    // An empty page past the end, and an unknown session.
    let last = all.last().unwrap()["position"].clone();
    let empty = c.ok("session.history", json!({"sessionId": sid, "after": last})).await;
    assert_eq!(empty["rows"], json!([]));
    assert_eq!(empty["nextAfter"], Value::Null);
    let missing = c
        .call("session.history", json!({"sessionId": "ses_missing"}))
        .await
        .unwrap_err();
    assert_eq!(code(&missing), "not-found");
}

/// A new session, for tests that write its history rows themselves: its id, a direct
/// database connection, its tenant and its last sequence.
async fn seeded_session(stack: &Stack, c: &mut Client) -> (String, tokio_postgres::Client, String, i64) {
    let sid = stack.session(c).await;
    let db = berth_e2e::harness::db(&stack.database_url).await;
    let row = db
        .query_one("SELECT tenant_id, last_sequence FROM sessions WHERE id = $1", &[&sid])
        .await
        .unwrap();
    (sid, db, row.get(0), row.get(1))
}

/// `session.history` pages are written straight from the database's rows; the text is the
/// same, byte for byte, as the typed page's (`Store::history`, which the worker's
/// `turn_history` reads): turn ids, thinking, tools, attachments, hidden rows left out, a
/// stored tool that does not read as one left out, a single row cut to the budget, the
/// `nextAfter` cursor and an empty page.
#[tokio::test(flavor = "multi_thread")]
async fn history_pages_written_from_rows_match_the_typed_pages() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let (sid, db, tenant, first) = seeded_session(&stack, &mut c).await;
    db.execute(
        "INSERT INTO events (session_id, sequence, tenant_id, type, payload)
         SELECT $1, g, $2, 'model.completed', '{}' FROM generate_series($3::bigint, $3::bigint + 5) g",
        &[&sid, &tenant, &(first + 1)],
    )
    .await
    .unwrap();
    let attachments = json!([{"attachmentId": "att_1", "name": "a \"quoted\" name.png", "mimeType": "image/png",
                              "bytes": 12, "sha256": "ab".repeat(32)}]);
    let tool = json!({"name": "read", "callId": "call_1", "status": "ok"});
    db.execute(
        "INSERT INTO rows (session_id, source_sequence, item_index, tenant_id, turn_id, kind, body, thinking, tool, hidden, attachments)
         VALUES ($1, $3::bigint + 1, 0, $2, NULL, 'user', 'hello \"there\"\n\u{1F600}', NULL, NULL, false, $4),
                ($1, $3::bigint + 2, 0, $2, 'turn_x', 'assistant', 'an answer', 'a thought', NULL, false, NULL),
                ($1, $3::bigint + 2, 1, $2, 'turn_x', 'toolCall', '{\"path\":\"a\"}', NULL, $5, false, NULL),
                ($1, $3::bigint + 2, 2, $2, 'turn_x', 'toolResult', 'internal', NULL, $5, true, NULL),
                ($1, $3::bigint + 3, 0, $2, 'turn_x', 'toolResult', 'odd tool', NULL, '{\"name\": 1}', false, NULL),
                ($1, $3::bigint + 4, 0, $2, 'turn_x', 'assistant', repeat('long ', 1000), repeat('deep ', 500), NULL, false, NULL),
                ($1, $3::bigint + 5, 0, $2, 'turn_x', 'notice', '', NULL, NULL, false, NULL)",
        &[&sid, &tenant, &first, &attachments, &tool],
    )
    .await
    .unwrap();
    db.execute(
        "UPDATE sessions SET last_sequence = $2 WHERE id = $1",
        &[&sid, &(first + 6)],
    )
    .await
    .unwrap();
    let store = berth_store::Store::connect(&stack.database_url, 1).unwrap();
    let after = |seq: i64, item: i32| {
        Some(berth_protocol::Position {
            source_sequence: seq,
            item_index: item,
        })
    };
    let pages = [
        (None, None, None, None),
        (None, Some(2), None, None),
        (after(first + 2, 0), Some(2), None, None),
        (after(first + 3, 0), None, Some(1024), None),
        (None, None, Some(1024), None),
        (None, Some(500), None, Some(first + 2)),
        (after(first + 6, 0), None, None, None),
    ];
    for (after, limit, max_bytes, through) in pages {
        let p = berth_protocol::SessionHistoryParams {
            session_id: sid.clone(),
            after,
            limit,
            max_bytes,
            through,
            ..Default::default()
        };
        let written = store.history_json(&tenant, &p).await.unwrap();
        let typed = serde_json::to_string(&store.history(&tenant, &p).await.unwrap()).unwrap();
        assert_eq!(written.get(), typed, "{after:?} {limit:?} {max_bytes:?} {through:?}");
    }
    // What a client reads is that text.
    let whole = c.ok("session.history", json!({"sessionId": sid})).await;
    let rows = whole["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 6, "the hidden row is left out: {whole}");
    assert_eq!(rows[0]["attachments"], attachments);
    assert_eq!(rows[1]["thinking"], "a thought");
    assert_eq!(rows[2]["tool"], tool);
    assert!(rows[3].get("tool").is_none(), "{}", rows[3]);
}

/// A page is cut at the byte budget at the same row whatever its rows' sizes: rows of mixed
/// sizes (a few bytes to past the largest budget, some with thinking, multi-byte text), read
/// in pages of several limits and budgets, give exactly the longest prefix of the rest of
/// the history that holds at most `limit` rows and `maxBytes` of text (the first row always;
/// alone, it is cut to the budget and marked), each row's text whole, and together the whole
/// history.
#[tokio::test(flavor = "multi_thread")]
async fn history_pages_cut_rows_of_mixed_sizes_at_the_byte_budget() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let (sid, db, tenant, first) = seeded_session(&stack, &mut c).await;
    let sizes = [
        5, 3000, 40, 1500, 700, 70_000, 12, 2600, 300_000, 8, 1100, 900, 20_000, 3, 5000, 260_000, 64, 2000, 1_200_000,
        30, 1023, 1025, 9,
    ];
    // (position, body, thinking) in history order; every third row thinks, every fourth
    // writes two-byte characters, and every fifth event holds a second, hidden row.
    let mut rows: Vec<(i64, i32, String, Option<String>)> = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let sequence = first + 1 + i as i64;
        let text = |n: usize| if i % 4 == 1 { "é".repeat(n / 2) } else { "x".repeat(n) };
        let (body, thinking) = if i % 3 == 2 {
            (text(size / 2), Some(text(size - size / 2)))
        } else {
            (text(size), None)
        };
        db.execute(
            "INSERT INTO events (session_id, sequence, tenant_id, type, payload) VALUES ($1, $2, $3, 'model.completed', '{}')",
            &[&sid, &sequence, &tenant],
        )
        .await
        .unwrap();
        db.execute(
            "INSERT INTO rows (session_id, source_sequence, item_index, tenant_id, kind, body, thinking)
             VALUES ($1, $2, 0, $3, 'assistant', $4, $5)",
            &[&sid, &sequence, &tenant, &body, &thinking],
        )
        .await
        .unwrap();
        if i % 5 == 0 {
            db.execute(
                "INSERT INTO rows (session_id, source_sequence, item_index, tenant_id, kind, body, hidden)
                 VALUES ($1, $2, 1, $3, 'toolResult', repeat('h', 4000), true)",
                &[&sid, &sequence, &tenant],
            )
            .await
            .unwrap();
        }
        rows.push((sequence, 0, body, thinking));
    }
    db.execute(
        "UPDATE sessions SET last_sequence = $2 WHERE id = $1",
        &[&sid, &(first + sizes.len() as i64)],
    )
    .await
    .unwrap();
    let text_len = |r: &(i64, i32, String, Option<String>)| r.2.len() + r.3.as_ref().map_or(0, String::len);
    for (limit, max_bytes) in [
        (100, None),
        (500, Some(1024)),
        (3, Some(4096)),
        (10, Some(65_536)),
        (500, Some(1 << 20)),
        (2, Some(1024)),
        (1, Some(300_000)),
    ] {
        let budget = max_bytes.unwrap_or(256 << 10);
        let mut at = 0;
        let mut after = Value::Null;
        while at < rows.len() {
            let page = c
                .ok(
                    "session.history",
                    json!({"sessionId": sid, "after": after, "limit": limit, "maxBytes": max_bytes}),
                )
                .await;
            // The longest prefix of what is left within the limit and the budget.
            let mut take = 0;
            let mut used = 0;
            for r in &rows[at..] {
                used += text_len(r);
                if take == limit || (take > 0 && used > budget) {
                    break;
                }
                take += 1;
            }
            let got = page["rows"].as_array().unwrap();
            let label = format!("{limit}/{max_bytes:?} at row {at}");
            assert_eq!(got.len(), take, "{label}");
            for (r, want) in got.iter().zip(&rows[at..at + take]) {
                assert_eq!(
                    r["position"],
                    json!({"sourceSequence": want.0, "itemIndex": want.1}),
                    "{label}"
                );
                let (body, thinking) = (r["body"].as_str().unwrap(), r["thinking"].as_str());
                if take == 1 && text_len(want) > budget {
                    // Alone and longer than the budget: cut, body first, and marked.
                    assert!(body.len() + thinking.map_or(0, str::len) <= budget, "{label}");
                    assert!(want.2.starts_with(body), "{label}");
                    let thought = want.3.as_deref().unwrap_or_default();
                    assert!(thought.starts_with(thinking.unwrap_or_default()), "{label}");
                    // Each field that was cut says so, with its whole size.
                    for (field, got, whole) in [
                        ("body", body, want.2.as_str()),
                        ("thinking", thinking.unwrap_or_default(), thought),
                    ] {
                        let mark = &r["truncated"][field];
                        if got.len() < whole.len() {
                            assert_eq!(
                                (&mark["bytes"], &mark["returned"]),
                                (&json!(whole.len()), &json!(got.len())),
                                "{label}"
                            );
                        } else {
                            assert!(mark.is_null(), "{label}");
                        }
                    }
                } else {
                    assert!(r.get("truncated").is_none(), "{label}");
                    assert_eq!(body, want.2, "{label}");
                    assert_eq!(thinking, want.3.as_deref(), "{label}");
                }
            }
            at += take;
            match page.get("nextAfter").filter(|n| !n.is_null()) {
                Some(next) => {
                    assert!(at < rows.len(), "{label}: nextAfter on the last page");
                    assert_eq!(next, &got.last().unwrap()["position"], "{label}");
                    after = next.clone();
                }
                None => assert_eq!(at, rows.len(), "{label}: no nextAfter before the end"),
            }
        }
    }
}

/// Issue 52: a stopped turn keeps what its running step had written — as the assistant row
/// of its `turn.ended`, live and in the history (a removal keeps nothing, see above).
#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_turn_keeps_its_text_so_far() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    mock.push(Reply::StreamThenHang(vec![
        Part::Text("half of ".into()),
        Part::Text("an answer".into()),
    ]));
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let sent = c.ok("session.send", json!({"sessionId": sid, "prompt": "go"})).await;
    watch
        .until(20, |i| {
            i["type"] == "model.delta" && i["text"].as_str().is_some_and(|t| t.contains("answer"))
        })
        .await
        .expect("the turn streams");
    // The live text is stored every 50 ms or so; stop once it is (as a person would).
    let db = berth_e2e::harness::db(&stack.database_url).await;
    let turn = sent["turnId"].as_str().unwrap().to_string();
    let stored = eventually(10, || {
        let (db, turn) = (&db, &turn);
        async move {
            let text: String = db
                .query_one("SELECT partial_text FROM turns WHERE id = $1", &[turn])
                .await
                .ok()?
                .get(0);
            text.contains("answer").then_some(())
        }
    })
    .await;
    assert!(stored.is_some(), "the partial text is stored");
    c.ok("session.stop", json!({"sessionId": sid, "turnId": sent["turnId"]}))
        .await;
    let items = watch.until(10, is_turn_end).await.unwrap();
    let end = items.last().unwrap();
    assert_eq!(end["state"], "cancelled");
    let rows = end["rows"].as_array().expect("the kept text is a row of the end");
    assert_eq!(rows.len(), 1, "{end}");
    assert_eq!(rows[0]["kind"], "assistant");
    assert_eq!(rows[0]["body"], "half of an answer");
    assert_eq!(c.history_bodies(&sid).await, ["go", "half of an answer"]);
}
