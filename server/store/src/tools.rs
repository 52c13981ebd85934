//! The agent loop's history: the rows a worker reads before a turn, and tool calls'
//! status changes and ends, each appended as an event (the call row's stored status
//! follows in the same transaction, so a later read shows the final status and a watcher
//! sees every change).

use berth_protocol::{
    ErrorCode, EventPayload, NewRow, Position, RowField, RowKind, SessionHistoryParams, SessionSourceParams,
    SessionSourceResult, ToolCallStatus, ToolInfo,
    worker::{Handoff, ToolStatus},
};
use deadpool_postgres::GenericClient;
use serde_json::value::RawValue;

use crate::{
    Param, Result, Store, StoreError,
    history::{EventRecord, HISTORY_BUDGET_MAX, append_event_as_written},
    turns::lock_running_turn_then,
};

/// Rows per `turn.history` page at most.
const TURN_HISTORY_ROWS: u32 = 500;

/// A running turn's session (`$1` the turn, `$2` the tenant, `$3` the connection it was
/// handed to), with the session's latest compaction's `keepFrom` and its summary (the
/// compaction event's row 0), NULL when never compacted. The summary is read inside the
/// lateral (only for a compaction found): joined outside it, a session never compacted had
/// every row 0 of its history scanned and filtered out on each turn. The turn by primary key
/// (`(…) IS TRUE` matches no partial index on running turns; see `turns::running_turn_sql`).
///
/// With it, when the turn runs, the live payload `$5` (the running phase, or null) is
/// notified on channel `$4` if a watcher of the session that replica `$6` does not hold is
/// recorded (`watched_elsewhere_sql`): the notice goes out with this read's commit, before
/// anything the turn relays later, and costs nothing when nobody elsewhere watches.
const TURN_HANDOFF_SQL: &str = concat!(
    "SELECT t.session_id, c.payload->'keepFrom', c.body,
            (SELECT pg_notify($4, $5) WHERE $5::text IS NOT NULL AND (",
    watched_elsewhere_sql!("$6", "t.session_id"),
    "))
       FROM turns t
       LEFT JOIN LATERAL (SELECT e.payload,
                                 (SELECT r.body FROM rows r
                                   WHERE r.session_id = e.session_id AND r.tenant_id = $2
                                     AND r.source_sequence = e.sequence AND r.item_index = 0) AS body
                            FROM events e
                           WHERE e.session_id = t.session_id AND e.tenant_id = $2 AND e.type = 'session.compacted'
                           ORDER BY e.sequence DESC LIMIT 1) c ON true
      WHERE t.id = $1 AND t.tenant_id = $2 AND (t.state = 'running') IS TRUE AND t.dispatched_to = $3"
);

/// Serializes as [`berth_protocol::worker::TurnHistoryResult`] (same fields, same order, same omissions), its rows
/// already written.
#[derive(serde::Serialize)]
struct TurnHistoryJson<'a> {
    rows: &'a RawValue,
    next: Option<Position>,
    #[serde(skip_serializing_if = "Option::is_none")]
    handoff: Option<Handoff>,
}

impl Store {
    /// A page of the session's rows (hidden ones left out) for the worker connection that
    /// runs `turn_id` (of session `session_id`), after `after`, as the JSON of its
    /// [`berth_protocol::worker::TurnHistoryResult`]: the rows, where the next page starts
    /// and, on the first page of a compacted session, the handoff the pages start from. The
    /// rows are written straight from PostgreSQL's (as `session.history`'s are): the page goes
    /// to the worker without a `Row` or a `serde_json::Value` built for each row in between.
    ///
    /// One round trip and one snapshot: the turn check with the session's latest compaction
    /// ([`TURN_HANDOFF_SQL`]), the fence and the page. The first page is read as if the
    /// session was never compacted ([`crate::history::UNCOMPACTED_PAGE_SQL`]: no rows
    /// otherwise); a compacted session's first page, starting at its `keepFrom`, is read
    /// after. `running`: a live payload for other replicas' watchers and this replica's id,
    /// notified with this page (see [`TURN_HANDOFF_SQL`]).
    pub async fn turn_history_json(
        &self,
        connection_id: &str,
        tenant_id: &str,
        turn_id: &str,
        session_id: &str,
        after: Option<Position>,
        running: Option<(&str, &str)>,
    ) -> Result<Box<RawValue>> {
        let first = after.is_none();
        let mut p = SessionHistoryParams {
            session_id: session_id.to_string(),
            after,
            limit: Some(TURN_HISTORY_ROWS),
            max_bytes: Some(HISTORY_BUDGET_MAX as u32),
            ..SessionHistoryParams::default()
        };
        let page_sql = if first {
            crate::history::UNCOMPACTED_PAGE_SQL
        } else {
            crate::history::PAGE_SQL
        };
        let client = self.pool.get().await?;
        let (payload, replica) = running.unzip();
        let check: [crate::Param; 6] = [
            &turn_id,
            &tenant_id,
            &connection_id,
            &crate::CHANNEL_DELTAS,
            &payload,
            &replica,
        ];
        let (mut before, read) = self
            .page_with(&client, tenant_id, &p, &[(TURN_HANDOFF_SQL, &check)], page_sql)
            .await?;
        let row = before
            .pop()
            .and_then(|rows| rows.into_iter().next())
            .ok_or(StoreError::Code(ErrorCode::TurnNotRunning))?;
        if row.get::<_, &str>(0) != session_id {
            // The API tier's own record of the turn's session: never another.
            return Err(StoreError::Code(ErrorCode::Internal));
        }
        let handoff = match row.get::<_, Option<serde_json::Value>>(1).filter(|_| first) {
            Some(keep_from) => Some(Handoff {
                keep_from: serde_json::from_value(keep_from).map_err(|e| StoreError::Other(e.into()))?,
                summary: row.get::<_, Option<String>>(2).unwrap_or_default(),
            }),
            None => None,
        };
        let page = match handoff {
            None => read.finish(&client, tenant_id, &p).await?,
            Some(_) => None,
        };
        drop(client);
        let (rows, next) = match page {
            Some(page) => crate::history::page_rows_json(&page)?,
            // Compacted (the pages start at `keepFrom`; `after` is exclusive), or the page's
            // long rows were cleared after it was read: read on its own.
            None => {
                if let Some(h) = &handoff {
                    p.after = Some(Position {
                        source_sequence: h.keep_from.source_sequence,
                        item_index: h.keep_from.item_index - 1,
                    });
                }
                self.page_rows_json(tenant_id, &p).await?
            }
        };
        serde_json::value::to_raw_value(&TurnHistoryJson {
            rows: &rows,
            next,
            handoff,
        })
        .map_err(|e| StoreError::Other(e.into()))
    }

    /// The rest of a row field that a `turn_history` page cut, from byte `offset`.
    pub async fn turn_source(
        &self,
        connection_id: &str,
        tenant_id: &str,
        turn_id: &str,
        position: Position,
        field: RowField,
        offset: u64,
    ) -> Result<SessionSourceResult> {
        let session_id = self.turn_session(connection_id, tenant_id, turn_id).await?;
        self.source(
            tenant_id,
            &SessionSourceParams {
                session_id,
                position,
                field,
                offset,
                limit: Some(HISTORY_BUDGET_MAX as u32),
            },
        )
        .await
    }

    /// The session of a turn that runs and is handed to `connection_id`.
    async fn turn_session(&self, connection_id: &str, tenant_id: &str, turn_id: &str) -> Result<String> {
        let client = self.pool.get().await?;
        crate::tenant_read_opt(
            &client,
            tenant_id,
            "SELECT session_id FROM turns WHERE id = $1 AND tenant_id = $2 AND state = 'running' AND dispatched_to = $3",
            &[&turn_id, &tenant_id, &connection_id],
        )
        .await?
        .map(|r| r.get(0))
        .ok_or(StoreError::Code(ErrorCode::TurnNotRunning))
    }

    /// A running turn's tool call (the `toolCall` row at `position`) moved to `running`:
    /// append `tool.status`. Returns its sequence and, when `local`, the event as written;
    /// `replica` as in [`Store::append_step`].
    #[allow(clippy::too_many_arguments)]
    pub async fn tool_status(
        &self,
        connection_id: &str,
        tenant_id: &str,
        turn_id: &str,
        position: Position,
        call_id: &str,
        status: ToolStatus,
        replica: Option<&str>,
        local: bool,
    ) -> Result<(i64, Vec<EventRecord>)> {
        if status != ToolStatus::Running {
            return Err(StoreError::Code(ErrorCode::BadParams));
        }
        let call = Call {
            position,
            call_id,
            status,
        };
        self.append_for_call(connection_id, tenant_id, turn_id, call, None, replica, local)
            .await
    }

    /// A running turn's model set its plan: append `plan.updated`. Returns its sequence and,
    /// when `local`, the event as written; `replica` as in [`Store::append_step`].
    pub async fn turn_plan(
        &self,
        connection_id: &str,
        tenant_id: &str,
        turn_id: &str,
        plan: berth_protocol::PlanUpdated,
        replica: Option<&str>,
        local: bool,
    ) -> Result<(i64, Vec<EventRecord>)> {
        let client = self.pool.get().await?;
        let tx = crate::Begun::new(&client);
        let c = tx.client();
        let (session_id, _) = lock_running_turn_then(c, Some(connection_id), tenant_id, turn_id, &[]).await?;
        let event = EventPayload::PlanUpdated(plan);
        let append = append_event_as_written(c, tenant_id, &session_id, Some(turn_id), &event, &[], replica, local);
        append_and_commit(tx, append).await
    }

    /// A running turn's tool call ended with a final `status`: append `tool.ended`, which
    /// publishes the `toolResult` row holding the whole `output`. Returns its sequence and,
    /// when `local`, the event as written; `replica` as in [`Store::append_step`].
    #[allow(clippy::too_many_arguments)]
    pub async fn tool_ended(
        &self,
        connection_id: &str,
        tenant_id: &str,
        turn_id: &str,
        position: Position,
        call_id: &str,
        status: ToolStatus,
        output: &str,
        replica: Option<&str>,
        local: bool,
    ) -> Result<(i64, Vec<EventRecord>)> {
        if !status.is_final() {
            return Err(StoreError::Code(ErrorCode::BadParams));
        }
        let call = Call {
            position,
            call_id,
            status,
        };
        self.append_for_call(connection_id, tenant_id, turn_id, call, Some(output), replica, local)
            .await
    }

    /// Move a running turn's tool call to `call.status` and append its event: `tool.ended`
    /// with its `toolResult` row when `output` is given, else `tool.status`. Two waits: the
    /// transaction's `BEGIN`, the tenant switch, the session's lock, the turn's check and the
    /// call row's read go out together; then the call row's update, the append and the
    /// `COMMIT`, once the move is checked.
    #[allow(clippy::too_many_arguments)]
    async fn append_for_call(
        &self,
        connection_id: &str,
        tenant_id: &str,
        turn_id: &str,
        call: Call<'_>,
        output: Option<&str>,
        replica: Option<&str>,
        local: bool,
    ) -> Result<(i64, Vec<EventRecord>)> {
        let client = self.pool.get().await?;
        let tx = crate::Begun::new(&client);
        let c = tx.client();
        let at = call.position;
        let read: [Param; 4] = [&turn_id, &tenant_id, &at.source_sequence, &at.item_index];
        let (session_id, rows) =
            lock_running_turn_then(c, Some(connection_id), tenant_id, turn_id, &[(CALL_ROW_SQL, &read)]).await?;
        let name = call.check(rows[0].first())?;
        let status = call.status.as_str();
        let moved: [Param; 5] = [&session_id, &tenant_id, &at.source_sequence, &at.item_index, &status];
        let payload = ToolCallStatus {
            position: at,
            call_id: call.call_id.to_string(),
            status: call.status,
        };
        let (event, rows) = match output {
            Some(output) => {
                let row = NewRow {
                    kind: RowKind::ToolResult,
                    body: output.to_string(),
                    thinking: None,
                    tool: Some(ToolInfo {
                        name,
                        call_id: call.call_id.to_string(),
                        status: status.to_string(),
                    }),
                    hidden: None,
                };
                (EventPayload::ToolEnded(payload), vec![row])
            }
            None => (EventPayload::ToolStatus(payload), Vec::new()),
        };
        // Prepared first (cached after the first use on a connection), so that the update
        // goes out, and runs, before the append.
        let update = c.prepare_cached(SET_CALL_STATUS_SQL).await?;
        let append = async {
            let (_, appended) = tokio::try_join!(
                biased;
                async { c.execute(&update, &moved).await.map_err(StoreError::from) },
                append_event_as_written(c, tenant_id, &session_id, Some(turn_id), &event, &rows, replica, local),
            )?;
            Ok(appended)
        };
        append_and_commit(tx, append).await
    }
}

/// `append` (the transaction's last statements, ending with [`crate::history::APPEND_SQL`];
/// not polled yet) sent together with `tx`'s `COMMIT`: one wait. An error PostgreSQL raises
/// in any of them fails the whole (it then answers the `COMMIT` with a rollback); an error
/// after the `COMMIT` went out (a lost connection, an answer that does not read) leaves the
/// outcome unknown, and the API tier's watchers then read (`Hub::failed`).
async fn append_and_commit(
    tx: crate::Begun<'_>,
    append: impl std::future::Future<Output = Result<(i64, Vec<EventRecord>)>>,
) -> Result<(i64, Vec<EventRecord>)> {
    // The append statement prepared first (cached after the first use on a connection):
    // one still to be prepared would go out after the `COMMIT`.
    tx.client().prepare_cached(crate::history::APPEND_SQL).await?;
    let (appended, ()) = tokio::try_join!(biased; append, tx.commit())?;
    Ok(appended)
}

/// A tool call's status change, as a worker reports it.
struct Call<'a> {
    position: Position,
    call_id: &'a str,
    status: ToolStatus,
}

