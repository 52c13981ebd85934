//! Tools from MCP servers (SPEC §4.16), through the official Rust SDK (`rmcp`, client side
//! only).
//!
//! Where servers come from, in this order (a name already taken is skipped, so an earlier
//! source wins a clash): the worker's own configuration (`BERTH_WORKER_MCP_CONFIG`, a JSON
//! file: what the machine's operator runs), then the tenant's servers saved with `mcp.save`
//! (sent with each `turn.run`, header and environment values included), then, when the
//! worker allows it (`BERTH_WORKER_MCP_WORKSPACE`), the workspace's `.berth/mcp.json` (read
//! through `workspace.rs`; no headers there). The files have the shape
//! `{"mcpServers": {"name": {"command", "args", "env"} | {"url", "headers"}}}`.
//!
//! A turn with tools connects to every configured server at its start and disconnects at
//! its end: stdio servers run in `/`, not in the workspace (an interpreter or launcher
//! there would take the workspace's files — a `json.py` on Python's path, a package in
//! `node_modules`, an `.npmrc`, `./srv` — and run them before any approval), with
//! `${workspace}` in their arguments and variables standing for the workspace root, a clean
//! environment (`PATH`, `HOME`, `LANG` and the server's own `env`; none of Berth's secrets)
//! and their own process group, which is killed when the turn is done; what a server started
//! outside its group is found by its mark (`marks.rs`) and killed then too. Their tools reach the
//! model as `mcp__<server>__<tool>` with their input schemas. A server that cannot be used is
//! a [`Problem`] the turn reports as a notice and goes on without. Bounded: servers, tools,
//! start time, call time, output size.

use std::{collections::BTreeMap, path::Path, process::Stdio, sync::Arc, time::Duration};

use anyhow::{Context, bail};
use berth_protocol::{McpServerRun, McpTransport};
use process_wrap::tokio::{CommandWrap, ProcessGroup};
use rmcp::{
    RoleClient, ServiceExt,
    model::{CallToolRequestParams, CallToolResult, RawContent, Tool},
    service::RunningService,
    transport::{
        StreamableHttpClientTransport, TokioChildProcess, streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{
    Outcome,
    marks::{self, KillOnDrop},
};
use crate::workspace::Workspace;

/// Prefix of every MCP tool's name as the model sees it.
pub(crate) const PREFIX: &str = "mcp__";
/// The workspace's MCP configuration file.
pub(crate) const WORKSPACE_FILE: &str = ".berth/mcp.json";
/// Largest configuration file read.
const FILE_MAX: u64 = 64 * 1024;
/// Longest tool description passed on.
const DESCRIPTION_MAX: usize = 1024;
/// Largest input schema passed on (serialized); a tool with a larger one is left out.
const SCHEMA_MAX: usize = 16 * 1024;
/// Providers accept function names of at most 64 characters.
const NAME_MAX: usize = 64;

/// The worker's MCP settings.
#[derive(Debug, Clone)]
pub struct McpConfig {
    /// Servers from the worker's own configuration, by name.
    pub servers: BTreeMap<String, ServerSpec>,
    /// Whether workspaces' `.berth/mcp.json` is read (off by default: a repository's file
    /// would otherwise start commands on the worker's machine without anyone's approval).
    pub workspace_files: bool,
    /// Servers one turn connects to at most.
    pub max_servers: usize,
    /// Tools offered from all servers together at most.
    pub max_tools: usize,
    /// Starting a server, its handshake and its tool list, together.
    pub start_timeout: Duration,
    /// One tool call.
    pub call_timeout: Duration,
    /// Bytes of a call's result kept.
    pub output_max: usize,
}

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            servers: BTreeMap::new(),
            workspace_files: false,
            max_servers: 8,
            max_tools: 128,
            start_timeout: Duration::from_secs(30),
            call_timeout: Duration::from_secs(120),
            output_max: 256 * 1024,
        }
    }
}

impl McpConfig {
    /// Read the worker's configuration file (`{"mcpServers": {…}}`); a malformed file is an
    /// error at start, not a surprise in a turn.
    pub fn load_servers(path: &Path) -> anyhow::Result<BTreeMap<String, ServerSpec>> {
        let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let file: File = serde_json::from_slice(&text).with_context(|| format!("parsing {}", path.display()))?;
        for (name, spec) in &file.servers {
            if let Err(reason) = spec.check(name, true) {
                bail!("{}: server {name:?}: {reason}", path.display());
            }
        }
        Ok(file.servers)
    }
}

