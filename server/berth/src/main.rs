//! `berth`: one binary with subcommands — `serve`, `worker`, `dev`, `migrate`, `admin`.

mod acp;
mod client_cmds;
mod pieces;
mod seal;
mod settings;

use std::{
    io::Write,
    os::unix::fs::{DirBuilderExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use anyhow::Context;
use berth_api::{Config, ModelConfig, Secret};
use berth_store::{
    Store,
    admin::Actor,
    cluster::{ClusterOptions, PrivateCluster, create_database},
};
use clap::{Parser, Subcommand};
use settings::Settings;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(name = "berth", version, about = "Berth: a self-hosted, multi-tenant agent host")]
struct Cli {
    /// Config file of KEY=VALUE lines (keys as the environment variables).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Data directory (BERTH_DATA_DIR; default: the user's own for the current directory,
    /// outside it: $XDG_DATA_HOME/berth/dev/<dir>-<hash>, else ~/.local/share/…).
    #[arg(long, global = true)]
    data_dir: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run an API replica.
    Serve(ServeArgs),
    /// Run the API tier and a worker for the current directory, with private Postgres.
    Dev(ServeArgs),
    /// Run a worker: connect outbound to the API tier and serve workspaces.
    Worker(WorkerArgs),
    /// Apply database migrations.
    Migrate,
    /// Administration against the database (bootstrap and break-glass).
    #[command(subcommand)]
    Admin(Admin),
    #[command(flatten)]
    Client(client_cmds::ClientCommand),
}

#[derive(clap::Args, Clone)]
struct ServeArgs {
    /// Listen address (BERTH_LISTEN; default 127.0.0.1:8790).
    #[arg(long)]
    listen: Option<String>,
    /// Metrics listen address (BERTH_METRICS_LISTEN; default 127.0.0.1:9464).
    #[arg(long)]
    metrics_listen: Option<String>,
    /// Do not apply migrations on start.
    #[arg(long)]
    no_migrate: bool,
}

#[derive(clap::Args)]
struct WorkerArgs {
    /// The API tier's URL, e.g. wss://berth.example.com/
    #[arg(long)]
    server: String,
    /// File holding the worker credential (or BERTH_WORKER_TOKEN).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// A workspace to serve: [NAME=]PATH (repeatable).
    #[arg(long = "workspace", required = true)]
    workspaces: Vec<String>,
    /// This machine's stable name (default: the hostname).
    #[arg(long)]
    host: Option<String>,
    /// Model steps one turn may take before it fails with `step-limit`
    /// (BERTH_WORKER_MAX_STEPS; default 50).
    #[arg(long)]
    max_steps: Option<String>,
    /// Longest a shell tool call may run, in seconds (BERTH_WORKER_SHELL_TIMEOUT_SECS; default 300).
    #[arg(long)]
    shell_timeout_secs: Option<String>,
    /// Serve `/healthz` (alive) and `/readyz` (registered with the API tier) on this address
    /// for probes (BERTH_WORKER_HEALTH_LISTEN; default: none).
    #[arg(long)]
    health_listen: Option<String>,
}

/// The worker's loop and tool limits: flag > environment > config file > default.
fn worker_limits(
    settings: &Settings,
    max_steps: Option<&str>,
    shell_timeout: Option<&str>,
) -> anyhow::Result<(berth_worker::AgentConfig, berth_worker::ToolLimits)> {
    let agent = berth_worker::AgentConfig {
        max_steps: settings.parse(max_steps, "BERTH_WORKER_MAX_STEPS", "50")?,
    };
    let secs: u64 = settings.parse(shell_timeout, "BERTH_WORKER_SHELL_TIMEOUT_SECS", "300")?;
    let tools = berth_worker::ToolLimits {
        shell_timeout: std::time::Duration::from_secs(secs),
        shell_output_max: settings.parse(None, "BERTH_WORKER_SHELL_OUTPUT_MAX", "1048576")?,
    };
    Ok((agent, tools))
}

/// The worker's MCP servers and bounds: environment > config file > default.
fn worker_mcp(settings: &Settings) -> anyhow::Result<berth_worker::McpConfig> {
    let defaults = berth_worker::McpConfig::default();
    let servers = match settings.get(None, "BERTH_WORKER_MCP_CONFIG") {
        Some(path) => berth_worker::McpConfig::load_servers(Path::new(&path))?,
        None => Default::default(),
    };
    Ok(berth_worker::McpConfig {
        servers,
        workspace_files: settings.parse(None, "BERTH_WORKER_MCP_WORKSPACE", "false")?,
        max_servers: settings.parse(None, "BERTH_WORKER_MCP_MAX_SERVERS", &defaults.max_servers.to_string())?,
        max_tools: settings.parse(None, "BERTH_WORKER_MCP_MAX_TOOLS", &defaults.max_tools.to_string())?,
        start_timeout: std::time::Duration::from_secs(settings.parse(
            None,
            "BERTH_WORKER_MCP_START_TIMEOUT_SECS",
            &defaults.start_timeout.as_secs().to_string(),
        )?),
        call_timeout: std::time::Duration::from_secs(settings.parse(
            None,
            "BERTH_WORKER_MCP_CALL_TIMEOUT_SECS",
            &defaults.call_timeout.as_secs().to_string(),
        )?),
        output_max: settings.parse(None, "BERTH_WORKER_MCP_OUTPUT_MAX", &defaults.output_max.to_string())?,
    })
}

#[derive(Subcommand)]
enum Admin {
    /// Credentials.
    #[command(subcommand)]
    Token(TokenCmd),
    /// Tenants.
    #[command(subcommand)]
    Tenant(TenantCmd),
    /// Users.
    #[command(subcommand)]
    User(UserCmd),
}

#[derive(Subcommand)]
enum TokenCmd {
    /// Create a credential and print it (only it) on stdout.
    Create {
        #[arg(long)]
        tenant: String,
        /// The user's email (a user credential).
        #[arg(long, conflicts_with = "worker", required_unless_present = "worker")]
        user: Option<String>,
        /// A worker credential instead.
        #[arg(long)]
        worker: bool,
        #[arg(long, default_value = "")]
        note: String,
    },
    /// List a tenant's credentials, one per line, id first.
    List {
        #[arg(long)]
        tenant: String,
    },
    /// Revoke a credential by id.
    Revoke { id: String },
}

#[derive(Subcommand)]
enum TenantCmd {
    /// Create a tenant; prints its id.
    Create { name: String },
}

#[derive(Subcommand)]
enum UserCmd {
    /// Create a user; prints its id.
    Create {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        email: String,
        #[arg(long)]
        admin: bool,
        /// Read a password for the user from standard input (first line).
        #[arg(long)]
        password_stdin: bool,
    },
    /// Set a user's password, read from standard input (first line).
    SetPassword {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        email: String,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Before any thread: this may run the process again without secrets in its environment.
    let sealed = match &cli.command {
        Command::Dev(_) | Command::Worker(_) => seal::seal(true)?,
        Command::Serve(_) => seal::seal(false)?,
        _ => Default::default(),
    };
    let settings = Settings::load(cli.config.as_deref(), sealed)?;
    init_tracing(&settings);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = runtime.block_on(run(cli, settings));
    if let Err(e) = &result {
        eprintln!("berth: {e:#}");
        std::process::exit(1);
    }
    Ok(())
}

/// Seconds (fractions allowed) as a duration.
fn secs(settings: &Settings, key: &str, default: &str) -> anyhow::Result<std::time::Duration> {
    let v: f64 = settings.parse(None, key, default)?;
    std::time::Duration::try_from_secs_f64(v).map_err(|e| anyhow::anyhow!("{key}: {e}"))
}

/// The provider profiles of these settings.
fn providers(settings: &Settings) -> anyhow::Result<berth_api::config::ProviderSet> {
    berth_api::config::ProviderSet::load(|k| settings.get(None, k), |k| settings.secret(k))
}

/// SIGHUP re-reads the config file (and environment) for the provider profiles; calls in
/// flight keep the profiles they started with, connections stay up. A file that does not
/// parse keeps the current profiles.
fn spawn_reload(current: berth_api::config::Providers, settings: Settings) {
    #[cfg(unix)]
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            return;
        };
        while hup.recv().await.is_some() {
            match settings.reloaded().and_then(|s| providers(&s)) {
                Ok(set) => {
                    tracing::info!(profiles = set.profiles.len(), "provider profiles reloaded");
                    current.replace(set);
                }
                Err(e) => tracing::warn!(error = %e, "provider profiles not reloaded; keeping the current ones"),
            }
        }
    });
    #[cfg(not(unix))]
    let _ = (current, settings);
}

