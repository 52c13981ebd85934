-- A session's turns by position, whatever their state: admission reads the session's
-- highest position on every `session.send` (the queued and running ones have partial
-- indexes; ended turns had none, so that read scanned the whole table, growing with every
-- turn of every session). Also serves the coordinator's first/last turn of a session and
-- the cascade when a session is deleted.
CREATE INDEX turns_session ON turns (session_id, queue_position);
