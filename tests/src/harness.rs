//! Processes and databases for end-to-end tests.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        Mutex, OnceLock,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use berth_store::cluster::{ClusterOptions, PrivateCluster, create_database};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

struct TestCluster {
    admin_url: String,
    url_prefix: String,
    /// Taken and stopped when the test process exits (see [`at_exit`]).
    cluster: Mutex<Option<PrivateCluster>>,
}

static CLUSTER: OnceLock<TestCluster> = OnceLock::new();
static NEXT_DB: AtomicU32 = AtomicU32::new(0);
const TEMPLATE: &str = "berth_template";

/// The test run's cluster: started once (from the installed PostgreSQL binaries), with a
/// migrated template database. It stops when the test process exits, after every child
/// process that may use it.
fn cluster() -> &'static TestCluster {
    CLUSTER.get_or_init(|| {
        std::thread::spawn(|| {
            remove_stale_scratch_dirs();
            let dir = scratch_dir("pg");
            let cluster = PrivateCluster::start(
                &dir,
                &ClusterOptions {
                    unsafe_no_fsync: true,
                    // Diagnostics only (e.g. the bench's `pg_stat_statements` table):
                    // `name=value` settings, space-separated.
                    settings: std::env::var("BERTH_TEST_PG_SETTINGS")
                        .unwrap_or_default()
                        .split_whitespace()
                        .map(String::from)
                        .collect(),
                    ..ClusterOptions::default()
                },
            )
            .expect("start test cluster");
            let admin_url = cluster.url("postgres");
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                create_database(&admin_url, TEMPLATE, None)
                    .await
                    .expect("create template");
                let store = berth_store::Store::connect(&cluster.url(TEMPLATE), 1).expect("connect template");
                store.migrate().await.expect("migrate template");
            });
            let url_prefix = cluster.url("").trim_end_matches("dbname=").to_string();
            register_at_exit();
            TestCluster {
                admin_url,
                url_prefix,
                cluster: Mutex::new(Some(cluster)),
            }
        })
        .join()
        .expect("cluster thread")
    })
}

/// The events of a turn whose first step calls a tool and whose second answers.
pub const A_TOOL_TURN: [&str; 6] = [
    "turn.started",
    "model.completed",
    "tool.status",
    "tool.ended",
    "model.completed",
    "turn.ended",
];

/// The types of the stored events (the items with a sequence) among a watch's items, in order.
pub fn event_types(items: &[serde_json::Value]) -> Vec<&str> {
    items
        .iter()
        .filter(|e| e.get("sequence").is_some())
        .filter_map(|e| e["type"].as_str())
        .collect()
}

/// The JSON lines of a log (`BERTH_LOG_FORMAT=json`) whose target is `target`.
pub fn log_events(log: &Path, target: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(target))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["target"] == target)
        .collect()
}

/// A sample's value in a Prometheus text exposition (`/metrics`): `name` is the sample's
/// whole name, labels included as written (`berth_db_notices_total{channel="berth_deltas"}`).
pub fn metric(metrics: &str, name: &str) -> Option<u64> {
    metrics
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
}

/// From a replica's metrics: the `berth_events` notices it received, and the events its
/// watchers were sent as an append of its own wrote them (not read back).
pub fn event_notices_and_appends(metrics: &str) -> (u64, u64) {
    let m = |name: &str| metric(metrics, name).unwrap_or(0);
    (
        m("berth_db_notices_total{channel=\"berth_events\"}"),
        m("berth_watch_events_total{source=\"append\"}"),
    )
}

/// The wall-clock time in µs since the Unix epoch, as Berth's TRACE events of live output
/// carry it.
pub fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_micros() as u64
}

/// A direct connection to a test database (for checks the API cannot make).
pub async fn db(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to the test database");
    tokio::spawn(conn);
    client
}

/// A fresh, migrated database for one test; returns its connection string.
pub async fn fresh_database() -> String {
    let c = cluster();
    let name = format!("t{}_{}", std::process::id(), NEXT_DB.fetch_add(1, Ordering::Relaxed));
    create_database(&c.admin_url, &name, Some(TEMPLATE))
        .await
        .expect("create test database");
    format!("{}dbname={name}", c.url_prefix)
}

/// A directory for this test process under the system temp dir, world-traversable so that
/// PostgreSQL (run as an unprivileged user when tests run as root) can reach its socket.
pub fn scratch_dir(what: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let base = scratch_root().join(format!("berth-test-{}", std::process::id()));
    let n = NEXT_DB.fetch_add(1, Ordering::Relaxed);
    let dir = base.join(format!("{what}{n}"));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    for d in [&base, &dir] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod scratch dir");
    }
    dir
}

