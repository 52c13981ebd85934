//! Operation receipts (`operation.receipt`).

use serde::{Deserialize, Serialize};

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
