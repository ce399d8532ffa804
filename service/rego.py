"""The only module that imports regopy: compile Rego modules + data into a bundle, query it.

regopy wraps a native library with sharp edges, so they are all handled here:
- ``Output.expressions()`` on an error output aborts the whole process (a C++ ``std::logic_error``),
  so results are read only after ``ok()`` is checked, and only through ``Output.results``;
- an undefined result is an ``ok`` output whose text is ``undefined`` and has no results;
- setting input from a ``dict`` (``regopy.Input``) is ~4x cheaper than from JSON text;
- an ``Interpreter`` is not safe to share between threads: a ``Bundle`` owns one and serialises
  queries with a lock, and callers that want parallelism use processes (one bundle per worker).
"""

from __future__ import annotations

import ctypes
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import regopy

__all__ = ["Bundle", "RegoCompileError", "RegoEvalError", "Undefined", "compile_bundle"]


class RegoCompileError(Exception):
    """A module does not parse or compile, or an entrypoint has no plan."""


class RegoEvalError(Exception):
    """Evaluation failed (runtime error, missing plan)."""


class _UndefinedType:
    _instance: _UndefinedType | None = None

    def __new__(cls) -> _UndefinedType:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "Undefined"

    def __bool__(self) -> bool:
        return False


#: The value of a query whose result is undefined (no rule produced a value).
Undefined = _UndefinedType()


@dataclass(frozen=True)
class Module:
    """One Rego module: a name (usually its relative path) and its source text."""

    name: str
    source: str


class Bundle:
    """A compiled policy bundle with fixed entrypoints, queried with a ``dict`` input."""

    def __init__(self, interpreter: regopy.Interpreter, bundle: Any, entrypoints: tuple[str, ...]):
        self._interpreter = interpreter
        self._bundle = bundle
        self._lock = threading.Lock()
        self.entrypoints = entrypoints

    def query(self, entrypoint: str, input_doc: Mapping[str, Any]) -> Any:
        """Evaluate ``entrypoint`` (``a/b/c`` form) with ``input_doc``; ``Undefined`` if no value."""
        if entrypoint not in self.entrypoints:
            raise RegoEvalError(f"entrypoint {entrypoint!r} was not compiled into this bundle")
        with self._lock:
            try:
                self._interpreter.set_input(_input(input_doc))
                output = self._interpreter.query_bundle_entrypoint(self._bundle, entrypoint)
            except regopy.RegoError as exc:
                raise RegoEvalError(_first_line(str(exc))) from None
            except (ValueError, TypeError, ctypes.ArgumentError) as exc:
                # regopy builds Output by json-parsing the native result; an evaluation error
                # (e.g. an unknown builtin) arrives as an s-expression and fails that parse.
                raise RegoEvalError(_errormsg(getattr(exc, "doc", "") or str(exc))) from None
            if not output.ok():
                raise RegoEvalError(_first_line(str(output)))
            results = output.results
        if not results:
            return Undefined
        expressions = results[0].expressions
        if not expressions:
            return Undefined
        return expressions[0]


def compile_bundle(
    modules: Iterable[Module],
    data: Mapping[str, Any],
    entrypoints: Iterable[str],
) -> Bundle:
    """Compile ``modules`` and the base ``data`` document into a bundle with ``entrypoints``.

    Raises ``RegoCompileError`` with the engine's message (file, line, column) on any error.
    """
    interpreter = regopy.Interpreter()
    eps = tuple(entrypoints)
    if not eps:
        raise RegoCompileError("a bundle needs at least one entrypoint")
    try:
        for module in modules:
            interpreter.add_module(module.name, module.source)
        if data:
            interpreter.add_data(dict(data))
        bundle = interpreter.build(None, list(eps))
    except regopy.RegoError as exc:
        raise RegoCompileError(_compact(str(exc))) from None
    return Bundle(interpreter, bundle, eps)


def query_once(modules: Iterable[Module], data: Mapping[str, Any], query: str) -> Any:
    """Run a one-off ad-hoc query (used by offline tooling, e.g. test discovery); not for hot paths."""
    interpreter = regopy.Interpreter()
    try:
        for module in modules:
            interpreter.add_module(module.name, module.source)
        if data:
            interpreter.add_data(dict(data))
        output = interpreter.query(query)
    except regopy.RegoError as exc:
        raise RegoCompileError(_compact(str(exc))) from None
    if not output.ok():
        raise RegoEvalError(_first_line(str(output)))
    results = output.results
    if not results or not results[0].expressions:
        return Undefined
    return results[0].expressions[0]


_native = regopy.rego_shared.rego
_IN_STR, _IN_INT, _IN_FLOAT, _IN_BOOL, _IN_NULL = (
    _native.regoInputString, _native.regoInputInt, _native.regoInputFloat,
    _native.regoInputBoolean, _native.regoInputNull)
_IN_ITEM, _IN_OBJECT, _IN_ARRAY = (
    _native.regoInputObjectItem, _native.regoInputObject, _native.regoInputArray)


def _input(value: Mapping[str, Any]) -> regopy.Input:
    """``regopy.Input(value)`` at ~60% of the cost: one native call per node, no per-string buffer.

    Input conversion dominates a decision's cost (one native call per JSON node), so this is the
    hot path. Same node sequence as regopy's own converter; strings with NUL are refused (a C
    string would silently truncate them, and the policy would see a different value).
    """
    handle = _native.regoNewInput()
    holder = regopy.Input.__new__(regopy.Input)
    holder._impl = handle  # freed by Input.__del__, also when conversion fails below
    status = 0

    def add(v: Any) -> None:
        nonlocal status
        t = type(v)
        if t is str:
            raw = v.encode("utf-8")
            if b"\0" in raw:
                raise ValueError("NUL character in input string")
            status |= _IN_STR(handle, raw)
        elif t is dict:
            for k, x in v.items():
                if type(k) is not str:
                    raise ValueError("input object keys must be strings")
                raw = k.encode("utf-8")
                if b"\0" in raw:
                    raise ValueError("NUL character in input key")
                status |= _IN_STR(handle, raw)
                add(x)
                status |= _IN_ITEM(handle)
            status |= _IN_OBJECT(handle, len(v))
        elif t is list or t is tuple:
            for x in v:
                add(x)
            status |= _IN_ARRAY(handle, len(v))
        elif t is bool:
            status |= _IN_BOOL(handle, v)
        elif t is int:
            status |= _IN_INT(handle, v)
        elif t is float:
            status |= _IN_FLOAT(handle, v)
        elif v is None:
            status |= _IN_NULL(handle)
        elif isinstance(v, Mapping):
            add(dict(v))
        else:
            raise TypeError(f"cannot convert {t.__name__} to rego input")

    add(dict(value))
    if status:
        raise ValueError("the native library refused the input")
    return holder


def _errormsg(text: str) -> str:
    """The ``(errormsg N:text)`` payload of a native error s-expression, else its first line."""
    match = re.search(r"\(errormsg \d+:([^)]*)\)", text)
    return match.group(1).strip()[:500] if match else _first_line(text)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:500]
    return "rego evaluation error"


def _compact(text: str) -> str:
    """Shorten regopy's error sequence to its messages with their ``file|line|col`` locations."""
    return " ".join(text.split())[:2000]
