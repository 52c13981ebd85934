//! MCP tools (issue 17, SPEC §4.16): the worker connects to the MCP servers configured for
//! the workspace (`.berth/mcp.json`, when the worker allows it) and in its own configuration
//! (`BERTH_WORKER_MCP_CONFIG`); their tools reach the model under the session's approval
//! policy and their results land in history; a server that cannot be used is a notice and a
//! diagnostic, and the turn goes on.

use std::path::Path;

use berth_e2e::{
    Client, MockProvider, Reply, Stack,
    client::{Subscription, code},
    harness::eventually,
};
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
/// A stack whose worker (given `worker_env` too) serves the workspace's `.berth/mcp.json`,
/// which names the test server `tester` with `env` and its pid written to the returned file
/// (and, when `env` has `ESCAPEE`, its escaped child's pid to `mcp-escapee.pid` beside it).
async fn with_workspace_tester(
    mock: &MockProvider,
    mut env: Value,
    worker_env: &[(&str, &str)],
) -> (Stack, std::path::PathBuf) {
    let mut stack = Stack::start(mock, 1).await;
    let pidfile = stack.workspace_dir.join("mcp-server.pid");
    env["PIDFILE"] = pidfile.display().to_string().into();
    if env.get("ESCAPEE").is_some() {
        env["ESCAPEE"] = stack.workspace_dir.join("mcp-escapee.pid").display().to_string().into();
    }
    write_config(
        &stack.workspace_dir.join(".berth/mcp.json"),
        json!({"tester": {"command": SERVER, "env": env}}),
    );
    stack.kill_worker().await;
    let worker_env: Vec<(&str, &str)> = [("BERTH_WORKER_MCP_WORKSPACE", "true")]
        .into_iter()
        .chain(worker_env.iter().copied())
        .collect();
    stack.start_worker_with_env(0, &[], &worker_env).await;
    (stack, pidfile)
}

async fn session(stack: &Stack, c: &mut Client) -> (String, Subscription) {
    let s = c.ok("session.create", json!({"workspaceId": stack.workspace_id})).await;
    let sid = s["sessionId"].as_str().unwrap().to_string();
    let watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    (sid, watch)
}

#[tokio::test]
async fn a_workspace_mcp_servers_tool_is_approved_runs_in_the_workspace_and_its_result_lands_in_history() {
    let mock = MockProvider::start().await;
    let (stack, pidfile) = with_workspace_tester(
        &mock,
        json!({"GREETING": "hi", "ESCAPEE": true}),
        &[("BERTH_MODEL_API_KEY", "sk-must-not-reach-mcp")],
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
    // Started in `/`, not in the workspace, with a clean environment plus its own variables.
    assert!(body.contains("cwd: /\n"), "{body}");
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
    let pid = pid_in(&pidfile);
    let gone = eventually(20, || async move {
        (!Path::new(&format!("/proc/{pid}")).exists()).then_some(())
    })
    .await;
    assert!(gone.is_some(), "the MCP server {pid} outlived its turn");
    // And so is what it started outside its process group.
    assert_escapee_gone(&stack.workspace_dir.join("mcp-escapee.pid")).await;
}

/// The process id a test server wrote to `file`.
fn pid_in(file: &Path) -> i32 {
    std::fs::read_to_string(file).unwrap().trim().parse().unwrap()
}

/// The test server's escaped child (`ESCAPEE`, its pid in `file`) ends soon; if not, the test
/// kills it (not left on the machine) and fails.
async fn assert_escapee_gone(file: &Path) {
    let pid = pid_in(file);
    let gone = ends_within(20, pid).await;
    let still_sleep = std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(b"sleep\0"));
    if !gone && still_sleep {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    assert!(gone, "the MCP server's escaped child {pid} outlived its server");
}

/// Whether process `pid` stops running (see [`running`]) within `secs`.
async fn ends_within(secs: u64, pid: i32) -> bool {
    eventually(secs, || async move { (!running(pid)).then_some(()) })
        .await
        .is_some()
}

/// Running, not a zombie waiting for a reaper (a killed worker's children are reaped by
/// whoever adopts them, if ever).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// A worker killed outright (SIGKILL: no code of it runs) while its turn's stdio server
/// runs: the server goes with it (its guard, `lifeline.rs`), not left on the machine.
#[tokio::test]
async fn a_stdio_server_dies_with_its_worker_even_when_the_worker_is_killed() {
    let mock = MockProvider::start().await;
    // A server that would stay after its input closes: only the guard ends it.
    let (mut stack, pidfile) = with_workspace_tester(&mock, json!({"LINGER": "1"}), &[]).await;
    let mut c = stack.client(0).await;
    let (sid, mut watch) = session(&stack, &mut c).await;
    mock.push(Reply::tools(
        &[("call_m", "mcp__tester__echo", json!({"text": "ahoy"}))],
        5,
    ));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "Use the echo tool"}))
        .await;
    watch
        .until(60, |e| e["type"] == "interaction.requested")
        .await
        .expect("the call waits for approval, its server running");
    let pid = pid_in(&pidfile);
    assert!(running(pid), "the server runs");
    stack.kill_worker().await;
    assert!(
        ends_within(30, pid).await,
        "the MCP server {pid} outlived its killed worker"
    );
}

