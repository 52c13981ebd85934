//! Keeping a process's secrets out of reach of the tools it runs (`berth dev`, `berth
//! worker`, and `berth serve` alike).
//!
//! A tool the model runs is a child of the worker, so it can read the worker's
//! `/proc/<pid>/environ`: the worker token given as `BERTH_WORKER_TOKEN`, and under `berth
//! dev` the provider key, the database URL, the object store's keys. Two defences:
//!
//! - The process marks itself non-dumpable (`PR_SET_DUMPABLE` 0): its `/proc/<pid>/environ`
//!   and memory are then closed to other processes of its user (not to root with
//!   `CAP_SYS_PTRACE`: run tools as another user for that, docs/deploy.md).
//! - Secrets leave the environment itself ([`is_secret`]): when any is there at start, the process runs
//!   itself again (`exec`, same pid) without them, handing them over through a pipe on its
//!   standard input, so `/proc/<pid>/environ` (the environment it was started with) no
//!   longer holds them. [`Sealed`] is what came through; settings read it as the environment.

use std::{
    collections::HashMap,
    io::{Read, Write},
    os::unix::process::CommandExt,
};

use anyhow::Context;

/// Set in the re-run process's environment: its standard input carries the secrets.
const MARK: &str = "BERTH_SEALED_ENV";
/// More than this in secrets is not sealed (a pipe holds 64 KiB before a writer waits).
const MAX_BYTES: usize = 60 << 10;

/// The variables sealed away from the environment, by name.
#[derive(Default, Clone)]
pub struct Sealed(HashMap<String, String>);

impl Sealed {
    pub fn get(&self, key: &str) -> Option<&String> {
        self.0.get(key)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &String)> {
        self.0.iter()
    }
}

/// Make this process non-dumpable and, for a process that runs tools, take its secrets out
/// of its environment (see the module's doc). Call before any thread starts: it may replace
/// the process image.
pub fn seal(runs_tools: bool) -> anyhow::Result<Sealed> {
    if let Err(e) = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable) {
        eprintln!("berth: could not make the process non-dumpable: {e}");
    }
    if std::env::var_os(MARK).is_some() {
        return receive();
    }
    if !runs_tools {
        return Ok(Sealed::default());
    }
    let secrets: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| is_secret(k))
        .collect();
    let bytes: usize = secrets.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    if secrets.is_empty() || bytes > MAX_BYTES {
        return Ok(Sealed::default());
    }
    let (reader, mut writer) = std::io::pipe().context("a pipe for the sealed environment")?;
    for (k, v) in &secrets {
        writer.write_all(k.as_bytes())?;
        writer.write_all(b"\0")?;
        writer.write_all(v.as_bytes())?;
        writer.write_all(b"\0")?;
    }
    drop(writer);
    let mut again = std::process::Command::new("/proc/self/exe");
    again
        .arg0(std::env::args_os().next().unwrap_or_default())
        .args(std::env::args_os().skip(1))
        .env(MARK, "1")
        .stdin(reader);
    for (k, _) in &secrets {
        again.env_remove(k);
    }
    // Only returns when the exec failed: go on as started (the secrets stay where they were).
    let e = again.exec();
    eprintln!("berth: could not run again without secrets in the environment: {e}");
    Ok(Sealed::default())
}

/// The variables taken out of the environment: those a tool never sees
/// ([`berth_worker::is_secret_env`]) that hold a secret — a token, key, secret or password,
/// the database URL. Other settings (`BERTH_CONFIG`, `BERTH_PG_BIN`, listen addresses) stay
/// where code and people look for them.
fn is_secret(key: &str) -> bool {
    let k = key.to_ascii_uppercase();
    berth_worker::is_secret_env(&k)
        && (k == "DATABASE_URL"
            || k.starts_with("PGPASS")
            || ["TOKEN", "KEY", "SECRET", "PASSWORD"].iter().any(|w| k.contains(w)))
}

/// The re-run process: read the secrets from standard input (left at its end).
fn receive() -> anyhow::Result<Sealed> {
    let mut raw = Vec::new();
    std::io::stdin()
        .lock()
        .take(MAX_BYTES as u64 + 1)
        .read_to_end(&mut raw)
        .context("reading the sealed environment")?;
    let mut fields = raw.split(|b| *b == 0);
    let mut out = HashMap::new();
    while let (Some(k), Some(v)) = (fields.next(), fields.next()) {
        if let (Ok(k), Ok(v)) = (std::str::from_utf8(k), std::str::from_utf8(v)) {
            out.insert(k.to_string(), v.to_string());
        }
    }
    Ok(Sealed(out))
}

#[cfg(test)]
mod tests {
    #[test]
    fn secrets_are_sealed_and_other_settings_stay() {
        for k in [
            "BERTH_WORKER_TOKEN",
            "BERTH_MODEL_API_KEY",
            "BERTH_PROVIDER_OPEN_API_KEY",
            "DATABASE_URL",
            "PGPASSWORD",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
        ] {
            assert!(super::is_secret(k), "{k}");
        }
        for k in [
            "BERTH_CONFIG",
            "BERTH_PG_BIN",
            "BERTH_LISTEN",
            "BERTH_DATA_DIR",
            "PATH",
            "HOME",
        ] {
            assert!(!super::is_secret(k), "{k}");
        }
    }
}
