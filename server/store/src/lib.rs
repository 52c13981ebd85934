//! Berth's PostgreSQL layer. Only this crate talks SQL.
//!
//! [`Store`] wraps a connection pool; every query that touches tenant data takes the
//! caller's tenant id and filters on it, so an id from another tenant behaves exactly like
//! an id that does not exist. History is appended through [`Store`]'s methods only, which
//! assign the gapless per-session sequence inside the appending transaction and send one
//! `NOTIFY berth_events, '<session>:<sequence>'` that is delivered on commit.

/// Whether session `s` (with its agent `a`) runs its tool calls without asking: its own
/// `autoApprove`, or an agent whose approval is `auto` — unless the session is a fork (forks
/// start narrowed) or a child whose parent asked (`may_auto_approve`). A child is never more
/// permissive than what started it: one whose parent auto-ran only some tools
/// (`auto_approve_within`) auto-runs nothing unless its own agent's tool set is within them,
/// and a child inherits its parent's `autoApprove` only where it took effect in the parent
/// (so a child that asks cannot start a grandchild that does not).
macro_rules! effective_auto_approve {
    () => {
        "((s.auto_approve OR coalesce(a.approval = 'auto' AND s.branch IS NULL AND s.may_auto_approve, false))
          AND (s.auto_approve_within IS NULL OR coalesce(a.tools <@ s.auto_approve_within, false)))"
    };
}

/// The bound on what a child of session `s` (with its agent `a`) may auto-run
/// (`sessions.auto_approve_within`): the agent's tool set, else the session's own bound.
macro_rules! child_auto_approve_within {
    () => {
        "coalesce(a.tools, s.auto_approve_within)"
    };
}

pub mod cluster;
pub mod migrate;
pub mod token;

pub mod admin;
mod agents;
mod attachments;
mod compaction;
mod context;
mod coordinator;
mod delegate;
mod fork;
#[macro_use]
mod history;
mod identity;
mod interactions;
mod mcp;
mod patches;
pub mod receipts;
mod routing;
pub mod search;
mod sessions;
mod skills;
mod tls;
mod tools;
mod turns;
mod workspace_ops;
mod workspaces;

use std::{path::PathBuf, time::Duration};

use berth_protocol::ErrorCode;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres_rustls::MakeRustlsConnect;

pub use attachments::{NewAttachment, StoredAttachment};
pub use compaction::CompactionSource;
pub use context::ContextMeasure;
pub use coordinator::NewChild;
pub use history::EventRecord;
pub use identity::{CredentialKind, LoginFound, Principal};
pub use interactions::WatcherKey;
pub use patches::NewPatch;
pub use receipts::{Begin, Receipt, ReceiptView};
pub use routing::WorkerRoute;
pub use turns::{Admission, Admitted, ClaimedTurn, Ended, Metered, Partial, ProxyTurn, TitleSource};

/// The `application_name` of a replica's LISTEN connection ([`Store::listen`]).
pub const LISTEN_APPLICATION_NAME: &str = "berth-listen";

/// Channel carrying `<session_id>:<sequence>` after each committed append.
pub const CHANNEL_EVENTS: &str = "berth_events";
/// Channel carrying a workspace id whose queued or undispatched turns may now be handed out,
/// optionally followed by a space and the id of the replica that sent it and has already
/// woken its own worker connections ([`dispatch_payload`]).
pub const CHANNEL_DISPATCH: &str = "berth_dispatch";

/// A [`CHANNEL_DISPATCH`] payload for `workspace_id`. `from`: the sending replica, which
/// kicks its own connections itself, so that it can skip its own notification.
pub fn dispatch_payload(workspace_id: &str, from: Option<&str>) -> String {
    match from {
        Some(replica) => format!("{workspace_id} {replica}"),
        None => workspace_id.to_string(),
    }
}

/// The workspace whose connections replica `me` must kick for a [`CHANNEL_DISPATCH`]
/// `payload`: none when `me` sent it (it kicked them already).
pub fn dispatch_target<'a>(payload: &'a str, me: &str) -> Option<&'a str> {
    match payload.split_once(' ') {
        Some((_, from)) if from == me => None,
        Some((workspace_id, _)) => Some(workspace_id),
        None => Some(payload),
    }
}
/// Channel carrying small coalesced live deltas between replicas (JSON).
pub const CHANNEL_DELTAS: &str = "berth_deltas";
/// Channel carrying revocations: `cred:<credential id>` or `user:<user id>`.
pub const CHANNEL_REVOKE: &str = "berth_revoke";
/// Channel carrying the id of an interaction that was just resolved (its outcome is read
/// from the table).
pub const CHANNEL_INTERACTIONS: &str = "berth_interactions";
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
        StoreError::Unavailable(error_chain(&e))
    }
}

