"""Canonical JSON (RFC 8785, JCS): the bytes every hash and signature of the service is taken
over (audit records, resource and command bindings, policy revisions, checkpoints).

``rfc8785.dumps`` is the definition. It is pure Python and costs ~60 us for an audit record,
paid on every request; for the values the service hashes on its hot paths (strings, integers,
booleans, null, objects with string keys, arrays) a compact key-sorted JSON encoder writes the
very same bytes at C speed (``service.jsontext.compact_sorted``: orjson, which for these values
writes what the standard library's encoder writes), provided that:

- every integer is one JCS accepts (|n| < 2**53: outside it, ``rfc8785`` refuses), and every
  float is one whose Python ``repr`` is the form JCS gives it (``0.5``, ``12.75``; not ``1.0``,
  which JCS writes ``1``, nor ``1e-07``, which it writes ``1e-7``);
- no string holds a code point at or above U+D800: a lone surrogate is refused by ``rfc8785``,
  and beyond it JCS orders keys by UTF-16 code units where Python orders by code points.

Anything else goes to ``rfc8785.dumps``, which also raises its ``CanonicalizationError`` for what
JCS cannot express. A property test holds the two equal (tests/test_canonical.py).
"""

from __future__ import annotations

import re
from typing import Any

import rfc8785

from . import jsontext

__all__ = ["dumps", "is_canonical"]

_MAX_INT = 2**53 - 1
_HIGH = re.compile("[\ud800-\U0010ffff]")


def dumps(value: Any) -> bytes:
    """The RFC 8785 canonical form of ``value`` as UTF-8 bytes."""
    if _plain(value):
        text = jsontext.compact_sorted(value)
        if below_surrogates(text):
            return text.encode("utf-8")
    return rfc8785.dumps(value)


def is_canonical(value: Any, text: str) -> bool:
    """Whether ``text``, the compact key-sorted encoding of ``value`` (``jsontext.compact_sorted``,
    as ``store.sql.dump_json`` writes it), is already ``value``'s RFC 8785 form: then its UTF-8
    bytes are what ``dumps`` would return, and hashing them needs no second encoding."""
    return _plain(value) and below_surrogates(text)


def below_surrogates(text: str) -> bool:
    """No code point at or above U+D800 (an ASCII text, most of them, without the search)."""
    return text.isascii() or _HIGH.search(text) is None


def float_fits(number: float) -> bool:
    """Whether ``number``'s standard encoding (``repr``) is its RFC 8785 form."""
    # Fixed notation on both sides, with the same shortest round-trip digits: repr() writes
    # 1e-4 <= |x| < 1e16 positionally, ECMAScript 1e-7 <= |x| < 1e21; an integral float is
    # "1.0" in Python and "1" in JCS. Arithmetic, so a timestamp costs no rfc8785 call; what
    # falls outside (1e+21, 5e-324: the two may still agree) asks rfc8785.
    if 1e-4 <= abs(number) < 1e16 and not number.is_integer():
        return True
    try:
        return rfc8785.dumps(number) == repr(number).encode()
    except rfc8785.CanonicalizationError:  # NaN, infinities: refused by the fallback
        return False


def _plain(value: Any) -> bool:
    """Only types whose standard encoding is JCS's (see the module's docstring); iterative, so
    depth costs no recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str or kind is bool or item is None:
            continue
        if kind is int:
            if -_MAX_INT <= item <= _MAX_INT:
                continue
            return False
        if kind is float:
            # json writes repr(x); where that is JCS's own form (0.5, 1.25e+30 is not), it fits.
            if float_fits(item):
                continue
            return False
        if kind is dict:
            for key in item:
                if type(key) is not str:
                    return False
            stack.extend(item.values())
            continue
        if kind is list:
            stack.extend(item)
            continue
        return False
    return True
