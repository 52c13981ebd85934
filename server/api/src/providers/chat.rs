//! OpenAI Chat Completions: the normalized format itself. The request asks for usage in
//! the stream; the response passes through unchanged.

use std::borrow::Cow;

use berth_store::ContextMeasure;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json, value::RawValue};

use super::{Encoded, Outgoing};
use crate::config::ReasoningLevel;

const PATH: &str = "/chat/completions";

pub(crate) fn request(mut chat: Map<String, Value>, level: Option<ReasoningLevel>) -> Outgoing {
    // Berth's echo of reasoning blocks is not part of this format.
    for m in chat
        .get_mut("messages")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Some(m) = m.as_object_mut() {
            m.remove("reasoning_items");
        }
    }
    top_level(&mut chat, level);
    Outgoing {
        path: PATH,
        body: Value::Object(chat),
    }
}

/// The request's own fields for this format: the reasoning level, streaming with usage.
fn top_level(chat: &mut Map<String, Value>, level: Option<ReasoningLevel>) {
    if let Some(level) = level {
        chat.entry("reasoning_effort").or_insert(level.as_str().into());
    }
    chat.insert("stream".into(), true.into());
    chat.insert("stream_options".into(), json!({"include_usage": true}));
}

/// A worker's chat-completions body read in one pass that builds no tree of the
/// conversation: the top-level fields but `messages` and `tools` as values (the proxy
/// rewrites those), `messages` and `tools` as their JSON text, present (even `null`) or not.
#[derive(Deserialize)]
struct Borrowed<'a> {
    #[serde(default, borrow, deserialize_with = "present")]
    messages: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    tools: Option<&'a RawValue>,
    #[serde(flatten)]
    rest: Map<String, Value>,
}

/// A field that is there, `null` included (`Option<&RawValue>` alone reads `null` as absent).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// What the proxy reads of a message: its role, and whether it carries Berth's echo of
/// reasoning blocks (which this format must not get). The rest is skipped, not built.
#[derive(Deserialize)]
struct MessageHead<'a> {
    #[serde(default, borrow)]
    role: Option<Cow<'a, str>>,
    #[serde(default, deserialize_with = "is_there")]
    reasoning_items: bool,
}

/// True for a field that is there, whatever it holds.
fn is_there<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    serde::de::IgnoredAny::deserialize(d).map(|_| true)
}

/// What the proxy reads of a tool schema: the function's name.
#[derive(Deserialize)]
struct ToolHead<'a> {
    #[serde(default, borrow)]
    function: Option<FunctionHead<'a>>,
}

#[derive(Deserialize)]
struct FunctionHead<'a> {
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
}

/// The request for a chat-completions provider straight from the worker's `body`, with its
/// `session.context` measure, when nothing inside its messages needs rewriting: the top-level
/// fields rewritten by `rewrite` and this format's own, the messages and tools forwarded as
/// the text they came in (no tree of the conversation built, none written again). The same
/// request and the same measure as [`request`] and [`super::measure`] on the parsed body,
/// for the compact JSON a worker sends. None when the body needs the tree: a message with
/// reasoning blocks to drop, an image part for a model without image input (`images`
/// false), or a body of another shape; the caller then takes that path.
pub(crate) fn forward(
    body: &[u8],
    images: bool,
    level: Option<ReasoningLevel>,
    rewrite: impl FnOnce(&mut Map<String, Value>),
) -> Option<(Encoded, ContextMeasure)> {
    let Borrowed {
        messages: Some(messages),
        tools,
        mut rest,
    } = serde_json::from_slice::<Borrowed>(body).ok()?
    else {
        return None;
    };
    let each: Vec<&RawValue> = serde_json::from_str(messages.get()).ok()?;
    let mut roles = Vec::with_capacity(each.len());
    for m in each {
        let text = m.get();
        if !images && text.contains("image_url") {
            return None;
        }
        let head: MessageHead = serde_json::from_str(text).ok()?;
        if head.reasoning_items {
            return None;
        }
        roles.push((head.role.unwrap_or(Cow::Borrowed("unknown")), text.len() as u64));
    }
    let mut schemas = Vec::new();
    if let Some(tools) = tools.filter(|t| t.get() != "null") {
        for t in serde_json::from_str::<Vec<&RawValue>>(tools.get()).ok()? {
            let head: ToolHead = serde_json::from_str(t.get()).ok()?;
            let name = head.function.and_then(|f| f.name).unwrap_or_default();
            schemas.push((name, t.get().len() as u64));
        }
    }
    rewrite(&mut rest);
    top_level(&mut rest, level);
    let out = Forwarded {
        rest: &rest,
        messages,
        tools,
    };
    let encoded = Encoded {
        path: PATH,
        body: Bytes::from(serde_json::to_vec(&out).ok()?),
    };
    Some((encoded, super::measured(roles, schemas)))
}

