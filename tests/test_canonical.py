"""service.canonical.dumps against rfc8785.dumps, the definition: the same bytes for every JSON
value, and the same refusal for what JCS cannot express."""

from __future__ import annotations

import rfc8785
from hypothesis import example, given, settings
from hypothesis import strategies as st

from service import canonical

# Strings from every plane, lone surrogates included; keys likewise (the sort order differs
# between UTF-16 and code points only above U+D800).
_TEXT = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF,
                                       blacklist_categories=()), max_size=8)
_SCALARS = st.one_of(
    st.none(), st.booleans(), _TEXT,
    st.integers(min_value=-(2**53) - 3, max_value=2**53 + 3),
    st.integers(), st.floats(allow_nan=True, allow_infinity=True),
)
_JSON = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(_TEXT, inner, max_size=5)), max_leaves=25)


def _outcome(fn, value):
    try:
        return fn(value)
    except Exception as exc:  # a surrogate key: rfc8785 raises UnicodeEncodeError
        return type(exc)


@settings(max_examples=300, deadline=None)
@given(_JSON)
@example({"\U0001f600": 1, "\ue000": 2})  # UTF-16 order puts the emoji (D83D DE00) first
@example({"a": "\ud800"})  # a lone surrogate: refused
@example([2**53 - 1, -(2**53 - 1), 2**53])
@example([0.5, 1.0, -0.0, 1e-7, 1e21, 1e-5, 123456.789, 5e-324])  # repr is JCS's form or not
def test_same_bytes_or_same_refusal_as_rfc8785(value):
    assert _outcome(canonical.dumps, value) == _outcome(rfc8785.dumps, value)


def test_the_fast_path_is_taken_for_plain_values_and_matches():
    record = {"seq": 7, "prev_hash": "sha256:" + "0" * 64, "entry": {
        "principal": {"subject_id": "alice", "kind": "human", "session_id": None},
        "decision": {"result": "allow", "reasons": ["role viewer"]}, "ticket_consumed": True,
        "path": "/api/v1/databases?x=\u00e9\n\"\\\u2028", "status": 200, "neg": -(2**53 - 1)}}
    assert canonical._plain(record)
    assert canonical.dumps(record) == rfc8785.dumps(record)
    assert canonical._plain({"cpus": 0.5, "memory": 12.75})
    for value in (1.0, 1e-7, 2**53, {"a": [1.0]}, {1: "x"}, ("tuple",), float("nan")):
        assert not canonical._plain(value)
