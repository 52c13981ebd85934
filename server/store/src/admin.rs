//! Tenant administration: credentials and users, audited. Revoking a credential or
//! disabling a user notifies every replica (`berth_revoke`) so that the principal's live
//! connections close at once.

use berth_protocol::{
    AdminStatus, AuditEntry, AuditPage, CredentialView, Disabled, ErrorCode, Revoked, UserView, WorkerView,
};
use deadpool_postgres::GenericClient;

use crate::{
    CHANNEL_REVOKE, Cached, Result, Store, StoreError, fmt_time, not_found,
    receipts::{Receipt, finish},
    tenant_tx, token,
};

/// A principal to cut off: its id, the statement that marks it (`$1` id, `$2` tenant),
/// the audit action and the `berth_revoke` prefix.
struct Target<'a> {
    id: &'a str,
    sql: &'static str,
    action: &'static str,
    notify: &'static str,
    /// The target is a user who may be the tenant's last enabled admin: refused then.
    keeps_an_admin: bool,
}

/// Admin changes of one tenant take turns (`$1` the tenant), so two of them (demotions,
/// disables) cannot both see another admin left.
const LOCK_ADMINS: &str = "SELECT pg_advisory_xact_lock(hashtext('berth.roles:' || $1))";

/// Who did it, for the audit log.
pub struct Actor<'a>(pub &'a str);

/// Who changes a shared definition (an agent, a tenant skill): its owner or a tenant admin
/// may; anyone else is `forbidden`.
pub struct Editor<'a> {
    /// The user (or credential) acting, recorded as a new definition's owner and in the audit log.
    pub actor: &'a str,
    pub admin: bool,
}

/// Lock the definition `id` of `table` (`agents` or `skills`) for a change by `editor`:
/// `Ok(false)` when the tenant has no such definition, `forbidden` when `editor` may not
/// change it.
pub(crate) async fn lock_owned(
    tx: &impl GenericClient,
    table: &'static str,
    tenant_id: &str,
    id: &str,
    editor: &Editor<'_>,
) -> Result<bool> {
    let row = tx
        .qo(
            &format!("SELECT owner FROM {table} WHERE id = $1 AND tenant_id = $2 FOR UPDATE"),
            &[&id, &tenant_id],
        )
        .await?;
    let Some(row) = row else { return Ok(false) };
    let owner: Option<String> = row.get(0);
    if editor.admin || owner.as_deref() == Some(editor.actor) {
        Ok(true)
    } else {
        Err(StoreError::Code(ErrorCode::Forbidden))
    }
}

pub(crate) async fn audit(
    client: &impl GenericClient,
    tenant: &str,
    actor: &str,
    action: &str,
    target: &str,
) -> Result<()> {
    client
        .ex(
            "INSERT INTO audit_log (tenant_id, actor, action, target) VALUES ($1, $2, $3, $4)",
            &[&tenant, &actor, &action, &target],
        )
        .await?;
    Ok(())
}

const CREDENTIAL_SELECT: &str = "SELECT c.id, c.kind, c.user_id, u.email, c.note, c.created_at, c.last_used_at,
        c.expires_at, c.revoked_at FROM credentials c LEFT JOIN users u ON u.id = c.user_id";

fn credential_from(r: &tokio_postgres::Row) -> CredentialView {
    let t = |i| r.get::<_, Option<chrono::DateTime<chrono::Utc>>>(i).map(fmt_time);
    CredentialView {
        credential_id: r.get(0),
        kind: r.get(1),
        user_id: r.get(2),
        user_email: r.get(3),
        note: r.get(4),
        created_at: fmt_time(r.get(5)),
        last_used_at: t(6),
        expires_at: t(7),
        revoked_at: t(8),
        token: None,
    }
}

const USER_SELECT: &str =
    "SELECT id, email, role, disabled_at IS NOT NULL, password_hash IS NOT NULL, created_at FROM users";

fn user_from(r: &tokio_postgres::Row) -> UserView {
    UserView {
        user_id: r.get(0),
        email: r.get(1),
        role: r.get(2),
        disabled: r.get(3),
        has_password: r.get(4),
        created_at: fmt_time(r.get(5)),
    }
}

