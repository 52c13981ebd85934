//! A private PostgreSQL cluster owned by this process.
//!
//! With no `DATABASE_URL`, Berth creates (initdb) and starts a cluster from the machine's
//! installed PostgreSQL binaries under its data directory, listening only on a Unix socket,
//! and stops it on exit. PostgreSQL refuses to run as root, so when Berth runs as root the
//! cluster runs as an unprivileged system user (`postgres` if it exists, else `nobody`).
//! The test harness uses the same type: one cluster per test run.

use std::{
    io::Read,
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};

/// Options for a private cluster.
#[derive(Debug, Clone, Default)]
pub struct ClusterOptions {
    /// Turn off fsync (tests only: a crash may lose data).
    pub unsafe_no_fsync: bool,
    /// Also listen on 127.0.0.1 at this port (tests of TCP connections; the default is the
    /// Unix socket only).
    pub tcp_port: Option<u16>,
    /// Serve TLS on TCP with this certificate and key (PEM files; copied into the cluster).
    pub tls: Option<(PathBuf, PathBuf)>,
    /// More server settings, `name=value` each (passed as `-c`; diagnostics such as
    /// `shared_preload_libraries=pg_stat_statements`).
    pub settings: Vec<String>,
}

/// A running private cluster. Dropping it stops the server (fast shutdown).
#[derive(Debug)]
pub struct PrivateCluster {
    /// The keeper thread and its stop signal (None: attached to another process's cluster).
    keeper: Option<(std::thread::JoinHandle<()>, std::sync::mpsc::Sender<()>)>,
    socket_dir: PathBuf,
    port: u16,
}

/// The superuser role the cluster is initialised with.
pub const CLUSTER_USER: &str = "berth";
const PORT: u16 = 5432;