/// The request [`forward`] writes: the rewritten top-level fields, then the messages and
/// tools as they came.
#[derive(Serialize)]
struct Forwarded<'a> {
    #[serde(flatten)]
    rest: &'a Map<String, Value>,
    messages: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a RawValue>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_level_becomes_reasoning_effort_and_echoed_blocks_are_dropped() {
        let chat = json!({"model": "m", "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "reasoning_items": [{"type": "thinking"}]},
        ]});
        let Value::Object(chat) = chat else { unreachable!() };
        let b = request(chat.clone(), Some(ReasoningLevel::High)).body;
        assert_eq!(b["reasoning_effort"], "high");
        assert!(b["messages"][1].get("reasoning_items").is_none());
        assert!(request(chat, None).body.get("reasoning_effort").is_none());
    }

    /// The request and measure of the tree path, for comparison.
    fn through_tree(
        body: &Value,
        level: Option<ReasoningLevel>,
        rewrite: impl Fn(&mut Map<String, Value>),
    ) -> (Value, Value) {
        let Value::Object(mut chat) = body.clone() else {
            unreachable!()
        };
        rewrite(&mut chat);
        let measured = serde_json::to_value(super::super::measure(&chat)).unwrap();
        (request(chat, level).body, measured)
    }

    fn rewrite(obj: &mut Map<String, Value>) {
        obj.insert("model".into(), "the-model".into());
        obj.remove("n");
        obj.insert("max_tokens".into(), 100.into());
    }

    #[test]
    fn forwarding_sends_and_measures_what_the_tree_path_does() {
        let body = json!({
            "model": "asked", "n": 3, "stream": true, "temperature": 0.7,
            "messages": [
                {"role": "system", "content": "be \"brief\"\n — é"},
                {"role": "user", "content": [{"type": "text", "text": "look"},
                                             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": "{\"a\":1}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "out"},
                {"content": "no role"},
                {"role": "user", "content": "again"},
            ],
            "tools": [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}},
                      {"type": "function", "function": {"parameters": {}}}],
        });
        let bytes = serde_json::to_vec(&body).unwrap();
        for level in [None, Some(ReasoningLevel::High)] {
            let (encoded, measured) = forward(&bytes, true, level, rewrite).expect("forwarded");
            assert_eq!(encoded.path, PATH);
            let sent: Value = serde_json::from_slice(&encoded.body).unwrap();
            let (tree, tree_measured) = through_tree(&body, level, rewrite);
            assert_eq!(sent, tree);
            assert_eq!(serde_json::to_value(&measured).unwrap(), tree_measured);
        }
        assert_eq!(
            serde_json::from_slice::<Value>(&forward(&bytes, true, None, rewrite).unwrap().0.body).unwrap()["tools"][0]
                ["function"]["name"],
            "shell"
        );
        // Without tools, and with `null` tools: as the tree path.
        for tools in [None, Some(Value::Null)] {
            let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
            if let Some(t) = &tools {
                body["tools"] = t.clone();
            }
            let bytes = serde_json::to_vec(&body).unwrap();
            let (encoded, measured) = forward(&bytes, false, None, rewrite).expect("forwarded");
            let (tree, tree_measured) = through_tree(&body, None, rewrite);
            assert_eq!(serde_json::from_slice::<Value>(&encoded.body).unwrap(), tree);
            assert_eq!(serde_json::to_value(&measured).unwrap(), tree_measured);
        }
    }

    #[test]
    fn bodies_whose_messages_need_rewriting_take_the_tree_path() {
        let fwd =
            |body: Value, images: bool| forward(&serde_json::to_vec(&body).unwrap(), images, None, rewrite).is_some();
        let image = json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]});
        assert!(fwd(image.clone(), true));
        assert!(!fwd(image, false), "images to strip");
        assert!(!fwd(
            json!({"messages": [{"role": "assistant", "content": "", "reasoning_items": null}]}),
            true
        ));
        assert!(!fwd(json!({"model": "m"}), true), "no messages");
        assert!(!fwd(json!({"messages": null}), true));
        assert!(!fwd(json!({"messages": ["not an object"]}), true));
        assert!(!fwd(json!({"messages": [{"role": 7}]}), true));
        assert!(!fwd(json!({"messages": [], "tools": [{"function": "x"}]}), true));
        assert!(
            forward(b"{\"messages\": [], \"messages\": []}", true, None, rewrite).is_none(),
            "a repeated key"
        );
        assert!(forward(b"not json", true, None, rewrite).is_none());
    }
}
