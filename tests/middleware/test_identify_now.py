"""AuthN answers a bearer request at once where nothing needs a wait (``authn.identify_now``):
on SQLite the caller of a read is identified, and a revoked, unknown or malformed credential
refused, with nothing left to await; a session opened through a federation leaves only its
groups to read (its token and row checked once) and keeps them."""

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
    """The paths of the requests whose caller ``identify_now`` left something to await for."""
    paths: list[str] = []
    identify_now = authn.identify_now

    def spy(request: Any) -> Any:
        pending = identify_now(request)
        if pending is not None:
            paths.append(request.path)
        return pending

    monkeypatch.setattr(authn, "identify_now", spy)
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
    checked: list[str] = []
    reads = store.session_now

    def read(id: str) -> Any:
        checked.append(id)
        return reads(id)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store, "session_now", read)
        patch.setattr(store, "get_session", None)  # the row read at once serves to the end
        response = await client.get("/api/v1/authn/sessions/current",
                                    headers=bearer(issued.access_token))
    assert response.status == 200, await response.text()
    assert (await response.json())["idp_groups"] == ["corp:sre"]
    assert awaited == ["/api/v1/authn/sessions/current"]
    assert checked == [session.id]  # its row read once (never again awaited), then its groups
