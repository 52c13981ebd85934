//! The tools the model can call: one module per family behind one registry that owns the
//! schemas the model sees and dispatches calls by name. A tool error is a result the model
//! reads, never a crash.

pub(crate) mod ask;
pub(crate) mod attach;
mod fs;
pub(crate) mod image;
pub(crate) mod jobs;
mod lifeline;
mod marks;
pub(crate) mod mcp;
mod patch;
pub(crate) mod plan;
mod read;
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
pub(crate) const APPLY_PATCH: &str = "apply_patch";
pub(crate) const LIST_DIRECTORY: &str = "list_directory";
pub(crate) const SEARCH_FILES: &str = "search_files";
pub(crate) const GLOB: &str = "glob";

/// How a tool call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// The tool did its job (a shell command also needs exit status 0).
    pub ok: bool,
    /// The whole output, as stored in history.
    pub output: String,
    /// An image the model is shown after the step's results (`view_image`).
    pub image: Option<image::Image>,
}

impl Outcome {
    pub(crate) fn ok(output: impl Into<String>) -> Outcome {
        Outcome {
            ok: true,
            output: output.into(),
            image: None,
        }
    }

    pub(crate) fn error(output: impl Into<String>) -> Outcome {
        Outcome {
            ok: false,
            output: output.into(),
            image: None,
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

/// The tools of one workspace, for one turn.
#[derive(Clone)]
pub(crate) struct Tools {
    ws: Arc<Workspace>,
    limits: ToolLimits,
    mcp: Arc<McpConfig>,
    /// What this turn's model has read and written (stale-write warnings, nested AGENTS.md).
    seen: Arc<fs::Seen>,
    /// The worker's background jobs, and the session this turn is of (whose jobs it sees).
    jobs: Arc<jobs::Jobs>,
    session: Arc<str>,
}

impl Tools {
    pub(crate) fn new(
        ws: Arc<Workspace>,
        limits: ToolLimits,
        mcp: Arc<McpConfig>,
        jobs: Arc<jobs::Jobs>,
        session: &str,
    ) -> Tools {
        Tools {
            ws,
            limits,
            mcp,
            seen: Arc::default(),
            jobs,
            session: Arc::from(session),
        }
    }

    /// Stop this session's background jobs (its turn was stopped).
    pub(crate) fn stop_jobs(&self) {
        self.jobs.stop_session(&self.session);
    }

    /// This turn's MCP servers (see `mcp.rs`) and the problems with those it goes without.
    pub(crate) async fn connect_mcp(
        &self,
        tenant: &[berth_protocol::McpServerRun],
        offerable: Option<&[String]>,
        cancel: &CancellationToken,
    ) -> (mcp::Mcp, Vec<mcp::Problem>) {
        mcp::Mcp::connect(&self.mcp, tenant, &self.ws, offerable, cancel).await
    }

    pub(crate) fn workspace(&self) -> &Arc<Workspace> {
        &self.ws
    }

    /// Whether the tool `name` only reads the workspace, asks nothing and may run at the
    /// same time as other such calls of its step.
    pub(crate) fn runs_alongside(name: &str) -> bool {
        matches!(
            name,
            READ_FILE | LIST_DIRECTORY | GLOB | SEARCH_FILES | image::VIEW_IMAGE
        )
    }

    /// The schemas the model sees (OpenAI chat-completions `tools`).
    pub(crate) fn schemas(&self) -> Vec<Value> {
        let f = |name: &str, description: &str, parameters: Value| json!({"type": "function", "function": {"name": name, "description": description, "parameters": parameters}});
        let timeout = self.limits.shell_timeout.as_secs();
        vec![
            f(
                SHELL,
                &format!(
                    "Run a command with {} in the workspace (or in workdir). Output is stdout and stderr together, \
then the exit code; a long output keeps its beginning and its end (where compiler and test summaries are) with a \
note of how much was left out between. Prefer read_file, search_files, glob and list_directory to cat, grep, find \
and ls. Times out after {timeout} s unless timeout_secs asks for less. With background, the command keeps running \
(a dev server, a watcher, a build longer than the timeout): the call returns its first {start} s of output and a \
job id to read on, wait for or stop it with shell_output; at most {jobs} at once, each for at most {hours} h, and \
stopped with the turn if the turn is stopped.",
                    shell::shell_name(),
                    start = jobs::START_WAIT.as_secs(),
                    jobs = jobs::JOBS_PER_SESSION,
                    hours = jobs::LIFETIME.as_secs() / 3600,
                ),
                json!({"type": "object", "properties": {
                    "command": {"type": "string", "description": "The command line."},
                    "workdir": {"type": "string", "description": "Directory to run in, relative to the workspace root (default: the root)."},
                    "timeout_secs": {"type": "integer", "description": format!("Kill the command after this many seconds (default and most: {timeout}).")},
                    "background": {"type": "boolean", "description": "Run it in the background and return at once with a job id (default false)."}
                }, "required": ["command"], "additionalProperties": false}),
            ),
            f(
                jobs::SHELL_OUTPUT,
                "Read what a background job (shell with background) wrote since you last looked: waits up to \
wait_secs for it to end (returning as soon as it does) and then answers with the new output and whether it still \
runs (its exit code once it ended). kill stops it and everything it started.",
                json!({"type": "object", "properties": {
                    "job": {"type": "integer", "description": "The job id shell answered with."},
                    "wait_secs": {"type": "integer", "description": "Seconds to wait for it to end (default 5, most 120)."},
                    "kill": {"type": "boolean", "description": "Stop the job (default false)."}
                }, "required": ["job"], "additionalProperties": false}),
            ),
            f(
                READ_FILE,
                "Read a text file of the workspace as numbered lines (`  12\tline`; the number and tab are not part of the \
file). Up to 2000 lines or 24 KiB a call; a longer file says where to read on with offset. Lines longer than 2000 \
characters are cut. Read a file before you edit it. A directory answers with its entries, a missing path with the \
nearest ones; for an image, use view_image.",
                json!({"type": "object", "properties": {
                    "path": {"type": "string", "description": "Path relative to the workspace root."},
                    "offset": {"type": "integer", "description": "First line to read (1-based, default 1)."},
                    "limit": {"type": "integer", "description": "How many lines to read (default 2000)."}
                }, "required": ["path"], "additionalProperties": false}),
            ),
            f(
                image::VIEW_IMAGE,
                "Look at an image file of the workspace (PNG, JPEG, GIF or WebP, at most 2 MiB): a screenshot, a \
diagram, a rendered page. The image is shown to you right after this call.",
                json!({"type": "object", "properties": {
                    "path": {"type": "string", "description": "Path relative to the workspace root."}
                }, "required": ["path"], "additionalProperties": false}),
            ),
            f(
                WRITE_FILE,
                "Write a whole file in the workspace (created with its directories, or replaced). To change part of a \
file, use edit_file or apply_patch instead.",
                json!({"type": "object", "properties": {
                    "path": {"type": "string"},
                    "content": {"type": "string"}
                }, "required": ["path", "content"], "additionalProperties": false}),
            ),
            f(
                EDIT_FILE,
                "Replace old_string with new_string in a file. old_string must match the file exactly (whitespace \
included; without read_file's line numbers) and occur once, unless replace_all is set. If it is not in the file \
exactly but matches one place when each line's leading and trailing whitespace is ignored, that place is edited \
(new_string indented as the file is there) and the answer says so. Line ends follow the file's (LF or CRLF). \
Answers with the changed lines; when old_string is not found it shows the nearest text.",
                json!({"type": "object", "properties": {
                    "path": {"type": "string"},
                    "old_string": {"type": "string", "description": "The exact text to replace."},
                    "new_string": {"type": "string", "description": "The text to put in its place (different from old_string)."},
                    "replace_all": {"type": "boolean", "description": "Replace every occurrence (default false)."}
                }, "required": ["path", "old_string", "new_string"], "additionalProperties": false}),
            ),
            f(
                APPLY_PATCH,
                "Add, change, move and delete files in one call. input is a patch:\n\
*** Begin Patch\n*** Add File: path\n+line\n*** Update File: path\n*** Move to: new/path (optional)\n\
@@ a line just above the change (optional)\n context line\n-removed line\n+added line\n\
*** Delete File: path\n*** End Patch\n\
Give about three lines of context around each change. Nothing is written unless the whole patch applies.",
                json!({"type": "object", "properties": {
                    "input": {"type": "string", "description": "The whole patch, from *** Begin Patch to *** End Patch."}
                }, "required": ["input"], "additionalProperties": false}),
            ),
            f(
                LIST_DIRECTORY,
                "List a directory of the workspace (default: the root); with depth > 1, a tree that far down \
(gitignored entries left out). At most 500 entries.",
                json!({"type": "object", "properties": {
                    "path": {"type": "string"},
                    "depth": {"type": "integer", "description": "Levels to show (default 1, at most 6)."}
                }, "additionalProperties": false}),
            ),
            f(
                GLOB,
                "Find files by name: paths matching a glob (e.g. **/*.rs, src/**/test_*.py), most recently \
modified first, gitignored files left out. At most 500.",
                json!({"type": "object", "properties": {
                    "pattern": {"type": "string", "description": "A glob, matched against paths relative to path."},
                    "path": {"type": "string", "description": "Directory to search (default: the root)."}
                }, "required": ["pattern"], "additionalProperties": false}),
            ),
            f(
                SEARCH_FILES,
                "Search file contents for a regular expression (respects .gitignore; hidden files included, .git \
not). Answers path:line:text for each matching line (path-line-text for context lines, -- between groups), at \
most 200 matches; with files_only, each matching file and its count of matching lines.",
                json!({"type": "object", "properties": {
                    "pattern": {"type": "string", "description": "A regular expression (Rust regex syntax)."},
                    "path": {"type": "string", "description": "Directory or file to search (default: the root)."},
                    "glob": {"type": "string", "description": "Only files whose path matches this glob, e.g. *.rs"},
                    "ignore_case": {"type": "boolean", "description": "Match regardless of letter case (default false)."},
                    "context": {"type": "integer", "description": "Lines to show before and after each match (default 0, at most 10)."},
                    "files_only": {"type": "boolean", "description": "List only the files that match, with their count of matching lines (default false)."}
                }, "required": ["pattern"], "additionalProperties": false}),
            ),
        ]
    }

    /// Run the call `name(arguments)`. `cancel` stops it (a shell command's process group is
    /// killed before this returns).
    pub(crate) async fn call(&self, name: &str, arguments: &str, cancel: &CancellationToken) -> Outcome {
        match name {
            SHELL => match args::<shell::Args>(arguments) {
                Ok(a) => match a.heredoc_patch() {
                    Some(input) => {
                        let (ws, seen) = (self.ws.clone(), self.seen.clone());
                        tokio::task::spawn_blocking(move || patch::run(&ws, &seen, patch::Args { input }))
                            .await
                            .unwrap_or_else(|_| Outcome::error("the tool failed unexpectedly"))
                    }
                    None if a.background() => shell::start_job(&self.ws, a, &self.jobs, &self.session, cancel).await,
                    None => shell::run(&self.ws, a, &self.limits, cancel).await,
                },
                Err(e) => e,
            },
            jobs::SHELL_OUTPUT => match args::<jobs::LookArgs>(arguments) {
                Ok(a) => self.jobs.look(&self.session, a, cancel).await,
                Err(e) => e,
            },
            READ_FILE => self.blocking(arguments, read::read).await,
            image::VIEW_IMAGE => self.blocking(arguments, |ws, _, a| image::view(ws, a)).await,
            WRITE_FILE => self.blocking(arguments, fs::write).await,
            EDIT_FILE => self.blocking(arguments, fs::edit).await,
            APPLY_PATCH => self.blocking(arguments, patch::run).await,
            LIST_DIRECTORY => self.blocking(arguments, |ws, _, a| fs::list(ws, a)).await,
            GLOB => self.blocking(arguments, |ws, _, a| fs::glob(ws, a)).await,
            SEARCH_FILES => self.blocking(arguments, |ws, _, a| search::search(ws, a)).await,
            other => Outcome::error(format!("unknown tool {other:?}")),
        }
    }

    /// Filesystem tools block: run them off the async workers.
    async fn blocking<A, F>(&self, arguments: &str, f: F) -> Outcome
    where
        A: DeserializeOwned + Send + 'static,
        F: FnOnce(&Workspace, &fs::Seen, A) -> Outcome + Send + 'static,
    {
        let a = match args::<A>(arguments) {
            Ok(a) => a,
            Err(e) => return e,
        };
        let (ws, seen) = (self.ws.clone(), self.seen.clone());
        tokio::task::spawn_blocking(move || f(&ws, &seen, a))
            .await
            .unwrap_or_else(|_| Outcome::error("the tool failed unexpectedly"))
    }
}

/// The call's arguments; a missing, mistyped or unknown field is an error the model reads
/// (every tool's arguments refuse unknown fields: a misspelt `replace_all` must not be
/// silently ignored).
fn args<A: DeserializeOwned>(arguments: &str) -> Result<A, Outcome> {
    let text = if arguments.trim().is_empty() { "{}" } else { arguments };
    serde_json::from_str(text).map_err(|e| Outcome::error(format!("invalid arguments: {e}; the call did not run")))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A workspace in a new scratch directory (kept while the first half lives).
    pub(in crate::tools) fn scratch_workspace() -> (tempfile::TempDir, Workspace) {
        let t = tempfile::tempdir().unwrap();
        let w = Workspace::open(t.path()).unwrap();
        (t, w)
    }

    /// `apply_patch <<'EOF' … EOF` sent through the shell (as Codex-trained models do) is
    /// applied as the apply_patch tool would; anything else around it runs as a command.
    #[tokio::test]
    async fn a_heredoc_apply_patch_through_the_shell_is_applied() {
        let t = tempfile::tempdir().unwrap();
        let ws = Arc::new(Workspace::open(t.path()).unwrap());
        let tools = Tools::new(ws, ToolLimits::default(), Arc::default(), Arc::default(), "ses_test");
        let patch = "*** Begin Patch\n*** Add File: x.txt\n+hi\n*** End Patch\n";
        let call = |command: String| json!({"command": command}).to_string();
        let r = tools
            .call(
                SHELL,
                &call(format!("apply_patch <<'EOF'\n{patch}EOF\n")),
                &CancellationToken::new(),
            )
            .await;
        assert!(r.ok && r.output.contains("A x.txt"), "{r:?}");
        assert_eq!(std::fs::read_to_string(t.path().join("x.txt")).unwrap(), "hi\n");
        // Not only apply_patch: a real command (there is no apply_patch program).
        let r = tools
            .call(
                SHELL,
                &call(format!("apply_patch <<EOF && echo done\n{patch}EOF\n")),
                &CancellationToken::new(),
            )
            .await;
        assert!(!r.ok, "{r:?}");
    }

    /// A background command keeps running after its call: its output is read on (and waited
    /// for) with shell_output, it is the session's own, it can be stopped, a session runs at
    /// most four at once, and a stopped turn stops them.
    #[tokio::test]
    async fn background_jobs_run_on_and_are_read_waited_for_and_stopped() {
        let t = tempfile::tempdir().unwrap();
        let ws = Arc::new(Workspace::open(t.path()).unwrap());
        let jobs = Arc::new(jobs::Jobs::with_start_wait(Duration::from_millis(300)));
        let tools = Tools::new(ws.clone(), ToolLimits::default(), Arc::default(), jobs.clone(), "ses_a");
        let other = Tools::new(ws, ToolLimits::default(), Arc::default(), jobs, "ses_b");
        let cancel = CancellationToken::new();
        let shell = |command: &str| json!({"command": command, "background": true}).to_string();
        let id_of = |out: &str| -> u64 {
            let rest = out.split("background job ").nth(1).expect("a job id");
            rest[..rest.find(':').unwrap()].parse().unwrap()
        };

        let r = tools
            .call(SHELL, &shell("echo started; sleep 1; echo later; exit 3"), &cancel)
            .await;
        assert!(r.ok, "{r:?}");
        let first = id_of(&r.output);
        assert!(r.output.contains("started\n"), "{}", r.output);
        let look = |id: u64, extra: Value| {
            let mut a = json!({"job": id});
            a.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            a.to_string()
        };
        // Another session does not see it.
        let r = other.call(jobs::SHELL_OUTPUT, &look(first, json!({})), &cancel).await;
        assert!(!r.ok && r.output.contains("no background job"), "{r:?}");
        // Waited for: the output written since, and how it ended; then it is forgotten.
        let r = tools
            .call(jobs::SHELL_OUTPUT, &look(first, json!({"wait_secs": 30})), &cancel)
            .await;
        assert!(
            r.output.contains("later\n") && !r.output.contains("started"),
            "{}",
            r.output
        );
        assert!(r.output.ends_with("exited with code 3]"), "{}", r.output);
        let r = tools.call(jobs::SHELL_OUTPUT, &look(first, json!({})), &cancel).await;
        assert!(!r.ok, "{r:?}");

        // A server that does not end: still running after its look, stopped with kill.
        let r = tools.call(SHELL, &shell("echo serving; sleep 300"), &cancel).await;
        let server = id_of(&r.output);
        assert!(
            r.output.contains("serving") && r.output.contains("still running"),
            "{}",
            r.output
        );
        let r = tools
            .call(jobs::SHELL_OUTPUT, &look(server, json!({"kill": true})), &cancel)
            .await;
        assert!(
            r.output.ends_with(&format!("[job {server} was stopped]")),
            "{}",
            r.output
        );

        // At most four at once; a stopped turn stops them all.
        let mut running = Vec::new();
        for _ in 0..jobs::JOBS_PER_SESSION {
            let r = tools.call(SHELL, &shell("sleep 300"), &cancel).await;
            running.push(id_of(&r.output));
        }
        let r = tools.call(SHELL, &shell("echo fifth"), &cancel).await;
        assert!(!r.ok && r.output.contains("already running"), "{r:?}");
        tools.stop_jobs();
        for id in running {
            let r = tools
                .call(jobs::SHELL_OUTPUT, &look(id, json!({"wait_secs": 10})), &cancel)
                .await;
            assert!(r.output.ends_with("was stopped]"), "{}", r.output);
        }
    }
}
