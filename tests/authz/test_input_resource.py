"""Policies see the request they decide about: ``input.resource.value`` (DESIGN.md section 4).

A held-out candidate policy with one rule on the resource's version decides the same in every
place a policy runs: ``cpctl policy eval`` (and ``policy test``), the running service, the
decision log replayed by ``cpctl policy replay``, and shadow evaluation of the same candidate.
(In tests/conftest.py's IN_PROCESS_VETTING: the app vets revisions in-process, as the other app
tests do.)
"""

from __future__ import annotations

import asyncio
import io
import json
import textwrap
from pathlib import Path
from typing import Any

from service.authz.decisionlog import DECISION_LOG, MASK, read_records
from service.authz.shadow import SHADOW
from service.cli.policy import run
from tests.auth import bearer, login
from tests.authz.conftest import write_policy

#: A policy an author writes from policies/README.md: pre-release versions are denied outside
#: prod (prod mutations are ticketed whatever the policy says), everything else is allowed.
PRERELEASE = """\
    package controlplane.authz

    import rego.v1

    decision := {"decision": "deny", "reasons": ["pre_release"], "approval": {}} if {
        input.action == "installer.run.execute"
        regex.match(`-(rc|beta)`, input.resource.value.version)
    } else := {"decision": "allow", "reasons": ["ok"], "approval": {}}
"""

TESTS = """\
    package controlplane.authz_test

    import rego.v1

    rc := {"principal": {"subject_id": "alice", "kind": "human"},
           "action": "installer.run.execute",
           "resource": {"id": "t-1", "kind": "installer_run", "hash": null,
                        "value": {"app": "web", "version": "3.0.0-rc"}},
           "env": "dev", "context": {}}

    test_rc_is_denied if {
        data.controlplane.authz.decision.reasons == ["pre_release"] with input as rc
    }
"""


def call(*argv: str) -> tuple[int, str]:
    """Exit code and stdout (stderr carries the policies header of the offline verbs)."""
    out, err = io.StringIO(), io.StringIO()
    code = run(list(argv), out, err)
    return code, out.getvalue() if code in (0, 1) else out.getvalue() + err.getvalue()


def _author(root: Path) -> Path:
    return write_policy(root, PRERELEASE, tests=TESTS)


async def _logged(client: Any, count: int) -> None:
    sink = client.server.app[DECISION_LOG]
    for _ in range(500):
        if sink.written >= count and sink.status()["queued"] == 0:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("decision log did not catch up")


async def test_a_rule_on_the_resource_version_decides_the_same_offline_live_replayed_and_shadowed(
        make_client, tmp_path):
    policies = _author(tmp_path / "policies")
    # Offline: the author's own test passes, and eval of a case file decides the same.
    code, text = call("test", str(policies))
    assert code == 0, text
    case = tmp_path / "rc.json"
    code, text = call("case", "new", "--subject", "alice", "--kind", "human",
                      "--action", "installer.run.execute", "--env", "dev", "--policies",
                      str(policies), "--resource", '{"app": "web", "version": "3.0.0-rc"}',
                      "--out", str(case))
    assert code == 0, text
    code, text = call("eval", "--input", str(case), "--policies", str(policies))
    assert code == 0, text
    offline = json.loads(text)
    assert (offline["decision"], offline["reasons"]) == ("deny", ["pre_release"])

    # Live: a service serving the policy without the rule reloads the author's revision (and
    # shadows it as its candidate).
    served = write_policy(tmp_path / "served", PRERELEASE.replace("-(rc|beta)", "-never-"))
    log_path = tmp_path / "decisions.jsonl"
    client = await make_client({"policies": {"dir": str(served), "reload_interval_s": 0.2,
                                             "candidate_dir": str(policies)},
                                "decision_log": {"path": str(log_path)}})
    write_policy(served, PRERELEASE, tests=TESTS)
    for _ in range(300):
        status = await (await client.get("/api/v1/authz/status")).json()
        if status["revision"] == offline["revision"]:
            break
        await asyncio.sleep(0.1)
    assert status["revision"] == offline["revision"], status  # the revision eval decided with
    assert client.server.app[SHADOW].wait_idle(30)
    alice = await login(client, "alice")
    answers = {}
    for n, version in enumerate(("3.0.0-rc", "3.0.0", "3.1.0-beta.2")):
        response = await client.post("/api/v1/installer/actions", headers=bearer(alice), json={
            "task_id": f"t-{n}", "env": "dev", "action": "installer.run.execute",
            "resource": {"app": "web", "version": version, "password": "hunter2"}})
        answers[version] = response.status
        if response.status == 403:
            assert (await response.json())["reasons"] == ["pre_release"]
    assert answers == {"3.0.0-rc": 403, "3.0.0": 202, "3.1.0-beta.2": 403}

    # The decision log holds the resource as sent, masked like every logged input.
    await _logged(client, 3)
    records = [r for _, r in read_records(log_path)]
    values = [r["input"]["resource"]["value"] for r in records]
    assert [v["version"] for v in values] == ["3.0.0-rc", "3.0.0", "3.1.0-beta.2"]
    assert all(v["password"] == MASK for v in values)
    assert "hunter2" not in log_path.read_text()
    assert [r["result"]["decision"] for r in records] == ["deny", "allow", "deny"]

    # Shadow: the candidate (the same revision) agrees with every live decision.
    shadow = client.server.app[SHADOW]
    assert shadow.wait_idle(30)
    status = await (await client.get("/api/v1/authz/status")).json()
    assert status["shadow"]["evaluated"] == 3 and status["shadow"]["diverged"] == 0

    # Replay: the logged decisions replayed against the candidate change nothing.
    code, text = call("replay", "--log", str(log_path), "--policies", str(policies),
                      "--format", "json")
    assert code == 0, text
    report = json.loads(text)
    assert report["total"] == 3 and report["changes"] == []

    # ...and against a candidate without the rule, exactly the two pre-releases change.
    relaxed = write_policy(tmp_path / "relaxed", PRERELEASE.replace("-(rc|beta)", "-never-"))
    code, text = call("replay", "--log", str(log_path), "--policies", str(relaxed),
                      "--format", "json")
    assert code == 1, text
    changed = json.loads(text)["changes"]
    assert sorted(c["transition"] for c in changed) == ["deny->allow", "deny->allow"]


