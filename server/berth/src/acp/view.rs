//! Berth's history and live items as ACP session updates: pure translation, no I/O.

use berth_client::protocol::{
    Cause, Event, EventPayload, ModelDelta, PlanStepStatus, Row, RowKind, TurnEnded, TurnState, worker::ToolStatus,
};
use std::path::Path;

use serde_json::Value;

use super::wire::{
    ContentBlock, PlanEntry, PlanPriority, PlanStatus, SessionUpdate, StopReason, ToolCall, ToolCallContent,
    ToolCallLocation, ToolCallStatus, ToolKind,
};
use crate::pieces::Pieces;

/// How ACP names the kind of one of Berth's tools.
pub fn tool_kind(name: &str) -> ToolKind {
    match name {
        "shell" => ToolKind::Execute,
        "read_file" | "view_image" | "list_directory" => ToolKind::Read,
        "write_file" | "edit_file" | "apply_patch" => ToolKind::Edit,
        "search_files" | "glob" => ToolKind::Search,
        _ => ToolKind::Other,
    }
}

/// A short title for a call: the tool and what it acts on.
pub fn tool_title(name: &str, input: &Value) -> String {
    if name == "apply_patch"
        && let Some(summary) = input.get("input").and_then(Value::as_str).map(patch_summary)
        && !summary.is_empty()
    {
        return format!("{name}: {summary}");
    }
    let target = ["command", "path", "pattern"]
        .iter()
        .find_map(|k| input.get(k).and_then(Value::as_str));
    match target {
        Some(t) => format!("{name}: {t}"),
        None => name.to_string(),
    }
}

fn tool_status(status: &str) -> ToolCallStatus {
    match ToolStatus::parse(status) {
        Some(ToolStatus::Running) => ToolCallStatus::InProgress,
        Some(ToolStatus::Completed) => ToolCallStatus::Completed,
        Some(ToolStatus::Failed | ToolStatus::Denied) => ToolCallStatus::Failed,
        Some(ToolStatus::Requested) | None => ToolCallStatus::Pending,
    }
}

/// A tool call's input as the model wrote it: JSON when it is, else the text.
pub fn tool_input(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_string()))
}

/// A call's ACP id: the model's call id within its turn (a provider's `call_0` comes back
/// every turn), so unique in the session.
pub fn call_id(turn_id: Option<&str>, call_id: &str) -> String {
    match turn_id {
        Some(turn) => format!("{turn}/{call_id}"),
        None => call_id.to_string(),
    }
}

