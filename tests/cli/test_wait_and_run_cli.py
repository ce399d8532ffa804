"""``cpctl approval request --wait`` and ``cpctl installer run`` as real processes against a real
``cpctl serve``: alice waits in cpctl while bob reviews through the API, as two people would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from service.approvals.command import command_hash
from service.cli import approval, installer
from service.cli.client import Client, ClientError, CredentialStore, token_entry
from tests.auth import PASSWORDS, assertion, otp
from tests.cpctl import PROCESS_TIMEOUT_S, finish, report_steps
from tests.servers import REPO, serve

_REVIEWERS: dict[Any, Client] = {}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    with serve(tmp_path_factory.mktemp("wait-cli") / "state") as (base, proc):
        yield base, proc


@dataclass
class People:
    """cpctl processes per subject (each with its own credentials file) and API clients."""

    base: str
    proc: Any
    home: Path

    def env(self, subject: str) -> dict[str, str]:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
        environ.update({"CONTROLPLANE_URL": self.base, "PYTHONUNBUFFERED": "1",
                        "CONTROLPLANE_CREDENTIALS": str(self.home / subject / "credentials.json")})
        return environ

    def cpctl(self, subject: str, *argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "service", *argv], cwd=REPO, env=self.env(subject),
                              input=stdin, capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)

    def start(self, subject: str, *argv: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "service", *argv], cwd=REPO, env=self.env(subject),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def login(self, subject: str) -> None:
        """Log in as ``cpctl login`` would (its own tests cover it): the token in the credentials
        file of ``subject``'s cpctl processes, without a process start per test."""
        answer = Client(self.base).post("/api/v1/authn/sessions",
                                        {"subject_id": subject, "password": PASSWORDS[subject]},
                                        auth=False)
        CredentialStore(self.home / subject / "credentials.json").put(
            self.base, token_entry(answer, subject))

    def api(self, subject: str, *, step_up: bool = False) -> Client:
        """An API client as ``subject`` (what a reviewer's own tools would do)."""
        client = Client(self.base)
        if subject in PASSWORDS:
            body = {"subject_id": subject, "password": PASSWORDS[subject]}
        else:
            body = {"assertion": assertion(subject)}
        client.token = client.post("/api/v1/authn/sessions", body, auth=False)["access_token"]
        if step_up:
            answer = client.post("/api/v1/authn/step-up", {"otp": otp(subject, self.proc)})
            client.token = answer["access_token"]
        return client

    def reviewer(self) -> Client:
        """bob, stepped up once per server: TOTP codes are single-use per time step, so every
        test stepping up anew would run out of steps."""
        if self.proc not in _REVIEWERS:
            _REVIEWERS[self.proc] = self.api("bob", step_up=True)
        return _REVIEWERS[self.proc]

    def review(self, ticket_id: str, body: dict[str, Any]) -> None:
        """bob reviews, stepping up again when his step-up has aged out."""
        path = f"/api/v1/approvals/{ticket_id}/reviews"
        try:
            self.reviewer().post(path, body)
        except ClientError as exc:
            if exc.code != "step_up_required":
                raise
            _REVIEWERS.pop(self.proc)
            self.reviewer().post(path, body)

    def pending_ticket(self, reviewer: Client, resource: Any, proc: subprocess.Popen[str] | None,
                       subject: str = "alice") -> dict[str, Any]:
        """The pending ticket for ``resource`` once ``proc`` has requested it."""
        deadline = time.monotonic() + PROCESS_TIMEOUT_S
        while time.monotonic() < deadline:
            page = reviewer.get("/api/v1/approvals", {"state": "pending", "subject_id": subject})
            for ticket in page["items"]:
                if ticket["resource"] == resource:
                    return dict(ticket)
            assert proc is None or proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        raise AssertionError(f"no pending ticket for {resource}")


def stream_requests(proc: Any) -> int:
    """How many ticket event streams the server was asked for so far (its access log)."""
    count = 0
    for line in Path(proc.log_path).read_text().splitlines():
        if "/events" not in line:
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if doc.get("route") == "/api/v1/approvals/{id}/events":
            count += 1
    return count


@pytest.fixture
def people(server: tuple[str, Any], tmp_path: Path) -> People:
    base, proc = server
    return People(base, proc, tmp_path)


def unique_resource() -> dict[str, str]:
    return {"app": "web", "release": uuid.uuid4().hex[:12]}


