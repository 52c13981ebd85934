-- Sub-agents: a session started by a turn's delegate call names its parent session, the
-- parent turn and the call (one child per call, so a retried request makes no second one),
-- and how many levels deeper it may delegate in turn.
ALTER TABLE sessions
    ADD COLUMN parent_id        text,
    ADD COLUMN parent_turn_id   text,
    ADD COLUMN parent_call_id   text,
    ADD COLUMN delegation_depth integer NOT NULL DEFAULT 1 CHECK (delegation_depth >= 0);

CREATE INDEX sessions_parent ON sessions (tenant_id, parent_id, updated_at DESC, id DESC) WHERE parent_id IS NOT NULL;
CREATE UNIQUE INDEX sessions_parent_call ON sessions (parent_turn_id, parent_call_id) WHERE parent_turn_id IS NOT NULL;
