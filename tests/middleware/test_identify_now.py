"""AuthN answers a bearer request at once where nothing needs a wait (``authn.identify_now``):
on SQLite the caller of a read is identified, and a revoked, unknown or malformed credential
refused, without awaiting ``identify``; where a wait is needed (a session opened through a
federation, whose groups are read apart) ``identify`` is awaited and answers as before."""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from service import clock
from service.authn.sessions import AUTHENTICATOR
from service.middleware import authn
from service.store.base import FederatedSession, SessionRecord
from service.storelink import STORE
from tests.auth import bearer, login
from tests.problems import assert_problem


@pytest.fixture
def awaited(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the requests whose caller ``identify`` was awaited for."""
    paths: list[str] = []
    identify = authn.identify

    async def spy(request: Any) -> None:
        paths.append(request.path)
        await identify(request)

    monkeypatch.setattr(authn, "identify", spy)
    return paths


async def test_a_bearer_read_on_sqlite_is_identified_without_a_wait(client, awaited):
    carol = await login(client, "carol")
    assert (await client.get("/api/v1/databases", headers=bearer(carol))).status == 200
    await assert_problem(await client.get("/api/v1/databases", headers=bearer("x.y.z")),
                         401, "token_malformed")
    await assert_problem(await client.get("/api/v1/databases"), 401, "unauthenticated")
    assert (await client.delete("/api/v1/authn/sessions/current",
                                headers=bearer(carol))).status == 204
    await assert_problem(await client.get("/api/v1/databases", headers=bearer(carol)),
                         401, "session_revoked")
    assert awaited == []


async def test_a_federated_session_is_awaited_for_its_groups(client, awaited):
    app, now = client.server.app, clock.now()
    store = app[STORE].require()
    session = SessionRecord(id=secrets.token_urlsafe(24), subject_id="dora", kind="human",
                            authn_method="oidc", auth_time=now, created_at=now,
                            expires_at=now + 600)
    await store.create_session(session)
    await store.put_federated_session(FederatedSession(session.id, "corp", "sub-1",
                                                       ("sre",), now))
    issued = await app[AUTHENTICATOR].token_for_session(session.id, now, stepped_up=False)
    response = await client.get("/api/v1/authn/sessions/current",
                                headers=bearer(issued.access_token))
    assert response.status == 200, await response.text()
    assert (await response.json())["idp_groups"] == ["corp:sre"]
    assert awaited == ["/api/v1/authn/sessions/current"]
