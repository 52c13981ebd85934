//! The Agent Client Protocol's wire types that the bridge speaks (protocol version 1), as
//! its schema names them: camelCase fields, snake_case enum values, `sessionUpdate` and
//! `type` tags. Only what the bridge reads or writes is declared; unknown fields of what it
//! reads are ignored, as the protocol asks.
//!
//! Written here rather than taken from the `agent-client-protocol` crates: those turn on
//! serde_json's `preserve_order` for the whole build (features unify), which would change
//! the key order of every JSON value the server handles — the generated schema and
//! TypeScript among them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The protocol version this bridge speaks.
pub const PROTOCOL_VERSION: u16 = 1;

// Methods (client → agent) and the agent → client ones.
pub const INITIALIZE: &str = "initialize";
pub const AUTHENTICATE: &str = "authenticate";
pub const SESSION_NEW: &str = "session/new";
pub const SESSION_LOAD: &str = "session/load";
pub const SESSION_PROMPT: &str = "session/prompt";
pub const SESSION_CANCEL: &str = "session/cancel";
pub const SESSION_UPDATE: &str = "session/update";
pub const SESSION_REQUEST_PERMISSION: &str = "session/request_permission";

/// JSON-RPC error codes ACP uses.
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    pub const RESOURCE_NOT_FOUND: i64 = -32002;
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeRequest {
    pub protocol_version: u16,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSessionRequest {
    pub cwd: std::path::PathBuf,
    #[serde(default)]
    pub mcp_servers: Vec<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadSessionRequest {
    pub session_id: String,
    #[serde(default)]
    pub mcp_servers: Vec<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PromptRequest {
    pub session_id: String,
    pub prompt: Vec<ContentBlock>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CancelNotification {
    pub session_id: String,
}

/// A piece of content in a prompt or an update.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Text {
        text: String,
    },
    /// A file the client points at (`@file` mentions).
    #[serde(rename_all = "camelCase")]
    ResourceLink {
        uri: String,
        name: String,
    },
    /// A file's contents the client embedded (`embeddedContext`).
    Resource {
        resource: EmbeddedResource,
    },
    /// Image, audio and kinds this bridge does not take.
    #[serde(other)]
    Unsupported,
}

impl ContentBlock {
    pub fn text(text: impl Into<String>) -> ContentBlock {
        ContentBlock::Text { text: text.into() }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EmbeddedResource {
    pub uri: String,
    /// Text contents (blob contents are not taken).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// The `update` of a `session/update` notification.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "sessionUpdate", rename_all = "snake_case")]
pub enum SessionUpdate {
    UserMessageChunk {
        content: ContentBlock,
    },
    AgentMessageChunk {
        content: ContentBlock,
    },
    AgentThoughtChunk {
        content: ContentBlock,
    },
    ToolCall(ToolCall),
    ToolCallUpdate(ToolCall),
    /// The agent's plan, whole each time.
    Plan {
        entries: Vec<PlanEntry>,
    },
}

/// One entry of a `plan` update.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanEntry {
    pub content: String,
    pub priority: PlanPriority,
    pub status: PlanStatus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanPriority {
    Medium,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanStatus {
    Pending,
    InProgress,
    Completed,
}

/// A file a tool call works on (an editor can follow it).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCallLocation {
    /// Absolute.
    pub path: String,
}

/// A tool call as `tool_call` announces it, and as `tool_call_update` (and a permission
/// request) changes it: absent fields are unchanged.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCall {
    pub tool_call_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<ToolKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<ToolCallStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<Vec<ToolCallContent>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locations: Option<Vec<ToolCallLocation>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw_input: Option<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    Read,
    Edit,
    Search,
    Execute,
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallStatus {
    Pending,
    InProgress,
    Completed,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolCallContent {
    Content {
        content: ContentBlock,
    },
    /// A change of one file, for the editor to show as a diff (`old_text` absent: a new file).
    #[serde(rename_all = "camelCase")]
    Diff {
        /// Absolute.
        path: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        old_text: Option<String>,
        new_text: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    EndTurn,
    MaxTurnRequests,
    Cancelled,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PermissionOption {
    pub option_id: String,
    pub name: String,
    pub kind: PermissionOptionKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionOptionKind {
    AllowOnce,
    RejectOnce,
}

#[derive(Debug, Deserialize)]
pub struct RequestPermissionResponse {
    pub outcome: PermissionOutcome,
}

#[derive(Debug, PartialEq, Eq, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum PermissionOutcome {
    /// The prompt turn was cancelled before the user chose.
    Cancelled,
    #[serde(rename_all = "camelCase")]
    Selected { option_id: String },
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn updates_have_the_schemas_shape() {
        let chunk = SessionUpdate::AgentMessageChunk {
            content: ContentBlock::text("hi"),
        };
        assert_eq!(
            serde_json::to_value(&chunk).unwrap(),
            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}})
        );
        let call = SessionUpdate::ToolCallUpdate(ToolCall {
            tool_call_id: "call_1".into(),
            status: Some(ToolCallStatus::InProgress),
            content: Some(vec![ToolCallContent::Content {
                content: ContentBlock::text("out"),
            }]),
            ..Default::default()
        });
        assert_eq!(
            serde_json::to_value(&call).unwrap(),
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "call_1", "status": "in_progress",
                   "content": [{"type": "content", "content": {"type": "text", "text": "out"}}]})
        );
        assert_eq!(serde_json::to_value(StopReason::EndTurn).unwrap(), "end_turn");
        assert_eq!(
            serde_json::to_value(PermissionOptionKind::AllowOnce).unwrap(),
            "allow_once"
        );
    }

    #[test]
    fn prompts_and_outcomes_read_as_the_schema_writes_them() {
        let p: PromptRequest = serde_json::from_value(json!({"sessionId": "ses_1", "prompt": [
            {"type": "text", "text": "fix", "annotations": {"priority": 1}},
            {"type": "resource_link", "uri": "file:///a.rs", "name": "a.rs", "mimeType": "text/x-rust"},
            {"type": "resource", "resource": {"uri": "file:///b.rs", "text": "fn b() {}"}},
            {"type": "image", "data": "AAAA", "mimeType": "image/png"}
        ]}))
        .unwrap();
        assert_eq!(p.prompt[0], ContentBlock::text("fix"));
        assert!(matches!(&p.prompt[1], ContentBlock::ResourceLink { name, .. } if name == "a.rs"));
        assert!(matches!(&p.prompt[2], ContentBlock::Resource { resource } if resource.text.is_some()));
        assert_eq!(p.prompt[3], ContentBlock::Unsupported);
        let r: RequestPermissionResponse =
            serde_json::from_value(json!({"outcome": {"outcome": "selected", "optionId": "allow"}})).unwrap();
        assert_eq!(
            r.outcome,
            PermissionOutcome::Selected {
                option_id: "allow".into()
            }
        );
        let r: RequestPermissionResponse =
            serde_json::from_value(json!({"outcome": {"outcome": "cancelled"}})).unwrap();
        assert_eq!(r.outcome, PermissionOutcome::Cancelled);
    }
}