impl Store {
    /// Create a credential for a user of the tenant (`user_id`) or a worker (None). The
    /// receipt keeps everything but the plaintext.
    pub async fn admin_create_credential(
        &self,
        tenant_id: &str,
        user_id: Option<&str>,
        note: &str,
        expires_at: Option<chrono::DateTime<chrono::Utc>>,
        actor: Actor<'_>,
        op: Option<&Receipt>,
    ) -> Result<CredentialView> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        if let Some(user) = user_id {
            let live = tx
                .qo(
                    "SELECT 1 FROM users WHERE id = $1 AND tenant_id = $2 AND disabled_at IS NULL",
                    &[&user, &tenant_id],
                )
                .await?;
            if live.is_none() {
                return not_found();
            }
        }
        let kind = if user_id.is_some() { "user" } else { "worker" };
        let plaintext = token::generate();
        let id = token::new_id("crd");
        tx.ex(
            "INSERT INTO credentials (id, tenant_id, kind, user_id, sha256, note, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &[&id, &tenant_id, &kind, &user_id, &token::digest(&plaintext), &note, &expires_at],
        )
        .await?;
        audit(&tx, tenant_id, actor.0, "credential.create", &id).await?;
        let row = tx
            .q1(
                &format!("{CREDENTIAL_SELECT} WHERE c.id = $1 AND c.tenant_id = $2"),
                &[&id, &tenant_id],
            )
            .await?;
        let mut view = credential_from(&row);
        finish(&tx, op, &view).await?;
        tx.commit().await?;
        view.token = Some(plaintext);
        Ok(view)
    }

    pub async fn admin_list_credentials(&self, tenant_id: &str) -> Result<Vec<CredentialView>> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let rows = tx
            .qa(
                &format!("{CREDENTIAL_SELECT} WHERE c.tenant_id = $1 ORDER BY c.created_at, c.id"),
                &[&tenant_id],
            )
            .await?;
        Ok(rows.iter().map(credential_from).collect())
    }

    /// Revoke one of the tenant's credentials; another tenant's id is not-found.
    pub async fn admin_revoke_credential(
        &self,
        tenant_id: &str,
        credential_id: &str,
        actor: Actor<'_>,
        op: Option<&Receipt>,
    ) -> Result<Revoked> {
        let sql = "UPDATE credentials SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1 AND tenant_id = $2 RETURNING 1";
        let target = Target {
            id: credential_id,
            sql,
            action: "credential.revoke",
            notify: "cred",
            keeps_an_admin: false,
        };
        self.cut_off(tenant_id, target, actor, op, Revoked { revoked: true })
            .await
    }

    /// Create a user; `password_hash` is an argon2id PHC string (never the password).
    pub async fn admin_create_user(
        &self,
        tenant_id: &str,
        email: &str,
        role: &str,
        password_hash: Option<&str>,
        actor: Actor<'_>,
        op: Option<&Receipt>,
    ) -> Result<UserView> {
        if role != "admin" && role != "member" {
            return Err(StoreError::Code(ErrorCode::BadParams));
        }
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let id = token::new_id("usr");
        let n = tx
            .ex(
                "INSERT INTO users (id, tenant_id, email, role, password_hash) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                &[&id, &tenant_id, &email, &role, &password_hash],
            )
            .await?;
        if n == 0 {
            return Err(StoreError::Code(ErrorCode::Conflict));
        }
        audit(&tx, tenant_id, actor.0, "user.create", &id).await?;
        let row = tx
            .q1(
                &format!("{USER_SELECT} WHERE id = $1 AND tenant_id = $2"),
                &[&id, &tenant_id],
            )
            .await?;
        let view = user_from(&row);
        finish(&tx, op, &view).await?;
        tx.commit().await?;
        Ok(view)
    }

    pub async fn admin_list_users(&self, tenant_id: &str) -> Result<Vec<UserView>> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let rows = tx
            .qa(
                &format!("{USER_SELECT} WHERE tenant_id = $1 ORDER BY created_at, id"),
                &[&tenant_id],
            )
            .await?;
        Ok(rows.iter().map(user_from).collect())
    }

    /// Disable a user: their credentials and tokens stop working and their connections close.
    /// Disabling the tenant's last enabled admin is refused with `conflict`, as demoting them is.
    pub async fn admin_disable_user(
        &self,
        tenant_id: &str,
        user_id: &str,
        actor: Actor<'_>,
        op: Option<&Receipt>,
    ) -> Result<Disabled> {
        let sql =
            "UPDATE users SET disabled_at = coalesce(disabled_at, now()) WHERE id = $1 AND tenant_id = $2 RETURNING 1";
        let target = Target {
            id: user_id,
            sql,
            action: "user.disable",
            notify: "user",
            keeps_an_admin: true,
        };
        self.cut_off(tenant_id, target, actor, op, Disabled { disabled: true })
            .await
    }

    /// Revoke a principal (credential or user) of the tenant: mark it, audit it, and tell
    /// every replica to close its connections. Another tenant's id is not-found.
    async fn cut_off<T: serde::Serialize>(
        &self,
        tenant_id: &str,
        target: Target<'_>,
        actor: Actor<'_>,
        op: Option<&Receipt>,
        result: T,
    ) -> Result<T> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        if target.keeps_an_admin {
            tx.ex(LOCK_ADMINS, &[&tenant_id]).await?;
            let last: bool = tx
                .q1(
                    "SELECT coalesce(bool_or(id = $2), false) AND count(*) = 1 FROM users
                      WHERE tenant_id = $1 AND role = 'admin' AND disabled_at IS NULL",
                    &[&tenant_id, &target.id],
                )
                .await?
                .get(0);
            if last {
                return Err(StoreError::Code(ErrorCode::Conflict));
            }
        }
        if tx.qo(target.sql, &[&target.id, &tenant_id]).await?.is_none() {
            return not_found();
        }
        audit(&tx, tenant_id, actor.0, target.action, target.id).await?;
        tx.ex(
            "SELECT pg_notify($1, $2)",
            &[&CHANNEL_REVOKE, &format!("{}:{}", target.notify, target.id)],
        )
        .await?;
        finish(&tx, op, &result).await?;
        tx.commit().await?;
        Ok(result)
    }

    /// Make a user an `admin` or a `member`. Their live connections close (`berth_revoke`),
    /// so that none keeps acting with the old role; they sign in again with the new one.
    /// Demoting the tenant's last enabled admin is refused with `conflict`.
    pub async fn admin_set_role(
        &self,
        tenant_id: &str,
        user_id: &str,
        role: &str,
        actor: Actor<'_>,
        op: Option<&Receipt>,
    ) -> Result<UserView> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        tx.ex(LOCK_ADMINS, &[&tenant_id]).await?;
        let Some(before) = tx
            .qo(
                "SELECT role FROM users WHERE id = $1 AND tenant_id = $2 FOR UPDATE",
                &[&user_id, &tenant_id],
            )
            .await?
        else {
            return not_found();
        };
        let before: String = before.get(0);
        tx.ex(
            "UPDATE users SET role = $3 WHERE id = $1 AND tenant_id = $2",
            &[&user_id, &tenant_id, &role],
        )
        .await?;
        let row = tx
            .q1(
                &format!("{USER_SELECT} WHERE id = $1 AND tenant_id = $2"),
                &[&user_id, &tenant_id],
            )
            .await?;
        let admins: i64 = tx
            .q1(
                "SELECT count(*) FROM users WHERE tenant_id = $1 AND role = 'admin' AND disabled_at IS NULL",
                &[&tenant_id],
            )
            .await?
            .get(0);
        if admins == 0 {
            return Err(StoreError::Code(ErrorCode::Conflict));
        }
        if before != role {
            audit(&tx, tenant_id, actor.0, "user.role", user_id).await?;
            tx.ex(
                "SELECT pg_notify($1, $2)",
                &[&CHANNEL_REVOKE, &format!("user:{user_id}")],
            )
            .await?;
        }
        let view = user_from(&row);
        finish(&tx, op, &view).await?;
        tx.commit().await?;
        Ok(view)
    }

    /// Record a sign-in attempt on a user of the tenant (`login` or `login.failed`; the user
    /// is both actor and target, and nothing presented is recorded).
    pub async fn audit_login(&self, tenant_id: &str, user_id: &str, succeeded: bool) -> Result<()> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let action = if succeeded { "login" } else { "login.failed" };
        audit(&tx, tenant_id, user_id, action, user_id).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The tenant's audit log, newest first: at most `limit` entries older than `before`.
    pub async fn admin_audit(&self, tenant_id: &str, before: Option<i64>, limit: u32) -> Result<AuditPage> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let limit = i64::from(limit.clamp(1, 200));
        let rows = tx
            .qa(
                "SELECT id, at, actor, action, target FROM audit_log
                 WHERE tenant_id = $1 AND ($2::bigint IS NULL OR id < $2)
                 ORDER BY id DESC LIMIT $3",
                &[&tenant_id, &before, &(limit + 1)],
            )
            .await?;
        let more = rows.len() as i64 > limit;
        let entries: Vec<AuditEntry> = rows
            .iter()
            .take(limit as usize)
            .map(|r| AuditEntry {
                audit_id: r.get(0),
                at: fmt_time(r.get(1)),
                actor: r.get(2),
                action: r.get(3),
                target: r.get(4),
            })
            .collect();
        let next_before = more.then(|| entries.last().map(|e| e.audit_id)).flatten();
        Ok(AuditPage { entries, next_before })
    }

    /// The tenant's worker credentials, each with its newest live connection (presence rows
    /// that still count: heartbeat within 45 s) and the workspaces of its host.
    pub async fn admin_workers(&self, tenant_id: &str) -> Result<Vec<WorkerView>> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let rows = tx
            .qa(
                "SELECT c.id, c.note, c.host, p.replica_id, p.connected_at,
                        coalesce(p.heartbeat_at, c.last_used_at), c.revoked_at,
                        coalesce((SELECT array_agg(w.id ORDER BY w.id) FROM workspaces w
                                  WHERE w.tenant_id = c.tenant_id AND w.host = c.host), '{}')
                 FROM credentials c
                 LEFT JOIN LATERAL (
                     SELECT replica_id, connected_at, heartbeat_at FROM worker_presence wp
                     WHERE wp.tenant_id = c.tenant_id AND wp.credential_id = c.id
                       AND wp.heartbeat_at > now() - interval '45 seconds'
                     ORDER BY wp.heartbeat_at DESC LIMIT 1) p ON true
                 WHERE c.tenant_id = $1 AND c.kind = 'worker'
                 ORDER BY c.created_at, c.id",
                &[&tenant_id],
            )
            .await?;
        let t = |r: &tokio_postgres::Row, i| r.get::<_, Option<chrono::DateTime<chrono::Utc>>>(i).map(fmt_time);
        Ok(rows
            .iter()
            .map(|r| {
                let replica_id: Option<String> = r.get(3);
                WorkerView {
                    credential_id: r.get(0),
                    note: r.get(1),
                    host: r.get(2),
                    online: replica_id.is_some(),
                    replica_id,
                    connected_at: t(r, 4),
                    last_seen_at: t(r, 5),
                    revoked_at: t(r, 6),
                    workspace_ids: r.get(7),
                }
            })
            .collect())
    }

    /// Set (or replace) a user's password hash (CLI).
    pub async fn set_password(
        &self,
        tenant_id: &str,
        email: &str,
        password_hash: &str,
        actor: Actor<'_>,
    ) -> Result<()> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let row = tx
            .qo(
                "UPDATE users SET password_hash = $3 WHERE tenant_id = $1 AND email = $2 RETURNING id",
                &[&tenant_id, &email, &password_hash],
            )
            .await?;
        let Some(row) = row else { return not_found() };
        let id: String = row.get(0);
        audit(&tx, tenant_id, actor.0, "user.password", &id).await?;
        tx.commit().await?;
        Ok(())
    }

    /// What `admin.status` reports for the tenant.
    pub async fn admin_status(&self, tenant_id: &str, replica_id: &str) -> Result<AdminStatus> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let row = tx
            .q1(
                "SELECT (SELECT count(*) FROM worker_presence WHERE tenant_id = $1 AND heartbeat_at > now() - interval '45 seconds'),
                        (SELECT count(*) FROM turns WHERE tenant_id = $1 AND state = 'running'),
                        (SELECT count(*) FROM turns WHERE tenant_id = $1 AND state = 'queued'),
                        (SELECT coalesce(array_agg(DISTINCT replica_id), '{}') FROM worker_presence WHERE tenant_id = $1)",
                &[&tenant_id],
            )
            .await?;
        let mut replicas: Vec<String> = row.get(3);
        if !replicas.iter().any(|r| r == replica_id) {
            replicas.push(replica_id.to_string());
        }
        replicas.sort();
        Ok(AdminStatus {
            replica_id: replica_id.to_string(),
            replicas,
            connected_workers: row.get(0),
            running_turns: row.get(1),
            queue_depth: row.get(2),
        })
    }
}
