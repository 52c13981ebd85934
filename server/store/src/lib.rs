//! Berth's PostgreSQL layer. Only this crate talks SQL.
//!
//! [`Store`] wraps a connection pool; every query that touches tenant data takes the
//! caller's tenant id and filters on it, so an id from another tenant behaves exactly like
//! an id that does not exist. History is appended through [`Store`]'s methods only, which
//! assign the gapless per-session sequence inside the appending transaction and send one
//! `NOTIFY berth_events, '<session>:<sequence>'` that is delivered on commit.

pub mod cluster;
pub mod migrate;
pub mod token;

pub mod admin;
mod fork;
mod history;
mod identity;
pub mod receipts;
pub mod search;
mod sessions;
mod turns;
mod workspaces;

use berth_protocol::ErrorCode;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

pub use history::EventRecord;
pub use identity::{CredentialKind, Principal};
pub use receipts::{Begin, Receipt, ReceiptView};
pub use turns::{ClaimedTurn, Partial};

/// Channel carrying `<session_id>:<sequence>` after each committed append.
pub const CHANNEL_EVENTS: &str = "berth_events";
/// Channel carrying a workspace id whose queued or undispatched turns may now be handed out.
pub const CHANNEL_DISPATCH: &str = "berth_dispatch";
/// Channel carrying small coalesced live deltas between replicas (JSON).
pub const CHANNEL_DELTAS: &str = "berth_deltas";
/// Channel carrying revocations: `cred:<credential id>` or `user:<user id>`.
pub const CHANNEL_REVOKE: &str = "berth_revoke";
/// Channel carrying control messages for worker connections: `stop:<connection>:<turn>`.
pub const CHANNEL_CONTROL: &str = "berth_control";

/// A store failure: a typed user-facing code, or an infrastructure error.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{}", .0.as_str())]
    Code(ErrorCode),
    #[error("database unavailable: {0}")]
    Unavailable(String),
    #[error(transparent)]
    Db(#[from] tokio_postgres::Error),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(e: deadpool_postgres::PoolError) -> StoreError {
        StoreError::Unavailable(e.to_string())
    }
}

impl StoreError {
    /// The wire code this error answers with.
    pub fn code(&self) -> ErrorCode {
        match self {
            StoreError::Code(c) => *c,
            StoreError::Unavailable(_) => ErrorCode::Unavailable,
            StoreError::Db(e) if e.is_closed() => ErrorCode::Unavailable,
            _ => ErrorCode::Internal,
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The database behind one type.
#[derive(Clone)]
pub struct Store {
    pool: Pool,
    config: tokio_postgres::Config,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("pool", &self.pool.status()).finish()
    }
}

impl Store {
    /// Connect a pool (lazily) to `url` (a `postgres://` URL or `key=value` string).
    pub fn connect(url: &str, max_size: usize) -> anyhow::Result<Store> {
        let config: tokio_postgres::Config = url.parse().map_err(|e| anyhow::anyhow!("invalid DATABASE_URL: {e}"))?;
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(max_size)
            .wait_timeout(Some(std::time::Duration::from_secs(10)))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()?;
        Ok(Store { pool, config })
    }

    /// Apply pending migrations under the advisory lock.
    pub async fn migrate(&self) -> Result<usize> {
        let mut client = self.pool.get().await?;
        Ok(migrate::migrate(&mut client).await?)
    }

    /// `/readyz`: the database answers and migrations are current.
    pub async fn ready(&self) -> bool {
        match self.pool.get().await {
            Ok(client) => migrate::is_current(&client).await.unwrap_or(false),
            Err(_) => false,
        }
    }

    /// Pool size and available connections, for metrics.
    pub fn pool_status(&self) -> (usize, usize) {
        let s = self.pool.status();
        (s.size, s.available)
    }

    /// A dedicated connection that LISTENs on `channels`; notifications arrive on the
    /// returned receiver until the connection drops (then the receiver closes).
    pub async fn listen(
        &self,
        channels: &[&str],
    ) -> anyhow::Result<(
        tokio_postgres::Client,
        tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::Notification>,
    )> {
        let (client, mut connection) = self.config.connect(NoTls).await?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                match futures_util::future::poll_fn(|cx| connection.poll_message(cx)).await {
                    Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) => {
                        if tx.send(n).is_err() {
                            break;
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "listen connection failed");
                        break;
                    }
                    None => break,
                }
            }
        });
        for channel in channels {
            client.batch_execute(&format!("LISTEN {channel}")).await?;
        }
        Ok((client, rx))
    }

    /// Send a notification outside any transaction.
    pub async fn notify(&self, channel: &str, payload: &str) -> Result<()> {
        let client = self.pool.get().await?;
        client.ex("SELECT pg_notify($1, $2)", &[&channel, &payload]).await?;
        Ok(())
    }
}

type Params<'a> = &'a [&'a (dyn tokio_postgres::types::ToSql + Sync)];

/// Queries through the connection's statement cache: after the first use of a statement on
/// a connection, each query is one round trip instead of two (parse, then bind/execute).
pub(crate) trait Cached: deadpool_postgres::GenericClient {
    fn qa<'a>(
        &'a self,
        sql: &'a str,
        params: Params<'a>,
    ) -> impl std::future::Future<Output = Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>> + Send + 'a {
        async move { self.query(&self.prepare_cached(sql).await?, params).await }
    }

    fn q1<'a>(
        &'a self,
        sql: &'a str,
        params: Params<'a>,
    ) -> impl std::future::Future<Output = Result<tokio_postgres::Row, tokio_postgres::Error>> + Send + 'a {
        async move { self.query_one(&self.prepare_cached(sql).await?, params).await }
    }

    fn qo<'a>(
        &'a self,
        sql: &'a str,
        params: Params<'a>,
    ) -> impl std::future::Future<Output = Result<Option<tokio_postgres::Row>, tokio_postgres::Error>> + Send + 'a {
        async move { self.query_opt(&self.prepare_cached(sql).await?, params).await }
    }

    fn ex<'a>(
        &'a self,
        sql: &'a str,
        params: Params<'a>,
    ) -> impl std::future::Future<Output = Result<u64, tokio_postgres::Error>> + Send + 'a {
        async move { self.execute(&self.prepare_cached(sql).await?, params).await }
    }
}

impl<T: deadpool_postgres::GenericClient> Cached for T {}

/// The role tenant-scoped transactions run as (subject to row-level security).
pub const APP_ROLE: &str = "berth_app";

/// Begin a transaction scoped to `tenant_id`: it runs as [`APP_ROLE`] with the tenant set
/// for this transaction only, so row-level security admits that tenant's rows and no other.
/// This is the second line of isolation; every query filters on the tenant as well.
pub(crate) async fn tenant_tx<'a>(
    client: &'a mut deadpool_postgres::Object,
    tenant_id: &str,
) -> Result<deadpool_postgres::Transaction<'a>> {
    let tx = client.transaction().await?;
    tx.ex(
        "SELECT set_config('role', $1, true), set_config('berth.tenant_id', $2, true)",
        &[&APP_ROLE, &tenant_id],
    )
    .await?;
    Ok(tx)
}

/// RFC 3339 with milliseconds, UTC.
pub(crate) fn fmt_time(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

pub(crate) fn not_found<T>() -> Result<T> {
    Err(StoreError::Code(ErrorCode::NotFound))
}
