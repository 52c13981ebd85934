//! The CPU bench's optional Codex row: `codex app-server` (JSON-RPC over stdio) running the
//! same text turns, one after another, against a scripted provider of its own.
//!
//! Codex no longer speaks Chat Completions: since 0.146 a provider with `wire_api = "chat"`
//! fails to load ("`wire_api = \"chat\"` is no longer supported", `CHAT_WIRE_API_REMOVED_ERROR`
//! in openai/codex `codex-rs/model-provider-info/src/lib.rs`, earlier
//! `codex-rs/core/src/model_provider_info.rs`; checked with 0.171.0). It uses the same
//! [`MockProvider`]'s Responses API route (`POST /v1/responses`, `wire_api = "responses"`)
//! instead, with the same script (six text chunks 5 ms apart). So its row is not quite
//! like for like: the Responses events are larger than Chat chunks to parse.
//!
//! The binary: `BERTH_BENCH_CODEX=/path/to/codex`, else the npm package installed with
//! `npm install --prefix /var/tmp/berth-codex @openai/codex` (its native binary, else the
//! `node_modules/.bin/codex` launcher). `BERTH_BENCH_CODEX_TURNS=N`: turns (default 50).
//! Nothing here fails the bench: any error becomes the skip line.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use berth_e2e::{
    MockProvider, Reply,
    procstat::{clock_ticks, tree_ticks},
};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// Where the bench looks for the npm package when `BERTH_BENCH_CODEX` is not set.
const PREFIX: &str = "/var/tmp/berth-codex";
/// Turns before the measured ones (the first thread and turn start lazily what they need).
const WARM_UP: usize = 3;
/// How long one request or turn may take.
const WAIT: Duration = Duration::from_secs(120);

/// The measured row.
pub struct Measured {
    pub version: String,
    pub turns: usize,
    /// CPU ms a turn, the app-server's process tree (user + system).
    pub ms: f64,
    /// Median turn wall time, ms.
    pub wall: f64,
    /// Model requests a turn.
    pub requests: f64,
}

/// The `codex` binary to run, or why there is none.
fn find() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("BERTH_BENCH_CODEX") {
        return Ok(PathBuf::from(p));
    }
    let modules = Path::new(PREFIX).join("node_modules/@openai");
    // The platform package's native binary (`codex-linux-x64/vendor/<triple>/bin/codex`):
    // the launcher would add a node process to the tree.
    let native = std::fs::read_dir(&modules)
        .into_iter()
        .flatten()
        .flatten()
        .find_map(|pkg| {
            let vendor = pkg.path().join("vendor");
            std::fs::read_dir(vendor)
                .into_iter()
                .flatten()
                .flatten()
                .map(|triple| triple.path().join("bin/codex"))
                .find(|bin| bin.is_file())
        });
    if let Some(bin) = native {
        return Ok(bin);
    }
    let launcher = Path::new(PREFIX).join("node_modules/.bin/codex");
    if launcher.is_file() {
        return Ok(launcher);
    }
    Err(format!(
        "Codex is not installed: set BERTH_BENCH_CODEX to a `codex` binary, or \
         `npm install --prefix {PREFIX} @openai/codex`"
    ))
}

/// A running `codex app-server` and its stdio.
struct AppServer {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    next_id: u64,
    stderr: PathBuf,
}

