//! Marks on the processes a tool starts: a random value in one environment variable, which
//! everything started from it inherits, so that what left the process group (`setsid`, a
//! daemon's double fork) is still found and killed with the rest — unless it dropped the
//! variable or its environment cannot be read (another user's, a non-dumpable one). Used
//! by `shell` (each command) and `mcp` (each stdio server).

use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process};

/// The variable whose value marks every process a tool starts ([`marked`]).
pub(super) const MARK_ENV: &str = "AGENT_HOST_COMMAND_MARK";

/// How long a look through `/proc` may take before it is given up (a process stuck in the
/// kernel can hold a read of its files).
pub(super) const SCAN_LIMIT: Duration = Duration::from_secs(2);

/// A fresh mark, for [`MARK_ENV`].
pub(super) fn new_mark() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Kills every process carrying its mark when dropped, on a thread of its own (a look
/// through `/proc` can block): for a process tree whose end is not awaited (an MCP server's,
/// a dropped shell command's). It looks again while it finds some, so that what a dying
/// process started meanwhile goes too (a few passes at most).
pub(super) struct KillOnDrop(pub(super) String);

/// Looks through `/proc` a [`KillOnDrop`] makes at most.
const KILL_PASSES: usize = 5;

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        kill_marked_soon(std::mem::take(&mut self.0));
    }
}

/// Kill every process carrying `mark`, on a thread of its own (a look through `/proc` can
/// block), looking again while it finds some ([`KillOnDrop`]).
pub(super) fn kill_marked_soon(mark: String) {
    // A thread that cannot be made leaves the processes (never a panic in `drop`).
    let _ = std::thread::Builder::new().spawn(move || {
        for _ in 0..KILL_PASSES {
            let found = marked(&mark);
            if found.is_empty() {
                break;
            }
            kill_all(&found);
            std::thread::sleep(Duration::from_millis(10));
        }
    });
}

/// A process carrying a command's mark.
#[derive(Clone, Copy)]
pub(super) struct Marked {
    pub(super) pid: Pid,
    pub(super) pgrp: i32,
}

/// `then` of the processes carrying `mark` ([`marked`]), off the runtime's threads and
/// given up after [`SCAN_LIMIT`] (None).
pub(super) async fn scan<T: Send + 'static>(
    mark: &str,
    then: impl FnOnce(Vec<Marked>) -> T + Send + 'static,
) -> Option<T> {
    let mark = mark.to_string();
    let look = tokio::task::spawn_blocking(move || then(marked(&mark)));
    tokio::time::timeout(SCAN_LIMIT, look).await.ok()?.ok()
}

pub(super) fn kill_all(processes: &[Marked]) {
    for m in processes {
        let _ = kill_process(m.pid, Signal::KILL);
    }
}

/// The processes whose environment carries `mark` ([`MARK_ENV`]): what a command started,
/// in its process group or not, unless it dropped the variable before its last `exec` or
/// its environment cannot be read (another user's, a non-dumpable process).
pub(super) fn marked(mark: &str) -> Vec<Marked> {
    let entry = format!("{MARK_ENV}={mark}");
    let mut found = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(env) = std::fs::read(p.path().join("environ")) else {
            continue;
        };
        if env.split(|b| *b == 0).any(|v| v == entry.as_bytes())
            && let (Some(pid), Some(st)) = (Pid::from_raw(pid), stat(pid))
        {
            found.push(Marked { pid, pgrp: st.pgrp });
        }
    }
    found
}

/// What `/proc/<pid>/stat` says of a process: its state and its process group.
struct Stat {
    state: char,
    pgrp: i32,
}

fn stat(pid: i32) -> Option<Stat> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name (in parentheses, which it may itself contain): state, ppid, pgrp.
    let mut fields = s.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let pgrp = fields.nth(1)?.parse().ok()?;
    Some(Stat { state, pgrp })
}

/// Whether process `pid` runs (a zombie waiting for its reaper does not).
pub(super) fn runs(pid: i32) -> bool {
    stat(pid).is_some_and(|s| s.state != 'Z')
}

/// Whether a process of group `pgid` still runs (zombies waiting for their reaper do not).
pub(super) fn group_runs(pgid: i32) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    procs.flatten().any(|p| {
        p.file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
            .and_then(stat)
            .is_some_and(|s| s.pgrp == pgid && s.state != 'Z')
    })
}
