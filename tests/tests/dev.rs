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
/// alarming while doing so; its logs to a file carry no colour codes; it takes its address
/// file with it.
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
    // Clients in this directory find the server by its address file while it runs.
    let address = data.join("run/address");
    assert_eq!(
        std::fs::read_to_string(&address).expect("address file").trim(),
        format!("http://{addr}")
    );

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
    assert!(
        !address.exists(),
        "a stopped berth dev left its address for clients to find"
    );
}

/// `berth dev` run from `dir` with no data directory configured (the user's data directory
/// is `xdg`), on ports of the system's choosing, with `mock` as its model.
fn dev_without_data_dir(dir: &Path, xdg: &Path, mock: &MockProvider) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(berth_bin());
    cmd.arg("dev")
        .current_dir(dir)
        .env_remove("BERTH_DATA_DIR")
        .env_remove("DATABASE_URL")
        .env("XDG_DATA_HOME", xdg)
        .env("BERTH_LISTEN", "127.0.0.1:0")
        .env("BERTH_METRICS_LISTEN", "127.0.0.1:0")
        .env("BERTH_MODEL_BASE_URL", mock.base_url())
        .env("BERTH_MODEL", "mock-model");
    cmd
}

/// The workspace `berth dev` at `url` serves, once its worker is online.
async fn online_workspace(url: &str, token: &str) -> String {
    eventually(30, || {
        let (url, token) = (url.to_string(), token.to_string());
        async move {
            let mut c = Client::authed(&url, &token).await.ok()?;
            let list = c.ok("workspace.list", json!({})).await;
            let w = list.as_array()?.iter().find(|w| w["online"] == true)?.clone();
            Some(w["workspaceId"].as_str()?.to_string())
        }
    })
    .await
    .expect("the dev worker comes online")
}

/// The data directory `berth dev` chose under `xdg` (`XDG_DATA_HOME`): the one there.
fn dev_data_dir(xdg: &Path) -> Option<std::path::PathBuf> {
    let mut dirs: Vec<_> = std::fs::read_dir(xdg.join("berth/dev"))
        .ok()?
        .filter_map(|e| Some(e.ok()?.path()))
        .collect();
    assert!(dirs.len() <= 1, "one data directory per workspace: {dirs:?}");
    dirs.pop()
}

/// Removes the test's directory under /root and the cluster directory Berth made for it.
struct RootDirs {
    base: std::path::PathBuf,
    xdg: std::path::PathBuf,
}

impl Drop for RootDirs {
    fn drop(&mut self) {
        if let Some(data) = dev_data_dir(&self.xdg)
            && let Ok(pg) = std::fs::read_link(data.join("pg"))
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
    // The user's data directory (as ~/.local/share would be), private like /root.
    let xdg = base.join("share");
    let _cleanup = RootDirs {
        base: base.clone(),
        xdg: xdg.clone(),
    };
    std::fs::create_dir_all(&project).unwrap();
    std::fs::create_dir_all(&xdg).unwrap();
    for d in [&base, &project, &xdg] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let log = scratch_dir("devroot").join("berth-dev.log");
    let cmd = dev_without_data_dir(&project, &xdg, &mock);
    let (mut child, addr, _) = spawn_listening(cmd, &log).await.expect("berth dev starts as root");
    let data = dev_data_dir(&xdg).expect("the data directory");
    assert!(
        std::fs::read_link(data.join("pg")).is_ok(),
        "the cluster lives outside the private directory"
    );

    let token = std::fs::read_to_string(data.join("run/token")).expect("token file");
    let url = format!("ws://{addr}/v1/rpc");
    let workspace = online_workspace(&url, token.trim()).await;
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

/// Issue 47: `berth dev` keeps its data directory (the admin credential, the login signing
/// key, the worker's credential) outside the workspace — by default under the user's data
/// directory, keyed by the workspace — the model's tools refuse Berth's private state in a
/// workspace that still has one, and a command cannot read the provider key from the dev
/// process's environment.
#[tokio::test(flavor = "multi_thread")]
async fn dev_keeps_its_secrets_out_of_the_workspace_and_out_of_reach_of_tools() {
    use std::os::unix::fs::PermissionsExt;
    let mock = MockProvider::start().await;
    let workspace = scratch_dir("devsecrets-ws");
    let home = scratch_dir("devsecrets-home");
    let xdg = home.join("share");
    let log = home.join("berth-dev.log");
    let mut cmd = dev_without_data_dir(&workspace, &xdg, &mock);
    cmd.env("BERTH_MODEL_API_KEY", "sk-dev-provider-secret");
    let (mut child, addr, _) = spawn_listening(cmd, &log).await.expect("berth dev starts");

    let data = dev_data_dir(&xdg).expect("a data directory under the user's");
    let workspace = workspace.canonicalize().unwrap();
    assert!(!data.starts_with(&workspace), "{}", data.display());
    assert!(
        !workspace.join(".berth").exists(),
        "nothing of Berth's in the workspace"
    );
    let mode = std::fs::metadata(&data).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "the data directory is the user's alone");
    // The private cluster trusts whoever reaches its socket: only its user (and root) can.
    let home = std::fs::read_link(data.join("pg"))
        .ok()
        .and_then(|pg| pg.parent().map(std::path::Path::to_path_buf))
        .unwrap_or_else(|| data.clone());
    let sockets = home.join("run/pg");
    let mode = std::fs::metadata(&sockets).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{}", sockets.display());
    let socket = std::fs::read_dir(&sockets)
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| {
            e.file_name().to_string_lossy().starts_with(".s.PGSQL.")
                && !e.file_name().to_string_lossy().ends_with(".lock")
        })
        .expect("the cluster's socket");
    let mode = socket.metadata().unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{}", socket.path().display());
    let token = std::fs::read_to_string(data.join("run/token")).expect("token file");
    let token = token.trim().to_string();

