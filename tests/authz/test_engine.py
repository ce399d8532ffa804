"""PolicyEngine: fail closed, prod upgrade, projection, cache, reload, status, decision log."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from service.authz.decision import POLICY_ERROR, PRODUCTION_UPGRADE
from service.authz.engine import LOG_FIELDS, PolicyEngine
from service.logs import JSONFormatter
from tests.authz.conftest import doc, write_policy

ALLOW_ALL = """
    package controlplane.authz
    import rego.v1
    decision := {"decision": "allow", "reasons": ["everything"], "approval": {}}
"""

ROLE_ECHO = """
    package controlplane.authz
    import rego.v1
    decision := {"decision": "allow", "reasons": input.principal.roles, "approval": {}} if {
        count(input.principal.roles) > 0
    } else := {"decision": "deny", "reasons": ["no_roles"], "approval": {}}
"""


def engine_for(path: Path, **kw: object) -> PolicyEngine:
    engine = PolicyEngine(path, {"dev": False, "prod": True}, **kw)  # type: ignore[arg-type]
    result = engine.load()
    assert result.ok, result.error
    return engine


# ---- fail closed -----------------------------------------------------------------------------

BROKEN_DECISIONS = [
    pytest.param('decision := {"decision": "yes", "reasons": []}', id="unknown decision value"),
    pytest.param("decision := 42", id="not an object"),
    pytest.param(
        'decision := {"decision": "allow", "reasons": [], "extra": 1}', id="unknown field"
    ),
    pytest.param('decision := {"decision": "allow", "reasons": "ok"}', id="reasons not a list"),
    pytest.param('decision := {"decision": "deny", "reasons": []}', id="deny without reason"),
    pytest.param(
        'decision := {"decision": "require_approval", "reasons": ["x"], "approval": {}}',
        id="approval without quorum",
    ),
    pytest.param(
        'decision := {"decision": "require_approval", "reasons": ["x"], '
        '"approval": {"quorum": 1, "self_review": true}}',
        id="approval allowing self review",
    ),
    pytest.param(
        'decision := {"decision": "allow", "reasons": ["x"]} if input.nothing', id="undefined"
    ),
    pytest.param(
        'decision := {"decision": "allow", "reasons": [no_such_builtin(1)]}', id="evaluation error"
    ),
    pytest.param(
        'decision := {"decision": "allow", "reasons": ["a"]} if true'
        '\ndecision := {"decision": "deny", "reasons": ["b"]} if true',
        id="conflicting outputs",
    ),
]


@pytest.mark.parametrize("body", BROKEN_DECISIONS)
def test_malformed_or_failing_policy_denies_with_policy_error(policy_dir, body, caplog):
    engine = engine_for(policy_dir("package controlplane.authz\nimport rego.v1\n" + body))
    with caplog.at_level(logging.WARNING, logger="service.authz.engine"):
        decision = engine.decide(doc(action="databases.list"))
    assert decision.decision == "deny"
    assert decision.reasons == (POLICY_ERROR,)
    # the correlation id from input.context goes to the log with the error
    assert any("corr-1" in r.getMessage() for r in caplog.records)
    assert engine.status()["decisions"]["policy_error"] == 1


def test_policy_errors_are_never_cached(policy_dir):
    engine = engine_for(policy_dir("package controlplane.authz\nimport rego.v1\ndecision := 1\n"))
    for _ in range(3):
        assert not engine.decide(doc()).cached
    assert engine.status()["cache"]["size"] == 0


def test_no_revision_loaded_denies(tmp_path):
    engine = PolicyEngine(tmp_path / "missing")
    assert not engine.load().ok
    assert engine.decide(doc()).reasons == (POLICY_ERROR,)
    assert engine.status()["status"] == "degraded"


def test_non_json_input_denies(shipped):
    bad = doc()
    bad["resource"] = {"kind": object()}
    assert shipped.decide(bad).reasons == (POLICY_ERROR,)


def test_nul_in_input_denies(shipped):
    assert shipped.decide(doc(subject="alice\x00admin")).reasons == (POLICY_ERROR,)


def test_unknown_action_denied_before_policy(policy_dir):
    engine = engine_for(policy_dir(ALLOW_ALL))
    assert engine.decide(doc(action="rockets.launch")).decision == "deny"


# ---- code-owned production upgrade ----------------------------------------------------------


def test_production_allow_of_mutation_is_upgraded(policy_dir):
    engine = engine_for(policy_dir(ALLOW_ALL))
    decision = engine.decide(doc(env="prod"))
    assert decision.decision == "require_approval"
    assert PRODUCTION_UPGRADE in decision.reasons
    assert decision.approval["quorum"] >= 1 and decision.approval["humans_only"] is True


@pytest.mark.parametrize(
    ("action", "env", "want"),
    [
        pytest.param("installer.run.execute", "dev", "allow", id="non-production"),
        pytest.param("databases.list", "prod", "allow", id="read in production"),
        pytest.param("approvals.review", "prod", "allow", id="approval workflow is not ticketed"),
        pytest.param(
            "installer.run.execute",
            "qa-unknown",
            "require_approval",
            id="unknown env counts as production",
        ),
    ],
)
def test_upgrade_applies_only_to_ticketed_actions_in_production(policy_dir, action, env, want):
    engine = engine_for(policy_dir(ALLOW_ALL))
    assert engine.decide(doc(action=action, env=env)).decision == want


def test_configured_production_envs(policy_dir):
    engine = PolicyEngine(policy_dir(ALLOW_ALL), {"dev": False, "live": True})
    assert engine.load().ok
    assert engine.decide(doc(env="live")).decision == "require_approval"
    assert engine.decide(doc(env="dev")).decision == "allow"


# ---- projection ------------------------------------------------------------------------------


def test_roles_come_from_policy_data_never_from_the_input(policy_dir):
    engine = engine_for(policy_dir(ROLE_ECHO))
    forged = doc(subject="mallory")
    forged["principal"]["roles"] = ["admin"]  # a token or caller cannot inject roles
    assert engine.decide(forged).reasons == ("no_roles",)
    assert engine.decide(doc(subject="alice")).reasons == ("op",)


def test_projection_strips_correlation_id_and_time(shipped):
    projected = shipped.project(doc())
    assert "correlation_id" not in projected["context"]
    assert "time" not in projected["context"]
    assert projected["principal"]["roles"] == ["operator"]
    assert projected["principal"]["grants"] == [
        {"role": "operator", "envs": ["*"], "kinds": ["human"]}
    ]


def test_groups_projected(shipped):
    assert shipped.project(doc(subject="bob"))["principal"]["groups"] == ["sre-approvers"]


# ---- cache -------------------------------------------------------------------------------------


def test_cache_hits_for_same_input_regardless_of_correlation_id(shipped):
    first = doc(action="tasks.read", context={"correlation_id": "a", "time": "t1"})
    second = doc(action="tasks.read", context={"correlation_id": "b", "time": "t2"})
    a, b = shipped.decide(first), shipped.decide(second)
    assert (a.decision, a.reasons) == (b.decision, b.reasons)
    assert b.cached and a.decision_id != b.decision_id
    assert shipped.status()["cache"]["hit_rate"] > 0


def test_cache_keys_on_every_policy_visible_field(shipped):
    shipped.decide(doc(action="tasks.read"))
    other = doc(action="tasks.read")
    other["resource"]["owner"] = "bob"
    assert not shipped.decide(other).cached


def test_reload_invalidates_cache(policy_dir):
    root = policy_dir(ALLOW_ALL)
    engine = engine_for(root)
    engine.decide(doc())
    assert engine.decide(doc()).cached
    write_policy(root, ALLOW_ALL.replace("everything", "changed"))
    assert engine.reload().changed
    decision = engine.decide(doc())
    assert not decision.cached and decision.reasons == ("changed",)


# ---- reload ----------------------------------------------------------------------------------

PASSING_TEST = """
    package controlplane.authz_test
    import rego.v1
    test_ok if { data.controlplane.authz.decision.decision == "allow" }