/// Where test processes keep their scratch dirs: `BERTH_TEST_SCRATCH` (kept for CI to scan
/// the logs afterwards) or the system temp dir.
fn scratch_root() -> PathBuf {
    std::env::var_os("BERTH_TEST_SCRATCH")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
}

/// Scratch dirs of earlier test processes that are gone (their clusters died with them).
/// Under `BERTH_TEST_SCRATCH` nothing is removed: the caller owns that directory.
fn remove_stale_scratch_dirs() {
    if std::env::var_os("BERTH_TEST_SCRATCH").is_some() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("berth-test-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// The `berth` binary next to this test executable (`target/<profile>/berth`).
pub fn berth_bin() -> PathBuf {
    if let Ok(p) = std::env::var("BERTH_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join("berth");
    assert!(
        bin.exists(),
        "{} is missing: run the tests with `cargo test --workspace`",
        bin.display()
    );
    bin
}

/// A `berth serve` child process.
pub struct TestServer {
    pub child: Proc,
    pub addr: String,
    pub metrics_addr: String,
    pub data_dir: PathBuf,
    pub database_url: String,
    pub log: PathBuf,
}

impl TestServer {
    /// Start `berth serve` on `database_url`, its model provider at `model_base_url`.
    pub async fn start(database_url: &str, model_base_url: &str) -> anyhow::Result<TestServer> {
        let data_dir = scratch_dir("serve");
        Self::launch(database_url, model_base_url, &data_dir, &[]).await
    }

    /// Start with extra environment (limits, for example).
    pub async fn start_with(
        database_url: &str,
        model_base_url: &str,
        env: &[(&str, &str)],
    ) -> anyhow::Result<TestServer> {
        let data_dir = scratch_dir("serve");
        Self::launch(database_url, model_base_url, &data_dir, env).await
    }

    async fn launch(
        database_url: &str,
        model_base_url: &str,
        data_dir: &Path,
        env: &[(&str, &str)],
    ) -> anyhow::Result<TestServer> {
        let log = data_dir.join("serve.log");
        let mut cmd = Command::new(berth_bin());
        cmd.arg("serve")
            .env("DATABASE_URL", database_url)
            .env("BERTH_DATA_DIR", data_dir)
            .env("BERTH_LISTEN", "127.0.0.1:0")
            .env("BERTH_METRICS_LISTEN", "127.0.0.1:0")
            .env("BERTH_MODEL_BASE_URL", model_base_url)
            .env("BERTH_MODEL", "mock-model")
            .env("BERTH_MODEL_API_KEY", "sk-test-provider-key")
            // A scripted failure fails at once; the provider tests set their own retries.
            .env("BERTH_MODEL_MAX_RETRIES", "0")
            // Titles would take scripted replies meant for turns; the title tests turn them on.
            .env("BERTH_AUTO_TITLES", "false")
            .env("RUST_LOG", "debug")
            // Tests drive many requests from one credential; the limits test sets its own.
            .env("BERTH_RATE_PER_SEC", "100000")
            .env("BERTH_RATE_BURST", "100000")
            // A test that stops a replica mid-turn with a worker that cannot move elsewhere
            // waits this long, not the production default; the hand-over test sets its own.
            .env("BERTH_DRAIN_TIMEOUT_SECS", "5");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let (child, addr, metrics_addr) = spawn_listening(cmd, &log).await?;
        Ok(TestServer {
            child,
            addr,
            metrics_addr,
            data_dir: data_dir.to_path_buf(),
            database_url: database_url.to_string(),
            log,
        })
    }

    /// The bootstrap admin credential written to `<data-dir>/run/token`.
    pub fn admin_token(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("run/token"))
            .expect("token file")
            .trim()
            .to_string()
    }

    /// A second tenant, `tenant-b`, with an admin `b@example.com`; returns that admin's
    /// client credential.
    pub async fn tenant_b(&self) -> String {
        self.admin(&["tenant", "create", "tenant-b"]).await.expect("tenant");
        self.admin(&[
            "user",
            "create",
            "--tenant",
            "tenant-b",
            "--email",
            "b@example.com",
            "--admin",
        ])
        .await
        .expect("user");
        self.admin(&[
            "token",
            "create",
            "--tenant",
            "tenant-b",
            "--user",
            "b@example.com",
            "--note",
            "b",
        ])
        .await
        .expect("token")
        .trim()
        .to_string()
    }

    /// `berth admin …` against this server's database; returns stdout.
    pub async fn admin(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(berth_bin())
            .arg("admin")
            .args(args)
            .env("DATABASE_URL", &self.database_url)
            .env("BERTH_DATA_DIR", &self.data_dir)
            .output()
            .await?;
        if !out.status.success() {
            bail!("berth admin {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8(out.stdout)?)
    }

    /// A new worker credential for the default tenant.
    pub async fn worker_token(&self) -> String {
        self.admin(&[
            "token",
            "create",
            "--tenant",
            "default",
            "--worker",
            "--note",
            "test worker",
        ])
        .await
        .expect("worker token")
        .trim()
        .to_string()
    }

    pub fn ws_url(&self) -> String {
        format!("ws://{}/v1/rpc", self.addr)
    }

    /// The Prometheus exposition from the metrics listener.
    pub async fn metrics(&self) -> String {
        let resp = reqwest::get(format!("http://{}/metrics", self.metrics_addr))
            .await
            .expect("metrics");
        resp.text().await.expect("metrics body")
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        reqwest::get(format!("http://{}{path}", self.addr))
            .await
            .expect("http get")
    }

    /// Send SIGTERM and wait for the process to exit.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        terminate(&mut self.child).await
    }
}

/// A `berth worker` child process serving one workspace.
pub struct TestWorker {
    pub child: Proc,
    pub log: PathBuf,
}

impl TestWorker {
    pub async fn start(server: &TestServer, token: &str, name: &str, path: &Path) -> anyhow::Result<TestWorker> {
        Self::start_with_args(server, token, name, path, &[]).await
    }

    /// The same, with extra `berth worker` arguments (e.g. `--max-steps 2`).
    pub async fn start_with_args(
        server: &TestServer,
        token: &str,
        name: &str,
        path: &Path,
        extra: &[&str],
    ) -> anyhow::Result<TestWorker> {
        Self::start_with_env(server, token, name, path, extra, &[]).await
    }

    /// The same, with extra environment for the worker process.
    pub async fn start_with_env(
        server: &TestServer,
        token: &str,
        name: &str,
        path: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<TestWorker> {
        Self::start_on_host(server, token, "test-host", name, path, extra, env).await
    }

    /// The same, on another machine name (a worker credential serves one host).
    pub async fn start_on_host(
        server: &TestServer,
        token: &str,
        host: &str,
        name: &str,
        path: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<TestWorker> {
        Self::start_at(&server.addr, token, host, name, path, extra, env).await
    }

    /// The same, connecting to `addr` (`host:port`: a replica, or nginx in front of several).
    pub async fn start_at(
        addr: &str,
        token: &str,
        host: &str,
        name: &str,
        path: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<TestWorker> {
        let dir = scratch_dir("worker");
        let token_file = dir.join("token");
        std::fs::write(&token_file, token)?;
        let log = dir.join("worker.log");
        let mut cmd = Command::new(berth_bin());
        cmd.args(["worker", "--server", &format!("http://{addr}/"), "--host", host]);
        // A token given in the environment is the worker's credential; else the file.
        if !env.iter().any(|(k, _)| *k == "BERTH_WORKER_TOKEN") {
            cmd.arg("--token-file").arg(&token_file);
        }
        let child = cmd
            .arg("--workspace")
            .arg(format!("{name}={}", path.display()))
            .args(extra)
            .env("RUST_LOG", "debug")
            // The caller's environment last: it may set its own `RUST_LOG`.
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()?;
        Ok(TestWorker {
            child: Proc::new(child, STOP),
            log,
        })
    }
}

/// Spawn a command that prints `berth: listening on http://ADDR (metrics on http://MADDR/metrics)`.
pub async fn spawn_listening(mut cmd: Command, log: &Path) -> anyhow::Result<(Proc, String, String)> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log)?)
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().context("stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await? {
            if line.starts_with("berth: listening on") {
                return Ok(line);
            }
        }
        anyhow::bail!(
            "berth exited before listening; log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        )
    })
    .await
    .context("berth did not start listening within 60 s")??;
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let mut words = line.split_whitespace();
    let addr = words
        .nth(3)
        .context("address")?
        .trim_start_matches("http://")
        .to_string();
    let metrics = words
        .nth(2)
        .context("metrics address")?
        .trim_start_matches("http://")
        .trim_end_matches("/metrics)")
        .to_string();
    Ok((Proc::new(child, STOP), addr, metrics))
}

/// SIGTERM, then wait (SIGKILL after 20 s).
pub async fn terminate(child: &mut Child) -> std::process::ExitStatus {
    if let Some(pid) = child.id() {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }
    match tokio::time::timeout(Duration::from_secs(20), child.wait()).await {
        Ok(status) => status.expect("wait"),
        Err(_) => {
            child.kill().await.ok();
            child.wait().await.expect("wait")
        }
    }
}

/// The process id a command wrote to `path`, once it has (waiting up to 30 s).
pub async fn pid_written(path: &Path) -> Option<i32> {
    eventually(30, || {
        let p = std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse().ok());
        async move { p }
    })
    .await
}

/// Wait until `f` returns Some, polling every 50 ms, for at most `secs` seconds.
pub async fn eventually<T, F, Fut>(secs: u64, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while tokio::time::Instant::now() < deadline {
        if let Some(v) = f().await {
            return Some(v);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// At least `n` statements of the database at `database_url` wait on a lock (within 30 s):
/// a write the test holds back has reached the database.
pub async fn statements_wait_on_locks(database_url: &str, n: i64) -> Option<()> {
    let db = db(database_url).await;
    eventually(30, || async {
        let q = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'";
        (db.query_one(q, &[]).await.ok()?.get::<_, i64>(0) >= n).then_some(())
    })
    .await
}

/// Make every insert into `table` whose new row matches `when` (an SQL condition on `NEW`)
/// fail inside its transaction, by a trigger named `name` (`DROP TRIGGER <name> ON <table>`
/// lets them through again).
pub async fn refuse_inserts(db: &tokio_postgres::Client, name: &str, table: &str, when: &str) {
    db.batch_execute(&format!(
        "CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN IF {when} THEN RAISE EXCEPTION 'held by the test'; END IF; RETURN NEW; END $$;
         CREATE TRIGGER {name} BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {name}();"
    ))
    .await
    .expect("refusing trigger");
}

/// How a child process is stopped: its stop signal, and how long it may take to exit before
/// it (and, with `group`, its whole process group) gets SIGKILL.
#[derive(Debug, Clone, Copy)]
pub struct Stop {
    pub signal: i32,
    pub grace: Duration,
    pub group: bool,
}

/// Berth's processes drain on SIGTERM (connections, then the worker and the cluster).
pub const STOP: Stop = Stop {
    signal: libc::SIGTERM,
    grace: Duration::from_secs(20),
    group: false,
};

/// A child process that is stopped gracefully when dropped instead of killed: it gets its
/// stop signal at once and is waited for in the background; before the test process
/// exits it waits for every such child (see [`at_exit`]). Derefs to the [`Child`].
pub struct Proc {
    child: Option<Child>,
    stop: Stop,
}

impl Proc {
    pub fn new(child: Child, stop: Stop) -> Proc {
        Proc {
            child: Some(child),
            stop,
        }
    }
}

impl std::ops::Deref for Proc {
    type Target = Child;
    fn deref(&self) -> &Child {
        self.child.as_ref().expect("a live Proc has its child")
    }
}

impl std::ops::DerefMut for Proc {
    fn deref_mut(&mut self) -> &mut Child {
        self.child.as_mut().expect("a live Proc has its child")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            stop_gracefully(child, self.stop);
        }
    }
}

struct Stopping {
    child: Child,
    pid: i32,
    deadline: Instant,
    group: bool,
}

static STOPPING: Mutex<Vec<Stopping>> = Mutex::new(Vec::new());

/// Send `child` its stop signal and leave it to the reaper (SIGKILL after the grace).
pub fn stop_gracefully(mut child: Child, stop: Stop) {
    let Some(pid) = child.id() else { return };
    if !matches!(child.try_wait(), Ok(None)) {
        return;
    }
    signal(pid as i32, stop.signal);
    STOPPING.lock().unwrap_or_else(|e| e.into_inner()).push(Stopping {
        child,
        pid: pid as i32,
        deadline: Instant::now() + stop.grace,
        group: stop.group,
    });
    static REAPER: OnceLock<()> = OnceLock::new();
    REAPER.get_or_init(|| {
        register_at_exit();
        std::thread::spawn(|| {
            loop {
                reap();
                std::thread::sleep(Duration::from_millis(50));
            }
        });
    });
}

/// Collect the children that exited; SIGKILL those past their grace. True: none is left.
fn reap() -> bool {
    let mut stopping = STOPPING.lock().unwrap_or_else(|e| e.into_inner());
    stopping.retain_mut(|s| match s.child.try_wait() {
        Ok(None) => {
            if Instant::now() > s.deadline {
                eprintln!("harness: process {} outlived its grace period; killing it", s.pid);
                signal(if s.group { -s.pid } else { s.pid }, libc::SIGKILL);
            }
            true
        }
        _ => false,
    });
    stopping.is_empty()
}

#[expect(unsafe_code, reason = "kill(2): signals other than SIGKILL, and to a process group")]
fn signal(pid: i32, sig: i32) {
    unsafe {
        libc::kill(pid, sig);
    }
}

#[expect(unsafe_code, reason = "atexit(3): the test harness exits through exit(3)")]
fn register_at_exit() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| unsafe {
        libc::atexit(at_exit);
    });
}

/// When the test process exits: wait for the children being stopped (each is killed past
/// its grace), then stop the PostgreSQL cluster they used. Nothing this process started
/// outlives it.
extern "C" fn at_exit() {
    while !reap() {
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some(c) = CLUSTER.get() {
        drop(c.cluster.lock().unwrap_or_else(|e| e.into_inner()).take());
    }
}
