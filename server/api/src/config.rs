//! Typed configuration for the API tier. The binary fills it from flags, environment and
//! an optional file; secrets are redacted in `Debug`.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, RwLock},
    time::Duration,
};

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
    /// `BERTH_MODEL_LEVEL`: the default model's reasoning level (None: not a reasoning model).
    pub level: Option<ReasoningLevel>,
    /// `BERTH_MODEL_MAX_OUTPUT_TOKENS`: cap on a request's `max_tokens` (None: no cap).
    pub max_output_tokens: Option<u64>,
    /// `BERTH_MODEL_MAX_CONCURRENT`: concurrent proxy calls per tenant (per replica).
    pub max_concurrent: usize,
    /// `BERTH_MODEL_RATE_PER_MIN`: proxy calls per tenant per minute (per replica).
    pub requests_per_min: u32,
    /// Timeouts and retries of provider calls.
    pub resilience: Resilience,
}

impl Default for ModelConfig {
    fn default() -> ModelConfig {
        ModelConfig {
            base_url: None,
            api_key: None,
            model: None,
            context_tokens: 200_000,
            level: None,
            max_output_tokens: None,
            max_concurrent: 64,
            requests_per_min: 600,
            resilience: Resilience::default(),
        }
    }
}

/// How the model proxy copes with a slow or failing provider.
#[derive(Debug, Clone)]
pub struct Resilience {
    /// `BERTH_MODEL_CONNECT_TIMEOUT_SECS`: TCP/TLS connect.
    pub connect_timeout: Duration,
    /// `BERTH_MODEL_FIRST_BYTE_TIMEOUT_SECS`: from sending the request to the response head.
    pub first_byte_timeout: Duration,
    /// `BERTH_MODEL_IDLE_TIMEOUT_SECS`: longest silence inside a streaming response.
    pub idle_timeout: Duration,
    /// `BERTH_MODEL_MAX_RETRIES`: retries of a call answered 429 or 5xx (or not reached).
    pub max_retries: u32,
    /// `BERTH_MODEL_MAX_RETRY_WAIT_SECS`: the longest wait before a retry; a provider asking
    /// for more (`Retry-After`) fails the call at once.
    pub max_retry_wait: Duration,
}

impl Default for Resilience {
    fn default() -> Resilience {
        Resilience {
            connect_timeout: Duration::from_secs(10),
            first_byte_timeout: Duration::from_secs(120),
            idle_timeout: Duration::from_secs(120),
            max_retries: 2,
            max_retry_wait: Duration::from_secs(30),
        }
    }
}

/// A provider's wire format (`BERTH_MODEL_API`, `BERTH_PROVIDER_<NAME>_API`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireApi {
    ChatCompletions,
    Responses,
    AnthropicMessages,
}

impl std::str::FromStr for WireApi {
    type Err = String;
    fn from_str(s: &str) -> Result<WireApi, String> {
        match s {
            "chat-completions" => Ok(WireApi::ChatCompletions),
            "responses" => Ok(WireApi::Responses),
            "anthropic-messages" => Ok(WireApi::AnthropicMessages),
            _ => Err("expected chat-completions, responses or anthropic-messages".into()),
        }
    }
}

/// How hard a reasoning model thinks (`BERTH_MODEL_LEVEL`, a profile model's `:level`):
/// `reasoning_effort` on Chat Completions, `reasoning.effort` on the Responses API, a
/// thinking budget on Anthropic Messages. Unset: the request asks for no reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningLevel {
    Low,
    Medium,
    High,
}

impl ReasoningLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            ReasoningLevel::Low => "low",
            ReasoningLevel::Medium => "medium",
            ReasoningLevel::High => "high",
        }
    }
}

impl std::str::FromStr for ReasoningLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<ReasoningLevel, String> {
        match s {
            "low" => Ok(ReasoningLevel::Low),
            "medium" => Ok(ReasoningLevel::Medium),
            "high" => Ok(ReasoningLevel::High),
            _ => Err("expected low, medium or high".into()),
        }
    }
}

/// One model a profile offers.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileModel {
    pub id: String,
    /// The model's context window, if the profile says.
    pub context_tokens: Option<u64>,
    /// Its reasoning level, if it is a reasoning model.
    pub level: Option<ReasoningLevel>,
}

