//! The `berth` client commands against a real server: login (token stored with mode
//! 0600), workspaces, chat with a streamed answer, sessions and history.

use std::{os::unix::fs::PermissionsExt, process::Stdio};

use berth_client::{Client, method::AdminUserCreate, protocol::AdminUserCreateParams};
use berth_e2e::{MockProvider, Reply, Stack, harness::berth_bin};
use tokio::io::AsyncWriteExt;

async fn berth(config_dir: &std::path::Path, args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut cmd = tokio::process::Command::new(berth_bin());
    cmd.args(args)
        .env("BERTH_CONFIG_DIR", config_dir)
        .env("RUST_LOG", "warn");
    output_of(cmd, stdin).await
}

/// Run `cmd` with `stdin` as its input: whether it succeeded, its stdout and its stderr.
async fn output_of(mut cmd: tokio::process::Command, stdin: &str) -> (bool, String, String) {
    let mut child = cmd
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

    // A match is shown in its line (no colour into a pipe).
    let (ok, out, err) = berth(dir.path(), &["search", &session, "from"], "").await;
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(
        out.contains("body:") && out.trim_end().ends_with("Hi from Berth"),
        "{out}"
    );
    assert!(!out.contains('\u{1b}'), "{out:?}");
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
    /// Without colour (`NO_COLOR`), so that the screen is the plain text.
    fn start(command: &str, config_dir: &std::path::Path) -> Terminal {
        Terminal::start_with(command, config_dir, &[("NO_COLOR", "1")])
    }

    /// With `env` set (and `NO_COLOR` only when it sets it).
    fn start_with(command: &str, config_dir: &std::path::Path, env: &[(&str, &str)]) -> Terminal {
        use tokio::io::AsyncReadExt;
        let mut child = tokio::process::Command::new("script")
            .args(["-qfec", command, "/dev/null"])
            .env("BERTH_CONFIG_DIR", config_dir)
            .env("RUST_LOG", "warn")
            .env("TERM", "xterm")
            .env_remove("NO_COLOR")
            .envs(env.iter().copied())
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
    assert!(screen.contains("as tty@example.com; token stored"), "{screen}");
    assert!(!screen.contains("pw-secret"), "the password was echoed: {screen}");

    let mut term = Terminal::start(
        &format!("exec {berth} chat --workspace {}", stack.workspace_id),
        dir.path(),
    );
    term.wait_for("session ses_").await;
    term.type_keys(b"run it\r").await;
    term.wait_for("? y/n]").await;
    assert!(term.text().contains("[approve shell"), "{}", term.text());
    // The call is shown once, on one line; the question does not repeat it.
    assert_eq!(
        term.text().matches("echo approved-at-prompt").count(),
        1,
        "{}",
        term.text()
    );
    // Neither yes nor no: asked again, nothing answered.
    term.type_keys(b"maybe\r").await;
    term.wait_for("answer y or n").await;
    let asked = || term.text().matches("[approve shell").count();
    for _ in 0..100 {
        if asked() == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(asked(), 2, "asked again: {}", term.text());
    term.type_keys(b"y\r").await;
    term.wait_for("all done").await;
    let screen = term.text();
    let result = screen
        .lines()
        .find(|l| l.contains("✓"))
        .unwrap_or_else(|| panic!("no tool result: {screen}"));
    assert!(result.contains("approved-at-prompt"), "the call ran: {screen}");
    // The prompt comes back once the turn has ended; a Ctrl-C there ends the chat.
    term.wait_for("all done\r\n> ").await;
    term.type_keys(b"\x03").await;
    assert!(term.exit_status().await.success(), "{}", term.text());
}

/// `berth` run in `cwd` with a credential file (no stored login).
async fn berth_in(
    cwd: &std::path::Path,
    config_dir: &std::path::Path,
    args: &[&str],
    stdin: &str,
) -> (bool, String, String) {
    let mut cmd = tokio::process::Command::new(berth_bin());
    cmd.args(args)
        .current_dir(cwd)
        .env("BERTH_CONFIG_DIR", config_dir)
        .env("RUST_LOG", "warn")
        .env_remove("BERTH_SERVER");
    output_of(cmd, stdin).await
}

/// A turn whose model endpoint cannot be reached ends the chat non-zero with the cause in
/// words; every error names what was not found (or who refused) and the next step; the
/// server-down error names the URL tried, once; `berth doctor` says which check fails.
#[tokio::test]
async fn failures_say_why_and_what_next_and_exit_non_zero() {
    let stack = Stack::start_with_model("http://127.0.0.1:1", 1, &[("BERTH_MODEL_MAX_RETRIES", "0")]).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &stack.token).unwrap();
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "berth_not_a_credential").unwrap();
    let server = format!("http://{}", stack.servers[0].addr);
    let (tf, wf) = (token_file.to_str().unwrap(), wrong.to_str().unwrap());
    let with = |args: &[&str], file: &str| -> Vec<String> {
        let mut v: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        v.extend([
            "--server".into(),
            server.clone(),
            "--token-file".into(),
            file.to_string(),
        ]);
        v
    };
    let run = |args: Vec<String>, stdin: &'static str| {
        let cfg = dir.path().to_path_buf();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            berth(&cfg, &args, stdin).await
        }
    };

    let (ok, out, err) = run(with(&["chat", "--workspace", &stack.workspace_id], tf), "hello\n").await;
    assert!(!ok, "a failed turn fails the chat: {out} {err}");
    assert!(
        out.contains("[turn failed: the model endpoint could not be reached")
            && out.contains("(provider-unreachable)]"),
        "{out}"
    );
    assert!(err.contains("berth: the turn failed"), "{err}");

    let (ok, _, err) = run(with(&["history", "ses_missing"], tf), "").await;
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "no session ses_missing on {server}: `berth sessions` lists them"
        )),
        "{err}"
    );
    let (ok, _, err) = run(with(&["history", "no such title"], tf), "").await;
    assert!(!ok);
    assert!(
        err.contains("no session \"no such title\"") && err.contains("`berth sessions`"),
        "{err}"
    );
    let (ok, _, err) = run(with(&["sessions", "--workspace", "nowhere"], tf), "").await;
    assert!(!ok);
    assert!(
        err.contains("no workspace \"nowhere\"") && err.contains("`berth workspaces`"),
        "{err}"
    );
    let (ok, _, err) = run(with(&["workspaces"], wf), "").await;
    assert!(!ok);
    assert!(
        err.contains("unauthorized") && err.contains("run `berth login"),
        "{err}"
    );
    let down = vec![
        "workspaces".to_string(),
        "--server".into(),
        "http://127.0.0.1:1".into(),
        "--token-file".into(),
        tf.to_string(),
    ];
    let (ok, _, err) = run(down, "").await;
    assert!(!ok);
    assert_eq!(
        err.matches("http://127.0.0.1:1").count(),
        1,
        "the URL tried, once: {err}"
    );
    assert!(
        err.contains("cannot reach a Berth server at http://127.0.0.1:1") && err.contains("berth dev"),
        "{err}"
    );

    // `berth doctor`: each check a line; the failing one with its next step.
    // This stack's model endpoint does not answer: the server says so, and doctor fails.
    let (ok, out, err) = run(with(&["doctor"], tf), "").await;
    assert!(!ok, "{out} {err}");
    let line = |out: &str, check: &str| {
        out.lines()
            .find(|l| l.split_whitespace().nth(1) == Some(check))
            .unwrap_or_else(|| panic!("no {check} line: {out}"))
            .to_string()
    };
    assert!(line(&out, "server").starts_with("ok"), "{out}");
    assert!(
        line(&out, "credential").starts_with("ok") && line(&out, "credential").contains("admin"),
        "{out}"
    );
    let model = line(&out, "model");
    assert!(
        model.starts_with("fail") && model.contains("provider-unreachable") && model.contains("BERTH_MODEL_BASE_URL"),
        "{out}"
    );
    assert!(line(&out, "worker").starts_with("ok"), "{out}");
    let (ok, out, _) = run(with(&["doctor"], wf), "").await;
    assert!(!ok);
    assert!(
        line(&out, "credential").starts_with("fail") && line(&out, "credential").contains("berth login"),
        "{out}"
    );
    let (ok, out, _) = run(
        vec![
            "doctor".into(),
            "--server".into(),
            "http://127.0.0.1:1".into(),
            "--token-file".into(),
            tf.into(),
        ],
        "",
    )
    .await;
    assert!(!ok);
    assert!(
        line(&out, "server").starts_with("fail") && line(&out, "server").contains("berth dev"),
        "{out}"
    );

    // The same at a terminal: the exit status and the words.
    let mut term = Terminal::start(
        &format!(
            "exec {} history ses_missing --server {server} --token-file {tf}",
            berth_bin().display()
        ),
        dir.path(),
    );
    let status = term.exit_status().await;
    assert!(!status.success());
    assert!(term.text().contains("no session ses_missing"), "{}", term.text());
}

