//! Berth's API tier: the WebSocket JSON-RPC front door, worker routing, the streaming model
//! proxy, health and metrics.
//!
//! The tier is stateless: everything authoritative lives in PostgreSQL (through
//! [`berth_store::Store`]). In memory there are only connections, the [`hub::Hub`] that
//! wakes local watchers, and the registry of worker connections this replica holds.

pub mod auth;
pub mod blobs;
mod compaction;
mod complete;
pub mod config;
pub mod connections;
mod console;
pub mod error;
pub mod hub;
mod listen;
mod login;
pub mod metrics;
pub mod net;
mod providers;
mod proxy;
mod rpc;
mod titles;
mod workers;

use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use axum::{
    Router,
    extract::State,
    http::StatusCode,
    response::IntoResponse,
    routing::{get, post},
};
use berth_store::Store;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use config::{Config, ModelConfig, ObjectStoreConfig, Secret};
pub use rpc::{patch::SNAPSHOTS_AT_ONCE, upload::WORKER_ATTACH_BODIES};

/// Shared state of one replica.
#[derive(Clone)]
pub struct AppState(pub Arc<App>);

impl std::ops::Deref for AppState {
    type Target = App;
    fn deref(&self) -> &App {
        &self.0
    }
}

pub struct App {
    /// The database (all authoritative state).
    pub store: Store,
    /// Configuration this replica was started with.
    pub config: Config,
    /// Metrics registry.
    pub metrics: metrics::Metrics,
    /// Local fan-out to watchers on this replica.
    pub hub: hub::Hub,
    /// Worker connections held by this replica.
    pub workers: workers::Registry,
    /// Wake-ups for the open `turn.interaction` requests of this replica's workers.
    pub interactions: workers::interaction::Waiters,
    /// The `session.watch` subscriptions this replica holds (recorded in PostgreSQL).
    pub watchers: rpc::interaction::Watchers,
    /// HTTP client for outbound calls.
    pub http: reqwest::Client,
    /// HTTP client for model providers (their connect timeout).
    pub provider_http: reqwest::Client,
    /// HTTP client for endpoints sessions choose (`baseUrl`): public addresses only.
    pub public_http: reqwest::Client,
    /// Cancelled when the replica shuts down; long-lived tasks end with it.
    pub shutdown: CancellationToken,
    /// Cancelled at SIGTERM, before `shutdown`: the replica hands out no more turns, refuses
    /// new worker connections, reports not ready, and asks its workers to move their turns
    /// to another replica (`worker.reconnect`) while it keeps relaying them.
    pub draining: CancellationToken,
    /// Live connections by principal (for revocation and per-credential limits).
    pub connections: connections::Connections,
    /// Login attempts per account and per source address.
    pub login_limiter: auth::LoginLimiter,
    /// Requests per credential.
    pub request_limiter: auth::KeyedLimiter,
    /// Password verifications running at once (argon2id is memory- and CPU-heavy).
    pub password_checks: Arc<tokio::sync::Semaphore>,
    /// Files workers attach, held in memory at once ([`rpc::upload::WORKER_ATTACH_BODIES`]).
    pub worker_attach_bodies: Arc<tokio::sync::Semaphore>,
    /// Patches captured at once ([`rpc::patch::SNAPSHOTS_AT_ONCE`]).
    pub patch_snapshots: Arc<tokio::sync::Semaphore>,
    /// Uploaded bodies held at once, in KiB ([`Config::upload_memory_bytes`]).
    pub upload_memory: Arc<tokio::sync::Semaphore>,
    /// Per-tenant limits of the model proxy.
    pub proxy: proxy::ProxyLimits,
    /// Object storage (attachment bytes).
    pub blobs: blobs::Blobs,
    /// The cluster secret and this replica's internal address (routing worker calls).
    pub cluster: workers::forwarded::Cluster,
}

impl App {
    /// Resolve a presented credential or login token to its principal (None: not valid).
    pub async fn authenticate(
        &self,
        presented: &str,
    ) -> Result<Option<berth_store::Principal>, berth_store::StoreError> {
        if auth::looks_like_jwt(presented) {
            let Some(keys) = &self.config.jwt else { return Ok(None) };
            let Some(claims) = keys.verify(presented) else {
                return Ok(None);
            };
            let expires = chrono::DateTime::from_timestamp(claims.exp, 0);
            let session = format!("jwt:{}", claims.jti);
            return self
                .store
                .user_principal(&claims.tid, &claims.sub, &session, expires)
                .await;
        }
        self.store.authenticate(presented).await
    }
}

