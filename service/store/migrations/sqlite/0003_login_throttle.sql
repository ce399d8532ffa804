-- 0003: login throttling as one counter row per key (replaces the row-per-failure table).
-- An attempt reserves a failure with one conditional upsert before the secret is verified, so
-- parallel attempts from any worker or replica cannot all pass a read-then-write check.
-- failures: failures (and reservations in flight) of the window that began at window_start;
-- last_at: the latest reservation; delay_s: the spacing it asks of the next attempt (the
-- progressive slowdown; 0 for plain budgets).
DROP TABLE login_failures;
CREATE TABLE login_throttle (
    key          TEXT PRIMARY KEY,
    failures     INTEGER NOT NULL,
    window_start REAL NOT NULL,
    last_at      REAL NOT NULL,
    delay_s      REAL NOT NULL
);
CREATE INDEX login_throttle_window_idx ON login_throttle (window_start);
