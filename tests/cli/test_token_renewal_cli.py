"""A CLI session lasts a shift: the real ``cpctl`` renews its short-lived access token against
the live session, until the session ends; a logout ends it at once; renewals never refresh the
step-up. Against a real ``cpctl serve`` whose tokens live 30 seconds (the least configurable; no
clock skew allowed), so this waits for one token to expire."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.cli.client import Client, ClientError, CredentialStore
from tests.auth import PASSWORDS, otp
from tests.servers import REPO, serve

TOKEN_TTL_S = 30


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, object]]:
    env = {"CONTROLPLANE_AUTHN__TOKEN_TTL_S": str(TOKEN_TTL_S),
           "CONTROLPLANE_AUTHN__CLOCK_SKEW_S": "0"}
    with serve(tmp_path_factory.mktemp("renewal") / "state", env=env) as (base, proc):
        yield base, proc


def cpctl(base: str, creds: Path, *argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    env.update({"CONTROLPLANE_URL": base, "CONTROLPLANE_CREDENTIALS": str(creds)})
    return subprocess.run([sys.executable, "-m", "service", *argv], cwd=REPO, env=env,
                          input=stdin, capture_output=True, text=True, timeout=60, check=False)


def stored(base: str, creds: Path) -> dict:
    entry = CredentialStore(creds).get(base)
    assert entry is not None
    return entry


def wait_expired(base: str, token: str) -> None:
    """Until the server refuses ``token`` as expired (bounded generously)."""
    deadline = time.monotonic() + TOKEN_TTL_S + 30
    while True:
        try:
            Client(base, token).get("/api/v1/authn/sessions/current")
        except ClientError as exc:
            assert exc.code == "token_expired", exc
            return
        assert time.monotonic() < deadline, "the token did not expire"
        time.sleep(0.5)


def test_cpctl_renews_its_token_until_the_session_ends(server, tmp_path: Path) -> None:
    base, proc = server
    creds = tmp_path / "credentials.json"
    done = cpctl(base, creds, "login", "alice", "--password-stdin", stdin=PASSWORDS["alice"] + "\n")
    assert done.returncode == 0, done.stderr
    first = stored(base, creds)
    assert first["refresh_token"] and first["refresh_token"] != first["access_token"]

    # Later than the token's life: cpctl renews it against the live session and works on.
    wait_expired(base, first["access_token"])
    done = cpctl(base, creds, "whoami", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["session_id"] == first["session_id"]
    renewed = stored(base, creds)
    assert renewed["access_token"] != first["access_token"]
    assert renewed["session_id"] == first["session_id"]

    # A step-up is carried over by renewals, never refreshed: its time stays that of the code.
    # (A token with less than a minute left is renewed before it is sent: here, every call.)
    done = cpctl(base, creds, "step-up", "--otp", otp("alice", proc))
    assert done.returncode == 0, done.stderr
    stepped = stored(base, creds)["access_token"]
    done = cpctl(base, creds, "whoami", "--json")
    step = json.loads(done.stdout)["step_up"]
    assert step["verified"] is True and stored(base, creds)["access_token"] != stepped
    time.sleep(1.1)  # a later whole second, so a refreshed step-up would show
    done = cpctl(base, creds, "whoami", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["step_up"]["at"] == step["at"]

    # The renewal credential is no access token.
    entry = stored(base, creds)
    with pytest.raises(ClientError) as refused:
        Client(base, entry["refresh_token"]).get("/api/v1/authn/sessions/current")
    assert refused.value.status == 401

    # A logout ends the session at once: a copy of the credentials renews nothing any more.
    copy = dict(entry)
    done = cpctl(base, creds, "logout")
    assert done.returncode == 0, done.stderr
    with pytest.raises(ClientError) as refused:
        Client(base).post("/api/v1/authn/token/renew", {"refresh_token": copy["refresh_token"]},
                          auth=False)
    assert (refused.value.status, refused.value.code) == (401, "session_revoked")
    CredentialStore(creds).put(base, copy)
    done = cpctl(base, creds, "whoami")
    assert done.returncode == 1 and "401 session_revoked" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_cpctl_approval_request_wait_after_the_first_token_expired(server, tmp_path: Path) -> None:
    """The issue's case: ``cpctl approval request --wait`` run once the token from ``cpctl
    login`` has expired (15 minutes by default) requests, waits and reports the approval."""
    base, proc = server
    creds = tmp_path / "credentials.json"
    done = cpctl(base, creds, "login", "alice", "--password-stdin", stdin=PASSWORDS["alice"] + "\n")
    assert done.returncode == 0, done.stderr
    wait_expired(base, stored(base, creds)["access_token"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    env.update({"CONTROLPLANE_URL": base, "CONTROLPLANE_CREDENTIALS": str(creds)})
    waiting = subprocess.Popen(
        [sys.executable, "-m", "service", "approval", "request", "--env", "prod", "--action",
         "installer.run.execute", "--resource", '{"app": "web", "version": "9"}', "--reason",
         "renewal", "--wait", "--json"],
        cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        bob = Client(base)
        bob.token = bob.post("/api/v1/authn/sessions", {"subject_id": "bob",
                                                        "password": PASSWORDS["bob"]},
                             auth=False)["access_token"]
        deadline = time.monotonic() + 30
        while not (items := bob.get("/api/v1/approvals", {"state": "pending",
                                                          "subject_id": "alice"})["items"]):
            assert time.monotonic() < deadline and waiting.poll() is None, waiting.communicate()
            time.sleep(0.3)
        bob.token = bob.post("/api/v1/authn/step-up", {"otp": otp("bob", proc)})["access_token"]
        bob.post(f"/api/v1/approvals/{items[0]['id']}/reviews", {"decision": "approve"})
        out, err = waiting.communicate(timeout=60)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.communicate()
    assert waiting.returncode == 0, (out, err)
    assert json.loads(out)["state"] == "approved", out
