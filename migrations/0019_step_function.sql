-- A worker's completed model step (`turn.step`) in one statement (issue 8): the tenant
-- switch, the session lock, the relay of the step's live output and the step itself, in a
-- function the store calls as one protocol message in an implicit transaction, instead of
-- `BEGIN`, switch, lock, relay, step and `COMMIT` as six (each answered and flushed on its
-- own). The end of a turn calls it too, inside its own transaction, for a last step it
-- carries. Changing what a step writes means a new migration replacing this function.
--
-- Lock order: the session row first (`FOR UPDATE`, as `session.stop`, clear and remove
-- take it), then the turn's row (updated by the step). Everything after the lock reads a
-- snapshot taken after it, so the running-turn check sees every committed stop.
--
-- `locked` is false when the turn does not exist for the tenant (`not-found`); `seq` is
-- null when nothing was written (the turn is not running, was handed to another
-- connection, or its session was removed: `turn-not-running`). The event's notice goes out
-- only when `p_notify` and someone may need it: any watcher when `p_replica` (the appending
-- replica, which wakes its own watchers) is null, else only a watcher another replica
-- recorded (`session_watchers`; registering one share-locks the session row, which
-- conflicts with the lock taken here).
CREATE FUNCTION berth_step(
    p_turn text, p_tenant text, p_connection text,
    p_kinds text[], p_bodies text[], p_thinking text[], p_tools jsonb[], p_hidden boolean[],
    p_reply int, p_event text, p_channel text, p_replica text, p_notify boolean,
    p_relay_channel text, p_relay text[],
    OUT locked boolean, OUT seq bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_session text;
BEGIN
    -- Tenant-scoped, as every tenant transaction: row-level security applies from here on.
    PERFORM set_config('role', 'berth_app', true), set_config('berth.tenant_id', p_tenant, true);
    PERFORM 1 FROM sessions
      WHERE id = (SELECT session_id FROM turns WHERE id = p_turn AND tenant_id = p_tenant) FOR UPDATE;
    locked := FOUND;
    IF NOT locked THEN
        RETURN;
    END IF;
    IF cardinality(p_relay) > 0 THEN
        PERFORM pg_notify(p_relay_channel, p) FROM unnest(p_relay) WITH ORDINALITY AS n(p, i)
          WHERE EXISTS (SELECT 1 FROM turns t JOIN sessions s ON s.id = t.session_id
                         WHERE t.id = p_turn AND t.tenant_id = p_tenant AND t.state = 'running'
                           AND s.removed_at IS NULL AND (p_connection IS NULL OR t.dispatched_to = p_connection))
          ORDER BY i;
    END IF;
    WITH t AS (SELECT t.session_id FROM turns t JOIN sessions s ON s.id = t.session_id
                WHERE t.id = p_turn AND t.tenant_id = p_tenant AND t.state = 'running' AND s.removed_at IS NULL
                  AND (p_connection IS NULL OR t.dispatched_to = p_connection)),
         u AS (UPDATE turns x SET step = x.step + 1, partial_text = '', partial_thinking = '', step_usage = NULL
                 FROM (SELECT step_usage FROM turns WHERE id = p_turn) old
                WHERE x.id = p_turn AND EXISTS (SELECT 1 FROM t) RETURNING old.step_usage AS usage),
         s AS (UPDATE sessions SET last_sequence = last_sequence + 1, updated_at = now()
                WHERE id = (SELECT session_id FROM t) AND tenant_id = p_tenant RETURNING id, last_sequence),
         e AS (INSERT INTO events (session_id, sequence, tenant_id, type, turn_id, payload)
               SELECT s.id, s.last_sequence, p_tenant, p_event, p_turn,
                      CASE WHEN u.usage IS NULL THEN '{}'::jsonb
                           ELSE jsonb_build_object('usage', jsonb_build_object(
                                    'inputTokens', (u.usage->>'inputTokens')::bigint,
                                    'outputTokens', (u.usage->>'outputTokens')::bigint)) END
                 FROM s, u),
         named AS (SELECT jsonb_agg(jsonb_build_object('attachmentId', a.id, 'name', a.name, 'mimeType', a.mime_type,
                                                       'bytes', a.bytes, 'sha256', a.sha256) ORDER BY a.created_at, a.id) AS list
                     FROM attachments a
                    WHERE p_reply IS NOT NULL AND a.turn_id = p_turn AND a.tenant_id = p_tenant
                      AND NOT EXISTS (SELECT 1 FROM rows r WHERE r.session_id = (SELECT session_id FROM t) AND r.tenant_id = p_tenant
                                         AND r.attachments @> jsonb_build_array(jsonb_build_object('attachmentId', a.id)))),
         r AS (INSERT INTO rows (session_id, source_sequence, item_index, tenant_id, turn_id, kind, body, thinking, tool, hidden,
                                 attachments)
               SELECT s.id, s.last_sequence, (v.n - 1)::int, p_tenant, p_turn, v.kind, v.body, v.thinking, v.tool, v.hidden,
                      CASE WHEN v.n - 1 = p_reply THEN (SELECT list FROM named) END
                 FROM s, unnest(p_kinds, p_bodies, p_thinking, p_tools, p_hidden)
                         WITH ORDINALITY AS v(kind, body, thinking, tool, hidden, n))
    SELECT s.id, s.last_sequence INTO v_session, seq FROM s;
    IF seq IS NOT NULL AND p_notify
       AND (p_replica IS NULL
            OR EXISTS (SELECT 1 FROM session_watchers w WHERE w.session_id = v_session AND w.replica_id <> p_replica)) THEN
        PERFORM pg_notify(p_channel, v_session || ':' || seq);
    END IF;
END
$fn$;
