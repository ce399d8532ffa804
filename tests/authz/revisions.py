"""Signed policy revisions for tests: a signing key pair, ``policies.store`` trusting it (with an
activation key), a publish body signed by it, and a behaviour-preserving variant of the shipped
policies (another revision, same decisions); a revision key followers trust (``KEY``,
``TRUSTED``), the replicas' activation key (``ACTIVATOR``) and ``publish`` straight into a store,
activated."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from service.authz.activations import ActivationSigner, activation_keys
from service.authz.revisions import Bundle, key_id, sign
from service.store import Store
from service.store.base import PolicyRevisionRecord

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


#: A revision signing key the followers trust, by key id.
KEY = Ed25519PrivateKey.generate()
TRUSTED = {key_id(KEY.public_key()): KEY.public_key()}
#: The activation key of the replicas (signs activations), and what followers trust.
ACTIVATOR = ActivationSigner(Ed25519PrivateKey.generate())
ACTIVATION_KEYS = activation_keys((), ACTIVATOR)


def variant(comment: str, module: str | None = None) -> Bundle:
    """The shipped policies with one more comment line (another revision, same behaviour), or
    with ``module`` as their authz.rego."""
    base = Bundle.from_dir(REPO / "policies")
    text = module if module is not None else base.modules["authz.rego"] + f"\n# {comment}\n"
    return Bundle({**base.modules, "authz.rego": text}, base.data)


async def publish(store: Store, bundle: Bundle, key: Ed25519PrivateKey = KEY) -> str:
    """Store ``bundle`` signed by ``key`` as a revision and activate it (signed by ``ACTIVATOR``)."""
    revision = bundle.revision_id()
    await store.add_policy_revision(PolicyRevisionRecord(
        id=revision, digest=bundle.digest, bundle=bundle.to_doc(),
        signature=sign(bundle, key, author="alice", message="", created_at="t"),
        kid=key_id(key.public_key()), author="alice", message="", created_at=0.0,
        published_by="alice", published_at=time.time()))
    await store.activate_policy_revision(revision, kind="activate", by="alice", at=time.time(),
                                         sign=lambda a: ACTIVATOR.sign(a, "ticket-1"))
    return revision


def fleet_keys(tmp_path: Path) -> tuple[Path, Path]:
    """A signer and an activation key made with ``cpctl policy keygen`` in ``tmp_path/keys``, and
    a configuration file trusting the one and activating with the other (for ``cpctl serve``)."""
    from service.cli import revisions  # the CLI's keygen, as an operator runs it

    keys = tmp_path / "keys"
    keys.mkdir()
    for name in ("signer", "activation"):
        assert revisions.run(["keygen", str(keys / f"{name}.pem")]) == 0
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"policies": {"store": {
        "trusted_keys": [str(keys / "signer.pub.pem")],
        "activation_key": str(keys / "activation.pem")}}}))
    return keys, config
