"""Logout reaches every worker and every replica at once (real `cpctl serve` processes).

Two replicas with separate state dirs (so separate signing keys) on one PostgreSQL: replica A
runs two workers, replica B one. A token issued by A is used on both until each process has it
in its verified-token cache; after logout on B, the very next request to any process is refused.
The verified-token cache saves only the signature check; the session is read per request (one
indexed read), which is what makes revocation immediate.
"""

from __future__ import annotations

import contextlib
import time

import aiohttp

from tests.auth import PASSWORDS
from tests.servers import serve
from tests.store.pg import require_postgres, temp_schema

ME = "/api/v1/authn/sessions/current"


async def test_logout_is_refused_at_once_by_every_worker_and_replica(tmp_path):
    await require_postgres()
    async with temp_schema("cp_revoke") as (dsn, schema):
        env = {"CONTROLPLANE_STORE__BACKEND": "postgres", "CONTROLPLANE_STORE__POSTGRES__DSN": dsn,
               "CONTROLPLANE_STORE__POSTGRES__SCHEMA": schema}
        with contextlib.ExitStack() as stack:
            a, _ = stack.enter_context(serve(tmp_path / "replica-a", workers=2, env=env))
            b, _ = stack.enter_context(serve(tmp_path / "replica-b", env=env))
            async with aiohttp.ClientSession() as http:
                async with http.post(a + "/api/v1/authn/sessions", json={
                        "subject_id": "alice", "password": PASSWORDS["alice"]}) as r:
                    assert r.status == 201, await r.text()
                    token = (await r.json())["access_token"]
                auth = {"Authorization": f"Bearer {token}"}
                # Warm every process's verified-token cache (new connections spread over A's
                # two workers; B verifies A's key through the store).
                for base in [a] * 12 + [b] * 3:
                    async with aiohttp.ClientSession() as fresh, fresh.get(base + ME,
                                                                           headers=auth) as r:
                        assert r.status == 200, await r.text()
                async with http.delete(b + ME, headers=auth) as r:
                    assert r.status in (200, 204), await r.text()
                logged_out = time.monotonic()
                refused = []
                for base in [a] * 12 + [b] * 3:
                    async with aiohttp.ClientSession() as fresh, fresh.get(base + ME,
                                                                           headers=auth) as r:
                        body = await r.json(content_type=None)
                        refused.append((r.status, body.get("code")))
                latency = time.monotonic() - logged_out
        assert set(refused) == {(401, "session_revoked")}, refused
        print(f"15 requests refused on 3 processes within {latency:.3f} s of the logout")
