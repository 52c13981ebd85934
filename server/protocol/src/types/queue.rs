//! The queue of a session's turns: its changes, its entries (previews) and `queue.get`.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct QueueUpdateParams {
    pub session_id: String,
    pub queue_id: String,
    /// Also accepted as `revision` (SPEC §4.4's name).
    #[serde(alias = "revision")]
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
    /// Also accepted as `revision` (SPEC §4.4's name).
    #[serde(alias = "revision")]
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
    /// Also accepted as `revision` (SPEC §4.4's name).
    #[serde(alias = "revision")]
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
