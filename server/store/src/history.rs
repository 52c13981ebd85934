//! The per-session event log and its rows.

use berth_protocol::{Event, NewRow, Position, Row, RowKind, SessionHistoryResult, ToolInfo};
use deadpool_postgres::GenericClient;

use crate::{CHANNEL_EVENTS, Result, Store, fmt_time, not_found};

/// A persisted event together with its rows.
pub type EventRecord = Event;

/// Append one event (and the rows it publishes) inside the caller's transaction. The
/// sequence comes from bumping `sessions.last_sequence`, which also serializes appends per
/// session; the NOTIFY is delivered when the transaction commits.
pub(crate) async fn append_event(
    tx: &impl GenericClient,
    tenant_id: &str,
    session_id: &str,
    kind: &str,
    turn_id: Option<&str>,
    payload: serde_json::Value,
    rows: &[NewRow],
) -> Result<i64> {
    let seq: i64 = tx
        .query_one(
            "UPDATE sessions SET last_sequence = last_sequence + 1, updated_at = now()
              WHERE id = $1 AND tenant_id = $2 RETURNING last_sequence",
            &[&session_id, &tenant_id],
        )
        .await?
        .get(0);
    tx.execute(
        "INSERT INTO events (session_id, sequence, tenant_id, type, turn_id, payload) VALUES ($1, $2, $3, $4, $5, $6)",
        &[&session_id, &seq, &tenant_id, &kind, &turn_id, &payload],
    )
    .await?;
    for (i, row) in rows.iter().enumerate() {
        let tool = row
            .tool
            .as_ref()
            .map(|t| serde_json::to_value(t).unwrap_or_default());
        tx.execute(
            "INSERT INTO rows (session_id, source_sequence, item_index, tenant_id, turn_id, kind, body, thinking, tool, hidden)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            &[
                &session_id,
                &seq,
                &(i as i32),
                &tenant_id,
                &turn_id,
                &row.kind.as_str(),
                &row.body,
                &row.thinking,
                &tool,
                &row.hidden.unwrap_or(false),
            ],
        )
        .await?;
    }
    tx.execute(
        "SELECT pg_notify($1, $2)",
        &[&CHANNEL_EVENTS, &format!("{session_id}:{seq}")],
    )
    .await?;
    Ok(seq)
}

const ROW_COLUMNS: &str =
    "source_sequence, item_index, turn_id, kind, body, thinking, tool, hidden";

fn row_from(r: &tokio_postgres::Row) -> Row {
    let hidden: bool = r.get(7);
    Row {
        position: Position {
            source_sequence: r.get(0),
            item_index: r.get(1),
        },
        turn_id: r.get(2),
        kind: RowKind::parse(r.get(3)).unwrap_or(RowKind::Notice),
        body: r.get(4),
        thinking: r.get(5),
        tool: r
            .get::<_, Option<serde_json::Value>>(6)
            .and_then(|v| serde_json::from_value::<ToolInfo>(v).ok()),
        hidden: hidden.then_some(true),
    }
}

impl Store {
    /// The session's last sequence, or not-found.
    pub async fn last_sequence(&self, tenant_id: &str, session_id: &str) -> Result<i64> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt(
                "SELECT last_sequence FROM sessions WHERE id = $1 AND tenant_id = $2 AND removed_at IS NULL",
                &[&session_id, &tenant_id],
            )
            .await?;
        match row {
            Some(r) => Ok(r.get(0)),
            None => not_found(),
        }
    }

    /// Events with `sequence > after`, in order, at most `limit`, each with its rows.
    pub async fn events_after(
        &self,
        tenant_id: &str,
        session_id: &str,
        after: i64,
        limit: i64,
    ) -> Result<Vec<EventRecord>> {
        let client = self.pool.get().await?;
        let events = client
            .query(
                "SELECT sequence, type, turn_id, payload, at FROM events
                  WHERE session_id = $1 AND tenant_id = $2 AND sequence > $3 ORDER BY sequence LIMIT $4",
                &[&session_id, &tenant_id, &after, &limit],
            )
            .await?;
        let Some(last) = events.last().map(|r| r.get::<_, i64>(0)) else {
            return Ok(Vec::new());
        };
        let rows = client
            .query(
                &format!(
                    "SELECT {ROW_COLUMNS} FROM rows WHERE session_id = $1 AND tenant_id = $2
                      AND source_sequence > $3 AND source_sequence <= $4 ORDER BY source_sequence, item_index"
                ),
                &[&session_id, &tenant_id, &after, &last],
            )
            .await?;
        let mut rows = rows.iter().map(row_from).peekable();
        let mut out = Vec::with_capacity(events.len());
        for e in &events {
            let sequence: i64 = e.get(0);
            let mut published = Vec::new();
            while let Some(r) = rows.next_if(|r| r.position.source_sequence == sequence) {
                published.push(r);
            }
            let data = match e.get::<_, serde_json::Value>(3) {
                serde_json::Value::Object(m) => m,
                _ => serde_json::Map::new(),
            };
            out.push(Event {
                sequence,
                kind: e.get(1),
                at: fmt_time(e.get(4)),
                turn_id: e.get(2),
                rows: published,
                data,
            });
        }
        Ok(out)
    }

    /// A page of rows under the `through` fence (pinned to the current last sequence when
    /// absent), after the `after` position, skipping hidden rows.
    pub async fn history(
        &self,
        tenant_id: &str,
        session_id: &str,
        through: Option<i64>,
        after: Option<Position>,
        limit: u32,
    ) -> Result<SessionHistoryResult> {
        let last = self.last_sequence(tenant_id, session_id).await?;
        let through = through.unwrap_or(last).min(last);
        let after = after.unwrap_or(Position {
            source_sequence: 0,
            item_index: -1,
        });
        let limit = i64::from(limit.clamp(1, 500));
        let client = self.pool.get().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT {ROW_COLUMNS} FROM rows WHERE session_id = $1 AND tenant_id = $2 AND NOT hidden
                      AND source_sequence <= $3 AND (source_sequence, item_index) > ($4, $5)
                      ORDER BY source_sequence, item_index LIMIT $6"
                ),
                &[&session_id, &tenant_id, &through, &after.source_sequence, &after.item_index, &(limit + 1)],
            )
            .await?;
        let mut rows: Vec<Row> = rows.iter().map(row_from).collect();
        let more = rows.len() as i64 > limit;
        rows.truncate(limit as usize);
        let next_after = if more {
            rows.last().map(|r| r.position)
        } else {
            None
        };
        Ok(SessionHistoryResult {
            through,
            rows,
            next_after,
        })
    }
}
