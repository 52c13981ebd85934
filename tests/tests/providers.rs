//! Model providers (issue 10): profiles and their wire formats, resilience, typed causes,
//! the per-session choice of provider and endpoint, and reload — against the scripted
//! provider speaking Chat Completions, the Responses API and Anthropic Messages.

use berth_e2e::{Client, Format, MockProvider, Part, Reply, Stack, client::code, harness::metric};
use serde_json::{Value, json};

fn is_turn_end(v: &Value) -> bool {
    v["type"] == "turn.ended"
}

/// Profiles `resp` (Responses API) and `anth` (Anthropic Messages) on `mock`, beside the
/// default chat-completions profile; each with its own key.
fn profiles(mock: &MockProvider) -> Vec<(String, String)> {
    let url = mock.base_url();
    [
        ("BERTH_PROVIDERS", "resp,anth"),
        ("BERTH_PROVIDER_RESP_API", "responses"),
        ("BERTH_PROVIDER_RESP_BASE_URL", &url),
        ("BERTH_PROVIDER_RESP_API_KEY", "sk-resp-key"),
        ("BERTH_PROVIDER_RESP_MODELS", "resp-model:128000,resp-mini"),
        ("BERTH_PROVIDER_ANTH_API", "anthropic-messages"),
        ("BERTH_PROVIDER_ANTH_BASE_URL", &url),
        ("BERTH_PROVIDER_ANTH_API_KEY", "sk-anth-key"),
        ("BERTH_PROVIDER_ANTH_MODELS", "claude-test"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

async fn stack_with(mock: &MockProvider, extra: &[(&str, &str)]) -> Stack {
    let owned = profiles(mock);
    let mut env: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    env.extend_from_slice(extra);
    Stack::start_with(mock, 1, &env).await
}

/// Send `prompt` in a new session created with `create` params; returns the session id and
/// the turn's end.
async fn run_turn(stack: &Stack, c: &mut Client, create: Value, prompt: &str) -> (String, Value) {
    let mut params = json!({"workspaceId": stack.workspace_id});
    for (k, v) in create.as_object().unwrap() {
        params[k] = v.clone();
    }
    let snap = c.ok("session.create", params).await;
    let sid = snap["sessionId"].as_str().unwrap().to_string();
    let mut w = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    c.ok("session.send", json!({"sessionId": sid, "prompt": prompt})).await;
    let items = w.until(60, is_turn_end).await.expect("turn ended");
    (sid, items.last().unwrap().clone())
}

/// History rows without what differs between sessions (ids, times).
async fn rows(c: &mut Client, sid: &str) -> Vec<Value> {
    let h = c.ok("session.history", json!({"sessionId": sid})).await;
    h["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| json!({"kind": r["kind"], "body": r["body"], "thinking": r.get("thinking"), "tool": r.get("tool")}))
        .collect()
}

fn answer() -> Reply {
    Reply::Stream(vec![
        Part::Reasoning("Let me ".into()),
        Part::Reasoning("think.".into()),
        Part::Text("Hello ".into()),
        Part::Text("from the model.".into()),
        Part::Usage {
            prompt: 21,
            completion: 8,
        },
    ])
}

/// A step that thinks, then calls two tools (arguments in small pieces): the second reads
/// what the first wrote.
fn tool_step() -> Reply {
    Reply::Stream(vec![
        Part::Reasoning("Write, then read.".into()),
        Part::tool_call(
            0,
            "c1",
            "write_file",
            &json!({"path": "note.txt", "content": "written through the provider"}),
            5,
        ),
        Part::tool_call(1, "c2", "shell", &json!({"command": "cat note.txt"}), 4),
        Part::Usage {
            prompt: 30,
            completion: 4,
        },
    ])
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_tool_using_turn_completes_through_each_wire_format_with_identical_rows() {
    let mock = MockProvider::start().await;
    let stack = stack_with(&mock, &[]).await;
    let mut c = stack.client(0).await;
    let mut histories = Vec::new();
    for (create, format, key) in [
        (
            json!({"autoApprove": true}),
            Format::Chat,
            "Bearer sk-test-provider-key",
        ),
        (
            json!({"autoApprove": true, "provider": "resp"}),
            Format::Responses,
            "Bearer sk-resp-key",
        ),
        (
            json!({"autoApprove": true, "provider": "anth", "model": "claude-test"}),
            Format::Anthropic,
            "sk-anth-key",
        ),
    ] {
        mock.push(tool_step());
        mock.push(answer());
        let (sid, end) = run_turn(&stack, &mut c, create, "write and read a note").await;
        assert_eq!(end["state"], "completed", "{format:?}: {end}");
        assert_eq!(
            end["usage"],
            json!({"inputTokens": 51, "outputTokens": 12}),
            "{format:?}"
        );
        histories.push(rows(&mut c, &sid).await);
        for (got_format, credential) in mock.credentials().iter().rev().take(2) {
            assert_eq!(*got_format, format);
            assert_eq!(credential.as_deref(), Some(key), "{format:?}: each profile's own key");
        }
        // The usage the provider reported, in its own format, is metered the same.
        let usage = stack
            .sql_i64("SELECT input_tokens FROM turns WHERE session_id = $1", &sid)
            .await;
        assert_eq!(usage, 51, "{format:?}");
    }
    assert_eq!(histories[0], histories[1]);
    assert_eq!(histories[0], histories[2]);
    let rows = &histories[0];
    assert!(rows.iter().any(|r| r["body"] == "Hello from the model."), "{rows:?}");
    assert!(rows.iter().any(|r| r["kind"] == "toolCall"), "{rows:?}");
    assert!(
        rows.iter().any(|r| r["body"]
            .as_str()
            .unwrap_or("")
            .contains("written through the provider")),
        "the second call read what the first wrote: {rows:?}"
    );
    // Each request was in its provider's shape, with the profile's model, the tool
    // schemas, and (in the second step) the calls and their results.
    let reqs = mock.requests();
    assert_eq!(reqs.len(), 6);
    assert_eq!(reqs[0]["model"], "mock-model");
    assert_eq!(reqs[0]["stream_options"]["include_usage"], true);
    assert_eq!(
        reqs[2]["model"], "resp-model",
        "a profile named without a model gets its first"
    );
    assert!(reqs[2]["stream"] == true && reqs[2]["input"].is_array());
    assert!(
        reqs[2]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "shell")
    );
    let input = reqs[3]["input"].as_array().unwrap();
    assert!(
        input
            .iter()
            .any(|i| i["type"] == "function_call" && i["call_id"] == "c2")
    );
    assert!(
        input
            .iter()
            .any(|i| i["type"] == "function_call_output" && i["call_id"] == "c1")
    );
    assert_eq!(reqs[4]["model"], "claude-test");
    assert!(reqs[4]["max_tokens"].is_u64());
    assert!(
        reqs[4]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["input_schema"].is_object())
    );
    let blocks: Vec<&Value> = reqs[5]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().into_iter().flatten())
        .collect();
    assert!(blocks.iter().any(|b| b["type"] == "tool_use" && b["id"] == "c2"));
    assert!(
        blocks
            .iter()
            .any(|b| b["type"] == "tool_result" && b["tool_use_id"] == "c1")
    );
    // Tokens by provider in the metrics.
    let metrics = stack.servers[0].metrics().await;
    for provider in ["default", "resp", "anth"] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("berth_model_tokens_total{kind=\"input\"")
                    && l.contains(&format!("provider=\"{provider}\"}}"))
                    && l.ends_with(" 51")),
            "{provider}: {metrics}"
        );
    }
}