fn init_tracing(settings: &Settings) {
    use tracing_subscriber::{EnvFilter, fmt};
    let filter = EnvFilter::try_new(settings.get(None, "RUST_LOG").unwrap_or_else(|| "info".into()))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour only for a person at a terminal: files and pipes get plain text.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour);
    if settings.get(None, "BERTH_LOG_FORMAT").as_deref() == Some("json") {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn run(cli: Cli, settings: Settings) -> anyhow::Result<()> {
    // Only the commands that keep data make (or look for) a data directory.
    let data_dir = || -> anyhow::Result<PathBuf> {
        match settings.get(cli.data_dir.as_deref(), "BERTH_DATA_DIR") {
            Some(d) => Ok(PathBuf::from(d)),
            None => default_data_dir(),
        }
    };
    match cli.command {
        Command::Serve(args) => serve(&settings, &data_dir()?, &args, false).await,
        Command::Dev(args) => serve(&settings, &data_dir()?, &args, true).await,
        Command::Worker(args) => worker(&settings, args).await,
        Command::Migrate => {
            let (store, _cluster) = database(&settings, &data_dir()?).await?;
            let n = store.migrate().await?;
            println!("applied {n} migration(s)");
            Ok(())
        }
        Command::Admin(cmd) => admin(&settings, &data_dir()?, cmd).await,
        Command::Client(cmd) => client_cmds::run(cmd).await,
    }
}

/// The data directory when none is configured: the user's own for the current directory, never
/// inside it. A data directory holds the admin credential, the login signing key and the dev
/// worker's credential: inside a workspace, a tool could read them and `git add -A` commit
/// them. Keyed by the directory's canonical path, so `berth dev` and `berth admin` run from
/// one directory find the same private cluster.
fn default_data_dir() -> anyhow::Result<PathBuf> {
    let cwd = std::env::current_dir()
        .and_then(|d| d.canonicalize())
        .context("the current directory")?;
    let dir = dev_data_dir(&cwd);
    if cwd.join(".berth/run/token").exists() {
        eprintln!(
            "berth: {} holds an older data directory, no longer used by default (it keeps credentials inside the workspace); \
             this directory's data now lives in {} — move it there, or set BERTH_DATA_DIR, and remove it from the workspace",
            cwd.join(".berth").display(),
            dir.display()
        );
    }
    // Private to the user: it will hold credentials.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("creating data dir {}", dir.display()))?;
    Ok(dir)
}

/// Paths on this machine that hold Berth's own credentials and settings, which a worker keeps
/// out of its workspaces' reach (tools and `files.*` neither read nor list them, even in a
/// workspace that holds them, such as one served from a home directory): `berth login`'s
/// credential directory, every base Berth keeps data directories under, the configuration
/// file, the files its `*_FILE` settings and the MCP configuration name, and `more`. Each
/// by its real path where it exists.
fn secret_paths(settings: &Settings, more: &[&Path]) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = Vec::new();
    if let Ok(credentials) = client_cmds::credentials_path()
        && let Some(dir) = credentials.parent()
    {
        paths.push(dir.to_path_buf());
    }
    let (bases, fallback) = data_bases();
    paths.extend(bases.into_iter().map(|b| b.join("berth")));
    paths.push(fallback);
    paths.extend(settings.path.clone());
    for (key, value) in settings.with_prefix("BERTH_") {
        if key.ends_with("_FILE") || key == "BERTH_WORKER_MCP_CONFIG" || key == "BERTH_DATA_DIR" {
            paths.push(PathBuf::from(value));
        }
    }
    paths.extend(more.iter().map(|p| p.to_path_buf()));
    paths
        .into_iter()
        .filter(|p| !p.as_os_str().is_empty())
        .filter_map(|p| std::path::absolute(&p).ok())
        .map(|p| p.canonicalize().unwrap_or(p))
        .collect()
}

