//! Coordinator sessions (issue 18, SPEC §4.15): a coordinator's turn starts child sessions
//! in workspaces served by other workers, waits for them and gathers their answers; its
//! children are ordinary sessions; stopping it stops them; approvals inside a child are
//! answered by a client that watches the coordinator's tree; the bounds are typed.

use berth_e2e::{Client, MockProvider, Reply, Stack};
use serde_json::{Value, json};

fn is_turn_end(e: &Value) -> bool {
    e["type"] == "turn.ended"
}

/// A coordinator session in the stack's workspace.
async fn coordinator(stack: &Stack, c: &mut Client, extra: Value) -> String {
    let mut p = json!({"workspaceId": stack.workspace_id, "kind": "coordinator"});
    for (k, v) in extra.as_object().unwrap() {
        p[k] = v.clone();
    }
    let s = c.ok("session.create", p).await;
    assert_eq!(s["kind"], "coordinator");
    s["sessionId"].as_str().unwrap().to_string()
}

/// The coordinator keyed by `key` starts `children` at once (each `start_child` call's id
/// and arguments), then waits for all of them and gathers their answers.
fn start_children_then_gather(mock: &MockProvider, key: &str, children: &[(&str, Value)]) {
    let calls: Vec<(&str, &str, Value)> = children
        .iter()
        .map(|(id, args)| (*id, "start_child", args.clone()))
        .collect();
    mock.push_for(key, Reply::tools(&calls, 9));
    mock.push_for(key, wait_for_all_children());
    mock.push_for(key, gather());
}

/// A session keyed by `key` runs one shell `command` (call `id`), then answers `then`.
fn shell_then(mock: &MockProvider, key: &str, id: &str, command: &str, then: &str) {
    mock.push_for(key, Reply::tools(&[(id, "shell", json!({"command": command}))], 9));
    mock.push_for(key, Reply::text(&[then]));
}

/// The sessions `sid` started (`session.list {parent}`).
async fn children(c: &mut Client, sid: &str) -> Vec<Value> {
    let list = c.ok("session.list", json!({"parent": sid})).await;
    list["entries"].as_array().unwrap().clone()
}

/// The JSON tool results of a provider request that have `field`, in order.
fn tool_results(body: &Value, field: &str) -> Vec<Value> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .filter_map(|m| serde_json::from_str::<Value>(m["content"].as_str()?).ok())
        .filter(|v| v.get(field).is_some())
        .collect()
}

/// A step that waits for every child the earlier steps started.
fn wait_for_all_children() -> Reply {
    Reply::computed(|body| {
        let calls: Vec<(String, Value)> = tool_results(body, "session_id")
            .iter()
            .enumerate()
            .map(|(i, r)| (format!("w{i}"), json!({"session_id": r["session_id"]})))
            .collect();
        let calls: Vec<(&str, &str, Value)> = calls
            .iter()
            .map(|(id, a)| (id.as_str(), "wait_child", a.clone()))
            .collect();
        Reply::tools(&calls, 7)
    })
}

/// The final answer: every child's answer the waits returned.
fn gather() -> Reply {
    Reply::computed(|body| {
        let answers: Vec<String> = tool_results(body, "answer")
            .iter()
            .map(|r| r["answer"].as_str().unwrap().to_string())
            .collect();
        Reply::text(&[&format!("Gathered: {}", answers.join(" | "))])
    })
}

