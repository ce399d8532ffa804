"""Shadow evaluation of a published, inactive revision (policies.candidate_revision) in the
running service, on the real store: two revisions published (one revoking carol's role), one
activated, the other shadowed; the divergence metric counts exactly the diverging requests and
the live decisions do not change. A candidate the process cannot verify is rejected, shown in
authz/status, and never affects serving; SIGHUP re-reads the config file and follows a changed
candidate. (In tests/conftest.py's IN_PROCESS_VETTING: the app vets revisions in-process, as
other app tests do.)"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.app import create_app
from service.authz.engine import ENGINE
from service.authz.reload import CandidateRevision
from service.authz.revisions import Bundle, key_id, sign
from service.authz.shadow import SHADOW, Shadow
from service.config import ConfigError, load
from service.store import Store, open_store
from service.store.base import PolicyRevisionRecord
from service.storelink import STORE
from tests.auth import bearer, login
from tests.authz.conftest import candidate_without_carols_role
from tests.authz.revisions import keypair, published, store_keys
from tests.metrics import shadow_divergence
from tests.servers import EdgeTestServer
from tests.store import pg

REPO = Path(__file__).resolve().parents[2]
NON_PRODUCTION = {"dev": {"production": False}, "staging": {"production": False}}


def _revoking(tmp_path: Path) -> Bundle:
    """The shipped policies with carol's `viewer` binding revoked, as a bundle."""
    return Bundle.from_dir(candidate_without_carols_role(tmp_path / "revoking"))


def _policies(public: Path, candidate: str | None, poll_s: float = 0.1) -> dict[str, Any]:
    return {"source": "store", "candidate_revision": candidate,
            "store": {**store_keys(public), "poll_interval_s": poll_s,
                      "convergence_s": 5}}


