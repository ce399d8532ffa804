"""The decision cache keys on the input paths a revision can read (service/authz/inputrefs.py).

Soundness is the point: two inputs with the same key must get the same (uncached) decision. The
property test checks it against the shipped policy and deliberately tricky ones; the table checks
that every dynamic use of ``input`` falls back to a larger key.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from service.authz import inputrefs
from service.authz.engine import PolicyEngine, default_policies_dir
from tests.authz.conftest import doc, write_policy

HEAD = "package controlplane.authz\nimport rego.v1\n"


def paths(*sources: str) -> list[str] | None:
    refs = inputrefs.analyse([HEAD + s for s in sources])
    return None if refs.paths is None else [".".join(p) for p in refs.paths]


# ---- the analysis ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("x if input.resource.owner == input.principal.subject_id",
         ["principal.subject_id", "resource.owner"]),
        ('x if input["resource"].owner == "a"', ["resource.owner"]),
        ("x if input.resource.tags[0] == 1", ["resource.tags"]),
        ("x if { some k; input.resource[k] == 1 }", ["resource"]),
        ('x if input.resource.value.app == "web"', ["resource.value.app"]),
        # a dynamic key into the resource's value: its whole value is keyed
        ("x if { some k; input.resource.value[k] == 1 }", ["resource.value"]),
        ('x if { some v in input.resource.value.tags; v == "a" }', ["resource.value.tags"]),
        ("x if input.resource[input.principal.kind]", ["principal.kind", "resource"]),
        ("x if { some v in input.resource.list; v == 1 }", ["resource.list"]),
        ('x := object.get(input.resource, "owner", "none")', ["resource.owner"]),
        ('x := object.get(input.resource, ["owner"], "none")', ["resource"]),
        ("x := object.get(input.resource, k, 1) if k := input.env", ["env", "resource"]),
        ("x := count(input.resource)", ["resource"]),
        ("f(inp) := inp.resource.id\nx := f(input)", ["resource.id"]),
        ("f(inp) := g(inp.principal)\ng(p) := p.kind\nx := f(input)", ["principal.kind"]),
        ("f(a, b) := a.k == b\nx := f(input.resource, 1)", ["resource.k"]),
        ("f([a]) := a\nx := f(input.resource)", ["resource"]),
        ("f(inp) := inp\nx := f(input).resource.id", None),  # the function returns it whole
        ("import input.resource as r\nx if r.owner == 1", ["resource.owner"]),
        ("import input.principal\nx if principal.kind == 1", ["principal.kind"]),
        ("import input as doc\nx if doc.env", ["env"]),
        ("import input\nx if input.env", ["env"]),
        ("x if input[y]", None),
        ("x if input[_]", None),
        ("x if walk(input, [p, v])", None),
        ("x := json.marshal(input)", None),
        ("x := object.get(input, \"env\", 1)", ["env"]),
        ("x := input", None),
        ("y if input.env\nx if y with input.env as 1", None),
        ("y if input.env\nx if y with input as {}", None),
        ("x := q.f(input)", None),  # an imported or built-in call: the argument whole
        ('x := $"{input.env}"', None),  # a template string: not understood
        ('# input[x] in a comment\nx if input.env == "input[y]"', ["env"]),
        ("x if input.env == `raw\ninput[y]`", ["env"]),
        ("x if input.env == ~1", None),  # a character the lexer does not know
        ("x if (input.env", None),  # unbalanced
        ("x if data.input.x == input.env", ["env"]),
    ],
)
def test_analysis(source, expected):
    assert paths(source) == expected


def test_a_function_named_in_another_package_is_followed_by_its_data_path():
    caller = HEAD + "x := data.lib.f(input)\n"
    lib = "package lib\nf(inp) := inp.env\n"
    assert inputrefs.analyse([caller, lib]).paths == (("env",),)
    # Not by a bare name from another package: that may be a built-in of the same name.
    assert inputrefs.analyse([HEAD + "x := f(input)\n", lib]).paths is None


def test_shipped_policy_reads_a_few_paths_not_the_resource_id():
    engine = PolicyEngine(default_policies_dir())
    assert engine.load().ok
    cache = engine.status()["cache"]
    assert cache["keyed_on"] == "referenced_paths"
    assert "resource.owner" in cache["paths"]
    assert not any(p in ("resource", "resource.id", "context", "principal") for p in cache["paths"])


def test_key_adds_the_engine_paths_and_the_subject_for_projected_facts():
    assert inputrefs.key_paths([("resource", "owner")]) == (
        ("action",), ("env",), ("resource", "owner"))
    assert ("principal", "subject_id") in inputrefs.key_paths([("principal", "grants")])
    # The whole principal holds the subject id already.
    assert inputrefs.key_paths([("principal",)]) == (("action",), ("env",), ("principal",))


def test_key_tells_a_missing_member_from_a_value_that_is_not_an_object():
    keyed = inputrefs.key_paths([("resource", "owner")])
    keys = {inputrefs.cache_key(keyed, {"action": "a", "env": "dev", "resource": r})
            for r in ({}, "x", [], None, 1, {"owner": None}, {"owner": "a"})}
    assert len(keys) == 7
    assert inputrefs.cache_key(keyed, {"action": "a", "env": "dev", "resource": "x"}) == \
        inputrefs.cache_key(keyed, {"action": "a", "env": "dev", "resource": "y"})


def test_distinct_resource_ids_hit_the_cache():
    engine = PolicyEngine(default_policies_dir())
    assert engine.load().ok
    for i in range(200):
        engine.decide(doc(action="databases.list", resource={"id": f"r-{i}", "kind": "database"}))
    cache = engine.status()["cache"]
    assert cache["hit_rate"] >= 0.99 and cache["size"] == 1


def test_distinct_versions_of_one_app_hit_the_cache_of_a_policy_reading_the_app(tmp_path):
    engine = PolicyEngine(write_policy(tmp_path / "app", HEAD + TRICKY["resource_value_app"]))
    assert engine.load().ok
    assert engine.status()["cache"]["paths"] == ["resource.value.app"]
    for i in range(200):
        engine.decide(doc(resource={"id": f"task-{i}", "kind": "installer_run",
                                    "value": {"app": "web", "version": f"1.{i}.0"}}))
    cache = engine.status()["cache"]
    assert cache["hit_rate"] >= 0.95 and cache["size"] == 1


# ---- soundness: same key, same uncached decision ------------------------------------------------

KEYS = ["owner", "id", "kind", "k", "list", "tags", "scope", "env", "app", "version"]
APPS = ["web", "payments", "x"]
VERSIONS = ["1.0.0", "2.4.0-rc.1", "3.0.0-beta", "x"]
SUBJECTS = ["alice", "bob", "carol", "ci-bot", "agent-7", "nobody"]
ACTIONS = ["approvals.create", "approvals.review", "installer.run.execute", "databases.list",
           "tasks.read"]
ENVS = ["dev", "staging", "prod", "elsewhere"]

leaves = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.sampled_from(SUBJECTS),
                   st.sampled_from(["x", "human", "agent", "*"]))
values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(KEYS), inner, max_size=3),
    max_leaves=6,
)


@st.composite
def inputs(draw: st.DrawFn) -> dict[str, Any]:
    out = doc(subject=draw(st.sampled_from(SUBJECTS)),
              kind=draw(st.sampled_from(["human", "service", "agent"])),
              action=draw(st.sampled_from(ACTIONS)), env=draw(st.sampled_from(ENVS)))
    resource = draw(st.dictionaries(st.sampled_from(KEYS), values, max_size=3))
    if draw(st.booleans()):
        resource["owner"] = draw(st.sampled_from(SUBJECTS))
    # input.resource.value: the request's resource as sent, mostly an app/version object.
    value = draw(st.one_of(
        st.fixed_dictionaries({"app": st.sampled_from(APPS), "version": st.sampled_from(VERSIONS)},
                              optional={"k": values, "tags": values}),
        values))
    if draw(st.integers(0, 3)):  # mostly present, as the chain always sends it
        resource["value"] = value
    out["resource"] = resource
    return out


#: Where edits land: mostly outside what the policies read, sometimes inside.
EDIT_PATHS = [
    ("resource", "id"), ("resource", "kind"), ("resource", "owner"), ("resource",),
    ("resource", "k"), ("resource", "list"), ("resource", "tags"), ("principal", "session_id"),
    ("principal", "auth_time"), ("principal", "kind"), ("principal", "subject_id"),
    ("principal", "step_up"), ("context", "method"), ("context", "path"), ("context",),
    ("context", "correlation_id"), ("context", "time"), ("env",), ("extra",),
    ("resource", "value"), ("resource", "value", "app"), ("resource", "value", "version"),
    ("resource", "value", "k"), ("resource", "value", "tags"),
]


def _edit(target: dict[str, Any], path: tuple[str, ...], value: Any, delete: bool) -> None:
    node: Any = target
    for name in path[:-1]:
        if not isinstance(node, dict):
            return
        node = node.setdefault(name, {})
    if not isinstance(node, dict):
        return
    if delete:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value


#: Edits inside the resource's value only (and a few per-request fields beside it).
VALUE_EDIT_PATHS = [p for p in EDIT_PATHS if p[:2] == ("resource", "value")] + [
    ("resource", "id"), ("principal", "session_id"), ("context", "path")]


def edits_of(paths: list[tuple[str, ...]]) -> st.SearchStrategy[Any]:
    return st.lists(
        st.tuples(st.sampled_from(paths),
                  st.one_of(st.sampled_from(SUBJECTS), st.sampled_from(VERSIONS), values),
                  st.booleans()),
        min_size=1, max_size=3)


edits = edits_of(EDIT_PATHS)

TRICKY = {
    "dynamic_key": """
        decision := {"decision": "allow", "reasons": ["some_key"], "approval": {}} if {
            some k
            input.resource[k] == "x"
        } else := {"decision": "deny", "reasons": ["none"], "approval": {}}
    """,
    "import_alias": """
        import input.resource as r
        decision := {"decision": "allow", "reasons": ["own"], "approval": {}} if {
            r.owner == input.principal.subject_id
        } else := {"decision": "deny", "reasons": ["other"], "approval": {}}
    """,
    "functions_and_object_get": """
        decision := verdict(input)
        verdict(inp) := {"decision": "allow", "reasons": [owner(inp)], "approval": {}} if {
            kind_of(inp.principal) == "human"
        } else := {"decision": "deny", "reasons": ["kind"], "approval": {}}
        kind_of(p) := p.kind
        owner(inp) := sprintf("%v", [object.get(inp.resource, "owner", "none")])
    """,
    "dynamic_index_from_input": """
        decision := {"decision": "allow", "reasons": ["indexed"], "approval": {}} if {
            input.resource[input.principal.kind] != null
        } else := {"decision": "deny", "reasons": ["no"], "approval": {}}
    """,
    "returns_input_whole": """
        same(x) := x
        decision := {"decision": "allow", "reasons": ["id"], "approval": {}} if {
            same(input).resource.id == "x"
        } else := {"decision": "deny", "reasons": ["no"], "approval": {}}
    """,
    "resource_value_app": """
        decision := {"decision": "allow", "reasons": ["web"], "approval": {}} if {
            input.resource.value.app == "web"
        } else := {"decision": "deny", "reasons": ["other"], "approval": {}}
    """,
    "resource_value_version": """
        decision := {"decision": "require_approval", "reasons": ["pre_release"],
                     "approval": {"quorum": 1}} if {
            regex.match(`-(rc|beta)`, input.resource.value.version)
        } else := {"decision": "allow", "reasons": [input.resource.value.app], "approval": {}}
    """,
    "resource_value_dynamic_key": """
        decision := {"decision": "allow", "reasons": ["some_x"], "approval": {}} if {
            some k
            input.resource.value[k] == "x"
        } else := {"decision": "deny", "reasons": ["none"], "approval": {}}
    """,
    "count_of_subtree": """
        decision := {"decision": "allow", "reasons": [sprintf("%d", [count(input.resource)])],
                     "approval": {}}
    """,
}


def _engine(root: Path) -> PolicyEngine:
    # cache_size 0: every decision below is evaluated, none is served from a cache.
    engine = PolicyEngine(root, cache_size=0, vet_in_subprocess=False)
    result = engine.load()
    assert result.ok, result.error
    return engine


def _check_soundness(engine: PolicyEngine, key_paths: tuple[inputrefs.Path, ...] | None,
                     examples: int = 40, shrink: bool = True,
                     changes_of: st.SearchStrategy[Any] = edits) -> int:
    """Run the property; return how many pairs shared a key (so the property was exercised)."""
    from service.authz.input import strip

    shared = [0]
    # The key function the engine serves with (compiled once per revision).
    key_of = None if key_paths is None else inputrefs.compile_key(key_paths)

    def key(d: dict[str, Any]) -> Any:
        if key_of is None:
            import json
            return json.dumps(strip(d), sort_keys=True)
        return key_of(strip(d))

    phases = tuple(Phase) if shrink else (Phase.generate,)

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None, phases=phases,
              suppress_health_check=[HealthCheck.too_slow])
    @given(base=inputs(), changes=changes_of)
    def prop(base: dict[str, Any], changes: list[tuple[tuple[str, ...], Any, bool]]) -> None:
        other = copy.deepcopy(base)
        for path, value, delete in changes:
            _edit(other, path, value, delete)
        if key(base) != key(other):
            return
        shared[0] += 1
        a, b = engine.decide(base), engine.decide(other)
        assert (a.decision, a.reasons, a.approval) == (b.decision, b.reasons, b.approval), (
            base, other)

    prop()
    return shared[0]


def test_same_key_same_decision_shipped_policy():
    engine = _engine(default_policies_dir())
    current = engine._current  # the revision's analysed key paths
    assert current is not None and current.key_paths is not None
    assert _check_soundness(engine, current.key_paths, examples=100) >= 20


def test_the_property_catches_a_key_missing_a_path_the_policy_reads():
    engine = _engine(default_policies_dir())
    current = engine._current
    assert current is not None and current.key_paths is not None
    unsound = tuple(p for p in current.key_paths if p != ("resource", "owner"))
    with pytest.raises(AssertionError):
        _check_soundness(engine, unsound, examples=300, shrink=False)


def test_the_property_catches_a_key_missing_a_path_into_the_resource_value(tmp_path):
    engine = _engine(write_policy(tmp_path / "v", HEAD + TRICKY["resource_value_version"]))
    current = engine._current
    assert current is not None and current.key_paths is not None
    assert ("resource", "value", "version") in current.key_paths
    # Sound with the analysed key, under edits inside the value...
    assert _check_soundness(engine, current.key_paths, examples=100,
                            changes_of=edits_of(VALUE_EDIT_PATHS)) >= 5
    # ...and the same property finds the key that leaves out the version.
    unsound = tuple(p for p in current.key_paths if p != ("resource", "value", "version"))
    with pytest.raises(AssertionError):
        _check_soundness(engine, unsound, examples=300, shrink=False,
                         changes_of=edits_of(VALUE_EDIT_PATHS))


@pytest.mark.parametrize("name", ["resource_value_app", "resource_value_version",
                                  "resource_value_dynamic_key"])
def test_same_key_same_decision_under_edits_inside_the_resource_value(tmp_path, name):
    engine = _engine(write_policy(tmp_path / name, HEAD + TRICKY[name]))
    current = engine._current
    assert current is not None and current.key_paths is not None
    if name == "resource_value_dynamic_key":  # a dynamic key: the whole value is keyed
        assert ("resource", "value") in current.key_paths
    assert _check_soundness(engine, current.key_paths, examples=100,
                            changes_of=edits_of(VALUE_EDIT_PATHS)) >= 5


@pytest.mark.parametrize("name", sorted(TRICKY))
def test_same_key_same_decision_tricky_policies(tmp_path, name):
    engine = _engine(write_policy(tmp_path / name, HEAD + TRICKY[name]))
    current = engine._current
    assert current is not None
    shared = _check_soundness(engine, current.key_paths)
    if name == "returns_input_whole":
        # The whole input is the key: equal keys are equal inputs, nothing left to show.
        assert current.key_paths is None
    else:
        assert current.key_paths is not None and shared >= 5


def test_cache_keys_keep_apart_what_json_keeps_apart():
    """The key is a tuple of tagged values: Python's equality merges true and 1, 1 and 1.0,
    0.0 and -0.0; JSON, hence the policy, does not, and neither may the key."""
    from service.authz.inputrefs import cache_key

    paths = (("resource", "value", "n"),)

    def key(n):
        return cache_key(paths, {"resource": {"value": {"n": n}}})

    distinct = [True, 1, 1.0, 0.0, -0.0, "1", None, [1], {"a": 1}, [True]]
    keys = [key(n) for n in distinct]
    assert len(set(keys)) == len(distinct)
    assert key({"b": 1, "a": [2, 3]}) == key({"a": [2, 3], "b": 1})  # objects by content
    assert key("x") != cache_key(paths, {"resource": {"value": {}}})  # absent is its own key
    for bad in (float("nan"), float("inf"), object()):
        with pytest.raises((TypeError, ValueError)):  # not JSON: no key, no cached decision
            key(bad)


_NAMES = ("a", "b", "principal", "kind", "value")
_DOC_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=3),
              st.floats(allow_nan=True, allow_infinity=False), st.just(object())),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(_NAMES), inner, max_size=4)),
    max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_NAMES), min_size=1, max_size=3).map(tuple),
                min_size=1, max_size=6),
       st.dictionaries(st.sampled_from(_NAMES), _DOC_VALUES, max_size=5))
def test_the_compiled_key_is_cache_key(raw_paths, doc):
    """inputrefs.compile_key(paths)(doc) == inputrefs.cache_key(paths, doc), the same error
    where cache_key raises (a value JSON has no type for, a NaN)."""
    paths = tuple(sorted({p for p in raw_paths
                          if not any(q != p and p[:len(q)] == q for q in raw_paths)}))

    def outcome(fn):
        try:
            return fn()
        except (TypeError, ValueError) as exc:
            return type(exc)

    compiled = inputrefs.compile_key(paths)
    assert outcome(lambda: compiled(doc)) == outcome(lambda: inputrefs.cache_key(paths, doc))


def test_the_shipped_revision_keys_with_its_compiled_function():
    engine = PolicyEngine(default_policies_dir())
    assert engine.load().ok
    current = engine._current
    assert current is not None and current.key_of is not None and current.key_paths
    doc = {"action": "databases.list", "env": "prod", "principal": {"subject_id": "carol",
           "kind": "human"}, "resource": {"value": {"app": "web"}}, "context": {}}
    assert current.key_of(doc) == inputrefs.cache_key(current.key_paths, doc)
    with pytest.raises(ValueError):
        inputrefs.compile_key((("a",), ("a", "b")))
