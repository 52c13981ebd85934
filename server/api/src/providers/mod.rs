//! Provider wire formats. Between worker and API tier there is one normalized stream:
//! OpenAI Chat Completions streaming chunks ending in `data: [DONE]`, with a failure
//! in the middle of a stream sent as `data: {"error": {code, status?}}`. The worker's
//! chat-completions request is translated here into the profile's format, and the
//! provider's stream back into that normalized stream:
//!
//! - [`chat`]: OpenAI Chat Completions (passed through; usage asked for in the stream);
//! - [`responses`]: the OpenAI Responses API;
//! - [`anthropic`]: Anthropic Messages.
//!
//! Provider output is untrusted: SSE lines are bounded, and nothing of it reaches a log.

use berth_protocol::CauseCode;
pub(crate) mod anthropic;
pub(crate) mod chat;
pub(crate) mod responses;

use berth_protocol::Cause;
use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::config::{ProviderProfile, ReasoningLevel, WireApi};

/// A provider request built from the worker's chat-completions request.
pub(crate) struct Outgoing {
    /// Appended to the profile's base URL.
    pub path: &'static str,
    pub body: Value,
}

impl Outgoing {
    /// The request written out once (each attempt sends the same bytes).
    pub(crate) fn encode(&self) -> Encoded {
        Encoded {
            path: self.path,
            body: Bytes::from(serde_json::to_vec(&self.body).unwrap_or_default()),
        }
    }
}

/// A provider request as it is sent: its path and its JSON body's bytes.
pub(crate) struct Encoded {
    /// Appended to the profile's base URL.
    pub path: &'static str,
    pub body: Bytes,
}

impl Encoded {
    /// A builder of this request to `base`, one per attempt: the format's headers, and the
    /// profile's key when `with_key` (never for a client-chosen endpoint).
    pub(crate) fn builder<'a>(
        &'a self,
        http: &'a reqwest::Client,
        profile: &'a ProviderProfile,
        base: &str,
        with_key: bool,
    ) -> impl Fn() -> reqwest::RequestBuilder + 'a {
        let url = format!("{}{}", base.trim_end_matches('/'), self.path);
        move || {
            let req = http
                .post(&url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(self.body.clone());
            let req = headers(profile.api, req);
            if with_key { authorize(profile, req) } else { req }
        }
    }
}

/// Build the request for `api` from a chat-completions body (model already set), asking
/// for the model's reasoning `level` where it has one.
///
/// The worker's assistant messages may carry `reasoning_items`: reasoning blocks this
/// translation put into the normalized stream (see [`reasoning_items`]), echoed back
/// within the turn. Each format takes the blocks of its own kind and drops the field.
pub(crate) fn request(api: WireApi, chat: Map<String, Value>, level: Option<ReasoningLevel>) -> Outgoing {
    match api {
        WireApi::ChatCompletions => chat::request(chat, level),
        WireApi::Responses => responses::request(chat, level),
        WireApi::AnthropicMessages => anthropic::request(chat, level),
    }
}

/// The reasoning blocks an assistant message carries whose `type` is one of `kinds`.
pub(crate) fn reasoning_items<'a>(message: &'a Value, kinds: &'a [&str]) -> impl Iterator<Item = &'a Value> + 'a {
    message
        .get("reasoning_items")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|b| {
            b.get("type")
                .and_then(Value::as_str)
                .is_some_and(|t| kinds.contains(&t))
        })
}

/// A normalized chunk carrying provider reasoning blocks for the worker to echo back.
pub(crate) fn reasoning_chunk(items: Vec<Value>) -> Value {
    delta(json!({ "reasoning_items": items }))
}

/// Authentication headers for `profile`'s own endpoint.
pub(crate) fn authorize(profile: &ProviderProfile, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    let Some(key) = &profile.api_key else { return req };
    match profile.api {
        WireApi::AnthropicMessages => req.header("x-api-key", &key.0),
        _ => req.bearer_auth(&key.0),
    }
}

