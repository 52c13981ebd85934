//! The per-session event log and its rows.

use std::collections::BTreeMap;

use berth_protocol::{
    ErrorCode, Event, EventPayload, HistoryTarget, Position, Row, RowAttachment, RowField, RowKind,
    SessionHistoryParams, SessionHistoryResult, SessionSourceParams, SessionSourceResult, ToolInfo, Truncation,
};
use deadpool_postgres::GenericClient;
use serde_json::value::RawValue;
use tokio_postgres::types::Json;

use crate::{Cached, Param, Result, Store, StoreError, fmt_time, not_found, tenant_tx};

/// A row's columns as [`row_at`] reads them (a macro, for the statements built with `concat!`).
macro_rules! row_columns {
    () => {
        "source_sequence, item_index, turn_id, kind, body, thinking, tool, hidden, attachments"
    };
}

/// Whether a watcher of session `s.id` (or of the session the expression `$s` names) that
/// replica `$r` does not hold is recorded (`session_watchers`), or `$r` is null: only then
/// must an append's notice go out, since the appending replica `$r` wakes its own watchers
/// directly. Stale rows count (a notice too many is harmless). Registering a watcher takes a
/// share lock on the session row, which conflicts with the appender's `FOR UPDATE` (live
/// output's `FOR NO KEY UPDATE`): so an append either sees the new row (its statement's
/// snapshot is taken after its lock) or commits before the watcher's first read
/// (`Store::watcher_add`).
macro_rules! watched_elsewhere_sql {
    ($r:literal) => {
        watched_elsewhere_sql!($r, "s.id")
    };
    ($r:literal, $s:literal) => {
        concat!(
            $r,
            "::text IS NULL OR EXISTS (SELECT 1 FROM session_watchers w WHERE w.session_id = ",
            $s,
            " AND w.replica_id <> ",
            $r,
            ")"
        )
    };
}

/// A persisted event together with its rows.
pub type EventRecord = Event;

mod append;

pub(crate) use append::{APPEND_SQL, RowArrays, append_event, append_event_as_written, pg_text};

/// Events and their rows from result lines laid out as [`CATCH_UP_SQL`]'s from column `first`
/// on: the sequence (lines without one are skipped), whether the event fits the read (true:
/// it is read whole; false: there is more to read, returned), its type, turn, payload and
/// time, then — when `rows` says the lines have them — one row's [`ROW_COLUMNS`] (null:
/// none), ordered by event, then row. The append statements that return what they wrote ([`Store::append_step`],
/// [`Store::end_turn_with_step`]) use the same layout, so a local watcher handed their
/// events sends exactly what a catch-up would have read.
pub(crate) fn events_from_lines(
    lines: &[tokio_postgres::Row],
    first: usize,
    rows: bool,
    out: &mut Vec<Event>,
) -> Result<bool> {
    let mut more = false;
    for line in lines {
        let Some(sequence) = line.get::<_, Option<i64>>(first) else {
            continue;
        };
        if !line.get::<_, bool>(first + 1) {
            more = true;
            continue;
        }
        if out.last().is_none_or(|e| e.sequence != sequence) {
            out.push(Event {
                sequence,
                at: fmt_time(line.get(first + 5)),
                turn_id: line.get(first + 3),
                rows: Vec::new(),
                payload: stored_payload(line.get(first + 2), line.get(first + 4))?,
            });
        }
        let rows_at = first + 6;
        if rows
            && line.get::<_, Option<i64>>(rows_at).is_some()
            && let Some(e) = out.last_mut()
        {
            e.rows.push(row_at(line, rows_at));
        }
    }
    Ok(more)
}

/// A stored event's payload read back into the typed union (`type` lives in its own column).
fn stored_payload(kind: String, payload: serde_json::Value) -> Result<EventPayload> {
    let mut fields = match payload {
        serde_json::Value::Object(m) => m,
        _ => serde_json::Map::new(),
    };
    fields.insert("type".into(), kind.into());
    serde_json::from_value(fields.into()).map_err(|e| StoreError::Other(anyhow::anyhow!("stored event payload: {e}")))
}

const ROW_COLUMNS: &str = row_columns!();

/// Default and largest page byte budgets for `session.history`.
pub const HISTORY_BUDGET_DEFAULT: usize = 256 << 10;
pub const HISTORY_BUDGET_MAX: usize = 1 << 20;
/// Default and largest `session.source` read.
pub const SOURCE_DEFAULT: usize = 256 << 10;
pub const SOURCE_MAX: usize = 1 << 20;

fn row_from(r: &tokio_postgres::Row) -> Row {
    row_at(r, 0)
}