#[derive(Deserialize)]
struct File {
    #[serde(rename = "mcpServers", default)]
    servers: BTreeMap<String, ServerSpec>,
}

/// One server: a command (stdio) or a URL (streamable HTTP).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSpec {
    #[serde(default)]
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

/// Values may be secrets: only names and shapes are shown.
impl std::fmt::Debug for ServerSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerSpec")
            .field("command", &self.command)
            .field("args", &self.args.len())
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("url", &self.url.as_ref().map(|_| "<set>"))
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl From<&McpTransport> for ServerSpec {
    fn from(t: &McpTransport) -> ServerSpec {
        match t {
            McpTransport::Stdio(s) => ServerSpec {
                command: Some(s.command.clone()),
                args: s.args.clone(),
                env: s.env.clone(),
                url: None,
                headers: BTreeMap::new(),
            },
            McpTransport::Http(h) => ServerSpec {
                command: None,
                args: Vec::new(),
                env: BTreeMap::new(),
                url: Some(h.url.clone()),
                headers: h.headers.clone(),
            },
        }
    }
}

impl ServerSpec {
    /// Why this server cannot be used, as a reason code.
    fn check(&self, name: &str, headers_allowed: bool) -> Result<(), &'static str> {
        let valid_name = !name.is_empty()
            && name.len() <= 32
            && !name.contains("__")
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid_name {
            return Err("invalid-name");
        }
        match (&self.command, &self.url) {
            (Some(c), None) if !c.is_empty() && self.headers.is_empty() => Ok(()),
            (None, Some(u)) if (u.starts_with("http://") || u.starts_with("https://")) && self.env.is_empty() => {
                if !headers_allowed && !self.headers.is_empty() {
                    Err("headers-not-allowed")
                } else {
                    Ok(())
                }
            }
            _ => Err("invalid-config"),
        }
    }
}

/// A server the turn goes on without; reported as a `mcp-server-unavailable` notice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    /// The server's name (None: the workspace's file as a whole).
    pub server: Option<String>,
    /// `invalid-config`, `invalid-name`, `headers-not-allowed`, `too-many-servers`,
    /// `start-failed`, `start-timeout`, `too-many-tools`.
    pub reason: &'static str,
}

impl Problem {
    pub(crate) const CODE: &'static str = berth_protocol::NoticeCode::McpServerUnavailable.as_str();

    pub(crate) fn params(&self) -> Value {
        json!({"server": self.server, "reason": self.reason})
    }
}

/// One connected server.
struct Server {
    name: String,
    /// Reached over HTTP (its URL and headers may hold secrets), not started over stdio.
    http: bool,
    service: RunningService<RoleClient, ()>,
    /// A stdio server's mark: what it started is killed when the server is let go, the
    /// processes that left its group too (dropped after `service`).
    _marked: Option<KillOnDrop>,
}

/// One offered tool: the name the model uses, its server and its own name there.
struct Offered {
    name: String,
    server: usize,
    tool: Tool,
}

/// The MCP servers of one turn.
#[derive(Default)]
pub(crate) struct Mcp {
    servers: Vec<Server>,
    tools: Vec<Offered>,
    call_timeout: Duration,
    output_max: usize,
}