impl PrivateCluster {
    /// Create the cluster under `dir/pg` if it does not exist yet, then start it.
    ///
    /// Running as root, the cluster runs as an unprivileged user that may not be able to
    /// reach `dir` (under `/root`, say, or a data dir of mode 0700): then its files live in a
    /// directory Berth creates for it under [`CLUSTERS_DIR`], and `dir/pg` links there.
    pub fn start(dir: &Path, options: &ClusterOptions) -> anyhow::Result<PrivateCluster> {
        let bin = find_bin_dir()?;
        let owner = if is_root() { Some(unprivileged_user()?) } else { None };
        let dir = &match owner {
            Some((uid, gid)) => cluster_home(dir, uid, gid)?,
            None => dir.to_path_buf(),
        };
        let data = dir.join("pg");
        let socket_dir = dir.join("run").join("pg");
        std::fs::create_dir_all(&socket_dir).with_context(|| format!("creating {}", socket_dir.display()))?;
        let port = options.tcp_port.unwrap_or(PORT);
        if let Some(running) = PrivateCluster::attach(&data, &socket_dir, port) {
            return Ok(running);
        }
        if let Some((uid, _)) = owner {
            check_reachable(dir, uid)?;
        }
        if !data.join("PG_VERSION").exists() {
            std::fs::create_dir_all(&data)?;
            std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700))?;
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(&data, Some(uid), Some(gid))?;
            }
            let mut cmd = Command::new(bin.join("initdb"));
            cmd.arg("-D")
                .arg(&data)
                .args(["-U", CLUSTER_USER, "--auth=trust", "-E", "UTF8", "--no-instructions"]);
            if options.unsafe_no_fsync {
                cmd.arg("--no-sync");
            }
            let out = as_owner(&mut cmd, owner)
                .stdin(Stdio::null())
                .output()
                .context("running initdb")?;
            if !out.status.success() {
                bail!("initdb failed: {}", String::from_utf8_lossy(&out.stderr).trim());
            }
        }
        // The cluster trusts whoever reaches its socket: only its own user (and root) may.
        std::fs::set_permissions(&socket_dir, std::fs::Permissions::from_mode(0o700))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&socket_dir, Some(uid), Some(gid))?;
        }
        let log_path = dir.join("run").join("postgres.log");
        let log = std::fs::File::create(&log_path)?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&log_path, Some(uid), Some(gid))?;
        }
        let mut cmd = Command::new(bin.join("postgres"));
        cmd.arg("-D").arg(&data).arg("-k").arg(&socket_dir);
        let listen = if options.tcp_port.is_some() { "127.0.0.1" } else { "" };
        cmd.args([
            "-c",
            &format!("listen_addresses={listen}"),
            "-p",
            &port.to_string(),
            "-c",
            "max_connections=400",
            "-c",
            "unix_socket_permissions=0700",
        ]);
        if let Some((cert, key)) = &options.tls {
            // PostgreSQL wants the key private to the user it runs as.
            for (from, name, mode) in [(cert, "server.crt", 0o644), (key, "server.key", 0o600)] {
                let to = data.join(name);
                std::fs::copy(from, &to).with_context(|| format!("copying {}", from.display()))?;
                std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode))?;
                if let Some((uid, gid)) = owner {
                    std::os::unix::fs::chown(&to, Some(uid), Some(gid))?;
                }
            }
            cmd.args([
                "-c",
                "ssl=on",
                "-c",
                "ssl_cert_file=server.crt",
                "-c",
                "ssl_key_file=server.key",
            ]);
        }
        for setting in &options.settings {
            cmd.arg("-c").arg(setting);
        }
        if options.unsafe_no_fsync {
            cmd.args([
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
            ]);
        }
        as_owner(&mut cmd, owner)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        die_with_parent(&mut cmd);
        // The parent-death signal fires when the *thread* that spawned the child exits, so
        // the child is spawned and reaped by a keeper thread that lives as long as the cluster.
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let (ready_data, ready_socket) = (data.clone(), socket_dir.clone());
        let keeper = std::thread::Builder::new()
            .name("berth-postgres".into())
            .spawn(move || {
                let mut child = match cmd.spawn() {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = ready_tx.send(Err(anyhow::Error::from(e).context("starting postgres")));
                        return;
                    }
                };
                let ready = wait_ready(&mut child, &ready_data, &ready_socket, port, &log_path);
                let ok = ready.is_ok();
                let _ = ready_tx.send(ready);
                if ok {
                    // Blocks until stop() or the handle is dropped.
                    let _ = stop_rx.recv();
                }
                shut_down(child);
            })?;
        ready_rx.recv().context("postgres keeper thread died")??;
        Ok(PrivateCluster {
            keeper: Some((keeper, stop_tx)),
            socket_dir,
            port,
        })
    }

    /// A cluster some other process already runs on this data directory (e.g. `berth serve`
    /// while `berth admin` is used): connect to it without owning it.
    fn attach(data: &Path, socket_dir: &Path, port: u16) -> Option<PrivateCluster> {
        let pidfile = std::fs::read_to_string(data.join("postmaster.pid")).ok()?;
        let pid: i32 = pidfile.lines().next()?.trim().parse().ok()?;
        if !alive(pid) || !pidfile.contains("ready") || !socket_dir.join(format!(".s.PGSQL.{port}")).exists() {
            return None;
        }
        Some(PrivateCluster {
            keeper: None,
            socket_dir: socket_dir.to_path_buf(),
            port,
        })
    }

    /// A libpq-style connection string for `dbname` on this cluster (its Unix socket).
    pub fn url(&self, dbname: &str) -> String {
        format!(
            "host={} port={} user={CLUSTER_USER} dbname={dbname}",
            self.socket_dir.display(),
            self.port
        )
    }

    /// Stop the server (fast shutdown) and wait for it to exit. A cluster this process
    /// only attached to is left running.
    pub fn stop(&mut self) {
        if let Some((keeper, stop)) = self.keeper.take() {
            let _ = stop.send(());
            let _ = keeper.join();
        }
    }
}

