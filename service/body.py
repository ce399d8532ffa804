"""Reading request bodies: content type (415), size (413), JSON syntax (400), bounds and schema
(422).

The bounds are ``service.limits``' (one walk, ``limits.check_json``), applied to the whole document
before the schema sees it: arrays/objects nested deeper than ``MAX_JSON_DEPTH`` (``too_deep``),
a top-level member (or a non-object document) whose compact JSON is over
``MAX_JSON_VALUE_BYTES`` (``too_large``), strings or keys with U+0000 or an unpaired surrogate
(``invalid_string``), numbers outside I-JSON (``invalid_number``). Each is a 422 whose
``errors[0].pointer`` says where; the value itself is never echoed.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from aiohttp import web

from . import limits
from .errors import MalformedJSON, UnsupportedMediaType
from .lru import LRU
from .schemas import validate

__all__ = ["check_document", "check_nesting", "read_json"]


def _is_json(content_type: str) -> bool:
    return content_type == "application/json" or (
        content_type.startswith("application/") and content_type.endswith("+json")
    )


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Two values for one key is ambiguous (parsers disagree on which wins): reject, never guess.
    doc: dict[str, Any] = {}
    for key, value in pairs:
        if key in doc:
            raise MalformedJSON(f"duplicate key {key[:64]!r} in JSON object")
        doc[key] = value
    return doc


def _no_constants(name: str) -> Any:
    raise MalformedJSON(f"{name} is not valid JSON")


# A JSON string (escapes included), to be skipped when counting brackets; written so that each
# character is looked at once (no backtracking on long strings).
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = str.maketrans({"[": "(", "{": "(", "]": ")", "}": ")"})
_NOT_BRACKETS = re.compile(r"[^()]+")


def check_nesting(text: str) -> None:
    """Refuse JSON text nesting arrays/objects deeper than ``MAX_JSON_DEPTH`` before it is
    parsed: one pass, no recursion, so the (recursive) parser never holds a deeper document.

    Text that is not JSON may be counted wrong here; the parser refuses it anyway (400), unless
    it opens more than ``MAX_JSON_DEPTH`` brackets, which is refused as ``too_deep`` first.
    """
    brackets = _NOT_BRACKETS.sub("", _STRING.sub("", text).translate(_BRACKETS))
    if brackets.count("(") <= limits.MAX_JSON_DEPTH:
        return
    depth = 0
    for char in brackets:
        if char == "(":
            depth += 1
            if depth > limits.MAX_JSON_DEPTH:
                raise limits.TooDeep(
                    f"the request body nests deeper than {limits.MAX_JSON_DEPTH} arrays/objects"
                )
        else:
            depth -= 1


def check_document(document: Any) -> None:
    """Refuse a parsed body outside ``service.limits`` (``limits.JSONValueRefused``)."""
    limits.check_json(document)
    members = (
        [("/" + k.replace("~", "~0").replace("/", "~1"), v) for k, v in document.items()]
        if type(document) is dict else [("", document)]
    )
    for pointer, value in members:
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
        limits.check_size(size, pointer)


def _parse(text: str) -> Any:
    return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants,
                      parse_int=limits.parse_int)


#: The digests of recent bodies that passed every check of ``read_json`` for a schema. Every
#: check is a function of the body's bytes and the schema (loaded once per process), so the same
#: bytes pass again: a repeated body (a client re-sending one compose file) is only parsed, not
#: walked and validated again (~5 ms for a 10-service compose import). Only successes are kept.
_PASSED: LRU[tuple[str | None, bytes], bool] = LRU(1024)


async def read_json(request: web.Request, schema: str | None = None) -> Any:
    """The request body as JSON, validated against ``schemas/<schema>`` when given.

    The size limit is the application's ``client_max_size`` (``server.max_body_bytes``); going
    over it raises aiohttp's 413, which the problems middleware renders.
    """
    if not _is_json(request.content_type):
        raise UnsupportedMediaType(
            f"expected Content-Type application/json, got {request.content_type[:100]!r}"
        )
    raw = await request.read()
    if not raw:
        raise MalformedJSON("the request body is empty; a JSON document is required")
    passed = (schema, hashlib.sha256(raw).digest())
    if _PASSED.get(passed):
        return _parse(raw.decode("utf-8"))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedJSON("the request body is not UTF-8") from None
    check_nesting(text)
    try:
        document = _parse(text)
    except json.JSONDecodeError as exc:
        raise MalformedJSON(
            f"the request body is not valid JSON (line {exc.lineno}, column {exc.colno})"
        ) from None
    check_document(document)
    if schema is not None:
        validate(schema, document)
    _PASSED.put(passed, True)
    return document
