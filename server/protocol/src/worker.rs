//! The worker protocol: JSON-RPC 2.0 over the worker's outbound WebSocket (`GET /v1/worker`).
//!
//! Worker → server requests: `worker.hello`, `turn.history` (the session's rows before the
//! turn, in pages; `turn.source` reads on a field a page cut), `turn.step`, `turn.toolStatus`, `turn.toolEnded`, `turn.interaction`,
//! `turn.end`, `turn.delegate`; for a coordinator's turn `turn.workspaces`,
//! `turn.childStart`, `turn.childSend`, `turn.childWait`, `turn.childStop`; `turn.notice` (a
//! problem the turn goes on without, e.g. an MCP server that did not start); notification
//! `turn.delta`. Server → worker notifications: `turn.run` (the
//! turn's settings only), `turn.stop {turnId}` (the turn was cancelled: stop working on it;
//! the server has already settled it).
//!
//! Model calls go to the API tier's proxy ([`MODEL_PROXY_PATH`]) with the worker credential
//! and the turn named in [`MODEL_PROXY_TURN_HEADER`].
//!
//! Observation calls (git, files) go the other way: the server sends a `call` request (its
//! own id space), the worker streams `call.item` notifications for subscriptions and then
//! answers the request. The worker keeps at most [`CALL_WINDOW`] items of a call unacknowledged;
//! the server returns credit with `call.ack` as the items are consumed, and `call.cancel`
//! stops a call early. A `files.read` chunk goes as a binary message ([`chunk_frame`]) to a
//! server that announced [`WorkerHelloResult::binary_chunks`].

use serde::{Deserialize, Serialize};

use crate::{
    Cause, InteractionOutcome, InteractionState, InteractionTool, NewRow, Position, Row, RowField, TurnState, Workspace,
};

pub const WORKER_HELLO: &str = "worker.hello";
pub const TURN_RUN: &str = "turn.run";
pub const TURN_DELTA: &str = "turn.delta";
pub const TURN_STEP: &str = "turn.step";
pub const TURN_END: &str = "turn.end";
pub const TURN_STOP: &str = "turn.stop";
pub const TURN_HISTORY: &str = "turn.history";
pub const TURN_SOURCE: &str = "turn.source";
pub const TURN_TOOL_STATUS: &str = "turn.toolStatus";
pub const TURN_TOOL_ENDED: &str = "turn.toolEnded";
pub const TURN_INTERACTION: &str = "turn.interaction";
pub const TURN_DELEGATE: &str = "turn.delegate";
pub const TURN_WORKSPACES: &str = "turn.workspaces";
pub const TURN_CHILD_START: &str = "turn.childStart";
pub const TURN_CHILD_SEND: &str = "turn.childSend";
pub const TURN_CHILD_WAIT: &str = "turn.childWait";
pub const TURN_CHILD_STOP: &str = "turn.childStop";
pub const TURN_COMPACT: &str = "turn.compact";
pub const TURN_SKILL: &str = "turn.skill";
pub const TURN_NOTICE: &str = "turn.notice";
/// The largest answer a worker sends for a `call`: a larger one goes out as
/// `payload-too-large {limit: "answer", max}` instead, so that no observation (a status of a
/// huge dirty tree, say) is ever a message the API tier refuses — which would close the
/// connection that carries the worker's turns (`BERTH_MAX_TEXT_MESSAGE`, 8 MiB by default).
pub const CALL_ANSWER_MAX: usize = 4 << 20;

/// Worker → server: the turn's plan as its model set it ([`TurnPlan`]).
pub const TURN_PLAN: &str = "turn.plan";
pub const CALL: &str = "call";
pub const CALL_ITEM: &str = "call.item";
pub const CALL_ACK: &str = "call.ack";
pub const CALL_CANCEL: &str = "call.cancel";

/// Items of one call the worker may send before the server acknowledges them.
pub const CALL_WINDOW: u32 = 32;

/// Server → worker: answer a client method for one of the worker's workspaces. `method` is
/// the client method's name (`git.status`, `files.read`, …); `params` are its parameters
/// with the session resolved away.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Call {
    pub workspace_id: String,
    pub method: String,
    #[serde(default)]
    pub params: serde_json::Value,
}

