-- A session's provider choice (`session.create {provider, baseUrl}`, `session.setModel`):
-- the client-chosen endpoint, honoured only for a profile that allows one. A turn records
-- the provider and endpoint it was dispatched with, beside its model, so the model proxy
-- holds the worker to them.
ALTER TABLE sessions ADD COLUMN base_url text;
ALTER TABLE turns ADD COLUMN provider text;
ALTER TABLE turns ADD COLUMN base_url text;
-- Automatic titles are tried once per session (after its first settled turn).
ALTER TABLE sessions ADD COLUMN title_attempted boolean NOT NULL DEFAULT false;
