//! Compaction (SPEC §4.17): older history summarized into a handoff row. The rows stay; a
//! `session.compacted` event publishes the handoff row and names `keepFrom`, the first row
//! still sent as itself. A turn's history starts at the latest compaction. Compactions
//! only move forward: one that would keep more than the latest is not written.

use berth_protocol::{
    Compacted, Compaction, ErrorCode, EventPayload, NewRow, Notice, Position, RowKind, SessionCompactResult,
    worker::Handoff,
};
use deadpool_postgres::GenericClient;

use crate::{
    Cached, Result, Store, StoreError,
    history::append_event,
    receipts::{Receipt, finish},
    sessions::lock_session,
    tenant_tx,
    turns::lock_running_turn,
};

/// Bytes of one row's text that go into a summary's source.
const SOURCE_ROW_BYTES: i32 = 4000;

/// The latest compaction of a session at or before `through` (None: never compacted).
pub(crate) async fn latest(
    tx: &impl GenericClient,
    tenant_id: &str,
    session_id: &str,
    through: i64,
) -> Result<Option<Compaction>> {
    let row = tx
        .qo(
            "SELECT sequence, payload->'keepFrom' FROM events
              WHERE session_id = $1 AND tenant_id = $2 AND type = 'session.compacted' AND sequence <= $3
              ORDER BY sequence DESC LIMIT 1",
            &[&session_id, &tenant_id, &through],
        )
        .await?;
    let Some(r) = row else { return Ok(None) };
    let keep_from: Position = serde_json::from_value(r.get(1)).map_err(|e| StoreError::Other(e.into()))?;
    Ok(Some(Compaction {
        handoff: Position {
            source_sequence: r.get(0),
            item_index: 0,
        },
        keep_from,
    }))
}

/// The handoff a turn's history starts from: the latest compaction's summary.
pub(crate) async fn handoff(tx: &impl GenericClient, tenant_id: &str, session_id: &str) -> Result<Option<Handoff>> {
    let Some(c) = latest(tx, tenant_id, session_id, i64::MAX).await? else {
        return Ok(None);
    };
    let summary = tx
        .qo(
            "SELECT body FROM rows WHERE session_id = $1 AND tenant_id = $2 AND source_sequence = $3 AND item_index = 0",
            &[&session_id, &tenant_id, &c.handoff.source_sequence],
        )
        .await?
        .map(|r| r.get(0))
        .unwrap_or_default();
    Ok(Some(Handoff {
        keep_from: c.keep_from,
        summary,
    }))
}

/// What a summary is made from.
#[derive(Debug, Clone)]
pub struct CompactionSource {
    /// The previous compaction's summary, which the new one replaces.
    pub previous: Option<String>,
    /// Rows since the previous compaction, oldest first: kind, tool name, text (cut).
    pub rows: Vec<(RowKind, Option<String>, String)>,
    /// Older rows left out to stay within the byte budget.
    pub omitted: u64,
    /// Where the next row would go: `keepFrom` of a compaction of everything so far.
    pub end: Position,
    /// The session's model choice as turns resolve it (session > agent; None: the default).
    pub provider: Option<String>,
    pub model: Option<String>,
    pub base_url: Option<String>,
}

