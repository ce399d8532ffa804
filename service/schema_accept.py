"""A fast, import-light test that a document certainly matches one of ``schemas/``.

``cpctl compose check`` validates its request body as the endpoint does; importing
``jsonschema`` (with ``referencing`` and the metaschemas) is ~0.1-0.3 s of a process that
otherwise takes ~0.3 s. ``accepts`` answers "certainly valid" for the common case without that
import; anything else (an invalid document, or one it is not sure of) goes to
``service.schemas.validate``, so every error message still comes from ``jsonschema`` and is the
endpoint's. It is exact where it says yes: it knows only the keywords listed in ``_decide``
(with Draft 2020-12's meaning, ``pattern`` as ``ecma_regex``), and any other keyword, a ``$ref``
outside the document, or a value that is not plain JSON makes it unsure, never "valid".
tests/compose/test_schema_accept.py holds it to ``jsonschema``'s answer.

The service asks it first too (``service.schemas.validate``): a valid request body, most of
them, then costs a walk of this module's instead of jsonschema's (an installer action's body:
~40 us less on every production run). tests/test_schema_accept_bodies.py holds it to
jsonschema's answer for every request body schema.
"""

from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path
from typing import Any

__all__ = ["SCHEMA_DIR", "accepts", "ecma_regex"]

#: The repository's ``schemas/`` directory (shipped beside the package).
SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"

#: Keywords that never change whether a document is valid (annotations; ``$defs`` only holds
#: what a ``$ref`` names).
_ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "$comment", "title", "description", "default",
                          "examples", "deprecated", "readOnly", "writeOnly"})
_TYPES: dict[str, Any] = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool))
    or (isinstance(v, float) and v.is_integer()),
}
_PLAIN = (dict, list, str, int, float, bool, type(None))


@functools.lru_cache(maxsize=1024)
def ecma_regex(pattern: str) -> re.Pattern[str]:
    """``pattern`` compiled with ECMA-262's meaning of ``$`` (end of input: ``\\Z``) and of
    ``\\d``/``\\w`` (ASCII). Unescaped ``$`` outside a character class is the only rewrite."""
    out: list[str] = []
    i, in_class = 0, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "$":
            char = r"\Z"
        out.append(char)
        i += 1
    return re.compile("".join(out), re.ASCII)


@functools.cache
def _schema(name: str) -> Any:
    return json.loads((SCHEMA_DIR / name).read_text(encoding="utf-8"))


def accepts(name: str, document: Any) -> bool:
    """Whether ``document`` certainly matches ``schemas/<name>``; ``False`` when it does not or
    when this cannot tell (then ask ``service.schemas.validate``)."""
    root = _schema(name)
    try:
        return _decide(root, document, root) is True
    except RecursionError:
        return False


def _decide(schema: Any, value: Any, root: Any) -> bool | None:
    """``True`` valid, ``False`` invalid, ``None`` not sure (a keyword or value not known)."""
    if schema is True or schema is False:
        return schema
    if not isinstance(schema, dict) or not isinstance(value, _PLAIN):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None  # comparisons with NaN answer False either way: not sure is the exact answer
    answer: bool | None = True
    for keyword, arg in schema.items():
        if keyword in _ANNOTATIONS:
            continue
        verdict = _keyword(keyword, arg, schema, value, root)
        if verdict is False:
            return False
        if verdict is None:
            answer = None
    return answer


def _all(verdicts: Any) -> bool | None:
    answer: bool | None = True
    for verdict in verdicts:
        if verdict is False:
            return False
        if verdict is None:
            answer = None
    return answer


def _keyword(keyword: str, arg: Any, schema: dict[str, Any], value: Any,
             root: Any) -> bool | None:
    if keyword == "type":
        names = [arg] if isinstance(arg, str) else arg
        if not isinstance(names, list) or any(n not in _TYPES for n in names):
            return None
        return any(_TYPES[n](value) for n in names)
    if keyword == "$ref":
        if not isinstance(arg, str) or not arg.startswith("#/$defs/") or "~" in arg:
            return None
        target = root.get("$defs", {}).get(arg.removeprefix("#/$defs/"))
        return None if target is None else _decide(target, value, root)
    if keyword == "not":
        inner = _decide(arg, value, root)
        return None if inner is None else not inner
    if keyword == "enum":
        if not isinstance(value, str) or not isinstance(arg, list):
            return None  # strings only: jsonschema's equality of numbers and booleans differs
        return value in [e for e in arg if isinstance(e, str)]
    if keyword == "const":
        if not isinstance(value, str) or not isinstance(arg, str):
            return None  # strings only, as enum
        return value == arg
    if keyword == "allOf":
        if not isinstance(arg, list):
            return None
        return _all(_decide(sub, value, root) for sub in arg)
    if keyword == "if":
        condition = _decide(arg, value, root)
        if condition is None:
            return None
        branch = schema.get("then" if condition else "else", True)
        return _decide(branch, value, root)
    if keyword in ("then", "else"):
        return True  # decided with their "if" (and without one, they do not apply)
    if keyword in ("oneOf", "anyOf"):
        if not isinstance(arg, list) or not arg:
            return None
        verdicts = [_decide(sub, value, root) for sub in arg]
        if None in verdicts:
            return None
        return verdicts.count(True) == 1 if keyword == "oneOf" else True in verdicts
    if isinstance(value, str):
        if keyword == "pattern":
            return isinstance(arg, str) and ecma_regex(arg).search(value) is not None
        if keyword == "minLength":
            return bool(len(value) >= arg)
        if keyword == "maxLength":
            return bool(len(value) <= arg)
    if isinstance(value, int | float) and not isinstance(value, bool):
        if keyword == "minimum":
            return bool(value >= arg)
        if keyword == "maximum":
            return bool(value <= arg)
    if isinstance(value, list):
        if keyword == "items":
            return _all(_decide(arg, item, root) for item in value)
        if keyword == "maxItems":
            return bool(len(value) <= arg)
        if keyword == "minItems":
            return bool(len(value) >= arg)
    if isinstance(value, dict):
        return _object_keyword(keyword, arg, schema, value, root)
    if keyword in _APPLIES_TO_OTHER_TYPES:
        return True  # a keyword about another type holds for this value (Draft 2020-12)
    return None


#: The keywords above that hold for a value of a type they do not speak about.
_APPLIES_TO_OTHER_TYPES = frozenset({"pattern", "minLength", "maxLength", "minimum", "maximum",
                                     "items", "minItems", "maxItems", "properties",
                                     "additionalProperties", "required", "propertyNames",
                                     "minProperties", "maxProperties"})


def _object_keyword(keyword: str, arg: Any, schema: dict[str, Any], value: dict[str, Any],
                    root: Any) -> bool | None:
    if keyword == "required":
        return all(key in value for key in arg)
    if keyword == "properties":
        return _all(_decide(sub, value[key], root) for key, sub in arg.items() if key in value)
    if keyword == "additionalProperties":
        if "patternProperties" in schema:
            return None
        known = schema.get("properties") or {}
        return _all(_decide(arg, item, root) for key, item in value.items() if key not in known)
    if keyword == "propertyNames":
        return _all(_decide(arg, key, root) for key in value)
    if keyword == "minProperties":
        return bool(len(value) >= arg)
    if keyword == "maxProperties":
        return bool(len(value) <= arg)
    if keyword in _APPLIES_TO_OTHER_TYPES:
        return True
    return None