/// Worker → server: one subscription item of call `call_id`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallItem {
    pub call_id: u32,
    pub item: serde_json::Value,
}

/// A `files.read` chunk item as one binary WebSocket message (worker → server), sent only
/// to a server whose hello set [`WorkerHelloResult::binary_chunks`]: [`CHUNK_FRAME_TAG`],
/// the call id (u32, big-endian), the chunk's offset (u64, big-endian), then the chunk's
/// raw bytes. It stands for the item `{type: "chunk", offset, dataBase64}` and counts
/// against the call's credit like any `call.item`; no hop has to parse or re-validate the
/// bytes, and base64 is done once, where the client's JSON is written.
pub const CHUNK_FRAME_TAG: u8 = 1;
/// The length of a chunk frame's header (tag, call id, offset).
pub const CHUNK_FRAME_HEADER: usize = 1 + 4 + 8;

/// A chunk frame around `data`, in one sized buffer.
pub fn chunk_frame(call_id: u32, offset: u64, data: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(CHUNK_FRAME_HEADER + data.len());
    frame.push(CHUNK_FRAME_TAG);
    frame.extend_from_slice(&call_id.to_be_bytes());
    frame.extend_from_slice(&offset.to_be_bytes());
    frame.extend_from_slice(data);
    frame
}

/// A chunk frame's call id and offset; its data is `frame[CHUNK_FRAME_HEADER..]`. None when
/// `frame` is not a chunk frame (too short, or another tag).
pub fn chunk_frame_header(frame: &[u8]) -> Option<(u32, u64)> {
    if frame.len() < CHUNK_FRAME_HEADER || frame[0] != CHUNK_FRAME_TAG {
        return None;
    }
    let call_id = u32::from_be_bytes(frame[1..5].try_into().ok()?);
    let offset = u64::from_be_bytes(frame[5..13].try_into().ok()?);
    Some((call_id, offset))
}

/// A run of consecutive `files.read` chunks as one binary WebSocket message (worker →
/// server), sent only to a server whose hello set [`WorkerHelloResult::chunk_runs`]:
/// [`CHUNK_RUN_TAG`], the call id (u32, big-endian), the run's offset (u64, big-endian), a
/// flags byte ([`CHUNK_RUN_TEXT`]: cut on UTF-8 boundaries), then at most
/// [`CHUNK_RUN_BYTES`] raw bytes starting and ending on chunk boundaries. It stands for the
/// chunk items [`crate::files_read_chunk_ends`] cuts it into (the replica writing the
/// client's items cuts it so) and counts that many items against the call's credit: one
/// message, one wake-up per hop for up to 8 chunks.
pub const CHUNK_RUN_TAG: u8 = 2;
/// The length of a chunk run's header (tag, call id, offset, flags).
pub const CHUNK_RUN_HEADER: usize = 1 + 4 + 8 + 1;
/// A chunk run's flag: a text file's bytes, cut on UTF-8 boundaries.
pub const CHUNK_RUN_TEXT: u8 = 1;
/// The most bytes one chunk run carries.
pub const CHUNK_RUN_BYTES: usize = 256 << 10;

/// A chunk run frame around `data`, in one sized buffer.
pub fn chunk_run_frame(call_id: u32, offset: u64, text: bool, data: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(CHUNK_RUN_HEADER + data.len());
    frame.push(CHUNK_RUN_TAG);
    frame.extend_from_slice(&call_id.to_be_bytes());
    frame.extend_from_slice(&offset.to_be_bytes());
    frame.push(if text { CHUNK_RUN_TEXT } else { 0 });
    frame.extend_from_slice(data);
    frame
}

/// A chunk run's call id, offset and text flag; its data is `frame[CHUNK_RUN_HEADER..]`.
/// None when `frame` is not a chunk run.
pub fn chunk_run_header(frame: &[u8]) -> Option<(u32, u64, bool)> {
    if frame.len() < CHUNK_RUN_HEADER || frame[0] != CHUNK_RUN_TAG {
        return None;
    }
    let call_id = u32::from_be_bytes(frame[1..5].try_into().ok()?);
    let offset = u64::from_be_bytes(frame[5..13].try_into().ok()?);
    Some((call_id, offset, frame[13] & CHUNK_RUN_TEXT != 0))
}

