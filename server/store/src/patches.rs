//! Patch snapshots: metadata rows (the text is in object storage under `object_key`).

use berth_protocol::{ErrorCode, PatchInfo};

use crate::{Cached, Param, Receipt, Result, Store, StoreError, fmt_time, not_found, receipts::finish, tenant_tx};

/// A patch to record (its text already stored under `object_key`).
#[derive(Debug, Clone)]
pub struct NewPatch {
    pub id: String,
    pub session_id: String,
    pub turn_id: Option<String>,
    pub base: Option<String>,
    pub files: u32,
    pub bytes: u64,
    /// Lowercase hex SHA-256.
    pub sha256: String,
    pub object_key: String,
    /// The session's last sequence when the capture was allowed ([`Store::patch_ready`]).
    pub ready_at: i64,
}

/// A running turn of any session in the workspace of session `$1` (tenant `$2`).
const RUNNING_IN_WORKSPACE: &str =
    "SELECT 1 FROM sessions o JOIN turns t ON t.session_id = o.id AND t.state = 'running'
  WHERE o.tenant_id = $2 AND o.workspace_id = (SELECT workspace_id FROM sessions WHERE id = $1 AND tenant_id = $2)
  LIMIT 1";

const PATCH_SELECT: &str =
    "SELECT id, session_id, turn_id, base, files, bytes, sha256, created_at, object_key FROM patches";

fn patch_from_row(r: &tokio_postgres::Row) -> (PatchInfo, String) {
    let files: i32 = r.get(4);
    let bytes: i64 = r.get(5);
    let info = PatchInfo {
        patch_id: r.get(0),
        session_id: r.get(1),
        turn_id: r.get(2),
        base: r.get(3),
        files: files as u32,
        bytes: bytes as u64,
        sha256: r.get(6),
        created_at: fmt_time(r.get(7)),
    };
    (info, r.get(8))
}

impl Store {
    /// Whether a patch of `session_id` may be captured now: the session is live, the named
    /// turn (if any) is one of its turns and settled (`turn-busy` while queued or running),
    /// and no turn of any session runs in its workspace (every writer has settled). Returns
    /// the session's last sequence, for [`NewPatch::ready_at`].
    pub async fn patch_ready(&self, tenant_id: &str, session_id: &str, turn_id: Option<&str>) -> Result<i64> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let live = tx
            .qo(
                "SELECT last_sequence FROM sessions WHERE id = $1 AND tenant_id = $2 AND removed_at IS NULL",
                &[&session_id, &tenant_id],
            )
            .await?;
        let Some(live) = live else { return not_found() };
        // The named turn must have settled (an unknown one is not-found).
        let unsettled = match turn_id {
            Some(turn) => {
                let state: Option<String> = tx
                    .qo(
                        "SELECT state FROM turns WHERE id = $1 AND session_id = $2 AND tenant_id = $3",
                        &[&turn, &session_id, &tenant_id],
                    )
                    .await?
                    .map(|r| r.get(0));
                match state.as_deref() {
                    None => return not_found(),
                    Some(s) => s == "queued" || s == "running",
                }
            }
            None => false,
        };
        // And no session's turn may be running in the workspace: it may be writing into it,
        // and a capture now could hold a half-written file.
        let busy = unsettled || tx.qo(RUNNING_IN_WORKSPACE, &[&session_id, &tenant_id]).await?.is_some();
        tx.commit().await?;
        if busy {
            return Err(StoreError::Code(ErrorCode::TurnBusy));
        }
        Ok(live.get(0))
    }

    /// Record a captured patch of a live session; marks the operation's receipt done in the
    /// same transaction, so the patch exists exactly when its receipt does. `turn-busy` when
    /// a turn of the session started after [`NewPatch::ready_at`] (during the capture), or a
    /// turn of any session runs in the workspace now.
    pub async fn insert_patch(&self, tenant_id: &str, p: &NewPatch, op: Option<&Receipt>) -> Result<PatchInfo> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let files = i32::try_from(p.files).unwrap_or(i32::MAX);
        let bytes = i64::try_from(p.bytes).unwrap_or(i64::MAX);
        // The session is locked first (`FOR KEY SHARE`: a turn's admission waits for it, a
        // step does not), so that the insert's snapshot, taken after it, holds every turn
        // started before: one that started since `patch_ready` may have changed the workspace
        // while it was captured, and the patch would mix its changes in. Both go out together.
        let key: [Param; 2] = [&p.session_id, &tenant_id];
        let params: [Param; 10] = [
            &p.id,
            &tenant_id,
            &p.session_id,
            &p.turn_id,
            &p.base,
            &files,
            &bytes,
            &p.sha256,
            &p.object_key,
            &p.ready_at,
        ];
        let mut results = crate::pipelined(
            &tx,
            None,
            &[
                (
                    "SELECT 1 FROM sessions WHERE id = $1 AND tenant_id = $2 AND removed_at IS NULL FOR KEY SHARE",
                    &key,
                ),
                (
                    "INSERT INTO patches (id, tenant_id, session_id, turn_id, base, files, bytes, sha256, object_key)
                     SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9
                      WHERE EXISTS (SELECT 1 FROM sessions WHERE id = $3 AND tenant_id = $2 AND removed_at IS NULL)
                        AND NOT EXISTS (SELECT 1 FROM events
                                         WHERE session_id = $3 AND sequence > $10 AND type = 'turn.started')
                        AND NOT EXISTS (SELECT 1 FROM sessions o JOIN turns t ON t.session_id = o.id AND t.state = 'running'
                                         WHERE o.tenant_id = $2
                                           AND o.workspace_id = (SELECT workspace_id FROM sessions WHERE id = $3))
                     RETURNING id, session_id, turn_id, base, files, bytes, sha256, created_at, object_key",
                    &params,
                ),
            ],
        )
        .await?;
        let inserted = results.pop().unwrap_or_default();
        if results.pop().unwrap_or_default().is_empty() {
            return not_found();
        }
        let Some(row) = inserted.first() else {
            return Err(StoreError::Code(ErrorCode::TurnBusy));
        };
        let (info, _) = patch_from_row(row);
        finish(&tx, op, &info).await?;
        tx.commit().await?;
        Ok(info)
    }

    /// A patch of a live session of the tenant, with its object key (`not-found`
    /// otherwise, exactly as for an id that does not exist).
    pub async fn get_patch(&self, tenant_id: &str, patch_id: &str) -> Result<(PatchInfo, String)> {
        // One round trip: it runs for every page of `patch.read`.
        let client = self.pool.get().await?;
        let row = crate::tenant_read_opt(
            &client,
            tenant_id,
            &format!(
                "{PATCH_SELECT} p WHERE p.id = $1 AND p.tenant_id = $2
                   AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = p.session_id AND s.removed_at IS NULL)"
            ),
            &[&patch_id, &tenant_id],
        )
        .await?;
        match row {
            Some(r) => Ok(patch_from_row(&r)),
            None => not_found(),
        }
    }

    /// After `session_id` was removed: delete its patch rows and return their object keys,
    /// for the caller to delete the text after the rows.
    pub async fn release_session_patches(&self, tenant_id: &str, session_id: &str) -> Result<Vec<String>> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let rows = tx
            .qa(
                "DELETE FROM patches p WHERE p.session_id = $1 AND p.tenant_id = $2
                   AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = p.session_id AND s.removed_at IS NOT NULL)
                 RETURNING p.object_key",
                &[&session_id, &tenant_id],
            )
            .await?;
        tx.commit().await?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }
}