/// A row whose [`ROW_COLUMNS`] start at column `at`.
fn row_at(r: &tokio_postgres::Row, at: usize) -> Row {
    owned(row_ref(r, at))
}

fn owned(v: RowRef<'_>) -> Row {
    Row {
        position: v.position,
        turn_id: v.turn_id.map(str::to_owned),
        kind: v.kind,
        body: v.body.to_owned(),
        thinking: v.thinking.map(str::to_owned),
        tool: v.tool,
        hidden: v.hidden,
        truncated: None,
        attachments: v.attachments,
    }
}

/// A plain `session.history` page (no target): the page's rows after `$4, $5` up to
/// `least($3, last_sequence)`, at most `$6` and one more (which says there is more), each
/// with its text's size in bytes (column 0; then [`ROW_COLUMNS`]). The cut at the byte
/// budget is made in Rust ([`cut`]), so a row's text comes back only when it is at most
/// `$7` bytes: with `$7` = budget / (`$6` + 1), this statement returns at most one budget of
/// text whatever the rows hold; the longer rows that fall within the page are read after it
/// ([`TEXT_SQL`]). Flat on purpose: the rows come out of the index in page order, so
/// nothing is sorted again, and no window function (a running sum over the page cost
/// ~0.1 ms per 200 rows); the fence is a statement of its own ([`FENCE_SQL`]) in the same
/// snapshot.
pub(crate) const PAGE_SQL: &str = page_sql!("");

/// [`PAGE_SQL`] for the first `turn.history` page, read before the turn's compaction is
/// known: no rows when the session was ever compacted (the pages then start at the
/// compaction's `keepFrom`, read after). The condition is a one-time filter (one probe of
/// `events_compacted`); the rows are read as by [`PAGE_SQL`].
pub(crate) const UNCOMPACTED_PAGE_SQL: &str = page_sql!(
    "AND NOT EXISTS (SELECT 1 FROM events e WHERE e.session_id = $1 AND e.tenant_id = $2 AND e.type = 'session.compacted')"
);

/// [`PAGE_SQL`]'s text with `$extra` among its conditions.
macro_rules! page_sql {
    ($extra:literal) => {
        concat!(
            "
SELECT octet_length(body)::bigint + coalesce(octet_length(thinking), 0)::bigint,
       source_sequence, item_index, turn_id, kind,
       CASE WHEN octet_length(body)::bigint + coalesce(octet_length(thinking), 0)::bigint <= $7::bigint THEN body END,
       CASE WHEN octet_length(body)::bigint + coalesce(octet_length(thinking), 0)::bigint <= $7::bigint THEN thinking END,
       tool, hidden, attachments
  FROM rows
 WHERE session_id = $1 AND tenant_id = $2 AND NOT hidden
   AND source_sequence <= least($3::bigint,
         (SELECT last_sequence FROM sessions WHERE id = $1 AND tenant_id = $2 AND (removed_at IS NULL) IS TRUE))
   AND (source_sequence, item_index) > ($4::bigint, $5::int) ",
            $extra,
            "
 ORDER BY source_sequence, item_index LIMIT $6::bigint + 1"
        )
    };
}
use page_sql;

/// The text of the page's rows that [`PAGE_SQL`] left out (longer than its per-row share
/// of the budget), at positions `($3[k], $4[k])`, in that order.
const TEXT_SQL: &str = "
SELECT r.body, r.thinking
  FROM unnest($3::bigint[], $4::int[]) WITH ORDINALITY AS p(sequence, item, k)
  JOIN rows r ON r.session_id = $1 AND r.tenant_id = $2 AND r.source_sequence = p.sequence AND r.item_index = p.item
 ORDER BY p.k";

/// The session's fence for [`PAGE_SQL`] (no row: no such session). Sessions are read by
/// primary key on the turn path: `(…) IS TRUE` matches no partial index (ARCHITECTURE.md,
/// "Generic plans").
const FENCE_SQL: &str = "SELECT last_sequence, cleared_at_sequence FROM sessions WHERE id = $1 AND tenant_id = $2 AND (removed_at IS NULL) IS TRUE";

