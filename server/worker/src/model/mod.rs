//! The model: OpenAI Chat Completions streaming through the API tier's proxy
//! (`eventsource-stream` parses the SSE framing), and the conversation as the provider
//! wants it (`messages.rs`).
//!
//! Provider output is hostile input: the response, each SSE line, and the number of tool
//! calls in a step are bounded, so no stream can make the worker allocate without limit.

use berth_protocol::CauseCode;
pub(crate) mod messages;

use std::future::Future;

use berth_protocol::{
    Cause,
    worker::{self as wp, ProxyError, Usage},
};
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::Value;

use crate::Link;

/// Bytes of one model response on the wire at most (SSE framing and JSON envelopes included).
const RESPONSE_MAX: usize = 64 << 20;
/// Bytes of a step's content at most (text, thinking and tool arguments together), so that
/// the step's rows fit one frame to the server (8 MiB by default).
const CONTENT_MAX: usize = 4 << 20;
/// Bytes of one SSE line at most (the parser rescans an unfinished line as data arrives).
const LINE_MAX: usize = 4 << 20;
/// Tool calls in one step at most (`tool_calls[].index` is bounded by it).
pub(crate) const TOOL_CALLS_MAX: usize = 64;

/// A finished model step.
#[derive(Debug, Default)]
pub(crate) struct Completion {
    pub text: String,
    pub thinking: String,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Option<Usage>,
    /// The provider's own reasoning blocks (Anthropic thinking with its signature, a
    /// Responses reasoning item), opaque here: sent back with this step's assistant message
    /// within the turn, as those providers require when tool calls follow thinking.
    pub reasoning_items: Vec<Value>,
}

#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// Why a step did not complete.
#[derive(Debug)]
pub(crate) enum StreamError {
    /// A typed failure; the turn settles `failed`.
    Failed(Cause),
}

fn failed(code: CauseCode) -> StreamError {
    StreamError::Failed(Cause {
        code: code.as_str().into(),
        status: None,
    })
}

/// Attempts at reaching the model proxy, and the pause before each retry.
const PROXY_RETRIES: [std::time::Duration; 2] =
    [std::time::Duration::from_millis(250), std::time::Duration::from_secs(1)];

/// The model request `body` of turn `turn_id` posted to the model proxy at `url`. A proxy
/// that cannot be reached or drops the request before answering (a replica that just went
/// away behind the load balancer, a pooled connection it closed) is tried again, and then
/// fails the turn `provider-unreachable`: the worker's connection may be alive, and a turn
/// left without its end would hold its session until that connection ends. Nothing is
/// stored before the proxy answers, so a retry stores nothing twice.
async fn post(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    turn_id: &str,
    body: Vec<u8>,
) -> Result<reqwest::Response, StreamError> {
    let mut retries = PROXY_RETRIES.iter();
    loop {
        let sent = http
            .post(url)
            .bearer_auth(token)
            .header(wp::MODEL_PROXY_TURN_HEADER, turn_id)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(resp) => return Ok(resp),
            Err(e) => match retries.next() {
                Some(pause) => {
                    tracing::warn!(turn.id = %turn_id, error = %e, "the model proxy could not be reached; trying again");
                    tokio::time::sleep(*pause).await;
                }
                None => {
                    tracing::warn!(turn.id = %turn_id, error = %e, "the model proxy could not be reached");
                    return Err(failed(CauseCode::ProviderUnreachable));
                }
            },
        }
    }
}

/// Stream one completion of turn `turn_id` for the request `body`, calling
/// `on_delta(text, thinking)` as output arrives.
pub(crate) async fn stream<F, Fut>(
    link: &Link,
    turn_id: &str,
    body: Vec<u8>,
    on_delta: F,
) -> Result<Completion, StreamError>
where
    F: Fn(Option<String>, Option<String>) -> Fut,
    Fut: Future<Output = bool>,
{
    let resp = post(&link.http, &link.proxy_url, &link.token, turn_id, body).await?;
    if !resp.status().is_success() {
        let status = resp.status().as_u16();
        let err = resp.json::<ProxyError>().await.map(|e| e.error);
        return Err(StreamError::Failed(err.unwrap_or(Cause {
            code: CauseCode::ProviderStatus.as_str().into(),
            status: Some(status),
        })));
    }
    let mut guard = Guard::default();
    let bytes = resp.bytes_stream().map(move |chunk| match chunk {
        Ok(b) => guard.admit(&b).map(|()| b),
        Err(_) => Err(Fault::Unreachable),
    });
    let mut events = std::pin::pin!(bytes.eventsource());
    let mut acc = Accumulator::default();
    while let Some(event) = events.next().await {
        // When the chunk arrived, for the TRACE event that follows its delta.
        let received = tracing::enabled!(tracing::Level::TRACE).then(std::time::SystemTime::now);
        let event = event.map_err(|e| match e {
            eventsource_stream::EventStreamError::Transport(Fault::Unreachable) => {
                failed(CauseCode::ProviderUnreachable)
            }
            _ => failed(CauseCode::ProviderProtocol),
        })?;
        if event.data == "[DONE]" {
            return Ok(acc.finish());
        }
        if event.data.is_empty() {
            continue;
        }
        let chunk: Chunk = serde_json::from_str(&event.data).map_err(|_| failed(CauseCode::ProviderProtocol))?;
        if let Some((text, thinking)) = acc.add(chunk)? {
            // Logged after the delta is sent, so that tracing never holds it up.
            let traced = received.map(|at| (at, text.clone(), thinking.clone()));
            // Live deltas are best effort; history gets the whole step.
            let _ = on_delta(text, thinking).await;
            if let Some((at, text, thinking)) = traced {
                trace_output(turn_id, at, text.as_deref(), thinking.as_deref());
            }
        }
    }
    Err(failed(CauseCode::ProviderStreamEnded))
}

