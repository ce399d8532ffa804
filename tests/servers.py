"""Running ``cpctl serve`` as real processes for tests that need them (workers, kill tests)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestServer

from service.edge import EdgeRunner

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, timeout: float = 20.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Poll ``url`` until it answers 200 (the server's readiness signal), at most ``timeout``
    seconds; fail at once if ``proc`` exits first (it will never be ready)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:  # noqa: S310 (loopback)
                if response.status == 200:
                    return
        except OSError:
            pass
        if proc is not None and proc.poll() is not None:
            log = getattr(proc, "log_path", None)
            tail = log.read_text(errors="replace")[-2000:] if log is not None else ""
            raise RuntimeError(f"server exited ({proc.returncode}) before {url} was ready:\n{tail}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} not ready after {timeout}s")
        time.sleep(0.05)


@contextmanager
def serve(
    state_dir: Path,
    *,
    workers: int = 1,
    args: tuple[str, ...] = (),
    env: Mapping[str, str] | None = None,
    preexec: Callable[[], None] | None = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Start ``cpctl serve`` on a free loopback port; yield (base URL, process); stop it after.
    ``preexec`` runs in the child before it starts (e.g. to lower a resource limit); the log
    file is ``process.log_path``."""
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    environ.update({"CONTROLPLANE_STATE_DIR": str(state_dir), **(env or {})})
    # Logs go to a file, never to an unread pipe: a full pipe would block the server's event
    # loop on its next log line.
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    log_path = state_dir.parent / f"serve-{port}.log"
    log_file = open(log_path, "wb")  # closed in finally
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "serve", "--port", str(port), "--workers", str(workers),
         *args],
        cwd=REPO,
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=log_file,
        preexec_fn=preexec,
        start_new_session=True,
    )
    proc.log_path = log_path  # type: ignore[attr-defined]
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base + "/healthz", proc=proc)
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log_file.close()


class EdgeTestServer(TestServer):
    """pytest-aiohttp's test server with the runner ``cpctl serve`` uses."""

    def __init__(self, *args: Any, handler_cancellation: bool = True, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._cancellation = handler_cancellation

    async def _make_runner(self, **kwargs: Any) -> EdgeRunner:
        kwargs["handler_cancellation"] = self._cancellation
        return EdgeRunner(self.app, **kwargs)