/// `berth dev` serves the current directory to the agent's tools, so its data directory
/// (credentials, the login key, the private cluster) must not be inside it.
fn outside_the_workspace(data_dir: &Path) -> anyhow::Result<()> {
    let cwd = std::env::current_dir()?.canonicalize()?;
    // Its real path without creating it: the nearest existing ancestor's, and the rest.
    let absolute = std::path::absolute(data_dir)?;
    let mut data = None;
    for existing in absolute.ancestors() {
        if let Ok(real) = existing.canonicalize() {
            data = Some(real.join(absolute.strip_prefix(existing).unwrap_or(Path::new(""))));
            break;
        }
    }
    let data = data.unwrap_or(absolute);
    if data.starts_with(&cwd) {
        anyhow::bail!(
            "the data directory {} is inside the workspace {} that `berth dev` serves, where the agent's tools could read its credentials; \
             set BERTH_DATA_DIR outside it, or run berth dev from a project directory",
            data.display(),
            cwd.display()
        );
    }
    Ok(())
}

/// The data directory of a `berth dev` run from `cwd` (canonical), created or not:
/// `$XDG_DATA_HOME/berth/dev/<dir>-<hash>`, else under `~/.local/share`.
/// A base inside `cwd` (`berth dev` run from the home directory) is passed over: the
/// workspace's tools would read the credentials without asking.
pub(crate) fn dev_data_dir(cwd: &Path) -> PathBuf {
    dev_data_dir_from(cwd, data_bases())
}

/// The bases Berth keeps data directories under (`<base>/berth/…`), from its environment:
/// `$XDG_DATA_HOME` and `$HOME/.local/share` where set, and the fallback
/// `/var/tmp/berth-<uid>`.
fn data_bases_from(xdg: Option<PathBuf>, home: Option<PathBuf>, uid: u32) -> (Vec<PathBuf>, PathBuf) {
    let bases = [xdg, home.map(|h| h.join(".local/share"))]
        .into_iter()
        .flatten()
        .collect();
    (bases, PathBuf::from(format!("/var/tmp/berth-{uid}")))
}

/// [`data_bases_from`] with this process's environment.
fn data_bases() -> (Vec<PathBuf>, PathBuf) {
    data_bases_from(
        std::env::var_os("XDG_DATA_HOME").map(PathBuf::from),
        std::env::var_os("HOME").map(PathBuf::from),
        rustix::process::getuid().as_raw(),
    )
}

/// [`dev_data_dir`] with the data bases given ([`data_bases_from`]): the first absolute
/// base not inside `cwd`, else the fallback.
fn dev_data_dir_from(cwd: &Path, (bases, fallback): (Vec<PathBuf>, PathBuf)) -> PathBuf {
    use sha2::Digest as _;
    let base = bases
        .into_iter()
        .find(|b| b.is_absolute() && !b.starts_with(cwd))
        .unwrap_or(fallback);
    let digest = sha2::Sha256::digest(cwd.as_os_str().as_encoded_bytes());
    let key: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    let name = cwd.file_name().and_then(|n| n.to_str()).unwrap_or("root");
    base.join("berth/dev").join(format!("{name}-{key}"))
}

/// Where `berth dev` writes the address it listens on, for the client commands.
pub(crate) const DEV_ADDRESS_FILE: &str = "run/address";

