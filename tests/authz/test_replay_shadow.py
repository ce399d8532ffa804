"""Seeing a policy change before it ships: the decision log with inputs and replay of it against
a candidate revision (shadow evaluation in the running service: tests/authz/test_shadow.py)."""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path

import pytest
import yaml

from service.authz import actions
from service.authz.decisionlog import MASK, DecisionLog, read_records
from service.authz.engine import PolicyEngine
from service.cli.policy import run
from tests.authz.conftest import REPO, candidate_without_carols_role, doc

SUBJECTS = (("alice", "human"), ("bob", "human"), ("carol", "human"), ("erin", "human"),
            ("ci-bot", "service"), ("agent-7", "agent"))
ENVS = ("dev", "staging", "prod")


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
    audit = tmp_path / "audit.jsonl"
    entry = {"principal": {"subject_id": "carol", "kind": "human", "session_id": "s"},
             "action": "storage.list", "env": "prod", "resource_kind": "inventory",
             "time": "3000-01-01T00:00:00Z",
             "decision": {"result": "allow", "reasons": ["role:viewer"], "decision_id": "d-1"}}
    audit.write_text(json.dumps({"seq": 1, "entry": entry}) + "\n")
    out = io.StringIO()
    # --since drops every logged decision (all older) but not the (future) audit record;
    # decision cases have no time and are always replayed.
    code = run(["replay", "--log", str(path), "--since", "2999-01-01T00:00:00Z",
                "--cases", str(REPO / "examples" / "decisions"), "--audit", str(audit),
                "--policies", str(candidate), "--format", "json"], out, io.StringIO())
    report = json.loads(out.getvalue())
    assert code == 1
    cases = len(list((REPO / "examples" / "decisions").rglob("*.yaml")))
    assert report["total"] == cases + 1
    by_source = {c["source"]: c for c in report["changes"]}
    audit_change = by_source["audit.jsonl:1"]
    assert audit_change["exact"] is False and audit_change["ref"] == "d-1"
    assert any(src.startswith("reads/") and c["subject"] == "carol" for src, c in by_source.items())
    assert all(c["subject"] == "carol" for c in report["changes"])


def test_replay_refuses_unreadable_sources(tmp_path):
    bad = tmp_path / "log.jsonl"
    bad.write_text('{"result": {"decision": "allow"}, "input": {}}\nnot json\n')
    code, text = call("replay", "--log", str(bad), "--policies", str(REPO / "policies"))
    assert code == 2 and "log.jsonl:2: not a JSON line" in text
    code, text = call("replay", "--policies", str(REPO / "policies"))
    assert code == 2 and "--log" in text




def test_replay_text_lists_the_unexpected_changes_first(recorded, tmp_path):
    """With --expect, the text report opens with the changes no expectation lists (all of them,
    not --examples per group), before the expected groups."""
    path, made = recorded
    candidate = candidate_without_carols_role(tmp_path / "candidate")
    expect = tmp_path / "expect.yaml"
    expect.write_text(yaml.safe_dump({"expect": [
        {"transition": "allow->deny", "subject": "carol", "action": "storage.*"}]}))
    code, text = call("replay", "--log", str(path), "--policies", str(candidate),
                      "--expect", str(expect), "--examples", "1")
    assert code == 1
    lines = [line for line in text.splitlines() if not line.startswith("policies:")]
    unexpected = [d for d, _ in made if d["principal"]["subject_id"] == "carol"
                  and not d["action"].startswith("storage.")
                  and d["action"] in ("databases.list", "compose.import", "tasks.read",
                                      "approvals.read", "approvals.list", "policy.read")]
    assert lines[1].startswith(f"{len(unexpected)} change(s) not listed in {expect}"), lines[:3]
    listed = lines[2: 2 + len(unexpected)]
    assert all("UNEXPECTED" in line and " carol " in line for line in listed)
    assert not any(" storage.list " in line for line in listed)
    assert lines[2 + len(unexpected)].startswith("  allow->deny:")
