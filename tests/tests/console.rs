//! The web console (issue 16): served by `berth serve` at `/` with a strict policy, and
//! driven end to end in headless Chromium (Debian's package, through playwright-core from
//! npm) against the real stack: `tests/console/scenarios.mjs` holds the browser steps.
//!
//! Outside CI, a machine without node, Chromium or playwright-core skips the browser tests
//! and says why; `.ci/run` installs them and sets `BERTH_TEST_BROWSER_REQUIRED`, which turns
//! their absence into a failure. Screenshots of the main pages go to the test's scratch dir.

use std::path::{Path, PathBuf};

use berth_e2e::{Client, MockProvider, Part, Reply, Stack, harness::scratch_dir};
use serde_json::json;

/// What the browser tests need: node, playwright-core's module and a Chromium binary.
struct Browser {
    node: PathBuf,
    playwright: PathBuf,
    chromium: PathBuf,
}

fn find_browser() -> Result<Browser, String> {
    let node = std::env::var_os("BERTH_NODE")
        .map(PathBuf::from)
        .unwrap_or_else(|| "node".into());
    let runs = std::process::Command::new(&node)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !runs {
        return Err(format!("{} does not run (set BERTH_NODE)", node.display()));
    }
    let prefix = std::env::var_os("BERTH_PLAYWRIGHT")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/var/tmp/berth-playwright".into());
    let playwright = prefix.join("node_modules/playwright-core/index.mjs");
    if !playwright.exists() {
        return Err(format!(
            "{} is missing (npm install --prefix {} playwright-core, or set BERTH_PLAYWRIGHT)",
            playwright.display(),
            prefix.display()
        ));
    }
    let chromium = match std::env::var_os("BERTH_CHROMIUM") {
        Some(p) => PathBuf::from(p),
        None => ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .ok_or("no Chromium at /usr/bin/chromium (apt-get install chromium, or set BERTH_CHROMIUM)")?,
    };
    if !chromium.exists() {
        return Err(format!("{} is missing (set BERTH_CHROMIUM)", chromium.display()));
    }
    Ok(Browser {
        node,
        playwright,
        chromium,
    })
}

/// The browser, or None after saying why the test is skipped (a failure where CI requires it).
fn browser(test: &str) -> Option<Browser> {
    match find_browser() {
        Ok(b) => Some(b),
        Err(why) if std::env::var_os("BERTH_TEST_BROWSER_REQUIRED").is_some() => {
            panic!("{test}: the browser tests are required here but cannot run: {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED {test}: {why}; .ci/run installs what the browser tests need");
            None
        }
    }
}

/// Run one scenario of `scenarios.mjs` against `base`; panics with its output if it fails.
async fn run_scenario(b: &Browser, scenario: &str, base: &str, env: &[(&str, &str)]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("console/scenarios.mjs");
    let shots = scratch_dir("console-screenshots");
    let mut cmd = tokio::process::Command::new(&b.node);
    cmd.arg(&script)
        .arg(scenario)
        .env("BERTH_URL", base)
        .env("BERTH_PLAYWRIGHT_CORE", &b.playwright)
        .env("BERTH_CHROMIUM", &b.chromium)
        .env("BERTH_SHOTS", &shots)
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(std::time::Duration::from_secs(240), cmd.output())
        .await
        .expect("the browser scenario finishes within 4 minutes")
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "scenario {scenario} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    eprintln!("{stdout}screenshots in {}", shots.display());
}

