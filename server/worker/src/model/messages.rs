//! The conversation in the provider's own shape (OpenAI chat completions): history rows
//! and this turn's steps become `user`, `assistant` (with `tool_calls`) and `tool`
//! (with `tool_call_id`) messages.

use berth_protocol::{Row, RowField, RowKind};
use serde_json::{Value, json};

use super::Completion;

/// What the model is told about where it works.
pub(crate) const SYSTEM_PROMPT: &str = "You are a coding agent working in a workspace on the user's machine. \
Use the tools to inspect and change files and to run commands; paths are relative to the workspace root. \
When the work is done, answer without calling a tool.";

const SYSTEM_PROMPT_NO_TOOLS: &str = "You are a helpful coding assistant.";

/// What a coordinator session's model is told besides [`SYSTEM_PROMPT`].
const COORDINATOR_PROMPT: &str = "You also coordinate other agents: list the workspaces, start a child session \
in a workspace with a self-contained task, wait for its turn to end and read its answer, send it follow-ups, or stop \
it. Children work in parallel; start all the independent ones before waiting. Your final answer gathers their results.";

/// Bytes of one tool result the model sees; the whole result stays in history.
pub(crate) const TOOL_OUTPUT_SHOWN: usize = 32 << 10;

/// `s` cut to `TOOL_OUTPUT_SHOWN` bytes (its head and its tail) with a marked cut.
pub(crate) fn cap_output(s: &str) -> String {
    if s.len() <= TOOL_OUTPUT_SHOWN {
        return s.to_string();
    }
    let head = berth_protocol::text::prefix(s, TOOL_OUTPUT_SHOWN / 2);
    let mut tail_start = s.len() - TOOL_OUTPUT_SHOWN / 2;
    while !s.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    let cut = tail_start - head.len();
    format!(
        "{head}\n[… {cut} bytes cut here; the whole output is kept in the session history …]\n{}",
        &s[tail_start..]
    )
}

#[derive(Debug, Default)]
pub(crate) struct Conversation {
    messages: Vec<Value>,
    /// Calls of the last assistant message that have no result yet, in order.
    open: Vec<String>,
    /// The history event whose assistant message later tool-call rows join.
    joinable: Option<i64>,
}

impl Conversation {
    pub(crate) fn new(tools: bool, coordinator: bool) -> Conversation {
        let system = match (tools, coordinator) {
            (true, true) => format!("{SYSTEM_PROMPT} {COORDINATOR_PROMPT}"),
            (true, false) => SYSTEM_PROMPT.to_string(),
            (false, _) => SYSTEM_PROMPT_NO_TOOLS.to_string(),
        };
        Conversation {
            messages: vec![json!({"role": "system", "content": system})],
            ..Conversation::default()
        }
    }

    /// Put a turn's attachments into its prompt (the last user message).
    pub(crate) fn attach(&mut self, received: &[crate::attachments::Received]) {
        crate::attachments::attach(&mut self.messages, received);
    }

    pub(crate) fn messages(&self) -> &[Value] {
        &self.messages
    }

    /// Add one history row (rows arrive in history order).
    pub(crate) fn push_row(&mut self, row: &Row) {
        let mut body = row.body.clone();
        if let Some(t) = row.truncated.as_ref().and_then(|t| t.get(&RowField::Body)) {
            body.push_str(&format!("\n[… cut: {} bytes in all]", t.bytes));
        }
        let seq = row.position.source_sequence;
        match row.kind {
            RowKind::User => {
                self.close_open();
                self.messages.push(json!({"role": "user", "content": body}));
            }
            RowKind::Assistant => {
                self.close_open();
                self.messages.push(json!({"role": "assistant", "content": body}));
                self.joinable = Some(seq);
            }
            RowKind::ToolCall => {
                let Some(tool) = &row.tool else { return };
                if self.joinable != Some(seq) {
                    self.close_open();
                    self.messages.push(json!({"role": "assistant", "content": ""}));
                    self.joinable = Some(seq);
                }
                self.add_call(&tool.call_id, &tool.name, &body);
            }
            RowKind::ToolResult => {
                if let Some(tool) = &row.tool {
                    self.push_result(&tool.call_id, &body);
                }
            }
            RowKind::Notice => {}
        }
    }

    /// Add this turn's completed model step.
    pub(crate) fn push_step(&mut self, c: &Completion) {
        self.close_open();
        let mut message = json!({"role": "assistant", "content": c.text});
        if !c.reasoning_items.is_empty() {
            // Only the API tier's translation for the provider that wrote them reads these.
            message["reasoning_items"] = c.reasoning_items.clone().into();
        }
        self.messages.push(message);
        self.joinable = None;
        for call in &c.tool_calls {
            self.add_call(&call.id, &call.name, &call.arguments);
        }
    }

