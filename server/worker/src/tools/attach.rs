//! `attach_file`, the tool of a channel session's model (SPEC §4.3 `channel`): a workspace
//! file goes to the API tier, which stores it as an attachment of the session; the turn's
//! reply row names it, so the file reaches the chat reader with the answer. The path is
//! confined by `workspace.rs` like every other tool's, and a repository's internals (`.git`)
//! are not sent; the size by the server's attachment limit (read at most one byte past it). A refusal is a tool error the model reads.

use std::sync::Arc;

use berth_protocol::{
    RowAttachment,
    worker::{self as wp, ProxyError},
};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::Outcome;
use crate::{turn::TurnLink, workspace::Workspace};

pub(crate) const ATTACH_FILE: &str = "attach_file";

/// The longest file name the server takes (as for uploads).
const MAX_NAME: usize = 255;

#[derive(Deserialize)]
pub(crate) struct Args {
    path: String,
    name: Option<String>,
}

pub(crate) fn schema() -> Value {
    json!({"type": "function", "function": {
        "name": ATTACH_FILE,
        "description": "Attach a workspace file to your reply: the reader receives it with your answer.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "Path relative to the workspace root."},
            "name": {"type": "string", "description": "The file name the reader sees (default: the path's last component)."}
        }, "required": ["path"]}
    }})
}

/// Read the file (confined, bounded by `max` bytes) and store it through the API tier.
pub(crate) async fn run(t: &TurnLink, ws: Arc<Workspace>, max: u64, arguments: &str) -> Outcome {
    let a = match super::args::<Args>(arguments) {
        Ok(a) => a,
        Err(e) => return e,
    };
    let name = match a.name.as_deref().map(str::trim).filter(|n| !n.is_empty()) {
        Some(n) => n.to_string(),
        None => a.path.rsplit(['/', '\\']).next().unwrap_or_default().to_string(),
    };
    if name.is_empty()
        || name.len() > MAX_NAME
        || name.contains(['/', '\\'])
        || name == "."
        || name == ".."
        || name.chars().any(char::is_control)
    {
        return Outcome::error(format!(
            "{name:?}: not a usable file name (at most {MAX_NAME} bytes, no directories)"
        ));
    }
    let path = a.path.clone();
    let read = tokio::task::spawn_blocking(move || {
        let data = ws.read_bounded(&path, max)?;
        Ok::<_, crate::workspace::PathError>(data.map(|d| {
            let sha256 = crate::attachments::hex(&Sha256::digest(&d));
            (d, sha256)
        }))
    })
    .await;
    let (data, sha256) = match read {
        Ok(Ok(Some(d))) => d,
        Ok(Ok(None)) => return Outcome::error(format!("{}: larger than the attachment limit ({max} bytes)", a.path)),
        Ok(Err(e)) => return Outcome::error(e.0),
        Err(_) => return Outcome::error("the tool failed unexpectedly"),
    };
    let mime = mime_guess::from_path(&name).first_or_octet_stream().to_string();
    let base = t
        .link
        .proxy_url
        .strip_suffix(wp::MODEL_PROXY_PATH)
        .unwrap_or(&t.link.proxy_url);
    let query = wp::AttachQuery { name, mime, sha256 };
    let sent = t
        .link
        .http
        .post(format!("{base}{}", wp::ATTACHMENTS_PATH))
        .bearer_auth(&t.link.token)
        .header(wp::MODEL_PROXY_TURN_HEADER, t.turn_id())
        .query(&query)
        .body(data)
        .send()
        .await;
    let resp = match sent {
        Ok(r) => r,
        Err(_) => return Outcome::error("the file could not be sent to the server; try again"),
    };
    if !resp.status().is_success() {
        let code = resp
            .json::<ProxyError>()
            .await
            .map_or_else(|_| "unavailable".to_string(), |e| e.error.code);
        return Outcome::error(format!("{}: the server refused the file ({code})", a.path));
    }
    match resp.json::<RowAttachment>().await {
        Ok(att) => Outcome::ok(format!(
            "Attached {} ({}, {} bytes); it is delivered with your reply.",
            att.name, att.mime_type, att.bytes
        )),
        Err(_) => Outcome::error("the server's answer could not be read; the file may not be attached"),
    }
}
