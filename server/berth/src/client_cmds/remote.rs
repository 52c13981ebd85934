//! Reaching the server: where it is and which credential to use (flags, what `berth login`
//! stored, or the `berth dev` serving the current directory), errors in words with the next
//! step, and names (titles) turned into ids.

use std::{io::Write, os::unix::fs::OpenOptionsExt, path::PathBuf};

use anyhow::Context;
use berth_client::{
    Client, Endpoints,
    method::{SessionList, WorkspaceList},
    protocol::{SessionListParams, Workspace},
};
use serde::{Deserialize, Serialize};

#[derive(clap::Args, Clone)]
pub struct Remote {
    /// The server, e.g. https://berth.example.com (default: the one `berth login` stored,
    /// else the `berth dev` serving this directory).
    #[arg(long, env = "BERTH_SERVER")]
    pub server: Option<String>,
    /// File holding a credential (default: the one `berth login` stored).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Machine-readable output (JSON, one value or one item per line).
    #[arg(long)]
    pub json: bool,
}

/// What `berth login` stores.
#[derive(Serialize, Deserialize)]
pub struct Stored {
    pub server: String,
    pub token: String,
}

/// Where the server's address `berth login` uses when none is given, and none runs here.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:8790";

pub fn credentials_path() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("BERTH_CONFIG_DIR") {
        return Ok(PathBuf::from(dir).join("credentials.json"));
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .context("no HOME or XDG_CONFIG_HOME to store credentials in (set BERTH_CONFIG_DIR)")?;
    Ok(base.join("berth").join("credentials.json"))
}

pub fn store_credentials(stored: &Stored) -> anyhow::Result<PathBuf> {
    let path = credentials_path()?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)?;
    file.write_all(&serde_json::to_vec(stored)?)?;
    Ok(path)
}

pub fn stored_credentials() -> Option<Stored> {
    std::fs::read(credentials_path().ok()?)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
}

/// The data directory of the `berth dev` serving the current directory (or a directory
/// above it): the first whose address file exists.
pub fn local_dev_dir() -> Option<PathBuf> {
    let cwd = std::env::current_dir().ok()?.canonicalize().ok()?;
    cwd.ancestors()
        .map(crate::dev_data_dir)
        .find(|data| data.join(crate::DEV_ADDRESS_FILE).exists())
}

/// The `berth dev` serving the current directory (or a directory above it): its address
/// and admin credential, from its data directory. None when there is none.
pub fn local_dev() -> Option<Stored> {
    let data = local_dev_dir()?;
    let server = std::fs::read_to_string(data.join(crate::DEV_ADDRESS_FILE)).ok()?;
    let token = std::fs::read_to_string(data.join("run/token")).ok()?;
    Some(Stored {
        server: server.trim().to_string(),
        token: token.trim().to_string(),
    })
}

/// The server and credential a command uses: the flags, else what `berth login` stored,
/// else the `berth dev` serving the current directory.
pub fn target(server: Option<&str>, token_file: Option<&std::path::Path>) -> anyhow::Result<Stored> {
    let stored = stored_credentials().or_else(|| {
        if server.is_none() && token_file.is_none() {
            local_dev()
        } else {
            None
        }
    });
    let server = server
        .map(str::to_string)
        .or_else(|| stored.as_ref().map(|s| s.server.clone()))
        .context("no server to talk to: run `berth dev` in this directory, `berth login`, or pass --server")?;
    let token = match token_file {
        Some(f) => std::fs::read_to_string(f)
            .with_context(|| format!("reading the credential file {}", f.display()))?
            .trim()
            .to_string(),
        None => stored.map(|s| s.token).with_context(|| {
            format!("no credential for {server}: run `berth login --server {server}`, or pass --token-file")
        })?,
    };
    Ok(Stored { server, token })
}

pub async fn connect(remote: &Remote) -> anyhow::Result<Client> {
    connect_to(remote.server.as_deref(), remote.token_file.as_deref()).await
}

/// Connect with the given server and credential file, or what `berth login` stored, or —
/// with neither — the `berth dev` serving the current directory.
pub async fn connect_to(server: Option<&str>, token_file: Option<&std::path::Path>) -> anyhow::Result<Client> {
    let target = target(server, token_file)?;
    Client::connect(&target.server, &target.token)
        .await
        .map_err(|e| explain(e, &shown(&target.server), Subject::None))
}

/// A server address as the messages show it (`http(s)://host:port`).
pub fn shown(server: &str) -> String {
    Endpoints::parse(server).map_or_else(|_| server.to_string(), |e| e.http)
}