    /// A call's result (capped for the model).
    pub(crate) fn push_result(&mut self, call_id: &str, output: &str) {
        let Some(i) = self.open.iter().position(|c| c == call_id) else {
            return; // a result without its call (e.g. cleared history): nothing to answer
        };
        self.open.remove(i);
        self.joinable = None;
        self.messages
            .push(json!({"role": "tool", "tool_call_id": call_id, "content": cap_output(output)}));
    }

    /// Calls left without a result (their turn ended first) get one, as providers require.
    pub(crate) fn close_open(&mut self) {
        for id in std::mem::take(&mut self.open) {
            self.messages.push(json!({
                "role": "tool", "tool_call_id": id,
                "content": "[no result: the turn ended before this call finished]",
            }));
        }
        self.joinable = None;
    }

    fn add_call(&mut self, id: &str, name: &str, arguments: &str) {
        let Some(msg) = self.messages.last_mut() else { return };
        if msg["content"] == "" {
            msg["content"] = Value::Null;
        }
        let call = json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}});
        match msg.get_mut("tool_calls").and_then(Value::as_array_mut) {
            Some(calls) => calls.push(call),
            None => msg["tool_calls"] = json!([call]),
        }
        self.open.push(id.to_string());
    }
}

#[cfg(test)]
mod tests {
    use berth_protocol::{Position, ToolInfo};

    use super::*;
    use crate::model::ToolCall;

    fn row(seq: i64, i: i32, kind: RowKind, body: &str, tool: Option<(&str, &str)>) -> Row {
        Row {
            position: Position {
                source_sequence: seq,
                item_index: i,
            },
            turn_id: None,
            kind,
            body: body.into(),
            thinking: None,
            tool: tool.map(|(name, id)| ToolInfo {
                name: name.into(),
                call_id: id.into(),
                status: "completed".into(),
            }),
            hidden: None,
            truncated: None,
            attachments: None,
        }
    }

    #[test]
    fn history_becomes_provider_messages_and_dangling_calls_get_results() {
        let mut c = Conversation::new(true, false);
        c.push_row(&row(2, 0, RowKind::User, "hi", None));
        c.push_row(&row(3, 0, RowKind::Assistant, "", None));
        c.push_row(&row(3, 1, RowKind::ToolCall, "{\"a\":1}", Some(("shell", "c1"))));
        c.push_row(&row(3, 2, RowKind::ToolCall, "{}", Some(("list_directory", "c2"))));
        c.push_row(&row(5, 0, RowKind::ToolResult, "out1", Some(("shell", "c1"))));
        // c2 never ended (worker lost); the next prompt closes it.
        c.push_row(&row(8, 0, RowKind::ToolCall, "{}", Some(("shell", "c3"))));
        c.push_row(&row(9, 0, RowKind::User, "again", None));
        let m = c.messages();
        assert_eq!(m[0]["role"], "system");
        assert_eq!(m[1], json!({"role": "user", "content": "hi"}));
        assert_eq!(m[2]["content"], Value::Null);
        assert_eq!(m[2]["tool_calls"][0]["id"], "c1");
        assert_eq!(m[2]["tool_calls"][1]["function"]["name"], "list_directory");
        assert_eq!(m[3], json!({"role": "tool", "tool_call_id": "c1", "content": "out1"}));
        assert_eq!(m[4]["tool_call_id"], "c2");
        assert_eq!(m[5]["tool_calls"][0]["id"], "c3");
        assert_eq!(m[6]["tool_call_id"], "c3");
        assert_eq!(m[7], json!({"role": "user", "content": "again"}));
        assert_eq!(m.len(), 8);

        c.push_step(&Completion {
            text: "ok".into(),
            tool_calls: vec![ToolCall {
                id: "c4".into(),
                name: "shell".into(),
                arguments: "{}".into(),
            }],
            ..Completion::default()
        });
        c.push_result("c4", "done");
        let m = c.messages();
        assert_eq!(m[8]["content"], "ok");
        assert_eq!(m[8]["tool_calls"][0]["id"], "c4");
        assert_eq!(m[9]["content"], "done");
    }

    #[test]
    fn large_outputs_are_cut_with_a_mark() {
        let big = format!("{}{}", "a".repeat(TOOL_OUTPUT_SHOWN), "é".repeat(TOOL_OUTPUT_SHOWN));
        let shown = cap_output(&big);
        assert!(shown.len() < TOOL_OUTPUT_SHOWN + 200);
        assert!(shown.contains("bytes cut here"));
        assert!(shown.starts_with('a') && shown.ends_with('é'));
        assert_eq!(cap_output("small"), "small");
    }
}