/// Server → worker: `items` more items of call `call_id` may be sent.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallAck {
    pub call_id: u32,
    pub items: u32,
}

/// Server → worker: stop call `call_id` (its answer is no longer wanted).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallCancel {
    pub call_id: u32,
}

/// One item of a `patch.snapshot` call: the next piece of the patch text (at most
/// [`PATCH_CHUNK_BYTES`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PatchChunk {
    pub text: String,
}

/// The answer of a `patch.snapshot` call, after its chunks.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PatchCaptured {
    /// HEAD's commit; absent when the repository has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    pub files: u32,
}

/// The most bytes of patch text one [`PatchChunk`] carries.
pub const PATCH_CHUNK_BYTES: usize = 64 << 10;

/// The most workspaces one `worker.hello` may declare.
pub const HELLO_WORKSPACES_MAX: usize = 256;
/// The longest `worker.hello` `host` (and `replaces`), in bytes.
pub const HELLO_HOST_BYTES_MAX: usize = 256;
/// The longest workspace `name` of a `worker.hello`, in bytes.
pub const HELLO_NAME_BYTES_MAX: usize = 256;
/// The longest workspace `path` of a `worker.hello`, in bytes.
pub const HELLO_PATH_BYTES_MAX: usize = 4096;

/// A hello past [`HELLO_WORKSPACES_MAX`] workspaces, or with a string past its bound
/// ([`HELLO_HOST_BYTES_MAX`], [`HELLO_NAME_BYTES_MAX`], [`HELLO_PATH_BYTES_MAX`]), is
/// refused with `bad-params {field, max}` and the connection closed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerHello {
    pub protocol: u32,
    /// The machine's stable name; a workspace keeps its identity by (host, name).
    pub host: String,
    pub workspaces: Vec<WorkspaceDecl>,
    /// The connection this worker held before this one (its `connectionId`), which it has
    /// given up: the server ends that connection's running turns `interrupted` now rather
    /// than when its presence goes stale (its replica may have died without a word).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaces: Option<String>,
    /// The worker process: a random key it makes at start and keeps in memory only. While a
    /// connection of this credential from another process (or one without a key) is live, the
    /// hello is refused (`conflict {reason: "worker-running"}`): the token alone, which the
    /// commands the worker runs can read, does not let a second process connect beside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// The worker is shutting down (see [`WORKER_DRAINING`]): this connection is handed no
    /// turns, only those it carries over.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub draining: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkspaceDecl {
    pub name: String,
    pub path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerHelloResult {
    pub workspaces: Vec<RegisteredWorkspace>,
    /// The server stores a `turn.end`'s [`TurnEnd::step`] with the end, in one
    /// transaction. A worker sends its last step that way only when this is set (an older
    /// server would ignore the field and lose the step).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub end_carries_step: bool,
    /// The server takes `files.read` chunks as binary chunk frames ([`chunk_frame`]). A
    /// worker sends them only when this is set (an older server reads text frames only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub binary_chunks: bool,
    /// The server takes runs of `files.read` chunks as one binary message
    /// ([`chunk_run_frame`]). A worker sends them only when this is set.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub chunk_runs: bool,
    /// This connection's id, for the next `worker.hello`'s `replaces`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegisteredWorkspace {
    pub name: String,
    pub workspace_id: String,
}