impl ProfileModel {
    /// One entry of a `MODELS` list: `id[:contextTokens][:level]`. Options are taken from
    /// the right while they parse, so an id may itself hold colons (`llama3:8b`).
    pub fn parse(entry: &str) -> ProfileModel {
        let mut model = ProfileModel {
            id: entry.to_string(),
            context_tokens: None,
            level: None,
        };
        while let Some((rest, last)) = model.id.rsplit_once(':') {
            if model.level.is_none()
                && model.context_tokens.is_none()
                && let Ok(level) = last.parse()
            {
                model.level = Some(level);
            } else if model.context_tokens.is_none()
                && let Ok(n) = last.parse()
            {
                model.context_tokens = Some(n);
            } else if last.is_empty() && model.context_tokens.is_none() {
                // `id::high`: no context size given.
            } else {
                break;
            }
            model.id = rest.to_string();
        }
        model
    }
}

/// A configured model provider. Its key is only ever sent to its own `base_url`.
#[derive(Debug, Clone)]
pub struct ProviderProfile {
    pub name: String,
    pub api: WireApi,
    pub base_url: String,
    pub api_key: Option<Secret>,
    /// The models offered; empty means any model name is passed on.
    pub models: Vec<ProfileModel>,
    /// A session may name its own endpoint (`baseUrl`); calls there never carry the key.
    pub allow_base_url: bool,
    /// Such an endpoint may be on a private network, loopback or link-local
    /// (`…_ALLOW_PRIVATE_BASE_URL`; off: public addresses only, so a session cannot aim the
    /// proxy at the API tier's own listeners, a metadata service or the internal network).
    pub allow_private_base_url: bool,
    /// Which of its models take image input.
    pub image_input: ImageInput,
}

/// Which models of a profile take image input (`BERTH_MODEL_IMAGE_INPUT`,
/// `BERTH_PROVIDER_<NAME>_IMAGE_INPUT`): `true` (every model, the default), `false` (none),
/// or the ids of the models that do, comma-separated (the others do not). A model without
/// image input gets a text note in place of each image.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum ImageInput {
    #[default]
    All,
    None,
    Models(Vec<String>),
}

impl ImageInput {
    fn parse(v: Option<String>) -> ImageInput {
        match v.as_deref().map(str::trim) {
            None | Some("" | "true" | "1" | "yes") => ImageInput::All,
            Some("false" | "0" | "no") => ImageInput::None,
            Some(list) => ImageInput::Models(
                list.split(',')
                    .map(str::trim)
                    .filter(|m| !m.is_empty())
                    .map(String::from)
                    .collect(),
            ),
        }
    }
}

impl ProviderProfile {
    /// Whether `model` may be chosen on this profile.
    pub fn offers(&self, model: &str) -> bool {
        self.models.is_empty() || self.models.iter().any(|m| m.id == model)
    }

    /// Whether `model` of this profile takes image input.
    pub fn takes_images(&self, model: &str) -> bool {
        match &self.image_input {
            ImageInput::All => true,
            ImageInput::None => false,
            ImageInput::Models(ids) => ids.iter().any(|m| m == model),
        }
    }
}

/// The name of the profile built from `BERTH_MODEL_*`.
pub const DEFAULT_PROVIDER: &str = "default";

/// The configured provider profiles. Profiles come from `BERTH_MODEL_*` (named
/// [`DEFAULT_PROVIDER`]) and, for each name in `BERTH_PROVIDERS=a,b`, from
/// `BERTH_PROVIDER_<NAME>_{API,BASE_URL,API_KEY,API_KEY_FILE,MODELS,ALLOW_BASE_URL,IMAGE_INPUT}`
/// (`MODELS` is `id[:contextTokens],…`; `<NAME>` upper-cased, `-` as `_`).
#[derive(Debug, Clone, Default)]
pub struct ProviderSet {
    pub profiles: Vec<ProviderProfile>,
}

impl ProviderSet {
    /// A profile by name (None: the default profile).
    pub fn get(&self, name: Option<&str>) -> Option<&ProviderProfile> {
        let name = name.unwrap_or(DEFAULT_PROVIDER);
        self.profiles.iter().find(|p| p.name == name)
    }

