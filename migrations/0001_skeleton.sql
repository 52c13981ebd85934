-- Berth's first schema: tenancy, credentials, workspaces, sessions, turns, history.
-- Forward-only. Every tenant-owned table carries tenant_id and every query filters on it.

CREATE TABLE tenants (
    id          text PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE users (
    id            text PRIMARY KEY,
    tenant_id     text NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    email         text NOT NULL,
    role          text NOT NULL CHECK (role IN ('admin', 'member')),
    password_hash text,
    disabled_at   timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, email)
);

CREATE TABLE credentials (
    id            text PRIMARY KEY,
    tenant_id     text NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    kind          text NOT NULL CHECK (kind IN ('user', 'worker')),
    user_id       text REFERENCES users(id) ON DELETE CASCADE,
    sha256        bytea NOT NULL UNIQUE,
    note          text NOT NULL DEFAULT '',
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz,
    last_used_at  timestamptz,
    revoked_at    timestamptz,
    CHECK ((kind = 'user') = (user_id IS NOT NULL))
);
CREATE INDEX credentials_tenant ON credentials (tenant_id, created_at);

CREATE TABLE audit_log (
    id         bigserial PRIMARY KEY,
    tenant_id  text NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    actor      text NOT NULL,
    action     text NOT NULL,
    target     text NOT NULL,
    at         timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE workspaces (
    id            text PRIMARY KEY,
    tenant_id     text NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    host          text NOT NULL,
    name          text NOT NULL,
    path          text NOT NULL,
    title         text NOT NULL,
    last_seen_at  timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, host, name)
);

-- One row per live worker connection; the replica that holds it dispatches its turns.
CREATE TABLE worker_presence (
    connection_id  text PRIMARY KEY,
    tenant_id      text NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    credential_id  text NOT NULL,
    replica_id     text NOT NULL,
    workspace_ids  text[] NOT NULL,
    connected_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX worker_presence_workspaces ON worker_presence USING gin (workspace_ids);

CREATE TABLE sessions (
    id             text PRIMARY KEY,
    tenant_id      text NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    workspace_id   text NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    title          text NOT NULL DEFAULT '',
    model          text,
    no_tools       boolean NOT NULL DEFAULT false,
    auto_approve   boolean NOT NULL DEFAULT false,
    last_sequence  bigint NOT NULL DEFAULT 0,
    revision       bigint NOT NULL DEFAULT 0,
    paused         boolean NOT NULL DEFAULT false,
    removed_at     timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sessions_list ON sessions (tenant_id, updated_at DESC, id DESC) WHERE removed_at IS NULL;

CREATE TABLE turns (
    id              text PRIMARY KEY,
    tenant_id       text NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    session_id      text NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    state           text NOT NULL CHECK (state IN ('queued', 'running', 'completed', 'failed', 'cancelled', 'interrupted')),
    prompt          text NOT NULL,
    queue_position  bigint NOT NULL,
    queue_revision  bigint NOT NULL DEFAULT 0,
    -- The worker connection a running turn was handed to (NULL: not yet handed out).
    dispatched_to   text,
    cause           jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    ended_at        timestamptz
);
CREATE UNIQUE INDEX turns_one_running ON turns (session_id) WHERE state = 'running';
CREATE INDEX turns_queue ON turns (session_id, queue_position) WHERE state = 'queued';
CREATE INDEX turns_dispatched ON turns (dispatched_to) WHERE state = 'running';

-- The gapless per-session log. `sequence` is assigned by bumping sessions.last_sequence in
-- the appending transaction, so it has no holes and a single order.
CREATE TABLE events (
    session_id  text NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    sequence    bigint NOT NULL,
    tenant_id   text NOT NULL,
    type        text NOT NULL,
    turn_id     text,
    payload     jsonb NOT NULL DEFAULT '{}',
    at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, sequence)
);

CREATE TABLE rows (
    session_id       text NOT NULL,
    source_sequence  bigint NOT NULL,
    item_index       integer NOT NULL,
    tenant_id        text NOT NULL,
    turn_id          text,
    kind             text NOT NULL,
    body             text NOT NULL,
    thinking         text,
    tool             jsonb,
    hidden           boolean NOT NULL DEFAULT false,
    PRIMARY KEY (session_id, source_sequence, item_index),
    FOREIGN KEY (session_id, source_sequence) REFERENCES events(session_id, sequence) ON DELETE CASCADE
);
