//! `shell`: `bash -c COMMAND` (`sh` where there is no bash) in the workspace root or a
//! directory of it, in its own process group, with Berth's secrets stripped from its
//! environment. Its output is kept whole up to a bound (`BERTH_WORKER_SHELL_OUTPUT_MAX`, in
//! history); past it, its beginning and its end (where compiler and test summaries are),
//! with one note of what was left out between. The model is shown such an output's head and
//! tail in the same way (`model::messages::cap_output`), with one note. On stop or timeout the whole group is killed
//! (SIGTERM, then SIGKILL after a short grace, so children that ignore SIGTERM die too);
//! when the command exits, whatever it left running in its group is killed as well; the
//! grace ends early once nothing of it runs. A process that left the group (`setsid`, a
//! daemon's double fork) is found by a mark in its environment, which everything the
//! command starts inherits, and killed with the group (unless it dropped the variable or its
//! environment cannot be read: another user's, a non-dumpable one). And when the worker
//! itself is gone, however it went (SIGKILL included), a guard in the group kills the group
//! (`lifeline.rs`; not what left it). The mark and the look-ups through `/proc` are in
//! `marks.rs`.

use std::{
    io::{PipeReader, Read},
    path::Path,
    process::Stdio,
    time::Duration,
};

use rustix::process::{Pid, Signal, kill_process, kill_process_group};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::{
    Outcome, ToolLimits, Workspace,
    marks::{self, SCAN_LIMIT, group_runs, kill_all, runs, scan},
};

/// Between SIGTERM and SIGKILL, at most.
const GRACE: Duration = Duration::from_millis(500);
/// How often the group is looked at during the grace.
const GRACE_POLL: Duration = Duration::from_millis(10);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {
    command: String,
    #[serde(default)]
    workdir: Option<String>,
    #[serde(default)]
    timeout_secs: Option<u64>,
    /// Start it as a background job (`jobs.rs`) and return at once.
    #[serde(default)]
    background: bool,
}

impl Args {
    pub(crate) fn background(&self) -> bool {
        self.background
    }

    /// The patch of a command that only runs `apply_patch` on a heredoc in the workspace's
    /// root (`apply_patch <<'EOF' … EOF`), the form Codex-trained models often send through
    /// the shell: it is applied as the apply_patch tool would.
    pub(crate) fn heredoc_patch(&self) -> Option<String> {
        if self
            .workdir
            .as_deref()
            .is_some_and(|d| !matches!(d.trim(), "" | "." | "./"))
        {
            return None;
        }
        let command = self.command.trim();
        let rest = command
            .strip_prefix("apply_patch")
            .or_else(|| command.strip_prefix("applypatch"))?;
        let (head, body) = rest.split_once('\n')?;
        let delimiter = head.trim().strip_prefix("<<")?;
        let delimiter = delimiter.strip_prefix('-').unwrap_or(delimiter).trim();
        let delimiter = delimiter.trim_matches(|c| c == '\'' || c == '"');
        if delimiter.is_empty() || !delimiter.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return None;
        }
        let body = body.trim_end();
        let patch = body.strip_suffix(delimiter)?;
        patch.ends_with('\n').then(|| patch.to_string())
    }
}

/// The shell commands run with: bash where the machine has it (`[[`, brace expansion,
/// `pipefail`, which models expect), else `sh`.
pub(crate) fn shell_name() -> &'static str {
    shell_path().rsplit('/').next().unwrap_or("sh")
}

fn shell_path() -> &'static str {
    static SHELL: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    SHELL.get_or_init(|| {
        ["/bin/bash", "/usr/bin/bash", "/usr/local/bin/bash"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or("/bin/sh")
    })
}

/// What a command's environment says whatever the worker's does: its output is read, not
/// shown on a terminal, so nothing pages, colours or waits for a key.
const COMMAND_ENV: &[(&str, &str)] = &[
    ("PAGER", "cat"),
    ("GIT_PAGER", "cat"),
    ("GH_PAGER", "cat"),
    ("MANPAGER", "cat"),
    ("SYSTEMD_PAGER", ""),
    ("NO_COLOR", "1"),
    ("TERM", "dumb"),
    ("GIT_TERMINAL_PROMPT", "0"),
];

