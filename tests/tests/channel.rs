//! Channel sessions (issue 17, SPEC §4.3 `channel`): the model is told its replies are read
//! as short plain text on the channel; with tools it gets `attach_file`, whose files are
//! stored in object storage and come back on the reply row; `content.read` pages their
//! bytes on any replica.

use base64::Engine;
use berth_e2e::{Client, MockProvider, Reply, Stack, client::Subscription, client::code};
use rand::RngCore;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

fn is_turn_end(e: &Value) -> bool {
    e["type"] == "turn.ended"
}

async fn turn(c: &mut Client, watch: &mut Subscription, sid: &str, prompt: &str) -> Vec<Value> {
    c.ok("session.send", json!({"sessionId": sid, "prompt": prompt})).await;
    watch.until(60, is_turn_end).await.expect("the turn ends")
}

fn system_prompt(request: &Value) -> String {
    let m = &request["messages"][0];
    assert_eq!(m["role"], "system", "{request}");
    m["content"].as_str().expect("system text").to_string()
}

fn tool_names(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .map(|t| t["function"]["name"].as_str().expect("name").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Every byte of an attachment, page by page; and the number of pages.
async fn read_all(c: &mut Client, attachment_id: &str) -> (Vec<u8>, usize) {
    let mut data = Vec::new();
    let mut after = Value::Null;
    let mut pages = 0;
    loop {
        let page = c
            .ok("content.read", json!({"attachmentId": attachment_id, "after": after}))
            .await;
        assert_eq!(page["offset"], data.len() as u64, "{page}");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(page["data"].as_str().expect("data"))
            .expect("base64");
        data.extend_from_slice(&bytes);
        pages += 1;
        if page["nextAfter"].is_null() {
            return (data, pages);
        }
        after = page["nextAfter"].clone();
    }
}

/// The last row a turn's steps published (`model.completed`): its reply.
fn reply_row(events: &[Value]) -> &Value {
    events
        .iter()
        .filter(|e| e["type"] == "model.completed")
        .flat_map(|e| e["rows"].as_array().unwrap())
        .next_back()
        .expect("reply")
}

/// A stack of `replicas` whose object store is a local directory (kept while the handle is).
async fn with_object_store(mock: &MockProvider, replicas: usize) -> (Stack, tempfile::TempDir) {
    let objects = tempfile::tempdir().expect("tempdir");
    let store = format!("file://{}", objects.path().display());
    let stack = Stack::start_with(mock, replicas, &[("BERTH_OBJECT_STORE", store.as_str())]).await;
    (stack, objects)
}

/// A channel session in the stack's workspace, watched from its start.
async fn channel_session(stack: &Stack, c: &mut Client) -> (String, Subscription) {
    let snap = c
        .ok(
            "session.create",
            json!({"workspaceId": stack.workspace_id, "channel": "slack #ops"}),
        )
        .await;
    let sid = snap["sessionId"].as_str().unwrap().to_string();
    let watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    (sid, watch)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_channel_sessions_model_attaches_a_file_that_comes_back_with_its_reply() {
    let mock = MockProvider::start().await;
    let (stack, _objects) = with_object_store(&mock, 2).await;
    let mut c = stack.client(0).await;

    let ws = &stack.workspace_dir;
    let mut data = vec![0u8; 300 << 10];
    rand::rng().fill_bytes(&mut data);
    std::fs::create_dir_all(ws.join("out")).unwrap();
    std::fs::write(ws.join("out/report.bin"), &data).unwrap();
    let sha256: String = Sha256::digest(&data).iter().map(|b| format!("{b:02x}")).collect();
    let outside = berth_e2e::harness::scratch_dir("outside");
    std::fs::write(outside.join("secret"), "SECRET").unwrap();
    std::os::unix::fs::symlink(outside.join("secret"), ws.join("link")).unwrap();
    // A repository's internals are not sent either (its configuration may hold credentials).
    std::fs::create_dir_all(ws.join(".git")).unwrap();
    std::fs::write(ws.join(".git/token-note"), "SECRET").unwrap();

    let channel = "slack #ops";
    let snap = c
        .ok(
            "session.create",
            json!({"workspaceId": stack.workspace_id, "channel": channel}),
        )
        .await;
    assert_eq!(snap["channel"], channel, "{snap}");
    let sid = snap["sessionId"].as_str().unwrap().to_string();
    let got = c.ok("session.get", json!({"sessionId": sid})).await;
    assert_eq!(got["channel"], channel);
    let list = c.ok("session.list", json!({})).await;
    let entry = list["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["sessionId"] == sid.as_str())
        .expect("listed");
    assert_eq!(entry["channel"], channel);

    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let calls = [
        ("a1", "attach_file", json!({"path": "out/report.bin"})),
        ("a2", "attach_file", json!({"path": "../x"})),
        ("a3", "attach_file", json!({"path": "/etc/passwd", "name": "passwd"})),
        ("a4", "attach_file", json!({"path": "link"})),
        ("a5", "attach_file", json!({"path": ".git/token-note"})),
    ];
    mock.push(Reply::tools(&calls, 32));
    mock.push(Reply::text(&["Here is ", "the report."]));
    let events = turn(&mut c, &mut watch, &sid, "Send me the report").await;
    let end = events.last().unwrap();
    assert_eq!(end["state"], "completed", "{end}");

    // The model was told, on every step, and offered the tool.
    let reqs = mock.requests();
    assert_eq!(reqs.len(), 2);
    for r in &reqs {
        let system = system_prompt(r);
        assert!(system.contains("\"slack #ops\""), "{system}");
        assert!(system.contains("short plain text"), "{system}");
        assert!(system.contains("not your tool calls"), "{system}");
        assert!(tool_names(r).iter().any(|n| n == "attach_file"), "{r}");
    }

    // The escapes are tool errors the model reads; the file inside was attached.
    let results: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "tool.ended")
        .map(|e| &e["rows"][0])
        .collect();
    assert_eq!(results.len(), 5);
    assert_eq!(results[0]["tool"]["status"], "completed", "{}", results[0]);
    assert!(results[0]["body"].as_str().unwrap().contains("report.bin"));
    for (i, r) in results[1..].iter().enumerate() {
        assert_eq!(r["tool"]["status"], "failed", "{r}");
        let body = r["body"].as_str().unwrap();
        let why = if i < 3 {
            "outside the workspace"
        } else {
            "repository internals (.git) are not read by tools"
        };
        assert!(body.contains(why), "{body}");
        assert!(!body.contains("SECRET") && !body.contains("root:"), "{body}");
    }

    // The reply row carries the attachment, for the watcher and in history.
    let expected = |a: &Value| {
        assert_eq!(a["name"], "report.bin", "{a}");
        assert_eq!(a["mimeType"], "application/octet-stream", "{a}");
        assert_eq!(a["bytes"], data.len() as u64, "{a}");
        assert_eq!(a["sha256"], sha256.as_str(), "{a}");
        a["attachmentId"].as_str().expect("attachmentId").to_string()
    };
    let watched: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "model.completed")
        .flat_map(|e| e["rows"].as_array().unwrap())
        .filter(|r| r["kind"] == "assistant")
        .collect();
    let reply = watched.last().expect("a reply row");
    assert_eq!(reply["body"], "Here is the report.");
    let listed = reply["attachments"].as_array().expect("attachments on the reply");
    assert_eq!(listed.len(), 1, "{reply}");
    let attachment_id = expected(&listed[0]);
    let history = c.history(&sid).await;
    let with: Vec<&Value> = history.iter().filter(|r| r.get("attachments").is_some()).collect();
    assert_eq!(with.len(), 1, "only the reply row names it");
    assert_eq!(with[0]["kind"], "assistant");
    assert_eq!(expected(&with[0]["attachments"][0]), attachment_id);

    // The bytes, paged, from the other replica.
    let mut other = stack.client(1).await;
    let (read, pages) = read_all(&mut other, &attachment_id).await;
    assert_eq!(pages, 2, "300 KiB in 256 KiB pages");
    assert!(read == data, "identical bytes");
    let e = other
        .call(
            "content.read",
            json!({"attachmentId": attachment_id, "after": "999999999"}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "bad-params");
    let e = other
        .call("content.read", json!({"attachmentId": "att_nope"}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "not-found");

    // A later turn is told again; a reply without attachments names none.
    mock.push(Reply::text(&["Done."]));
    let events = turn(&mut c, &mut watch, &sid, "Thanks").await;
    assert_eq!(events.last().unwrap()["state"], "completed");
    let reqs = mock.requests();
    assert!(system_prompt(&reqs[2]).contains("\"slack #ops\""));
    let reply = reply_row(&events);
    assert!(reply.get("attachments").is_none(), "{reply}");

    // A fork keeps the channel.
    let got = c.ok("session.get", json!({"sessionId": sid})).await;
    let fork = c
        .ok(
            "session.fork",
            json!({"sessionId": sid, "sourceRevision": got["historyRevision"], "operationId": "fork-1"}),
        )
        .await;
    let forked = c.ok("session.get", json!({"sessionId": fork["sessionId"]})).await;
    assert_eq!(forked["channel"], channel, "{forked}");
}

/// `attach_file` needs no approval, so what one turn stores is bounded by the server: a
/// turn's model attaches at most as many files as a prompt carries (32); past that, the
/// server refuses the file (`payload-too-large`) before taking its bytes, and the model
/// reads why.
#[tokio::test(flavor = "multi_thread")]
async fn a_turn_attaches_a_bounded_number_of_files() {
    let mock = MockProvider::start().await;
    let (stack, _objects) = with_object_store(&mock, 1).await;
    let mut c = stack.client(0).await;
    std::fs::write(stack.workspace_dir.join("note.txt"), "note").unwrap();
    let (sid, mut watch) = channel_session(&stack, &mut c).await;
    let ids: Vec<String> = (0..=berth_protocol::MAX_ATTACHMENTS_PER_TURN)
        .map(|i| format!("a{i}"))
        .collect();
    let calls: Vec<(&str, &str, Value)> = ids
        .iter()
        .map(|id| (id.as_str(), "attach_file", json!({"path": "note.txt"})))
        .collect();
    mock.push(Reply::tools(&calls, 32));
    mock.push(Reply::text(&["Sent."]));
    let events = turn(&mut c, &mut watch, &sid, "Send the note, many times").await;
    assert_eq!(events.last().unwrap()["state"], "completed");
    let statuses: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "tool.ended")
        .map(|e| e["rows"][0]["tool"]["status"].as_str().unwrap())
        .collect();
    let max = berth_protocol::MAX_ATTACHMENTS_PER_TURN;
    assert_eq!(statuses.len(), max + 1);
    assert!(statuses[..max].iter().all(|s| *s == "completed"), "{statuses:?}");
    let last = events.iter().rfind(|e| e["type"] == "tool.ended").unwrap();
    assert_eq!(last["rows"][0]["tool"]["status"], "failed");
    let body = last["rows"][0]["body"].as_str().unwrap();
    assert!(body.contains("payload-too-large"), "{body}");
    let reply = reply_row(&events);
    assert_eq!(reply["attachments"].as_array().map(Vec::len), Some(max), "{reply}");
}

#[tokio::test(flavor = "multi_thread")]
async fn only_channel_sessions_get_attach_file_and_channel_names_are_bounded() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let ws = stack.workspace_id.clone();

    for bad in [json!("x".repeat(129)), json!(""), json!("a\u{7}b")] {
        let e = c
            .call("session.create", json!({"workspaceId": ws, "channel": bad}))
            .await
            .unwrap_err();
        assert_eq!(code(&e), "bad-params", "{bad}");
        assert_eq!(e.data["field"], "channel");
    }
    let longest = c
        .ok("session.create", json!({"workspaceId": ws, "channel": "x".repeat(128)}))
        .await;
    assert_eq!(longest["channel"], "x".repeat(128));

    // An ordinary session: no channel, no attach_file, nothing said about a channel.
    let sid = stack.session(&mut c).await;
    let snap = c.ok("session.get", json!({"sessionId": sid})).await;
    assert!(snap.get("channel").is_none(), "{snap}");
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    mock.push(Reply::text(&["Hi."]));
    let events = turn(&mut c, &mut watch, &sid, "Hello").await;
    let turn_id = events.last().unwrap()["turnId"].as_str().unwrap().to_string();
    let req = &mock.requests()[0];
    assert!(tool_names(req).iter().any(|n| n == "read_file"), "{req}");
    assert!(!tool_names(req).iter().any(|n| n == "attach_file"), "{req}");
    assert!(!system_prompt(req).contains("chat channel"));

    // The worker's attach resource takes files only for a running turn of a channel
    // session, from the worker credential it was handed to.
    let http = reqwest::Client::new();
    let url = format!("http://{}/v1/worker/attachments", stack.servers[0].addr);
    let post = |token: Option<&str>| {
        let mut r = http
            .post(&url)
            .header("berth-turn", &turn_id)
            .query(&[("name", "a.txt"), ("mime", "text/plain"), ("sha256", "00")])
            .body("x");
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    let resp = post(None).await.unwrap();
    assert_eq!(resp.status(), 401);
    let resp = post(Some(&stack.token)).await.unwrap();
    assert_eq!(resp.status(), 401, "a user credential is not a worker's");
    let resp = post(Some(&stack.worker_token)).await.unwrap();
    assert_eq!(resp.status(), 403);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "turn-not-running", "{body}");

    // A channel session without tools is told about the channel, and has no tools.
    let s = c
        .ok(
            "session.create",
            json!({"workspaceId": ws, "channel": "irc", "noTools": true}),
        )
        .await;
    let sid = s["sessionId"].as_str().unwrap().to_string();
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    mock.push(Reply::text(&["Hi."]));
    turn(&mut c, &mut watch, &sid, "Hello").await;
    let req = &mock.requests()[1];
    assert!(tool_names(req).is_empty(), "{req}");
    let system = system_prompt(req);
    assert!(
        system.contains("\"irc\"") && system.contains("short plain text"),
        "{system}"
    );
    assert!(!system.contains("attach_file"), "{system}");
}

/// A worker's machine may be compromised, so the files workers attach that one replica holds
/// in memory at once are bounded: while four bodies (`WORKER_ATTACH_BODIES`) are being read, a fifth is refused
/// `rate-limited` at once rather than buffered; once they are gone, files are taken again.
#[tokio::test(flavor = "multi_thread")]
async fn a_replica_holds_a_bounded_number_of_attached_files_at_once() {
    use tokio::io::AsyncWriteExt;

    let mock = MockProvider::start().await;
    let (stack, _objects) = with_object_store(&mock, 1).await;
    let mut c = stack.client(0).await;
    let (sid, mut watch) = channel_session(&stack, &mut c).await;
    // The turn stays running (its answer comes late) while files are posted for it.
    mock.push(Reply::Stream(vec![
        berth_e2e::Part::Delay(60_000),
        berth_e2e::Part::Text("late".into()),
    ]));
    let sent = c.ok("session.send", json!({"sessionId": sid, "prompt": "Wait"})).await;
    let turn = sent["turnId"].as_str().unwrap().to_string();
    watch
        .until(20, |e| e["type"] == "turn.started")
        .await
        .expect("the turn starts");
    berth_e2e::harness::eventually(20, || async { (!mock.requests().is_empty()).then_some(()) })
        .await
        .expect("the worker runs the turn (it asked the model)");
    let addr = &stack.servers[0].addr;
    let path = berth_protocol::worker::ATTACHMENTS_PATH;
    let zeros = "0".repeat(64);
    let head = |name: &str| {
        format!(
            "POST {path}?name={name}&mime=text%2Fplain&sha256={zeros} HTTP/1.1\r\nHost: berth\r\n\
             Authorization: Bearer {}\r\n{}: {turn}\r\nContent-Length: 1000\r\n\r\n",
            stack.worker_token,
            berth_protocol::worker::MODEL_PROXY_TURN_HEADER,
        )
    };
    // Four bodies that never come.
    let mut held = Vec::new();
    for i in 0..berth_api::WORKER_ATTACH_BODIES {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(head(&format!("held{i}")).as_bytes()).await.expect("write");
        held.push(s);
    }
    let http = reqwest::Client::new();
    let post = || {
        http.post(format!("http://{addr}{path}"))
            .bearer_auth(&stack.worker_token)
            .header(berth_protocol::worker::MODEL_PROXY_TURN_HEADER, &turn)
            .query(&[("name", "fifth"), ("mime", "text/plain"), ("sha256", zeros.as_str())])
            .body("fifth")
            .send()
    };
    let refused = berth_e2e::harness::eventually(10, || async {
        let r = post().await.ok()?;
        (r.status() == reqwest::StatusCode::TOO_MANY_REQUESTS).then_some(r)
    })
    .await
    .expect("a fifth file is refused while four are held");
    let body: Value = refused.json().await.expect("json");
    assert_eq!(body["error"]["code"], "rate-limited", "{body}");
    drop(held);
    // Taken again (and refused only for its wrong digest) once the held bodies are gone.
    let taken = berth_e2e::harness::eventually(10, || async {
        let r = post().await.ok()?;
        (r.status() != reqwest::StatusCode::TOO_MANY_REQUESTS).then_some(r)
    })
    .await
    .expect("files are taken again");
    let body: Value = taken.json().await.expect("json");
    assert_eq!(body["error"]["code"], "attachment-corrupt", "{body}");
}
