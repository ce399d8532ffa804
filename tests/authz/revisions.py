"""Signed policy revisions for tests: a signing key pair, ``policies.store`` trusting it (with an
activation key), a publish body signed by it, and a behaviour-preserving variant of the shipped
policies (another revision, same decisions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from service.authz.revisions import Bundle, sign

REPO = Path(__file__).resolve().parents[2]


def keypair(tmp_path: Path, name: str = "signer") -> tuple[Ed25519PrivateKey, Path]:
    key = Ed25519PrivateKey.generate()
    public = tmp_path / f"{name}.pub.pem"
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return key, public


def store_keys(public: Path) -> dict[str, Any]:
    """``policies.store`` trusting ``public`` for revisions, with an activation key beside it
    (written once: every replica of a test shares it)."""
    activation = public.with_name("activation.pem")
    if not activation.exists():
        activation.write_bytes(Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
    return {"trusted_keys": [str(public)], "activation_key": str(activation)}


def published(key: Ed25519PrivateKey, bundle: Bundle | None = None,
              message: str = "tighten reads") -> dict[str, Any]:
    bundle = bundle or Bundle.from_dir(REPO / "policies")
    return {"bundle": bundle.to_doc(),
            "signature": sign(bundle, key, author="alice", message=message,
                              created_at="2026-11-23T18:00:00+00:00")}


def variant(comment: str) -> Bundle:
    """The shipped policies with one more comment line: another revision, same behaviour."""
    base = Bundle.from_dir(REPO / "policies")
    modules = dict(base.modules)
    modules["authz.rego"] = modules["authz.rego"] + f"\n# {comment}\n"
    return Bundle(modules, base.data)
