//! Error codes: stable kebab-case strings carried in a JSON-RPC error's `data.code`.

use serde::{Deserialize, Serialize};

/// A stable, typed error code. The client owns the wording.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum ErrorCode {
    ParseError,
    InvalidRequest,
    MethodNotFound,
    Unauthorized,
    Forbidden,
    NotFound,
    /// The thing exists already (e.g. a user with that email).
    Conflict,
    BadParams,
    UnsupportedProtocol,
    StaleRevision,
    TurnBusy,
    TurnNotRunning,
    WorkspaceOffline,
    OperationConflict,
    OperationInProgress,
    RateLimited,
    PayloadTooLarge,
    /// The session's queue holds [`crate::MAX_QUEUE_LENGTH`] turns already.
    QueueFull,
    HistoryCleared,
    /// The interaction was already resolved (answered, expired, closed); the error carries
    /// its `state` and recorded `outcome`.
    InteractionClosed,
    Unsupported,
    Unavailable,
    Internal,
    /// `provider` names no configured provider profile.
    UnknownProvider,
    /// `model` is not one of the profile's models.
    UnknownModel,
    /// `baseUrl` given for a profile that does not allow a client-chosen endpoint.
    BaseUrlNotAllowed,
    /// The session may not start sessions below it: its `delegationDepth` is used up.
    DepthExceeded,
    /// A coordinator's turn started as many child sessions as it may (`max`).
    ChildLimit,
}

impl ErrorCode {
    /// The kebab-case wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::ParseError => "parse-error",
            ErrorCode::InvalidRequest => "invalid-request",
            ErrorCode::MethodNotFound => "method-not-found",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::NotFound => "not-found",
            ErrorCode::Conflict => "conflict",
            ErrorCode::BadParams => "bad-params",
            ErrorCode::UnsupportedProtocol => "unsupported-protocol",
            ErrorCode::StaleRevision => "stale-revision",
            ErrorCode::TurnBusy => "turn-busy",
            ErrorCode::TurnNotRunning => "turn-not-running",
            ErrorCode::WorkspaceOffline => "workspace-offline",
            ErrorCode::OperationConflict => "operation-conflict",
            ErrorCode::OperationInProgress => "operation-in-progress",
            ErrorCode::RateLimited => "rate-limited",
            ErrorCode::PayloadTooLarge => "payload-too-large",
            ErrorCode::QueueFull => "queue-full",
            ErrorCode::HistoryCleared => "history-cleared",
            ErrorCode::InteractionClosed => "interaction-closed",
            ErrorCode::Unsupported => "unsupported",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
            ErrorCode::UnknownProvider => "unknown-provider",
            ErrorCode::UnknownModel => "unknown-model",
            ErrorCode::BaseUrlNotAllowed => "base-url-not-allowed",
            ErrorCode::DepthExceeded => "depth-exceeded",
            ErrorCode::ChildLimit => "child-limit",
        }
    }

    /// The JSON-RPC numeric code this error travels under.
    pub fn jsonrpc_code(self) -> i64 {
        match self {
            ErrorCode::ParseError => -32700,
            ErrorCode::InvalidRequest => -32600,
            ErrorCode::MethodNotFound => -32601,
            ErrorCode::BadParams => -32602,
            ErrorCode::Internal => -32603,
            _ => -32000,
        }
    }
}

/// A JSON-RPC error object: `{code, message, data: {code, …fields}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: serde_json::Value,
}

impl RpcError {
    /// An error with only its typed code.
    pub fn new(code: ErrorCode) -> RpcError {
        RpcError::with_fields(code, serde_json::Map::new())
    }

    /// An error with its typed code and safe typed fields.
    pub fn with_fields(code: ErrorCode, mut fields: serde_json::Map<String, serde_json::Value>) -> RpcError {
        fields.insert("code".into(), code.as_str().into());
        RpcError {
            code: code.jsonrpc_code(),
            message: code.as_str().to_string(),
            data: fields.into(),
        }
    }

    /// The typed code in `data.code`, if any.
    pub fn data_code(&self) -> Option<&str> {
        self.data.get("code").and_then(|c| c.as_str())
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.data)
    }
}

impl std::error::Error for RpcError {}
