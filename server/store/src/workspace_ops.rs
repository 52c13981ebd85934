//! Renaming and removing workspaces.

use berth_protocol::{ErrorCode, Removed, Workspace};
use deadpool_postgres::GenericClient;

use crate::{
    Cached, Receipt, Result, Store, StoreError,
    admin::{Actor, audit},
    not_found,
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
    /// `session.remove`). Idempotent: `{removed: false}` when it does not exist. Also returns
    /// the object keys of the attachments and patches its sessions owned, whose rows are
    /// deleted in the same transaction: the caller deletes those blobs after the rows (a
    /// fork stays in its source's workspace, so nothing outside it names them).
    pub async fn remove_workspace(
        &self,
        tenant_id: &str,
        workspace_id: &str,
        actor: &Actor<'_>,
        op: Option<&Receipt>,
    ) -> Result<(Removed, Vec<String>)> {
        // The sessions still live, read with the workspace locked (see below): the first
        // time, all of them.
        let mut sessions: Vec<String> = Vec::new();
        for _ in 0..5 {
            // Each session the way `session.remove` does it (turns stopped, watchers told);
            // a retry after a failure part-way finds the rest.
            for session in &sessions {
                self.remove_session(tenant_id, session, actor, None).await?;
            }
            let mut client = self.pool.get().await?;
            let tx = tenant_tx(&mut client, tenant_id).await?;
            // The workspace first: no session can be created in it from here on (its insert's
            // key check waits).
            tx.qa(
                "SELECT 1 FROM workspaces WHERE id = $1 AND tenant_id = $2 FOR UPDATE",
                &[&workspace_id, &tenant_id],
            )
            .await?;
            // Any session still live (one created since the last look, before that lock) is
            // removed like the others first, not deleted unseen with the workspace: the lock
            // is given up meanwhile, as `session.remove` locks a coordinator first.
            let live = tx
                .qa(
                    "SELECT id FROM sessions WHERE workspace_id = $1 AND tenant_id = $2 AND removed_at IS NULL",
                    &[&workspace_id, &tenant_id],
                )
                .await?;
            if !live.is_empty() {
                sessions = live.iter().map(|r| r.get(0)).collect();
                continue;
            }
            let (result, keys) = delete_workspace(&tx, tenant_id, workspace_id).await?;
            if result.removed {
                audit(&tx, tenant_id, actor.0, "workspace.remove", workspace_id).await?;
            }
            finish(&tx, op, &result).await?;
            tx.commit().await?;
            return Ok((result, keys));
        }
        // Sessions keep being created in it: the caller may try again.
        Err(StoreError::Code(ErrorCode::Unavailable))
    }
}

/// Delete workspace `workspace_id`, locked by the caller's transaction `tx` with no live
/// session left in it, with everything its sessions owned; returns whether it existed and
/// the object keys of its attachments and patches.
async fn delete_workspace(
    tx: &impl GenericClient,
    tenant_id: &str,
    workspace_id: &str,
) -> Result<(Removed, Vec<String>)> {
    // Its (removed) sessions locked: an append to one, which bumps the session's sequence,
    // either committed before or finds the session gone, so nothing is written into the
    // workspace between the deletes below.
    tx.qa(
        "SELECT 1 FROM sessions WHERE workspace_id = $1 AND tenant_id = $2 ORDER BY id FOR UPDATE",
        &[&workspace_id, &tenant_id],
    )
    .await?;
    // An attachment is named by id anywhere in the tenant: one its sessions uploaded that a
    // live session elsewhere sent with a prompt moves to that session (the earliest such
    // turn's) and stays, with its bytes, rather than going with this workspace.
    tx.ex(
        "UPDATE attachments a SET session_id = keep.session_id
           FROM (SELECT DISTINCT ON (x.id) x.id, t.session_id
                   FROM attachments x
                   JOIN sessions own ON own.id = x.session_id AND own.workspace_id = $1 AND own.tenant_id = $2
                   JOIN turns t ON t.tenant_id = $2 AND x.id = ANY(t.attachment_ids)
                   JOIN sessions s ON s.id = t.session_id AND s.workspace_id <> $1 AND s.removed_at IS NULL
                  WHERE x.tenant_id = $2
                  ORDER BY x.id, t.created_at) keep
          WHERE a.id = keep.id AND a.tenant_id = $2",
        &[&workspace_id, &tenant_id],
    )
    .await?;
    let mut keys = Vec::new();
    for sql in [
        "DELETE FROM attachments a USING sessions s
          WHERE s.id = a.session_id AND s.workspace_id = $1 AND s.tenant_id = $2 AND a.tenant_id = $2
          RETURNING a.object_key",
        "DELETE FROM patches p USING sessions s
          WHERE s.id = p.session_id AND s.workspace_id = $1 AND s.tenant_id = $2 AND p.tenant_id = $2
          RETURNING p.object_key",
    ] {
        let rows = tx.qa(sql, &[&workspace_id, &tenant_id]).await?;
        keys.extend(rows.iter().map(|r| r.get::<_, String>(0)));
    }
    // The sessions' rows and events first (no key cascades to them: migration 0021); the
    // sessions, their turns and the rest go with the workspace (ON DELETE CASCADE).
    for sql in [
        "DELETE FROM rows r USING sessions s
          WHERE s.id = r.session_id AND s.workspace_id = $1 AND s.tenant_id = $2 AND r.tenant_id = $2",
        "DELETE FROM events e USING sessions s
          WHERE s.id = e.session_id AND s.workspace_id = $1 AND s.tenant_id = $2 AND e.tenant_id = $2",
    ] {
        tx.ex(sql, &[&workspace_id, &tenant_id]).await?;
    }
    let n = tx
        .ex(
            "DELETE FROM workspaces WHERE id = $1 AND tenant_id = $2",
            &[&workspace_id, &tenant_id],
        )
        .await?;
    Ok((Removed { removed: n > 0 }, keys))
}
