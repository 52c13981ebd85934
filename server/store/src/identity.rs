//! Tenants, users and credentials.

use anyhow::anyhow;

use crate::{
    APP_ROLE, Cached, ProxyTurn, Result, Store, StoreError, admin::audit, tenant_tx, token, workspaces::PRESENCE_TTL,
};
use berth_protocol::ErrorCode;

/// What kind of principal a credential authenticates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialKind {
    User,
    Worker,
}

impl CredentialKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CredentialKind::User => "user",
            CredentialKind::Worker => "worker",
        }
    }
}

/// What a sign-in's tenant and e-mail name (`Store::login_lookup`).
#[derive(Debug, Clone)]
pub struct LoginFound {
    pub tenant_id: String,
    /// The enabled user with that e-mail: (user id, role, password hash).
    pub user: Option<(String, String, Option<String>)>,
}

/// An authenticated caller. Everything it does is scoped to `tenant_id`.
#[derive(Debug, Clone)]
pub struct Principal {
    pub tenant_id: String,
    pub credential_id: String,
    pub kind: CredentialKind,
    pub user_id: Option<String>,
    /// `admin` or `member` for users; `worker` for workers.
    pub role: String,
    /// When the credential or login token stops being valid (connections close then).
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl Store {
    /// Resolve a credential to its principal. A malformed token (bad checksum) is rejected
    /// without touching the database.
    pub async fn authenticate(&self, presented: &str) -> Result<Option<Principal>> {
        if !token::well_formed(presented) {
            return Ok(None);
        }
        let digest = token::digest(presented);
        let client = self.pool.get().await?;
        // last-used is advisory: written at most once a minute, by the look-up itself.
        let find = client.prepare_cached(FIND_TOUCH_SQL).await?;
        let row = client.query_opt(&find, &[&digest]).await?;
        Ok(principal(row, &digest))
    }

    /// For the model proxy, before every model request: [`Store::authenticate`] and the
    /// turn's check (the model, provider profile and endpoint `turn_id` was dispatched with)
    /// in one round trip. `BEGIN`, the look-up with its touch and the switch to the
    /// credential's tenant ([`FIND_TOUCH_SWITCH_SQL`]), the turn's check under row-level
    /// security and `COMMIT` go out together. None: not authenticated; else the principal
    /// and the turn, if it runs and was handed to a live connection of this worker
    /// credential.
    pub async fn authenticate_for_turn(
        &self,
        presented: &str,
        turn_id: &str,
    ) -> Result<Option<(Principal, Option<ProxyTurn>)>> {
        if !token::well_formed(presented) {
            return Ok(None);
        }
        let digest = token::digest(presented);
        let client = self.pool.get().await?;
        // The turn by primary key: `(…) IS TRUE` matches no partial index on running turns
        // (see `turns::running_turn_sql`).
        let turn_sql = format!(
            "SELECT t.model, t.provider, t.base_url, t.session_id FROM turns t
               JOIN worker_presence p ON p.connection_id = t.dispatched_to
               JOIN credentials c ON c.id = p.credential_id
              WHERE t.id = $1 AND c.sha256 = $2 AND c.kind = 'worker' AND t.tenant_id = c.tenant_id
                AND p.tenant_id = c.tenant_id AND (t.state = 'running') IS TRUE
                AND p.heartbeat_at > now() - interval '{PRESENCE_TTL}'"
        );
        // Prepared first (cached per connection): a statement still to be prepared would go
        // out after the `COMMIT`.
        let (check, turn) = tokio::try_join!(
            client.prepare_cached(FIND_TOUCH_SWITCH_SQL),
            client.prepare_cached(&turn_sql),
        )?;
        let c: &tokio_postgres::Client = &client;
        // `biased`: polled, so sent, in this order, all on the first poll (a caller dropped
        // mid-way still leaves the connection outside any transaction).
        let check_params: [crate::Param; 2] = [&digest, &APP_ROLE];
        let turn_params: [crate::Param; 2] = [&turn_id, &digest];
        let (begin, row, turn, commit) = tokio::join!(
            biased;
            c.batch_execute("BEGIN"),
            c.query_one(&check, &check_params),
            c.query_opt(&turn, &turn_params),
            c.batch_execute("COMMIT"),
        );
        begin?;
        let row = row?;
        let turn = turn?;
        commit?;
        // No valid credential: its columns are null.
        let row = row.get::<_, Option<String>>(0).map(|_| row);
        let Some(principal) = principal(row, &digest) else {
            return Ok(None);
        };
        Ok(Some((
            principal,
            turn.map(|r| ProxyTurn {
                model: r.get(0),
                provider: r.get(1),
                base_url: r.get(2),
                session_id: r.get(3),
            }),
        )))
    }

    /// The principal of a signed-in user (JWT), if the user exists and is not disabled.
    /// The role comes from the database, not from the token.
    pub async fn user_principal(
        &self,
        tenant_id: &str,
        user_id: &str,
        session: &str,
        expires_at: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<Option<Principal>> {
        let client = self.pool.get().await?;
        let row = client
            .qo(
                "SELECT role FROM users WHERE id = $1 AND tenant_id = $2 AND disabled_at IS NULL",
                &[&user_id, &tenant_id],
            )
            .await?;
        Ok(row.map(|r| Principal {
            tenant_id: tenant_id.to_string(),
            credential_id: session.to_string(),
            kind: CredentialKind::User,
            user_id: Some(user_id.to_string()),
            role: r.get(0),
            expires_at,
        }))
    }

    /// Of these credentials and users, the ones no longer valid: credentials revoked or
    /// expired, users disabled (system: across tenants, for revalidating live connections).
    pub async fn invalid_principals(
        &self,
        credential_ids: &[String],
        user_ids: &[String],
    ) -> Result<(Vec<String>, Vec<String>)> {
        let client = self.pool.get().await?;
        let creds = client
            .qa(
                "SELECT id FROM credentials WHERE id = ANY($1)
                    AND (revoked_at IS NOT NULL OR (expires_at IS NOT NULL AND expires_at <= now()))",
                &[&credential_ids],
            )
            .await?;
        let users = client
            .qa(
                "SELECT id FROM users WHERE id = ANY($1) AND disabled_at IS NOT NULL",
                &[&user_ids],
            )
            .await?;
        Ok((
            creds.iter().map(|r| r.get(0)).collect(),
            users.iter().map(|r| r.get(0)).collect(),
        ))
    }

    /// For login, by tenant name or id and e-mail: the tenant's id, when a tenant has that
    /// name or id, and its enabled user with that e-mail as (user id, role, password hash).
    pub async fn login_lookup(&self, tenant: &str, email: &str) -> Result<Option<LoginFound>> {
        let client = self.pool.get().await?;
        let row = client
            .qo(
                "SELECT t.id, u.id, u.role, u.password_hash FROM tenants t
                   LEFT JOIN users u ON u.tenant_id = t.id AND lower(u.email) = lower($2) AND u.disabled_at IS NULL
                  WHERE t.name = $1 OR t.id = $1
                  ORDER BY u.id IS NULL, t.id = $1 DESC LIMIT 1",
                &[&tenant, &email],
            )
            .await?;
        Ok(row.map(|r| LoginFound {
            tenant_id: r.get(0),
            user: r.get::<_, Option<String>>(1).map(|user| (user, r.get(2), r.get(3))),
        }))
    }

    /// Take one sign-in attempt from the account's bucket, shared by every replica
    /// (`login_buckets`): `capacity` attempts at once, then one every `refill`. `Err(wait)`
    /// when it is empty, with how long until it has one again.
    pub async fn login_take(
        &self,
        key: &[u8; 32],
        capacity: u32,
        refill: std::time::Duration,
    ) -> Result<std::result::Result<(), std::time::Duration>> {
        let client = self.pool.get().await?;
        let refill = refill.as_secs_f64();
        let burst = refill * f64::from(capacity.max(1));
        // In one statement, so two replicas taking at once each see the other's take (the
        // upsert locks the row); the outer read sees the bucket as it was before.
        let row = client
            .q1(
                "WITH taken AS (
                    INSERT INTO login_buckets AS b (key, full_at) VALUES ($1, now() + make_interval(secs => $2))
                    ON CONFLICT (key) DO UPDATE SET full_at = greatest(b.full_at, now()) + make_interval(secs => $2)
                     WHERE greatest(b.full_at, now()) + make_interval(secs => $2) <= now() + make_interval(secs => $3)
                    RETURNING 1)
                 SELECT EXISTS (SELECT 1 FROM taken),
                        (SELECT extract(epoch FROM full_at - now())::float8 FROM login_buckets WHERE key = $1)",
                &[&key.as_slice(), &refill, &burst],
            )
            .await?;
        if row.get(0) {
            return Ok(Ok(()));
        }
        let until_full: f64 = row.get::<_, Option<f64>>(1).unwrap_or(0.0);
        let wait = (until_full + refill - burst).max(0.0);
        Ok(Err(std::time::Duration::from_secs_f64(wait)))
    }

    /// Forget the account's sign-in bucket (after a sign-in succeeded).
    pub async fn login_forget(&self, key: &[u8; 32]) -> Result<()> {
        let client = self.pool.get().await?;
        client
            .ex("DELETE FROM login_buckets WHERE key = $1", &[&key.as_slice()])
            .await?;
        Ok(())
    }

    /// Delete the sign-in buckets that are full again (they mean the same as none).
    pub async fn login_buckets_cleanup(&self) -> Result<u64> {
        let client = self.pool.get().await?;
        Ok(client
            .ex("DELETE FROM login_buckets WHERE full_at < now()", &[])
            .await?)
    }

    /// First start: create the `default` tenant, an admin user and its credential. Returns
    /// the credential's plaintext when this call created it (exactly once per database).
    pub async fn bootstrap(&self) -> Result<Option<String>> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        tx.ex("SELECT pg_advisory_xact_lock(7305)", &[]).await?;
        let any: bool = tx.q1("SELECT EXISTS (SELECT 1 FROM tenants)", &[]).await?.get(0);
        if any {
            return Ok(None);
        }
        let tenant = token::new_id("ten");
        tx.ex("INSERT INTO tenants (id, name) VALUES ($1, 'default')", &[&tenant])
            .await?;
        let user = token::new_id("usr");
        tx.ex(
            "INSERT INTO users (id, tenant_id, email, role) VALUES ($1, $2, 'admin@localhost', 'admin')",
            &[&user, &tenant],
        )
        .await?;
        let plaintext = token::generate();
        let cred = token::new_id("crd");
        tx.ex(
            "INSERT INTO credentials (id, tenant_id, kind, user_id, sha256, note) VALUES ($1, $2, 'user', $3, $4, 'bootstrap')",
            &[&cred, &tenant, &user, &token::digest(&plaintext)],
        )
        .await?;
        audit(&tx, &tenant, "bootstrap", "tenant.create", &tenant).await?;
        tx.commit().await?;
        Ok(Some(plaintext))
    }