/// Server → worker: run this turn. It carries the turn's settings only; the conversation
/// is read with `turn.history`, page by page, so no history size can break the link.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnRun {
    pub turn_id: String,
    pub session_id: String,
    pub workspace_id: String,
    /// The model to ask, if the session or tenant names one.
    pub model: Option<String>,
    /// The session offers the model no tools.
    #[serde(default)]
    pub no_tools: bool,
    /// Tool calls run without asking.
    #[serde(default)]
    pub auto_approve: bool,
    /// How many levels of sub-agents this session may still start (0: no delegate tool).
    #[serde(default)]
    pub delegation_depth: u32,
    /// A coordinator session: the model also gets the tools that direct child sessions
    /// (`turn.workspaces`, `turn.childStart`, `turn.childSend`, `turn.childWait`,
    /// `turn.childStop`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub coordinator: bool,
    /// This turn's attachments, in the order the client named them; their bytes, concatenated
    /// in that order, are fetched from [`ATTACHMENTS_PATH`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<AttachmentMeta>,
    /// The session's agent definition (absent: the built-in defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<crate::TurnAgent>,
    /// The tenant's skills (name and summary); the worker adds the workspace's own and
    /// reads a tenant skill's body with `turn.skill`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<crate::SkillInfo>,
    /// The model's declared context window, in tokens: a turn nearing it compacts
    /// (`turn.compact`). Absent: none declared, no compaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_tokens: Option<u64>,
    /// The chat channel the session's answers are read on: the model is told so, and with
    /// tools it gets `attach_file` (files sent with [`ATTACHMENTS_PATH`] `POST`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// The largest attachment the API tier takes, in bytes (set with `channel`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attachment_bytes: Option<u64>,
    /// The tenant's enabled MCP servers (`mcp.save`), with their header and environment
    /// values; the worker merges them with its own and the workspace's (SPEC §4.16).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<crate::McpServerRun>,
}

/// Worker → server: summarize the session's history before `keepFrom` into a handoff row
/// (the server makes the model call). Answered once it is written (or when the session was
/// already compacted that far); the worker then reads its history again.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnCompact {
    pub turn_id: String,
    pub keep_from: Position,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnCompactResult {
    pub compacted: bool,
}

/// Worker → server: the body of the tenant skill `name` (the model asked to read it).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnSkill {
    pub turn_id: String,
    pub name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnSkillResult {
    pub body: String,
}

/// The compaction a turn's history starts from: its summary stands for every row before
/// `keepFrom`, and the rows from `keepFrom` on follow.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Handoff {
    pub keep_from: Position,
    pub summary: String,
}

/// Worker → server: a page of the session's rows (in order, hidden rows left out) as the
/// turn's conversation so far. `after` is the previous page's `next`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnHistory {
    pub turn_id: String,
    #[serde(default)]
    pub after: Option<Position>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnHistoryResult {
    pub rows: Vec<Row>,
    /// Where the next page starts; null at the end.
    pub next: Option<Position>,
    /// On the first page of a compacted session: the latest compaction, whose summary
    /// stands for the rows before its `keepFrom` (the pages start there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff: Option<Handoff>,
}

/// Worker → server: a delegate call starts a child session (same workspace, `parent` set,
/// one level less of delegation) whose first turn runs `prompt`. Answered at once with the
/// child's ids; the child's turn is handed out like any other. Asking again for the same
/// call answers the same child. Refused with `forbidden` without depth left, `child-limit`
/// `{max}` past the children one turn may start, `payload-too-large` for a prompt past
/// [`crate::MAX_PROMPT_BYTES`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnDelegate {
    pub turn_id: String,
    pub call_id: String,
    pub prompt: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnDelegateResult {
    pub session_id: String,
    pub turn_id: String,
}

/// Worker → server: the tenant's workspaces, for a coordinator's turn.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnWorkspaces {
    pub turn_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnWorkspacesResult {
    pub workspaces: Vec<Workspace>,
}

/// Worker → server: a coordinator's call `call_id` starts a child session in `workspace_id`
/// (`parent` = the coordinator, one level less of depth) whose first turn runs `prompt`.
/// Asking again for the same call answers the same child. Refused with `depth-exceeded`
/// or `child-limit` past the bounds, `not-found` for a workspace the tenant does not have.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnChildStart {
    pub turn_id: String,
    pub call_id: String,
    pub workspace_id: String,
    pub prompt: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The tenant's agent definition the child runs as (its id or name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

/// Worker → server: send `prompt` to a child of the coordinator (it queues behind a turn
/// that runs); stopping the coordinator's turn stops it too.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnChildSend {
    pub turn_id: String,
    pub session_id: String,
    pub prompt: String,
}

