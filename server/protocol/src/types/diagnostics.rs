//! Notices (facts for the client to word) and session diagnostics
//! (`session.diagnostics`, `session.watchDiagnostics`).

use serde::{Deserialize, Serialize};

use super::Cause;

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