/// Titles work where ids do; `berth chat` with no session or workspace uses the workspace
/// holding the current directory; rendered markdown and colour at a terminal only, and
/// never with `NO_COLOR`; shell completions.
#[tokio::test]
async fn titles_the_current_directory_and_colour_at_a_terminal_only() {
    let mock = MockProvider::start().await;
    mock.push(Reply::text(&["Some **bold** ", "and `code`"]));
    let stack = Stack::start(&mock, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &stack.token).unwrap();
    let server = format!("http://{}", stack.servers[0].addr);
    let tf = token_file.to_str().unwrap();
    let remote = ["--server", server.as_str(), "--token-file", tf];
    let inside = stack.workspace_dir.join("src");
    std::fs::create_dir_all(&inside).unwrap();

    let args: Vec<&str> = ["chat"].iter().chain(remote.iter()).copied().collect();
    let (ok, out, err) = berth_in(&inside, dir.path(), &args, "hello\n").await;
    assert!(ok, "{err}");
    assert!(out.contains("Some **bold** and `code`"), "plain into a pipe: {out:?}");
    assert!(!out.contains('\u{1b}'), "{out:?}");
    let session = err
        .lines()
        .find_map(|l| l.strip_prefix("session "))
        .expect("the new session is named")
        .trim()
        .to_string();

    let admin = Client::connect(&server, &stack.token).await.unwrap();
    admin
        .call::<berth_client::method::SessionRename>(berth_client::protocol::SessionRenameParams {
            session_id: session.clone(),
            title: "colour check".into(),
            operation_id: None,
        })
        .await
        .unwrap();
    let workspaces = admin
        .call::<berth_client::method::WorkspaceList>(Default::default())
        .await
        .unwrap();
    let title = workspaces[0].title.clone();

    let args: Vec<&str> = ["sessions", "--workspace", title.as_str()]
        .iter()
        .chain(remote.iter())
        .copied()
        .collect();
    let (ok, out, err) = berth(dir.path(), &args, "").await;
    assert!(ok, "{err}");
    assert!(out.contains(&session) && out.contains("colour check"), "{out}");
    let args: Vec<&str> = ["history", "colour check"]
        .iter()
        .chain(remote.iter())
        .copied()
        .collect();
    let (ok, out, err) = berth(dir.path(), &args, "").await;
    assert!(ok, "{err}");
    assert!(out.contains("Some **bold** and `code`"), "{out}");

    let history = format!(
        "exec {} history 'colour check' --server {server} --token-file {tf}",
        berth_bin().display()
    );
    let mut term = Terminal::start_with(&history, dir.path(), &[]);
    assert!(term.exit_status().await.success(), "{}", term.text());
    let screen = term.text();
    assert!(
        screen.contains("\u{1b}[1mbold\u{1b}[0m"),
        "bold at a terminal: {screen:?}"
    );
    assert!(screen.contains("\u{1b}[36mcode\u{1b}[0m"), "code in colour: {screen:?}");
    assert!(!screen.contains("**"), "{screen:?}");
    let mut term = Terminal::start_with(&history, dir.path(), &[("NO_COLOR", "1")]);
    assert!(term.exit_status().await.success(), "{}", term.text());
    let screen = term.text();
    assert!(!screen.contains('\u{1b}'), "NO_COLOR: {screen:?}");
    assert!(screen.contains("Some **bold** and `code`"), "{screen:?}");

    for (shell, marker) in [
        ("bash", "_berth()"),
        ("zsh", "#compdef berth"),
        ("fish", "complete -c berth"),
    ] {
        let (ok, out, err) = berth(dir.path(), &["completions", shell], "").await;
        assert!(ok, "{err}");
        assert!(out.contains(marker) && out.contains("doctor"), "{shell}: {out}");
    }
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
