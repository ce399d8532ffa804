"""Fixtures: identities with cheap scrypt hashes, a key ring and the real SQLite store per test."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from service.authn import identities, passwords, totp
from service.authn.identities import IdentityDirectory
from service.authn.keyring import KeyRing
from service.authn.sessions import Authenticator
from service.config import AuthnConfig
from service.store import Store, open_store
from tests.authn.openid_provider import browser, ports  # noqa: F401 (fixtures of the sign-in tests)

NOW = 1_700_000_000.0
ISSUER = "https://cp.test"
AUDIENCE = "https://cp.test/api"
#: Cheap scrypt for tests (the cost travels inside each hash string).
CHEAP = passwords.ScryptParams(ln=4, r=8, p=1)
PASSWORDS = {"alice": "alice-pw", "bob": "bob-pw", "dave": "dave-pw"}
TOTP_SECRETS = {"alice": totp.generate_secret(), "bob": totp.generate_secret()}
SERVICE_KEYS = {
    "ci-bot": Ed25519PrivateKey.generate(),
    "agent-7": Ed25519PrivateKey.generate(),
    "old-bot": Ed25519PrivateKey.generate(),
}


def public_pem(key: Ed25519PrivateKey) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode("ascii")
    )


def identities_document() -> dict[str, Any]:
    """alice, bob (humans with TOTP), dave (disabled human), ci-bot, agent-7, old-bot (disabled)."""
    humans = [
        {
            "subject_id": "alice",
            "kind": "human",
            "password_hash": passwords.hash_password(PASSWORDS["alice"], CHEAP),
            "totp_secret": TOTP_SECRETS["alice"],
        },
        {
            "subject_id": "bob",
            "kind": "human",
            "password_hash": passwords.hash_password(PASSWORDS["bob"], CHEAP),
            "totp_secret": TOTP_SECRETS["bob"],
        },
        {
            "subject_id": "dave",
            "kind": "human",
            "password_hash": passwords.hash_password(PASSWORDS["dave"], CHEAP),
            "disabled": True,
        },
    ]
    keyholders = [
        {
            "subject_id": "ci-bot",
            "kind": "service",
            "public_key": public_pem(SERVICE_KEYS["ci-bot"]),
        },
        {
            "subject_id": "agent-7",
            "kind": "agent",
            "public_key": public_pem(SERVICE_KEYS["agent-7"]),
        },
        {
            "subject_id": "old-bot",
            "kind": "service",
            "public_key": public_pem(SERVICE_KEYS["old-bot"]),
            "disabled": True,
        },
    ]
    return {"identities": humans + keyholders}


@pytest.fixture(scope="session")
def directory() -> IdentityDirectory:
    return identities.parse(identities_document())


@pytest.fixture
def settings() -> AuthnConfig:
    return AuthnConfig(
        issuer=ISSUER,
        audience=AUDIENCE,
        identities=Path("unused.yaml"),
        token_ttl_s=600,
        step_up_window_s=300,
        clock_skew_s=30,
        max_failures=3,
        failure_window_s=600,
        max_failures_per_addr=10,
    )


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'authn.db'}"


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    s = await open_store(store_url)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
def keyring(tmp_path: Path, settings: AuthnConfig) -> KeyRing:
    return KeyRing.open(tmp_path / "keys", retain_s=settings.key_retain_s, now=NOW)


@pytest.fixture
def auth(
    store: Store, directory: IdentityDirectory, keyring: KeyRing, settings: AuthnConfig
) -> Authenticator:
    return Authenticator(store, directory, keyring, settings)


@dataclass
class Peer:
    """A second app instance: its own Authenticator and store connection, same file and keys."""

    auth: Authenticator
    store: Store


@pytest.fixture
async def peer(
    store_url: str,
    tmp_path: Path,
    directory: IdentityDirectory,
    settings: AuthnConfig,
    auth: Authenticator,
) -> AsyncIterator[Peer]:
    other_store = await open_store(store_url)
    ring = KeyRing.open(tmp_path / "keys", retain_s=settings.key_retain_s, now=NOW)
    try:
        yield Peer(Authenticator(other_store, directory, ring, settings), other_store)
    finally:
        await other_store.close()


# -- raw token helpers (for forging tokens the issuer would never make) --------------------------


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def segment(value: dict[str, Any] | list[Any] | bytes) -> str:
    raw = value if isinstance(value, bytes) else json.dumps(value, separators=(",", ":")).encode()
    return b64url(raw)


def forge(
    header: dict[str, Any] | list[Any] | bytes,
    payload: dict[str, Any] | list[Any] | bytes,
    key: Ed25519PrivateKey | None,
    sign: Callable[[bytes], bytes] | None = None,
) -> str:
    """A compact JWS over exactly these header and payload bytes."""
    signing_input = f"{segment(header)}.{segment(payload)}"
    if sign is not None:
        signature = sign(signing_input.encode("ascii"))
    elif key is not None:
        signature = key.sign(signing_input.encode("ascii"))
    else:
        signature = b""
    return f"{signing_input}.{b64url(signature)}"


def decode_part(token: str, index: int) -> Any:
    part = token.split(".")[index]
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