/// The names of the tools offered in provider request `body`.
fn offered(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_coordinator_fans_out_to_two_workspaces_and_gathers_both_answers() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    // The second workspace's worker is on another machine and connects to the other replica.
    let (_worker_b, ws_b, dir_b) = stack.start_other_worker(1, "host-b", "beta").await;
    let mut c = stack.client(0).await;
    let sid = coordinator(&stack, &mut c, json!({"autoApprove": true})).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));

    mock.push_for(
        "Coordinate the release",
        Reply::tools(&[("l1", "list_workspaces", json!({}))], 9),
    );
    start_children_then_gather(
        &mock,
        "Coordinate the release",
        &[
            (
                "s1",
                json!({"workspace_id": stack.workspace_id, "prompt": "Task alpha: write alpha.txt", "title": "alpha"}),
            ),
            (
                "s2",
                json!({"workspace_id": ws_b, "prompt": "Task beta: report the answer"}),
            ),
        ],
    );
    mock.push_for(
        "Task alpha",
        Reply::tools(
            &[(
                "a1",
                "write_file",
                json!({"path": "alpha.txt", "content": "from alpha"}),
            )],
            9,
        ),
    );
    mock.push_for("Task alpha", Reply::text(&["alpha result: 42"]));
    mock.push_for("Task beta", Reply::text(&["beta result: ", "7"]));

    c.ok(
        "session.send",
        json!({"sessionId": sid, "prompt": "Coordinate the release"}),
    )
    .await;
    let events = watch.until(90, is_turn_end).await.expect("the coordinator's turn ends");
    assert_eq!(events.last().unwrap()["state"], "completed", "{events:?}");

    // The final answer holds both children's results, which reached the model as tool results.
    let rows = c.history(&sid).await;
    let answer = rows.last().unwrap();
    assert_eq!(answer["kind"], "assistant");
    assert_eq!(answer["body"], "Gathered: alpha result: 42 | beta result: 7");
    let listed = rows
        .iter()
        .find(|r| r["kind"] == "toolResult" && r["tool"]["name"] == "list_workspaces")
        .unwrap();
    let listed: Value = serde_json::from_str(listed["body"].as_str().unwrap()).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
    let coordinator_request = mock
        .requests()
        .into_iter()
        .find(|r| r["messages"][1]["content"] == "Coordinate the release")
        .unwrap();
    let tools = offered(&coordinator_request);
    for t in [
        "list_workspaces",
        "start_child",
        "send_child",
        "wait_child",
        "stop_child",
        "shell",
    ] {
        assert!(tools.contains(&t.to_string()), "{t} not offered: {tools:?}");
    }

    // Each child is an ordinary session in its own workspace, readable on its own.
    let kids = children(&mut c, &sid).await;
    assert_eq!(kids.len(), 2, "{kids:?}");
    for (title, workspace, prompt, result) in [
        (
            "alpha",
            &stack.workspace_id,
            "Task alpha: write alpha.txt",
            "alpha result: 42",
        ),
        ("", &ws_b, "Task beta: report the answer", "beta result: 7"),
    ] {
        let kid = kids.iter().find(|k| &k["workspaceId"] == workspace).unwrap();
        assert_eq!(kid["parent"], sid.as_str());
        if !title.is_empty() {
            assert_eq!(kid["title"], title);
        }
        let kid_id = kid["sessionId"].as_str().unwrap();
        let snap = c.ok("session.get", json!({"sessionId": kid_id})).await;
        assert_eq!(snap["parent"], sid.as_str());
        let typed: berth_protocol::SessionSnapshot = serde_json::from_value(snap.clone()).unwrap();
        assert_eq!(typed.delegation_depth, 1, "one level less than the coordinator's 2");
        assert!(snap.get("kind").is_none(), "a child is an ordinary session");
        let rows = c.history(kid_id).await;
        assert_eq!(rows.first().unwrap()["body"], prompt);
        assert_eq!(rows.last().unwrap()["body"], result);
        // Children started by this coordinator are not offered its tools.
        let child_request = mock
            .requests()
            .into_iter()
            .find(|r| r["messages"][1]["content"] == prompt)
            .unwrap();
        assert!(!offered(&child_request).contains(&"start_child".to_string()));
    }
    assert_eq!(
        std::fs::read_to_string(stack.workspace_dir.join("alpha.txt")).unwrap(),
        "from alpha"
    );
    assert!(!dir_b.join("alpha.txt").exists());

    // Both children's turn ends are in the coordinator's history.
    let all = c
        .subscribe("session.watch", json!({"sessionId": sid, "after": 0}))
        .until(10, |e| e["type"] == "state")
        .await
        .unwrap();
    let ended: Vec<&Value> = all.iter().filter(|e| e["type"] == "child.turnEnded").collect();
    assert_eq!(ended.len(), 2, "{all:?}");
    for e in ended {
        // The event is one the protocol describes, and reads back the same.
        let typed: berth_protocol::WatchItem = serde_json::from_value(e.clone()).unwrap();
        assert_eq!(&serde_json::to_value(&typed).unwrap(), e);
        assert_eq!(e["state"], "completed");
        assert!(e.get("turnId").is_none(), "a session-level event");
        assert!(kids.iter().any(|k| k["sessionId"] == e["sessionId"]));
    }

    // git and files answer on the coordinator session, against its own workspace.
    let listing = c.ok("files.list", json!({"sessionId": sid, "path": null})).await;
    assert!(listing["entries"].to_string().contains(&b64("alpha.txt")), "{listing}");
    let status = c.call("git.status", json!({"sessionId": sid})).await;
    assert!(status.is_ok(), "{status:?}");
}

fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// Members of the process group `pgid` that are still alive (not zombies).
fn group_members(pgid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = after.split(' ').collect();
        if fields[0] != "Z" && fields[2].parse::<i32>() == Ok(pgid) {
            out.push(pid);
        }
    }
    out
}

