//! `session.search` and `session.fork` (issue 13), against real processes.

use std::collections::BTreeSet;

use berth_e2e::{MockProvider, Part, Reply, Stack, client::code, harness};
use serde_json::{Value, json};

fn is_turn_end(v: &Value) -> bool {
    v["type"] == "turn.ended"
}

/// Rows written straight into the database: event `2 + i` publishes row `i` (0-based).
/// Every 7th body holds "needle" twice (once capitalised), every 11th thinking once.
const ROWS: i64 = 100_000;

fn expected_hits(n: i64) -> BTreeSet<(i64, &'static str, u64)> {
    let mut out = BTreeSet::new();
    for i in 0..n {
        let seq = i + 2;
        if i % 7 == 0 {
            out.insert((seq, "body", 2));
            out.insert((seq, "body", 10));
        }
        if i % 11 == 0 {
            out.insert((seq, "thinking", 0));
        }
    }
    out
}

/// `n` events of one assistant row each appended to session `sid` in bulk (sequences 2 to
/// `n + 1`), each row's body and thinking the SQL expressions given (of `g`, 0 to `n - 1`).
async fn fill(db: &tokio_postgres::Client, sid: &str, n: i64, body: &str, thinking: &str) {
    db.batch_execute(&format!(
        "INSERT INTO events (session_id, sequence, tenant_id, type, payload)
           SELECT id, g + 2, tenant_id, 'model.completed', '{{}}' FROM sessions, generate_series(0, {last}) g WHERE id = '{sid}';
         INSERT INTO rows (session_id, source_sequence, item_index, tenant_id, kind, body, thinking)
           SELECT id, g + 2, 0, tenant_id, 'assistant', {body}, {thinking}
             FROM sessions, generate_series(0, {last}) g WHERE id = '{sid}';
         UPDATE sessions SET last_sequence = {n} + 1 WHERE id = '{sid}';",
        last = n - 1
    ))
    .await
    .expect("bulk rows");
}

