//! The conversation in the provider's own shape (OpenAI chat completions): history rows
//! and this turn's steps become `user`, `assistant` (with `tool_calls`) and `tool`
//! (with `tool_call_id`) messages.

use berth_protocol::{Position, Row, RowField, RowKind};
use serde_json::{Value, json};

use super::Completion;

/// What the model is told about where it works.
pub(crate) const SYSTEM_PROMPT: &str = "You are a coding agent working in a workspace on the user's machine. \
Use the tools to inspect and change files and to run commands; paths are relative to the workspace root. \
When the work is done, answer without calling a tool.";

const SYSTEM_PROMPT_NO_TOOLS: &str = "You are a helpful coding assistant.";

/// What a coordinator session's model is told besides [`SYSTEM_PROMPT`].
pub(crate) const COORDINATOR_PROMPT: &str = "You also coordinate other agents: list the workspaces, start a child session \
in a workspace with a self-contained task, wait for its turn to end and read its answer, send it follow-ups, or stop \
it. Children work in parallel; start all the independent ones before waiting. Your final answer gathers their results.";

/// What a channel session's model is told (with the channel's name) on every turn.
pub(crate) fn channel_prompt(channel: &str, tools: bool) -> String {
    let mut s = format!(
        "Your replies are read on the chat channel {channel:?} as short plain text: answer briefly, without \
markdown tables, headings or code blocks longer than a few lines. The reader sees only your final reply, not your \
tool calls or their results."
    );
    if tools {
        s.push_str(" To send the reader a file, attach it with attach_file; it is delivered with your reply.");
    }
    s
}

/// What an image shown to the model counts for in the conversation's estimate, in tokens
/// (about what providers charge for a screenshot), in place of its base64 text.
pub(crate) const IMAGE_TOKENS: u64 = 1_600;

/// Images `view_image` showed that stay in the conversation, in all: older ones become a
/// note, so that a turn looking at many images neither fills the request nor passes the
/// room the proxy gives images (`IMAGE_ROOM`).
pub(crate) const IMAGES_KEPT: usize = 3;

/// The bytes of `m`'s image parts (their data URLs) and how many there are.
fn image_parts(m: &Value) -> (usize, usize) {
    let Some(parts) = m["content"].as_array() else {
        return (0, 0);
    };
    parts
        .iter()
        .filter_map(|p| p["image_url"]["url"].as_str())
        .fold((0, 0), |(n, bytes), url| (n + 1, bytes + url.len()))
}

/// A message's share of the estimate, in bytes (an image as [`IMAGE_TOKENS`]).
fn weight(m: &Value) -> usize {
    let (images, image_bytes) = image_parts(m);
    m.to_string().len() - image_bytes + images * IMAGE_TOKENS as usize * 4
}

/// Bytes of one tool result the model sees; the whole result stays in history.
pub(crate) const TOOL_OUTPUT_SHOWN: usize = 32 << 10;

/// `s` cut to `TOOL_OUTPUT_SHOWN` bytes with one marked cut: its first quarter and its last
/// three quarters (a command's summary, a test run's failures, are at the end).
pub(crate) fn cap_output(s: &str) -> String {
    if s.len() <= TOOL_OUTPUT_SHOWN {
        return s.to_string();
    }
    let head = berth_protocol::text::prefix(s, TOOL_OUTPUT_SHOWN / 4);
    let mut tail_start = s.len() - TOOL_OUTPUT_SHOWN * 3 / 4;
    while !s.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    let cut = tail_start - head.len();
    format!(
        "{head}\n[… {cut} bytes of this result left out here; {} bytes in all …]\n{}",
        s.len(),
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
    /// Where the conversation may be cut for compaction: a user or assistant message's
    /// index and the position of its first row (everything from there on is kept whole).
    cuts: Vec<(usize, Position)>,
    /// Messages before this index are not history the model could lose (system, handoff).
    fixed: usize,
    /// Whether the rows include a user prompt (this turn's attachments go there).
    has_prompt: bool,
    /// The messages holding images `view_image` showed, oldest first, with the paths.
    viewed: Vec<(usize, String)>,
}

/// The built-in system prompt of a session with or without tools.
pub(crate) fn default_system_prompt(tools: bool) -> &'static str {
    if tools { SYSTEM_PROMPT } else { SYSTEM_PROMPT_NO_TOOLS }
}

impl Conversation {
    pub(crate) fn new(system: String) -> Conversation {
        Conversation {
            messages: vec![json!({"role": "system", "content": system})],
            fixed: 1,
            ..Conversation::default()
        }
    }

    /// A note from Berth to the model for this request only (never history).
    pub(crate) fn push_note(&mut self, note: &str) {
        self.messages.push(json!({"role": "user", "content": note}));
        self.joinable = None;
    }

    /// Start from a compaction's summary, which stands for the history before its rows.
    pub(crate) fn push_handoff(&mut self, summary: &str) {
        self.messages.push(json!({"role": "user", "content": format!(
            "[Summary of the earlier conversation, compacted to fit the context window]\n{summary}"
        )}));
        self.fixed = self.messages.len();
    }

