-- The tenant's MCP servers (SPEC §4.16): the workers running the tenant's turns connect to
-- the enabled ones. `transport` is the definition as saved (`{"kind": "stdio", command,
-- args, env}` or `{"kind": "http", url, headers}`); header and environment values may be
-- secrets, stored as given (no encryption at rest; the table is under RLS like the rest)
-- and never read back to clients.
CREATE TABLE mcp_servers (
    tenant_id   text NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    name        text NOT NULL,
    transport   jsonb NOT NULL,
    enabled     boolean NOT NULL DEFAULT true,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, name)
);
ALTER TABLE mcp_servers ENABLE ROW LEVEL SECURITY;
ALTER TABLE mcp_servers FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON mcp_servers TO berth_app
    USING (tenant_id = current_setting('berth.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('berth.tenant_id', true));
DO $$
BEGIN
    EXECUTE format('CREATE POLICY system_access ON mcp_servers TO %I USING (true) WITH CHECK (true)', current_user);
END
$$;
