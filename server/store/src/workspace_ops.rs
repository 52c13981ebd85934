//! Renaming and removing workspaces.

use berth_protocol::{Removed, Workspace};

use crate::{
    Cached, Receipt, Result, Store, not_found,
    receipts::finish,
    tenant_tx,
    workspaces::{WORKSPACE_SELECT, workspace_from_row},
};

impl Store {
    /// Set a workspace's title.
    pub async fn rename_workspace(
        &self,
        tenant_id: &str,
        workspace_id: &str,
        title: &str,
        op: Option<&Receipt>,
    ) -> Result<Workspace> {
        {
            let mut client = self.pool.get().await?;
            let tx = tenant_tx(&mut client, tenant_id).await?;
            let n = tx
                .ex(
                    "UPDATE workspaces SET title = $3 WHERE id = $1 AND tenant_id = $2",
                    &[&workspace_id, &tenant_id, &title],
                )
                .await?;
            if n == 0 {
                return not_found();
            }
            let row = tx
                .q1(
                    &format!("{WORKSPACE_SELECT} WHERE w.tenant_id = $1 AND w.id = $2"),
                    &[&tenant_id, &workspace_id],
                )
                .await?;
            let ws = workspace_from_row(&row);
            finish(&tx, op, &ws).await?;
            tx.commit().await?;
            Ok(ws)
        }
    }

    /// Remove a workspace with its sessions (their running turns are stopped first, as by
    /// `session.remove`). Idempotent: `{removed: false}` when it does not exist.
    pub async fn remove_workspace(&self, tenant_id: &str, workspace_id: &str, op: Option<&Receipt>) -> Result<Removed> {
        let sessions: Vec<String> = {
            let mut client = self.pool.get().await?;
            let tx = tenant_tx(&mut client, tenant_id).await?;
            let rows = tx
                .qa(
                    "SELECT id FROM sessions WHERE workspace_id = $1 AND tenant_id = $2 AND removed_at IS NULL",
                    &[&workspace_id, &tenant_id],
                )
                .await?;
            tx.commit().await?;
            rows.iter().map(|r| r.get(0)).collect()
        };
        // Each session the way `session.remove` does it (turns stopped, watchers told);
        // a retry after a failure part-way finds the rest.
        for session in &sessions {
            self.remove_session(tenant_id, session, None).await?;
        }
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        // Sessions, their events, rows and turns go with the workspace (ON DELETE CASCADE).
        let n = tx
            .ex(
                "DELETE FROM workspaces WHERE id = $1 AND tenant_id = $2",
                &[&workspace_id, &tenant_id],
            )
            .await?;
        let result = Removed { removed: n > 0 };
        finish(&tx, op, &result).await?;
        tx.commit().await?;
        Ok(result)
    }
}