#[tokio::test]
async fn the_console_is_served_with_a_strict_policy_and_may_open_the_socket() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let server = &stack.servers[0];
    let page = server.get("/").await;
    assert_eq!(page.status(), 200);
    let h = page.headers().clone();
    assert!(h["content-type"].to_str().unwrap().starts_with("text/html"));
    let csp = h["content-security-policy"].to_str().unwrap();
    for directive in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(directive), "{csp}");
    }
    assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"), "{csp}");
    assert_eq!(h["x-frame-options"], "DENY");
    assert_eq!(h["x-content-type-options"], "nosniff");
    let html = page.text().await.unwrap();
    assert!(
        html.contains("<script type=\"module\" src=\"/console/app.js\">"),
        "{html}"
    );

    let js = server.get("/console/app.js").await;
    assert_eq!(js.status(), 200);
    assert!(
        js.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/javascript")
    );
    assert!(js.headers().contains_key("content-security-policy"));
    let missing = server.get("/console/nothing.js").await;
    assert_eq!(missing.status(), 404);
    assert_eq!(server.get("/console/../Cargo.toml").await.status(), 404);

    // The console's own origin may open the WebSocket (it still signs in with `hello`);
    // another site may not.
    let own = format!("http://{}", server.addr);
    let mut c = Client::connect_with(&server.ws_url(), None, Some(&own))
        .await
        .expect("same origin");
    let err = c.call("ping", json!({})).await.expect_err("not signed in yet");
    assert_eq!(err.data_code(), Some("unauthorized"));
    let hello = c
        .ok(
            "hello",
            json!({"protocol": 1, "token": stack.token, "client": {"name": "console-test", "version": "1"}}),
        )
        .await;
    assert_eq!(hello["role"], "admin");
    let err = Client::connect_with(&server.ws_url(), None, Some("http://127.0.0.1:1"))
        .await
        .err()
        .expect("another origin is refused");
    assert!(format!("{err:#}").contains("403"), "{err:#}");
}

#[tokio::test]
async fn an_admin_creates_a_member_and_a_credential_and_revokes_it_in_the_browser() {
    let Some(b) = browser("an_admin_creates_a_member_and_a_credential_and_revokes_it_in_the_browser") else {
        return;
    };
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let base = format!("http://{}", stack.servers[0].addr);
    run_scenario(
        &b,
        "admin",
        &base,
        &[("BERTH_ADMIN_TOKEN", &stack.token), ("BERTH_WORKSPACE_TITLE", "proj")],
    )
    .await;

    // What the browser did is what the server holds.
    let mut admin = stack.client(0).await;
    let users = admin.ok("admin.user.list", json!({})).await;
    let member = users
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["email"] == "member@example.com")
        .expect("the member exists");
    assert_eq!(member["role"], "member");
    assert_eq!(member["disabled"], true);
    let creds = admin.ok("admin.credential.list", json!({})).await;
    let cred = creds
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["note"] == "member laptop")
        .expect("the credential exists");
    assert_eq!(cred["userId"], member["userId"]);
    assert!(cred["revokedAt"].is_string(), "{cred}");
    assert!(cred["lastUsedAt"].is_string(), "{cred}");
}

#[tokio::test]
async fn a_member_prompts_watches_the_stream_approves_a_tool_and_reloads_in_the_browser() {
    let Some(b) = browser("a_member_prompts_watches_the_stream_approves_a_tool_and_reloads_in_the_browser") else {
        return;
    };
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut admin = stack.client(0).await;
    let (email, password) = ("dev@example.com", "correct horse battery staple");
    admin
        .ok(
            "admin.user.create",
            json!({"email": email, "password": password, "role": "member"}),
        )
        .await;
    // One step that streams (with a pause, so the page shows it live) and asks to write a
    // file; then the answer.
    let write = json!({"path": "greeting.txt", "content": "hello from the console\n"});
    mock.push(Reply::Stream(vec![
        Part::Text("Let me write ".into()),
        Part::Delay(1500),
        Part::Text("the file.".into()),
        Part::tool_call(0, "call_w", "write_file", &write, 16),
    ]));
    mock.push(Reply::Stream(vec![
        Part::Text("The greeting ".into()),
        Part::Delay(300),
        Part::Text("is written.".into()),
        Part::Usage {
            prompt: 10,
            completion: 5,
        },
    ]));
    // The turn that is stopped from the page.
    mock.push(Reply::StreamThenHang(vec![Part::Text("Thinking about it".into())]));
    let base = format!("http://{}", stack.servers[0].addr);
    run_scenario(
        &b,
        "member",
        &base,
        &[
            ("BERTH_MEMBER_EMAIL", email),
            ("BERTH_MEMBER_PASSWORD", password),
            ("BERTH_WORKSPACE_TITLE", "proj"),
        ],
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(stack.workspace_dir.join("greeting.txt")).unwrap(),
        "hello from the console\n",
        "the approved call ran"
    );
    assert_eq!(mock.requests().len(), 3, "the removed queued prompt never ran");
}