/// Headers every request of `api` carries (key or not).
pub(crate) fn headers(api: WireApi, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    match api {
        WireApi::AnthropicMessages => req.header("anthropic-version", "2023-06-01"),
        _ => req,
    }
}

/// Turns a provider's SSE events into normalized chunks.
pub(crate) trait Translate: Send {
    /// One event (`event:` name, may be empty; `data:` payload). Pushes chunks to `out`;
    /// true once the provider's response is complete (finish and usage chunks pushed).
    fn event(&mut self, event: &str, data: &str, out: &mut Vec<Value>) -> Result<bool, Cause>;
}

/// The translator for `api` (None: chat-completions, passed through).
pub(crate) fn translator(api: WireApi) -> Option<Box<dyn Translate>> {
    match api {
        WireApi::ChatCompletions => None,
        WireApi::Responses => Some(Box::<responses::Stream>::default()),
        WireApi::AnthropicMessages => Some(Box::<anthropic::Stream>::default()),
    }
}

/// The functions a chat-completions request declares in `tools`, as (name, description,
/// JSON-schema parameters) — what every other wire format's tool declaration is built from.
pub(crate) fn chat_functions(chat: &Map<String, Value>) -> impl Iterator<Item = (Value, Value, Value)> + '_ {
    chat.get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| t.get("function"))
        .map(|f| {
            (
                f.get("name").cloned().unwrap_or_default(),
                f.get("description").cloned().unwrap_or_default(),
                f.get("parameters").cloned().unwrap_or(json!({"type": "object"})),
            )
        })
}

pub(crate) fn cause(code: CauseCode) -> Cause {
    Cause {
        code: code.as_str().into(),
        status: None,
    }
}

/// A normalized chunk with one choice delta.
pub(crate) fn delta(delta: Value) -> Value {
    json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
}

/// A text or reasoning piece.
pub(crate) fn text(field: &str, piece: &str) -> Value {
    delta(json!({ field: piece }))
}

/// A tool call's first piece (`id`, `name`) or a further piece of its arguments.
pub(crate) fn tool_call(index: usize, head: Option<(&str, &str)>, arguments: &str) -> Value {
    let mut call = json!({"index": index, "function": {"arguments": arguments}});
    if let Some((id, name)) = head {
        call["id"] = id.into();
        call["type"] = "function".into();
        call["function"]["name"] = name.into();
    }
    delta(json!({ "tool_calls": [call] }))
}