/// A base URL as shown to people: without any user or password in it.
fn without_userinfo(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let host_end = rest.find('/').unwrap_or(rest.len());
            match rest[..host_end].rfind('@') {
                Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
                None => url.to_string(),
            }
        }
        None => url.to_string(),
    }
}

/// How a person runs this program again: `berth` when that is what PATH finds, else its path.
fn program_name() -> String {
    let me = std::env::current_exe().and_then(|p| p.canonicalize()).ok();
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("berth"))
            .find(|p| p.is_file())
            .and_then(|p| p.canonicalize().ok())
    });
    match (me, on_path) {
        (Some(me), Some(found)) if me == found => "berth".into(),
        (Some(me), _) => me.display().to_string(),
        (None, _) => "berth".into(),
    }
}

/// `berth dev`'s start-up lines after the address: the console, the model, the credential,
/// a `berth chat` that works as printed from this directory, and how to stop.
fn dev_startup_lines(addr: &str, token_path: &Path, model: &ModelConfig) -> Vec<String> {
    let mut lines = vec![format!(
        "console: http://{addr}/ (sign in with the admin credential below)"
    )];
    lines.push(match (&model.model, &model.base_url) {
        (Some(m), Some(url)) => format!("model: {m} at {}", without_userinfo(url)),
        (None, Some(url)) => format!(
            "model: the endpoint's default at {} (set BERTH_MODEL to choose one)",
            without_userinfo(url)
        ),
        (_, None) => {
            "model: none configured — turns will fail until BERTH_MODEL_BASE_URL and BERTH_MODEL are set".into()
        }
    });
    lines.push(format!("admin credential file: {}", token_path.display()));
    let program = program_name();
    // A `berth login` to another server takes precedence over this directory's dev server:
    // then the command names this one.
    let elsewhere = client_cmds::stored_server().is_some_and(|s| s.trim_end_matches('/') != format!("http://{addr}"));
    let chat = if elsewhere {
        format!(
            "{program} chat --server http://{addr} --token-file {}",
            token_path.display()
        )
    } else {
        format!("{program} chat")
    };
    lines.push(format!("chat from this directory: {chat}"));
    lines.push(format!("check the setup: {program} doctor"));
    lines.push("Ctrl-C stops Berth and its private PostgreSQL".into());
    lines
}

/// The store: `DATABASE_URL`, or the private cluster under the data dir (returned so that
/// the caller owns it and it stops when dropped).
async fn database(settings: &Settings, data_dir: &Path) -> anyhow::Result<(Store, Option<PrivateCluster>)> {
    let defaults = berth_store::DbOptions::default();
    let secs = |key: &str, default: std::time::Duration| -> anyhow::Result<std::time::Duration> {
        Ok(std::time::Duration::from_secs(settings.parse(
            None,
            key,
            &default.as_secs().to_string(),
        )?))
    };
    let options = berth_store::DbOptions {
        max_size: settings.parse(None, "BERTH_DB_POOL_SIZE", "16")?,
        ca_file: settings.get(None, "BERTH_DB_CA_FILE").map(PathBuf::from),
        connect_timeout: secs("BERTH_DB_CONNECT_TIMEOUT_SECS", defaults.connect_timeout)?,
        tcp_user_timeout: secs("BERTH_DB_TCP_USER_TIMEOUT_SECS", defaults.tcp_user_timeout)?,
        statement_timeout: secs("BERTH_DB_STATEMENT_TIMEOUT_SECS", defaults.statement_timeout)?,
        ssl_mode_floor: None,
    };
    if let Some(url) = settings.secret("DATABASE_URL")? {
        // A floor for a server elsewhere (the private cluster is reached over a local socket).
        let floor = match settings.get(None, "BERTH_DB_SSLMODE") {
            Some(v) => Some(v.parse().with_context(|| format!("BERTH_DB_SSLMODE={v:?}"))?),
            None => None,
        };
        let options = berth_store::DbOptions {
            ssl_mode_floor: floor,
            ..options
        };
        return Ok((Store::connect_with(&url, &options)?, None));
    }
    std::fs::create_dir_all(data_dir).with_context(|| format!("creating data dir {}", data_dir.display()))?;
    let data_dir = data_dir.canonicalize()?;
    let cluster =
        tokio::task::spawn_blocking(move || PrivateCluster::start(&data_dir, &ClusterOptions::default())).await??;
    create_database(&cluster.url("postgres"), "berth", None).await?;
    berth_store::cluster::leave_initial_wal_segment(&cluster.url("postgres")).await?;
    let store = Store::connect_with(&cluster.url("berth"), &options)?;
    Ok((store, Some(cluster)))
}