/// A child's turn as started or sent.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChildTurn {
    pub session_id: String,
    pub turn_id: String,
    pub state: TurnState,
    /// Whether the child's workspace has a worker online (else the turn waits queued).
    pub online: bool,
}

/// Worker → server: wait until a child's turn (default: its latest) ends, then answer how
/// it ended and its final answer. Answered at once when the child's workspace has no
/// worker online (`online: false`), and after `timeout_secs` (`timedOut`) if it runs on.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnChildWait {
    pub turn_id: String,
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_turn_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChildWaitResult {
    pub session_id: String,
    pub turn_id: String,
    pub state: TurnState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    /// The turn's last assistant text (a completed turn's answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    pub online: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
}

/// Worker → server: stop a child's running and queued turns.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnChildStop {
    pub turn_id: String,
    pub session_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnChildStopResult {
    /// The turns that were stopped (none: the child was idle).
    pub stopped: Vec<String>,
}

/// Worker → server: the rest of a row field a `turn.history` page cut (it is marked
/// `truncated`), from byte `offset`; answered like `session.source`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnSource {
    pub turn_id: String,
    pub position: Position,
    pub field: RowField,
    pub offset: u64,
}

/// A tool call's status: `requested → running → completed | failed | denied`
/// (`requested → denied` when an approval is refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum ToolStatus {
    Requested,
    Running,
    Completed,
    Failed,
    Denied,
}

impl ToolStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolStatus::Requested => "requested",
            ToolStatus::Running => "running",
            ToolStatus::Completed => "completed",
            ToolStatus::Failed => "failed",
            ToolStatus::Denied => "denied",
        }
    }

    pub fn parse(s: &str) -> Option<ToolStatus> {
        Some(match s {
            "requested" => ToolStatus::Requested,
            "running" => ToolStatus::Running,
            "completed" => ToolStatus::Completed,
            "failed" => ToolStatus::Failed,
            "denied" => ToolStatus::Denied,
            _ => return None,
        })
    }

    pub fn is_final(self) -> bool {
        matches!(self, ToolStatus::Completed | ToolStatus::Failed | ToolStatus::Denied)
    }
}

/// Worker → server: a tool call (the `toolCall` row at `position`) changed status; appended
/// as a `tool.status` event, and the row's stored status follows.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnToolStatus {
    pub turn_id: String,
    pub position: Position,
    pub call_id: String,
    pub status: ToolStatus,
}

/// Worker → server: a tool call ended; appended as a `tool.ended` event that publishes the
/// `toolResult` row (the whole output) and sets the call row's final status.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnToolEnded {
    pub turn_id: String,
    /// The `toolCall` row's position.
    pub position: Position,
    pub call_id: String,
    pub status: ToolStatus,
    pub output: String,
}

/// Worker → server: something the turn goes on without (an MCP server that did not start or
/// answer, a malformed MCP configuration). Appended as a `session.notice {level: "warning",
/// code, params}` and recorded as a `tool` diagnostic whose cause is `code`. `params` holds
/// facts (a server name, a reason code), never configuration values or error texts.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnNotice {
    pub turn_id: String,
    /// A [`NoticeCode`](crate::NoticeCode); the server refuses any other (`bad-params`).
    pub code: String,
    #[serde(default)]
    pub params: serde_json::Value,
}

/// Worker → server: the turn's model set its plan (`update_plan`); appended as
/// `plan.updated`. Answered `{sequence}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnPlan {
    pub turn_id: String,
    #[serde(flatten)]
    pub plan: crate::PlanUpdated,
}

/// Largest `turn.notice` params (serialized).
pub const TURN_NOTICE_PARAMS_MAX: usize = 4096;

/// One attachment of a turn, as the worker receives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentMeta {
    /// The file name the client gave (not a path).
    pub name: String,
    pub mime_type: String,
    pub bytes: u64,
    /// `sha256:` and the lowercase hex SHA-256 of the bytes.
    pub digest: String,
}

