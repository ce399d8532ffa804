-- 0008: audit records staged by a run's transaction, sealed into the chain in batches.
-- A mutation's transaction inserts its record here (no global lock: the id comes from an
-- identity), so the record commits with the mutation. A sealer (any replica) later moves staged
-- rows into audit_log under the audit_head row lock, one batch per locked transaction.
-- staged_at is the service's clock (unix seconds): rows left by a replica that stopped are
-- swept by the others once they are older than a grace period.
CREATE TABLE audit_staged (
    id        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    staged_at DOUBLE PRECISION NOT NULL,
    entry     TEXT NOT NULL
);