impl Store {
    /// The source of a summary of the session's history before `keep_from` (None: all of
    /// it), at most `budget` bytes of row text (the newest rows are kept).
    pub async fn compaction_source(
        &self,
        tenant_id: &str,
        session_id: &str,
        keep_from: Option<Position>,
        budget: usize,
    ) -> Result<CompactionSource> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let s = tx
            .qo(
                "SELECT s.last_sequence, coalesce(s.model, a.model),
                        CASE WHEN s.model IS NULL AND a.model IS NOT NULL THEN a.provider ELSE s.provider END,
                        CASE WHEN s.model IS NULL AND a.model IS NOT NULL THEN NULL ELSE s.base_url END
                   FROM sessions s LEFT JOIN agents a ON a.id = s.agent_id
                  WHERE s.id = $1 AND s.tenant_id = $2 AND s.removed_at IS NULL",
                &[&session_id, &tenant_id],
            )
            .await?;
        let Some(s) = s else {
            return Err(StoreError::Code(ErrorCode::NotFound));
        };
        let end = Position {
            source_sequence: s.get::<_, i64>(0) + 1,
            item_index: 0,
        };
        let keep_from = keep_from.unwrap_or(end);
        let previous = handoff(&tx, tenant_id, session_id).await?;
        let from = previous.as_ref().map_or(
            Position {
                source_sequence: 0,
                item_index: 0,
            },
            |h| h.keep_from,
        );
        let rows = tx
            .qa(
                "SELECT kind, tool->>'name', substring(body for $7), octet_length(body) FROM rows
                  WHERE session_id = $1 AND tenant_id = $2 AND NOT hidden AND kind <> 'handoff'
                    AND (source_sequence, item_index) >= ($3, $4) AND (source_sequence, item_index) < ($5, $6)
                  ORDER BY source_sequence DESC, item_index DESC",
                &[
                    &session_id,
                    &tenant_id,
                    &from.source_sequence,
                    &from.item_index,
                    &keep_from.source_sequence,
                    &keep_from.item_index,
                    &SOURCE_ROW_BYTES,
                ],
            )
            .await?;
        tx.commit().await?;
        let mut out = Vec::new();
        let mut used = 0usize;
        let mut omitted = 0u64;
        for r in &rows {
            let mut text: String = r.get(2);
            let whole: i32 = r.get(3);
            if used + text.len() > budget {
                omitted += 1;
                continue;
            }
            used += text.len();
            if whole as usize > text.len() {
                text.push_str(&format!(" [… {} bytes in all]", whole));
            }
            let kind = RowKind::parse(r.get(0)).unwrap_or(RowKind::Notice);
            out.push((kind, r.get(1), text));
        }
        out.reverse();
        Ok(CompactionSource {
            previous: previous.map(|h| h.summary),
            rows: out,
            omitted,
            end,
            provider: s.get(2),
            model: s.get(1),
            base_url: s.get(3),
        })
    }

    /// Write a compaction: the handoff row with `summary`, standing for the rows before
    /// `keep_from`, and a `context-compacted` notice. None when the session is already
    /// compacted that far (nothing is written).
    pub async fn compact(
        &self,
        tenant_id: &str,
        session_id: &str,
        keep_from: Position,
        summary: &str,
        automatic: bool,
        op: Option<&Receipt>,
    ) -> Result<Option<Compaction>> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        lock_session(&tx, tenant_id, session_id).await?;
        if let Some(c) = latest(&tx, tenant_id, session_id, i64::MAX).await?
            && c.keep_from >= keep_from
        {
            finish(
                &tx,
                op,
                &SessionCompactResult {
                    compacted: false,
                    compaction: None,
                },
            )
            .await?;
            tx.commit().await?;
            return Ok(None);
        }
        let row = NewRow {
            kind: RowKind::Handoff,
            body: summary.to_string(),
            thinking: None,
            tool: None,
            hidden: None,
        };
        let event = EventPayload::SessionCompacted(Compacted { keep_from, automatic });
        let seq = append_event(&tx, tenant_id, session_id, None, &event, &[row]).await?;
        let compaction = Compaction {
            handoff: Position {
                source_sequence: seq,
                item_index: 0,
            },
            keep_from,
        };
        let notice = EventPayload::SessionNotice(Notice {
            level: berth_protocol::NoticeLevel::Info.as_str().into(),
            code: berth_protocol::NoticeCode::ContextCompacted.as_str().into(),
            params: serde_json::json!({
                "handoff": compaction.handoff,
                "keepFrom": keep_from,
                "automatic": automatic,
            }),
        });
        append_event(&tx, tenant_id, session_id, None, &notice, &[]).await?;
        let result = SessionCompactResult {
            compacted: true,
            compaction: Some(compaction),
        };
        finish(&tx, op, &result).await?;
        tx.commit().await?;
        Ok(Some(compaction))
    }

    /// The session of a turn that runs and is handed to `connection_id` (`turn-not-running`
    /// otherwise).
    pub async fn running_turn_session(&self, connection_id: &str, tenant_id: &str, turn_id: &str) -> Result<String> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let session = lock_running_turn(&tx, Some(connection_id), tenant_id, turn_id).await?;
        tx.commit().await?;
        Ok(session)
    }
}