def test_request_wait_exits_0_once_another_person_approves(people: People) -> None:
    people.login("alice")
    resource = unique_resource()
    before = stream_requests(people.proc)
    waiting = people.start("alice", "approval", "request", "--env", "prod", "--action",
                           "installer.run.execute", "--resource", json.dumps(resource),
                           "--reason", "release", "--wait")
    bob = people.reviewer()
    ticket = people.pending_ticket(bob, resource, waiting)
    time.sleep(1.0)  # a poller would ask several times in this second; a stream asks once
    people.review(ticket['id'], {"decision": "approve", "reason": "ok"})
    code, out, err = finish(waiting)
    assert code == 0, err
    assert f"ticket {ticket['id']} is approved" in out
    assert "pending (0/1 approvals)" in err and "bob: approve" in err
    # One stream, no polling (the access line is written once the server has closed it).
    deadline = time.monotonic() + 5
    while stream_requests(people.proc) - before < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stream_requests(people.proc) - before == 1


def test_request_wait_exits_1_on_reject(people: People) -> None:
    people.login("alice")
    resource = unique_resource()
    waiting = people.start("alice", "approval", "request", "--env", "prod", "--action",
                           "installer.run.execute", "--resource", json.dumps(resource), "--wait",
                           "--json")
    bob = people.reviewer()
    ticket = people.pending_ticket(bob, resource, waiting)
    people.review(ticket['id'], {"decision": "reject", "reason": "no"})
    code, out, err = finish(waiting)
    assert code == 1, err
    final = json.loads(out)
    assert final["id"] == ticket["id"] and final["state"] == "rejected" and final["nonce"]


def test_wait_on_a_revoked_ticket_exits_1_and_a_refusal_exits_3(people: People) -> None:
    people.login("alice")
    alice = people.api("alice")
    ticket = alice.post("/api/v1/approvals", {"subject_id": "alice", "env": "prod",
                                              "action": "installer.run.execute",
                                              "resource": unique_resource()})
    alice.post(f"/api/v1/approvals/{ticket['id']}/revoke", {})
    done = people.cpctl("alice", "approval", "wait", ticket["id"])
    assert done.returncode == 1 and f"ticket {ticket['id']} is revoked" in done.stdout
    done = people.cpctl("alice", "approval", "wait", "tkt_" + "0" * 32)
    assert done.returncode == 3 and "404 ticket_not_found" in done.stderr


def test_installer_run_end_to_end_with_an_approval_in_prod(people: People) -> None:
    people.login("alice")
    resource, task_id = unique_resource(), "release-" + uuid.uuid4().hex[:8]
    command = "helm upgrade web ./chart --version 1.2.3"
    running = people.start("alice", "installer", "run", "--task-id", task_id, "--env", "prod",
                           "--resource", json.dumps(resource), "--command", command,
                           "--reason", "release 1.2.3", "--otp", otp("alice", people.proc))
    bob = people.reviewer()
    ticket = people.pending_ticket(bob, resource, running)
    # Bound to exactly what the server's approval_required answer named, and this command.
    assert ticket["env"] == "prod" and ticket["action"] == "installer.run.execute"
    assert ticket["command_hash"] == command_hash(command)
    kept = json.loads((people.home / "alice" / "tickets.json").read_text())
    nonce = kept["servers"][people.base][ticket["id"]]["nonce"]
    assert oct((people.home / "alice" / "tickets.json").stat().st_mode & 0o777) == "0o600"

    people.review(ticket['id'], {"decision": "approve", "reason": "CHG-7"})
    # The executor reports once the run is accepted; cpctl prints the events as they come.
    report_steps(people.api("ci-bot"), task_id, running, (
        {"kind": "started", "message": "pulling chart"},
        {"kind": "progress", "progress": 50},
        {"kind": "succeeded", "result": {"revision": 7}}))
    code, out, err = finish(running)
    assert code == 0, err
    assert f"ticket {ticket['id']} consumed" in out
    lines = out.splitlines()
    kinds = [line.split()[2] for line in lines if line.startswith("#")]
    assert kinds == ["installer.run.requested", "started", "progress", "succeeded"]
    assert f"task {task_id} succeeded" in lines[-1]
    assert "approval required" in err and "stepped up" in err and "approved; running" in err
    assert nonce not in out + err  # presented as a header, never shown
    assert bob.get(f"/api/v1/approvals/{ticket['id']}")["state"] == "consumed"
    kept = json.loads((people.home / "alice" / "tickets.json").read_text())
    assert ticket["id"] not in kept["servers"][people.base]  # used up: forgotten


def test_installer_run_needs_no_ticket_where_the_policy_allows(people: People) -> None:
    people.login("alice")
    done = people.cpctl("alice", "installer", "run", "--task-id", "dev-" + uuid.uuid4().hex[:8],
                        "--env", "dev", "--resource", "web", "--no-follow", "--json")
    assert done.returncode == 0, done.stderr
    accepted = json.loads(done.stdout)["accepted"]
    assert accepted["event"]["kind"] == "installer.run.requested" and accepted["event"]["ticket_id"] is None


