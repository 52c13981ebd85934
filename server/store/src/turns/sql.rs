//! SQL several files of the module share: the claim's columns and dispatch values, the
//! locks on a turn's session, the running-turn check, the relay and the step statement.

/// A step's usage (`$u`, the `{inputTokens, outputTokens}` object of `turns.step_usage`, or
/// null) with `$input` and `$output` tokens added.
macro_rules! usage_plus_sql {
    ($u:literal, $input:literal, $output:literal) => {
        concat!(
            "jsonb_build_object('inputTokens', coalesce((",
            $u,
            "->>'inputTokens')::bigint, 0) + ",
            $input,
            ", 'outputTokens', coalesce((",
            $u,
            "->>'outputTokens')::bigint, 0) + ",
            $output,
            ")"
        )
    };
}

/// What a turn handed out is run with ([`claimed_from`] reads them by position), from the turn
/// `t`, its session `s` and the session's agent `a`.
///
/// [`claimed_from`]: super::claim::claimed_from
macro_rules! claimed_columns {
    () => {
        concat!(
            "t.id, t.session_id, s.workspace_id, t.model, s.no_tools, ",
            effective_auto_approve!(),
            ", s.delegation_depth,
         s.kind IS NOT DISTINCT FROM 'coordinator', t.provider, a.id, a.system_prompt, a.tools, a.params,
         s.channel"
        )
    };
}

/// The model, provider and endpoint a turn of session `s` (with its agent `a`) is dispatched
/// with, the default model being `$default`. The model resolves session > agent > tenant
/// default; the agent's model comes with its provider (and without the session's endpoint).
macro_rules! dispatch_values {
    ($default:literal) => {
        concat!(
            "coalesce(s.model, a.model, ",
            $default,
            "),
             CASE WHEN s.model IS NULL AND a.model IS NOT NULL THEN a.provider ELSE s.provider END,
             CASE WHEN s.model IS NULL AND a.model IS NOT NULL THEN NULL ELSE s.base_url END"
        )
    };
}

/// The session row of turn `$1` of tenant `$2`, by key (no row: no such turn), for the
/// locks below.
macro_rules! session_of_turn_sql {
    () => {
        "SELECT id FROM sessions WHERE id = (SELECT session_id FROM turns WHERE id = $1 AND tenant_id = $2)"
    };
}

/// Locks the session of turn `$1` of tenant `$2` (the session row first, as stop, clear and
/// remove do); no row: no such turn.
pub(super) const LOCK_SESSION_OF_TURN: &str = concat!(session_of_turn_sql!(), " FOR UPDATE");

/// The session of turn `$1` (tenant `$2`) if it runs, its session is not removed and, when
/// `$3` names a worker connection, it was handed to that connection. Read in a statement
/// after [`LOCK_SESSION_OF_TURN`], so under the lock.
///
/// The turn and its session are each read by primary key, in subqueries the planner keeps
/// (`OFFSET 0`) so that the conditions on them are checked after the probe: joined flat, a
/// generic plan made while the tables were small (a connection keeps its plan until the
/// statistics change) scanned every running turn (the partial indexes on running turns
/// match `state = 'running'`) and every session of the tenant, on each call.
macro_rules! running_turn_sql {
    () => {
        "SELECT t.session_id
           FROM (SELECT session_id, state, dispatched_to FROM turns WHERE id = $1 AND tenant_id = $2 OFFSET 0) t
           JOIN LATERAL (SELECT id, removed_at FROM sessions WHERE id = t.session_id OFFSET 0) s ON true
          WHERE t.state = 'running' AND s.removed_at IS NULL AND ($3::text IS NULL OR t.dispatched_to = $3)"
    };
}