impl StoreError {
    /// The wire code this error answers with.
    pub fn code(&self) -> ErrorCode {
        match self {
            StoreError::Code(c) => *c,
            StoreError::Unavailable(_) => ErrorCode::Unavailable,
            StoreError::Db(e) if lost_connection(e) => ErrorCode::Unavailable,
            _ => ErrorCode::Internal,
        }
    }
}

/// The database went away under a query (a restart, a failover, a cut network) rather
/// than the query being wrong: a closed connection, an I/O error, a connection exception
/// (SQLSTATE class 08) or the server shutting down or not accepting connections yet.
fn lost_connection(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(code) => {
            code.code().starts_with("08")
                || [
                    SqlState::ADMIN_SHUTDOWN,
                    SqlState::CRASH_SHUTDOWN,
                    SqlState::CANNOT_CONNECT_NOW,
                ]
                .contains(code)
        }
        None => {
            let mut source = std::error::Error::source(e);
            while let Some(s) = source {
                if s.is::<std::io::Error>() {
                    return true;
                }
                source = s.source();
            }
            false
        }
    }
}

/// `e` and its causes, `: `-separated (a driver error's own text is often just "db error").
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// How the store reaches the database, beyond the URL. Values the URL sets itself
/// (`connect_timeout`, `tcp_user_timeout`, `options=-c statement_timeout=…`) win.
#[derive(Debug, Clone)]
pub struct DbOptions {
    /// `BERTH_DB_POOL_SIZE`: connections in the pool.
    pub max_size: usize,
    /// `BERTH_DB_CA_FILE`: PEM certificates to verify the server's certificate and host name
    /// against. Without it, `sslmode=require` and `prefer` encrypt without verifying (as
    /// libpq does without a root certificate).
    pub ca_file: Option<PathBuf>,
    /// `BERTH_DB_CONNECT_TIMEOUT_SECS`: giving up on a connection attempt.
    pub connect_timeout: Duration,
    /// `BERTH_DB_TCP_USER_TIMEOUT_SECS`: how long sent data may stay unacknowledged before
    /// the connection is dropped (a dead peer is noticed instead of waited for).
    pub tcp_user_timeout: Duration,
    /// `BERTH_DB_STATEMENT_TIMEOUT_SECS`: the server cancels a statement running longer
    /// (zero: no limit). Migrations run without it.
    pub statement_timeout: Duration,
    /// `BERTH_DB_SSLMODE`: the least TLS the connection may use, whatever the URL says (the
    /// stricter of the two wins). `prefer`, the URL's default, falls back to plain text when
    /// the server (or an attacker in the way) does not offer TLS; `require` never does.
    pub ssl_mode_floor: Option<SslFloor>,
}

/// A floor for the URL's `sslmode` ([`DbOptions::ssl_mode_floor`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SslFloor {
    Disable,
    Prefer,
    Require,
}

impl std::str::FromStr for SslFloor {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<SslFloor> {
        match s {
            "disable" => Ok(SslFloor::Disable),
            "prefer" => Ok(SslFloor::Prefer),
            "require" => Ok(SslFloor::Require),
            other => anyhow::bail!("{other:?}: expected disable, prefer or require"),
        }
    }
}

impl Default for DbOptions {
    fn default() -> DbOptions {
        DbOptions {
            max_size: 16,
            ca_file: None,
            connect_timeout: Duration::from_secs(10),
            tcp_user_timeout: Duration::from_secs(30),
            statement_timeout: Duration::from_secs(30),
            ssl_mode_floor: None,
        }
    }
}

