//! The tenant's MCP servers (SPEC §4.16). The definition is stored whole (header and
//! environment values as given — there is no encryption at rest in Berth; RLS keeps them to
//! the tenant) and read back whole only for the turns the tenant's workers run; clients get
//! [`McpTransport::view`], names without values.

use berth_protocol::{ErrorCode, MAX_MCP_SERVERS, McpServer, McpServerRun, McpTransport, Removed};
use deadpool_postgres::GenericClient;

use crate::{
    Cached, Result, Store, StoreError,
    admin::{Actor, audit},
    fmt_time,
    receipts::{Receipt, finish},
    tenant_tx,
};

const COLUMNS: &str = "name, transport, enabled, created_at, updated_at";

fn transport(r: &tokio_postgres::Row, i: usize) -> Result<McpTransport> {
    // The error's text could quote a value: it is not passed on.
    serde_json::from_value(r.get(i))
        .map_err(|_| StoreError::Other(anyhow::anyhow!("a stored MCP transport is unreadable")))
}

fn server_from(r: &tokio_postgres::Row) -> Result<McpServer> {
    Ok(McpServer {
        name: r.get(0),
        transport: transport(r, 1)?.view(),
        enabled: r.get(2),
        created_at: fmt_time(r.get(3)),
        updated_at: fmt_time(r.get(4)),
    })
}

/// The tenant's enabled MCP servers, by name.
pub(crate) const ENABLED_SERVERS_SQL: &str =
    "SELECT name, transport FROM mcp_servers WHERE tenant_id = $1 AND enabled ORDER BY name";

/// The tenant's enabled servers with their values, for a turn being handed out. A server
/// whose stored transport cannot be read is left out (and logged), not an error:
/// this runs with the `COMMIT` of the turn's hand-out, which must not fail after the
/// commit went through.
pub(crate) async fn enabled_servers(tx: &impl GenericClient, tenant_id: &str) -> Result<Vec<McpServerRun>> {
    let rows = tx.qa(ENABLED_SERVERS_SQL, &[&tenant_id]).await?;
    Ok(rows
        .iter()
        .filter_map(|r| match transport(r, 1) {
            Ok(transport) => Some(McpServerRun {
                name: r.get(0),
                transport,
            }),
            Err(e) => {
                tracing::warn!(mcp.server = %r.get::<_, String>(0), error = %e, "MCP server left out of the turn");
                None
            }
        })
        .collect())
}

impl Store {
    pub async fn list_mcp_servers(&self, tenant_id: &str) -> Result<Vec<McpServer>> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let rows = tx
            .qa(
                &format!("SELECT {COLUMNS} FROM mcp_servers WHERE tenant_id = $1 ORDER BY name"),
                &[&tenant_id],
            )
            .await?;
        rows.iter().map(server_from).collect()
    }

    /// Create the server `name` or replace its definition; a new one past
    /// [`MAX_MCP_SERVERS`] is `bad-params`. Audited as `mcp.save`.
    pub async fn save_mcp_server(
        &self,
        tenant_id: &str,
        name: &str,
        transport: &McpTransport,
        enabled: bool,
        actor: Actor<'_>,
        op: Option<&Receipt>,
    ) -> Result<McpServer> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        // Saves of one tenant take turns, so two new servers cannot both pass the count.
        tx.ex(
            "SELECT pg_advisory_xact_lock(hashtext('berth.mcp_servers'), hashtext($1))",
            &[&tenant_id],
        )
        .await?;
        let others: i64 = tx
            .q1(
                "SELECT count(*) FROM mcp_servers WHERE tenant_id = $1 AND name <> $2",
                &[&tenant_id, &name],
            )
            .await?
            .get(0);
        if others >= MAX_MCP_SERVERS as i64 {
            return Err(StoreError::Code(ErrorCode::BadParams));
        }
        let value = serde_json::to_value(transport).map_err(|e| StoreError::Other(e.into()))?;
        let row = tx
            .q1(
                &format!(
                    "INSERT INTO mcp_servers (tenant_id, name, transport, enabled) VALUES ($1, $2, $3, $4)
                     ON CONFLICT (tenant_id, name) DO UPDATE
                        SET transport = excluded.transport, enabled = excluded.enabled, updated_at = now()
                     RETURNING {COLUMNS}"
                ),
                &[&tenant_id, &name, &value, &enabled],
            )
            .await?;
        let server = server_from(&row)?;
        audit(&tx, tenant_id, actor.0, "mcp.save", name).await?;
        finish(&tx, op, &server).await?;
        tx.commit().await?;
        Ok(server)
    }

    /// Remove the server `name` (idempotent). Audited as `mcp.remove` when it existed.
    pub async fn remove_mcp_server(
        &self,
        tenant_id: &str,
        name: &str,
        actor: Actor<'_>,
        op: Option<&Receipt>,
    ) -> Result<Removed> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let n = tx
            .ex(
                "DELETE FROM mcp_servers WHERE tenant_id = $1 AND name = $2",
                &[&tenant_id, &name],
            )
            .await?;
        if n > 0 {
            audit(&tx, tenant_id, actor.0, "mcp.remove", name).await?;
        }
        let result = Removed { removed: n > 0 };
        finish(&tx, op, &result).await?;
        tx.commit().await?;
        Ok(result)
    }
}