/// The API tier's resource with a running turn's attachment bytes, concatenated in the
/// order of [`TurnRun::attachments`] (worker credential; the turn named in
/// [`MODEL_PROXY_TURN_HEADER`]). `?count=N` asks for the first N attachments only, so a
/// worker takes what fits its byte budget.
///
/// `POST` (a channel session's running turn, [`AttachQuery`] as the query, the file's
/// bytes as the body, at most [`TurnRun::max_attachment_bytes`]) stores a file the model
/// attached as an attachment of the session, answered with its
/// [`crate::RowAttachment`]; the turn's reply row names it. Refusals are [`ProxyError`]s.
pub const ATTACHMENTS_PATH: &str = "/v1/worker/attachments";

/// The query of a `POST` to [`ATTACHMENTS_PATH`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttachQuery {
    /// The file name the reader sees (not a path).
    pub name: String,
    pub mime: String,
    /// Lowercase hex SHA-256 of the body, checked by the server.
    pub sha256: String,
}

/// Worker → server: streamed output (live only).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnDelta {
    pub turn_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
}

/// Worker → server: a completed model step, persisted as one `model.completed` event.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnStep {
    pub turn_id: String,
    pub rows: Vec<NewRow>,
    #[serde(default)]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// Worker → server: the turn settled.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnEnd {
    pub turn_id: String,
    pub state: TurnState,
    #[serde(default)]
    pub cause: Option<Cause>,
    /// The turn's last model step (its rows, as in [`TurnStep`]), stored as its
    /// `model.completed` event in the same transaction as `turn.ended`: one commit instead
    /// of two on the turn's critical path, and watchers see the answer and the end together.
    /// Sent only to a server whose hello set [`WorkerHelloResult::end_carries_step`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<Vec<NewRow>>,
}

/// Server → worker notification: this replica is shutting down (a rollout, a scale-down, a
/// drain). The worker opens another connection (through the load balancer, to a replica that
/// is not draining), then hands its running turns over to it: `worker.release` on this
/// connection, `worker.carry` on the new one. Turns are not interrupted; the draining replica
/// keeps relaying their messages until they are released.
pub const WORKER_RECONNECT: &str = "worker.reconnect";
/// Worker → server request: this worker is shutting down (an upgrade, a restart; its first
/// SIGTERM). Its connection is handed no more turns (they wait in their queues for its next
/// process), while the turns it runs go on to their ends; it then disconnects. Answered
/// (`{}`) once nothing more is handed to it.
pub const WORKER_DRAINING: &str = "worker.draining";
/// Worker → server request on the connection being left: stop relaying these turns here
/// ([`WorkerRelease`]). Each is answered once every message the worker sent for it before has
/// been handled, with where its live output stands ([`ReleasedTurn`]).
pub const WORKER_RELEASE: &str = "worker.release";
/// Worker → server request on the new connection: take over these turns released by the
/// worker's connection `from` ([`WorkerCarry`]); answered with the turns taken
/// ([`WorkerCarried`]). A turn not taken (it ended or was stopped meanwhile) is the worker's to
/// stop.
pub const WORKER_CARRY: &str = "worker.carry";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerRelease {
    pub turns: Vec<String>,
}

/// A turn released by a draining replica, and where its live output stands: the new replica
/// goes on from there, so that watchers' `model.delta` offsets stay continuous.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleasedTurn {
    pub turn_id: String,
    pub step: i32,
    pub text: u64,
    pub thinking: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerReleased {
    pub turns: Vec<ReleasedTurn>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerCarry {
    /// The connection the turns were released from (its `connectionId`).
    pub from: String,
    pub turns: Vec<ReleasedTurn>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerCarried {
    pub turns: Vec<String>,
}

/// The path of the API tier's streaming model proxy (OpenAI Chat Completions shape).
pub const MODEL_PROXY_PATH: &str = "/v1/model/chat/completions";

/// The JSON body the model proxy answers with when it cannot stream: `{"error": Cause}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProxyError {
    pub error: Cause,
}

/// Worker → server: hold a tool call for approval (`kind: "approval"`) or ask a question
/// (`choice`, `text`, `confirm`: an [`InteractionKind`](crate::InteractionKind); any other
/// kind is `bad-params`). The request stays open until the interaction is resolved; the worker's
/// other messages flow meanwhile. Asking again with the same `(turnId, callId)` and the same
/// request waits on the same interaction (so after an `unavailable` error the worker may
/// simply ask again); under that id with another request it is `conflict`: a call id names
/// one call for its whole turn (the worker renames a call whose id an earlier step used).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnInteraction {
    pub turn_id: String,
    pub call_id: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<InteractionTool>,
    /// The tool's arguments (approvals) or the question (questions).
    #[serde(default)]
    pub input: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<serde_json::Value>,
    /// The outcome when nobody answers; default `{approved: false}` for approvals and
    /// `{choice: null}` for questions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<InteractionOutcome>,
}

