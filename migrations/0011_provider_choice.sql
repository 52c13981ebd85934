-- A session's provider choice (`session.create {provider, baseUrl}`, `session.setModel`):
-- the client-chosen endpoint, honoured only for a profile that allows one. A turn records
-- the provider and endpoint it was dispatched with, beside its model, so the model proxy
-- holds the worker to them.
ALTER TABLE sessions ADD COLUMN base_url text;
ALTER TABLE turns ADD COLUMN provider text;
ALTER TABLE turns ADD COLUMN base_url text;
-- Automatic titles are tried once per session (after its first settled turn).
ALTER TABLE sessions ADD COLUMN title_attempted boolean NOT NULL DEFAULT false;

-- `session.context`: what each main model request of a session held (input by role, tool
-- schemas, estimated tokens; no message text) and the input usage the provider reported.
-- `sequence` is the session's last event when the request was made (the `through` fence).
CREATE TABLE context_records (
    id            text PRIMARY KEY,
    tenant_id     text NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    session_id    text NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    turn_id       text,
    sequence      bigint NOT NULL,
    provider      text,
    model         text,
    report        jsonb NOT NULL,
    input_tokens  bigint,
    at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX context_records_latest ON context_records (session_id, sequence DESC, at DESC);
ALTER TABLE context_records ENABLE ROW LEVEL SECURITY;
ALTER TABLE context_records FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON context_records TO berth_app
    USING (tenant_id = current_setting('berth.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('berth.tenant_id', true));
DO $$
BEGIN
    EXECUTE format('CREATE POLICY system_access ON context_records TO %I USING (true) WITH CHECK (true)', current_user);
END
$$;
