//! CPU time of processes, read from `/proc/<pid>/stat` (Linux), for the benches.

use std::time::Duration;

/// Clock ticks per second of `/proc/<pid>/stat`'s times.
pub fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// The fields of a `stat` file (`/proc/<pid>/stat`, `/proc/self/task/<tid>/stat`) after the
/// command name (which may hold spaces): `[0]` state, `[1]` ppid, `[11]` utime, `[12]`
/// stime. None once the process is gone.
pub fn stat_fields(path: &str) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(path).ok()?;
    let rest = &stat[stat.rfind(") ")? + 2..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// [`stat_fields`] of a process.
pub fn pid_stat(pid: u32) -> Option<Vec<String>> {
    stat_fields(&format!("/proc/{pid}/stat"))
}

/// User + system time of [`stat_fields`], in clock ticks.
pub fn stat_ticks(f: &[String]) -> u64 {
    f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
}

/// User + system time a process has used so far, in clock ticks (zero once it is gone).
pub fn cpu_ticks(pid: u32) -> u64 {
    pid_stat(pid).map_or(0, |f| stat_ticks(&f))
}

/// [`cpu_ticks`] of a process and its children (PostgreSQL: the postmaster and its
/// backends, checkpointer, WAL writer, autovacuum). A child that exits between two
/// readings takes its time with it; the pools keep theirs open.
pub fn tree_ticks(root: u32) -> u64 {
    let mut sum = cpu_ticks(root);
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(f) = pid_stat(pid)
            && f[1].parse::<u32>().ok() == Some(root)
        {
            sum += stat_ticks(&f);
        }
    }
    sum
}

/// Clock ticks as time.
pub fn ticks_time(ticks: u64) -> Duration {
    Duration::from_secs_f64(ticks as f64 / clock_ticks())
}
