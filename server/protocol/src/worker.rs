//! The worker protocol: JSON-RPC 2.0 over the worker's outbound WebSocket (`GET /v1/worker`).
//!
//! Worker → server requests: `worker.hello`, `turn.step`, `turn.end`; notification
//! `turn.delta`. Server → worker notifications: `turn.run`, `turn.stop {turnId}` (the turn
//! was cancelled: stop working on it; the server has already settled it).
//!
//! Model calls go to the API tier's proxy ([`MODEL_PROXY_PATH`]) with the worker credential
//! and the turn named in [`MODEL_PROXY_TURN_HEADER`].

use serde::{Deserialize, Serialize};

use crate::{Cause, NewRow, TurnState};

pub const WORKER_HELLO: &str = "worker.hello";
pub const TURN_RUN: &str = "turn.run";
pub const TURN_DELTA: &str = "turn.delta";
pub const TURN_STEP: &str = "turn.step";
pub const TURN_END: &str = "turn.end";
pub const TURN_STOP: &str = "turn.stop";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerHello {
    pub protocol: u32,
    /// The machine's stable name; a workspace keeps its identity by (host, name).
    pub host: String,
    pub workspaces: Vec<WorkspaceDecl>,
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
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegisteredWorkspace {
    pub name: String,
    pub workspace_id: String,
}

/// One chat message of the model request the worker builds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// Server → worker: run this turn.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnRun {
    pub turn_id: String,
    pub session_id: String,
    pub workspace_id: String,
    /// The model to ask, if the session or tenant names one.
    pub model: Option<String>,
    /// The conversation so far, ending with this turn's prompt.
    pub messages: Vec<ChatMessage>,
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
}

/// The path of the API tier's streaming model proxy (OpenAI Chat Completions shape).
pub const MODEL_PROXY_PATH: &str = "/v1/model/chat/completions";

/// The JSON body the model proxy answers with when it cannot stream: `{"error": Cause}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProxyError {
    pub error: Cause,
}

/// The request header naming the turn a model-proxy call is for: the proxy serves only a
/// running turn handed to a connection of the calling worker credential.
pub const MODEL_PROXY_TURN_HEADER: &str = "berth-turn";