#[tokio::test]
async fn stopping_the_coordinators_turn_stops_the_child_it_started() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let (_worker_b, ws_b, dir_b) = stack.start_other_worker(0, "host-b", "beta").await;
    let mut c = stack.client(0).await;
    let sid = coordinator(&stack, &mut c, json!({"autoApprove": true})).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    mock.push_for(
        "Run the long job",
        Reply::tools(
            &[(
                "s1",
                "start_child",
                json!({"workspace_id": ws_b, "prompt": "Task sleepy: run it"}),
            )],
            9,
        ),
    );
    mock.push_for("Run the long job", wait_for_all_children());
    mock.push_for(
        "Task sleepy",
        Reply::tools(
            &[("sh", "shell", json!({"command": "echo $$ > child.pid; sleep 600"}))],
            9,
        ),
    );
    let sent = c
        .ok("session.send", json!({"sessionId": sid, "prompt": "Run the long job"}))
        .await;
    let pidfile = dir_b.join("child.pid");
    let pgid: i32 = berth_e2e::harness::pid_written(&pidfile)
        .await
        .expect("the child runs its command");
    let kid = children(&mut c, &sid).await.remove(0);
    let kid = kid["sessionId"].as_str().unwrap().to_string();
    let mut child_watch = c.subscribe("session.watch", json!({"sessionId": kid, "after": 0}));
    // The coordinator is waiting on the child when it is stopped.
    berth_e2e::harness::eventually(30, || {
        let waiting = mock.requests().len() >= 3;
        async move { waiting.then_some(()) }
    })
    .await
    .expect("the coordinator waits");
    c.ok("session.stop", json!({"sessionId": sid, "turnId": sent["turnId"]}))
        .await;
    let end = watch.until(30, is_turn_end).await.expect("the coordinator ends");
    assert_eq!(end.last().unwrap()["state"], "cancelled");
    let child_end = child_watch.until(30, is_turn_end).await.expect("the child ends");
    assert_eq!(child_end.last().unwrap()["state"], "cancelled");
    let mirrored = watch
        .until(10, |e| e["type"] == "child.turnEnded")
        .await
        .expect("the child's end reaches the coordinator's history");
    assert_eq!(mirrored.last().unwrap()["state"], "cancelled");
    assert_eq!(mirrored.last().unwrap()["sessionId"], kid.as_str());
    berth_e2e::harness::eventually(10, || {
        let gone = group_members(pgid).is_empty();
        async move { gone.then_some(()) }
    })
    .await
    .expect("the child's command is killed");

    // A later turn sends to that child (started by the earlier turn): stopping this turn
    // stops the turn it sent, and only that.
    std::fs::remove_file(&pidfile).unwrap();
    mock.push_for(
        "Run the long job",
        Reply::tools(
            &[(
                "n1",
                "send_child",
                json!({"session_id": kid, "prompt": "again, longer"}),
            )],
            9,
        ),
    );
    mock.push_for("Run the long job", wait_for_all_children());
    mock.push_for(
        "Task sleepy",
        Reply::tools(
            &[("sh2", "shell", json!({"command": "echo $$ > child.pid; sleep 600"}))],
            9,
        ),
    );
    let before = mock.requests().len();
    let sent = c
        .ok("session.send", json!({"sessionId": sid, "prompt": "Once more"}))
        .await;
    let pgid: i32 = berth_e2e::harness::pid_written(&pidfile)
        .await
        .expect("the child runs its command again");
    // The coordinator's two steps and the child's one.
    berth_e2e::harness::eventually(30, || {
        let waiting = mock.requests().len() >= before + 3;
        async move { waiting.then_some(()) }
    })
    .await
    .expect("the coordinator waits");
    c.ok("session.stop", json!({"sessionId": sid, "turnId": sent["turnId"]}))
        .await;
    let end = watch.until(30, is_turn_end).await.expect("the coordinator ends");
    assert_eq!(end.last().unwrap()["state"], "cancelled");
    let child_end = child_watch.until(30, is_turn_end).await.expect("the child ends");
    assert_eq!(child_end.last().unwrap()["state"], "cancelled");
    berth_e2e::harness::eventually(10, || {
        let gone = group_members(pgid).is_empty();
        async move { gone.then_some(()) }
    })
    .await
    .expect("the child's second command is killed");
    assert_eq!(children(&mut c, &sid).await.len(), 1, "the same child");
}

