//! Interactions (approvals and questions): their state, outcome and resolution, and
//! `session.respond`.

use serde::{Deserialize, Serialize};

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
