"""Query-string parameters, validated: a bad value is a 422 naming the parameter."""

from __future__ import annotations

import re
from collections.abc import Sequence

from aiohttp import web

from ..errors import SchemaValidationFailed
from ..store.base import MAX_PAGE

__all__ = ["query_int", "query_known", "query_page_limit", "query_str"]


def _invalid(name: str, message: str) -> SchemaValidationFailed:
    return SchemaValidationFailed(
        f"query parameter {name!r} is invalid",
        code="invalid_query",
        errors=[{"pointer": f"/query/{name}", "message": message}],
    )


def query_known(request: web.Request, names: Sequence[str]) -> None:
    """Refuse a parameter the route does not take (a typo is not silently ignored)."""
    for name in request.query:
        if name not in names:
            raise _invalid(name, "not a parameter of this route")


def query_str(
    request: web.Request,
    name: str,
    *,
    pattern: str | None = None,
    choices: Sequence[str] | None = None,
) -> str | None:
    """One optional string parameter (repeated parameters are refused, not guessed)."""
    values = request.query.getall(name, [])
    if not values:
        return None
    if len(values) > 1:
        raise _invalid(name, "given more than once")
    value = values[0]
    if choices is not None and value not in choices:
        raise _invalid(name, f"must be one of {', '.join(choices)}")
    if pattern is not None and not re.fullmatch(pattern, value):
        raise _invalid(name, f"must match {pattern}")
    return value


def query_int(request: web.Request, name: str, *, default: int, low: int, high: int) -> int:
    """One optional integer parameter within [low, high]."""
    text = query_str(request, name, pattern=r"-?[0-9]{1,12}")
    if text is None:
        return default
    value = int(text)
    if not low <= value <= high:
        raise _invalid(name, f"must be between {low} and {high}")
    return value


def query_page_limit(request: web.Request, *, default: int, high: int) -> int:
    """The ``limit`` of a paged read, within [1, high], and never more than the store returns in
    one call (``MAX_PAGE``): a page that comes back this full then has a next cursor, so a
    client asking for more than one store page misses nothing."""
    return min(query_int(request, "limit", default=default, low=1, high=high), MAX_PAGE)