#[tokio::test]
async fn an_approval_inside_a_child_is_answered_from_the_coordinators_tree() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    let (_worker_b, ws_b, dir_b) = stack.start_other_worker(1, "host-b", "beta").await;
    let mut c = stack.client(0).await;
    // No autoApprove: the child inherits the policy, so its shell call waits for a person.
    let sid = coordinator(&stack, &mut c, json!({})).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    start_children_then_gather(
        &mock,
        "Guarded work",
        &[("s1", json!({"workspace_id": ws_b, "prompt": "Task guarded: write it"}))],
    );
    shell_then(
        &mock,
        "Task guarded",
        "sh",
        "echo approved > guarded.txt",
        "guarded done",
    );
    c.ok("session.send", json!({"sessionId": sid, "prompt": "Guarded work"}))
        .await;

    // Another client, on the other replica, knows only the coordinator: it finds the child
    // through `session.list {parent}` and answers its approval.
    let mut other = stack.client(1).await;
    // (The coordinator's watcher counts for its tree.)
    let (kid, interaction) = pending_in_child(&stack, 1, &sid).await;
    let asked = other
        .ok("session.interaction", json!({"interactionId": interaction}))
        .await;
    assert_eq!(asked["tool"]["name"], "shell");
    assert_eq!(asked["sessionId"], kid.as_str());
    other
        .ok(
            "session.respond",
            json!({"interactionId": interaction, "answer": {"approved": true}}),
        )
        .await;
    let events = watch.until(60, is_turn_end).await.expect("the coordinator ends");
    assert_eq!(events.last().unwrap()["state"], "completed", "{events:?}");
    assert_eq!(
        std::fs::read_to_string(dir_b.join("guarded.txt")).unwrap(),
        "approved\n"
    );
    let rows = c.history(&sid).await;
    assert_eq!(rows.last().unwrap()["body"], "Gathered: guarded done");
}

