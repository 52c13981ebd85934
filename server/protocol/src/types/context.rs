//! What a model request held (`session.context`) and compaction (`session.compact`).

use serde::{Deserialize, Serialize};

use super::Position;

/// `session.context` parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionContextParams {
    pub session_id: String,
    /// The history sequence fence: the latest request made at or before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub through: Option<i64>,
}

/// `session.context`: the latest main model request the session prepared (null: none yet).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionContextResult {
    /// The history sequence fence the report was read under: the `through` asked for
    /// (at most the session's last sequence), or the last sequence when none was.
    pub through: i64,
    pub request: Option<ContextReport>,
}

/// What one model request held. Token counts are estimates (about four bytes a token);
/// `inputTokens` is what the provider reported (null until and unless it did).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ContextReport {
    pub turn_id: Option<String>,
    /// The session's last event sequence when the request was made.
    pub sequence: i64,
    pub provider: Option<String>,
    pub model: Option<String>,
    /// The input grouped by role, in order of first appearance.
    pub roles: Vec<RoleInput>,
    pub tools: Vec<ToolSchemaSize>,
    pub estimated_tokens: u64,
    pub input_tokens: Option<u64>,
    pub at: String,
    /// The compaction in effect when the request was made: the rows before `keepFrom` were
    /// sent as the handoff row's summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<Compaction>,
}

/// A compaction (SPEC §4.17): the handoff row that summarizes the history before `keepFrom`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Compaction {
    /// The handoff row.
    pub handoff: Position,
    /// The first row still sent as itself.
    pub keep_from: Position,
}

/// `session.compact`: summarize the session's history so far into a handoff row.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionCompactParams {
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

/// What `session.compact` did: the new compaction, or none when there was nothing to
/// compact (`compacted: false`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionCompactResult {
    pub compacted: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<Compaction>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct RoleInput {
    pub role: String,
    pub messages: u64,
    pub bytes: u64,
    pub estimated_tokens: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ToolSchemaSize {
    pub name: String,
    pub bytes: u64,
    pub estimated_tokens: u64,
}
