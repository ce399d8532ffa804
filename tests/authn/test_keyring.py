"""The signing key ring: RFC 7638 kids, 0600 files, rotation, retention, JWKS, several processes."""

from __future__ import annotations

import base64
import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from service.authn.keyring import KeyRing, KeyRingError, load_public_key, thumbprint

from .conftest import NOW

RETAIN = 930.0


def test_rfc8037_thumbprint_vector() -> None:
    # RFC 8037 Appendix A.3: the thumbprint of the example Ed25519 public key.
    x = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"
    key = Ed25519PublicKey.from_public_bytes(base64.urlsafe_b64decode(x + "="))
    assert thumbprint(key) == "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
    assert thumbprint(load_public_key({"kty": "OKP", "crv": "Ed25519", "x": x})) == thumbprint(key)


def test_first_key_is_created_private(tmp_path: Path) -> None:
    ring = KeyRing.open(tmp_path / "keys", retain_s=RETAIN, now=NOW)
    key = ring.signing_key()
    path = tmp_path / "keys" / f"{key.kid}.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700
    assert key.kid == thumbprint(key.public_key)


def test_jwks_has_public_keys_only(tmp_path: Path) -> None:
    ring = KeyRing.open(tmp_path / "keys", retain_s=RETAIN, now=NOW)
    jwks = ring.jwks(NOW)
    (jwk,) = jwks["keys"]
    assert set(jwk) == {"kty", "crv", "x", "kid", "alg", "use"}
    assert jwk["kid"] == ring.signing_key().kid and jwk["alg"] == "EdDSA"
    assert "PRIVATE" not in json.dumps(jwks)


def test_rotation_keeps_old_key_until_its_tokens_expired(tmp_path: Path) -> None:
    ring = KeyRing.open(tmp_path / "keys", retain_s=RETAIN, now=NOW)
    old = ring.signing_key().kid
    new = ring.rotate(NOW + 10)
    assert new != old and ring.signing_key().kid == new
    assert ring.kids(NOW + 10) == [new, old]
    assert ring.verification_key(old, NOW + 10 + RETAIN) is not None
    assert ring.verification_key(old, NOW + 11 + RETAIN) is None
    # The next rotation after the window deletes the old file.
    ring.rotate(NOW + 20 + RETAIN)
    assert not (tmp_path / "keys" / f"{old}.json").exists()
    assert ring.verification_key(new, NOW + 20 + RETAIN) is not None


def test_a_second_process_sees_a_rotation(tmp_path: Path) -> None:
    first = KeyRing.open(tmp_path / "keys", retain_s=RETAIN, now=NOW)
    second = KeyRing.open(tmp_path / "keys", retain_s=RETAIN, now=NOW)
    assert first.signing_key().kid == second.signing_key().kid
    new = first.rotate(NOW + 5)
    assert second.verification_key(new, NOW + 5) is not None
    assert second.signing_key().kid == new


def test_tampered_key_file_is_refused(tmp_path: Path) -> None:
    ring = KeyRing.open(tmp_path / "keys", retain_s=RETAIN, now=NOW)
    kid = ring.signing_key().kid
    (tmp_path / "keys" / f"{kid}.json").rename(tmp_path / "keys" / f"{'A' * 43}.json")
    with pytest.raises(KeyRingError):
        KeyRing.open(tmp_path / "keys", retain_s=RETAIN, now=NOW)


_WORKER = """
import sys
from pathlib import Path
from service.authn.keyring import KeyRing
ring = KeyRing.open(Path(sys.argv[1]), retain_s=930, now=1.0)
print(ring.signing_key().kid)
"""


def test_workers_starting_together_share_one_key(tmp_path: Path) -> None:
    directory = tmp_path / "keys"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(directory)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        for _ in range(6)
    ]
    kids = {proc.communicate(timeout=60)[0].strip() for proc in procs}
    assert all(proc.returncode == 0 for proc in procs)
    assert len(kids) == 1
    assert len(list(directory.glob("*.json"))) == 1
