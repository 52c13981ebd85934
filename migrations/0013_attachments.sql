-- Attachments (issue 12): metadata here, bytes in object storage under `object_key`.
-- A turn lists its attachments in order; a fork's turns may name its source's attachments
-- (they are the tenant's, not the session's, once uploaded).
CREATE TABLE attachments (
    id          text PRIMARY KEY,
    tenant_id   text NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    session_id  text NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    name        text NOT NULL,
    mime_type   text NOT NULL,
    bytes       bigint NOT NULL,
    sha256      text NOT NULL,
    object_key  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX attachments_session ON attachments (session_id);
-- The orphan sweep asks which stored objects have no row.
CREATE UNIQUE INDEX attachments_object_key ON attachments (object_key);

ALTER TABLE turns ADD COLUMN attachment_ids text[] NOT NULL DEFAULT '{}';
-- A user row names its turn's attachments ([{attachmentId, name, mimeType, bytes, sha256}]);
-- a fork copies it, which keeps those attachments alive while the fork lives.
ALTER TABLE rows ADD COLUMN attachments jsonb;
CREATE INDEX rows_attachments ON rows USING gin (attachments jsonb_path_ops) WHERE attachments IS NOT NULL;

ALTER TABLE attachments ENABLE ROW LEVEL SECURITY;
ALTER TABLE attachments FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON attachments TO berth_app
    USING (tenant_id = current_setting('berth.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('berth.tenant_id', true));
DO $$
BEGIN
    EXECUTE format('CREATE POLICY system_access ON attachments TO %I USING (true) WITH CHECK (true)', current_user);
END
$$;
GRANT SELECT, INSERT, UPDATE, DELETE ON attachments TO berth_app;
