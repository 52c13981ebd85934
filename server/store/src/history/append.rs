//! Appending to the event log: one event and the rows it publishes, in one statement.

use berth_protocol::{Event, EventPayload, NewRow, ToolInfo};
use deadpool_postgres::GenericClient;

use super::events_from_lines;
use crate::{CHANNEL_EVENTS, Cached, Result, StoreError, not_found};

/// PostgreSQL text cannot hold NUL: model output that contains it is stored with U+FFFD.
pub(crate) fn pg_text(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains('\0') {
        std::borrow::Cow::Owned(s.replace('\0', "\u{FFFD}"))
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

/// A row's tool as stored (without NUL).
fn tool_json(t: &ToolInfo) -> serde_json::Value {
    let clean = ToolInfo {
        name: pg_text(&t.name).into_owned(),
        call_id: pg_text(&t.call_id).into_owned(),
        status: pg_text(&t.status).into_owned(),
    };
    serde_json::to_value(clean).unwrap_or_default()
}

/// Rows as the parallel arrays the append statements `unnest` (kind, body, thinking, tool,
/// hidden; [`APPEND_SQL`], `turns/sql.rs`'s step statement).
pub(crate) struct RowArrays<'a> {
    pub kinds: Vec<&'static str>,
    pub bodies: Vec<std::borrow::Cow<'a, str>>,
    pub thinking: Vec<Option<std::borrow::Cow<'a, str>>>,
    pub tools: Vec<Option<serde_json::Value>>,
    pub hidden: Vec<bool>,
}

impl<'a> RowArrays<'a> {
    pub fn new(rows: &'a [NewRow]) -> RowArrays<'a> {
        RowArrays {
            kinds: rows.iter().map(|r| r.kind.as_str()).collect(),
            bodies: rows.iter().map(|r| pg_text(&r.body)).collect(),
            thinking: rows.iter().map(|r| r.thinking.as_deref().map(pg_text)).collect(),
            tools: rows.iter().map(|r| r.tool.as_ref().map(tool_json)).collect(),
            hidden: rows.iter().map(|r| r.hidden.unwrap_or(false)).collect(),
        }
    }
}

/// One event (`$3` type, `$4` turn, `$5` payload) and the rows it publishes (`$6`..`$10` by
/// item) appended to session `$1` of tenant `$2`, with its notice on channel `$11`, in one
/// statement (one wait): the session's sequence bumped (its row locked, so sequences stay
/// gapless), the event and its rows under it. Returns the event as a catch-up reads it
/// ([`events_from_lines`] from column 0), one line per row when `$12` is set (else one line,
/// without the rows), or no line when the session is not the tenant's.
///
/// The notice goes out always when `$13` is null; else `$13` is the appending replica, which
/// wakes its own watchers itself, and it goes out only when a watcher another replica holds
/// is recorded (`watched_elsewhere_sql`). That is sound only when an earlier statement of the
/// transaction locked the session row (this statement's snapshot is then taken under the
/// lock, see `watched_elsewhere_sql`).
pub(crate) const APPEND_SQL: &str = concat!(
    "
WITH s AS (UPDATE sessions SET last_sequence = last_sequence + 1, updated_at = now()
            WHERE id = $1 AND tenant_id = $2 RETURNING id, last_sequence),
     e AS (INSERT INTO events (session_id, sequence, tenant_id, type, turn_id, payload)
           SELECT s.id, s.last_sequence, $2, $3, $4, $5 FROM s
           RETURNING type, turn_id, payload, at),
     r AS (INSERT INTO rows (session_id, source_sequence, item_index, tenant_id, turn_id, kind, body, thinking, tool, hidden)
           SELECT s.id, s.last_sequence, (v.n - 1)::int, $2, $4, v.kind, v.body, v.thinking, v.tool, v.hidden
             FROM s, unnest($6::text[], $7::text[], $8::text[], $9::jsonb[], $10::bool[])
                     WITH ORDINALITY AS v(kind, body, thinking, tool, hidden, n)
           RETURNING ",
    row_columns!(),
    "),
     n AS MATERIALIZED (SELECT (SELECT pg_notify($11, s.id || ':' || s.last_sequence) WHERE ",
    watched_elsewhere_sql!("$13"),
    ") FROM s)
SELECT s.last_sequence, true, e.type, e.turn_id, e.payload, e.at, r.*
  FROM s CROSS JOIN e CROSS JOIN n LEFT JOIN r ON $12::bool ORDER BY r.item_index"
);

/// Append one event (and the rows it publishes) inside the caller's transaction. The
/// sequence comes from bumping `sessions.last_sequence`, which also serializes appends per
/// session; the NOTIFY is delivered when the transaction commits. Only the typed union can
/// be appended, so every stored event is one the protocol crate describes.
pub(crate) async fn append_event(
    tx: &impl GenericClient,
    tenant_id: &str,
    session_id: &str,
    turn_id: Option<&str>,
    event: &EventPayload,
    rows: &[NewRow],
) -> Result<i64> {
    Ok(
        append_event_as_written(tx, tenant_id, session_id, turn_id, event, rows, None, false)
            .await?
            .0,
    )
}

/// [`append_event`], also returning the event as written when `local` (for the appending
/// replica's own watchers: what a catch-up would read; empty otherwise). `replica`: the
/// appending replica, when it wakes its own watchers and the session is locked already
/// ([`APPEND_SQL`]'s `$13`); None: the notice always goes out.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn append_event_as_written(
    tx: &impl GenericClient,
    tenant_id: &str,
    session_id: &str,
    turn_id: Option<&str>,
    event: &EventPayload,
    rows: &[NewRow],
    replica: Option<&str>,
    local: bool,
) -> Result<(i64, Vec<Event>)> {
    let kind = event.type_name();
    let mut payload = serde_json::to_value(event).map_err(|e| StoreError::Other(e.into()))?;
    if let Some(fields) = payload.as_object_mut() {
        fields.remove("type");
    }
    let rows = RowArrays::new(rows);
    let written = tx
        .qa(
            APPEND_SQL,
            &[
                &session_id,
                &tenant_id,
                &kind,
                &turn_id,
                &payload,
                &rows.kinds,
                &rows.bodies,
                &rows.thinking,
                &rows.tools,
                &rows.hidden,
                &CHANNEL_EVENTS,
                &local,
                &replica,
            ],
        )
        .await?;
    let Some(seq) = written.first().map(|r| r.get(0)) else {
        return not_found();
    };
    let mut events = Vec::new();
    if local {
        events_from_lines(&written, 0, true, &mut events)?;
    }
    Ok((seq, events))
}
