//! OpenAI Chat Completions streaming client (through the API tier's proxy).

use std::future::Future;

use berth_protocol::{
    Cause,
    worker::{self as wp, ProxyError, TurnRun, Usage},
};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;

use crate::{Link, turn::StepError};

/// A finished model step.
#[derive(Debug, Default)]
pub(crate) struct Completion {
    pub text: String,
    pub thinking: String,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Option<Usage>,
}

#[derive(Debug, Default, Clone)]
pub(crate) struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

fn cause(code: &str) -> StepError {
    StepError::Failed(Cause {
        code: code.into(),
        status: None,
    })
}

/// Stream one completion, calling `on_delta(text, thinking)` as output arrives.
pub(crate) async fn stream<F, Fut>(link: &Link, run: &TurnRun, on_delta: F) -> Result<Completion, StepError>
where
    F: Fn(Option<String>, Option<String>) -> Fut,
    Fut: Future<Output = bool>,
{
    let body = json!({ "model": run.model, "messages": run.messages, "stream": true });
    let resp = link
        .http
        .post(&link.proxy_url)
        .bearer_auth(&link.token)
        .header(wp::MODEL_PROXY_TURN_HEADER, &run.turn_id)
        .json(&body)
        .send()
        .await
        .map_err(|e| StepError::Link(e.into()))?;
    if !resp.status().is_success() {
        let status = resp.status().as_u16();
        let err = resp.json::<ProxyError>().await.map(|e| e.error);
        return Err(StepError::Failed(err.unwrap_or(Cause {
            code: "provider-status".into(),
            status: Some(status),
        })));
    }
    let mut completion = Completion::default();
    let mut parser = SseParser::default();
    let mut body = resp.bytes_stream();
    let mut done = false;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|_| cause("provider-unreachable"))?;
        for data in parser.feed(&chunk) {
            if data == "[DONE]" {
                done = true;
                break;
            }
            let chunk: Chunk = serde_json::from_str(&data).map_err(|_| cause("provider-protocol"))?;
            if let Some(u) = chunk.usage {
                completion.usage = Some(Usage {
                    input_tokens: u.prompt_tokens,
                    output_tokens: u.completion_tokens,
                });
            }
            for choice in chunk.choices.unwrap_or_default() {
                let d = choice.delta;
                let thinking = d.reasoning_content.or(d.reasoning).filter(|s| !s.is_empty());
                let text = d.content.filter(|s| !s.is_empty());
                if text.is_some() || thinking.is_some() {
                    completion.text.push_str(text.as_deref().unwrap_or(""));
                    completion.thinking.push_str(thinking.as_deref().unwrap_or(""));
                    // Live deltas are best effort; history gets the whole step.
                    let _ = on_delta(text, thinking).await;
                }
                for tc in d.tool_calls.unwrap_or_default() {
                    let i = tc.index as usize;
                    if completion.tool_calls.len() <= i {
                        completion.tool_calls.resize(i + 1, ToolCall::default());
                    }
                    let slot = &mut completion.tool_calls[i];
                    if let Some(id) = tc.id {
                        slot.id = id;
                    }
                    if let Some(f) = tc.function {
                        slot.name.push_str(f.name.as_deref().unwrap_or(""));
                        slot.arguments.push_str(f.arguments.as_deref().unwrap_or(""));
                    }
                }
            }
        }
        if done {
            break;
        }
    }
    if !done {
        return Err(cause("provider-stream-ended"));
    }
    Ok(completion)
}

/// Splits an SSE byte stream into `data:` payloads.
#[derive(Default)]
pub(crate) struct SseParser {
    buf: Vec<u8>,
    data: String,
}

impl SseParser {
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(nl) = self.buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=nl).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if !self.data.is_empty() {
                    out.push(std::mem::take(&mut self.data));
                }
            } else if let Some(v) = line.strip_prefix("data:") {
                if !self.data.is_empty() {
                    self.data.push('\n');
                }
                self.data.push_str(v.strip_prefix(' ').unwrap_or(v));
            }
        }
        out
    }
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Option<Vec<Choice>>,
    #[serde(default)]
    usage: Option<ChunkUsage>,
}

#[derive(Deserialize)]
struct ChunkUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Delta,
}

#[derive(Deserialize, Default)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: u32,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::SseParser;

    #[test]
    fn sse_events_split_across_reads() {
        let mut p = SseParser::default();
        assert!(p.feed(b"data: {\"a\"").is_empty());
        assert_eq!(
            p.feed(b":1}\n\ndata: [DONE]\n\n"),
            vec!["{\"a\":1}".to_string(), "[DONE]".to_string()]
        );
        assert_eq!(p.feed(b": comment\r\n\r\ndata: x\r\n\r\n"), vec!["x".to_string()]);
    }
}