def test_json_looking_input_that_does_not_parse_is_an_error(people: People) -> None:
    done = people.cpctl("alice", "approval", "request", "--env", "prod", "--action",
                        "installer.run.execute", "--resource", "{app:web}", "--json")
    assert done.returncode == 1
    assert "--resource: invalid JSON at line 1 column 2" in done.stderr
    error = json.loads(done.stdout)["error"]
    assert error["code"] == "usage_error" and "line 1 column 2" in error["detail"]


def test_errors_show_code_reasons_and_correlation_id(people: People) -> None:
    people.login("carol")  # a viewer: the policy denies her tickets, naming why
    argv = ("approval", "request", "--env", "prod", "--action", "installer.run.execute",
            "--resource", "web")
    done = people.cpctl("carol", *argv)
    assert done.returncode == 1
    line = done.stderr.splitlines()[0]
    assert line.startswith("cpctl approval request: error: 403 denied:")
    assert "[reasons: " in line and "(correlation_id " in line
    done = people.cpctl("carol", *argv, "--json")
    assert done.returncode == 1
    error = json.loads(done.stdout)["error"]
    assert error["status"] == 403 and error["code"] == "denied"
    assert error["reasons"] and error["correlation_id"] and error["correlation_id"] in done.stderr


def test_installer_run_presents_a_ticket_requested_earlier(people: People,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """``--ticket``: the nonce comes from tickets.json (kept by ``approval request``); this runs
    cpctl in-process (the process path is covered above)."""
    people.login("alice")
    monkeypatch.setenv("CONTROLPLANE_URL", people.base)
    monkeypatch.setenv("CONTROLPLANE_CREDENTIALS", str(people.home / "alice" / "credentials.json"))
    resource, command = unique_resource(), ["helm", "upgrade", "web", "./chart"]
    assert approval.run(["request", "--env", "prod", "--action", "installer.run.execute",
                         "--resource", json.dumps(resource), "--command", json.dumps(command)]) == 0
    ticket_id = next(line.split()[1] for line in capsys.readouterr().out.splitlines()
                     if line.startswith("ticket:"))
    bob = people.reviewer()
    people.review(ticket_id, {"decision": "approve"})
    argv = ["run", "--task-id", "t-" + uuid.uuid4().hex[:8], "--env", "prod",
            "--resource", json.dumps(resource), "--ticket", ticket_id, "--no-follow"]
    # Another command than the ticket binds: the server refuses, and nothing is consumed.
    code = installer.run([*argv, "--command", "helm upgrade web ./chart", "--otp", otp("alice", people.proc)])
    err = capsys.readouterr().err
    assert code == 1 and "403 ticket_binding_mismatch" in err and "correlation_id" in err
    assert installer.run([*argv, "--command", json.dumps(command)]) == 0  # still stepped up
    out = capsys.readouterr().out
    assert f"ticket {ticket_id} consumed" in out
    assert bob.get(f"/api/v1/approvals/{ticket_id}")["state"] == "consumed"
    # Used up and forgotten: presenting it again needs a nonce cpctl no longer has.
    assert installer.run([*argv, "--command", json.dumps(command)]) == 1
    assert f"no nonce kept for ticket {ticket_id}" in capsys.readouterr().err


def test_an_agent_runs_in_prod_with_its_command_bound(people: People, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """An agent: no step-up (its fresh key login stands in), the command must be bound, a person
    approves. In-process cpctl, bob approving from another thread."""
    answer = Client(people.base).post("/api/v1/authn/sessions", {"assertion": assertion("agent-7")},
                                      auth=False)
    creds = people.home / "agent-7" / "credentials.json"
    CredentialStore(creds).put(people.base, token_entry(answer, "agent-7"))
    monkeypatch.setenv("CONTROLPLANE_URL", people.base)
    monkeypatch.setenv("CONTROLPLANE_CREDENTIALS", str(creds))
    resource = unique_resource()
    argv = ["run", "--task-id", "agent-" + uuid.uuid4().hex[:8], "--env", "prod",
            "--resource", json.dumps(resource), "--no-follow"]
    assert installer.run(argv) == 1
    assert "pass --command" in capsys.readouterr().err

    bob = people.reviewer()
    approved: list[str] = []

    def approve() -> None:
        ticket = people.pending_ticket(bob, resource, None, subject="agent-7")
        people.review(ticket['id'], {"decision": "approve"})
        approved.append(ticket["id"])

    reviewer = threading.Thread(target=approve)
    reviewer.start()
    try:
        code = installer.run([*argv, "--command", '["deploy", "web"]'])
    finally:
        reviewer.join(PROCESS_TIMEOUT_S)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert approved and f"ticket {approved[0]} consumed" in out
    ticket = bob.get(f"/api/v1/approvals/{approved[0]}")
    assert ticket["state"] == "consumed" and ticket["command_hash"] == command_hash(["deploy", "web"])
