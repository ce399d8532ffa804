"""Operations: a rejected policy revision degrades authz status but never readiness; startup
failures are one structured line and exit 2; one supervisor per port; worker process titles."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, cast

import pytest

from service.authz.engine import ENGINE
from tests.servers import REPO, free_port, serve, wait_ready

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="Linux /proc")

BROKEN = "\npackage controlplane.authz\n\ndecision := {\n"


def _policies(tmp_path: Path) -> Path:
    root = tmp_path / "policies"
    shutil.copytree(REPO / "policies", root)
    return root


def _metric(text: str, name: str) -> float:
    line = next(x for x in text.splitlines() if x.startswith(name + " "))
    return float(line.rsplit(" ", 1)[1])


async def test_rejected_revision_keeps_readiness_and_degrades_authz(make_client, tmp_path):
    root = _policies(tmp_path)
    client = await make_client({"policies": {"dir": str(root), "reload_interval_s": 0}})
    engine = client.app[ENGINE]
    serving = engine.revision
    ok = 'controlplane_policy_reload_total{result="ok"}'
    rejected = 'controlplane_policy_reload_total{result="rejected"}'
    before = await (await client.get("/metrics")).text()
    assert _metric(before, ok) == 1.0 and _metric(before, rejected) == 0.0

    (root / "authz.rego").write_text(BROKEN)
    assert not engine.reload().ok

    assert (await client.get("/readyz")).status == 200
    status = await (await client.get("/api/v1/authz/status")).json()
    assert status["status"] == "degraded" and status["serving"] is True
    assert status["revision"] == serving
    assert status["error"].startswith("compile: authz.rego:4:")  # file:line:col
    assert status["reloads"] == {"ok": 1, "rejected": 1}
    info = await (await client.get("/api/v1/system/info")).json()
    assert info["status"] == "degraded"
    assert info["components"]["authz"]["status"] == "degraded"
    assert info["components"]["policies"]["status"] == "ready"
    after = await (await client.get("/metrics")).text()
    assert _metric(after, rejected) == 1.0 and _metric(after, ok) == 1.0


async def test_no_revision_at_all_is_not_ready(make_client, tmp_path):
    root = _policies(tmp_path)
    (root / "authz.rego").write_text(BROKEN)
    client = await make_client({"policies": {"dir": str(root), "reload_interval_s": 0}})
    response = await client.get("/readyz")
    assert response.status == 503
    assert (await response.json())["components"] == {"policies": "degraded"}


# ---- real `cpctl serve` processes --------------------------------------------------------


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 (loopback)
            return response.status, _body(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, _body(exc.read())


def _body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode()


def _cpctl_serve(state_dir: Path, *args: str, env: dict[str, str] | None = None,
                 ) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    environ.update({"CONTROLPLANE_STATE_DIR": str(state_dir), **(env or {})})
    return subprocess.run(
        [sys.executable, "-m", "service", "serve", *args], cwd=REPO, env=environ,
        capture_output=True, text=True, timeout=60, check=False)


def _one_fatal_line(stderr: str, *, only: bool = True) -> dict[str, Any]:
    """The one structured fatal line (``only``: and nothing else was logged); no traceback."""
    records = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    fatal = [r for r in records if r["level"] == "CRITICAL"]
    assert len(fatal) == 1 and (len(records) == 1 or not only), stderr
    assert fatal[0]["event"] == "startup.failed" and "Traceback" not in stderr
    assert not any(r["msg"] == "serving" for r in records), stderr
    return cast(dict[str, Any], fatal[0])


def test_bad_policy_pushed_to_a_running_two_worker_server(tmp_path):
    root = _policies(tmp_path)
    env = {"CONTROLPLANE_POLICIES__DIR": str(root), "CONTROLPLANE_POLICIES__RELOAD_INTERVAL_S": "0.2"}
    with serve(tmp_path / "state", workers=2, env=env) as (base, proc):
        wait_ready(base + "/readyz", proc=proc)
        status, before = _get(base + "/api/v1/authz/status")
        serving = before["revision"]
        assert status == 200 and before["status"] == "ready" and serving
        rejected = 'controlplane_policy_reload_total{result="rejected"}'
        assert _metric(_get(base + "/metrics")[1], rejected) == 0.0

        (root / "authz.rego").write_text(BROKEN)
        # Every worker polls, vets and rejects the revision on its own: +1 each.
        deadline = time.monotonic() + 30
        while _metric(_get(base + "/metrics")[1], rejected) < 2.0:
            assert time.monotonic() < deadline, "the revision was not rejected by both workers"
            time.sleep(0.1)
        assert _metric(_get(base + "/metrics")[1], rejected) == 2.0
        for _ in range(10):  # whichever worker answers
            assert _get(base + "/readyz")[0] == 200
            status, authz = _get(base + "/api/v1/authz/status")
            assert status == 200 and authz["status"] == "degraded", authz
            assert authz["revision"] == serving and authz["serving"] is True  # the old one serves
            assert authz["error"].startswith("compile: authz.rego:4:")
            info = _get(base + "/api/v1/system/info")[1]
            assert info["status"] == "degraded" and info["components"]["policies"]["status"] == "ready"
        events = [json.loads(line) for line in proc.log_path.read_text().splitlines()
                  if '"policy.revision_rejected"' in line]
        assert len(events) == 2 and {e["serving_revision"] for e in events} == {serving}


def test_sighup_to_a_two_worker_server_reloads_every_worker_and_ends_none(tmp_path):
    """SIGHUP is the documented reload signal: sent to the supervisor of `cpctl serve --workers
    2` it reaches both workers (polling is off, so only the signal can load the change), and
    every process keeps serving (a SIGHUP used to end the supervisor, and the service with it)."""
    root = _policies(tmp_path)
    env = {"CONTROLPLANE_POLICIES__DIR": str(root),
           "CONTROLPLANE_POLICIES__RELOAD_INTERVAL_S": "3600"}
    loaded = 'controlplane_policy_reload_total{result="ok"}'
    with serve(tmp_path / "state", workers=2, env=env) as (base, proc):
        wait_ready(base + "/readyz", proc=proc)
        before = _get(base + "/api/v1/authz/status")[1]["revision"]
        deadline = time.monotonic() + 30
        while _metric(_get(base + "/metrics")[1], loaded) < 2:  # each worker's first load
            assert time.monotonic() < deadline, "the workers did not load their policies"
            time.sleep(0.1)
        at_start = _metric(_get(base + "/metrics")[1], loaded)
        rego = root / "authz.rego"
        rego.write_text(rego.read_text() + "\n# reviewed\n")
        time.sleep(0.5)
        assert _metric(_get(base + "/metrics")[1], loaded) == at_start  # nothing polls
        os.kill(proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + 30
        while _metric(_get(base + "/metrics")[1], loaded) < at_start + 2:
            assert time.monotonic() < deadline, "the SIGHUP did not reload both workers"
            assert proc.poll() is None, "the supervisor ended on SIGHUP"
            time.sleep(0.1)
        assert proc.poll() is None
        revisions = {_get(base + "/api/v1/authz/status")[1]["revision"] for _ in range(20)}
        assert len(revisions) == 1 and revisions != {before}  # whichever worker answers
        events = [json.loads(line) for line in proc.log_path.read_text().splitlines()
                  if '"serve.sighup"' in line]
        assert len(events) == 1 and events[0]["workers"] == 2


def test_workers_stop_when_their_supervisor_is_killed_outright(tmp_path):
    """SIGKILL leaves the supervisor no chance to stop its workers: they notice on their own
    (within ~SUPERVISOR_CHECK_S), drain and exit, instead of serving on unsupervised."""
    with serve(tmp_path / "state", workers=2) as (base, proc):
        wait_ready(base + "/readyz", proc=proc)
        deadline = time.monotonic() + 30
        workers: list[int] = []
        while len(workers) < 2:
            assert time.monotonic() < deadline, "the workers did not start"
            workers = [pid for pid in _children(proc.pid)
                       if "controlplane worker" in _cmdline(pid)]
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 15
        while any(_running(pid) for pid in workers):
            assert time.monotonic() < deadline, "a worker outlived its supervisor"
            time.sleep(0.1)
        orphaned = [json.loads(line) for line in proc.log_path.read_text().splitlines()
                    if '"server.orphaned"' in line]
        assert sorted(e["pid"] for e in orphaned) == sorted(workers)
        with pytest.raises(urllib.error.URLError):  # nobody serves the port any more
            _get(base + "/healthz")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[1]) == pid:
                    found.append(int(entry.name))
    return found


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return ""


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped."""
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False


