-- Sessions, queue, history and receipts: the complete semantics.

ALTER TABLE sessions ADD COLUMN provider text;
-- The sequence of the `session.cleared` event of the last clear (0: never cleared).
-- Cursors that point before it answer `history-cleared`.
ALTER TABLE sessions ADD COLUMN cleared_at_sequence bigint NOT NULL DEFAULT 0;

-- Live output of the running step, coalesced (the replica holding the worker appends to it
-- every ~50 ms), so a watcher joining mid-turn on any replica sees the partial text so far.
ALTER TABLE turns ADD COLUMN step integer NOT NULL DEFAULT 0;
ALTER TABLE turns ADD COLUMN partial_text text NOT NULL DEFAULT '';
ALTER TABLE turns ADD COLUMN partial_thinking text NOT NULL DEFAULT '';

CREATE TABLE diagnostics (
    id          text PRIMARY KEY,
    tenant_id   text NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    session_id  text NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    revision    bigint NOT NULL,
    kind        text NOT NULL,
    turn_id     text,
    sequence    bigint,
    cause       jsonb NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    UNIQUE (session_id, revision)
);
ALTER TABLE sessions ADD COLUMN diagnostic_revision bigint NOT NULL DEFAULT 0;

-- One row per (tenant, principal, operationId). `pending` while the first attempt runs
-- (owned by `owner`); the mutation's own transaction flips it to `done` with the outcome,
-- so an outcome is recorded exactly when the work was done.
CREATE TABLE operation_receipts (
    tenant_id     text NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    principal     text NOT NULL,
    operation_id  text NOT NULL,
    method        text NOT NULL,
    params_hash   text NOT NULL,
    state         text NOT NULL CHECK (state IN ('pending', 'done')),
    owner         text NOT NULL,
    result        jsonb,
    error         jsonb,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, principal, operation_id)
);
CREATE INDEX operation_receipts_age ON operation_receipts (created_at);
