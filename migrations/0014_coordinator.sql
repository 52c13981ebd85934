-- Coordinator sessions (issue 18): a session of kind 'coordinator' starts and directs
-- child sessions in any of the tenant's workspaces (children name it in parent_id, and the
-- turn that started them in parent_turn_id, as sub-agents do). A turn the coordinator sent
-- to an existing child names the coordinator's turn, so stopping that turn stops it too.
ALTER TABLE sessions ADD COLUMN kind text CHECK (kind IN ('coordinator'));
ALTER TABLE turns ADD COLUMN parent_turn_id text;
CREATE INDEX turns_parent_turn ON turns (parent_turn_id) WHERE parent_turn_id IS NOT NULL AND state IN ('running', 'queued');
