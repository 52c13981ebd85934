//! Parameter, result, event and row types of the client-facing methods.

use serde::{Deserialize, Serialize};

/// `hello` parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct HelloParams {
    pub protocol: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<ClientInfo>,
}

/// Who the client says it is (for logs and metrics only).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ClientInfo {
    pub name: String,
    pub version: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct HelloResult {
    pub protocol: u32,
    pub server_version: String,
    pub replica_id: String,
    pub tenant_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// The signed-in person's email (absent for a credential without a user).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    pub role: String,
    /// Host-level notices (e.g. no model provider configured).
    #[serde(default)]
    pub notices: Vec<Notice>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PingResult {
    pub pong: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct StatusResult {
    pub server_version: String,
    pub protocol: u32,
    pub replica_id: String,
    /// The default model endpoint's answer, when `probeModel` asked for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelProbe>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct StatusParams {
    /// Also check, from this replica, that the default model endpoint answers (`berth
    /// doctor`): one `GET <base URL>/models`, without the provider key.
    #[serde(default, deserialize_with = "crate::null_default")]
    #[cfg_attr(feature = "schema", schemars(with = "Option<bool>"))]
    pub probe_model: bool,
}

/// Whether the server's default model endpoint answered a probe. The endpoint itself is not
/// named (it is the operator's configuration).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ModelProbe {
    /// The default model, if one is configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// An HTTP answer came (any status: without the key a 401 is an answer too).
    pub answered: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    /// Why it did not answer: a `CauseCode` (`provider-unconfigured`, `provider-timeout`,
    /// `provider-unreachable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(with = "Option<crate::CauseCode>"))]
    pub error: Option<String>,
}

/// A workspace as the client sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Workspace {
    pub workspace_id: String,
    pub title: String,
    pub host: String,
    pub path: String,
    pub online: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_at: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceRef {
    pub workspace_id: String,
}

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
    /// The running turn's id, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<String>,
    /// How many turns are queued.
    pub queued: u32,
    /// The queued turns in order (previews, not whole prompts).
    pub queue: Vec<QueueEntry>,
    /// The history revision (what `session.fork` is guarded by).
    pub history_revision: i64,
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
    /// The running turn's id, if any (as in the snapshot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
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

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TurnRef {
    pub turn_id: String,
    pub state: TurnState,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct QueueUpdateParams {
    pub session_id: String,
    pub queue_id: String,
    pub queue_revision: i64,
    pub prompt: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct QueueMoveParams {
    pub session_id: String,
    pub queue_id: String,
    pub queue_revision: i64,
    /// Move before this entry; absent or null moves to the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_queue_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct QueueRemoveParams {
    pub session_id: String,
    pub queue_id: String,
    pub queue_revision: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

/// The queue after a change (also the payload of `queue.changed`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct QueueState {
    pub queue: Vec<QueueEntry>,
    pub paused: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct OperationReceiptParams {
    pub operation_id: String,
}

/// A stored operation receipt (`operation.receipt`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ReceiptView {
    pub operation_id: String,
    /// The method the operation called.
    pub method: String,
    pub state: ReceiptState,
    /// The method's result (its result type), when it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    /// The method's typed error, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<crate::RpcError>,
    pub created_at: String,
}

/// Where an operation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum ReceiptState {
    /// The first attempt is still running (a retry answers `operation-in-progress`).
    Pending,
    /// The outcome is stored (`result` or `error`).
    Done,
}

/// A notice: a fact for the client to word, never a sentence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Notice {
    /// A [`NoticeLevel`](crate::NoticeLevel).
    #[cfg_attr(feature = "schema", schemars(with = "crate::NoticeLevel"))]
    pub level: String,
    /// A [`NoticeCode`](crate::NoticeCode); `params` depend on it.
    #[cfg_attr(feature = "schema", schemars(with = "crate::NoticeCode"))]
    pub code: String,
    #[serde(default)]
    pub params: serde_json::Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionDiagnosticsParams {
    pub session_id: String,
    /// The fence: the diagnostic revision (not a history sequence) the pages are read
    /// under; absent for the current one, then pass back the answer's `throughRevision`.
    /// Also read as `through`, its earlier name.
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "through")]
    pub through_revision: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Diagnostic {
    pub diagnostic_id: String,
    /// The session's diagnostic revision this record was written at (its own counter,
    /// independent of history).
    pub diagnostic_revision: i64,
    /// A [`DiagnosticKind`](crate::DiagnosticKind): `tool` is something a turn went on
    /// without (e.g. an MCP server that did not start: `mcp-server-unavailable`).
    #[cfg_attr(feature = "schema", schemars(with = "crate::DiagnosticKind"))]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<i64>,
    pub cause: Cause,
    pub at: String,
}

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

/// A `session.watchDiagnostics` item: the session's diagnostic revision now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct DiagnosticsRevision {
    pub diagnostic_revision: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionDiagnosticsResult {
    /// The diagnostic revision fence these pages are read under.
    pub through_revision: i64,
    pub diagnostics: Vec<Diagnostic>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_before: Option<i64>,
}

/// A queued turn as the queue shows it: a preview of its prompt, never the whole text
/// (`queue.get` reads that). `queueId` is the turn's id (`trn_…`); both are given so that
/// queue edits and turn references read naturally.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct QueueEntry {
    pub queue_id: String,
    pub turn_id: String,
    /// Guards `queue.update`, `queue.move`, `queue.remove` (stale → `stale-revision`).
    pub queue_revision: i64,
    /// The prompt's first [`crate::QUEUE_PREVIEW_BYTES`] bytes at most (cut on a character boundary).
    pub preview: String,
    /// The whole prompt's length in bytes (more than the preview's: it was cut).
    pub prompt_bytes: u64,
}