/// What a file-changing call (`write_file`, `edit_file`, `apply_patch`) will do, as diffs an
/// editor can review, and the files it touches; paths made absolute under `root`, the
/// workspace's directory (None, or another tool: nothing).
pub fn file_changes(
    name: &str,
    input: &Value,
    root: Option<&Path>,
) -> Option<(Vec<ToolCallContent>, Vec<ToolCallLocation>)> {
    let root = root?;
    let text = |k: &str| input.get(k).and_then(Value::as_str);
    let abs = |p: &str| root.join(p).display().to_string();
    let diff = |path: String, old_text: Option<String>, new_text: String| ToolCallContent::Diff {
        path,
        old_text,
        new_text,
    };
    let (content, locations): (Vec<ToolCallContent>, Vec<String>) = match name {
        "write_file" => {
            let path = abs(text("path")?);
            (vec![diff(path.clone(), None, text("content")?.to_string())], vec![path])
        }
        "edit_file" => {
            let path = abs(text("path")?);
            let old = Some(text("old_string")?.to_string());
            (
                vec![diff(path.clone(), old, text("new_string")?.to_string())],
                vec![path],
            )
        }
        "apply_patch" => {
            let mut content = Vec::new();
            let mut locations = Vec::new();
            for f in patch_files(text("input")?) {
                let path = abs(&f.path);
                match (f.op, f.moved_to) {
                    // A deletion is said, not drawn: an ACP diff without old text is a new
                    // file, and one without new text reads as a file emptied.
                    (PatchOp::Delete, _) => content.push(ToolCallContent::Content {
                        content: ContentBlock::text(format!("Delete {path}")),
                    }),
                    (PatchOp::Add, _) => content.push(diff(path.clone(), None, f.new)),
                    (PatchOp::Update, None) => content.push(diff(path.clone(), Some(f.old), f.new)),
                    (PatchOp::Update, Some(to)) => {
                        let to = abs(&to);
                        content.push(ToolCallContent::Content {
                            content: ContentBlock::text(format!("Move {path} to {to}")),
                        });
                        content.push(diff(to.clone(), Some(f.old), f.new));
                        locations.push(to);
                    }
                }
                locations.push(path);
            }
            (content, locations)
        }
        _ => return None,
    };
    if content.is_empty() {
        return None;
    }
    let locations = locations.into_iter().map(|path| ToolCallLocation { path }).collect();
    Some((content, locations))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PatchOp {
    Add,
    Update,
    Delete,
}

/// One file of an `apply_patch` input: what is done to it, where it moves, and its old and
/// new text as far as the patch shows them (an added file's whole content; a changed file's
/// changed lines with their context; a deleted file's nothing).
struct PatchFile {
    op: PatchOp,
    path: String,
    moved_to: Option<String>,
    old: String,
    new: String,
}

/// The files of an `apply_patch` input, read leniently: a malformed patch shows less.
fn patch_files(patch: &str) -> Vec<PatchFile> {
    let mut out: Vec<PatchFile> = Vec::new();
    let file = |op, p: &str| PatchFile {
        op,
        path: p.trim().to_string(),
        moved_to: None,
        old: String::new(),
        new: String::new(),
    };
    for line in patch.lines() {
        if let Some(p) = line.strip_prefix("*** Add File: ") {
            out.push(file(PatchOp::Add, p));
        } else if let Some(p) = line.strip_prefix("*** Update File: ") {
            out.push(file(PatchOp::Update, p));
        } else if let Some(p) = line.strip_prefix("*** Delete File: ") {
            out.push(file(PatchOp::Delete, p));
        } else if let Some(p) = line.strip_prefix("*** Move to: ") {
            if let Some(last) = out.last_mut() {
                last.moved_to = Some(p.trim().to_string());
            }
        } else if line.starts_with("***") || line.starts_with("@@") {
        } else if let Some(f) = out.last_mut() {
            let (kind, rest) = line.split_at(line.len().min(1));
            let push = |s: &mut String| {
                s.push_str(rest);
                s.push('\n');
            };
            let update = f.op == PatchOp::Update;
            match kind {
                "+" => push(&mut f.new),
                "-" if update => push(&mut f.old),
                "-" => {}
                _ => {
                    if update {
                        push(&mut f.old);
                    }
                    push(&mut f.new);
                }
            }
        }
    }
    out
}

/// What an `apply_patch` input does, file by file, for a call's title: `add a.rs, update
/// b.rs, move c.rs to d.rs, delete e.rs`.
fn patch_summary(patch: &str) -> String {
    let files: Vec<String> = patch_files(patch)
        .into_iter()
        .map(|f| match (f.op, f.moved_to) {
            (PatchOp::Add, _) => format!("add {}", f.path),
            (PatchOp::Delete, _) => format!("delete {}", f.path),
            (PatchOp::Update, None) => format!("update {}", f.path),
            (PatchOp::Update, Some(to)) => format!("move {} to {to}", f.path),
        })
        .collect();
    files.join(", ")
}

/// The announcement of a call row (`tool_call`): a file-changing call with its diffs.
fn call_announced(row: &Row, root: Option<&Path>) -> Option<SessionUpdate> {
    let tool = row.tool.as_ref()?;
    let input = tool_input(&row.body);
    let (content, locations) = file_changes(&tool.name, &input, root).unzip();
    Some(SessionUpdate::ToolCall(ToolCall {
        tool_call_id: call_id(row.turn_id.as_deref(), &tool.call_id),
        title: Some(tool_title(&tool.name, &input)),
        kind: Some(tool_kind(&tool.name)),
        status: Some(tool_status(&tool.status)),
        content,
        locations,
        raw_input: Some(input),
    }))
}

/// A result row as the end of its call (`tool_call_update` with the output).
fn call_ended(row: &Row, status: ToolCallStatus) -> Option<SessionUpdate> {
    let tool = row.tool.as_ref()?;
    Some(SessionUpdate::ToolCallUpdate(ToolCall {
        tool_call_id: call_id(row.turn_id.as_deref(), &tool.call_id),
        status: Some(status),
        content: Some(vec![ToolCallContent::Content {
            content: ContentBlock::text(row.body.clone()),
        }]),
        ..Default::default()
    }))
}

/// A history row replayed (`session/load`); `root` is the workspace's directory.
pub fn replay(row: &Row, root: Option<&Path>) -> Vec<SessionUpdate> {
    if row.hidden == Some(true) {
        return Vec::new();
    }
    let mut out = Vec::new();
    match row.kind {
        RowKind::User => out.push(SessionUpdate::UserMessageChunk {
            content: ContentBlock::text(row.body.clone()),
        }),
        RowKind::Assistant => {
            if let Some(t) = row.thinking.as_ref().filter(|t| !t.is_empty()) {
                out.push(SessionUpdate::AgentThoughtChunk {
                    content: ContentBlock::text(t.clone()),
                });
            }
            if !row.body.is_empty() {
                out.push(SessionUpdate::AgentMessageChunk {
                    content: ContentBlock::text(row.body.clone()),
                });
            }
        }
        RowKind::ToolCall => out.extend(call_announced(row, root)),
        RowKind::ToolResult => {
            let status = row
                .tool
                .as_ref()
                .map_or(ToolCallStatus::Completed, |t| tool_status(&t.status));
            out.extend(call_ended(row, status));
        }
        // Notices are facts for a client to word (a code and params), and a handoff is the
        // model's summary of rows the editor replays anyway: ACP has no place for either.
        RowKind::Notice | RowKind::Handoff => {}
    }
    out
}

/// How a turn ended, for the `session/prompt` answer.
#[derive(Debug, PartialEq)]
pub enum Ending {
    Stop(StopReason),
    /// Failed or interrupted: an error answer.
    Failed {
        state: TurnState,
        cause: Option<Cause>,
    },
}

pub fn ending(end: &TurnEnded, cancel_asked: bool) -> Ending {
    if cancel_asked {
        // ACP: once the client cancels, the prompt ends `cancelled` whatever raced it.
        return Ending::Stop(StopReason::Cancelled);
    }
    match end.state {
        TurnState::Completed => Ending::Stop(StopReason::EndTurn),
        TurnState::Cancelled => Ending::Stop(StopReason::Cancelled),
        TurnState::Failed if end.cause.as_ref().is_some_and(|c| c.code == "step-limit") => {
            Ending::Stop(StopReason::MaxTurnRequests)
        }
        state => Ending::Failed {
            state,
            cause: end.cause.clone(),
        },
    }
}

/// One turn followed live: streamed text and thinking (each byte once), tool calls and
/// their changes.
pub struct TurnView {
    turn_id: String,
    /// The workspace's directory (absolute paths in diffs).
    root: Option<std::path::PathBuf>,
    text: Pieces,
    thinking: Pieces,
    /// Steps completed (the next `model.completed` is this step).
    steps: i64,
}

impl TurnView {
    pub fn new(turn_id: &str, root: Option<std::path::PathBuf>) -> TurnView {
        TurnView {
            turn_id: turn_id.to_string(),
            root,
            text: Pieces::default(),
            thinking: Pieces::default(),
            steps: 0,
        }
    }

    /// The workspace's directory, if known.
    pub fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    pub fn delta(&mut self, d: &ModelDelta) -> Vec<SessionUpdate> {
        let mut out = Vec::new();
        if d.turn_id != self.turn_id {
            return out;
        }
        if let (Some(t), Some(offset)) = (&d.thinking, d.thinking_offset) {
            let piece = self.thinking.piece(&d.turn_id, d.step, offset as usize, t);
            if !piece.is_empty() {
                out.push(SessionUpdate::AgentThoughtChunk {
                    content: ContentBlock::text(piece),
                });
            }
        }
        if let (Some(t), Some(offset)) = (&d.text, d.text_offset) {
            let piece = self.text.piece(&d.turn_id, d.step, offset as usize, t);
            if !piece.is_empty() {
                out.push(SessionUpdate::AgentMessageChunk {
                    content: ContentBlock::text(piece),
                });
            }
        }
        out
    }

    /// The updates an event of this turn makes.
    pub fn event(&mut self, ev: &Event) -> Vec<SessionUpdate> {
        let mut out = Vec::new();
        if ev.turn_id.as_deref() != Some(self.turn_id.as_str()) {
            return out;
        }
        match &ev.payload {
            EventPayload::ModelCompleted(_) => {
                let step = self.steps;
                self.steps += 1;
                for row in &ev.rows {
                    match row.kind {
                        RowKind::Assistant => {
                            // What the deltas did not deliver (all of it, for a watcher
                            // that saw none).
                            let thinking = row.thinking.as_deref().unwrap_or_default();
                            let rest = self.thinking.piece(&self.turn_id, step, 0, thinking);
                            if !rest.is_empty() {
                                out.push(SessionUpdate::AgentThoughtChunk {
                                    content: ContentBlock::text(rest),
                                });
                            }
                            let rest = self.text.piece(&self.turn_id, step, 0, &row.body);
                            if !rest.is_empty() {
                                out.push(SessionUpdate::AgentMessageChunk {
                                    content: ContentBlock::text(rest),
                                });
                            }
                        }
                        RowKind::ToolCall => out.extend(call_announced(row, self.root.as_deref())),
                        _ => {}
                    }
                }
            }
            EventPayload::ToolStatus(s) => out.push(SessionUpdate::ToolCallUpdate(ToolCall {
                tool_call_id: call_id(Some(&self.turn_id), &s.call_id),
                status: Some(tool_status(s.status.as_str())),
                ..Default::default()
            })),
            EventPayload::ToolEnded(s) => {
                let status = tool_status(s.status.as_str());
                match ev.rows.iter().find(|r| r.kind == RowKind::ToolResult) {
                    Some(row) => out.extend(call_ended(row, status)),
                    None => out.push(SessionUpdate::ToolCallUpdate(ToolCall {
                        tool_call_id: call_id(Some(&self.turn_id), &s.call_id),
                        status: Some(status),
                        ..Default::default()
                    })),
                }
            }
            EventPayload::PlanUpdated(plan) => out.push(SessionUpdate::Plan {
                entries: plan
                    .plan
                    .iter()
                    .map(|s| PlanEntry {
                        content: s.step.clone(),
                        priority: PlanPriority::Medium,
                        status: match s.status {
                            PlanStepStatus::Pending => PlanStatus::Pending,
                            PlanStepStatus::InProgress => PlanStatus::InProgress,
                            PlanStepStatus::Completed => PlanStatus::Completed,
                        },
                    })
                    .collect(),
            }),
            _ => {}
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use berth_client::protocol::{ModelCompleted, Position, ToolInfo, events::ToolCallStatus as BerthToolStatus};
    use serde_json::json;

    use super::*;

    fn row(kind: RowKind, body: &str, tool: Option<(&str, &str)>) -> Row {
        Row {
            position: Position {
                source_sequence: 3,
                item_index: 0,
            },
            turn_id: Some("trn_1".into()),
            kind,
            body: body.into(),
            thinking: None,
            tool: tool.map(|(name, status)| ToolInfo {
                name: name.into(),
                call_id: "call_1".into(),
                status: status.into(),
            }),
            hidden: None,
            truncated: None,
            attachments: None,
        }
    }

    fn event(payload: EventPayload, rows: Vec<Row>) -> Event {
        Event {
            sequence: 3,
            at: "2026-01-01T00:00:00Z".into(),
            turn_id: Some("trn_1".into()),
            rows,
            payload,
        }
    }

    fn delta(text: &str, offset: u64) -> ModelDelta {
        ModelDelta {
            turn_id: "trn_1".into(),
            step: 0,
            text: Some(text.into()),
            text_offset: Some(offset),
            thinking: None,
            thinking_offset: None,
        }
    }

    fn texts(updates: &[SessionUpdate]) -> Vec<String> {
        updates
            .iter()
            .filter_map(|u| match u {
                SessionUpdate::AgentMessageChunk {
                    content: ContentBlock::Text { text },
                } => Some(text.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn streamed_text_is_sent_once_and_the_completed_step_sends_only_the_rest() {
        let mut view = TurnView::new("trn_1", None);
        assert_eq!(texts(&view.delta(&delta("Hel", 0))), ["Hel"]);
        // A repeat after a reconnect sends nothing twice.
        assert_eq!(texts(&view.delta(&delta("Hello", 0))), ["lo"]);
        let mut other = delta("x", 0);
        other.turn_id = "trn_2".into();
        assert!(
            view.delta(&other).is_empty(),
            "another turn's output is not this prompt's"
        );
        let done = event(
            EventPayload::ModelCompleted(ModelCompleted {
                step: Some(0),
                usage: None,
            }),
            vec![
                row(RowKind::Assistant, "Hello there", None),
                row(RowKind::ToolCall, r#"{"command":"make"}"#, Some(("shell", "requested"))),
            ],
        );
        let updates = view.event(&done);
        assert_eq!(texts(&updates), [" there"]);
        assert_eq!(
            updates[1],
            SessionUpdate::ToolCall(ToolCall {
                tool_call_id: "trn_1/call_1".into(),
                title: Some("shell: make".into()),
                kind: Some(ToolKind::Execute),
                status: Some(ToolCallStatus::Pending),
                content: None,
                locations: None,
                raw_input: Some(json!({"command": "make"})),
            })
        );
        // The next step streams from offset 0 again.
        let mut next = delta("More", 0);
        next.step = 1;
        assert_eq!(texts(&view.delta(&next)), ["More"]);
    }

    #[test]
    fn tool_status_changes_and_results_update_the_call() {
        let mut view = TurnView::new("trn_1", None);
        let status = |status| BerthToolStatus {
            position: Position {
                source_sequence: 3,
                item_index: 1,
            },
            call_id: "call_1".into(),
            status,
        };
        let running = view.event(&event(EventPayload::ToolStatus(status(ToolStatus::Running)), vec![]));
        assert!(
            matches!(&running[..], [SessionUpdate::ToolCallUpdate(c)] if c.status == Some(ToolCallStatus::InProgress))
        );
        let ended = view.event(&event(
            EventPayload::ToolEnded(status(ToolStatus::Denied)),
            vec![row(
                RowKind::ToolResult,
                "The user denied this call",
                Some(("shell", "denied")),
            )],
        ));
        let [SessionUpdate::ToolCallUpdate(c)] = &ended[..] else {
            panic!("{ended:?}")
        };
        assert_eq!(c.status, Some(ToolCallStatus::Failed));
        assert_eq!(
            c.content,
            Some(vec![ToolCallContent::Content {
                content: ContentBlock::text("The user denied this call")
            }])
        );
    }

    #[test]
    fn turn_ends_map_to_stop_reasons_or_errors() {
        let end = |state, cause: Option<&str>| TurnEnded {
            state,
            cause: cause.map(|c| Cause {
                code: c.into(),
                status: None,
            }),
            usage: None,
        };
        assert_eq!(
            ending(&end(TurnState::Completed, None), false),
            Ending::Stop(StopReason::EndTurn)
        );
        assert_eq!(
            ending(&end(TurnState::Cancelled, None), false),
            Ending::Stop(StopReason::Cancelled)
        );
        assert_eq!(
            ending(&end(TurnState::Failed, Some("step-limit")), false),
            Ending::Stop(StopReason::MaxTurnRequests)
        );
        assert!(matches!(
            ending(&end(TurnState::Failed, Some("provider-status")), false),
            Ending::Failed { .. }
        ));
        assert_eq!(
            ending(&end(TurnState::Interrupted, None), true),
            Ending::Stop(StopReason::Cancelled)
        );
    }

    #[test]
    fn history_replays_as_the_conversation() {
        let mut assistant = row(RowKind::Assistant, "answer", None);
        assistant.thinking = Some("hmm".into());
        let mut hidden = row(RowKind::ToolCall, "{}", Some(("internal", "completed")));
        hidden.hidden = Some(true);
        let updates: Vec<SessionUpdate> = [
            row(RowKind::User, "question", None),
            assistant,
            hidden,
            row(RowKind::ToolResult, "ok", Some(("shell", "completed"))),
        ]
        .iter()
        .flat_map(|r| replay(r, None))
        .collect();
        let names: Vec<Value> = updates
            .iter()
            .map(|u| serde_json::to_value(u).unwrap()["sessionUpdate"].clone())
            .collect();
        assert_eq!(
            names,
            [
                "user_message_chunk",
                "agent_thought_chunk",
                "agent_message_chunk",
                "tool_call_update"
            ]
        );
    }

    /// Issue 48: a call's id is unique in the session (the provider's `call_1` of another
    /// turn is another call), and a file-changing call carries diffs and locations an editor
    /// shows for review, with absolute paths.
    #[test]
    fn calls_have_session_unique_ids_and_edits_carry_diffs() {
        assert_eq!(call_id(Some("trn_9"), "call_1"), "trn_9/call_1");
        let root = Path::new("/work/app");
        let edit = json!({"path": "src/a.rs", "old_string": "one()", "new_string": "two()"});
        let (content, locations) = file_changes("edit_file", &edit, Some(root)).unwrap();
        assert_eq!(
            content,
            [ToolCallContent::Diff {
                path: "/work/app/src/a.rs".into(),
                old_text: Some("one()".into()),
                new_text: "two()".into(),
            }]
        );
        assert_eq!(locations[0].path, "/work/app/src/a.rs");
        let write = json!({"path": "new.md", "content": "# New\n"});
        let (content, _) = file_changes("write_file", &write, Some(root)).unwrap();
        assert_eq!(
            serde_json::to_value(&content[0]).unwrap(),
            json!({"type": "diff", "path": "/work/app/new.md", "newText": "# New\n"})
        );
        let patch = json!({"input": "*** Begin Patch\n*** Add File: b.txt\n+hi\n*** Update File: a.txt\n@@\n keep\n-old\n+new\n*** End Patch\n"});
        let (content, locations) = file_changes("apply_patch", &patch, Some(root)).unwrap();
        assert_eq!(
            content,
            [
                ToolCallContent::Diff {
                    path: "/work/app/b.txt".into(),
                    old_text: None,
                    new_text: "hi\n".into(),
                },
                ToolCallContent::Diff {
                    path: "/work/app/a.txt".into(),
                    old_text: Some("keep\nold\n".into()),
                    new_text: "keep\nnew\n".into(),
                },
            ]
        );
        assert_eq!(locations.len(), 2);
        // A deletion is said, not drawn as a file emptied; a move names both places.
        let patch = json!({"input": "*** Begin Patch\n*** Delete File: src/auth.rs\n*** Update File: a.rs\n*** Move to: b.rs\n@@\n-x\n+y\n*** End Patch\n"});
        let (content, locations) = file_changes("apply_patch", &patch, Some(root)).unwrap();
        assert_eq!(
            content,
            [
                ToolCallContent::Content {
                    content: ContentBlock::text("Delete /work/app/src/auth.rs".to_string()),
                },
                ToolCallContent::Content {
                    content: ContentBlock::text("Move /work/app/a.rs to /work/app/b.rs".to_string()),
                },
                ToolCallContent::Diff {
                    path: "/work/app/b.rs".into(),
                    old_text: Some("x\n".into()),
                    new_text: "y\n".into(),
                },
            ]
        );
        let paths: Vec<_> = locations.iter().map(|l| l.path.as_str()).collect();
        assert_eq!(paths, ["/work/app/src/auth.rs", "/work/app/b.rs", "/work/app/a.rs"]);
        assert_eq!(
            tool_title("apply_patch", &patch),
            "apply_patch: delete src/auth.rs, move a.rs to b.rs"
        );
        assert!(file_changes("shell", &json!({"command": "ls"}), Some(root)).is_none());
        assert!(file_changes("edit_file", &edit, None).is_none());
        // The announcement carries them.
        let mut r = row(RowKind::ToolCall, &edit.to_string(), Some(("edit_file", "requested")));
        r.turn_id = Some("trn_2".into());
        let [SessionUpdate::ToolCall(c)] = &replay(&r, Some(root))[..] else {
            panic!()
        };
        assert_eq!(c.tool_call_id, "trn_2/call_1");
        assert!(c.content.is_some() && c.locations.is_some());
    }
}