async fn serve(settings: &Settings, data_dir: &Path, args: &ServeArgs, dev: bool) -> anyhow::Result<()> {
    if dev {
        outside_the_workspace(data_dir)?;
    }
    let (store, cluster) = database(settings, data_dir).await?;
    if !args.no_migrate {
        let n = store.migrate().await.context("applying migrations")?;
        tracing::info!(applied = n, "migrations current");
    }
    let run_dir = data_dir.join("run");
    std::fs::create_dir_all(&run_dir)?;
    let token_path = run_dir.join("token");
    if let Some(token) = store.bootstrap().await? {
        write_secret(&token_path, &token)?;
        tracing::info!(path = %token_path.display(), "bootstrap admin credential written");
    }

    let mut config = Config::for_data_dir(data_dir.to_path_buf());
    config.listen = settings.parse(args.listen.as_deref(), "BERTH_LISTEN", "127.0.0.1:8790")?;
    config.metrics_listen = settings.parse(args.metrics_listen.as_deref(), "BERTH_METRICS_LISTEN", "127.0.0.1:9464")?;
    config.allowed_origins = settings
        .get(None, "BERTH_ALLOWED_ORIGINS")
        .map(|s| {
            s.split(',')
                .map(|o| o.trim().to_string())
                .filter(|o| !o.is_empty())
                .collect()
        })
        .unwrap_or_default();
    config.max_text_message = settings.parse(None, "BERTH_MAX_TEXT_MESSAGE", "8388608")?;
    config.max_attachment_bytes = settings.parse(None, "BERTH_MAX_ATTACHMENT_BYTES", "33554432")?;
    config.upload_memory_bytes = settings.parse(None, "BERTH_UPLOAD_MEMORY_BYTES", "268435456")?;
    config.object_store = berth_api::ObjectStoreConfig {
        url: settings.get(None, "BERTH_OBJECT_STORE"),
        aws: settings
            .with_prefix("AWS_")
            .into_iter()
            .map(|(k, v)| (k, Secret(v)))
            .collect(),
        sweep_every: std::time::Duration::from_secs(settings.parse(None, "BERTH_OBJECT_SWEEP_SECS", "3600")?),
        orphan_age: std::time::Duration::from_secs(settings.parse(None, "BERTH_OBJECT_ORPHAN_AGE_SECS", "3600")?),
    };
    config.model = ModelConfig {
        base_url: settings.get(None, "BERTH_MODEL_BASE_URL"),
        api_key: settings.secret("BERTH_MODEL_API_KEY")?.map(Secret),
        model: settings.get(None, "BERTH_MODEL"),
        context_tokens: settings.parse(None, "BERTH_MODEL_CONTEXT_TOKENS", "200000")?,
        level: match settings.get(None, "BERTH_MODEL_LEVEL") {
            Some(v) => Some(v.parse().map_err(|e| anyhow::anyhow!("BERTH_MODEL_LEVEL={v:?}: {e}"))?),
            None => None,
        },
        max_output_tokens: match settings.get(None, "BERTH_MODEL_MAX_OUTPUT_TOKENS") {
            Some(v) => Some(v.parse().context("BERTH_MODEL_MAX_OUTPUT_TOKENS")?),
            None => None,
        },
        max_concurrent: settings.parse(None, "BERTH_MODEL_MAX_CONCURRENT", "64")?,
        requests_per_min: settings.parse(None, "BERTH_MODEL_RATE_PER_MIN", "600")?,
        resilience: berth_api::config::Resilience {
            connect_timeout: secs(settings, "BERTH_MODEL_CONNECT_TIMEOUT_SECS", "10")?,
            first_byte_timeout: secs(settings, "BERTH_MODEL_FIRST_BYTE_TIMEOUT_SECS", "120")?,
            idle_timeout: secs(settings, "BERTH_MODEL_IDLE_TIMEOUT_SECS", "120")?,
            max_retries: settings.parse(None, "BERTH_MODEL_MAX_RETRIES", "2")?,
            max_retry_wait: secs(settings, "BERTH_MODEL_MAX_RETRY_WAIT_SECS", "30")?,
        },
    };
    config.providers = berth_api::config::Providers::new(providers(settings)?);
    config.auto_titles = settings.parse(None, "BERTH_AUTO_TITLES", "true")?;
    config.jwt = Some(std::sync::Arc::new(jwt_keys(settings, &run_dir)?));
    config.jwt_ttl = std::time::Duration::from_secs(settings.parse(None, "BERTH_JWT_TTL_SECS", "900")?);
    let defaults = berth_api::config::Limits::default();
    config.limits = berth_api::config::Limits {
        max_in_flight: settings.parse(None, "BERTH_MAX_IN_FLIGHT", &defaults.max_in_flight.to_string())?,
        max_subscriptions: settings.parse(None, "BERTH_MAX_SUBSCRIPTIONS", &defaults.max_subscriptions.to_string())?,
        requests_per_sec: settings.parse(None, "BERTH_RATE_PER_SEC", &defaults.requests_per_sec.to_string())?,
        request_burst: settings.parse(None, "BERTH_RATE_BURST", &defaults.request_burst.to_string())?,
        max_connections_per_credential: settings.parse(
            None,
            "BERTH_MAX_CONNECTIONS_PER_CREDENTIAL",
            &defaults.max_connections_per_credential.to_string(),
        )?,
        max_json_depth: settings.parse(None, "BERTH_MAX_JSON_DEPTH", &defaults.max_json_depth.to_string())?,
        ping_interval: std::time::Duration::from_secs(settings.parse(None, "BERTH_WS_PING_SECS", "20")?),
        idle_timeout: std::time::Duration::from_secs(settings.parse(None, "BERTH_WS_IDLE_SECS", "60")?),
        outbound_bytes: settings.parse(None, "BERTH_WS_OUTBOUND_BYTES", &defaults.outbound_bytes.to_string())?,
        write_timeout: std::time::Duration::from_secs(settings.parse(None, "BERTH_WS_WRITE_TIMEOUT_SECS", "30")?),
        hello_timeout: std::time::Duration::from_secs(settings.parse(None, "BERTH_HELLO_TIMEOUT_SECS", "10")?),
        max_unauthenticated_per_address: settings.parse(
            None,
            "BERTH_MAX_UNAUTHENTICATED_PER_ADDRESS",
            &defaults.max_unauthenticated_per_address.to_string(),
        )?,
        max_password_checks: settings.parse(
            None,
            "BERTH_MAX_PASSWORD_CHECKS",
            &defaults.max_password_checks.to_string(),
        )?,
        worker_max_turns: settings.parse(None, "BERTH_WORKER_MAX_TURNS", &defaults.worker_max_turns.to_string())?,
        worker_max_writes: settings.parse(None, "BERTH_WORKER_MAX_WRITES", &defaults.worker_max_writes.to_string())?,
        replica_max_turn_writes: settings.parse(
            None,
            "BERTH_TURN_WRITES_PER_REPLICA",
            &defaults.replica_max_turn_writes.to_string(),
        )?,
    };
    config.listen_probe_interval = std::time::Duration::from_secs(settings.parse(None, "BERTH_DB_PROBE_SECS", "15")?);
    config.listen_probe_timeout =
        std::time::Duration::from_secs(settings.parse(None, "BERTH_DB_PROBE_TIMEOUT_SECS", "10")?);
    config.trusted_proxies = settings
        .get(None, "BERTH_TRUSTED_PROXIES")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            // A bare address is a one-address network.
            s.parse::<ipnet::IpNet>()
                .or_else(|_| s.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .with_context(|| format!("BERTH_TRUSTED_PROXIES: {s:?} is not a CIDR or address"))
        })
        .collect::<anyhow::Result<_>>()?;
    let retention: u64 = settings.parse(None, "BERTH_RECEIPT_RETENTION_SECS", "604800")?;
    config.receipt_retention = std::time::Duration::from_secs(retention);
    let interaction_timeout: u64 = settings.parse(None, "BERTH_INTERACTION_TIMEOUT_SECS", "900")?;
    config.interaction_timeout = std::time::Duration::from_secs(interaction_timeout);
    let drain_timeout: u64 = settings.parse(None, "BERTH_DRAIN_TIMEOUT_SECS", "45")?;
    config.drain_timeout = std::time::Duration::from_secs(drain_timeout);
    config.coordinator_max_children = settings.parse(None, "BERTH_COORDINATOR_MAX_CHILDREN", "16")?;
    config.internal_url = settings.get(None, "BERTH_INTERNAL_URL");
    config.internal_listen = match settings.get(None, "BERTH_INTERNAL_LISTEN") {
        Some(v) => Some(
            v.parse()
                .with_context(|| format!("BERTH_INTERNAL_LISTEN={v:?}: expected host:port"))?,
        ),
        None => None,
    };
    anyhow::ensure!(
        config.internal_url.is_none() || config.internal_listen.is_some(),
        "BERTH_INTERNAL_URL needs BERTH_INTERNAL_LISTEN: other replicas forward worker calls to a listener of its own, not the public one"
    );
    if let Some(id) = settings.get(None, "BERTH_REPLICA_ID") {
        config.replica_id = id;
    }
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding BERTH_LISTEN {}", config.listen))?;
    let metrics_listener = tokio::net::TcpListener::bind(config.metrics_listen)
        .await
        .with_context(|| format!("binding BERTH_METRICS_LISTEN {}", config.metrics_listen))?;
    let addr = listener.local_addr()?;
    let metrics_addr = metrics_listener.local_addr()?;
    println!("berth: listening on http://{addr} (metrics on http://{metrics_addr}/metrics)");
    // Gone when this server stops (however it stops), so no client finds a dead address.
    let mut address_file = None;
    if dev {
        // The client commands run from this directory find the server and its credential.
        write_secret(&data_dir.join(DEV_ADDRESS_FILE), &format!("http://{addr}"))?;
        address_file = Some(RemovedOnDrop(data_dir.join(DEV_ADDRESS_FILE)));
        for line in dev_startup_lines(&addr.to_string(), &token_path, &config.model) {
            println!("berth: {line}");
        }
    } else {
        println!("berth: admin credential file: {}", token_path.display());
    }
    std::io::stdout().flush()?;

    let shutdown = CancellationToken::new();
    let mut worker_task = None;
    if dev {
        let worker_token = dev_worker_token(&store, &run_dir).await?;
        let cwd = std::env::current_dir()?;
        let name = cwd
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("workspace")
            .to_string();
        let (agent, tools) = worker_limits(settings, None, None)?;
        let cfg = berth_worker::WorkerConfig {
            server: format!("http://{addr}"),
            token: worker_token,
            host: hostname(),
            workspaces: vec![(name, cwd)],
            agent,
            tools,
            mcp: worker_mcp(settings)?,
            keep_out: secret_paths(settings, &[data_dir]),
        };
        let s = shutdown.clone();
        worker_task = Some(tokio::spawn(async move { berth_worker::run(cfg, s).await }));
    }
    spawn_reload(config.providers.clone(), settings.clone());
    let s = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down");
        s.cancel();
    });
    let s = shutdown.clone();
    berth_api::serve(
        config,
        store,
        listener,
        metrics_listener,
        async move { s.cancelled().await },
    )
    .await?;
    if let Some(t) = worker_task {
        let _ = t.await;
    }
    drop(address_file);
    drop(cluster);
    Ok(())
}