    /// Read the profiles through `get` (a setting by name) and `secret` (a setting given
    /// directly or as `KEY_FILE`).
    pub fn load(
        get: impl Fn(&str) -> Option<String>,
        secret: impl Fn(&str) -> anyhow::Result<Option<String>>,
    ) -> anyhow::Result<ProviderSet> {
        let mut profiles = Vec::new();
        if let Some(base_url) = get("BERTH_MODEL_BASE_URL") {
            profiles.push(ProviderProfile {
                name: DEFAULT_PROVIDER.into(),
                api: parse_api("BERTH_MODEL_API", get("BERTH_MODEL_API"))?,
                base_url,
                api_key: secret("BERTH_MODEL_API_KEY")?.map(Secret),
                models: Vec::new(),
                allow_base_url: parse_bool("BERTH_MODEL_ALLOW_BASE_URL", get("BERTH_MODEL_ALLOW_BASE_URL"))?,
                allow_private_base_url: parse_bool(
                    "BERTH_MODEL_ALLOW_PRIVATE_BASE_URL",
                    get("BERTH_MODEL_ALLOW_PRIVATE_BASE_URL"),
                )?,
                image_input: ImageInput::parse(get("BERTH_MODEL_IMAGE_INPUT")),
            });
        }
        for name in get("BERTH_PROVIDERS").unwrap_or_default().split(',') {
            let name = name.trim();
            if name.is_empty() {
                continue;
            }
            let prefix = format!("BERTH_PROVIDER_{}_", name.to_ascii_uppercase().replace('-', "_"));
            let key = |k: &str| format!("{prefix}{k}");
            let base_url = get(&key("BASE_URL")).ok_or_else(|| anyhow::anyhow!("{} is missing", key("BASE_URL")))?;
            let models = get(&key("MODELS"))
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|m| !m.is_empty())
                .map(ProfileModel::parse)
                .collect::<Vec<_>>();
            if let Some(m) = models.iter().find(|m| m.id.is_empty()) {
                anyhow::bail!("{}: an entry has no model id ({m:?})", key("MODELS"));
            }
            let profile = ProviderProfile {
                name: name.into(),
                api: parse_api(&key("API"), get(&key("API")))?,
                base_url,
                api_key: secret(&key("API_KEY"))?.map(Secret),
                models,
                allow_base_url: parse_bool(&key("ALLOW_BASE_URL"), get(&key("ALLOW_BASE_URL")))?,
                allow_private_base_url: parse_bool(
                    &key("ALLOW_PRIVATE_BASE_URL"),
                    get(&key("ALLOW_PRIVATE_BASE_URL")),
                )?,
                image_input: ImageInput::parse(get(&key("IMAGE_INPUT"))),
            };
            profiles.retain(|p: &ProviderProfile| p.name != profile.name);
            profiles.push(profile);
        }
        Ok(ProviderSet { profiles })
    }
}

fn parse_api(key: &str, v: Option<String>) -> anyhow::Result<WireApi> {
    v.as_deref()
        .unwrap_or("chat-completions")
        .parse()
        .map_err(|e| anyhow::anyhow!("{key}: {e}"))
}

fn parse_bool(key: &str, v: Option<String>) -> anyhow::Result<bool> {
    match v.as_deref() {
        None | Some("false" | "0" | "no") => Ok(false),
        Some("true" | "1" | "yes") => Ok(true),
        Some(other) => anyhow::bail!("{key}={other:?}: expected true or false"),
    }
}

/// The profiles in use, replaced whole on reload (SIGHUP); a call in flight keeps the set
/// it started with.
#[derive(Clone, Default)]
pub struct Providers(Arc<RwLock<Arc<ProviderSet>>>);

impl std::fmt::Debug for Providers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.current().fmt(f)
    }
}

impl Providers {
    pub fn new(set: ProviderSet) -> Providers {
        Providers(Arc::new(RwLock::new(Arc::new(set))))
    }

    pub fn current(&self) -> Arc<ProviderSet> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn replace(&self, set: ProviderSet) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(set);
    }
}

/// Room in a model request for images as base64, which a context window's measure does
/// not cover: the three images of at most 2 MiB a worker keeps shown (`view_image`).
pub const IMAGE_ROOM: u64 = 3 * (2 << 20) * 4 / 3 + (64 << 10);

/// What a call needs to know about its model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSpec {
    pub context_tokens: u64,
    pub level: Option<ReasoningLevel>,
}

impl ModelSpec {
    /// The proxy's request-body limit: room for a full context window of JSON-escaped text
    /// (16 bytes a token: a token is a few bytes of text, more once JSON-escaped) plus 1 MiB.
    /// Images' base64 is not counted against it, up to [`IMAGE_ROOM`] more.
    pub fn body_limit(&self) -> usize {
        let bytes = self.context_tokens.saturating_mul(16).saturating_add(1 << 20);
        usize::try_from(bytes).unwrap_or(usize::MAX)
    }
}