#[tokio::test]
async fn a_broken_mcp_server_is_a_notice_and_a_diagnostic_and_the_turn_completes() {
    let mock = MockProvider::start().await;
    let mut stack = Stack::start(&mock, 1).await;
    let config = stack.workspace_dir.with_extension("worker-mcp.json");
    // One that starts a process outside its group and quits before its handshake: what it
    // started goes with it.
    let escapee_file = stack.workspace_dir.with_extension("escapee.pid");
    write_config(
        &config,
        json!({
            "missing": {"command": "/nonexistent/berth-no-such-mcp-server"},
            "quits": {"command": SERVER, "env": {"ESCAPEE": escapee_file.display().to_string(), "QUIT": "1"}},
            "works": {"command": SERVER},
            // Two servers whose tools meet in one offered name (`mcp__a___b`).
            "a": {"command": SERVER, "env": {"TOOL_NAME": "_b"}},
            "a_": {"command": SERVER, "env": {"TOOL_NAME": "b"}}
        }),
    );
    // A workspace file that is not JSON at all.
    std::fs::create_dir_all(stack.workspace_dir.join(".berth")).unwrap();
    std::fs::write(stack.workspace_dir.join(".berth/mcp.json"), "{not json").unwrap();
    let (mut c, sid, events) = one_turn_with(
        &mut stack,
        &mock,
        &config,
        ("BERTH_WORKER_MCP_WORKSPACE", "true"),
        "Still here.",
    )
    .await;

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
        params.contains(&json!({"server": "quits", "reason": "start-failed"})),
        "{params:?}"
    );
    assert!(
        params.contains(&json!({"server": null, "reason": "invalid-config"})),
        "{params:?}"
    );
    assert_eq!(params.len(), 3, "{params:?}");
    assert_escapee_gone(&escapee_file).await;

    // The working server's tool is offered; the broken one's are not.
    let tools = offered(&mock, 0);
    assert!(tools.contains(&"mcp__works__echo".to_string()), "{tools:?}");
    assert!(!tools.iter().any(|t| t.starts_with("mcp__missing__")), "{tools:?}");
    // A name two servers' tools meet in is offered once, for one of them only.
    assert_eq!(tools.iter().filter(|t| *t == "mcp__a___b").count(), 1, "{tools:?}");

    let d = c.ok("session.diagnostics", json!({"sessionId": sid})).await;
    let causes: Vec<&Value> = d["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["kind"] == "tool")
        .map(|d| &d["cause"]["code"])
        .collect();
    assert_eq!(causes, [&json!("mcp-server-unavailable"); 3], "{d}");
    assert_eq!(c.history(&sid).await.last().unwrap()["body"], "Still here.");
}