    /// Create a tenant by name; returns its id.
    pub async fn create_tenant(&self, name: &str) -> Result<String> {
        let client = self.pool.get().await?;
        let id = token::new_id("ten");
        let n = client
            .ex(
                "INSERT INTO tenants (id, name) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
                &[&id, &name],
            )
            .await?;
        if n == 0 {
            return Err(StoreError::Other(anyhow!("a tenant named {name:?} exists already")));
        }
        audit(&client, &id, "cli", "tenant.create", &id).await?;
        Ok(id)
    }

    /// The id of a tenant given its name or id.
    pub async fn tenant_id(&self, name_or_id: &str) -> Result<String> {
        let client = self.pool.get().await?;
        let row = client
            .qo("SELECT id FROM tenants WHERE name = $1 OR id = $1", &[&name_or_id])
            .await?;
        row.map(|r| r.get(0)).ok_or(StoreError::Code(ErrorCode::NotFound))
    }

    /// The id of one of the tenant's users, by email (case-insensitive).
    pub async fn user_id_by_email(&self, tenant_id: &str, email: &str) -> Result<String> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let row = tx
            .qo(
                "SELECT id FROM users WHERE tenant_id = $1 AND lower(email) = lower($2)",
                &[&tenant_id, &email],
            )
            .await?;
        row.map(|r| r.get(0)).ok_or(StoreError::Code(ErrorCode::NotFound))
    }

    /// A user's email (None: no such user in the tenant).
    pub async fn user_email(&self, tenant_id: &str, user_id: &str) -> Result<Option<String>> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let row = tx
            .qo(
                "SELECT email FROM users WHERE tenant_id = $1 AND id = $2",
                &[&tenant_id, &user_id],
            )
            .await?;
        Ok(row.map(|r| r.get(0)))
    }

    /// The tenant a credential belongs to (break-glass revocation by id from the CLI).
    pub async fn credential_tenant(&self, credential_id: &str) -> Result<String> {
        let client = self.pool.get().await?;
        let row = client
            .qo("SELECT tenant_id FROM credentials WHERE id = $1", &[&credential_id])
            .await?;
        row.map(|r| r.get(0)).ok_or(StoreError::Code(ErrorCode::NotFound))
    }
}

