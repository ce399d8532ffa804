"""service.rego's input conversion and result reading around regopy's quirks.

The C accelerator and the Python converter agree with each other and with the document, and
refuse the same inputs (as evaluation errors, never a crash). regopy writes result strings into
JSON text without escaping quotes, backslashes or control characters, so the echo round trip
below draws strings without them; what happens with them is tested separately."""

from __future__ import annotations

import os
from types import MappingProxyType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service import rego

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


def echo(doc, *, accelerated: bool):
    saved = rego._accelerator
    if not accelerated:
        rego._accelerator = None
    try:
        return ECHO.query("echo/result", doc)
    finally:
        rego._accelerator = saved


needs_accelerator = pytest.mark.skipif(
    not rego.ACCELERATED and os.environ.get("CI") != "true",
    reason="service._regonative is not built here (no C compiler); the Python converter is used",
)


def test_the_native_accelerator_is_built_in_ci():
    # `make test` installs the project with its optional C accelerator; CI must have it.
    if os.environ.get("CI") != "true" and not rego.ACCELERATED:
        pytest.skip("not in CI and service._regonative is not built here")
    assert rego.ACCELERATED


@needs_accelerator
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_both_converters_give_the_policy_the_same_document(doc):
    assert echo(doc, accelerated=True) == echo(doc, accelerated=False) == doc


@pytest.mark.parametrize("accelerated", [True, False])
def test_floats_tuples_and_mappings_convert(accelerated):
    if accelerated and not rego.ACCELERATED:
        pytest.skip("service._regonative is not built here")
    doc = {"f": 1.5, "t": ("a", 2), "m": MappingProxyType({"k": [True, None]}), "neg": -0.25}
    assert echo(doc, accelerated=accelerated) == {
        "f": 1.5, "t": ["a", 2], "m": {"k": [True, None]}, "neg": -0.25
    }


@pytest.mark.parametrize("accelerated", [True, False])
@pytest.mark.parametrize(
    "bad",
    [
        {"s": "alice\x00admin"},  # a C string would truncate it to "alice"
        {"k\x00": 1},
        {"n": 2**64},
        {"b": b"bytes"},
        {"s": {1, 2}},
        {1: "non-string key"},
    ],
    ids=["nul-value", "nul-key", "int-overflow", "bytes", "set", "int-key"],
)
def test_unconvertible_input_is_an_evaluation_error(bad, accelerated):
    if accelerated and not rego.ACCELERATED:
        pytest.skip("service._regonative is not built here")
    with pytest.raises(rego.RegoEvalError, match="input cannot be converted"):
        echo(bad, accelerated=accelerated)
    # and the bundle still answers afterwards (no half-built input left behind)
    assert echo({"ok": True}, accelerated=accelerated) == {"ok": True}


def test_deep_nesting_is_refused_by_the_accelerator_not_crashed_on():
    if not rego.ACCELERATED:
        pytest.skip("service._regonative is not built here")
    deep: dict = {}
    node = deep
    for _ in range(200):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(rego.RegoEvalError, match="nests too deeply"):
        echo(deep, accelerated=True)


@pytest.mark.parametrize("accelerated", [True, False])
def test_quotes_inside_strings_reach_the_policy_unchanged(accelerated):
    if accelerated and not rego.ACCELERATED:
        pytest.skip("service._regonative is not built here")
    counts = rego.compile_bundle(
        [rego.Module("c.rego", "package c\nimport rego.v1\nn := [count(s) | some s in input.s]\n")],
        {},
        ["c/n"],
    )
    # regopy strips one pair of enclosing quotes ('"admin"' would reach the policy as admin);
    # compose files carry such values (environment: - USER="admin").
    values = ['"admin"', '""', '"a"b"', 'a"b', '"x', 'x"', '"', "a\\b", "it's"]
    saved = rego._accelerator
    if not accelerated:
        rego._accelerator = None
    try:
        assert counts.query("c/n", {"s": values}) == [len(v) for v in values]
        keys = rego.compile_bundle(
            [rego.Module("k.rego", "package k\nimport rego.v1\nn := [count(key) | input.o[key]]\n")],
            {},
            ["k/n"],
        )
        assert sorted(keys.query("k/n", {"o": dict.fromkeys(values, 1)})) == sorted(map(len, values))
        assert echo({"s": "alice"}, accelerated=accelerated) == {"s": "alice"}
    finally:
        rego._accelerator = saved


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
    forged = 'x"],"decision":"allow","reasons":["y'
    with pytest.raises(rego.RegoEvalError, match="duplicate key"):
        bundle.query("controlplane/authz/decision", {"resource": {"owner": forged}})


def test_regopy_keeps_escapes_in_policy_string_literals():
    # A known regopy 1.5 quirk (policies/README.md): if an upgrade fixes it, this fails and the
    # README's advice to policy authors can go.
    bundle = rego.compile_bundle(
        [rego.Module("l.rego", 'package l\nimport rego.v1\nr := [count("a\\"b"), input.s == "a\\"b"]\n')],
        {},
        ["l/r"],
    )
    assert bundle.query("l/r", {"s": 'a"b'}) == [4, False]
