"""Tasks: state follows step events; executors report; events page as JSON and stream as SSE."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
import yaml
from aiohttp.test_utils import TestClient
from cryptography.hazmat.primitives import serialization

from service.app import create_app
from service.authn.assertions import make_assertion
from service.storelink import STORE
from service.streams import STREAMS
from tests.auth import AUDIENCE, KEYS, bearer, bound_policies, login
from tests.conftest import REPO
from tests.problems import assert_problem
from tests.servers import EdgeTestServer


async def start_task(client, task_id: str = "build-1") -> str:
    alice = await login(client, "alice")
    body = {"task_id": task_id, "action": "installer.run.execute", "resource": "web", "env": "dev"}
    response = await client.post("/api/v1/installer/actions", json=body, headers=bearer(alice))
    assert response.status == 202
    return alice


async def test_installer_action_creates_task_without_changing_its_state(client):
    alice = await start_task(client)
    task = await (await client.get("/api/v1/tasks/build-1", headers=bearer(alice))).json()
    assert task["state"] == "pending" and task["progress"] == 0 and task["last_seq"] == 1
    # A second intent appends; the state is still the executor's to change.
    body = {"task_id": "build-1", "action": "installer.run.execute", "resource": "web", "env": "dev"}
    again = await client.post("/api/v1/installer/actions", json=body, headers=bearer(alice))
    assert (await again.json())["event"]["seq"] == 2
    task = await (await client.get("/api/v1/tasks/build-1", headers=bearer(alice))).json()
    assert task["state"] == "pending"


async def test_executor_reports_drive_the_state(client):
    alice = await start_task(client)
    bot = await login(client, "ci-bot")
    for report, state in (
        ({"kind": "started"}, "running"),
        ({"kind": "progress", "progress": 40, "message": "pulling images"}, "running"),
        ({"kind": "succeeded", "result": {"digest": "sha256:abc"}}, "succeeded"),
    ):
        response = await client.post("/api/v1/tasks/build-1/events", json=report, headers=bearer(bot))
        assert response.status == 201, await response.text()
        task = await (await client.get("/api/v1/tasks/build-1", headers=bearer(alice))).json()
        assert task["state"] == state
    assert task["progress"] == 100 and task["result"] == {"digest": "sha256:abc"}
    late = await client.post("/api/v1/tasks/build-1/events", json={"kind": "started"},
                             headers=bearer(bot))
    await assert_problem(late, 409, "task_state_conflict")


def _second_executor(tmp_path) -> dict:
    """Overrides adding ``ci-bot-2``, a second service with the ``ci`` role (ci-bot's key)."""
    identities = yaml.safe_load((REPO / "examples" / "identities.yaml").read_text())
    bot = next(i for i in identities["identities"] if i["subject_id"] == "ci-bot")
    identities["identities"].append({**bot, "subject_id": "ci-bot-2"})
    (tmp_path / "identities.yaml").write_text(yaml.safe_dump(identities))
    return {"authn": {"identities": str(tmp_path / "identities.yaml")},
            "policies": {"dir": bound_policies(tmp_path, {"ci-bot-2": ["ci"]})}}


async def test_the_first_report_claims_the_task_for_its_executor(make_client, tmp_path):
    client = await make_client(_second_executor(tmp_path))
    alice = await start_task(client)
    bot = await login(client, "ci-bot")
    key = serialization.load_pem_private_key(KEYS["ci-bot"].read_bytes(), password=None)
    other = await client.post("/api/v1/authn/sessions", json={"assertion": make_assertion(
        key, subject_id="ci-bot-2", audience=AUDIENCE, now=time.time())})  # type: ignore[arg-type]
    assert other.status == 201, await other.text()
    bot2 = (await other.json())["access_token"]
    task = await (await client.get("/api/v1/tasks/build-1", headers=bearer(alice))).json()
    assert task["claimed_by"] is None

    started = await client.post("/api/v1/tasks/build-1/events", json={"kind": "started"},
                                headers=bearer(bot))
    assert started.status == 201, await started.text()
    # The other executor can neither start, report progress on, nor end the claimed task.
    for report in ({"kind": "started"}, {"kind": "progress", "progress": 10},
                   {"kind": "succeeded"}, {"kind": "failed", "result": {"why": "mine"}}):
        refused = await client.post("/api/v1/tasks/build-1/events", json=report,
                                    headers=bearer(bot2))
        body = await assert_problem(refused, 409, "task_claimed")
        assert "ci-bot" in body["detail"]
    task = await (await client.get("/api/v1/tasks/build-1", headers=bearer(alice))).json()
    assert (task["state"], task["claimed_by"], task["last_seq"]) == ("running", "ci-bot", 2)
    done = await client.post("/api/v1/tasks/build-1/events",
                             json={"kind": "succeeded", "result": {"ok": True}},
                             headers=bearer(bot))
    assert done.status == 201, await done.text()

    # A progress report on a pending task claims it too.
    await start_task(client, "build-2")
    progress = await client.post("/api/v1/tasks/build-2/events",
                                 json={"kind": "progress", "progress": 5}, headers=bearer(bot2))
    assert progress.status == 201, await progress.text()
    refused = await client.post("/api/v1/tasks/build-2/events", json={"kind": "failed"},
                                headers=bearer(bot))
    await assert_problem(refused, 409, "task_claimed")
    running = await (await client.get("/api/v1/tasks?state=running",
                                      headers=bearer(alice))).json()
    assert [(t["id"], t["claimed_by"]) for t in running["items"]] == [("build-2", "ci-bot-2")]


async def test_only_executors_report(client):
    alice = await start_task(client)
    response = await client.post("/api/v1/tasks/build-1/events", json={"kind": "started"},
                                 headers=bearer(alice))
    await assert_problem(response, 403, "denied")


async def test_report_schema_and_unknown_task(client):
    await start_task(client)
    bot = await login(client, "ci-bot")
    bad = await client.post("/api/v1/tasks/build-1/events", json={"kind": "progress"},
                            headers=bearer(bot))
    body = await assert_problem(bad, 422, "schema_validation_failed")
    assert body["errors"][0]["pointer"] == ""
    missing = await client.post("/api/v1/tasks/nope/events", json={"kind": "started"},
                                headers=bearer(bot))
    await assert_problem(missing, 404, "task_not_found")


async def test_events_page_by_after_seq(client):
    alice = await start_task(client)
    bot = await login(client, "ci-bot")
    for pct in (10, 20, 30):
        await client.post("/api/v1/tasks/build-1/events", json={"kind": "progress", "progress": pct},
                          headers=bearer(bot))
    page = await (await client.get("/api/v1/tasks/build-1/events?after_seq=1&limit=2",
                                   headers=bearer(alice))).json()
    assert [e["seq"] for e in page["items"]] == [2, 3] and page["next_after_seq"] == 3
    rest = await (await client.get("/api/v1/tasks/build-1/events?after_seq=3",
                                   headers=bearer(alice))).json()
    assert [e["progress"] for e in rest["items"]] == [30] and rest["next_after_seq"] is None


async def test_a_page_larger_than_the_store_returns_still_has_a_next_cursor(client):
    """limit=1000 over 501 events: the store returns its page (500), and the answer says there
    is more instead of ending the listing there."""
    alice = await start_task(client)
    store = client.server.app[STORE].require()
    async with store.transaction() as tx:
        for i in range(500):
            await tx.append_event("build-1", "progress", "ci-bot", {"progress": i % 100}, 1.0 + i)
    first = await (await client.get("/api/v1/tasks/build-1/events?limit=1000",
                                    headers=bearer(alice))).json()
    assert len(first["items"]) == 500 and first["next_after_seq"] == 500
    rest = await (await client.get("/api/v1/tasks/build-1/events?limit=1000&after_seq=500",
                                   headers=bearer(alice))).json()
    assert [e["seq"] for e in rest["items"]] == [501] and rest["next_after_seq"] is None


async def test_events_stream_as_sse_and_resume(client):
    alice = await start_task(client)
    bot = await login(client, "ci-bot")
    await client.post("/api/v1/tasks/build-1/events", json={"kind": "started"}, headers=bearer(bot))

    async def finish_later() -> None:
        await asyncio.sleep(0.3)
        await client.post("/api/v1/tasks/build-1/events", json={"kind": "progress", "progress": 50},
                          headers=bearer(bot))
        await client.post("/api/v1/tasks/build-1/events", json={"kind": "failed",
                                                                 "result": {"error": "exit 3"}},
                          headers=bearer(bot))

    finisher = asyncio.create_task(finish_later())
    response = await client.get("/api/v1/tasks/build-1/events",
                                headers=bearer(alice, Accept="text/event-stream",
                                               **{"Last-Event-ID": "1"}))
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    assert response.headers["Cache-Control"] == "no-store"
    text = await asyncio.wait_for(response.text(), timeout=10)
    await finisher
    ids = [int(line[4:]) for line in text.splitlines() if line.startswith("id: ")]
    assert ids == [2, 3, 4]  # resumed after 1, then live until the task ended
    assert "event: failed" in text and text.rstrip().endswith("data: {}")


async def test_concurrent_reports_keep_sequence_gap_free(client):
    await start_task(client)
    bot = await login(client, "ci-bot")
    await client.post("/api/v1/tasks/build-1/events", json={"kind": "started"}, headers=bearer(bot))
    responses = await asyncio.gather(*(
        client.post("/api/v1/tasks/build-1/events", json={"kind": "progress", "progress": i},
                    headers=bearer(bot))
        for i in range(20)
    ))
    assert all(r.status == 201 for r in responses)
    events = await client.server.app[STORE].require().list_events("build-1", 0, 100)
    assert [e.seq for e in events] == list(range(1, 23))


# -- live streams: caps, heartbeats, session re-check, disconnects, shutdown (issue 13, item 7) --

STREAM = {"Accept": "text/event-stream"}


async def open_stream(client, token: str):
    return await client.get("/api/v1/tasks/build-1/events", headers=bearer(token, **STREAM))


async def read_for(response, seconds: float) -> str:
    """What a stream sends in ``seconds`` (less if it ends)."""
    chunks: list[bytes] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (left := deadline - loop.time()) > 0:
        try:
            chunk = await asyncio.wait_for(response.content.readany(), left)
        except TimeoutError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()


async def test_streams_are_capped_per_principal_and_in_total(make_client):
    client = await make_client({"server": {"streams": {"max_per_principal": 2, "max_total": 3}}})
    alice = await start_task(client)
    alice_again = await login(client, "alice")  # another session of the same principal
    bot = await login(client, "ci-bot")
    first, second = await open_stream(client, alice), await open_stream(client, alice_again)
    assert first.status == second.status == 200
    over = await open_stream(client, alice)
    body = await assert_problem(over, 429, "too_many_streams")
    assert int(over.headers["Retry-After"]) >= 1 and "per principal" in body["detail"]
    third = await open_stream(client, bot)
    assert third.status == 200
    full = await open_stream(client, bot)
    await assert_problem(full, 429, "too_many_streams")
    # A closed stream gives its slot back.
    first.close()
    for _ in range(40):
        again = await open_stream(client, alice)
        if again.status == 200:
            break
        await asyncio.sleep(0.1)
    assert again.status == 200
    slots = client.server.app[STREAMS]
    assert slots.total == 3 and slots.open_for("alice") == 2
    for response in (second, third, again):
        response.close()


async def test_streams_send_regular_heartbeats(make_client):
    client = await make_client({"server": {"streams": {"heartbeat_s": 0.3}}})
    alice = await start_task(client)
    response = await open_stream(client, alice)
    text = await read_for(response, 2.2)  # heartbeats go out at the next poll (0.25 s)
    response.close()
    assert text.count(": heartbeat\n\n") >= 3, text


async def test_logout_ends_an_open_stream_within_seconds(client):
    """The stream's session is checked again every server.streams.session_check_s (2 s)."""
    alice = await start_task(client)
    response = await open_stream(client, alice)
    assert response.status == 200
    await read_for(response, 0.3)
    loop = asyncio.get_running_loop()
    logged_out = loop.time()
    assert (await client.delete("/api/v1/authn/sessions/current", headers=bearer(alice))).ok
    text = await asyncio.wait_for(response.text(), 10)
    assert loop.time() - logged_out < 3.5
    assert text.rstrip().endswith('event: end\ndata: {"reason":"session_ended"}')
    assert client.server.app[STREAMS].total == 0


@pytest.mark.parametrize("cancellation", [True, False], ids=["handler-cancelled", "cpctl-serve"])
async def test_a_client_disconnect_is_normal(make_config, caplog, cancellation):
    """No traceback, no ERROR, and the slot is given back, whether aiohttp cancels the handler
    (TestServer's default) or the stream notices the closed connection (cpctl serve)."""
    server = EdgeTestServer(create_app(make_config()), handler_cancellation=cancellation)
    async with TestClient(server) as client:
        alice = await start_task(client)
        with caplog.at_level(logging.DEBUG):
            response = await open_stream(client, alice)
            await read_for(response, 0.3)
            response.close()
            slots = client.server.app[STREAMS]
            for _ in range(50):
                if slots.total == 0:
                    break
                await asyncio.sleep(0.1)
            assert slots.total == 0
            await asyncio.sleep(0.5)
    assert "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def test_shutdown_ends_open_streams_within_the_grace_period(make_config):
    server = EdgeTestServer(create_app(make_config()), shutdown_timeout=10)
    client = TestClient(server)
    await client.start_server()
    alice = await start_task(client)
    streams = [await open_stream(client, alice) for _ in range(3)]
    assert all(s.status == 200 for s in streams)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await server.close()
    assert loop.time() - started < 2.0  # not the 10 s grace period: the streams ended
    for stream in streams:  # each ended cleanly (a client reconnects with Last-Event-ID)
        await asyncio.wait_for(stream.text(), 2)
    await client.close()