impl Mcp {
    /// Connect to the configured servers — the worker's, the tenant's (`tenant`, from the
    /// turn) and the workspace's — concurrently, each within the start timeout. Returns the
    /// connected ones and what went wrong with the others.
    /// `offerable`: the agent's tool names, when its definition names them: a server none of
    /// whose tools could be offered is not started (a workspace's `.berth/mcp.json` names a
    /// command to run; a session that could not use its tools runs nothing of it).
    pub(crate) async fn connect(
        config: &McpConfig,
        tenant: &[McpServerRun],
        ws: &Arc<Workspace>,
        offerable: Option<&[String]>,
        cancel: &CancellationToken,
    ) -> (Mcp, Vec<Problem>) {
        let mut problems = Vec::new();
        let mut specs: Vec<(String, ServerSpec)> = config.servers.clone().into_iter().collect();
        let taken = |specs: &[(String, ServerSpec)], name: &str| specs.iter().any(|(n, _)| n == name);
        for server in tenant {
            if taken(&specs, &server.name) {
                continue;
            }
            let spec = ServerSpec::from(&server.transport);
            match spec.check(&server.name, true) {
                Ok(()) => specs.push((server.name.clone(), spec)),
                Err(reason) => problems.push(Problem {
                    server: Some(server.name.clone()),
                    reason,
                }),
            }
        }
        if config.workspace_files {
            match read_workspace_file(ws).await {
                Ok(servers) => {
                    for (name, spec) in servers {
                        if taken(&specs, &name) {
                            continue;
                        }
                        match spec.check(&name, false) {
                            Ok(()) => specs.push((name, spec)),
                            Err(reason) => problems.push(Problem {
                                server: Some(name),
                                reason,
                            }),
                        }
                    }
                }
                Err(reason) => problems.push(Problem { server: None, reason }),
            }
        }
        if let Some(names) = offerable {
            specs.retain(|(name, _)| berth_protocol::mcp_server_offerable(name, names));
        }
        if specs.len() > config.max_servers {
            for (name, _) in specs.drain(config.max_servers..) {
                problems.push(Problem {
                    server: Some(name),
                    reason: "too-many-servers",
                });
            }
        }
        let root = ws.root().to_path_buf();
        let starts = specs.into_iter().map(|(name, spec)| {
            let root = root.clone();
            async move {
                let started = tokio::select! {
                    r = tokio::time::timeout(config.start_timeout, start(&name, &spec, &root)) => match r {
                        Ok(Ok(s)) => Ok(s),
                        Ok(Err(reason)) => Err(reason),
                        Err(_) => Err("start-timeout"),
                    },
                    _ = cancel.cancelled() => Err("start-failed"),
                };
                (name, started)
            }
        });
        let mut mcp = Mcp {
            servers: Vec::new(),
            tools: Vec::new(),
            call_timeout: config.call_timeout,
            output_max: config.output_max,
        };
        for (name, started) in futures_util::future::join_all(starts).await {
            let (service, tools, marked) = match started {
                Ok(s) => s,
                Err(reason) => {
                    problems.push(Problem {
                        server: Some(name),
                        reason,
                    });
                    continue;
                }
            };
            let index = mcp.servers.len();
            let mut cut = false;
            for tool in tools {
                let offered = format!("{PREFIX}{name}__{}", tool.name);
                // Two servers' tools may meet in one name (`a_` + `b`, `a` + `_b`): neither
                // runs under it for the other (the first keeps it).
                let taken = mcp.tools.iter().any(|t| t.name == offered);
                let usable = !taken
                    && offered.len() <= NAME_MAX
                    && offered
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
                    && serde_json::to_string(&tool.input_schema).map_or(0, |s| s.len()) <= SCHEMA_MAX;
                if !usable {
                    tracing::info!(mcp.server = %name, "an MCP tool with an unusable name or schema is left out");
                    continue;
                }
                if mcp.tools.len() >= config.max_tools {
                    cut = true;
                    break;
                }
                mcp.tools.push(Offered {
                    name: offered,
                    server: index,
                    tool,
                });
            }
            if cut {
                problems.push(Problem {
                    server: Some(name.clone()),
                    reason: "too-many-tools",
                });
            }
            mcp.servers.push(Server {
                name,
                http: marked.is_none(),
                service,
                _marked: marked,
            });
        }
        (mcp, problems)
    }

    /// The schemas the model sees (chat-completions `tools`).
    pub(crate) fn schemas(&self) -> Vec<Value> {
        self.tools
            .iter()
            .map(|t| {
                let mut description: String = t.tool.description.as_deref().unwrap_or_default().to_string();
                if description.len() > DESCRIPTION_MAX {
                    let mut end = DESCRIPTION_MAX;
                    while !description.is_char_boundary(end) {
                        end -= 1;
                    }
                    description.truncate(end);
                }
                json!({"type": "function", "function": {
                    "name": t.name,
                    "description": format!("[MCP server {}] {description}", self.servers[t.server].name),
                    "parameters": Value::Object((*t.tool.input_schema).clone()),
                }})
            })
            .collect()
    }

    /// Whether the model's tool `name` is one of this turn's MCP tools.
    pub(crate) fn offers(&self, name: &str) -> bool {
        self.tools.iter().any(|t| t.name == name)
    }

