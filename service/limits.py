"""Bounds on every JSON value the service accepts, stores, hashes or hands to the policy engine.

One home for them, so the HTTP body reader, the resource hash, the policy input converter and the
store agree: a value that passes the body reader can be hashed, converted and stored without
meeting a recursion limit, an encoding error or a database refusal anywhere further in.

``check_json`` is the one walk that enforces them (iteratively: it never recurses, whatever the
depth). It raises a ``JSONValueRefused`` subclass naming the JSON pointer of the offending value;
``service.errors`` maps each to a 422 with a stable code:

=================  ================  =====================================================
exception          code              refused
=================  ================  =====================================================
``TooDeep``        ``too_deep``      arrays/objects nested deeper than ``MAX_JSON_DEPTH``
``TooLarge``       ``too_large``     a value whose compact JSON is over ``MAX_JSON_VALUE_BYTES``
``InvalidString``  ``invalid_string``  a string or key with U+0000 or an unpaired surrogate
``InvalidNumber``  ``invalid_number``  an integer beyond +-(2**53 - 1), a non-finite number
=================  ================  =====================================================

Strings: U+0000 cannot be stored in a PostgreSQL ``jsonb`` (nor passed to the policy engine,
whose C strings would truncate it), and an unpaired surrogate (``"\\ud800"``) is not Unicode: it
has no UTF-8 form, so SQLite cannot store it and RFC 8785 cannot hash it. Neither can be kept
faithfully by both backends, so neither is accepted. Numbers: I-JSON (RFC 7493), the range RFC
8785 hashes exactly and every JSON client reads back unchanged; this also keeps Python's own
4,300-digit integer conversion limit out of reach.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

__all__ = [
    "MAX_INPUT_DEPTH",
    "MAX_JSON_DEPTH",
    "MAX_JSON_INTEGER",
    "MAX_JSON_VALUE_BYTES",
    "InvalidNumber",
    "InvalidString",
    "JSONValueRefused",
    "TooDeep",
    "TooLarge",
    "check_json",
    "check_size",
    "is_valid_string",
    "parse_int",
    "text_size",
]

#: Deepest nesting of arrays/objects accepted anywhere (the top-level value is depth 1).
#: Real resources, compose documents and policy inputs stay far below it.
MAX_JSON_DEPTH = 64

#: Deepest nesting of the policy input document: it holds a request's resource as sent at
#: ``input.resource.value``, two levels below its top, and that resource is a body member (at
#: most ``MAX_JSON_DEPTH - 1`` deep), so the input may reach one level more; one spare.
MAX_INPUT_DEPTH = MAX_JSON_DEPTH + 2

#: Largest compact UTF-8 JSON text of one value that is stored, hashed or evaluated: a request
#: body's members (a ticket's resource, a compose document's fields, a task event's result), a
#: value the store serialises. 256 KiB: a quarter of the default request body limit
#: (``server.max_body_bytes``, 1 MiB), so the bound holds at the defaults and is not loosened by
#: raising the body limit; several times the largest real compose document (a hundred services
#: come to well under 100 KiB); and small enough that a stored ticket read back in a list page
#: cannot make one response tens of MiB per item.
MAX_JSON_VALUE_BYTES = 256 * 1024

#: I-JSON's exact integer range (RFC 7493 2.2): the integers an IEEE 754 double holds exactly.
MAX_JSON_INTEGER = 2**53 - 1

_MAX_POINTER = 300  # characters of a pointer reported back


class JSONValueRefused(ValueError):
    """A JSON value outside the bounds. ``pointer`` is where (RFC 6901, "" for the whole)."""

    code: ClassVar[str] = "invalid_json_value"

    def __init__(self, message: str, pointer: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.pointer = pointer if len(pointer) <= _MAX_POINTER else pointer[:_MAX_POINTER] + "..."


class TooDeep(JSONValueRefused):
    code = "too_deep"


class TooLarge(JSONValueRefused):
    code = "too_large"


class InvalidString(JSONValueRefused):
    code = "invalid_string"


class InvalidNumber(JSONValueRefused):
    code = "invalid_number"


def is_valid_string(text: str) -> bool:
    """No U+0000 and no unpaired surrogate (the text has a UTF-8 form)."""
    if "\0" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def text_size(text: str) -> int | None:
    """The UTF-8 size of ``text``, a value's compact JSON written without checking its strings
    (``check_json(strings=False)``), or None when the text says a string must be checked: it
    has no UTF-8 form (an unpaired surrogate) or holds an escaped U+0000 (perhaps only a
    string's own backslash: the whole walk says which)."""
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            return None
    return None if "\\u0000" in text else size


def check_size(nbytes: int, pointer: str = "") -> None:
    """Refuse a value whose serialised form takes ``nbytes`` when that is over the bound."""
    if nbytes > MAX_JSON_VALUE_BYTES:
        raise TooLarge(f"the value takes {nbytes} bytes as JSON; at most "
                       f"{MAX_JSON_VALUE_BYTES} are accepted", pointer)


def _escape(token: object) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


def check_json(value: Any, pointer: str = "", *, depth: int = 1, strings: bool = True) -> None:
    """Refuse ``value`` (at ``pointer``, nested at ``depth``) unless every part of it is within
    the bounds above: depth, strings and keys, numbers. Size is the caller's, on the text it
    makes (``check_size``). Types JSON does not have are left to the serialiser that meets them.
    ``strings=False``: strings and keys are left to the caller, who checks the JSON text it
    makes (``store.sql.dump_json``: no escaped U+0000, a UTF-8 form) and, only when that text
    has one, walks again with them to say where.
    """
    # (value, depth, parent entry, key): the pointer is only built for the one that is refused.
    stack: list[tuple[Any, int, Any, object]] = [(value, depth, None, None)]

    def where(entry: Any) -> str:
        parts: list[str] = []
        while entry is not None and entry[2] is not None:
            parts.append(_escape(entry[3]))
            entry = entry[2]
        return pointer + "".join("/" + p for p in reversed(parts))

    while stack:
        entry = stack.pop()
        v, d = entry[0], entry[1]
        t = type(v)
        if t is str:
            if strings and not is_valid_string(v):
                raise InvalidString("a string contains U+0000 or an unpaired surrogate", where(entry))
        elif t is int:
            if not -MAX_JSON_INTEGER <= v <= MAX_JSON_INTEGER:
                raise InvalidNumber("an integer is outside +-(2**53 - 1) (I-JSON)", where(entry))
        elif t is float:
            if not math.isfinite(v):
                raise InvalidNumber("a number is not finite", where(entry))
        elif t is dict or t is list or t is tuple:
            if d > MAX_JSON_DEPTH:
                raise TooDeep(f"the value nests deeper than {MAX_JSON_DEPTH} arrays/objects",
                              where(entry))
            if t is dict:
                for k, x in v.items():
                    if strings and type(k) is str and not is_valid_string(k):
                        raise InvalidString("an object key contains U+0000 or an unpaired "
                                            "surrogate", where(entry))
                    if strings or type(x) is not str:
                        stack.append((x, d + 1, entry, k))
            else:
                for i, x in enumerate(v):
                    if strings or type(x) is not str:
                        stack.append((x, d + 1, entry, i))
        elif isinstance(v, _OutOfRange):
            raise InvalidNumber("an integer is outside +-(2**53 - 1) (I-JSON)", where(entry))


class _OutOfRange:
    """What ``parse_int`` returns for an integer literal too long to convert (kept for the walk,
    which reports where it is). Never escapes the body reader."""

    __slots__ = ("digits",)

    def __init__(self, digits: int) -> None:
        self.digits = digits


#: Digits of the longest integer literal that can be within ``MAX_JSON_INTEGER``.
_MAX_DIGITS = len(str(MAX_JSON_INTEGER))


def parse_int(literal: str) -> Any:
    """``json.loads``' ``parse_int``: never converts a literal Python would refuse (or spend
    quadratic time on); ``check_json`` then refuses what is out of range, with its pointer."""
    if len(literal) - literal.startswith("-") > _MAX_DIGITS:
        return _OutOfRange(len(literal))
    return int(literal)
