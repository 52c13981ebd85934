-- Agent definitions (SPEC §4.16): a tenant's shared agents — system prompt, tool set, model
-- and params, approval policy. A session names at most one (`sessions.agent_id`); removing
-- the agent leaves its sessions on the built-in defaults.
CREATE TABLE agents (
    id            text PRIMARY KEY,
    tenant_id     text NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    name          text NOT NULL,
    description   text,
    system_prompt text,
    -- The tools offered, by name (null: every built-in tool).
    tools         jsonb,
    provider      text,
    model         text,
    params        jsonb,
    approval      text NOT NULL DEFAULT 'ask' CHECK (approval IN ('ask', 'auto')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, name)
);
ALTER TABLE agents ENABLE ROW LEVEL SECURITY;
ALTER TABLE agents FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON agents TO berth_app
    USING (tenant_id = current_setting('berth.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('berth.tenant_id', true));
DO $$
BEGIN
    EXECUTE format('CREATE POLICY system_access ON agents TO %I USING (true) WITH CHECK (true)', current_user);
END
$$;

ALTER TABLE sessions ADD COLUMN agent_id text REFERENCES agents(id) ON DELETE SET NULL;
CREATE INDEX sessions_agent ON sessions (agent_id) WHERE agent_id IS NOT NULL;

-- Compaction (SPEC §4.17): a turn's history starts at the latest `session.compacted` event
-- (its handoff row stands for the rows before its `keepFrom`); found without scanning the log.
CREATE INDEX events_compacted ON events (session_id, sequence DESC) WHERE type = 'session.compacted';

-- Tenant skills (SPEC §4.16): instruction documents offered to the model by name and summary
-- and read on demand (workspace skills live in the workspace, not here).
CREATE TABLE skills (
    id          text PRIMARY KEY,
    tenant_id   text NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    name        text NOT NULL,
    summary     text NOT NULL,
    body        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, name)
);
ALTER TABLE skills ENABLE ROW LEVEL SECURITY;
ALTER TABLE skills FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON skills TO berth_app
    USING (tenant_id = current_setting('berth.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('berth.tenant_id', true));
DO $$
BEGIN
    EXECUTE format('CREATE POLICY system_access ON skills TO %I USING (true) WITH CHECK (true)', current_user);
END
$$;
