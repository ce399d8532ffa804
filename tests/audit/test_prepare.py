"""``audit.record.prepare``: the scrub, the store's bounds and text, and the canonical check in
one walk. It must decide exactly what the three walks it replaces decide: the same scrubbed
entry, the same stored text, the same canonical verdict, and for every value the store refuses,
no checked text at all (so the store refuses it as before)."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from service import canonical, limits
from service.audit.record import prepare, scrub, seal
from service.store.base import AUDIT_GENESIS_HASH, CheckedEntry
from service.store.sql.audit import _chain
from service.store.sql.core import dump_json

_TEXT = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=6)
# Names a secret may hide under, beside ordinary ones.
_KEYS = st.one_of(_TEXT, st.sampled_from(["token", "password", "api_key", "Authorization",
                                          "nonce", "env", "status", "principal", "at"]))
_SCALARS = st.one_of(
    st.none(), st.booleans(), _TEXT,
    st.integers(min_value=-(2**54), max_value=2**54),
    st.floats(), st.tuples(st.integers(0, 3)),
)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(_KEYS, inner, max_size=4)), max_leaves=20)
_ENTRIES = st.dictionaries(_KEYS, _VALUES, max_size=8)


def _stored(value):
    """What the store would do with ``value``: its text, or the refusal's class."""
    try:
        return dump_json(value)
    except limits.JSONValueRefused as exc:
        return type(exc)


def _deep(depth: int):
    value: dict = {"leaf": 1}
    for _ in range(depth):
        value = {"down": value}
    return value


@settings(max_examples=600, deadline=None)
@given(_ENTRIES)
@example({"a": 1.5, "b": [1e21, 5e-324, -0.0], "token": "x", "c": {"password": "p", "d": 2}})
@example({"s": "\x00", "t": "\ud800"})
@example({"n": 2**53, "m": -(2**53 - 1)})
@example({"f": math.inf})
@example({"x": "é" * 10, "y": "\U0001F600"})
@example({"deep": _deep(limits.MAX_JSON_DEPTH - 1)})
@example({"deep": _deep(limits.MAX_JSON_DEPTH)})
@example({1: "a"})
def test_prepare_decides_what_scrub_dump_json_and_is_canonical_decide(entry):
    prepared, scrubbed = prepare(entry), scrub(entry)
    assert prepared == scrubbed  # the same entry, secrets dropped at every depth
    stored = _stored(scrubbed)
    if type(prepared) is CheckedEntry:
        assert prepared.text == stored  # the text the store writes (so never a refused value)
        assert prepared.canonical == canonical.is_canonical(scrubbed, stored)
        assert dump_json(prepared) == stored
    else:
        assert type(prepared) is dict  # the general path: the store checks (and may refuse)
        assert _stored(prepared) == stored


def test_common_entries_take_the_one_walk():
    entry = {"at": "2026-11-27T10:00:00.123Z", "principal": {"subject_id": "carol",
             "session_id": "ses_1", "token": "secret"}, "decision": {"reasons": ["a", "b"]},
             "status": 200, "duration": 0.25, "nonce": "n"}
    prepared = prepare(entry)
    assert type(prepared) is CheckedEntry and prepared.canonical
    assert "nonce" not in prepared and "token" not in prepared["principal"]
    assert prepared.text == dump_json(scrub(entry))


@pytest.mark.parametrize("entry", [{"f": 1e21}, {"f": 5e-324}, {"s": "\U0001F600"}],
                         ids=["big-float", "tiny-float", "astral"])
def test_a_record_seals_the_same_from_a_checked_entry_as_from_the_plain_one(entry):
    prepared = prepare(entry)
    assert type(prepared) is CheckedEntry
    checked = _chain(0, AUDIT_GENESIS_HASH, [(dump_json(prepared), prepared)], seal)[0]
    plain = _chain(0, AUDIT_GENESIS_HASH, [(dump_json(scrub(entry)), scrub(entry))], seal)[0]
    assert checked == plain and checked.text == plain.text
    assert type(checked.entry) is dict  # the record holds a plain dict, never the carrier


# ``known`` members as their contract says (``prepare``): strings of any code point, booleans,
# None, integers within the bounds, and dicts (keys that name no secret) and lists of them.
_KNOWN_NAMES = ["at", "principal", "decision", "status", "path"]
_KNOWN_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), _TEXT,
              st.integers(min_value=-limits.MAX_JSON_INTEGER, max_value=limits.MAX_JSON_INTEGER)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(["subject_id", "reasons", "x", "é"]),
                                            inner, max_size=3)),
    max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(_KNOWN_NAMES), _KNOWN_VALUES, max_size=5), _ENTRIES)
@example({"path": "\x00"}, {})
@example({"path": "\ud800", "status": 200}, {"token": "t"})
@example({"principal": {"subject_id": "é" * 10}}, {"status": 1.5})
def test_known_members_are_copied_as_the_walk_would_pass_them(known_members, others):
    """What ``known`` skips is exactly what the walk would have passed as it is: the same
    entry, text and canonical verdict either way (the other members, walked, may override)."""
    entry = {**known_members, **others}
    known = frozenset(known_members) - frozenset(others)
    walked, copied = prepare(entry), prepare(entry, known)
    assert type(copied) is type(walked) and copied == walked
    assert list(copied) == list(walked)  # the entry's order, as the mirror writes it
    if type(walked) is CheckedEntry:
        assert copied.text == walked.text and copied.canonical == walked.canonical