/// Environment variables a command never sees: the worker's credential and anything else
/// Berth reads from its environment (`berth dev`'s provider key, database URL and object
/// store keys among them). `berth` takes the same ones out of its own environment too.
pub fn is_secret_env(key: &str) -> bool {
    let k = key.to_ascii_uppercase();
    k.starts_with("BERTH_")
        || k == "DATABASE_URL"
        || k.starts_with("PGPASS")
        || k == "AWS_SECRET_ACCESS_KEY"
        || k == "AWS_SESSION_TOKEN"
        // `object_store` reads these too: another name for the session token, and the
        // customer key object storage encrypts with.
        || k == "AWS_TOKEN"
        || k == "AWS_SSE_CUSTOMER_KEY_BASE64"
}

/// The command's process group, and the mark of every process it started: killed when
/// dropped (a turn task dropped mid-command leaves nothing).
pub(super) struct Group {
    pid: Option<Pid>,
    mark: String,
}

impl Group {
    fn signal(&self, sig: Signal) {
        if let Some(pid) = self.pid {
            // ESRCH (the group is already gone) is the expected end.
            let _ = kill_process_group(pid, sig);
        }
    }

    /// SIGTERM to the group and to the marked processes that left it, a grace period (over
    /// as soon as nothing in the group and none of those runs), then SIGKILL to the group and
    /// to every marked process left.
    pub(super) async fn terminate(&mut self) {
        self.signal(Signal::TERM);
        let pgid = self.pid.map_or(0, |p| p.as_raw_nonzero().get());
        let escaped = scan(&self.mark, move |p| {
            let away: Vec<Pid> = p.into_iter().filter(|m| m.pgrp != pgid).map(|m| m.pid).collect();
            for &pid in &away {
                let _ = kill_process(pid, Signal::TERM);
            }
            away
        })
        .await
        .unwrap_or_default();
        let end = tokio::time::Instant::now() + GRACE;
        while tokio::time::Instant::now() < end {
            let escaped = escaped.clone();
            let runs = tokio::task::spawn_blocking(move || {
                escaped.iter().any(|&pid| runs(pid.as_raw_nonzero().get())) || (pgid != 0 && group_runs(pgid))
            });
            if !matches!(tokio::time::timeout(SCAN_LIMIT, runs).await, Ok(Ok(true))) {
                break;
            }
            tokio::time::sleep(GRACE_POLL).await;
        }
        self.signal(Signal::KILL);
        self.pid = None;
        // Those started during the grace too.
        let _ = scan(&self.mark, |p| kill_all(&p)).await;
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if self.pid.is_some() {
            self.signal(Signal::KILL);
            marks::kill_marked_soon(std::mem::take(&mut self.mark));
        }
    }
}

pub(crate) async fn run(ws: &Workspace, a: Args, limits: &ToolLimits, cancel: &CancellationToken) -> Outcome {
    let dir = match workdir(ws, &a) {
        Ok(d) => d,
        Err(e) => return e,
    };
    run_guarded(&dir, a, limits, cancel, super::lifeline::reader()).await
}

/// `shell` with `background`: the command started as a job of `session`.
pub(crate) async fn start_job(
    ws: &Workspace,
    a: Args,
    jobs: &std::sync::Arc<super::jobs::Jobs>,
    session: &str,
    cancel: &CancellationToken,
) -> Outcome {
    let dir = match workdir(ws, &a) {
        Ok(d) => d,
        Err(e) => return e,
    };
    jobs.start(session, &dir, &a.command, cancel).await
}

/// The directory a command runs in: its `workdir` in the workspace, else the root.
fn workdir(ws: &Workspace, a: &Args) -> Result<std::path::PathBuf, Outcome> {
    match &a.workdir {
        Some(w) => ws
            .dir_path(w)
            .map_err(|e| Outcome::error(format!("workdir {}; the command did not run", e.0))),
        None => Ok(ws.root().to_path_buf()),
    }
}