#[tokio::test]
async fn a_coordinators_bounds_and_an_offline_child_are_reported() {
    let mock = MockProvider::start().await;
    let stack = Stack::start_with(&mock, 1, &[("BERTH_COORDINATOR_MAX_CHILDREN", "1")]).await;
    let (mut worker_b, ws_b, _dir_b) = stack.start_other_worker(0, "host-b", "beta").await;
    worker_b.child.kill().await.ok();
    worker_b.child.wait().await.ok();
    stack.wait_workspace("beta", false).await;
    let mut c = stack.client(0).await;

    let too_deep = c
        .call(
            "session.create",
            json!({"workspaceId": stack.workspace_id, "kind": "coordinator", "delegationDepth": 99}),
        )
        .await
        .unwrap_err();
    assert_eq!(too_deep.data["code"], "bad-params");

    // Another tenant's workspace, and a session of this tenant that is not its child.
    let db = berth_e2e::harness::db(&stack.database_url).await;
    db.batch_execute(
        "INSERT INTO tenants (id, name) VALUES ('ten_other', 'other');
         INSERT INTO workspaces (id, tenant_id, host, name, path, title)
         VALUES ('wsp_other', 'ten_other', 'h', 'secret', '/secret', 'secret')",
    )
    .await
    .unwrap();
    let stranger = c.ok("session.create", json!({"workspaceId": stack.workspace_id})).await["sessionId"]
        .as_str()
        .unwrap()
        .to_string();

    // One child per turn; the child lands in an offline workspace: it queues, and waiting
    // on it reports the offline workspace at once.
    let sid = coordinator(&stack, &mut c, json!({"autoApprove": true})).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    mock.push_for(
        "Bounded",
        Reply::tools(
            &[
                ("s1", "start_child", json!({"workspace_id": ws_b, "prompt": "Task one"})),
                ("s2", "start_child", json!({"workspace_id": ws_b, "prompt": "Task two"})),
                ("s3", "send_child", json!({"session_id": stranger, "prompt": "hi"})),
                ("s4", "stop_child", json!({"session_id": "ses_nothere"})),
            ],
            9,
        ),
    );
    mock.push_for("Bounded", wait_for_all_children());
    mock.push_for("Bounded", Reply::text(&["bounded"]));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "Bounded"}))
        .await;
    let events = watch.until(60, is_turn_end).await.expect("the turn ends");
    assert_eq!(events.last().unwrap()["state"], "completed", "{events:?}");
    let results: Vec<Value> = c
        .history(&sid)
        .await
        .into_iter()
        .filter(|r| r["kind"] == "toolResult")
        .collect();
    let body = |i: usize| results[i]["body"].as_str().unwrap().to_string();
    assert_eq!(results[0]["tool"]["status"], "completed");
    assert!(body(0).contains("\"state\":\"queued\""), "{}", body(0));
    assert!(body(0).contains("no worker online"), "{}", body(0));
    assert_eq!(results[1]["tool"]["status"], "failed");
    assert!(body(1).contains("child limit"), "{}", body(1));
    assert_eq!(results[2]["tool"]["status"], "failed");
    assert!(body(2).contains("no such"), "{}", body(2));
    assert!(body(3).contains("no such"), "{}", body(3));
    assert_eq!(results[4]["tool"]["name"], "wait_child");
    assert_eq!(results[4]["tool"]["status"], "failed");
    assert!(body(4).contains("no worker online"), "{}", body(4));
    let listed: Value = serde_json::from_str(body(0).as_str()).unwrap();
    assert_eq!(listed["state"], "queued");
    let history_of_stranger = c.history(&stranger).await;
    assert!(
        history_of_stranger.is_empty(),
        "nothing was sent to a session not its child"
    );
    let kids = children(&mut c, &sid).await;
    assert_eq!(kids.len(), 1);
    assert_eq!(kids[0]["queued"], 1);

    // Another tenant's workspace does not exist for this one.
    let other = coordinator(&stack, &mut c, json!({"autoApprove": true})).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": other, "after": 0}));
    mock.push_for(
        "Elsewhere",
        Reply::tools(
            &[(
                "s1",
                "start_child",
                json!({"workspace_id": "wsp_other", "prompt": "Task secret"}),
            )],
            9,
        ),
    );
    mock.push_for("Elsewhere", Reply::text(&["elsewhere"]));
    c.ok("session.send", json!({"sessionId": other, "prompt": "Elsewhere"}))
        .await;
    watch.until(60, is_turn_end).await.expect("the turn ends");
    let results: Vec<Value> = c
        .history(&other)
        .await
        .into_iter()
        .filter(|r| r["kind"] == "toolResult")
        .collect();
    assert!(
        results[0]["body"].as_str().unwrap().contains("no such workspace"),
        "{results:?}"
    );
    assert!(children(&mut c, &other).await.is_empty());
    let owned: i64 = db
        .query_one("SELECT count(*) FROM sessions WHERE workspace_id = 'wsp_other'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(owned, 0);

    // A coordinator with no depth left may not start children.
    let flat = coordinator(&stack, &mut c, json!({"autoApprove": true, "delegationDepth": 0})).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": flat, "after": 0}));
    mock.push_for(
        "Flat",
        Reply::tools(
            &[(
                "s1",
                "start_child",
                json!({"workspace_id": ws_b, "prompt": "Task three"}),
            )],
            9,
        ),
    );
    mock.push_for("Flat", Reply::text(&["flat"]));
    c.ok("session.send", json!({"sessionId": flat, "prompt": "Flat"})).await;
    watch.until(60, is_turn_end).await.expect("the turn ends");
    let results: Vec<Value> = c
        .history(&flat)
        .await
        .into_iter()
        .filter(|r| r["kind"] == "toolResult")
        .collect();
    assert!(
        results[0]["body"].as_str().unwrap().contains("depth limit"),
        "{results:?}"
    );
    assert!(children(&mut c, &flat).await.is_empty());

    // An ordinary session is offered none of the coordinator's tools, and calling one fails.
    let plain = c
        .ok(
            "session.create",
            json!({"workspaceId": stack.workspace_id, "autoApprove": true}),
        )
        .await["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    let mut watch = c.subscribe("session.watch", json!({"sessionId": plain, "after": 0}));
    mock.push_for(
        "Plain",
        Reply::tools(
            &[(
                "s1",
                "start_child",
                json!({"workspace_id": ws_b, "prompt": "Task four"}),
            )],
            9,
        ),
    );
    mock.push_for("Plain", Reply::text(&["plain"]));
    c.ok("session.send", json!({"sessionId": plain, "prompt": "Plain"}))
        .await;
    watch.until(60, is_turn_end).await.expect("the turn ends");
    let request = mock
        .requests()
        .into_iter()
        .find(|r| r["messages"][1]["content"] == "Plain")
        .unwrap();
    assert!(!offered(&request).contains(&"start_child".to_string()));
    assert!(children(&mut c, &plain).await.is_empty());
}

/// A child started with one of the team's agent definitions (by name) runs as that agent:
/// the child session names it and the child's model request carries its system prompt.
/// An agent the tenant does not have starts nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_child_started_with_an_agent_runs_as_that_agent() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let agent = c
        .ok(
            "agent.save",
            json!({"name": "reviewer", "systemPrompt": "You are REVIEWER-PROMPT, the careful one."}),
        )
        .await;
    let agent_id = agent["agentId"].as_str().expect("agentId").to_string();
    let sid = coordinator(&stack, &mut c, json!({"autoApprove": true})).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let ws = stack.workspace_id.clone();
    start_children_then_gather(
        &mock,
        "Review the change",
        &[
            (
                "s1",
                json!({"workspace_id": ws, "prompt": "Task review: look", "agent": "reviewer"}),
            ),
            (
                "s2",
                json!({"workspace_id": ws, "prompt": "Task ghost: never", "agent": "nobody"}),
            ),
        ],
    );
    mock.push_for("Task review", Reply::text(&["reviewed: fine"]));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "Review the change"}))
        .await;
    let events = watch.until(90, is_turn_end).await.expect("the coordinator's turn ends");
    assert_eq!(events.last().unwrap()["state"], "completed", "{events:?}");
    let rows = c.history(&sid).await;
    assert_eq!(rows.last().unwrap()["body"], "Gathered: reviewed: fine");
    let kids = children(&mut c, &sid).await;
    assert_eq!(kids.len(), 1, "the unknown agent started nothing: {kids:?}");
    assert_eq!(kids[0]["agentId"], agent_id.as_str());
    let child_request = mock
        .requests()
        .into_iter()
        .find(|r| r.to_string().contains("Task review: look") && !r.to_string().contains("Review the change"))
        .expect("the child's model request");
    assert_eq!(child_request["messages"][0]["role"], "system");
    assert!(
        child_request["messages"][0]["content"]
            .as_str()
            .unwrap()
            .contains("REVIEWER-PROMPT"),
        "{child_request}"
    );
    let ghost = rows
        .iter()
        .find(|r| r["kind"] == "toolResult" && r["tool"]["callId"] == "s2")
        .expect("the second call's result");
    assert_eq!(ghost["tool"]["status"], "failed", "{ghost}");
    assert!(
        ghost["body"].as_str().unwrap().contains("no such workspace, agent"),
        "{ghost}"
    );
}

