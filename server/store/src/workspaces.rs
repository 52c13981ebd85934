//! Workspaces and worker presence.

use berth_protocol::{Workspace, worker::WorkspaceDecl};

use crate::{Cached, Principal, Result, Store, fmt_time, not_found, tenant_tx, token};

/// How long a presence row counts as live without a heartbeat.
pub(crate) const PRESENCE_TTL: &str = "45 seconds";

/// `conflict` while a live connection of `worker`'s credential other than `connection_id`
/// belongs to another worker process than `instance`; takes a lock on the credential for the
/// rest of the transaction, so two hellos cannot both pass.
async fn another_process_live(
    tx: &impl deadpool_postgres::GenericClient,
    worker: &Principal,
    connection_id: &str,
    instance: Option<&str>,
) -> Result<()> {
    let other = tx
        .qo(
            &format!(
                "SELECT 1 FROM (SELECT pg_advisory_xact_lock(hashtextextended($2, 7))) l, worker_presence
                  WHERE tenant_id = $1 AND credential_id = $2 AND connection_id <> $3
                    AND instance IS DISTINCT FROM $4 AND heartbeat_at > now() - interval '{PRESENCE_TTL}'
                  LIMIT 1"
            ),
            &[&worker.tenant_id, &worker.credential_id, &connection_id, &instance],
        )
        .await?;
    match other {
        Some(_) => Err(crate::StoreError::Code(berth_protocol::ErrorCode::Conflict)),
        None => Ok(()),
    }
}

