//! Sessions: `session.create` (kinds, limits), the snapshot a client draws a session
//! from, `session.list`, and the session-wide changes (rename, model, remove, clear, pause,
//! stop).

use serde::{Deserialize, Serialize};

use super::{Interaction, QueueEntry};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionRef {
    pub session_id: String,
}

/// `session.create` parameters.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionCreateParams {
    pub workspace_id: String,
    /// At most 1000 bytes of UTF-8 ([`MAX_SESSION_TITLE_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_tools: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_approve: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// How many levels of sessions below this one it may start (sub-agents, a
    /// coordinator's children), at most [`MAX_DELEGATION_DEPTH`]; default 1, or 2 for a
    /// coordinator (so that its children may still start sub-agents).
    ///
    /// A budget that counts **down**: a child gets one less, and 0 starts nothing. This is
    /// the opposite direction of the client protocol it came from, whose `delegation_depth`
    /// counts **up** (how deep the client itself already is, 0 at the top, checked against
    /// a fixed limit). A client bridging from there sends `MAX_DELEGATION_DEPTH - its depth`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegation_depth: Option<u32>,
    /// `coordinator`: the session directs sessions in the tenant's workspaces (SPEC §4.15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<SessionKind>,
    /// The agent definition the session uses (its id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The chat channel the answers are read on (at most [`MAX_CHANNEL_BYTES`], no control
    /// characters): the model is told to answer in short plain text, and with tools it
    /// gets `attach_file`, whose files come back on its reply row (`attachments`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
}

/// The longest `session.create {channel}`, in bytes of UTF-8.
pub const MAX_CHANNEL_BYTES: usize = 128;

/// The longest session title a client (or a coordinator's child start) may set, in bytes of
/// UTF-8: `session.create {title}`, `session.rename {title}`.
pub const MAX_SESSION_TITLE_BYTES: usize = 1000;

/// The deepest nesting `session.create {delegationDepth}` may ask for.
pub const MAX_DELEGATION_DEPTH: u32 = 4;

/// What a session is for (`session.create {kind}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum SessionKind {
    Coordinator,
}

impl SessionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionKind::Coordinator => "coordinator",
        }
    }

    pub fn parse(s: &str) -> Option<SessionKind> {
        (s == "coordinator").then_some(SessionKind::Coordinator)
    }
}

/// What a session is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum SessionPhase {
    Idle,
    Running,
}

/// Where a session's effective model came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum ModelLevel {
    Session,
    Agent,
    Tenant,
}

/// Everything a reconnecting client needs to draw a session.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionSnapshot {
    pub session_id: String,
    pub workspace_id: String,
    pub title: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_model_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_model_level: Option<ModelLevel>,
    /// The session's agent definition, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    pub phase: SessionPhase,
    /// The running turn's id; `null` when none runs.
    #[serde(default)]
    pub running: Option<String>,
    /// How many turns are queued.
    pub queued: u32,
    /// The queued turns in order (previews, not whole prompts).
    pub queue: Vec<QueueEntry>,
    /// The history revision (what `session.fork` is guarded by).
    pub history_revision: i64,
    /// SPEC §4.3's name for `historyRevision` (the same value).
    #[serde(default)]
    pub revision: i64,
    /// Last event sequence.
    pub sequence: i64,
    /// The queue is held (`session.pause`).
    pub paused: bool,
    /// Interactions waiting for an answer, oldest first.
    pub pending_interactions: Vec<Interaction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Absent for an ordinary session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<SessionKind>,
    /// The session that started this one (a coordinator, or a delegate call's session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The chat channel its answers are read on (`session.create {channel}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// For a fork: the session, turn and sequence it was forked from (as `session.fork`
    /// answered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<crate::search::Branch>,
    /// How many levels of sessions below it this one may still start (a budget counting
    /// down: a child has one less; see [`SessionCreateParams::delegation_depth`]).
    pub delegation_depth: u32,
    pub created_at: String,
    pub updated_at: String,
}

/// `session.list` parameters.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionListParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The previous page's `nextAfter`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionListResult {
    pub entries: Vec<SessionListEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<String>,
}

/// One `session.list` entry (no message bodies).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionListEntry {
    pub session_id: String,
    pub workspace_id: String,
    pub title: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_model_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_model_level: Option<ModelLevel>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    pub message_count: i64,
    pub updated_at: String,
    pub phase: SessionPhase,
    /// The running turn's id; `null` when none runs (as in the snapshot).
    #[serde(default)]
    pub running: Option<String>,
    /// How many turns are queued (as in the snapshot).
    pub queued: u32,
    /// For a fork: what it was forked from (the `Branch` of `session.fork`'s answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<crate::search::Branch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<SessionKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionRenameParams {
    pub session_id: String,
    /// At most 1000 bytes of UTF-8 ([`MAX_SESSION_TITLE_BYTES`]).
    pub title: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionSetModelParams {
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

/// `session.remove`, `session.clear`: a session and an optional operation id.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionOpParams {
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Removed {
    pub removed: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Cleared {
    /// The `session.cleared` event's sequence.
    pub sequence: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionPauseParams {
    pub session_id: String,
    pub paused: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionStopParams {
    pub session_id: String,
    pub turn_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}
