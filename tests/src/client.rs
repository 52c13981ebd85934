//! A WebSocket JSON-RPC client for tests, using only the wire contract.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context;
use berth_protocol::{
    RpcError,
    jsonrpc::{Request, Response},
};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest, http::HeaderValue};

type Pending = Arc<Mutex<HashMap<u32, oneshot::Sender<Response>>>>;
type Subs = Arc<Mutex<HashMap<u32, mpsc::UnboundedSender<Value>>>>;

pub struct Client {
    out: mpsc::UnboundedSender<Message>,
    pending: Pending,
    subs: Subs,
    next_id: u32,
    /// Responses with a null id (parse errors and invalid requests).
    pub orphans: mpsc::UnboundedReceiver<Response>,
    /// Set when the server closes the connection (with its close code, if any).
    pub closed: Arc<Mutex<Option<Option<u16>>>>,
    /// While true, the client does not read from the socket (a slow or stalled peer).
    paused: tokio::sync::watch::Sender<bool>,
}

/// An open subscription: its request id, its items, and its final response.
pub struct Subscription {
    pub id: u32,
    pub items: mpsc::UnboundedReceiver<Value>,
    pub done: oneshot::Receiver<Response>,
}

impl Subscription {
    /// The next item, or None after `secs` seconds.
    pub async fn next(&mut self, secs: u64) -> Option<Value> {
        tokio::time::timeout(Duration::from_secs(secs), self.items.recv())
            .await
            .ok()
            .flatten()
    }

    /// Items until one matches `pred` (inclusive), or None after `secs` seconds.
    pub async fn until(&mut self, secs: u64, pred: impl Fn(&Value) -> bool) -> Option<Vec<Value>> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        let mut seen = Vec::new();
        loop {
            let item = tokio::time::timeout_at(deadline, self.items.recv())
                .await
                .ok()
                .flatten()?;
            let stop = pred(&item);
            seen.push(item);
            if stop {
                return Some(seen);
            }
        }
    }
}

impl Client {
    /// Connect without authenticating (use `hello`).
    pub async fn connect(url: &str) -> anyhow::Result<Client> {
        Self::connect_with(url, None, None).await
    }

    /// Connect with an `Authorization: Bearer` header and/or an `Origin` header.
    pub async fn connect_with(url: &str, bearer: Option<&str>, origin: Option<&str>) -> anyhow::Result<Client> {
        let mut req = url.into_client_request()?;
        if let Some(t) = bearer {
            req.headers_mut()
                .insert("authorization", HeaderValue::from_str(&format!("Bearer {t}"))?);
        }
        if let Some(o) = origin {
            req.headers_mut().insert("origin", HeaderValue::from_str(o)?);
        }
        // Nagle off, like a real client: small frames go out at once.
        let (ws, _) = tokio_tungstenite::connect_async_with_config(req, None, true)
            .await
            .context("websocket connect")?;
        Ok(Self::over(ws))
    }

    /// Connect with a small socket receive buffer, so that a client that stops reading
    /// makes the server's side back up after little data (slow-reader tests).
    pub async fn connect_small_buffer(url: &str) -> anyhow::Result<Client> {
        let req = url.into_client_request()?;
        let host = req.uri().host().context("host")?;
        let port = req.uri().port_u16().context("port")?;
        let addr = tokio::net::lookup_host((host, port)).await?.next().context("address")?;
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_recv_buffer_size(4096)?;
        // Small segments keep the server's send buffer small too: Linux sizes it from the
        // segment size, and loopback's 64 KiB segments would let it absorb megabytes.
        socket2::SockRef::from(&socket).set_tcp_mss(536)?;
        let tcp = socket.connect(addr).await?;
        let (ws, _) = tokio_tungstenite::client_async(req, tokio_tungstenite::MaybeTlsStream::Plain(tcp))
            .await
            .context("websocket connect")?;
        Ok(Self::over(ws))
    }

