//! Background commands: `shell` with `background` starts a command that keeps running after
//! the call (a dev server, a watcher, a build longer than the shell's timeout), and
//! `shell_output` reads what it wrote since the model last looked, waits for it, or stops
//! it. A job is started like any command (`shell::spawn`: its own process group, the
//! secrets out of its environment, its mark, the worker's lifeline) and belongs to its
//! session: later turns of the session see it, other sessions do not. It ends when it exits,
//! when the model stops it, when a turn of its session is stopped, after [`LIFETIME`], or
//! with the worker; whatever it started is killed with it.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use serde::Deserialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Outcome, shell};

pub(crate) const SHELL_OUTPUT: &str = "shell_output";
/// Jobs one session runs at once.
pub(crate) const JOBS_PER_SESSION: usize = 4;
/// Bytes of a job's unread output kept (the latest; older ones are counted as left out).
const KEPT: usize = 256 << 10;
/// Bytes of output one look returns at most (the latest).
const SHOWN: usize = 16 << 10;
/// How long a job may run.
pub(crate) const LIFETIME: Duration = Duration::from_secs(3600);
/// How long `shell` with `background` waits for the first output (less if the job ends).
pub(crate) const START_WAIT: Duration = Duration::from_secs(5);
/// `shell_output`'s default and longest wait.
const LOOK_WAIT_DEFAULT: u64 = 5;
const LOOK_WAIT_MAX: u64 = 120;

/// The background jobs of every session on this worker.
pub(crate) struct Jobs {
    sessions: Mutex<HashMap<String, Vec<Arc<Job>>>>,
    next: std::sync::atomic::AtomicU32,
    /// [`START_WAIT`] (shorter in tests).
    start_wait: Duration,
}

impl Default for Jobs {
    fn default() -> Self {
        Jobs::with_start_wait(START_WAIT)
    }
}

struct Job {
    id: u32,
    output: Mutex<Output>,
    /// Bumped on new output and at the end.
    changed: watch::Sender<u64>,
    stop: CancellationToken,
}

#[derive(Default)]
struct Output {
    unread: VecDeque<u8>,
    /// Unread bytes dropped to keep [`KEPT`].
    dropped: u64,
    /// How it ended, once it has (and its output is all read from the pipe).
    ended: Option<Ended>,
}

#[derive(Clone, Copy)]
enum Ended {
    Exit(i32),
    Signal,
    Stopped,
    OutOfTime,
}

