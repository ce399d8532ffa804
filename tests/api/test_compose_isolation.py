"""POST /api/v1/compose/import evaluates in evaluator processes: a native crash there fails one
request (422 evaluation_failed), is counted and logged once, and the worker serves on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from service.compose import preflight
from service.compose.evaluator import COMPOSE_EVALUATOR, EvaluatorPool
from tests.auth import PASSWORDS, bearer, login
from tests.compose.long_values import documents, every_pair, rotation
from tests.metrics import scrape, value
from tests.problems import assert_problem
from tests.servers import serve

IMPORT = "/api/v1/compose/import"
FAILURES = ("controlplane_compose_evaluator_failures", "controlplane_compose_evaluator_failures_total")
#: How long a test waits for an evaluator to be busy (a generous bound, not a timing claim).
WAIT_S = 60.0


def _services(count: int) -> dict[str, Any]:
    """Services with findings from most rules: ~2 ms of evaluation each."""
    return {f"svc{i}": {"image": "nginx", "restart": "always", "cap_add": ["NET_ADMIN"],
                        "ports": [{"target": 80, "published": "80", "protocol": "tcp"}],
                        "environment": {"DB_PASSWORD": f"hunter2hunter2-{i}"}}
            for i in range(count)}


async def _busy_evaluator(pool: EvaluatorPool, request: asyncio.Future[Any]) -> int:
    deadline = time.monotonic() + WAIT_S
    while not (busy := pool.pids(busy=True)):
        assert not request.done(), "the request ended before an evaluator was busy with it"
        assert time.monotonic() < deadline, "no evaluator became busy"
        await asyncio.sleep(0.005)
    return busy[0]


async def test_a_viewer_with_a_30000_character_password_gets_a_report(client):
    """The issue's request: carol (viewer) imports a 30,000-character DB_PASSWORD."""
    token = await login(client, "carol")
    response = await client.post(IMPORT, headers=bearer(token), json={"fields": {"services": {
        "db": {"image": "postgres:16", "environment": {"DB_PASSWORD": "x" * 30_000}}}}})
    assert response.status == 200
    found = [f for f in (await response.json())["findings"] if f["rule"] == "secret-env"]
    assert [f["severity"] for f in found] == ["fail"]
    assert (await client.get("/healthz")).status == 200


@pytest.mark.parametrize("signum", [signal.SIGSEGV, signal.SIGKILL], ids=["SIGSEGV", "SIGKILL"])
async def test_an_evaluator_killed_mid_request_fails_that_request_and_the_next_is_served(
        client, caplog, signum):
    token = await login(client, "carol")
    pool = client.app[COMPOSE_EVALUATOR]
    big = asyncio.ensure_future(client.post(IMPORT, headers=bearer(token),
                                            json={"fields": {"services": _services(800)}}))
    pid = await _busy_evaluator(pool, big)
    with caplog.at_level(logging.ERROR, logger="controlplane.compose"):
        os.kill(pid, signum)
        response = await big
    problem = await assert_problem(response, 422, "evaluation_failed")
    assert problem["errors"][0]["pointer"] == "/fields"
    events = [r for r in caplog.records
              if getattr(r, "fields", {}).get("event") == "compose.evaluator_failed"]
    assert [r.fields["reason"] for r in events] == ["crashed"]  # type: ignore[attr-defined]
    assert value(await scrape(client), *FAILURES, reason="crashed") == 1

    after = await client.post(IMPORT, headers=bearer(token),
                              json={"fields": {"services": _services(2)}})
    assert after.status == 200 and (await after.json())["summary"]["services"] == 2
    assert pid not in pool.pids()
    assert (await client.get("/healthz")).status == 200


