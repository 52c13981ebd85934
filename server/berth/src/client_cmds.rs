//! Client commands against a remote Berth (`berth login`, `workspaces`, `sessions`, `chat`,
//! `history`, `stop`, `schema`), on top of `berth-client`. Human output by default,
//! `--json` for scripts.

use std::{
    collections::{HashMap, VecDeque},
    io::{BufRead, IsTerminal, Write},
    os::unix::fs::OpenOptionsExt,
    path::PathBuf,
};

use anyhow::Context;
use berth_client::{
    Client,
    method::{
        SessionCreate, SessionFork, SessionGet, SessionHistory, SessionList, SessionRespond, SessionSearch,
        SessionSend, SessionSource, SessionStop, WorkspaceList,
    },
    protocol::{
        Event, EventPayload, INTERACTION_APPROVAL, Interaction, InteractionKind, LiveItem, RowKind,
        SessionCreateParams, SessionForkParams, SessionHistoryParams, SessionListParams, SessionRef,
        SessionRespondParams, SessionSearchParams, SessionSendParams, SessionSourceParams, SessionStopParams,
        WatchItem,
    },
};
use serde::{Deserialize, Serialize};

use crate::pieces::Pieces;

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
    /// Sign in with email and password and store the token (mode 0600) for the other
    /// client commands. The password is read from the terminal without echo (from standard
    /// input when it is not a terminal).
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
    /// standard input is a prompt; the answer streams as it arrives; a tool call held for
    /// approval is asked inline (answer y or n). Ctrl-C stops the turn.
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
    /// Stop a running turn (the one running now when no turn is named).
    Stop {
        #[command(flatten)]
        remote: Remote,
        session: String,
        turn: Option<String>,
    },
    /// Who the stored (or given) credential signs in as, and where.
    Whoami(Remote),
    /// Forget the credential `berth login` stored.
    Logout,
    /// This program's version and the protocol it speaks.
    Version,
    /// Be an Agent Client Protocol agent on stdio (for editors such as Zed) whose sessions
    /// are this server's: each ACP session is a Berth session.
    Acp {
        /// The server, e.g. https://berth.example.com (default: the one `berth login` stored).
        #[arg(long, env = "BERTH_SERVER")]
        server: Option<String>,
        /// File holding a credential (default: the one `berth login` stored).
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// Start every new session in this workspace (an id or a title).
        #[arg(long)]
        workspace: Option<String>,
        /// DIR=WORKSPACE: a session started in DIR or below goes to WORKSPACE (repeatable).
        /// Without either option, the workspace whose path holds the editor's directory.
        #[arg(long = "map", value_parser = crate::acp::WorkspaceChoice::parse_map)]
        maps: Vec<(PathBuf, String)>,
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
    connect_to(remote.server.as_deref(), remote.token_file.as_deref()).await
}

/// The `berth dev` serving the current directory (or a directory above it): its address
/// and admin credential, from its data directory. None when there is none.
fn local_dev() -> Option<Stored> {
    let cwd = std::env::current_dir().ok()?.canonicalize().ok()?;
    cwd.ancestors().find_map(|dir| {
        let data = crate::dev_data_dir(dir);
        let server = std::fs::read_to_string(data.join(crate::DEV_ADDRESS_FILE)).ok()?;
        let token = std::fs::read_to_string(data.join("run/token")).ok()?;
        Some(Stored {
            server: server.trim().to_string(),
            token: token.trim().to_string(),
        })
    })
}

