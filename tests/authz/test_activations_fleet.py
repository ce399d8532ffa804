"""Real `cpctl serve` processes following the store's active policy revision.

Two replicas (separate state dirs) on one PostgreSQL schema, and one SQLite replica with two
workers: a published revision, once activated, runs in every process within the convergence
bound and decides their requests; a rollback brings every process back; a revision signed by a
key they do not trust is refused by all of them (authz degraded, the previous one serving).
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from service.authz.activations import ActivationSigner
from service.authz.revisions import Bundle, key_id, sign
from service.store import Store, open_store
from service.store.base import PolicyRevisionRecord
from tests.auth import PASSWORDS
from tests.servers import serve
from tests.store.pg import require_postgres, temp_schema

REPO = Path(__file__).resolve().parents[2]
#: The configured bound the tests hold every process to (poll 0.2 s; vetting takes the rest).
CONVERGENCE_S = 5.0


def activation_key(tmp_path: Path) -> ActivationSigner:
    """The fleet's activation key (one PEM file every replica is configured with)."""
    path = tmp_path / "activation.pem"
    if not path.exists():
        path.write_bytes(Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
    return ActivationSigner.from_file(path)


def fleet_config(tmp_path: Path, public: Path, **store: Any) -> Path:
    activation_key(tmp_path)
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({
        # A fleet without production environments: no tickets needed to roll out here (the
        # ticket path is tests/api/test_policy_revisions.py).
        "environments": {"dev": {"production": False}, "staging": {"production": False}},
        "policies": {"source": "store", "store": {
            "trusted_keys": [str(public)], "poll_interval_s": 0.2,
            "convergence_s": CONVERGENCE_S,
            "activation_key": str(tmp_path / "activation.pem")}},
        **({"store": store} if store else {}),
    }))
    return path


def signer(tmp_path: Path) -> tuple[Ed25519PrivateKey, Path]:
    key = Ed25519PrivateKey.generate()
    public = tmp_path / "policy-signing.pub.pem"
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return key, public


def variant(comment: str) -> Bundle:
    base = Bundle.from_dir(REPO / "policies")
    return Bundle({**base.modules, "authz.rego": base.modules["authz.rego"] + f"\n# {comment}\n"},
                  base.data)


def signed(bundle: Bundle, key: Ed25519PrivateKey) -> dict[str, Any]:
    return {"bundle": bundle.to_doc(), "signature": sign(
        bundle, key, author="alice", message="fleet test", created_at="2026-11-23T18:00:00Z")}


class Replica:
    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session, self.base, self.token = session, base, ""

    async def login(self) -> None:
        async with self.session.post(self.base + "/api/v1/authn/sessions", json={
                "subject_id": "alice", "password": PASSWORDS["alice"]}) as r:
            assert r.status == 201, await r.text()
            self.token = (await r.json())["access_token"]

    async def call(self, method: str, path: str, **kw: Any) -> tuple[int, Any, str]:
        async with self.session.request(method, self.base + path, headers={
                "Authorization": f"Bearer {self.token}"}, **kw) as r:
            return r.status, await r.json(content_type=None), r.headers["X-Correlation-ID"]

    async def status(self) -> dict[str, Any]:
        async with self.session.get(self.base + "/api/v1/authz/status") as r:
            return dict(await r.json())

    async def process_revisions(self) -> dict[str, tuple[str, float]]:
        """pid -> (revision served, converged) from /metrics (one series per worker)."""
        async with self.session.get(self.base + "/metrics") as r:
            text = await r.text()
        serving: dict[str, str] = {}
        for labels, _value in _samples(text, "controlplane_policy_process_revision", 1.0):
            serving[labels.get("pid", "")] = labels["revision"]
        converged = {labels.get("pid", ""): value
                     for labels, value in _samples(text, "controlplane_policy_store_converged")}
        return {pid: (rev, converged.get(pid, -1.0)) for pid, rev in serving.items()}


