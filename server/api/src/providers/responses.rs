//! The OpenAI Responses API (`POST …/responses`, streaming): the chat request becomes
//! `instructions` + `input` items (messages, `function_call`, `function_call_output`), and
//! the typed stream events become normalized chunks.

use berth_protocol::Cause;
use berth_protocol::CauseCode;
use serde_json::{Map, Value, json};

use super::{Outgoing, Translate, cause, content_text, finish, max_tokens, text, tool_call};
use crate::config::ReasoningLevel;

pub(crate) fn request(chat: Map<String, Value>, level: Option<ReasoningLevel>) -> Outgoing {
    let mut instructions = Vec::new();
    let mut input = Vec::new();
    for m in chat.get("messages").and_then(Value::as_array).into_iter().flatten() {
        match m.get("role").and_then(Value::as_str).unwrap_or("") {
            "system" | "developer" => instructions.push(content_text(m.get("content"))),
            "user" => input.push(json!({"role": "user", "content": user_content(m.get("content"))})),
            "assistant" => {
                // The step's reasoning items come back before what it said and called.
                input.extend(super::reasoning_items(m, &["reasoning"]).cloned());
                let said = content_text(m.get("content"));
                if !said.is_empty() {
                    input.push(json!({"role": "assistant", "content": said}));
                }
                for tc in m.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
                    input.push(json!({
                        "type": "function_call",
                        "call_id": tc.get("id").cloned().unwrap_or_default(),
                        "name": tc.pointer("/function/name").cloned().unwrap_or_default(),
                        "arguments": tc.pointer("/function/arguments").cloned().unwrap_or("{}".into()),
                    }));
                }
            }
            "tool" => input.push(json!({
                "type": "function_call_output",
                "call_id": m.get("tool_call_id").cloned().unwrap_or_default(),
                "output": content_text(m.get("content")),
            })),
            _ => {}
        }
    }
    let mut body = json!({
        "model": chat.get("model").cloned().unwrap_or_default(),
        "input": input,
        "stream": true,
        "store": false,
    });
    if !instructions.is_empty() {
        body["instructions"] = instructions.join("\n\n").into();
    }
    let tools: Vec<Value> = super::chat_functions(&chat)
        .map(|(name, description, parameters)| {
            json!({"type": "function", "name": name, "description": description, "parameters": parameters})
        })
        .collect();
    if !tools.is_empty() {
        body["tools"] = tools.into();
    }
    if let Some(n) = max_tokens(&chat) {
        body["max_output_tokens"] = n.into();
    }
    for key in ["temperature", "top_p"] {
        if let Some(v) = chat.get(key) {
            body[key] = v.clone();
        }
    }
    if let Some(choice @ Value::String(_)) = chat.get("tool_choice") {
        body["tool_choice"] = choice.clone();
    }
    if let Some(level) = level {
        // Nothing is stored at the provider: the reasoning comes back encrypted, for the
        // next step of the turn to send again.
        body["reasoning"] = json!({"effort": level.as_str(), "summary": "auto"});
        body["include"] = json!(["reasoning.encrypted_content"]);
    }
    Outgoing {
        path: "/responses",
        body,
    }
}

fn user_content(content: Option<&Value>) -> Value {
    match content {
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| match p.get("type").and_then(Value::as_str) {
                Some("text") => Some(json!({"type": "input_text", "text": p.get("text").cloned().unwrap_or_default()})),
                Some("image_url") => Some(json!({"type": "input_image",
                    "image_url": p.pointer("/image_url/url").cloned().unwrap_or_default()})),
                _ => None,
            })
            .collect(),
        other => content_text(other).into(),
    }
}

/// The stream's state: which output items are tool calls (their normalized index).
#[derive(Default)]
pub(crate) struct Stream {
    tool_items: Vec<u64>,
}