/// Connect with the given server and credential file, or what `berth login` stored, or —
/// with neither — the `berth dev` serving the current directory.
async fn connect_to(server: Option<&str>, token_file: Option<&std::path::Path>) -> anyhow::Result<Client> {
    let stored: Option<Stored> = std::fs::read(credentials_path()?)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .or_else(|| {
            if server.is_none() && token_file.is_none() {
                local_dev()
            } else {
                None
            }
        });
    let server = server
        .map(str::to_string)
        .or_else(|| stored.as_ref().map(|s| s.server.clone()))
        .context("no server: pass --server, run `berth login`, or run `berth dev` in this directory")?;
    let token = match token_file {
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
            let password = read_password()?;
            let login = berth_client::login(&server, &tenant, &email, &password).await?;
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
            let turn = match turn {
                Some(t) => t,
                None => client
                    .call::<SessionGet>(SessionRef {
                        session_id: session.clone(),
                    })
                    .await?
                    .running
                    .with_context(|| format!("no turn is running in {session}"))?,
            };
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
        ClientCommand::Whoami(remote) => {
            let client = connect(&remote).await?;
            let me = client
                .call::<berth_client::method::Hello>(berth_protocol::HelloParams {
                    protocol: berth_protocol::PROTOCOL_VERSION,
                    token: None,
                    client: None,
                })
                .await?;
            if remote.json {
                return print_json(&me);
            }
            let who = me.user_id.as_deref().unwrap_or("a credential without a user");
            println!(
                "{who} ({}) in tenant {} on {} (server {}, protocol {})",
                me.role,
                me.tenant_id,
                client.endpoints().http,
                me.server_version,
                me.protocol
            );
            Ok(())
        }
        ClientCommand::Logout => {
            let path = credentials_path()?;
            match std::fs::remove_file(&path) {
                Ok(()) => eprintln!("signed out: {} removed", path.display()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    eprintln!("not signed in (no {})", path.display())
                }
                Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
            }
            Ok(())
        }
        ClientCommand::Version => {
            println!(
                "berth {} (protocol {})",
                env!("CARGO_PKG_VERSION"),
                berth_protocol::PROTOCOL_VERSION
            );
            Ok(())
        }
        ClientCommand::Acp {
            server,
            token_file,
            workspace,
            maps,
        } => {
            let client = connect_to(server.as_deref(), token_file.as_deref()).await?;
            crate::acp::run(client, crate::acp::WorkspaceChoice { fixed: workspace, maps }).await
        }
    }
}

/// Ask about an interaction at the prompt (on stderr when stdout is JSON).
fn ask(interaction: &Interaction, json: bool) -> std::io::Result<()> {
    let question = prompt_for(interaction);
    if json {
        eprint!("{question}");
        std::io::stderr().flush()
    } else {
        let mut out = std::io::stdout().lock();
        write!(out, "{question}")?;
        out.flush()
    }
}

/// The prompt line for an interaction: an approval names its tool and input; a question
/// (the model's `ask_user`) shows its text and how to answer by kind — a numbered choice,
/// y/n, or free text — and whether it may be skipped (an empty line).
fn prompt_for(interaction: &Interaction) -> String {
    if interaction.kind == INTERACTION_APPROVAL {
        let tool = interaction.tool.as_ref().map_or("tool", |t| t.name.as_str());
        return format!("[approve {tool} {}? y/n] ", interaction.input);
    }
    let text = match interaction.input.get("question").and_then(|q| q.as_str()) {
        Some(q) => q.to_string(),
        None => interaction.input.to_string(),
    };
    let skip = interaction
        .params
        .as_ref()
        .and_then(|p| p.get("allowSkip"))
        .and_then(|a| a.as_bool())
        .unwrap_or(true);
    let skip = if skip { "; empty to skip" } else { "" };
    let options = interaction.options.as_deref().unwrap_or_default();
    match InteractionKind::parse(&interaction.kind) {
        Some(InteractionKind::Confirm) => format!("[question] {text} (y/n{skip}) "),
        Some(InteractionKind::Text) => format!("[question] {text} (your answer{skip}) "),
        _ => {
            let numbered: Vec<String> = options
                .iter()
                .enumerate()
                .map(|(i, o)| format!("{}) {o}", i + 1))
                .collect();
            format!("[question] {text} {} (number{skip}) ", numbered.join(" "))
        }
    }
}

/// The `session.respond` answer a line typed at the prompt gives: `y`/`yes` approves
/// (anything else denies); a question takes the line as its answer (empty: none): a
/// `confirm` reads y/n as `yes`/`no`, a choice also reads an option's number.
fn answer_for(interaction: &Interaction, line: &str) -> serde_json::Value {
    let line = line.trim();
    if interaction.kind == INTERACTION_APPROVAL {
        return serde_json::json!({"approved": matches!(line.to_lowercase().as_str(), "y" | "yes")});
    }
    if line.is_empty() {
        return serde_json::json!({"choice": null});
    }
    let options = interaction.options.as_deref().unwrap_or_default();
    let choice = match InteractionKind::parse(&interaction.kind) {
        Some(InteractionKind::Confirm) => match line.to_lowercase().as_str() {
            "y" | "yes" => "yes".to_string(),
            "n" | "no" => "no".to_string(),
            _ => line.to_string(),
        },
        _ => match line.parse::<usize>() {
            Ok(n) if n >= 1 && n <= options.len() && !options.iter().any(|o| o == line) => options[n - 1].clone(),
            _ => line.to_string(),
        },
    };
    serde_json::json!({"choice": choice})
}

