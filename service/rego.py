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
                self._interpreter.set_input(regopy.Input(dict(input_doc)))
                output = self._interpreter.query_bundle_entrypoint(self._bundle, entrypoint)
            except regopy.RegoError as exc:
                raise RegoEvalError(_first_line(str(exc))) from None
            except ValueError as exc:
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
