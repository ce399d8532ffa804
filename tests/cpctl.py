"""Driving real ``cpctl`` processes in tests: collect one's output, and play the executor that
reports the steps of the run it started."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterable
from typing import Any

from service.cli.client import Client, ClientError

#: How long a cpctl process or the run it waits for may take before a test fails.
PROCESS_TIMEOUT_S = 30


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of ``proc`` (killed if it outlives the timeout)."""
    try:
        out, err = proc.communicate(timeout=PROCESS_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


def report_steps(executor: Client, task_id: str, running: subprocess.Popen[str],
                 events: Iterable[dict[str, Any]]) -> None:
    """As the executor: wait until the run ``running`` waits on was accepted (its task exists),
    then report ``events`` for it."""
    deadline = time.monotonic() + PROCESS_TIMEOUT_S
    while True:
        try:
            executor.get(f"/api/v1/tasks/{task_id}")
            break
        except ClientError as exc:
            assert exc.code == "task_not_found" and time.monotonic() < deadline, exc
            assert running.poll() is None, running.communicate()
            time.sleep(0.1)
    for event in events:
        executor.post(f"/api/v1/tasks/{task_id}/events", event)
