//! Client commands against a remote Berth (`berth login`, `workspaces`, `sessions`, `chat`,
//! `history`, `stop`, `schema`), on top of `berth-client`. Human output by default,
//! `--json` for scripts.

use std::{
    collections::HashMap,
    io::{BufRead, Write},
    os::unix::fs::OpenOptionsExt,
    path::PathBuf,
};

use anyhow::Context;
use berth_client::{
    Client,
    method::{
        SessionCreate, SessionFork, SessionGet, SessionHistory, SessionList, SessionSearch, SessionSend, SessionSource,
        SessionStop, WorkspaceList,
    },
    protocol::{
        Event, EventPayload, LiveItem, RowKind, SessionCreateParams, SessionForkParams, SessionHistoryParams,
        SessionListParams, SessionRef, SessionSearchParams, SessionSendParams, SessionSourceParams, SessionStopParams,
        WatchItem,
    },
};
use serde::{Deserialize, Serialize};

#[derive(clap::Args, Clone)]
pub struct Remote {
    /// The server, e.g. https://berth.example.com (default: the one `berth login` stored).
    #[arg(long, env = "BERTH_SERVER")]
    server: Option<String>,
    /// File holding a credential (default: the one `berth login` stored).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Machine-readable output (JSON, one value or one item per line).
    #[arg(long)]
    json: bool,
}

#[derive(clap::Subcommand)]
pub enum ClientCommand {
    /// Sign in with email and password (read from standard input) and store the token
    /// (mode 0600) for the other client commands.
    Login {
        #[arg(long)]
        server: String,
        /// Tenant name or id.
        #[arg(long, default_value = "default")]
        tenant: String,
        #[arg(long)]
        email: String,
    },
    /// List workspaces.
    Workspaces(Remote),
    /// List sessions, newest first.
    Sessions {
        #[command(flatten)]
        remote: Remote,
        #[arg(long)]
        workspace: Option<String>,
    },
    /// Chat in a session (a new one in --workspace when none is given): each line of
    /// standard input is a prompt; the answer streams as it arrives. Ctrl-C stops the turn.
    Chat {
        #[command(flatten)]
        remote: Remote,
        session: Option<String>,
        #[arg(long)]
        workspace: Option<String>,
    },
    /// Print a session's history.
    History {
        #[command(flatten)]
        remote: Remote,
        session: String,
    },
    /// Search a session's rows for a literal text.
    Search {
        #[command(flatten)]
        remote: Remote,
        session: String,
        query: String,
        #[arg(long)]
        case_sensitive: bool,
        #[arg(long)]
        whole_word: bool,
    },
    /// Fork a session from a settled turn (or all of its current history).
    Fork {
        #[command(flatten)]
        remote: Remote,
        session: String,
        turn: Option<String>,
    },
    /// Stop a running turn.
    Stop {
        #[command(flatten)]
        remote: Remote,
        session: String,
        turn: String,
    },
    /// Print the protocol's JSON Schema (or its TypeScript declarations).
    Schema {
        #[arg(long)]
        typescript: bool,
    },
}

/// What `berth login` stores.
#[derive(Serialize, Deserialize)]
struct Stored {
    server: String,
    token: String,
}

fn credentials_path() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("BERTH_CONFIG_DIR") {
        return Ok(PathBuf::from(dir).join("credentials.json"));
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .context("no HOME or XDG_CONFIG_HOME to store credentials in (set BERTH_CONFIG_DIR)")?;
    Ok(base.join("berth").join("credentials.json"))
}

async fn connect(remote: &Remote) -> anyhow::Result<Client> {
    let stored: Option<Stored> = std::fs::read(credentials_path()?)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    let server = remote
        .server
        .clone()
        .or_else(|| stored.as_ref().map(|s| s.server.clone()))
        .context("no server: pass --server or run `berth login`")?;
    let token = match &remote.token_file {
        Some(f) => std::fs::read_to_string(f)
            .with_context(|| format!("reading {}", f.display()))?
            .trim()
            .to_string(),
        None => stored
            .map(|s| s.token)
            .context("no credential: pass --token-file or run `berth login`")?,
    };
    Ok(Client::connect(&server, &token).await?)
}

fn print_json(v: &impl Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string(v)?);
    Ok(())
}

