//! A Rust client for Berth's WebSocket JSON-RPC, built on the wire-contract crate only.
//!
//! - **Connect** with a credential or a login JWT ([`login`]); the credential travels in the
//!   upgrade's `Authorization` header, so a wrong one fails before the upgrade.
//! - **Typed calls** for every method in `methods!`: `client.call::<method::SessionSend>(…)`.
//! - **Watches as streams** ([`Client::watch`]): items of `session.watch` as [`WatchItem`]s.
//! - **Reconnect and resume.** A dropped connection is re-established on the next use (with
//!   backoff). A call whose answer was lost is sent again: reads are safe to repeat, and
//!   every mutation carries an `operationId` (one is chosen when the caller gave none) that
//!   its retries reuse, so the server answers a retry with the original outcome instead of
//!   doing the work twice. A watch resubscribes from the last sequence it delivered, so its
//!   consumer sees every event exactly once.
//! - **Uploads** ([`Client::upload`]): `content.upload` and its binary message in one call.

mod connection;
mod watch;

use std::{
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use berth_protocol::{Method, RpcError};
use serde_json::Value;

pub use berth_protocol as protocol;
pub use berth_protocol::method;
pub use watch::Watch;

use connection::Conn;

/// Methods whose params take an `operationId` (SPEC §4.9). A call of one of these without
/// an id gets a fresh one, which every retry of that call reuses. (A test checks this list
/// against the schema.)
pub const TAKES_OPERATION_ID: &[&str] = &[
    "session.create",
    "session.send",
    "session.rename",
    "session.setModel",
    "session.setAgent",
    "session.compact",
    "session.remove",
    "session.clear",
    "session.pause",
    "session.stop",
    "session.respond",
    "workspace.rename",
    "workspace.remove",
    "queue.update",
    "queue.move",
    "queue.remove",
    "admin.credential.create",
    "admin.credential.revoke",
    "admin.user.create",
    "admin.user.disable",
    "admin.user.setRole",
    "agent.save",
    "agent.remove",
    "skill.save",
    "skill.remove",
    "mcp.save",
    "mcp.remove",
];

/// What went wrong with a call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with a typed error.
    #[error("{}", .0.data_code().unwrap_or(&.0.message))]
    Rpc(RpcError),
    /// The credential was refused (HTTP 401 at the upgrade, or a failed login).
    #[error("unauthorized")]
    Unauthorized,
    /// The server could not be reached (after the configured reconnect attempts).
    #[error("cannot reach the server: {0}")]
    Connect(String),
    /// The connection dropped and the call could not be completed within the retries.
    #[error("connection lost")]
    Disconnected,
    /// The server sent something this client cannot read.
    #[error("unexpected answer: {0}")]
    Protocol(String),
    /// Bad client-side input (a server address that is not a URL, …).
    #[error("{0}")]
    Usage(String),
}

impl Error {
    /// The typed error code (`data.code`), for a server error.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Rpc(e) => e.data_code(),
            Error::Unauthorized => Some("unauthorized"),
            _ => None,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// The server's two addresses, derived from what a user types (`http(s)://host[:port]`,
/// `ws(s)://…`, or `host:port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    /// `ws(s)://…/v1/rpc`
    pub rpc: String,
    /// `http(s)://…` (no trailing slash)
    pub http: String,
}

impl Endpoints {
    pub fn parse(server: &str) -> Result<Endpoints> {
        let server = server.trim().trim_end_matches('/');
        let server = server.strip_suffix("/v1/rpc").unwrap_or(server);
        let (secure, rest) = if let Some(r) = server.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = server.strip_prefix("wss://") {
            (true, r)
        } else if let Some(r) = server.strip_prefix("http://") {
            (false, r)
        } else if let Some(r) = server.strip_prefix("ws://") {
            (false, r)
        } else if server.contains("://") {
            return Err(Error::Usage(format!("unsupported server address {server:?}")));
        } else {
            (false, server)
        };
        if rest.is_empty() {
            return Err(Error::Usage("empty server address".into()));
        }
        let (ws, http) = if secure { ("wss", "https") } else { ("ws", "http") };
        Ok(Endpoints {
            rpc: format!("{ws}://{rest}/v1/rpc"),
            http: format!("{http}://{rest}"),
        })
    }
}

/// How hard to try before giving up.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Connection attempts per (re)connect.
    pub connect_attempts: u32,
    /// Times one call is sent again after its connection dropped (or the server said
    /// `operation-in-progress`).
    pub call_retries: u32,
    /// First backoff; it doubles up to `max_backoff`.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            connect_attempts: 8,
            call_retries: 8,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(3),
        }
    }
}

