//! Client commands against a remote Berth (`berth login`, `workspaces`, `sessions`, `chat`,
//! `history`, `stop`, `schema`), on top of `berth-client`. Human output by default,
//! `--json` for scripts.

mod chat;
mod doctor;
mod remote;
mod render;

use std::{
    io::{BufRead, IsTerminal},
    path::PathBuf,
};

use anyhow::Context;
use berth_client::{
    method::{SessionFork, SessionGet, SessionHistory, SessionList, SessionSearch, SessionSource, SessionStop},
    protocol::{
        SessionForkParams, SessionHistoryParams, SessionListParams, SessionRef, SessionSearchParams,
        SessionSourceParams, SessionStopParams,
    },
};
use serde::Serialize;

use remote::{Explain, Stored, Subject, connect, connect_to, session_id, workspace_id};
pub use remote::{Remote, credentials_path};
use render::Style;

#[derive(clap::Subcommand)]
pub enum ClientCommand {
    /// Sign in with email and password and store the token (mode 0600) for the other
    /// client commands. The password is read from the terminal without echo (from standard
    /// input when it is not a terminal).
    Login {
        /// The server (default: the `berth dev` serving this directory, else
        /// http://127.0.0.1:8790).
        #[arg(long)]
        server: Option<String>,
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
        /// Only this workspace's (an id or a title).
        #[arg(long)]
        workspace: Option<String>,
    },
    /// Chat in a session (id or title; without one, a new session in --workspace, else in
    /// the workspace holding the current directory): each line of standard input is a
    /// prompt; the answer streams as it arrives; a tool call held for approval is asked
    /// inline (answer y or n). Ctrl-C stops the turn. Exits non-zero when a turn failed.
    Chat {
        #[command(flatten)]
        remote: Remote,
        session: Option<String>,
        /// Start the new session in this workspace (an id or a title).
        #[arg(long)]
        workspace: Option<String>,
    },
    /// Print a session's history (SESSION: an id or a title).
    History {
        #[command(flatten)]
        remote: Remote,
        session: String,
    },
    /// Search a session's rows for a literal text: each match's line, the match marked.
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
    /// Check the setup: the server answers, the credential signs in, the model endpoint
    /// answers, a worker is online. One line each, with the next step when one fails.
    Doctor(Remote),
    /// Print a shell completion script: `source <(berth completions bash)`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
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

pub(crate) fn print_json(v: &impl Serialize) -> anyhow::Result<()> {
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
            let server = server
                .or_else(|| remote::local_dev().map(|d| d.server))
                .unwrap_or_else(|| remote::DEFAULT_SERVER.to_string());
            let password = read_password()?;
            let login = berth_client::login(&server, &tenant, &email, &password)
                .await
                .map_err(|e| match e {
                    berth_client::Error::Unauthorized => anyhow::anyhow!(
                        "{} refused the sign-in (unauthorized): check the email, password and tenant ({tenant}); \
                         an admin sets a password with `berth admin user set-password`",
                        remote::shown(&server)
                    ),
                    e => remote::explain(e, &remote::shown(&server), Subject::None),
                })?;
            let path = remote::store_credentials(&Stored {
                server: server.clone(),
                token: login.token,
            })?;
            eprintln!(
                "signed in to {} as {email}; token stored in {}",
                remote::shown(&server),
                path.display()
            );
            Ok(())
        }
        ClientCommand::Workspaces(remote) => {
            let client = connect(&remote).await?;
            let list = remote::workspaces(&client).await?;
            if remote.json {
                return print_json(&list);
            }
            let style = Style::for_stdout(false);
            for w in list {
                let state = if w.online {
                    style.green("online")
                } else {
                    style.dim("offline")
                };
                println!(
                    "{}  {}  {}:{}  {state}",
                    w.workspace_id,
                    style.bold(&render::safe(&w.title)),
                    render::safe(&w.host),
                    render::safe(&w.path)
                );
            }
            Ok(())
        }
        ClientCommand::Sessions { remote, workspace } => {
            let client = connect(&remote).await?;
            let workspace_id = match workspace {
                Some(w) => Some(workspace_id(&client, &w).await?),
                None => None,
            };
            let mut params = SessionListParams {
                workspace_id: workspace_id.clone(),
                ..Default::default()
            };
            let style = Style::for_stdout(remote.json);
            let subject = workspace_id.as_deref().map_or(Subject::None, Subject::Workspace);
            loop {
                let page = client
                    .call::<SessionList>(params.clone())
                    .await
                    .explain(&client, subject)?;
                for s in &page.entries {
                    if remote.json {
                        print_json(s)?;
                    } else {
                        let phase = serde_json::to_value(s.phase)?;
                        let title = if s.title.is_empty() {
                            "(untitled)".into()
                        } else {
                            render::safe(&s.title)
                        };
                        println!(
                            "{}  {}  {}  {} messages  {}",
                            s.session_id,
                            style.bold(&title),
                            phase.as_str().unwrap_or(""),
                            s.message_count,
                            style.dim(&s.updated_at)
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
            let session = session_id(&client, &session).await?;
            let style = Style::for_stdout(remote.json);
            let mut params = SessionHistoryParams {
                session_id: session.clone(),
                ..Default::default()
            };
            loop {
                let page = client
                    .call::<SessionHistory>(params.clone())
                    .await
                    .explain(&client, Subject::Session(&session))?;
                for row in &page.rows {
                    if remote.json {
                        print_json(row)?;
                    } else {
                        println!("{}", render::render_row(style, row));
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
            let session = session_id(&client, &session).await?;
            let style = Style::for_stdout(remote.json);
            let mut params = SessionSearchParams {
                session_id: session.clone(),
                query,
                case_sensitive,
                whole_word,
                through: None,
                after: None,
            };
            let mut found = false;
            loop {
                let page = client
                    .call::<SessionSearch>(params.clone())
                    .await
                    .explain(&client, Subject::Session(&session))?;
                for hit in &page.hits {
                    found = true;
                    if remote.json {
                        print_json(hit)?;
                        continue;
                    }
                    // The field up to a little past the match (whole, for ordinary rows), as
                    // `session.source` reads it; the match's own bytes when it lies deeper.
                    let whole = hit.end + 1024 <= SOURCE_MAX;
                    let (offset, limit) = if whole {
                        (0, hit.end + 1024)
                    } else {
                        (hit.start, hit.end - hit.start)
                    };
                    let source = client
                        .call::<SessionSource>(SessionSourceParams {
                            session_id: session.clone(),
                            position: hit.position,
                            field: hit.field,
                            offset,
                            limit: Some(u32::try_from(limit).unwrap_or(u32::MAX)),
                        })
                        .await
                        .explain(&client, Subject::Session(&session))?;
                    let (start, end) = ((hit.start - offset) as usize, (hit.end - offset) as usize);
                    let field = serde_json::to_value(hit.field)?;
                    println!(
                        "{} {}",
                        style.dim(&format!(
                            "{}:{} {}:",
                            hit.position.source_sequence,
                            hit.position.item_index,
                            field.as_str().unwrap_or("")
                        )),
                        matching_line(style, &source.data, start, end)
                    );
                }
                match page.next_after {
                    Some(after) => {
                        params.through = Some(page.through);
                        params.after = Some(after);
                    }
                    None => break,
                }
            }
            if !found && !remote.json {
                eprintln!("no matches");
            }
            Ok(())
        }
        ClientCommand::Fork { remote, session, turn } => {
            let client = connect(&remote).await?;
            let session = session_id(&client, &session).await?;
            let snapshot = client
                .call::<SessionGet>(SessionRef {
                    session_id: session.clone(),
                })
                .await
                .explain(&client, Subject::Session(&session))?;
            let subject = turn.as_deref().map_or(Subject::Session(&session), Subject::Turn);
            let forked = client
                .call::<SessionFork>(SessionForkParams {
                    session_id: session.clone(),
                    turn_id: turn.clone(),
                    source_revision: snapshot.history_revision,
                    operation_id: berth_client::new_operation_id(),
                })
                .await
                .explain(&client, subject)?;
            if remote.json {
                return print_json(&forked);
            }
            println!("{}", forked.session_id);
            Ok(())
        }
        ClientCommand::Stop { remote, session, turn } => {
            let client = connect(&remote).await?;
            let session = session_id(&client, &session).await?;
            let turn = match turn {
                Some(t) => t,
                None => client
                    .call::<SessionGet>(SessionRef {
                        session_id: session.clone(),
                    })
                    .await
                    .explain(&client, Subject::Session(&session))?
                    .running
                    .with_context(|| format!("no turn is running in {session}: nothing to stop"))?,
            };
            let stopped = client
                .call::<SessionStop>(SessionStopParams {
                    session_id: session.clone(),
                    turn_id: turn.clone(),
                    operation_id: None,
                })
                .await
                .explain(&client, Subject::Turn(&turn))?;
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
        } => chat::chat(remote, session, workspace).await,
        ClientCommand::Whoami(remote) => {
            let client = connect(&remote).await?;
            let me = client
                .call::<berth_client::method::Hello>(berth_protocol::HelloParams {
                    protocol: berth_protocol::PROTOCOL_VERSION,
                    token: None,
                    client: None,
                })
                .await
                .explain(&client, Subject::None)?;
            if remote.json {
                return print_json(&me);
            }
            let who = me
                .email
                .as_deref()
                .or(me.user_id.as_deref())
                .unwrap_or("a credential without a user");
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
        ClientCommand::Doctor(remote) => doctor::doctor(remote).await,
        ClientCommand::Completions { shell } => {
            let mut cmd = <crate::Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "berth", &mut std::io::stdout());
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

/// The server `berth login` stored, if any.
pub fn stored_server() -> Option<String> {
    remote::stored_credentials().map(|s| s.server)
}

/// The most `session.source` returns in one read.
const SOURCE_MAX: u64 = 1 << 20;

/// The line of `text` holding the match at bytes `[start, end)`, the match marked (bold at a
/// terminal, else as is), cut to about 80 characters either side of it.
fn matching_line(style: Style, text: &str, start: usize, end: usize) -> String {
    let (start, end) = (start.min(text.len()), end.min(text.len()));
    if !text.is_char_boundary(start) || !text.is_char_boundary(end) {
        return render::safe(text).into_owned();
    }
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[end..].find('\n').map_or(text.len(), |i| end + i);
    let before = &text[line_start..start];
    let after = &text[end..line_end];
    let before_chars = before.chars().count();
    let before = if before_chars > 80 {
        format!("…{}", before.chars().skip(before_chars - 80).collect::<String>())
    } else {
        before.to_string()
    };
    let after = if after.chars().count() > 80 {
        format!("{}…", after.chars().take(80).collect::<String>())
    } else {
        after.to_string()
    };
    let matched = render::safe(&text[start..end]);
    let matched = if style.colour {
        format!("\x1b[1;31m{matched}\x1b[0m")
    } else {
        matched.into_owned()
    };
    format!("{}{matched}{}", render::safe(&before), render::safe(&after))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_match_is_shown_in_its_line() {
        let plain = Style { colour: false };
        let text = "first line\nsecond has the word here\nthird";
        let start = text.find("word").unwrap();
        assert_eq!(matching_line(plain, text, start, start + 4), "second has the word here");
        let long = format!("{}needle{}", "a".repeat(200), "b".repeat(200));
        let line = matching_line(plain, &long, 200, 206);
        assert!(
            line.starts_with('…') && line.ends_with('…') && line.contains("needle"),
            "{line}"
        );
        let bold = matching_line(Style { colour: true }, text, start, start + 4);
        assert!(bold.contains("\x1b[1;31mword\x1b[0m"), "{bold}");
    }
}
