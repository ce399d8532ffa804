-- 0004: the command text on tickets, and the notification outbox.
-- tickets.command: the command as the requester sent it (JSON: a string or an argv array), next
-- to its hash; NULL when the ticket binds none.
-- outbox_events: one row per ticket change, inserted in the transaction of the change; the
-- dispatcher leases due rows (lease_owner, lease_until) and records each sink's attempts in
-- outbox_deliveries. window_start: where notifications.max_age_s counts from (creation, or
-- the last `cpctl notifications retry`).
ALTER TABLE tickets ADD COLUMN command TEXT;

CREATE TABLE outbox_events (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    id              TEXT NOT NULL UNIQUE,
    type            TEXT NOT NULL,
    ticket_id       TEXT NOT NULL,
    env             TEXT NOT NULL,
    at              REAL NOT NULL,
    data            TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'dead')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    window_start    REAL NOT NULL,
    lease_owner     TEXT,
    lease_until     REAL,
    last_error      TEXT,
    finished_at     REAL
);
CREATE INDEX outbox_events_due_idx ON outbox_events (state, next_attempt_at);
CREATE INDEX outbox_events_ticket_idx ON outbox_events (ticket_id, seq);

CREATE TABLE outbox_deliveries (
    event_id    TEXT NOT NULL REFERENCES outbox_events (id) ON DELETE CASCADE,
    sink        TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('delivered', 'failed')),
    attempts    INTEGER NOT NULL,
    last_status INTEGER,
    last_error  TEXT,
    at          REAL NOT NULL,
    PRIMARY KEY (event_id, sink)
);
