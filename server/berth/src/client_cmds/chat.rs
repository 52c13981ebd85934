//! `berth chat`: each line of standard input is a prompt, the answer streams as it arrives,
//! tool calls show once on a line each, and a held call is asked about inline.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    io::{BufRead, IsTerminal, Write},
};

use berth_client::{
    Client,
    method::{SessionCreate, SessionGet, SessionRespond, SessionSend, SessionStop},
    protocol::{
        Event, EventPayload, INTERACTION_APPROVAL, Interaction, InteractionKind, LiveItem, RowKind,
        SessionCreateParams, SessionRef, SessionRespondParams, SessionSendParams, SessionStopParams, TurnState,
        WatchItem,
    },
};

use super::{
    print_json,
    remote::{Explain, Remote, Subject, connect, session_id, workspace_here, workspace_id},
    render::{Markdown, Style, approval_target, cause_words, render_row, safe, tool_call_line, tool_result_line},
};
use crate::pieces::Pieces;

/// What a line typed at an approval means: yes, no, or neither (ask again).
pub fn approval_answer(line: &str) -> Option<bool> {
    match line.trim().to_lowercase().as_str() {
        "y" | "yes" => Some(true),
        "n" | "no" => Some(false),
        _ => None,
    }
}

/// What the chat has shown: the streamed text of each step (every byte once, see
/// [`Pieces`]) rendered as markdown at a terminal, the steps completed per turn (the next
/// `model.completed` is that step), and the tool calls already on screen.
struct Printed {
    style: Style,
    text: Pieces,
    steps: HashMap<String, i64>,
    /// The step whose text is streaming, and its renderer.
    streaming: Option<((String, i64), Markdown)>,
    calls: HashSet<String>,
}

impl Printed {
    fn new(style: Style) -> Printed {
        Printed {
            style,
            text: Pieces::default(),
            steps: HashMap::new(),
            streaming: None,
            calls: HashSet::new(),
        }
    }

    /// Text for `(turn, step)` starting at byte `offset`: what was not shown yet, rendered.
    fn text(&mut self, turn: &str, step: i64, offset: usize, text: &str, out: &mut impl Write) -> std::io::Result<()> {
        let piece = self.text.piece(turn, step, offset, text);
        if piece.is_empty() {
            return Ok(());
        }
        let key = (turn.to_string(), step);
        if self.streaming.as_ref().is_none_or(|(k, _)| *k != key) {
            self.end_text(out)?;
            self.streaming = Some((key, Markdown::new(self.style)));
        }
        if let Some((_, md)) = &mut self.streaming {
            write!(out, "{}", md.push(&piece))?;
        }
        Ok(())
    }

    /// Close the text that was streaming (its styles), if any.
    fn end_text(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        if let Some((_, mut md)) = self.streaming.take() {
            write!(out, "{}", md.finish())?;
        }
        Ok(())
    }

    fn event(&mut self, ev: &Event, out: &mut impl Write) -> std::io::Result<()> {
        let turn = ev.turn_id.clone().unwrap_or_default();
        if let EventPayload::ModelCompleted(_) = ev.payload {
            let step = *self.steps.get(&turn).unwrap_or(&0);
            self.steps.insert(turn.clone(), step + 1);
            for row in &ev.rows {
                match row.kind {
                    RowKind::Assistant => {
                        self.text(&turn, step, 0, &row.body, out)?;
                        self.end_text(out)?;
                        writeln!(out)?;
                    }
                    RowKind::ToolCall => {
                        let name = row.tool.as_ref().map_or("?", |t| t.name.as_str());
                        writeln!(out, "{}", tool_call_line(self.style, name, &row.body))?;
                        if let Some(t) = &row.tool {
                            self.calls.insert(format!("{turn}/{}", t.call_id));
                        }
                    }
                    _ => {}
                }
            }
        } else {
            for row in &ev.rows {
                match row.kind {
                    RowKind::ToolResult => writeln!(out, "{}", tool_result_line(self.style, row))?,
                    RowKind::Notice => writeln!(out, "{}", render_row(self.style, row))?,
                    _ => {}
                }
            }
        }
        out.flush()
    }

