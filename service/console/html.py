"""A tiny HTML template helper: ``$name`` placeholders whose values are escaped unless marked safe.

Every value that reaches a page goes through ``render`` (or ``escape``), so a ticket's reason,
resource or command can only ever be text: ``<script>`` in a reason renders as the characters
``<script>``. Pre-rendered fragments are ``Markup`` (only this module's functions make them).
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from string import Template
from typing import Any

__all__ = ["Markup", "escape", "join", "render"]


class Markup(str):
    """A string of HTML that is already safe (built by ``render``, ``escape`` or ``join``)."""

    __slots__ = ()


def escape(value: Any) -> Markup:
    """``value`` as HTML text (quotes escaped too: safe inside attribute values)."""
    if isinstance(value, Markup):
        return value
    return Markup(html.escape("" if value is None else str(value), quote=True))


def render(template: str, **values: Any) -> Markup:
    """``template`` with each ``$name`` replaced by its escaped value (``Markup`` as is)."""
    return Markup(Template(template).substitute({k: escape(v) for k, v in values.items()}))


def join(parts: Iterable[Markup | str], sep: str = "") -> Markup:
    """Fragments joined (plain strings among them are escaped)."""
    return Markup(sep.join(escape(p) for p in parts))
