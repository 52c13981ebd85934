//! Operation receipts: a mutation retried with the same `operationId` returns the original
//! outcome without doing the work again.
//!
//! [`Store::receipt_begin`] records a `pending` receipt owned by this attempt (or answers
//! from the stored one). The mutation then calls [`finish`] inside its own transaction, so
//! the receipt turns `done` exactly when the work commits; an attempt that lost ownership
//! (its pending receipt went stale and another attempt took over) rolls back.

use berth_protocol::{ErrorCode, ReceiptState};
use deadpool_postgres::GenericClient;
use serde_json::Value;

use crate::{Cached, Result, Store, StoreError, fmt_time, tenant_tx, token};

/// A pending receipt this attempt owns.
#[derive(Debug, Clone)]
pub struct Receipt {
    pub tenant_id: String,
    pub principal: String,
    pub operation_id: String,
    owner: String,
}

/// What `receipt_begin` decided.
#[derive(Debug)]
pub enum Begin {
    /// Do the work, then `finish` the receipt in the same transaction.
    Proceed(Receipt),
    /// The operation completed before: its stored outcome (`result` or `error`).
    Replay {
        result: Option<Value>,
        error: Option<Value>,
    },
}

pub use berth_protocol::ReceiptView;

/// A pending receipt older than this is presumed abandoned (its replica died mid-call) and
/// may be taken over by a retry.
const STALE_PENDING: &str = "60 seconds";

impl Store {
    pub async fn receipt_begin(
        &self,
        tenant_id: &str,
        principal: &str,
        operation_id: &str,
        method: &str,
        params_hash: &str,
    ) -> Result<Begin> {
        let mut client = self.pool.get().await?;
        let client = tenant_tx(&mut client, tenant_id).await?;
        let owner = token::new_id("own");
        let inserted = client
            .ex(
                "INSERT INTO operation_receipts (tenant_id, principal, operation_id, method, params_hash, state, owner)
                 VALUES ($1, $2, $3, $4, $5, 'pending', $6) ON CONFLICT DO NOTHING",
                &[&tenant_id, &principal, &operation_id, &method, &params_hash, &owner],
            )
            .await?;
        let receipt = Receipt {
            tenant_id: tenant_id.into(),
            principal: principal.into(),
            operation_id: operation_id.into(),
            owner: owner.clone(),
        };
        if inserted == 1 {
            client.commit().await?;
            return Ok(Begin::Proceed(receipt));
        }
        let row = client
            .qo(
                &format!(
                    "SELECT method, params_hash, state, result, error, updated_at < now() - interval '{STALE_PENDING}'
                       FROM operation_receipts WHERE tenant_id = $1 AND principal = $2 AND operation_id = $3"
                ),
                &[&tenant_id, &principal, &operation_id],
            )
            .await?;
        // Deleted by retention between the two statements: treat as in progress; a retry decides.
        let Some(row) = row else {
            return Err(StoreError::Code(ErrorCode::OperationInProgress));
        };
        let (m, h, state): (String, String, String) = (row.get(0), row.get(1), row.get(2));
        if m != method || h != params_hash {
            return Err(StoreError::Code(ErrorCode::OperationConflict));
        }
        if state == "done" {
            return Ok(Begin::Replay {
                result: row.get(3),
                error: row.get(4),
            });
        }
        let stale: bool = row.get(5);
        if stale {
            let took = client
                .ex(
                    &format!(
                        "UPDATE operation_receipts SET owner = $4, updated_at = now()
                          WHERE tenant_id = $1 AND principal = $2 AND operation_id = $3 AND state = 'pending'
                            AND updated_at < now() - interval '{STALE_PENDING}'"
                    ),
                    &[&tenant_id, &principal, &operation_id, &owner],
                )
                .await?;
            if took == 1 {
                client.commit().await?;
                return Ok(Begin::Proceed(receipt));
            }
        }
        Err(StoreError::Code(ErrorCode::OperationInProgress))
    }

