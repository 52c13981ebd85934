//! One WebSocket: a writer task, a reader task that routes answers to their callers and
//! subscription items to their subscriptions, and the tables of both.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
};

use berth_protocol::jsonrpc::{Request, Response, SUBSCRIPTION_ITEM};
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::{self, Message, client::IntoClientRequest, http::HeaderValue};

use crate::{Error, Result};

#[derive(Default)]
struct Tables {
    pending: HashMap<u32, oneshot::Sender<Response>>,
    subs: HashMap<u32, mpsc::UnboundedSender<Value>>,
}

pub(crate) struct Conn {
    out: mpsc::UnboundedSender<Message>,
    tables: Arc<Mutex<Tables>>,
    closed: Arc<AtomicBool>,
}

/// An open subscription on one connection. Its items end (`None`) when the subscription
/// ended or the connection dropped; `done` then tells which.
pub(crate) struct Subscription {
    pub items: mpsc::UnboundedReceiver<Value>,
    pub done: oneshot::Receiver<Response>,
}

fn lock(m: &Mutex<Tables>) -> MutexGuard<'_, Tables> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Conn {
    pub async fn open(url: &str, token: &str) -> Result<Conn> {
        let mut req = url.into_client_request().map_err(|e| Error::Usage(e.to_string()))?;
        let bearer = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| Error::Usage("the credential has characters a header cannot carry".into()))?;
        req.headers_mut().insert("authorization", bearer);
        let ws = match tokio_tungstenite::connect_async(req).await {
            Ok((ws, _)) => ws,
            Err(tungstenite::Error::Http(resp)) if resp.status().as_u16() == 401 => return Err(Error::Unauthorized),
            Err(e) => return Err(Error::Connect(e.to_string())),
        };
        let (mut sink, mut stream) = ws.split();
        let (out, mut out_rx) = mpsc::unbounded_channel::<Message>();
        let closed = Arc::new(AtomicBool::new(false));
        let tables: Arc<Mutex<Tables>> = Arc::default();
        let writer_closed = closed.clone();
        tokio::spawn(async move {
            while let Some(m) = out_rx.recv().await {
                let last = matches!(m, Message::Close(_));
                if sink.send(m).await.is_err() || last {
                    break;
                }
            }
            writer_closed.store(true, Ordering::SeqCst);
            let _ = sink.close().await;
        });
        let (t, c, pong) = (tables.clone(), closed.clone(), out.clone());
        tokio::spawn(async move {
            while let Some(Ok(msg)) = stream.next().await {
                match msg {
                    Message::Text(text) => route(&t, &text),
                    Message::Ping(p) => {
                        let _ = pong.send(Message::Pong(p));
                    }
                    Message::Close(_) => break,
                    _ => {}
                }
            }
            // Dropping every sender tells callers and subscriptions that the connection
            // is gone (their receivers end).
            c.store(true, Ordering::SeqCst);
            let mut tables = lock(&t);
            tables.pending.clear();
            tables.subs.clear();
        });
        Ok(Conn { out, tables, closed })
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst) || self.out.is_closed()
    }

    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let _ = self.out.send(Message::Close(None));
    }

    fn send(
        &self,
        id: u32,
        method: &str,
        params: Value,
        sub: Option<mpsc::UnboundedSender<Value>>,
    ) -> Result<oneshot::Receiver<Response>> {
        let (tx, rx) = oneshot::channel();
        {
            let mut tables = lock(&self.tables);
            if self.is_closed() {
                return Err(Error::Disconnected);
            }
            tables.pending.insert(id, tx);
            if let Some(sub) = sub {
                tables.subs.insert(id, sub);
            }
        }
        let text = serde_json::to_string(&Request::new(id, method, params)).map_err(|e| Error::Usage(e.to_string()))?;
        self.out.send(Message::text(text)).map_err(|_| Error::Disconnected)?;
        Ok(rx)
    }

    /// Send a request and wait for its answer (`Disconnected` if the connection drops first).
    pub async fn request(&self, id: u32, method: &str, params: Value) -> Result<Value> {
        let rx = self.send(id, method, params, None)?;
        let resp = rx.await.map_err(|_| Error::Disconnected)?;
        answer(resp)
    }

    /// `content.upload`: the request, then right behind it on the same socket its binary
    /// message (`id` big-endian, then `data`), and wait for the answer.
    pub async fn upload(&self, id: u32, params: Value, data: &[u8]) -> Result<Value> {
        let rx = self.send(
            id,
            <berth_protocol::method::ContentUpload as berth_protocol::Method>::NAME,
            params,
            None,
        )?;
        self.out
            .send(Message::Binary(frame(id, data).into()))
            .map_err(|_| Error::Disconnected)?;
        let resp = rx.await.map_err(|_| Error::Disconnected)?;
        answer(resp)
    }

    /// Open a subscription (`id` is its request id).
    pub fn subscribe(&self, id: u32, method: &str, params: Value) -> Result<Subscription> {
        let (tx, items) = mpsc::unbounded_channel();
        let done = self.send(id, method, params, Some(tx))?;
        Ok(Subscription { items, done })
    }

    /// Ask the server to end a subscription early (its answer goes to the subscription).
    pub fn close_subscription(&self, id: u32, close_id: u32) {
        let req = Request::new(close_id, "subscription.close", serde_json::json!({"id": id}));
        if let Ok(text) = serde_json::to_string(&req) {
            let _ = self.out.send(Message::text(text));
        }
    }
}

/// An upload's binary message: the request id (big-endian u32), then the bytes.
pub(crate) fn frame(id: u32, data: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(4 + data.len());
    frame.extend_from_slice(&id.to_be_bytes());
    frame.extend_from_slice(data);
    frame
}

/// A response's result, or its error as [`Error::Rpc`].
pub(crate) fn answer(resp: Response) -> Result<Value> {
    match resp.error {
        Some(e) => Err(Error::Rpc(e)),
        None => Ok(resp.result.unwrap_or(Value::Null)),
    }
}

fn route(tables: &Mutex<Tables>, text: &str) {
    let Ok(v) = serde_json::from_str::<Value>(text) else {
        tracing::debug!("unreadable message from the server");
        return;
    };
    if v.get("method").and_then(Value::as_str) == Some(SUBSCRIPTION_ITEM) {
        let Some(id) = v["params"]["id"].as_u64().and_then(|id| u32::try_from(id).ok()) else {
            return;
        };
        if let Some(tx) = lock(tables).subs.get(&id) {
            let _ = tx.send(v["params"]["item"].clone());
        }
        return;
    }
    let Ok(resp) = serde_json::from_value::<Response>(v) else {
        return;
    };
    let Some(id) = resp.id else { return };
    let mut t = lock(tables);
    // A subscription's answer ends it: its item channel closes before the answer arrives.
    t.subs.remove(&id);
    if let Some(tx) = t.pending.remove(&id) {
        let _ = tx.send(resp);
    }
}