impl Job {
    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    fn ended(&self) -> Option<Ended> {
        self.output.lock().expect("job lock").ended
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LookArgs {
    job: u32,
    #[serde(default)]
    wait_secs: Option<u64>,
    #[serde(default)]
    kill: bool,
}

impl Jobs {
    pub(crate) fn with_start_wait(start_wait: Duration) -> Jobs {
        Jobs {
            sessions: Mutex::default(),
            next: Default::default(),
            start_wait,
        }
    }

    fn running(&self, session: &str) -> usize {
        let sessions = self.sessions.lock().expect("jobs lock");
        sessions
            .get(session)
            .map_or(0, |jobs| jobs.iter().filter(|j| j.ended().is_none()).count())
    }

    fn find(&self, session: &str, id: u32) -> Option<Arc<Job>> {
        let sessions = self.sessions.lock().expect("jobs lock");
        sessions.get(session)?.iter().find(|j| j.id == id).cloned()
    }

    fn forget(&self, session: &str, id: u32) {
        let mut sessions = self.sessions.lock().expect("jobs lock");
        if let Some(jobs) = sessions.get_mut(session) {
            jobs.retain(|j| j.id != id);
            if jobs.is_empty() {
                sessions.remove(session);
            }
        }
    }

    /// Stop every job of `session` (a turn of it was stopped).
    pub(crate) fn stop_session(&self, session: &str) {
        let sessions = self.sessions.lock().expect("jobs lock");
        for job in sessions.get(session).into_iter().flatten() {
            job.stop.cancel();
        }
    }

    /// Start `command` in `dir` as a job of `session`, and return what it wrote in its
    /// first seconds.
    pub(crate) async fn start(
        self: &Arc<Self>,
        session: &str,
        dir: &std::path::Path,
        command: &str,
        cancel: &CancellationToken,
    ) -> Outcome {
        if self.running(session) >= JOBS_PER_SESSION {
            return Outcome::error(format!(
                "{JOBS_PER_SESSION} background commands are already running in this session; stop one \
                 (shell_output with kill) or wait for one to end. The command did not run."
            ));
        }
        let shell::Started {
            mut child,
            mut group,
            reader,
        } = match shell::spawn(dir, command, super::lifeline::reader()) {
            Ok(s) => s,
            Err(e) => return Outcome::error(e),
        };
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let job = Arc::new(Job {
            id,
            output: Mutex::default(),
            changed: watch::channel(0).0,
            stop: CancellationToken::new(),
        });
        let j = job.clone();
        let pipe = tokio::task::spawn_blocking(move || read_into(reader, &j));
        let j = job.clone();
        tokio::spawn(async move {
            let status = tokio::select! {
                s = child.wait() => s.ok().map(|s| s.code().map_or(Ended::Signal, Ended::Exit)),
                _ = j.stop.cancelled() => Some(Ended::Stopped),
                _ = tokio::time::sleep(LIFETIME) => Some(Ended::OutOfTime),
            };
            group.terminate().await;
            let _ = child.wait().await;
            // The rest of its output, unless something it left holds the pipe open.
            let _ = tokio::time::timeout(Duration::from_secs(2), pipe).await;
            j.output.lock().expect("job lock").ended = Some(status.unwrap_or(Ended::Signal));
            j.bump();
        });
        self.sessions
            .lock()
            .expect("jobs lock")
            .entry(session.to_string())
            .or_default()
            .push(job.clone());
        let mut out = format!("[started background job {id}: {command}]\n");
        out.push_str(&self.look_at(session, &job, self.start_wait, cancel).await);
        Outcome::ok(out)
    }

    /// `shell_output`: the job's new output (waiting up to `wait_secs` for it to end), or
    /// its stop.
    pub(crate) async fn look(&self, session: &str, a: LookArgs, cancel: &CancellationToken) -> Outcome {
        let Some(job) = self.find(session, a.job) else {
            return Outcome::error(format!(
                "there is no background job {} in this session (it ended and its output was read, or it never was)",
                a.job
            ));
        };
        let wait = if a.kill {
            job.stop.cancel();
            Duration::from_secs(10)
        } else {
            Duration::from_secs(a.wait_secs.unwrap_or(LOOK_WAIT_DEFAULT).min(LOOK_WAIT_MAX))
        };
        Outcome::ok(self.look_at(session, &job, wait, cancel).await)
    }

    /// Wait until the job ends, `wait` passes or the turn stops; then take its unread
    /// output and say where it stands. An ended job whose output is all taken is forgotten.
    async fn look_at(&self, session: &str, job: &Arc<Job>, wait: Duration, cancel: &CancellationToken) -> String {
        let mut changed = job.changed.subscribe();
        let until = tokio::time::Instant::now() + wait;
        while job.ended().is_none() {
            tokio::select! {
                r = changed.changed() => if r.is_err() { break },
                _ = tokio::time::sleep_until(until) => break,
                _ = cancel.cancelled() => break,
            }
        }
        let (text, dropped, ended) = {
            let mut o = job.output.lock().expect("job lock");
            let bytes: Vec<u8> = o.unread.drain(..).collect();
            (bytes, std::mem::take(&mut o.dropped), o.ended)
        };
        let mut out = String::new();
        let cut = text.len().saturating_sub(SHOWN);
        let left_out = dropped + cut as u64;
        if left_out > 0 {
            out.push_str(&format!("[… {left_out} earlier bytes of output left out]\n"));
        }
        let shown = &text[cut..];
        // Not from the middle of a character.
        let start = shown.iter().take(3).take_while(|b| (**b & 0xC0) == 0x80).count();
        out.push_str(&String::from_utf8_lossy(&shown[start..]));
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        let id = job.id;
        match ended {
            None => out.push_str(&format!(
                "[job {id} is still running; read on with shell_output {{\"job\": {id}}}, stop it with \"kill\": true]"
            )),
            Some(end) => {
                out.push_str(&match end {
                    Ended::Exit(code) => format!("[job {id} exited with code {code}]"),
                    Ended::Signal => format!("[job {id} was killed by a signal]"),
                    Ended::Stopped => format!("[job {id} was stopped]"),
                    Ended::OutOfTime => format!("[job {id} was stopped after {} min]", LIFETIME.as_secs() / 60),
                });
                self.forget(session, id);
            }
        }
        out
    }
}

/// Read a job's pipe to its end into its unread output, keeping the latest [`KEPT`] bytes.
fn read_into(mut reader: std::io::PipeReader, job: &Job) {
    use std::io::Read;
    let mut buf = [0u8; 16 << 10];
    loop {
        match reader.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                {
                    let mut o = job.output.lock().expect("job lock");
                    o.unread.extend(&buf[..n]);
                    let over = o.unread.len().saturating_sub(KEPT);
                    if over > 0 {
                        o.unread.drain(..over);
                        o.dropped += over as u64;
                    }
                }
                job.bump();
            }
        }
    }
}
