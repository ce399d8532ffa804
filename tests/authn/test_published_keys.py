"""Replicas with separate state dirs on one store: a token from one works on the other.

Each replica signs with its own key (never shared) and publishes the public half through the
store (service/authn/published.py); the other verifies with it and lists it in its JWKS.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from service.app import create_app
from service.authn.keyring import public_jwk, thumbprint
from service.authn.sessions import AUTHENTICATOR
from service.authn.tokens import ACCESS_TYP, encode
from service.store.base import PublishedKey
from service.storelink import STORE
from tests.auth import bearer, login
from tests.problems import assert_problem
from tests.servers import EdgeTestServer
from tests.store import pg

ME = "/api/v1/authn/sessions/current"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    """The ``store`` section both replicas use: one SQLite file, or one PostgreSQL schema."""
    if request.param == "sqlite":
        yield {"backend": "sqlite", "sqlite": {"path": str(tmp_path / "shared.db")}}
        return
    await pg.require_postgres()
    async with pg.temp_schema() as (dsn, schema):
        yield {"backend": "postgres", "postgres": {"dsn": dsn, "schema": schema}}


@pytest.fixture
async def replicas(shared_store, aiohttp_client, make_config, tmp_path) -> list[TestClient]:
    # shared_store first: set up before the clients, torn down after they closed.
    clients = []
    for name in ("a", "b"):
        config = make_config({"state_dir": str(tmp_path / f"replica-{name}"),
                              "store": shared_store})
        clients.append(await aiohttp_client(EdgeTestServer(create_app(config))))
    return clients


def _active_kid(client: TestClient) -> str:
    return client.server.app[AUTHENTICATOR].keys.signing_key().kid


async def test_a_token_from_one_replica_works_on_the_other(replicas):
    a, b = replicas
    assert _active_kid(a) != _active_kid(b)  # separate state dirs: separate private keys
    token = await login(a, "alice")
    # At once on the other replica: an unknown key id makes it read the published keys again.
    response = await b.get(ME, headers=bearer(token))
    assert response.status == 200, await response.text()
    assert (await response.json())["subject_id"] == "alice"
    # Both ways.
    other = await login(b, "bob")
    assert (await a.get(ME, headers=bearer(other))).status == 200
    # Logging out on one replica ends the session on the other at once (it is in the store).
    assert (await b.delete(ME, headers=bearer(token))).status in (200, 204)
    await assert_problem(await a.get(ME, headers=bearer(token)), 401, "session_revoked")


async def test_every_replica_lists_every_replicas_public_keys(replicas):
    a, b = replicas
    wanted = {_active_kid(a), _active_kid(b)}
    deadline = time.monotonic() + 5
    for client in (a, b):
        while True:
            jwks = await (await client.get("/api/v1/authn/jwks.json")).json()
            kids = {k["kid"] for k in jwks["keys"]}
            if wanted <= kids:
                break
            assert time.monotonic() < deadline, kids
            await asyncio.sleep(0.1)
        assert all("d" not in k for k in jwks["keys"])  # public halves only
        status = await (await client.get("/api/v1/authn/status")).json()
        listed = [k["kid"] for k in status["signing_keys"]]
        assert listed[0] == _active_kid(client) and wanted <= set(listed)
        assert [k["active"] for k in status["signing_keys"]].count(True) == 1


async def test_a_published_row_whose_kid_is_not_its_key_is_ignored(replicas):
    a, b = replicas
    attacker = Ed25519PrivateKey.generate()
    forged_kid = _active_kid(a)[:-4] + "AAAA"  # well-formed, not the thumbprint of the key
    assert forged_kid != thumbprint(attacker.public_key())
    store = b.server.app[STORE].require()
    now = time.time()
    await store.publish_signing_keys(
        [PublishedKey(forged_kid, public_jwk(attacker.public_key())["x"], now, None)], now)
    claims = {"iss": "urn:controlplane:local", "aud": "urn:controlplane:api", "sub": "alice",
              "sid": "x", "kind": "human", "iat": int(now), "nbf": int(now),
              "exp": int(now) + 60, "jti": "j", "auth_time": int(now)}
    token = encode(claims, attacker, typ=ACCESS_TYP, kid=forged_kid)
    await asyncio.sleep(0.3)  # past the look-up interval: the row is read, and refused
    await assert_problem(await b.get(ME, headers=bearer(token)), 401, "token_unknown_kid")
    jwks = await (await b.get("/api/v1/authn/jwks.json")).json()
    assert forged_kid not in {k["kid"] for k in jwks["keys"]}


async def test_a_stopped_replica_retires_its_key_but_its_tokens_keep_verifying(
        shared_store, aiohttp_client, make_config, tmp_path):  # the store outlives the clients
    config = make_config({"state_dir": str(tmp_path / "gone"), "store": shared_store})
    gone = await aiohttp_client(EdgeTestServer(create_app(config)))
    token = await login(gone, "alice")
    kid = _active_kid(gone)
    await gone.close()  # a clean stop: its active key is published as retired
    stays = await aiohttp_client(EdgeTestServer(create_app(
        make_config({"state_dir": str(tmp_path / "stays"), "store": shared_store}))))
    rows = await stays.server.app[STORE].require().published_signing_keys(time.time())
    retired = {r.kid: r.verify_until for r in rows}
    assert retired[kid] is not None and retired[kid] > time.time()
    assert (await stays.get(ME, headers=bearer(token))).status == 200
