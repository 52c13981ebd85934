//! Anthropic Messages (`POST …/messages`, streaming): the chat request becomes `system` +
//! alternating messages of content blocks (`tool_use`, `tool_result`), and the stream's
//! content-block events become normalized chunks.

use berth_protocol::Cause;
use berth_protocol::CauseCode;
use serde_json::{Map, Value, json};

use super::{Outgoing, Translate, cause, content_text, finish, max_tokens, reasoning_chunk, text, tool_call};
use crate::config::ReasoningLevel;

/// Anthropic requires an output cap; this one applies when the request names none.
const DEFAULT_MAX_TOKENS: u64 = 8192;
/// The smallest thinking budget Anthropic accepts.
const MIN_THINKING_BUDGET: u64 = 1024;
/// Thinking kept to echo back at most (a provider thinking without end fails the step).
const THINKING_MAX: usize = 16 << 20;
/// The block types this format echoes back.
const REASONING_BLOCKS: &[&str] = &["thinking", "redacted_thinking"];

/// Tokens of thinking a level may spend.
fn thinking_budget(level: ReasoningLevel) -> u64 {
    match level {
        ReasoningLevel::Low => 2048,
        ReasoningLevel::Medium => 8192,
        ReasoningLevel::High => 24576,
    }
}

pub(crate) fn request(chat: Map<String, Value>, level: Option<ReasoningLevel>) -> Outgoing {
    let mut system = Vec::new();
    let mut messages: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for m in chat.get("messages").and_then(Value::as_array).into_iter().flatten() {
        let (role, blocks) = match m.get("role").and_then(Value::as_str).unwrap_or("") {
            "system" | "developer" => {
                system.push(content_text(m.get("content")));
                continue;
            }
            "user" => ("user", user_blocks(m.get("content"))),
            "assistant" => {
                // Thinking (with its signature) comes back first and unchanged, as Anthropic
                // requires when tool use follows it.
                let mut blocks: Vec<Value> = super::reasoning_items(m, REASONING_BLOCKS).cloned().collect();
                let said = content_text(m.get("content"));
                if !said.is_empty() {
                    blocks.push(json!({"type": "text", "text": said}));
                }
                for tc in m.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
                    let args = tc
                        .pointer("/function/arguments")
                        .and_then(Value::as_str)
                        .unwrap_or("{}");
                    blocks.push(json!({
                        "type": "tool_use",
                        "id": tc.get("id").cloned().unwrap_or_default(),
                        "name": tc.pointer("/function/name").cloned().unwrap_or_default(),
                        "input": serde_json::from_str::<Value>(args).ok().filter(Value::is_object).unwrap_or(json!({})),
                    }));
                }
                ("assistant", blocks)
            }
            "tool" => (
                "user",
                vec![json!({
                    "type": "tool_result",
                    "tool_use_id": m.get("tool_call_id").cloned().unwrap_or_default(),
                    "content": content_text(m.get("content")),
                })],
            ),
            _ => continue,
        };
        if blocks.is_empty() {
            continue;
        }
        // Roles alternate: consecutive messages of one role (tool results) become one.
        match messages.last_mut() {
            Some((last, b)) if *last == role => b.extend(blocks),
            _ => messages.push((role, blocks)),
        }
    }
    let asked = max_tokens(&chat);
    let mut max = asked.unwrap_or(DEFAULT_MAX_TOKENS);
    // Thinking spends part of `max_tokens`: room is added when the request named no cap,
    // and the budget never takes more than half of a cap it named.
    let budget = level.map(thinking_budget).and_then(|b| {
        if asked.is_none() {
            max += b;
        }
        Some(b.min(max / 2)).filter(|b| *b >= MIN_THINKING_BUDGET)
    });
    let mut body = json!({
        "model": chat.get("model").cloned().unwrap_or_default(),
        "messages": messages.into_iter().map(|(role, content)| json!({"role": role, "content": content})).collect::<Vec<_>>(),
        "max_tokens": max,
        "stream": true,
    });
    if !system.is_empty() {
        body["system"] = system.join("\n\n").into();
    }
    let tools: Vec<Value> = super::chat_functions(&chat)
        .map(|(name, description, parameters)| {
            json!({"name": name, "description": description, "input_schema": parameters})
        })
        .collect();
    if !tools.is_empty() {
        body["tools"] = tools.into();
        if let Some(choice) = chat.get("tool_choice").and_then(Value::as_str) {
            let kind = match choice {
                // With thinking on, Anthropic takes only `auto` and `none`.
                "required" if budget.is_none() => "any",
                "none" => "none",
                _ => "auto",
            };
            body["tool_choice"] = json!({"type": kind});
        }
    }
    if let Some(budget) = budget {
        body["thinking"] = json!({"type": "enabled", "budget_tokens": budget});
    } else {
        // Sampling parameters are not accepted beside thinking.
        for key in ["temperature", "top_p"] {
            if let Some(v) = chat.get(key) {
                body[key] = v.clone();
            }
        }
    }
    Outgoing {
        path: "/messages",
        body,
    }
}

