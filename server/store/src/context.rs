//! `session.context`: a record of each main model request a session made (input by role,
//! tool schemas, estimated tokens — never the text), written by the model proxy, with the
//! input usage the provider reported beside it.

use berth_protocol::{ContextReport, ErrorCode, RoleInput, ToolSchemaSize};

use crate::{Cached, Result, Store, StoreError, fmt_time, tenant_tx, token};

/// The parts of a report the proxy measures (the store adds identity and the fence).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContextMeasure {
    pub roles: Vec<RoleInput>,
    pub tools: Vec<ToolSchemaSize>,
    pub estimated_tokens: u64,
}

impl Store {
    /// Record a request of `turn_id` (its session found through the turn); returns the
    /// record's id, for [`Store::meter_usage`]. The commit does not wait for the disk: the
    /// record is a report of what a request held, not history, and is on the turn's
    /// critical path (before the provider is called); a database crash may lose the last
    /// ones, and `session.context` then shows the request before.
    pub async fn record_context(
        &self,
        tenant_id: &str,
        turn_id: &str,
        provider: &str,
        model: &str,
        measure: &ContextMeasure,
    ) -> Result<String> {
        let client = self.pool.get().await?;
        let id = token::new_id("ctx");
        let report = serde_json::to_value(measure).map_err(|e| StoreError::Other(e.into()))?;
        // `BEGIN`, the tenant switch, the insert and `COMMIT` in one round trip.
        let inserted = crate::tenant_write_unflushed(
            &client,
            tenant_id,
            "INSERT INTO context_records (id, tenant_id, session_id, turn_id, sequence, provider, model, report)
             SELECT $1, t.tenant_id, t.session_id, t.id, s.last_sequence, $4, $5, $6
               FROM turns t JOIN sessions s ON s.id = t.session_id
              WHERE t.id = $3 AND t.tenant_id = $2
             RETURNING 1",
            &[&id, &tenant_id, &turn_id, &provider, &model, &report],
        )
        .await?;
        if inserted.is_empty() {
            return Err(StoreError::Code(ErrorCode::TurnNotRunning));
        }
        Ok(id)
    }

    /// The latest request of the session at or before `through` (None: none), with the fence
    /// used: `through` at most the last sequence, else the last sequence.
    pub async fn context(
        &self,
        tenant_id: &str,
        session_id: &str,
        through: Option<i64>,
    ) -> Result<(i64, Option<ContextReport>)> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let last: i64 = tx
            .qo(
                "SELECT last_sequence FROM sessions WHERE id = $1 AND tenant_id = $2 AND removed_at IS NULL",
                &[&session_id, &tenant_id],
            )
            .await?
            .map(|r| r.get(0))
            .ok_or(StoreError::Code(ErrorCode::NotFound))?;
        let through = through.map_or(last, |t| t.min(last));
        let row = tx
            .qo(
                "SELECT turn_id, sequence, provider, model, report, input_tokens, at
                   FROM context_records WHERE session_id = $1 AND tenant_id = $2 AND sequence <= $3
                  ORDER BY sequence DESC, at DESC LIMIT 1",
                &[&session_id, &tenant_id, &through],
            )
            .await?;
        let Some(r) = row else { return Ok((through, None)) };
        let compaction = crate::compaction::latest(&tx, tenant_id, session_id, r.get(1)).await?;
        tx.commit().await?;
        let measure: ContextMeasure = serde_json::from_value(r.get(4)).map_err(|e| StoreError::Other(e.into()))?;
        Ok((
            through,
            Some(ContextReport {
                turn_id: r.get(0),
                sequence: r.get(1),
                provider: r.get(2),
                model: r.get(3),
                roles: measure.roles,
                tools: measure.tools,
                estimated_tokens: measure.estimated_tokens,
                input_tokens: r.get::<_, Option<i64>>(5).and_then(|n| u64::try_from(n).ok()),
                at: fmt_time(r.get(6)),
                compaction,
            }),
        ))
    }
}