fn wait_ready(child: &mut Child, data: &Path, socket_dir: &Path, port: u16, log_path: &Path) -> anyhow::Result<()> {
    let socket = socket_dir.join(format!(".s.PGSQL.{port}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait()? {
            let mut log = String::new();
            std::fs::File::open(log_path)
                .and_then(|mut f| f.read_to_string(&mut log))
                .ok();
            bail!("postgres exited ({status}) while starting: {}", log.trim());
        }
        // The socket appears once postgres listens; `postmaster.pid`'s status line says
        // "ready" when startup recovery is over.
        let ready =
            socket.exists() && std::fs::read_to_string(data.join("postmaster.pid")).is_ok_and(|p| p.contains("ready"));
        if ready {
            return Ok(());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("postgres did not become ready within 60 s; see {}", log_path.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn shut_down(mut child: Child) {
    signal(child.id(), libc::SIGINT);
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Where PostgreSQL's server binaries are: `BERTH_PG_BIN`, `PATH`, or Debian's layout.
pub fn find_bin_dir() -> anyhow::Result<PathBuf> {
    if let Ok(dir) = std::env::var("BERTH_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    if let Ok(path) = std::env::var("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("initdb").exists() && dir.join("postgres").exists() {
                return Ok(dir);
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, p)| p.join("initdb").exists())
        .collect();
    versions.sort();
    versions.pop().map(|(_, p)| p).context(
        "PostgreSQL server binaries (initdb, postgres) not found: install them (Debian: apt-get install postgresql) \
         or set BERTH_PG_BIN, or set DATABASE_URL",
    )
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

/// The uid/gid of `postgres`, else `nobody`, from /etc/passwd.
fn unprivileged_user() -> anyhow::Result<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").context("reading /etc/passwd")?;
    let lookup = |name: &str| {
        passwd.lines().find_map(|line| {
            let f: Vec<&str> = line.split(':').collect();
            (f.len() > 3 && f[0] == name)
                .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
                .flatten()
        })
    };
    lookup("postgres")
        .or_else(|| lookup("nobody"))
        .context("running as root, and neither a `postgres` nor a `nobody` user exists to run PostgreSQL as")
}

/// Where clusters live whose data directory the unprivileged user cannot reach (one
/// directory per data directory, created by Berth, traversable by that user).
pub const CLUSTERS_DIR: &str = "/var/lib/berth-clusters";

/// Where the cluster of data directory `dir` keeps its files when it runs as `uid`: `dir`
/// itself if that user can reach it (or a cluster is already there), else the directory
/// `dir/pg` links to, created under [`CLUSTERS_DIR`] on first start.
fn cluster_home(dir: &Path, uid: u32, gid: u32) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    let link = dir.join("pg");
    if let Ok(target) = std::fs::read_link(&link) {
        return target
            .parent()
            .map(Path::to_path_buf)
            .with_context(|| format!("{} links to {}", link.display(), target.display()));
    }
    if link.exists() || unreachable_part(&dir, uid).is_none() {
        return Ok(dir);
    }
    let digest = <sha2::Sha256 as sha2::Digest>::digest(dir.as_os_str().as_encoded_bytes());
    let id: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    let home = Path::new(CLUSTERS_DIR).join(id);
    for d in [Path::new(CLUSTERS_DIR), &home] {
        if !d.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(d)
                .with_context(|| format!("creating {}", d.display()))?;
            // Whatever the umask: the cluster's user must get through.
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    std::fs::write(home.join("data-dir"), format!("{}\n", dir.display()))?;
    let data = home.join("pg");
    std::fs::create_dir_all(&data)?;
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700))?;
    std::os::unix::fs::chown(&data, Some(uid), Some(gid))?;
    std::os::unix::fs::symlink(&data, &link).with_context(|| format!("linking {}", link.display()))?;
    Ok(home)
}

/// The first of `dir` and its ancestors that `uid` cannot traverse, if any.
fn unreachable_part(dir: &Path, uid: u32) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    dir.ancestors()
        .find(|d| {
            std::fs::metadata(d).is_ok_and(|meta| {
                let traversable = meta.mode() & 0o001 != 0 || (meta.uid() == uid && meta.mode() & 0o100 != 0);
                !traversable
            })
        })
        .map(Path::to_path_buf)
}

/// Running as root, the cluster runs as `uid`: the cluster's directory and its ancestors
/// must let that user through, or initdb fails with a confusing error. (Only a cluster
/// created in place before, whose directory was made private since, can fail here.)
fn check_reachable(dir: &Path, uid: u32) -> anyhow::Result<()> {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    if let Some(blocked) = unreachable_part(&dir, uid) {
        bail!(
            "the private PostgreSQL cluster runs as uid {uid} (PostgreSQL refuses root), which cannot reach {}: \
             {} is not traversable by other users. Make it so (chmod o+x) or set BERTH_DATA_DIR to a directory \
             such as /var/lib/berth",
            dir.display(),
            blocked.display()
        );
    }
    Ok(())
}

fn as_owner(cmd: &mut Command, owner: Option<(u32, u32)>) -> &mut Command {
    if let Some((uid, gid)) = owner {
        cmd.uid(uid).gid(gid);
    }
    cmd
}

#[expect(
    unsafe_code,
    reason = "pre_exec and prctl: the only way to tie postgres's life to ours"
)]
fn die_with_parent(cmd: &mut Command) {
    // Runs in the child after fork and after the uid change, before exec. If Berth dies
    // without a clean stop, postgres gets SIGINT (fast shutdown) instead of lingering.
    // Its own process group keeps a terminal's Ctrl-C (sent to the foreground group) away
    // from it: Berth drains first and then stops the cluster itself.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGINT) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[expect(unsafe_code, reason = "kill(2) with signal 0 is the liveness probe")]
fn alive(pid: i32) -> bool {
    unsafe { libc::kill(pid, 0) == 0 }
}

#[expect(
    unsafe_code,
    reason = "kill(2) has no safe std wrapper for signals other than SIGKILL"
)]
fn signal(pid: u32, sig: libc::c_int) {
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Create database `name` on the server at `admin_url` unless it exists, optionally as a
/// copy of `template`.
pub async fn create_database(admin_url: &str, name: &str, template: Option<&str>) -> anyhow::Result<()> {
    let (client, connection) = tokio_postgres::connect(admin_url, tokio_postgres::NoTls).await?;
    let conn = tokio::spawn(connection);
    let exists = client
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .await?
        .is_some();
    if !exists {
        let ident = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
        let sql = match template {
            Some(t) => format!("CREATE DATABASE {} TEMPLATE {}", ident(name), ident(t)),
            None => format!("CREATE DATABASE {}", ident(name)),
        };
        if let Err(e) = client.batch_execute(&sql).await {
            // Lost a race with another process creating it: fine.
            if e.code() != Some(&tokio_postgres::error::SqlState::DUPLICATE_DATABASE) {
                return Err(e.into());
            }
        }
    }
    drop(client);
    let _ = conn.await;
    Ok(())
}

/// The name of the WAL segment `initdb` writes: the first of timeline 1.
const INITIAL_WAL_SEGMENT: &str = "000000010000000000000001";

/// Move a private cluster out of the WAL segment `initdb` wrote, if it is still there: on
/// thin-provisioned virtual disks, a commit in that segment waited ≈ 3.5–4 ms for the disk
/// against ≈ 0.15–0.2 ms in any segment PostgreSQL created or recycled itself (measured with
/// pgbench on the same cluster before and after the switch; docs/performance.md, "A new
/// cluster's first WAL segment"). The switch leaves the rest of that segment unused, once.
/// `admin_url` connects as the cluster's superuser.
pub async fn leave_initial_wal_segment(admin_url: &str) -> anyhow::Result<()> {
    let (client, connection) = tokio_postgres::connect(admin_url, tokio_postgres::NoTls).await?;
    let conn = tokio::spawn(connection);
    client
        .query(
            "SELECT pg_switch_wal() WHERE pg_walfile_name(pg_current_wal_lsn()) = $1",
            &[&INITIAL_WAL_SEGMENT],
        )
        .await?;
    drop(client);
    let _ = conn.await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory is reachable by another user only if it and every ancestor let that user
    /// through; the data dir's own mode counts too.
    #[test]
    fn the_first_private_directory_on_the_way_is_found() {
        let base = std::env::temp_dir().join(format!("berth-reach-{}", std::process::id()));
        let data = base.join("project").join(".berth");
        std::fs::create_dir_all(&data).unwrap();
        let mode = |d: &Path, m: u32| std::fs::set_permissions(d, std::fs::Permissions::from_mode(m)).unwrap();
        for d in [&base, &base.join("project"), &data] {
            mode(d, 0o755);
        }
        let other = 65_534;
        assert_eq!(unreachable_part(&data, other), None);
        mode(&data, 0o700);
        assert_eq!(unreachable_part(&data, other), Some(data.clone()));
        mode(&data, 0o755);
        mode(&base, 0o700);
        assert_eq!(unreachable_part(&data, other), Some(base.clone()));
        // Its owner gets through a directory of mode 0700.
        let me = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&base).unwrap());
        assert_eq!(unreachable_part(&data, me), None);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
