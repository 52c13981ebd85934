//! `session.search` and `session.fork`: finding text in a session and branching from it.

use serde::{Deserialize, Serialize};

use crate::{Position, RowField};

/// `session.search` parameters. Keep `query`, the options and `through` fixed while
/// following `nextAfter`; start with `after` absent.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionSearchParams {
    pub session_id: String,
    /// Literal text (not a pattern).
    pub query: String,
    #[serde(default, deserialize_with = "crate::null_default")]
    #[cfg_attr(feature = "schema", schemars(with = "Option<bool>"))]
    pub case_sensitive: bool,
    #[serde(default, deserialize_with = "crate::null_default")]
    #[cfg_attr(feature = "schema", schemars(with = "Option<bool>"))]
    pub whole_word: bool,
    /// The fence: no row published after this event is searched. Absent: the session's
    /// last sequence now, returned in the result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub through: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<SearchCursor>,
}

/// Where a search page stopped. With `field` absent the row at `position` was searched
/// whole; with `field` and `offset` the scan resumes in that row's field at that byte.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SearchCursor {
    pub position: Position,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<RowField>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
}

/// One page of hits, in history order. A page may hold no hits and still advance:
/// follow `nextAfter` until it is null.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionSearchResult {
    pub through: i64,
    pub hits: Vec<SearchHit>,
    #[serde(default)]
    pub next_after: Option<SearchCursor>,
}

/// A match: the row, the field and the byte range `[start, end)` in that field's text, so
/// that `session.history {target: {kind: "row", position, field}}` and `session.source`
/// open exactly it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SearchHit {
    pub position: Position,
    pub field: RowField,
    pub start: u64,
    pub end: u64,
}

/// `session.fork` parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionForkParams {
    pub session_id: String,
    /// A settled turn to fork from (its history up to its end); absent or null: all
    /// current history, which must then have no running turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// The source's history revision (`session.get`'s `revision`) the client saw.
    pub source_revision: i64,
    /// Required: a lost response is recovered with `session.forkReceipt`.
    pub operation_id: String,
}

/// Where a forked session came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Branch {
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// The source's last event included in the fork.
    pub sequence: i64,
}

/// `session.fork` result (also what `session.forkReceipt` finds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionForkResult {
    pub session_id: String,
    pub branch: Branch,
}

/// `session.forkReceipt` parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionForkReceiptParams {
    pub operation_id: String,
}
