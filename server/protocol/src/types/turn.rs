//! Turns: `session.send`, a turn's state, and why a turn failed (`Cause`).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TurnRef {
    pub turn_id: String,
    pub state: TurnState,
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
    /// SPEC §4.4's name for `queueRevision` (the same value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
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
