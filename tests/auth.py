"""Logging in as the shipped dev identities over HTTP, for black-box tests of the real app."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import yaml
from aiohttp.test_utils import TestClient
from cryptography.hazmat.primitives import serialization

from service.authn import totp
from service.authn.assertions import make_assertion

REPO = Path(__file__).resolve().parent.parent
PASSWORDS = {"alice": "alice-dev-password", "bob": "bob-dev-password", "carol": "carol-dev-password"}
KEYS = {"ci-bot": REPO / "examples/keys/ci-bot.pem", "agent-7": REPO / "examples/keys/agent-7.pem"}
AUDIENCE = "urn:controlplane:local"  # our issuer is the audience of assertions


def _secrets() -> dict[str, str]:
    doc = yaml.safe_load((REPO / "examples/identities.yaml").read_text())
    return {i["subject_id"]: i["totp_secret"] for i in doc["identities"] if i.get("totp_secret")}


TOTP_SECRETS = _secrets()
# TOTP codes are single-use per time step and store; tests that step up repeatedly in one app
# walk the tolerated steps (now, +30 s, -30 s).
_used_steps: dict[tuple[int, str], set[int]] = {}


def bearer(token: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **extra}


def assertion(subject: str, now: float | None = None) -> str:
    key = serialization.load_pem_private_key(KEYS[subject].read_bytes(), password=None)
    return make_assertion(key, subject_id=subject, audience=AUDIENCE,  # type: ignore[arg-type]
                          now=time.time() if now is None else now)


async def login(client: TestClient, subject: str) -> str:
    """An access token for a dev identity (password for people, key assertion otherwise)."""
    body: dict[str, Any]
    if subject in PASSWORDS:
        body = {"subject_id": subject, "password": PASSWORDS[subject]}
    else:
        body = {"assertion": assertion(subject)}
    response = await client.post("/api/v1/authn/sessions", json=body)
    assert response.status == 201, await response.text()
    return str((await response.json())["access_token"])


def otp(subject: str, scope: object = None) -> str:
    """A code for a time step not used yet for ``subject`` in ``scope`` (one app and its store)."""
    secret = TOTP_SECRETS[subject]
    now = time.time()
    used = _used_steps.setdefault((id(scope), subject), set())
    for offset in (0, 30, -30):
        step = int((now + offset) // 30)
        if step not in used:
            used.add(step)
            return totp.code_at(secret, now + offset)
    raise RuntimeError(f"no unused TOTP step left for {subject}; a test stepped up too often")


async def step_up(client: TestClient, token: str, subject: str) -> str:
    """A stepped-up token for ``subject``'s session."""
    response = await client.post("/api/v1/authn/step-up",
                                 json={"otp": otp(subject, client.server.app)},
                                 headers=bearer(token))
    assert response.status == 201, await response.text()
    return str((await response.json())["access_token"])


def bound_policies(tmp_path: Path, bindings: dict[str, list[str]]) -> str:
    """A copy of the shipped policies with ``bindings`` (subject -> roles) added or replaced in
    its policy data (roles live there, never in tokens): the directory for ``policies.dir``."""
    policies = tmp_path / "policies"
    shutil.copytree(REPO / "policies", policies)
    path = policies / "data" / "bindings.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["bindings"].update({subject: {"roles": roles} for subject, roles in bindings.items()})
    path.write_text(yaml.safe_dump(doc))
    return str(policies)