/// A file removed when this value is dropped: `berth dev`'s address file.
struct RemovedOnDrop(PathBuf);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The login-token signing key: `BERTH_JWT_SECRET_FILE`, else `<data-dir>/run/jwt-secret`
/// (created on first start). Replicas behind one load balancer must share one secret.
fn jwt_keys(settings: &Settings, run_dir: &Path) -> anyhow::Result<berth_api::auth::JwtKeys> {
    if let Some(path) = settings.get(None, "BERTH_JWT_SECRET_FILE") {
        return berth_api::auth::JwtKeys::from_file(&path).with_context(|| format!("BERTH_JWT_SECRET_FILE ({path})"));
    }
    let path = run_dir.join("jwt-secret");
    if !path.exists() {
        write_secret(&path, &berth_store::token::generate())?;
    }
    berth_api::auth::JwtKeys::from_file(&path)
}

/// `berth dev`'s worker credential, kept in `run/worker-token` and reused while valid.
async fn dev_worker_token(store: &Store, run_dir: &Path) -> anyhow::Result<String> {
    let path = run_dir.join("worker-token");
    if let Ok(existing) = std::fs::read_to_string(&path)
        && let Ok(Some(_)) = store.authenticate(existing.trim()).await
    {
        return Ok(existing.trim().to_string());
    }
    let tenant = store.tenant_id("default").await?;
    let created = store
        .admin_create_credential(&tenant, None, "berth dev worker", None, Actor("berth-dev"), None)
        .await?;
    let token = created.token.context("a new credential carries its plaintext")?;
    write_secret(&path, &token)?;
    Ok(token)
}