impl RetryPolicy {
    fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32 << attempt.min(16);
        self.initial_backoff.saturating_mul(factor).min(self.max_backoff)
    }
}

/// A connection to Berth that reconnects as needed. Cheap to clone (clones share the
/// connection).
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    endpoints: Endpoints,
    token: String,
    retry: RetryPolicy,
    conn: tokio::sync::Mutex<Option<Arc<Conn>>>,
    next_id: AtomicU32,
}

/// The answer of `POST /v1/auth/login`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoginToken {
    /// A short-lived JWT the WebSocket accepts like a credential.
    pub token: String,
    #[serde(default)]
    pub expires_at: Option<String>,
    pub user_id: String,
    pub tenant_id: String,
}

impl std::fmt::Display for LoginToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "login of {} (token redacted)", self.user_id)
    }
}

/// Exchange a person's password for a short-lived token (`POST /v1/auth/login`).
pub async fn login(server: &str, tenant: &str, email: &str, password: &str) -> Result<LoginToken> {
    let endpoints = Endpoints::parse(server)?;
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| Error::Connect(e.to_string()))?;
    let resp = http
        .post(format!("{}/v1/auth/login", endpoints.http))
        .json(&serde_json::json!({"tenant": tenant, "email": email, "password": password}))
        .send()
        .await
        .map_err(|e| Error::Connect(e.to_string()))?;
    let status = resp.status();
    let body: Value = resp.json().await.map_err(|e| Error::Protocol(e.to_string()))?;
    if status == reqwest::StatusCode::UNAUTHORIZED {
        return Err(Error::Unauthorized);
    }
    if !status.is_success() {
        let code = body["error"]["code"].as_str().unwrap_or("internal");
        let code = serde_json::from_value(Value::String(code.into())).unwrap_or(berth_protocol::ErrorCode::Internal);
        return Err(Error::Rpc(RpcError::new(code)));
    }
    serde_json::from_value(body).map_err(|e| Error::Protocol(e.to_string()))
}

impl Client {
    /// Connect to `server` with a credential (or a login token).
    pub async fn connect(server: &str, token: &str) -> Result<Client> {
        Self::connect_with(server, token, RetryPolicy::default()).await
    }

    /// The same, with a retry policy.
    pub async fn connect_with(server: &str, token: &str, retry: RetryPolicy) -> Result<Client> {
        let client = Client {
            inner: Arc::new(Inner {
                endpoints: Endpoints::parse(server)?,
                token: token.to_string(),
                retry,
                conn: tokio::sync::Mutex::new(None),
                next_id: AtomicU32::new(1),
            }),
        };
        client.connection().await?;
        Ok(client)
    }

    /// Where this client connects.
    pub fn endpoints(&self) -> &Endpoints {
        &self.inner.endpoints
    }

