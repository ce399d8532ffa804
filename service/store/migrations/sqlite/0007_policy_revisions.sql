-- 0007: published policy revisions and the fleet's active revision.
-- policy_revisions: immutable, content-addressed (id = the engine's revision id of the bundle);
-- bundle and signature are JSON text (the signature is a flattened JWS over the bundle's digest).
-- policy_head: one row; every activation (and rollback) bumps seq with one conditional UPDATE,
-- which serialises activations across replicas; revision_id '' means none is active yet.
-- policy_activations: the history, one row per seq (who, when, why, from which revision).
CREATE TABLE policy_revisions (
    id           TEXT PRIMARY KEY,
    digest       TEXT NOT NULL,
    bundle       TEXT NOT NULL,
    signature    TEXT NOT NULL,
    kid          TEXT NOT NULL,
    author       TEXT NOT NULL,
    message      TEXT NOT NULL,
    created_at   REAL NOT NULL,
    published_by TEXT NOT NULL,
    published_at REAL NOT NULL
);
CREATE INDEX policy_revisions_published_idx ON policy_revisions (published_at);
CREATE TABLE policy_head (
    id          INTEGER PRIMARY KEY,
    seq         BIGINT NOT NULL,
    revision_id TEXT NOT NULL,
    previous_id TEXT NOT NULL
);
INSERT INTO policy_head (id, seq, revision_id, previous_id) VALUES (1, 0, '', '');
CREATE TABLE policy_activations (
    seq          BIGINT PRIMARY KEY,
    revision_id  TEXT NOT NULL,
    previous_id  TEXT NOT NULL,
    kind         TEXT NOT NULL,
    activated_by TEXT NOT NULL,
    activated_at REAL NOT NULL,
    reason       TEXT
);
