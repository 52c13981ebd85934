//! MCP tools (issue 17, SPEC §4.16): the worker connects to the MCP servers configured for
//! the workspace (`.berth/mcp.json`, when the worker allows it) and in its own configuration
//! (`BERTH_WORKER_MCP_CONFIG`); their tools reach the model under the session's approval
//! policy and their results land in history; a server that cannot be used is a notice and a
//! diagnostic, and the turn goes on.

use std::path::Path;

use berth_e2e::{Client, MockProvider, Reply, Stack, client::Subscription, harness::eventually};
use serde_json::{Value, json};

const SERVER: &str = env!("CARGO_BIN_EXE_berth-mcp-test-server");

fn is_turn_end(e: &Value) -> bool {
    e["type"] == "turn.ended"
}

/// The tool names offered in provider request `i`.
fn offered(mock: &MockProvider, i: usize) -> Vec<String> {
    mock.requests()[i]["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn write_config(path: &Path, servers: Value) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, json!({"mcpServers": servers}).to_string()).unwrap();
}

/// A session that asks for approvals (no `autoApprove`), watched from the start.
async fn session(stack: &Stack, c: &mut Client) -> (String, Subscription) {
    let s = c.ok("session.create", json!({"workspaceId": stack.workspace_id})).await;
    let sid = s["sessionId"].as_str().unwrap().to_string();
    let watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    (sid, watch)
}

#[tokio::test]
async fn a_workspace_mcp_servers_tool_is_approved_runs_in_the_workspace_and_its_result_lands_in_history() {
    let mock = MockProvider::start().await;
    let mut stack = Stack::start(&mock, 1).await;
    let pidfile = stack.workspace_dir.join("mcp-server.pid");
    write_config(
        &stack.workspace_dir.join(".berth/mcp.json"),
        json!({"tester": {"command": SERVER, "env": {"PIDFILE": pidfile.display().to_string(), "GREETING": "hi"}}}),
    );
    stack.kill_worker().await;
    stack
        .start_worker_with_env(
            0,
            &[],
            &[
                ("BERTH_WORKER_MCP_WORKSPACE", "true"),
                ("BERTH_MODEL_API_KEY", "sk-must-not-reach-mcp"),
            ],
        )
        .await;
    let mut c = stack.client(0).await;
    let (sid, mut watch) = session(&stack, &mut c).await;

    mock.push(Reply::tools(
        &[("call_m", "mcp__tester__echo", json!({"text": "ahoy"}))],
        5,
    ));
    mock.push(Reply::text(&["The server said ahoy."]));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "Use the echo tool"}))
        .await;

    // The call waits for a person's approval, like a shell command would.
    let asked = watch
        .until(60, |e| e["type"] == "interaction.requested")
        .await
        .expect("an approval is requested");
    let requested = asked.last().unwrap();
    let interaction = requested["interaction"]["interactionId"]
        .as_str()
        .expect("the interaction's id")
        .to_string();
    let shown = c.ok("session.interaction", json!({"interactionId": interaction})).await;
    assert_eq!(shown["tool"]["name"], "mcp__tester__echo", "{shown}");
    assert_eq!(shown["input"], json!({"text": "ahoy"}));
    c.ok(
        "session.respond",
        json!({"interactionId": interaction, "answer": {"approved": true}}),
    )
    .await;
    let events = watch.until(60, is_turn_end).await.expect("the turn ends");
    assert_eq!(events.last().unwrap()["state"], "completed", "{events:?}");

    // The model was offered the server's tool, namespaced, with its schema.
    let reqs = mock.requests();
    assert!(offered(&mock, 0).contains(&"mcp__tester__echo".to_string()));
    let schema = reqs[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "mcp__tester__echo")
        .unwrap()["function"]["parameters"]
        .clone();
    assert_eq!(schema["required"], json!(["text"]));

    // Its result is in history, as the call's result, and went back to the model.
    let rows = c.history(&sid).await;
    let result = rows
        .iter()
        .find(|r| r["kind"] == "toolResult")
        .expect("a tool result row");
    assert_eq!(result["tool"]["name"], "mcp__tester__echo");
    assert_eq!(result["tool"]["status"], "completed");
    let body = result["body"].as_str().unwrap();
    assert!(body.starts_with("echo: ahoy\n"), "{body}");
    // Started inside the workspace, with a clean environment plus its own variables.
    let root = stack.workspace_dir.canonicalize().unwrap();
    assert!(body.contains(&format!("cwd: {}\n", root.display())), "{body}");
    let env = body.rsplit("env: ").next().unwrap();
    let names: Vec<&str> = env.split(',').collect();
    assert!(names.contains(&"GREETING") && names.contains(&"PATH"), "{env}");
    assert!(
        !names.iter().any(|n| n.starts_with("BERTH_") || *n == "DATABASE_URL"),
        "Berth's environment leaked to the MCP server: {env}"
    );
    let m1 = reqs[1]["messages"].as_array().unwrap();
    let tool_msg = m1.iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(tool_msg["tool_call_id"], "call_m");
    assert!(tool_msg["content"].as_str().unwrap().starts_with("echo: ahoy"));
    assert_eq!(rows.last().unwrap()["body"], "The server said ahoy.");

    // The server ran for the turn and is gone once it ended.
    let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    let gone = eventually(20, || async move {
        (!Path::new(&format!("/proc/{pid}")).exists()).then_some(())
    })
    .await;
    assert!(gone.is_some(), "the MCP server {pid} outlived its turn");
}

