//! The tools the model can call: one module per family behind one registry that owns the
//! schemas the model sees and dispatches calls by name. A tool error is a result the model
//! reads, never a crash.

pub(crate) mod attach;
mod fs;
mod lifeline;
mod marks;
pub(crate) mod mcp;
mod search;
pub(crate) mod shell;

use std::{sync::Arc, time::Duration};

use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::workspace::Workspace;

pub use mcp::{McpConfig, ServerSpec};

pub(crate) const SHELL: &str = "shell";
pub(crate) const READ_FILE: &str = "read_file";
pub(crate) const WRITE_FILE: &str = "write_file";
pub(crate) const EDIT_FILE: &str = "edit_file";
pub(crate) const LIST_DIRECTORY: &str = "list_directory";
pub(crate) const SEARCH_FILES: &str = "search_files";

/// How a tool call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// The tool did its job (a shell command also needs exit status 0).
    pub ok: bool,
    /// The whole output, as stored in history.
    pub output: String,
}

impl Outcome {
    pub(crate) fn ok(output: impl Into<String>) -> Outcome {
        Outcome {
            ok: true,
            output: output.into(),
        }
    }

    pub(crate) fn error(output: impl Into<String>) -> Outcome {
        Outcome {
            ok: false,
            output: output.into(),
        }
    }
}

/// Limits of the tools (worker configuration).
#[derive(Debug, Clone)]
pub struct ToolLimits {
    /// A shell command's default timeout (the model may ask for less, never more).
    pub shell_timeout: Duration,
    /// Bytes of a shell command's output kept (stdout and stderr together).
    pub shell_output_max: usize,
}

impl Default for ToolLimits {
    fn default() -> Self {
        ToolLimits {
            shell_timeout: Duration::from_secs(300),
            shell_output_max: 1 << 20,
        }
    }
}

/// The tools of one workspace.
#[derive(Clone)]
pub(crate) struct Tools {
    ws: Arc<Workspace>,
    limits: ToolLimits,
    mcp: Arc<McpConfig>,
}

impl Tools {
    pub(crate) fn new(ws: Arc<Workspace>, limits: ToolLimits, mcp: Arc<McpConfig>) -> Tools {
        Tools { ws, limits, mcp }
    }

    /// This turn's MCP servers (see `mcp.rs`) and the problems with those it goes without.
    pub(crate) async fn connect_mcp(
        &self,
        tenant: &[berth_protocol::McpServerRun],
        cancel: &CancellationToken,
    ) -> (mcp::Mcp, Vec<mcp::Problem>) {
        mcp::Mcp::connect(&self.mcp, tenant, &self.ws, cancel).await
    }

    pub(crate) fn workspace(&self) -> &Arc<Workspace> {
        &self.ws
    }

    /// The schemas the model sees (OpenAI chat-completions `tools`).
    pub(crate) fn schemas() -> Vec<Value> {
        let f = |name: &str, description: &str, parameters: Value| json!({"type": "function", "function": {"name": name, "description": description, "parameters": parameters}});
        vec![
            f(
                SHELL,
                "Run a shell command (sh -c) in the workspace root. Output is stdout and stderr together, then the exit code.",
                json!({"type": "object", "properties": {
                    "command": {"type": "string", "description": "The command line."},
                    "timeout_secs": {"type": "integer", "description": "Give up after this many seconds (capped by the worker)."}
                }, "required": ["command"]}),
            ),
            f(
                READ_FILE,
                "Read a text file of the workspace, optionally a range of lines.",
                json!({"type": "object", "properties": {
                    "path": {"type": "string", "description": "Path relative to the workspace root."},
                    "offset": {"type": "integer", "description": "First line to read (1-based, default 1)."},
                    "limit": {"type": "integer", "description": "How many lines to read (default 2000)."}
                }, "required": ["path"]}),
            ),
            f(
                WRITE_FILE,
                "Write a whole file in the workspace (created with its directories, or replaced).",
                json!({"type": "object", "properties": {
                    "path": {"type": "string"},
                    "content": {"type": "string"}
                }, "required": ["path", "content"]}),
            ),
            f(
                EDIT_FILE,
                "Replace exactly one occurrence of old_string with new_string in a file. Fails if old_string is missing or occurs more than once.",
                json!({"type": "object", "properties": {
                    "path": {"type": "string"},
                    "old_string": {"type": "string"},
                    "new_string": {"type": "string"}
                }, "required": ["path", "old_string", "new_string"]}),
            ),
            f(
                LIST_DIRECTORY,
                "List a directory of the workspace (default: the root).",
                json!({"type": "object", "properties": {
                    "path": {"type": "string"}
                }}),
            ),
            f(
                SEARCH_FILES,
                "Search the workspace's files for a regular expression (respects .gitignore). Answers path:line:text.",
                json!({"type": "object", "properties": {
                    "pattern": {"type": "string", "description": "A regular expression (Rust regex syntax)."},
                    "path": {"type": "string", "description": "Directory to search (default: the root)."},
                    "glob": {"type": "string", "description": "Only files whose path matches this glob, e.g. *.rs"}
                }, "required": ["pattern"]}),
            ),
        ]
    }

    /// Run the call `name(arguments)`. `cancel` stops it (a shell command's process group is
    /// killed before this returns).
    pub(crate) async fn call(&self, name: &str, arguments: &str, cancel: &CancellationToken) -> Outcome {
        match name {
            SHELL => match args::<shell::Args>(arguments) {
                Ok(a) => shell::run(self.ws.root(), a, &self.limits, cancel).await,
                Err(e) => e,
            },
            READ_FILE => self.blocking(arguments, fs::read).await,
            WRITE_FILE => self.blocking(arguments, fs::write).await,
            EDIT_FILE => self.blocking(arguments, fs::edit).await,
            LIST_DIRECTORY => self.blocking(arguments, fs::list).await,
            SEARCH_FILES => self.blocking(arguments, search::search).await,
            other => Outcome::error(format!("unknown tool {other:?}")),
        }
    }

    /// Filesystem tools block: run them off the async workers.
    async fn blocking<A, F>(&self, arguments: &str, f: F) -> Outcome
    where
        A: DeserializeOwned + Send + 'static,
        F: FnOnce(&Workspace, A) -> Outcome + Send + 'static,
    {
        let a = match args::<A>(arguments) {
            Ok(a) => a,
            Err(e) => return e,
        };
        let ws = self.ws.clone();
        tokio::task::spawn_blocking(move || f(&ws, a))
            .await
            .unwrap_or_else(|_| Outcome::error("the tool failed unexpectedly"))
    }
}

fn args<A: DeserializeOwned>(arguments: &str) -> Result<A, Outcome> {
    let text = if arguments.trim().is_empty() { "{}" } else { arguments };
    serde_json::from_str(text).map_err(|e| Outcome::error(format!("invalid arguments: {e}")))
}
