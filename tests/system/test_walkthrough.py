"""docs/walkthrough.md in its script form (examples/walkthrough.sh) against a real server on a
free port, twice in a row: the port comes from a variable, /metrics is not dumped whole, and the
second run (within the same 30 s TOTP step) neither replays a code nor ends in a traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.servers import REPO, serve

#: One run may wait up to one TOTP step (30 s) per person for a fresh code.
RUN_TIMEOUT_S = 180


def run_walkthrough(base: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    environ.update({"PORT": base.rsplit(":", 1)[1], "PYTHON": sys.executable})
    return subprocess.run(["bash", "examples/walkthrough.sh"], cwd=REPO, env=environ,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)


def test_the_walkthrough_runs_twice_in_a_row_on_any_port(tmp_path: Path) -> None:
    with serve(tmp_path / "state") as (base, _proc):
        assert not base.endswith(":8700")
        first = run_walkthrough(base)
        second = run_walkthrough(base)
    for done in (first, second):
        assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
        assert "Traceback" not in done.stderr and "KeyError" not in done.stderr, done.stderr
        assert "approval_required" in done.stdout and "ticket_consumed" in done.stdout
        assert re.search(r'"state":\s*"succeeded"', done.stdout), done.stdout[-3000:]
        # A few request counters, not the whole exposition (no HELP/TYPE lines, no histograms).
        assert "# HELP" not in done.stdout and "_bucket{" not in done.stdout
        assert "controlplane_http_requests_total" in done.stdout
        assert done.stdout.rstrip().splitlines()[-2:] == ["204", "401"], done.stdout[-500:]
    # The second run came within the first one's TOTP step: it waited for a fresh code instead
    # of sending the used one again (or the step changed in between, and it needed no wait).
    assert "was used already" in second.stderr or "was used already" not in first.stderr
