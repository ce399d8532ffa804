-- 0002: signed audit checkpoints. Each row is a checkpoint the service signed with its audit key
-- (kept outside the database): (seq, head_hash) of a record it committed, the RFC 3339 time it
-- signed at (the signed text, verbatim), the key id and the base64url Ed25519 signature.
-- One per seq: workers that checkpoint the same record store it once (INSERT ... DO NOTHING).
CREATE TABLE audit_checkpoints (
    seq       BIGINT PRIMARY KEY,
    head_hash TEXT NOT NULL,
    at        TEXT NOT NULL,
    kid       TEXT NOT NULL,
    sig       TEXT NOT NULL
);
