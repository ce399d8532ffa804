"""``cpctl serve`` as a real process: one worker, several workers on one port, graceful stop."""

from __future__ import annotations

import json
import signal
import time
import urllib.request

from service.cli.main import main
from service.middleware.metrics import FLUSH_INTERVAL_S as TALLY_FLUSH_S
from tests.servers import serve


def _get(url: str) -> tuple[int, dict]:
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 (loopback)
        return response.status, json.loads(response.read())


def test_serve_single_worker_and_graceful_sigterm(tmp_path):
    with serve(tmp_path / "state") as (base, proc):
        status, info = _get(base + "/api/v1/system/info")
        assert status == 200
        assert info["runtime"]["workers"] == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        logs = proc.log_path.read_text()
    # Structured logs: every line is a JSON object.
    lines = [line for line in logs.splitlines() if line.strip()]
    assert lines and all(json.loads(line)["level"] for line in lines)
    assert (tmp_path / "state").stat().st_mode & 0o077 == 0


def test_serve_two_workers_share_one_port_and_their_metrics(tmp_path):
    with serve(tmp_path / "state", workers=2) as (base, proc):
        status, info = _get(base + "/api/v1/system/info")
        assert status == 200 and info["runtime"]["workers"] == 2
        # The socket is bound before the workers start: the harness's probes that timed out
        # while they started were queued and are served (and counted) too, by either worker,
        # the other's within its flush interval. Count from once the count has settled.
        before = _settled_healthz_count(base)
        for _ in range(40):
            assert _get(base + "/healthz")[0] == 200
        # Whichever worker answers /metrics, it counts every worker's requests: its own at
        # once, the other's within its tally flush interval (never more than were made).
        for _ in range(4):
            deadline = time.monotonic() + 10 * TALLY_FLUSH_S + 5
            while (count := _healthz_count(base)) < before + 40 and time.monotonic() < deadline:
                time.sleep(TALLY_FLUSH_S / 5)
            assert count == before + 40
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0


def _settled_healthz_count(base: str) -> float:
    """The /healthz count once it held still across three flush intervals (at most 15 s)."""
    deadline = time.monotonic() + 15
    count, since = _healthz_count(base), time.monotonic()
    while time.monotonic() - since < 3 * TALLY_FLUSH_S and time.monotonic() < deadline:
        time.sleep(TALLY_FLUSH_S / 5)
        if (now := _healthz_count(base)) != count:
            count, since = now, time.monotonic()
    return count


def _healthz_count(base: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=5) as response:  # noqa: S310
        text = response.read().decode()
    line = next(x for x in text.splitlines() if x.startswith(
        'controlplane_http_requests_total{method="GET",route="/healthz",status="200"}'))
    return float(line.rsplit(" ", 1)[1])


def test_bad_config_exits_2_with_a_message(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("server:\n  port: nope\n")
    assert main(["serve", "--config", str(path)]) == 2
    assert "/server/port" in capsys.readouterr().err


def test_the_event_loop_is_uvloop_when_installed_unless_refused(monkeypatch):
    import asyncio
    import sys

    import pytest
    import uvloop

    from service.cli.serve import StartupError, event_loop_factory

    assert event_loop_factory("auto") is uvloop.new_event_loop
    assert event_loop_factory("uvloop") is uvloop.new_event_loop
    assert event_loop_factory("asyncio") is None
    with asyncio.Runner(loop_factory=event_loop_factory("auto")) as runner:
        assert isinstance(runner.get_loop(), uvloop.Loop)
    monkeypatch.setitem(sys.modules, "uvloop", None)  # not installed: import fails
    assert event_loop_factory("auto") is None
    with pytest.raises(StartupError, match="uvloop is not installed"):
        event_loop_factory("uvloop")