/// A delegate's child runs on its parent's provider, with its parent's model and that
/// profile's key: not on the default profile with a model vetted for another one.
#[tokio::test(flavor = "multi_thread")]
async fn a_delegates_child_runs_on_its_parents_provider() {
    let mock = MockProvider::start().await;
    let stack = stack_with(&mock, &[]).await;
    let mut c = stack.client(0).await;
    mock.push_for(
        "Hand off",
        Reply::tools(&[("d1", "delegate", json!({"prompt": "Task delegated: answer"}))], 9),
    );
    mock.push_for("Task delegated", Reply::text(&["child done"]));
    mock.push_for("Hand off", Reply::text(&["handed off"]));
    let create = json!({"provider": "anth", "model": "claude-test", "delegationDepth": 1});
    let (_, end) = run_turn(&stack, &mut c, create, "Hand off").await;
    assert_eq!(end["state"], "completed", "{end}");
    let credentials = mock.credentials();
    assert!(credentials.len() >= 3, "{credentials:?}");
    for (format, key) in &credentials {
        assert_eq!(*format, Format::Anthropic, "{credentials:?}");
        assert_eq!(key.as_deref(), Some("sk-anth-key"), "{credentials:?}");
    }
    assert!(mock.requests().iter().all(|r| r["model"] == "claude-test"));
}

