-- 0008: audit records staged by a run's transaction, sealed into the chain in batches (see the
-- PostgreSQL migration; SQLite has one writer per file, so the service appends directly there,
-- but the table and its operations are the same on both backends).
CREATE TABLE audit_staged (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    staged_at REAL NOT NULL,
    entry     TEXT NOT NULL
);
