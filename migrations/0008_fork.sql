-- Forks: where a session was branched from (`session.fork`), as
-- {sessionId, turnId?, sequence}; NULL for a session that was not forked.
ALTER TABLE sessions ADD COLUMN branch jsonb;