impl ModelConfig {
    /// `model` on `profile`: the profile's own entry for it where it has one (its window
    /// defaulting to `BERTH_MODEL_CONTEXT_TOKENS`), else — for the default model of the
    /// default profile — `BERTH_MODEL_CONTEXT_TOKENS` and `BERTH_MODEL_LEVEL`, else the
    /// default window and no reasoning.
    pub fn spec(&self, profile: &ProviderProfile, model: &str) -> ModelSpec {
        if let Some(m) = profile.models.iter().find(|m| m.id == model) {
            return ModelSpec {
                context_tokens: m.context_tokens.unwrap_or(self.context_tokens),
                level: m.level,
            };
        }
        let default_model = profile.name == DEFAULT_PROVIDER && self.model.as_deref() == Some(model);
        ModelSpec {
            context_tokens: self.context_tokens,
            level: if default_model { self.level } else { None },
        }
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
    /// The provider profiles (the default one included); reloadable.
    pub providers: Providers,
    /// `BERTH_AUTO_TITLES` (default true): name untitled sessions after their first turn.
    pub auto_titles: bool,
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
    /// Where attachment bytes live.
    pub object_store: ObjectStoreConfig,
    /// `BERTH_MAX_ATTACHMENT_BYTES`: the largest attachment (and binary message) accepted.
    pub max_attachment_bytes: usize,
    /// `BERTH_UPLOAD_MEMORY_BYTES`: uploaded bodies a replica holds at once, across every
    /// connection, until they are stored (default 256 MiB; never less than the largest
    /// attachment). Past it an upload is refused `rate-limited {limit: "upload-memory"}`.
    pub upload_memory_bytes: usize,
    /// `BERTH_INTERACTION_TIMEOUT_SECS`: how long an approval or question waits for an answer
    /// before its fallback answers (default 15 minutes).
    pub interaction_timeout: std::time::Duration,
    /// `BERTH_DRAIN_TIMEOUT_SECS`: after SIGTERM, how long the replica keeps relaying the
    /// running turns of its workers while they move to another replica (`worker.reconnect`),
    /// and serving the model streams in flight, before it stops (default 45: the chart's
    /// grace period of 60 s less its preStop delay and a margin). Turns still held then end
    /// `interrupted`.
    pub drain_timeout: std::time::Duration,
    /// `BERTH_COORDINATOR_MAX_CHILDREN`: child sessions one turn may start, a coordinator's
    /// children or `delegate` sub-agents (default 16).
    pub coordinator_max_children: u32,
    /// `BERTH_INTERNAL_URL`: where other replicas reach this one to forward worker calls
    /// (default: `http://<internal listen address>` unless that is a wildcard address).
    pub internal_url: Option<String>,
    /// `BERTH_INTERNAL_LISTEN`: the listener that serves other replicas only
    /// (`/v1/internal/call`), never the public one (default: the public listener's address
    /// with a port of the system's choosing).
    pub internal_listen: Option<std::net::SocketAddr>,
    /// `BERTH_TRUSTED_PROXIES`: networks (CIDRs) of reverse proxies whose
    /// `X-Forwarded-For` names the client address; from anyone else it is ignored.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// `BERTH_DB_PROBE_SECS`: how often the LISTEN connection is asked a trivial query, so
    /// that a half-open one (notifications silently lost) is noticed and replaced.
    pub listen_probe_interval: std::time::Duration,
    /// `BERTH_DB_PROBE_TIMEOUT_SECS`: how long that probe may take.
    pub listen_probe_timeout: std::time::Duration,
}

/// `BERTH_OBJECT_STORE` and, for `s3://`, the `AWS_*` settings (values redacted in `Debug`).
#[derive(Debug, Clone)]
pub struct ObjectStoreConfig {
    /// `file://PATH` or `s3://bucket/prefix`; None: `<data-dir>/objects`.
    pub url: Option<String>,
    /// `AWS_*` settings (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
    /// `AWS_ENDPOINT_URL`, `AWS_VIRTUAL_HOSTED_STYLE_REQUEST`, …).
    pub aws: Vec<(String, Secret)>,
    /// `BERTH_OBJECT_SWEEP_SECS`: how often a replica removes orphaned blobs (default 1 hour).
    pub sweep_every: std::time::Duration,
    /// `BERTH_OBJECT_ORPHAN_AGE_SECS`: a blob without a row is an orphan once this old
    /// (default 1 hour: longer than any upload between its bytes and its row).
    pub orphan_age: std::time::Duration,
}

impl Default for ObjectStoreConfig {
    fn default() -> ObjectStoreConfig {
        ObjectStoreConfig {
            url: None,
            aws: Vec::new(),
            sweep_every: std::time::Duration::from_secs(3600),
            orphan_age: std::time::Duration::from_secs(3600),
        }
    }
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
            providers: Providers::default(),
            auto_titles: true,
            replica_id: berth_store::token::new_id("rep"),
            receipt_retention: std::time::Duration::from_secs(7 * 24 * 3600),
            jwt: None,
            jwt_ttl: std::time::Duration::from_secs(15 * 60),
            limits: Limits::default(),
            object_store: ObjectStoreConfig::default(),
            max_attachment_bytes: 32 << 20,
            upload_memory_bytes: 256 << 20,
            interaction_timeout: std::time::Duration::from_secs(15 * 60),
            drain_timeout: std::time::Duration::from_secs(45),
            coordinator_max_children: 16,
            internal_url: None,
            internal_listen: None,
            trusted_proxies: Vec::new(),
            listen_probe_interval: std::time::Duration::from_secs(15),
            listen_probe_timeout: std::time::Duration::from_secs(10),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_entries_take_options_from_the_right() {
        let p = |s: &str| {
            let m = ProfileModel::parse(s);
            (m.id, m.context_tokens, m.level)
        };
        assert_eq!(p("gpt-5"), ("gpt-5".into(), None, None));
        assert_eq!(p("gpt-5:400000"), ("gpt-5".into(), Some(400_000), None));
        assert_eq!(
            p("o3:200000:high"),
            ("o3".into(), Some(200_000), Some(ReasoningLevel::High))
        );
        assert_eq!(p("o3::low"), ("o3".into(), None, Some(ReasoningLevel::Low)));
        assert_eq!(p("llama3:8b"), ("llama3:8b".into(), None, None));
        assert_eq!(p("llama3:8b:8192"), ("llama3:8b".into(), Some(8192), None));
    }