#[tokio::test]
async fn an_mcp_server_that_never_answers_is_a_start_timeout_and_what_it_started_goes_with_it() {
    let mock = MockProvider::start().await;
    let mut stack = Stack::start(&mock, 1).await;
    let config = stack.workspace_dir.with_extension("worker-mcp.json");
    let (pidfile, escapee_file) = (
        stack.workspace_dir.with_extension("hangs.pid"),
        stack.workspace_dir.with_extension("hangs-escapee.pid"),
    );
    write_config(
        &config,
        json!({"hangs": {"command": SERVER, "env": {
            "PIDFILE": pidfile.display().to_string(),
            "ESCAPEE": escapee_file.display().to_string(),
            "HANG": "1",
        }}}),
    );
    let setting = ("BERTH_WORKER_MCP_START_TIMEOUT_SECS", "1");
    let (_, _, events) = one_turn_with(&mut stack, &mock, &config, setting, "Without it.").await;
    let params: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "session.notice")
        .map(|n| &n["params"])
        .collect();
    assert_eq!(
        params,
        [&json!({"server": "hangs", "reason": "start-timeout"})],
        "{events:?}"
    );
    assert!(offered(&mock, 0).iter().all(|t| !t.starts_with("mcp__hangs__")));
    // The server given up on is gone, and so is what it started outside its group.
    let pid = pid_in(&pidfile);
    assert!(
        ends_within(20, pid).await,
        "the MCP server {pid} outlived its start timeout"
    );
    assert_escapee_gone(&escapee_file).await;
}

/// The worker restarted with the MCP servers of `config` and one more `setting`, then one
/// turn of a new session answered `reply`, completed: the client, the session and its
/// events.
async fn one_turn_with(
    stack: &mut Stack,
    mock: &MockProvider,
    config: &Path,
    setting: (&str, &str),
    reply: &str,
) -> (Client, String, Vec<Value>) {
    stack.kill_worker().await;
    let config_path = config.display().to_string();
    let env = [("BERTH_WORKER_MCP_CONFIG", config_path.as_str()), setting];
    stack.start_worker_with_env(0, &[], &env).await;
    let mut c = stack.client(0).await;
    let (sid, mut watch) = session(stack, &mut c).await;
    mock.push(Reply::text(&[reply]));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "Hello"})).await;
    let events = watch.until(60, is_turn_end).await.expect("the turn ends");
    assert_eq!(events.last().unwrap()["state"], "completed", "{events:?}");
    (c, sid, events)
}

/// The test server in streamable-HTTP mode, refusing requests without `header`; returns the
/// process (killed when dropped) and its URL.
async fn http_server(header: &str) -> (tokio::process::Child, String) {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(SERVER)
        .arg("--http")
        .env("REQUIRE_HEADER", header)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let url = tokio::time::timeout(std::time::Duration::from_secs(30), lines.next_line())
        .await
        .expect("the server prints its URL")
        .unwrap()
        .expect("a URL line");
    (child, url)
}

/// Answer the next approval request of `watch` with yes; returns the interaction as shown.
async fn approve(c: &mut Client, watch: &mut Subscription) -> Value {
    let asked = watch
        .until(60, |e| e["type"] == "interaction.requested")
        .await
        .expect("an approval is requested");
    let id = asked.last().unwrap()["interaction"]["interactionId"].clone();
    let shown = c.ok("session.interaction", json!({"interactionId": id})).await;
    c.ok(
        "session.respond",
        json!({"interactionId": id, "answer": {"approved": true}}),
    )
    .await;
    shown
}

