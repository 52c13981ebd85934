//! Attachments: metadata rows (the bytes are in object storage under `object_key`), and the
//! ordered list a turn names.

use std::collections::HashMap;

use berth_protocol::{ErrorCode, worker::AttachmentMeta};
use deadpool_postgres::GenericClient;

use crate::{Cached, Principal, Result, Store, StoreError, not_found, tenant_tx, workspaces::PRESENCE_TTL};

/// An attachment to record (its bytes already stored under `object_key`).
#[derive(Debug, Clone)]
pub struct NewAttachment {
    pub id: String,
    pub session_id: String,
    pub name: String,
    pub mime_type: String,
    pub bytes: u64,
    /// Lowercase hex SHA-256.
    pub sha256: String,
    pub object_key: String,
}

/// A turn's attachment with where its bytes are.
#[derive(Debug, Clone)]
pub struct StoredAttachment {
    pub meta: AttachmentMeta,
    pub object_key: String,
}

impl Store {
    /// Whether `session_id` is a live session of the tenant (`not-found` otherwise).
    pub async fn check_session(&self, tenant_id: &str, session_id: &str) -> Result<()> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let row = tx
            .qo(
                "SELECT 1 FROM sessions WHERE id = $1 AND tenant_id = $2 AND removed_at IS NULL",
                &[&session_id, &tenant_id],
            )
            .await?;
        tx.commit().await?;
        if row.is_none() {
            return not_found();
        }
        Ok(())
    }

    /// Record an uploaded attachment of a live session of the tenant.
    pub async fn insert_attachment(&self, tenant_id: &str, a: &NewAttachment) -> Result<()> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let bytes = i64::try_from(a.bytes).unwrap_or(i64::MAX);
        let n = tx
            .ex(
                "INSERT INTO attachments (id, tenant_id, session_id, name, mime_type, bytes, sha256, object_key)
                 SELECT $1, $2, $3, $4, $5, $6, $7, $8 FROM sessions
                  WHERE id = $3 AND tenant_id = $2 AND removed_at IS NULL",
                &[
                    &a.id,
                    &tenant_id,
                    &a.session_id,
                    &a.name,
                    &a.mime_type,
                    &bytes,
                    &a.sha256,
                    &a.object_key,
                ],
            )
            .await?;
        if n == 0 {
            return not_found();
        }
        tx.commit().await?;
        Ok(())
    }

    /// After `session_id` was removed: delete its attachment rows that no live session's
    /// turn names (a fork shares its source's attachments) and return their object keys,
    /// for the caller to delete the bytes after the rows.
    pub async fn release_session_attachments(&self, tenant_id: &str, session_id: &str) -> Result<Vec<String>> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let rows = tx
            .qa(
                "DELETE FROM attachments a
                  WHERE a.session_id = $1 AND a.tenant_id = $2
                    AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = $1 AND s.removed_at IS NOT NULL)
                    AND NOT EXISTS (SELECT 1 FROM turns t JOIN sessions s ON s.id = t.session_id
                                     WHERE t.tenant_id = $2 AND s.removed_at IS NULL
                                       AND a.id = ANY(t.attachment_ids))
                  RETURNING a.object_key",
                &[&session_id, &tenant_id],
            )
            .await?;
        tx.commit().await?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    /// For the worker's attachment fetch: the attachments of `turn_id` in order, if the turn
    /// is running and was handed to a live connection of the calling worker credential
    /// (`turn-not-running` otherwise), as the model proxy checks.
    pub async fn worker_turn_attachments(&self, worker: &Principal, turn_id: &str) -> Result<Vec<StoredAttachment>> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, &worker.tenant_id).await?;
        let running = tx
            .qo(
                &format!(
                    "SELECT 1 FROM turns t JOIN worker_presence p ON p.connection_id = t.dispatched_to
                      WHERE t.id = $1 AND t.tenant_id = $2 AND t.state = 'running'
                        AND p.tenant_id = $2 AND p.credential_id = $3
                        AND p.heartbeat_at > now() - interval '{PRESENCE_TTL}'"
                ),
                &[&turn_id, &worker.tenant_id, &worker.credential_id],
            )
            .await?;
        if running.is_none() {
            return Err(StoreError::Code(ErrorCode::TurnNotRunning));
        }
        let mut by_turn = turn_attachments(&tx, &worker.tenant_id, &[turn_id.to_string()]).await?;
        tx.commit().await?;
        Ok(by_turn.remove(turn_id).unwrap_or_default())
    }
}

/// Check that every id names an attachment of the tenant (`not-found` otherwise, exactly as
/// for an id that does not exist) and that none repeats (`bad-params`).
pub(crate) async fn check_attachment_ids(tx: &impl GenericClient, tenant_id: &str, ids: &[String]) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut unique = ids.to_vec();
    unique.sort();
    unique.dedup();
    if unique.len() != ids.len() {
        return Err(StoreError::Code(ErrorCode::BadParams));
    }
    let found: i64 = tx
        .q1(
            "SELECT count(*) FROM attachments WHERE id = ANY($1) AND tenant_id = $2",
            &[&unique, &tenant_id],
        )
        .await?
        .get(0);
    if found as usize != unique.len() {
        return not_found();
    }
    Ok(())
}

/// The attachments of `turns`, each turn's in its order.
pub(crate) async fn turn_attachments(
    tx: &impl GenericClient,
    tenant_id: &str,
    turns: &[String],
) -> Result<HashMap<String, Vec<StoredAttachment>>> {
    let mut out: HashMap<String, Vec<StoredAttachment>> = HashMap::new();
    if turns.is_empty() {
        return Ok(out);
    }
    let rows = tx
        .qa(
            "SELECT t.id, a.name, a.mime_type, a.bytes, a.sha256, a.object_key
               FROM turns t, unnest(t.attachment_ids) WITH ORDINALITY AS u(attachment_id, n)
               JOIN attachments a ON a.id = u.attachment_id
              WHERE t.id = ANY($1) AND t.tenant_id = $2 AND a.tenant_id = $2
              ORDER BY t.id, u.n",
            &[&turns, &tenant_id],
        )
        .await?;
    for r in rows {
        let bytes: i64 = r.get(3);
        let sha256: String = r.get(4);
        out.entry(r.get(0)).or_default().push(StoredAttachment {
            meta: AttachmentMeta {
                name: r.get(1),
                mime_type: r.get(2),
                bytes: bytes as u64,
                digest: format!("sha256:{sha256}"),
            },
            object_key: r.get(5),
        });
    }
    Ok(out)
}
