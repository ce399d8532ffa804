"""Stage 2 of the chain on its own (``service.authz.decide``): the input document the stage builds
from a principal, an action and a target, decided by the shipped policies; an engine that fails
answers deny (never an exception, never an allow); a production mutation is never a plain allow
whatever the engine answered; the observers (decision log, shadow evaluation) see a request's
own decisions only, and one that fails changes nothing."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from service.authn.principal import Principal
from service.authz import actions
from service.authz.decide import decide, decide_run, observe
from service.authz.decision import POLICY_ERROR, PRODUCTION_UPGRADE, Decision
from service.authz.engine import PolicyEngine, default_policies_dir
from service.config import Environments
from service.run import Target

NOW = 1_800_000_000.0
WINDOW_S = 300
ENVIRONMENTS = Environments({"dev": False, "staging": False, "prod": True})
INSTALL = actions.get("installer.run.execute")
LIST = actions.get("databases.list")
RESOURCE = {"app": "web", "version": "1.2.3"}
CONTEXT = {"correlation_id": "corr-1", "method": "POST", "path": "/api/v1/installer/actions",
           "command_hash": None, "time": "2027-01-15T08:00:00.000Z"}


def principal(subject: str, *, stepped_up: bool = True, **fields: Any) -> Principal:
    """``subject`` with a password session, stepped up a minute ago (or never)."""
    return Principal(**{"subject_id": subject, "kind": "human", "session_id": "s1",
                        "auth_time": NOW - 600, "authn_method": "password",
                        "step_up_at": NOW - 60 if stepped_up else None, **fields})


def person(subject: str, *, stepped_up: bool = True) -> dict[str, Any]:
    """``subject``'s policy input (``principal``)."""
    return principal(subject, stepped_up=stepped_up).to_input(NOW, WINDOW_S)


def run(engine: PolicyEngine, who: Principal, action: actions.Action, target: Target,
        now: float = NOW, **context: Any) -> Decision:
    """The chain's decision (``decide_run``) with ``CONTEXT``'s request fields."""
    return decide_run(engine, ENVIRONMENTS, who, action, target, now=now,
                      step_up_window_s=WINDOW_S, correlation_id="corr-1",
                      **{"method": CONTEXT["method"], "path": CONTEXT["path"],
                         "command_hash": None, **context})


def on(env: str) -> Target:
    return Target(RESOURCE, env)


@pytest.fixture(scope="module")
def engine() -> PolicyEngine:
    loaded = PolicyEngine(default_policies_dir(), ENVIRONMENTS)
    assert loaded.load().ok
    return loaded


def test_the_shipped_policies_decide_on_the_document_the_stage_builds(engine):
    dev = decide(engine, ENVIRONMENTS, person("alice"), INSTALL, on("dev"), CONTEXT)
    assert dev.decision == "allow" and dev.revision == engine.status()["revision"]
    prod = decide(engine, ENVIRONMENTS, person("alice"), INSTALL, on("prod"), CONTEXT)
    assert prod.decision == "require_approval" and prod.approval["quorum"] >= 1
    viewer = decide(engine, ENVIRONMENTS, person("carol"), INSTALL, on("dev"), CONTEXT)
    assert viewer.decision == "deny" and viewer.reasons
    # A subject the policy data does not know is denied too.
    stranger = decide(engine, ENVIRONMENTS, person("mallory"), LIST, on("dev"), CONTEXT)
    assert stranger.decision == "deny"


def test_an_engine_without_a_revision_fails_closed(tmp_path):
    broken = PolicyEngine(tmp_path / "missing", ENVIRONMENTS)
    assert not broken.load().ok
    for env in ("dev", "prod"):  # prod: a failure is a deny, not a ticket to ask for
        decision = decide(broken, ENVIRONMENTS, person("alice"), INSTALL, on(env), CONTEXT)
        assert (decision.decision, decision.reasons) == ("deny", (POLICY_ERROR,))


