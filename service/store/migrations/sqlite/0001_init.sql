-- 0001: sessions, one-time claims, login failures, approval tickets, tasks, audit chain.
-- SQLite dialect of the same schema: REAL times, JSON as TEXT (encoded and decoded by the service).
-- Times are REAL unix seconds supplied by the service (the database clock is never read).

CREATE TABLE sessions (
    id             TEXT PRIMARY KEY,
    subject_id     TEXT NOT NULL,
    kind           TEXT NOT NULL,
    authn_method   TEXT NOT NULL,
    auth_time      REAL NOT NULL,
    created_at     REAL NOT NULL,
    expires_at     REAL NOT NULL,
    step_up_at     REAL,
    step_up_method TEXT,
    revoked_at     REAL
);
CREATE INDEX sessions_subject_idx ON sessions (subject_id);

CREATE TABLE once_claims (
    namespace  TEXT NOT NULL,
    key        TEXT NOT NULL,
    expires_at REAL NOT NULL,
    claimed_at REAL NOT NULL,
    PRIMARY KEY (namespace, key)
);
CREATE INDEX once_claims_expires_idx ON once_claims (expires_at);

CREATE TABLE login_failures (
    id  INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    at  REAL NOT NULL
);
CREATE INDEX login_failures_key_at_idx ON login_failures (key, at);

CREATE TABLE tickets (
    id                      TEXT PRIMARY KEY,
    subject_id              TEXT NOT NULL,
    env                     TEXT NOT NULL,
    resource                TEXT NOT NULL,
    resource_hash           TEXT NOT NULL,
    action                  TEXT NOT NULL,
    command_hash            TEXT,
    nonce_hash              TEXT NOT NULL,
    state                   TEXT NOT NULL CHECK (state IN
                                ('pending', 'approved', 'rejected', 'expired', 'revoked', 'consumed')),
    requested_by            TEXT NOT NULL,
    reason                  TEXT,
    created_at              REAL NOT NULL,
    pending_until           REAL NOT NULL,
    approved_at             REAL,
    expires_at              REAL,
    consumed_at             REAL,
    consumed_correlation_id TEXT,
    closed_by               TEXT,
    closed_at               REAL,
    approval                TEXT NOT NULL
);
CREATE INDEX tickets_created_idx ON tickets (created_at, id);
CREATE INDEX tickets_state_idx ON tickets (state, created_at DESC);
CREATE INDEX tickets_subject_idx ON tickets (subject_id, created_at DESC);

CREATE TABLE ticket_reviews (
    ticket_id  TEXT NOT NULL REFERENCES tickets (id) ON DELETE CASCADE,
    reviewer   TEXT NOT NULL,
    pos        INTEGER NOT NULL,
    decision   TEXT NOT NULL CHECK (decision IN ('approve', 'reject')),
    group_name TEXT,
    reason     TEXT,
    at         REAL NOT NULL,
    -- One review per reviewer per ticket, enforced by the database, not only by the domain.
    PRIMARY KEY (ticket_id, reviewer)
);

CREATE TABLE tasks (
    id         TEXT PRIMARY KEY,
    state      TEXT NOT NULL CHECK (state IN ('pending', 'running', 'succeeded', 'failed')),
    progress   INTEGER NOT NULL DEFAULT 0,
    result     TEXT,
    created_by TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    last_seq   INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE task_events (
    task_id TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    seq     INTEGER NOT NULL,
    kind    TEXT NOT NULL,
    at      REAL NOT NULL,
    actor   TEXT NOT NULL,
    data    TEXT NOT NULL,
    PRIMARY KEY (task_id, seq)
);

-- The audit head is one row: appending locks it (UPDATE), which serialises writers across replicas.
CREATE TABLE audit_head (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    seq  INTEGER NOT NULL,
    hash TEXT NOT NULL
);
INSERT INTO audit_head (id, seq, hash)
VALUES (1, 0, 'sha256:0000000000000000000000000000000000000000000000000000000000000000');

-- entry is stored exactly as sealed (JSON text), like every JSON column here.
CREATE TABLE audit_log (
    seq       INTEGER PRIMARY KEY,
    prev_hash TEXT NOT NULL,
    hash      TEXT NOT NULL,
    entry     TEXT NOT NULL
);
