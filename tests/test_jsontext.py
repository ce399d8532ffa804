"""service.jsontext (orjson) against the standard library's encoder, which it replaces on the hot
paths: the same text wherever a hash is taken over it, the same refusals, the same fallback."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import random
import struct

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from service import canonical, jsontext
from service.store.sql.core import dump_json

_SORTED = json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

# Every code point bar the surrogates (their own test below); keys too.
_TEXT = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF,
                                       blacklist_categories=("Cs",)), max_size=8)
_SCALARS = st.one_of(
    st.none(), st.booleans(), _TEXT,
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
)
_JSON = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(_TEXT, inner, max_size=5)), max_leaves=25)


def _float_spelling_only(a: str, b: str) -> bool:
    """Two texts of one value that differ only in how a float is spelled (1e-05, 0.00001)."""
    return json.loads(a) == json.loads(b)


@settings(max_examples=500, deadline=None)
@given(_JSON)
@example({"b": 1, "a": [0.5, -0.0, 1e21, 5e-324, 2**53 + 1], "\u00e9": "\x00\x1f\x7f\u2028"})
def test_the_same_text_as_json_for_every_value_canonical_admits(value):
    ours, theirs = jsontext.compact_sorted(value), _SORTED(value)
    if canonical._plain(value):  # every float in it is written as repr writes it
        assert ours == theirs
    else:
        assert _float_spelling_only(ours, theirs)


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_a_response_body_is_the_compact_text_in_utf8(value):
    ours, theirs = jsontext.compact_bytes(value).decode("utf-8"), _COMPACT(value)
    if canonical._plain(value):  # every float in it is written as repr writes it
        assert ours == theirs
    else:
        assert _float_spelling_only(ours, theirs)


def test_a_response_body_refuses_what_the_compact_text_cannot_send():
    big = {"n": 2**70, 1: "x"}  # refused by orjson: written by json
    assert jsontext.compact_bytes(big) == _COMPACT(big).encode("utf-8")
    with pytest.raises(UnicodeEncodeError):  # no UTF-8 form: as ``text.encode`` refused it
        jsontext.compact_bytes({"s": "\ud800"})
    with pytest.raises(TypeError):
        jsontext.compact_bytes({"v": {1, 2}})


def test_every_code_point_is_escaped_or_written_as_json_does():
    for cp in (*range(0, 0xD800), *range(0xE000, 0x110000, 101)):
        text = f"{chr(cp)}x{chr(cp)}"
        assert jsontext.compact_sorted({text: text}) == _SORTED({text: text}), hex(cp)


def test_floats_are_spelled_as_repr_wherever_canonical_takes_the_text_as_is():
    rnd = random.Random(8785)
    seen = 0
    for _ in range(200_000):
        x = struct.unpack("<d", rnd.getrandbits(64).to_bytes(8, "little"))[0]
        if rnd.random() < 0.5:  # and as many of the magnitudes records carry (timestamps)
            x = 10 ** rnd.uniform(-4, 16) * rnd.choice((1, -1))
        if math.isfinite(x) and canonical._plain(x):
            seen += 1
            assert jsontext.compact_sorted(x) == repr(x), repr(x)
    assert seen > 100_000


def test_what_orjson_refuses_is_written_or_refused_by_json():
    big = {"n": 2**70, "m": [-(2**64)]}
    assert jsontext.compact_sorted(big) == _SORTED(big)
    keyed = {1: "x", 2.5: "y", None: "z"}
    assert jsontext.compact_sorted({"a": "x"}) == '{"a":"x"}'
    assert jsontext.compact_bytes(keyed) == _COMPACT(keyed).encode("utf-8")
    deep: list = []
    for _ in range(300):
        deep = [deep]
    assert jsontext.compact_sorted(deep) == _SORTED(deep)
    surrogate = {"s": "\ud800"}
    assert jsontext.compact_sorted(surrogate) == _SORTED(surrogate)
    # Types json refuses stay refused: datetimes, dataclasses, sets.
    for value in (datetime.datetime(2026, 1, 1), _Point(1, 2), {1, 2}):
        with pytest.raises(TypeError):
            jsontext.compact_sorted({"v": value})
        with pytest.raises(TypeError):
            jsontext.compact_bytes(value)


def test_subclasses_are_written_as_json_writes_them():
    class Name(str):
        pass

    class Count(int):
        pass

    value = {Name("k"): [Name("v"), Count(3)], "t": (1, 2)}
    assert jsontext.compact_sorted(value) == _SORTED(value)
    assert jsontext.compact_bytes(value) == _COMPACT(value).encode("utf-8")


def test_nan_is_refused_before_it_is_written():
    assert dump_json({"a": 1.5}) == '{"a":1.5}'
    with pytest.raises(ValueError):
        dump_json({"a": float("nan")})


def test_the_log_encoder_writes_what_json_has_no_type_for_with_the_default():
    encode = jsontext.encoder_with_default(lambda v: f"<{type(v).__name__}>")
    doc = {"at": datetime.datetime(2026, 1, 1), "p": _Point(1, 2), 3: "k", "big": 2**80,
           "s": "\u00e9"}
    assert json.loads(encode(doc)) == {"at": "<datetime>", "p": "<_Point>", "3": "k",
                                       "big": 2**80, "s": "\u00e9"}
    assert encode({"nan": float("nan")}) == '{"nan":null}'  # never JSON's non-standard NaN


@dataclasses.dataclass
class _Point:
    x: int
    y: int
