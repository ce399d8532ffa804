"""Seeing a policy change before it ships: the decision log with inputs, replay of it against a
candidate revision, and shadow evaluation of a candidate in the running service."""

from __future__ import annotations

import io
import itertools
import json
import shutil
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from service.appkeys import ENGINE, SHADOW
from service.authz import actions
from service.authz.decisionlog import MASK, DecisionLog, read_records
from service.authz.engine import PolicyEngine
from service.cli.policy import run
from tests.auth import bearer, login
from tests.authz.conftest import REPO, doc

SUBJECTS = (("alice", "human"), ("bob", "human"), ("carol", "human"), ("erin", "human"),
            ("ci-bot", "service"), ("agent-7", "agent"))
ENVS = ("dev", "staging", "prod")


def candidate_without_carols_role(root: Path) -> Path:
    """The shipped policies with one role binding revoked: carol loses `viewer`."""
    shutil.copytree(REPO / "policies", root, ignore=shutil.ignore_patterns("compose"))
    bindings = root / "data" / "bindings.yaml"
    text = bindings.read_text()
    assert "  carol: {roles: [viewer]}\n" in text
    bindings.write_text(text.replace("  carol: {roles: [viewer]}\n", "  carol: {roles: []}\n"))
    return root


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[dict, str]]]:
    """1,000 decisions of the shipped revision, logged with their inputs (rotated files)."""
    tmp = tmp_path_factory.mktemp("log")
    live = PolicyEngine(REPO / "policies")
    assert live.load().ok
    sink = DecisionLog(tmp / "decisions.jsonl", max_bytes=200_000, backups=20)
    sink.start()
    combos = itertools.cycle(itertools.product(SUBJECTS, sorted(actions.ACTIONS), ENVS))
    made: list[tuple[dict, str]] = []
    for n in range(1000):
        (subject, kind), action, env = next(combos)
        d = doc(subject=subject, kind=kind, action=action, env=env)
        d["context"]["correlation_id"] = f"corr-{n}"
        d["context"]["api_token"] = "never-logged"
        decision = live.decide(d)
        sink.record(d, decision)
        made.append((d, decision.decision))
    sink.close()
    assert sink.written == 1000 and sink.dropped == 0
    return tmp / "decisions.jsonl", made


