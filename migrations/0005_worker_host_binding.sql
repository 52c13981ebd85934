-- A worker credential serves one host: bound on its first `worker.hello`, and a host has at
-- most one live (unrevoked) worker credential per tenant. Rotating = create a new
-- credential, revoke the old one, start the worker with the new one.
ALTER TABLE credentials ADD COLUMN host text;
CREATE UNIQUE INDEX credentials_live_host ON credentials (tenant_id, host) WHERE host IS NOT NULL AND revoked_at IS NULL;