impl AppServer {
    async fn start(bin: &Path, home: &Path, base_url: &str) -> Result<AppServer, String> {
        let stderr = home.join("stderr.log");
        let log = std::fs::File::create(&stderr).map_err(|e| format!("stderr log: {e}"))?;
        let provider = format!(
            "model_providers.berth_mock={{name=\"Berth mock\",base_url=\"{base_url}\",\
             wire_api=\"responses\",request_max_retries=0,stream_max_retries=0}}"
        );
        let mut child = Command::new(bin)
            .arg("app-server")
            .args(["-c", &provider])
            .args(["-c", "model_provider=\"berth_mock\""])
            .args(["-c", "model=\"mock-model\""])
            .args(["-c", "approval_policy=\"never\""])
            .args(["-c", "sandbox_mode=\"read-only\""])
            .env("CODEX_HOME", home)
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("{}: {e}", bin.display()))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        Ok(AppServer {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            next_id: 0,
            stderr,
        })
    }

    fn pid(&self) -> Result<u32, String> {
        self.child.id().ok_or_else(|| "codex app-server exited".to_string())
    }

    /// The end of its stderr, for an error message.
    fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let lines: Vec<_> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(5)..].join(" / ")
    }

    async fn send(&mut self, message: &Value) -> Result<(), String> {
        let mut line = message.to_string();
        line.push('\n');
        self.stdin
            .write_all(line.as_bytes())
            .await
            .map_err(|e| format!("writing to codex app-server: {e}; stderr: {}", self.stderr_tail()))
    }

    /// The next message from the app-server.
    async fn next(&mut self) -> Result<Value, String> {
        let line = tokio::time::timeout(WAIT, self.lines.next_line())
            .await
            .map_err(|_| format!("no message from codex app-server within {} s", WAIT.as_secs()))?
            .map_err(|e| format!("reading codex app-server: {e}"))?;
        let Some(line) = line else {
            return Err(format!("codex app-server exited; stderr: {}", self.stderr_tail()));
        };
        serde_json::from_str(&line).map_err(|e| format!("codex app-server sent {line:?}: {e}"))
    }

    /// Sends a request; returns its id.
    async fn request(&mut self, method: &str, params: Value) -> Result<u64, String> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"id": id, "method": method, "params": params}))
            .await?;
        Ok(id)
    }

    /// Sends a request and waits for its result (notifications meanwhile are dropped).
    async fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let id = self.request(method, params).await?;
        loop {
            let m = self.next().await?;
            if let Some(result) = answer(&m, id, method)? {
                return Ok(result);
            }
        }
    }

    /// One text turn on `thread`: `turn/start`, then its `turn/completed`. Returns its wall
    /// time (ms).
    async fn turn(&mut self, thread: &str) -> Result<f64, String> {
        let t0 = Instant::now();
        let id = self
            .request(
                "turn/start",
                json!({"threadId": thread, "input": [{"type": "text", "text": "hi"}]}),
            )
            .await?;
        loop {
            let m = self.next().await?;
            answer(&m, id, "turn/start")?;
            if m["method"] == "turn/completed" && m["params"]["threadId"] == thread {
                let turn = &m["params"]["turn"];
                if turn["status"] != "completed" {
                    return Err(format!("turn ended {}: {}", turn["status"], turn["error"]));
                }
                return Ok(t0.elapsed().as_secs_f64() * 1000.0);
            }
        }
    }
}

/// `m` as the answer to request `id`: its result, `None` if it is something else, an error
/// if it is an error or a request from the server (none is expected with approvals off).
fn answer(m: &Value, id: u64, method: &str) -> Result<Option<Value>, String> {
    if m.get("method").is_some() {
        if m.get("id").is_some() {
            return Err(format!("codex app-server asked the bench: {m}"));
        }
        return Ok(None);
    }
    if m["id"] != id {
        return Ok(None);
    }
    if let Some(e) = m.get("error") {
        return Err(format!("{method}: {e}"));
    }
    Ok(Some(m["result"].clone()))
}

/// Starts a thread for a turn, as Berth's rows start a session for each.
async fn thread(server: &mut AppServer, cwd: &Path) -> Result<String, String> {
    let r = server
        .call(
            "thread/start",
            json!({"cwd": cwd, "approvalPolicy": "never", "sandbox": "read-only"}),
        )
        .await?;
    r["thread"]["id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("thread/start answered {r}"))
}

/// Runs `turns` text turns, each on a thread of its own, one after another, and measures the
/// app-server's CPU. `reply` is the bench's text reply; `cwd` the workspace directory.
pub async fn measure(turns: usize, reply: fn() -> Reply, cwd: &Path) -> Result<Measured, String> {
    let bin = find()?;
    let version = std::process::Command::new(&bin)
        .arg("--version")
        .output()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    let mock = MockProvider::start().await;
    let home = tempfile::Builder::new()
        .prefix("berth-bench-codex-home")
        .tempdir()
        .map_err(|e| format!("CODEX_HOME: {e}"))?;
    let mut server = AppServer::start(&bin, home.path(), &mock.base_url()).await?;
    server
        .call(
            "initialize",
            json!({"clientInfo": {"name": "berth-bench", "version": env!("CARGO_PKG_VERSION")}}),
        )
        .await?;
    server.send(&json!({"method": "initialized"})).await?;

    // More replies than turns: a request Codex makes besides the turn's own takes one too
    // (and is counted in `requests`).
    for _ in 0..2 * (turns + WARM_UP) {
        mock.push(reply());
    }
    for _ in 0..WARM_UP {
        let t = thread(&mut server, cwd).await?;
        server.turn(&t).await?;
    }
    let mut threads = Vec::new();
    for _ in 0..turns {
        threads.push(thread(&mut server, cwd).await?);
    }
    let pid = server.pid()?;
    let requests_before = mock.requests().len();
    let before = tree_ticks(pid);
    let mut walls = Vec::new();
    for t in &threads {
        walls.push(server.turn(t).await?);
    }
    let ticks = tree_ticks(pid).saturating_sub(before);
    let requests = mock.requests().len() - requests_before;
    let _ = server.child.start_kill();
    let _ = server.child.wait().await;
    Ok(Measured {
        version,
        turns,
        ms: ticks as f64 * 1000.0 / clock_ticks() / turns as f64,
        wall: super::median(&mut walls),
        requests: requests as f64 / turns as f64,
    })
}
