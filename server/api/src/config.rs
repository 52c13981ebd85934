//! Typed configuration for the API tier. The binary fills it from flags, environment and
//! an optional file; secrets are redacted in `Debug`.

use std::{net::SocketAddr, path::PathBuf};

/// A secret string whose `Debug` never shows the value.
#[derive(Clone, Default)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { "\"<redacted>\"" })
    }
}

/// The default OpenAI-compatible provider.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// `BERTH_MODEL_BASE_URL`: an OpenAI-compatible `…/v1`.
    pub base_url: Option<String>,
    /// `BERTH_MODEL_API_KEY`: stays on the API tier.
    pub api_key: Option<Secret>,
    /// `BERTH_MODEL`: the tenant-level default model.
    pub model: Option<String>,
    /// `BERTH_MODEL_CONTEXT_TOKENS`: the model's context window; the proxy's request-body
    /// limit follows from it, so a conversation the model accepts is never refused.
    pub context_tokens: u64,
    /// `BERTH_MODEL_MAX_OUTPUT_TOKENS`: cap on a request's `max_tokens` (None: no cap).
    pub max_output_tokens: Option<u64>,
    /// `BERTH_MODEL_MAX_CONCURRENT`: concurrent proxy calls per tenant (per replica).
    pub max_concurrent: usize,
    /// `BERTH_MODEL_RATE_PER_MIN`: proxy calls per tenant per minute (per replica).
    pub requests_per_min: u32,
}

impl Default for ModelConfig {
    fn default() -> ModelConfig {
        ModelConfig {
            base_url: None,
            api_key: None,
            model: None,
            context_tokens: 200_000,
            max_output_tokens: None,
            max_concurrent: 64,
            requests_per_min: 600,
        }
    }
}

impl ModelConfig {
    /// The proxy's request-body limit: room for a full context window of JSON-escaped text
    /// (16 bytes a token: a token is a few bytes of text, more once JSON-escaped) plus 1 MiB.
    pub fn body_limit(&self) -> usize {
        let bytes = self.context_tokens.saturating_mul(16).saturating_add(1 << 20);
        usize::try_from(bytes).unwrap_or(usize::MAX)
    }
}

/// Everything `serve` needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// `BERTH_LISTEN` (default `127.0.0.1:8790`).
    pub listen: SocketAddr,
    /// `BERTH_METRICS_LISTEN` (default `127.0.0.1:9464`).
    pub metrics_listen: SocketAddr,
    /// `BERTH_DATA_DIR`: run files (the bootstrap token) and, by default, blobs and the private cluster.
    pub data_dir: PathBuf,
    /// `BERTH_ALLOWED_ORIGINS`: browser origins allowed to open the WebSocket.
    pub allowed_origins: Vec<String>,
    /// Largest text message accepted on a WebSocket.
    pub max_text_message: usize,
    /// The default model provider.
    pub model: ModelConfig,
    /// This replica's id (random per process unless set).
    pub replica_id: String,
    /// `BERTH_RECEIPT_RETENTION_SECS`: how long operation receipts are kept (default 7 days).
    pub receipt_retention: std::time::Duration,
    /// Signing key for login tokens (`BERTH_JWT_SECRET_FILE`); None disables password login.
    pub jwt: Option<std::sync::Arc<crate::auth::JwtKeys>>,
    /// `BERTH_JWT_TTL_SECS`: lifetime of a login token (default 15 minutes).
    pub jwt_ttl: std::time::Duration,
    /// Per-connection and per-credential limits.
    pub limits: Limits,
    /// `BERTH_TRUSTED_PROXIES`: networks (CIDRs) of reverse proxies whose
    /// `X-Forwarded-For` names the client address; from anyone else it is ignored.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// `BERTH_DB_PROBE_SECS`: how often the LISTEN connection is asked a trivial query, so
    /// that a half-open one (notifications silently lost) is noticed and replaced.
    pub listen_probe_interval: std::time::Duration,
    /// `BERTH_DB_PROBE_TIMEOUT_SECS`: how long that probe may take.
    pub listen_probe_timeout: std::time::Duration,
}