/// A live credential (not revoked, not expired, its user not disabled) by its SHA-256
/// (`$1`), with its user's role, as `c`; and its last use recorded, at most once a minute.
macro_rules! find_touch_sql {
    () => {
        "WITH c AS (SELECT c.id, c.tenant_id, c.kind, c.user_id, u.role, c.sha256, c.expires_at
                      FROM credentials c LEFT JOIN users u ON u.id = c.user_id
                     WHERE c.sha256 = $1 AND c.revoked_at IS NULL
                       AND (c.expires_at IS NULL OR c.expires_at > now())
                       AND (u.id IS NULL OR u.disabled_at IS NULL)),
              touched AS (UPDATE credentials x SET last_used_at = now() FROM c
                           WHERE x.id = c.id AND (x.last_used_at IS NULL OR x.last_used_at < now() - interval '1 minute'))"
    };
}

/// [`find_touch_sql`]'s credential, if any.
const FIND_TOUCH_SQL: &str = concat!(find_touch_sql!(), " SELECT * FROM c");

/// For the model proxy: [`FIND_TOUCH_SQL`] (`$1`) and the switch of the current transaction
/// to the found credential's tenant and then to role `$2` (as `TENANT_SQL` does), in one
/// statement. Always one row: the credential's columns as [`FIND_TOUCH_SQL`]'s, null when no
/// valid credential has that hash; the switch happens either way (to no tenant then), so what
/// follows runs under row-level security. The look-up and the touch run as the statement's
/// own role: a role set by `set_config` applies from the next statement on.
const FIND_TOUCH_SWITCH_SQL: &str = concat!(
    find_touch_sql!(),
    " SELECT c.id, c.tenant_id, c.kind, c.user_id, c.role, c.sha256, c.expires_at,
             set_config('berth.tenant_id', coalesce(c.tenant_id, ''), true), set_config('role', $2, true)
        FROM (SELECT) one LEFT JOIN c ON true"
);

/// The principal of a [`FIND_TOUCH_SQL`] row, if its stored hash is `digest`.
fn principal(row: Option<tokio_postgres::Row>, digest: &[u8]) -> Option<Principal> {
    let row = row?;
    // The index found it by hash; compare the stored hash in constant time anyway.
    let stored: Vec<u8> = row.get(5);
    if !bool::from(subtle::ConstantTimeEq::ct_eq(stored.as_slice(), digest)) {
        return None;
    }
    let kind: String = row.get(2);
    let kind = if kind == "worker" {
        CredentialKind::Worker
    } else {
        CredentialKind::User
    };
    Some(Principal {
        tenant_id: row.get(1),
        credential_id: row.get(0),
        kind,
        user_id: row.get(3),
        role: row.get::<_, Option<String>>(4).unwrap_or_else(|| "worker".into()),
        expires_at: row.get(6),
    })
}