/// A provider's redirect is not followed: the profile's key goes only to the profile's URL
/// (Anthropic's `x-api-key` would survive a redirect to another host), and the step fails
/// with the status it got.
#[tokio::test(flavor = "multi_thread")]
async fn a_providers_redirect_is_not_followed_with_its_key() {
    let mock = MockProvider::start().await;
    let elsewhere = MockProvider::start().await;
    elsewhere.push(Reply::text(&["took the key"]));
    let stack = stack_with(&mock, &[("BERTH_MODEL_MAX_RETRIES", "0")]).await;
    let mut c = stack.client(0).await;
    mock.push(Reply::Redirect(format!("{}/messages", elsewhere.base_url())));
    let create = json!({"provider": "anth", "model": "claude-test"});
    let (_, end) = run_turn(&stack, &mut c, create, "hi").await;
    assert_eq!(end["state"], "failed", "{end}");
    assert_eq!(end["cause"], json!({"code": "provider-status", "status": 307}));
    assert_eq!(mock.credentials().len(), 1);
    assert!(elsewhere.credentials().is_empty(), "{:?}", elsewhere.credentials());
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_providers_and_models_are_typed_errors() {
    let mock = MockProvider::start().await;
    let stack = stack_with(&mock, &[]).await;
    let mut c = stack.client(0).await;
    let ws = stack.workspace_id.clone();
    let e = c
        .call("session.create", json!({"workspaceId": ws, "provider": "nope"}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "unknown-provider");
    let e = c
        .call(
            "session.create",
            json!({"workspaceId": ws, "provider": "anth", "model": "gpt-x"}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "unknown-model");
    let snap = c.ok("session.create", json!({"workspaceId": ws})).await;
    let sid = snap["sessionId"].clone();
    let e = c
        .call(
            "session.setModel",
            json!({"sessionId": sid, "provider": "resp", "model": "claude-test"}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "unknown-model");
    let snap = c
        .ok(
            "session.setModel",
            json!({"sessionId": sid, "provider": "resp", "model": "resp-mini"}),
        )
        .await;
    assert_eq!(snap["provider"], "resp");
    assert_eq!(snap["modelId"], "resp-mini");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rate_limited_call_is_retried_after_the_providers_retry_after() {
    let mock = MockProvider::start().await;
    let stack = stack_with(&mock, &[("BERTH_MODEL_MAX_RETRIES", "2")]).await;
    let mut c = stack.client(0).await;
    mock.push(Reply::StatusRetryAfter { status: 429, secs: 1 });
    mock.push(Reply::text(&["after ", "the wait"]));
    let (sid, end) = run_turn(&stack, &mut c, json!({}), "hi").await;
    assert_eq!(end["state"], "completed", "{end}");
    assert_eq!(mock.requests().len(), 2);
    assert_eq!(c.history_bodies(&sid).await.last().unwrap(), "after the wait");
}

#[tokio::test(flavor = "multi_thread")]
async fn repeated_server_errors_fail_the_step_with_a_typed_cause_and_no_body_or_key_in_logs() {
    let mock = MockProvider::start().await;
    let stack = stack_with(&mock, &[("BERTH_MODEL_MAX_RETRIES", "2")]).await;
    let mut c = stack.client(0).await;
    for _ in 0..3 {
        mock.push(Reply::Status(500));
    }
    let sid = stack.session(&mut c).await;
    let mut diag_watch = c.subscribe("session.watchDiagnostics", json!({"sessionId": sid}));
    assert_eq!(
        diag_watch.next(10).await.expect("current revision"),
        json!({"diagnosticRevision": 0})
    );
    let mut w = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "hi"})).await;
    let end = w.until(60, is_turn_end).await.expect("turn ended").pop().unwrap();
    assert_eq!(
        diag_watch.next(10).await.expect("the change"),
        json!({"diagnosticRevision": 1})
    );
    assert_eq!(end["state"], "failed");
    assert_eq!(end["cause"], json!({"code": "provider-status", "status": 500}));
    assert_eq!(mock.requests().len(), 3, "the first call and two retries");
    let diags = c.ok("session.diagnostics", json!({"sessionId": sid})).await;
    assert_eq!(diags["diagnostics"][0]["kind"], "model-step");
    assert_eq!(diags["diagnostics"][0]["cause"]["status"], 500);
    let logs = std::fs::read_to_string(&stack.servers[0].log).unwrap()
        + &std::fs::read_to_string(&stack.worker.as_ref().unwrap().log).unwrap();
    assert!(!logs.contains("scripted status"), "a provider body reached a log");
    assert!(!logs.contains("sk-test-provider-key") && !logs.contains("sk-resp-key"));
    assert!(!end.to_string().contains("scripted status"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_stream_fails_with_provider_timeout() {
    let mock = MockProvider::start().await;
    let stack = stack_with(&mock, &[("BERTH_MODEL_IDLE_TIMEOUT_SECS", "1")]).await;
    let mut c = stack.client(0).await;
    for (create, _format) in [
        (json!({}), Format::Chat),
        (json!({"provider": "resp"}), Format::Responses),
        (json!({"provider": "anth"}), Format::Anthropic),
    ] {
        mock.push(Reply::StreamThenHang(vec![Part::Text("partial".into())]));
        let (_, end) = run_turn(&stack, &mut c, create, "hi").await;
        assert_eq!(end["state"], "failed");
        assert_eq!(end["cause"], json!({"code": "provider-timeout"}), "{_format:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_during_a_stalled_stream_settles_the_turn() {
    let mock = MockProvider::start().await;
    let stack = stack_with(&mock, &[]).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    let mut w = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    mock.push(Reply::StreamThenHang(vec![Part::Text("partial".into())]));
    let sent = c.ok("session.send", json!({"sessionId": sid, "prompt": "hi"})).await;
    w.until(30, |v| v["type"] == "model.delta")
        .await
        .expect("the stream started");
    c.ok("session.stop", json!({"sessionId": sid, "turnId": sent["turnId"]}))
        .await;
    // Well inside the idle timeout (120 s): the stall does not hold the stop.
    let items = w.until(5, is_turn_end).await.expect("settled soon after stop");
    assert_eq!(items.last().unwrap()["state"], "cancelled");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_chosen_endpoint_is_refused_unless_allowed_and_never_gets_a_key() {
    let mock = MockProvider::start().await;
    let elsewhere = MockProvider::start().await;
    let url = mock.base_url();
    let stack = stack_with(
        &mock,
        &[
            ("BERTH_PROVIDERS", "resp,anth,open,pub"),
            ("BERTH_PROVIDER_OPEN_BASE_URL", &url),
            ("BERTH_PROVIDER_OPEN_API_KEY", "sk-open-key"),
            ("BERTH_PROVIDER_OPEN_ALLOW_BASE_URL", "true"),
            ("BERTH_PROVIDER_OPEN_ALLOW_PRIVATE_BASE_URL", "true"),
            ("BERTH_PROVIDER_PUB_BASE_URL", &url),
            ("BERTH_PROVIDER_PUB_ALLOW_BASE_URL", "true"),
        ],
    )
    .await;
    let mut c = stack.client(0).await;
    let ws = stack.workspace_id.clone();
    // A profile that allows an endpoint of the session's own, but not a private one: the
    // API tier itself, loopback, link-local metadata and private networks are refused.
    for private in [
        elsewhere.base_url(),
        format!("http://{}/v1", stack.servers[0].addr),
        "http://localhost:9464/v1".to_string(),
        "http://169.254.169.254/latest".to_string(),
        "http://10.0.0.7:8791/v1".to_string(),
        "http://[::1]:8790/v1".to_string(),
    ] {
        let e = c
            .call(
                "session.create",
                json!({"workspaceId": ws, "provider": "pub", "baseUrl": private}),
            )
            .await
            .unwrap_err();
        assert_eq!(code(&e), "base-url-not-allowed", "{private}");
        assert_eq!(e.data["reason"], "private-address", "{private}");
    }
    for create in [
        json!({"workspaceId": ws, "baseUrl": elsewhere.base_url()}),
        json!({"workspaceId": ws, "provider": "anth", "baseUrl": elsewhere.base_url()}),
    ] {
        let e = c.call("session.create", create).await.unwrap_err();
        assert_eq!(code(&e), "base-url-not-allowed");
    }
    let e = c
        .call(
            "session.create",
            json!({"workspaceId": ws, "provider": "open", "baseUrl": "file:///etc/passwd"}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "bad-params");
    // Allowed: the call goes to the chosen endpoint, without the profile's key.
    elsewhere.push(Reply::text(&["from elsewhere"]));
    let (sid, end) = run_turn(
        &stack,
        &mut c,
        json!({"provider": "open", "baseUrl": elsewhere.base_url()}),
        "hi",
    )
    .await;
    assert_eq!(end["state"], "completed", "{end}");
    assert_eq!(c.history_bodies(&sid).await.last().unwrap(), "from elsewhere");
    assert_eq!(elsewhere.requests().len(), 1);
    assert!(
        elsewhere.credentials().iter().all(|(_, k)| k.is_none()),
        "the chosen endpoint never receives a key"
    );
    assert!(mock.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_reloads_provider_profiles_without_dropping_connections() {
    let mock = MockProvider::start().await;
    let dir = berth_e2e::harness::scratch_dir("conf");
    let conf = dir.join("berth.conf");
    std::fs::write(&conf, "# no extra profiles yet\n").unwrap();
    let conf_path = conf.display().to_string();
    let stack = Stack::start_with(&mock, 1, &[("BERTH_CONFIG", &conf_path)]).await;
    let mut c = stack.client(0).await;
    let ws = stack.workspace_id.clone();
    let e = c
        .call("session.create", json!({"workspaceId": ws, "provider": "late"}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "unknown-provider");
    std::fs::write(
        &conf,
        format!(
            "BERTH_PROVIDERS=late\nBERTH_PROVIDER_LATE_API=anthropic-messages\nBERTH_PROVIDER_LATE_BASE_URL={}\nBERTH_PROVIDER_LATE_MODELS=late-model\n",
            mock.base_url()
        ),
    )
    .unwrap();
    let pid = stack.servers[0].child.id().expect("server pid");
    let status = std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let created = berth_e2e::harness::eventually(10, || {
        let url = stack.servers[0].ws_url();
        let token = stack.token.clone();
        let ws = ws.clone();
        async move {
            let mut c = Client::authed(&url, &token).await.ok()?;
            c.call("session.create", json!({"workspaceId": ws, "provider": "late"}))
                .await
                .ok()
        }
    })
    .await
    .expect("the reloaded profile is offered");
    assert_eq!(created["modelId"], "late-model");
    // The connection opened before the reload still serves.
    assert_eq!(c.ok("ping", json!({})).await, json!({"pong": true}));
    mock.push(answer());
    let (_, end) = run_turn(&stack, &mut c, json!({"provider": "late"}), "hi").await;
    assert_eq!(end["state"], "completed", "{end}");
    assert_eq!(mock.credentials().last().unwrap().0, Format::Anthropic);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_first_turn_names_the_session_once_and_never_over_a_human_title() {
    let mock = MockProvider::start().await;
    let stack = stack_with(&mock, &[("BERTH_AUTO_TITLES", "true")]).await;
    let mut c = stack.client(0).await;
    // Untitled: the title follows the first turn, through the session's own profile.
    let snap = c
        .ok(
            "session.create",
            json!({"workspaceId": stack.workspace_id, "provider": "anth"}),
        )
        .await;
    let sid = snap["sessionId"].as_str().unwrap().to_string();
    let mut w = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    mock.push(answer());
    mock.push(Reply::text(&["\"Greeting ", "the model.\""]));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "hi there"}))
        .await;
    let items = w
        .until(60, |v| v["type"] == "session.titleChanged")
        .await
        .expect("an automatic title");
    assert_eq!(items.last().unwrap()["title"], "Greeting the model");
    assert!(items.iter().any(is_turn_end), "the title follows the settled turn");
    let title_request = &mock.requests()[1];
    assert!(
        title_request.to_string().contains("hi there"),
        "named from the first prompt"
    );
    assert_eq!(mock.credentials()[1].0, Format::Anthropic);
    // Once: a second turn asks for no title.
    mock.push(Reply::text(&["again"]));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "more"})).await;
    w.until(60, is_turn_end).await.expect("second turn");

    // A human title first: no title request, the title stays.
    let snap = c
        .ok(
            "session.create",
            json!({"workspaceId": stack.workspace_id, "title": "Mine"}),
        )
        .await;
    let human = snap["sessionId"].as_str().unwrap().to_string();
    mock.push(Reply::text(&["ok"]));
    let mut hw = c.subscribe("session.watch", json!({"sessionId": human, "after": 0}));
    c.ok("session.send", json!({"sessionId": human, "prompt": "hello"}))
        .await;
    hw.until(60, is_turn_end).await.expect("turn");
    // A later untitled session's title shows every earlier attempt had its chance.
    mock.push(Reply::text(&["fine"]));
    mock.push(Reply::text(&["Later one"]));
    let (later, _) = run_turn(&stack, &mut c, json!({}), "later").await;
    berth_e2e::harness::eventually(30, || {
        let url = stack.servers[0].ws_url();
        let token = stack.token.clone();
        let later = later.clone();
        async move {
            let mut c = Client::authed(&url, &token).await.ok()?;
            let s = c.ok("session.get", json!({"sessionId": later})).await;
            (s["title"] == "Later one").then_some(())
        }
    })
    .await
    .expect("the later session is named");
    let s = c.ok("session.get", json!({"sessionId": human})).await;
    assert_eq!(s["title"], "Mine");
    assert_eq!(
        mock.requests().len(),
        6,
        "no title request for the human-titled session"
    );
    // Only a completed turn of a session still untitled claims the title (a transaction of
    // its own): the named session's second turn and the human-titled one's skip it.
    let mut outcomes = [0; 3];
    for server in &stack.servers {
        let m = server.metrics().await;
        for (n, outcome) in outcomes.iter_mut().zip(["named", "failed", "taken"]) {
            *n += metric(&m, &format!("berth_auto_titles_total{{outcome=\"{outcome}\"}}")).unwrap_or(0);
        }
    }
    assert_eq!(outcomes, [2, 0, 0], "titles named, failed, claimed for nothing");
}

/// A session without a model of its own is named by its agent's model, the one its turns use.
#[tokio::test(flavor = "multi_thread")]
async fn the_title_of_an_agents_session_comes_from_the_agents_model() {
    let mock = MockProvider::start().await;
    let stack = stack_with(&mock, &[("BERTH_AUTO_TITLES", "true")]).await;
    let mut c = stack.client(0).await;
    let agent = c
        .ok(
            "agent.save",
            json!({"name": "namer", "systemPrompt": "You name things.", "model": "agent-model"}),
        )
        .await;
    mock.push(answer());
    mock.push(Reply::text(&["Named by the agent"]));
    let (sid, end) = run_turn(&stack, &mut c, json!({"agent": agent["agentId"]}), "hi there").await;
    assert_eq!(end["state"], "completed", "{end}");
    berth_e2e::harness::eventually(30, || {
        let url = stack.servers[0].ws_url();
        let token = stack.token.clone();
        let sid = sid.clone();
        async move {
            let mut c = Client::authed(&url, &token).await.ok()?;
            let s = c.ok("session.get", json!({"sessionId": sid})).await;
            (s["title"] == "Named by the agent").then_some(())
        }
    })
    .await
    .expect("the session is named");
    let requests = mock.requests();
    assert_eq!(requests.len(), 2, "the turn and the title");
    assert_eq!(requests[0]["model"], "agent-model", "the turn uses the agent's model");
    assert_eq!(requests[1]["model"], "agent-model", "and so does its title");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_title_request_is_a_title_diagnostic_after_the_answer() {
    let mock = MockProvider::start().await;
    let stack = stack_with(&mock, &[("BERTH_AUTO_TITLES", "true")]).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    let mut diags = c.subscribe("session.watchDiagnostics", json!({"sessionId": sid}));
    assert_eq!(diags.next(10).await.unwrap(), json!({"diagnosticRevision": 0}));
    let mut w = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    mock.push(answer());
    mock.push(Reply::Status(500));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "hi"})).await;
    let end = w.until(60, is_turn_end).await.unwrap().pop().unwrap();
    assert_eq!(end["state"], "completed", "the answer is not failed by its title");
    assert_eq!(diags.next(30).await.unwrap(), json!({"diagnosticRevision": 1}));
    let d = c.ok("session.diagnostics", json!({"sessionId": sid})).await;
    assert_eq!(d["diagnostics"][0]["kind"], "title");
    assert_eq!(
        d["diagnostics"][0]["cause"],
        json!({"code": "provider-status", "status": 500})
    );
    let s = c.ok("session.get", json!({"sessionId": sid})).await;
    assert_eq!(s["title"], "");
}

/// A title is a model call like a worker's, within the tenant's model-call limits: past
/// them it is not asked for, nor claimed (a later turn may still name the session), and
/// nothing fails.
/// A model probe (`status {probeModel}`) is a request to the provider like a model call:
/// past the tenant's rate it is `rate-limited`, and the provider is not asked.
#[tokio::test(flavor = "multi_thread")]
async fn a_model_probe_counts_against_the_tenants_model_call_limits() {
    let mock = MockProvider::start().await;
    let stack = stack_with(&mock, &[("BERTH_MODEL_RATE_PER_MIN", "1")]).await;
    let mut c = stack.client(0).await;
    let first = c.ok("status", json!({"probeModel": true})).await;
    assert_eq!(first["model"]["answered"], true, "{first}");
    let refused = c.call("status", json!({"probeModel": true})).await.unwrap_err();
    assert_eq!(code(&refused), "rate-limited", "{refused:?}");
    assert_eq!(refused.data["limit"], "model-calls", "{refused:?}");
    // Without a probe, status answers as ever.
    c.ok("status", json!({})).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_title_past_the_tenants_model_call_limits_is_not_asked_for() {
    let mock = MockProvider::start().await;
    // One call a minute: the turn's.
    let env = [("BERTH_AUTO_TITLES", "true"), ("BERTH_MODEL_RATE_PER_MIN", "1")];
    let stack = stack_with(&mock, &env).await;
    let mut c = stack.client(0).await;
    mock.push(answer());
    mock.push(Reply::text(&["Never asked"]));
    let (sid, end) = run_turn(&stack, &mut c, json!({}), "hi there").await;
    assert_eq!(end["state"], "completed", "{end}");
    let refused = berth_e2e::harness::eventually(30, || {
        let server = &stack.servers[0];
        async move {
            let m = server.metrics().await;
            metric(&m, "berth_auto_titles_total{outcome=\"refused\"}").filter(|n| *n == 1)
        }
    })
    .await;
    assert!(refused.is_some(), "the title was refused at the tenant's limits");
    assert_eq!(mock.requests().len(), 1, "only the turn reached the provider");
    let s = c.ok("session.get", json!({"sessionId": sid})).await;
    assert_eq!(s["title"], "");
    let d = c.ok("session.diagnostics", json!({"sessionId": sid})).await;
    assert_eq!(d["diagnostics"], json!([]), "a refusal is no failed title");
    let db = berth_e2e::harness::db(&stack.database_url).await;
    let attempted: bool = db
        .query_one("SELECT title_attempted FROM sessions WHERE id = $1", &[&sid])
        .await
        .unwrap()
        .get(0);
    assert!(!attempted, "the title is left for a later turn");
}

#[tokio::test(flavor = "multi_thread")]
async fn session_context_reports_the_latest_request_with_the_providers_usage() {
    let mock = MockProvider::start().await;
    let stack = stack_with(&mock, &[]).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    let none = c.ok("session.context", json!({"sessionId": sid})).await;
    assert_eq!(
        none,
        json!({"through": 1, "request": null}),
        "the fence it used: the last sequence"
    );
    let mut w = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    mock.push(answer());
    c.ok(
        "session.send",
        json!({"sessionId": sid, "prompt": "a prompt of some length"}),
    )
    .await;
    let end = w.until(60, is_turn_end).await.unwrap().pop().unwrap();
    let latest = c.ok("session.context", json!({"sessionId": sid})).await;
    assert!(latest["through"].as_i64() >= end["sequence"].as_i64(), "{latest}");
    let report = latest["request"].clone();
    assert_eq!(report["turnId"], end["turnId"]);
    assert_eq!(report["provider"], "default");
    assert_eq!(report["model"], "mock-model");
    assert_eq!(
        report["inputTokens"], 21,
        "the provider's own count, beside the estimate"
    );
    let roles = report["roles"].as_array().unwrap();
    let user = roles.iter().find(|r| r["role"] == "user").expect("user input");
    assert_eq!(user["messages"], 1);
    assert!(user["estimatedTokens"].as_u64().unwrap() > 0);
    let sum: u64 = roles
        .iter()
        .map(|r| r["estimatedTokens"].as_u64().unwrap())
        .sum::<u64>()
        + report["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["estimatedTokens"].as_u64().unwrap())
            .sum::<u64>();
    assert_eq!(report["estimatedTokens"], sum);
    assert!(
        !report.to_string().contains("a prompt of some length"),
        "sizes, not text"
    );
    let tools = report["tools"].as_array().unwrap();
    assert!(
        tools
            .iter()
            .any(|t| t["name"] == "shell" && t["estimatedTokens"].as_u64() > Some(0))
    );
    // A fence before the request: nothing yet.
    let before = c.ok("session.context", json!({"sessionId": sid, "through": 1})).await;
    assert_eq!(before["request"], Value::Null);
    assert_eq!(before["through"], 1, "the fence asked for");
    let beyond = c
        .ok("session.context", json!({"sessionId": sid, "through": 1_000_000}))
        .await;
    assert!(
        beyond["through"].as_i64() < Some(1_000_000),
        "at most the last sequence: {beyond}"
    );
    assert_eq!(beyond["request"], report);
    // A fork does not inherit its source's requests.
    let revision = c.ok("session.get", json!({"sessionId": sid})).await["historyRevision"].clone();
    let fork = c
        .ok(
            "session.fork",
            json!({"sessionId": sid, "sourceRevision": revision, "operationId": "ctx-fork"}),
        )
        .await;
    let forked = c.ok("session.context", json!({"sessionId": fork["sessionId"]})).await;
    assert_eq!(forked["request"], Value::Null);
}

/// Each format asks for the model's reasoning level, and the reasoning a step returned
/// (Anthropic's signed thinking, the Responses API's encrypted reasoning item) goes back
/// with that step in the turn's next request, as those providers require.
#[tokio::test(flavor = "multi_thread")]
async fn reasoning_levels_reach_each_format_and_reasoning_comes_back_within_the_turn() {
    let mock = MockProvider::start().await;
    let url = mock.base_url();
    let stack = Stack::start_with(
        &mock,
        1,
        &[
            ("BERTH_MODEL_LEVEL", "low"),
            ("BERTH_PROVIDERS", "resp,anth"),
            ("BERTH_PROVIDER_RESP_API", "responses"),
            ("BERTH_PROVIDER_RESP_BASE_URL", &url),
            ("BERTH_PROVIDER_RESP_MODELS", "o-test:200000:high"),
            ("BERTH_PROVIDER_ANTH_API", "anthropic-messages"),
            ("BERTH_PROVIDER_ANTH_BASE_URL", &url),
            ("BERTH_PROVIDER_ANTH_MODELS", "claude-test::medium"),
        ],
    )
    .await;
    let mut c = stack.client(0).await;
    for create in [
        json!({"autoApprove": true}),
        json!({"autoApprove": true, "provider": "resp"}),
        json!({"autoApprove": true, "provider": "anth"}),
    ] {
        mock.push(tool_step());
        mock.push(answer());
        let (_, end) = run_turn(&stack, &mut c, create, "write and read a note").await;
        assert_eq!(end["state"], "completed", "{end}");
    }
    let reqs = mock.requests();
    assert_eq!(reqs.len(), 6);
    // Chat Completions: the default model's level from BERTH_MODEL_LEVEL; Berth's echo
    // field never reaches this format.
    assert_eq!(reqs[0]["reasoning_effort"], "low");
    assert!(!reqs[1].to_string().contains("reasoning_items"));
    // Responses: effort and the encrypted reasoning asked for; the step's reasoning item
    // comes back before its calls.
    assert_eq!(reqs[2]["reasoning"]["effort"], "high");
    assert_eq!(reqs[2]["include"], json!(["reasoning.encrypted_content"]));
    let input = reqs[3]["input"].as_array().unwrap();
    let item = input
        .iter()
        .position(|i| i["type"] == "reasoning")
        .expect("the reasoning item came back");
    assert!(input[item]["encrypted_content"].as_str().unwrap().starts_with("enc-"));
    assert_eq!(input[item]["summary"][0]["text"], "Write, then read.");
    let call = input.iter().position(|i| i["type"] == "function_call").unwrap();
    assert!(item < call, "{input:?}");
    // Anthropic: a thinking budget, and the signed thinking block first in the assistant
    // message that made the calls, unchanged.
    assert_eq!(reqs[4]["thinking"], json!({"type": "enabled", "budget_tokens": 8192}));
    assert!(reqs[4]["max_tokens"].as_u64().unwrap() > 8192);
    let assistant = reqs[5]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "assistant")
        .expect("the step's message");
    let first = &assistant["content"][0];
    assert_eq!(first["type"], "thinking");
    assert_eq!(first["thinking"], "Write, then read.");
    assert!(first["signature"].as_str().unwrap().starts_with("sig-"), "{first}");
    assert_eq!(assistant["content"][1]["type"], "tool_use");
}

/// The model proxy's body limit follows the turn's own model: a conversation that
/// outgrows a small declared window is refused (`payload-too-large`) while the same
/// conversation on a model with a larger window goes through.
#[tokio::test(flavor = "multi_thread")]
async fn the_body_limit_follows_the_models_own_context_window() {
    let mock = MockProvider::start().await;
    let url = mock.base_url();
    let stack = Stack::start_with(
        &mock,
        1,
        &[
            ("BERTH_PROVIDERS", "two"),
            ("BERTH_PROVIDER_TWO_BASE_URL", &url),
            ("BERTH_PROVIDER_TWO_MODELS", "roomy:400000,tiny:1000"),
        ],
    )
    .await;
    let mut c = stack.client(0).await;
    let snap = c
        .ok(
            "session.create",
            json!({"workspaceId": stack.workspace_id, "provider": "two", "model": "tiny"}),
        )
        .await;
    let sid = snap["sessionId"].as_str().unwrap().to_string();
    let mut w = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    // The tiny window makes each turn try to compact first; the summaries fail here, so the
    // conversation grows as it would without compaction.
    for _ in 0..8 {
        mock.push_matching(berth_e2e::SUMMARY_REQUEST, Reply::Status(500));
    }
    // Five prompts of 240 KiB: the fifth request holds about 1.2 MB, over the tiny model's
    // 16 000 bytes + 1 MiB.
    let prompt = "x".repeat(240 << 10);
    let mut ends = Vec::new();
    for _ in 0..5 {
        mock.push(Reply::text(&["ok"]));
        c.ok("session.send", json!({"sessionId": sid, "prompt": prompt})).await;
        ends.push(w.until(60, is_turn_end).await.expect("turn ended").pop().unwrap());
    }
    for end in &ends[..4] {
        assert_eq!(end["state"], "completed", "{end}");
    }
    assert_eq!(ends[4]["state"], "failed");
    assert_eq!(ends[4]["cause"]["code"], "payload-too-large");
    assert_eq!(
        mock.requests()
            .iter()
            .filter(|r| !r.to_string().contains(berth_e2e::SUMMARY_REQUEST))
            .count(),
        4,
        "the refused request never reached the provider"
    );
    c.ok(
        "session.setModel",
        json!({"sessionId": sid, "provider": "two", "model": "roomy"}),
    )
    .await;
    c.ok("session.send", json!({"sessionId": sid, "prompt": prompt})).await;
    let end = w.until(60, is_turn_end).await.expect("turn ended").pop().unwrap();
    assert_eq!(end["state"], "completed", "{end}");
    let turn_requests = mock
        .requests()
        .iter()
        .filter(|r| !r.to_string().contains(berth_e2e::SUMMARY_REQUEST))
        .count();
    assert_eq!(turn_requests, 5);
}
