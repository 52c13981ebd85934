-- Issue 47: nothing the agent starts is more permissive than what started it, and shared
-- definitions have an owner.
--
-- `sessions.may_auto_approve`: whether the session's agent may auto-approve its tool calls.
-- A child session (a coordinator's `start_child`, a `delegate`) records its parent's
-- effective approval here when it is created, so an agent whose approval is `auto` cannot
-- widen what a parent that asks for approval allowed. Sessions clients create keep `true`.
ALTER TABLE sessions ADD COLUMN may_auto_approve boolean NOT NULL DEFAULT true;

-- `owner`: the user (or, for a user without one, the credential) that created the
-- definition; only it or a tenant admin may change or remove it. Definitions created before
-- this have none: admins only.
ALTER TABLE agents ADD COLUMN owner text;
ALTER TABLE skills ADD COLUMN owner text;
