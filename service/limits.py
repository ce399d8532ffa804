"""Bounds on every JSON value the service accepts, stores, hashes or hands to the policy engine.

One home for them, so the HTTP body reader, the resource hash, the policy input converter and the
store agree: a value that passes the body reader can be hashed, converted and stored without
meeting a recursion limit anywhere further in.
"""

from __future__ import annotations

__all__ = ["MAX_JSON_DEPTH"]

#: Deepest nesting of arrays/objects accepted anywhere (the top-level value is depth 1).
#: Real resources, compose documents and policy inputs stay far below it.
MAX_JSON_DEPTH = 64
