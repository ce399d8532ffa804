-- 0006: the public halves of every replica's token signing keys, so that any replica verifies
-- any replica's tokens and the JWKS endpoint lists them all. Each replica keeps its private keys
-- in its own state dir and publishes here only (kid, public key, created_at, verify_until);
-- kid is the RFC 7638 thumbprint of the key, which readers recompute (a row whose kid does not
-- match its key is ignored). verify_until is NULL while the key signs, then the end of the
-- window in which tokens it signed may still be valid; rows past it are deleted.
CREATE TABLE published_signing_keys (
    kid          TEXT PRIMARY KEY,
    public_key   TEXT NOT NULL,
    created_at   DOUBLE PRECISION NOT NULL,
    verify_until DOUBLE PRECISION
);
