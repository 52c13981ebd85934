//! Attachments: `content.upload` and `content.read`.

use serde::{Deserialize, Serialize};

use super::RowAttachment;

/// `content.upload` parameters: the request is followed by one binary WebSocket message
/// whose first four bytes are this request's id (big-endian u32) and the rest the bytes.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContentUploadParams {
    pub session_id: String,
    /// The content type (`image/png`, `text/plain`, …).
    pub mime: String,
    /// The file's name as the user knows it (no directories).
    pub filename: String,
    /// The payload's size, if the client knows it: a binary message of another size (a
    /// truncated one) is `bad-params {reason: "size-mismatch"}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

/// `content.read` parameters: a page of an attachment's bytes.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContentReadParams {
    pub attachment_id: String,
    /// The `nextAfter` of the previous page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

/// The most bytes of an attachment one `content.read` page carries (before base64).
pub const CONTENT_PAGE_BYTES: usize = 256 << 10;

/// One page of an attachment's bytes: at most [`CONTENT_PAGE_BYTES`].
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContentReadResult {
    pub attachment: RowAttachment,
    /// The byte offset of `data` in the attachment.
    pub offset: u64,
    /// The page's bytes, base64 (standard alphabet, padded).
    pub data: String,
    /// Pass as `after` for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<String>,
}

/// An uploaded attachment, to name in `session.send {attachments}`.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContentUploadResult {
    pub attachment_id: String,
    pub bytes: u64,
    /// Lowercase hex SHA-256 of the bytes.
    pub sha256: String,
}
