-- Interactions: tool calls held for approval and questions put to the user (SPEC §4.6).
--
-- A row is created `pending` by the worker's `turn.interaction` request and resolved exactly
-- once: `answered` (a user), `expired` (its timeout passed: the fallback answered),
-- `unwatched` (nobody watched the session when it was asked: the fallback answered at
-- once), `auto` (an autoApprove session approved it) or `closed` (its turn ended first).
-- `answer` is the recorded outcome (`{"approved": bool}` or `{"choice": string|null}`).
CREATE TABLE interactions (
    id           text PRIMARY KEY,
    tenant_id    text NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    session_id   text NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    turn_id      text NOT NULL REFERENCES turns(id) ON DELETE CASCADE,
    -- The worker's id for this request within the turn: asking again finds the same row.
    call_id      text NOT NULL,
    kind         text NOT NULL,
    -- What the client shows: {tool?, input, options?, params?}.
    request      jsonb NOT NULL,
    -- The outcome recorded when nobody answers.
    fallback     jsonb NOT NULL,
    state        text NOT NULL CHECK (state IN ('pending', 'answered', 'expired', 'unwatched', 'auto', 'closed')),
    answer       jsonb,
    answered_by  text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    resolved_at  timestamptz,
    UNIQUE (turn_id, call_id),
    CHECK ((state = 'pending') = (answer IS NULL))
);
CREATE INDEX interactions_pending ON interactions (session_id, created_at) WHERE state = 'pending';
CREATE INDEX interactions_expiry ON interactions (expires_at) WHERE state = 'pending';

-- Who watches a session, across replicas: one row per open `session.watch`, kept alive by
-- the replica that holds it (heartbeat every 10 s). Rows of a replica that died stop
-- counting once their heartbeat is 45 s old and are swept. An interaction asked while no row counts
-- is answered by its fallback at once.
CREATE TABLE session_watchers (
    id            text PRIMARY KEY,
    tenant_id     text NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    session_id    text NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    replica_id    text NOT NULL,
    heartbeat_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX session_watchers_session ON session_watchers (session_id);
CREATE INDEX session_watchers_replica ON session_watchers (replica_id);

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['interactions', 'session_watchers']
    LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format(
            'CREATE POLICY tenant_isolation ON %I TO berth_app
                USING (tenant_id = current_setting(''berth.tenant_id'', true))
                WITH CHECK (tenant_id = current_setting(''berth.tenant_id'', true))', t);
        EXECUTE format('CREATE POLICY system_access ON %I TO %I USING (true) WITH CHECK (true)', t, current_user);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I TO berth_app', t);
    END LOOP;
END
$$;