def test_second_instance_on_the_same_port_exits_2(tmp_path):
    with serve(tmp_path / "first", workers=2) as (base, _proc):
        port = base.rsplit(":", 1)[1]
        second = _cpctl_serve(tmp_path / "second", "--port", port, "--workers", "2")
        assert second.returncode == 2
        record = _one_fatal_line(second.stderr)
        assert "address already in use" in record["error"]
        assert _get(base + "/readyz")[0] == 200  # the first instance still serves alone


def test_unwritable_state_dir_is_one_json_line_and_exit_2(tmp_path):
    # Root may write anywhere: a state dir under a regular file cannot be created by anyone.
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    result = _cpctl_serve(blocker / "state", "--port", str(free_port()))
    assert result.returncode == 2
    assert "is not writable" in _one_fatal_line(result.stderr)["error"]


def test_missing_identities_file_is_one_json_line_and_exit_2(tmp_path):
    result = _cpctl_serve(tmp_path / "state", "--port", str(free_port()), "--workers", "2",
                          env={"CONTROLPLANE_AUTHN__IDENTITIES": str(tmp_path / "missing.yaml")})
    assert result.returncode == 2
    assert "missing.yaml" in _one_fatal_line(result.stderr)["error"]


def test_required_store_unreachable_at_start_exits_2(tmp_path):
    result = _cpctl_serve(tmp_path / "state", "--port", str(free_port()), env={
        "CONTROLPLANE_STORE__BACKEND": "postgres",
        "CONTROLPLANE_STORE__POSTGRES__DSN": "postgresql://cp:pw@127.0.0.1:1/cp",
        "CONTROLPLANE_STORE__REQUIRED": "true", "CONTROLPLANE_STORE__TIMEOUT_S": "2"})
    assert result.returncode == 2
    record = _one_fatal_line(result.stderr, only=False)  # after the policy load, the store error
    assert "store.required" in record["error"] and "pw" not in result.stderr


def test_serving_is_logged_with_the_bound_address_and_workers_have_titles(tmp_path):
    with serve(tmp_path / "state", workers=2) as (base, proc):
        port = int(base.rsplit(":", 1)[1])
        titles = sorted(_cmdline(pid) for pid in _children(proc.pid))
        assert [t for t in titles if t.startswith("controlplane worker")] == [
            "controlplane worker 1/2", "controlplane worker 2/2"], titles
        assert _cmdline(proc.pid).startswith("controlplane supervisor")
        records = [json.loads(line) for line in proc.log_path.read_text().splitlines() if line]
    serving = [r for r in records if r["msg"] == "serving"]
    assert len(serving) == 1 and serving[0]["address"] == f"127.0.0.1:{port}"
    assert serving[0]["port"] == port and serving[0]["workers"] == 2


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                out.append(int(stat.parent.name))
    return out


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