    /// Put a turn's attachments into its prompt (the last user message), if the prompt is
    /// still sent as itself (not compacted away).
    pub(crate) fn attach(&mut self, received: &[crate::attachments::Received]) {
        if self.has_prompt {
            crate::attachments::attach(&mut self.messages, received);
        }
    }

    /// Where to cut for a compaction that keeps at most about `keep_tokens` of the latest
    /// messages whole (at least the last cut point's): the position of the first row kept.
    /// None when there is nothing before the last cut point to summarize.
    pub(crate) fn cut(&self, keep_tokens: u64) -> Option<Position> {
        let keep_bytes = usize::try_from(keep_tokens.saturating_mul(4)).unwrap_or(usize::MAX);
        // Bytes from each message to the end, summed once from the back.
        let mut suffix = vec![0usize; self.messages.len() + 1];
        for (i, m) in self.messages.iter().enumerate().rev() {
            suffix[i] = suffix[i + 1] + weight(m);
        }
        let mut last = None;
        for &(i, position) in self.cuts.iter().filter(|(i, _)| *i > self.fixed) {
            if suffix[i] <= keep_bytes {
                return Some(position);
            }
            last = Some(position);
        }
        last
    }

    /// A cut point at the next message, which starts with the row at `position`.
    fn mark(&mut self, position: Position) {
        self.cuts.push((self.messages.len(), position));
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
                self.mark(row.position);
                self.messages.push(json!({"role": "user", "content": body}));
                self.has_prompt = true;
            }
            RowKind::Assistant => {
                self.close_open();
                self.mark(row.position);
                self.messages.push(json!({"role": "assistant", "content": body}));
                self.joinable = Some(seq);
            }
            RowKind::ToolCall => {
                let Some(tool) = &row.tool else { return };
                if self.joinable != Some(seq) {
                    self.close_open();
                    self.mark(row.position);
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
            // A handoff row comes with its compaction (`push_handoff`); older ones were
            // summarized into the latest.
            RowKind::Notice | RowKind::Handoff => {}
        }
    }

