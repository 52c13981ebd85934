-- Running turns by the worker connection they were handed to, for the turns of a connection
-- (its end, the sweep, the proxy's and tools' checks), now only those handed out; the
-- running turns not yet handed out, for the claim, get an index of their own.
--
-- With the predicate `state = 'running'` alone, `turns_dispatched` matched every statement
-- about running turns, and a generic plan made while the table was small (a connection keeps
-- its plan until the statistics change) could read all of it where `turns_one_running` finds
-- a session's running turn by key (admission read every running turn on each `session.send`).
-- `turns_undispatched` is deliberately not in the claim's order (`started_at`): given that
-- order, a generic plan of the claim dropped its sort and ran its locking subquery again for
-- every candidate row (docs/performance.md, issue 20).
DROP INDEX turns_dispatched;
CREATE INDEX turns_dispatched ON turns (dispatched_to) WHERE state = 'running' AND dispatched_to IS NOT NULL;
CREATE INDEX turns_undispatched ON turns (session_id) WHERE state = 'running' AND dispatched_to IS NULL;