async def _shadow_status(client: Any, until: str, *, running: str | None = None,
                         error: str | None = None, timeout: float = 20.0) -> dict[str, Any]:
    """authz/status once the shadow is in state ``until`` (with ``error``; with ``running``,
    the process runs that active revision), or at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        status = await (await client.get("/api/v1/authz/status")).json()
        done = status["shadow"]["state"] == until and (
            error is None or status["shadow"]["error"] == error) and (
            running is None or (status["distribution"]["active_revision"] == running
                                and status["distribution"]["running_active"]))
        if done or time.monotonic() > deadline:
            return status
        await asyncio.sleep(0.05)


async def _reads(client: Any, rounds: int = 3) -> None:
    carol, alice = await login(client, "carol"), await login(client, "alice")
    for _ in range(rounds):
        for token in (carol, alice):
            response = await client.get("/api/v1/storage/objects", headers=bearer(token))
            assert response.status == 200  # the live decision serves, whatever the candidate


@pytest.fixture(params=["sqlite", "postgres"])
async def store_overrides(request: pytest.FixtureRequest) -> AsyncIterator[dict[str, Any]]:
    if request.param == "sqlite":
        yield {}
        return
    async with pg.temp_schema("cp_shadow_rev") as (dsn, schema):
        yield {"store": {"backend": "postgres", "postgres": {"dsn": dsn, "schema": schema}}}


async def test_a_published_revision_is_shadowed_and_counts_exactly_the_diverging_requests(
        make_client, tmp_path, store_overrides):
    key, public = keypair(tmp_path)
    live_bundle, revoking = Bundle.from_dir(REPO / "policies"), _revoking(tmp_path)
    live_id, candidate_id = live_bundle.revision_id(), revoking.revision_id()
    client = await make_client({**store_overrides, "environments": NON_PRODUCTION,
                                "policies": _policies(public, candidate_id)})
    app = client.server.app
    # Not published yet: the shadow waits for it (and says why), serving is untouched.
    status = await _shadow_status(client, "loading", error="the revision is not in the store")
    status = status["shadow"]
    assert (status["state"], status["source"], status["candidate_revision"]) == (
        "loading", "store", candidate_id)
    assert status["error"] == "the revision is not in the store"

    alice = await login(client, "alice")
    for bundle, message in ((live_bundle, "live"), (revoking, "revoke carol's viewer role")):
        r = await client.post("/api/v1/policy/revisions", json=published(key, bundle, message),
                              headers=bearer(alice))
        assert r.status == 201, await r.text()
    r = await client.post("/api/v1/policy/activation",
                          json={"revision": live_id, "reason": "roll out"}, headers=bearer(alice))
    assert r.status == 200, await r.text()

    status = await _shadow_status(client, "ready", running=live_id)
    assert status["shadow"]["state"] == "ready", status["shadow"]
    assert status["shadow"]["revision"] == candidate_id and status["shadow"]["error"] is None
    assert status["distribution"]["active_revision"] == live_id
    assert status["distribution"]["running_active"] is True
    assert app[ENGINE].revision == live_id  # the candidate is never what serves
    shadow = app[SHADOW]
    assert shadow.wait_idle(30)
    before = shadow.status()["evaluated"]

    await _reads(client)
    assert shadow.wait_idle(30)
    assert await shadow_divergence(client, "allow", "deny") == 3.0  # carol's three reads, not alice's
    status = await (await client.get("/api/v1/authz/status")).json()
    assert status["shadow"]["evaluated"] - before == 6
    assert status["shadow"]["divergences"] == {"allow->deny": 3}
    assert status["status"] == "ready" and status["revision"] == live_id
    r = await client.get("/api/v1/policy/revisions", headers=bearer(alice))
    assert r.status == 200
    listed = {rev["id"]: rev["active"] for rev in (await r.json())["items"]}
    assert listed == {live_id: True, candidate_id: False}  # shadowing does not activate


async def _client_from_file(aiohttp_client: Any, path: Path) -> Any:
    config = load(path, {}, base_dir=REPO)
    return await aiohttp_client(EdgeTestServer(create_app(config)))


async def test_an_untrusted_candidate_is_rejected_and_sighup_follows_a_changed_one(
        aiohttp_client, tmp_path):
    key, public = keypair(tmp_path)
    stranger, _ = keypair(tmp_path, "stranger")
    revoking = _revoking(tmp_path)
    # The same revoking content, but signed by a key this process does not trust: another id
    # (one more comment), so the trusted one can be named after the SIGHUP.
    untrusted = Bundle({**revoking.modules,
                        "authz.rego": revoking.modules["authz.rego"] + "\n# unsigned here\n"},
                       revoking.data)
    untrusted_id, candidate_id = untrusted.revision_id(), revoking.revision_id()
    path = tmp_path / "controlplane.yaml"

    def write(candidate: str | None) -> None:
        path.write_text(yaml.safe_dump({
            "state_dir": str(tmp_path / "state"), "environments": NON_PRODUCTION,
            "policies": {**_policies(public, candidate, poll_s=1), "source": "dir"}}))

    # Both revisions in the store before the service starts (the untrusted one written as a
    # publisher trusting that key would have stored it).
    write(untrusted_id)
    seed = await _client_from_file(aiohttp_client, path)
    store = seed.server.app[STORE].require()
    signature = sign(untrusted, stranger, author="mallory", message="looks harmless",
                     created_at="2026-11-23T18:00:00+00:00")
    assert await store.add_policy_revision(PolicyRevisionRecord(
        id=untrusted_id, digest=untrusted.digest, bundle=untrusted.to_doc(),
        signature=signature, kid=key_id(stranger.public_key()), author="mallory",
        message="looks harmless", created_at=0.0, published_by="mallory", published_at=0.0))
    alice = await login(seed, "alice")
    r = await seed.post("/api/v1/policy/revisions", json=published(key, revoking, "revoke"),
                        headers=bearer(alice))
    assert r.status == 201, await r.text()
    await seed.close()

    client = await _client_from_file(aiohttp_client, path)
    app = client.server.app
    live = app[ENGINE].revision
    status = await _shadow_status(client, "rejected")
    assert status["status"] == "ready" and status["revision"] == live
    assert status["shadow"]["state"] == "rejected" and status["shadow"]["revision"] is None
    assert status["shadow"]["error"].startswith("signature: untrusted_key")
    await _reads(client, rounds=2)
    assert app[SHADOW].wait_idle(30)
    status = await (await client.get("/api/v1/authz/status")).json()
    assert status["status"] == "ready" and status["revision"] == live
    assert status["shadow"]["evaluated"] == 0 and status["shadow"]["skipped"] == 4
    assert await shadow_divergence(client, "allow", "deny") == 0.0

    # The operator names the trusted revision and sends SIGHUP: it loads and shadows.
    write(candidate_id)
    os.kill(os.getpid(), signal.SIGHUP)
    status = await _shadow_status(client, "ready")
    assert status["shadow"]["state"] == "ready", status["shadow"]
    assert status["shadow"]["revision"] == candidate_id
    await _reads(client, rounds=2)
    assert app[SHADOW].wait_idle(30)
    assert await shadow_divergence(client, "allow", "deny") == 2.0
    assert app[ENGINE].revision == live

    # A config that names no candidate any more turns shadow evaluation off.
    write(None)
    os.kill(os.getpid(), signal.SIGHUP)
    status = await _shadow_status(client, "off")
    assert status["shadow"]["state"] == "off" and status["shadow"]["revision"] is None


async def _store_signed(store: Store, bundle: Bundle, key: Any, *,
                        stored: Bundle | None = None) -> str:
    """Write a revision straight into the store, signed for ``bundle``; ``stored``: other
    content stored under that signature (altered after signing)."""
    revision = bundle.revision_id()
    content = stored or bundle
    assert await store.add_policy_revision(PolicyRevisionRecord(
        id=revision, digest=content.digest, bundle=content.to_doc(),
        signature=sign(bundle, key, author="alice", message="", created_at="t"),
        kid=key_id(key.public_key()), author="alice", message="", created_at=0.0,
        published_by="alice", published_at=0.0))
    return revision


async def test_candidate_revision_waits_refuses_and_switches_on_the_real_store(tmp_path):
    """The component alone on a real SQLite store: what it waits for (retried), what it refuses
    for good (altered content, failing vetting), and a switch at reload."""
    key, _ = keypair(tmp_path)
    trusted = {key_id(key.public_key()): key.public_key()}
    revoking = _revoking(tmp_path)
    altered = Bundle({**revoking.modules, "authz.rego": revoking.modules["authz.rego"] + "\n#x\n"},
                     revoking.data)
    broken = Bundle({**revoking.modules, "authz.rego": "package controlplane.authz\nx := \n"},
                    revoking.data)
    store = await open_store(f"sqlite:///{tmp_path / 'cp.db'}")
    shadow = Shadow(None, NON_PRODUCTION)
    shadow.start()  # the shadow process vets and loads what the component hands it
    reachable, configured = False, revoking.revision_id()
    candidate = CandidateRevision(shadow, lambda: store if reachable else None, trusted,
                                  configured, reread=lambda: configured)
    try:
        await candidate.sync()
        assert (shadow.state, shadow.error) == ("loading", "the store is unreachable: the "
                                                "candidate revision cannot be read")
        reachable = True
        await candidate.sync()
        assert (shadow.state, shadow.error) == ("loading", "the revision is not in the store")

        # Signed for one content, another stored under it: refused, never retried.
        configured = await _store_signed(store, altered, key, stored=broken)
        await candidate.reload()
        assert shadow.state == "rejected" and shadow.revision is None
        assert shadow.error is not None and shadow.error.startswith("signature: digest_mismatch")
        # Signed by a trusted key but failing vetting: rejected by the candidate engine.
        configured = await _store_signed(store, broken, key)
        await candidate.reload()
        assert shadow.state == "rejected" and shadow.revision is None
        assert shadow.status()["candidate_revision"] == configured, shadow.error
        assert (shadow.error or "").startswith("compile"), shadow.error

        configured = await _store_signed(store, revoking, key)
        await candidate.reload()
        assert (shadow.state, shadow.revision) == ("ready", configured)
        configured = altered.revision_id()  # back to a refused one: refused again, not re-read
        await candidate.reload()
        assert shadow.state == "rejected" and "digest_mismatch" in (shadow.error or "")
    finally:
        await asyncio.to_thread(shadow.close)
        await store.close()


def test_candidate_dir_and_candidate_revision_are_exclusive(make_config, tmp_path):
    _, public = keypair(tmp_path)
    revision = "sha256:0123456789abcdef"
    with pytest.raises(ConfigError, match="both"):
        make_config({"policies": {**_policies(public, revision),
                                  "candidate_dir": str(REPO / "policies")}})
    with pytest.raises(ConfigError, match="trusted_keys is empty"):
        make_config({"policies": {"candidate_revision": revision}})
    with pytest.raises(ConfigError, match=r"store\.backend is none"):
        make_config({"store": {"backend": "none"},
                     "policies": {**_policies(public, revision), "source": "dir"}})
    with pytest.raises(ConfigError, match="candidate_revision"):
        make_config({"policies": {"candidate_revision": "not-a-revision"}})
    assert make_config({"policies": _policies(public, revision)}).policies.candidate_revision \
        == revision
