"""The command text on tickets: its canonical hash, masking, and the create endpoint's checks."""

from __future__ import annotations

import hashlib
import json

import pytest

from service.approvals.command import canonical_command, command_hash, masked
from service.storelink import STORE
from tests.auth import bearer, login, step_up
from tests.problems import assert_problem

RESOURCE = {"app": "web", "version": "1.2.3"}
ARGV = ["helm", "upgrade", "web", "./chart", "--set", "image.tag=1.2.3"]


def test_a_string_hashes_as_its_utf8_bytes() -> None:
    line = "helm upgrade web ./chart  --set tag=é"
    assert command_hash(line) == "sha256:" + hashlib.sha256(line.encode("utf-8")).hexdigest()
    assert command_hash(line) != command_hash(line.replace("  ", " "))  # no normalising


def test_argv_hashes_as_its_rfc8785_json() -> None:
    # RFC 8785 for an array of strings: no whitespace, minimal escapes, UTF-8.
    expected = json.dumps(ARGV, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    assert canonical_command(ARGV) == expected
    assert command_hash(ARGV) == "sha256:" + hashlib.sha256(expected).hexdigest()
    assert command_hash(ARGV) != command_hash(" ".join(ARGV))
    assert command_hash(["a b"]) != command_hash(["a", "b"])
    assert len(command_hash("x")) == 71 and command_hash("x") == command_hash("x").lower()
    with pytest.raises(TypeError):
        canonical_command(["ok", 3])  # type: ignore[list-item]


@pytest.mark.parametrize(("command", "hidden", "kept"), [
    pytest.param("deploy --password=hunter2 web", "hunter2", "deploy", id="string-named"),
    pytest.param("curl -H 'Authorization: Bearer abc.def' x", "abc.def", "curl", id="string-bearer"),
    pytest.param(["deploy", "--password", "hunter2", "web"], "hunter2", "web", id="argv-flag"),
    pytest.param(["deploy", "--api-key=k3y", "web"], "k3y", "web", id="argv-named"),
    pytest.param(["psql", "postgresql://u:s3cret@db/x"], "s3cret", "psql", id="argv-url"),
    # The space-separated form of a command line, and quoted values in every form.
    pytest.param("mysql --password hunter2 -e 'select 1'", "hunter2", "select 1", id="string-flag"),
    pytest.param("deploy --token t0k3n web", "t0k3n", "web", id="string-token"),
    pytest.param("deploy --api-key k3y web", "k3y", "web", id="string-api-key"),
    pytest.param("deploy --client-secret\tk3y web", "k3y", "web", id="string-tab"),
    pytest.param("deploy --password 'hunter 2' web", "hunter", "web", id="string-flag-quoted"),
    pytest.param('deploy --password "hunter 2" web', "hunter", "web", id="string-flag-dquoted"),
    pytest.param('deploy --password="hunter 2" web', "hunter", "web", id="string-named-quoted"),
    pytest.param("deploy '--password=hunter 2' web", "hunter", "web", id="string-quoted-pair"),
    pytest.param("PASSWORD=hunter2 ./deploy.sh", "hunter2", "deploy.sh", id="string-env"),
    pytest.param("DB_PASSWORD='hunter 2' ./deploy.sh", "hunter", "deploy.sh", id="string-env-quoted"),
    pytest.param("helm upgrade web --set db.password=hunter2", "hunter2", "helm", id="string-set"),
    pytest.param(["deploy", "--token", "t0k3n"], "t0k3n", "deploy", id="argv-token"),
    pytest.param(["deploy", "--password=hunter 2"], "hunter", "deploy", id="argv-named-space"),
    pytest.param(["env", "PASSWORD=hunter2", "run"], "hunter2", "run", id="argv-env"),
    pytest.param(["sh", "-c", "mysql --password hunter2"], "hunter2", "mysql", id="argv-shell"),
])
def test_masking_hides_secret_values(command, hidden, kept) -> None:
    shown = json.dumps(masked(command))
    assert hidden not in shown and kept in shown and "***" in shown


@pytest.mark.parametrize("command", [
    pytest.param("deploy --token-ttl 5m --user alice web", id="no-secret"),
    pytest.param("deploy --password hunter2 web", id="secret"),
    pytest.param(["deploy", "--password", "hunter2"], id="argv"),
])
def test_masking_is_idempotent(command) -> None:
    assert masked(masked(command)) == masked(command)


def test_masking_keeps_the_rest_of_the_command_line_as_written() -> None:
    assert masked("mysql  --password hunter2 -e 'select 1'") == "mysql  --password *** -e 'select 1'"
    assert masked("deploy --password 'hunter 2' --user alice") == "deploy --password *** --user alice"
    assert masked("deploy --password=hunter2") == "deploy --password=***"
    assert masked("deploy '--password=hunter 2' x") == "deploy --password=*** x"
    assert masked(["deploy", "--password", "hunter2", "--user", "alice"]) == [
        "deploy", "--password", "***", "--user", "alice"]


async def test_a_secret_in_the_command_is_never_shown_but_the_hash_binds_it(client):
    """The hash is over the exact command; every view of the ticket (the requester's 201, a
    read, the list) shows the command with its secret values masked, and the store keeps
    only that form."""
    line = "mysql --host db --password hunter2 -e 'select 1'"
    alice = await login(client, "alice")
    created = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": RESOURCE, "command": line})
    assert created.status == 201, await created.text()
    ticket = await created.json()
    assert ticket["command_hash"] == command_hash(line)
    assert ticket["command"] == "mysql --host db --password *** -e 'select 1'"
    read = await (await client.get(f"/api/v1/approvals/{ticket['id']}",
                                   headers=bearer(alice))).text()
    listed = await (await client.get("/api/v1/approvals", headers=bearer(alice))).text()
    assert "hunter2" not in read and "hunter2" not in listed and "--password ***" in read
    stored = await client.server.app[STORE].require().get_ticket(ticket["id"])
    assert stored is not None and "hunter2" not in json.dumps(stored.command)


async def test_the_command_is_stored_shown_and_its_hash_derived(client):
    alice = await login(client, "alice")
    created = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": RESOURCE, "command": ARGV})
    assert created.status == 201, await created.text()
    ticket = await created.json()
    assert ticket["command"] == ARGV
    assert ticket["command_hash"] == command_hash(ARGV)
    read = await (await client.get(f"/api/v1/approvals/{ticket['id']}",
                                   headers=bearer(alice))).json()
    assert read["command"] == ARGV
    listed = await (await client.get("/api/v1/approvals", headers=bearer(alice))).json()
    assert listed["items"][0]["command"] == ARGV


async def test_a_ticket_without_command_shows_null(client):
    alice = await login(client, "alice")
    created = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": RESOURCE})
    ticket = await created.json()
    assert ticket["command"] is None and ticket["command_hash"] is None


async def test_a_hash_that_does_not_match_the_command_is_refused(client):
    alice = await login(client, "alice")
    response = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": RESOURCE, "command": "helm upgrade web",
        "command_hash": command_hash("helm upgrade evil")})
    problem = await assert_problem(response, 422, "command_hash_mismatch")
    assert problem["errors"][0]["pointer"] == "/command_hash"
    matching = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": RESOURCE, "command": "helm upgrade web",
        "command_hash": command_hash("helm upgrade web")})
    assert matching.status == 201, await matching.text()


