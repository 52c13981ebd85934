//! What the model is told about where it works, after its instructions in the system
//! prompt: the working directory, the machine, the shell and the date, the repository's
//! branch and state, how to use the tools well, and the workspace's `AGENTS.md` — each part
//! bounded, so the prompt stays small whatever the workspace holds. Nested `AGENTS.md` files
//! reach the model with the first file it reads or writes under them (`tools/fs.rs`).

use crate::{observe::git, tools, workspace::Workspace};

/// Bytes of the root `AGENTS.md` in the prompt.
const AGENTS_MAX: usize = 16 << 10;
/// Changed paths named in the git summary.
const CHANGES_NAMED: usize = 10;

/// How the tools are best used (what Codex and opencode tell their models, for these tools).
const GUIDANCE: &str = "\
- Find before you change: search_files for contents, glob for file names, list_directory (with depth) for layout.
- read_file shows numbered lines (`  12\\tcode`); the numbers are not part of the file: never copy them into an edit.
- Change part of a file with edit_file (exact text, once; replace_all for every occurrence) or apply_patch (several \
places or files in one call); write_file is for new files and complete rewrites.
- Run builds, tests and git with shell; its output keeps the beginning and the end. Start what never ends (a dev \
server, a watcher) or outlasts the timeout with shell's background, then read, wait for or stop it with \
shell_output. Commands get no input: don't run ones that wait for it.
- Look at screenshots, diagrams and other images with view_image; read_file reads text.
- Tools cannot read or write inside .git (use git through shell), and Berth's .berth/ directory is not open to them.
- When a call fails, read its message: it says why and what to do next.";

/// The environment section for a session with tools in `ws` (git read at most once, here).
pub(crate) fn environment(ws: &Workspace) -> String {
    let mut out = String::from("\n\n<environment>\n");
    out.push_str(&format!(
        "Working directory: {} (tool paths are relative to it)\n",
        ws.root().display()
    ));
    out.push_str(&format!(
        "OS: {} ({}); shell: {}\n",
        std::env::consts::OS,
        std::env::consts::ARCH,
        tools::shell::shell_name()
    ));
    out.push_str(&format!("Today: {}\n", chrono::Utc::now().format("%Y-%m-%d")));
    out.push_str(&git_summary(ws));
    out.push_str("</environment>\n\n<tool_guidance>\n");
    out.push_str(GUIDANCE);
    out.push_str("\n</tool_guidance>\n");
    if let Ok(Some(bytes)) = ws.read_bounded("AGENTS.md", AGENTS_MAX as u64 * 4) {
        let text = String::from_utf8_lossy(&bytes);
        let shown = berth_protocol::text::prefix(&text, AGENTS_MAX);
        out.push_str("\n<agents_md>\nThe workspace's AGENTS.md, instructions for agents working in it:\n");
        out.push_str(shown);
        if shown.len() < text.len() {
            out.push_str("\n[… the rest was cut; read AGENTS.md with read_file]");
        }
        out.push_str("\n</agents_md>\n");
    }
    out
}

/// One or two lines on the repository: its branch and commit, what is changed.
fn git_summary(ws: &Workspace) -> String {
    let status = match git::status(ws.root()) {
        Ok(Some(s)) => s,
        Ok(None) => return "Git: not a repository\n".into(),
        Err(_) => return String::new(),
    };
    let mut out = String::from("Git: ");
    match &status.head {
        Some(head) => {
            let short = &head.oid[..head.oid.len().min(10)];
            match head.reference.as_deref().and_then(|r| r.strip_prefix("refs/heads/")) {
                Some(branch) => out.push_str(&format!("on branch {branch} at {short}")),
                None => out.push_str(&format!("detached at {short}")),
            }
        }
        None => out.push_str("no commit yet"),
    }
    let (staged, changed, untracked) = (status.staged.len(), status.worktree.len(), status.untracked.len());
    if staged + changed + untracked == 0 {
        out.push_str("; clean\n");
        return out;
    }
    out.push_str(&format!(
        "; {staged} staged, {changed} changed, {untracked} untracked\n"
    ));
    let named: Vec<String> = status
        .staged
        .iter()
        .chain(&status.worktree)
        .chain(&status.untracked)
        .filter_map(|e| crate::observe::decode_path(&e.path).ok())
        .map(|p: Vec<u8>| String::from_utf8_lossy(&p).into_owned())
        .take(CHANGES_NAMED)
        .collect();
    out.push_str(&format!("Changed: {}", named.join(", ")));
    let total = staged + changed + untracked;
    if total > named.len() {
        out.push_str(&format!(" (and {} more)", total - named.len()));
    }
    out.push('\n');
    out
}
