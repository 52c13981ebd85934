//! The wire contract as a client author meets it (issue 21, issue 7 item 2): every method and
//! item typed in the protocol crate, history and watch without loops or silent gaps, the
//! queue kept current, forward-compatible params, and limits on what a member can make a
//! replica hold.

use std::{collections::BTreeSet, time::Duration};

use berth_e2e::{Client, MockProvider, Part, Reply, Stack, client::code};
use berth_protocol::{
    ErrorCode, EventPayload, MAX_PROMPT_BYTES, MAX_QUEUE_LENGTH, METHOD_NAMES, Method, QUEUE_PREVIEW_BYTES, WatchItem,
    method,
};
use serde_json::{Value, json};

/// Serialize → typed → serialize: the typed value must describe every field, add none, and
/// leave optional fields absent rather than null, except those SPEC gives as null.
fn assert_typed<T: serde::de::DeserializeOwned + serde::Serialize>(what: &str, wire: &Value) {
    let typed: T = serde_json::from_value(wire.clone()).unwrap_or_else(|e| panic!("{what}: {e}\n{wire}"));
    let back = serde_json::to_value(&typed).unwrap();
    assert_eq!(&back, wire, "{what}: the protocol crate does not describe this exactly");
    assert!(
        !has_null_field(wire),
        "{what}: a field is null instead of absent: {wire}"
    );
}

/// The fields SPEC gives as null when they have no value: a last page's cursor, an idle
/// session's `running`, an unborn repository's `head`, a workspace never served's
/// `lastSeenAt`.
const NULL_BY_SPEC: [&str; 5] = ["nextAfter", "next", "running", "head", "lastSeenAt"];

fn has_null_field(v: &Value) -> bool {
    match v {
        Value::Object(m) => m
            .iter()
            .any(|(k, v)| (v.is_null() && !NULL_BY_SPEC.contains(&k.as_str())) || has_null_field(v)),
        Value::Array(a) => a.iter().any(has_null_field),
        _ => false,
    }
}

/// The model output a watcher draws from `model.delta` items, by their offsets. A gap (a
/// piece past the end of what it has) is a silent loss unless a `resync` came first.
#[derive(Default)]
struct Drawn {
    text: String,
    resyncs: usize,
    awaiting_redraw: bool,
}

impl Drawn {
    fn apply(&mut self, item: &Value) {
        match item["type"].as_str() {
            Some("resync") => {
                self.resyncs += 1;
                self.awaiting_redraw = true;
            }
            Some("model.delta") => {
                let Some(piece) = item["text"].as_str() else { return };
                let offset = item["textOffset"].as_u64().expect("textOffset with text") as usize;
                if offset == 0 {
                    self.text = piece.to_string();
                    self.awaiting_redraw = false;
                } else {
                    assert!(!self.awaiting_redraw, "after resync the text restarts at offset 0");
                    assert_eq!(offset, self.text.len(), "a gap or overlap in streamed text");
                    self.text.push_str(piece);
                }
            }
            _ => {}
        }
    }
}

/// A session whose one completion has two rows: a 3000-byte text with a short thought, and
/// a tool call. Returns the client, the session and the completion's sequence.
async fn two_row_completion(stack: &Stack, mock: &MockProvider) -> (Client, String, i64) {
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    // One completion with two rows (text and a tool call), the text large with a short thought.
    let body = "b".repeat(3000);
    mock.push(Reply::Stream(vec![
        Part::Reasoning("a short thought".into()),
        Part::Text(body.clone()),
        Part::ToolCall {
            index: 0,
            id: "call_1".into(),
            name: "read".into(),
            argument_pieces: vec!["{}".into()],
        },
    ]));
    mock.push(Reply::text(&["done"]));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "go"})).await;
    let items = watch
        .until(30, |i| i["type"] == "model.completed")
        .await
        .expect("completion");
    let completed = items.last().unwrap();
    assert_eq!(completed["rows"].as_array().unwrap().len(), 2);
    (c, sid, completed["sequence"].as_i64().unwrap())
}

/// `session.history {target: event}` pages through that event's rows and ends: following
/// `nextAfter` never loops.
#[tokio::test(flavor = "multi_thread")]
async fn history_event_target_pages_to_an_end() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let (mut c, sid, seq) = two_row_completion(&stack, &mock).await;
    let mut after = Value::Null;
    let mut seen = Vec::new();
    for _ in 0..5 {
        let mut params = json!({"sessionId": sid, "limit": 1, "target": {"kind": "event", "sequence": seq}});
        if !after.is_null() {
            params["after"] = after.clone();
        }
        let page = c.ok("session.history", params).await;
        for r in page["rows"].as_array().unwrap() {
            seen.push(r["position"]["itemIndex"].as_i64().unwrap());
        }
        after = page.get("nextAfter").cloned().unwrap_or(Value::Null);
        if after.is_null() {
            break;
        }
    }
    assert!(after.is_null(), "following nextAfter must end");
    assert_eq!(seen, [0, 1], "each row of the event once, in order");
}

