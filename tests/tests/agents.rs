//! Agent definitions, context limits and skills (issue 17, SPEC §4.16, §4.17): a team's
//! shared agents reach every member's sessions, a switch mid-session changes what the model
//! is told from the next turn on, long sessions compact and keep answering, and skills are
//! offered by name and read on demand.

use berth_e2e::{Client, MockProvider, Reply, Stack, TestServer, client::code};
use serde_json::{Value, json};

/// A member of the default tenant and a client signed in with their own credential.
async fn member(stack: &Stack, admin: &mut Client, email: &str) -> Client {
    let user = admin.ok("admin.user.create", json!({"email": email})).await;
    let cred = admin
        .ok(
            "admin.credential.create",
            json!({"userId": user["userId"], "note": email}),
        )
        .await;
    Client::authed(&stack.servers[0].ws_url(), cred["token"].as_str().unwrap())
        .await
        .unwrap()
}

/// Send `prompt` and wait until its turn ends; returns the `turn.ended` event.
async fn turn(c: &mut Client, sid: &str, prompt: &str) -> Value {
    let sent = c.ok("session.send", json!({"sessionId": sid, "prompt": prompt})).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let turn_id = sent["turnId"].clone();
    let events = watch
        .until(60, |e| e["type"] == "turn.ended" && e["turnId"] == turn_id)
        .await
        .expect("the turn ends");
    events.last().unwrap().clone()
}

/// The system prompt of provider request `i`.
fn system_of(mock: &MockProvider, i: usize) -> String {
    let req = &mock.requests()[i];
    assert_eq!(req["messages"][0]["role"], "system", "{req}");
    req["messages"][0]["content"].as_str().unwrap().to_string()
}

