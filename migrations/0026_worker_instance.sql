-- The worker process a connection belongs to: a random key each worker process makes at
-- start and keeps only in its memory (`worker.hello`'s `instance`). While a connection of a
-- credential is live, a connection of the same credential from another process is refused,
-- so a command that read the worker's token file cannot connect as the worker beside it.
ALTER TABLE worker_presence ADD COLUMN instance text;
