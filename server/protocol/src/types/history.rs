//! History: positions, `session.history` pages and their rows, `session.source`, and
//! `session.watch`.

use serde::{Deserialize, Serialize};

/// A row's address: the event that emitted it, then its ordinal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Position {
    pub source_sequence: i64,
    pub item_index: i32,
}

/// `session.history` parameters.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionHistoryParams {
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub through: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Position>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// Page byte budget (default and maximum set by the server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u32>,
    /// Open one row or one event under the fence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<HistoryTarget>,
}

/// What `session.history` opens when given a `target`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum HistoryTarget {
    Row { position: Position, field: RowField },
    Event { sequence: i64 },
}

/// A row's text fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum RowField {
    Body,
    Thinking,
}

/// A field cut to fit the page: `returned` bytes of `bytes` are in the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Truncation {
    pub truncated: bool,
    pub bytes: u64,
    pub returned: u64,
}

/// `session.source`: read a row's field onward from a byte offset.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionSourceParams {
    pub session_id: String,
    pub position: Position,
    pub field: RowField,
    #[serde(default, deserialize_with = "crate::null_default")]
    #[cfg_attr(feature = "schema", schemars(with = "Option<u64>"))]
    pub offset: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionSourceResult {
    pub data: String,
    pub offset: u64,
    /// Where the next read starts (exclusive of what this one returned); null at the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u64>,
    pub bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionHistoryResult {
    pub through: i64,
    pub rows: Vec<Row>,
    /// The next page's `after`; `null` on the last page (SPEC: "null ends").
    #[serde(default)]
    pub next_after: Option<Position>,
}

/// What a row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum RowKind {
    User,
    Assistant,
    ToolCall,
    ToolResult,
    Notice,
    /// A compaction's summary of the history before its `keepFrom` (SPEC §4.17): what the
    /// model is sent instead of those rows, which stay readable.
    Handoff,
}

impl RowKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RowKind::User => "user",
            RowKind::Assistant => "assistant",
            RowKind::ToolCall => "toolCall",
            RowKind::ToolResult => "toolResult",
            RowKind::Notice => "notice",
            RowKind::Handoff => "handoff",
        }
    }

    pub fn parse(s: &str) -> Option<RowKind> {
        Some(match s {
            "user" => RowKind::User,
            "assistant" => RowKind::Assistant,
            "toolCall" => RowKind::ToolCall,
            "toolResult" => RowKind::ToolResult,
            "notice" => RowKind::Notice,
            "handoff" => RowKind::Handoff,
            _ => return None,
        })
    }
}

/// A tool row's tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ToolInfo {
    pub name: String,
    pub call_id: String,
    /// A [`ToolStatus`](crate::worker::ToolStatus).
    #[cfg_attr(feature = "schema", schemars(with = "crate::worker::ToolStatus"))]
    pub status: String,
}

/// A conversation item published by an event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Row {
    pub position: Position,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    pub kind: RowKind,
    pub body: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<ToolInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<bool>,
    /// Fields cut to fit the page, by field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<std::collections::BTreeMap<RowField, Truncation>>,
    /// A user row's attachments, in the order they were sent; on a channel session's reply
    /// row, the files the model attached during its turn (`attach_file`), in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachments: Option<Vec<RowAttachment>>,
}

/// An attachment as a history row names it.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RowAttachment {
    pub attachment_id: String,
    pub name: String,
    pub mime_type: String,
    pub bytes: u64,
    /// Lowercase hex SHA-256.
    pub sha256: String,
}

/// A row before the store gives it a position (what a worker or the API tier publishes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct NewRow {
    pub kind: RowKind,
    pub body: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<ToolInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<bool>,
}

impl NewRow {
    /// The user's prompt as the row a turn starts with.
    pub fn user(prompt: &str) -> NewRow {
        NewRow {
            kind: RowKind::User,
            body: prompt.to_string(),
            thinking: None,
            tool: None,
            hidden: None,
        }
    }
}

/// `session.watch` parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionWatchParams {
    pub session_id: String,
    #[serde(default, deserialize_with = "crate::null_default")]
    #[cfg_attr(feature = "schema", schemars(with = "Option<i64>"))]
    pub after: i64,
}