/// What a call was about, for its error's words.
#[derive(Debug, Clone, Copy)]
pub enum Subject<'a> {
    None,
    Session(&'a str),
    Workspace(&'a str),
    Turn(&'a str),
}

/// A client error in words: what went wrong, where, and what to do next.
pub fn explain(e: berth_client::Error, server: &str, subject: Subject<'_>) -> anyhow::Error {
    use berth_client::Error;
    let text = match &e {
        Error::Unauthorized => format!(
            "the server at {server} refused the credential (unauthorized): run `berth login --server {server}` to sign in again"
        ),
        Error::Connect(why) => format!(
            "cannot reach a Berth server at {server} ({why}): is it running? Start one with `berth dev`, or point at another with --server"
        ),
        Error::Disconnected => format!("lost the connection to {server} and could not get it back: try again"),
        Error::Rpc(rpc) => {
            let code = rpc.data_code().unwrap_or(&rpc.message);
            match (code, subject) {
                ("not-found", Subject::Session(id)) => {
                    format!("no session {id} on {server}: `berth sessions` lists them")
                }
                ("not-found", Subject::Workspace(id)) => {
                    format!("no workspace {id} on {server}: `berth workspaces` lists them")
                }
                ("not-found", Subject::Turn(id)) => {
                    format!("no turn {id} in that session: `berth history SESSION` shows its turns")
                }
                ("not-found", Subject::None) => format!("not found on {server}"),
                ("forbidden", _) => "forbidden: this credential's role may not do that (ask a tenant admin)".into(),
                ("workspace-offline", _) => "the workspace is offline (no worker serves it): run `berth dev` in its \
                                             directory, or start its `berth worker`"
                    .into(),
                ("turn-busy", _) => {
                    "a turn is already running in that session: wait for it, or `berth stop SESSION`".into()
                }
                ("turn-not-running", _) => "no turn is running in that session".into(),
                ("rate-limited", _) => "the server is rate-limiting this credential: try again in a moment".into(),
                ("unauthorized", _) => format!(
                    "the server at {server} refused the credential (unauthorized): run `berth login --server {server}` to sign in again"
                ),
                (code, _) => {
                    let mut fields = rpc.data.clone();
                    if let Some(map) = fields.as_object_mut() {
                        map.remove("code");
                    }
                    match fields.as_object() {
                        Some(m) if !m.is_empty() => format!("{code} ({fields})"),
                        _ => code.to_string(),
                    }
                }
            }
        }
        Error::Protocol(_) | Error::Usage(_) => e.to_string(),
    };
    anyhow::anyhow!(text)
}

/// `.explain(&client, subject)` on a call's result.
pub trait Explain<T> {
    fn explain(self, client: &Client, subject: Subject<'_>) -> anyhow::Result<T>;
}

impl<T> Explain<T> for berth_client::Result<T> {
    fn explain(self, client: &Client, subject: Subject<'_>) -> anyhow::Result<T> {
        self.map_err(|e| explain(e, &client.endpoints().http, subject))
    }
}

/// A session named by id (`ses_…`) or by title.
pub async fn session_id(client: &Client, name: &str) -> anyhow::Result<String> {
    if name.starts_with("ses_") {
        return Ok(name.to_string());
    }
    let mut params = SessionListParams::default();
    let mut found = Vec::new();
    loop {
        let page = client
            .call::<SessionList>(params.clone())
            .await
            .explain(client, Subject::None)?;
        found.extend(
            page.entries
                .into_iter()
                .filter(|s| s.title == name)
                .map(|s| s.session_id),
        );
        match page.next_after {
            Some(after) => params.after = Some(after),
            None => break,
        }
    }
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => anyhow::bail!(
            "no session {name:?} on {}: `berth sessions` lists them (by id or title)",
            client.endpoints().http
        ),
        many => anyhow::bail!(
            "{} sessions are titled {name:?}: name one by id ({})",
            many.len(),
            many.join(", ")
        ),
    }
}

pub async fn workspaces(client: &Client) -> anyhow::Result<Vec<Workspace>> {
    client
        .call::<WorkspaceList>(Default::default())
        .await
        .explain(client, Subject::None)
}

/// A workspace named by id (`wsp_…`) or by title.
pub async fn workspace_id(client: &Client, name: &str) -> anyhow::Result<String> {
    if name.starts_with("wsp_") {
        return Ok(name.to_string());
    }
    let list = workspaces(client).await?;
    let found: Vec<&Workspace> = list.iter().filter(|w| w.title == name).collect();
    match found.as_slice() {
        [one] => Ok(one.workspace_id.clone()),
        [] => anyhow::bail!(
            "no workspace {name:?} on {}: `berth workspaces` lists them (by id or title)",
            client.endpoints().http
        ),
        many => anyhow::bail!(
            "{} workspaces are titled {name:?}: name one by id ({})",
            many.len(),
            many.iter()
                .map(|w| w.workspace_id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The workspace whose directory holds the current directory (the deepest, an online one
/// first).
pub async fn workspace_here(client: &Client) -> anyhow::Result<String> {
    let cwd = std::env::current_dir()?.canonicalize()?;
    let list = workspaces(client).await?;
    crate::acp::WorkspaceChoice::default().resolve(&cwd, &list).with_context(|| {
        format!(
            "no workspace on {} holds {}: run `berth dev` here, or name one with --workspace (`berth workspaces` lists them)",
            client.endpoints().http,
            cwd.display()
        )
    })
}