impl Store {
    /// `conflict` while another worker process's connection of this credential is live (see
    /// [`Store::presence_insert`], which checks again as it records the connection).
    pub async fn check_worker_process(&self, worker: &Principal, instance: Option<&str>) -> Result<()> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, &worker.tenant_id).await?;
        another_process_live(&tx, worker, "", instance).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Bind a worker credential to the host it serves (on its first hello). Refused with
    /// `forbidden` when the credential is bound to another host, or another live worker
    /// credential of the tenant serves this host.
    pub async fn bind_worker_host(&self, worker: &Principal, host: &str) -> Result<()> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, &worker.tenant_id).await?;
        let bound = tx
            .qo(
                "UPDATE credentials SET host = coalesce(host, $3) WHERE id = $1 AND tenant_id = $2 AND kind = 'worker'
                 RETURNING host",
                &[&worker.credential_id, &worker.tenant_id, &host],
            )
            .await;
        let bound: Option<String> = match bound {
            Ok(row) => row.and_then(|r| r.get(0)),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
                return Err(crate::StoreError::Code(berth_protocol::ErrorCode::Forbidden));
            }
            Err(e) => return Err(e.into()),
        };
        if bound.as_deref() != Some(host) {
            return Err(crate::StoreError::Code(berth_protocol::ErrorCode::Forbidden));
        }
        tx.commit().await?;
        Ok(())
    }

    /// Upsert the worker's workspaces by (tenant, host, name); returns their ids in order.
    /// Moving a workspace's directory keeps its identity (and its sessions).
    pub async fn register_workspaces(
        &self,
        worker: &Principal,
        host: &str,
        decls: &[WorkspaceDecl],
    ) -> Result<Vec<String>> {
        let mut client = self.pool.get().await?;
        let client = tenant_tx(&mut client, &worker.tenant_id).await?;
        let mut ids = Vec::with_capacity(decls.len());
        for decl in decls {
            let row = client
                .q1(
                    "INSERT INTO workspaces (id, tenant_id, host, name, path, title, last_seen_at)
                     VALUES ($1, $2, $3, $4, $5, $4, now())
                     ON CONFLICT (tenant_id, host, name) DO UPDATE SET path = EXCLUDED.path, last_seen_at = now()
                     RETURNING id",
                    &[&token::new_id("wsp"), &worker.tenant_id, &host, &decl.name, &decl.path],
                )
                .await?;
            ids.push(row.get(0));
        }
        client.commit().await?;
        Ok(ids)
    }

    /// Record a live worker connection held by `replica_id`, of the worker process
    /// `instance`. `conflict` while a live connection of the same credential belongs to
    /// another process (checked and inserted under a lock on the credential).
    pub async fn presence_insert(
        &self,
        connection_id: &str,
        worker: &Principal,
        replica_id: &str,
        workspace_ids: &[String],
        instance: Option<&str>,
    ) -> Result<()> {
        let mut client = self.pool.get().await?;
        let client = tenant_tx(&mut client, &worker.tenant_id).await?;
        another_process_live(&client, worker, connection_id, instance).await?;
        client
            .ex(
                "INSERT INTO worker_presence (connection_id, tenant_id, credential_id, replica_id, workspace_ids, instance)
                 VALUES ($1, $2, $3, $4, $5, $6)",
                &[
                    &connection_id,
                    &worker.tenant_id,
                    &worker.credential_id,
                    &replica_id,
                    &workspace_ids,
                    &instance,
                ],
            )
            .await?;
        client.commit().await?;
        Ok(())
    }

    /// Keep a worker connection's presence (and its workspaces' last-seen time) fresh.
    /// Returns whether the presence row still existed.
    pub async fn presence_heartbeat(&self, connection_id: &str) -> Result<bool> {
        let client = self.pool.get().await?;
        let row = client
            .q1(
                "WITH p AS (UPDATE worker_presence SET heartbeat_at = now() WHERE connection_id = $1 RETURNING tenant_id, workspace_ids),
                      w AS (UPDATE workspaces w SET last_seen_at = now() FROM p
                             WHERE w.tenant_id = p.tenant_id AND w.id = ANY(p.workspace_ids) RETURNING 1)
                 SELECT EXISTS (SELECT 1 FROM p)",
                &[&connection_id],
            )
            .await?;
        // False: the row is gone (swept while this replica stalled); the caller re-inserts it.
        Ok(row.get(0))
    }

    /// Forget a worker connection.
    pub async fn presence_remove(&self, connection_id: &str) -> Result<()> {
        let client = self.pool.get().await?;
        client
            .ex(
                "DELETE FROM worker_presence WHERE connection_id = $1",
                &[&connection_id],
            )
            .await?;
        Ok(())
    }

    /// The tenant's workspaces, by title.
    pub async fn list_workspaces(&self, tenant_id: &str) -> Result<Vec<Workspace>> {
        let mut client = self.pool.get().await?;
        let client = tenant_tx(&mut client, tenant_id).await?;
        let rows = client
            .qa(
                &format!("{WORKSPACE_SELECT} WHERE w.tenant_id = $1 ORDER BY w.title, w.id"),
                &[&tenant_id],
            )
            .await?;
        Ok(rows.iter().map(workspace_from_row).collect())
    }

    /// One workspace of the tenant.
    pub async fn get_workspace(&self, tenant_id: &str, workspace_id: &str) -> Result<Workspace> {
        let mut client = self.pool.get().await?;
        let client = tenant_tx(&mut client, tenant_id).await?;
        let row = client
            .qo(
                &format!("{WORKSPACE_SELECT} WHERE w.tenant_id = $1 AND w.id = $2"),
                &[&tenant_id, &workspace_id],
            )
            .await?;
        match row {
            Some(r) => Ok(workspace_from_row(&r)),
            None => not_found(),
        }
    }
}

pub(crate) const WORKSPACE_SELECT: &str = "SELECT w.id, w.title, w.host, w.path, w.last_seen_at,
    EXISTS (SELECT 1 FROM worker_presence p WHERE w.id = ANY(p.workspace_ids) AND p.tenant_id = w.tenant_id
            AND p.heartbeat_at > now() - interval '45 seconds') AS online
    FROM workspaces w";

/// SQL: whether workspace `$n` has a live worker (for use inside other statements).
pub(crate) fn online_sql(workspace_expr: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM worker_presence p WHERE {workspace_expr} = ANY(p.workspace_ids)
                 AND p.heartbeat_at > now() - interval '{PRESENCE_TTL}')"
    )
}

pub(crate) fn workspace_from_row(r: &tokio_postgres::Row) -> Workspace {
    Workspace {
        workspace_id: r.get(0),
        title: r.get(1),
        host: r.get(2),
        path: r.get(3),
        last_seen_at: r.get::<_, Option<chrono::DateTime<chrono::Utc>>>(4).map(fmt_time),
        online: r.get(5),
    }
}