/// Issue 47: a child is never more permissive than what started it. A coordinator that asks
/// for approval starting a child with an agent whose approval is `auto`, and a delegate's
/// child switched to such an agent afterwards, still have their shell calls held for a
/// person; denied, nothing runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_child_is_never_more_permissive_than_what_started_it() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let yolo = c.ok("agent.save", json!({"name": "yolo", "approval": "auto"})).await;
    let ws = stack.workspace_id.clone();
    let sid = coordinator(&stack, &mut c, json!({})).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    start_children_then_gather(
        &mock,
        "Escalate",
        &[(
            "s1",
            json!({"workspace_id": ws, "prompt": "Task escalate: write", "agent": "yolo"}),
        )],
    );
    shell_then(
        &mock,
        "Task escalate",
        "sh",
        "echo pwned > escalated.txt",
        "child stopped",
    );
    c.ok("session.send", json!({"sessionId": sid, "prompt": "Escalate"}))
        .await;

    // The child's shell call waits for a person (the coordinator's watcher counts for its
    // tree) instead of running under its agent's `auto`.
    let (kid, interaction) = pending_in_child(&stack, 0, &sid).await;
    let asked = c.ok("session.interaction", json!({"interactionId": interaction})).await;
    assert_eq!(asked["tool"]["name"], "shell");
    assert_eq!(asked["sessionId"], kid.as_str());
    c.ok(
        "session.respond",
        json!({"interactionId": interaction, "answer": {"approved": false}}),
    )
    .await;
    let events = watch.until(60, is_turn_end).await.expect("the coordinator ends");
    assert_eq!(events.last().unwrap()["state"], "completed", "{events:?}");
    assert!(
        !stack.workspace_dir.join("escalated.txt").exists(),
        "the child's shell ran unasked"
    );
    assert_eq!(children(&mut c, &sid).await[0]["agentId"], yolo["agentId"]);

    // A delegate's child of a session that asks, switched to the `auto` agent afterwards:
    // its shell call still waits.
    let parent = c
        .ok("session.create", json!({"workspaceId": ws, "delegationDepth": 1}))
        .await["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    mock.push_for(
        "Hand off",
        Reply::tools(&[("d1", "delegate", json!({"prompt": "Task quiet: answer"}))], 9),
    );
    mock.push_for("Task quiet", Reply::text(&["quiet done"]));
    mock.push_for("Hand off", Reply::text(&["handed off"]));
    let mut pw = c.subscribe("session.watch", json!({"sessionId": parent, "after": 0}));
    c.ok("session.send", json!({"sessionId": parent, "prompt": "Hand off"}))
        .await;
    let events = pw.until(60, is_turn_end).await.expect("the parent ends");
    assert_eq!(events.last().unwrap()["state"], "completed", "{events:?}");
    let child = children(&mut c, &parent).await[0]["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    c.ok(
        "session.setAgent",
        json!({"sessionId": child, "agent": yolo["agentId"]}),
    )
    .await;
    let mut cw = c.subscribe("session.watch", json!({"sessionId": child, "after": 0}));
    // (Replies are keyed by a session's first prompt.)
    shell_then(
        &mock,
        "Task quiet",
        "sh2",
        "echo pwned > delegated.txt",
        "stopped again",
    );
    c.ok(
        "session.send",
        json!({"sessionId": child, "prompt": "Task again: write"}),
    )
    .await;
    let asked = cw
        .until(60, |e| e["type"] == "interaction.requested")
        .await
        .expect("the child's shell call is held");
    let interaction = asked.last().unwrap()["interaction"]["interactionId"].clone();
    c.ok(
        "session.respond",
        json!({"interactionId": interaction, "answer": {"approved": false}}),
    )
    .await;
    cw.until(60, is_turn_end).await.expect("the child's turn ends");
    assert!(!stack.workspace_dir.join("delegated.txt").exists());
}

