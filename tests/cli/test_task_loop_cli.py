"""The task loop as real processes: ``cpctl installer run`` bounds its wait on the task
(``--no-executor-after``, ``--timeout`` with its own exit code), and an executor reports steps
with ``cpctl task report`` (the first ``started`` claims the task)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.cli.client import Client, ClientError, CredentialStore, token_entry
from service.cli.task import EXIT_TIMEOUT
from tests.auth import PASSWORDS, assertion
from tests.cpctl import PROCESS_TIMEOUT_S, finish
from tests.servers import REPO, serve


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serve(tmp_path_factory.mktemp("task-loop") / "state") as (base, _proc):
        yield base


class Cpctl:
    """cpctl processes per subject, each with its own credentials file, logged in."""

    def __init__(self, base: str, home: Path) -> None:
        self.base, self.home = base, home

    def env(self, subject: str) -> dict[str, str]:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
        environ.update({"CONTROLPLANE_URL": self.base, "PYTHONUNBUFFERED": "1",
                        "CONTROLPLANE_CREDENTIALS": str(self.home / subject / "credentials.json")})
        return environ

    def login(self, subject: str) -> None:
        body: dict[str, Any] = ({"subject_id": subject, "password": PASSWORDS[subject]}
                                if subject in PASSWORDS else {"assertion": assertion(subject)})
        answer = Client(self.base).post("/api/v1/authn/sessions", body, auth=False)
        CredentialStore(self.home / subject / "credentials.json").put(
            self.base, token_entry(answer, subject))

    def start(self, subject: str, *argv: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "service", *argv], cwd=REPO,
                                env=self.env(subject), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def run(self, subject: str, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "service", *argv], cwd=REPO,
                              env=self.env(subject), stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=PROCESS_TIMEOUT_S)


@pytest.fixture
def cpctl(server: str, tmp_path: Path) -> Cpctl:
    return Cpctl(server, tmp_path)


def test_installer_run_says_no_executor_reported_and_times_out_with_its_own_exit_code(
        cpctl: Cpctl) -> None:
    cpctl.login("alice")
    task_id = "dev-" + uuid.uuid4().hex[:8]
    running = cpctl.start("alice", "installer", "run", "--task-id", task_id, "--env", "dev",
                          "--resource", "web", "--no-executor-after", "1", "--timeout", "4")
    code, out, err = finish(running)
    assert code == EXIT_TIMEOUT == 4, (out, err)
    assert f"run accepted: task {task_id}" in out
    assert f"no executor has reported on task {task_id} for 1 s" in err
    assert f"task {task_id} did not end within 4 s" in err
    assert "Traceback" not in err


def test_task_report_claims_the_task_once_and_ends_the_run(cpctl: Cpctl) -> None:
    cpctl.login("alice")
    cpctl.login("ci-bot")
    task_id = "dev-" + uuid.uuid4().hex[:8]
    running = cpctl.start("alice", "installer", "run", "--task-id", task_id, "--env", "dev",
                          "--resource", "web", "--no-executor-after", "600")
    try:
        # The run is accepted before the executor can claim it (the task exists from then on).
        alice = Client(cpctl.base, CredentialStore(cpctl.home / "alice" / "credentials.json")
                       .get(cpctl.base)["access_token"])  # type: ignore[index]
        claimed = None
        for _attempt in range(PROCESS_TIMEOUT_S * 10):
            claimed = cpctl.run("ci-bot", "task", "report", task_id, "--step", "helm-upgrade",
                                "--status", "started", "--message", "pulling chart")
            if claimed.returncode == 0 or "task_not_found" not in claimed.stderr:
                break
            assert running.poll() is None, running.communicate()
        assert claimed is not None and claimed.returncode == 0, claimed.stderr
        assert f"task {task_id}: started recorded" in claimed.stdout
        # A second `started` is refused: the task already runs (another executor would get
        # task_claimed: tests/api/test_tasks.py).
        again = cpctl.run("ci-bot", "task", "report", task_id, "--status", "started")
        assert again.returncode == 1 and "409 task_state_conflict" in again.stderr, again.stderr
        # Someone without tasks.report cannot report (alice, the operator who asked for the run).
        denied = cpctl.run("alice", "task", "report", task_id, "--status", "succeeded")
        assert denied.returncode == 1 and "403" in denied.stderr, denied.stderr
        done = cpctl.run("ci-bot", "task", "report", task_id, "--step", "helm-upgrade",
                         "--status", "succeeded", "--result", '{"revision": 7}')
        assert done.returncode == 0, done.stderr
    finally:
        code, out, err = finish(running)
    assert code == 0, err
    assert "started by ci-bot: [helm-upgrade] pulling chart" in out
    assert f"task {task_id} succeeded" in out.splitlines()[-1]
    assert "no executor has reported" not in err
    assert alice.get(f"/api/v1/tasks/{task_id}")["state"] == "succeeded"
    bad = cpctl.run("ci-bot", "task", "report", task_id, "--status", "failed", "--result", "[1]")
    assert bad.returncode == 1 and "--result must be a JSON object" in bad.stderr


def test_the_example_executor_closes_the_loop_without_the_test_playing_executor(
        cpctl: Cpctl) -> None:
    cpctl.login("alice")
    executor = subprocess.Popen(
        [sys.executable, "examples/executor/executor.py", "--server", cpctl.base,
         "--interval", "0.2"], cwd=REPO, env=cpctl.env("ci-bot"), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        task_id = "dev-" + uuid.uuid4().hex[:8]
        done = cpctl.run("alice", "installer", "run", "--task-id", task_id, "--env", "dev",
                         "--resource", "web", "--timeout", str(PROCESS_TIMEOUT_S - 5))
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert "started by ci-bot: [example-executor] claimed" in done.stdout
        assert f"task {task_id} succeeded" in done.stdout.splitlines()[-1]
    finally:
        executor.terminate()
        _code, _out, err = finish(executor)
    assert f"task {task_id}: claimed" in err and f"task {task_id}: succeeded" in err, err
    assert "Traceback" not in err


def test_pending_tasks_are_listed_for_executors_and_bad_states_are_refused(cpctl: Cpctl) -> None:
    cpctl.login("alice")
    task_id = "dev-" + uuid.uuid4().hex[:8]
    accepted = cpctl.run("alice", "installer", "run", "--task-id", task_id, "--env", "dev",
                         "--resource", "web", "--no-follow")
    assert accepted.returncode == 0, accepted.stderr
    token = CredentialStore(cpctl.home / "alice" / "credentials.json").get(cpctl.base)
    assert token is not None
    alice = Client(cpctl.base, token["access_token"])
    pending = alice.get("/api/v1/tasks", {"state": "pending", "limit": 200})
    assert task_id in [t["id"] for t in pending["items"]]
    assert all(t["state"] == "pending" for t in pending["items"])
    with pytest.raises(ClientError) as refused:
        alice.get("/api/v1/tasks", {"state": "done"})
    assert refused.value.status == 422 and refused.value.code == "invalid_query"
    with pytest.raises(ClientError) as refused:
        alice.get("/api/v1/tasks", {"": "0"})  # a parameter the route does not take
    assert refused.value.status == 422 and refused.value.code == "invalid_query"