async fn worker(settings: &Settings, args: WorkerArgs) -> anyhow::Result<()> {
    let token = match &args.token_file {
        Some(f) => std::fs::read_to_string(f)
            .with_context(|| format!("reading --token-file {}", f.display()))?
            .trim()
            .to_string(),
        None => settings
            .secret("BERTH_WORKER_TOKEN")?
            .context("give --token-file or BERTH_WORKER_TOKEN")?,
    };
    let mut workspaces = Vec::new();
    for w in &args.workspaces {
        let (name, path) = match w.split_once('=') {
            Some((n, p)) => (n.to_string(), PathBuf::from(p)),
            None => {
                let p = PathBuf::from(w);
                let n = p
                    .canonicalize()?
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or("workspace")
                    .to_string();
                (n, p)
            }
        };
        let path = path
            .canonicalize()
            .with_context(|| format!("workspace {name}: {}", path.display()))?;
        workspaces.push((name, path));
    }
    let (agent, tools) = worker_limits(settings, args.max_steps.as_deref(), args.shell_timeout_secs.as_deref())?;
    let cfg = berth_worker::WorkerConfig {
        server: args.server,
        token,
        host: args.host.unwrap_or_else(hostname),
        workspaces,
        agent,
        tools,
        mcp: worker_mcp(settings)?,
        keep_out: secret_paths(
            settings,
            &args.token_file.iter().map(PathBuf::as_path).collect::<Vec<_>>(),
        ),
    };
    // The first SIGTERM (or SIGINT) drains: no new turns, the running ones go on to their
    // ends, within the drain timeout (below the deployment's grace period: the chart's and the
    // systemd unit's are 60 s); a second signal, or the timeout, stops at once.
    let drain_secs: u64 = settings.parse(None, "BERTH_WORKER_DRAIN_TIMEOUT_SECS", "50")?;
    let drain = CancellationToken::new();
    let shutdown = CancellationToken::new();
    let (d, s) = (drain.clone(), shutdown.clone());
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!(
            timeout_secs = drain_secs,
            "draining: running turns go on to their ends (a second signal stops at once)"
        );
        d.cancel();
        tokio::select! {
            _ = wait_for_signal() => tracing::info!("second signal: stopping now"),
            _ = tokio::time::sleep(std::time::Duration::from_secs(drain_secs)) => {
                tracing::warn!("drain timeout: stopping the turns still running");
            }
        }
        s.cancel();
    });
    let connected = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    if let Some(addr) = settings.get(args.health_listen.as_deref(), "BERTH_WORKER_HEALTH_LISTEN") {
        let addr: std::net::SocketAddr = addr.parse().context("BERTH_WORKER_HEALTH_LISTEN")?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding BERTH_WORKER_HEALTH_LISTEN {addr}"))?;
        tokio::spawn(worker_health(listener, connected.clone(), shutdown.clone()));
    }
    berth_worker::run_reporting(cfg, drain, shutdown, connected).await
}