/// A watcher's catch-up in one statement: the session's fence (`cleared_at_sequence`; no
/// line at all when the session does not exist), then the events after `$3` in order, each
/// with its rows (one line per row, the event's columns repeated; none for an event
/// without rows): at most `$4` events and no more than `$5` bytes of payloads and row text,
/// but always the first event whole. One more event comes back without payload or rows
/// (`fits` false) when the batch is cut: it says there is more. No event: one line of NULLs
/// after the fence. Each event's rows are an index probe by key of their own (`LATERAL`,
/// kept a subquery by `OFFSET 0`): joined flat, a generic plan made while the tables were
/// small (a connection keeps its plan) probed `rows` by session only and filtered on the
/// sequence, reading all of the session's rows for every event of the batch.
const CATCH_UP_SQL: &str = "
SELECT f.cleared_at_sequence, w.sequence, w.fits, w.type, w.turn_id,
       CASE WHEN w.fits THEN w.payload END, w.at,
       r.source_sequence, r.item_index, r.turn_id, r.kind, r.body, r.thinking, r.tool, r.hidden, r.attachments
  FROM (SELECT cleared_at_sequence FROM sessions
         WHERE id = $1 AND tenant_id = $2 AND (removed_at IS NULL) IS TRUE) f
  LEFT JOIN LATERAL (
    SELECT x.*, (x.n <= $4::bigint AND (x.n = 1 OR x.running <= $5::bigint)) AS fits FROM (
      SELECT e.sequence, e.type, e.turn_id, e.payload, e.at,
             row_number() OVER v AS n,
             (sum(octet_length(e.payload::text)::bigint + coalesce(b.bytes, 0)::bigint) OVER v)::bigint AS running,
             octet_length(e.payload::text)::bigint + coalesce(b.bytes, 0)::bigint AS size
        FROM events e
        LEFT JOIN LATERAL (SELECT sum(octet_length(body) + coalesce(octet_length(thinking), 0)) AS bytes
                             FROM rows WHERE session_id = e.session_id AND source_sequence = e.sequence) b ON true
       WHERE e.session_id = $1 AND e.tenant_id = $2 AND e.sequence > $3::bigint
      WINDOW v AS (ORDER BY e.sequence ROWS UNBOUNDED PRECEDING)
       ORDER BY e.sequence LIMIT $4::bigint + 1
    ) x
    WHERE x.n <= 2 OR x.running - x.size <= $5::bigint
  ) w ON true
  LEFT JOIN LATERAL (
    SELECT r.* FROM rows r
     WHERE w.fits AND r.session_id = $1 AND r.tenant_id = $2 AND r.source_sequence = w.sequence
    OFFSET 0
  ) r ON true
 ORDER BY w.sequence, r.item_index";

/// Cut a row's fields to `budget` bytes in all, `first` served first, marking what was cut.
fn fit(row: &mut Row, budget: usize, first: RowField) {
    let mut left = budget;
    let mut marks = BTreeMap::new();
    let order = match first {
        RowField::Body => [RowField::Body, RowField::Thinking],
        RowField::Thinking => [RowField::Thinking, RowField::Body],
    };
    for field in order {
        let value = match field {
            RowField::Body => Some(&mut row.body),
            RowField::Thinking => row.thinking.as_mut(),
        };
        let Some(value) = value else { continue };
        let total = value.len();
        if total > left {
            let kept = berth_protocol::text::prefix(value, left).len();
            value.truncate(kept);
            marks.insert(
                field,
                Truncation {
                    truncated: true,
                    bytes: total as u64,
                    returned: kept as u64,
                },
            );
            left = 0;
        } else {
            left -= total;
        }
    }
    if !marks.is_empty() {
        row.truncated = Some(marks);
    }
}

/// How many of a [`PAGE_SQL`] answer's rows, whose text sizes are `sizes` in page order,
/// make the page: at most `limit`, and no more than `budget` bytes of text in all, but
/// always the first row (a page of one row is cut to the budget instead). Also whether more
/// follows (a row was left out, or the page ends at `limit` before the answer's extra row).
fn cut(sizes: impl IntoIterator<Item = i64>, limit: usize, budget: usize) -> (usize, bool) {
    let (mut take, mut used) = (0usize, 0u64);
    for size in sizes {
        used = used.saturating_add(size.max(0) as u64);
        if take == limit || (take > 0 && used > budget as u64) {
            return (take, true);
        }
        take += 1;
    }
    (take, false)
}

/// A [`PAGE_SQL`] answer cut to the page, checked: the page's fence, whether more follows,
/// and the text of the page's rows that the statement left out.
pub(crate) struct PageLines {
    lines: Vec<tokio_postgres::Row>,
    /// The page's rows: the first `take` lines.
    take: usize,
    /// The text (body, thinking) of the page's rows that [`PAGE_SQL`] left out, by line.
    texts: Vec<(usize, tokio_postgres::Row)>,
    through: i64,
    budget: usize,
    more: bool,
}

