"""Helpers for tests that take JSON documents apart."""

from __future__ import annotations

from typing import Any


def places(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``doc`` (not the root)."""
    found = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) \
        else ()
    for key, value in items:
        found.append((*path, key))
        found += places(value, (*path, key))
    return found
