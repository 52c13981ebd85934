-- A child may auto-run only what its parent could.
--
-- `sessions.auto_approve_within`: the tools a child session (a coordinator's `start_child`,
-- a `delegate`) may run without asking, recorded when it is created: the tool set of the
-- parent's agent (a JSON array of tool names), else the parent's own bound; NULL: no bound.
-- `may_auto_approve` (0022) stops a child of a parent that asks from auto-approving at all;
-- this stops a child of a parent that auto-runs only some tools (an agent that may only read,
-- say) from auto-running tools beyond them: a child whose own tool set is not within the
-- bound asks for every call that needs approval.
ALTER TABLE sessions ADD COLUMN auto_approve_within jsonb;
