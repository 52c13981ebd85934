//! A turn's attachments: their bytes fetched from the API tier (one resource, the bytes
//! concatenated in the order of the turn's metadata), checked against their digests, and
//! put into the turn's user message as chat-completions content parts: images as image
//! input, text inline, anything else described by name, type, size and digest.

use base64::Engine;
use berth_protocol::CauseCode;
use berth_protocol::{
    Cause,
    worker::{self as wp, AttachmentMeta, TurnRun},
};
use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The most attachment bytes one turn fetches; attachments past it (in order) reach the
/// model as a description only.
pub(crate) const BUDGET: u64 = 64 << 20;
/// Images up to this size go to the model as image input (base64 inside the request).
const IMAGE_INLINE_MAX: u64 = 2 << 20;
/// Text attachments up to this size go to the model inline.
const TEXT_INLINE_MAX: u64 = 256 << 10;

/// One attachment with its bytes (None: past the budget, not fetched).
pub(crate) struct Received {
    pub meta: AttachmentMeta,
    pub data: Option<Bytes>,
    /// `sha256:<hex>` of the bytes received.
    pub digest: Option<String>,
}

fn failed(code: CauseCode) -> Cause {
    Cause {
        code: code.as_str().into(),
        status: None,
    }
}

/// Fetch the turn's attachments within [`BUDGET`]; a digest that does not match fails the
/// turn (`attachment-corrupt`), an unreachable resource `attachment-unavailable`.
pub(crate) async fn fetch(
    http: &reqwest::Client,
    proxy_url: &str,
    token: &str,
    run: &TurnRun,
) -> Result<Vec<Received>, Cause> {
    if run.attachments.is_empty() {
        return Ok(Vec::new());
    }
    let mut count = 0;
    let mut total = 0u64;
    for a in &run.attachments {
        if total.saturating_add(a.bytes) > BUDGET {
            break;
        }
        total += a.bytes;
        count += 1;
    }
    let mut data = Vec::new();
    if count > 0 {
        let base = proxy_url.strip_suffix(wp::MODEL_PROXY_PATH).unwrap_or(proxy_url);
        let resp = http
            .get(format!("{base}{}?count={count}", wp::ATTACHMENTS_PATH))
            .bearer_auth(token)
            .header(wp::MODEL_PROXY_TURN_HEADER, &run.turn_id)
            .send()
            .await
            .map_err(|_| failed(CauseCode::AttachmentUnavailable))?;
        if !resp.status().is_success() {
            return Err(failed(CauseCode::AttachmentUnavailable));
        }
        let mut body = resp.bytes_stream();
        data.reserve(usize::try_from(total).unwrap_or(0));
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|_| failed(CauseCode::AttachmentUnavailable))?;
            if (data.len() + chunk.len()) as u64 > total {
                return Err(failed(CauseCode::AttachmentCorrupt));
            }
            data.extend_from_slice(&chunk);
        }
        if data.len() as u64 != total {
            return Err(failed(CauseCode::AttachmentCorrupt));
        }
    }
    let data = Bytes::from(data);
    let mut offset = 0usize;
    let mut out = Vec::with_capacity(run.attachments.len());
    for (i, meta) in run.attachments.iter().enumerate() {
        if i >= count {
            out.push(Received {
                meta: meta.clone(),
                data: None,
                digest: None,
            });
            continue;
        }
        let len = meta.bytes as usize;
        let bytes = data.slice(offset..offset + len);
        offset += len;
        let digest = format!("sha256:{}", hex(&Sha256::digest(&bytes)));
        if digest != meta.digest {
            tracing::warn!(turn.id = %run.turn_id, "attachment bytes do not match their digest");
            return Err(failed(CauseCode::AttachmentCorrupt));
        }
        out.push(Received {
            meta: meta.clone(),
            data: Some(bytes),
            digest: Some(digest),
        });
    }
    Ok(out)
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The content parts of a user message carrying `text` and the attachments.
pub(crate) fn content(text: &str, received: &[Received]) -> Value {
    let mut parts = vec![json!({"type": "text", "text": text})];
    for r in received {
        let m = &r.meta;
        let described = format!(
            "[attachment {:?}: {}, {} bytes, {}]",
            m.name,
            m.mime_type,
            m.bytes,
            r.digest.as_deref().unwrap_or(&m.digest)
        );
        match &r.data {
            Some(data) if m.mime_type.starts_with("image/") && m.bytes <= IMAGE_INLINE_MAX => {
                let b64 = base64::engine::general_purpose::STANDARD.encode(data);
                parts.push(json!({"type": "text", "text": described}));
                parts.push(json!({
                    "type": "image_url",
                    "image_url": {"url": format!("data:{};base64,{b64}", m.mime_type)},
                }));
            }
            Some(data) if m.mime_type.starts_with("text/") && m.bytes <= TEXT_INLINE_MAX => {
                let text = String::from_utf8_lossy(data);
                parts.push(json!({"type": "text", "text": format!("{described}\n{text}")}));
            }
            Some(_) => parts.push(json!({"type": "text", "text": described})),
            None => parts.push(json!({
                "type": "text",
                "text": format!("{described} (not fetched: past the turn's attachment budget)"),
            })),
        }
    }
    Value::Array(parts)
}

/// Put the attachments into the last user message of `messages` (this turn's prompt).
pub(crate) fn attach(messages: &mut [Value], received: &[Received]) {
    if received.is_empty() {
        return;
    }
    let Some(last_user) = messages.iter_mut().rev().find(|m| m["role"] == "user") else {
        return;
    };
    let text = last_user["content"].as_str().unwrap_or_default().to_string();
    last_user["content"] = content(&text, received);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(name: &str, mime: &str, data: &'static [u8]) -> Received {
        let digest = format!("sha256:{}", hex(&Sha256::digest(data)));
        Received {
            meta: AttachmentMeta {
                name: name.into(),
                mime_type: mime.into(),
                bytes: data.len() as u64,
                digest: digest.clone(),
            },
            data: Some(Bytes::from_static(data)),
            digest: Some(digest),
        }
    }

    #[test]
    fn images_become_image_parts_text_goes_inline() {
        let mut messages = vec![
            json!({"role": "system", "content": "s"}),
            json!({"role": "user", "content": "look"}),
        ];
        let list = [
            received("a.png", "image/png", b"\x89PNG"),
            received("n.txt", "text/plain", b"hello"),
            received("b.bin", "application/octet-stream", b"\0\x01"),
        ];
        attach(&mut messages, &list);
        let parts = messages[1]["content"].as_array().expect("parts");
        assert_eq!(parts[0], json!({"type": "text", "text": "look"}));
        assert_eq!(parts[2]["type"], "image_url");
        assert_eq!(parts[2]["image_url"]["url"], "data:image/png;base64,iVBORw==");
        assert!(parts[3]["text"].as_str().expect("text").ends_with("\nhello"));
        assert!(parts[4]["text"].as_str().expect("text").contains(&list[2].meta.digest));
    }
}
