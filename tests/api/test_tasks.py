"""Tasks: state follows step events; executors report; events page as JSON and stream as SSE."""

from __future__ import annotations

import asyncio

from service.appkeys import STORE
from tests.auth import bearer, login
from tests.problems import assert_problem


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