/// A child auto-runs only what its parent could: under a coordinator whose agent auto-runs
/// only `shell`, a child whose agent names only `shell` runs it unasked, and one whose agent
/// has every tool (`auto` too) asks; a delegate's child of a session that auto-approves but
/// whose agent may only read (and delegate) asks as well.
#[tokio::test(flavor = "multi_thread")]
async fn a_child_auto_runs_only_the_tools_its_parent_could() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let ws = stack.workspace_id.clone();
    let runner = c
        .ok(
            "agent.save",
            json!({"name": "runner", "approval": "auto", "tools": ["shell"]}),
        )
        .await;
    c.ok("agent.save", json!({"name": "everything", "approval": "auto"}))
        .await;
    let sid = coordinator(&stack, &mut c, json!({"agent": runner["agentId"]})).await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    start_children_then_gather(
        &mock,
        "Fan out",
        &[
            (
                "s1",
                json!({"workspace_id": ws, "prompt": "Task within: run", "agent": "runner"}),
            ),
            (
                "s2",
                json!({"workspace_id": ws, "prompt": "Task beyond: run", "agent": "everything"}),
            ),
        ],
    );
    shell_then(&mock, "Task within", "w", "echo ok > within.txt", "within done");
    shell_then(&mock, "Task beyond", "b", "echo pwned > beyond.txt", "beyond stopped");
    c.ok("session.send", json!({"sessionId": sid, "prompt": "Fan out"}))
        .await;

    let (kid, interaction) = pending_in_child(&stack, 0, &sid).await;
    let asked = c.ok("session.interaction", json!({"interactionId": interaction})).await;
    assert_eq!(asked["tool"]["name"], "shell");
    let kids = children(&mut c, &sid).await;
    let beyond = kids.iter().find(|k| k["sessionId"] == kid.as_str()).unwrap();
    assert_ne!(
        beyond["agentId"], runner["agentId"],
        "only the child beyond the bound asks"
    );
    c.ok(
        "session.respond",
        json!({"interactionId": interaction, "answer": {"approved": false}}),
    )
    .await;
    let events = watch.until(60, is_turn_end).await.expect("the coordinator ends");
    assert_eq!(events.last().unwrap()["state"], "completed", "{events:?}");
    assert!(
        stack.workspace_dir.join("within.txt").exists(),
        "the child within ran unasked"
    );
    assert!(
        !stack.workspace_dir.join("beyond.txt").exists(),
        "the child beyond ran unasked"
    );

    // A session that auto-approves, with an agent that may only read and delegate: its
    // delegate's child has the same agent, so it gets no tool its parent's definition leaves
    // out (`shell` is not offered, and its call does not run).
    let reader = c
        .ok(
            "agent.save",
            json!({"name": "reader", "tools": ["read_file", "delegate"]}),
        )
        .await;
    let parent = c
        .ok(
            "session.create",
            json!({"workspaceId": ws, "delegationDepth": 1, "autoApprove": true, "agent": reader["agentId"]}),
        )
        .await["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    mock.push_for(
        "Hand off",
        Reply::tools(&[("d1", "delegate", json!({"prompt": "Task delegated: run"}))], 9),
    );
    shell_then(
        &mock,
        "Task delegated",
        "sh",
        "echo pwned > delegated.txt",
        "delegated stopped",
    );
    mock.push_for("Hand off", Reply::text(&["handed off"]));
    let mut pw = c.subscribe("session.watch", json!({"sessionId": parent, "after": 0}));
    c.ok("session.send", json!({"sessionId": parent, "prompt": "Hand off"}))
        .await;
    let events = pw.until(60, is_turn_end).await.expect("the parent ends");
    assert_eq!(events.last().unwrap()["state"], "completed", "{events:?}");
    assert!(!stack.workspace_dir.join("delegated.txt").exists());
    let kids = children(&mut c, &parent).await;
    assert_eq!(
        kids[0]["agentId"], reader["agentId"],
        "the child has its parent's agent"
    );
    let asked = mock
        .requests()
        .into_iter()
        .filter(|r| r.to_string().contains("Task delegated: run"))
        .collect::<Vec<_>>();
    assert!(!asked.is_empty());
    for r in &asked {
        let tools: Vec<&str> = r["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["function"]["name"].as_str())
            .collect();
        assert!(!tools.contains(&"shell"), "{tools:?}");
        assert!(tools.contains(&"read_file"), "{tools:?}");
    }
}

