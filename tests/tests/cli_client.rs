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
}
