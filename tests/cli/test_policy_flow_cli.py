"""Issue 30 (1): ``cpctl policy publish | activate | rollback`` as real processes against a real
``cpctl serve`` whose fleet serves production: each steps up, requests the ticket the server
names, waits while bob reviews through the API, and presents ticket, nonce and command hash
itself (the one request -> wait -> present flow of ``installer run``); ``publish`` without a
directory signs ``./policies`` of its working directory and says so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from service.approvals.binding import new_nonce
from service.authz.revisions import Bundle
from service.cli.client import Client, CredentialStore, token_entry
from service.cli.main import build_parser
from service.cli.options import option_values
from tests.auth import PASSWORDS, otp
from tests.authz.revisions import fleet_keys
from tests.cpctl import PROCESS_TIMEOUT_S
from tests.servers import REPO, serve


def _env(home: Path, base: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    environ.update({"CONTROLPLANE_URL": base, "PYTHONUNBUFFERED": "1",
                    "PYTHONPATH": str(REPO),  # runs from another directory: this checkout's code
                    "CONTROLPLANE_CREDENTIALS": str(home / "credentials.json")})
    return environ


def _pending(reviewer: Client, action: str, proc: subprocess.Popen[str]) -> dict[str, Any]:
    deadline = time.monotonic() + PROCESS_TIMEOUT_S
    while time.monotonic() < deadline:
        for ticket in reviewer.get("/api/v1/approvals", {"state": "pending",
                                                          "subject_id": "alice"})["items"]:
            if ticket["action"] == action:
                return dict(ticket)
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise AssertionError(f"no pending {action} ticket")


def _approved_run(reviewer: Client, action: str, cwd: Path, env: dict[str, str],
                  *argv: str) -> tuple[str, str, dict[str, Any]]:
    """Start ``cpctl *argv``; bob approves the ticket it requests; its stdout, stderr, ticket."""
    proc = subprocess.Popen([sys.executable, "-m", "service", *argv], cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        ticket = _pending(reviewer, action, proc)
        reviewer.post(f"/api/v1/approvals/{ticket['id']}/reviews", {"decision": "approve"})
        out, err = proc.communicate(timeout=PROCESS_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, (out, err)
    assert f"ticket {ticket['id']} requested; waiting for reviewers" in err, err
    assert f"ticket {ticket['id']} approved; running" in err, err
    return out, err, ticket


@pytest.fixture
def fleet(tmp_path: Path):
    keys, config = fleet_keys(tmp_path)
    with serve(tmp_path / "state", env={"CONTROLPLANE_CONFIG": str(config)}) as (base, proc):
        yield base, proc, keys


def test_publish_activate_rollback_request_wait_and_present_their_tickets(fleet, tmp_path):
    base, server, keys = fleet
    home = tmp_path / "alice"
    answer = Client(base).post("/api/v1/authn/sessions", {
        "subject_id": "alice", "password": PASSWORDS["alice"]}, auth=False)
    CredentialStore(home / "credentials.json").put(base, token_entry(answer, "alice"))
    bob = Client(base)
    bob.token = bob.post("/api/v1/authn/sessions", {"subject_id": "bob",
                                                     "password": PASSWORDS["bob"]},
                         auth=False)["access_token"]
    bob.token = bob.post("/api/v1/authn/step-up", {"otp": otp("bob", server)})["access_token"]
    env = _env(home, base)

    # A working directory with its own policies/: that tree is what is signed.
    work = tmp_path / "work"
    shutil.copytree(REPO / "policies", work / "policies")
    with (work / "policies" / "authz.rego").open("a") as f:
        f.write("\n# the working directory's change\n")
    mine = Bundle.from_dir(work / "policies").revision_id()
    assert mine != Bundle.from_dir(REPO / "policies").revision_id()

    out, err, ticket = _approved_run(
        bob, "policy.publish", work, env, "policy", "publish", "--key",
        str(keys / "signer.pem"), "-m", "tighten reads", "--otp", otp("alice", server))
    assert f"policies: {work / 'policies'} (default ./policies)" in err, err
    assert f"published {mine}" in out, out
    assert ticket["resource"]["revision"] == mine
    shown = subprocess.run([sys.executable, "-m", "service", "approval", "show", ticket["id"]],
                           cwd=work, env=env, capture_output=True, text=True,
                           timeout=PROCESS_TIMEOUT_S)
    assert shown.returncode == 0, shown.stderr
    for line in (f"revision:   {mine} (published)", "message:    tighten reads",
                 "vetting:    passed", "diff:       1 files, +2 -0 lines",
                 "changed  authz.rego (+2 -0)", "impact:     no decision log is configured"):
        assert line in shown.stdout, shown.stdout

    # A ticket requested earlier: `--ticket T` alone presents it (the kept nonce).
    requested = subprocess.run(
        [sys.executable, "-m", "service", "approval", "request", "--env", "prod", "--action",
         "policy.activate", "--resource", json.dumps({"revision": mine}), "--json"],
        cwd=work, env=env, capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    assert requested.returncode == 0, requested.stderr
    ticket_id = json.loads(requested.stdout)["id"]
    bob.post(f"/api/v1/approvals/{ticket_id}/reviews", {"decision": "approve"})
    activated = subprocess.run(
        [sys.executable, "-m", "service", "policy", "activate", mine, "--ticket", ticket_id],
        cwd=work, env=env, capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    assert activated.returncode == 0, activated.stderr
    assert f"active: {mine}" in activated.stdout
    listed = Client(base)
    listed.token = answer["access_token"]
    assert listed.get("/api/v1/policy/revisions")["active"]["revision"] == mine

    # Right after the first activation, the way back is directory mode.
    out, _err, ticket = _approved_run(bob, "policy.activate", work, env, "policy", "rollback")
    assert ticket["resource"] == {"revision": "directory"}
    assert "active: None" not in out and "directory mode" in out, out
    assert listed.get("/api/v1/policy/revisions")["active"]["revision"] is None


def test_a_nonce_may_start_with_a_dash_and_none_is_minted_so() -> None:
    argv = ["policy", "activate", "R", "--ticket", "T", "--nonce", "-jnYZ"]
    assert option_values(argv) == ["policy", "activate", "R", "--ticket", "T", "--nonce=-jnYZ"]
    args = build_parser().parse_args(option_values(argv))
    assert (args.ticket, args.nonce) == ("T", "-jnYZ")
    # One in 64 URL-safe nonces used to start with '-': none of 2,000 does now.
    assert not any(new_nonce().startswith("-") for _ in range(2000))


def test_an_approval_required_error_names_its_bindings_without_json(capsys) -> None:
    import argparse

    from service.cli.client import ClientError, report_error
    exc = ClientError(403, "approval_required", "this action needs an approved ticket", body={
        "bindings": {"action": "policy.publish", "env": "prod",
                     "resource": {"revision": "sha256:1", "digest": "sha256:2"}}})
    report_error(argparse.Namespace(command="policy"), exc)
    err = capsys.readouterr().err
    assert ('needs a ticket for policy.publish on prod, resource '
            '{"digest": "sha256:2", "revision": "sha256:1"}') in err
    assert "`policy publish`" in err and "installer run" in err