/// The driver configuration for `url` with `options` applied where the URL is silent.
fn db_config(url: &str, options: &DbOptions) -> anyhow::Result<tokio_postgres::Config> {
    let mut config: tokio_postgres::Config = url.parse().map_err(|e| anyhow::anyhow!("invalid DATABASE_URL: {e}"))?;
    if let Some(floor) = options.ssl_mode_floor {
        use tokio_postgres::config::SslMode;
        let url = match config.get_ssl_mode() {
            SslMode::Disable => SslFloor::Disable,
            SslMode::Prefer => SslFloor::Prefer,
            _ => SslFloor::Require,
        };
        match floor.max(url) {
            SslFloor::Disable => config.ssl_mode(SslMode::Disable),
            SslFloor::Prefer => config.ssl_mode(SslMode::Prefer),
            SslFloor::Require => config.ssl_mode(SslMode::Require),
        };
    }
    if config.get_connect_timeout().is_none() && !options.connect_timeout.is_zero() {
        config.connect_timeout(options.connect_timeout);
    }
    if config.get_tcp_user_timeout().is_none() && !options.tcp_user_timeout.is_zero() {
        config.tcp_user_timeout(options.tcp_user_timeout);
    }
    let mut all = config.get_options().unwrap_or_default().to_string();
    if !all.contains("statement_timeout") && !options.statement_timeout.is_zero() {
        let ms = options.statement_timeout.as_millis();
        all.push_str(&format!(" -c statement_timeout={ms}"));
    }
    // Prepared statements keep one generic plan per connection. Under the default (`auto`)
    // PostgreSQL plans a statement anew on every call when the generic plan's estimate
    // looks dearer than the custom plans' — planning on every call of a turn's statements,
    // whose plans are index look-ups either way (ARCHITECTURE.md, "Generic plans").
    if !all.contains("plan_cache_mode") {
        all.push_str(" -c plan_cache_mode=force_generic_plan");
    }
    let all = all.trim_start();
    if !all.is_empty() {
        config.options(all);
    }
    Ok(config)
}

/// The database behind one type.
#[derive(Clone)]
pub struct Store {
    pool: Pool,
    /// One connection of its own for `/readyz`: a request pool busy to its last connection
    /// is not a replica that should leave the load balancer.
    probe: Pool,
    config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
}

/// How long `/readyz` waits for its answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("pool", &self.pool.status()).finish()
    }
}

impl Store {
    /// Connect a pool (lazily) to `url` (a `postgres://` URL or `key=value` string) with
    /// the default [`DbOptions`].
    pub fn connect(url: &str, max_size: usize) -> anyhow::Result<Store> {
        Self::connect_with(
            url,
            &DbOptions {
                max_size,
                ..DbOptions::default()
            },
        )
    }

    /// Connect a pool (lazily) to `url`. TLS follows the URL's `sslmode` (`disable`,
    /// `prefer` — the default — or `require`), over rustls.
    pub fn connect_with(url: &str, options: &DbOptions) -> anyhow::Result<Store> {
        let config = db_config(url, options)?;
        let tls = tls::connector(options.ca_file.as_deref())?;
        let manager = Manager::from_config(
            config.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.max_size)
            .wait_timeout(Some(Duration::from_secs(10)))
            .create_timeout(Some(
                config.get_connect_timeout().copied().unwrap_or(Duration::from_secs(10)),
            ))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()?;
        let probe = Pool::builder(Manager::from_config(
            config.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        ))
        .max_size(1)
        .wait_timeout(Some(PROBE_TIMEOUT))
        .create_timeout(Some(PROBE_TIMEOUT))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()?;
        Ok(Store {
            pool,
            probe,
            config,
            tls,
        })
    }

    /// Apply pending migrations under the advisory lock (without the statement timeout:
    /// waiting for another replica's migration, or a long one, is expected).
    pub async fn migrate(&self) -> Result<usize> {
        let mut client = self.pool.get().await?;
        client.batch_execute("SET statement_timeout = 0").await?;
        let applied = migrate::migrate(&mut client).await;
        client.batch_execute("RESET statement_timeout").await?;
        Ok(applied?)
    }

    /// `/readyz`: the database answers and migrations are current — asked on a connection of
    /// its own, within a short timeout, so a busy request pool does not make it flap.
    pub async fn ready(&self) -> bool {
        let check = async {
            match self.probe.get().await {
                Ok(client) => migrate::is_current(&client).await.unwrap_or(false),
                Err(_) => false,
            }
        };
        tokio::time::timeout(PROBE_TIMEOUT, check).await.unwrap_or(false)
    }

    /// Pool size and available connections, for metrics.
    pub fn pool_status(&self) -> (usize, usize) {
        let s = self.pool.status();
        (s.size, s.available)
    }

