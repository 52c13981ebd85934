-- Running turns by the worker connection they were handed to, for the turns of a connection
-- (its end, the sweep, the proxy's and tools' checks), now only those handed out. Running
-- turns not yet handed out are few and the claim finds them by `turns_one_running`.
--
-- With the predicate `state = 'running'` alone this index matched every statement about
-- running turns, and a generic plan made while the table was small (a connection keeps its
-- plan until the statistics change) could read all of it where `turns_one_running` finds a
-- session's running turn by key (admission read every running turn on each `session.send`).
DROP INDEX turns_dispatched;
CREATE INDEX turns_dispatched ON turns (dispatched_to) WHERE state = 'running' AND dispatched_to IS NOT NULL;