/// Limits that keep one client from taking the server down. Exceeding one answers a typed
/// error (or closes the WebSocket with 1009 for an oversized message).
#[derive(Debug, Clone)]
pub struct Limits {
    /// `BERTH_MAX_IN_FLIGHT`: concurrent requests per connection (subscriptions excluded).
    pub max_in_flight: usize,
    /// `BERTH_MAX_SUBSCRIPTIONS`: open subscriptions per connection.
    pub max_subscriptions: usize,
    /// `BERTH_RATE_PER_SEC` / `BERTH_RATE_BURST`: requests per credential on each replica.
    pub requests_per_sec: u32,
    pub request_burst: u32,
    /// `BERTH_MAX_CONNECTIONS_PER_CREDENTIAL`: open WebSockets per credential on each replica.
    pub max_connections_per_credential: usize,
    /// `BERTH_MAX_JSON_DEPTH`: nesting depth of a request.
    pub max_json_depth: usize,
    /// `BERTH_WS_PING_SECS`: how often the server pings an idle WebSocket.
    pub ping_interval: std::time::Duration,
    /// `BERTH_WS_IDLE_SECS`: a WebSocket that sends nothing (not even a pong) for this long is closed.
    pub idle_timeout: std::time::Duration,
    /// `BERTH_WS_OUTBOUND_BYTES`: bytes queued for one client WebSocket before its
    /// responses and subscriptions wait (a larger single message waits for an empty queue).
    pub outbound_bytes: usize,
    /// `BERTH_WS_WRITE_TIMEOUT_SECS`: a write the client does not take within this long
    /// closes the connection.
    pub write_timeout: std::time::Duration,
    /// `BERTH_HELLO_TIMEOUT_SECS`: a connection not authenticated within this long is closed.
    pub hello_timeout: std::time::Duration,
    /// `BERTH_MAX_UNAUTHENTICATED_PER_ADDRESS`: connections per source address (IPv6: per
    /// /64) that have not authenticated yet, on each replica.
    pub max_unauthenticated_per_address: usize,
    /// `BERTH_MAX_PASSWORD_CHECKS`: concurrent password verifications (argon2id, 19 MiB
    /// each) on each replica; logins beyond it answer 503 with `Retry-After`.
    pub max_password_checks: usize,
    /// `BERTH_WORKER_MAX_TURNS`: turns handed to one worker connection at once; more wait
    /// (running, not yet handed out) until one ends.
    pub worker_max_turns: usize,
    /// `BERTH_WORKER_MAX_WRITES`: database writes in flight for one worker connection's
    /// turns; beyond it the connection stops reading (backpressure to the worker).
    pub worker_max_writes: usize,
    /// `BERTH_TURN_WRITES_PER_REPLICA`: the same bound across all worker connections of a replica.
    pub replica_max_turn_writes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_in_flight: 64,
            max_subscriptions: 64,
            requests_per_sec: 50,
            request_burst: 200,
            max_connections_per_credential: 32,
            max_json_depth: 64,
            ping_interval: std::time::Duration::from_secs(20),
            idle_timeout: std::time::Duration::from_secs(60),
            outbound_bytes: 2 << 20,
            write_timeout: std::time::Duration::from_secs(30),
            hello_timeout: std::time::Duration::from_secs(10),
            max_unauthenticated_per_address: 128,
            max_password_checks: 4,
            worker_max_turns: 256,
            worker_max_writes: 16,
            replica_max_turn_writes: 64,
        }
    }
}

impl Config {
    /// Defaults for a data directory (used by tests and `berth dev`).
    pub fn for_data_dir(data_dir: PathBuf) -> Config {
        Config {
            listen: "127.0.0.1:8790".parse().expect("static address"),
            metrics_listen: "127.0.0.1:9464".parse().expect("static address"),
            data_dir,
            allowed_origins: Vec::new(),
            max_text_message: 8 << 20,
            model: ModelConfig::default(),
            replica_id: berth_store::token::new_id("rep"),
            receipt_retention: std::time::Duration::from_secs(7 * 24 * 3600),
            jwt: None,
            jwt_ttl: std::time::Duration::from_secs(15 * 60),
            limits: Limits::default(),
            trusted_proxies: Vec::new(),
            listen_probe_interval: std::time::Duration::from_secs(15),
            listen_probe_timeout: std::time::Duration::from_secs(10),
        }
    }
}
