//! `berth acp`: the Agent Client Protocol bridge as an editor runs it — a child process
//! spoken to in ACP JSON-RPC over its stdin/stdout, against a real stack with a scripted
//! model: streaming, a tool call held for permission and answered, cancel, and load.

use std::{process::Stdio, time::Duration};

use berth_e2e::{MockProvider, Part, Reply, Stack, harness::berth_bin};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    process::{Child, ChildStdin},
    sync::mpsc,
};

/// An ACP client talking to a `berth acp` child.
struct Editor {
    _child: Child,
    stdin: ChildStdin,
    incoming: mpsc::UnboundedReceiver<Value>,
    next_id: u64,
}

impl Editor {
    async fn start(server: &str, token_file: &std::path::Path) -> Editor {
        let mut child = tokio::process::Command::new(berth_bin())
            .args(["acp", "--server", server, "--token-file"])
            .arg(token_file)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("run berth acp");
        let stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (tx, incoming) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
                assert_eq!(v["jsonrpc"], "2.0", "{line}");
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        Editor {
            _child: child,
            stdin,
            incoming,
            next_id: 0,
        }
    }

    async fn send(&mut self, message: Value) {
        let mut line = message.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    async fn request(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        id
    }

    async fn next(&mut self) -> Value {
        tokio::time::timeout(Duration::from_secs(60), self.incoming.recv())
            .await
            .expect("berth acp said nothing for 60 s")
            .expect("berth acp closed its stdout")
    }

    /// Read until the answer to `id`; returns it and the updates seen meanwhile. Agent
    /// requests go to `answer`, whose value is sent back as their result.
    async fn until_answer(&mut self, id: u64, mut answer: impl FnMut(&Value) -> Value) -> (Value, Vec<Value>) {
        let mut updates = Vec::new();
        loop {
            let m = self.next().await;
            if m.get("method").is_none() {
                assert_eq!(m["id"], id, "an answer to a request not asked: {m}");
                return (m, updates);
            }
            if m.get("id").is_some() {
                let result = answer(&m);
                let reply = json!({"jsonrpc": "2.0", "id": m["id"], "result": result});
                self.send(reply).await;
                updates.push(m);
            } else {
                assert_eq!(m["method"], "session/update", "{m}");
                updates.push(m);
            }
        }
    }

    async fn call(&mut self, method: &str, params: Value) -> (Value, Vec<Value>) {
        let id = self.request(method, params).await;
        self.until_answer(id, |m| panic!("unexpected request {m}")).await
    }

    async fn initialize(&mut self) -> Value {
        let (answer, _) = self
            .call(
                "initialize",
                json!({"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false}}),
            )
            .await;
        answer["result"].clone()
    }
}

/// The text of the updates of one kind, joined.
fn chunks(updates: &[Value], kind: &str) -> String {
    updates
        .iter()
        .filter(|u| u["params"]["update"]["sessionUpdate"] == kind)
        .map(|u| u["params"]["update"]["content"]["text"].as_str().unwrap_or_default())
        .collect()
}

fn kinds(updates: &[Value]) -> Vec<String> {
    updates
        .iter()
        .map(|u| {
            u["params"]["update"]["sessionUpdate"]
                .as_str()
                .map_or_else(|| u["method"].as_str().unwrap().to_string(), str::to_string)
        })
        .collect()
}

#[tokio::test]
async fn an_editor_prompts_approves_cancels_and_loads_through_berth_acp() {
    let mock = MockProvider::start().await;
    mock.push(Reply::text(&["Hel", "lo ", "there"]));
    mock.push(Reply::tools(
        &[("call_1", "shell", json!({"command": "echo approved-run"}))],
        6,
    ));
    mock.push(Reply::text(&["ran ", "it"]));
    mock.push(Reply::StreamThenHang(vec![Part::Text("pondering".into())]));
    let stack = Stack::start(&mock, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &stack.token).unwrap();
    let server = format!("http://{}", stack.servers[0].addr);
    let mut admin = stack.client(0).await;
    let list = admin.ok("workspace.list", json!({})).await;
    let workspace_path = list[0]["path"].as_str().unwrap().to_string();

    let mut editor = Editor::start(&server, &token_file).await;
    let init = editor.initialize().await;
    assert_eq!(init["protocolVersion"], 1);
    assert_eq!(init["agentCapabilities"]["loadSession"], true);

    // A directory no workspace holds is refused; one inside the workspace maps to it.
    let (answer, _) = editor
        .call("session/new", json!({"cwd": "/nowhere/at/all", "mcpServers": []}))
        .await;
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    let cwd = format!("{workspace_path}/src");
    let (answer, _) = editor.call("session/new", json!({"cwd": cwd, "mcpServers": []})).await;
    let session = answer["result"]["sessionId"].as_str().expect("a session").to_string();
    let snapshot = admin.ok("session.get", json!({"sessionId": session})).await;
    assert_eq!(snapshot["workspaceId"], stack.workspace_id.as_str());

    // Streaming: the answer arrives as chunks, every byte once, then end_turn.
    let (answer, updates) = editor
        .call(
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": "say hi"}]}),
        )
        .await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(chunks(&updates, "agent_message_chunk"), "Hello there");
    assert!(updates.iter().all(|u| u["params"]["sessionId"] == session.as_str()));

    // A shell call is held: the editor is asked, allows it, and sees it run.
    let id = editor
        .request(
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": "run it"}]}),
        )
        .await;
    let mut asked = Vec::new();
    let (answer, updates) = editor
        .until_answer(id, |m| {
            asked.push(m.clone());
            let allow = m["params"]["options"]
                .as_array()
                .unwrap()
                .iter()
                .find(|o| o["kind"] == "allow_once")
                .expect("an allow option")["optionId"]
                .clone();
            json!({"outcome": {"outcome": "selected", "optionId": allow}})
        })
        .await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0]["method"], "session/request_permission");
    let call = &asked[0]["params"]["toolCall"];
    // Unique in the session: the provider's call id within its turn.
    let call_id = call["toolCallId"].as_str().unwrap().to_string();
    assert!(call_id.starts_with("trn_") && call_id.ends_with("/call_1"), "{call_id}");
    assert_eq!(call["kind"], "execute");
    assert_eq!(call["rawInput"]["command"], "echo approved-run");
    let order = kinds(&updates);
    let at = |k: &str| {
        order
            .iter()
            .position(|x| x == k)
            .unwrap_or_else(|| panic!("no {k}: {order:?}"))
    };
    assert!(at("tool_call") < at("session/request_permission"), "{order:?}");
    let call_updates: Vec<&Value> = updates
        .iter()
        .filter(|u| u["params"]["update"]["sessionUpdate"] == "tool_call_update")
        .map(|u| &u["params"]["update"])
        .collect();
    let statuses: Vec<&str> = call_updates.iter().map(|u| u["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["in_progress", "completed"]);
    assert_eq!(call_updates[1]["toolCallId"], call_id.as_str());
    let output = call_updates[1]["content"][0]["content"]["text"].as_str().unwrap();
    assert!(output.contains("approved-run"), "{output}");
    assert_eq!(chunks(&updates, "agent_message_chunk"), "ran it");

    // Cancel: the turn is stopped and the prompt ends `cancelled`.
    let id = editor
        .request(
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": "wait"}]}),
        )
        .await;
    loop {
        let m = editor.next().await;
        if m["params"]["update"]["content"]["text"] == "pondering" {
            break;
        }
        assert!(m.get("id").is_none(), "no answer before the cancel: {m}");
    }
    editor
        .send(json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session}}))
        .await;
    let (answer, _) = editor.until_answer(id, |m| panic!("unexpected request {m}")).await;
    assert_eq!(answer["result"]["stopReason"], "cancelled", "{answer}");
    let snapshot = admin.ok("session.get", json!({"sessionId": session})).await;
    assert_eq!(snapshot["phase"], "idle", "the turn was stopped: {snapshot}");