#[tokio::test]
async fn a_broken_mcp_server_is_a_notice_and_a_diagnostic_and_the_turn_completes() {
    let mock = MockProvider::start().await;
    let mut stack = Stack::start(&mock, 1).await;
    let config = stack.workspace_dir.with_extension("worker-mcp.json");
    write_config(
        &config,
        json!({
            "missing": {"command": "/nonexistent/berth-no-such-mcp-server"},
            "works": {"command": SERVER}
        }),
    );
    // A workspace file that is not JSON at all.
    std::fs::create_dir_all(stack.workspace_dir.join(".berth")).unwrap();
    std::fs::write(stack.workspace_dir.join(".berth/mcp.json"), "{not json").unwrap();
    stack.kill_worker().await;
    let config_path = config.display().to_string();
    stack
        .start_worker_with_env(
            0,
            &[],
            &[
                ("BERTH_WORKER_MCP_CONFIG", config_path.as_str()),
                ("BERTH_WORKER_MCP_WORKSPACE", "true"),
            ],
        )
        .await;
    let mut c = stack.client(0).await;
    let (sid, mut watch) = session(&stack, &mut c).await;
    mock.push(Reply::text(&["Still here."]));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "Hello"})).await;
    let events = watch.until(60, is_turn_end).await.expect("the turn ends");
    assert_eq!(events.last().unwrap()["state"], "completed", "{events:?}");

    let notices: Vec<&Value> = events.iter().filter(|e| e["type"] == "session.notice").collect();
    let params: Vec<Value> = notices
        .iter()
        .map(|n| {
            assert_eq!(n["code"], "mcp-server-unavailable", "{n}");
            assert_eq!(n["level"], "warning", "{n}");
            n["params"].clone()
        })
        .collect();
    assert!(
        params.contains(&json!({"server": "missing", "reason": "start-failed"})),
        "{params:?}"
    );
    assert!(
        params.contains(&json!({"server": null, "reason": "invalid-config"})),
        "{params:?}"
    );
    assert_eq!(params.len(), 2, "{params:?}");

    // The working server's tool is offered; the broken one's are not.
    let tools = offered(&mock, 0);
    assert!(tools.contains(&"mcp__works__echo".to_string()), "{tools:?}");
    assert!(!tools.iter().any(|t| t.starts_with("mcp__missing__")), "{tools:?}");

    let d = c.ok("session.diagnostics", json!({"sessionId": sid})).await;
    let causes: Vec<&Value> = d["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["kind"] == "tool")
        .map(|d| &d["cause"]["code"])
        .collect();
    assert_eq!(causes, [&json!("mcp-server-unavailable"); 2], "{d}");
    assert_eq!(c.history(&sid).await.last().unwrap()["body"], "Still here.");
}