    /// The question for an interaction: an approval names its call only when the call is
    /// not on screen already.
    fn question(&self, interaction: &Interaction) -> String {
        if interaction.kind == INTERACTION_APPROVAL {
            // The whole of what is approved: not again when the call's line on screen
            // showed all of it, but whenever that line was cut to fit (`…`).
            let (tool, detail) = match &interaction.tool {
                Some(t) => {
                    let input = interaction.input.to_string();
                    let shown = self.calls.contains(&format!("{}/{}", interaction.turn_id, t.call_id))
                        && !tool_call_line(Style { colour: false }, &t.name, &input).ends_with('…');
                    let detail = if shown {
                        String::new()
                    } else {
                        approval_target(&t.name, &input)
                    };
                    (safe(&t.name), detail)
                }
                None => ("tool".into(), format!(" {}", safe(&interaction.input.to_string()))),
            };
            self.style.yellow(&format!("[approve {tool}{detail}? y/n] "))
        } else {
            question_prompt(interaction)
        }
    }
}

/// The prompt for a question (the model's `ask_user`): its text and how to answer by kind
/// — a numbered choice, y/n, or free text — and whether it may be skipped (an empty line).
fn question_prompt(interaction: &Interaction) -> String {
    let text = match interaction.input.get("question").and_then(|q| q.as_str()) {
        Some(q) => safe(q).into_owned(),
        None => safe(&interaction.input.to_string()).into_owned(),
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
                .map(|(i, o)| format!("{}) {}", i + 1, safe(o)))
                .collect();
            format!("[question] {text} {} (number{skip}) ", numbered.join(" "))
        }
    }
}