/// A 100 000-row session searched page by page under a fixed fence while new turns append:
/// no row after the fence appears, every hit appears exactly once, and hits open with
/// `session.history {target}`.
#[tokio::test(flavor = "multi_thread")]
async fn search_pages_a_large_session_under_a_fixed_fence() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    let db = harness::db(&stack.database_url).await;
    fill(
        &db,
        &sid,
        ROWS,
        "CASE WHEN g % 7 = 0 THEN 'a needle, Needle.' ELSE 'plain row ' || g END",
        "CASE WHEN g % 11 = 0 THEN 'NEEDLE first' ELSE NULL END",
    )
    .await;

    // 100 000 rows outgrow the default context window: the first new turn compacts them.
    mock.push_matching(berth_e2e::SUMMARY_REQUEST, Reply::text(&["earlier rows"]));
    let mut seen = BTreeSet::new();
    let mut after = Value::Null;
    let mut through = Value::Null;
    let mut pages = 0;
    loop {
        let mut params = json!({"sessionId": sid, "query": "needle", "caseSensitive": false, "wholeWord": true});
        if !after.is_null() {
            params["after"] = after.clone();
            params["through"] = through.clone();
        }
        let page = c.ok("session.search", params).await;
        if pages == 0 {
            through = page["through"].clone();
            assert_eq!(through, json!(ROWS + 1));
        }
        assert_eq!(page["through"], through, "the fence stays fixed");
        for h in page["hits"].as_array().unwrap() {
            let seq = h["position"]["sourceSequence"].as_i64().unwrap();
            assert!(seq <= ROWS + 1, "a row after the fence appeared: {h}");
            assert_eq!(h["end"].as_u64().unwrap() - h["start"].as_u64().unwrap(), 6);
            let key = (
                seq,
                if h["field"] == "body" { "body" } else { "thinking" },
                h["start"].as_u64().unwrap(),
            );
            assert!(seen.insert(key), "hit {h} appeared twice");
        }
        pages += 1;
        // New turns append behind the fence while the search runs.
        if pages % 50 == 1 {
            mock.push(Reply::text(&["needle in a new turn"]));
            let last = c.ok("session.get", json!({"sessionId": sid})).await["sequence"].clone();
            let mut w = c.subscribe("session.watch", json!({"sessionId": sid, "after": last}));
            c.ok("session.send", json!({"sessionId": sid, "prompt": "needle again"}))
                .await;
            w.until(120, is_turn_end).await.expect("turn ends");
        }
        after = page["nextAfter"].clone();
        if after.is_null() {
            break;
        }
        assert!(pages < 2000, "the search does not advance");
    }
    assert!(pages >= 200, "pages are bounded in work ({pages} pages)");
    let expected = expected_hits(ROWS);
    let missing: Vec<_> = expected.difference(&seen).take(5).collect();
    let extra: Vec<_> = seen.difference(&expected).take(5).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{} hits, {} expected; missing {missing:?}, unexpected {extra:?}",
        seen.len(),
        expected.len()
    );

    // A hit opens exactly its field with `session.history {target}`.
    let hit = c
        .ok(
            "session.search",
            json!({"sessionId": sid, "query": "NEEDLE", "caseSensitive": true, "wholeWord": false}),
        )
        .await["hits"][0]
        .clone();
    assert_eq!(hit["field"], "thinking");
    let opened = c
        .ok(
            "session.history",
            json!({"sessionId": sid, "target": {"kind": "row", "position": hit["position"], "field": hit["field"]}}),
        )
        .await;
    let text = opened["rows"][0]["thinking"].as_str().unwrap();
    let (s, e) = (
        hit["start"].as_u64().unwrap() as usize,
        hit["end"].as_u64().unwrap() as usize,
    );
    assert_eq!(&text[s..e], "NEEDLE");

    // Newer rows are found by a new search, and bad input is a typed error.
    let fresh = c
        .ok(
            "session.search",
            json!({"sessionId": sid, "query": "needle again", "caseSensitive": true, "wholeWord": false,
                   "after": {"position": {"sourceSequence": ROWS + 1, "itemIndex": 0}}}),
        )
        .await;
    assert!(!fresh["hits"].as_array().unwrap().is_empty());
    let e = c
        .call(
            "session.search",
            json!({"sessionId": sid, "query": "", "caseSensitive": false, "wholeWord": false}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "bad-params");
    let e = c
        .call(
            "session.search",
            json!({"sessionId": "ses_nope", "query": "x", "caseSensitive": false, "wholeWord": false}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "not-found");
}

/// Fork of an earlier complete turn while a later one runs; the fork keeps that history,
/// has no active work, narrowed permissions and no diagnostics; a fork whose response was
/// lost is found by `session.forkReceipt` and a retry does not make a second one.
#[tokio::test(flavor = "multi_thread")]
async fn fork_a_settled_turn_while_a_later_one_runs() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    let mut c = stack.client(0).await;
    let created = c
        .ok(
            "session.create",
            json!({"workspaceId": stack.workspace_id, "title": "source", "autoApprove": true}),
        )
        .await;
    let sid = created["sessionId"].as_str().unwrap().to_string();
    let mut w = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));

    // Turn 1 fails at the provider (a diagnostic), turn 2 completes, turn 3 keeps running.
    mock.push(Reply::Status(500));
    let t1 = c.ok("session.send", json!({"sessionId": sid, "prompt": "first"})).await;
    w.until(30, is_turn_end).await.unwrap();
    mock.push(Reply::text(&["second answer"]));
    let t2 = c
        .ok("session.send", json!({"sessionId": sid, "prompt": "second"}))
        .await;
    let ended = w.until(30, is_turn_end).await.unwrap();
    let t2_end = ended.last().unwrap()["sequence"].as_i64().unwrap();
    mock.push(Reply::StreamThenHang(vec![Part::Text("third, still going".into())]));
    let t3 = c.ok("session.send", json!({"sessionId": sid, "prompt": "third"})).await;
    w.until(30, |i| i["type"] == "model.delta").await.unwrap();
    let snap = c.ok("session.get", json!({"sessionId": sid})).await;
    let revision = snap["historyRevision"].clone();
    assert!(
        !c.ok("session.diagnostics", json!({"sessionId": sid})).await["diagnostics"]
            .as_array()
            .unwrap()
            .is_empty()
    );

    // Work that is not settled cannot be included.
    for turn in [Value::Null, t3["turnId"].clone()] {
        let e = c
            .call(
                "session.fork",
                json!({"sessionId": sid, "turnId": turn, "sourceRevision": revision, "operationId": format!("busy-{turn}")}),
            )
            .await
            .unwrap_err();
        assert_eq!(code(&e), "turn-busy");
    }
    let e = c
        .call(
            "session.fork",
            json!({"sessionId": sid, "turnId": t2["turnId"], "sourceRevision": 99, "operationId": "stale"}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "stale-revision");

    // The response is lost: the request goes out and its answer is never read.
    let params = json!({"sessionId": sid, "turnId": t2["turnId"], "sourceRevision": revision, "operationId": "fork-1"});
    let lost = stack.client(1).await;
    lost.pause_reading(true);
    lost.send_raw(&json!({"jsonrpc": "2.0", "id": 77, "method": "session.fork", "params": params}).to_string());
    let mut other = stack.client(1).await;
    let mut found = Value::Null;
    for _ in 0..400 {
        found = other.ok("session.forkReceipt", json!({"operationId": "fork-1"})).await;
        if !found.is_null() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(!found.is_null(), "the published fork is found by its receipt");
    drop(lost);
    let retried = other.ok("session.fork", params.clone()).await;
    assert_eq!(retried, found, "a retry returns the same fork");
    let fork_id = found["sessionId"].as_str().unwrap().to_string();
    assert_eq!(
        found["branch"],
        json!({"sessionId": sid, "turnId": t2["turnId"], "sequence": t2_end})
    );
    let forks = stack
        .sql_i64("SELECT count(*) FROM sessions WHERE branch->>'sessionId' = $1", &sid)
        .await;
    assert_eq!(forks, 1, "exactly one fork");

    // The fork: history through turn 2, no active work, narrowed permissions, no diagnostics.
    let source_rows = c
        .ok("session.history", json!({"sessionId": sid, "through": t2_end}))
        .await["rows"]
        .clone();
    let fork_rows = c.ok("session.history", json!({"sessionId": fork_id})).await["rows"].clone();
    assert_eq!(fork_rows, source_rows);
    let bodies: Vec<&str> = fork_rows
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["body"].as_str())
        .collect();
    assert!(bodies.contains(&"second answer"));
    assert!(!bodies.contains(&"third"));
    let fsnap = c.ok("session.get", json!({"sessionId": fork_id})).await;
    assert!(fsnap["running"].is_null());
    assert!(fsnap["queue"].as_array().is_none_or(|q| q.is_empty()));
    assert_eq!(fsnap["workspaceId"], snap["workspaceId"]);
    assert_eq!(fsnap["title"], "source");
    assert_eq!(
        stack
            .sql_i64("SELECT auto_approve::int::bigint FROM sessions WHERE id = $1", &fork_id)
            .await,
        0
    );
    let fdiag = c.ok("session.diagnostics", json!({"sessionId": fork_id})).await;
    assert_eq!(fdiag["diagnostics"], json!([]));
    let list = c.ok("session.list", json!({})).await;
    let entry = list["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["sessionId"] == fork_id.as_str())
        .unwrap()
        .clone();
    // The list and the snapshot name the fork's source as the fork's answer did.
    assert_eq!(entry["branch"]["sessionId"], sid.as_str());
    let got = c.ok("session.get", json!({"sessionId": fork_id})).await;
    assert_eq!(entry["branch"], got["branch"]);
    assert_eq!(got["branch"]["sessionId"], sid.as_str());
    assert!(got["branch"]["sequence"].as_i64().is_some(), "{got}");
    // The fork's watchers see its history and then the fork's own event, without a gap.
    let mut fw = c.subscribe("session.watch", json!({"sessionId": fork_id, "after": 0}));
    let items = fw.until(10, |i| i["type"] == "session.forked").await.unwrap();
    let seqs: Vec<i64> = items.iter().filter_map(|i| i["sequence"].as_i64()).collect();
    assert_eq!(seqs, (1..=t2_end + 1).collect::<Vec<_>>());
    // The fork is a session of its own: it runs turns.
    mock.push(Reply::text(&["on the branch"]));
    c.ok("session.send", json!({"sessionId": fork_id, "prompt": "go on"}))
        .await;
    let done = fw.until(30, is_turn_end).await.unwrap();
    assert_eq!(done.last().unwrap()["state"], "completed");

    // Stopping the source's running turn leaves the fork alone.
    c.ok("session.stop", json!({"sessionId": sid, "turnId": t3["turnId"]}))
        .await;
    let _ = t1;
}

/// Index entries of `rows` read so far in this database, once every backend's counts have
/// reached the statistics (a backend reports them within 10 s of going idle).
async fn rows_index_reads(db: &tokio_postgres::Client, after: i64) -> i64 {
    let read = || async {
        db.query_one(
            "SELECT coalesce(sum(idx_tup_read), 0)::bigint FROM pg_stat_user_indexes WHERE relname = 'rows'",
            &[],
        )
        .await
        .expect("index statistics")
        .get::<_, i64>(0)
    };
    // Idle backends report within 10 s: read after that, and at least once past `after`.
    tokio::time::sleep(std::time::Duration::from_secs(11)).await;
    harness::eventually(20, || async { Some(read().await).filter(|n| *n > after) })
        .await
        .expect("the statistics report the reads")
}

/// Pages of a long session read their own rows only: `session.history` pages from the
/// middle of a 20 000-row session and `session.search` pages from its start walk the
/// primary key from the page's start. (The generic plan a pooled connection makes from the
/// table's statistics read every row after the page's start and sorted them: ≈ 10 000–20 000
/// index entries a page here, 35–50 ms a page at 100 000 rows.)
#[tokio::test(flavor = "multi_thread")]
async fn pages_of_a_long_session_read_only_their_rows() {
    const LONG: i64 = 20_000;
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    let db = harness::db(&stack.database_url).await;
    fill(
        &db,
        &sid,
        LONG,
        "CASE WHEN g % 7 = 0 THEN 'a needle' ELSE 'plain row ' || g END",
        "NULL",
    )
    .await;
    let before = rows_index_reads(&db, -1).await;

    for k in 0..5 {
        let at = 10_000 + k * 1_000;
        let page = c
            .ok(
                "session.history",
                json!({"sessionId": sid, "after": {"sourceSequence": at, "itemIndex": 0}, "limit": 200}),
            )
            .await;
        let rows = page["rows"].as_array().expect("rows");
        assert_eq!(rows.len(), 200);
        assert_eq!(rows[0]["position"]["sourceSequence"], json!(at + 1));
    }
    let mut after = Value::Null;
    let mut through = Value::Null;
    for _ in 0..5 {
        let mut params = json!({"sessionId": sid, "query": "needle", "caseSensitive": false, "wholeWord": false});
        if !after.is_null() {
            params["after"] = after.clone();
            params["through"] = through.clone();
        }
        let page = c.ok("session.search", params).await;
        assert!(!page["hits"].as_array().expect("hits").is_empty());
        through = page["through"].clone();
        after = page["nextAfter"].clone();
        assert!(!after.is_null(), "more pages follow");
    }

    // The pages' own rows: 5 × 201 for history, 5 × (501 sizes + 500 rows) for search.
    let read = rows_index_reads(&db, before).await - before;
    assert!(
        read < 10_000,
        "ten pages read {read} index entries of `rows`: they walked more than their own rows"
    );
}
