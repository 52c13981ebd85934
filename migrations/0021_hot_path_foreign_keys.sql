-- The foreign keys checked on every turn that nothing needs: each check is a locking look-up
-- in a trigger at the end of the writing statement, and the tenant keys all lock the one row
-- of a tenant, so concurrent turns of a tenant made PostgreSQL build a multixact for it on
-- every insert (docs/performance.md, issue 20: a turn's executor time at 50 at once fell by
-- about a fifth without them).
--
-- What guarantees each instead:
-- - `turns`, `context_records` and `sessions` → `tenants`: rows are written under row-level
--   security, whose `WITH CHECK` admits only the tenant of the transaction (an authenticated
--   principal's), and no tenant is ever deleted.
-- - `events` → `sessions`: every append takes its sequence from the `UPDATE sessions …
--   RETURNING` of the same statement (a fork, from the session it inserted just before), so
--   the session exists and is locked until the commit. Sessions are deleted only with their
--   workspace, which deletes their events first (`Store::remove_workspace`).
-- - `rows` → `events`: a row is inserted by the statement that inserts its event, with the
--   event's key; `session.clear` and workspace removal delete the rows with the events.
-- The other keys of these tables (the turns' and context records' sessions, the sessions'
-- workspaces) stay: their cascades remove a workspace's sessions, turns and records.
ALTER TABLE turns DROP CONSTRAINT turns_tenant_id_fkey;
ALTER TABLE context_records DROP CONSTRAINT context_records_tenant_id_fkey;
ALTER TABLE sessions DROP CONSTRAINT sessions_tenant_id_fkey;
ALTER TABLE events DROP CONSTRAINT events_session_id_fkey;
ALTER TABLE rows DROP CONSTRAINT rows_session_id_source_sequence_fkey;