impl PageLines {
    /// The page's rows, their text borrowed.
    fn rows(&self) -> impl Iterator<Item = RowRef<'_>> {
        self.lines[..self.take].iter().enumerate().map(|(i, line)| {
            match self.texts.binary_search_by_key(&i, |(at, _)| *at) {
                Ok(k) => {
                    let text = &self.texts[k].1;
                    row_ref_text(line, 1, (text.get(0), text.get(1)))
                }
                Err(_) => row_ref(line, 1),
            }
        })
    }

    /// Where the next page starts, when there is more.
    fn next_after(&self) -> Option<Position> {
        let last = self.lines[..self.take].last().filter(|_| self.more)?;
        Some(Position {
            source_sequence: last.get(1),
            item_index: last.get(2),
        })
    }

    /// The page as its typed result; a page of one row is cut to the byte budget.
    fn typed(&self) -> SessionHistoryResult {
        let mut rows: Vec<Row> = self.rows().map(owned).collect();
        if let [only] = rows.as_mut_slice() {
            fit(only, self.budget, RowField::Body);
        }
        SessionHistoryResult {
            through: self.through,
            rows,
            next_after: self.next_after(),
        }
    }
}

/// A page row borrowed from its PostgreSQL row: serializes exactly as [`Row`] (same fields,
/// same order, same omissions; `truncated` is never set on a page of several rows).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct RowRef<'a> {
    position: Position,
    #[serde(skip_serializing_if = "Option::is_none")]
    turn_id: Option<&'a str>,
    kind: RowKind,
    body: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool: Option<ToolInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hidden: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    attachments: Option<Vec<RowAttachment>>,
}

/// A row whose [`ROW_COLUMNS`] start at column `at`, its text columns borrowed.
fn row_ref(r: &tokio_postgres::Row, at: usize) -> RowRef<'_> {
    row_ref_text(r, at, (r.get(at + 4), r.get(at + 5)))
}

/// [`row_ref`] with its text (body, thinking) read apart.
fn row_ref_text<'a>(r: &'a tokio_postgres::Row, at: usize, (body, thinking): (&'a str, Option<&'a str>)) -> RowRef<'a> {
    let hidden: bool = r.get(at + 7);
    RowRef {
        position: Position {
            source_sequence: r.get(at),
            item_index: r.get(at + 1),
        },
        turn_id: r.get(at + 2),
        kind: RowKind::parse(r.get(at + 3)).unwrap_or(RowKind::Notice),
        body,
        thinking,
        // A stored value that does not read as the type is left out.
        tool: r
            .try_get::<_, Option<Json<ToolInfo>>>(at + 6)
            .ok()
            .flatten()
            .map(|t| t.0),
        hidden: hidden.then_some(true),
        attachments: r
            .try_get::<_, Option<Json<Vec<RowAttachment>>>>(at + 8)
            .ok()
            .flatten()
            .map(|a| a.0),
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<Box<RawValue>> {
    serde_json::value::to_raw_value(v).map_err(|e| StoreError::Other(e.into()))
}

/// A page's rows, serialized as the `Vec<Row>` they stand for.
struct PageRows<'a>(&'a PageLines);

impl serde::Serialize for PageRows<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_seq(self.0.rows())
    }
}

/// Serializes as [`SessionHistoryResult`] (same fields, same order).
impl serde::Serialize for PageLines {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut out = s.serialize_struct("SessionHistoryResult", 3)?;
        out.serialize_field("through", &self.through)?;
        out.serialize_field("rows", &PageRows(self))?;
        out.serialize_field("nextAfter", &self.next_after())?;
        out.end()
    }
}

/// The fence of a read of a session whose history ends at `last` and was cleared before
/// `cleared`: `through` (absent: `last`; never past it), refused when it, or the event of
/// the `after` position the read resumes from, is before the clear.
pub(crate) fn read_fence(through: Option<i64>, after: Option<i64>, last: i64, cleared: i64) -> Result<i64> {
    let through = match through {
        Some(t) if t < 0 => return Err(StoreError::Code(ErrorCode::BadParams)),
        Some(t) if t < cleared => return Err(StoreError::Code(ErrorCode::HistoryCleared)),
        Some(t) => t.min(last),
        None => last,
    };
    if after.is_some_and(|a| a > 0 && a < cleared) {
        return Err(StoreError::Code(ErrorCode::HistoryCleared));
    }
    Ok(through)
}

impl Store {
    /// The session's (last sequence, cleared-at sequence), or not-found.
    pub(crate) async fn fence(
        &self,
        client: &impl GenericClient,
        tenant_id: &str,
        session_id: &str,
    ) -> Result<(i64, i64)> {
        let row = client.qo(FENCE_SQL, &[&session_id, &tenant_id]).await?;
        match row {
            Some(r) => Ok((r.get(0), r.get(1))),
            None => not_found(),
        }
    }