/// `session.history {target: row, field}` serves the named field first.
#[tokio::test(flavor = "multi_thread")]
async fn history_row_target_serves_the_named_field() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let (mut c, sid, seq) = two_row_completion(&stack, &mock).await;
    // The row's thinking is asked for: it comes whole even though the body fills the budget.
    let row = c
        .ok(
            "session.history",
            json!({"sessionId": sid, "maxBytes": 1024, "target": {"kind": "row", "field": "thinking",
                   "position": {"sourceSequence": seq, "itemIndex": 0}}}),
        )
        .await;
    let row = &row["rows"][0];
    assert_eq!(row["thinking"], "a short thought");
    assert!(row["truncated"].get("thinking").is_none(), "{row}");
    assert_eq!(row["truncated"]["body"]["bytes"], 3000);
    // And the body when the body is asked for.
    let row = c
        .ok(
            "session.history",
            json!({"sessionId": sid, "maxBytes": 4096, "target": {"kind": "row", "field": "body",
                   "position": {"sourceSequence": seq, "itemIndex": 0}}}),
        )
        .await;
    assert_eq!(row["rows"][0]["body"], "b".repeat(3000));
}

/// `queue.changed` follows every change of the queue: a send that queues, a queued turn
/// starting, and a clear that cancels the queue.
#[tokio::test(flavor = "multi_thread")]
async fn queue_changed_follows_send_start_and_clear() {
    let mock = MockProvider::start().await;
    let mut stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    stack.kill_worker().await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let sent = c
        .ok("session.send", json!({"sessionId": sid, "prompt": "queued one"}))
        .await;
    assert_eq!(sent["state"], "queued");
    let items = watch
        .until(10, |i| i["type"] == "queue.changed")
        .await
        .expect("queue.changed on send");
    let changed = items.last().unwrap();
    assert_eq!(changed["queue"][0]["queueId"], sent["queueId"]);
    assert_eq!(changed["queue"][0]["preview"], "queued one");

    // The worker comes back: the queued turn starts, and the queue shows it gone.
    mock.push(Reply::text(&["ok"]));
    stack.start_worker(0).await;
    let items = watch
        .until(20, |i| i["type"] == "queue.changed")
        .await
        .expect("queue.changed on start");
    assert!(items.iter().any(|i| i["type"] == "turn.started"));
    assert_eq!(items.last().unwrap()["queue"], json!([]));
    watch.until(20, |i| i["type"] == "turn.ended").await.expect("turn ends");

    // Clearing a session with a queue empties the queue watchers draw.
    c.ok("session.pause", json!({"sessionId": sid, "paused": true})).await;
    c.ok("session.send", json!({"sessionId": sid, "prompt": "held"})).await;
    watch.until(10, |i| i["type"] == "turn.queued").await.unwrap();
    c.ok("session.clear", json!({"sessionId": sid})).await;
    let items = watch
        .until(10, |i| i["type"] == "queue.changed" && i["queue"] == json!([]))
        .await;
    let items = items.expect("queue.changed on clear");
    assert!(items.iter().any(|i| i["type"] == "session.cleared"));
}

/// After catch-up, a watch sends the state a client draws — phase, running turn, queue,
/// pending interactions — and the running step's text so far.
#[tokio::test(flavor = "multi_thread")]
async fn watch_starts_with_the_state_a_client_draws() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    mock.push(Reply::StreamThenHang(vec![Part::Text("so far".into())]));
    let mut first = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let running = c.ok("session.send", json!({"sessionId": sid, "prompt": "one"})).await;
    first
        .until(20, |i| i["type"] == "model.delta")
        .await
        .expect("streaming");
    let queued = c.ok("session.send", json!({"sessionId": sid, "prompt": "two"})).await;
    let last = c.ok("session.get", json!({"sessionId": sid})).await["sequence"]
        .as_i64()
        .unwrap();

    let mut late = stack.client(0).await;
    let mut watch = late.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let items = watch.until(20, |i| i["type"] == "state").await.expect("a state item");
    let events = items.iter().filter(|i| i.get("sequence").is_some()).count() as i64;
    assert_eq!(events, last, "the state comes after catch-up");
    let state = items.last().unwrap();
    assert_eq!(state["phase"], "running");
    assert_eq!(state["running"], running["turnId"]);
    assert_eq!(state["queued"], 1);
    assert_eq!(state["queue"][0]["queueId"], queued["queueId"]);
    assert_eq!(state["paused"], false);
    assert_eq!(state["pendingInteractions"], json!([]));
    assert!(state["through"].as_i64().unwrap() >= last);
    let delta = watch.next(10).await.expect("the text so far");
    assert_eq!(delta["type"], "model.delta");
    assert_eq!(delta["text"], "so far");
    assert_eq!(delta["textOffset"], 0);
}