#[tokio::test]
async fn an_admins_http_mcp_server_serves_a_members_session_under_approval_and_its_secret_is_never_shown() {
    const SECRET: &str = "Bearer mcp-s3cret-header-value";
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let (_server, url) = http_server(&format!("authorization:{SECRET}")).await;
    let mut admin = stack.client(0).await;
    let mut bob = stack.member(&mut admin, "bob@example.com").await;
    let definition = json!({
        "name": "web",
        "transport": {"kind": "http", "url": url, "headers": {"authorization": SECRET}},
    });

    // Members list the tenant's servers but may not change them.
    let e = bob.call("mcp.save", definition.clone()).await.unwrap_err();
    assert_eq!(code(&e), "forbidden");
    let e = bob.call("mcp.remove", json!({"name": "web"})).await.unwrap_err();
    assert_eq!(code(&e), "forbidden");
    // Bad definitions are typed refusals naming the field.
    for (bad, field) in [
        (
            json!({"name": "a__b", "transport": {"kind": "stdio", "command": "x"}}),
            "name",
        ),
        (
            json!({"name": "w", "transport": {"kind": "http", "url": "file:///etc/passwd"}}),
            "transport.url",
        ),
        (
            json!({"name": "w", "transport": {"kind": "http", "url": "https://u:p@mcp.example/"}}),
            "transport.url",
        ),
        (
            json!({"name": "w", "transport": {"kind": "http", "url": "https://mcp.example/", "headers": {"bad name": "v"}}}),
            "transport.headers",
        ),
    ] {
        let e = admin.call("mcp.save", bad.clone()).await.unwrap_err();
        assert_eq!(code(&e), "bad-params", "{bad}");
        assert_eq!(e.data["field"], field, "{bad}");
    }

    let saved = admin.ok("mcp.save", definition).await;
    assert_eq!(
        saved["transport"],
        json!({"kind": "http", "url": url, "headerNames": ["authorization"]})
    );
    assert_eq!(saved["enabled"], true);
    let listed = bob.ok("mcp.list", json!({})).await;
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["name"], "web");
    assert!(!listed.to_string().contains("s3cret"), "{listed}");
    let audit = admin.ok("admin.audit.list", json!({})).await;
    assert!(
        audit["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["action"] == "mcp.save" && e["target"] == "web"),
        "{audit}"
    );

    // A member's session: the model calls the server's tool, which waits for approval.
    let (sid, mut watch) = session(&stack, &mut bob).await;
    mock.push(Reply::tools(
        &[("call_h", "mcp__web__echo", json!({"text": "over http"}))],
        5,
    ));
    mock.push(Reply::text(&["Done."]));
    bob.ok("session.send", json!({"sessionId": sid, "prompt": "Use the web echo"}))
        .await;
    let shown = approve(&mut bob, &mut watch).await;
    assert_eq!(shown["tool"]["name"], "mcp__web__echo", "{shown}");
    let events = watch.until(60, is_turn_end).await.expect("the turn ends");
    assert_eq!(events.last().unwrap()["state"], "completed", "{events:?}");
    assert!(!events.iter().any(|e| e["type"] == "session.notice"), "{events:?}");
    assert!(offered(&mock, 0).contains(&"mcp__web__echo".to_string()));
    let rows = bob.history(&sid).await;
    let result = rows
        .iter()
        .find(|r| r["kind"] == "toolResult")
        .expect("a tool result row");
    assert_eq!(result["tool"]["status"], "completed", "{result}");
    assert!(
        result["body"].as_str().unwrap().starts_with("echo: over http\n"),
        "{result}"
    );

    // The header value reached the server (it refuses requests without it) and nothing else:
    // not the model, not history, not a log.
    for (i, req) in mock.requests().iter().enumerate() {
        assert!(!req.to_string().contains("s3cret"), "request {i} carries the secret");
    }
    assert!(!serde_json::to_string(&rows).unwrap().contains("s3cret"));
    let logs = [stack.servers[0].log.clone(), stack.worker.as_ref().unwrap().log.clone()];
    for log in logs {
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(!text.contains("s3cret"), "{} holds the secret", log.display());
    }

    // Removed, it is gone from the list and from the next turn.
    assert_eq!(
        admin.ok("mcp.remove", json!({"name": "web"})).await,
        json!({"removed": true})
    );
    assert_eq!(bob.ok("mcp.list", json!({})).await, json!([]));
    mock.push(Reply::text(&["No tools from outside."]));
    bob.ok("session.send", json!({"sessionId": sid, "prompt": "Again"}))
        .await;
    let events = watch.until(60, is_turn_end).await.expect("the second turn ends");
    assert_eq!(events.last().unwrap()["state"], "completed", "{events:?}");
    assert!(!offered(&mock, 2).iter().any(|t| t.starts_with("mcp__web__")));
}