    /// Call the MCP tool `name` with the model's `arguments` (a JSON object).
    pub(crate) async fn call(&self, name: &str, arguments: &str, cancel: &CancellationToken) -> Outcome {
        let Some(t) = self.tools.iter().find(|t| t.name == name) else {
            return Outcome::error(format!("unknown tool {name:?}"));
        };
        let text = if arguments.trim().is_empty() { "{}" } else { arguments };
        let arguments = match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(map)) => map,
            Ok(_) => return Outcome::error("invalid arguments: expected a JSON object"),
            Err(e) => return Outcome::error(format!("invalid arguments: {e}")),
        };
        let server = &self.servers[t.server];
        let params = CallToolRequestParams {
            meta: None,
            name: t.tool.name.clone(),
            arguments: Some(arguments),
            task: None,
        };
        let result = tokio::select! {
            r = tokio::time::timeout(self.call_timeout, server.service.peer().call_tool(params)) => r,
            _ = cancel.cancelled() => return Outcome::error("stopped"),
        };
        match result {
            Ok(Ok(r)) => self.outcome(r),
            Ok(Err(e)) => {
                // An HTTP server's URL and headers may hold secrets, and its errors may quote
                // them: only a stdio server's error text is logged.
                if server.http {
                    tracing::info!(mcp.server = %server.name, "MCP tool call failed");
                } else {
                    tracing::info!(mcp.server = %server.name, error = %e, "MCP tool call failed");
                }
                Outcome::error(format!("the MCP server {} failed to answer the call", server.name))
            }
            Err(_) => Outcome::error(format!(
                "the MCP server {} did not answer within {} s",
                server.name,
                self.call_timeout.as_secs()
            )),
        }
    }

    /// A result as text: text parts as they are, other parts described, structured content
    /// when there is nothing else; cut to the output cap with a mark.
    fn outcome(&self, r: CallToolResult) -> Outcome {
        let mut parts = Vec::new();
        for c in &r.content {
            parts.push(match &c.raw {
                RawContent::Text(t) => t.text.clone(),
                RawContent::Image(i) => format!("[image, {}]", i.mime_type),
                RawContent::Audio(a) => format!("[audio, {}]", a.mime_type),
                RawContent::Resource(_) => "[embedded resource]".to_string(),
                RawContent::ResourceLink(l) => format!("[resource {}]", l.uri),
            });
        }
        if parts.is_empty()
            && let Some(s) = &r.structured_content
        {
            parts.push(s.to_string());
        }
        let mut output = parts.join("\n");
        if output.len() > self.output_max {
            let mut end = self.output_max;
            while !output.is_char_boundary(end) {
                end -= 1;
            }
            output.truncate(end);
            output.push_str("\n[output cut]");
        }
        if r.is_error == Some(true) {
            Outcome::error(output)
        } else {
            Outcome::ok(output)
        }
    }

    /// Disconnect: each stdio server is ended (its process group killed if it does not exit),
    /// then everything carrying its mark, inside its group or not.
    pub(crate) async fn shutdown(self) {
        for s in self.servers {
            let _ = s.service.cancel().await;
        }
    }
}

async fn read_workspace_file(ws: &Arc<Workspace>) -> Result<BTreeMap<String, ServerSpec>, &'static str> {
    let ws = ws.clone();
    let bytes = tokio::task::spawn_blocking(move || ws.read_private(WORKSPACE_FILE, FILE_MAX))
        .await
        .map_err(|_| "invalid-config")?;
    match bytes {
        Ok(Some(b)) => serde_json::from_slice::<File>(&b)
            .map(|f| f.servers)
            .map_err(|_| "invalid-config"),
        // No file (or none readable as a plain file inside the workspace): no servers.
        Ok(None) | Err(_) => Ok(BTreeMap::new()),
    }
}

type Started = (RunningService<RoleClient, ()>, Vec<Tool>, Option<KillOnDrop>);

/// In a stdio server's arguments and variables, the workspace root.
const WORKSPACE_VAR: &str = "${workspace}";