    /// Add this turn's completed model step, published at event `sequence`.
    pub(crate) fn push_step(&mut self, c: &Completion, sequence: i64) {
        self.close_open();
        self.mark(Position {
            source_sequence: sequence,
            item_index: 0,
        });
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

    /// The images a step's calls showed (`view_image`), after all its results: one user
    /// message, since a tool result is text. Only the latest [`IMAGES_KEPT`] such messages
    /// keep their images; an older one keeps a note of what it showed.
    pub(crate) fn push_images(&mut self, mut images: Vec<crate::tools::image::Image>) {
        use base64::Engine;
        if images.is_empty() {
            return;
        }
        // At most [`IMAGES_KEPT`] in all: a step's latest, then the earlier steps' latest.
        let unshown = images.len().saturating_sub(IMAGES_KEPT);
        let left_out: Vec<String> = images.drain(..unshown).map(|i| i.path).collect();
        let names = images.iter().map(|i| i.path.as_str()).collect::<Vec<_>>().join(", ");
        let mut text = format!("[Berth: the images view_image showed, in order: {names}]");
        if !left_out.is_empty() {
            text.push_str(&format!(
                "\n[Berth: not shown, as at most {IMAGES_KEPT} images are shown at once: {}; view fewer at a time]",
                left_out.join(", ")
            ));
        }
        let mut parts = vec![json!({"type": "text", "text": text})];
        for image in &images {
            let b64 = base64::engine::general_purpose::STANDARD.encode(&image.data);
            parts.push(json!({
                "type": "image_url",
                "image_url": {"url": format!("data:{};base64,{b64}", image.mime)},
            }));
        }
        self.viewed.push((self.messages.len(), names));
        self.messages.push(json!({"role": "user", "content": parts}));
        self.joinable = None;
        while self.images().0 > IMAGES_KEPT {
            let (old, names) = self.viewed.remove(0);
            let note = format!("[Berth: view_image showed {names} here earlier in this turn; view it again to see it]");
            self.messages[old]["content"] = Value::String(note);
        }
    }

    /// The images the conversation holds and the bytes of their data URLs.
    pub(crate) fn images(&self) -> (usize, usize) {
        self.viewed
            .iter()
            .map(|(i, _)| image_parts(&self.messages[*i]))
            .fold((0, 0), |(n, b), (n2, b2)| (n + n2, b + b2))
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
        let mut c = Conversation::new(default_system_prompt(true).into());
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

        c.push_step(
            &Completion {
                text: "ok".into(),
                tool_calls: vec![ToolCall {
                    id: "c4".into(),
                    name: "shell".into(),
                    arguments: "{}".into(),
                }],
                ..Completion::default()
            },
            10,
        );
        c.push_result("c4", "done");
        let m = c.messages();
        assert_eq!(m[8]["content"], "ok");
        assert_eq!(m[8]["tool_calls"][0]["id"], "c4");
        assert_eq!(m[9]["content"], "done");
    }

    #[test]
    fn cuts_keep_the_latest_messages_that_fit_and_never_the_fixed_ones() {
        let mut c = Conversation::new("sys".into());
        c.push_handoff("earlier");
        assert_eq!(c.cut(1000), None, "nothing to summarize");
        c.push_row(&row(5, 0, RowKind::User, &"a".repeat(400), None));
        c.push_row(&row(6, 0, RowKind::Assistant, &"b".repeat(400), None));
        c.push_row(&row(7, 0, RowKind::User, "short", None));
        c.push_row(&row(8, 0, RowKind::ToolCall, "{}", Some(("shell", "c1"))));
        c.push_row(&row(9, 0, RowKind::ToolResult, "out", Some(("shell", "c1"))));
        let at = |seq| Position {
            source_sequence: seq,
            item_index: 0,
        };
        // Room for the last two messages' worth and more: cut before the second user row.
        assert_eq!(c.cut(60), Some(at(7)));
        // Room for everything after the first row: keep from the assistant row.
        assert_eq!(c.cut(1000), Some(at(6)));
        // No room at all: keep the last step only.
        assert_eq!(c.cut(0), Some(at(8)));
        assert!(c.has_prompt);
    }

    #[test]
    fn large_outputs_are_cut_with_a_mark() {
        let big = format!("{}{}", "a".repeat(TOOL_OUTPUT_SHOWN), "é".repeat(TOOL_OUTPUT_SHOWN));
        let shown = cap_output(&big);
        assert!(shown.len() < TOOL_OUTPUT_SHOWN + 200);
        assert!(shown.contains("bytes of this result left out here;"));
        assert!(shown.contains(&format!("{} bytes in all", big.len())));
        assert!(shown.starts_with('a') && shown.ends_with('é'));
        assert_eq!(cap_output("small"), "small");
    }

    /// Images a step's calls showed follow all its results as one user message; the
    /// latest [`IMAGES_KEPT`] keep their images, older ones a note; the estimate counts an
    /// image as [`IMAGE_TOKENS`], not as its base64.
    #[test]
    fn viewed_images_follow_the_results_and_only_the_latest_stay() {
        use crate::tools::image::Image;
        let image = |path: &str| Image {
            path: path.into(),
            mime: "image/png",
            data: vec![7u8; 30_000],
        };
        let mut c = Conversation::new("sys".into());
        c.push_row(&row(1, 0, RowKind::User, "look", None));
        c.push_row(&row(2, 0, RowKind::ToolCall, "{}", Some(("view_image", "c1"))));
        c.push_row(&row(2, 1, RowKind::ToolCall, "{}", Some(("view_image", "c2"))));
        c.push_result("c1", "a.png: shown");
        c.push_result("c2", "b.png: shown");
        c.push_images(vec![image("a.png"), image("b.png")]);
        let m = c.messages();
        assert_eq!(
            (m[3]["role"].as_str(), m[4]["role"].as_str()),
            (Some("tool"), Some("tool"))
        );
        assert_eq!(m[5]["role"], "user");
        assert_eq!(
            m[5]["content"][0]["text"],
            "[Berth: the images view_image showed, in order: a.png, b.png]"
        );
        let url = m[5]["content"][1]["image_url"]["url"].as_str().unwrap();
        assert!(url.starts_with("data:image/png;base64,BwcH"), "{url}");
        assert_eq!(c.images(), (2, 2 * url.len()));
        assert!(weight(&m[5]) < 2 * IMAGE_TOKENS as usize * 4 + 500);
        c.push_images(Vec::new());
        assert_eq!(c.messages().len(), 6, "no images, no message");
        for name in ["c.png", "d.png", "e.png"] {
            c.push_images(vec![image(name)]);
        }
        let m = c.messages();
        assert_eq!(
            m[5]["content"],
            "[Berth: view_image showed a.png, b.png here earlier in this turn; view it again to see it]"
        );
        assert_eq!(c.images().0, 3, "the latest three kept");
        assert!(m[8]["content"][1]["image_url"]["url"].is_string());
        // Five in one step: its last three are shown, the first two named as not shown,
        // and no earlier image stays.
        c.push_images(["1.png", "2.png", "3.png", "4.png", "5.png"].map(image).to_vec());
        let m = c.messages();
        let last = &m[m.len() - 1]["content"];
        let text = last[0]["text"].as_str().unwrap();
        assert!(text.contains("in order: 3.png, 4.png, 5.png"), "{text}");
        assert!(
            text.contains("not shown, as at most 3 images are shown at once: 1.png, 2.png"),
            "{text}"
        );
        assert_eq!(c.images().0, 3);
        assert!(m[6]["content"].is_string() && m[7]["content"].is_string() && m[8]["content"].is_string());
    }
}