#[tokio::test]
async fn tenant_stdio_servers_run_outside_the_workspace_and_the_workers_own_file_wins_a_name_clash() {
    let mock = MockProvider::start().await;
    let mut stack = Stack::start(&mock, 1).await;
    let config = stack.workspace_dir.with_extension("worker-mcp.json");
    write_config(
        &config,
        json!({"clash": {"command": SERVER, "env": {"FROM_WORKER": "1"}}}),
    );
    stack.kill_worker().await;
    let config_path = config.display().to_string();
    stack
        .start_worker_with_env(0, &[], &[("BERTH_WORKER_MCP_CONFIG", config_path.as_str())])
        .await;
    let mut admin = stack.client(0).await;
    let stdio = |env: Value| json!({"kind": "stdio", "command": SERVER, "env": env});
    admin
        .ok(
            "mcp.save",
            json!({"name": "local", "transport": stdio(json!({"TENANT_TOKEN": "env-s3cret", "WHERE": "${workspace}"}))}),
        )
        .await;
    admin
        .ok(
            "mcp.save",
            json!({"name": "clash", "transport": stdio(json!({"FROM_TENANT": "1"}))}),
        )
        .await;
    admin
        .ok(
            "mcp.save",
            json!({"name": "off", "transport": stdio(json!({})), "enabled": false}),
        )
        .await;
    // A command named relative to the working directory never runs a workspace's file: a
    // repository (or the model's approved write) cannot plant what a server starts.
    let planted = stack.workspace_dir.join("planted.sh");
    let marker = stack.workspace_dir.join("planted-ran");
    std::fs::write(&planted, format!("#!/bin/sh\ntouch {}\n", marker.display())).unwrap();
    std::fs::set_permissions(&planted, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    admin
        .ok(
            "mcp.save",
            json!({"name": "planted", "transport": {"kind": "stdio", "command": "./planted.sh"}}),
        )
        .await;
    // One that cannot be reached is a notice, not a failed turn.
    admin
        .ok(
            "mcp.save",
            json!({"name": "gone", "transport": {"kind": "http", "url": "http://127.0.0.1:9/mcp"}}),
        )
        .await;
    let listed = admin.ok("mcp.list", json!({})).await;
    let local = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "local")
        .unwrap();
    assert_eq!(
        local["transport"],
        json!({"kind": "stdio", "command": SERVER, "envNames": ["TENANT_TOKEN", "WHERE"]})
    );
    assert!(!listed.to_string().contains("env-s3cret"), "{listed}");

    let s = admin
        .ok(
            "session.create",
            json!({"workspaceId": stack.workspace_id, "autoApprove": true}),
        )
        .await;
    let sid = s["sessionId"].as_str().unwrap().to_string();
    let mut watch = admin.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    mock.push(Reply::tools(
        &[
            ("call_l", "mcp__local__echo", json!({"text": "tenant"})),
            ("call_c", "mcp__clash__echo", json!({"text": "clash"})),
        ],
        5,
    ));
    mock.push(Reply::text(&["Both answered."]));
    admin
        .ok("session.send", json!({"sessionId": sid, "prompt": "Call both"}))
        .await;
    let events = watch.until(60, is_turn_end).await.expect("the turn ends");
    assert_eq!(events.last().unwrap()["state"], "completed", "{events:?}");
    let notices: Vec<Value> = events
        .iter()
        .filter(|e| e["type"] == "session.notice")
        .map(|e| e["params"].clone())
        .collect();
    let mut notices: Vec<String> = notices.iter().map(Value::to_string).collect();
    notices.sort();
    assert_eq!(
        notices,
        [
            json!({"server": "gone", "reason": "start-failed"}).to_string(),
            json!({"server": "planted", "reason": "start-failed"}).to_string(),
        ],
        "{events:?}"
    );

    let tools = offered(&mock, 0);
    assert!(tools.contains(&"mcp__local__echo".to_string()), "{tools:?}");
    assert!(!tools.iter().any(|t| t.starts_with("mcp__off__")), "{tools:?}");
    let rows = admin.history(&sid).await;
    let body = |call: &str| {
        rows.iter()
            .find(|r| r["kind"] == "toolResult" && r["tool"]["callId"] == call)
            .unwrap_or_else(|| panic!("no result for {call}: {rows:?}"))["body"]
            .as_str()
            .unwrap()
            .to_string()
    };
    // The tenant's server ran outside the workspace, told where it is, with its own
    // environment; the planted script never ran.
    let local = body("call_l");
    assert!(local.starts_with("echo: tenant\n"), "{local}");
    assert!(local.contains("cwd: /\n"), "{local}");
    let place = local
        .split("where: ")
        .nth(1)
        .and_then(|l| l.lines().next())
        .unwrap_or_default();
    assert_eq!(
        std::path::Path::new(place).canonicalize().ok(),
        stack.workspace_dir.canonicalize().ok(),
        "{local}"
    );
    assert!(!marker.exists(), "a workspace file ran as an MCP server");
    assert!(local.contains("TENANT_TOKEN"), "{local}");
    // On a name clash the worker's own entry is the one started.
    let clash = body("call_c");
    assert!(
        clash.contains("FROM_WORKER") && !clash.contains("FROM_TENANT"),
        "{clash}"
    );
    let worker_log = std::fs::read_to_string(&stack.worker.as_ref().unwrap().log).unwrap();
    assert!(!worker_log.contains("env-s3cret"));
}

