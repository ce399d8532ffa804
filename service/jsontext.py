"""JSON text on the hot paths, written by orjson (C) with the standard library as its fallback.

Every request writes three or more JSON texts: its response, its audit record (the stored
text, which is also the record's RFC 8785 form: ``service.canonical``), its access line.
``json``'s encoder took ~6 us for an audit record where orjson takes ~0.6 (measured on the
authorized read); orjson is a maintained, widely used library and writes, for the values the
service hashes, exactly the text ``json`` writes (a property test holds them equal:
``tests/test_jsontext.py``):

- strings: the same escapes (``\\"``, ``\\\\``, ``\\b\\f\\n\\r\\t``, ``\\u00XX`` in lowercase
  for the other control characters) and every other code point as itself, in UTF-8;
- integers as digits; floats in the shortest form that reads back, as ``repr`` writes them
  wherever ``service.canonical`` takes the text as canonical (it admits no other float);
  elsewhere (below 1e-4) orjson writes the positional form (``0.00001`` for ``1e-05``): the
  same number, only spelled as RFC 8785 spells it;
- keys sorted by code point (``sort_keys``): UTF-8 byte order is code point order.

Where orjson would not write what ``json`` writes, it refuses, and ``json`` writes the value
(or raises its own error): integers beyond 64 bits, non-string keys, strings without a UTF-8
form (an unpaired surrogate), nesting over 254 levels, and (``_STRICT``) datetimes, dataclasses
and subclasses of ``str``/``int``/``dict``/``list``, which orjson would otherwise write its own
way. Two types ``json`` refuses are written by orjson: ``uuid.UUID`` (as its text) and enums
(as their value); neither reaches a JSON text on purpose, and neither could change a hash
silently: a hash is taken over the text that was written.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson

__all__ = ["compact_bytes", "compact_sorted", "encoder_with_default"]

#: Types orjson writes its own way and ``json`` does not: sent to the fallback instead.
_STRICT = (orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
           | orjson.OPT_PASSTHROUGH_SUBCLASS)
_SORTED = _STRICT | orjson.OPT_SORT_KEYS

_json_sorted = json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode
_json_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_dumps = orjson.dumps
_Refused = orjson.JSONEncodeError


def compact_sorted(value: Any) -> str:
    """``json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)``.

    Raises what ``json`` raises for a value it cannot write (``TypeError``, ``ValueError``);
    ``UnicodeEncodeError`` never: a string without a UTF-8 form is written as ``json`` writes
    it (the caller's own checks refuse it)."""
    try:
        return _dumps(value, option=_SORTED).decode()
    except _Refused:
        return _json_sorted(value)


def compact_bytes(value: Any) -> bytes:
    """``value`` as compact JSON in UTF-8, keys in their order: a response body as it is sent
    (orjson's own bytes, no text in between). Raises ``UnicodeEncodeError`` where the text has
    no UTF-8 form (an unpaired surrogate)."""
    try:
        return _dumps(value, option=_STRICT)
    except _Refused:
        return _json_compact(value).encode("utf-8")


def encoder_with_default(default: Callable[[Any], Any]) -> Callable[[Any], str]:
    """A compact encoder that writes what JSON has no type for as ``default(value)`` does (a log
    line's fields: never refused). Keys that are not strings are written as their text."""
    fallback = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=default).encode
    option = _STRICT | orjson.OPT_NON_STR_KEYS

    def encode(value: Any) -> str:
        try:
            return _dumps(value, default=default, option=option).decode()
        except _Refused:
            return fallback(value)

    return encode
