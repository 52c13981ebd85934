//! Attachments: metadata rows (the bytes are in object storage under `object_key`), and the
//! ordered list a turn names.

use std::collections::HashMap;

use berth_protocol::{ErrorCode, MAX_ATTACHMENTS_PER_TURN, RowAttachment, worker::AttachmentMeta};
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

/// How many files turn `$1` of tenant `$2` attached so far.
const ATTACHED_SQL: &str = "(SELECT count(*) FROM attachments x WHERE x.turn_id = $1 AND x.tenant_id = $2)";

/// A turn's model attaches at most [`MAX_ATTACHMENTS_PER_TURN`] files to its replies, as a
/// prompt carries at most that many: past it, `payload-too-large` (the tool needs no
/// approval, so nothing else bounds what one turn stores).
fn within_reply_limit(attached: i64) -> Result<()> {
    if attached >= MAX_ATTACHMENTS_PER_TURN as i64 {
        return Err(StoreError::Code(ErrorCode::PayloadTooLarge));
    }
    Ok(())
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
                  WHERE id = $3 AND tenant_id = $2 AND removed_at IS NULL FOR KEY SHARE",
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

    /// After `session_id` was removed: delete the attachment rows it owned or named that no
    /// live session names any more (a fork shares its source's attachments) and whose
    /// uploading session is removed; return their object keys, for the caller to delete
    /// the bytes after the rows.
    pub async fn release_session_attachments(&self, tenant_id: &str, session_id: &str) -> Result<Vec<String>> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let rows = tx
            .qa(
                "WITH named AS (
                    SELECT id FROM attachments WHERE session_id = $1 AND tenant_id = $2
                    UNION SELECT unnest(attachment_ids) FROM turns WHERE session_id = $1 AND tenant_id = $2
                    UNION SELECT e->>'attachmentId' FROM rows r, jsonb_array_elements(r.attachments) e
                           WHERE r.session_id = $1 AND r.tenant_id = $2 AND r.attachments IS NOT NULL)
                 DELETE FROM attachments a USING named
                  WHERE a.id = named.id AND a.tenant_id = $2
                    AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = a.session_id AND s.removed_at IS NOT NULL)
                    AND NOT EXISTS (SELECT 1 FROM turns t JOIN sessions s ON s.id = t.session_id
                                     WHERE t.tenant_id = $2 AND s.removed_at IS NULL
                                       AND a.id = ANY(t.attachment_ids))
                    AND NOT EXISTS (SELECT 1 FROM rows r JOIN sessions s ON s.id = r.session_id
                                     WHERE r.tenant_id = $2 AND s.removed_at IS NULL AND r.attachments IS NOT NULL
                                       AND r.attachments @> jsonb_build_array(jsonb_build_object('attachmentId', a.id)))
                  RETURNING a.object_key",
                &[&session_id, &tenant_id],
            )
            .await?;
        tx.commit().await?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    /// Of `keys` (object keys found in object storage), those no attachment or patch row names:
    /// orphans a crash between storing the bytes and recording the row left behind.
    /// Cross-tenant system work (runs as the owner).
    pub async fn unrecorded_object_keys(&self, keys: &[String]) -> Result<Vec<String>> {
        let client = self.pool.get().await?;
        let rows = client
            .qa(
                "SELECT k FROM unnest($1::text[]) AS k
                  WHERE NOT EXISTS (SELECT 1 FROM attachments WHERE object_key = k)
                    AND NOT EXISTS (SELECT 1 FROM patches WHERE object_key = k)",
                &[&keys],
            )
            .await?;
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

/// The turn `$1` of tenant `$2` runs, handed to a live connection of credential `$3`.
fn running_for_worker() -> String {
    format!(
        "SELECT t.session_id FROM turns t JOIN worker_presence p ON p.connection_id = t.dispatched_to
          WHERE t.id = $1 AND t.tenant_id = $2 AND t.state = 'running'
            AND p.tenant_id = $2 AND p.credential_id = $3
            AND p.heartbeat_at > now() - interval '{PRESENCE_TTL}'"
    )
}

impl Store {
    /// For a file a channel session's model attaches: the session of `turn_id` if the turn
    /// runs in a channel session and was handed to a live connection of the calling worker
    /// credential (`turn-not-running` otherwise).
    pub async fn worker_attach_session(&self, worker: &Principal, turn_id: &str) -> Result<String> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, &worker.tenant_id).await?;
        let row = tx
            .qo(
                &format!(
                    "SELECT r.session_id, {ATTACHED_SQL} FROM ({}) r JOIN sessions s ON s.id = r.session_id
                      WHERE s.channel IS NOT NULL AND s.removed_at IS NULL",
                    running_for_worker()
                ),
                &[&turn_id, &worker.tenant_id, &worker.credential_id],
            )
            .await?;
        tx.commit().await?;
        let row = row.ok_or(StoreError::Code(ErrorCode::TurnNotRunning))?;
        within_reply_limit(row.get(1))?;
        Ok(row.get(0))
    }

    /// Record a file the model of `turn_id` attached (its bytes already stored under
    /// `a.object_key`), under the same conditions as [`Store::worker_attach_session`]
    /// checked again; the turn's reply row will name it.
    pub async fn insert_worker_attachment(&self, worker: &Principal, turn_id: &str, a: &NewAttachment) -> Result<()> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, &worker.tenant_id).await?;
        // The turn's files are counted and inserted one at a time (a lock of the turn's own,
        // not a row lock: a writer of the turn takes its session's row first).
        let attached = tx
            .q1(
                &format!("SELECT pg_advisory_xact_lock(hashtext('attach:' || $1)), {ATTACHED_SQL}"),
                &[&turn_id, &worker.tenant_id],
            )
            .await?;
        within_reply_limit(attached.get(1))?;
        let bytes = i64::try_from(a.bytes).unwrap_or(i64::MAX);
        let n = tx
            .ex(
                &format!(
                    "INSERT INTO attachments (id, tenant_id, session_id, name, mime_type, bytes, sha256, object_key, turn_id)
                     SELECT $4, $2, r.session_id, $5, $6, $7, $8, $9, $1
                       FROM ({}) r JOIN sessions s ON s.id = r.session_id
                      WHERE s.channel IS NOT NULL AND s.removed_at IS NULL FOR KEY SHARE OF s",
                    running_for_worker()
                ),
                &[
                    &turn_id,
                    &worker.tenant_id,
                    &worker.credential_id,
                    &a.id,
                    &a.name,
                    &a.mime_type,
                    &bytes,
                    &a.sha256,
                    &a.object_key,
                ],
            )
            .await?;
        if n == 0 {
            return Err(StoreError::Code(ErrorCode::TurnNotRunning));
        }
        tx.commit().await?;
        Ok(())
    }

    /// An attachment of the tenant as rows name it, with where its bytes are
    /// (`not-found` for another tenant's id, exactly as for one that does not exist).
    pub async fn get_attachment(&self, tenant_id: &str, attachment_id: &str) -> Result<(RowAttachment, String)> {
        // One round trip: it runs for every page of `content.read`.
        let client = self.pool.get().await?;
        let row = crate::tenant_read_opt(
            &client,
            tenant_id,
            "SELECT id, name, mime_type, bytes, sha256, object_key FROM attachments WHERE id = $1 AND tenant_id = $2",
            &[&attachment_id, &tenant_id],
        )
        .await?;
        let Some(r) = row else { return not_found() };
        let bytes: i64 = r.get(3);
        let meta = RowAttachment {
            attachment_id: r.get(0),
            name: r.get(1),
            mime_type: r.get(2),
            bytes: u64::try_from(bytes).unwrap_or(0),
            sha256: r.get(4),
        };
        Ok((meta, r.get(5)))
    }
}