/// A watcher that falls behind the live stream is told (`resync`) and gets the text again
/// from offset 0: it never silently misses streamed text.
#[tokio::test(flavor = "multi_thread")]
async fn a_watcher_that_falls_behind_is_told_and_never_silently_misses_text() {
    let mock = MockProvider::start().await;
    // The paused reader answers no pings meanwhile: keep it from being closed as idle on a
    // slow machine. A small outbound queue makes its watch wait on the socket soon, so the
    // live stream overruns the hub's buffer however fast the replica is.
    let stack = Stack::start_with(
        &mock,
        1,
        &[("BERTH_WS_IDLE_SECS", "600"), ("BERTH_WS_OUTBOUND_BYTES", "16384")],
    )
    .await;
    let mut writer = stack.client(0).await;
    let sid = stack.session(&mut writer).await;
    let mut slow = Client::connect_small_buffer(&stack.servers[0].ws_url()).await.unwrap();
    slow.hello(&stack.token).await.unwrap();
    let mut sub = slow.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    sub.until(10, |i| i["sequence"] == 1).await.expect("joined");
    let mut watch = writer.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));

    // Far more live items than the hub keeps per session plus the outbound queue.
    let chunks: Vec<String> = (0..5000).map(|i| format!("{i:05}{}|", "x".repeat(100))).collect();
    let refs: Vec<&str> = chunks.iter().map(String::as_str).collect();
    mock.push(Reply::text(&refs));
    slow.pause_reading(true);
    writer
        .ok("session.send", json!({"sessionId": sid, "prompt": "stream"}))
        .await;
    let done = watch
        .until(120, |i| i["type"] == "turn.ended")
        .await
        .expect("turn ends");
    let body = done
        .iter()
        .find(|i| i["type"] == "model.completed")
        .map(|i| i["rows"][0]["body"].as_str().unwrap().to_string())
        .expect("completion");
    assert_eq!(body, chunks.concat());
    slow.pause_reading(false);

    let mut items = sub
        .until(120, |i| i["type"] == "turn.ended")
        .await
        .expect("slow watcher catches up");
    // Noticed only when it reads again, the lag's resync may come after the events the
    // catch-up delivers, and its state after them.
    if items.iter().any(|i| i["type"] == "resync")
        && !items
            .iter()
            .skip_while(|i| i["type"] != "resync")
            .any(|i| i["type"] == "state")
    {
        items.extend(
            sub.until(30, |i| i["type"] == "state")
                .await
                .expect("state after resync"),
        );
    }
    let mut drawn = Drawn::default();
    for item in &items {
        drawn.apply(item);
    }
    assert!(drawn.resyncs > 0, "the watcher fell behind (the scenario must lag)");
    // What it drew is a prefix of the text (a resync may come after the step's text was
    // complete); the completion event carries the whole of it.
    assert!(body.starts_with(&drawn.text));
    let after_resync = items
        .iter()
        .skip_while(|i| i["type"] != "resync")
        .any(|i| i["type"] == "state");
    assert!(after_resync, "a state item follows resync");
}

/// Before `hello` every name, declared or not, is `unauthorized`; `hello` without a token
/// is `bad-params`; a newer client's extra `hello` fields are ignored.
#[tokio::test(flavor = "multi_thread")]
async fn before_hello_everything_is_unauthorized() {
    let mock = MockProvider::start().await;
    let db = berth_e2e::fresh_database().await;
    let server = berth_e2e::TestServer::start(&db, &mock.base_url()).await.unwrap();
    let token = server.admin_token();
    let mut anon = Client::connect(&server.ws_url()).await.unwrap();
    for m in ["no.such.method", "session.get", "ping"] {
        let e = anon.call(m, json!({})).await.unwrap_err();
        assert_eq!(code(&e), "unauthorized", "{m}");
    }
    let e = anon.call("hello", json!({"protocol": 1})).await.unwrap_err();
    assert_eq!(code(&e), "bad-params");
    assert_eq!(e.data["field"], "token");
    anon.ok(
        "hello",
        json!({"protocol": 1, "token": token, "capabilities": {"x": 1}}),
    )
    .await;
    // Signed in, a message far past a hello's size is served (as with the header).
    let pad = "x".repeat(100_000);
    assert_eq!(anon.ok("ping", json!({"pad": pad})).await["pong"], true);

    // Before hello, the same message closes the connection (1009), and so does any binary
    // message (1008); the server keeps serving.
    for binary in [false, true] {
        let nobody = Client::connect(&server.ws_url()).await.unwrap();
        if binary {
            nobody.send_binary(vec![0, 0, 0, 1, 42]);
        } else {
            nobody.send_raw(&format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"hello\",\"params\":{{\"pad\":\"{pad}\"}}}}"
            ));
        }
        let closed = berth_e2e::harness::eventually(5, || {
            let c = *nobody.closed.lock().unwrap();
            async move { c }
        })
        .await;
        assert_eq!(closed, Some(Some(if binary { 1008 } else { 1009 })));
    }
    assert_eq!(anon.ok("ping", json!({})).await["pong"], true);
}