    #[test]
    fn a_models_window_sets_its_body_limit_and_the_default_model_takes_the_env_level() {
        let cfg = ModelConfig {
            model: Some("main".into()),
            context_tokens: 100_000,
            level: Some(ReasoningLevel::Medium),
            ..ModelConfig::default()
        };
        let profile = ProviderProfile {
            name: DEFAULT_PROVIDER.into(),
            api: WireApi::ChatCompletions,
            base_url: "http://127.0.0.1:1".into(),
            api_key: None,
            models: vec![ProfileModel::parse("small:1000:high")],
            allow_base_url: false,
            allow_private_base_url: false,
            image_input: ImageInput::All,
        };
        let small = cfg.spec(&profile, "small");
        assert_eq!(small.context_tokens, 1000);
        assert_eq!(small.level, Some(ReasoningLevel::High));
        assert_eq!(small.body_limit(), 16_000 + (1 << 20));
        let main = cfg.spec(&profile, "main");
        assert_eq!(main.context_tokens, 100_000);
        assert_eq!(main.level, Some(ReasoningLevel::Medium));
        assert!(main.body_limit() > small.body_limit());
        assert_eq!(cfg.spec(&profile, "other").level, None);
    }
}

#[cfg(test)]
mod image_input_tests {
    use std::collections::HashMap;

    use super::ProviderSet;

    fn load(vars: &[(&str, &str)]) -> ProviderSet {
        let vars: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        ProviderSet::load(|k| vars.get(k).cloned(), |_| Ok(None)).expect("profiles")
    }

    #[test]
    fn each_profile_says_which_of_its_models_take_images() {
        let set = load(&[
            ("BERTH_MODEL_BASE_URL", "http://default"),
            ("BERTH_PROVIDERS", "mixed,blind"),
            ("BERTH_PROVIDER_MIXED_BASE_URL", "http://mixed"),
            ("BERTH_PROVIDER_MIXED_MODELS", "seeing,text-only"),
            ("BERTH_PROVIDER_MIXED_IMAGE_INPUT", "seeing, other"),
            ("BERTH_PROVIDER_BLIND_BASE_URL", "http://blind"),
            ("BERTH_PROVIDER_BLIND_IMAGE_INPUT", "false"),
        ]);
        let default = set.get(None).expect("default");
        assert!(
            default.takes_images("anything"),
            "images are taken unless a profile says otherwise"
        );
        let mixed = set.get(Some("mixed")).expect("mixed");
        assert!(mixed.takes_images("seeing"));
        assert!(!mixed.takes_images("text-only"));
        assert!(!set.get(Some("blind")).expect("blind").takes_images("seeing"));
        let off = load(&[
            ("BERTH_MODEL_BASE_URL", "http://default"),
            ("BERTH_MODEL_IMAGE_INPUT", "false"),
        ]);
        assert!(!off.get(None).expect("default").takes_images("m"));
    }
}