/// A tenant MCP server whose stored definition cannot be read is left out of the turn (and
/// logged) rather than failing its hand-out: the turn's settings are read with the commit
/// that hands it to the worker, so an error there would leave a turn running that no worker
/// was told about (and `session.send` answered with an error).
#[tokio::test]
async fn an_unreadable_stored_mcp_server_is_left_out_and_the_turn_runs() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let stdio = json!({"kind": "stdio", "command": SERVER, "env": {}});
    c.ok("mcp.save", json!({"name": "broken", "transport": stdio})).await;
    let db = berth_e2e::harness::db(&stack.database_url).await;
    db.execute("UPDATE mcp_servers SET transport = '\"not a transport\"'::jsonb", &[])
        .await
        .unwrap();
    for round in 0..2 {
        let (sid, mut watch) = session(&stack, &mut c).await;
        mock.push(Reply::text(&["Still here."]));
        c.ok("session.send", json!({"sessionId": sid, "prompt": "Hello"})).await;
        let events = watch.until(30, is_turn_end).await.expect("the turn ends");
        assert_eq!(
            events.last().unwrap()["state"],
            "completed",
            "round {round}: {events:?}"
        );
        let tools = offered(&mock, round);
        assert!(!tools.iter().any(|t| t.starts_with("mcp__broken__")), "{tools:?}");
    }
}

/// A server none of whose tools the session's agent could be offered is not started: a
/// workspace's `.berth/mcp.json` names a command to run, and a session whose agent leaves
/// its tools out runs nothing of it (one approved shell command could otherwise have planted
/// a server that every later session of the workspace starts). An agent that names the
/// server's tool starts it.
#[tokio::test]
async fn a_server_whose_tools_the_agent_could_not_be_offered_is_not_started() {
    let mock = MockProvider::start().await;
    let (stack, pidfile) = with_workspace_tester(&mock, json!({}), &[]).await;
    let mut c = stack.client(0).await;
    for (name, tools, starts) in [
        ("reader", json!(["read_file"]), false),
        ("echoer", json!(["read_file", "mcp__tester__echo"]), true),
    ] {
        let agent = c.ok("agent.save", json!({"name": name, "tools": tools})).await;
        let s = c
            .ok(
                "session.create",
                json!({"workspaceId": stack.workspace_id, "agent": agent["agentId"]}),
            )
            .await;
        let sid = s["sessionId"].as_str().unwrap().to_string();
        let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
        mock.push(Reply::text(&["done"]));
        c.ok("session.send", json!({"sessionId": sid, "prompt": "Anything"}))
            .await;
        let events = watch.until(60, is_turn_end).await.expect("the turn ends");
        assert_eq!(events.last().unwrap()["state"], "completed", "{events:?}");
        assert_eq!(pidfile.exists(), starts, "{name}: the server started");
    }
}