/// `queue.get`: one queued turn's whole prompt.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct QueueGetParams {
    pub session_id: String,
    pub queue_id: String,
}

/// A queued turn with its whole prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct QueuedPrompt {
    pub queue_id: String,
    pub turn_id: String,
    pub queue_revision: i64,
    pub prompt: String,
}

/// `content.upload` parameters: the request is followed by one binary WebSocket message
/// whose first four bytes are this request's id (big-endian u32) and the rest the bytes.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContentUploadParams {
    pub session_id: String,
    /// The content type (`image/png`, `text/plain`, …).
    pub mime: String,
    /// The file's name as the user knows it (no directories).
    pub filename: String,
    /// The payload's size, if the client knows it: a binary message of another size (a
    /// truncated one) is `bad-params {reason: "size-mismatch"}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

/// `content.read` parameters: a page of an attachment's bytes.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContentReadParams {
    pub attachment_id: String,
    /// The `nextAfter` of the previous page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

/// The most bytes of an attachment one `content.read` page carries (before base64).
pub const CONTENT_PAGE_BYTES: usize = 256 << 10;

/// One page of an attachment's bytes: at most [`CONTENT_PAGE_BYTES`].
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContentReadResult {
    pub attachment: RowAttachment,
    /// The byte offset of `data` in the attachment.
    pub offset: u64,
    /// The page's bytes, base64 (standard alphabet, padded).
    pub data: String,
    /// Pass as `after` for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<String>,
}

/// An uploaded attachment, to name in `session.send {attachments}`.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContentUploadResult {
    pub attachment_id: String,
    pub bytes: u64,
    /// Lowercase hex SHA-256 of the bytes.
    pub sha256: String,
}

/// `session.send` parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionSendParams {
    pub session_id: String,
    pub prompt: String,
    #[serde(default, deserialize_with = "crate::null_default")]
    #[cfg_attr(feature = "schema", schemars(with = "Option<Vec<String>>"))]
    pub attachments: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionSendResult {
    pub turn_id: String,
    pub state: TurnState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_revision: Option<i64>,
}

/// A turn's lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum TurnState {
    Queued,
    Running,
    Completed,
    Failed,
    Cancelled,
    Interrupted,
}

