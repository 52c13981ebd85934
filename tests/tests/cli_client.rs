//! The `berth` client commands against a real server: login (token stored with mode
//! 0600), workspaces, chat with a streamed answer, sessions and history.

use std::{os::unix::fs::PermissionsExt, process::Stdio};

use berth_client::{Client, method::AdminUserCreate, protocol::AdminUserCreateParams};
use berth_e2e::{MockProvider, Reply, Stack, harness::berth_bin};
use tokio::io::AsyncWriteExt;

async fn berth(config_dir: &std::path::Path, args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut child = tokio::process::Command::new(berth_bin())
        .args(args)
        .env("BERTH_CONFIG_DIR", config_dir)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run berth");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    let out = child.wait_with_output().await.unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn login_then_chat_sessions_and_history() {
    let mock = MockProvider::start().await;
    mock.push(Reply::text(&["Hi ", "from ", "Berth"]));
    let stack = Stack::start(&mock, 1).await;
    let admin = Client::connect(&stack.servers[0].addr, &stack.token).await.unwrap();
    admin
        .call::<AdminUserCreate>(AdminUserCreateParams {
            email: "cli@example.com".into(),
            role: None,
            password: Some("pw-secret-cli-1234".into()),
            operation_id: None,
        })
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = format!("http://{}", stack.servers[0].addr);

    let (ok, _, err) = berth(
        dir.path(),
        &["login", "--server", &server, "--email", "cli@example.com"],
        "wrong-password\n",
    )
    .await;
    assert!(!ok, "a wrong password is refused");
    assert!(err.contains("unauthorized"), "{err}");
    let (ok, _, err) = berth(
        dir.path(),
        &["login", "--server", &server, "--email", "cli@example.com"],
        "pw-secret-cli-1234\n",
    )
    .await;
    assert!(ok, "{err}");
    let stored = dir.path().join("credentials.json");
    let mode = std::fs::metadata(&stored).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    let (ok, out, err) = berth(dir.path(), &["workspaces", "--json"], "").await;
    assert!(ok, "{err}");
    let list: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(list[0]["workspaceId"], stack.workspace_id.as_str());

    let (ok, out, err) = berth(dir.path(), &["chat", "--workspace", &stack.workspace_id], "say hi\n").await;
    assert!(ok, "{err}");
    assert_eq!(out.matches("Hi from Berth").count(), 1, "streamed once: {out:?}");
    let session = err
        .lines()
        .find_map(|l| l.strip_prefix("session "))
        .expect("the new session is named")
        .trim()
        .to_string();

    let (ok, out, _) = berth(dir.path(), &["sessions"], "").await;
    assert!(ok);
    assert!(out.contains(&session), "{out}");
    let (ok, out, _) = berth(dir.path(), &["history", &session], "").await;
    assert!(ok);
    assert!(out.contains("> say hi") && out.contains("Hi from Berth"), "{out}");

    let (ok, out, err) = berth(dir.path(), &["search", &session, "from"], "").await;
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.contains("body") && out.trim_end().ends_with("from"), "{out}");
    let (ok, out, err) = berth(dir.path(), &["fork", &session, "--json"], "").await;
    assert!(ok, "{err}");
    let forked: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(forked["branch"]["sessionId"], session.as_str());
    assert_ne!(forked["sessionId"], session.as_str());
}