/// Name the turn's attachments on its prompt row (item 0 of `turn.started` at `sequence`).
pub(crate) async fn name_in_prompt_row(
    tx: &impl GenericClient,
    tenant_id: &str,
    session_id: &str,
    turn_id: &str,
    sequence: i64,
) -> Result<()> {
    tx.ex(
        "UPDATE rows SET attachments = named.list
           FROM (SELECT jsonb_agg(jsonb_build_object('attachmentId', a.id, 'name', a.name, 'mimeType', a.mime_type,
                                                     'bytes', a.bytes, 'sha256', a.sha256) ORDER BY u.n) AS list
                   FROM turns t, unnest(t.attachment_ids) WITH ORDINALITY AS u(attachment_id, n)
                   JOIN attachments a ON a.id = u.attachment_id
                  WHERE t.id = $3 AND t.tenant_id = $2 AND a.tenant_id = $2) AS named
          WHERE named.list IS NOT NULL AND session_id = $1 AND tenant_id = $2 AND source_sequence = $4 AND item_index = 0",
        &[&session_id, &tenant_id, &turn_id, &sequence],
    )
    .await?;
    Ok(())
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
/// The attachments of turns `$1` (tenant `$2`), in each turn's order.
pub(crate) const TURN_ATTACHMENTS_SQL: &str = "SELECT t.id, a.name, a.mime_type, a.bytes, a.sha256, a.object_key
   FROM turns t, unnest(t.attachment_ids) WITH ORDINALITY AS u(attachment_id, n)
   JOIN attachments a ON a.id = u.attachment_id
  WHERE t.id = ANY($1) AND t.tenant_id = $2 AND a.tenant_id = $2
  ORDER BY t.id, u.n";

pub(crate) async fn turn_attachments(
    tx: &impl GenericClient,
    tenant_id: &str,
    turns: &[String],
) -> Result<HashMap<String, Vec<StoredAttachment>>> {
    let mut out: HashMap<String, Vec<StoredAttachment>> = HashMap::new();
    if turns.is_empty() {
        return Ok(out);
    }
    let rows = tx.qa(TURN_ATTACHMENTS_SQL, &[&turns, &tenant_id]).await?;
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