def _samples(text: str, name: str, only: float | None = None
             ) -> list[tuple[dict[str, str], float]]:
    out = []
    for m in re.finditer(rf"^{name}(?:\{{([^}}]*)\}})? ([0-9.e+-]+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        value = float(m.group(2))
        if only is None or value == only:
            out.append((labels, value))
    return out


async def activate(replica: Replica, revision: str) -> None:
    status, body, _ = await replica.call("POST", "/api/v1/policy/activation",
                                         json={"revision": revision, "reason": "fleet test"})
    assert status == 200, body


async def publish(replica: Replica, bundle: Bundle, key: Ed25519PrivateKey) -> str:
    status, body, _ = await replica.call("POST", "/api/v1/policy/revisions",
                                         json=signed(bundle, key))
    assert status == 201, body
    return str(body["id"])


async def until(check: Any, what: str, timeout: float = CONVERGENCE_S) -> float:
    """Poll ``check()`` until true; the seconds it took (fails past ``timeout``)."""
    started = time.monotonic()
    while not await check():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def running(replicas: list[Replica], revision: str) -> bool:
    for replica in replicas:
        status = await replica.status()
        d = status["distribution"]
        if (status["revision"], d["active_revision"], d["running_active"]) != (
                revision, revision, True):
            return False
    return True


async def decided_with(store: Store, correlation_ids: list[str]) -> set[str]:
    records = await store.audit_range(0, 500)
    found = {r.entry["correlation_id"]: r.entry.get("policy_revision") for r in records}
    return {str(found[c]) for c in correlation_ids}


async def untrusted_activation(store: Store, bundle: Bundle, signer: ActivationSigner) -> str:
    """What a writer holding the activation key, but no revision key, could do: store and
    activate a revision signed by a key no replica trusts (the API itself refuses both)."""
    stranger = Ed25519PrivateKey.generate()
    jws = sign(bundle, stranger, author="mallory", message="x", created_at="2026-11-23T18:00:00Z")
    revision = bundle.revision_id()
    await store.add_policy_revision(PolicyRevisionRecord(
        id=revision, digest=bundle.digest, bundle=bundle.to_doc(), signature=jws,
        kid=key_id(stranger.public_key()), author="mallory", message="x", created_at=0.0,
        published_by="mallory", published_at=time.time()))
    await store.activate_policy_revision(revision, kind="activate", by="mallory", at=time.time(),
                                         sign=lambda a: signer.sign(a, None))
    return revision


async def test_two_replicas_on_postgresql_follow_the_active_revision(tmp_path):
    await require_postgres()
    key, public = signer(tmp_path)
    async with temp_schema("cp_fleet") as (dsn, schema):
        env = {"CONTROLPLANE_CONFIG": str(fleet_config(tmp_path, public)),
               "CONTROLPLANE_STORE__BACKEND": "postgres",
               "CONTROLPLANE_STORE__POSTGRES__DSN": dsn,
               "CONTROLPLANE_STORE__POSTGRES__SCHEMA": schema}
        store = await open_store(dsn, schema=schema)
        try:
            with serve(tmp_path / "a" / "state", env=env) as (a_url, _), \
                    serve(tmp_path / "b" / "state", env=env) as (b_url, _):
                async with aiohttp.ClientSession() as session:
                    await _follow(store, [Replica(session, a_url), Replica(session, b_url)], key,
                                  activation_key(tmp_path), listening=True)
        finally:
            await store.close()


async def test_two_sqlite_workers_follow_the_active_revision(tmp_path):
    key, public = signer(tmp_path)
    state = tmp_path / "state"
    env = {"CONTROLPLANE_CONFIG": str(fleet_config(tmp_path, public))}
    with serve(state, workers=2, env=env) as (url, _):
        store = await open_store(f"sqlite:///{state / 'controlplane.db'}")
        try:
            async with aiohttp.ClientSession() as session:
                replica = Replica(session, url)
                await _follow(store, [replica], key, activation_key(tmp_path), listening=False,
                              workers=2)
        finally:
            await store.close()


async def _follow(store: Store, replicas: list[Replica], key: Ed25519PrivateKey,
                  signer: ActivationSigner, *,
                  listening: bool, workers: int = 1) -> None:
    for replica in replicas:
        await replica.login()
        d = (await replica.status())["distribution"]
        assert (d["source"], d["active_revision"], d["listening"]) == ("store", None, listening)
    first, second = variant("fleet one"), variant("fleet two")
    r1 = await publish(replicas[0], first, key)
    r2 = await publish(replicas[-1], second, key)

    async def everywhere(revision: str, converged: float = 1.0) -> bool:
        if not await running(replicas, revision) and converged == 1.0:
            return False
        for replica in replicas:
            processes = await replica.process_revisions()
            if len(processes) < workers or any(
                    p != (revision, converged) for p in processes.values()):
                return False
        return True

    await activate(replicas[0], r1)
    took = await until(lambda: everywhere(r1), f"every process runs {r1}")
    print(f"converged on activation in {took:.2f} s")
    cids = []
    for replica in replicas:
        for _ in range(2 * workers):
            status, _body, cid = await replica.call("GET", "/api/v1/policy/revisions")
            assert status == 200
            cids.append(cid)
    assert await decided_with(store, cids) == {r1}

    await activate(replicas[-1], r2)
    await until(lambda: everywhere(r2), f"every process runs {r2}")
    status, body, _ = await replicas[0].call("POST", "/api/v1/policy/rollback",
                                             json={"reason": "back"})
    assert status == 200 and body["revision"] == r1, body
    took = await until(lambda: everywhere(r1), f"every process is back on {r1}")
    print(f"converged on rollback in {took:.2f} s")

    bad = await untrusted_activation(store, variant("not ours"), signer)

    async def refused() -> bool:
        for replica in replicas:
            status = await replica.status()
            d = status["distribution"]
            if not (status["status"] == "degraded" and status["revision"] == r1
                    and d["active_revision"] == bad and d["running_active"] is False
                    and "untrusted_key" in (d["error"] or "")):
                return False
            # The load gauge says so for as long as the refused revision is the active one.
            if await metric(replica, "controlplane_policy_load_ok", source="store") != 0.0:
                return False
        return await everywhere(r1, converged=0.0)

    await until(refused, "every process refuses the untrusted revision and keeps serving")
    cids = []
    for replica in replicas:
        status, _body, cid = await replica.call("GET", "/api/v1/policy/revisions")
        assert status == 200
        cids.append(cid)
    assert await decided_with(store, cids) == {r1}
    await asyncio.sleep(1.0)  # several polls later the gauge has not recovered by itself
    for replica in replicas:
        assert await metric(replica, "controlplane_policy_load_ok", source="store") == 0.0
    # The API refuses to activate what no replica would run.
    status, body, _ = await replicas[0].call("POST", "/api/v1/policy/activation",
                                             json={"revision": bad})
    assert (status, body["code"]) == (422, "policy_signature_invalid"), body


async def metric(replica: Replica, name: str, **labels: str) -> float:
    async with replica.session.get(replica.base + "/metrics") as r:
        text = await r.text()
    return sum(value for found, value in _samples(text, name)
               if all(found.get(k) == v for k, v in labels.items()))


async def test_a_database_only_activation_is_refused_by_every_replica(tmp_path):
    """Issue 30 (3): a writer of the database alone inserts an activation of an older signed
    revision and moves policy_head back; then replays an older signed activation. Both replicas
    refuse both (degraded, counted, load gauge 0) and keep serving the revision they run; the
    next signed activation is followed again."""
    await require_postgres()
    key, public = signer(tmp_path)
    async with temp_schema("cp_forge") as (dsn, schema):
        env = {"CONTROLPLANE_CONFIG": str(fleet_config(tmp_path, public)),
               "CONTROLPLANE_STORE__BACKEND": "postgres",
               "CONTROLPLANE_STORE__POSTGRES__DSN": dsn,
               "CONTROLPLANE_STORE__POSTGRES__SCHEMA": schema}
        sql = await asyncpg.connect(dsn, server_settings={"search_path": schema})
        try:
            with serve(tmp_path / "a" / "state", env=env) as (a_url, _), \
                    serve(tmp_path / "b" / "state", env=env) as (b_url, _):
                async with aiohttp.ClientSession() as session:
                    replicas = [Replica(session, a_url), Replica(session, b_url)]
                    for replica in replicas:
                        await replica.login()
                    await _forge(sql, replicas, key)
        finally:
            await sql.close()


async def _forge(sql: Any, replicas: list[Replica], key: Ed25519PrivateKey) -> None:
    old, new = variant("old: carol would be admin"), variant("new")
    r_old = await publish(replicas[0], old, key)
    r_new = await publish(replicas[0], new, key)
    await activate(replicas[0], r_old)
    await until(lambda: running(replicas, r_old), f"every replica runs {r_old}")
    await activate(replicas[1], r_new)
    await until(lambda: running(replicas, r_new), f"every replica runs {r_new}")
    rows = await sql.fetch("SELECT seq, signature FROM policy_activations ORDER BY seq")
    assert [r["seq"] for r in rows] == [1, 2] and all(r["signature"] for r in rows)

    async def refused(reason: str, seq: int) -> bool:
        for replica in replicas:
            status = await replica.status()
            d = status["distribution"]
            if not (status["status"] == "degraded" and status["revision"] == r_new
                    and d["active_revision"] == r_new
                    and d["refused_activation"] == {"seq": seq, "revision": r_old,
                                                    "reason": reason}):
                return False
            if (await metric(replica, "controlplane_policy_activations_refused_total",
                             reason=reason) < 1
                    or await metric(replica, "controlplane_policy_load_ok",
                                    source="store") != 0.0):
                return False
        return True

    # 1. An unsigned activation row of the older revision, policy_head moved back with it.
    await sql.execute(
        "INSERT INTO policy_activations (seq, revision_id, previous_id, kind, activated_by, "
        "activated_at, reason) VALUES (3, $1, $2, 'activate', 'alice', $3, 'forged')",
        r_old, r_new, time.time())
    await sql.execute("UPDATE policy_head SET seq = 3, revision_id = $1, previous_id = $2",
                      r_old, r_new)
    await until(lambda: refused("unsigned", 3), "both replicas refuse the unsigned activation")
    # 2. The same row carrying the genuine signature of the first activation (seq 1).
    await sql.execute("UPDATE policy_activations SET signature = "
                      "(SELECT signature FROM policy_activations WHERE seq = 1) WHERE seq = 3")
    await sql.execute("UPDATE policy_head SET seq = 3")  # wakes the replicas (NOTIFY)
    await until(lambda: refused("mismatch", 3), "both replicas refuse the copied signature")
    # 3. A replay: the newer activations deleted, the first one (validly signed) is the latest.
    await sql.execute("DELETE FROM policy_activations WHERE seq > 1")
    await sql.execute("UPDATE policy_head SET seq = 1, revision_id = $1, previous_id = ''",
                      r_old)
    await until(lambda: refused("out_of_sequence", 1), "both replicas refuse the replay")
    for replica in replicas:  # the revision they ran keeps deciding
        status, _body, _cid = await replica.call("GET", "/api/v1/policy/revisions")
        assert status == 200
        assert (await replica.status())["revision"] == r_new

    # The next signed activation (through the API) is above every row, and is followed.
    await activate(replicas[0], r_old)
    await until(lambda: running(replicas, r_old), f"every replica runs {r_old} again")
    for replica in replicas:
        status = await replica.status()
        assert status["status"] == "ready", status
        assert status["distribution"]["refused_activation"] is None
        assert await metric(replica, "controlplane_policy_load_ok", source="store") == 1.0
