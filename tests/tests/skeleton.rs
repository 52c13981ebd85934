//! The walking skeleton, end to end: a client, `berth serve` and `berth worker` as separate
//! processes, a real PostgreSQL, and the scripted model provider.

use std::time::Duration;

use berth_e2e::{
    Client, MockProvider, Part, Reply, Stack, TestServer, TestWorker,
    client::code,
    fresh_database,
    harness::{self, eventually, scratch_dir},
};
use serde_json::{Value, json};

/// A stack (one replica, a worker whose workspace is online) and an authenticated client.
struct Skel {
    stack: Stack,
    client: Client,
}

impl Skel {
    async fn new(stack: Stack) -> Skel {
        let client = stack.client(0).await;
        Skel { stack, client }
    }

    fn server(&self) -> &TestServer {
        &self.stack.servers[0]
    }
}

async fn stack(mock: &MockProvider) -> Skel {
    Skel::new(Stack::start(mock, 1).await).await
}

fn is_turn_end(v: &Value) -> bool {
    v["type"] == "turn.ended"
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prompt_travels_client_to_model_to_history_and_watch() {
    let mock = MockProvider::start().await;
    mock.push(Reply::Stream(vec![
        Part::Reasoning("Let me think.".into()),
        Part::Text("Hel".into()),
        Part::Delay(30),
        Part::Text("lo, ".into()),
        Part::Delay(30),
        Part::Text("world".into()),
        Part::Usage {
            prompt: 12,
            completion: 3,
        },
    ]));
    let mut s = stack(&mock).await;
    let ws = s.workspace_list_entry().await;
    assert_eq!(ws["title"], "proj");
    assert_eq!(ws["host"], "test-host");

    let session = s
        .client
        .ok(
            "session.create",
            json!({"workspaceId": s.stack.workspace_id, "title": "demo"}),
        )
        .await;
    let sid = session["sessionId"].as_str().unwrap().to_string();
    assert_eq!(session["phase"], "idle");
    assert_eq!(session["effectiveModelId"], "mock-model");
    assert_eq!(session["effectiveModelLevel"], "tenant");

    let mut watch = s
        .client
        .subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let sent = s
        .client
        .ok("session.send", json!({"sessionId": sid, "prompt": "Say hello"}))
        .await;
    let turn_id = sent["turnId"].as_str().unwrap().to_string();
    assert_eq!(sent["state"], "running");

    let items = watch.until(30, is_turn_end).await.expect("the turn ends");
    let events: Vec<&Value> = items.iter().filter(|i| i.get("sequence").is_some()).collect();
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        ["session.created", "turn.started", "model.completed", "turn.ended"]
    );
    let seqs: Vec<i64> = events.iter().map(|e| e["sequence"].as_i64().unwrap()).collect();
    assert_eq!(seqs, [1, 2, 3, 4], "gapless from 1");
    let ended = events.last().unwrap();
    assert_eq!(ended["state"], "completed");
    assert_eq!(ended["turnId"], turn_id.as_str());
    assert!(ended.get("cause").is_none());

    // Live deltas arrived as the model streamed, and add up to the persisted text.
    let live_text: String = items
        .iter()
        .filter(|i| i["type"] == "model.delta")
        .filter_map(|i| i["text"].as_str())
        .collect();
    assert_eq!(live_text, "Hello, world");
    let live_thinking: String = items
        .iter()
        .filter(|i| i["type"] == "model.delta")
        .filter_map(|i| i["thinking"].as_str())
        .collect();
    assert_eq!(live_thinking, "Let me think.");

    // The completion's rows are published at its event, positions {sourceSequence, itemIndex}.
    let completed = events.iter().find(|e| e["type"] == "model.completed").unwrap();
    assert_eq!(completed["usage"], json!({"inputTokens": 12, "outputTokens": 3}));
    let started = events.iter().find(|e| e["type"] == "turn.started").unwrap();
    let watched_rows: Vec<Value> = [started, completed]
        .iter()
        .flat_map(|e| e["rows"].as_array().unwrap().clone())
        .collect();
    assert_eq!(watched_rows.len(), 2);
    assert_eq!(watched_rows[0]["kind"], "user");
    assert_eq!(watched_rows[0]["body"], "Say hello");
    assert_eq!(
        watched_rows[0]["position"],
        json!({"sourceSequence": 2, "itemIndex": 0})
    );
    assert_eq!(watched_rows[1]["kind"], "assistant");
    assert_eq!(watched_rows[1]["body"], "Hello, world");
    assert_eq!(watched_rows[1]["thinking"], "Let me think.");
    assert_eq!(
        watched_rows[1]["position"],
        json!({"sourceSequence": 3, "itemIndex": 0})
    );
    assert_eq!(watched_rows[1]["turnId"], turn_id.as_str());

    // History returns the same rows under a pinned fence.
    let history = s.client.ok("session.history", json!({"sessionId": sid})).await;
    assert_eq!(history["through"], 4);
    assert_eq!(history["rows"].as_array().unwrap(), &watched_rows);
    assert_eq!(history["nextAfter"], Value::Null);
    // Paging: one row per page, following nextAfter under the same fence.
    let p1 = s
        .client
        .ok("session.history", json!({"sessionId": sid, "through": 4, "limit": 1}))
        .await;
    assert_eq!(p1["rows"][0], watched_rows[0]);
    let p2 = s
        .client
        .ok(
            "session.history",
            json!({"sessionId": sid, "through": 4, "limit": 1, "after": p1["nextAfter"]}),
        )
        .await;
    assert_eq!(p2["rows"][0], watched_rows[1]);
    assert_eq!(p2["nextAfter"], Value::Null);

    // The provider saw the prompt and the server's key; the model came from the tenant default.
    let reqs = mock.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0]["model"], "mock-model");
    assert_eq!(reqs[0]["stream"], true);
    assert_eq!(reqs[0]["messages"][0]["role"], "system");
    assert_eq!(
        reqs[0]["messages"].as_array().unwrap()[1..],
        [json!({"role": "user", "content": "Say hello"})]
    );
    assert_eq!(mock.authorizations()[0].as_deref(), Some("Bearer sk-test-provider-key"));

    // Reconnect from the middle: exactly the events after the cursor, no gap, no duplicate,
    // then live ones as a second turn (a tool call split across chunks) runs.
    mock.push(Reply::Stream(vec![
        Part::ToolCall {
            index: 0,
            id: "call_1".into(),
            name: "read_file".into(),
            argument_pieces: vec!["{\"pa".into(), "th\": \"READ".into(), "ME.md\"}".into()],
        },
        Part::Usage {
            prompt: 20,
            completion: 7,
        },
    ]));
    // The tool runs (there is no README.md: a tool error the model reads), then it answers.
    mock.push(Reply::text(&["There is no readme."]));
    drop(watch);
    let mut again = Client::authed(&s.server().ws_url(), &s.server().admin_token())
        .await
        .unwrap();
    let mut watch = again.subscribe("session.watch", json!({"sessionId": sid, "after": 2}));
    let replay = watch.until(10, is_turn_end).await.expect("replay");
    let replay_seqs: Vec<i64> = replay.iter().filter_map(|e| e["sequence"].as_i64()).collect();
    assert_eq!(replay_seqs, [3, 4]);
    assert_eq!(
        replay
            .iter()
            .filter(|e| e.get("sequence").is_some())
            .collect::<Vec<_>>(),
        events[2..].to_vec()
    );
    let sent2 = again
        .ok("session.send", json!({"sessionId": sid, "prompt": "Read the readme"}))
        .await;
    let live = watch.until(30, is_turn_end).await.expect("second turn ends");
    let live_seqs: Vec<i64> = live.iter().filter_map(|e| e["sequence"].as_i64()).collect();
    assert_eq!(live_seqs, [5, 6, 7, 8, 9, 10]);
    assert_eq!(harness::event_types(&live), harness::A_TOOL_TURN);
    let result = &live.iter().find(|e| e["type"] == "tool.ended").unwrap()["rows"][0];
    assert_eq!(result["kind"], "toolResult");
    assert_eq!(result["tool"]["status"], "failed");
    assert_eq!(result["body"], "README.md: no such file or directory");
    let step = live.iter().find(|e| e["type"] == "model.completed").unwrap();
    let call = &step["rows"][0];
    assert_eq!(call["kind"], "toolCall");
    assert_eq!(call["body"], "{\"path\": \"README.md\"}");
    assert_eq!(call["tool"]["name"], "read_file");
    assert_eq!(call["tool"]["callId"], "call_1");
    // Rows are read from the table when the event is delivered: a watcher that reads the
    // step after the call started (or ended) sees that status; each change is its own event.
    let status = call["tool"]["status"].as_str().unwrap();
    assert!(["requested", "running", "failed"].contains(&status), "{status}");
    assert_eq!(live.last().unwrap()["turnId"], sent2["turnId"]);
    // The second request carried the conversation so far.
    let reqs = mock.requests();
    assert_eq!(
        reqs[1]["messages"].as_array().unwrap()[1..],
        [
            json!({"role": "user", "content": "Say hello"}),
            json!({"role": "assistant", "content": "Hello, world"}),
            json!({"role": "user", "content": "Read the readme"})
        ]
    );

    // The snapshot reflects it all; the provider key never reached the worker.
    let snap = again.ok("session.get", json!({"sessionId": sid})).await;
    assert_eq!(snap["sequence"], 10);
    assert_eq!(snap["phase"], "idle");
    let worker_log = std::fs::read_to_string(&s.stack.worker.as_ref().unwrap().log).unwrap();
    assert!(!worker_log.contains("sk-test-provider-key"));
    let metrics = s.server().metrics().await;
    assert!(
        metrics.contains("berth_turns_total{state=\"completed\"} 2"),
        "{metrics}"
    );
    assert!(metrics.contains("berth_workers_connected 1"));
    assert!(metrics.contains("berth_model_tokens_total{kind=\"input\",model=\"mock-model\",provider=\"default\"} 42"));
    assert!(metrics.contains("berth_turn_duration_seconds_count 2"));
    assert!(
        !metrics.contains("berth_fanout_lag_seconds_count 0"),
        "live deliveries are measured"
    );
    let server_log = std::fs::read_to_string(&s.server().log).unwrap();
    assert!(!server_log.contains("sk-test-provider-key"));
    assert!(!server_log.contains(&s.server().admin_token()));
}