/// Unknown params fields are ignored; a known field with the wrong type stays `bad-params`.
#[tokio::test(flavor = "multi_thread")]
async fn params_are_forward_compatible() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let ws = stack.workspace_id.clone();
    let e = c
        .call("session.create", json!({"workspaceId": ws, "channel": 7}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "bad-params", "a wrong type");
    let snap = c.ok("session.create", json!({"workspaceId": ws})).await;
    let e = c
        .call(
            "session.setModel",
            json!({"sessionId": snap["sessionId"], "provider": "openai"}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "unknown-provider");
    assert_eq!(e.data["provider"], "openai");
    // A known field with the wrong type stays bad-params.
    let e = c
        .call("session.create", json!({"workspaceId": ws, "delegationDepth": "deep"}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "bad-params");
    let e = c
        .call("session.create", json!({"workspaceId": ws, "kind": "manager"}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "bad-params");
    let snap = c
        .ok("session.create", json!({"workspaceId": ws, "futureField": true}))
        .await;
    let got = c
        .ok("session.get", json!({"sessionId": snap["sessionId"], "futureField": 1}))
        .await;
    assert_eq!(got["sessionId"], snap["sessionId"]);
}

/// Null is absent, in receipts too: a retry that sends `null` for a field the first call
/// left out is the same operation, not `operation-conflict`.
#[tokio::test(flavor = "multi_thread")]
async fn a_retry_with_null_for_an_absent_field_is_the_same_operation() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let ws = stack.workspace_id.clone();
    let snap = c
        .ok(
            "session.create",
            json!({"workspaceId": ws, "title": null, "operationId": "op-null"}),
        )
        .await;
    let again = c
        .ok("session.create", json!({"workspaceId": ws, "operationId": "op-null"}))
        .await;
    assert_eq!(again["sessionId"], snap["sessionId"], "the same operation");
    let e = c
        .call(
            "session.create",
            json!({"workspaceId": ws, "title": "other", "operationId": "op-null"}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "operation-conflict");
}

/// Walk every declared method and every event type a session produces: each result, event
/// and live item read back exactly into the protocol crate's types (the seed of the schema
/// test), and every error carries a declared code.
#[tokio::test(flavor = "multi_thread")]
async fn every_method_and_event_matches_the_protocol_types() {
    let mock = MockProvider::start().await;
    let mut stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let mut walked: BTreeSet<&str> = BTreeSet::new();
    let ws = stack.workspace_id.clone();

    macro_rules! check {
        ($m:ty, $params:expr) => {{
            let params: Value = $params;
            serde_json::from_value::<<$m as Method>::Params>(params.clone())
                .unwrap_or_else(|e| panic!("{} params: {e}", <$m as Method>::NAME));
            walked.insert(<$m as Method>::NAME);
            match c.call(<$m as Method>::NAME, params).await {
                Ok(v) => {
                    assert_typed::<<$m as Method>::Result>(<$m as Method>::NAME, &v);
                    v
                }
                Err(e) => {
                    serde_json::from_value::<ErrorCode>(json!(code(&e)))
                        .unwrap_or_else(|_| panic!("undeclared error code {e}"));
                    panic!("{} failed: {e}", <$m as Method>::NAME)
                }
            }
        }};
    }

    check!(method::Hello, json!({"protocol": 1, "token": stack.token}));
    check!(method::Ping, json!({}));
    check!(method::Status, json!({}));
    check!(method::WorkspaceList, json!({}));
    check!(method::WorkspaceGet, json!({"workspaceId": ws}));
    let snap = check!(method::SessionCreate, json!({"workspaceId": ws, "title": "walk"}));
    let sid = snap["sessionId"].as_str().unwrap().to_string();
    check!(method::SessionCreate, json!({"workspaceId": ws, "channel": "walk"}));
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    walked.insert(method::SessionWatch::NAME);
    check!(method::SessionGet, json!({"sessionId": sid}));
    check!(method::SessionRename, json!({"sessionId": sid, "title": "renamed"}));
    check!(
        method::SessionSetModel,
        json!({"sessionId": sid, "model": "other-model"})
    );
    check!(method::SessionSetModel, json!({"sessionId": sid}));
    let agent = check!(
        method::AgentSave,
        json!({"name": "walker", "systemPrompt": "Walk.", "tools": ["read_file"], "params": {"topP": 0.5}})
    );
    check!(
        method::AgentSave,
        json!({"agentId": agent["agentId"], "name": "walker", "approval": "auto"})
    );
    check!(method::AgentList, json!({}));
    check!(method::AgentGet, json!({"agentId": agent["agentId"]}));
    check!(
        method::SessionSetAgent,
        json!({"sessionId": sid, "agent": agent["agentId"]})
    );
    check!(method::SessionSetAgent, json!({"sessionId": sid}));
    check!(method::AgentRemove, json!({"agentId": agent["agentId"]}));
    let skill = check!(
        method::SkillSave,
        json!({"name": "walking", "summary": "How to walk", "body": "Left, right."})
    );
    check!(method::SkillGet, json!({"skillId": skill["skillId"]}));
    check!(method::SkillList, json!({"workspaceId": ws}));
    check!(method::SkillRemove, json!({"skillId": skill["skillId"]}));
    // Saved disabled, so the walk's turns connect to nothing.
    check!(
        method::McpSave,
        json!({"name": "walk-stdio", "enabled": false,
               "transport": {"kind": "stdio", "command": "srv", "args": ["-v"], "env": {"TOKEN": "t"}}})
    );
    check!(
        method::McpSave,
        json!({"name": "walk-http", "enabled": false,
               "transport": {"kind": "http", "url": "https://mcp.example/", "headers": {"authorization": "Bearer t"}}})
    );
    check!(method::McpList, json!({}));
    check!(method::McpRemove, json!({"name": "walk-stdio"}));
    check!(method::McpRemove, json!({"name": "walk-http"}));
    mock.push(Reply::Stream(vec![
        Part::Reasoning("hm".into()),
        Part::Text("hello".into()),
        Part::Usage {
            prompt: 3,
            completion: 4,
        },
    ]));
    let t1 = check!(
        method::SessionSend,
        json!({"sessionId": sid, "prompt": "hi", "operationId": "walk-1"})
    );
    let mut items = watch.until(30, |i| i["type"] == "turn.ended").await.expect("turn ends");
    let receipt = check!(method::OperationReceipt, json!({"operationId": "walk-1"}));
    assert_eq!(receipt["state"], "done");
    check!(method::OperationReceipt, json!({"operationId": "never-used"}));
    let history = check!(method::SessionHistory, json!({"sessionId": sid}));
    let position = history["rows"][0]["position"].clone();
    check!(
        method::SessionHistory,
        json!({"sessionId": sid, "target": {"kind": "row", "position": position, "field": "body"}})
    );
    check!(
        method::SessionSource,
        json!({"sessionId": sid, "position": position, "field": "body"})
    );
    check!(method::SessionList, json!({}));
    check!(method::SessionDiagnostics, json!({"sessionId": sid}));
    // Observation (answered by the worker): a repository with a commit and a change.
    let dir = stack.workspace_dir.clone();
    for args in [
        &["init", "-q", "-b", "main"][..],
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "walk",
        ],
    ] {
        let ok = std::process::Command::new("git")
            .args(args)
            .current_dir(&dir)
            .status()
            .unwrap();
        assert!(ok.success());
    }
    std::fs::write(dir.join("walk.txt"), "walk\n").unwrap();
    let walk_txt = json!({"bytesBase64": "d2Fsay50eHQ="});
    check!(method::GitStatusGet, json!({"sessionId": sid}));
    check!(
        method::GitDiffGet,
        json!({"sessionId": sid, "path": walk_txt, "area": "untracked"})
    );
    let patch = check!(
        method::PatchSnapshot,
        json!({"sessionId": sid, "operationId": "walk-patch"})
    );
    check!(method::PatchRead, json!({"patchId": patch["patchId"]}));
    check!(method::FilesList, json!({"sessionId": sid}));
    check!(method::WorkspaceFiles, json!({"workspaceId": ws, "prefix": "w"}));
    check!(method::WorkspaceRename, json!({"workspaceId": ws, "title": "walked"}));
    let mut read = c.subscribe("files.read", json!({"sessionId": sid, "path": walk_txt}));
    walked.insert(method::FilesRead::NAME);
    for _ in 0..3 {
        let item = read.next(30).await.expect("a read item");
        assert_typed::<berth_protocol::FilesReadItem>("files.read item", &item);
    }
    assert!(read.done.await.unwrap().error.is_none());
    assert_typed::<<method::FilesRead as Method>::Result>("files.read", &Value::Null);
    let mut files_watch = c.subscribe("files.watch", json!({"sessionId": sid}));
    walked.insert(method::FilesWatch::NAME);
    let ready = files_watch.next(30).await.expect("ready");
    assert_typed::<berth_protocol::FilesWatchItem>("files.watch item", &ready);
    c.ok("subscription.close", json!({"id": files_watch.id})).await;
    let done = files_watch.done.await.unwrap();
    assert!(done.error.is_none());
    assert_typed::<<method::FilesWatch as Method>::Result>("files.watch", &Value::Null);
    check!(method::SessionContext, json!({"sessionId": sid}));
    mock.push_matching(berth_e2e::SUMMARY_REQUEST, Reply::text(&["Summary."]));
    let compacted = check!(method::SessionCompact, json!({"sessionId": sid}));
    assert_eq!(compacted["compacted"], true);
    let mut diags = c.subscribe("session.watchDiagnostics", json!({"sessionId": sid}));
    walked.insert(method::SessionWatchDiagnostics::NAME);
    let item = diags.next(10).await.expect("the current diagnostic revision");
    assert_typed::<berth_protocol::DiagnosticsRevision>("diagnostics item", &item);
    c.ok("subscription.close", json!({"id": diags.id})).await;
    // Interactions: this worker never asks, so one is written as the store writes it.
    berth_e2e::harness::db(&stack.database_url)
        .await
        .execute(
            "INSERT INTO interactions (id, tenant_id, session_id, turn_id, call_id, kind, request, fallback, state, expires_at)
             SELECT 'int_walk', tenant_id, id, $2, 'call', 'approval', '{\"input\": {\"command\": \"make\"}}',
                    '{\"approved\": false}', 'pending', now() + interval '1 hour' FROM sessions WHERE id = $1",
            &[&sid, &t1["turnId"].as_str().unwrap()],
        )
        .await
        .unwrap();
    check!(method::SessionPendingInteractions, json!({"sessionId": sid}));
    check!(method::SessionInteraction, json!({"interactionId": "int_walk"}));
    check!(
        method::SessionRespond,
        json!({"interactionId": "int_walk", "answer": {"approved": true}})
    );
    check!(
        method::SessionSearch,
        json!({"sessionId": sid, "query": "HELLO", "caseSensitive": false, "wholeWord": true})
    );
    let revision = c.ok("session.get", json!({"sessionId": sid})).await["historyRevision"].clone();
    let fork = check!(
        method::SessionFork,
        json!({"sessionId": sid, "sourceRevision": revision, "operationId": "walk-fork"})
    );
    check!(method::SessionForkReceipt, json!({"operationId": "walk-fork"}));
    let mut fork_watch = c.subscribe("session.watch", json!({"sessionId": fork["sessionId"], "after": 0}));
    for item in fork_watch
        .until(10, |i| i["type"] == "session.forked")
        .await
        .expect("the fork's own event")
    {
        assert_typed::<WatchItem>("fork watch item", &item);
    }
    // The queue: offline worker (a notice), three queued turns, then edits.
    stack.kill_worker().await;
    // An upload is a request plus one binary message, so it is walked by hand.
    let upload = json!({"sessionId": sid, "mime": "text/plain", "filename": "walk.txt"});
    serde_json::from_value::<<method::ContentUpload as Method>::Params>(upload.clone()).unwrap();
    let uploaded = c.upload(upload, b"walked", None).await.expect("content.upload");
    assert_typed::<<method::ContentUpload as Method>::Result>("content.upload", &uploaded);
    walked.insert(method::ContentUpload::NAME);
    check!(method::ContentRead, json!({"attachmentId": uploaded["attachmentId"]}));
    let q1 = check!(
        method::SessionSend,
        json!({"sessionId": sid, "prompt": "q1", "attachments": [uploaded["attachmentId"]]})
    );
    let q2 = check!(method::SessionSend, json!({"sessionId": sid, "prompt": "q2"}));
    let q3 = check!(method::SessionSend, json!({"sessionId": sid, "prompt": "q3"}));
    check!(
        method::QueueUpdate,
        json!({"sessionId": sid, "queueId": q1["queueId"], "queueRevision": 0, "prompt": "q1!"})
    );
    check!(method::QueueGet, json!({"sessionId": sid, "queueId": q1["queueId"]}));
    check!(
        method::QueueMove,
        json!({"sessionId": sid, "queueId": q2["queueId"], "queueRevision": 0, "beforeQueueId": q1["queueId"]})
    );
    check!(
        method::QueueRemove,
        json!({"sessionId": sid, "queueId": q2["queueId"], "queueRevision": 1})
    );
    check!(method::SessionPause, json!({"sessionId": sid, "paused": true}));
    check!(method::SessionGet, json!({"sessionId": sid}));
    check!(method::SessionStop, json!({"sessionId": sid, "turnId": q3["turnId"]}));
    // Caught up before the clear (a watcher behind a clear is told `history-cleared`).
    items.extend(
        watch
            .until(10, |i| i["type"] == "turn.ended" && i["turnId"] == q3["turnId"])
            .await
            .expect("the stop"),
    );
    check!(method::SessionClear, json!({"sessionId": sid}));
    // Admin methods.
    let user = check!(method::AdminUserCreate, json!({"email": "walk@example.com"}));
    check!(method::AdminUserList, json!({}));
    let cred = check!(method::AdminCredentialCreate, json!({"userId": user["userId"]}));
    check!(method::AdminCredentialList, json!({}));
    check!(
        method::AdminCredentialRevoke,
        json!({"credentialId": cred["credentialId"]})
    );
    check!(
        method::AdminUserSetRole,
        json!({"userId": user["userId"], "role": "admin"})
    );
    check!(method::AdminUserDisable, json!({"userId": user["userId"]}));
    check!(method::AdminStatusGet, json!({}));
    check!(method::AdminAuditList, json!({"limit": 5}));
    check!(method::AdminWorkerList, json!({}));
    let other = check!(method::SessionCreate, json!({"workspaceId": ws}));
    check!(method::SessionRemove, json!({"sessionId": other["sessionId"]}));

    // Every item the watch delivered is a typed watch item.
    items.extend(
        watch
            .until(10, |i| {
                i["type"] == "queue.changed" && i["queue"] == json!([]) && i["paused"] == true
            })
            .await
            .expect("the clear's queue change"),
    );
    let mut types = BTreeSet::new();
    for item in &items {
        assert_typed::<WatchItem>("watch item", item);
        types.insert(item["type"].as_str().unwrap().to_string());
    }
    let events: BTreeSet<String> = EventPayload::samples()
        .iter()
        .map(|p| p.type_name().to_string())
        .collect();
    for produced in [
        "session.created",
        "session.titleChanged",
        "session.modelChanged",
        "session.agentChanged",
        "session.compacted",
        "session.notice",
        "session.cleared",
        "turn.queued",
        "turn.started",
        "model.completed",
        "turn.ended",
        "queue.changed",
        "interaction.resolved",
    ] {
        assert!(events.contains(produced), "{produced} is not in the typed union");
        assert!(types.contains(produced), "the walk did not see {produced}: {types:?}");
    }
    for live in ["state", "model.delta", "phase"] {
        assert!(types.contains(live), "the walk did not see {live}: {types:?}");
    }
    // The subscription ends with the declared final value.
    let id = watch.id;
    let closed = c.ok("subscription.close", json!({"id": id})).await;
    walked.insert(method::SubscriptionClose::NAME);
    assert_typed::<<method::SubscriptionClose as Method>::Result>("subscription.close", &closed);
    let done = tokio::time::timeout(Duration::from_secs(10), watch.done)
        .await
        .unwrap()
        .unwrap();
    assert!(done.error.is_none());
    assert_typed::<<method::SessionWatch as Method>::Result>("session.watch", &Value::Null);

    check!(method::WorkspaceRemove, json!({"workspaceId": ws}));

    let all: BTreeSet<&str> = METHOD_NAMES.iter().copied().collect();
    assert_eq!(walked, all, "every declared method is walked");
}

/// Resident memory of a process, in bytes (`VmHWM`: its peak so far).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

/// A member filling a paused queue with the largest prompts cannot push a replica's memory
/// past a bound: prompts over [`MAX_PROMPT_BYTES`] and turns past [`MAX_QUEUE_LENGTH`] are
/// refused with typed errors, and snapshots, queue events and catch-up batches carry
/// previews, never whole prompts. The bound stated: with a full queue of maximal prompts
/// (25 MiB), 20 snapshots and 10 watchers catching up from 0, all at once, raise the
/// replica's peak RSS by less than 64 MiB.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_queue_of_large_prompts_keeps_replica_memory_bounded() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let pid = stack.servers[0].child.id().unwrap();
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    c.ok("session.pause", json!({"sessionId": sid, "paused": true})).await;

    let too_big = "p".repeat(MAX_PROMPT_BYTES + 1);
    let e = c
        .call("session.send", json!({"sessionId": sid, "prompt": too_big}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "payload-too-large");
    assert_eq!(e.data["limit"], "prompt");
    assert_eq!(e.data["max"], MAX_PROMPT_BYTES);

    let prompt = "é".repeat(MAX_PROMPT_BYTES / 2);
    let mut first = None;
    for _ in 0..MAX_QUEUE_LENGTH {
        let r = c.ok("session.send", json!({"sessionId": sid, "prompt": prompt})).await;
        first.get_or_insert(r);
    }
    let e = c
        .call("session.send", json!({"sessionId": sid, "prompt": "one more"}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "queue-full");
    let e = c
        .call(
            "queue.update",
            json!({"sessionId": sid, "queueId": first.as_ref().unwrap()["queueId"], "queueRevision": 0,
                   "prompt": "p".repeat(MAX_PROMPT_BYTES + 1)}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "payload-too-large");

    // Previews, not prompts; the whole text on request.
    let snap = c.ok("session.get", json!({"sessionId": sid})).await;
    assert_eq!(snap["queued"], MAX_QUEUE_LENGTH);
    let entry = &snap["queue"][0];
    assert!(entry["preview"].as_str().unwrap().len() <= QUEUE_PREVIEW_BYTES);
    assert!(prompt.starts_with(entry["preview"].as_str().unwrap()));
    assert_eq!(entry["promptBytes"], prompt.len());
    let full = c
        .ok("queue.get", json!({"sessionId": sid, "queueId": entry["queueId"]}))
        .await;
    assert_eq!(full["prompt"], prompt.as_str());

    let before = peak_rss(pid);
    let url = stack.servers[0].ws_url();
    let mut tasks = Vec::new();
    // Ten connections (within the per-credential limit), each reading two snapshots and
    // catching up one watcher at once.
    for _ in 0..10 {
        let (url, token, sid) = (url.clone(), stack.token.clone(), sid.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = Client::authed(&url, &token).await.unwrap();
            let mut w = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
            for _ in 0..2 {
                let snap = c.ok("session.get", json!({"sessionId": sid})).await;
                assert!(snap.to_string().len() < 1 << 20, "a snapshot stays small");
            }
            let items = w.until(60, |i| i["type"] == "state").await.expect("caught up");
            let largest = items.iter().map(|i| i.to_string().len()).max().unwrap();
            assert!(largest < 1 << 20, "no item carries whole prompts: {largest} bytes");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let grown = peak_rss(pid).saturating_sub(before);
    assert!(grown < 64 << 20, "peak RSS grew by {} MiB", grown >> 20);
}

/// Events stored in the shape before typed payloads (whole prompts in queue entries, a
/// `revision`, nulls) read back as typed events after migration 0007.
#[tokio::test(flavor = "multi_thread")]
async fn events_stored_in_the_old_shape_read_back_typed_after_the_migration() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    let db = berth_e2e::harness::db(&stack.database_url).await;
    let long = "ü".repeat(300);
    let old = [
        (
            "turn.queued",
            json!({"queueId": "trn_old", "prompt": long, "revision": 0}),
        ),
        (
            "queue.changed",
            json!({"paused": true, "queue": [{"queueId": "trn_old", "turnId": "trn_old", "prompt": long, "revision": 2}]}),
        ),
        ("session.modelChanged", json!({"provider": null, "model": "m"})),
        ("model.completed", json!({"usage": null})),
    ];
    for (kind, payload) in &old {
        db.execute(
            "WITH s AS (UPDATE sessions SET last_sequence = last_sequence + 1 WHERE id = $1
                         RETURNING last_sequence, tenant_id)
             INSERT INTO events (session_id, sequence, tenant_id, type, turn_id, payload)
             SELECT $1, s.last_sequence, s.tenant_id, $2, 'trn_old', $3 FROM s",
            &[&sid, kind, payload],
        )
        .await
        .unwrap();
    }
    db.batch_execute(include_str!("../../migrations/0007_typed_event_payloads.sql"))
        .await
        .unwrap();
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let items = watch.until(20, |i| i["type"] == "state").await.expect("caught up");
    for item in &items {
        assert_typed::<WatchItem>("migrated event", item);
    }
    let queued = items.iter().find(|i| i["type"] == "turn.queued").unwrap();
    assert_eq!(queued["entry"]["promptBytes"], long.len());
    assert!(long.starts_with(queued["entry"]["preview"].as_str().unwrap()));
    let changed = items.iter().find(|i| i["type"] == "queue.changed").unwrap();
    assert_eq!(changed["queue"][0]["queueRevision"], 2);
    assert_eq!(changed["paused"], true);
}

/// Issue 52: the live `phase: idle` never arrives before the turn's last `model.completed`
/// and its `turn.ended` — a client that stops reading at idle has the answer — whether the
/// watcher is on the worker's replica or another one.
#[tokio::test(flavor = "multi_thread")]
async fn idle_comes_after_the_turns_last_events() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    for replica in [0, 1] {
        let mut c = stack.client(replica).await;
        let sid = stack.session(&mut c).await;
        let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
        for i in 0..5 {
            mock.push(berth_e2e::Reply::text(&["the ", "answer"]));
            let sent = c
                .ok("session.send", json!({"sessionId": sid, "prompt": format!("q{i}")}))
                .await;
            let turn = sent["turnId"].clone();
            let items = watch
                .until(30, |i| {
                    i["type"] == "phase" && i["phase"] == "idle" && i["turnId"] == turn
                })
                .await
                .expect("the turn goes idle");
            let ended = items.iter().any(|i| i["type"] == "turn.ended" && i["turnId"] == turn);
            let answered = items.iter().any(|i| {
                i["type"] == "model.completed"
                    && i["turnId"] == turn
                    && i["rows"]
                        .as_array()
                        .is_some_and(|r| r.iter().any(|r| r["body"] == "the answer"))
            });
            assert!(
                ended && answered,
                "replica {replica}, turn {i}: idle came first: {items:?}"
            );
        }
    }
}