    // A workspace that still holds an older data directory: its files stay closed to tools.
    std::fs::create_dir_all(workspace.join(".berth/run")).unwrap();
    std::fs::write(workspace.join(".berth/run/token"), "berth_old_credential_in_workspace").unwrap();
    let url = format!("ws://{addr}/v1/rpc");
    let wid = online_workspace(&url, &token).await;
    let mut c = Client::authed(&url, &token).await.unwrap();
    let sid = c
        .ok("session.create", json!({"workspaceId": wid, "autoApprove": true}))
        .await["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    let mut watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let environ = "tr '\\0' '\\n' < /proc/$PPID/environ; echo; env";
    mock.push(berth_e2e::Reply::tools(
        &[
            ("r1", "read_file", json!({"path": ".berth/run/token"})),
            (
                "r2",
                "write_file",
                json!({"path": ".git/hooks/pre-commit", "content": "evil"}),
            ),
            ("s1", "shell", json!({"command": environ})),
        ],
        9,
    ));
    mock.push(berth_e2e::Reply::text(&["done"]));
    c.ok(
        "session.send",
        json!({"sessionId": sid, "prompt": "Find the credentials"}),
    )
    .await;
    let items = watch
        .until(60, |i| i["type"] == "turn.ended")
        .await
        .expect("the turn ends");
    assert_eq!(items.last().unwrap()["state"], "completed");

    // What the model got back, in its next request.
    let next = &mock.requests()[1];
    let result = |id: &str| {
        next["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["tool_call_id"] == id)
            .and_then(|m| m["content"].as_str())
            .unwrap_or_else(|| panic!("no result for {id}: {next}"))
            .to_string()
    };
    let read = result("r1");
    assert!(read.contains("private state"), "{read}");
    assert!(!read.contains("berth_old_credential"), "{read}");
    let write = result("r2");
    assert!(write.contains("repository internals"), "{write}");
    assert!(!workspace.join(".git/hooks/pre-commit").exists());
    let shell = result("s1");
    // Read (as root, whom non-dumpable does not stop) or refused (anyone else); either way
    // without the secrets, which left the environment when the process started.
    assert!(
        shell.contains("BERTH_SEALED_ENV=1") || shell.contains("Permission denied"),
        "the command tried its parent's environment: {shell}"
    );
    assert!(
        !shell.contains("sk-dev-provider-secret"),
        "the provider key leaked: {shell}"
    );
    assert!(!shell.contains(&token), "the admin credential leaked: {shell}");

    // The client commands run in the workspace (a directory of it, too) find this server
    // and its credential with no `berth login`.
    std::fs::create_dir_all(workspace.join("src")).unwrap();
    let listed = tokio::process::Command::new(berth_bin())
        .args(["workspaces", "--json"])
        .current_dir(workspace.join("src"))
        .env("XDG_DATA_HOME", &xdg)
        .env("BERTH_CONFIG_DIR", home.join("no-login"))
        .env_remove("BERTH_SERVER")
        .output()
        .await
        .unwrap();
    assert!(listed.status.success(), "{}", String::from_utf8_lossy(&listed.stderr));
    let list: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(list[0]["workspaceId"], wid.as_str(), "{list}");
    let cli = |args: &[&str]| {
        let mut cmd = tokio::process::Command::new(berth_bin());
        cmd.args(args)
            .current_dir(&workspace)
            .env("XDG_DATA_HOME", &xdg)
            .env("BERTH_CONFIG_DIR", home.join("no-login"))
            .env_remove("BERTH_SERVER");
        cmd
    };
    let me = cli(&["whoami", "--json"]).output().await.unwrap();
    assert!(me.status.success(), "{}", String::from_utf8_lossy(&me.stderr));
    let me: serde_json::Value = serde_json::from_slice(&me.stdout).unwrap();
    assert_eq!(me["role"], "admin", "{me}");
    // `berth stop SESSION` stops what runs; with nothing running it says so and fails.
    let stop = cli(&["stop", &sid]).output().await.unwrap();
    assert!(!stop.status.success());
    assert!(
        String::from_utf8_lossy(&stop.stderr).contains("no turn is running"),
        "{stop:?}"
    );
    let version = cli(&["version"]).output().await.unwrap();
    assert!(
        String::from_utf8_lossy(&version.stdout).starts_with("berth "),
        "{version:?}"
    );
    drop(c);
    assert!(berth_e2e::harness::terminate(&mut child).await.success());
}

/// The first five minutes: `berth dev`'s start-up lines name the console, the model and its
/// endpoint, and a `berth chat` line that works as printed from the directory (no login, no
/// admin step); `berth doctor` there checks the model endpoint too; `berth login` defaults
/// to this server.
#[tokio::test(flavor = "multi_thread")]
async fn dev_start_up_lines_name_the_console_the_model_and_a_chat_that_works_as_printed() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let mock = MockProvider::start().await;
    let workspace = scratch_dir("devfirst-ws");
    let home = scratch_dir("devfirst-home");
    let xdg = home.join("share");
    let log = home.join("berth-dev.log");
    let mut child = dev_without_data_dir(&workspace, &xdg, &mock)
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("berth dev");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut shown = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let last = line.contains("Ctrl-C");
            shown.push(line);
            if last {
                return;
            }
        }
        panic!("berth dev ended: {}", std::fs::read_to_string(&log).unwrap_or_default());
    })
    .await
    .expect("the start-up lines within 60 s");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let text = shown.join("\n");
    let addr = shown[0].split_whitespace().nth(3).expect("address").to_string();
    assert!(text.contains(&format!("console: {addr}/")), "{text}");
    assert!(
        text.contains(&format!("model: mock-model at {}", mock.base_url())),
        "{text}"
    );
    let chat = shown
        .iter()
        .find_map(|l| l.strip_prefix("berth: chat from this directory: "))
        .unwrap_or_else(|| panic!("no chat line: {text}"))
        .to_string();
    assert!(chat.ends_with(" chat"), "nothing else to type: {chat}");

    // The line as printed, run in the directory by a shell.
    let data = dev_data_dir(&xdg).expect("data dir");
    let token = std::fs::read_to_string(data.join("run/token")).unwrap();
    online_workspace(
        &format!("ws://{}/v1/rpc", addr.trim_start_matches("http://")),
        token.trim(),
    )
    .await;
    mock.push(berth_e2e::Reply::text(&["first ", "answer"]));
    let mut run = tokio::process::Command::new("sh")
        .args(["-c", &chat])
        .current_dir(&workspace)
        .env("XDG_DATA_HOME", &xdg)
        .env("BERTH_CONFIG_DIR", home.join("no-login"))
        .env_remove("BERTH_SERVER")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    run.stdin.take().unwrap().write_all(b"hello\n").await.unwrap();
    let out = run.wait_with_output().await.unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("first answer"), "{stdout}\n{stderr}");

    let doctor = tokio::process::Command::new(berth_bin())
        .arg("doctor")
        .current_dir(&workspace)
        .env("XDG_DATA_HOME", &xdg)
        .env("BERTH_CONFIG_DIR", home.join("no-login"))
        .env_remove("BERTH_SERVER")
        .output()
        .await
        .unwrap();
    let report = String::from_utf8_lossy(&doctor.stdout);
    assert!(doctor.status.success(), "{report}");
    let model = report
        .lines()
        .find(|l| l.contains(" model "))
        .unwrap_or_else(|| panic!("{report}"));
    assert!(model.starts_with("ok") && model.contains("mock-model"), "{report}");

    // `berth login` without --server signs in to this server (here: a wrong password).
    let login = tokio::process::Command::new(berth_bin())
        .args(["login", "--email", "nobody@example.com"])
        .current_dir(&workspace)
        .env("XDG_DATA_HOME", &xdg)
        .env("BERTH_CONFIG_DIR", home.join("login"))
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&login.stderr);
    assert!(!login.status.success());
    assert!(err.contains(&format!("{addr} refused the sign-in")), "{err}");
    assert!(berth_e2e::harness::terminate(&mut child).await.success());
}

/// A data directory set inside the workspace `berth dev` serves is refused before anything
/// is written there: the agent's tools would read its credentials without asking.
#[tokio::test(flavor = "multi_thread")]
async fn dev_refuses_a_data_directory_inside_its_workspace() {
    let mock = MockProvider::start().await;
    let workspace = scratch_dir("devinside-ws");
    let xdg = scratch_dir("devinside-xdg");
    let mut cmd = dev_without_data_dir(&workspace, &xdg, &mock);
    cmd.env("BERTH_DATA_DIR", workspace.join("data"));
    let out = cmd.output().await.expect("berth dev runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is inside the workspace"), "{stderr}");
    assert!(
        !workspace.join("data").exists(),
        "nothing of Berth's was written in the workspace"
    );
}