def test_a_policy_that_fails_to_evaluate_fails_closed(tmp_path):
    # Loads and serves dev; for prod its two complete rules conflict: an evaluation error.
    root = tmp_path / "policies"
    root.mkdir()
    (root / "authz.rego").write_text(
        "package controlplane.authz\nimport rego.v1\n"
        'decision := {"decision": "allow", "reasons": ["a"], "approval": {}} if input.env == "prod"\n'
        'decision := {"decision": "deny", "reasons": ["b"], "approval": {}} if input.env == "prod"\n'
        'decision := {"decision": "allow", "reasons": ["dev"], "approval": {}} if input.env != "prod"\n')
    failing = PolicyEngine(root, ENVIRONMENTS)
    assert failing.load().ok
    assert decide(failing, ENVIRONMENTS, person("alice"), LIST, on("dev"), CONTEXT).allowed
    decision = decide(failing, ENVIRONMENTS, person("alice"), INSTALL, on("prod"), CONTEXT)
    assert (decision.decision, decision.reasons) == ("deny", (POLICY_ERROR,))


class EngineWithoutTheProductionRule(PolicyEngine):
    """An engine answering a plain allow for everything, the production rule not applied: what
    a decision that did not come from ``PolicyEngine.decide`` could be. The stage must still
    turn a production allow of a ticketed action into ``require_approval``."""

    def decide(self, input_doc: Mapping[str, Any], **_: Any) -> Decision:
        return Decision("allow", ("everything",), revision="unguarded")

    def recall(self, facts: tuple[Any, ...]) -> Decision | None:
        return Decision("allow", ("everything",), revision="unguarded", cached=True)


@pytest.mark.parametrize(("action", "env", "expected"), [
    (INSTALL, "prod", "require_approval"),
    (INSTALL, "dev", "allow"),
    (LIST, "prod", "allow"),  # a read needs no ticket
])
def test_a_production_allow_is_upgraded_whatever_the_engine_answered(action, env, expected):
    unguarded = EngineWithoutTheProductionRule(Path("unused"), ENVIRONMENTS)
    decided = decide(unguarded, ENVIRONMENTS, person("alice"), action, on(env), CONTEXT)
    recalled = run(unguarded, principal("alice", stepped_up=False), action, on(env))  # recall
    for decision in (decided, recalled):
        assert decision.decision == expected
        if expected == "require_approval":
            assert decision.reasons == ("everything", PRODUCTION_UPGRADE)
            assert decision.approval["step_up"] is True


def test_observers_see_the_requests_decisions_only_and_cannot_change_or_fail_them(engine, caplog):
    seen: list[tuple[Mapping[str, Any], Decision]] = []

    def failing(doc: Mapping[str, Any], decision: Decision) -> None:
        raise RuntimeError("observer broke")

    removers = [observe(engine, failing), observe(engine, lambda d, dec: seen.append((d, dec)))]
    try:
        # A what-if question of the workflow (a ticket's requirements) is not a request.
        decide(engine, ENVIRONMENTS, person("alice"), INSTALL, on("prod"), CONTEXT)
        assert seen == []
        with caplog.at_level(logging.ERROR, logger="controlplane.authz"):
            decision = decide(engine, ENVIRONMENTS, person("alice"), INSTALL, on("prod"), CONTEXT,
                              observed=True)
        assert decision.decision == "require_approval"
        [(doc, observed)] = seen
        assert observed is decision
        assert doc["principal"]["subject_id"] == "alice" and doc["env"] == "prod"
        assert doc["action"] == INSTALL.name and doc["resource"]["hash"] == on("prod").hash
        assert doc["context"]["correlation_id"] == "corr-1"
        assert any("decision observer failed" in r.getMessage() for r in caplog.records)
    finally:
        for remove in removers:
            remove()
    decide(engine, ENVIRONMENTS, person("alice"), INSTALL, on("prod"), CONTEXT, observed=True)
    assert len(seen) == 1  # removed: not called again


