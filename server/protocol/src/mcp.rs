//! MCP servers configured for the whole tenant (SPEC §4.16): `mcp.list` for everyone,
//! `mcp.save` / `mcp.remove` for admins. The workers running the tenant's turns connect to
//! the enabled ones (with their own configured servers and, when allowed, the workspace's
//! `.berth/mcp.json`).
//!
//! Header and environment values may be secrets: they are written, never read back —
//! `mcp.list` shows their names only.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The most MCP servers a tenant configures.
pub const MAX_MCP_SERVERS: usize = 32;
/// The most bytes of a server's name: letters, digits, `-`, `_` (no `__`, which separates
/// server and tool in the tool names the model sees).
pub const MAX_MCP_NAME_BYTES: usize = 32;
/// The most arguments, environment variables or headers of one server (each).
pub const MAX_MCP_ENTRIES: usize = 64;
/// The most bytes of a command, URL, argument, name or value.
pub const MAX_MCP_VALUE_BYTES: usize = 8 << 10;

/// Whether `name` may name an MCP server.
/// Whether an agent whose definition names `tools` could be offered any tool of the MCP
/// server `server` (offered to the model as `mcp__<server>__<tool>`). A turn gets only those
/// servers (and their secrets); an agent that names no tools may use every server.
pub fn mcp_server_offerable(server: &str, tools: &[String]) -> bool {
    tools.iter().any(|t| {
        t.strip_prefix("mcp__")
            .and_then(|rest| rest.strip_prefix(server))
            .is_some_and(|rest| rest.starts_with("__"))
    })
}

pub fn is_mcp_server_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_MCP_NAME_BYTES
        && !name.contains("__")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
}

/// How a server is reached.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum McpTransport {
    /// A command the worker starts inside the workspace, speaking MCP on its stdin/stdout.
    Stdio(McpStdio),
    /// A streamable-HTTP endpoint.
    Http(McpHttp),
}

/// A stdio server: `command` with `args`, in the workspace root, with a clean environment
/// plus `env`.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct McpStdio {
    pub command: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Values may be secrets (never listed).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// A streamable-HTTP server at `url` (http or https), sent `headers` on every request.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct McpHttp {
    pub url: String,
    /// Values may be secrets (never listed).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

/// Values may be secrets: only names are shown.
impl std::fmt::Debug for McpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            McpTransport::Stdio(s) => f
                .debug_struct("Stdio")
                .field("command", &s.command)
                .field("args", &s.args.len())
                .field("env", &s.env.keys().collect::<Vec<_>>())
                .finish(),
            McpTransport::Http(h) => f
                .debug_struct("Http")
                .field("url", &"<set>")
                .field("headers", &h.headers.keys().collect::<Vec<_>>())
                .finish(),
        }
    }
}

impl McpTransport {
    /// What `mcp.list` shows: everything but header and environment values and an HTTP
    /// URL's query and fragment (`?api_key=…` is a common place for a token), marked `?…`.
    pub fn view(&self) -> McpTransportView {
        match self {
            McpTransport::Stdio(s) => McpTransportView::Stdio(McpStdioView {
                command: s.command.clone(),
                args: s.args.clone(),
                env_names: s.env.keys().cloned().collect(),
            }),
            McpTransport::Http(h) => McpTransportView::Http(McpHttpView {
                url: match h.url.find(['?', '#']) {
                    Some(at) => format!("{}?…", &h.url[..at]),
                    None => h.url.clone(),
                },
                header_names: h.headers.keys().cloned().collect(),
            }),
        }
    }
}

/// A transport as listed: secret values left out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum McpTransportView {
    Stdio(McpStdioView),
    Http(McpHttpView),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct McpStdioView {
    pub command: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// The names of the server's environment variables (their values are not shown).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_names: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct McpHttpView {
    pub url: String,
    /// The names of the headers sent (their values are not shown).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub header_names: Vec<String>,
}

/// A tenant's MCP server as listed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct McpServer {
    /// Unique within the tenant; its tools reach the model as `mcp__<name>__<tool>`.
    pub name: String,
    pub transport: McpTransportView,
    /// Whether turns connect to it.
    pub enabled: bool,
    pub created_at: String,
    pub updated_at: String,
}

/// `mcp.save`: create the server `name`, or replace its whole definition (values not sent
/// again are gone: header and environment values are never read back).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct McpSaveParams {
    pub name: String,
    pub transport: McpTransport,
    /// Absent: enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

/// `mcp.remove` (idempotent).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct McpRemoveParams {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

/// One of the tenant's enabled servers as a turn gets it (`turn.run`), values included.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct McpServerRun {
    pub name: String,
    pub transport: McpTransport,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn names_fit_the_tool_names_the_model_sees() {
        assert!(is_mcp_server_name("web-search_2"));
        assert!(!is_mcp_server_name(""));
        assert!(!is_mcp_server_name("a__b"));
        assert!(!is_mcp_server_name("a.b"));
        assert!(!is_mcp_server_name(&"a".repeat(MAX_MCP_NAME_BYTES + 1)));
    }

    #[test]
    fn the_view_and_debug_show_no_values() {
        let t: McpTransport = serde_json::from_value(
            json!({"kind": "http", "url": "https://mcp.example/", "headers": {"authorization": "Bearer s3cret"}}),
        )
        .unwrap();
        assert_eq!(
            serde_json::to_value(t.view()).unwrap(),
            json!({"kind": "http", "url": "https://mcp.example/", "headerNames": ["authorization"]})
        );
        assert!(!format!("{t:?}").contains("s3cret"));
        let t: McpTransport =
            serde_json::from_value(json!({"kind": "http", "url": "https://mcp.example/sse?api_key=s3cret#x"})).unwrap();
        assert_eq!(
            serde_json::to_value(t.view()).unwrap()["url"],
            "https://mcp.example/sse?…"
        );
        let t: McpTransport =
            serde_json::from_value(json!({"kind": "stdio", "command": "srv", "env": {"TOKEN": "t0ken"}})).unwrap();
        assert!(!serde_json::to_string(&t.view()).unwrap().contains("t0ken"));
        assert!(!format!("{t:?}").contains("t0ken"));
    }
}
