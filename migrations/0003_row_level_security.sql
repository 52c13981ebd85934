-- Row-level security: the second line of tenant isolation.
--
-- Tenant-scoped work runs as `berth_app` (not the owner, no BYPASSRLS), switched to per
-- transaction together with the tenant: `set_config('role', 'berth_app', true)` and
-- `set_config('berth.tenant_id', <tenant>, true)`. Its policies admit only that tenant's
-- rows. The owner (the migrating role) keeps a policy of its own for system work that is
-- cross-tenant by nature (authenticating a credential, sweeping dead workers, retention).
-- FORCE makes the owner subject to policies too, so nothing reaches the tables unchecked.

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'berth_app') THEN
        CREATE ROLE berth_app NOLOGIN NOSUPERUSER NOBYPASSRLS;
    END IF;
    EXECUTE format('GRANT berth_app TO %I', current_user);
END
$$;

GRANT USAGE ON SCHEMA public TO berth_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO berth_app;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO berth_app;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO berth_app;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO berth_app;
REVOKE ALL ON berth_migrations FROM berth_app;

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['users', 'credentials', 'audit_log', 'workspaces', 'worker_presence', 'sessions',
                             'turns', 'events', 'rows', 'diagnostics', 'operation_receipts']
    LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format(
            'CREATE POLICY tenant_isolation ON %I TO berth_app
                USING (tenant_id = current_setting(''berth.tenant_id'', true))
                WITH CHECK (tenant_id = current_setting(''berth.tenant_id'', true))', t);
        EXECUTE format('CREATE POLICY system_access ON %I TO %I USING (true) WITH CHECK (true)', t, current_user);
    END LOOP;
    ALTER TABLE tenants ENABLE ROW LEVEL SECURITY;
    ALTER TABLE tenants FORCE ROW LEVEL SECURITY;
    CREATE POLICY tenant_isolation ON tenants TO berth_app
        USING (id = current_setting('berth.tenant_id', true));
    EXECUTE format('CREATE POLICY system_access ON tenants TO %I USING (true) WITH CHECK (true)', current_user);
END
$$;