/// Serve the API on `listener` and metrics on `metrics_listener` until `shutdown`
/// resolves, then drain connections.
pub async fn serve(
    config: Config,
    store: Store,
    listener: TcpListener,
    metrics_listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let http = net::http_client()?;
    let provider_http = net::provider_client(config.model.resilience.connect_timeout)?;
    let public_http = net::public_only_client(config.model.resilience.connect_timeout)?;
    let token = CancellationToken::new();
    let (config_rate, config_burst) = (config.limits.requests_per_sec, config.limits.request_burst);
    let password_checks = Arc::new(tokio::sync::Semaphore::new(config.limits.max_password_checks.max(1)));
    let proxy = proxy::ProxyLimits::new(&config.model);
    let workers = workers::Registry::new(&config.limits);
    let metrics = metrics::Metrics::new();
    let blobs = blobs::Blobs::open(
        config.object_store.url.as_deref(),
        &config.data_dir,
        config.object_store.aws.iter().map(|(k, v)| (k.clone(), v.0.clone())),
        metrics.object_store_bytes.clone(),
    )?;
    tracing::info!(object_store = %blobs.url, "object storage");
    // Replica-to-replica forwarding has a listener of its own, kept off the public one (and
    // so out of the reverse proxy's reach).
    let internal_addr = config.internal_listen.unwrap_or_else(|| {
        std::net::SocketAddr::new(
            listener.local_addr().map(|a| a.ip()).unwrap_or([127, 0, 0, 1].into()),
            0,
        )
    });
    let internal_listener = TcpListener::bind(internal_addr)
        .await
        .with_context(|| format!("binding BERTH_INTERNAL_LISTEN {internal_addr}"))?;
    let cluster =
        workers::forwarded::Cluster::load(&store, config.internal_url.as_deref(), internal_listener.local_addr()?)
            .await?;
    let upload_memory = Arc::new(tokio::sync::Semaphore::new(
        rpc::upload::kib(rpc::upload::memory_budget(&config)) as usize,
    ));
    let state = AppState(Arc::new(App {
        store,
        config,
        metrics,
        hub: hub::Hub::default(),
        workers,
        interactions: Default::default(),
        watchers: Default::default(),
        http,
        provider_http,
        public_http,
        shutdown: token.clone(),
        draining: CancellationToken::new(),
        connections: connections::Connections::default(),
        login_limiter: auth::LoginLimiter::default(),
        request_limiter: auth::KeyedLimiter::new(auth::BucketConfig {
            capacity: config_burst,
            refill_every: Duration::from_secs(1) / config_rate.max(1),
        }),
        password_checks,
        worker_attach_bodies: Arc::new(tokio::sync::Semaphore::new(rpc::upload::WORKER_ATTACH_BODIES)),
        patch_snapshots: Arc::new(tokio::sync::Semaphore::new(rpc::patch::SNAPSHOTS_AT_ONCE)),
        upload_memory,
        proxy,
        blobs,
        cluster,
    }));
    listen::spawn(state.clone());
    spawn_housekeeping(state.clone());
    workers::interaction::spawn_housekeeping(state.clone());
    workers::forwarded::spawn_announce(state.clone());

    let app = Router::new()
        .route("/v1/rpc", get(rpc::upgrade))
        .route("/v1/worker", get(workers::upgrade))
        .route(berth_protocol::worker::MODEL_PROXY_PATH, post(proxy::chat_completions))
        .route(
            berth_protocol::worker::ATTACHMENTS_PATH,
            get(rpc::upload::worker_fetch).post(rpc::upload::worker_attach),
        )
        .route("/v1/auth/login", post(login::login))
        .route("/v1/schema", get(schema))
        .route("/", get(console::index))
        .route("/console/{file}", get(console::asset))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state.clone());
    let internal_app = Router::new()
        .route(
            workers::calls::INTERNAL_CALL_PATH,
            post(workers::forwarded::internal_call),
        )
        .with_state(state.clone());
    let metrics_app = Router::new()
        .route("/metrics", get(metrics_handler))
        .with_state(state.clone());

    let (t, s) = (token.clone(), state.clone());
    tokio::spawn(async move {
        shutdown.await;
        drain(&s).await;
        t.cancel();
    });
    let t = token.clone();
    let metrics_server = tokio::spawn(async move {
        axum::serve(net::nodelay(metrics_listener), metrics_app)
            .with_graceful_shutdown(async move { t.cancelled().await })
            .await
    });
    let t = token.clone();
    let internal_server = tokio::spawn(async move {
        axum::serve(net::nodelay(internal_listener), internal_app)
            .with_graceful_shutdown(async move { t.cancelled().await })
            .await
    });
    let t = token.clone();
    let served = axum::serve(
        net::nodelay(listener),
        app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(async move { t.cancelled().await });
    // Requests in flight get a bounded time to finish once the drain is over (a model stream
    // that hangs must not keep the process up past its grace period).
    let t = token.clone();
    tokio::select! {
        r = served => r?,
        _ = async move {
            t.cancelled().await;
            tokio::time::sleep(HTTP_SHUTDOWN_GRACE).await;
        } => tracing::warn!("requests still in flight after the shutdown grace period; stopping"),
    }
    // Upgraded WebSockets outlive axum's graceful shutdown: let them finish their cleanup
    // (they were told to close when `token` was cancelled) while the database is still up.
    if !state.connections.drained(Duration::from_secs(10)).await {
        tracing::warn!("connections still open after the shutdown grace period");
    }
    metrics_server.await??;
    internal_server.await??;
    Ok(())
}