impl Translate for Stream {
    fn event(&mut self, _event: &str, data: &str, out: &mut Vec<Value>) -> Result<bool, Cause> {
        let v: Value = serde_json::from_str(data).map_err(|_| cause(CauseCode::ProviderProtocol))?;
        let str_of = |p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or("");
        match str_of("/type") {
            "response.output_text.delta" => out.push(text("content", str_of("/delta"))),
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" => {
                out.push(text("reasoning_content", str_of("/delta")))
            }
            "response.output_item.done" if str_of("/item/type") == "reasoning" => {
                if let Some(item) = v.get("item") {
                    out.push(super::reasoning_chunk(vec![item.clone()]));
                }
            }
            "response.output_item.added" if str_of("/item/type") == "function_call" => {
                let item = v.get("output_index").and_then(Value::as_u64).unwrap_or(0);
                self.tool_items.push(item);
                out.push(tool_call(
                    self.tool_items.len() - 1,
                    Some((str_of("/item/call_id"), str_of("/item/name"))),
                    str_of("/item/arguments"),
                ));
            }
            "response.function_call_arguments.delta" => {
                let item = v.get("output_index").and_then(Value::as_u64).unwrap_or(0);
                let Some(i) = self.tool_items.iter().position(|t| *t == item) else {
                    return Err(cause(CauseCode::ProviderProtocol));
                };
                out.push(tool_call(i, None, str_of("/delta")));
            }
            kind @ ("response.completed" | "response.incomplete") => {
                let usage = v.pointer("/response/usage").map(|u| {
                    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
                    (n("input_tokens"), n("output_tokens"))
                });
                let reason = if kind == "response.incomplete" {
                    "length"
                } else if self.tool_items.is_empty() {
                    "stop"
                } else {
                    "tool_calls"
                };
                finish(out, reason, usage);
                return Ok(true);
            }
            "response.failed" | "error" => return Err(cause(CauseCode::ProviderFailed)),
            _ => {}
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_with_tools_becomes_input_items() {
        let chat = json!({"model": "m", "max_tokens": 100, "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "list"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        ], "tools": [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]});
        let Value::Object(chat) = chat else { unreachable!() };
        let out = request(chat, None);
        assert_eq!(out.path, "/responses");
        assert!(out.body.get("reasoning").is_none());
        assert_eq!(out.body["instructions"], "be brief");
        assert_eq!(out.body["max_output_tokens"], 100);
        assert_eq!(out.body["input"][1]["type"], "function_call");
        assert_eq!(out.body["input"][2]["output"], "a.txt");
        assert_eq!(out.body["tools"][0]["name"], "ls");
    }

    #[test]
    fn reasoning_items_round_trip_with_the_level() {
        let item = json!({"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "enc"});
        let mut s = Stream::default();
        let mut out = Vec::new();
        let done = json!({"type": "response.output_item.done", "output_index": 0, "item": item});
        s.event("", &done.to_string(), &mut out).unwrap();
        assert_eq!(out[0]["choices"][0]["delta"]["reasoning_items"][0], item);
        let chat = json!({"model": "m", "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": null, "reasoning_items": [item, {"type": "thinking"}],
             "tool_calls": [{"id": "c1", "function": {"name": "ls", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "a"},
        ]});
        let Value::Object(chat) = chat else { unreachable!() };
        let b = request(chat, Some(ReasoningLevel::Low)).body;
        assert_eq!(b["reasoning"]["effort"], "low");
        assert_eq!(b["include"][0], "reasoning.encrypted_content");
        let input = b["input"].as_array().unwrap();
        assert_eq!(input.len(), 4, "{input:?}");
        assert_eq!(input[1], item);
        assert_eq!(input[2]["type"], "function_call");
    }

    #[test]
    fn tool_call_pieces_and_usage_are_normalized() {
        let mut s = Stream::default();
        let mut out = Vec::new();
        let events = [
            json!({"type": "response.output_item.added", "output_index": 1,
                   "item": {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": ""}}),
            json!({"type": "response.function_call_arguments.delta", "output_index": 1, "delta": "{\"a\""}),
            json!({"type": "response.function_call_arguments.delta", "output_index": 1, "delta": ":1}"}),
            json!({"type": "response.completed", "response": {"usage": {"input_tokens": 7, "output_tokens": 3}}}),
        ];
        let mut done = false;
        for e in events {
            done = s.event("", &e.to_string(), &mut out).unwrap();
        }
        assert!(done);
        assert_eq!(out[0]["choices"][0]["delta"]["tool_calls"][0]["id"], "c1");
        assert_eq!(
            out[2]["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"],
            ":1}"
        );
        assert_eq!(out[3]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(out[4]["usage"]["prompt_tokens"], 7);
    }
}