    /// A dedicated connection that LISTENs on `channels` (its `application_name` is
    /// [`LISTEN_APPLICATION_NAME`] unless the database URL sets one); notifications arrive on the
    /// returned receiver until the connection drops (then the receiver closes). Dropping
    /// the receiver closes the connection (a half-open one too).
    pub async fn listen(
        &self,
        channels: &[&str],
    ) -> anyhow::Result<(
        tokio_postgres::Client,
        tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::Notification>,
    )> {
        // Named for operators (pg_stat_activity) unless the URL names every connection.
        let mut config = self.config.clone();
        if config.get_application_name().is_none() {
            config.application_name(LISTEN_APPLICATION_NAME);
        }
        let (client, mut connection) = config.connect(self.tls.clone()).await?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    m = futures_util::future::poll_fn(|cx| connection.poll_message(cx)) => m,
                    _ = tx.closed() => break,
                };
                match message {
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

/// One statement parameter.
pub(crate) type Param<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);
type Params<'a> = &'a [Param<'a>];

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
    tenant_tx_as(client, TENANT_SQL, tenant_id).await
}

/// [`tenant_tx`] whose plans read a range of a session's rows in index order
/// ([`TENANT_IN_ORDER_SQL`]): for pages of a long session (search).
pub(crate) async fn tenant_tx_in_order<'a>(
    client: &'a mut deadpool_postgres::Object,
    tenant_id: &str,
) -> Result<deadpool_postgres::Transaction<'a>> {
    tenant_tx_as(client, TENANT_IN_ORDER_SQL, tenant_id).await
}

/// A transaction scoped to `tenant_id` by `tenant_sql` (a tenant switch: `$1` [`APP_ROLE`],
/// `$2` the tenant id).
async fn tenant_tx_as<'a>(
    client: &'a mut deadpool_postgres::Object,
    tenant_sql: &str,
    tenant_id: &str,
) -> Result<deadpool_postgres::Transaction<'a>> {
    let tx = client.transaction().await?;
    tx.ex(tenant_sql, &[&APP_ROLE, &tenant_id]).await?;
    Ok(tx)
}

/// One read-only statement under the tenant's row-level security in one round trip:
/// `BEGIN`, the tenant switch (as [`tenant_tx`]), the statement and `COMMIT` go out
/// together. tokio-postgres sends a request when its future is first polled and PostgreSQL
/// runs a connection's requests in order, so `join4` (which polls in order) pipelines them;
/// all four are sent on that first poll, so a caller dropped mid-way still leaves the
/// connection outside any transaction. An error in any of them fails the whole read.
pub(crate) async fn tenant_read(
    client: &deadpool_postgres::Object,
    tenant_id: &str,
    sql: &str,
    params: Params<'_>,
) -> Result<Vec<tokio_postgres::Row>> {
    tenant_once(client, TENANT_SQL, tenant_id, sql, params).await
}

/// One write statement in its own transaction, in one round trip as [`tenant_read`], whose
/// commit does not wait for the disk (`synchronous_commit = off`, set with the tenant).
/// Only for writes whose loss in a database crash is harmless — never for history a client
/// or worker was told is stored (ARCHITECTURE.md, "Durable where acknowledged"); a later
/// durable commit flushes the log past it. A failing statement fails the call and its
/// `COMMIT` then rolls back.
pub(crate) async fn tenant_write_unflushed(
    client: &deadpool_postgres::Object,
    tenant_id: &str,
    sql: &str,
    params: Params<'_>,
) -> Result<Vec<tokio_postgres::Row>> {
    tenant_once(client, TENANT_UNFLUSHED_SQL, tenant_id, sql, params).await
}

async fn tenant_once(
    client: &deadpool_postgres::Object,
    tenant_sql: &str,
    tenant_id: &str,
    sql: &str,
    params: Params<'_>,
) -> Result<Vec<tokio_postgres::Row>> {
    let mut results = one_round_trip(client, "BEGIN", tenant_sql, tenant_id, &[(sql, params)]).await?;
    Ok(results.pop().unwrap_or_default())
}