impl TurnState {
    pub fn as_str(self) -> &'static str {
        match self {
            TurnState::Queued => "queued",
            TurnState::Running => "running",
            TurnState::Completed => "completed",
            TurnState::Failed => "failed",
            TurnState::Cancelled => "cancelled",
            TurnState::Interrupted => "interrupted",
        }
    }

    pub fn parse(s: &str) -> Option<TurnState> {
        Some(match s {
            "queued" => TurnState::Queued,
            "running" => TurnState::Running,
            "completed" => TurnState::Completed,
            "failed" => TurnState::Failed,
            "cancelled" => TurnState::Cancelled,
            "interrupted" => TurnState::Interrupted,
            _ => return None,
        })
    }

    pub fn is_settled(self) -> bool {
        !matches!(self, TurnState::Queued | TurnState::Running)
    }
}

/// Why a turn failed: a typed code plus safe fields, never a provider body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Cause {
    /// A [`CauseCode`](crate::CauseCode), or `refused-<error code>`.
    #[cfg_attr(feature = "schema", schemars(with = "crate::codes::CauseCodeWire"))]
    pub code: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
}

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
    #[serde(default, skip_serializing_if = "Option::is_none")]
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

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SubscriptionCloseParams {
    pub id: u32,
}

/// `admin.credential.create`: a user credential (`userId`) or a worker credential (`worker: true`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AdminCredentialCreateParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(default, deserialize_with = "crate::null_default")]
    #[cfg_attr(feature = "schema", schemars(with = "Option<bool>"))]
    pub worker: bool,
    #[serde(default, deserialize_with = "crate::null_default")]
    #[cfg_attr(feature = "schema", schemars(with = "Option<String>"))]
    pub note: String,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

/// A credential as administrators see it (never the secret, except `token` once at creation).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct CredentialView {
    pub credential_id: String,
    /// `user` or `worker`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_email: Option<String>,
    pub note: String,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<String>,
    /// The plaintext, present only in the response that created it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AdminCredentialRevokeParams {
    pub credential_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Revoked {
    pub revoked: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AdminUserCreateParams {
    pub email: String,
    /// `admin` or `member` (default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct UserView {
    pub user_id: String,
    pub email: String,
    pub role: String,
    pub disabled: bool,
    pub has_password: bool,
    pub created_at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AdminUserDisableParams {
    pub user_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Disabled {
    pub disabled: bool,
}

/// `admin.user.setRole`: make a user an `admin` or a `member`. Their live connections close
/// (they sign in again with the new role); the tenant's last enabled admin cannot be demoted.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AdminUserSetRoleParams {
    pub user_id: String,
    /// `admin` or `member`.
    pub role: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

/// `admin.audit.list`: the tenant's audit log, newest first.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AdminAuditListParams {
    /// The previous page's `nextBefore`; absent for the newest entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<i64>,
    /// Entries per page (default and maximum 200).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// One audited administrative action.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    pub audit_id: i64,
    pub at: String,
    /// Who did it: a user id, a credential id, `cli` or `bootstrap`.
    pub actor: String,
    /// What was done, e.g. `credential.create`, `credential.revoke`, `user.create`,
    /// `user.disable`, `user.role`, `user.password`, `tenant.create`.
    pub action: String,
    /// The id it was done to.
    pub target: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AuditPage {
    pub entries: Vec<AuditEntry>,
    /// Pass back as `before` for older entries; absent at the oldest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_before: Option<i64>,
}

/// A worker credential and where its worker is: `admin.worker.list`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct WorkerView {
    pub credential_id: String,
    pub note: String,
    /// The host the credential is bound to (on its first connection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// A live connection of this credential is present.
    pub online: bool,
    /// The replica holding that connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connected_at: Option<String>,
    /// The latest heartbeat, else the credential's last use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<String>,
    /// The workspaces registered from its host.
    pub workspace_ids: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AdminStatus {
    pub replica_id: String,
    /// Replicas holding a worker connection of this tenant.
    pub replicas: Vec<String>,
    pub connected_workers: i64,
    pub running_turns: i64,
    pub queue_depth: i64,
}

/// The tool call an approval holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct InteractionTool {
    pub name: String,
    pub call_id: String,
}

/// Where an interaction stands. Everything but `pending` is final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum InteractionState {
    Pending,
    /// A user answered.
    Answered,
    /// Nobody answered in time: the fallback answered.
    Expired,
    /// Nobody watched the session when it was asked: the fallback answered at once.
    Unwatched,
    /// The session has `autoApprove`: approved without asking.
    Auto,
    /// Its turn ended (stopped, interrupted, settled) before an answer: the fallback is recorded.
    Closed,
}

impl InteractionState {
    pub fn as_str(self) -> &'static str {
        match self {
            InteractionState::Pending => "pending",
            InteractionState::Answered => "answered",
            InteractionState::Expired => "expired",
            InteractionState::Unwatched => "unwatched",
            InteractionState::Auto => "auto",
            InteractionState::Closed => "closed",
        }
    }

    pub fn parse(s: &str) -> Option<InteractionState> {
        Some(match s {
            "pending" => InteractionState::Pending,
            "answered" => InteractionState::Answered,
            "expired" => InteractionState::Expired,
            "unwatched" => InteractionState::Unwatched,
            "auto" => InteractionState::Auto,
            "closed" => InteractionState::Closed,
            _ => return None,
        })
    }
}

