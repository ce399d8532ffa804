"""A bearer token's last check is kept with its verified claims (``Authenticator``'s
``authenticate_bearer_now``) and serves the token's next request only while every input of that
check is unchanged: the very session record the store holds (any commit replaces it), the
session not expired, and the subject's entry in the identities file. Anything else is checked
again in full, at once."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from service import clock
from service.authn.identities import IdentityDirectory
from service.authn.sessions import AUTHENTICATOR, Authenticator
from service.storelink import STORE
from tests.auth import bearer, login
from tests.problems import assert_problem


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The subjects whose session was checked in full (``Authenticator._own``)."""
    seen: list[str] = []
    own = Authenticator._own

    def spy(identity: Any, subject: str, kind: str, session: Any) -> None:
        seen.append(subject)
        own(identity, subject, kind, session)

    monkeypatch.setattr(Authenticator, "_own", staticmethod(spy))
    return seen


async def test_a_token_read_again_is_not_checked_again_while_nothing_changed(client, checks):
    carol = await login(client, "carol")
    for _ in range(3):
        assert (await client.get("/api/v1/databases", headers=bearer(carol))).status == 200
    # Each read commits its audit record, which replaces the store's copy of the row: the
    # check is remembered from a read to the requests before the next commit.
    app = client.server.app
    auth = app[AUTHENTICATOR]
    store = app[STORE].require()
    now = clock.now()
    before = len(checks)
    first = auth.authenticate_bearer_now(carol, now)
    assert auth.authenticate_bearer_now(carol, now) is first
    assert len(checks) <= before + 1  # checked at most once: the second was remembered
    # A commit anywhere (here: a step-up record of another session) and it is checked again.
    other = await login(client, "alice")
    await store.revoke_session(auth.tokens.verify(other, now)["sid"], now)
    before = len(checks)
    reads: list[str] = []
    session_now = store.session_now

    def counted(id: str) -> Any:
        reads.append(id)
        return session_now(id)

    store.session_now = counted  # type: ignore[method-assign]
    try:
        assert auth.authenticate_bearer_now(carol, now) == first
    finally:
        del store.session_now
    assert len(checks) == before + 1
    assert reads == [first.session_id]  # checked again in full on the row read once


async def test_a_revocation_is_seen_by_the_next_request(client, checks):
    carol = await login(client, "carol")
    assert (await client.get("/api/v1/databases", headers=bearer(carol))).status == 200
    app = client.server.app
    auth, store, now = app[AUTHENTICATOR], app[STORE].require(), clock.now()
    auth.authenticate_bearer_now(carol, now)
    await store.revoke_session(auth.tokens.verify(carol, now)["sid"], now)
    await assert_problem(await client.get("/api/v1/databases", headers=bearer(carol)),
                         401, "session_revoked")


async def test_a_subject_disabled_by_a_reload_is_refused_at_once(client, checks):
    """No commit in between: the identities entry alone makes the check run again."""
    carol = await login(client, "carol")
    app = client.server.app
    auth, now = app[AUTHENTICATOR], clock.now()
    remembered = auth.authenticate_bearer_now(carol, now)
    assert auth.authenticate_bearer_now(carol, now) is remembered
    directory = auth.identities
    entries = [dataclasses.replace(i, disabled=True) if i.subject_id == "carol" else i
               for i in directory._by_subject.values()]
    auth.replace_identities(IdentityDirectory(entries))
    with pytest.raises(Exception) as refused:
        auth.authenticate_bearer_now(carol, now)
    assert getattr(refused.value, "code", None) == "subject_disabled"


async def test_an_expired_session_is_refused_though_its_check_is_remembered(client, checks):
    carol = await login(client, "carol")
    app = client.server.app
    auth, now = app[AUTHENTICATOR], clock.now()
    remembered = auth.authenticate_bearer_now(carol, now)
    session = remembered.session_id
    found = app[STORE].require().session_now(session)
    assert found is not None and found[0] is not None
    expires_at = found[0].expires_at
    # The token itself would still be valid: only the session has ended.
    verified = auth.tokens.verified(carol, now)
    assert verified.derived is not None
    verified.valid_until = expires_at + 3600
    assert auth.authenticate_bearer_now(carol, now) is remembered
    with pytest.raises(Exception) as refused:
        auth.authenticate_bearer_now(carol, expires_at)
    assert getattr(refused.value, "code", None) == "session_inactive"
