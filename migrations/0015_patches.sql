-- Patch snapshots (issue 12): metadata here, the patch text in object storage under
-- `object_key` (`<tenant>/patches/<id>`). Immutable once written.
CREATE TABLE patches (
    id          text PRIMARY KEY,
    tenant_id   text NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    session_id  text NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    turn_id     text,
    base        text,
    files       integer NOT NULL,
    bytes       bigint NOT NULL,
    sha256      text NOT NULL,
    object_key  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX patches_session ON patches (session_id);
-- The orphan sweep asks which stored objects have no row.
CREATE UNIQUE INDEX patches_object_key ON patches (object_key);

ALTER TABLE patches ENABLE ROW LEVEL SECURITY;
ALTER TABLE patches FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON patches TO berth_app
    USING (tenant_id = current_setting('berth.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('berth.tenant_id', true));
DO $$
BEGIN
    EXECUTE format('CREATE POLICY system_access ON patches TO %I USING (true) WITH CHECK (true)', current_user);
END
$$;
GRANT SELECT, INSERT, DELETE ON patches TO berth_app;
