-- 0010: proposed policy revisions. A publish request whose signature verified and whose vetting
-- passed leaves its bundle here (content-addressed, like policy_revisions), so reviewers of its
-- ticket can read the change (diff, replayed impact) before it is approved and stored as a
-- revision. Nothing reads it to decide: only policy_revisions can be activated.
CREATE TABLE policy_candidates (
    id          TEXT PRIMARY KEY,
    digest      TEXT NOT NULL,
    bundle      TEXT NOT NULL,
    signature   TEXT NOT NULL,
    kid         TEXT NOT NULL,
    author      TEXT NOT NULL,
    message     TEXT NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    proposed_by TEXT NOT NULL,
    proposed_at DOUBLE PRECISION NOT NULL
);