/// A child that asks cannot start a grandchild that does not: under an auto-approving
/// coordinator whose agent may only read, a child with an agent that has `shell` and
/// `delegate` asks (its tools are beyond the bound), and the child it delegates to, with the
/// same agent, asks too (it used to inherit the raw `autoApprove` and a bound of its own
/// agent's tools, and ran `shell` unasked).
#[tokio::test(flavor = "multi_thread")]
async fn a_grandchild_asks_when_its_parent_asks() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let ws = stack.workspace_id.clone();
    let planner = c
        .ok("agent.save", json!({"name": "planner", "tools": ["read_file"]}))
        .await;
    c.ok("agent.save", json!({"name": "coder", "tools": ["shell", "delegate"]}))
        .await;
    let sid = coordinator(
        &stack,
        &mut c,
        json!({"agent": planner["agentId"], "autoApprove": true}),
    )
    .await;
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    start_children_then_gather(
        &mock,
        "Fan out",
        &[(
            "s1",
            json!({"workspace_id": ws, "prompt": "Task middle: hand off", "agent": "coder"}),
        )],
    );
    mock.push_for(
        "Task middle",
        Reply::tools(&[("d1", "delegate", json!({"prompt": "Task grand: run"}))], 9),
    );
    mock.push_for("Task middle", Reply::text(&["middle done"]));
    shell_then(&mock, "Task grand", "g", "echo pwned > grand.txt", "grand stopped");
    c.ok("session.send", json!({"sessionId": sid, "prompt": "Fan out"}))
        .await;

    // The grandchild's shell call waits for an answer.
    let url = stack.servers[0].ws_url();
    let (token, coord) = (stack.token.clone(), sid.clone());
    let interaction = berth_e2e::harness::eventually(30, || {
        let (url, token, coord) = (url.clone(), token.clone(), coord.clone());
        async move {
            let mut o = Client::authed(&url, &token).await.ok()?;
            for kid in children(&mut o, &coord).await {
                for grand in children(&mut o, kid["sessionId"].as_str()?).await {
                    let grand = grand["sessionId"].as_str()?.to_string();
                    let pending = o.ok("session.pendingInteractions", json!({"sessionId": grand})).await;
                    if let Some(first) = pending.as_array()?.first() {
                        return Some(first["interactionId"].as_str()?.to_string());
                    }
                }
            }
            None
        }
    })
    .await
    .expect("the grandchild asks before it runs shell");
    assert!(!stack.workspace_dir.join("grand.txt").exists());
    c.ok(
        "session.respond",
        json!({"interactionId": interaction, "answer": {"approved": false}}),
    )
    .await;
    let events = watch.until(60, is_turn_end).await.expect("the coordinator ends");
    assert_eq!(events.last().unwrap()["state"], "completed", "{events:?}");
    assert!(
        !stack.workspace_dir.join("grand.txt").exists(),
        "the grandchild ran unasked"
    );
}

/// The first child of coordinator `sid` with a pending interaction, and that interaction,
/// as a client of replica `replica` finds them.
async fn pending_in_child(stack: &Stack, replica: usize, sid: &str) -> (String, String) {
    berth_e2e::harness::eventually(30, || {
        let url = stack.servers[replica].ws_url();
        let token = stack.token.clone();
        let sid = sid.to_string();
        async move {
            let mut o = Client::authed(&url, &token).await.ok()?;
            for kid in children(&mut o, &sid).await {
                let kid = kid["sessionId"].as_str()?.to_string();
                let pending = o.ok("session.pendingInteractions", json!({"sessionId": kid})).await;
                if let Some(first) = pending.as_array()?.first() {
                    return Some((kid, first["interactionId"].as_str()?.to_string()));
                }
            }
            None
        }
    })
    .await
    .expect("the child's approval is pending")
}