/// How long HTTP requests in flight may take to finish once a replica stops.
const HTTP_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// SIGTERM: stop handing out turns and ask the workers to move theirs to another replica
/// ([`AppState::draining`]), then wait — within `BERTH_DRAIN_TIMEOUT_SECS` — until this
/// replica relays no turn, serves no model stream and has no workspace call in progress on
/// its worker connections (watches aside: they end with the connection).
async fn drain(state: &AppState) {
    state.draining.cancel();
    let started = std::time::Instant::now();
    let deadline = started + state.config.drain_timeout;
    tracing::info!(
        timeout_s = state.config.drain_timeout.as_secs(),
        "draining: workers asked to move their turns"
    );
    loop {
        let (turns, streams, calls) = (
            state.workers.held_turns(),
            state.proxy.streams(),
            state.workers.held_calls(),
        );
        if turns == 0 && streams == 0 && calls == 0 {
            tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, "drained");
            return;
        }
        if std::time::Instant::now() >= deadline {
            tracing::warn!(
                turns,
                streams,
                calls,
                "drain timeout: turns still held here end interrupted"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Periodic work any replica may do (each task is idempotent): interrupt the turns of
/// workers whose replica died, and delete expired operation receipts and sign-in buckets
/// that are full again.
fn spawn_housekeeping(state: AppState) {
    tokio::spawn(async move {
        let mut sweep = tokio::time::interval(Duration::from_secs(15));
        let mut receipts = tokio::time::interval(Duration::from_secs(3600));
        let mut logins = tokio::time::interval(Duration::from_secs(600));
        let mut revalidate = tokio::time::interval(Duration::from_secs(15));
        let mut orphans = tokio::time::interval(state.config.object_store.sweep_every.max(Duration::from_secs(1)));
        loop {
            tokio::select! {
                _ = sweep.tick() => match state.store.sweep_stale_presence().await {
                    Ok(turns) => for t in turns {
                        state.metrics.turns.with_label_values(&["interrupted"]).inc();
                        tracing::warn!(turn.id = %t, "worker's replica went silent; turn interrupted");
                    },
                    Err(e) => tracing::warn!(error = %e, "presence sweep failed"),
                },
                _ = receipts.tick() => match state.store.receipts_cleanup(state.config.receipt_retention.as_secs() as i64).await {
                    Ok(n) if n > 0 => tracing::info!(deleted = n, "expired operation receipts deleted"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "receipt cleanup failed"),
                },
                _ = logins.tick() => if let Err(e) = state.store.login_buckets_cleanup().await {
                    tracing::warn!(error = %e, "sign-in bucket cleanup failed");
                },
                _ = revalidate.tick() => state.connections.revalidate(&state, None).await,
                _ = orphans.tick() => match rpc::upload::sweep_orphans(&state).await {
                    Ok(n) if n > 0 => tracing::info!(removed = n, "orphaned blobs removed"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "orphan sweep failed"),
                },
                _ = state.shutdown.cancelled() => return,
            }
        }
    });
}

/// `GET /v1/schema`: the protocol's JSON Schema (generated once; it is static).
async fn schema() -> impl IntoResponse {
    static DOC: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let body = DOC.get_or_init(|| berth_protocol::schema::document().to_string());
    (
        [(axum::http::header::CONTENT_TYPE, "application/schema+json")],
        body.as_str(),
    )
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    if state.draining.is_cancelled() {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining");
    }
    if state.store.ready().await {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

async fn metrics_handler(State(state): State<AppState>) -> impl IntoResponse {
    let (size, available) = state.store.pool_status();
    state.metrics.db_pool_size.set(size as i64);
    state.metrics.db_pool_available.set(available as i64);
    state.metrics.render()
}
