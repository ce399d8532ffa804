"""The authn middleware (``service.middleware.authn``) on its own, bearer tokens: it identifies
and never decides. Behind it is the real app (real SQLite store, real sessions and keys) plus one
probe route that shows what the middleware attached: the principal, or the token's error code
for the chain to answer with. A valid token names its session's subject; a malformed token, a
forged one, one signed with another algorithm or by a key this service does not have, an
expired one (also once verified and cached) and one of a revoked session leave the request
anonymous with that token's code; another scheme or no header leaves it anonymous with no code;
without a store a token cannot be checked, and says so."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from service import clock
from service.app import create_app
from service.appkeys import AUTHN_ERROR
from service.authn.principal import PRINCIPAL
from service.chain import public
from service.config import CONFIG
from tests.auth import bearer, login

PROBE = "/test/authn-probe"


@public
async def probe(request: web.Request) -> web.Response:
    principal = request[PRINCIPAL]
    return web.json_response({"subject_id": principal.subject_id, "kind": principal.kind,
                              "session_id": principal.session_id,
                              "error": request.get(AUTHN_ERROR)})


@pytest.fixture
async def start(make_config) -> AsyncIterator[Callable[..., Awaitable[TestClient]]]:
    clients: list[TestClient] = []

    async def make(overrides: dict[str, Any] | None = None) -> TestClient:
        app = create_app(make_config(overrides))
        app.router.add_get(PROBE, probe)
        client = TestClient(TestServer(app))
        await client.start_server()
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


async def seen(client: TestClient, headers: dict[str, str] | None = None) -> dict[str, Any]:
    response = await client.get(PROBE, headers=headers or {})
    assert response.status == 200, await response.text()
    return dict(await response.json())


def segments(token: str) -> list[str]:
    return token.split(".")


def encoded(doc: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")


def decoded(segment: str) -> dict[str, Any]:
    return dict(json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))))


async def test_a_valid_token_names_its_sessions_subject(start):
    client = await start()
    token = await login(client, "alice")
    got = await seen(client, bearer(token))
    assert (got["subject_id"], got["kind"], got["error"]) == ("alice", "human", None)
    assert got["session_id"]
    # The scheme is case-insensitive (RFC 6750 / RFC 9110).
    assert (await seen(client, {"Authorization": f"bearer {token}"}))["subject_id"] == "alice"


@pytest.mark.parametrize("header", [None, "Basic YWxpY2U6cHc=", "Bearer", "Bearer    "],
                         ids=["none", "basic", "bearer-without-token", "bearer-blank"])
async def test_no_bearer_token_is_anonymous_without_an_error(start, header):
    client = await start()
    got = await seen(client, {} if header is None else {"Authorization": header})
    assert (got["kind"], got["error"]) == ("anonymous", None)


async def test_a_malformed_token_is_anonymous_with_its_code(start):
    client = await start()
    for token, code in [("not-a-token", "token_malformed"), ("a.b.c", "token_malformed"),
                        ("x" * 20_000, "token_too_large")]:
        got = await seen(client, bearer(token))
        assert (got["kind"], got["error"]) == ("anonymous", code), token[:20]


async def test_a_forged_signature_is_refused(start):
    client = await start()
    head, claims, signature = segments(await login(client, "alice"))
    forged_claims = encoded({**decoded(claims), "sub": "erin"})  # erin is an admin
    got = await seen(client, bearer(f"{head}.{forged_claims}.{signature}"))
    assert (got["kind"], got["error"]) == ("anonymous", "token_signature_invalid")


@pytest.mark.parametrize("alg", ["none", "HS256", "RS256", "ES256"])
async def test_a_token_of_another_algorithm_is_refused(start, alg):
    client = await start()
    head, claims, signature = segments(await login(client, "alice"))
    other = encoded({**decoded(head), "alg": alg})
    for forged in (f"{other}.{claims}.{signature}", f"{other}.{claims}."):
        got = await seen(client, bearer(forged))
        assert (got["kind"], got["error"]) == ("anonymous", "token_alg_not_allowed")


async def test_an_expired_token_is_refused_even_once_verified_and_cached(start, monkeypatch):
    client = await start()
    token = await login(client, "alice")
    assert (await seen(client, bearer(token)))["subject_id"] == "alice"  # verified: cached
    exp = decoded(segments(token)[1])["exp"]
    skew = client.server.app[CONFIG].authn.clock_skew_s
    monkeypatch.setattr(clock, "now", lambda: exp + skew + 1)
    got = await seen(client, bearer(token))
    assert (got["kind"], got["error"]) == ("anonymous", "token_expired")
    monkeypatch.setattr(clock, "now", time.time)
    assert (await seen(client, bearer(token)))["subject_id"] == "alice"


async def test_a_token_of_a_revoked_session_is_refused_at_once(start):
    client = await start()
    token = await login(client, "alice")
    other = await login(client, "alice")  # another session of the same subject
    assert (await seen(client, bearer(token)))["subject_id"] == "alice"  # verified and cached
    response = await client.delete("/api/v1/authn/sessions/current", headers=bearer(token))
    assert response.status == 204
    got = await seen(client, bearer(token))
    assert (got["kind"], got["error"]) == ("anonymous", "session_revoked")
    assert (await seen(client, bearer(other)))["subject_id"] == "alice"


async def test_a_token_another_service_issued_is_refused(start, tmp_path):
    # Two apps, two state dirs, two signing keys: one's token names a key the other lacks.
    first, second = await start(), await start({"state_dir": str(tmp_path / "other")})
    token = await login(first, "alice")
    got = await seen(second, bearer(token))
    assert (got["kind"], got["error"]) == ("anonymous", "token_unknown_kid")


async def test_without_a_store_a_token_cannot_be_checked_and_says_so(start):
    client = await start({"store": {"backend": "none"}})
    got = await seen(client, bearer("a.b.c"))
    assert (got["kind"], got["error"]) == ("anonymous", "authentication_unavailable")
