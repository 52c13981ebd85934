-- Event payloads follow the protocol crate's typed union (issue 21): queue entries carry a
-- preview and the prompt's size instead of the whole prompt, and their revision is named
-- `queueRevision`. Rewrite payloads stored in the older shape.
CREATE FUNCTION pg_temp.queue_entry(e jsonb, turn text) RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object(
        'queueId', e->>'queueId',
        'turnId', coalesce(e->>'turnId', turn, e->>'queueId'),
        'queueRevision', coalesce((e->>'revision')::bigint, 0),
        -- 64 characters are at most 256 bytes of UTF-8.
        'preview', left(coalesce(e->>'prompt', ''), 64),
        'promptBytes', octet_length(coalesce(e->>'prompt', '')))
$$;

UPDATE events SET payload = jsonb_build_object('entry', pg_temp.queue_entry(payload, turn_id))
 WHERE type = 'turn.queued' AND payload ? 'prompt';

UPDATE events SET payload = jsonb_build_object(
        'paused', coalesce(payload->'paused', 'false'::jsonb),
        'queue', coalesce((SELECT jsonb_agg(pg_temp.queue_entry(e, NULL) ORDER BY n)
                             FROM jsonb_array_elements(payload->'queue') WITH ORDINALITY AS q(e, n)), '[]'::jsonb))
 WHERE type = 'queue.changed' AND EXISTS (SELECT 1 FROM jsonb_array_elements(payload->'queue') q(e) WHERE q.e ? 'prompt');

-- Absent, never null: optional fields without a value are left out.
UPDATE events SET payload = jsonb_strip_nulls(payload) WHERE payload::text LIKE '%null%';
