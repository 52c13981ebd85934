//! Streamed text without silent holes (issue 51): a watcher whose replica lost its LISTEN
//! connection (the other replicas' live output) gets `resync` and then the whole live view
//! and history again; `model.completed` names the step it completed.

use berth_e2e::{MockProvider, Part, Reply, Stack, harness::db};
use serde_json::{Value, json};

/// The running step's text as a watcher draws it from `model.delta` items: each piece goes
/// at its offset; a piece that would leave a hole is a failure.
fn draw(text: &mut String, item: &Value) {
    let (Some(piece), Some(offset)) = (item["text"].as_str(), item["textOffset"].as_u64()) else {
        return;
    };
    let offset = offset as usize;
    assert!(
        offset <= text.len(),
        "a hole in the streamed text: {item} after {text:?}"
    );
    text.truncate(offset);
    text.push_str(piece);
}

/// The replica with the turn's worker streams; the watcher is on the other replica, whose
/// LISTEN connection the test kills from the database side. The watcher gets `resync`
/// (reason `reconnected`), then `state` and the step's text from offset 0, with no hole,
/// and every history event exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn a_watcher_resyncs_after_its_replica_listens_again() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    let mut writer = stack.client(0).await;
    let sid = stack.session(&mut writer).await;
    let mut watcher = stack.client(1).await;
    let mut w = watcher.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let mut items = w
        .until(10, |i| i["type"] == "state")
        .await
        .expect("the watch catches up");

    mock.push(Reply::StreamThenHang(vec![
        Part::Text("one ".into()),
        Part::Delay(500),
        Part::Text("two ".into()),
        Part::Delay(500),
        Part::Text("three".into()),
    ]));
    let sent = writer
        .ok("session.send", json!({"sessionId": sid, "prompt": "count"}))
        .await;
    items.extend(
        w.until(30, |i| i["type"] == "model.delta")
            .await
            .expect("live output reaches the other replica"),
    );

    let sql = db(&stack.database_url).await;
    let killed: i64 = sql
        .query_one(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE datname = current_database() AND application_name = $1) k",
            &[&berth_store::LISTEN_APPLICATION_NAME],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(killed, 2, "each replica's one LISTEN connection");

    let resync = w
        .until(30, |i| i["type"] == "resync")
        .await
        .expect("the watcher is told its live view may have a hole");
    assert_eq!(resync.last().unwrap()["reason"], "reconnected");
    items.extend(resync);
    // After it: the state again, then the step's text from the start, whole.
    let mut text = String::new();
    let mut after = Vec::new();
    while text != "one two three" {
        let item = w.next(30).await.expect("the live view is drawn again");
        draw(&mut text, &item);
        after.push(item);
    }
    assert_eq!(
        after[0]["type"], "state",
        "the live view starts with the state: {after:?}"
    );
    let first = after.iter().find(|i| i["type"] == "model.delta").unwrap();
    assert_eq!(first["textOffset"], 0, "the text again from its start: {after:?}");
    items.extend(after);

    writer
        .ok("session.stop", json!({"sessionId": sid, "turnId": sent["turnId"]}))
        .await;
    items.extend(w.until(30, |i| i["type"] == "turn.ended").await.expect("the turn ends"));
    let seen: Vec<i64> = items.iter().filter_map(|i| i["sequence"].as_i64()).collect();
    let last = stack
        .sql_i64("SELECT last_sequence FROM sessions WHERE id = $1", &sid)
        .await;
    assert_eq!(seen, (1..=last).collect::<Vec<_>>(), "every event once, in order");
}

/// Each `model.completed` names its step, as the step's `model.delta` items do, in the
/// watch and in the stored history alike.
#[tokio::test(flavor = "multi_thread")]
async fn model_completed_names_its_step() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    let mut w = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    mock.push(Reply::Stream(vec![
        Part::Text("Looking.".into()),
        Part::tool_call(0, "call_1", "read_file", &json!({"path": "README.md"}), 8),
    ]));
    mock.push(Reply::Stream(vec![Part::Text("There is no readme.".into())]));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "Read the readme"}))
        .await;
    let items = w.until(30, |i| i["type"] == "turn.ended").await.expect("the turn ends");
    let steps = |items: &[Value], kind: &str| -> Vec<i64> {
        let mut s: Vec<i64> = items
            .iter()
            .filter(|i| i["type"] == kind)
            .map(|i| {
                i["step"]
                    .as_i64()
                    .unwrap_or_else(|| panic!("{kind} names its step: {i}"))
            })
            .collect();
        s.dedup();
        s
    };
    assert_eq!(steps(&items, "model.completed"), [0, 1]);
    assert_eq!(
        steps(&items, "model.delta"),
        [0, 1],
        "the same steps as the live output"
    );
    // Read back from the database by a new watch.
    let mut again = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let stored = again.until(30, |i| i["type"] == "turn.ended").await.expect("history");
    assert_eq!(steps(&stored, "model.completed"), [0, 1], "stored with the event");
}