    fn over(
        ws: tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    ) -> Client {
        let (mut sink, mut stream) = ws.split();
        let (out, mut out_rx) = mpsc::unbounded_channel::<Message>();
        tokio::spawn(async move {
            while let Some(m) = out_rx.recv().await {
                if sink.send(m).await.is_err() {
                    return;
                }
            }
            // The client was dropped: close the socket properly, so that the server lets go
            // of the connection now (not at its idle timeout) and the reader task ends.
            let _ = sink.close().await;
        });
        let pending: Pending = Arc::default();
        let subs: Subs = Arc::default();
        let closed = Arc::new(Mutex::new(None));
        let (orphan_tx, orphans) = mpsc::unbounded_channel();
        let (p, s, c) = (pending.clone(), subs.clone(), closed.clone());
        let (paused, mut paused_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let mut code = None;
            loop {
                if paused_rx.wait_for(|p| !*p).await.is_err() {
                    break;
                }
                let Some(msg) = stream.next().await else { break };
                match msg {
                    Ok(Message::Text(t)) => {
                        let Ok(v) = serde_json::from_str::<Value>(&t) else {
                            continue;
                        };
                        if v.get("method").and_then(Value::as_str) == Some("subscription.item") {
                            let id = v["params"]["id"].as_u64().unwrap_or(u64::MAX) as u32;
                            if let Some(tx) = s.lock().unwrap().get(&id) {
                                let _ = tx.send(v["params"]["item"].clone());
                            }
                        } else if let Ok(resp) = serde_json::from_value::<Response>(v) {
                            match resp.id.and_then(|id| p.lock().unwrap().remove(&id)) {
                                Some(tx) => {
                                    let _ = tx.send(resp);
                                }
                                None => {
                                    let _ = orphan_tx.send(resp);
                                }
                            }
                        }
                    }
                    Ok(Message::Close(frame)) => {
                        code = frame.map(|f| u16::from(f.code));
                        break;
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            *c.lock().unwrap() = Some(code);
            s.lock().unwrap().clear();
            p.lock().unwrap().clear();
        });
        Client {
            out,
            pending,
            subs,
            next_id: 1,
            orphans,
            closed,
            paused,
        }
    }

    /// Connect and `hello` with `token`.
    pub async fn authed(url: &str, token: &str) -> anyhow::Result<Client> {
        let mut c = Self::connect(url).await?;
        c.hello(token).await.map_err(|e| anyhow::anyhow!("hello: {e}"))?;
        Ok(c)
    }

    pub async fn hello(&mut self, token: &str) -> Result<Value, RpcError> {
        self.call(
            "hello",
            json!({"protocol": 1, "token": token, "client": {"name": "e2e", "version": "0"}}),
        )
        .await
    }

    /// Send raw text (for malformed-input tests).
    pub fn send_raw(&self, text: &str) {
        let _ = self.out.send(Message::Text(text.to_string().into()));
    }

    /// Close the connection (a WebSocket Close frame), as a client going away does.
    pub fn close(&self) {
        let _ = self.out.send(Message::Close(None));
    }

    pub fn send_binary(&self, bytes: Vec<u8>) {
        let _ = self.out.send(Message::Binary(bytes.into()));
    }

    /// `content.upload`: the request, then one binary message `[id: u32 BE][payload]`
    /// (`binary_id` overrides the id the binary message names).
    pub async fn upload(&mut self, params: Value, payload: &[u8], binary_id: Option<u32>) -> Result<Value, RpcError> {
        let (id, rx) = self.start("content.upload", params);
        let mut frame = binary_id.unwrap_or(id).to_be_bytes().to_vec();
        frame.extend_from_slice(payload);
        self.send_binary(frame);
        let resp = tokio::time::timeout(Duration::from_secs(60), rx)
            .await
            .unwrap_or_else(|_| panic!("no response to content.upload within 60 s"))
            .unwrap_or_else(|_| panic!("connection closed before the response to content.upload"));
        match (resp.result, resp.error) {
            (_, Some(e)) => Err(e),
            (r, None) => Ok(r.unwrap_or(Value::Null)),
        }
    }

    fn start(&mut self, method: &str, params: Value) -> (u32, oneshot::Receiver<Response>) {
        let id = self.next_id;
        self.next_id += 1;
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, tx);
        let req = Request::new(id, method, params);
        let _ = self
            .out
            .send(Message::Text(serde_json::to_string(&req).unwrap().into()));
        (id, rx)
    }

    /// Call a method and wait (at most 30 s) for its response.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value, RpcError> {
        let (_, rx) = self.start(method, params);
        let resp = tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .unwrap_or_else(|_| panic!("no response to {method} within 30 s"))
            .unwrap_or_else(|_| panic!("connection closed before the response to {method}"));
        match (resp.result, resp.error) {
            (_, Some(e)) => Err(e),
            (r, None) => Ok(r.unwrap_or(Value::Null)),
        }
    }

    /// Call a method; None if the connection closes before the response (at most 30 s).
    pub async fn call_or_closed(&mut self, method: &str, params: Value) -> Option<Result<Value, RpcError>> {
        let (_, rx) = self.start(method, params);
        let resp = tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .unwrap_or_else(|_| panic!("no response to {method} within 30 s"))
            .ok()?;
        Some(match (resp.result, resp.error) {
            (_, Some(e)) => Err(e),
            (r, None) => Ok(r.unwrap_or(Value::Null)),
        })
    }

    /// Call and expect success.
    pub async fn ok(&mut self, method: &str, params: Value) -> Value {
        self.call(method, params)
            .await
            .unwrap_or_else(|e| panic!("{method} failed: {e}"))
    }

    /// The bodies of a session's history rows (one page).
    pub async fn history_bodies(&mut self, session_id: &str) -> Vec<String> {
        let history = self.ok("session.history", json!({"sessionId": session_id})).await;
        history["rows"]
            .as_array()
            .expect("rows")
            .iter()
            .map(|r| r["body"].as_str().expect("body").to_string())
            .collect()
    }

    /// Every history row of a session, following `nextAfter` page by page.
    pub async fn history(&mut self, session_id: &str) -> Vec<Value> {
        let mut rows = Vec::new();
        let mut after = Value::Null;
        loop {
            let page = self
                .ok("session.history", json!({"sessionId": session_id, "after": after}))
                .await;
            rows.extend(page["rows"].as_array().expect("rows").iter().cloned());
            if page["nextAfter"].is_null() {
                return rows;
            }
            after = page["nextAfter"].clone();
        }
    }

    /// Open a subscription.
    pub fn subscribe(&mut self, method: &str, params: Value) -> Subscription {
        let id = self.next_id;
        let (tx, items) = mpsc::unbounded_channel();
        self.subs.lock().unwrap().insert(id, tx);
        let (id2, done) = self.start(method, params);
        debug_assert_eq!(id, id2);
        Subscription { id, items, done }
    }

    /// Stop (true) or resume (false) reading from the socket.
    pub fn pause_reading(&self, paused: bool) {
        self.paused.send_replace(paused);
    }

    pub fn is_closed(&self) -> bool {
        self.closed.lock().unwrap().is_some()
    }
}

/// The `data.code` of an error.
pub fn code(e: &RpcError) -> &str {
    e.data_code().unwrap_or("")
}
