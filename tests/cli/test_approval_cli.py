"""``cpctl approval ...`` against a real ``cpctl serve`` process, as alice (requester) and bob (reviewer)."""

from __future__ import annotations

import hashlib
import io
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from service.approvals.binding import resource_hash
from service.approvals.command import command_hash
from service.cli import approval, session
from service.cli.approval import parse_command, parse_resource
from service.cli.client import UsageError
from tests.auth import KEYS, PASSWORDS, otp
from tests.servers import serve

PROD_RUN = ["--env", "prod", "--action", "installer.run.execute"]
RESOURCE = {"kind": "installer_run", "id": "run-42"}
COMMAND = "installer run --plan upgrade-42 --apply"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, object]]:
    with serve(tmp_path_factory.mktemp("approval-cli") / "state") as (base, proc):
        yield base, proc


@dataclass
class Cli:
    """Runs commands as one subject at a time; each subject has its own credentials file."""

    base: str
    scope: object
    home: Path
    monkeypatch: pytest.MonkeyPatch
    capsys: pytest.CaptureFixture[str]

    def as_(self, subject: str) -> Cli:
        self.monkeypatch.setenv("CONTROLPLANE_CREDENTIALS", str(self.home / subject / "credentials.json"))
        return self

    def login(self, subject: str, *, step_up: bool = False) -> None:
        self.as_(subject)
        if subject in KEYS:
            assert session.run(["login", subject, "--key", str(KEYS[subject])]) == 0
        else:
            self.monkeypatch.setattr(sys, "stdin", io.StringIO(PASSWORDS[subject] + "\n"))
            assert session.run(["login", subject, "--password-stdin"]) == 0
        if step_up:
            assert session.run(["step-up", "--otp", otp(subject, self.scope)]) == 0
        self.capsys.readouterr()

    def run(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = approval.run(list(argv))
        out = self.capsys.readouterr()
        return code, out.out, out.err

    def json(self, *argv: str) -> Any:
        code, out, err = self.run(*argv, "--json")
        assert code == 0, err
        return json.loads(out)


@pytest.fixture
def cli(server: tuple[str, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> Cli:
    base, proc = server
    monkeypatch.setenv("CONTROLPLANE_URL", base)
    monkeypatch.delenv("CONTROLPLANE_TOKEN", raising=False)
    return Cli(base, proc, tmp_path, monkeypatch, capsys)


def test_a_password_in_the_command_is_masked_by_request_and_show(cli: Cli) -> None:
    """The ticket binds the exact command (its hash, computed here); what the service keeps and
    every view prints has the password masked, the space-separated form included."""
    line = "mysql --host db --password hunter2 -e 'select 1'"
    cli.login("alice")
    code, out, err = cli.run("request", *PROD_RUN, "--resource", json.dumps(RESOURCE),
                             "--command", line, "--json")
    assert code == 0, err
    ticket = json.loads(out)
    assert ticket["command_hash"] == command_hash(line)
    assert ticket["command"] == "mysql --host db --password *** -e 'select 1'"
    code, text, _ = cli.run("show", ticket["id"])
    assert code == 0 and "hunter2" not in out + text
    assert "command:" in text and "mysql --host db --password *** -e 'select 1'" in text


def test_request_list_show_review_revoke(cli: Cli) -> None:
    cli.login("alice")
    ticket = cli.json("request", *PROD_RUN, "--resource", json.dumps(RESOURCE),
                      "--command", COMMAND, "--reason", "upgrade 42", "--ttl", "600")
    ticket_id = ticket["id"]
    assert ticket["state"] == "pending" and ticket["subject_id"] == "alice"  # --subject defaults to me
    assert ticket["resource"] == RESOURCE
    assert ticket["resource_hash"] == resource_hash(RESOURCE)
    assert ticket["command_hash"] == command_hash(COMMAND)  # hashed locally; only the hash was sent
    assert ticket["nonce"]

    shown = cli.json("show", ticket_id)
    assert shown["id"] == ticket_id and "nonce" not in shown

    page = cli.json("list", "--state", "pending", "--env", "prod", "--subject", "alice")
    assert ticket_id in [t["id"] for t in page["items"]]
    code, table, _ = cli.run("list", "--state", "pending")
    assert code == 0
    header, *rows = table.splitlines()
    assert header.split()[:3] == ["ID", "STATE", "ENV"]
    assert any(row.startswith(ticket_id) and " pending " in row for row in rows)

    # A requester cannot review; the policy gives operators no approvals.review.
    code, _, err = cli.run("review", ticket_id, "--approve")
    assert code == 1 and " 403 " in err

    # bob reviews a production ticket: first without a fresh step-up, then with one.
    cli.login("bob")
    code, _, err = cli.run("review", ticket_id, "--approve", "--reason", "looks right")
    assert code == 1
    assert "401 step_up_required" in err and "cpctl step-up" in err and "Traceback" not in err
    assert session.run(["step-up", "--otp", otp("bob", cli.scope)]) == 0
    reviewed = cli.json("review", ticket_id, "--approve", "--reason", "looks right")
    # The shipped prod policy: quorum 1 from sre-approvers, of which bob is one.
    assert reviewed["approval"]["quorum"] == 1
    assert reviewed["state"] == "approved"
    assert [(r["reviewer"], r["decision"], r["group"]) for r in reviewed["reviews"]] == [
        ("bob", "approve", "sre-approvers")
    ]
    assert reviewed["expires_at"]

    code, text, _ = cli.run("show", ticket_id)
    assert code == 0 and "state:" in text and "approved" in text and "bob [sre-approvers]: approve" in text

    # Only the requester (or an admin) revokes; bob's policy has no approvals.revoke.
    code, _, err = cli.run("revoke", ticket_id)
    assert code == 1 and " 403 " in err

    cli.as_("alice")
    revoked = cli.json("revoke", ticket_id)
    assert revoked["state"] == "revoked" and revoked["closed_by"] == "alice"
    code, _, err = cli.run("revoke", ticket_id)
    assert code == 1 and " 409 " in err


def test_request_prints_the_nonce_once_with_the_headers(cli: Cli) -> None:
    cli.login("alice")
    code, out, _ = cli.run("request", *PROD_RUN, "--resource", "db-7", "--command", COMMAND)
    assert code == 0
    ticket_id = next(line.split()[1] for line in out.splitlines() if line.startswith("ticket:"))
    headers = dict(
        line.strip().split(": ", 1) for line in out.splitlines()
        if line.strip().startswith(("Approval-Ticket:", "Approval-Nonce:", "Command-Hash:"))
    )
    assert headers["Approval-Ticket"] == ticket_id
    assert headers["Command-Hash"] == command_hash(COMMAND)
    nonce = headers["Approval-Nonce"]
    assert len(nonce) >= 32 and out.count(nonce) == 2  # the nonce line and its header
    # Nowhere else afterwards.
    for argv in (("show", ticket_id), ("list",), ("show", ticket_id, "--json"), ("list", "--json")):
        code, later, _ = cli.run(*argv)
        assert code == 0 and nonce not in later


def test_request_without_command_has_no_command_hash_header(cli: Cli) -> None:
    cli.login("alice")
    code, out, _ = cli.run("request", "--env", "prod", "--action", "installer.run.execute",
                           "--resource", "plain-string")
    assert code == 0
    assert "Approval-Nonce:" in out and "Command-Hash:" not in out


def test_reject(cli: Cli) -> None:
    cli.login("alice")
    ticket_id = cli.json("request", *PROD_RUN, "--resource", "db-8")["id"]
    cli.login("bob", step_up=True)
    rejected = cli.json("review", ticket_id, "--reject", "--reason", "wrong window")
    assert rejected["state"] == "rejected"
    assert rejected["reviews"][0]["reason"] == "wrong window"


def test_agent_must_bind_a_command(cli: Cli) -> None:
    cli.login("agent-7")
    code, _, err = cli.run("request", *PROD_RUN, "--resource", "db-9")
    assert code == 1 and "422 command_hash_required" in err
    ticket = cli.json("request", *PROD_RUN, "--resource", "db-9", "--command", COMMAND)
    assert ticket["subject_id"] == "agent-7" and ticket["command_hash"] == command_hash(COMMAND)


def test_errors_are_one_line(cli: Cli) -> None:
    cli.login("alice")
    code, _, err = cli.run("show", "tkt_does_not_exist")
    assert code == 1 and err.startswith("cpctl approval show: error: 404 ticket_not_found:")
    assert len(err.splitlines()) == 1
    code, _, err = cli.run("request", *PROD_RUN[:2], "--action", "no.such.action", "--resource", "x")
    assert code == 1 and "422" in err and "/action" in err


def test_not_logged_in(cli: Cli) -> None:
    cli.as_("nobody")
    code, _, err = cli.run("list")
    assert code == 1 and "not logged in" in err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param('{"kind": "db", "id": "db-1"}', {"kind": "db", "id": "db-1"}, id="object"),
        pytest.param("db-1", "db-1", id="plain string"),
        pytest.param('"db-1"', "db-1", id="json string"),
        pytest.param(' \n{"a": 1}', {"a": 1}, id="leading whitespace"),
    ],
)
def test_parse_resource(text: str, expected: Any) -> None:
    assert parse_resource(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("{app:web}", "--resource: invalid JSON at line 1 column 2", id="bare key"),
        pytest.param('{"a": 1,\n "b": }', "--resource: invalid JSON at line 2 column 7", id="line 2"),
        pytest.param('"unterminated', "--resource: invalid JSON at line 1 column 1", id="string"),
        pytest.param("[1, 2]", "--resource: a resource is a non-empty JSON object or string, not an array",
                     id="array"),
        pytest.param("{}", "not an empty object", id="empty object"),
    ],
)
def test_json_looking_resource_must_parse(text: str, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_resource(text)
    assert message in str(caught.value)


def test_resource_from_file(tmp_path: Path) -> None:
    path = tmp_path / "resource.json"
    path.write_text('{"app": "web"}\n')
    assert parse_resource(f"@{path}") == {"app": "web"}
    path.write_text("{app: web}")
    with pytest.raises(UsageError, match="invalid JSON at line 1 column 2"):
        parse_resource(f"@{path}")
    with pytest.raises(UsageError, match="cannot read"):
        parse_resource(f"@{tmp_path / 'missing.json'}")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("helm upgrade web ./chart", "helm upgrade web ./chart", id="command line"),
        pytest.param('["helm", "upgrade", "web"]', ["helm", "upgrade", "web"], id="argv"),
    ],
)
def test_parse_command(text: str, expected: Any) -> None:
    assert parse_command(text) == expected


@pytest.mark.parametrize("text", ['["helm", 1]', "[]", '["helm",', "{}"])
def test_parse_command_refuses(text: str) -> None:
    with pytest.raises(UsageError, match="--command"):
        parse_command(text)


def test_command_hash_is_the_one_binding_hash_for_a_command_line() -> None:
    # A command line hashes as the chain's binding rule says (UTF-8 of the exact line); an argv
    # array as its RFC 8785 JSON, so the two spellings are different commands.
    assert command_hash(COMMAND) == "sha256:" + hashlib.sha256(COMMAND.encode()).hexdigest()
    assert command_hash(["a", "b"]) == "sha256:" + hashlib.sha256(b'["a","b"]').hexdigest()
    assert command_hash(["a b"]) != command_hash("a b")
