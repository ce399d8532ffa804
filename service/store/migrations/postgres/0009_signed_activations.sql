-- 0009: signed activations. signature is the activation's JSON flattened JWS (EdDSA) over its
-- seq, revision, previous revision, kind, who, when and the approving ticket, by a replica's
-- activation key (service/authz/activations.py); NULL for rows written before, which
-- store-following replicas refuse like any unsigned activation.
ALTER TABLE policy_activations ADD COLUMN signature TEXT;