/// An interaction's answer: `{approved}` for approvals, `{choice}` for questions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum InteractionOutcome {
    Approval { approved: bool },
    Choice { choice: Option<String> },
}

/// The kind of interaction that holds a tool call; every other kind is a question.
pub const INTERACTION_APPROVAL: &str = crate::InteractionKind::Approval.as_str();

/// A held tool call (`kind: "approval"`) or a question, as clients see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Interaction {
    pub interaction_id: String,
    /// An [`InteractionKind`](crate::InteractionKind).
    #[cfg_attr(feature = "schema", schemars(with = "crate::InteractionKind"))]
    pub kind: String,
    pub session_id: String,
    pub turn_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<InteractionTool>,
    /// The tool's arguments (approvals) or the question (questions).
    pub input: serde_json::Value,
    /// The choices a question offers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<Vec<String>>,
    /// Question parameters for the client to word the prompt with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<serde_json::Value>,
    /// The outcome recorded when nobody answers (expiry, nobody watching).
    pub fallback: InteractionOutcome,
    pub created_at: String,
    pub expires_at: String,
    pub state: InteractionState,
    /// The recorded outcome once resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<InteractionOutcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_at: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct InteractionRef {
    pub interaction_id: String,
}

/// `session.respond`: `answer` is `{approved: bool}` (approvals) or `{choice: string|null}`
/// (questions; a choice must be one of the options when the question offers any).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionRespondParams {
    pub interaction_id: String,
    pub answer: serde_json::Value,
    #[serde(default)]
    pub operation_id: Option<String>,
}

/// How an interaction was resolved: the `session.respond` result and the payload of
/// `interaction.resolved`. A second answer gets `interaction-closed` with `state` and
/// `outcome` as error fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct InteractionResolution {
    pub interaction_id: String,
    pub state: InteractionState,
    pub outcome: InteractionOutcome,
    /// The user (or credential) that answered, for `answered`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `session.diagnostics`'s fence is `throughRevision`; `through`, its earlier name, is
    /// still read as it.
    #[test]
    fn the_diagnostics_fence_reads_its_earlier_name() {
        for name in ["throughRevision", "through"] {
            let p: SessionDiagnosticsParams =
                serde_json::from_value(serde_json::json!({"sessionId": "ses_1", name: 7})).unwrap();
            assert_eq!(p.through_revision, Some(7), "{name}");
        }
        let r = SessionDiagnosticsResult {
            through_revision: 7,
            diagnostics: Vec::new(),
            next_before: None,
        };
        assert_eq!(
            serde_json::to_value(r).unwrap(),
            serde_json::json!({"throughRevision": 7, "diagnostics": []})
        );
    }
}