async def test_agents_must_send_the_command_text(client):
    agent = await login(client, "agent-7")
    body = {"subject_id": "agent-7", "env": "prod", "action": "installer.run.execute",
            "resource": RESOURCE}
    only_hash = await client.post("/api/v1/approvals", headers=bearer(agent), json={
        **body, "command_hash": command_hash("deploy web")})
    problem = await assert_problem(only_hash, 422, "command_required")
    assert problem["errors"][0]["pointer"] == "/command"
    with_text = await client.post("/api/v1/approvals", headers=bearer(agent),
                                  json={**body, "command": "deploy web"})
    assert with_text.status == 201, await with_text.text()
    assert (await with_text.json())["command"] == "deploy web"


async def test_a_malformed_command_is_a_schema_error(client):
    alice = await login(client, "alice")
    for command in ([], ["ok", 3], "", {"argv": ["x"]}):  # one app for the whole table
        response = await client.post("/api/v1/approvals", headers=bearer(alice), json={
            "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
            "resource": RESOURCE, "command": command})
        problem = await assert_problem(response, 422, "schema_validation_failed")
        assert problem["errors"][0]["pointer"].startswith("/command"), command


async def test_a_ticket_where_no_approval_is_needed_is_refused(client):
    alice = await step_up(client, await login(client, "alice"), "alice")
    for env in ("dev", "staging"):
        response = await client.post("/api/v1/approvals", headers=bearer(alice), json={
            "subject_id": "alice", "env": env, "action": "installer.run.execute",
            "resource": RESOURCE})
        problem = await assert_problem(response, 422, "approval_not_required")
        assert problem["errors"][0]["pointer"] == "/env"
    pending = await (await client.get("/api/v1/approvals?state=pending",
                                      headers=bearer(alice))).json()
    assert pending["items"] == []  # nothing waits in the approvers' queue