impl Skel {
    async fn workspace_list_entry(&mut self) -> Value {
        let list = self.client.ok("workspace.list", json!({})).await;
        let entry = list
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["workspaceId"] == self.stack.workspace_id.as_str())
            .unwrap()
            .clone();
        let got = self
            .client
            .ok("workspace.get", json!({"workspaceId": self.stack.workspace_id}))
            .await;
        // (lastSeenAt moves with the worker's heartbeat)
        let strip = |mut v: Value| {
            v.as_object_mut().unwrap().remove("lastSeenAt");
            v
        };
        assert_eq!(strip(got), strip(entry.clone()));
        entry
    }

    async fn run_failing_turn(&mut self) -> Value {
        let session = self
            .client
            .ok("session.create", json!({"workspaceId": self.stack.workspace_id}))
            .await;
        let sid = session["sessionId"].as_str().unwrap().to_string();
        let mut watch = self
            .client
            .subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
        self.client
            .ok("session.send", json!({"sessionId": sid, "prompt": "hi"}))
            .await;
        let items = watch.until(30, is_turn_end).await.expect("the turn settles");
        let ended = items.last().unwrap().clone();
        // No model.completed: the failed step published nothing.
        assert!(!items.iter().any(|i| i["type"] == "model.completed"));
        let history = self.client.ok("session.history", json!({"sessionId": sid})).await;
        assert_eq!(history["rows"].as_array().unwrap().len(), 1, "only the prompt");
        ended
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_error_status_fails_the_turn_with_a_typed_cause() {
    let mock = MockProvider::start().await;
    mock.push(Reply::Status(500));
    let mut s = stack(&mock).await;
    let ended = s.run_failing_turn().await;
    assert_eq!(ended["state"], "failed");
    assert_eq!(ended["cause"], json!({"code": "provider-status", "status": 500}));
    // The provider's body never reaches the client.
    assert!(!ended.to_string().contains("scripted status"));
    // The server keeps serving, and the next turn works.
    assert_eq!(s.client.ok("ping", json!({})).await, json!({"pong": true}));
    mock.push(Reply::text(&["fine"]));
    let session = s
        .client
        .ok("session.create", json!({"workspaceId": s.stack.workspace_id}))
        .await;
    let sid = session["sessionId"].as_str().unwrap();
    let mut watch = s
        .client
        .subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    s.client
        .ok("session.send", json!({"sessionId": sid, "prompt": "again"}))
        .await;
    let items = watch.until(30, is_turn_end).await.unwrap();
    assert_eq!(items.last().unwrap()["state"], "completed");
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_connection_refused_fails_the_turn_and_the_server_keeps_serving() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let refusing = format!("http://127.0.0.1:{port}/v1");
    let mut s = Skel::new(Stack::start_with_model(&refusing, 1, &[]).await).await;
    let ended = s.run_failing_turn().await;
    assert_eq!(ended["state"], "failed");
    assert_eq!(ended["cause"], json!({"code": "provider-unreachable"}));
    assert_eq!(s.client.ok("status", json!({})).await["protocol"], 1);
    assert_eq!(s.server().get("/healthz").await.status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_gets_typed_errors_on_a_connection_that_stays_open() {
    let mock = MockProvider::start().await;
    let db = fresh_database().await;
    let server = TestServer::start(&db, &mock.base_url()).await.unwrap();
    let mut c = Client::connect(&server.ws_url()).await.unwrap();

    // Before hello: unauthorized, for every method.
    for method in ["ping", "status", "workspace.list", "session.create"] {
        let e = c.call(method, json!({})).await.unwrap_err();
        assert_eq!(code(&e), "unauthorized", "{method}");
    }
    // Malformed JSON: parse error with a null id.
    c.send_raw("{not json");
    let resp = tokio::time::timeout(Duration::from_secs(10), c.orphans.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resp.id, None);
    assert_eq!(resp.error.unwrap().data_code(), Some("parse-error"));
    // Not a JSON-RPC request.
    c.send_raw(r#"{"jsonrpc":"1.0","id":7,"method":"ping"}"#);
    // (answered on id 7, which this client did not register: it lands with the orphans)
    let resp = tokio::time::timeout(Duration::from_secs(10), c.orphans.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resp.error.unwrap().data_code(), Some("invalid-request"));
    // Wrong token: unauthorized, connection stays open.
    let e = c.hello("berth_not-a-real-token").await.unwrap_err();
    assert_eq!(code(&e), "unauthorized");
    let fake = format!("berth_{}", "0".repeat(72));
    assert_eq!(code(&c.hello(&fake).await.unwrap_err()), "unauthorized");
    // Unsupported protocol names the versions spoken.
    let e = c
        .call("hello", json!({"protocol": 99, "token": server.admin_token()}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "unsupported-protocol");
    assert_eq!(e.data["supported"], json!([1]));
    // Now a good hello on the same connection.
    let hello = c.hello(&server.admin_token()).await.unwrap();
    assert_eq!(hello["protocol"], 1);
    assert_eq!(hello["role"], "admin");
    // Unknown method.
    let e = c.call("no.such.method", json!({})).await.unwrap_err();
    assert_eq!(code(&e), "method-not-found");
    assert_eq!(e.code, -32601);
    // Bad params: wrong types; unknown fields are ignored; unknown ids.
    let e = c.call("session.create", json!({"workspaceId": 5})).await.unwrap_err();
    assert_eq!(code(&e), "bad-params");
    let e = c
        .call("session.get", json!({"sessionId": "ses_x", "bogus": true}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "not-found");
    let e = c
        .call("session.get", json!({"sessionId": "ses_missing"}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "not-found");
    let e = c
        .call("session.create", json!({"workspaceId": "wsp_missing"}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "not-found");
    let e = c
        .call("session.history", json!({"sessionId": "ses_missing"}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "not-found");
    let mut sub = c.subscribe("session.watch", json!({"sessionId": "ses_missing", "after": 0}));
    let done = tokio::time::timeout(Duration::from_secs(10), &mut sub.done)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.error.unwrap().data_code(), Some("not-found"));
    // NUL characters cannot be stored: refused, typed.
    let e = c
        .call("session.create", json!({"workspaceId": "wsp_\u{0}"}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "bad-params");
    // A raw watch of a missing session is answered on its own id.
    c.send_raw(r#"{"jsonrpc":"2.0","id":900,"method":"session.watch","params":{"sessionId":"ses_missing","after":0}}"#);
    let first = tokio::time::timeout(Duration::from_secs(10), c.orphans.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.error.unwrap().data_code(), Some("not-found"));
    // Still open and serving.
    assert_eq!(c.ok("ping", json!({})).await, json!({"pong": true}));
    assert!(!c.is_closed());

    // Wrong bearer on the upgrade: HTTP 401 before the upgrade.
    let err = Client::connect_with(&server.ws_url(), Some("berth_wrong"), None)
        .await
        .err()
        .expect("refused");
    assert!(format!("{err:#}").contains("401"), "{err:#}");
    // A worker credential is not a client credential.
    let worker = server.worker_token().await;
    let err = Client::connect_with(&server.ws_url(), Some(&worker), None)
        .await
        .err()
        .expect("refused");
    assert!(format!("{err:#}").contains("401"), "{err:#}");
    // A browser origin that is not allowed: HTTP 403.
    let err = Client::connect_with(&server.ws_url(), None, Some("https://evil.example"))
        .await
        .err()
        .expect("refused");
    assert!(format!("{err:#}").contains("403"), "{err:#}");
    // A good bearer authenticates without hello.
    let mut b = Client::connect_with(&server.ws_url(), Some(&server.admin_token()), None)
        .await
        .unwrap();
    assert_eq!(b.ok("ping", json!({})).await, json!({"pong": true}));

    // Health and metrics.
    assert_eq!(server.get("/healthz").await.status(), 200);
    assert_eq!(server.get("/readyz").await.status(), 200);
    let metrics = server.metrics().await;
    assert!(
        metrics.contains("berth_rpc_requests_total{code=\"unauthorized\",method=\"ping\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("berth_rpc_requests_total{code=\"method-not-found\",method=\"unknown\"}"));
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_shuts_the_server_down_gracefully() {
    let mock = MockProvider::start().await;
    let db = fresh_database().await;
    let mut server = TestServer::start(&db, &mock.base_url()).await.unwrap();
    let mut c = Client::authed(&server.ws_url(), &server.admin_token()).await.unwrap();
    assert_eq!(c.ok("ping", json!({})).await["pong"], true);
    let status = server.terminate().await;
    assert!(status.success(), "exit status {status}");
    let closed = eventually(10, || {
        let closed = c.is_closed();
        async move { closed.then_some(()) }
    })
    .await;
    assert!(closed.is_some(), "the client connection is closed on shutdown");
}

#[tokio::test(flavor = "multi_thread")]
async fn berth_dev_comes_up_on_a_fresh_data_dir_and_restarts_on_the_same_cluster() {
    use std::os::unix::fs::PermissionsExt;
    let mock = MockProvider::start().await;
    let home = scratch_dir("dev");
    let project = home.join("myproject");
    std::fs::create_dir_all(&project).unwrap();
    let data_dir = home.join("data");
    let start = || {
        let mut cmd = tokio::process::Command::new(harness::berth_bin());
        cmd.arg("dev")
            .current_dir(&project)
            .env_remove("DATABASE_URL")
            .env("BERTH_DATA_DIR", &data_dir)
            .env("BERTH_LISTEN", "127.0.0.1:0")
            .env("BERTH_METRICS_LISTEN", "127.0.0.1:0")
            .env("BERTH_MODEL_BASE_URL", mock.base_url())
            .env("BERTH_MODEL", "mock-model");
        cmd
    };
    let log = home.join("dev1.log");
    let (mut child, addr, _) = harness::spawn_listening(start(), &log).await.unwrap();
    let token_path = data_dir.join("run/token");
    assert_eq!(
        std::fs::metadata(&token_path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let token = std::fs::read_to_string(&token_path).unwrap().trim().to_string();
    let ready = reqwest::get(format!("http://{addr}/readyz")).await.unwrap();
    assert_eq!(ready.status(), 200);
    let url = format!("ws://{addr}/v1/rpc");
    let first_id = eventually(20, || {
        let (url, token) = (url.clone(), token.clone());
        async move {
            let mut c = Client::authed(&url, &token).await.ok()?;
            let list = c.ok("workspace.list", json!({})).await;
            let w = list.as_array()?.iter().find(|w| w["online"] == true)?.clone();
            Some((w["workspaceId"].as_str()?.to_string(), w["title"].as_str()?.to_string()))
        }
    })
    .await
    .expect("dev worker online");
    assert_eq!(first_id.1, "myproject");
    // A real turn through the dev worker.
    mock.push(Reply::text(&["dev ", "works"]));
    let mut c = Client::authed(&url, &token).await.unwrap();
    let session = c.ok("session.create", json!({"workspaceId": first_id.0})).await;
    let sid = session["sessionId"].as_str().unwrap().to_string();
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "hi"})).await;
    let items = watch.until(30, is_turn_end).await.unwrap();
    assert_eq!(items.last().unwrap()["state"], "completed");
    // The admin CLI works against the running private cluster of the data dir…
    let admin = |args: &[&str]| {
        let out = std::process::Command::new(harness::berth_bin())
            .arg("admin")
            .args(args)
            .env_remove("DATABASE_URL")
            .env("BERTH_DATA_DIR", &data_dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "berth admin {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let created = admin(&[
        "token",
        "create",
        "--tenant",
        "default",
        "--user",
        "admin@localhost",
        "--note",
        "cli",
    ]);
    let created = created.trim().to_string();
    assert!(
        created.starts_with("berth_") && !created.contains(char::is_whitespace),
        "only the credential: {created:?}"
    );
    let listed = admin(&["token", "list", "--tenant", "default"]);
    let line = listed
        .lines()
        .find(|l| l.contains("\tcli\t"))
        .expect("listed, one per line");
    let id = line.split('\t').next().unwrap().to_string();
    assert!(id.starts_with("crd_"), "id first: {line}");
    assert!(!listed.contains(&created), "lists never show secrets");
    let mut via_cli = Client::authed(&url, &created).await.unwrap();
    assert_eq!(via_cli.ok("ping", json!({})).await["pong"], true);
    admin(&["token", "revoke", &id]);
    assert!(
        Client::authed(&url, &created).await.is_err(),
        "a revoked credential is refused"
    );
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(!log_text.contains(&token), "the credential never reaches the log");
    assert!(harness::terminate(&mut child).await.success());

    // …and, with nothing running, starts the cluster itself.
    let tenant = admin(&["tenant", "create", "team-two"]);
    assert!(tenant.trim().starts_with("ten_"));
    let user = admin(&[
        "user",
        "create",
        "--tenant",
        "team-two",
        "--email",
        "two@example.com",
        "--admin",
    ]);
    assert!(user.trim().starts_with("usr_"));

    // Second start: same cluster, same data, no new bootstrap credential.
    let (mut child, addr, _) = harness::spawn_listening(start(), &home.join("dev2.log")).await.unwrap();
    assert_eq!(std::fs::read_to_string(&token_path).unwrap().trim(), token);
    assert_eq!(
        reqwest::get(format!("http://{addr}/readyz")).await.unwrap().status(),
        200
    );
    let mut c = Client::authed(&format!("ws://{addr}/v1/rpc"), &token).await.unwrap();
    let bodies = c.history_bodies(&sid).await;
    assert_eq!(bodies, ["hi", "dev works"]);
    let list = c.ok("workspace.list", json!({})).await;
    assert_eq!(list.as_array().unwrap().len(), 1, "the workspace kept its identity");
    assert_eq!(list[0]["workspaceId"], first_id.0.as_str());
    assert!(harness::terminate(&mut child).await.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_worker_reconnects_with_backoff_when_the_server_comes_back() {
    let mock = MockProvider::start().await;
    let db = fresh_database().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let env = [("BERTH_LISTEN", listen.as_str())];
    let mut server = TestServer::start_with(&db, &mock.base_url(), &env).await.unwrap();
    let token = server.worker_token().await;
    let _worker = TestWorker::start(&server, &token, "proj", &scratch_dir("workspace"))
        .await
        .unwrap();
    let online = |server: &TestServer, want: bool| {
        let (url, token) = (server.ws_url(), server.admin_token());
        async move {
            eventually(30, || {
                let (url, token) = (url.clone(), token.clone());
                async move {
                    let mut c = Client::authed(&url, &token).await.ok()?;
                    let list = c.ok("workspace.list", json!({})).await;
                    (list.as_array()?.first()?["online"] == want).then(|| list[0]["workspaceId"].clone())
                }
            })
            .await
        }
    };
    let ws = online(&server, true).await.expect("online");
    assert!(server.terminate().await.success());
    // Same database, same address: the worker finds it again by itself.
    let data_dir = server.data_dir.clone();
    let server = TestServer::start_with(&db, &mock.base_url(), &env).await.unwrap();
    std::fs::copy(data_dir.join("run/token"), server.data_dir.join("run/token")).unwrap();
    assert_eq!(online(&server, true).await.expect("online again"), ws);
    mock.push(Reply::text(&["back"]));
    let mut c = Client::authed(&server.ws_url(), &server.admin_token()).await.unwrap();
    let s = c.ok("session.create", json!({"workspaceId": ws})).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": s["sessionId"], "after": 0}));
    c.ok("session.send", json!({"sessionId": s["sessionId"], "prompt": "hi"}))
        .await;
    assert_eq!(
        watch.until(30, is_turn_end).await.unwrap().last().unwrap()["state"],
        "completed"
    );
}
