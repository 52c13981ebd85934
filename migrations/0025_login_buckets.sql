-- Sign-in attempts per account, counted across replicas (`Store::login_take`): one token
-- bucket per account, stored as the instant it is full again (GCRA's "theoretical arrival
-- time"). The key is the SHA-256 of the tenant's id (or the name as typed, when no tenant
-- has it) and the lowercased e-mail, so a tenant typed by name or by id, or a sign-in sent
-- to another replica, takes from the same bucket. No tenant data: only the owner role
-- (which answers sign-ins before any tenant is known) reads or writes it.
CREATE TABLE login_buckets (
    key bytea PRIMARY KEY,
    full_at timestamptz NOT NULL
);
REVOKE ALL ON login_buckets FROM berth_app;
