-- Channel sessions (issue 17): the chat channel a session's answers are read on, and the
-- turn that produced an attachment (a file the model attached with `attach_file`; null for
-- a client's upload). The turn's reply row names the files it produced.
ALTER TABLE sessions ADD COLUMN channel text;
ALTER TABLE attachments ADD COLUMN turn_id text;
CREATE INDEX attachments_turn ON attachments (turn_id) WHERE turn_id IS NOT NULL;
