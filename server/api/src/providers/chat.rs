//! OpenAI Chat Completions: the normalized format itself. The request asks for usage in
//! the stream; the response passes through unchanged.

use serde_json::{Map, Value, json};

use super::Outgoing;
use crate::config::ReasoningLevel;

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
    if let Some(level) = level {
        chat.entry("reasoning_effort").or_insert(level.as_str().into());
    }
    chat.insert("stream".into(), true.into());
    chat.insert("stream_options".into(), json!({"include_usage": true}));
    Outgoing {
        path: "/chat/completions",
        body: Value::Object(chat),
    }
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
}