    fn next_id(&self) -> u32 {
        // Ids are unique per client (across reconnects), which keeps logs unambiguous.
        self.inner.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The live connection, (re)connecting with backoff when there is none.
    async fn connection(&self) -> Result<Arc<Conn>> {
        let mut slot = self.inner.conn.lock().await;
        if let Some(c) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        let retry = &self.inner.retry;
        let mut last = String::new();
        for attempt in 0..retry.connect_attempts.max(1) {
            if attempt > 0 {
                tokio::time::sleep(retry.backoff(attempt - 1)).await;
            }
            match Conn::open(&self.inner.endpoints.rpc, &self.inner.token).await {
                Ok(c) => {
                    let c = Arc::new(c);
                    *slot = Some(c.clone());
                    return Ok(c);
                }
                Err(Error::Unauthorized) => return Err(Error::Unauthorized),
                Err(e) => {
                    tracing::debug!(attempt, error = %e, "connect failed");
                    last = e.to_string();
                }
            }
        }
        Err(Error::Connect(last))
    }

    /// Drop the current connection (the next use reconnects). Subscriptions resume.
    pub async fn disconnect(&self) {
        if let Some(c) = self.inner.conn.lock().await.take() {
            c.close();
        }
    }

    /// Call a method with typed params and result.
    pub async fn call<M: Method>(&self, params: M::Params) -> Result<M::Result> {
        let params = serde_json::to_value(params).map_err(|e| Error::Usage(e.to_string()))?;
        let result = self.call_value(M::NAME, params).await?;
        serde_json::from_value(result).map_err(|e| Error::Protocol(format!("{}: {e}", M::NAME)))
    }

    /// Call a method by name with JSON params. Mutations get an `operationId` if they have
    /// none; a call whose connection dropped before its answer is sent again (same id).
    pub async fn call_value(&self, method: &str, mut params: Value) -> Result<Value> {
        if TAKES_OPERATION_ID.contains(&method) {
            ensure_operation_id(&mut params);
        }
        let retry = &self.inner.retry;
        let mut attempt = 0;
        loop {
            let outcome = match self.connection().await {
                Ok(conn) => conn.request(self.next_id(), method, params.clone()).await,
                Err(Error::Connect(_)) if attempt < retry.call_retries => Err(Error::Disconnected),
                Err(e) => return Err(e),
            };
            match outcome {
                Ok(value) => return Ok(value),
                // The first attempt's outcome is not stored yet: ask again shortly.
                Err(Error::Rpc(e))
                    if e.data_code() == Some("operation-in-progress") && attempt < retry.call_retries => {}
                Err(Error::Disconnected) if attempt < retry.call_retries => {
                    tracing::debug!(method, attempt, "connection lost; sending again");
                }
                Err(e) => return Err(e),
            }
            tokio::time::sleep(retry.backoff(attempt)).await;
            attempt += 1;
        }
    }

    /// Upload an attachment (`content.upload` with its binary message). The declared size
    /// is filled in when absent, so a message cut short is refused rather than stored. An
    /// upload whose answer was lost is sent again: the first, if it was stored, is an
    /// attachment nothing names (released with its session).
    pub async fn upload(
        &self,
        mut params: berth_protocol::ContentUploadParams,
        data: &[u8],
    ) -> Result<berth_protocol::ContentUploadResult> {
        params.bytes.get_or_insert(data.len() as u64);
        let params = serde_json::to_value(params).map_err(|e| Error::Usage(e.to_string()))?;
        let retry = &self.inner.retry;
        let mut attempt = 0;
        loop {
            let outcome = match self.connection().await {
                Ok(conn) => conn.upload(self.next_id(), params.clone(), data).await,
                Err(Error::Connect(_)) if attempt < retry.call_retries => Err(Error::Disconnected),
                Err(e) => return Err(e),
            };
            match outcome {
                Ok(value) => {
                    return serde_json::from_value(value).map_err(|e| Error::Protocol(format!("content.upload: {e}")));
                }
                Err(Error::Disconnected) if attempt < retry.call_retries => {
                    tracing::debug!(attempt, "connection lost during an upload; sending again");
                }
                Err(e) => return Err(e),
            }
            tokio::time::sleep(retry.backoff(attempt)).await;
            attempt += 1;
        }
    }

    /// Watch a session from after `after` (0: from the start). The stream yields every
    /// event once, in order, across reconnects, plus live items; it ends when the
    /// subscription ends (an error item first if it ended with one).
    pub fn watch(&self, session_id: &str, after: i64) -> Watch {
        watch::start(self.clone(), session_id.to_string(), after)
    }
}

/// A fresh operation id: 128 random bits.
pub fn new_operation_id() -> String {
    format!("op_{:032x}", rand::random::<u128>())
}

fn ensure_operation_id(params: &mut Value) {
    if let Value::Object(map) = params
        && map.get("operationId").is_none_or(Value::is_null)
    {
        map.insert("operationId".into(), Value::String(new_operation_id()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_addresses_map_to_both_endpoints() {
        let e = Endpoints::parse("https://berth.example.com/").unwrap();
        assert_eq!(e.rpc, "wss://berth.example.com/v1/rpc");
        assert_eq!(e.http, "https://berth.example.com");
        let e = Endpoints::parse("ws://127.0.0.1:8790/v1/rpc").unwrap();
        assert_eq!(e.rpc, "ws://127.0.0.1:8790/v1/rpc");
        assert_eq!(e.http, "http://127.0.0.1:8790");
        assert_eq!(Endpoints::parse("localhost:1").unwrap().http, "http://localhost:1");
        assert!(Endpoints::parse("ftp://x").is_err());
        assert!(Endpoints::parse("").is_err());
    }

    #[test]
    fn an_upload_frame_is_the_request_id_big_endian_then_the_bytes() {
        assert_eq!(connection::frame(0x0102_0304, b"ab"), vec![1, 2, 3, 4, b'a', b'b']);
        assert_eq!(connection::frame(7, b""), vec![0, 0, 0, 7]);
    }

    #[test]
    fn a_mutation_keeps_the_callers_operation_id_or_gets_one() {
        let mut given = serde_json::json!({"sessionId": "ses_1", "operationId": "op_mine"});
        ensure_operation_id(&mut given);
        assert_eq!(given["operationId"], "op_mine");
        let mut none = serde_json::json!({"sessionId": "ses_1", "operationId": null});
        ensure_operation_id(&mut none);
        assert!(none["operationId"].as_str().unwrap().starts_with("op_"));
        assert_ne!(new_operation_id(), new_operation_id());
    }
}