    // Another editor loads the session: its history replays as updates, in order.
    drop(editor);
    let mut other = Editor::start(&server, &token_file).await;
    other.initialize().await;
    let (answer, _) = other
        .call(
            "session/load",
            json!({"sessionId": "ses_doesnotexist", "cwd": cwd, "mcpServers": []}),
        )
        .await;
    assert_eq!(answer["error"]["code"], -32002, "{answer}");
    let (answer, updates) = other
        .call(
            "session/load",
            json!({"sessionId": session, "cwd": cwd, "mcpServers": []}),
        )
        .await;
    assert_eq!(answer["result"], json!({}), "{answer}");
    let users: Vec<&str> = updates
        .iter()
        .filter(|u| u["params"]["update"]["sessionUpdate"] == "user_message_chunk")
        .map(|u| u["params"]["update"]["content"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(users, ["say hi", "run it", "wait"]);
    // The stopped turn keeps the text the editor was shown before the cancel.
    assert_eq!(chunks(&updates, "agent_message_chunk"), "Hello thereran itpondering");
    let order = kinds(&updates);
    assert_eq!(
        order,
        [
            "user_message_chunk",
            "agent_message_chunk",
            "user_message_chunk",
            "tool_call",
            "tool_call_update",
            "agent_message_chunk",
            "user_message_chunk",
            "agent_message_chunk"
        ]
    );
    assert_eq!(updates[3]["params"]["update"]["status"], "completed");
}

/// The official ACP client library: `BERTH_ACP_SDK` (a `node_modules` directory holding
/// `@agentclientprotocol/sdk`), else where `.ci/run` installs it. Absent outside CI → the
/// check is skipped with a note; in CI it must be there.
fn acp_sdk() -> Option<std::path::PathBuf> {
    let candidates = [
        std::env::var_os("BERTH_ACP_SDK").map(std::path::PathBuf::from),
        Some(std::path::PathBuf::from("/var/tmp/berth-acp-sdk/node_modules")),
    ];
    let found = candidates
        .into_iter()
        .flatten()
        .find(|p| p.join("@agentclientprotocol/sdk/package.json").exists());
    if found.is_none() && std::env::var_os("CI").is_some() {
        panic!("@agentclientprotocol/sdk not found (set BERTH_ACP_SDK or install it as .ci/run does)");
    }
    found
}

/// The ACP client from the npm registry drives `berth acp`: initialize, a new session, a
/// prompt whose tool call it allows, and a prompt it cancels. The SDK validates what
/// `berth acp` writes against the ACP schema.
#[tokio::test]
async fn the_official_acp_client_drives_berth_acp() {
    let Some(sdk) = acp_sdk() else {
        eprintln!("@agentclientprotocol/sdk not installed: skipping the official-client check");
        return;
    };
    let mock = MockProvider::start().await;
    mock.push(Reply::tools(
        &[("call_7", "shell", json!({"command": "echo from-the-sdk"}))],
        6,
    ));
    mock.push(Reply::text(&["ran ", "it"]));
    mock.push(Reply::StreamThenHang(vec![Part::Text("pondering".into())]));
    let stack = Stack::start(&mock, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &stack.token).unwrap();
    let mut admin = stack.client(0).await;
    let list = admin.ok("workspace.list", json!({})).await;
    let cwd = list[0]["path"].as_str().unwrap().to_string();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("acp-client/editor.mjs");

    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("node")
            .arg(script)
            .arg(&sdk)
            .arg(berth_bin())
            .arg(format!("http://{}", stack.servers[0].addr))
            .arg(&token_file)
            .arg(&cwd)
            .env("RUST_LOG", "warn")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the ACP client finished")
    .expect("node runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    assert_eq!(seen["first"], "end_turn", "{seen}");
    assert_eq!(seen["second"], "cancelled", "{seen}");
    let permissions = seen["permissions"].as_array().unwrap();
    assert_eq!(permissions.len(), 1, "{seen}");
    assert_eq!(permissions[0]["kind"], "execute");
    assert!(
        permissions[0]["toolCallId"].as_str().unwrap().ends_with("/call_7"),
        "{seen}"
    );
    assert!(seen["output"].as_str().unwrap().contains("from-the-sdk"), "{seen}");
    assert_eq!(seen["text"], "ran itpondering");
    let kinds: Vec<&str> = seen["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert_eq!(kinds.iter().filter(|k| **k == "tool_call").count(), 1, "{kinds:?}");
    let session = seen["sessionId"].as_str().unwrap();
    let snapshot = admin.ok("session.get", json!({"sessionId": session})).await;
    assert_eq!(snapshot["phase"], "idle", "the cancel stopped the turn: {snapshot}");
}

/// Issue 48: a file change reaches the editor as a reviewable diff — in the call's
/// announcement and in the approval request — with absolute paths and locations.
#[tokio::test]
async fn an_edit_is_announced_and_approved_as_a_diff() {
    let mock = MockProvider::start().await;
    mock.push(Reply::tools(
        &[(
            "call_0",
            "write_file",
            json!({"path": "acp-note.txt", "content": "hi\n"}),
        )],
        6,
    ));
    mock.push(Reply::text(&["written"]));
    let stack = Stack::start(&mock, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &stack.token).unwrap();
    let server = format!("http://{}", stack.servers[0].addr);
    let mut admin = stack.client(0).await;
    let list = admin.ok("workspace.list", json!({})).await;
    let workspace_path = list[0]["path"].as_str().unwrap().to_string();
    let mut editor = Editor::start(&server, &token_file).await;
    editor.initialize().await;
    let (answer, _) = editor
        .call("session/new", json!({"cwd": workspace_path, "mcpServers": []}))
        .await;
    let session = answer["result"]["sessionId"].as_str().expect("a session").to_string();
    let id = editor
        .request(
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": "write it"}]}),
        )
        .await;
    let mut asked = Vec::new();
    let (answer, updates) = editor
        .until_answer(id, |m| {
            asked.push(m.clone());
            json!({"outcome": {"outcome": "selected", "optionId": "allow"}})
        })
        .await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let path = format!("{workspace_path}/acp-note.txt");
    let diff = json!([{"type": "diff", "path": path, "newText": "hi\n"}]);
    let announced = updates
        .iter()
        .map(|u| &u["params"]["update"])
        .find(|u| u["sessionUpdate"] == "tool_call")
        .expect("the call is announced");
    assert_eq!(announced["content"], diff, "{announced}");
    assert_eq!(announced["locations"], json!([{"path": path}]));
    assert_eq!(announced["kind"], "edit");
    let call = &asked[0]["params"]["toolCall"];
    assert_eq!(call["content"], diff, "{call}");
    assert_eq!(call["toolCallId"], announced["toolCallId"]);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "hi\n");
}