/// TRACE (target `berth_worker::model`): live output of turn `turn_id` as it arrived from
/// the provider, `received_us` the wall-clock time (µs since the Unix epoch) it was parsed,
/// so that a reader of the log can tell how long each delta took from here to a watcher.
/// The model's output only: never the request, its headers or any credential.
fn trace_output(turn_id: &str, received: std::time::SystemTime, text: Option<&str>, thinking: Option<&str>) {
    let received_us = received
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    tracing::trace!(
        turn = turn_id,
        received_us,
        text = text.unwrap_or(""),
        thinking = thinking.unwrap_or(""),
        "model output received"
    );
}

/// The byte stream's bounds.
#[derive(Default)]
struct Guard {
    total: usize,
    line: usize,
}

#[derive(Debug)]
enum Fault {
    Unreachable,
    TooLarge,
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Fault::Unreachable => "provider unreachable",
            Fault::TooLarge => "provider response too large",
        })
    }
}

impl Guard {
    fn admit(&mut self, bytes: &[u8]) -> Result<(), Fault> {
        self.total += bytes.len();
        match bytes.iter().rposition(|b| *b == b'\n' || *b == b'\r') {
            Some(i) => self.line = bytes.len() - i - 1,
            None => self.line += bytes.len(),
        }
        if self.total > RESPONSE_MAX || self.line > LINE_MAX {
            return Err(Fault::TooLarge);
        }
        Ok(())
    }
}

/// Assembles a step from its chunks.
#[derive(Default)]
struct Accumulator {
    c: Completion,
    /// Content bytes so far.
    bytes: usize,
}

impl Accumulator {
    /// Add a chunk; returns the live text and thinking it carried, if any.
    #[allow(clippy::type_complexity)]
    fn add(&mut self, chunk: Chunk) -> Result<Option<(Option<String>, Option<String>)>, StreamError> {
        if let Some(cause) = chunk.error {
            return Err(StreamError::Failed(cause));
        }
        if let Some(u) = chunk.usage {
            self.c.usage = Some(Usage {
                input_tokens: u.prompt_tokens,
                output_tokens: u.completion_tokens,
            });
        }
        let mut live = None;
        for choice in chunk.choices.unwrap_or_default() {
            let d = &choice.delta;
            self.bytes += [&d.content, &d.reasoning_content, &d.reasoning]
                .iter()
                .map(|s| s.as_ref().map_or(0, String::len))
                .sum::<usize>();
            for item in d.reasoning_items.iter().flatten() {
                self.bytes += item.to_string().len();
            }
            for tc in d.tool_calls.iter().flatten() {
                self.bytes += tc.function.as_ref().map_or(0, |f| {
                    f.name.as_ref().map_or(0, String::len) + f.arguments.as_ref().map_or(0, String::len)
                });
            }
            if self.bytes > CONTENT_MAX {
                return Err(failed(CauseCode::ProviderResponseTooLarge));
            }
            let d = choice.delta;
            self.c.reasoning_items.extend(d.reasoning_items.unwrap_or_default());
            if self.c.reasoning_items.len() > TOOL_CALLS_MAX {
                return Err(failed(CauseCode::ProviderProtocol));
            }
            let thinking = d.reasoning_content.or(d.reasoning).filter(|s| !s.is_empty());
            let text = d.content.filter(|s| !s.is_empty());
            if text.is_some() || thinking.is_some() {
                self.c.text.push_str(text.as_deref().unwrap_or(""));
                self.c.thinking.push_str(thinking.as_deref().unwrap_or(""));
                live = Some((text, thinking));
            }
            for tc in d.tool_calls.unwrap_or_default() {
                let i = tc.index as usize;
                if i >= TOOL_CALLS_MAX {
                    return Err(failed(CauseCode::ProviderProtocol));
                }
                if self.c.tool_calls.len() <= i {
                    self.c.tool_calls.resize(i + 1, ToolCall::default());
                }
                let slot = &mut self.c.tool_calls[i];
                if let Some(id) = tc.id {
                    slot.id = id;
                }
                if let Some(f) = tc.function {
                    slot.name.push_str(f.name.as_deref().unwrap_or(""));
                    slot.arguments.push_str(f.arguments.as_deref().unwrap_or(""));
                }
            }
        }
        Ok(live)
    }