impl Call<'_> {
    /// Whether the call row read ([`CALL_ROW_SQL`]) may move to this status: a call that is
    /// not there, already ended, or a move backwards is `bad-params` (never `not-found`,
    /// which tells a worker its turn is over). Returns the tool's name.
    fn check(&self, row: Option<&tokio_postgres::Row>) -> Result<String> {
        let tool = row
            .and_then(|r| r.get::<_, Option<serde_json::Value>>(0))
            .and_then(|t| serde_json::from_value::<ToolInfo>(t).ok())
            .ok_or(StoreError::Code(ErrorCode::BadParams))?;
        let allowed = match ToolStatus::parse(&tool.status) {
            Some(ToolStatus::Requested) => self.status != ToolStatus::Requested,
            Some(ToolStatus::Running) => self.status.is_final(),
            _ => false,
        };
        if tool.call_id != self.call_id || !allowed {
            return Err(StoreError::Code(ErrorCode::BadParams));
        }
        Ok(tool.name)
    }
}

/// The `toolCall` row of turn `$1` (tenant `$2`) at position (`$3`, `$4`), locked; read
/// after the session's lock.
const CALL_ROW_SQL: &str = "SELECT tool FROM rows
  WHERE session_id = (SELECT session_id FROM turns WHERE id = $1 AND tenant_id = $2) AND tenant_id = $2
    AND source_sequence = $3 AND item_index = $4 AND turn_id = $1 AND kind = 'toolCall' FOR UPDATE";

