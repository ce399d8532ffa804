"""The README's quickstart, pasted as it stands, against a real server on a free port.

The quickstart's shell blocks are marked in README.md with ``<!-- quickstart: NAME -->`` on the
line before the fence; each block is one terminal's paste, after the ``setup`` block every
terminal pastes first. Here:

- ``server`` (``make run ARGS="--port $PORT"``) is the one block not run as written: ``make run``
  installs ``.venv`` first, so the server is ``cpctl serve --port PORT`` started the way every
  process test starts it (``tests.servers.serve``), on a free port given to the blocks as
  ``PORT`` (the setup block's ``${PORT:-8700}``);
- ``executor`` and ``requester`` run as written, side by side;
- the console approval cannot be pasted into a shell: its alternative, ``approver-cli`` (bob
  approves with ``cpctl``), runs once alice's run waits for reviewers.

``cpctl`` and ``python`` are this interpreter (a fresh clone has them in ``.venv/bin``, which the
setup block puts first on ``PATH``); the credentials live under a temporary ``HOME``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.servers import REPO, serve

README = REPO / "README.md"
_BLOCK = re.compile(r"^<!-- quickstart: ([\w-]+) -->\n```sh\n(.*?)^```$", re.M | re.S)
#: alice's run: a step-up, a ticket, bob's review, the run and the executor's two reports.
RUN_TIMEOUT_S = 120


def quickstart_blocks() -> dict[str, str]:
    """The marked shell blocks of the README's quickstart, by name."""
    return {name: body for name, body in _BLOCK.findall(README.read_text(encoding="utf-8"))}


def test_the_readme_marks_one_block_per_terminal_step() -> None:
    blocks = quickstart_blocks()
    assert list(blocks) == ["setup", "server", "executor", "requester", "approver-cli"]
    assert "${PORT:-8700}" in blocks["setup"]
    # The block replaced here by tests.servers.serve: exactly `make run` on the variable's port.
    assert blocks["server"].strip() == 'make run ARGS="--port $PORT"'
    assert "--port" not in blocks["executor"] and "8700" not in blocks["requester"]


@pytest.fixture
def shims(tmp_path: Path) -> Path:
    """``cpctl`` and ``python`` as a fresh clone's ``.venv/bin`` has them: this interpreter."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, argv in (("cpctl", f'"{sys.executable}" -m service'), ("python", f'"{sys.executable}"')):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
        shim.chmod(0o755)
    return bin_dir


def terminal(blocks: dict[str, str], name: str, environ: dict[str, str], log: Path,
             ) -> subprocess.Popen[bytes]:
    """One terminal: the setup block, then block ``name``, as pasted into bash."""
    script = "set -e\n" + blocks["setup"] + blocks[name]
    with open(log, "wb") as out:
        return subprocess.Popen(["bash", "-c", script], cwd=REPO, env=environ,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        assert proc.poll() is None, f"exited {proc.returncode} before {text!r}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no {text!r} after {timeout}s:\n{log.read_text()}"
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_the_quickstart_runs_as_pasted(tmp_path: Path, shims: Path) -> None:
    blocks = quickstart_blocks()
    home = tmp_path / "home"
    home.mkdir()
    with serve(tmp_path / "state") as (base, _server):
        environ = {k: v for k, v in os.environ.items()
                   if not k.startswith("CONTROLPLANE_") and k != "XDG_CONFIG_HOME"}
        environ.update({"PORT": base.rsplit(":", 1)[1], "HOME": str(home),
                        "PATH": f"{shims}:{os.environ['PATH']}"})
        logs = {name: tmp_path / f"{name}.log" for name in ("executor", "requester", "approver")}
        executor = terminal(blocks, "executor", environ, logs["executor"])
        try:
            wait_for(logs["executor"], "logged in to", executor, 30)
            requester = terminal(blocks, "requester", environ, logs["requester"])
            try:
                wait_for(logs["requester"], "waiting for reviewers", requester, 60)
                approver = subprocess.run(
                    ["bash", "-c", "set -e\n" + blocks["setup"] + blocks["approver-cli"]],
                    cwd=REPO, env=environ, stdin=subprocess.DEVNULL, capture_output=True,
                    text=True, timeout=60)
                assert approver.returncode == 0, (approver.stdout, approver.stderr)
                requester.wait(timeout=RUN_TIMEOUT_S)
            finally:
                stop(requester)
        finally:
            stop(executor)
    said = logs["requester"].read_text()
    assert requester.returncode == 0, said
    assert "approval required" in said and "approved; running" in said, said
    assert re.search(r"run accepted: task release-\d+, ticket \S+ consumed", said), said
    assert re.search(r"started by ci-bot: \[example-executor\] claimed", said), said
    assert re.search(r"succeeded by ci-bot", said), said
    assert re.search(r"^task release-\d+ succeeded", said, re.M), said
    assert "Traceback" not in said
    # bob's review came from bob's own credentials file: alice's stayed hers.
    config = home / ".config" / "controlplane"
    assert (config / "bob-credentials.json").is_file() and (config / "credentials.json").is_file()
    ran = logs["executor"].read_text()
    assert re.search(r"task release-\d+: succeeded", ran), ran
