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
#[derive(Debug, Clone, Default)]
pub struct ModelConfig {
    /// `BERTH_MODEL_BASE_URL`: an OpenAI-compatible `…/v1`.
    pub base_url: Option<String>,
    /// `BERTH_MODEL_API_KEY`: stays on the API tier.
    pub api_key: Option<Secret>,
    /// `BERTH_MODEL`: the tenant-level default model.
    pub model: Option<String>,
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
    /// `BERTH_INTERNAL_URL`: where other replicas reach this one to forward worker calls
    /// (default: `http://<listen address>` unless that is a wildcard address).
    pub internal_url: Option<String>,
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
            internal_url: None,
        }
    }
}