/// Issue 52: reading a session in the browser — markdown, turn ends with causes, a stopped
/// turn's text, approval expiry and fallback, the signed-in email, an unknown session, a
/// phone's width (screenshots of each in the scratch directory).
#[tokio::test]
async fn a_member_reads_markdown_turn_ends_and_a_stopped_turn_also_on_a_phone() {
    let Some(b) = browser("a_member_reads_markdown_turn_ends_and_a_stopped_turn_also_on_a_phone") else {
        return;
    };
    let mock = MockProvider::start().await;
    let stack = Stack::start_with(&mock, 1, &[("BERTH_MODEL_MAX_RETRIES", "0")]).await;
    let mut admin = stack.client(0).await;
    let (email, password) = ("reader@example.com", "a long enough password");
    admin
        .ok(
            "admin.user.create",
            json!({"email": email, "password": password, "role": "member"}),
        )
        .await;
    let markdown = "# A plan\nSome **bold** and `inline_code`, see [the docs](https://example.com/docs) \
                    and [bad](javascript:alert(1)).\n\n- one\n- two\n\n1. first\n2. second\n\n\
                    ```rust\nlet x = 1 < 2;\n```\n<img src=x onerror=alert(1)>";
    // Lines that made the renderer's patterns backtrack for minutes (a heading, a fence) or
    // recurse past the stack (a quote thousands deep), then text after them.
    let traps = format!(
        "\n\n# a{spaces}x\n\n```{spaces}!\n\n{quotes} deep\n\nafter the traps",
        spaces = " ".repeat(5000),
        quotes = ">".repeat(5000)
    );
    let markdown = format!("{markdown}{traps}");
    mock.push(Reply::Stream(vec![Part::Text(markdown)]));
    mock.push(Reply::Status(400));
    let write = json!({"path": "never.txt", "content": "no\n"});
    mock.push(Reply::Stream(vec![Part::tool_call(
        0,
        "call_w",
        "write_file",
        &write,
        16,
    )]));
    mock.push(Reply::text(&["Not writing it then."]));
    mock.push(Reply::StreamThenHang(vec![Part::Text("Partial words so far".into())]));
    let base = format!("http://{}", stack.servers[0].addr);
    run_scenario(
        &b,
        "reading",
        &base,
        &[
            ("BERTH_MEMBER_EMAIL", email),
            ("BERTH_MEMBER_PASSWORD", password),
            ("BERTH_WORKSPACE_TITLE", "proj"),
        ],
    )
    .await;
    assert!(
        !stack.workspace_dir.join("never.txt").exists(),
        "the denied call did not run"
    );
}

/// Issue 51: the model's question (`ask_user`) is drawn with answer controls by its kind and
/// the member's click answers it; the model's next request carries the answer.
#[tokio::test]
async fn a_member_answers_the_models_question_in_the_browser() {
    let Some(b) = browser("a_member_answers_the_models_question_in_the_browser") else {
        return;
    };
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut admin = stack.client(0).await;
    let (email, password) = ("asked@example.com", "correct horse battery staple");
    admin
        .ok(
            "admin.user.create",
            json!({"email": email, "password": password, "role": "member"}),
        )
        .await;
    let ask = json!({"kind": "choice", "question": "Which branch?", "options": ["main", "dev"], "allow_skip": false});
    mock.push(Reply::tools(&[("q1", "ask_user", ask)], 16));
    mock.push(Reply::text(&["Merged into dev."]));
    let base = format!("http://{}", stack.servers[0].addr);
    run_scenario(
        &b,
        "question",
        &base,
        &[
            ("BERTH_MEMBER_EMAIL", email),
            ("BERTH_MEMBER_PASSWORD", password),
            ("BERTH_WORKSPACE_TITLE", "proj"),
        ],
    )
    .await;
    let answered = mock.requests().iter().any(|r| {
        r["messages"].as_array().is_some_and(|m| {
            m.iter()
                .any(|m| m["role"] == "tool" && m["tool_call_id"] == "q1" && m["content"] == r#"{"answer":"dev"}"#)
        })
    });
    assert!(answered, "the model reads the member's answer");
}