fn user_blocks(content: Option<&Value>) -> Vec<Value> {
    let Some(Value::Array(parts)) = content else {
        let t = content_text(content);
        return if t.is_empty() {
            Vec::new()
        } else {
            vec![json!({"type": "text", "text": t})]
        };
    };
    parts
        .iter()
        .filter_map(|p| match p.get("type").and_then(Value::as_str) {
            Some("text") => Some(json!({"type": "text", "text": p.get("text").cloned().unwrap_or_default()})),
            Some("image_url") => {
                // Only inline images (`data:<type>;base64,<data>`) have an Anthropic form.
                let url = p.pointer("/image_url/url").and_then(Value::as_str)?;
                let (media, data) = url.strip_prefix("data:")?.split_once(";base64,")?;
                Some(json!({"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}))
            }
            _ => None,
        })
        .collect()
}

/// The stream's state: content blocks that are tool calls, the thinking block being
/// written (index, text, signature), usage so far, stop reason.
#[derive(Default)]
pub(crate) struct Stream {
    tool_blocks: Vec<u64>,
    thinking: Option<(u64, String, String)>,
    input_tokens: u64,
    output_tokens: u64,
    stop_reason: String,
}

impl Translate for Stream {
    fn event(&mut self, _event: &str, data: &str, out: &mut Vec<Value>) -> Result<bool, Cause> {
        let v: Value = serde_json::from_str(data).map_err(|_| cause(CauseCode::ProviderProtocol))?;
        let str_of = |p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or("");
        let num = |p: &str| v.pointer(p).and_then(Value::as_u64);
        match str_of("/type") {
            "message_start" => {
                // Cached input is input too.
                self.input_tokens = ["input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"]
                    .iter()
                    .filter_map(|k| num(&format!("/message/usage/{k}")))
                    .sum();
                self.output_tokens = num("/message/usage/output_tokens").unwrap_or(0);
            }
            "content_block_start" if str_of("/content_block/type") == "thinking" => {
                self.thinking = Some((num("/index").unwrap_or(0), String::new(), String::new()));
            }
            "content_block_start" if str_of("/content_block/type") == "redacted_thinking" => {
                let data = str_of("/content_block/data");
                out.push(reasoning_chunk(vec![
                    json!({"type": "redacted_thinking", "data": data}),
                ]));
            }
            "content_block_stop" => {
                let index = num("/index").unwrap_or(0);
                if let Some((_, thinking, signature)) = self.thinking.take_if(|(i, ..)| *i == index)
                    && !signature.is_empty()
                {
                    out.push(reasoning_chunk(vec![
                        json!({"type": "thinking", "thinking": thinking, "signature": signature}),
                    ]));
                }
            }
            "content_block_start" if str_of("/content_block/type") == "tool_use" => {
                self.tool_blocks.push(num("/index").unwrap_or(0));
                out.push(tool_call(
                    self.tool_blocks.len() - 1,
                    Some((str_of("/content_block/id"), str_of("/content_block/name"))),
                    "",
                ));
            }
            "content_block_delta" => match str_of("/delta/type") {
                "text_delta" => out.push(text("content", str_of("/delta/text"))),
                "thinking_delta" => {
                    let piece = str_of("/delta/thinking");
                    if let Some((_, thinking, _)) = &mut self.thinking {
                        if thinking.len() + piece.len() > THINKING_MAX {
                            return Err(cause(CauseCode::ProviderResponseTooLarge));
                        }
                        thinking.push_str(piece);
                    }
                    out.push(text("reasoning_content", piece));
                }
                "signature_delta" => {
                    if let Some((_, _, signature)) = &mut self.thinking {
                        if signature.len() > THINKING_MAX {
                            return Err(cause(CauseCode::ProviderResponseTooLarge));
                        }
                        signature.push_str(str_of("/delta/signature"));
                    }
                }
                "input_json_delta" => {
                    let block = num("/index").unwrap_or(0);
                    let Some(i) = self.tool_blocks.iter().position(|b| *b == block) else {
                        return Err(cause(CauseCode::ProviderProtocol));
                    };
                    out.push(tool_call(i, None, str_of("/delta/partial_json")));
                }
                _ => {}
            },
            "message_delta" => {
                if let Some(n) = num("/usage/output_tokens") {
                    self.output_tokens = n;
                }
                if let Some(r) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    r.clone_into(&mut self.stop_reason);
                }
            }
            "message_stop" => {
                let reason = match self.stop_reason.as_str() {
                    "tool_use" => "tool_calls",
                    "max_tokens" => "length",
                    _ => "stop",
                };
                finish(out, reason, Some((self.input_tokens, self.output_tokens)));
                return Ok(true);
            }
            "error" => {
                return Err(cause(match str_of("/error/type") {
                    "overloaded_error" | "rate_limit_error" => CauseCode::ProviderRateLimited,
                    _ => CauseCode::ProviderFailed,
                }));
            }
            _ => {}
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_results_merge_into_one_user_message() {
        let chat = json!({"model": "m", "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "function": {"name": "a", "arguments": "{\"x\":1}"}},
                {"id": "c2", "function": {"name": "b", "arguments": "not json"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "r1"},
            {"role": "tool", "tool_call_id": "c2", "content": "r2"},
        ]});
        let Value::Object(chat) = chat else { unreachable!() };
        let b = request(chat, None).body;
        assert_eq!(b["system"], "sys");
        assert!(b.get("thinking").is_none());
        assert_eq!(b["max_tokens"], DEFAULT_MAX_TOKENS);
        let msgs = b["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 3);
        assert_eq!(msgs[1]["content"][0]["input"], json!({"x": 1}));
        assert_eq!(msgs[1]["content"][1]["input"], json!({}));
        assert_eq!(msgs[2]["content"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn thinking_blocks_come_back_first_with_their_signature_and_the_level_sets_a_budget() {
        let mut s = Stream::default();
        let mut out = Vec::new();
        for e in [
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "a"}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "b"}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig"}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "redacted_thinking", "data": "xyz"}}),
        ] {
            s.event("", &e.to_string(), &mut out).unwrap();
        }
        let items: Vec<Value> = out
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["reasoning_items"].as_array())
            .flatten()
            .cloned()
            .collect();
        let thinking = json!({"type": "thinking", "thinking": "ab", "signature": "sig"});
        let redacted = json!({"type": "redacted_thinking", "data": "xyz"});
        assert_eq!(items, vec![thinking.clone(), redacted.clone()]);
        let chat = json!({"model": "m", "temperature": 0.2, "tool_choice": "required", "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "reasoning_items": [thinking, redacted, {"type": "reasoning"}],
             "tool_calls": [{"id": "c1", "function": {"name": "ls", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
        ], "tools": [{"type": "function", "function": {"name": "ls"}}]});
        let Value::Object(chat) = chat else { unreachable!() };
        let b = request(chat.clone(), Some(ReasoningLevel::Medium)).body;
        let blocks = b["messages"][1]["content"].as_array().unwrap();
        assert_eq!(blocks[0]["signature"], "sig");
        assert_eq!(blocks[1]["type"], "redacted_thinking");
        assert_eq!(blocks[2]["type"], "tool_use");
        assert_eq!(blocks.len(), 3);
        assert_eq!(b["thinking"]["budget_tokens"], 8192);
        assert_eq!(b["max_tokens"], DEFAULT_MAX_TOKENS + 8192);
        assert!(b.get("temperature").is_none());
        assert_eq!(b["tool_choice"]["type"], "auto");
        // A small cap leaves no room to think: no thinking, sampling kept.
        let mut small = chat;
        small.insert("max_tokens".into(), 1500.into());
        let b = request(small, Some(ReasoningLevel::High)).body;
        assert!(b.get("thinking").is_none());
        assert_eq!(b["max_tokens"], 1500);
        assert_eq!(b["temperature"], 0.2);
    }

    #[test]
    fn thinking_text_tools_and_usage_are_normalized() {
        let mut s = Stream::default();
        let mut out = Vec::new();
        let events = [
            json!({"type": "message_start", "message": {"usage": {"input_tokens": 5, "cache_read_input_tokens": 2, "output_tokens": 1}}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hm"}}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t1", "name": "ls"}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{}"}}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}}),
            json!({"type": "message_stop"}),
        ];
        let mut done = false;
        for e in events {
            done = s.event("", &e.to_string(), &mut out).unwrap();
        }
        assert!(done);
        assert_eq!(out[0]["choices"][0]["delta"]["reasoning_content"], "hm");
        assert_eq!(out[1]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], "ls");
        assert_eq!(out[3]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(out[4]["usage"]["prompt_tokens"], 7);
        assert_eq!(out[4]["usage"]["completion_tokens"], 9);
    }
}
