"""Log floods, on real ``cpctl serve`` processes: a failure that repeats is one structured line
per cause per interval with a count, and a traceback only for what is unexpected.

* accept() out of descriptors (``RLIMIT_NOFILE`` low, many idle connections): asyncio's accept
  loop reports it hundreds of times a second;
* a store outage: every request it fails;
* a policy directory that cannot be read: every poll of the reload loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import pytest

from tests.servers import REPO, serve, wait_ready
from tests.store import pg
from tests.store.faultproxy import FaultProxy, proxied

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="Linux /proc")

T = TypeVar("T")


def records(log: Path, start: int = 0) -> list[dict[str, Any]]:
    """The JSON log lines written after byte ``start``."""
    with open(log, "rb") as f:
        f.seek(start)
        return [json.loads(line) for line in f.read().splitlines() if line.strip()]


def get(url: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 (loopback)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 (loopback)
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@contextlib.contextmanager
def serve_limited(state_dir: Path, nofile: int, event_loop: str = "auto",
                  ) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """``cpctl serve`` with its descriptor limit at ``nofile``."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    env = {"CONTROLPLANE_SERVER__EVENT_LOOP": event_loop}
    with serve(state_dir, preexec=limit, env=env) as (base, proc):
        yield base, proc, proc.log_path  # type: ignore[attr-defined]


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
def test_descriptors_exhausted_by_idle_connections_log_a_few_lines_not_thousands(tmp_path,
                                                                                 event_loop):
    """Descriptor limit 256, 395 idle connections for 10 s: before, ~8,000 ERROR lines with a
    traceback each (4 MB) plus a policy-reload traceback every 2 s; now one line per cause and
    per interval, with the count, and no traceback for either. The service serves on.

    asyncio's accept loop reports each failed accept (``server.accept_failed``, summarised);
    uvloop's (libuv) accepts and closes a connection over the limit itself and reports none,
    so there only the other causes' lines are bounded."""
    with serve_limited(tmp_path / "state", 256, event_loop) as (base, proc, log):
        start = log.stat().st_size
        idle: list[socket.socket] = []
        try:
            for _ in range(395):
                idle.append(socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1]))))
            time.sleep(10)
            window = records(log, start)
            written = log.stat().st_size - start
        finally:
            for sock in idle:
                sock.close()
        wait_ready(base + "/healthz", timeout=20, proc=proc)  # serving again once they are gone
    print(f"{len(window)} lines, {written} bytes in 10 s")
    assert len(window) <= 30 and written <= 20_000, (len(window), written)
    accept = [r for r in window if r.get("event") == "server.accept_failed"]
    if event_loop == "asyncio":
        assert accept, [r["msg"] for r in window][:5]
        assert all("exc" not in r for r in accept)
        assert accept[0]["errno"] == "EMFILE" and accept[0]["count"] == 1
        # The summaries count what they stand for: many more occurrences than lines.
        assert sum(r["count"] for r in accept) > len(accept)
    else:
        assert not accept and all("exc" not in r for r in window), window[:5]
    reload_failures = [r for r in window if r.get("event") == "policy.reload_failed"]
    assert len(reload_failures) <= 3 and all("exc" not in r for r in reload_failures)


def test_a_policy_directory_that_cannot_be_read_is_not_a_traceback_every_poll(tmp_path):
    """The policies directory is a symbolic link, re-pointed to a path that cannot be resolved
    (its name is too long): every poll fails the same way. Before, a traceback per poll (50 in
    5 s at 0.1 s); now the first failure and a summary, no traceback."""
    real = tmp_path / "policies-1"
    shutil.copytree(REPO / "policies", real)
    link = tmp_path / "policies"
    link.symlink_to(real)
    env = {"CONTROLPLANE_POLICIES__DIR": str(link),
           "CONTROLPLANE_POLICIES__RELOAD_INTERVAL_S": "0.1"}
    with serve(tmp_path / "state", env=env) as (base, proc):
        log: Path = proc.log_path  # type: ignore[attr-defined]
        start = log.stat().st_size
        link.unlink()
        link.symlink_to("x" * 300)
        time.sleep(5)
        window = records(log, start)
        assert get(base + "/healthz") == 200
    failures = [r for r in window if r.get("event") == "policy.reload_failed"]
    assert 1 <= len(failures) <= 3, [r["msg"] for r in window]
    assert not any("exc" in r for r in window), window[0]
    assert failures[0]["error"] == "OSError" and failures[0]["count"] == 1


