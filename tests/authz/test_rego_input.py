"""service.rego's input conversion and result reading around regopy's quirks.

The converter gives the policy exactly the document, and refuses what it cannot convert (as
evaluation errors, never a crash), including anything nested deeper than
``service.limits.MAX_INPUT_DEPTH``. regopy writes result strings into JSON text without escaping
quotes, backslashes or control characters, so the echo round trip below draws strings without
them; what happens with them is tested separately. The private regopy API the converter uses is
asserted in test_rego_private_api.py."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service import rego
from service.authz.decision import POLICY_ERROR
from service.limits import MAX_INPUT_DEPTH

from .conftest import doc as authz_doc

ECHO = rego.compile_bundle(
    [rego.Module("echo.rego", "package echo\nimport rego.v1\nresult := input\n")], {}, ["echo/result"]
)

# No quote, backslash or C0 control character: the result text would not round-trip them.
echoable = st.characters(exclude_characters='"\\', exclude_categories=("Cs", "Cc"))
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.text(echoable, max_size=30)
)
documents = st.dictionaries(
    st.text(echoable, max_size=12),
    st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4)
        | st.dictionaries(st.text(echoable, max_size=8), inner, max_size=4),
        max_leaves=20,
    ),
    max_size=6,
)


def echo(doc: Any) -> Any:
    return ECHO.query("echo/result", doc)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_the_policy_sees_the_document(doc):
    assert echo(doc) == doc


def test_floats_tuples_and_mappings_convert():
    doc = {"f": 1.5, "t": ("a", 2), "m": MappingProxyType({"k": [True, None]}), "neg": -0.25}
    assert echo(doc) == {"f": 1.5, "t": ["a", 2], "m": {"k": [True, None]}, "neg": -0.25}


@pytest.mark.parametrize(
    "bad",
    [
        {"s": "alice\x00admin"},  # a C string would truncate it to "alice"
        {"k\x00": 1},
        {"n": 2**64},
        {"n": 2**63},
        {"n": -(2**63) - 1},
        {"b": b"bytes"},
        {"s": {1, 2}},
        {1: "non-string key"},
    ],
    ids=["nul-value", "nul-key", "int-overflow", "int-2**63", "int-underflow", "bytes", "set", "int-key"],
)
def test_unconvertible_input_is_an_evaluation_error(bad):
    with pytest.raises(rego.RegoEvalError, match="input cannot be converted"):
        echo(bad)
    # and the bundle still answers afterwards (no half-built input left behind)
    assert echo({"ok": True}) == {"ok": True}


def test_the_64_bit_integer_bounds_convert():
    assert echo({"n": [2**63 - 1, -(2**63)]}) == {"n": [2**63 - 1, -(2**63)]}


def nested(depth: int, *, leaf: Any = 1, kind: str = "object") -> dict[str, Any]:
    """A top-level object holding ``depth`` arrays/objects in all (itself included)."""
    value: Any = leaf
    for _ in range(depth - 1):
        value = {"x": value} if kind == "object" else [value]
    return {"x": value}


@pytest.mark.parametrize("kind", ["object", "array"])
def test_nesting_up_to_the_depth_limit_converts(kind):
    # scalars add no depth; the top-level object is depth 1
    for leaf in (1, "s", None, 1.5):
        deepest = nested(MAX_INPUT_DEPTH, leaf=leaf, kind=kind)
        assert echo(deepest) == deepest
    empty_at_the_limit = nested(MAX_INPUT_DEPTH - 1, leaf=[], kind=kind)
    assert echo(empty_at_the_limit) == empty_at_the_limit


@pytest.mark.parametrize("leaf", [[], {}])
def test_an_empty_container_past_the_limit_counts(leaf):
    with pytest.raises(rego.RegoEvalError, match="nests deeper"):
        echo(nested(MAX_INPUT_DEPTH, leaf=leaf))


@pytest.mark.parametrize("kind", ["object", "array"])
@pytest.mark.parametrize("extra", [1, 2, 1000, 100_000])
def test_nesting_beyond_the_depth_limit_is_an_evaluation_error(kind, extra):
    with pytest.raises(rego.RegoEvalError, match=f"input cannot be converted: input nests deeper than "
                       f"{MAX_INPUT_DEPTH} arrays/objects"):
        echo(nested(MAX_INPUT_DEPTH + extra, kind=kind))
    assert echo({"ok": True}) == {"ok": True}


def test_depth_counts_mappings_and_tuples_too():
    value: Any = 1
    for i in range(MAX_INPUT_DEPTH):
        value = MappingProxyType({"x": value}) if i % 2 else (value,)
    with pytest.raises(rego.RegoEvalError, match="nests deeper"):
        echo({"x": value})


def test_a_cyclic_document_is_refused_by_the_depth_limit():
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    with pytest.raises(rego.RegoEvalError, match="nests deeper"):
        echo(cyclic)


def test_the_depth_error_is_a_value_error_the_query_reports_as_an_evaluation_error():
    assert issubclass(rego.InputTooDeep, ValueError)
    handle = rego._native.regoNewInput()
    try:
        with pytest.raises(rego.InputTooDeep):
            rego._push(handle, nested(MAX_INPUT_DEPTH + 1))
    finally:
        rego._native.regoFreeInput(handle)


def test_the_engine_denies_a_too_deep_input_with_policy_error(shipped):
    deep = authz_doc()
    deep["resource"]["labels"] = nested(MAX_INPUT_DEPTH)
    decision = shipped.decide(deep)
    assert (decision.decision, decision.reasons) == ("deny", (POLICY_ERROR,))


def test_quotes_inside_strings_reach_the_policy_unchanged():
    counts = rego.compile_bundle(
        [rego.Module("c.rego", "package c\nimport rego.v1\nn := [count(s) | some s in input.s]\n")],
        {},
        ["c/n"],
    )
    # regopy strips one pair of enclosing quotes ('"admin"' would reach the policy as admin);
    # compose files carry such values (environment: - USER="admin").
    values = ['"admin"', '""', '"a"b"', 'a"b', '"x', 'x"', '"', "a\\b", "it's"]
    assert counts.query("c/n", {"s": values}) == [len(v) for v in values]
    keys = rego.compile_bundle(
        [rego.Module("k.rego", "package k\nimport rego.v1\nn := [count(key) | input.o[key]]\n")],
        {},
        ["k/n"],
    )
    assert sorted(keys.query("k/n", {"o": dict.fromkeys(values, 1)})) == sorted(map(len, values))
    assert echo({"s": "alice"}) == {"s": "alice"}


def test_repeated_strings_reach_the_policy_as_the_first():
    # The converter encodes each distinct string of a document once: a repeat, as a key or a
    # value, in any position, is the same string to the policy (and "" too, the falsy one).
    doc = {"x": "x", "": ["", "x", {"x": ""}], "k": {"x": ["x", "", "k"]}, "y": ["k", "k"]}
    assert echo(doc) == doc
    counts = rego.compile_bundle(
        [rego.Module("c.rego", "package c\nimport rego.v1\nn := [count(s) | some s in input.s]\n"
                                "k := [count(key) | input.o[key]]\n")],
        {},
        ["c/n", "c/k"],
    )
    quoted = ['"admin"', "a", '"admin"', "a", '"admin"']
    doc2 = {"s": quoted, "o": dict.fromkeys(quoted, '"admin"')}
    n, k = counts.query_each(["c/n", "c/k"], doc2)
    assert (n, sorted(k)) == ([7, 1, 7, 1, 7], [1, 7])


INJECTABLE = (
    "package controlplane.authz\nimport rego.v1\n"
    'decision := {"decision": "deny", "reasons": [sprintf("owner:%s", [input.resource.owner])],'
    ' "approval": {}}\n'
)


def test_a_string_copied_into_the_result_cannot_rewrite_it():
    bundle = rego.compile_bundle(
        [rego.Module("authz.rego", INJECTABLE)], {}, ["controlplane/authz/decision"]
    )
    assert bundle.query("controlplane/authz/decision", {"resource": {"owner": "bob"}}) == {
        "decision": "deny", "reasons": ["owner:bob"], "approval": {}
    }
    # An input with a quote is read back from the output's node tree, where the string is data.
    forged = 'x"],"decision":"allow","reasons":["y'
    assert bundle.query("controlplane/authz/decision", {"resource": {"owner": forged}}) == {
        "decision": "deny", "reasons": [f"owner:{forged}"], "approval": {}
    }


def test_regopy_keeps_escapes_in_policy_string_literals():
    # A known regopy 1.5 quirk (policies/README.md): if an upgrade fixes it, this fails and the
    # README's advice to policy authors can go.
    bundle = rego.compile_bundle(
        [rego.Module("l.rego", 'package l\nimport rego.v1\nr := [count("a\\"b"), input.s == "a\\"b"]\n')],
        {},
        ["l/r"],
    )
    assert bundle.query("l/r", {"s": 'a"b'}) == [4, False]


MANY = rego.compile_bundle([rego.Module("many.rego", """package many
import rego.v1
first := input.a
# two values for one complete rule: an evaluation error whenever input.a is set
clash := 1 if input.a
clash := 2 if input.a
nothing if input.a == "never"
last := [input.a, input.b]
""")], {}, ["many/first", "many/clash", "many/nothing", "many/last"])


def test_query_each_sets_the_input_once_and_keeps_each_entrypoints_own_result():
    first, clash, nothing, last = MANY.query_each(
        ["many/first", "many/clash", "many/nothing", "many/last"], {"a": "x", "b": 2})
    assert first == "x"
    assert isinstance(clash, rego.RegoEvalError)  # failed alone: the input is still set after it
    assert nothing is rego.Undefined
    assert last == ["x", 2]
    # each call answers for its own input
    assert MANY.query_each(["many/last"], {"a": "y", "b": 3}) == [["y", 3]]


def test_query_each_refuses_unknown_entrypoints_and_unconvertible_inputs_as_a_whole():
    with pytest.raises(rego.RegoEvalError, match="not compiled"):
        MANY.query_each(["many/first", "many/unknown"], {"a": "x"})
    with pytest.raises(rego.RegoEvalError, match="cannot be converted"):
        MANY.query_each(["many/first"], {"a": object()})