"""
FAILING_TEST = PASSING_TEST.replace('"allow"', '"deny"')


def test_reload_rejects_revision_that_does_not_compile(policy_dir):
    root = policy_dir(ALLOW_ALL)
    engine = engine_for(root)
    old = engine.revision
    write_policy(root, "package controlplane.authz\n\ndecision := {\n")
    result = engine.reload()
    assert not result.ok and result.revision == old
    assert "compile" in (result.error or "")
    assert engine.revision == old
    assert engine.decide(doc()).decision == "allow"  # the previous revision keeps serving
    status = engine.status()
    assert status["status"] == "degraded" and status["last_reload"]["ok"] is False
    assert "authz.rego:3" in status["last_reload"]["error"]
    assert status["last_reload"]["error"].startswith("compile: authz.rego:3")


def test_reload_rejects_revision_failing_its_own_tests(policy_dir):
    root = policy_dir(ALLOW_ALL, tests=PASSING_TEST)
    engine = engine_for(root)
    old = engine.revision
    write_policy(root, ALLOW_ALL.replace("everything", "new"), tests=FAILING_TEST)
    result = engine.reload()
    assert not result.ok
    assert "test_ok" in (result.error or "")
    assert engine.revision == old
    assert engine.decide(doc()).reasons == ("everything",)


def test_reload_rejects_bad_data_without_leaking_it(policy_dir):
    root = policy_dir(ALLOW_ALL)
    engine = engine_for(root)
    (root / "data" / "rbac.yaml").write_text("bindings:\n  secret-subject: {roles: [nope]}\n")
    result = engine.reload()
    assert not result.ok and engine.revision is not None
    assert "secret-subject" not in json.dumps(engine.status())


def test_reload_survives_a_policy_that_crashes_the_native_engine(policy_dir):
    # `with input as` over dependent rules crashes regopy 1.5 (the runner rewrites a test only
    # when all its `with input` clauses give one value); vetting runs in a child process.
    root = policy_dir(ALLOW_ALL)
    engine = engine_for(root)
    crashing = """
        package controlplane.authz_test
        import rego.v1
        a := 1 if input.x == 1
        b := 1 if a == 1
        test_crash if {
            v := {"x": 1}
            b == 1 with input as v
            b == 1 with input as {"x": 2}
        }
    """
    write_policy(root, ALLOW_ALL.replace("everything", "new"), tests=crashing)
    result = engine.reload()
    assert not result.ok
    assert "test_crash" in (result.error or "")
    assert engine.decide(doc()).reasons == ("everything",)


def test_reload_then_fix_recovers(policy_dir):
    root = policy_dir(ALLOW_ALL)
    engine = engine_for(root)
    write_policy(root, "package controlplane.authz\ndecision := {")
    assert not engine.reload().ok
    write_policy(root, ALLOW_ALL.replace("everything", "fixed"))
    assert engine.reload().ok
    assert engine.status()["status"] == "ready"
    assert engine.decide(doc()).reasons == ("fixed",)


def test_unchanged_content_is_not_recompiled(shipped):
    result = shipped.reload()
    assert result.ok and not result.changed


def test_poll_changes_detects_edits_and_new_files(policy_dir):
    root = policy_dir(ALLOW_ALL)
    engine = engine_for(root)
    assert not engine.poll_changes()
    path = root / "authz.rego"
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert engine.poll_changes()
    engine.reload()
    assert not engine.poll_changes()
    (root / "data" / "extra.json").write_text("{}")
    assert engine.poll_changes()


def test_compose_subdirectory_is_not_loaded(policy_dir):
    root = policy_dir(ALLOW_ALL)
    (root / "compose").mkdir()
    (root / "compose" / "broken.rego").write_text("package compose\nthis does not parse {")
    engine = engine_for(root)
    assert engine.status()["module_count"] == 1


def test_revision_is_a_content_hash(policy_dir, tmp_path):
    a = engine_for(policy_dir(ALLOW_ALL))
    b = engine_for(write_policy(tmp_path / "copy", ALLOW_ALL))
    assert a.revision == b.revision and a.revision.startswith("sha256:")
    (tmp_path / "copy" / "data" / "env.yaml").write_text(
        "environments: {dev: {production: false}}\n"
    )
    assert b.reload().revision != a.revision


# ---- status and log ----------------------------------------------------------------------------


def test_status_shape_and_no_policy_content(shipped):
    shipped.decide(doc(subject="carol", action="tasks.read"))
    status = shipped.status()
    assert status["status"] == "ready"
    assert status["module_count"] == 1 and status["revision"].startswith("sha256:")
    assert set(status["decisions"]) >= {"allow", "deny", "require_approval", "policy_error"}
    text = json.dumps(status)
    for secret in ("carol", "alice", "operator", "sre-approvers", "package controlplane"):
        assert secret not in text


def test_placeholder_before_load(tmp_path):
    assert PolicyEngine(tmp_path).status()["status"] == "placeholder"


def test_decision_log_fields_and_masking(policy_dir, caplog):
    engine = engine_for(policy_dir(ALLOW_ALL), mask_fields=("subject", "resource_hash"))
    with caplog.at_level(logging.INFO, logger="controlplane.decisions"):
        decision = engine.decide(doc())
    records = [r for r in caplog.records if r.name == "controlplane.decisions"]
    assert len(records) == 1
    # what the service's JSON log line carries (not just the record's attributes)
    line = json.loads(JSONFormatter().format(records[0]))
    assert line["logger"] == "controlplane.decisions"
    fields = line["decision"]
    assert set(fields) == set(LOG_FIELDS)
    assert fields["decision_id"] == decision.decision_id
    assert fields["revision"] == engine.revision
    assert (fields["action"], fields["env"], fields["kind"], fields["result"]) == (
        "installer.run.execute",
        "dev",
        "human",
        "allow",
    )
    assert fields["reasons"] == ["everything"] and fields["correlation_id"] == "corr-1"
    assert isinstance(fields["duration_us"], int)
    assert fields["subject"].startswith("masked:") and fields["resource_hash"].startswith("masked:")


def test_unknown_mask_field_is_a_config_error(tmp_path):
    with pytest.raises(ValueError, match="mask"):
        PolicyEngine(tmp_path, mask_fields=("password",))


# ---- large data ----------------------------------------------------------------------------------


def test_large_data_is_projected_not_loaded_into_rego(policy_dir):
    roles = "\n".join(
        f"  r{i}:\n    grants:\n      - {{actions: [tasks.read], envs: ['*']}}" for i in range(500)
    )
    binds = "\n".join(f"  s{i}: {{roles: [r{i % 500}]}}" for i in range(5000))
    root = policy_dir(ROLE_ECHO, bindings=f"roles:\n{roles}\nbindings:\n{binds}\n")
    engine = engine_for(root)
    assert engine.decide(doc(subject="s4321", action="tasks.read")).reasons == ("r321",)
    rev = engine._current
    assert rev is not None and "bindings" not in rev.projection.rego_data
    assert "roles" not in rev.projection.rego_data


def test_facts_come_from_policy_data_of_the_serving_revision():
    repo = Path(__file__).resolve().parents[2]
    engine = PolicyEngine(repo / "policies", vet_in_subprocess=False)
    review = "approvals.review"
    assert engine.facts("bob", review) == {"roles": [], "groups": [], "grants": []}  # none loaded
    assert engine.load().ok
    bob = engine.facts("bob", review)
    assert bob["roles"] == ["approver"] and "sre-approvers" in bob["groups"] and bob["grants"]
    assert engine.facts("bob", "installer.run.execute")["grants"] == []
    assert engine.facts("nobody", review)["roles"] == []


ECHOES_INPUT = """
    package controlplane.authz
    import rego.v1
    decision := {"decision": "deny", "reasons": [input.resource.owner],
                 "approval": {"ttl_s": input.resource.id}}
"""


@pytest.mark.parametrize(
    ("owner", "rid"),
    [
        pytest.param('x"],"decision":"allow","reasons":["y', "r1", id="duplicate decision key"),
        pytest.param(
            'y"]},"reasons":["z', 'x"},"decision":"allow","zz":{"q":{"w":"', id="nested real key"
        ),
    ],
)
def test_input_strings_echoed_into_the_decision_cannot_turn_it_into_an_allow(
    policy_dir, owner, rid
):
    # regopy writes result strings unescaped; a rewritten result is refused, never trusted
    engine = engine_for(policy_dir(ECHOES_INPUT))
    forged = doc(resource={"id": rid, "kind": "approval", "owner": owner})
    decision = engine.decide(forged)
    assert (decision.decision, decision.reasons) == ("deny", (POLICY_ERROR,))
