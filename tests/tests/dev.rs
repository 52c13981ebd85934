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

    // Its cluster commits past the WAL segment initdb wrote (where a commit waited ~20×
    // longer for a thin-provisioned virtual disk). Attaching leaves the cluster running.
    let cluster = berth_store::cluster::PrivateCluster::start(&data, &Default::default()).expect("attach");
    let (db, connection) = tokio_postgres::connect(&cluster.url("postgres"), tokio_postgres::NoTls)
        .await
        .expect("connect to the dev cluster");
    tokio::spawn(connection);
    let segment: String = db
        .query_one("SELECT pg_walfile_name(pg_current_wal_lsn())", &[])
        .await
        .expect("current WAL segment")
        .get(0);
    assert_ne!(segment, "000000010000000000000001", "still in initdb's WAL segment");
    drop(db);

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

/// Removes the test's directory under /root and the cluster directory Berth made for it.
struct RootDirs {
    base: std::path::PathBuf,
    data: std::path::PathBuf,
}

impl Drop for RootDirs {
    fn drop(&mut self) {
        if let Ok(pg) = std::fs::read_link(self.data.join("pg"))
            && let Some(home) = pg.parent()
            && home.starts_with(berth_store::cluster::CLUSTERS_DIR)
        {
            let _ = std::fs::remove_dir_all(home);
        }
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// The README's first command as root in a container: from a fresh directory under /root
/// (mode 0700, so PostgreSQL's unprivileged user cannot reach it) whose data dir is private
/// too, `berth dev` starts its cluster where that user can reach it and answers a prompt.
#[tokio::test(flavor = "multi_thread")]
async fn dev_as_root_in_a_private_directory_under_root_answers_a_prompt() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(1) != 0 {
        eprintln!("SKIPPED: not running as root");
        return;
    }
    let mock = MockProvider::start().await;
    let base = std::path::PathBuf::from(format!("/root/berth-test-dev-{}", std::process::id()));
    let project = base.join("myproject");
    let data = project.join(".berth");
    let _cleanup = RootDirs {
        base: base.clone(),
        data: data.clone(),
    };
    std::fs::create_dir_all(&data).unwrap();
    for d in [&base, &project, &data] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let log = scratch_dir("devroot").join("berth-dev.log");
    let mut cmd = tokio::process::Command::new(berth_bin());
    cmd.arg("dev")
        .current_dir(&project)
        .env_remove("BERTH_DATA_DIR")
        .env_remove("DATABASE_URL")
        .env("BERTH_LISTEN", "127.0.0.1:0")
        .env("BERTH_METRICS_LISTEN", "127.0.0.1:0")
        .env("BERTH_MODEL_BASE_URL", mock.base_url())
        .env("BERTH_MODEL", "mock-model");
    let (mut child, addr, _) = spawn_listening(cmd, &log).await.expect("berth dev starts as root");
    assert!(
        std::fs::read_link(data.join("pg")).is_ok(),
        "the cluster lives outside the private directory"
    );

    let token = std::fs::read_to_string(data.join("run/token")).expect("token file");
    let url = format!("ws://{addr}/v1/rpc");
    let workspace = eventually(30, || {
        let (url, token) = (url.clone(), token.trim().to_string());
        async move {
            let mut c = Client::authed(&url, &token).await.ok()?;
            let list = c.ok("workspace.list", json!({})).await;
            let w = list.as_array()?.iter().find(|w| w["online"] == true)?.clone();
            Some(w["workspaceId"].as_str()?.to_string())
        }
    })
    .await
    .expect("the dev worker comes online");
    mock.push(berth_e2e::Reply::text(&["hello ", "root"]));
    let mut c = Client::authed(&url, token.trim()).await.unwrap();
    let sid = c.ok("session.create", json!({"workspaceId": workspace})).await["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "hi"})).await;
    let items = watch
        .until(30, |i| i["type"] == "turn.ended")
        .await
        .expect("the turn ends");
    assert_eq!(items.last().unwrap()["state"], "completed");
    assert_eq!(c.history_bodies(&sid).await, ["hi", "hello root"]);
    drop(c);
    assert!(berth_e2e::harness::terminate(&mut child).await.success());
}