/// A command at a real terminal: `script` (util-linux) runs it under a pseudo-terminal;
/// what it shows is collected as the screen, keys go to its input.
struct Terminal {
    child: tokio::process::Child,
    keys: tokio::process::ChildStdin,
    screen: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Terminal {
    fn start(command: &str, config_dir: &std::path::Path) -> Terminal {
        use tokio::io::AsyncReadExt;
        let mut child = tokio::process::Command::new("script")
            .args(["-qfec", command, "/dev/null"])
            .env("BERTH_CONFIG_DIR", config_dir)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("script (util-linux) runs berth under a pseudo-terminal");
        let keys = child.stdin.take().unwrap();
        let mut screen_out = child.stdout.take().unwrap();
        let screen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let s = screen.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = screen_out.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                s.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Terminal { child, keys, screen }
    }

    fn text(&self) -> String {
        self.screen.lock().unwrap().clone()
    }

    async fn type_keys(&mut self, keys: &[u8]) {
        self.keys.write_all(keys).await.unwrap();
    }

    async fn wait_for(&self, needle: &str) {
        for _ in 0..600 {
            if self.text().contains(needle) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("{needle:?} never appeared on the terminal:\n{}", self.text());
    }

    async fn exit_status(&mut self) -> std::process::ExitStatus {
        tokio::time::timeout(std::time::Duration::from_secs(20), self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the command did not end:\n{}", self.text()))
            .unwrap()
    }
}

/// `berth chat` at a real terminal, reading a reply that is cut mid-turn, then a Ctrl-C
/// that stops a turn and a second that ends the chat.
#[tokio::test]
async fn chat_at_a_terminal_resumes_a_cut_connection_and_ctrl_c_stops_the_turn() {
    let mock = MockProvider::start().await;
    let mut parts = Vec::new();
    for i in 0..12 {
        parts.push(berth_e2e::Part::Text(format!("w{i} ")));
        parts.push(berth_e2e::Part::Delay(150));
    }
    mock.push(Reply::Stream(parts));
    mock.push(Reply::StreamThenHang(vec![berth_e2e::Part::Text("pondering".into())]));
    let stack = Stack::start(&mock, 1).await;
    let proxy = berth_e2e::cut_proxy::CutProxy::start(&stack.servers[0].addr).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &stack.token).unwrap();

    let command = format!(
        "exec {} chat --server {} --token-file {} --workspace {}",
        berth_bin().display(),
        proxy.server(),
        token_file.display(),
        stack.workspace_id
    );
    let mut term = Terminal::start(&command, dir.path());
    term.wait_for("session ses_").await;
    term.type_keys(b"count\r").await;
    term.wait_for("w1 ").await;
    proxy.cut();
    assert!(!term.text().contains("w11 "), "the cut came mid-turn");
    let answer: String = (0..12).map(|i| format!("w{i} ")).collect();
    term.wait_for(&answer).await;
    {
        let text = term.text();
        assert_eq!(text.matches(&answer).count(), 1, "{text}");
        for i in 0..12 {
            assert_eq!(
                text.matches(&format!("w{i} ")).count(),
                1,
                "no duplicate of w{i}: {text}"
            );
        }
    }

    term.type_keys(b"wait\r").await;
    term.wait_for("pondering").await;
    term.type_keys(b"\x03").await;
    term.wait_for("[turn cancelled]").await;
    term.type_keys(b"\x03").await;
    let status = term.exit_status().await;
    assert!(
        status.success(),
        "a Ctrl-C between turns ends the chat: {}",
        term.text()
    );
}

/// `berth login` at a terminal reads the password without echo; `berth chat` (with the
/// stored login) asks for a held tool call's approval inline and the answer is taken.
#[tokio::test]
async fn login_without_echo_then_an_approval_answered_at_the_chat_prompt() {
    let mock = MockProvider::start().await;
    mock.push(Reply::tools(
        &[(
            "call_1",
            "shell",
            serde_json::json!({"command": "echo approved-at-prompt"}),
        )],
        8,
    ));
    mock.push(Reply::text(&["all ", "done"]));
    let stack = Stack::start(&mock, 1).await;
    let admin = Client::connect(&stack.servers[0].addr, &stack.token).await.unwrap();
    admin
        .call::<AdminUserCreate>(AdminUserCreateParams {
            email: "tty@example.com".into(),
            role: None,
            password: Some("pw-secret-tty-5678".into()),
            operation_id: None,
        })
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let berth = berth_bin().display().to_string();

    let mut term = Terminal::start(
        &format!(
            "exec {berth} login --server http://{} --email tty@example.com",
            stack.servers[0].addr
        ),
        dir.path(),
    );
    term.wait_for("Password:").await;
    term.type_keys(b"pw-secret-tty-5678\r").await;
    let status = term.exit_status().await;
    let screen = term.text();
    assert!(status.success(), "{screen}");
    assert!(screen.contains("signed in as tty@example.com"), "{screen}");
    assert!(!screen.contains("pw-secret"), "the password was echoed: {screen}");

    let mut term = Terminal::start(
        &format!("exec {berth} chat --workspace {}", stack.workspace_id),
        dir.path(),
    );
    term.wait_for("session ses_").await;
    term.type_keys(b"run it\r").await;
    term.wait_for("? y/n]").await;
    assert!(term.text().contains("[approve shell"), "{}", term.text());
    term.type_keys(b"y\r").await;
    term.wait_for("all done").await;
    let screen = term.text();
    let result = screen
        .lines()
        .find(|l| l.contains("[result]"))
        .unwrap_or_else(|| panic!("no tool result: {screen}"));
    assert!(result.contains("approved-at-prompt"), "the call ran: {screen}");
    // The prompt comes back once the turn has ended; a Ctrl-C there ends the chat.
    term.wait_for("all done\r\n> ").await;
    term.type_keys(b"\x03").await;
    assert!(term.exit_status().await.success(), "{}", term.text());
}

/// `berth chat` asks the model's question (`ask_user`) at the prompt by its kind — a
/// numbered choice — and the number typed is the answer the model's next request carries.
#[tokio::test]
async fn a_question_of_the_model_answered_at_the_chat_prompt() {
    let mock = MockProvider::start().await;
    mock.push(Reply::tools(
        &[(
            "q1",
            "ask_user",
            serde_json::json!({"kind": "choice", "question": "Which branch?", "options": ["main", "dev"]}),
        )],
        8,
    ));
    mock.push(Reply::text(&["merged into ", "dev"]));
    let stack = Stack::start(&mock, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &stack.token).unwrap();
    let command = format!(
        "exec {} chat --server http://{} --token-file {} --workspace {}",
        berth_bin().display(),
        stack.servers[0].addr,
        token_file.display(),
        stack.workspace_id
    );
    let mut term = Terminal::start(&command, dir.path());
    term.wait_for("session ses_").await;
    term.type_keys(b"merge it\r").await;
    term.wait_for("[question] Which branch? 1) main 2) dev (number; empty to skip)")
        .await;
    term.type_keys(b"2\r").await;
    term.wait_for("merged into dev").await;
    let answered = mock.requests().iter().any(|r| {
        r["messages"].as_array().is_some_and(|m| {
            m.iter()
                .any(|m| m["role"] == "tool" && m["tool_call_id"] == "q1" && m["content"] == r#"{"answer":"dev"}"#)
        })
    });
    assert!(answered, "the model reads the answer: {}", term.text());
    term.wait_for("merged into dev\r\n> ").await;
    term.type_keys(b"\x03").await;
    assert!(term.exit_status().await.success(), "{}", term.text());
}
