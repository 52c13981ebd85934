//! OpenAI Chat Completions: the normalized format itself. The request asks for usage in
//! the stream; the response passes through unchanged.

use serde_json::{Map, Value, json};

use super::Outgoing;

pub(crate) fn request(mut chat: Map<String, Value>) -> Outgoing {
    chat.insert("stream".into(), true.into());
    chat.insert("stream_options".into(), json!({"include_usage": true}));
    Outgoing {
        path: "/chat/completions",
        body: Value::Object(chat),
    }
}