    /// The session's last sequence, or not-found.
    pub async fn last_sequence(&self, tenant_id: &str, session_id: &str) -> Result<i64> {
        let mut client = self.pool.get().await?;
        let client = tenant_tx(&mut client, tenant_id).await?;
        Ok(self.fence(&client, tenant_id, session_id).await?.0)
    }

    /// Events with `sequence > after`, in order, each with its rows: at most `limit`, and
    /// no more than `max_bytes` of payloads and row text (but always at least one event, which
    /// carries all of its rows). The flag says whether more events followed the batch.
    /// A cursor that points into cleared history answers `history-cleared`.
    pub async fn events_after(
        &self,
        tenant_id: &str,
        session_id: &str,
        after: i64,
        limit: i64,
        max_bytes: usize,
    ) -> Result<(Vec<EventRecord>, bool)> {
        let client = self.pool.get().await?;
        let params: [Param; 5] = [&session_id, &tenant_id, &after, &limit, &(max_bytes as i64)];
        // `BEGIN`, the tenant switch, the statement and `COMMIT` in one round trip.
        let lines = crate::tenant_read(&client, tenant_id, CATCH_UP_SQL, &params).await?;
        let Some(fence) = lines.first() else { return not_found() };
        let cleared: i64 = fence.get(0);
        if after > 0 && after < cleared - 1 {
            return Err(StoreError::Code(ErrorCode::HistoryCleared));
        }
        let mut out: Vec<Event> = Vec::new();
        let more = events_from_lines(&lines, 1, true, &mut out)?;
        let Some(first) = out.first() else {
            return Ok((Vec::new(), false));
        };
        if after > 0 && first.sequence != after + 1 {
            // Cleared: the events right after the cursor are gone.
            return Err(StoreError::Code(ErrorCode::HistoryCleared));
        }
        Ok((out, more))
    }

    /// A page of rows under the `through` fence (pinned to the current last sequence when
    /// absent), after the `after` position, bounded in rows and bytes; or one targeted row
    /// or event. Hidden rows appear only when targeted.
    pub async fn history(&self, tenant_id: &str, p: &SessionHistoryParams) -> Result<SessionHistoryResult> {
        if p.target.is_none() {
            return self.history_page(tenant_id, p).await;
        }
        let mut client = self.pool.get().await?;
        let client = tenant_tx(&mut client, tenant_id).await?;
        let session_id = p.session_id.as_str();
        let (last, cleared) = self.fence(&client, tenant_id, session_id).await?;
        let through = read_fence(p.through, p.after.map(|a| a.source_sequence), last, cleared)?;
        let budget = p
            .max_bytes
            .map_or(HISTORY_BUDGET_DEFAULT, |b| b as usize)
            .clamp(1024, HISTORY_BUDGET_MAX);
        match &p.target {
            Some(HistoryTarget::Row { position, field }) => {
                let row = client
                    .qo(
                        &format!(
                            "SELECT {ROW_COLUMNS} FROM rows WHERE session_id = $1 AND tenant_id = $2
                              AND source_sequence = $3 AND item_index = $4 AND source_sequence <= $5"
                        ),
                        &[
                            &session_id,
                            &tenant_id,
                            &position.source_sequence,
                            &position.item_index,
                            &through,
                        ],
                    )
                    .await?;
                let Some(row) = row else { return not_found() };
                let mut row = row_from(&row);
                fit(&mut row, budget, *field);
                return Ok(SessionHistoryResult {
                    through,
                    rows: vec![row],
                    next_after: None,
                });
            }
            Some(HistoryTarget::Event { sequence }) => {
                if *sequence > through || *sequence < 1 {
                    return not_found();
                }
                let exists = client
                    .qo(
                        "SELECT 1 FROM events WHERE session_id = $1 AND tenant_id = $2 AND sequence = $3",
                        &[&session_id, &tenant_id, sequence],
                    )
                    .await?;
                if exists.is_none() {
                    return not_found();
                }
            }
            None => {}
        }
        let start = p.after.unwrap_or(Position {
            source_sequence: 0,
            item_index: -1,
        });
        // An event's rows are paged like any others (`after` continues within the event);
        // hidden rows show only when their event is opened this way.
        let (lo, hi, hidden) = match &p.target {
            Some(HistoryTarget::Event { sequence }) => (
                start.max(Position {
                    source_sequence: *sequence,
                    item_index: -1,
                }),
                *sequence,
                "true",
            ),
            _ => (start, through, "NOT hidden"),
        };
        let limit = i64::from(p.limit.unwrap_or(100).clamp(1, 500));
        // Sizes first (no bodies read), to decide the page within the byte budget.
        let sizes = client
            .qa(
                &format!(
                    "SELECT source_sequence, item_index, octet_length(body)::bigint + coalesce(octet_length(thinking), 0)::bigint
                       FROM rows WHERE session_id = $1 AND tenant_id = $2 AND {hidden}
                        AND source_sequence <= $3 AND (source_sequence, item_index) > ($4, $5)
                      ORDER BY source_sequence, item_index LIMIT $6"
                ),
                &[&session_id, &tenant_id, &hi, &lo.source_sequence, &lo.item_index, &(limit + 1)],
            )
            .await?;
        let mut take = 0usize;
        let mut used = 0usize;
        for s in sizes.iter().take(limit as usize) {
            let size = s.get::<_, i64>(2) as usize;
            if take > 0 && used + size > budget {
                break;
            }
            used += size;
            take += 1;
        }
        let more = take < sizes.len();
        let Some(last_pos) = sizes.get(take.saturating_sub(1)).filter(|_| take > 0) else {
            return Ok(SessionHistoryResult {
                through,
                rows: Vec::new(),
                next_after: None,
            });
        };
        let last_pos = Position {
            source_sequence: last_pos.get(0),
            item_index: last_pos.get(1),
        };
        let rows = client
            .qa(
                &format!(
                    "SELECT {ROW_COLUMNS} FROM rows WHERE session_id = $1 AND tenant_id = $2 AND {hidden}
                      AND (source_sequence, item_index) > ($3, $4) AND (source_sequence, item_index) <= ($5, $6)
                      ORDER BY source_sequence, item_index"
                ),
                &[
                    &session_id,
                    &tenant_id,
                    &lo.source_sequence,
                    &lo.item_index,
                    &last_pos.source_sequence,
                    &last_pos.item_index,
                ],
            )
            .await?;
        let mut rows: Vec<Row> = rows.iter().map(row_from).collect();
        if let [only] = rows.as_mut_slice() {
            fit(only, budget, RowField::Body);
        }
        Ok(SessionHistoryResult {
            through,
            rows,
            next_after: more.then_some(last_pos),
        })
    }