class LoopThread:
    """An event loop on its own thread: the fault proxy forwards while the test blocks."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


async def disk_full(dsn: str, schema: str) -> None:
    """Every write of a run (its task, its audit record) fails as PostgreSQL fails on a full
    disk (SQLSTATE 53100); reads still work."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"""
            CREATE FUNCTION "{schema}".disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'could not extend file' USING ERRCODE = 'disk_full'; END $$""")
        for table in ("tasks", "audit_log", "audit_staged"):
            await conn.execute(f"""CREATE TRIGGER disk_full BEFORE INSERT ON "{schema}".{table}
                                   FOR EACH ROW EXECUTE FUNCTION "{schema}".disk_full()""")
    finally:
        await conn.close()


@pytest.mark.postgres
def test_requests_failed_by_a_store_outage_are_not_a_traceback_each(tmp_path):
    """PostgreSQL with a full disk (writes fail, reads work), then behind a proxy that refuses
    and drops every connection: 100 requests each, answered 503. Before, a traceback per
    request of the first kind and an ERROR line per request of the second; now a few lines
    with the count, and no traceback."""
    thread = LoopThread()
    stack = contextlib.AsyncExitStack()
    try:
        dsn, schema = thread.run(stack.enter_async_context(pg.temp_schema("cp_flood")))
        proxy: FaultProxy
        proxy, proxied_dsn = thread.run(stack.enter_async_context(proxied(dsn)))
        env = {"CONTROLPLANE_STORE__BACKEND": "postgres",
               "CONTROLPLANE_STORE__POSTGRES__DSN": proxied_dsn,
               "CONTROLPLANE_STORE__POSTGRES__SCHEMA": schema,
               "CONTROLPLANE_STORE__TIMEOUT_S": "2"}
        with serve(tmp_path / "state", env=env) as (base, proc):
            log: Path = proc.log_path  # type: ignore[attr-defined]
            token = login(base, "alice")
            assert get(base + "/api/v1/tasks/nothing", token) == 404
            thread.run(disk_full(dsn, schema))
            start = log.stat().st_size
            full = [post(base + "/api/v1/installer/actions", token, {
                "task_id": f"t-{i}", "action": "installer.run.execute", "env": "dev",
                "resource": {"app": "web", "version": "1.2.3"}}) for i in range(100)]
            during_full = records(log, start)

            async def outage() -> None:
                proxy.refuse()
                proxy.reset_all()

            thread.run(outage())
            start = log.stat().st_size
            unreachable = [get(base + "/api/v1/tasks/nothing", token) for _ in range(100)]
            during_outage = records(log, start)
    finally:
        thread.run(stack.aclose())
        thread.close()
    assert full.count(503) == 100 and unreachable.count(503) == 100, (full, unreachable)
    for window in (during_full, during_outage):
        ours = [r for r in window if r["logger"].startswith("controlplane")]
        problems = [r for r in ours if r["level"] != "INFO"]
        print(f"{len(problems)} warning/error lines for 100 failed requests:",
              sorted({r["msg"] for r in problems}))
        assert not any("exc" in r for r in ours), next(r for r in ours if "exc" in r)
        assert 1 <= len(problems) <= 6, [r["msg"] for r in problems]
        assert any(r.get("event") == "store.unavailable" for r in problems)
        # A library's own lines (asyncpg's pool) are few too.
        assert len([r for r in window if not r["logger"].startswith("controlplane")]) <= 5


def login(base: str, subject: str) -> str:
    from tests.auth import PASSWORDS

    body = {"subject_id": subject, "password": PASSWORDS[subject]}
    request = urllib.request.Request(  # noqa: S310 (loopback)
        base + "/api/v1/authn/sessions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 (loopback)
        return str(json.loads(response.read())["access_token"])


def post(url: str, token: str, body: Any) -> int:
    request = urllib.request.Request(  # noqa: S310 (loopback)
        url, data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 (loopback)
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