/// [`run`], the command's guard reading `lifeline` (None: no guard).
async fn run_guarded(
    root: &Path,
    a: Args,
    limits: &ToolLimits,
    cancel: &CancellationToken,
    lifeline: Option<PipeReader>,
) -> Outcome {
    let timeout = a
        .timeout_secs
        .map(Duration::from_secs)
        .unwrap_or(limits.shell_timeout)
        .min(limits.shell_timeout);
    let Started {
        mut child,
        mut group,
        reader,
    } = match spawn(root, &a.command, lifeline) {
        Ok(s) => s,
        Err(e) => return Outcome::error(e),
    };
    let max = limits.shell_output_max;
    let output = tokio::task::spawn_blocking(move || collect(reader, max));

    let status = tokio::select! {
        s = child.wait() => Some(s),
        _ = tokio::time::sleep(timeout) => None,
        _ = cancel.cancelled() => {
            group.terminate().await;
            let _ = child.wait().await;
            return Outcome::error("stopped");
        }
    };
    let timed_out = status.is_none();
    // The command is done (or out of time): nothing it started may outlive it.
    group.terminate().await;
    let status = match status {
        Some(s) => s.ok(),
        None => child.wait().await.ok(),
    };
    let mut text = match tokio::time::timeout(Duration::from_secs(2), output).await {
        Ok(Ok(r)) => r,
        _ => String::new(),
    };
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    if timed_out {
        text.push_str(&format!(
            "[timed out after {} s; the command was killed]",
            timeout.as_secs()
        ));
        return Outcome::error(text);
    }
    match status.and_then(|s| s.code()) {
        Some(0) => {
            text.push_str("[exit code 0]");
            Outcome::ok(text)
        }
        Some(code) => {
            text.push_str(&format!("[exit code {code}]"));
            Outcome::error(text)
        }
        None => {
            text.push_str("[killed by a signal]");
            Outcome::error(text)
        }
    }
}

/// A command started in its own process group: the child, the group (killed when dropped)
/// and the read end of its output (stdout and stderr together).
pub(super) struct Started {
    pub(super) child: tokio::process::Child,
    pub(super) group: Group,
    pub(super) reader: PipeReader,
}

/// Start `command` with the shell in `root`, its guard reading `lifeline` (None: no guard),
/// with Berth's secrets out of its environment and its mark in it.
pub(super) fn spawn(root: &Path, command: &str, lifeline: Option<PipeReader>) -> Result<Started, String> {
    let failed = |e: std::io::Error| format!("could not start the command: {e}");
    // One pipe for stdout and stderr keeps their interleaving.
    let (reader, writer) = std::io::pipe().map_err(failed)?;
    let writer2 = writer.try_clone().map_err(failed)?;
    let shell = shell_path();
    let mut cmd = match lifeline {
        Some(guarded) => {
            // By its absolute path: run in the workspace, a bare `sh` could name a file of the
            // repository's when the worker's PATH has an empty or relative entry.
            let mut cmd = tokio::process::Command::new("/bin/sh");
            cmd.args(["-c", super::lifeline::GUARD_ON_STDIN, "sh", command, shell])
                .stdin(guarded);
            cmd
        }
        None => {
            let mut cmd = tokio::process::Command::new(shell);
            cmd.arg("-c").arg(command).stdin(Stdio::null());
            cmd
        }
    };
    cmd.current_dir(root)
        .stdout(writer)
        .stderr(writer2)
        .process_group(0)
        .kill_on_drop(true);
    for (key, _) in std::env::vars_os() {
        if is_secret_env(&key.to_string_lossy()) {
            cmd.env_remove(&key);
        }
    }
    // Output goes to a pipe the model reads: no pager, no colours, no terminal to drive.
    for key in ["FORCE_COLOR", "CLICOLOR_FORCE"] {
        cmd.env_remove(key);
    }
    cmd.envs(COMMAND_ENV.iter().copied());
    let mark = marks::new_mark();
    cmd.env(marks::MARK_ENV, &mark);
    let child = cmd.spawn();
    // Our copies of the pipe's write end must close, or the reader never sees the end.
    drop(cmd);
    let child = child.map_err(failed)?;
    let group = Group {
        pid: child.id().and_then(|id| Pid::from_raw(id as i32)),
        mark,
    };
    Ok(Started { child, group, reader })
}