async def test_the_ticket_requirements_see_the_resource(make_client, tmp_path):
    """The second decision of a ticket request (what the ticketed action will need) reads the
    same ``input.resource.value`` as the request that later presents the ticket."""
    policies = write_policy(tmp_path / "policies", textwrap.dedent("""\
        package controlplane.authz

        import rego.v1

        decision := {"decision": "require_approval", "reasons": ["payments"],
                     "approval": {"quorum": 2}} if {
            input.action == "installer.run.execute"
            input.resource.value.app == "payments"
        } else := {"decision": "require_approval", "reasons": ["other"],
                   "approval": {"quorum": 1}} if {
            input.action == "installer.run.execute"
        } else := {"decision": "allow", "reasons": ["ok"], "approval": {}}
    """))
    client = await make_client({"policies": {"dir": str(policies)}})
    alice = await login(client, "alice")
    quorums = {}
    for app in ("payments", "web"):
        response = await client.post("/api/v1/approvals", headers=bearer(alice), json={
            "subject_id": "alice", "env": "dev", "action": "installer.run.execute",
            "resource": {"app": app, "version": "1.0.0"}})
        assert response.status == 201, await response.text()
        quorums[app] = (await response.json())["quorum"]
    assert quorums == {"payments": 2, "web": 1}


#: A policy that reads only the app of a run: distinct versions and task ids share its decisions.
APP_ONLY = """\
    package controlplane.authz

    import rego.v1

    decision := {"decision": "allow", "reasons": ["web"], "approval": {}} if {
        input.resource.value.app == "web"
    } else := {"decision": "deny", "reasons": ["not_web"], "approval": {}}
"""


async def test_the_decision_cache_hits_across_versions_of_one_app(make_client, tmp_path):
    """200 installer runs of one app, 200 distinct versions and task ids: >= 95% cache hits,
    as authz/status reports them; the first run of another app is decided, not served."""
    policies = write_policy(tmp_path / "policies", APP_ONLY)
    client = await make_client({"policies": {"dir": str(policies)}})
    status = await (await client.get("/api/v1/authz/status")).json()
    assert status["cache"]["paths"] == ["resource.value.app"]
    alice = await login(client, "alice")
    for n in range(200):
        response = await client.post("/api/v1/installer/actions", headers=bearer(alice), json={
            "task_id": f"run-{n}", "env": "dev", "action": "installer.run.execute",
            "resource": {"app": "web", "version": f"1.{n}.0"}})
        assert response.status == 202, await response.text()
    cache = (await (await client.get("/api/v1/authz/status")).json())["cache"]
    assert cache["hits"] + cache["misses"] == 200
    assert cache["hit_rate"] >= 0.95, cache
    other = await client.post("/api/v1/installer/actions", headers=bearer(alice), json={
        "task_id": "run-x", "env": "dev", "action": "installer.run.execute",
        "resource": {"app": "payments", "version": "1.0.0"}})
    assert other.status == 403 and (await other.json())["reasons"] == ["not_web"]


async def test_compose_import_gives_the_policy_a_summary_never_the_fields(make_client, tmp_path):
    """compose.import's resource is the whole fields document (its hash covers all of it); the
    policy sees the project name and each service's image, not environment maps or labels."""
    policies = write_policy(tmp_path / "policies", textwrap.dedent("""\
        package controlplane.authz

        import rego.v1

        decision := {"decision": "deny", "reasons": ["untrusted_image"], "approval": {}} if {
            input.action == "compose.import"
            some svc in input.resource.value.services
            startswith(svc.image, "evil/")
        } else := {"decision": "allow", "reasons": ["ok"], "approval": {}}
    """))
    log_path = tmp_path / "decisions.jsonl"
    client = await make_client({"policies": {"dir": str(policies)},
                                "decision_log": {"path": str(log_path)}})
    carol = await login(client, "carol")
    statuses = []
    for image in ("nginx:1.27", "evil/miner:1"):
        response = await client.post("/api/v1/compose/import", headers=bearer(carol), json={
            "env": "dev", "fields": {"name": "shop", "services": {"web": {
                "image": image, "environment": {"API_KEY": "s3cr3t-value", "MODE": "on"}}}}})
        statuses.append(response.status)
    assert statuses == [200, 403]
    await _logged(client, 2)
    values = [r["input"]["resource"]["value"] for _, r in read_records(log_path)]
    assert values == [{"name": "shop", "services": {"web": {"image": "nginx:1.27"}}},
                      {"name": "shop", "services": {"web": {"image": "evil/miner:1"}}}]
    assert "s3cr3t-value" not in log_path.read_text() and "MODE" not in log_path.read_text()