def call(*argv: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run(list(argv), out, err)
    return code, out.getvalue() + err.getvalue()


def test_the_decision_log_keeps_masked_inputs_and_rotates(recorded):
    path, made = recorded
    assert path.with_name("decisions.jsonl.1").exists()  # rotated at 200 kB
    records = [r for _, r in read_records(path)]
    assert len(records) == 1000
    assert [r["correlation_id"] for r in records] == [f"corr-{n}" for n in range(1000)]
    first = records[0]
    assert first["input"]["context"]["api_token"] == MASK
    assert "never-logged" not in path.read_text() + path.with_name("decisions.jsonl.1").read_text()
    assert first["result"]["decision"] == made[0][1] and first["revision"].startswith("sha256:")
    assert first["decision_id"] and first["ts"]


def test_replay_lists_exactly_the_decisions_a_revoked_role_changes(recorded, tmp_path):
    path, made = recorded
    candidate = candidate_without_carols_role(tmp_path / "candidate")
    out = io.StringIO()
    code = run(["replay", "--log", str(path), "--policies", str(candidate), "--format", "json"],
               out, io.StringIO())
    report = json.loads(out.getvalue())
    assert code == 1  # changes, and no --expect file lists them
    # Independent oracle: carol's decisions that were not already deny, and nothing else.
    expected = {d["context"]["correlation_id"] for d, result in made
                if d["principal"]["subject_id"] == "carol" and result != "deny"}
    assert expected and report["total"] == 1000
    changed = {c["ref"] for c in report["changes"]}
    refs = {r["decision_id"]: r["correlation_id"] for _, r in read_records(path)}
    assert {refs[c] for c in changed} == expected
    assert set(report["groups"]) == {"allow->deny"}
    assert report["groups"]["allow->deny"]["count"] == len(expected)
    assert all(c["candidate"]["reasons"] == ["no_grant"] for c in report["changes"])

    expect = tmp_path / "expect.yaml"
    expect.write_text(yaml.safe_dump({"expect": [
        {"transition": "allow->deny", "subject": "carol", "count": len(expected)}]}))
    code, text = call("replay", "--log", str(path), "--policies", str(candidate),
                      "--expect", str(expect))
    assert code == 0, text
    assert f"allow->deny: {len(expected)}" in text and "UNEXPECTED" not in text

    expect.write_text(yaml.safe_dump({"expect": [{"transition": "allow->deny",
                                                  "subject": "alice"}]}))
    code, text = call("replay", "--log", str(path), "--policies", str(candidate),
                      "--expect", str(expect), "--format", "junit")
    assert code == 1 and "<failure" in text


def test_replay_since_cases_and_audit_records(recorded, tmp_path):
    path, _ = recorded
    candidate = candidate_without_carols_role(tmp_path / "candidate")
    code, text = call("replay", "--log", str(path), "--since", "2999-01-01T00:00:00Z",
                      "--policies", str(candidate))
    assert code == 0 and "0 decisions replayed" in text
    code, text = call("replay", "--cases", str(REPO / "examples" / "decisions"),
                      "--policies", str(candidate))
    assert code == 1 and "allow->deny" in text and "carol" in text
    audit = tmp_path / "audit.jsonl"
    entry = {"principal": {"subject_id": "carol", "kind": "human", "session_id": "s"},
             "action": "storage.list", "env": "prod", "resource_kind": "inventory",
             "decision": {"result": "allow", "reasons": ["role:viewer"], "decision_id": "d-1"}}
    audit.write_text(json.dumps({"seq": 1, "entry": entry}) + "\n")
    code, text = call("replay", "--audit", str(audit), "--policies", str(candidate))
    assert code == 1 and "approximate input" in text and "d-1" in text


def test_replay_refuses_unreadable_sources(tmp_path):
    bad = tmp_path / "log.jsonl"
    bad.write_text('{"result": {"decision": "allow"}, "input": {}}\nnot json\n')
    code, text = call("replay", "--log", str(bad), "--policies", str(REPO / "policies"))
    assert code == 2 and "log.jsonl:2: not a JSON line" in text
    code, text = call("replay", "--policies", str(REPO / "policies"))
    assert code == 2 and "--log" in text


async def _metric(client, live: str, candidate: str) -> float:
    response = await client.get("/metrics")
    total = 0.0
    for family in text_string_to_metric_families(await response.text()):
        if family.name == "controlplane_policy_shadow_divergence":
            for s in family.samples:
                if s.name.endswith("_total") and s.labels == {"live": live,
                                                              "candidate": candidate}:
                    total += s.value
    return total


async def test_shadow_counts_exactly_the_diverging_requests(make_client, tmp_path):
    candidate = candidate_without_carols_role(tmp_path / "candidate")
    log_path = tmp_path / "decisions.jsonl"
    client = await make_client({"policies": {"candidate_dir": str(candidate)},
                                "decision_log": {"path": str(log_path)}})
    app = client.server.app
    shadow = app[SHADOW]
    assert shadow.wait_idle(30)
    carol, alice = await login(client, "carol"), await login(client, "alice")
    for _ in range(3):
        for token in (carol, alice):
            response = await client.get("/api/v1/storage/objects", headers=bearer(token))
            assert response.status == 200  # the live decision serves, whatever the candidate
    assert shadow.wait_idle(30)
    assert await _metric(client, "allow", "deny") == 3.0  # carol's three reads, not alice's
    status = await (await client.get("/api/v1/authz/status")).json()
    assert status["shadow"]["revision"] != app[ENGINE].revision
    assert status["shadow"]["state"] == "ready"
    assert status["shadow"]["evaluated"] == 6 and status["shadow"]["diverged"] == 3
    assert status["shadow"]["divergences"] == {"allow->deny": 3}
    assert status["decision_log"]["dropped"] == 0


async def test_a_broken_candidate_never_affects_serving(make_client, tmp_path):
    candidate = tmp_path / "candidate"
    shutil.copytree(REPO / "policies", candidate, ignore=shutil.ignore_patterns("compose"))
    (candidate / "authz.rego").write_text("package controlplane.authz\ndecision := {\n")
    client = await make_client({"policies": {"candidate_dir": str(candidate)}})
    shadow = client.server.app[SHADOW]
    assert shadow.wait_idle(30)
    carol = await login(client, "carol")
    assert (await client.get("/api/v1/storage/objects", headers=bearer(carol))).status == 200
    assert shadow.wait_idle(30)
    status = await (await client.get("/api/v1/authz/status")).json()
    assert status["status"] == "ready" and status["shadow"]["state"] == "rejected"
    assert "authz.rego" in status["shadow"]["error"]
    assert status["shadow"]["evaluated"] == 0