pub async fn run(cmd: ClientCommand) -> anyhow::Result<()> {
    match cmd {
        ClientCommand::Schema { typescript } => {
            let doc = berth_protocol::schema::document();
            if typescript {
                print!("{}", berth_protocol::schema::typescript(&doc));
            } else {
                println!("{}", serde_json::to_string_pretty(&doc)?);
            }
            Ok(())
        }
        ClientCommand::Login { server, tenant, email } => {
            let mut password = String::new();
            std::io::stdin().lock().read_line(&mut password)?;
            let password = password.trim_end_matches(['\r', '\n']);
            let login = berth_client::login(&server, &tenant, &email, password).await?;
            let path = credentials_path()?;
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let stored = Stored {
                server,
                token: login.token,
            };
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&path)?;
            file.write_all(&serde_json::to_vec(&stored)?)?;
            eprintln!("signed in as {email}; token stored in {}", path.display());
            Ok(())
        }
        ClientCommand::Workspaces(remote) => {
            let client = connect(&remote).await?;
            let list = client.call::<WorkspaceList>(Default::default()).await?;
            if remote.json {
                return print_json(&list);
            }
            for w in list {
                let state = if w.online { "online" } else { "offline" };
                println!("{}  {}  {}:{}  {state}", w.workspace_id, w.title, w.host, w.path);
            }
            Ok(())
        }
        ClientCommand::Sessions { remote, workspace } => {
            let client = connect(&remote).await?;
            let mut params = SessionListParams {
                workspace_id: workspace,
                ..Default::default()
            };
            loop {
                let page = client.call::<SessionList>(params.clone()).await?;
                for s in &page.entries {
                    if remote.json {
                        print_json(s)?;
                    } else {
                        let phase = serde_json::to_value(s.phase)?;
                        let title = if s.title.is_empty() { "(untitled)" } else { &s.title };
                        println!(
                            "{}  {title}  {}  {} messages  {}",
                            s.session_id,
                            phase.as_str().unwrap_or(""),
                            s.message_count,
                            s.updated_at
                        );
                    }
                }
                match page.next_after {
                    Some(after) => params.after = Some(after),
                    None => return Ok(()),
                }
            }
        }
        ClientCommand::History { remote, session } => {
            let client = connect(&remote).await?;
            let mut params = SessionHistoryParams {
                session_id: session,
                ..Default::default()
            };
            loop {
                let page = client.call::<SessionHistory>(params.clone()).await?;
                for row in &page.rows {
                    if remote.json {
                        print_json(row)?;
                    } else {
                        println!("{}", render_row(row));
                    }
                }
                match page.next_after {
                    Some(after) => {
                        params.through = Some(page.through);
                        params.after = Some(after);
                    }
                    None => return Ok(()),
                }
            }
        }
        ClientCommand::Search {
            remote,
            session,
            query,
            case_sensitive,
            whole_word,
        } => {
            let client = connect(&remote).await?;
            let mut params = SessionSearchParams {
                session_id: session.clone(),
                query,
                case_sensitive,
                whole_word,
                through: None,
                after: None,
            };
            loop {
                let page = client.call::<SessionSearch>(params.clone()).await?;
                for hit in &page.hits {
                    if remote.json {
                        print_json(hit)?;
                        continue;
                    }
                    // The hit's text, as `session.source` reads it.
                    let source = client
                        .call::<SessionSource>(SessionSourceParams {
                            session_id: session.clone(),
                            position: hit.position,
                            field: hit.field,
                            offset: hit.start,
                            limit: Some(u32::try_from(hit.end - hit.start).unwrap_or(u32::MAX)),
                        })
                        .await?;
                    let field = serde_json::to_value(hit.field)?;
                    println!(
                        "{}:{} {} {}..{}  {}",
                        hit.position.source_sequence,
                        hit.position.item_index,
                        field.as_str().unwrap_or(""),
                        hit.start,
                        hit.end,
                        source.data
                    );
                }
                match page.next_after {
                    Some(after) => {
                        params.through = Some(page.through);
                        params.after = Some(after);
                    }
                    None => return Ok(()),
                }
            }
        }
        ClientCommand::Fork { remote, session, turn } => {
            let client = connect(&remote).await?;
            let snapshot = client
                .call::<SessionGet>(SessionRef {
                    session_id: session.clone(),
                })
                .await?;
            let forked = client
                .call::<SessionFork>(SessionForkParams {
                    session_id: session,
                    turn_id: turn,
                    source_revision: snapshot.history_revision,
                    operation_id: berth_client::new_operation_id(),
                })
                .await?;
            if remote.json {
                return print_json(&forked);
            }
            println!("{}", forked.session_id);
            Ok(())
        }
        ClientCommand::Stop { remote, session, turn } => {
            let client = connect(&remote).await?;
            let stopped = client
                .call::<SessionStop>(SessionStopParams {
                    session_id: session,
                    turn_id: turn,
                    operation_id: None,
                })
                .await?;
            if remote.json {
                return print_json(&stopped);
            }
            println!("{} {}", stopped.turn_id, stopped.state.as_str());
            Ok(())
        }
        ClientCommand::Chat {
            remote,
            session,
            workspace,
        } => chat(remote, session, workspace).await,
    }
}

fn render_row(row: &berth_client::protocol::Row) -> String {
    match row.kind {
        RowKind::User => format!("> {}", row.body),
        RowKind::Assistant => row.body.clone(),
        RowKind::ToolCall => format!("[tool {}] {}", row.tool.as_ref().map_or("?", |t| &t.name), row.body),
        RowKind::ToolResult => format!("[result] {}", row.body),
        RowKind::Notice => format!("[notice] {}", row.body),
        RowKind::Handoff => format!("[summary of earlier history] {}", row.body),
    }
}

