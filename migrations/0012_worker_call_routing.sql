-- Routing worker calls (git, files) to the replica that holds the worker's connection:
-- each replica announces the address other replicas reach it at, and replicas prove to
-- each other that they belong to this cluster with a secret the first replica generates
-- (random, from the OS) and that only the owner role can read (not tenant-scoped transactions).
CREATE TABLE replicas (
    replica_id    text PRIMARY KEY,
    internal_url  text NOT NULL,
    heartbeat_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE cluster_secret (
    id      boolean PRIMARY KEY DEFAULT true CHECK (id),
    secret  text NOT NULL
);
REVOKE ALL ON cluster_secret FROM berth_app;