/// Live output relayed to other replicas (payloads `$5` on channel `$4`, in order) if the
/// turn runs ([`running_turn_sql`]) and a watcher that replica `$6` does not hold is
/// recorded (or `$6` is null): the appending replica relays to its own watchers itself.
/// Read after [`LOCK_SESSION_OF_TURN`], so a watcher registering meanwhile is either seen
/// or reads the stored output after this commits (`watched_elsewhere_sql`).
pub(super) const RELAY_SQL: &str = concat!(
    "SELECT pg_notify($4, p) FROM unnest($5::text[]) WITH ORDINALITY AS n(p, i)
      WHERE EXISTS (",
    running_turn_sql!(),
    " AND (",
    watched_elsewhere_sql!("$6"),
    ")) ORDER BY i"
);

/// A completed step of a running turn ([`running_turn_sql`]; nothing is written otherwise)
/// in one statement: the turn's step moves on and its metered usage is read and reset (read
/// under the turn row's lock, `FOR UPDATE`: a meter of another replica committed while the
/// step waited for the row is the step's, not lost to the reset), the session's sequence is
/// bumped (gapless: the session row is locked), and the `model.completed` event (`$10`,
/// naming the step it completed, with that usage), its rows (`$4`..`$8` by item) and the
/// notice go in. Usage metered on the appending replica comes as parameters: `$15` input
/// and `$16` output tokens (null: none) are added to the turn's totals and the step's, and
/// each context record `$17` gets its call's input tokens `$18`: the first by primary key
/// (`c`; `= ANY` of the array, planned generically for ten ids while the table was small,
/// scanned the whole table on every step), any others (a step of more than one call, rare)
/// in `c2`, which runs only then. The reply row (`$9`, a step without tool calls) names the
/// turn's files not named yet. Returns the event as a catch-up reads it
/// (`history::events_from_lines` from column 0: the sequence first), one line per row when
/// `$14` is set (else one line, without the rows), or no line when the turn does not run.
///
/// The event's notice (`$11`) goes out only when `$13` is set and someone may need it: any
/// watcher when `$12` (the appending replica, which wakes its own watchers itself) is null,
/// else only a watcher another replica recorded (`watched_elsewhere_sql`). It is computed
/// once (`n`, materialized), whatever the number of lines.
pub(super) const STEP_SQL: &str = concat!(
    "WITH t AS (",
    running_turn_sql!(),
    "),
     u AS (UPDATE turns x SET step = x.step + 1, partial_text = '', partial_thinking = '', step_usage = NULL,
                              input_tokens = x.input_tokens + coalesce($15::bigint, 0),
                              output_tokens = x.output_tokens + coalesce($16::bigint, 0)
             FROM (SELECT step_usage FROM turns WHERE id = $1 FOR UPDATE) old
            WHERE x.id = $1 AND EXISTS (SELECT 1 FROM t)
           RETURNING x.step - 1 AS step,
                     CASE WHEN $15::bigint IS NULL THEN old.step_usage
                          ELSE ",
    usage_plus_sql!("old.step_usage", "$15", "$16"),
    " END AS usage),
     c AS (UPDATE context_records x SET input_tokens = ($18::bigint[])[1]
            WHERE x.id = ($17::text[])[1] AND x.tenant_id = $2 AND EXISTS (SELECT 1 FROM t)),
     c2 AS (UPDATE context_records x SET input_tokens = ($18::bigint[])[array_position($17::text[], x.id)]
             WHERE cardinality($17::text[]) > 1 AND x.id = ANY(($17::text[])[2:]) AND x.tenant_id = $2
               AND EXISTS (SELECT 1 FROM t)),
     s AS (UPDATE sessions SET last_sequence = last_sequence + 1, updated_at = now()
            WHERE id = (SELECT session_id FROM t) AND tenant_id = $2 RETURNING id, last_sequence),
     e AS (INSERT INTO events (session_id, sequence, tenant_id, type, turn_id, payload)
           SELECT s.id, s.last_sequence, $2, $10, $1,
                  jsonb_build_object('step', u.step) ||
                  CASE WHEN u.usage IS NULL THEN '{}'::jsonb
                       ELSE jsonb_build_object('usage', jsonb_build_object(
                                'inputTokens', (u.usage->>'inputTokens')::bigint,
                                'outputTokens', (u.usage->>'outputTokens')::bigint)) END
             FROM s, u
           RETURNING type, turn_id, payload, at),
     named AS (SELECT jsonb_agg(jsonb_build_object('attachmentId', a.id, 'name', a.name, 'mimeType', a.mime_type,
                                                   'bytes', a.bytes, 'sha256', a.sha256) ORDER BY a.created_at, a.id) AS list
                 FROM attachments a
                WHERE $9::int IS NOT NULL AND a.turn_id = $1 AND a.tenant_id = $2
                  AND NOT EXISTS (SELECT 1 FROM rows r WHERE r.session_id = (SELECT session_id FROM t) AND r.tenant_id = $2
                                     AND r.attachments @> jsonb_build_array(jsonb_build_object('attachmentId', a.id)))),
     r AS (INSERT INTO rows (session_id, source_sequence, item_index, tenant_id, turn_id, kind, body, thinking, tool, hidden,
                             attachments)
           SELECT s.id, s.last_sequence, (v.n - 1)::int, $2, $1, v.kind, v.body, v.thinking, v.tool, v.hidden,
                  CASE WHEN v.n - 1 = $9::int THEN (SELECT list FROM named) END
             FROM s, unnest($4::text[], $5::text[], $6::text[], $7::jsonb[], $8::bool[])
                     WITH ORDINALITY AS v(kind, body, thinking, tool, hidden, n)
           RETURNING ", row_columns!(), "),
     n AS MATERIALIZED (SELECT (SELECT pg_notify($11, s.id || ':' || s.last_sequence) WHERE $13::bool AND (",
    watched_elsewhere_sql!("$12"),
    ")) FROM s)
     SELECT s.last_sequence, true, e.type, e.turn_id, e.payload, e.at, r.*
       FROM s CROSS JOIN e CROSS JOIN n LEFT JOIN r ON $14::bool ORDER BY r.item_index"
);