def test_fields_given_apart_reach_the_observers_and_never_the_policy(engine):
    """The chain gives the correlation id and the time apart from the context: the engine is
    given exactly what ``strip`` would leave of the whole document (the same cache key, the
    same decision), the observers the whole document, with the time formatted."""
    from service.authz import input as authz_input

    seen: list[Mapping[str, Any]] = []
    evaluated: list[Mapping[str, Any]] = []
    remove = observe(engine, lambda doc, _decision: seen.append(doc))
    real = engine.decide

    def spy(doc: Mapping[str, Any], **kwargs: Any) -> Decision:
        evaluated.append(authz_input.strip(doc) if not kwargs.get("stripped") else doc)
        return real(doc, **kwargs)

    engine.decide = spy  # type: ignore[method-assign]
    try:
        context = {k: v for k, v in CONTEXT.items() if k not in ("correlation_id", "time")}
        apart = decide(engine, ENVIRONMENTS, person("alice"), INSTALL, on("prod"), context,
                       observed=True, correlation_id="corr-1", at=1_800_000_000.25)
        whole = decide(engine, ENVIRONMENTS, person("alice"), INSTALL, on("prod"),
                       {**context, "correlation_id": "corr-1",
                        "time": "2027-01-15T08:00:00.250Z"}, observed=True)
    finally:
        engine.decide = real  # type: ignore[method-assign]
        remove()
    assert (apart.decision, apart.reasons, apart.approval) == (
        whole.decision, whole.reasons, whole.approval)
    assert evaluated[0] == evaluated[1]
    assert "correlation_id" not in evaluated[0]["context"]
    assert seen[0] == seen[1]
    assert seen[0]["context"]["correlation_id"] == "corr-1"
    assert seen[0]["context"]["time"] == "2027-01-15T08:00:00.250Z"
    with pytest.raises(ValueError):  # a field both given apart and in the context
        decide(engine, ENVIRONMENTS, person("alice"), INSTALL, on("dev"), CONTEXT,
               correlation_id="corr-2")


def test_the_chains_decision_is_recalled_by_the_facts_of_its_input_and_only_by_them(tmp_path):
    """``decide_run`` answers a question the serving revision answered (a new id, a cache hit)
    without building the input; any fact the input is built from asks again, and so does a
    new revision, a step-up (its age moves with the clock) or a summarised resource."""
    engine = PolicyEngine(default_policies_dir(), ENVIRONMENTS)
    assert engine.load().ok
    carol = principal("carol", stepped_up=False)
    first = run(engine, carol, LIST, Target.collection("databases", "prod"))
    again = run(engine, carol, LIST, Target.collection("databases", "prod"))
    assert (first.decision, first.cached) == ("allow", False)
    assert (again.decision, again.reasons, again.revision, again.cached) == (
        first.decision, first.reasons, first.revision, True)
    assert again.decision_id != first.decision_id
    status = engine.status()
    assert status["cache"]["hits"] == 1 and status["decisions"]["allow"] == 2
    asked = []
    evaluate = engine._evaluate
    engine._evaluate = lambda *a, **k: asked.append(a) or evaluate(*a, **k)  # type: ignore[method-assign]
    for other in (principal("carol", stepped_up=False, session_id="s2"),
                  principal("carol", stepped_up=False, authn_method="oidc"),
                  principal("carol", stepped_up=False, auth_time=NOW - 1)):
        run(engine, other, LIST, Target.collection("databases", "prod"))
    run(engine, carol, LIST, Target.collection("databases", "dev"))
    run(engine, carol, LIST, Target.collection("storage", "prod"))
    run(engine, carol, LIST, Target({"collection": "databases"}, "prod", owner="bob"))
    run(engine, carol, INSTALL, Target.collection("databases", "prod"))
    run(engine, carol, LIST, Target.collection("databases", "prod"), path="/elsewhere")
    run(engine, carol, LIST, Target.collection("databases", "prod"), method="HEAD")
    run(engine, carol, LIST, Target.collection("databases", "prod"), command_hash="sha256:1")
    assert len(asked) == 10
    for _ in range(2):  # never recalled: each asks the engine every time
        run(engine, principal("alice"), LIST, Target.collection("databases", "prod"))
        run(engine, carol, LIST, Target({"collection": "databases"}, "prod",
                                        attributes={"tier": "gold"}))
        run(engine, carol, LIST, Target({"x": 1}, "prod", value={"x": "summary"}))
    assert len(asked) == 16


