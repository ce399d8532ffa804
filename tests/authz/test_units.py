"""Actions catalogue, input document, strict decision parsing, error locations."""

from __future__ import annotations

import pytest

from service import schemas
from service.authz import actions
from service.authz.decision import Decision, MalformedDecision, parse_decision
from service.authz.input import build_input, strip, validate_input
from service.authz.source import locate_errors
from tests.authz.conftest import doc


def test_catalogue():
    assert actions.get("installer.run.execute").mutating
    for name in ("approvals.create", "approvals.review", "approvals.revoke", "tasks.report"):
        assert actions.get(name).mutating
    for name in (
        "approvals.read",
        "approvals.list",
        "compose.import",
        "databases.list",
        "storage.list",
        "tasks.read",
        "audit.read",
    ):
        assert not actions.get(name).mutating
    with pytest.raises(KeyError):
        actions.get("nope")
    with pytest.raises(AttributeError):
        actions.get("audit.read").mutating = True  # type: ignore[misc]


def test_build_input_drops_caller_supplied_projections():
    principal = {
        "subject_id": "a",
        "kind": "human",
        "roles": ["admin"],
        "step_up": {"verified": False},
    }
    built = build_input(
        principal, "tasks.read", {"id": "t", "kind": "task"}, "dev", {"correlation_id": "c"}
    )
    assert "roles" not in built["principal"]
    validate_input(built)


def test_input_schema_rejects_projected_fields_and_bad_kind():
    bad = doc()
    bad["principal"]["roles"] = ["admin"]
    bad["principal"]["kind"] = "robot"
    with pytest.raises(schemas.ValidationFailed) as err:
        validate_input(bad)
    pointers = {v.pointer for v in err.value.violations}
    assert {"/principal", "/principal/kind"} <= pointers


def test_strip_removes_log_only_fields():
    stripped = strip(doc())
    assert set(stripped["context"]) == {"method", "path", "command_hash"}


GOOD_APPROVAL = {"quorum": 2, "require_groups": ["a", "b"], "ttl_s": 60}


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param({"decision": "allow", "reasons": ["x"]}, id="allow"),
        pytest.param({"decision": "deny", "reasons": ["x"], "approval": {}}, id="deny"),
        pytest.param(
            {"decision": "require_approval", "reasons": [], "approval": GOOD_APPROVAL},
            id="approval",
        ),
    ],
)
def test_parse_valid(raw):
    assert isinstance(parse_decision(raw, "rev"), Decision)


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(None, id="none"),
        pytest.param([], id="list"),
        pytest.param({"decision": "ALLOW", "reasons": []}, id="case"),
        pytest.param({"decision": "allow", "reasons": [1]}, id="reason type"),
        pytest.param({"decision": "allow", "reasons": ["has space"]}, id="reason chars"),
        pytest.param(
            {"decision": "allow", "reasons": [], "approval": {"quorum": 1}}, id="approval on allow"
        ),
        pytest.param(
            {"decision": "require_approval", "reasons": [], "approval": {"quorum": True}},
            id="bool quorum",
        ),
        pytest.param(
            {"decision": "require_approval", "reasons": [], "approval": {"quorum": 0}},
            id="zero quorum",
        ),
        pytest.param(
            {
                "decision": "require_approval",
                "reasons": [],
                "approval": {"quorum": 1, "require_groups": ["a", "b"]},
            },
            id="groups exceed quorum",
        ),
        pytest.param(
            {
                "decision": "require_approval",
                "reasons": [],
                "approval": {"quorum": 1, "humans_only": False},
            },
            id="non-human reviewers",
        ),
        pytest.param(
            {
                "decision": "require_approval",
                "reasons": [],
                "approval": {"quorum": 1, "surprise": 1},
            },
            id="unknown approval field",
        ),
    ],
)
def test_parse_malformed(raw):
    with pytest.raises(MalformedDecision):
        parse_decision(raw)


def test_locate_errors_converts_byte_offsets():
    source = "package x\n\nfoo := if {\n"
    message = (
        "(rego-errorseq (error 6:b.rego|21|2 (errormsg 16:this is unclosed) (errorast |21|2)))"
    )
    [loc] = locate_errors(message, {"b.rego": source})
    assert (loc.file, loc.line, loc.column, loc.message) == ("b.rego", 3, 11, "this is unclosed")
