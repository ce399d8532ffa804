"""Published policy revisions and the active one, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from service.store import Conflict, NotFound, Store
from service.store.base import PolicyRevisionRecord

from .conftest import Target

T0 = 1_700_000_000.0


def revision(id: str = "sha256:aaaa", digest: str = "sha256:d1", at: float = T0
             ) -> PolicyRevisionRecord:
    return PolicyRevisionRecord(
        id=id, digest=digest,
        bundle={"format": "controlplane-policy-bundle/1", "modules": {"a.rego": "package a\n"},
                "data": {"x.yaml": "k: \u00e9\u0000\n"}},
        signature={"protected": "p", "payload": "q", "signature": "s"},
        kid="kid-1", author="alice", message="first \u00e9", created_at=at,
        published_by="alice", published_at=at,
    )


async def test_add_is_idempotent_and_content_addressed(store: Store) -> None:
    assert await store.add_policy_revision(revision()) is True
    assert await store.add_policy_revision(revision()) is False  # the same content again
    assert await store.get_policy_revision("sha256:aaaa") == revision()
    assert await store.get_policy_revision("sha256:none") is None
    with pytest.raises(Conflict) as exc:
        await store.add_policy_revision(revision(digest="sha256:other"))
    assert exc.value.reason == "duplicate_id"


async def test_list_newest_first_with_cursor(store: Store) -> None:
    for i in range(3):
        await store.add_policy_revision(revision(id=f"sha256:{i}", at=T0 + i))
    page = await store.list_policy_revisions(limit=2)
    assert [r.id for r in page] == ["sha256:2", "sha256:1"]
    rest = await store.list_policy_revisions(limit=2, before=page[-1].published_at)
    assert [r.id for r in rest] == ["sha256:0"]


async def test_activate_history_and_expected(store: Store) -> None:
    assert await store.active_policy() is None
    with pytest.raises(NotFound):
        await store.activate_policy_revision("sha256:missing", kind="activate", by="a", at=T0)
    await store.add_policy_revision(revision(id="sha256:1"))
    await store.add_policy_revision(revision(id="sha256:2"))
    first = await store.activate_policy_revision("sha256:1", kind="activate", by="alice", at=T0,
                                                 reason="go")
    assert (first.seq, first.previous_id, first.reason) == (1, "", "go")
    second = await store.activate_policy_revision("sha256:2", kind="activate", by="bob",
                                                  at=T0 + 1, expected="sha256:1")
    assert (second.seq, second.previous_id) == (2, "sha256:1")
    with pytest.raises(Conflict) as exc:  # someone activated another revision meanwhile
        await store.activate_policy_revision("sha256:1", kind="rollback", by="a", at=T0 + 2,
                                             expected="sha256:1")
    assert exc.value.reason == "state_conflict"
    back = await store.activate_policy_revision("sha256:1", kind="rollback", by="carol",
                                                at=T0 + 3, expected="sha256:2")
    assert await store.active_policy() == back
    assert [a.seq for a in await store.policy_activations()] == [3, 2, 1]
    assert replace(back, activated_at=0) == replace(
        back, seq=3, revision_id="sha256:1", previous_id="sha256:2", kind="rollback",
        activated_by="carol", activated_at=0)


async def test_concurrent_activations_get_distinct_seqs(store: Store, target: Target) -> None:
    await store.add_policy_revision(revision(id="sha256:1"))
    results = await asyncio.gather(*(
        store.activate_policy_revision("sha256:1", kind="activate", by=f"u{i}", at=T0 + i)
        for i in range(5)))
    assert sorted(a.seq for a in results) == [1, 2, 3, 4, 5]
    # exactly one of several "if still none active" activations wins
    await store.add_policy_revision(revision(id="sha256:2"))
    outcomes = await asyncio.gather(*(
        store.activate_policy_revision("sha256:2", kind="activate", by="x", at=T0,
                                       expected="sha256:1")
        for _ in range(4)), return_exceptions=True)
    assert sum(not isinstance(o, Exception) for o in outcomes) == 1
    assert all(isinstance(o, Conflict) for o in outcomes if isinstance(o, Exception))
