"""Reading request bodies: content type (415), size (413), JSON syntax (400), schema (422)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from .errors import MalformedJSON, UnsupportedMediaType
from .schemas import validate

__all__ = ["read_json"]


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
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedJSON("the request body is not UTF-8") from None
    try:
        document = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        raise MalformedJSON(
            f"the request body is not valid JSON (line {exc.lineno}, column {exc.colno})"
        ) from None
    except RecursionError:
        raise MalformedJSON("the request body nests too deeply") from None
    if schema is not None:
        validate(schema, document)
    return document