/// Start or reach one server, do the handshake and list its tools.
async fn start(name: &str, spec: &ServerSpec, root: &Path) -> Result<Started, &'static str> {
    let (service, marked) = if let Some(command) = &spec.command {
        // Under a guard that kills the server's group when the worker is gone, however it
        // went (`lifeline.rs`): the lifeline takes the place of the discarded stderr.
        let lifeline = super::lifeline::reader();
        // Its mark, so that what it starts outside its group goes with it.
        let mark = marks::new_mark();
        let program = if lifeline.is_some() {
            "/bin/sh"
        } else {
            command.as_str()
        };
        let mut cmd = CommandWrap::with_new(program, |c| {
            if lifeline.is_some() {
                c.args(["-c", super::lifeline::GUARD_ON_STDERR, "sh", command]);
            }
            let at_root = |s: &String| s.replace(WORKSPACE_VAR, &root.to_string_lossy());
            c.args(spec.args.iter().map(at_root)).current_dir("/").env_clear();
            for key in ["PATH", "HOME", "LANG"] {
                if let Some(v) = std::env::var_os(key) {
                    c.env(key, v);
                }
            }
            if std::env::var_os("PATH").is_none() {
                c.env("PATH", "/usr/local/bin:/usr/bin:/bin");
            }
            c.envs(spec.env.iter().map(|(k, v)| (k, at_root(v))));
            c.env(marks::MARK_ENV, &mark);
        });
        cmd.wrap(ProcessGroup::leader());
        let (transport, _) = TokioChildProcess::builder(cmd)
            .stderr(lifeline.map_or_else(Stdio::null, Stdio::from))
            .spawn()
            .map_err(|e| {
                tracing::warn!(mcp.server = %name, error = %e, "cannot start the MCP server");
                "start-failed"
            })?;
        // From here on, a failure (or this future dropped) kills what it started.
        let marked = KillOnDrop(mark);
        let service = ().serve(transport).await.map_err(|e| {
            tracing::warn!(mcp.server = %name, error = %e, "the MCP server's handshake failed");
            "start-failed"
        })?;
        (service, Some(marked))
    } else {
        let url = spec.url.as_deref().unwrap_or_default();
        let client = crate::net::mcp_http_client(&spec.headers).map_err(|_| "invalid-config")?;
        let transport =
            StreamableHttpClientTransport::with_client(client, StreamableHttpClientTransportConfig::with_uri(url));
        // The URL and headers may hold secrets: the error text is not logged.
        let service = ().serve(transport).await.map_err(|_| {
            tracing::warn!(mcp.server = %name, "the MCP server's handshake failed");
            "start-failed"
        })?;
        (service, None)
    };
    match service.peer().list_all_tools().await {
        Ok(tools) => Ok((service, tools, marked)),
        Err(e) => {
            // As at the handshake, an HTTP server's error text is not logged.
            if marked.is_some() {
                tracing::warn!(mcp.server = %name, error = %e, "the MCP server did not list its tools");
            } else {
                tracing::warn!(mcp.server = %name, "the MCP server did not list its tools");
            }
            let _ = service.cancel().await;
            Err("start-failed")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(v: Value) -> ServerSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_server_is_a_command_or_a_url_and_headers_only_come_from_the_worker() {
        assert_eq!(
            spec(json!({"command": "srv", "args": ["-x"]})).check("fs", false),
            Ok(())
        );
        assert_eq!(
            spec(json!({"url": "https://mcp.example/", "headers": {"authorization": "Bearer x"}})).check("web", true),
            Ok(())
        );
        assert_eq!(
            spec(json!({"url": "https://mcp.example/", "headers": {"authorization": "Bearer x"}})).check("web", false),
            Err("headers-not-allowed")
        );
        assert_eq!(
            spec(json!({"command": "srv", "url": "https://x/"})).check("x", true),
            Err("invalid-config")
        );
        assert_eq!(
            spec(json!({"url": "file:///etc/passwd"})).check("x", true),
            Err("invalid-config")
        );
        assert_eq!(spec(json!({"command": "srv"})).check("a__b", true), Err("invalid-name"));
        assert_eq!(spec(json!({"command": "srv"})).check("a b", true), Err("invalid-name"));
        assert!(serde_json::from_value::<ServerSpec>(json!({"command": "srv", "cwd": "/"})).is_err());
    }

    #[test]
    fn debug_shows_no_secret_values() {
        let s =
            spec(json!({"url": "https://user:pw@mcp.example/?key=k1", "headers": {"authorization": "Bearer s3cret"}}));
        let shown = format!("{s:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("pw@") && !shown.contains("k1"),
            "{shown}"
        );
        let s = spec(json!({"command": "srv", "env": {"TOKEN": "t0ken"}}));
        assert!(!format!("{s:?}").contains("t0ken"));
    }
}
