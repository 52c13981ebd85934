//! The queue: a queued prompt edited, read, moved or removed, guarded by its revision.

use berth_protocol::{ErrorCode, QUEUE_PREVIEW_BYTES, QueueEntry, QueueState, QueuedPrompt, Removed};
use deadpool_postgres::GenericClient;

use super::end::{KeepText, cancel_turn};
use crate::{
    Cached, Result, Store, StoreError, not_found,
    receipts::{Receipt, finish},
    sessions::{lock_session, queue_changed},
    tenant_tx,
};

impl Store {
    /// Edit a queued prompt, guarded by its revision.
    pub async fn queue_update(
        &self,
        tenant_id: &str,
        session_id: &str,
        queue_id: &str,
        revision: i64,
        prompt: &str,
        op: Option<&Receipt>,
    ) -> Result<QueueEntry> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        lock_session(&tx, tenant_id, session_id).await?;
        check_queued(&tx, session_id, queue_id, revision).await?;
        tx.ex(
            "UPDATE turns SET prompt = $2, queue_revision = queue_revision + 1 WHERE id = $1",
            &[&queue_id, &prompt],
        )
        .await?;
        queue_changed(&tx, tenant_id, session_id).await?;
        let entry = QueueEntry {
            queue_id: queue_id.into(),
            turn_id: queue_id.into(),
            queue_revision: revision + 1,
            preview: berth_protocol::text::prefix(prompt, QUEUE_PREVIEW_BYTES).to_string(),
            prompt_bytes: prompt.len() as u64,
        };
        finish(&tx, op, &entry).await?;
        tx.commit().await?;
        Ok(entry)
    }

    /// A queued turn's whole prompt (queue entries carry a preview).
    pub async fn queue_get(&self, tenant_id: &str, session_id: &str, queue_id: &str) -> Result<QueuedPrompt> {
        let mut client = self.pool.get().await?;
        let client = tenant_tx(&mut client, tenant_id).await?;
        let row = client
            .qo(
                "SELECT t.prompt, t.queue_revision FROM turns t JOIN sessions s ON s.id = t.session_id
                  WHERE t.id = $1 AND t.session_id = $2 AND t.tenant_id = $3 AND t.state = 'queued'
                    AND s.removed_at IS NULL",
                &[&queue_id, &session_id, &tenant_id],
            )
            .await?;
        let Some(row) = row else { return not_found() };
        Ok(QueuedPrompt {
            queue_id: queue_id.into(),
            turn_id: queue_id.into(),
            queue_revision: row.get(1),
            prompt: row.get(0),
        })
    }

    /// Move a queued prompt before another (or to the end), guarded by its revision.
    pub async fn queue_move(
        &self,
        tenant_id: &str,
        session_id: &str,
        queue_id: &str,
        revision: i64,
        before: Option<&str>,
        op: Option<&Receipt>,
    ) -> Result<QueueState> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        lock_session(&tx, tenant_id, session_id).await?;
        check_queued(&tx, session_id, queue_id, revision).await?;
        let mut order: Vec<String> = tx
            .qa(
                "SELECT id FROM turns WHERE session_id = $1 AND state = 'queued' ORDER BY queue_position",
                &[&session_id],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .filter(|id: &String| id != queue_id)
            .collect();
        let at = match before {
            Some(b) if b == queue_id => return Err(StoreError::Code(ErrorCode::BadParams)),
            Some(b) => order
                .iter()
                .position(|id| id == b)
                .ok_or(StoreError::Code(ErrorCode::NotFound))?,
            None => order.len(),
        };
        order.insert(at, queue_id.to_string());
        let base: i64 = tx
            .q1(
                "SELECT coalesce((SELECT queue_position FROM turns WHERE session_id = $1
                                   ORDER BY queue_position DESC LIMIT 1), 0)",
                &[&session_id],
            )
            .await?
            .get(0);
        for (i, id) in order.iter().enumerate() {
            tx.ex(
                "UPDATE turns SET queue_position = $2 WHERE id = $1",
                &[id, &(base + 1 + i as i64)],
            )
            .await?;
        }
        tx.ex(
            "UPDATE turns SET queue_revision = queue_revision + 1 WHERE id = $1",
            &[&queue_id],
        )
        .await?;
        let state = queue_changed(&tx, tenant_id, session_id).await?;
        finish(&tx, op, &state).await?;
        tx.commit().await?;
        Ok(state)
    }

    /// Remove a queued prompt, guarded by its revision; the turn settles `cancelled`.
    pub async fn queue_remove(
        &self,
        tenant_id: &str,
        session_id: &str,
        queue_id: &str,
        revision: i64,
        op: Option<&Receipt>,
    ) -> Result<Removed> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        crate::coordinator::lock_coordinator_of(&tx, tenant_id, session_id).await?;
        lock_session(&tx, tenant_id, session_id).await?;
        check_queued(&tx, session_id, queue_id, revision).await?;
        cancel_turn(&tx, tenant_id, session_id, queue_id.to_string(), true, KeepText::No).await?;
        let result = Removed { removed: true };
        finish(&tx, op, &result).await?;
        tx.commit().await?;
        Ok(result)
    }
}

async fn check_queued(tx: &impl GenericClient, session_id: &str, queue_id: &str, revision: i64) -> Result<()> {
    let row = tx
        .qo(
            "SELECT state, queue_revision FROM turns WHERE id = $1 AND session_id = $2 FOR UPDATE",
            &[&queue_id, &session_id],
        )
        .await?;
    let Some(row) = row else { return not_found() };
    let state: String = row.get(0);
    let current: i64 = row.get(1);
    // An entry that left the queue (started, removed) is stale for the client too.
    if state != "queued" || current != revision {
        return Err(StoreError::Code(ErrorCode::StaleRevision));
    }
    Ok(())
}