/// Read the pipe to its end: the whole output when it is at most `max` bytes, else its
/// first quarter and its last three quarters around one note of what was left out.
fn collect(mut reader: std::io::PipeReader, max: usize) -> String {
    let head_max = max / 4;
    let tail_max = max - head_max;
    let mut head = Vec::new();
    let mut tail = std::collections::VecDeque::new();
    let mut total = 0u64;
    let mut buf = [0u8; 16 << 10];
    loop {
        match reader.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                total += n as u64;
                let room = head_max.saturating_sub(head.len()).min(n);
                head.extend_from_slice(&buf[..room]);
                tail.extend(&buf[room..n]);
                let over = tail.len().saturating_sub(tail_max);
                tail.drain(..over);
            }
        }
    }
    let tail: Vec<u8> = tail.into();
    let omitted = total - (head.len() + tail.len()) as u64;
    if omitted == 0 {
        head.extend_from_slice(&tail);
        return String::from_utf8_lossy(&head).into_owned();
    }
    // Cut on line ends where there is one near, so neither side starts mid-line.
    const NEAR: usize = 1024;
    let head_end = head
        .iter()
        .rposition(|b| *b == b'\n')
        .map(|i| i + 1)
        .filter(|&e| head.len() - e <= NEAR)
        .unwrap_or(head.len());
    let tail_start = tail
        .iter()
        .position(|b| *b == b'\n')
        .map(|i| i + 1)
        .filter(|&s| s <= NEAR)
        .unwrap_or(0);
    let omitted = omitted + (head.len() - head_end + tail_start) as u64;
    format!(
        "{}[… {omitted} bytes of output left out here; {total} bytes in all …]\n{}",
        String::from_utf8_lossy(&head[..head_end]),
        String::from_utf8_lossy(&tail[tail_start..])
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(command: &str, timeout_secs: Option<u64>) -> Args {
        Args {
            command: command.into(),
            workdir: None,
            timeout_secs,
            background: false,
        }
    }

    fn ws(root: &Path) -> Workspace {
        Workspace::open(root).unwrap()
    }

    #[tokio::test]
    async fn commands_get_no_pager_colours_or_terminal() {
        let t = tempfile::tempdir().unwrap();
        let r = run(
            &ws(t.path()),
            args("echo \"$PAGER|$GIT_PAGER|$TERM|$NO_COLOR|$GIT_TERMINAL_PROMPT\"", None),
            &ToolLimits::default(),
            &CancellationToken::new(),
        )
        .await;
        assert!(r.ok, "{}", r.output);
        assert!(r.output.starts_with("cat|cat|dumb|1|0\n"), "{}", r.output);
    }

    #[tokio::test]
    async fn runs_in_the_workspace_with_secrets_stripped() {
        let t = tempfile::tempdir().unwrap();
        let limits = ToolLimits::default();
        let r = run(
            &ws(t.path()),
            args("pwd; echo err >&2; env | grep -c '^BERTH_' ; exit 3", None),
            &limits,
            &CancellationToken::new(),
        )
        .await;
        assert!(!r.ok);
        let root = t.path().canonicalize().unwrap();
        assert!(
            r.output.starts_with(&format!("{}\nerr\n0\n", root.display())),
            "{}",
            r.output
        );
        assert!(r.output.ends_with("[exit code 3]"));
        assert!(is_secret_env("BERTH_WORKER_TOKEN") && is_secret_env("DATABASE_URL"));
        for aws in [
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "AWS_TOKEN",
            "AWS_SSE_CUSTOMER_KEY_BASE64",
        ] {
            assert!(is_secret_env(aws), "{aws}");
        }
        assert!(!is_secret_env("AWS_REGION"));
        assert!(!is_secret_env("PATH"));
    }

    /// The worker gone (its lifeline's write end closed, as when it is SIGKILLed), its guard
    /// kills the command's whole group, children included, though the command would run on;
    /// while the worker lives, the command reads no input and the guard stays out of the way,
    /// whatever is written into the lifeline.
    #[tokio::test]
    async fn a_command_dies_with_its_worker() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().to_path_buf();
        let (reader, writer) = std::io::pipe().unwrap();
        let limits = ToolLimits::default();
        let cancel = CancellationToken::new();
        let r = run_guarded(
            &root,
            args("cat; echo read-to-the-end", None),
            &limits,
            &cancel,
            reader.try_clone().ok(),
        )
        .await;
        assert!(r.ok && r.output.starts_with("read-to-the-end\n"), "{}", r.output);

        let pids = root.join("pids");
        let script = format!("sleep 600 & echo $! > {p}; echo $$ >> {p}; wait", p = pids.display());
        let (dir, guard) = (root.clone(), reader.try_clone().ok());
        let running = tokio::spawn(async move {
            run_guarded(
                &dir,
                args(&script, None),
                &ToolLimits::default(),
                &CancellationToken::new(),
                guard,
            )
            .await
        });
        let read_pids = || -> Vec<i32> {
            std::fs::read_to_string(&pids)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect()
        };
        let mut started = Vec::new();
        for _ in 0..500 {
            started = read_pids();
            if started.len() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(started.len(), 2, "the command started its child");
        assert!(started.iter().all(|&p| runs(p)), "both run while the worker lives");
        // Lines written into the lifeline (a command can reopen a guard's end for writing)
        // wake no guard: only the pipe's end does.
        let mut w = &writer;
        std::io::Write::write_all(&mut w, b"\n\n\n\n").unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            started.iter().all(|&p| runs(p)),
            "a line in the lifeline killed nothing"
        );
        drop(writer);
        let r = tokio::time::timeout(Duration::from_secs(30), running)
            .await
            .expect("the command ended with its worker")
            .unwrap();
        assert!(r.output.contains("[killed by a signal]"), "{}", r.output);
        for _ in 0..500 {
            if !started.iter().any(|&p| runs(p)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!started.iter().any(|&p| runs(p)), "the command and its child are gone");
    }

    #[tokio::test]
    async fn output_is_capped_with_a_mark() {
        let t = tempfile::tempdir().unwrap();
        let limits = ToolLimits {
            shell_output_max: 100,
            ..ToolLimits::default()
        };
        let r = run(
            &ws(t.path()),
            args("yes x | head -c 1000", None),
            &limits,
            &CancellationToken::new(),
        )
        .await;
        assert!(r.ok);
        assert!(
            r.output.contains("bytes of output left out here; 1000 bytes in all …]"),
            "{}",
            r.output
        );
        assert!(
            r.output.starts_with("x\n") && r.output.ends_with("x\n[exit code 0]"),
            "{}",
            r.output
        );
    }

    /// A long output keeps its end (the summary) as well as its beginning, with one note;
    /// commands run in bash where there is one, and in the workdir asked for.
    #[tokio::test]
    async fn the_end_of_a_long_output_is_kept_and_commands_run_in_bash_in_their_workdir() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("sub")).unwrap();
        let w = ws(t.path());
        let limits = ToolLimits::default();
        let script = "echo FIRST; for i in $(seq 1 20000); do echo line $i; done; echo 'test result: SUMMARY'";
        let r = run(&w, args(script, None), &limits, &CancellationToken::new()).await;
        assert!(r.ok);
        assert!(r.output.starts_with("FIRST\nline 1\n"), "{}", &r.output[..100]);
        assert!(
            r.output.ends_with("test result: SUMMARY\n[exit code 0]"),
            "{}",
            r.output
        );
        let shown = crate::model::messages::cap_output(&r.output);
        assert_eq!(shown.matches("left out here").count(), 1, "{shown}");
        assert!(shown.starts_with("FIRST\n") && shown.ends_with("test result: SUMMARY\n[exit code 0]"));
        if shell_name() == "bash" {
            let r = run(
                &w,
                args("set -o pipefail; [[ 1 == 1 ]] && echo {a,b}", None),
                &limits,
                &CancellationToken::new(),
            )
            .await;
            assert_eq!(r.output, "a b\n[exit code 0]");
        }
        let mut a = args("pwd", None);
        a.workdir = Some("sub".into());
        let r = run(&w, a, &limits, &CancellationToken::new()).await;
        assert!(
            r.output.starts_with(&format!("{}/sub\n", w.root().display())),
            "{}",
            r.output
        );
        let mut a = args("pwd", None);
        a.workdir = Some("../..".into());
        let r = run(&w, a, &limits, &CancellationToken::new()).await;
        assert!(!r.ok && r.output.contains("outside the workspace"), "{}", r.output);
    }

    /// A process that left the command's group (`setsid`: a session and group of its own)
    /// is killed with it, found by the mark in its environment.
    #[tokio::test]
    async fn a_process_that_left_the_group_is_killed_with_the_command() {
        let t = tempfile::tempdir().unwrap();
        let pid_file = t.path().join("pid");
        // The command ends once the process has left its group (the pid is written after
        // `setsid`). Its output goes elsewhere: a process left running with the command's pipe
        // would keep the output's reader (and this test's runtime) waiting for it.
        let script = format!(
            "setsid sh -c 'echo $$ > {p}; exec sleep 600' >/dev/null 2>&1 & while [ ! -s {p} ]; do sleep 0.01; done",
            p = pid_file.display()
        );
        let r = run(
            &ws(t.path()),
            args(&script, None),
            &ToolLimits::default(),
            &CancellationToken::new(),
        )
        .await;
        assert!(r.ok, "{}", r.output);
        let pid: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
        // Killed; a zombie until its new parent reaps it.
        for _ in 0..100 {
            if !runs(pid) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = kill_process(Pid::from_raw(pid).unwrap(), Signal::KILL);
        panic!("{pid} (setsid sleep) outlived the command");
    }

    #[tokio::test]
    async fn timeout_and_stop_kill_the_whole_group_including_children_ignoring_sigterm() {
        let t = tempfile::tempdir().unwrap();
        let limits = ToolLimits::default();
        let pids = t.path().join("pids");
        let script = format!(
            "trap '' TERM; (trap '' TERM; sleep 600) & echo $! > {p}; echo $$ >> {p}; wait",
            p = pids.display()
        );
        let r = run(
            &ws(t.path()),
            args(&script, Some(1)),
            &limits,
            &CancellationToken::new(),
        )
        .await;
        assert!(!r.ok);
        assert!(r.output.contains("timed out"), "{}", r.output);
        let read_pids = || -> Vec<i32> {
            std::fs::read_to_string(&pids)
                .unwrap()
                .lines()
                .map(|l| l.parse().unwrap())
                .collect()
        };
        let before = read_pids();
        assert_eq!(before.len(), 2);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(before.iter().all(|p| !runs(*p)), "{before:?} still running");

        std::fs::remove_file(&pids).unwrap();
        let cancel = CancellationToken::new();
        let task = {
            let (root, cancel) = (t.path().to_path_buf(), cancel.clone());
            tokio::spawn(async move { run(&ws(&root), args(&script, None), &ToolLimits::default(), &cancel).await })
        };
        while std::fs::read_to_string(&pids).map(|s| s.lines().count()).unwrap_or(0) < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        cancel.cancel();
        let r = task.await.unwrap();
        assert_eq!(r.output, "stopped");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let after = read_pids();
        assert!(after.iter().all(|p| !runs(*p)), "{after:?} still running");
    }
}
