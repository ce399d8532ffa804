"""``cpctl notifications list [--failed] | retry ID`` against a real SQLite store."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from service.cli.main import main
from service.store import open_store
from service.store.base import DeliveryRecord
from tests.servers import REPO
from tests.store.helpers import T0, ticket


def _seed(db: Path) -> str:
    """Two tickets' requests: one delivered, one dead after a 500; returns the dead one's id."""

    async def seed() -> str:
        store = await open_store(f"sqlite:///{db}")
        try:
            await store.create_ticket(ticket("t-ok"))
            await store.create_ticket(ticket("t-dead"))
            ok, dead = await store.claim_outbox("cli-test", T0 + 1, 30, 10)
            await store.finish_outbox(ok.id, "cli-test", [
                DeliveryRecord(ok.id, "hook", "delivered", 1, 204, None, T0 + 2)],
                state="delivered", next_attempt_at=T0 + 2, error=None, now=T0 + 2)
            await store.finish_outbox(dead.id, "cli-test", [
                DeliveryRecord(dead.id, "hook", "failed", 1, 500, "HTTP 500", T0 + 2)],
                state="dead", next_attempt_at=T0 + 2, error="hook: HTTP 500", now=T0 + 2)
            return dead.id
        finally:
            await store.close()

    return asyncio.run(seed())


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir()
    path = tmp_path / "config.yaml"
    path.write_text(f"state_dir: {state}\n", encoding="utf-8")
    return path


def test_list_failed_and_retry(config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dead_id = _seed(config_file.parent / "state" / "controlplane.db")
    # As an operator runs it: the real cpctl entry point, in its own process.
    proc = subprocess.run([sys.executable, "-m", "service", "notifications", "list", "--config",
                           str(config_file), "--json"], capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    every = json.loads(proc.stdout)["items"]
    assert [(e["ticket_id"], e["state"]) for e in every] == [("t-dead", "dead"),
                                                            ("t-ok", "delivered")]

    assert main(["notifications", "list", "--failed", "--config", str(config_file)]) == 0
    out = capsys.readouterr().out
    assert dead_id in out and "t-ok" not in out
    assert "hook: failed (attempts 1, last 500)  HTTP 500" in out

    assert main(["notifications", "retry", dead_id, "--config", str(config_file), "--json"]) == 0
    retried = json.loads(capsys.readouterr().out)
    assert retried["state"] == "pending" and retried["attempts"] == 0
    assert main(["notifications", "list", "--failed", "--config", str(config_file)]) == 0
    assert "no failed notification events" in capsys.readouterr().out

    # Refusals: not dead any more, an unknown id.
    assert main(["notifications", "retry", dead_id, "--config", str(config_file)]) == 1
    assert "is pending, not dead" in capsys.readouterr().err
    assert main(["notifications", "retry", "nope", "--config", str(config_file)]) == 1
    assert "no notification event nope" in capsys.readouterr().err


def test_no_store_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {tmp_path / 'missing'}\n", encoding="utf-8")
    assert main(["notifications", "list", "--config", str(config)]) == 2
    assert "no store at" in capsys.readouterr().err