    /// A page without a target: the fence and the page ([`PAGE_SQL`]) in one round trip
    /// ([`Store::page_with`]); the same answers as the general path.
    async fn history_page(&self, tenant_id: &str, p: &SessionHistoryParams) -> Result<SessionHistoryResult> {
        Ok(self.page_lines(tenant_id, p).await?.typed())
    }

    /// [`Store::history`] written out as its JSON, the same text as serializing its
    /// result. A page of several rows (no target) is written straight from PostgreSQL's
    /// rows: text fields borrowed, no [`Row`] built in between.
    pub async fn history_json(&self, tenant_id: &str, p: &SessionHistoryParams) -> Result<Box<RawValue>> {
        if p.target.is_some() {
            return to_json(&self.history(tenant_id, p).await?);
        }
        let page = self.page_lines(tenant_id, p).await?;
        if page.take < 2 {
            // One row (or none) may be cut to the byte budget: the typed page marks it.
            return to_json(&page.typed());
        }
        to_json(&page)
    }

    /// A page without a target as the JSON array of its rows (the text of
    /// [`SessionHistoryResult::rows`]) and where the next page starts: for answers that carry
    /// a page in a shape of their own (`turn.history`), written as [`Store::history_json`]
    /// writes it.
    pub(crate) async fn page_rows_json(
        &self,
        tenant_id: &str,
        p: &SessionHistoryParams,
    ) -> Result<(Box<RawValue>, Option<Position>)> {
        page_rows_json(&self.page_lines(tenant_id, p).await?)
    }

    /// The page for `p` ([`PAGE_SQL`], cut to the page), with the fence checked.
    async fn page_lines(&self, tenant_id: &str, p: &SessionHistoryParams) -> Result<PageLines> {
        // A clear between the page statement and the read of its long rows deletes them:
        // the page is read again, and answers as a read after the clear does.
        for _ in 0..3 {
            if let Some(page) = self.page_once(tenant_id, p).await? {
                return Ok(page);
            }
        }
        Err(StoreError::Code(ErrorCode::HistoryCleared))
    }

    /// [`Store::page_lines`], or None when the page's long rows were deleted after the page
    /// statement read them.
    async fn page_once(&self, tenant_id: &str, p: &SessionHistoryParams) -> Result<Option<PageLines>> {
        let client = self.pool.get().await?;
        let (_, page) = self.page_with(&client, tenant_id, p, &[], PAGE_SQL).await?;
        page.finish(&client, tenant_id, p).await
    }