/// The streamed text of the turn in progress: how many bytes of each model step were
/// printed, so that deltas (which carry their byte offset) and the completed step's row
/// print every byte once, across reconnects and resyncs.
#[derive(Default)]
struct Printed {
    /// (turn, step) → bytes of text printed.
    text: HashMap<(String, i64), usize>,
    /// Steps completed per turn (the next `model.completed` is that step).
    steps: HashMap<String, i64>,
}

impl Printed {
    fn piece(&mut self, turn: &str, step: i64, offset: usize, text: &str) -> String {
        let done = self.text.entry((turn.to_string(), step)).or_default();
        let end = offset + text.len();
        if offset > *done || end <= *done || !text.is_char_boundary(*done - offset) {
            return String::new();
        }
        let out = text[*done - offset..].to_string();
        *done = end;
        out
    }

    fn event(&mut self, ev: &Event, out: &mut impl Write) -> std::io::Result<()> {
        let turn = ev.turn_id.clone().unwrap_or_default();
        if let EventPayload::ModelCompleted(_) = ev.payload {
            let step = *self.steps.get(&turn).unwrap_or(&0);
            self.steps.insert(turn.clone(), step + 1);
            for row in &ev.rows {
                match row.kind {
                    RowKind::Assistant => {
                        let rest = self.piece(&turn, step, 0, &row.body);
                        write!(out, "{rest}")?;
                        writeln!(out)?;
                    }
                    RowKind::ToolCall => writeln!(out, "{}", render_row(row))?,
                    _ => {}
                }
            }
        } else {
            for row in &ev.rows {
                if matches!(row.kind, RowKind::ToolResult | RowKind::Notice) {
                    writeln!(out, "{}", render_row(row))?;
                }
            }
        }
        out.flush()
    }
}

async fn chat(remote: Remote, session: Option<String>, workspace: Option<String>) -> anyhow::Result<()> {
    let client = connect(&remote).await?;
    let session = match session {
        Some(s) => s,
        None => {
            let workspace = workspace.context("give a SESSION or --workspace to start one in")?;
            let s = client
                .call::<SessionCreate>(SessionCreateParams {
                    workspace_id: workspace,
                    ..Default::default()
                })
                .await?;
            eprintln!("session {}", s.session_id);
            s.session_id
        }
    };
    let snapshot = client
        .call::<SessionGet>(SessionRef {
            session_id: session.clone(),
        })
        .await?;
    // Follow from now: history before this chat is `berth history`.
    let mut watch = client.watch(&session, snapshot.sequence);
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut printed = Printed::default();
    let stdout = std::io::stdout();
    loop {
        // Ctrl-C between turns ends the chat (within one it stops the turn).
        let prompt = tokio::select! {
            line = lines.recv() => line,
            _ = tokio::signal::ctrl_c() => None,
        };
        let Some(prompt) = prompt else { break };
        if prompt.trim().is_empty() {
            continue;
        }
        let sent = client
            .call::<SessionSend>(SessionSendParams {
                session_id: session.clone(),
                prompt,
                attachments: Vec::new(),
                operation_id: None,
            })
            .await?;
        if remote.json {
            print_json(&sent)?;
        }
        let mut stopping = false;
        loop {
            let item = tokio::select! {
                item = watch.next_item() => item,
                _ = tokio::signal::ctrl_c(), if !stopping => {
                    stopping = true;
                    client.call::<SessionStop>(SessionStopParams {
                        session_id: session.clone(),
                        turn_id: sent.turn_id.clone(),
                        operation_id: None,
                    }).await.ok();
                    continue;
                }
            };
            let Some(item) = item else {
                anyhow::bail!("the session's watch ended");
            };
            let item = item?;
            if remote.json {
                print_json(&item)?;
            }
            let mut out = stdout.lock();
            match &item {
                WatchItem::Live(LiveItem::ModelDelta(d)) if !remote.json => {
                    if let (Some(text), Some(offset)) = (&d.text, d.text_offset) {
                        let piece = printed.piece(&d.turn_id, d.step, offset as usize, text);
                        write!(out, "{piece}")?;
                        out.flush()?;
                    }
                }
                WatchItem::Event(ev) => {
                    if !remote.json {
                        printed.event(ev, &mut out)?;
                    }
                    if let EventPayload::TurnEnded(end) = &ev.payload
                        && ev.turn_id.as_deref() == Some(sent.turn_id.as_str())
                    {
                        if !remote.json && end.state != berth_client::protocol::TurnState::Completed {
                            writeln!(out, "[turn {}]", end.state.as_str())?;
                        }
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_pieces_print_every_byte_once() {
        let mut p = Printed::default();
        assert_eq!(p.piece("t", 0, 0, "Hel"), "Hel");
        // A repeat after a reconnect (from offset 0) prints only what is new.
        assert_eq!(p.piece("t", 0, 0, "Hello"), "lo");
        assert_eq!(p.piece("t", 0, 3, "lo"), "");
        // A piece beyond what was printed (a gap) waits for the completed row.
        assert_eq!(p.piece("t", 0, 9, "x"), "");
        assert_eq!(p.piece("t", 0, 0, "Hello world"), " world");
        assert_eq!(p.piece("t", 1, 0, "next"), "next");
    }
}