async def test_an_evaluator_over_the_wall_clock_bound_is_killed(client, monkeypatch):
    """A chunk of services cannot be interrupted inside the child: past WALL_FACTOR times the
    CPU budget the worker kills the child and answers evaluation_budget_exceeded."""
    token = await login(client, "carol")
    await client.post(IMPORT, headers=bearer(token),  # both children started, rules compiled
                      json={"fields": {"services": _services(1)}})
    pool = client.app[COMPOSE_EVALUATOR]
    started = pool.pids()
    # 0.2 ms of wall-clock time: far less than one chunk of 20 such services takes anywhere.
    monkeypatch.setattr(preflight, "EVALUATION_BUDGET_S", 0.2e-3 / preflight.WALL_FACTOR)
    response = await client.post(IMPORT, headers=bearer(token),
                                 json={"fields": {"services": _services(20)}})
    await assert_problem(response, 422, "evaluation_budget_exceeded")
    assert value(await scrape(client), *FAILURES, reason="timeout") == 1
    assert not set(started) & set(pool.pids())  # the child that held it is gone
    monkeypatch.undo()
    response = await client.post(IMPORT, headers=bearer(token),
                                 json={"fields": {"services": _services(20)}})
    assert response.status == 200


async def test_a_cached_report_needs_no_evaluator_and_shutdown_leaves_none(make_client):
    client = await make_client()
    token = await login(client, "carol")
    body = json.dumps({"fields": {"services": _services(3)}, "env": "prod"})
    headers = {**bearer(token), "Content-Type": "application/json"}
    first = await client.post(IMPORT, headers=headers, data=body)
    assert first.status == 200
    pool = client.app[COMPOSE_EVALUATOR]
    children = pool.pids()
    assert children and os.getpid() not in children
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    again = await client.post(IMPORT, headers=headers, data=body)
    assert again.status == 200 and await again.read() == await first.read()
    assert value(await scrape(client), *FAILURES) == 0  # never asked: nothing failed

    await client.post(IMPORT, headers=headers,  # a new child for a new document
                      data=json.dumps({"fields": {"services": _services(4)}}))
    children = pool.pids()
    await client.close()  # app cleanup
    for pid in children:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # exited and reaped


async def test_values_up_to_the_body_limit_in_every_position_are_answered_over_http(tmp_path):
    """The issue's case against a real `cpctl serve` worker, then every shape in every string
    position from 1 KB to 1 MB: each answered (a report, or 413/422 for a value over the
    body or value limit), and the worker stays up."""
    evaluators: list[int] = []
    async with aiohttp.ClientSession() as http:
        with serve(tmp_path / "state") as (base, proc):
            login_response = await http.post(base + "/api/v1/authn/sessions", json={
                "subject_id": "carol", "password": PASSWORDS["carol"]})
            token = (await login_response.json())["access_token"]

            async def post(fields: dict[str, Any]) -> aiohttp.ClientResponse:
                async with http.post(base + IMPORT, headers=bearer(token),
                                     json={"fields": fields}) as response:
                    await response.read()
                    return response

            secret = await post({"services": {"db": {"image": "postgres:16",
                                                     "environment": {"DB_PASSWORD": "x" * 30_000}}}})
            assert secret.status == 200
            cases = [(1_000, every_pair()), (30_000, every_pair()), (200_000, rotation()),
                     (1_000_000, rotation()[:3])]
            for length, pairs in cases:
                for ids, fields in documents(length, 900_000, pairs):
                    response = await post(fields)
                    assert response.status in (200, 413, 422), (length, ids, response.status)
                    if response.status == 422:
                        assert (await response.json())["code"] == "too_large", ids
                    assert proc.poll() is None, (length, ids)
            async with http.get(base + "/healthz") as health:
                assert health.status == 200
            evaluators = _evaluators(proc.pid)
            assert evaluators
    # SIGTERM: the worker's cleanup stopped its evaluators (none outlives it).
    for pid in evaluators:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _evaluators(root: int) -> list[int]:
    """The evaluator processes below ``root`` (from /proc)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    below, found = {root}, []
    for _ in range(4):  # supervisor -> worker -> evaluator
        below |= {pid for pid, parent in parents.items() if parent in below}
    for pid in below - {root}:
        with contextlib.suppress(OSError):
            if b"service.compose.evaluator" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found