/// The finish chunk and the usage chunk that end a normalized response.
pub(crate) fn finish(out: &mut Vec<Value>, reason: &str, usage: Option<(u64, u64)>) {
    out.push(json!({"object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}));
    if let Some((input, output)) = usage {
        out.push(json!({"object": "chat.completion.chunk", "choices": [], "usage": {
            "prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output}}));
    }
}

/// What a chat request holds, for `session.context`: the input by role (in order of first
/// appearance) and the tool schemas, in bytes and estimated tokens (about four bytes a
/// token); never the text itself.
pub(crate) fn measure(chat: &Map<String, Value>) -> berth_store::ContextMeasure {
    let messages = chat
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|m| {
            let role = m.get("role").and_then(Value::as_str).unwrap_or("unknown");
            (role, serde_json::to_string(m).map_or(0, |t| t.len() as u64))
        });
    let tools = chat
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|t| {
            let name = t.pointer("/function/name").and_then(Value::as_str).unwrap_or("");
            (name, serde_json::to_string(t).map_or(0, |s| s.len() as u64))
        });
    measured(messages, tools)
}

/// [`measure`] from each message's role and size in bytes, and each tool's name and size.
pub(crate) fn measured<R: AsRef<str>, N: AsRef<str>>(
    messages: impl IntoIterator<Item = (R, u64)>,
    tools: impl IntoIterator<Item = (N, u64)>,
) -> berth_store::ContextMeasure {
    let tokens = |bytes: u64| bytes.div_ceil(4);
    let mut roles: Vec<berth_protocol::RoleInput> = Vec::new();
    for (role, bytes) in messages {
        let role = role.as_ref();
        match roles.iter_mut().find(|r| r.role == role) {
            Some(r) => {
                r.messages += 1;
                r.bytes += bytes;
            }
            None => roles.push(berth_protocol::RoleInput {
                role: role.to_string(),
                messages: 1,
                bytes,
                estimated_tokens: 0,
            }),
        }
    }
    for r in &mut roles {
        r.estimated_tokens = tokens(r.bytes);
    }
    let tools: Vec<berth_protocol::ToolSchemaSize> = tools
        .into_iter()
        .map(|(name, bytes)| berth_protocol::ToolSchemaSize {
            name: name.as_ref().to_string(),
            bytes,
            estimated_tokens: tokens(bytes),
        })
        .collect();
    let estimated_tokens =
        roles.iter().map(|r| r.estimated_tokens).sum::<u64>() + tools.iter().map(|t| t.estimated_tokens).sum::<u64>();
    berth_store::ContextMeasure {
        roles,
        tools,
        estimated_tokens,
    }
}

/// Longest SSE line accepted from a provider.
const LINE_MAX: usize = 16 << 20;

/// Splits an SSE byte stream into events (`event:` name and joined `data:` lines).
#[derive(Default)]
pub(crate) struct SseParser {
    line: Vec<u8>,
    event: String,
    data: String,
    has_data: bool,
}

impl SseParser {
    /// Feed bytes; calls `f(event, data)` per complete event. Err: a line over the bound.
    pub(crate) fn feed(&mut self, bytes: &[u8], mut f: impl FnMut(&str, &str)) -> Result<(), Cause> {
        for &b in bytes {
            match b {
                b'\r' => {}
                b'\n' => {
                    let line = std::mem::take(&mut self.line);
                    if line.is_empty() {
                        if self.has_data {
                            f(&self.event, &self.data);
                        }
                        self.event.clear();
                        self.data.clear();
                        self.has_data = false;
                        continue;
                    }
                    let line = String::from_utf8_lossy(&line);
                    let (field, value) = line.split_once(':').unwrap_or((&line, ""));
                    let value = value.strip_prefix(' ').unwrap_or(value);
                    match field {
                        "event" => value.clone_into(&mut self.event),
                        "data" => {
                            if self.has_data {
                                self.data.push('\n');
                            }
                            self.data.push_str(value);
                            self.has_data = true;
                        }
                        _ => {}
                    }
                    if self.data.len() > LINE_MAX {
                        return Err(cause(CauseCode::ProviderProtocol));
                    }
                }
                _ => {
                    if self.line.len() >= LINE_MAX {
                        return Err(cause(CauseCode::ProviderProtocol));
                    }
                    self.line.push(b);
                }
            }
        }
        Ok(())
    }
}

/// The text of a chat message's `content` (a string, or an array of parts with `text`).
pub(crate) fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// The chat request's output cap (`max_completion_tokens` or `max_tokens`).
pub(crate) fn max_tokens(chat: &Map<String, Value>) -> Option<u64> {
    chat.get("max_completion_tokens")
        .or_else(|| chat.get("max_tokens"))
        .and_then(Value::as_u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_across_chunks_with_names_and_crlf() {
        let mut p = SseParser::default();
        let mut got = Vec::new();
        let mut f = |e: &str, d: &str| got.push((e.to_string(), d.to_string()));
        p.feed(b"event: a\r\ndata: {\"x\"", &mut f).unwrap();
        p.feed(b":1}\r\n\r\n: comment\n\ndata: one\ndata: two\n\n", &mut f)
            .unwrap();
        assert_eq!(
            got,
            vec![("a".into(), "{\"x\":1}".into()), (String::new(), "one\ntwo".into())]
        );
    }
}