/// The `session.respond` answer a line gives a question (empty: none): a `confirm` reads
/// y/n as `yes`/`no`, a choice also reads an option's number.
fn question_answer(interaction: &Interaction, line: &str) -> serde_json::Value {
    let line = line.trim();
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

/// Ask about an interaction at the prompt (on stderr when stdout is JSON).
fn ask(printed: &Printed, interaction: &Interaction, json: bool) -> std::io::Result<()> {
    let question = printed.question(interaction);
    if json {
        eprint!("{question}");
        std::io::stderr().flush()
    } else {
        let mut out = std::io::stdout().lock();
        write!(out, "{question}")?;
        out.flush()
    }
}

/// The session to chat in: the one named (id or title), a new one in `--workspace` (id or
/// title), or a new one in the workspace holding the current directory.
async fn chat_session(client: &Client, session: Option<String>, workspace: Option<String>) -> anyhow::Result<String> {
    if let Some(s) = session {
        return session_id(client, &s).await;
    }
    let workspace = match workspace {
        Some(w) => workspace_id(client, &w).await?,
        None => workspace_here(client).await?,
    };
    let s = client
        .call::<SessionCreate>(SessionCreateParams {
            workspace_id: workspace.clone(),
            ..Default::default()
        })
        .await
        .explain(client, Subject::Workspace(&workspace))?;
    eprintln!("session {}", s.session_id);
    Ok(s.session_id)
}

pub async fn chat(remote: Remote, session: Option<String>, workspace: Option<String>) -> anyhow::Result<()> {
    let client = connect(&remote).await?;
    let session = chat_session(&client, session, workspace).await?;
    let snapshot = client
        .call::<SessionGet>(SessionRef {
            session_id: session.clone(),
        })
        .await
        .explain(&client, Subject::Session(&session))?;
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
    let style = Style::for_stdout(remote.json);
    let mut printed = Printed::new(style);
    let mut stdin_open = true;
    let mut failed = 0usize;
    let stdout = std::io::stdout();
    // A person at a terminal gets a prompt when the chat is ready for the next line.
    let interactive = std::io::stdin().is_terminal() && !remote.json;
    loop {
        if interactive {
            print!("{}", style.bold("> "));
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
            .await
            .explain(&client, Subject::Session(&session))?;
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
                    let Some(interaction) = asking.front().cloned() else { continue };
                    let answer = if interaction.kind == INTERACTION_APPROVAL {
                        match approval_answer(&line) {
                            Some(approved) => serde_json::json!({"approved": approved}),
                            None => {
                                // Neither yes nor no: ask again rather than guess.
                                if remote.json {
                                    eprintln!("answer y or n");
                                } else {
                                    println!("{}", style.dim("answer y or n"));
                                }
                                ask(&printed, &interaction, remote.json)?;
                                continue;
                            }
                        }
                    } else {
                        question_answer(&interaction, &line)
                    };
                    asking.pop_front();
                    let answered = client.call::<SessionRespond>(SessionRespondParams {
                        interaction_id: interaction.interaction_id.clone(),
                        answer,
                        operation_id: None,
                    }).await;
                    if let Err(e) = answered {
                        eprintln!("[the answer was not taken: {e}]");
                    }
                    if let Some(next) = asking.front() {
                        ask(&printed, next, remote.json)?;
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
                anyhow::bail!("the session's watch ended (was {session} removed?)");
            };
            let item = item.explain(&client, Subject::Session(&session))?;
            if remote.json {
                print_json(&item)?;
            }
            let mut out = stdout.lock();
            match &item {
                WatchItem::Live(LiveItem::ModelDelta(d)) if !remote.json => {
                    if let (Some(text), Some(offset)) = (&d.text, d.text_offset) {
                        printed.text(&d.turn_id, d.step, offset as usize, text, &mut out)?;
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
                                ask(&printed, &asking[0], remote.json)?;
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
                                    ask(&printed, next, remote.json)?;
                                    out = stdout.lock();
                                }
                            }
                        }
                        _ => {}
                    }
                    if let EventPayload::TurnEnded(end) = &ev.payload
                        && ev.turn_id.as_deref() == Some(sent.turn_id.as_str())
                    {
                        let words = end.cause.as_ref().map(cause_words);
                        if end.state == TurnState::Failed {
                            failed += 1;
                        }
                        if !remote.json && end.state != TurnState::Completed {
                            let marker = match &words {
                                Some(w) => format!("[turn {}: {w}]", end.state.as_str()),
                                None => format!("[turn {}]", end.state.as_str()),
                            };
                            let marker = if end.state == TurnState::Failed {
                                style.red(&marker)
                            } else {
                                style.yellow(&marker)
                            };
                            writeln!(out, "{marker}")?;
                        }
                        if remote.json && end.state == TurnState::Failed {
                            eprintln!("the turn failed: {}", words.as_deref().unwrap_or("no cause given"));
                        }
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    if failed > 0 {
        let what = if failed == 1 {
            "the turn failed".to_string()
        } else {
            format!("{failed} turns failed")
        };
        anyhow::bail!("{what}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use berth_client::protocol::Interaction;

    use super::{approval_answer, question_answer, question_prompt};

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
        assert_eq!(
            question_prompt(&choice),
            "[question] Which branch? 1) main 2) dev (number) "
        );
        assert_eq!(question_answer(&choice, "2\n"), serde_json::json!({"choice": "dev"}));
        assert_eq!(question_answer(&choice, "main"), serde_json::json!({"choice": "main"}));
        let confirm = question("confirm", Some(&["yes", "no"]), true);
        assert_eq!(
            question_prompt(&confirm),
            "[question] Which branch? (y/n; empty to skip) "
        );
        assert_eq!(question_answer(&confirm, "Y"), serde_json::json!({"choice": "yes"}));
        assert_eq!(question_answer(&confirm, ""), serde_json::json!({"choice": null}));
        let text = question("text", None, true);
        assert_eq!(
            question_prompt(&text),
            "[question] Which branch? (your answer; empty to skip) "
        );
        assert_eq!(
            question_answer(&text, "feature/x"),
            serde_json::json!({"choice": "feature/x"})
        );
    }

    #[test]
    fn only_yes_or_no_answers_an_approval() {
        assert_eq!(approval_answer(" Y "), Some(true));
        assert_eq!(approval_answer("yes"), Some(true));
        assert_eq!(approval_answer("No"), Some(false));
        assert_eq!(approval_answer("n"), Some(false));
        assert_eq!(approval_answer("maybe"), None);
        assert_eq!(approval_answer(""), None);
    }
}
