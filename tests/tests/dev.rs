//! `berth dev` as a person runs it: started from a directory, stopped with Ctrl-C.

use std::{path::Path, time::Duration};

use berth_e2e::{
    Client, MockProvider,
    harness::{berth_bin, eventually, scratch_dir, spawn_listening},
};
use serde_json::json;

fn pid_alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        })
}

/// Ctrl-C in a terminal signals the whole foreground process group. Berth must drain its
/// connections and its worker first, then stop its private PostgreSQL, and say nothing
/// alarming while doing so; its logs to a file carry no colour codes.
#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_stops_dev_cleanly_with_its_cluster_and_plain_logs() {
    let mock = MockProvider::start().await;
    let workspace = scratch_dir("devws");
    let data = scratch_dir("devdata");
    let log = data.join("berth-dev.log");
    let mut cmd = tokio::process::Command::new(berth_bin());
    cmd.arg("dev")
        .current_dir(&workspace)
        .env("BERTH_DATA_DIR", &data)
        .env("BERTH_LISTEN", "127.0.0.1:0")
        .env("BERTH_METRICS_LISTEN", "127.0.0.1:0")
        .env("BERTH_MODEL_BASE_URL", mock.base_url())
        .env("BERTH_MODEL", "mock-model")
        .env_remove("DATABASE_URL")
        .env_remove("NO_COLOR")
        .process_group(0);
    let (mut child, addr, _metrics) = spawn_listening(cmd, &log).await.expect("berth dev starts");
    let pgid = child.id().expect("pid") as i32;

    // Wait for the dev worker to be online, so that stopping exercises its cleanup too.
    let token = std::fs::read_to_string(data.join("run/token")).expect("token file");
    let mut client = Client::authed(&format!("ws://{addr}/v1/rpc"), token.trim())
        .await
        .expect("client");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut online = None;
    while online.is_none() && tokio::time::Instant::now() < deadline {
        let list = client.ok("workspace.list", json!({})).await;
        online = list
            .as_array()
            .is_some_and(|l| l.iter().any(|w| w["online"] == true))
            .then_some(());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(online.is_some(), "the dev worker never came online");
    drop(client);

    let postmaster: i32 = std::fs::read_to_string(data.join("pg/postmaster.pid"))
        .expect("postmaster.pid")
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("postmaster pid");
    assert!(pid_alive(postmaster));

    // What the terminal does on Ctrl-C: SIGINT to every process of the foreground group.
    let sent = std::process::Command::new("kill")
        .args(["-INT", "--", &format!("-{pgid}")])
        .status()
        .expect("kill");
    assert!(sent.success());
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("berth dev stops within 30 s")
        .expect("wait");
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(status.success(), "berth dev exited with {status}; log:\n{text}");
    let alarming: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect();
    assert!(
        alarming.is_empty(),
        "a clean stop logged warnings or errors:\n{}",
        alarming.join("\n")
    );
    assert!(
        !text.contains('\u{1b}'),
        "ANSI escapes in a log written to a file:\n{text}"
    );
    assert!(
        text.contains("shutting down"),
        "expected the drain to be logged:\n{text}"
    );
    let gone = eventually(5, || async { (!pid_alive(postmaster)).then_some(()) }).await;
    assert!(
        gone.is_some(),
        "the private PostgreSQL ({postmaster}) outlived berth dev"
    );
}
