"""The audit key ring: created 0700/0600, rotated without losing a public key, never a token key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.audit.checkpoint import sign, signature_ok
from service.audit.keys import AuditKeyError, AuditKeys, load_jwks
from service.authn.keyring import KeyRing


def test_rotation_retires_the_private_key_and_keeps_the_public_one(tmp_path: Path) -> None:
    ring = AuditKeys.open(tmp_path / "audit-keys", now=1000.0)
    first = ring.signing_key()
    signed = sign(first, 7, "sha256:" + "a" * 64, 1000.0)
    assert (tmp_path / "audit-keys").stat().st_mode & 0o777 == 0o700
    new_kid = ring.rotate(2000.0)
    assert new_kid != first.kid and ring.signing_key().kid == new_kid
    retired = json.loads((tmp_path / "audit-keys" / f"{first.kid}.audit-key.json").read_text())
    assert "private_key" not in retired and retired["purpose"] == "controlplane-audit"
    for path in (tmp_path / "audit-keys").glob("*.audit-key.json"):
        assert path.stat().st_mode & 0o777 == 0o600
    # Another process (a fresh load) sees the same: the old key verifies, it cannot sign.
    other = AuditKeys.load(tmp_path / "audit-keys")
    assert set(other.public_keys()) == {first.kid, new_kid}
    assert signature_ok(signed, other.public_keys()[first.kid])
    assert load_jwks(json.dumps(other.jwks())).keys() == {first.kid, new_kid}
    assert [k["active"] for k in other.jwks()["keys"]] == [True, False]


def test_not_a_token_key_and_not_created_by_verification(tmp_path: Path) -> None:
    with pytest.raises(AuditKeyError):
        AuditKeys.load(tmp_path / "nothing")
    assert not (tmp_path / "nothing").exists()
    ring = AuditKeys.open(tmp_path / "keys", now=1000.0)  # even in the token key directory
    tokens = KeyRing.open(tmp_path / "keys", retain_s=60, now=1000.0)
    assert ring.signing_key().kid not in tokens.kids(1000.0)
    path = next((tmp_path / "keys").glob("*.audit-key.json"))
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "purpose": "token"}))
    with pytest.raises(AuditKeyError, match="not an audit key"):
        AuditKeys.load(tmp_path / "keys")