/// The password: from the terminal with echo off, or a line of standard input (scripts).
fn read_password() -> anyhow::Result<String> {
    if std::io::stdin().is_terminal() {
        return Ok(rpassword::prompt_password("Password: ")?);
    }
    let mut password = String::new();
    std::io::stdin().lock().read_line(&mut password)?;
    Ok(password.trim_end_matches(['\r', '\n']).to_string())
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

/// The streamed text of the turn in progress (every byte printed once, see [`Pieces`]) and
/// the steps completed per turn (the next `model.completed` is that step).
#[derive(Default)]
struct Printed {
    text: Pieces,
    steps: HashMap<String, i64>,
}

impl Printed {
    fn piece(&mut self, turn: &str, step: i64, offset: usize, text: &str) -> String {
        self.text.piece(turn, step, offset, text)
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
    let mut stdin_open = true;
    let stdout = std::io::stdout();
    // A person at a terminal gets a prompt when the chat is ready for the next line.
    let interactive = std::io::stdin().is_terminal() && !remote.json;
    loop {
        if interactive {
            print!("> ");
            std::io::stdout().flush()?;
        }
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
        // Interactions waiting for an answer at the prompt, the one asked first.
        let mut asking: VecDeque<Interaction> = VecDeque::new();
        loop {
            let item = tokio::select! {
                item = watch.next_item() => item,
                line = lines.recv(), if stdin_open && !asking.is_empty() => {
                    let Some(line) = line else {
                        // Nobody left to answer: the interaction's own timeout will.
                        stdin_open = false;
                        continue;
                    };
                    let Some(interaction) = asking.pop_front() else { continue };
                    let answered = client.call::<SessionRespond>(SessionRespondParams {
                        interaction_id: interaction.interaction_id.clone(),
                        answer: answer_for(&interaction, &line),
                        operation_id: None,
                    }).await;
                    if let Err(e) = answered {
                        eprintln!("[the answer was not taken: {e}]");
                    }
                    if let Some(next) = asking.front() {
                        ask(next, remote.json)?;
                    }
                    continue;
                }
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
                    match &ev.payload {
                        EventPayload::InteractionRequested(r) => {
                            asking.push_back((*r.interaction).clone());
                            if asking.len() == 1 {
                                drop(out);
                                ask(&asking[0], remote.json)?;
                                out = stdout.lock();
                            }
                        }
                        EventPayload::InteractionResolved(r) => {
                            // Resolved other than by this prompt's answer (another client,
                            // expiry, the turn ending): stop asking.
                            if let Some(i) = asking.iter().position(|x| x.interaction_id == r.interaction_id) {
                                asking.remove(i);
                                if !remote.json {
                                    writeln!(out, "[{}]", r.state.as_str())?;
                                }
                                if i == 0
                                    && let Some(next) = asking.front()
                                {
                                    drop(out);
                                    ask(next, remote.json)?;
                                    out = stdout.lock();
                                }
                            }
                        }
                        _ => {}
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

    fn question(kind: &str, options: Option<&[&str]>, allow_skip: bool) -> Interaction {
        serde_json::from_value(serde_json::json!({
            "interactionId": "int_1", "kind": kind, "sessionId": "ses_1", "turnId": "trn_1",
            "input": {"question": "Which branch?"},
            "options": options, "params": {"allowSkip": allow_skip},
            "fallback": {"choice": null}, "createdAt": "t", "expiresAt": "t", "state": "pending",
        }))
        .unwrap()
    }

    #[test]
    fn questions_are_asked_and_answered_by_their_kind() {
        let choice = question("choice", Some(&["main", "dev"]), false);
        assert_eq!(prompt_for(&choice), "[question] Which branch? 1) main 2) dev (number) ");
        assert_eq!(answer_for(&choice, "2\n"), serde_json::json!({"choice": "dev"}));
        assert_eq!(answer_for(&choice, "main"), serde_json::json!({"choice": "main"}));
        let confirm = question("confirm", Some(&["yes", "no"]), true);
        assert_eq!(prompt_for(&confirm), "[question] Which branch? (y/n; empty to skip) ");
        assert_eq!(answer_for(&confirm, "Y"), serde_json::json!({"choice": "yes"}));
        assert_eq!(answer_for(&confirm, ""), serde_json::json!({"choice": null}));
        let text = question("text", None, true);
        assert_eq!(
            prompt_for(&text),
            "[question] Which branch? (your answer; empty to skip) "
        );
        assert_eq!(
            answer_for(&text, "feature/x"),
            serde_json::json!({"choice": "feature/x"})
        );
    }
}