    /// Record a user-facing error as the operation's outcome.
    pub async fn receipt_fail(&self, r: &Receipt, error: &Value) -> Result<()> {
        let mut client = self.pool.get().await?;
        let client = tenant_tx(&mut client, &r.tenant_id).await?;
        client
            .ex(
                "UPDATE operation_receipts SET state = 'done', error = $5, updated_at = now()
                  WHERE tenant_id = $1 AND principal = $2 AND operation_id = $3 AND owner = $4 AND state = 'pending'",
                &[&r.tenant_id, &r.principal, &r.operation_id, &r.owner, error],
            )
            .await?;
        client.commit().await?;
        Ok(())
    }

    /// Forget a pending receipt whose attempt failed for an infrastructure reason, so that
    /// a retry can do the work.
    pub async fn receipt_abandon(&self, r: &Receipt) -> Result<()> {
        let mut client = self.pool.get().await?;
        let client = tenant_tx(&mut client, &r.tenant_id).await?;
        client
            .ex(
                "DELETE FROM operation_receipts
                  WHERE tenant_id = $1 AND principal = $2 AND operation_id = $3 AND owner = $4 AND state = 'pending'",
                &[&r.tenant_id, &r.principal, &r.operation_id, &r.owner],
            )
            .await?;
        client.commit().await?;
        Ok(())
    }

    /// The stored receipt, if any.
    pub async fn receipt_get(
        &self,
        tenant_id: &str,
        principal: &str,
        operation_id: &str,
    ) -> Result<Option<ReceiptView>> {
        let mut client = self.pool.get().await?;
        let client = tenant_tx(&mut client, tenant_id).await?;
        let row = client
            .qo(
                "SELECT method, state, result, error, created_at FROM operation_receipts
                  WHERE tenant_id = $1 AND principal = $2 AND operation_id = $3",
                &[&tenant_id, &principal, &operation_id],
            )
            .await?;
        Ok(row.map(|r| ReceiptView {
            operation_id: operation_id.to_string(),
            method: r.get(0),
            state: if r.get::<_, &str>(1) == "pending" {
                ReceiptState::Pending
            } else {
                ReceiptState::Done
            },
            result: r.get(2),
            error: r
                .get::<_, Option<Value>>(3)
                .and_then(|e| serde_json::from_value(e).ok()),
            created_at: fmt_time(r.get(4)),
        }))
    }

    /// Delete receipts older than `retention_secs`; returns how many.
    pub async fn receipts_cleanup(&self, retention_secs: i64) -> Result<u64> {
        let client = self.pool.get().await?;
        let n = client
            .ex(
                "DELETE FROM operation_receipts WHERE created_at < now() - make_interval(secs => $1)",
                &[&(retention_secs as f64)],
            )
            .await?;
        Ok(n)
    }
}

impl Store {
    /// Mark the receipt done with `result` for a mutation that wrote nothing else.
    pub async fn receipt_done(&self, r: &Receipt, result: &impl serde::Serialize) -> Result<()> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, &r.tenant_id).await?;
        finish(&tx, Some(r), result).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// Mark the receipt done with `result` inside the mutation's transaction. Fails with
/// `operation-in-progress` (rolling the work back) when this attempt no longer owns it.
pub(crate) async fn finish(
    tx: &impl GenericClient,
    op: Option<&Receipt>,
    result: &impl serde::Serialize,
) -> Result<()> {
    let Some(r) = op else { return Ok(()) };
    let value = serde_json::to_value(result).map_err(|e| StoreError::Other(e.into()))?;
    let n = tx
        .ex(
            "UPDATE operation_receipts SET state = 'done', result = $5, updated_at = now()
              WHERE tenant_id = $1 AND principal = $2 AND operation_id = $3 AND owner = $4 AND state = 'pending'",
            &[&r.tenant_id, &r.principal, &r.operation_id, &r.owner, &value],
        )
        .await?;
    if n == 1 {
        Ok(())
    } else {
        Err(StoreError::Code(ErrorCode::OperationInProgress))
    }
}