/// The answer to `turn.interaction`, sent once the interaction is resolved. A denial is
/// `{approved: false}`: the tool must not run.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnInteractionResult {
    pub interaction_id: String,
    pub outcome: InteractionOutcome,
    /// How it was resolved (answered, expired, unwatched, auto, closed).
    pub state: InteractionState,
}
/// The request header naming the turn a model-proxy call is for: the proxy serves only a
/// running turn handed to a connection of the calling worker credential.
pub const MODEL_PROXY_TURN_HEADER: &str = "berth-turn";

/// How many stops of turns it does not hold an end of the link remembers ([`EarlyStops`]).
pub const EARLY_STOPS_KEPT: usize = 64;

/// Stops of turns not (yet) held, the latest [`EARLY_STOPS_KEPT`]: a stop can come before
/// what it stops. The server's connection sees a stop between a hand-out's `COMMIT` and its
/// registration; the worker sees a `turn.stop` that overtook its `turn.run`. Either way that
/// turn must not run. Older entries are stops of turns that had already ended.
#[derive(Debug, Default)]
pub struct EarlyStops(std::collections::VecDeque<String>);

impl EarlyStops {
    /// Remember a stop of `turn_id`, which is not held.
    pub fn remember(&mut self, turn_id: &str) {
        if self.0.len() == EARLY_STOPS_KEPT {
            self.0.pop_front();
        }
        self.0.push_back(turn_id.to_string());
    }

    /// Whether `turn_id` was stopped before it came (forgotten once asked).
    pub fn take(&mut self, turn_id: &str) -> bool {
        let Some(i) = self.0.iter().position(|t| t == turn_id) else {
            return false;
        };
        self.0.remove(i);
        true
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_frame_round_trips() {
        let data = b"\x00\xffnot utf-8 \xc3";
        let frame = chunk_frame(7, 1 << 33, data);
        assert_eq!(frame.len(), CHUNK_FRAME_HEADER + data.len());
        assert_eq!(chunk_frame_header(&frame), Some((7, 1 << 33)));
        assert_eq!(&frame[CHUNK_FRAME_HEADER..], data);
        let empty = chunk_frame(u32::MAX, 0, b"");
        assert_eq!(chunk_frame_header(&empty), Some((u32::MAX, 0)));
    }

    #[test]
    fn a_chunk_run_round_trips() {
        let data = "é".repeat(100).into_bytes();
        let frame = chunk_run_frame(9, 1 << 35, true, &data);
        assert_eq!(chunk_run_header(&frame), Some((9, 1 << 35, true)));
        assert_eq!(&frame[CHUNK_RUN_HEADER..], &data[..]);
        let binary = chunk_run_frame(1, 0, false, b"\x89PNG");
        assert_eq!(chunk_run_header(&binary), Some((1, 0, false)));
        // The two binary forms are told apart by their tag.
        assert_eq!(chunk_frame_header(&frame), None);
        assert_eq!(chunk_run_header(&chunk_frame(9, 0, &data)), None);
        assert_eq!(chunk_run_header(&frame[..CHUNK_RUN_HEADER - 1]), None);
    }

    #[test]
    fn anything_else_is_not_a_chunk_frame() {
        let frame = chunk_frame(1, 2, b"x");
        assert_eq!(chunk_frame_header(&frame[..CHUNK_FRAME_HEADER - 1]), None);
        assert_eq!(chunk_frame_header(b""), None);
        let mut other = frame.clone();
        other[0] = 2;
        assert_eq!(chunk_frame_header(&other), None);
    }
}
