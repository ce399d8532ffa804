"""The federation store operations on both backends: single use across callers, purge."""

from __future__ import annotations

import asyncio

import pytest

from service.store import open_store
from service.store.base import FederatedSession, HandoffRecord, OidcLoginRecord, SessionRecord
from tests.store import pg

NOW = 1_700_000_000.0


def login(state_hash: str = "h1", expires_at: float = NOW + 600) -> OidcLoginRecord:
    return OidcLoginRecord(state_hash, "test", "login", "nonce", "verifier", "browser", None,
                           "http://127.0.0.1/cb", None, None, NOW, expires_at)


async def exercise(store) -> None:
    await store.put_oidc_login(login())
    # Many callers race for one state: exactly one gets it.
    taken = await asyncio.gather(*(store.take_oidc_login("h1", NOW) for _ in range(6)))
    assert sum(t is not None for t in taken) == 1
    await store.put_oidc_login(login("h2", expires_at=NOW - 1))
    assert await store.take_oidc_login("h2", NOW) is None  # expired: refused (and gone)

    await store.put_handoff(HandoffRecord("c1", "challenge", "s1", True, NOW + 60))
    got = await store.take_handoff("c1", NOW)
    assert got is not None and got.stepped_up and await store.take_handoff("c1", NOW) is None

    await store.create_session(SessionRecord("s1", "alice@example.com", "human", "oidc", NOW, NOW,
                                             NOW + 3600))
    await store.put_federated_session(FederatedSession("s1", "test", "alice", ("b", "a"), NOW))
    await store.put_federated_session(FederatedSession("gone", "test", "x", (), NOW))
    facts = await store.get_federated_session("s1")
    assert facts is not None and facts.groups == ("a", "b")
    await store.put_oidc_login(login("h3", expires_at=NOW + 1))
    assert await store.purge_federation(NOW + 2) == 2  # h3 and the orphaned "gone"
    assert await store.get_federated_session("s1") is not None

    await store.record_federated_subject("alice@example.com", "human", "oidc:test", NOW)
    await store.record_federated_subject("alice@example.com", "human", "oidc:test", NOW + 5)
    [seen] = await store.list_federated_subjects()
    assert (seen.first_seen, seen.last_seen) == (NOW, NOW + 5)


async def test_sqlite(tmp_path):
    store = await open_store(f"sqlite:///{tmp_path / 'cp.db'}")
    try:
        await exercise(store)
    finally:
        await store.close()


@pytest.mark.postgres
async def test_postgres():
    async with pg.temp_schema("cp_federation") as (dsn, schema):
        store = await open_store(dsn, schema=schema)
        try:
            await exercise(store)
        finally:
            await store.close()
