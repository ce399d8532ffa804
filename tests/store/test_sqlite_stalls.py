"""SQLite stalls through the real app: another process holds the database's write lock past the
store deadline, and when it lets go every later write of this worker answers normally and other
processes can write the file again (the writer connection is never left inside a transaction)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from service.config import CONFIG
from service.store.sqlite import SqliteStore
from service.storelink import STORE
from tests.auth import PASSWORDS, bearer, login
from tests.problems import assert_problem

from .sqlite_locks import write_lock_held

#: The store deadline these tests configure (seconds).
DEADLINE_S = 1.0

# A process that is not one of ours (a backup, an operator's sqlite3 shell) writing the file.
_WRITER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=float(sys.argv[2]))
try:
    db.execute("BEGIN IMMEDIATE")
    db.execute("UPDATE schema_migrations SET name = name")
    db.execute("COMMIT")
except sqlite3.Error as exc:
    print(exc)
    sys.exit(1)
print("written")
"""


async def other_process_writes(path: Path) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _WRITER, str(path), "3", stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode or 0, out.decode().strip()


async def log_in(client: TestClient, subject: str) -> Any:
    return await client.post("/api/v1/authn/sessions",
                             json={"subject_id": subject, "password": PASSWORDS[subject]})


def installer_body(task_id: str) -> dict[str, Any]:
    return {"task_id": task_id, "action": "installer.run.execute",
            "resource": {"app": "web", "version": "1.2.3"}, "env": "dev"}


async def test_a_begin_past_its_deadline_leaves_no_transaction_open(make_client):
    client = await make_client({"store": {"timeout_s": DEADLINE_S}})
    path = client.server.app[CONFIG].store.sqlite_path
    alice = await login(client, "alice")

    async with write_lock_held(path, hold_s=3 * DEADLINE_S) as holder:
        # The login's write waits for the lock until its deadline, then is refused as an outage.
        refused = await log_in(client, "bob")
        await assert_problem(refused, 503, "store_unavailable")
        await asyncio.wait_for(holder.wait(), 30)  # the holder lets go
    assert holder.returncode == 0

    # Every later write of this worker answers as usual ...
    for n in range(3):
        response = await log_in(client, "bob")
        assert response.status == 201, await response.text()
        task = await client.post("/api/v1/installer/actions", json=installer_body(f"t-{n}"),
                                 headers=bearer(alice))
        assert task.status == 202, await task.text()
    # ... and another process can take the write lock and write the file.
    assert await other_process_writes(path) == (0, "written")


async def test_readyz_is_not_ready_while_writes_wait_on_another_process(make_client):
    """Reads go on while another process holds the write lock, so a ping alone says ready; the
    writes that failed say otherwise, until one is served again."""
    client = await make_client({"store": {"timeout_s": DEADLINE_S}})
    path = client.server.app[CONFIG].store.sqlite_path
    assert (await client.get("/readyz")).status == 200

    async with write_lock_held(path, hold_s=3 * DEADLINE_S) as holder:
        await assert_problem(await log_in(client, "bob"), 503, "store_unavailable")
        body = await assert_problem(await client.get("/readyz"), 503, "not_ready")
        assert body["components"] == {"store": "degraded"}
        assert body["store_failures"]["writes"]["failed"] >= 1
        assert "reads" not in body["store_failures"]
        info = await (await client.get("/api/v1/system/info")).json()
        assert info["components"]["store"]["status"] == "degraded"
        assert str(path) not in await (await client.get("/readyz")).text()
        await asyncio.wait_for(holder.wait(), 30)

    response = await log_in(client, "bob")  # a write served again
    assert response.status == 201, await response.text()
    assert (await client.get("/readyz")).status == 200


async def test_readyz_is_not_ready_on_a_full_database(make_client):
    """SQLITE_FULL, the database's own "disk full", while reads still work. The file is made
    full the way SQLite lets a connection cap it: ``PRAGMA max_page_count`` on the app's own
    writer connection, at the pages the file has now."""
    client = await make_client({"store": {"timeout_s": DEADLINE_S}})
    alice = await login(client, "alice")
    store = client.server.app[STORE].require()
    assert isinstance(store, SqliteStore)

    def cap(db: Any) -> int:
        pages = int(db.execute("PRAGMA page_count").fetchone()[0])
        return int(db.execute(f"PRAGMA max_page_count = {pages}").fetchone()[0])

    await store._writer._call(cap)
    refused = None
    for n in range(500):  # until the free room in the last pages is used up
        response = await client.post("/api/v1/installer/actions", json=installer_body(f"t-{n}"),
                                     headers=bearer(alice))
        if response.status != 202:
            refused = response
            break
    assert refused is not None, "the capped database never filled up"
    await assert_problem(refused, 503, "store_unavailable")
    await store.ping()  # reads still work: a ping alone would say ready

    body = await assert_problem(await client.get("/readyz"), 503, "not_ready")
    assert body["components"] == {"store": "degraded"}
    assert body["store_failures"]["writes"]["failed"] >= 1
    text = await (await client.get("/readyz")).text()
    assert "SQLITE_FULL" not in text and str(client.server.app[CONFIG].store.sqlite_path) not in text

    await store._writer._call(lambda db: db.execute("PRAGMA max_page_count = 1073741823").close())
    response = await client.post("/api/v1/installer/actions", json=installer_body("t-room"),
                                 headers=bearer(alice))
    assert response.status == 202, await response.text()
    assert (await client.get("/readyz")).status == 200