/// The worker's probe endpoints: `/healthz` while the process runs, `/readyz` while it is
/// registered with the API tier (a worker that cannot reach it keeps retrying, and is alive).
async fn worker_health(
    listener: tokio::net::TcpListener,
    connected: std::sync::Arc<std::sync::atomic::AtomicBool>,
    shutdown: CancellationToken,
) {
    use axum::{http::StatusCode, routing::get};
    let app = axum::Router::new().route("/healthz", get(|| async { "ok" })).route(
        "/readyz",
        get(move || async move {
            if connected.load(std::sync::atomic::Ordering::Relaxed) {
                (StatusCode::OK, "connected")
            } else {
                (StatusCode::SERVICE_UNAVAILABLE, "not connected")
            }
        }),
    );
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await;
    if let Err(e) = served {
        tracing::warn!(error = %e, "worker health listener stopped");
    }
}

async fn admin(settings: &Settings, data_dir: &Path, cmd: Admin) -> anyhow::Result<()> {
    let (store, _cluster) = database(settings, data_dir).await?;
    store.migrate().await?;
    match cmd {
        Admin::Token(TokenCmd::Create {
            tenant,
            user,
            worker: _,
            note,
        }) => {
            let tenant = store.tenant_id(&tenant).await.context("no such tenant")?;
            let user_id = match &user {
                Some(email) => Some(store.user_id_by_email(&tenant, email).await.context("no such user")?),
                None => None,
            };
            let created = store
                .admin_create_credential(&tenant, user_id.as_deref(), &note, None, Actor("cli"), None)
                .await
                .context("creating the credential")?;
            let token = created.token.context("a new credential carries its plaintext")?;
            println!("{token}");
        }
        Admin::Token(TokenCmd::List { tenant }) => {
            let tenant = store.tenant_id(&tenant).await.context("no such tenant")?;
            for c in store.admin_list_credentials(&tenant).await? {
                let state = if c.revoked_at.is_some() { "revoked" } else { "active" };
                println!(
                    "{}\t{}\t{}\t{}\t{}\tcreated={}\tlast-used={}\texpires={}",
                    c.credential_id,
                    c.kind,
                    state,
                    c.user_email.as_deref().unwrap_or("-"),
                    c.note,
                    c.created_at,
                    c.last_used_at.as_deref().unwrap_or("-"),
                    c.expires_at.as_deref().unwrap_or("-"),
                );
            }
        }
        Admin::Token(TokenCmd::Revoke { id }) => {
            let tenant = store.credential_tenant(&id).await.context("no such credential")?;
            store
                .admin_revoke_credential(&tenant, &id, Actor("cli"), None)
                .await
                .context("revoking the credential")?;
            println!("revoked {id}");
        }
        Admin::Tenant(TenantCmd::Create { name }) => {
            println!("{}", store.create_tenant(&name).await?)
        }
        Admin::User(UserCmd::Create {
            tenant,
            email,
            admin,
            password_stdin,
        }) => {
            let tenant = store.tenant_id(&tenant).await.context("no such tenant")?;
            let hash = if password_stdin {
                Some(password_hash_from_stdin()?)
            } else {
                None
            };
            let role = if admin { "admin" } else { "member" };
            let user = store
                .admin_create_user(&tenant, &email, role, hash.as_deref(), Actor("cli"), None)
                .await?;
            println!("{}", user.user_id);
        }
        Admin::User(UserCmd::SetPassword { tenant, email }) => {
            let tenant = store.tenant_id(&tenant).await.context("no such tenant")?;
            let hash = password_hash_from_stdin()?;
            store
                .set_password(&tenant, &email, &hash, Actor("cli"))
                .await
                .context("no such user")?;
            println!("password set");
        }
    }
    Ok(())
}

/// Read a password from the first line of standard input and hash it (argon2id).
fn password_hash_from_stdin() -> anyhow::Result<String> {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    let password = line.trim_end_matches(['\n', '\r']);
    anyhow::ensure!(
        password.chars().count() >= 12,
        "the password must have at least 12 characters"
    );
    Ok(berth_api::auth::hash_password(password))
}

/// Write a secret file readable only by its owner (0600), replacing any previous one.
fn write_secret(path: &Path, secret: &str) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    writeln!(f, "{secret}")?;
    Ok(())
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `berth dev` run from the home directory (or any directory holding the user's data
    /// directory) keeps its data outside the workspace it serves.
    #[test]
    fn the_dev_data_dir_is_never_inside_the_workspace() {
        let dir = |cwd: &str, xdg: Option<&str>, home: Option<&str>| {
            dev_data_dir_from(
                Path::new(cwd),
                data_bases_from(xdg.map(PathBuf::from), home.map(PathBuf::from), 1000),
            )
        };
        let under = |d: PathBuf, base: &str| d.starts_with(base) && d.parent().unwrap().ends_with("berth/dev");
        assert!(under(
            dir("/home/u/proj", Some("/home/u/.xdg"), Some("/home/u")),
            "/home/u/.xdg"
        ));
        assert!(under(
            dir("/home/u/proj", None, Some("/home/u")),
            "/home/u/.local/share"
        ));
        // From the home directory: both bases are inside it.
        assert!(under(
            dir("/home/u", Some("/home/u/.xdg"), Some("/home/u")),
            "/var/tmp/berth-1000"
        ));
        assert!(under(dir("/home/u", Some("/data"), Some("/home/u")), "/data"));
        // Relative values are not bases.
        assert!(under(dir("/w", Some("rel"), Some("also-rel")), "/var/tmp/berth-1000"));
    }
}