def test_a_new_revision_forgets_what_was_recalled(tmp_path):
    root = tmp_path / "policies"
    root.mkdir()
    rule = ('package controlplane.authz\nimport rego.v1\n'
            'decision := {{"decision": "{0}", "reasons": ["r"], "approval": {{}}}}\n')
    (root / "authz.rego").write_text(rule.format("allow"))
    engine = PolicyEngine(root, ENVIRONMENTS, vet_in_subprocess=False)
    assert engine.load().ok
    carol = principal("carol", stepped_up=False)
    assert run(engine, carol, LIST, on("dev")).decision == "allow"
    assert run(engine, carol, LIST, on("dev")).cached
    (root / "authz.rego").write_text(rule.format("deny"))
    assert engine.reload().changed
    assert run(engine, carol, LIST, on("dev")).decision == "deny"


def test_observers_see_every_decision_of_the_chain_with_its_whole_document(engine):
    seen: list[Mapping[str, Any]] = []
    remove = observe(engine, lambda doc, decision: seen.append(doc))
    try:
        carol = principal("carol", stepped_up=False)
        decisions = [run(engine, carol, LIST, on("dev")) for _ in range(2)]
    finally:
        remove()
    assert decisions[1].cached and len(seen) == 2
    assert seen[0] == seen[1]  # the same whole document, its context's two fields included
    assert seen[1]["context"]["correlation_id"] == "corr-1"
    assert seen[1]["context"]["time"] == "2027-01-15T08:00:00.000Z"


def test_a_recalled_decision_is_the_decision_made_again_under_its_own_id():
    """``engine._again`` fills a ``Decision`` in without its ``__init__``: it must be the very
    decision ``Decision(...)`` makes, field for field and equal."""
    from types import MappingProxyType

    from service.authz.engine import _again

    for cached in (Decision("allow", ("r1",), revision="rev", decision_id="d-1"),
                   Decision("require_approval", ("r", PRODUCTION_UPGRADE),
                            MappingProxyType({"quorum": 2}), "rev", "d-2", False)):
        again = _again(cached, "d-9")
        made = Decision(cached.decision, cached.reasons, cached.approval, cached.revision,
                        "d-9", True)
        assert type(again) is Decision and vars(again) == vars(made) and again == made
        assert list(vars(again)) == list(vars(made))  # the fields' order too (its repr)
        assert repr(again) == repr(made)
        assert vars(cached)["decision_id"] != "d-9" and not cached.cached  # untouched
        with pytest.raises(AttributeError):
            again.decision = "deny"  # type: ignore[misc]


def test_a_collections_target_is_the_target_its_fields_make():
    """``Target.collection`` fills a ``Target`` in without its ``__init__``: the same fields
    and defaults as ``Target({"collection": name}, env)``, its hash the resource's, and a
    resource of its own for every request."""
    from dataclasses import fields

    from service.approvals.binding import resource_hash

    one, other = Target.collection("databases", "prod"), Target.collection("databases", "prod")
    made = Target({"collection": "databases"}, "prod")
    for f in fields(Target):
        assert getattr(one, f.name) == getattr(made, f.name), f.name
    assert one == made and one.hash == made.hash == resource_hash({"collection": "databases"})
    assert vars(one) == vars(made)  # every field on the instance, as ``__init__`` puts it
    assert one.resource is not other.resource
    assert Target.collection("storage", "dev").policy_resource(LIST) == Target(
        {"collection": "storage"}, "dev").policy_resource(LIST)
    with pytest.raises(AttributeError):
        one.env = "dev"  # type: ignore[misc]