    /// The session's fence ([`FENCE_SQL`]) and a page (`page_sql`: [`PAGE_SQL`] or a variant
    /// with its parameters) in one round trip, under the tenant's row-level security as
    /// [`crate::tenant_read`], in one snapshot (repeatable read), so the page is cut at the
    /// same last sequence the fence reports; `before` go first in the same snapshot, their
    /// rows returned first. Not yet cut: [`PageRead::finish`] makes the page.
    pub(crate) async fn page_with(
        &self,
        client: &deadpool_postgres::Object,
        tenant_id: &str,
        p: &SessionHistoryParams,
        before: &[(&str, &[Param<'_>])],
        page_sql: &str,
    ) -> Result<(Vec<Vec<tokio_postgres::Row>>, PageRead)> {
        let through = match p.through {
            Some(t) if t < 0 => return Err(StoreError::Code(ErrorCode::BadParams)),
            t => t.unwrap_or(i64::MAX),
        };
        let budget = p
            .max_bytes
            .map_or(HISTORY_BUDGET_DEFAULT, |b| b as usize)
            .clamp(1024, HISTORY_BUDGET_MAX);
        let lo = p.after.unwrap_or(Position {
            source_sequence: 0,
            item_index: -1,
        });
        let limit = p.limit.unwrap_or(100).clamp(1, 500) as usize;
        // Each row's share of the budget: the page statement returns no more text than one
        // budget, however long its rows are.
        let share = (budget / (limit + 1)) as i64;
        let params: [Param; 7] = [
            &p.session_id,
            &tenant_id,
            &through,
            &lo.source_sequence,
            &lo.item_index,
            &(limit as i64),
            &share,
        ];
        let mut statements = before.to_vec();
        statements.extend([(FENCE_SQL, &params[..2]), (page_sql, &params[..])]);
        let mut results = crate::tenant_snapshot_in_order(client, tenant_id, &statements).await?;
        let lines = results.pop().unwrap_or_default();
        let fence = results.pop().and_then(|rows| rows.into_iter().next());
        Ok((
            results,
            PageRead {
                fence,
                lines,
                through,
                budget,
                limit,
                share,
            },
        ))
    }

    /// Read a row's field onward from byte `offset` (which must be a character boundary).
    pub async fn source(&self, tenant_id: &str, p: &SessionSourceParams) -> Result<SessionSourceResult> {
        let mut client = self.pool.get().await?;
        let client = tenant_tx(&mut client, tenant_id).await?;
        let (_, cleared) = self.fence(&client, tenant_id, &p.session_id).await?;
        if p.position.source_sequence < cleared {
            return Err(StoreError::Code(ErrorCode::HistoryCleared));
        }
        let column = match p.field {
            RowField::Body => "body",
            RowField::Thinking => "thinking",
        };
        let row = client
            .qo(
                &format!(
                    "SELECT {column} FROM rows WHERE session_id = $1 AND tenant_id = $2 AND source_sequence = $3 AND item_index = $4"
                ),
                &[&p.session_id, &tenant_id, &p.position.source_sequence, &p.position.item_index],
            )
            .await?;
        let Some(row) = row else { return not_found() };
        let value: String = row.get::<_, Option<String>>(0).unwrap_or_default();
        let offset = usize::try_from(p.offset).map_err(|_| StoreError::Code(ErrorCode::BadParams))?;
        if offset > value.len() || !value.is_char_boundary(offset) {
            return Err(StoreError::Code(ErrorCode::BadParams));
        }
        let limit = p.limit.map_or(SOURCE_DEFAULT, |l| l as usize).clamp(4, SOURCE_MAX);
        let rest = &value[offset..];
        let data = berth_protocol::text::prefix(rest, limit);
        let end = offset + data.len();
        Ok(SessionSourceResult {
            data: data.to_string(),
            offset: p.offset,
            next_offset: (end < value.len()).then_some(end as u64),
            bytes: value.len() as u64,
        })
    }
}

/// [`Store::page_rows_json`] of a page already read.
pub(crate) fn page_rows_json(page: &PageLines) -> Result<(Box<RawValue>, Option<Position>)> {
    if page.take < 2 {
        let typed = page.typed();
        return Ok((to_json(&typed.rows)?, typed.next_after));
    }
    Ok((to_json(&PageRows(page))?, page.next_after()))
}

/// A page's statements as read ([`Store::page_with`]), not yet cut to the page.
pub(crate) struct PageRead {
    fence: Option<tokio_postgres::Row>,
    lines: Vec<tokio_postgres::Row>,
    through: i64,
    budget: usize,
    limit: usize,
    share: i64,
}

impl PageRead {
    /// The page: the fence checked, the lines cut, the text of its long rows read. None
    /// when those rows were deleted after the page statement read them (a clear: read the
    /// page again).
    pub(crate) async fn finish(
        self,
        client: &deadpool_postgres::Object,
        tenant_id: &str,
        p: &SessionHistoryParams,
    ) -> Result<Option<PageLines>> {
        let PageRead { fence, lines, .. } = self;
        let (through, budget, limit, share) = (self.through, self.budget, self.limit, self.share);
        let Some(fence) = fence else { return not_found() };
        let (last, cleared): (i64, i64) = (fence.get(0), fence.get(1));
        if p.through.is_some_and(|t| t < cleared) {
            return Err(StoreError::Code(ErrorCode::HistoryCleared));
        }
        if p.after
            .is_some_and(|a| a.source_sequence > 0 && a.source_sequence < cleared)
        {
            return Err(StoreError::Code(ErrorCode::HistoryCleared));
        }
        let size = |line: &tokio_postgres::Row| line.get::<_, i64>(0);
        let (take, more) = cut(lines.iter().map(size), limit, budget);
        // The page's rows longer than their share, read now. A row's text never changes, so
        // a later snapshot reads the same text, unless the row was deleted since (a clear).
        let long: Vec<usize> = (0..take).filter(|&i| size(&lines[i]) > share).collect();
        let mut texts = Vec::new();
        if !long.is_empty() {
            let sequences: Vec<i64> = long.iter().map(|&i| lines[i].get(1)).collect();
            let items: Vec<i32> = long.iter().map(|&i| lines[i].get(2)).collect();
            let read = crate::tenant_read(
                client,
                tenant_id,
                TEXT_SQL,
                &[&p.session_id, &tenant_id, &sequences, &items],
            )
            .await?;
            if read.len() != long.len() {
                return Ok(None);
            }
            texts = long.into_iter().zip(read).collect();
        }
        Ok(Some(PageLines {
            lines,
            take,
            texts,
            through: through.min(last),
            budget,
            more,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(body: &str, thinking: Option<&str>) -> Row {
        Row {
            position: Position {
                source_sequence: 1,
                item_index: 0,
            },
            turn_id: None,
            kind: RowKind::Assistant,
            body: body.into(),
            thinking: thinking.map(Into::into),
            tool: None,
            hidden: None,
            truncated: None,
            attachments: None,
        }
    }

    /// The page is the longest prefix within the limit and the budget, the first row always.
    #[test]
    fn cut_takes_the_longest_prefix_within_limit_and_budget() {
        // Within both: all, and nothing more.
        assert_eq!(cut([10, 20, 30], 5, 100), (3, false));
        // The budget is inclusive; the row past it is left for the next page.
        assert_eq!(cut([40, 60, 1], 5, 100), (2, true));
        assert_eq!(cut([40, 61, 1], 5, 100), (1, true));
        // The first row always, even past the budget (it is cut later).
        assert_eq!(cut([500, 1], 5, 100), (1, true));
        assert_eq!(cut([500], 5, 100), (1, false));
        // The limit: the answer's extra row says there is more.
        assert_eq!(cut([1, 1, 1], 2, 100), (2, true));
        assert_eq!(cut([1, 1], 2, 100), (2, false));
        // A long row after small ones ends the page before it, not at it.
        assert_eq!(cut([1, 1, 1000, 1], 5, 100), (2, true));
        assert_eq!(cut([], 5, 100), (0, false));
    }

    #[test]
    fn fit_cuts_on_char_boundaries_and_marks_fields() {
        let mut r = row("héllo wörld", Some("thoughts"));
        fit(&mut r, 2, RowField::Body);
        assert_eq!(r.body, "h");
        assert_eq!(r.thinking.as_deref(), Some(""));
        let marks = r.truncated.unwrap();
        assert_eq!(
            marks[&RowField::Body],
            Truncation {
                truncated: true,
                bytes: 13,
                returned: 1
            }
        );
        assert_eq!(marks[&RowField::Thinking].bytes, 8);

        let mut small = row("ok", None);
        fit(&mut small, 100, RowField::Body);
        assert!(small.truncated.is_none());

        // The targeted field is served first.
        let mut r = row("a long body", Some("think"));
        fit(&mut r, 5, RowField::Thinking);
        assert_eq!(r.thinking.as_deref(), Some("think"));
        assert_eq!(r.body, "");
        let marks = r.truncated.unwrap();
        assert!(!marks.contains_key(&RowField::Thinking));
        assert_eq!(marks[&RowField::Body].returned, 0);
    }
}
