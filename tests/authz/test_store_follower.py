"""``StoreFollower`` and ``revisions``: the signature rules, and a process following the store's
active revision (real SQLite store, real engine)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest
import rfc8785
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from service.authz.activations import (
    ActivationRefused,
    ActivationSigner,
    verify_activation,
)
from service.authz.engine import PolicyEngine
from service.authz.reload import StoreFollower, fetch_revision, following, materialize_revision
from service.authz.revisions import (
    Bundle,
    BundleError,
    SignatureError,
    materialize,
    sign,
    verify,
)
from service.authz.source import read_snapshot
from service.config import ConfigError, PolicyStoreConfig, load
from service.store import Store, open_store
from service.store.base import PolicyActivation
from tests.authz.revisions import ACTIVATION_KEYS, ACTIVATOR, KEY, TRUSTED, publish, variant
from tests.store.pg import require_postgres, temp_schema

REPO = Path(__file__).resolve().parents[2]
def _b64(doc: Any) -> str:
    return base64.urlsafe_b64encode(rfc8785.dumps(doc)).decode().rstrip("=")


# ---- the signature ---------------------------------------------------------------------------


def test_id_is_the_engine_revision_of_the_same_files(tmp_path: Path) -> None:
    bundle = variant("x")
    assert bundle.revision_id() == read_snapshot(materialize(bundle, tmp_path / "p")).revision
    crlf = Bundle({**bundle.modules, "authz.rego": bundle.modules["authz.rego"] + "# a\r\n"},
                  bundle.data)
    materialize(crlf, tmp_path / "crlf")
    assert Bundle.from_dir(tmp_path / "crlf") == crlf  # no newline translation either way
    assert crlf.revision_id() == read_snapshot(tmp_path / "crlf").revision != bundle.revision_id()
    assert Bundle.from_dir(REPO / "policies").revision_id() == \
        read_snapshot(REPO / "policies").revision


def _forged(bundle: Bundle, jws: dict[str, str], case: str) -> tuple[Bundle, dict[str, str]]:
    header = json.loads(base64.urlsafe_b64decode(jws["protected"] + "=="))
    payload = json.loads(base64.urlsafe_b64decode(jws["payload"] + "=="))
    if case == "alg_none":
        return bundle, {**jws, "protected": _b64({**header, "alg": "none"}), "signature": ""}
    if case == "alg_hs256":
        return bundle, {**jws, "protected": _b64({**header, "alg": "HS256"})}
    if case == "unknown_kid":
        return bundle, sign(bundle, Ed25519PrivateKey.generate(), author="m", message="",
                            created_at="t")
    if case == "payload_swapped":  # the signature of one payload over another
        return bundle, {**jws, "payload": _b64({**payload, "author": "mallory"})}
    if case == "content_changed":
        return variant("other"), jws
    if case == "wrong_purpose":
        forged = _b64({**payload, "purpose": "controlplane-audit-checkpoint"})
        sig = KEY.sign(f"{jws['protected']}.{forged}".encode())
        return bundle, {**jws, "payload": forged,
                        "signature": base64.urlsafe_b64encode(sig).decode().rstrip("=")}
    if case == "garbage":
        return bundle, {"protected": "!!", "payload": "x", "signature": "y"}
    raise AssertionError(case)


@pytest.mark.parametrize("case, reason", [
    ("alg_none", "algorithm_not_allowed"), ("alg_hs256", "algorithm_not_allowed"),
    ("unknown_kid", "untrusted_key"), ("payload_swapped", "bad_signature"),
    ("content_changed", "digest_mismatch"), ("wrong_purpose", "wrong_purpose"),
    ("garbage", "malformed"),
])
def test_verify_refuses(case: str, reason: str) -> None:
    bundle = variant("signed")
    jws = sign(bundle, KEY, author="alice", message="m", created_at="2026-11-23T18:00:00Z")
    assert verify(bundle, jws, TRUSTED).author == "alice"
    forged_bundle, forged = _forged(bundle, jws, case)
    with pytest.raises(SignatureError) as exc:
        verify(forged_bundle, forged, TRUSTED)
    assert exc.value.reason == reason


def test_verify_refuses_another_revision_id() -> None:
    bundle = variant("signed")
    jws = sign(bundle, KEY, author="a", message="", created_at="t")
    with pytest.raises(SignatureError) as exc:
        verify(bundle, jws, TRUSTED, revision="sha256:0000000000000000")
    assert exc.value.reason == "revision_mismatch"


@pytest.mark.parametrize("modules, data", [
    ({"../x.rego": "package x"}, {}),
    ({"a.rego": "package a"}, {"roles.txt": ""}),
    ({"a_test.rego": "package a"}, {}),  # tests alone are no revision
    ({"a.rego": "x" * (4 * 1024 * 1024 + 1)}, {}),
])
def test_bundle_refuses_unsafe_or_empty_content(modules: dict[str, str],
                                                 data: dict[str, str]) -> None:
    with pytest.raises(BundleError):
        Bundle(modules, data)


# ---- following the store ---------------------------------------------------------------------


async def test_follower_runs_the_active_revision_and_refuses_bad_ones(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'cp.db'}")
    engine = PolicyEngine(REPO / "policies", vet_in_subprocess=False)
    assert engine.load().ok
    bootstrap = engine.revision
    reachable = True
    follower = StoreFollower(engine, lambda: store if reachable else None,
                             PolicyStoreConfig((), 0.1, 0.5), TRUSTED,
                             activation_keys=ACTIVATION_KEYS)
    seen: list[tuple[str | None, bool]] = []
    follower.listeners.append(lambda active, running: seen.append((active, running)))
    try:
        await follower.sync()  # nothing activated yet: the directory's revision serves
        status = follower.status()
        assert (status["active_revision"], status["degraded"], engine.revision) == (
            None, False, bootstrap)

        good = await publish(store, variant("good"))
        await follower.sync()
        assert engine.revision == good and follower.converged
        assert follower.status()["running_active"] is True and seen[-1] == (good, True)
        assert (await fetch_revision(store, good, TRUSTED)).revision == good
        written = await materialize_revision(store, good, TRUSTED, tmp_path / "candidate")
        assert read_snapshot(tmp_path / "candidate").revision == written.revision == good

        for bundle, key in ((variant("stranger"), Ed25519PrivateKey.generate()),
                            (variant("", "package controlplane.authz\nx := \n"), KEY)):
            bad = await publish(store, bundle, key)
            await follower.sync()
            status = follower.status()
            # Refused at once (not after the bound), the last good revision keeps serving.
            assert engine.revision == good and status["degraded"] is True
            assert status["active_revision"] == bad and status["running_active"] is False
            assert seen[-1] == (bad, False)
        assert "untrusted_key" in str(follower._refused)

        assert engine.status()["status"] == "degraded"  # the engine's own rejection
        back = await publish(store, variant("good"))  # re-activating the good one recovers
        await follower.sync()
        assert back == good and follower.status()["degraded"] is False
        assert engine.status()["status"] == "ready"

        # The store unreachable: not degraded within the bound, degraded past it.
        reachable = False
        await follower.sync()
        assert follower.status()["degraded"] is False
        await asyncio.sleep(0.6)
        await follower.sync()
        status = follower.status()
        assert status["degraded"] is True and "unreachable" in status["error"]
        assert engine.revision == good
        reachable = True
        await follower.sync()
        assert follower.status()["degraded"] is False
    finally:
        await store.close()


@pytest.mark.parametrize("overrides, message", [
    ({"policies": {"source": "store"}}, "trusted_keys is empty"),
    ({"policies": {"source": "store", "store": {"trusted_keys": ["k.pem"]}},
      "store": {"backend": "none"}}, "store.backend is none"),
    ({"policies": {"store": {"poll_interval_s": 5, "convergence_s": 5}}}, "convergence_s"),
    ({"policies": {"source": "git"}}, "source"),
])
def test_config_refuses_a_store_source_that_could_never_converge(
        overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(None, {}, overrides=overrides)


async def test_postgresql_notify_wakes_the_follower_long_before_its_poll(tmp_path: Path) -> None:
    await require_postgres()
    async with temp_schema("cp_notify") as (dsn, schema):
        store = await open_store(dsn, schema=schema)
        writer = await open_store(dsn, schema=schema)  # another replica's connection
        engine = PolicyEngine(REPO / "policies", vet_in_subprocess=False)
        assert engine.load().ok
        follower = StoreFollower(engine, lambda: store, PolicyStoreConfig((), 60, 120), TRUSTED,
                                 activation_keys=ACTIVATION_KEYS)
        try:
            async with following(follower, lambda: store, 60):
                deadline = time.monotonic() + 5
                while not follower.listening:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.02)
                revision = await publish(writer, variant("notified"))
                started = time.monotonic()
                while engine.revision != revision:
                    # The poll is 60 s away: only the NOTIFY can have woken it (30 s: slack
                    # for a loaded machine, half the poll).
                    assert time.monotonic() - started < 30, follower.status()
                    await asyncio.sleep(0.02)
        finally:
            await writer.close()
            await store.close()


# ---- signed activations ----------------------------------------------------------------------


async def _raw(store: Store, sql: str, *args: object) -> None:
    """A write of the database alone (what a writer with its credentials can do)."""
    async with store._unit(write=True) as q:  # type: ignore[attr-defined]
        await q.exec(sql, *args)


async def test_follower_refuses_activations_the_database_alone_wrote(tmp_path: Path) -> None:
    """Issue 30 (3): an unsigned activation row, a genuine signature copied onto another row,
    and an older signed activation replayed are each refused (degraded, counted once, load not
    ok) and the revision of the last accepted activation keeps serving; the next signed
    activation is followed."""
    store = await open_store(f"sqlite:///{tmp_path / 'cp.db'}")
    engine = PolicyEngine(REPO / "policies", vet_in_subprocess=False)
    assert engine.load().ok
    follower = StoreFollower(engine, lambda: store, PolicyStoreConfig((), 0.1, 0.5), TRUSTED,
                             activation_keys=ACTIVATION_KEYS)
    refusals: list[str] = []
    follower.activation_listeners.append(refusals.append)
    try:
        old = await publish(store, variant("old"))
        new = await publish(store, variant("new"))
        await follower.sync()
        assert engine.revision == new and follower.load_ok and follower.accepted_seq == 2

        async def refused(reason: str, seq: int) -> None:
            await follower.sync()
            await follower.sync()  # a refusal is counted once, not once per sync
            status = follower.status()
            assert status["refused_activation"] == {"seq": seq, "revision": old,
                                                    "reason": reason}, status
            assert status["degraded"] is True and status["active_revision"] == new
            assert engine.revision == new and not follower.load_ok
            assert refusals[-1] == reason and refusals.count(reason) == 1

        await _raw(store, "INSERT INTO policy_activations (seq, revision_id, previous_id, kind, "
                   "activated_by, activated_at, reason) VALUES (3, ?, ?, 'activate', 'alice', "
                   "?, 'forged')", old, new, time.time())
        await _raw(store, "UPDATE policy_head SET seq = 3, revision_id = ?, previous_id = ?",
                   old, new)
        await refused("unsigned", 3)
        await _raw(store, "UPDATE policy_activations SET signature = (SELECT signature FROM "
                   "policy_activations WHERE seq = 1) WHERE seq = 3")
        await refused("mismatch", 3)
        await _raw(store, "DELETE FROM policy_activations WHERE seq > 1")
        await refused("out_of_sequence", 1)
        stranger = ActivationSigner(Ed25519PrivateKey.generate())
        await _raw(store, "DELETE FROM policy_activations")
        await store.activate_policy_revision(old, kind="activate", by="mallory",
                                             at=time.time(), sign=lambda a: stranger.sign(a, None),
                                             after_seq=5)
        await refused("untrusted_key", 6)

        # The next activation signed by the fleet's key is above every row, and followed.
        again = await store.activate_policy_revision(
            old, kind="activate", by="alice", at=time.time(),
            sign=lambda a: ACTIVATOR.sign(a, "ticket-2"), after_seq=follower.accepted_seq)
        assert again.seq == 7
        await follower.sync()
        status = follower.status()
        assert engine.revision == old and follower.load_ok and status["degraded"] is False
        assert status["refused_activation"] is None
    finally:
        await store.close()


def test_an_activation_signature_covers_every_field() -> None:
    a = PolicyActivation(seq=4, revision_id="sha256:1", previous_id="sha256:0",
                         kind="activate", activated_by="alice", activated_at=1.5)
    signed = replace_signature(a, ACTIVATOR.sign(a, "t-1"))
    assert verify_activation(signed, ACTIVATION_KEYS, after_seq=3) == "t-1"
    for field, value in (("seq", 5), ("revision_id", "sha256:2"), ("previous_id", ""),
                         ("kind", "rollback"), ("activated_by", "mallory"),
                         ("activated_at", 2.5)):
        with pytest.raises(ActivationRefused) as exc:
            verify_activation(replace_signature(signed, signed.signature, **{field: value}),
                              ACTIVATION_KEYS)
        assert exc.value.reason == "mismatch", field
    with pytest.raises(ActivationRefused) as exc:
        verify_activation(signed, ACTIVATION_KEYS, after_seq=4)
    assert exc.value.reason == "out_of_sequence"
    with pytest.raises(ActivationRefused) as exc:
        verify_activation(signed, TRUSTED)  # a revision key is not an activation key
    assert exc.value.reason == "untrusted_key"


def replace_signature(a: PolicyActivation, signature: Any, **changes: Any) -> PolicyActivation:
    return dataclasses.replace(a, signature=signature, **changes)


async def test_a_rollback_to_directory_mode_runs_the_directory_again(tmp_path: Path) -> None:
    """Issue 30 (4): the way back after the first activation: a signed activation of no
    revision ("") makes every follower run its policies.dir again."""
    store = await open_store(f"sqlite:///{tmp_path / 'cp.db'}")
    engine = PolicyEngine(REPO / "policies", vet_in_subprocess=False)
    assert engine.load().ok
    directory = engine.revision
    follower = StoreFollower(engine, lambda: store, PolicyStoreConfig((), 0.1, 0.5), TRUSTED,
                             activation_keys=ACTIVATION_KEYS)
    try:
        first = await publish(store, variant("first"))
        await follower.sync()
        assert engine.revision == first != directory
        back = await store.activate_policy_revision(
            "", kind="rollback", by="alice", at=time.time(), expected=first,
            sign=lambda a: ACTIVATOR.sign(a, "ticket-9"))
        assert (back.revision_id, back.previous_id) == ("", first)
        await follower.sync()
        status = follower.status()
        assert engine.revision == directory and follower.converged and follower.load_ok
        assert (status["active_revision"], status["directory_mode"], status["degraded"]) == (
            None, True, False)
        await follower.sync()  # stays there without reloading again
        assert engine.revision == directory
    finally:
        await store.close()