fn tool_names(req: &Value) -> Vec<String> {
    req["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn an_agent_saved_by_one_member_drives_another_members_session_and_a_switch_survives_a_restart() {
    let mock = MockProvider::start().await;
    let mut stack = Stack::start(&mock, 1).await;
    let mut admin = stack.client(0).await;
    let mut alice = member(&stack, &mut admin, "alice@example.com").await;
    let mut bob = member(&stack, &mut admin, "bob@example.com").await;

    // Alice saves two agents; a bad definition is a typed error, a taken name a conflict.
    let reviewer = alice
        .ok(
            "agent.save",
            json!({
                "name": "reviewer",
                "description": "Reads, never writes",
                "systemPrompt": "You are the team's careful reviewer.",
                "tools": ["read_file", "search_files", "some_mcp_tool"],
                "model": "reviewer-model",
                "params": {"temperature": 0.2, "maxTokens": 512},
            }),
        )
        .await;
    let rid = reviewer["agentId"].as_str().unwrap().to_string();
    assert_eq!(reviewer["approval"], "ask");
    let writer = alice
        .ok(
            "agent.save",
            json!({"name": "writer", "systemPrompt": "You are the team's fast writer.", "approval": "auto"}),
        )
        .await;
    let wid = writer["agentId"].as_str().unwrap().to_string();
    let err = alice.call("agent.save", json!({"name": "reviewer"})).await.unwrap_err();
    assert_eq!(code(&err), "conflict", "{err:?}");
    let err = alice
        .call("agent.save", json!({"name": "x", "params": {"temperature": 9}}))
        .await
        .unwrap_err();
    assert_eq!(code(&err), "bad-params");
    let err = alice
        .call("agent.save", json!({"name": "x", "provider": "nope"}))
        .await
        .unwrap_err();
    assert_eq!(code(&err), "unknown-provider");

    // Bob sees them and starts a session with the reviewer.
    let list = bob.ok("agent.list", json!({})).await;
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["reviewer", "writer"]);
    assert_eq!(bob.ok("agent.get", json!({"agentId": rid})).await, reviewer);
    let s = bob
        .ok(
            "session.create",
            json!({"workspaceId": stack.workspace_id, "agent": rid}),
        )
        .await;
    let sid = s["sessionId"].as_str().unwrap().to_string();
    assert_eq!(s["agentId"], rid.as_str());
    // The model resolves session > agent > tenant default, and says where it came from.
    assert_eq!(s["effectiveModelId"], "reviewer-model");
    assert_eq!(s["effectiveModelLevel"], "agent");
    let err = bob
        .call(
            "session.create",
            json!({"workspaceId": stack.workspace_id, "agent": "agt_nope"}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&err), "not-found");

    mock.push(Reply::text(&["Looks fine."]));
    let end = turn(&mut bob, &sid, "Review the code").await;
    assert_eq!(end["state"], "completed", "{end}");
    let req = &mock.requests()[0];
    assert_eq!(system_of(&mock, 0), "You are the team's careful reviewer.");
    assert_eq!(req["model"], "reviewer-model");
    assert_eq!(req["temperature"], 0.2);
    assert_eq!(req["max_tokens"], 512);
    // Only the tools the agent names that the worker has (an unknown name is no error).
    assert_eq!(tool_names(req), ["read_file", "search_files"]);

    // Mid-session switch: history is kept, the change is one event, and the next turn
    // uses the writer's prompt and (no agent model) the tenant default.
    let snap = bob
        .ok("session.setAgent", json!({"sessionId": sid, "agent": wid}))
        .await;
    assert_eq!(snap["agentId"], wid.as_str());
    assert_eq!(snap["effectiveModelId"], "mock-model");
    assert_eq!(snap["effectiveModelLevel"], "tenant");
    let listed = bob.ok("session.list", json!({})).await;
    let entry = &listed["entries"][0];
    assert_eq!(entry["sessionId"], sid.as_str());
    assert_eq!(entry["agentId"], wid.as_str());
    assert_eq!(entry["effectiveModelLevel"], "tenant");
    let mut watch = bob.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let events = watch
        .until(30, |e| e["type"] == "session.agentChanged")
        .await
        .unwrap();
    let changed = events.last().unwrap();
    assert_eq!(changed["agentId"], wid.as_str());
    assert_eq!(changed["name"], "writer");
    assert_eq!(bob.history_bodies(&sid).await, ["Review the code", "Looks fine."]);

    // A restart of the whole stack (server and worker) keeps the switch.
    stack.kill_worker().await;
    let db = stack.database_url.clone();
    stack.servers[0].terminate().await;
    stack.servers[0] = TestServer::start(&db, &mock.base_url()).await.unwrap();
    stack.start_worker(0).await;
    let mut admin = stack.client(0).await;
    let got = admin.ok("session.get", json!({"sessionId": sid})).await;
    assert_eq!(got["agentId"], wid.as_str());
    // The writer auto-approves: a shell call runs without asking.
    mock.push(Reply::tools(
        &[("call_1", "shell", json!({"command": "echo hi > out.txt"}))],
        64,
    ));
    mock.push(Reply::text(&["Written."]));
    let end = turn(&mut admin, &sid, "Write it").await;
    assert_eq!(end["state"], "completed", "{end}");
    assert_eq!(system_of(&mock, 1), "You are the team's fast writer.");
    assert_eq!(mock.requests()[1]["model"], "mock-model");
    assert!(stack.workspace_dir.join("out.txt").exists());
    let rows = admin.history_bodies(&sid).await;
    assert_eq!(rows[..2], ["Review the code", "Looks fine."]);

    // A session's own model beats its agent's; removing the agent leaves the session on the
    // defaults.
    admin
        .ok(
            "session.setModel",
            json!({"sessionId": sid, "model": "own-model"}),
        )
        .await;
    let got = admin.ok("session.get", json!({"sessionId": sid})).await;
    assert_eq!(got["effectiveModelLevel"], "session");
    assert_eq!(
        admin.ok("agent.remove", json!({"agentId": wid})).await,
        json!({"removed": true})
    );
    assert_eq!(
        admin.ok("agent.remove", json!({"agentId": wid})).await,
        json!({"removed": false})
    );
    let got = admin.ok("session.get", json!({"sessionId": sid})).await;
    assert!(got.get("agentId").is_none(), "{got}");
    let err = admin
        .call("session.setAgent", json!({"sessionId": sid, "agent": wid}))
        .await
        .unwrap_err();
    assert_eq!(code(&err), "not-found");
}