    /// The step, its tool calls given unique ids (some servers send none).
    fn finish(mut self) -> Completion {
        self.c
            .tool_calls
            .retain(|c| !c.name.is_empty() || !c.arguments.is_empty());
        let mut seen = std::collections::HashSet::new();
        for (i, call) in self.c.tool_calls.iter_mut().enumerate() {
            let mut n = i;
            while call.id.is_empty() || seen.contains(&call.id) {
                call.id = format!("call_{n}");
                n += TOOL_CALLS_MAX;
            }
            seen.insert(call.id.clone());
        }
        self.c
    }
}

#[derive(Deserialize)]
struct Chunk {
    /// The proxy's typed failure in the middle of a stream (idle timeout, …).
    #[serde(default)]
    error: Option<Cause>,
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
    /// Berth's extension of the normalized stream: provider reasoning blocks to echo back.
    #[serde(default)]
    reasoning_items: Option<Vec<Value>>,
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

    /// A model proxy that cannot be connected to fails the turn (after its retries) with a
    /// typed cause, rather than reading as a lost link to the server, which would leave the
    /// turn without its end while the worker's connection lives.
    #[tokio::test]
    async fn an_unreachable_proxy_fails_the_step_typed() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1/model", closed.local_addr().unwrap());
        drop(closed);
        let http = reqwest::Client::new();
        match post(&http, &url, "t", "trn_x", b"{}".to_vec()).await {
            Err(StreamError::Failed(cause)) => assert_eq!(cause.code, "provider-unreachable"),
            Ok(_) => panic!("answered"),
        }
    }

    use super::*;

    fn chunk(v: serde_json::Value) -> Chunk {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn tool_calls_assemble_from_pieces_and_a_huge_index_is_refused() {
        let mut acc = Accumulator::default();
        let tc = |index: u32, id: Option<&str>, name: Option<&str>, args: &str| {
            chunk(serde_json::json!({"choices": [{"delta": {"tool_calls": [
                {"index": index, "id": id, "function": {"name": name, "arguments": args}}
            ]}}]}))
        };
        acc.add(tc(0, Some("a"), Some("shell"), "{\"comm")).unwrap();
        acc.add(tc(1, None, Some("read_file"), "{}")).unwrap();
        acc.add(tc(0, None, None, "and\":\"ls\"}")).unwrap();
        let c = acc.finish();
        assert_eq!(c.tool_calls.len(), 2);
        assert_eq!(c.tool_calls[0].arguments, "{\"command\":\"ls\"}");
        assert_eq!(c.tool_calls[0].id, "a");
        assert!(!c.tool_calls[1].id.is_empty());

        let mut acc = Accumulator::default();
        let r = acc.add(tc(4_000_000_000, Some("x"), Some("shell"), "{}"));
        assert!(matches!(r, Err(StreamError::Failed(c)) if c.code == "provider-protocol"));

        // Content past the bound fails the step instead of growing without limit.
        let mut acc = Accumulator::default();
        let piece = "x".repeat(64 << 10);
        let mut result = Ok(None);
        for _ in 0..(CONTENT_MAX / piece.len() + 1) {
            result = acc.add(tc(0, None, Some(""), &piece));
            if result.is_err() {
                break;
            }
        }
        assert!(matches!(result, Err(StreamError::Failed(c)) if c.code == "provider-response-too-large"));
    }

    #[test]
    fn the_guard_bounds_lines_and_the_whole_response() {
        let mut g = Guard::default();
        assert!(g.admit(b"data: x\r\n\r\n").is_ok());
        let long = vec![b'a'; LINE_MAX / 2 + 1];
        assert!(g.admit(&long).is_ok());
        assert!(g.admit(&long).is_err());
        let mut g = Guard::default();
        let line = vec![b'\n'; 1 << 20];
        for _ in 0..(RESPONSE_MAX >> 20) {
            assert!(g.admit(&line).is_ok());
        }
        assert!(g.admit(b"\n").is_err());
    }

    #[tokio::test]
    async fn sse_with_cr_line_endings_and_split_events_parses() {
        let parts: Vec<Result<&[u8], Fault>> = vec![
            Ok(b"data: {\"a\""),
            Ok(b":1}\r\rdata: [DO"),
            Ok(b"NE]\r\n\r\n: comment\n\n"),
        ];
        let events: Vec<_> = futures_util::stream::iter(parts).eventsource().collect().await;
        let data: Vec<String> = events.into_iter().map(|e| e.unwrap().data).collect();
        assert_eq!(data, ["{\"a\":1}", "[DONE]"]);
    }
}
