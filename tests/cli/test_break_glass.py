"""Issue 30 (4): ``cpctl policy break-glass``, offline, for a revision that locks out its own
approvers: it signs an activation with an activation key and writes it to the store with its
audit record in one transaction; a follower that trusts the key follows it; a revision no
trusted key signed is not activated even so."""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from service.authz.activations import ActivationSigner, activation_keys, verify_activation
from service.authz.engine import PolicyEngine
from service.authz.reload import StoreFollower
from service.cli import revisions
from service.config import PolicyStoreConfig
from service.store import open_store
from tests.authz.revisions import ACTIVATOR, KEY, TRUSTED, publish, variant

REPO = Path(__file__).resolve().parents[2]


async def test_break_glass_returns_the_fleet_to_its_directory_audited(tmp_path, capsys):
    state = tmp_path / "state"
    state.mkdir()
    store = await open_store(f"sqlite:///{state / 'controlplane.db'}")
    public = tmp_path / "signer.pub.pem"
    public.write_bytes(KEY.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    glass = tmp_path / "keys" / "break-glass.pem"
    glass.parent.mkdir()
    assert revisions.run(["keygen", str(glass)]) == 0
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(state), "policies": {"store": {
        "trusted_keys": [str(public)],
        "trusted_activation_keys": [str(glass.with_name("break-glass.pub.pem"))]}}}))
    signer = ActivationSigner.from_file(glass)
    trusted = activation_keys((), signer)
    engine = PolicyEngine(REPO / "policies", vet_in_subprocess=False)
    assert engine.load().ok
    directory = engine.revision
    follower = StoreFollower(engine, lambda: store, PolicyStoreConfig((), 0.1, 0.5), TRUSTED,
                             activation_keys={**activation_keys((), ACTIVATOR), **trusted})
    try:
        locking = await publish(store, variant("locks out every approver"))
        await follower.sync()
        assert engine.revision == locking
        capsys.readouterr()

        # A key no replica trusts for activations is refused before anything is written.
        other = tmp_path / "keys" / "other.pem"
        assert revisions.run(["keygen", str(other)]) == 0
        capsys.readouterr()
        assert await asyncio.to_thread(revisions.run, [
            "break-glass", "--directory", "--activation-key", str(other), "--reason", "x",
            "--config", str(config)]) == 1
        assert "not an activation key the replicas trust" in capsys.readouterr().err
        assert len(await store.policy_activations()) == 1

        assert await asyncio.to_thread(revisions.run, [
            "break-glass", "--directory", "--activation-key", str(glass),
            "--reason", "INC-9: approvers locked out", "--config", str(config)]) == 0
        assert "break-glass activation seq 2: directory mode" in capsys.readouterr().out
        latest = await store.active_policy()
        assert latest is not None and (latest.kind, latest.revision_id, latest.previous_id) == (
            "break_glass", "", locking)
        verify_activation(latest, trusted)
        records = [r.entry for r in await store.audit_range(0, 100)]
        glassed = [e for e in records if e.get("action") == "policy.break_glass"]
        assert len(glassed) == 1 and glassed[0]["seq"] == 2
        assert glassed[0]["reason"] == "INC-9: approvers locked out"
        assert glassed[0]["activation_kid"] == signer.kid
        await follower.sync()
        assert engine.revision == directory and follower.load_ok

        # A revision signed by a key the configuration does not trust is refused, offline too.
        stranger = variant("stranger")
        bad = await publish(store, stranger, Ed25519PrivateKey.generate())
        before = await store.policy_activations()
        capsys.readouterr()
        assert await asyncio.to_thread(revisions.run, [
            "break-glass", bad, "--activation-key", str(glass), "--reason", "x",
            "--config", str(config)]) == 1
        assert "not trusted" in capsys.readouterr().err
        assert len(await store.policy_activations()) == len(before)
    finally:
        await store.close()
