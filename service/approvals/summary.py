"""A ticket's resource in one short line (``app=payments version=2.4.0``): what tells two pending
tickets apart in the console, notifications, ``cpctl approval list`` and the ticket's wire form."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["SUMMARY_CHARS", "resource_summary"]

#: Longest summary; a longer one ends with "…".
SUMMARY_CHARS = 80

_VALUE_CHARS = 40
#: Members shown first, in this order (the ones that name what is run); the rest by name.
_FIRST = ("app", "name", "service", "component", "version", "image", "tag", "revision",
          "task_id", "collection")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def resource_summary(resource: Any) -> str:
    """``key=value`` for each member of an object resource (scalars as they are, nested values
    as compact JSON), the naming members first; a string resource as it is; at most
    ``SUMMARY_CHARS`` characters, whitespace folded to single spaces (one line, always)."""
    if isinstance(resource, str):
        return _clip(_one_line(resource), SUMMARY_CHARS)
    if not isinstance(resource, Mapping):
        return _clip(json.dumps(resource, ensure_ascii=False), SUMMARY_CHARS)
    order = {name: i for i, name in enumerate(_FIRST)}
    parts = []
    for key in sorted(resource, key=lambda k: (order.get(k, len(order)), str(k))):
        value = resource[key]
        text = value if isinstance(value, str) else json.dumps(
            value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
        parts.append(f"{_one_line(str(key))}={_clip(_one_line(text), _VALUE_CHARS)}")
    return _clip(" ".join(parts), SUMMARY_CHARS)
