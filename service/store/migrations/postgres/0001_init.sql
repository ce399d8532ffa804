-- 0001: sessions, one-time claims, login failures, approval tickets, tasks, audit chain.
-- Times are DOUBLE PRECISION unix seconds supplied by the service (the database clock is never read).

CREATE TABLE sessions (
    id             TEXT PRIMARY KEY,
    subject_id     TEXT NOT NULL,
    kind           TEXT NOT NULL,
    authn_method   TEXT NOT NULL,
    auth_time      DOUBLE PRECISION NOT NULL,
    created_at     DOUBLE PRECISION NOT NULL,
    expires_at     DOUBLE PRECISION NOT NULL,
    step_up_at     DOUBLE PRECISION,
    step_up_method TEXT,
    revoked_at     DOUBLE PRECISION
);
CREATE INDEX sessions_subject_idx ON sessions (subject_id);

CREATE TABLE once_claims (
    namespace  TEXT NOT NULL,
    key        TEXT NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    claimed_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (namespace, key)
);
CREATE INDEX once_claims_expires_idx ON once_claims (expires_at);

CREATE TABLE login_failures (
    id  BIGSERIAL PRIMARY KEY,
    key TEXT NOT NULL,
    at  DOUBLE PRECISION NOT NULL
);
CREATE INDEX login_failures_key_at_idx ON login_failures (key, at);

CREATE TABLE tickets (
    id                      TEXT PRIMARY KEY,
    subject_id              TEXT NOT NULL,
    env                     TEXT NOT NULL,
    resource                JSONB NOT NULL,
    resource_hash           TEXT NOT NULL,
    action                  TEXT NOT NULL,
    command_hash            TEXT,
    nonce_hash              TEXT NOT NULL,
    state                   TEXT NOT NULL CHECK (state IN
                                ('pending', 'approved', 'rejected', 'expired', 'revoked', 'consumed')),
    requested_by            TEXT NOT NULL,
    reason                  TEXT,
    created_at              DOUBLE PRECISION NOT NULL,
    pending_until           DOUBLE PRECISION NOT NULL,
    approved_at             DOUBLE PRECISION,
    expires_at              DOUBLE PRECISION,
    consumed_at             DOUBLE PRECISION,
    consumed_correlation_id TEXT,
    closed_by               TEXT,
    closed_at               DOUBLE PRECISION,
    approval                JSONB NOT NULL
);
CREATE INDEX tickets_created_idx ON tickets (created_at DESC, id DESC);
CREATE INDEX tickets_state_idx ON tickets (state, created_at DESC);
CREATE INDEX tickets_subject_idx ON tickets (subject_id, created_at DESC);

CREATE TABLE ticket_reviews (
    ticket_id  TEXT NOT NULL REFERENCES tickets (id) ON DELETE CASCADE,
    reviewer   TEXT NOT NULL,
    pos        INTEGER NOT NULL,
    decision   TEXT NOT NULL CHECK (decision IN ('approve', 'reject')),
    group_name TEXT,
    reason     TEXT,
    at         DOUBLE PRECISION NOT NULL,
    -- One review per reviewer per ticket, enforced by the database, not only by the domain.
    PRIMARY KEY (ticket_id, reviewer)
);

CREATE TABLE tasks (
    id         TEXT PRIMARY KEY,
    state      TEXT NOT NULL CHECK (state IN ('pending', 'running', 'succeeded', 'failed')),
    progress   INTEGER NOT NULL DEFAULT 0,
    result     JSONB,
    created_by TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    last_seq   BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE task_events (
    task_id TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    seq     BIGINT NOT NULL,
    kind    TEXT NOT NULL,
    at      DOUBLE PRECISION NOT NULL,
    actor   TEXT NOT NULL,
    data    JSONB NOT NULL,
    PRIMARY KEY (task_id, seq)
);

-- The audit head is one row: appending locks it (UPDATE), which serialises writers across replicas.
CREATE TABLE audit_head (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    seq  BIGINT NOT NULL,
    hash TEXT NOT NULL
);
INSERT INTO audit_head (id, seq, hash)
VALUES (1, 0, 'sha256:0000000000000000000000000000000000000000000000000000000000000000');

-- entry is TEXT, not JSONB: JSONB normalises numbers and key order, and the chain must give back
-- exactly the document that was sealed.
CREATE TABLE audit_log (
    seq       BIGINT PRIMARY KEY,
    prev_hash TEXT NOT NULL,
    hash      TEXT NOT NULL,
    entry     TEXT NOT NULL
);
