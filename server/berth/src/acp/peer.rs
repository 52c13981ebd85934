//! JSON-RPC 2.0 over stdio as ACP frames it: one message per line (UTF-8, no embedded
//! newline), requests in both directions. One writer task owns stdout; requests this side
//! sends wait for their answer in a table the reader fills.

use std::{
    collections::HashMap,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use serde::Serialize;
use serde_json::{Value, json};
use tokio::{
    io::{AsyncWrite, AsyncWriteExt},
    sync::{mpsc, oneshot},
};

use super::wire::code;

/// An error answer: a JSON-RPC code, a message and safe data.
#[derive(Debug, Clone, PartialEq)]
pub struct AcpError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl AcpError {
    pub fn new(code: i64, message: impl Into<String>) -> AcpError {
        AcpError {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub fn invalid_params(message: impl Into<String>) -> AcpError {
        AcpError::new(code::INVALID_PARAMS, message)
    }

    pub fn with_data(mut self, data: Value) -> AcpError {
        self.data = Some(data);
        self
    }

    fn to_json(&self) -> Value {
        let mut e = json!({"code": self.code, "message": self.message});
        if let Some(d) = &self.data {
            e["data"] = d.clone();
        }
        e
    }
}

/// A message read from the other side.
#[derive(Debug, PartialEq)]
pub enum Incoming {
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
    /// An answer to one of this side's requests (its id is ours, so a number).
    Response {
        id: u64,
        outcome: Result<Value, AcpError>,
    },
}

/// Read one line; `Err` is the error answer owed for an unreadable message (with the id
/// when one could be read, else null).
pub fn parse(line: &str) -> Result<Incoming, (Value, AcpError)> {
    let v: Value =
        serde_json::from_str(line).map_err(|_| (Value::Null, AcpError::new(code::PARSE_ERROR, "not JSON")))?;
    let id = v.get("id").cloned();
    let invalid = |id: Option<Value>| {
        (
            id.unwrap_or(Value::Null),
            AcpError::new(code::INVALID_REQUEST, "not a JSON-RPC 2.0 message"),
        )
    };
    if v.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(invalid(id));
    }
    let params = v.get("params").cloned().unwrap_or(Value::Null);
    match (v.get("method").and_then(Value::as_str), id) {
        (Some(method), Some(id)) if id.is_number() || id.is_string() => Ok(Incoming::Request {
            id,
            method: method.to_string(),
            params,
        }),
        (Some(method), None) => Ok(Incoming::Notification {
            method: method.to_string(),
            params,
        }),
        (None, Some(id)) => {
            let id = id.as_u64().ok_or_else(|| invalid(None))?;
            let outcome = match v.get("error") {
                Some(e) => Err(AcpError {
                    code: e.get("code").and_then(Value::as_i64).unwrap_or(code::INTERNAL_ERROR),
                    message: e.get("message").and_then(Value::as_str).unwrap_or_default().to_string(),
                    data: e.get("data").cloned(),
                }),
                None => Ok(v.get("result").cloned().unwrap_or(Value::Null)),
            };
            Ok(Incoming::Response { id, outcome })
        }
        (_, id) => Err(invalid(id)),
    }
}

/// This side of the connection: send notifications, requests and answers.
pub struct Peer {
    out: mpsc::UnboundedSender<String>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Result<Value, AcpError>>>>,
    next_id: AtomicU64,
}

impl Peer {
    /// A peer whose messages a task writes to `sink`, one line each.
    pub fn new<W: AsyncWrite + Unpin + Send + 'static>(mut sink: W) -> Peer {
        let (out, mut lines) = mpsc::unbounded_channel::<String>();
        tokio::spawn(async move {
            while let Some(mut line) = lines.recv().await {
                line.push('\n');
                if sink.write_all(line.as_bytes()).await.is_err() || sink.flush().await.is_err() {
                    break;
                }
            }
        });
        Peer {
            out,
            pending: Mutex::default(),
            next_id: AtomicU64::new(0),
        }
    }

    fn send(&self, message: &Value) {
        // serde_json escapes newlines inside strings, so a message is always one line.
        match serde_json::to_string(message) {
            Ok(line) => {
                let _ = self.out.send(line);
            }
            Err(e) => tracing::warn!(error = %e, "unserializable ACP message"),
        }
    }

    pub fn notify(&self, method: &str, params: impl Serialize) {
        let params = serde_json::to_value(params).unwrap_or(Value::Null);
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    pub fn respond(&self, id: Value, outcome: Result<Value, AcpError>) {
        let message = match outcome {
            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err(e) => json!({"jsonrpc": "2.0", "id": id, "error": e.to_json()}),
        };
        self.send(&message);
    }

    /// Send a request and wait for its answer (an error if the other side goes away).
    pub async fn request(&self, method: &str, params: impl Serialize) -> Result<Value, AcpError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.lock().insert(id, tx);
        let params = serde_json::to_value(params).unwrap_or(Value::Null);
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        rx.await
            .unwrap_or_else(|_| Err(AcpError::new(code::INTERNAL_ERROR, "the client went away")))
    }

    /// Route an answer to the request waiting for it.
    pub fn answered(&self, id: u64, outcome: Result<Value, AcpError>) {
        match self.lock().remove(&id) {
            Some(tx) => {
                let _ = tx.send(outcome);
            }
            None => tracing::debug!(id, "an answer to no request of ours"),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<Result<Value, AcpError>>>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_told_apart() {
        assert_eq!(
            parse(r#"{"jsonrpc":"2.0","id":"a","method":"initialize","params":{"protocolVersion":1}}"#),
            Ok(Incoming::Request {
                id: json!("a"),
                method: "initialize".into(),
                params: json!({"protocolVersion": 1}),
            })
        );
        assert_eq!(
            parse(r#"{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s"}}"#),
            Ok(Incoming::Notification {
                method: "session/cancel".into(),
                params: json!({"sessionId": "s"}),
            })
        );
        assert_eq!(
            parse(r#"{"jsonrpc":"2.0","id":3,"result":{"outcome":{"outcome":"cancelled"}}}"#),
            Ok(Incoming::Response {
                id: 3,
                outcome: Ok(json!({"outcome": {"outcome": "cancelled"}})),
            })
        );
        let Ok(Incoming::Response { outcome: Err(e), .. }) =
            parse(r#"{"jsonrpc":"2.0","id":4,"error":{"code":-32601,"message":"no"}}"#)
        else {
            panic!("an error answer");
        };
        assert_eq!(e.code, code::METHOD_NOT_FOUND);
        assert_eq!(parse("{oops").unwrap_err().1.code, code::PARSE_ERROR);
        let (id, e) = parse(r#"{"id":7,"method":"x"}"#).unwrap_err();
        assert_eq!((id, e.code), (json!(7), code::INVALID_REQUEST));
    }

    #[tokio::test]
    async fn a_request_waits_for_its_answer_and_every_message_is_one_line() {
        let (mut read, write) = tokio::io::duplex(4096);
        let peer = std::sync::Arc::new(Peer::new(write));
        let p = peer.clone();
        let asked = tokio::spawn(async move { p.request("session/request_permission", json!({"x": "a\nb"})).await });
        let mut buf = vec![0u8; 4096];
        let n = tokio::io::AsyncReadExt::read(&mut read, &mut buf).await.unwrap();
        let line = std::str::from_utf8(&buf[..n]).unwrap();
        assert_eq!(line.matches('\n').count(), 1, "{line:?}");
        let Ok(Incoming::Request { id, method, .. }) = parse(line.trim_end()) else {
            panic!("{line}")
        };
        assert_eq!(method, "session/request_permission");
        peer.answered(id.as_u64().unwrap(), Ok(json!({"ok": true})));
        assert_eq!(asked.await.unwrap(), Ok(json!({"ok": true})));
    }
}
