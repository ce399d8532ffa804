-- 0005: identity federation (OpenID Connect sign-in of people, token exchange of workloads).
-- oidc_logins: one pending authorization request per row, keyed by the SHA-256 of its state
--   (a device authorization: of the handle the CLI polls with; code_verifier holds the device code);
--   taken once (DELETE ... RETURNING), so a state, its nonce and its PKCE verifier serve once.
-- federation_handoffs: the one-time code a CLI on a loopback port redeems (with its PKCE
--   verifier) for the session the browser flow opened; keyed by the code's SHA-256.
-- federated_sessions: what the IdP said about a session's person (provider, subject at the
--   IdP, groups), refreshed at every sign-in and step-up; never put into our tokens.
-- federated_subjects: the federated subjects seen (just-in-time identities, cpctl identities).
-- Workload token replay (jti) uses once_claims (namespace workload_jti).
CREATE TABLE oidc_logins (
    state_hash    TEXT PRIMARY KEY,
    provider      TEXT NOT NULL,
    purpose       TEXT NOT NULL CHECK (purpose IN ('login', 'step_up', 'device')),
    nonce         TEXT NOT NULL,
    code_verifier TEXT NOT NULL,
    browser_hash  TEXT,
    session_id    TEXT,
    redirect_uri  TEXT NOT NULL,
    cli_redirect  TEXT,
    cli_challenge TEXT,
    created_at    DOUBLE PRECISION NOT NULL,
    expires_at    DOUBLE PRECISION NOT NULL
);
CREATE INDEX oidc_logins_expires_idx ON oidc_logins (expires_at);

CREATE TABLE federation_handoffs (
    code_hash  TEXT PRIMARY KEY,
    challenge  TEXT NOT NULL,
    session_id TEXT NOT NULL,
    stepped_up INTEGER NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX federation_handoffs_expires_idx ON federation_handoffs (expires_at);

CREATE TABLE federated_sessions (
    session_id   TEXT PRIMARY KEY,
    provider     TEXT NOT NULL,
    foreign_sub  TEXT NOT NULL,
    groups       TEXT NOT NULL,
    updated_at   DOUBLE PRECISION NOT NULL
);

CREATE TABLE federated_subjects (
    subject_id  TEXT PRIMARY KEY,
    kind        TEXT NOT NULL,
    source      TEXT NOT NULL,
    first_seen  DOUBLE PRECISION NOT NULL,
    last_seen   DOUBLE PRECISION NOT NULL
);