/// The row at position (`$3`, `$4`) of session `$1` (tenant `$2`) moved to status `$5`.
const SET_CALL_STATUS_SQL: &str = "UPDATE rows SET tool = jsonb_set(tool, '{status}', to_jsonb($5::text))
  WHERE session_id = $1 AND tenant_id = $2 AND source_sequence = $3 AND item_index = $4";

#[cfg(test)]
mod tests {
    use berth_protocol::{
        Position, Row, RowKind, ToolInfo,
        worker::{Handoff, TurnHistoryResult},
    };

    use super::TurnHistoryJson;

    /// The page the worker reads is the same text as its typed result's.
    #[test]
    fn the_written_page_is_the_typed_results_text() {
        let at = |s, i| Position {
            source_sequence: s,
            item_index: i,
        };
        let rows = vec![
            Row {
                position: at(3, 0),
                turn_id: Some("t1".into()),
                kind: RowKind::User,
                body: "héllo \"quoted\"\n".into(),
                thinking: None,
                tool: None,
                hidden: None,
                truncated: None,
                attachments: None,
            },
            Row {
                position: at(4, 1),
                turn_id: None,
                kind: RowKind::ToolCall,
                body: "{}".into(),
                thinking: Some("why".into()),
                tool: Some(ToolInfo {
                    name: "shell".into(),
                    call_id: "c1".into(),
                    status: "completed".into(),
                }),
                hidden: None,
                truncated: None,
                attachments: None,
            },
        ];
        let written = serde_json::value::to_raw_value(&rows).unwrap();
        for (next, handoff) in [
            (None, None),
            (
                Some(at(4, 1)),
                Some(Handoff {
                    keep_from: at(3, 0),
                    summary: "earlier".into(),
                }),
            ),
        ] {
            let typed = TurnHistoryResult {
                rows: rows.clone(),
                next,
                handoff: handoff.clone(),
            };
            let raw = TurnHistoryJson {
                rows: &written,
                next,
                handoff,
            };
            assert_eq!(
                serde_json::to_string(&raw).unwrap(),
                serde_json::to_string(&typed).unwrap()
            );
        }
    }
}