/// A whole write transaction under the tenant's row-level security in one round trip:
/// `BEGIN`, the tenant switch, `statements` in order and `COMMIT` go out together, as in
/// [`tenant_read`] (all sent on the first poll). Each statement's rows come back; an error
/// in any of them fails the whole (PostgreSQL then answers the `COMMIT` with a rollback),
/// and `Ok` means committed durably. The statements' own `WHERE` clauses must make them
/// write nothing when an earlier one's outcome says they should not: nothing runs between.
pub(crate) async fn tenant_pipeline(
    client: &deadpool_postgres::Object,
    tenant_id: &str,
    statements: &[(&str, Params<'_>)],
) -> Result<Vec<Vec<tokio_postgres::Row>>> {
    one_round_trip(client, "BEGIN", TENANT_SQL, tenant_id, statements).await
}

/// [`tenant_pipeline`] whose commit does not wait for the disk, as
/// [`tenant_write_unflushed`] (and for the same kind of writes only).
pub(crate) async fn tenant_pipeline_unflushed(
    client: &deadpool_postgres::Object,
    tenant_id: &str,
    statements: &[(&str, Params<'_>)],
) -> Result<Vec<Vec<tokio_postgres::Row>>> {
    one_round_trip(client, "BEGIN", TENANT_UNFLUSHED_SQL, tenant_id, statements).await
}

/// Reads under the tenant's row-level security in one round trip, as [`tenant_read`], all
/// in one snapshot (repeatable read, read only), each statement's rows; plans read a range of
/// a session's rows in index order ([`TENANT_IN_ORDER_SQL`]): for pages of a long session
/// (history).
pub(crate) async fn tenant_snapshot_in_order(
    client: &deadpool_postgres::Object,
    tenant_id: &str,
    statements: &[(&str, Params<'_>)],
) -> Result<Vec<Vec<tokio_postgres::Row>>> {
    one_round_trip(
        client,
        "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
        TENANT_IN_ORDER_SQL,
        tenant_id,
        statements,
    )
    .await
}

async fn one_round_trip(
    client: &deadpool_postgres::Object,
    begin_sql: &str,
    tenant_sql: &str,
    tenant_id: &str,
    statements: &[(&str, Params<'_>)],
) -> Result<Vec<Vec<tokio_postgres::Row>>> {
    // Prepared first (cached per connection): a statement still to be prepared would go
    // out after the `COMMIT`.
    let set = client.prepare_cached(tenant_sql).await?;
    let prepared =
        futures_util::future::try_join_all(statements.iter().map(|(sql, _)| client.prepare_cached(sql))).await?;
    let c: &tokio_postgres::Client = client;
    let queries = futures_util::future::join_all(
        prepared
            .iter()
            .zip(statements)
            .map(|(statement, (_, params))| c.query(statement, params)),
    );
    let (begin, set, results, commit) = futures_util::future::join4(
        c.batch_execute(begin_sql),
        c.execute(&set, &[&APP_ROLE, &tenant_id]),
        queries,
        c.batch_execute("COMMIT"),
    )
    .await;
    begin?;
    set?;
    let results = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    commit?;
    Ok(results)
}

/// [`tenant_read`] of at most one row.
pub(crate) async fn tenant_read_opt(
    client: &deadpool_postgres::Object,
    tenant_id: &str,
    sql: &str,
    params: Params<'_>,
) -> Result<Option<tokio_postgres::Row>> {
    Ok(tenant_read(client, tenant_id, sql, params).await?.into_iter().next())
}

/// Scopes the current transaction to a tenant: `$1` [`APP_ROLE`], `$2` the tenant id.
const TENANT_SQL: &str = "SELECT set_config('role', $1, true), set_config('berth.tenant_id', $2, true)";
/// [`TENANT_SQL`], and no bitmap scan or sort for this transaction's plans: a page of a
/// session's rows (`ORDER BY` position, `LIMIT`) is then read by walking the primary key
/// from the page's start, whatever the planner estimates. Pool connections make generic
/// plans (ARCHITECTURE.md, "Generic plans"), which estimate a session's rows from the
/// table's average: for a long session it chose a bitmap scan of every row after the page's
/// start and a sort, ≈ 35–50 ms a page at 100 000 rows after it instead of ≈ 0.2 ms
/// (docs/performance.md, "Pages of a long session"). A connection plans a statement once,
/// under the settings of its first execution, so every use of a statement must go through
/// the same switch.
pub(crate) const TENANT_IN_ORDER_SQL: &str =
    "SELECT set_config('role', $1, true), set_config('berth.tenant_id', $2, true),
        set_config('enable_bitmapscan', 'off', true), set_config('enable_sort', 'off', true)";
/// [`TENANT_SQL`], and the commit does not wait for the disk.
const TENANT_UNFLUSHED_SQL: &str = "SELECT set_config('role', $1, true), set_config('berth.tenant_id', $2, true),
        set_config('synchronous_commit', 'off', true)";

/// `statements` sent together in an open transaction, in order (each runs after the one
/// before, so a statement reads what an earlier one locked), after the tenant switch
/// `(tenant_sql, tenant_id)` when given: one wait. Each statement's rows come back; an error
/// in any of them fails the whole.
pub(crate) async fn pipelined(
    tx: &impl deadpool_postgres::GenericClient,
    tenant: Option<(&str, &str)>,
    statements: &[(&str, Params<'_>)],
) -> Result<Vec<Vec<tokio_postgres::Row>>> {
    // All prepared first (cached after the first use on a connection), so that they are
    // sent, and run, in this order: the statements run under the tenant.
    let switch = match tenant {
        Some((sql, _)) => Some(tx.prepare_cached(sql).await?),
        None => None,
    };
    let prepared = futures_util::future::try_join_all(statements.iter().map(|(sql, _)| tx.prepare_cached(sql))).await?;
    let tenant_id = tenant.map(|(_, id)| id);
    let tenant_params: [Param; 2] = [&APP_ROLE, &tenant_id];
    let switch = async {
        match &switch {
            Some(s) => tx.execute(s, &tenant_params).await.map(drop),
            None => Ok(()),
        }
    };
    let queries = futures_util::future::try_join_all(
        prepared
            .iter()
            .zip(statements)
            .map(|(statement, (_, params))| tx.query(statement, params)),
    );
    // `biased`: first polled (and so sent) in this order; `try_join_all` of a few polls in
    // order too.
    let (_, results) = tokio::try_join!(biased; switch, queries)?;
    Ok(results)
}

/// A transaction whose `BEGIN` goes out with its first statements rather than waiting for
/// its own answer first, as `client.transaction()` does: one wait less, on paths every turn
/// takes (admission, the claim, `turn.end`). Statements run on [`Begun::client`], in order
/// after the `BEGIN`. Dropped without [`Begun::commit`] (an error, a cancelled caller), it sends
/// `ROLLBACK` before the connection goes back to the pool, as a dropped
/// `tokio_postgres::Transaction` does.
pub(crate) struct Begun<'a> {
    client: &'a deadpool_postgres::Object,
    /// `BEGIN`'s answer, checked at the commit.
    begin: Option<Pending<'a>>,
    done: bool,
}

/// A request sent and not yet answered.
type Pending<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), tokio_postgres::Error>> + Send + 'a>>;

impl<'a> Begun<'a> {
    /// Sends `BEGIN` now, without waiting for its answer.
    pub(crate) fn new(client: &'a deadpool_postgres::Object) -> Begun<'a> {
        let c: &'a tokio_postgres::Client = client;
        let mut begin: Pending<'a> = Box::pin(c.batch_execute("BEGIN"));
        let begin = match send_now(begin.as_mut()) {
            std::task::Poll::Ready(Err(e)) => Some(Box::pin(std::future::ready(Err(e))) as _),
            std::task::Poll::Ready(Ok(())) => None,
            std::task::Poll::Pending => Some(begin),
        };
        Begun {
            client,
            begin,
            done: false,
        }
    }

    /// The connection, inside the transaction.
    pub(crate) fn client(&self) -> &'a deadpool_postgres::Object {
        self.client
    }

    /// Commits (durably unless the transaction set otherwise).
    pub(crate) async fn commit(mut self) -> Result<()> {
        if let Some(begin) = self.begin.take() {
            begin.await?;
        }
        self.client.batch_execute("COMMIT").await?;
        self.done = true;
        Ok(())
    }
}

/// Commit `begun`, if given (without it, the caller's transaction is left open).
pub(crate) async fn commit_if(begun: Option<Begun<'_>>) -> Result<()> {
    match begun {
        Some(b) => b.commit().await,
        None => Ok(()),
    }
}

impl Drop for Begun<'_> {
    fn drop(&mut self) {
        if !self.done {
            // Sent on the first poll; its answer is discarded. A `ROLLBACK` after a `COMMIT`
            // that went out (a commit cancelled while waiting) only draws a warning.
            let c: &tokio_postgres::Client = self.client;
            let mut rollback = std::pin::pin!(c.batch_execute("ROLLBACK"));
            let _ = send_now(rollback.as_mut());
        }
    }
}

/// Polls `f` once: a tokio-postgres request goes out on its first poll.
fn send_now<F: std::future::Future + ?Sized>(f: std::pin::Pin<&mut F>) -> std::task::Poll<F::Output> {
    f.poll(&mut std::task::Context::from_waker(futures_util::task::noop_waker_ref()))
}

/// RFC 3339 with milliseconds, UTC.
pub(crate) fn fmt_time(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

pub(crate) fn not_found<T>() -> Result<T> {
    Err(StoreError::Code(ErrorCode::NotFound))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replica skips only its own dispatch notifications; every other replica kicks the
    /// workspace's connections, as for a payload without a sender.
    #[test]
    fn dispatch_is_skipped_only_by_its_sender() {
        let mine = dispatch_payload("wsp_1", Some("rep_a"));
        assert_eq!(dispatch_target(&mine, "rep_a"), None);
        assert_eq!(dispatch_target(&mine, "rep_b"), Some("wsp_1"));
        let anyone = dispatch_payload("wsp_1", None);
        assert_eq!(anyone, "wsp_1");
        assert_eq!(dispatch_target(&anyone, "rep_a"), Some("wsp_1"));
    }

    /// Connect timeout, TCP user timeout and statement timeout are set unless the URL sets
    /// them itself.
    #[test]
    fn timeouts_are_applied_where_the_url_is_silent() {
        let options = DbOptions::default();
        let c = db_config("host=db user=berth dbname=berth", &options).unwrap();
        assert_eq!(c.get_connect_timeout(), Some(&Duration::from_secs(10)));
        assert_eq!(c.get_tcp_user_timeout(), Some(&Duration::from_secs(30)));
        assert_eq!(
            c.get_options(),
            Some("-c statement_timeout=30000 -c plan_cache_mode=force_generic_plan")
        );

        let c = db_config(
            "postgres://berth@db/berth?connect_timeout=3&tcp_user_timeout=4&options=-c%20statement_timeout%3D5s",
            &options,
        )
        .unwrap();
        assert_eq!(c.get_connect_timeout(), Some(&Duration::from_secs(3)));
        assert_eq!(c.get_tcp_user_timeout(), Some(&Duration::from_secs(4)));
        assert_eq!(
            c.get_options(),
            Some("-c statement_timeout=5s -c plan_cache_mode=force_generic_plan")
        );

        let c = db_config("host=db options='-c search_path=x'", &options).unwrap();
        assert_eq!(
            c.get_options(),
            Some("-c search_path=x -c statement_timeout=30000 -c plan_cache_mode=force_generic_plan")
        );
        let c = db_config("host=db options='-c plan_cache_mode=auto'", &options).unwrap();
        assert_eq!(
            c.get_options(),
            Some("-c plan_cache_mode=auto -c statement_timeout=30000")
        );

        let none = DbOptions {
            statement_timeout: Duration::ZERO,
            ..DbOptions::default()
        };
        assert_eq!(
            db_config("host=db", &none).unwrap().get_options(),
            Some("-c plan_cache_mode=force_generic_plan")
        );
        assert!(db_config("host=db sslmode=verify-full", &options).is_err());
    }

    /// `BERTH_DB_SSLMODE` raises the URL's `sslmode`, never lowers it.
    #[test]
    fn the_ssl_floor_raises_the_urls_mode() {
        use tokio_postgres::config::SslMode;
        let floor = |f: SslFloor| DbOptions {
            ssl_mode_floor: Some(f),
            ..DbOptions::default()
        };
        let mode = |url: &str, o: &DbOptions| db_config(url, o).unwrap().get_ssl_mode();
        assert_eq!(mode("host=db", &DbOptions::default()), SslMode::Prefer);
        assert_eq!(mode("host=db", &floor(SslFloor::Require)), SslMode::Require);
        assert_eq!(
            mode("host=db sslmode=prefer", &floor(SslFloor::Require)),
            SslMode::Require
        );
        assert_eq!(
            mode("host=db sslmode=disable", &floor(SslFloor::Require)),
            SslMode::Require
        );
        assert_eq!(
            mode("host=db sslmode=require", &floor(SslFloor::Disable)),
            SslMode::Require
        );
        assert_eq!(
            mode("host=db sslmode=disable", &floor(SslFloor::Prefer)),
            SslMode::Prefer
        );
        assert!("verify-full".parse::<SslFloor>().is_err());
    }
}
