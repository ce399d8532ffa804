"""The only module that imports regopy: compile Rego modules + data into a bundle, query it.

regopy wraps a native library with sharp edges, so they are all handled here:
- ``Output.expressions()`` on an error output aborts the whole process (a C++ ``std::logic_error``),
  so a query reads results only from the output's JSON text, after ``regoOutputOk``;
- an undefined result is an ``ok`` output whose text is ``undefined`` and has no results;
- setting input node by node is ~4x cheaper than from JSON text; ``_push`` makes those calls
  through regopy's own ctypes bindings, to a bounded depth (``service.limits.MAX_INPUT_DEPTH``);
- everything used here beyond regopy's public API (``rego_shared``, the ``rego*`` functions and
  their ctypes signatures, ``_impl``) is asserted by tests/authz/test_rego_private_api.py, and
  pyproject.toml pins regopy to the minor version those tests passed with;
- the hot path (``Bundle.query``) calls the native library directly: one output read, no
  ``Output``/``Result`` objects, the input handle freed right after ``regoSetInput`` copied it;
- regopy writes strings into an output's JSON text as they are, unescaped: a result string
  with a ``"``, a ``\\`` or a control character copied from the input makes that text unreadable
  (or readable as another structure). When the input holds such a string, the result is read from
  the output's node tree instead (``_tree_expression``), so any string is data;
- an ``Interpreter`` is not safe to share between threads: a ``Bundle`` owns one and serialises
  queries with a lock, and callers that want parallelism use processes (one bundle per worker).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import hmac
import json
import os
import re
import stat
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import regopy

from service.limits import MAX_INPUT_DEPTH

__all__ = [
    "Bundle", "InputTooDeep", "RegoCompileError", "RegoEvalError", "Undefined", "builtins_among",
    "compile_bundle",
]


class RegoCompileError(Exception):
    """A module does not parse or compile, or an entrypoint has no plan."""


class RegoEvalError(Exception):
    """Evaluation failed (runtime error, missing plan, an input that cannot be converted)."""


class InputTooDeep(ValueError):
    """An input document nests arrays/objects deeper than ``MAX_INPUT_DEPTH`` (the top level is 1).

    A ``ValueError`` like every other unconvertible input, so ``Bundle.query`` reports it as a
    ``RegoEvalError`` ("input cannot be converted") and the engine fails closed.
    """


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
        self._known(entrypoint)
        handle, verbatim = _converted(input_doc)
        with self._lock:
            self._set_input(handle)
            return self._query(entrypoint, verbatim)

    def query_each(self, entrypoints: Iterable[str], input_doc: Mapping[str, Any]) -> list[Any]:
        """Evaluate every entrypoint against one input, converted and set once: per entrypoint
        its value (``Undefined`` if none) or the ``RegoEvalError`` it failed with, so one failing
        entrypoint does not cost the others their results. Raises ``RegoEvalError`` only when
        the input itself cannot be converted or set."""
        eps = list(entrypoints)
        for entrypoint in eps:
            self._known(entrypoint)
        handle, verbatim = _converted(input_doc)
        results: list[Any] = []
        with self._lock:
            self._set_input(handle)
            for entrypoint in eps:
                try:
                    results.append(self._query(entrypoint, verbatim))
                except RegoEvalError as exc:
                    results.append(exc)
        return results

    def save(self, path: str) -> None:
        """Write the compiled bundle to ``path`` in regopy's binary format (the bundle cache's)."""
        with self._lock:
            self._interpreter.save_bundle(path, self._bundle, regopy.BundleFormat.Binary)

    def _known(self, entrypoint: str) -> None:
        if entrypoint not in self.entrypoints:
            raise RegoEvalError(f"entrypoint {entrypoint!r} was not compiled into this bundle")

    def _set_input(self, handle: int) -> None:
        """Give the interpreter the input (with the lock held); the handle is freed either way."""
        interpreter = self._interpreter._impl
        try:
            # The interpreter copies the input (regopy itself frees a temporary Input right
            # after set_input), so the handle is released before any query.
            status = _native.regoSetInput(interpreter, handle)
        finally:
            _native.regoFreeInput(handle)
        if status:
            raise RegoEvalError(_first_line(regopy.rego_shared.rego_get_error(interpreter)))

    def _query(self, entrypoint: str, verbatim: bool = False) -> Any:
        """One entrypoint against the input set last (with the lock held); ``verbatim``: that
        input holds strings the output's JSON text cannot carry (read its node tree)."""
        interpreter = self._interpreter._impl
        output = _native.regoBundleQueryEntrypoint(
            interpreter, self._bundle._impl, entrypoint.encode()
        )
        if not output:
            raise RegoEvalError(_first_line(regopy.rego_shared.rego_get_error(interpreter)))
        try:
            if not _native.regoOutputOk(output):
                raise RegoEvalError(_errormsg(_output_text(output)))
            return _tree_expression(output) if verbatim else _first_expression(output)
        finally:
            _native.regoFreeOutput(output)


def compile_bundle(
    modules: Iterable[Module],
    data: Mapping[str, Any],
    entrypoints: Iterable[str],
    *,
    cache: Path | None = None,
) -> Bundle:
    """Compile ``modules`` and the base ``data`` document into a bundle with ``entrypoints``.

    ``cache``: a directory of this user's where the compiled bundle is kept for the next
    process (see "the compiled-bundle cache" below); a failing compile is never cached.
    Raises ``RegoCompileError`` with the engine's message (file, line, column) on any error.
    """
    eps = tuple(entrypoints)
    if not eps:
        raise RegoCompileError("a bundle needs at least one entrypoint")
    if cache is None:
        return _compile_bundle(modules, data, eps)
    modules = list(modules)
    key = _cache_key(modules, data, eps)
    cached = _cached_bundle(cache, key, eps)
    if cached is not None:
        return cached
    compiled = _compile_bundle(modules, data, eps)
    _save_bundle(cache, key, compiled)
    return compiled


def _compile_bundle(modules: Iterable[Module], data: Mapping[str, Any],
                    eps: tuple[str, ...]) -> Bundle:
    interpreter = regopy.Interpreter()
    try:
        for module in modules:
            interpreter.add_module(module.name, module.source)
        if data:
            interpreter.add_data(dict(data))
        bundle = interpreter.build(None, list(eps))
    except regopy.RegoError as exc:
        raise RegoCompileError(_compact(str(exc))) from None
    return Bundle(interpreter, bundle, eps)


# --- the compiled-bundle cache --------------------------------------------------------------
#
# Compiling is most of a short process's work (the compose rules: ~0.1-0.2 s; loading the same
# bundle saved in regopy's binary format: ~5 ms), so a command-line process may keep compiled
# bundles in a directory of its user's (``compile_bundle(..., cache=...)``). A cached bundle is
# native input to the engine, so it is used only when
# - its name is the digest of everything it was compiled from (the engine's version, the
#   modules' names and texts, the data, the entrypoints): other sources never find it;
# - the directory and the file are this user's, not group- or world-writable, and the file is
#   a regular file (not a link): no other user can have put it there;
# - its bytes match the digest written beside it when it was saved: a torn or truncated write
#   is compiled again, never loaded.
# Anything else (missing, unreadable, a mismatch, a directory that cannot be made private) is
# a miss: the bundle is compiled as without a cache, and saved for the next process.

_CACHE_SUFFIX = ".rbb"
#: Bundles a cache directory keeps (the newest; each ~0.2 MB for the compose rules): one per
#: revision of the rules a user checks with, so older revisions go.
CACHE_KEEP = 8


def _cache_key(modules: list[Module], data: Mapping[str, Any], eps: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    digest.update(f"regopy {regopy.__version__}\0".encode())
    digest.update(json.dumps(data, sort_keys=True).encode() + b"\0")
    digest.update("\0".join(eps).encode() + b"\0\0")
    for module in modules:
        digest.update(module.name.encode() + b"\0" + module.source.encode() + b"\0")
    return digest.hexdigest()


def _private(path: Path, *, directory: bool) -> bool:
    """``path`` is this user's own directory or regular file, writable by nobody else."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    kind = stat.S_ISDIR if directory else stat.S_ISREG
    return (kind(info.st_mode) and info.st_uid == os.geteuid()
            and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _cached_bundle(cache: Path, key: str, eps: tuple[str, ...]) -> Bundle | None:
    """The bundle saved under ``key``, if it passes every check above; else ``None``."""
    path, sidecar = cache / (key + _CACHE_SUFFIX), cache / (key + ".sha256")
    if not (_private(cache, directory=True) and _private(path, directory=False)
            and _private(sidecar, directory=False)):
        return None
    try:
        expected = sidecar.read_text(encoding="ascii").strip()
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
    except (OSError, UnicodeDecodeError):
        return None
    if not hmac.compare_digest(expected, actual):
        return None
    interpreter = regopy.Interpreter()
    try:
        bundle = interpreter.load_bundle(str(path), regopy.BundleFormat.Binary)
    except regopy.RegoError:
        return None
    if not bundle.ok():
        return None
    return Bundle(interpreter, bundle, eps)


def _save_bundle(cache: Path, key: str, compiled: Bundle) -> None:
    """Save ``compiled`` under ``key`` (best effort: a cache that cannot be written is no
    cache). Each file is written beside its name and renamed into place."""
    import tempfile  # here: a process that finds its bundle cached does not pay for it

    try:
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private(cache, directory=True):
            return
        fd, tmp = tempfile.mkstemp(dir=cache, suffix=".tmp")
        os.close(fd)
        tmp_sum: str | None = None
        try:
            compiled.save(tmp)
            digest = hashlib.sha256(Path(tmp).read_bytes()).hexdigest()
            fd, tmp_sum = tempfile.mkstemp(dir=cache, suffix=".tmp")
            with os.fdopen(fd, "w", encoding="ascii") as out:
                out.write(digest + "\n")
            os.replace(tmp, cache / (key + _CACHE_SUFFIX))
            os.replace(tmp_sum, cache / (key + ".sha256"))
            _prune(cache)
        finally:
            for leftover in (tmp, tmp_sum):
                if leftover is not None and os.path.exists(leftover):
                    os.unlink(leftover)
    except (OSError, regopy.RegoError):
        return


def _prune(cache: Path) -> None:
    """Remove all but the ``CACHE_KEEP`` newest bundles (and their digests)."""
    saved = sorted(cache.glob("*" + _CACHE_SUFFIX), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in saved[CACHE_KEEP:]:
        for path in (old, old.with_suffix(".sha256")):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def builtins_among(names: Iterable[str]) -> set[str]:
    """The ``names`` (``count``, ``regex.match``) that are built-in functions of the engine.

    Offline tooling only (``cpctl policy lint`` calls it in its child process)."""
    interpreter = regopy.Interpreter()
    return {n for n in names if len(n) <= 200 and interpreter.is_builtin(n)}


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


# regopy's ctypes bindings of the native library: not its public API, so every name and ctypes
# signature used from here is asserted by tests/authz/test_rego_private_api.py.
_native = regopy.rego_shared.rego
_IN_STR, _IN_INT, _IN_FLOAT, _IN_BOOL, _IN_NULL = (
    _native.regoInputString, _native.regoInputInt, _native.regoInputFloat,
    _native.regoInputBoolean, _native.regoInputNull)
_IN_ITEM, _IN_OBJECT, _IN_ARRAY = (
    _native.regoInputObjectItem, _native.regoInputObject, _native.regoInputArray)


def _converted(input_doc: Mapping[str, Any]) -> tuple[int, bool]:
    """``input_doc`` as a native input handle, and whether it holds a string the output's JSON
    text cannot carry (``_push``); an unconvertible input is a ``RegoEvalError``."""
    try:
        return _input_handle_verbatim(input_doc)
    except (ValueError, TypeError, OverflowError, RecursionError, ctypes.ArgumentError) as exc:
        raise RegoEvalError(f"input cannot be converted: {exc}") from None


def _input_handle(value: Mapping[str, Any]) -> int:
    """A new native input handle holding ``value``; the caller frees it (``regoFreeInput``)."""
    return _input_handle_verbatim(value)[0]


def _input_handle_verbatim(value: Mapping[str, Any]) -> tuple[int, bool]:
    """``_input_handle`` and whether ``value`` holds a string the output's JSON text cannot
    carry (``_push``'s answer)."""
    handle = _native.regoNewInput()
    if not handle:
        raise MemoryError("regoNewInput failed")
    try:
        verbatim = _push(handle, dict(value))
    except BaseException:
        _native.regoFreeInput(handle)
        raise
    return int(handle), verbatim


def _push(handle: int, value: Any) -> bool:
    """Push ``value`` onto ``handle`` with ctypes: one native call per node, regopy's own
    sequence (``regopy.Input(value)`` at ~60% of its cost).

    Refused (``ValueError``, ``TypeError``, ``OverflowError``): strings with NUL (a C string
    truncates them, and the policy would see another value than the service), non-string object
    keys, integers outside the 64-bit range (ctypes would wrap them around), types JSON does not
    have, and arrays/objects nested deeper than ``MAX_INPUT_DEPTH`` (``InputTooDeep``; the top-level
    value is depth 1, scalars add no depth), so conversion never meets the recursion limit.

    Returns whether a string or key holds a ``"``, a ``\\`` or a control character (any
    character ``str.isprintable`` refuses: a few more, cheaply): regopy writes those into an
    output's JSON text unescaped, so its result must be read verbatim (``_tree_expression``).
    """
    status = 0
    verbatim = False
    # Each distinct string (key or value) checked, encoded and quoted once: a document repeats
    # most of its keys and many values (measured: ~35% of the bench's compose input's cost).
    encoded: dict[str, bytes] = {}

    def encode(s: str, what: str) -> bytes:
        nonlocal verbatim
        raw = s.encode("utf-8")
        if b"\0" in raw:
            raise ValueError(f"NUL character in input {what}")
        if not verbatim and ('"' in s or "\\" in s or not s.isprintable()):
            verbatim = True
        raw = encoded[s] = _quoted(raw)
        return raw

    def add(v: Any, depth: int) -> None:
        nonlocal status
        t = type(v)
        if t is str:
            status |= _IN_STR(handle, encoded.get(v) or encode(v, "string"))
        elif t is dict:
            if depth > MAX_INPUT_DEPTH:
                raise InputTooDeep(f"input nests deeper than {MAX_INPUT_DEPTH} arrays/objects")
            for k, x in v.items():
                if type(k) is not str:
                    raise ValueError("input object keys must be strings")
                status |= _IN_STR(handle, encoded.get(k) or encode(k, "key"))
                if type(x) is str:  # the commonest value, without a call of add
                    status |= _IN_STR(handle, encoded.get(x) or encode(x, "string"))
                else:
                    add(x, depth + 1)
                status |= _IN_ITEM(handle)
            status |= _IN_OBJECT(handle, len(v))
        elif t is list or t is tuple:
            if depth > MAX_INPUT_DEPTH:
                raise InputTooDeep(f"input nests deeper than {MAX_INPUT_DEPTH} arrays/objects")
            for x in v:
                add(x, depth + 1)
            status |= _IN_ARRAY(handle, len(v))
        elif t is bool:
            status |= _IN_BOOL(handle, v)
        elif t is int:
            if not -(2**63) <= v < 2**63:  # ctypes would silently wrap it around
                raise OverflowError("integer out of the 64-bit range")
            status |= _IN_INT(handle, v)
        elif t is float:
            status |= _IN_FLOAT(handle, v)
        elif v is None:
            status |= _IN_NULL(handle)
        elif isinstance(v, Mapping):
            add(dict(v), depth)
        else:
            raise TypeError(f"cannot convert {t.__name__} to rego input")

    add(value, 1)
    if status:
        raise ValueError("the native library refused the input")
    return verbatim


def _first_expression(output: int) -> Any:
    """The value of the first expression of the first result of an ``ok`` output.

    regopy writes strings into the output's JSON text without escaping quotes or backslashes,
    so a string a policy copies from its input into its result (``x"],"decision":"allow",...``)
    can rewrite the structure of that text. Injected text can only add keys, never remove the
    document's own (an odd number of quotes leaves text that does not parse): so duplicate keys
    are refused here, as is anything that does not parse, and callers refuse unknown keys
    (``parse_decision`` does). Either way the caller fails closed.
    """
    text = _output_text(output)
    if text == "undefined":
        return Undefined
    try:
        parsed = json.loads(text, object_pairs_hook=_unique_keys)
    except ValueError as exc:
        # an evaluation error (e.g. an unknown builtin) can arrive as an s-expression
        detail = str(exc) if "duplicate key" in str(exc) else _errormsg(text)
        raise RegoEvalError(f"unreadable result: {detail}") from None
    result = parsed[0] if isinstance(parsed, list) and parsed else parsed
    expressions = result.get("expressions") if isinstance(result, dict) else None
    if not expressions:
        return Undefined
    return expressions[0]


# regopy's node kinds (regopy.rego_shared.NodeKind) read by ``_tree_expression``.
_TERM, _SCALAR, _ARRAY, _SET, _OBJECT, _OBJECT_ITEM = 1002, 1003, 1004, 1005, 1006, 1007
_INT, _FLOAT, _STRING, _TRUE, _FALSE, _NULL = 1008, 1009, 1010, 1011, 1012, 1013
_UNDEFINED, _RESULTS = 1014, 1017
#: Deepest result read from a node tree: the input's bound, and as much again for what a
#: policy wraps around it.
_MAX_RESULT_DEPTH = 2 * MAX_INPUT_DEPTH


def _tree_expression(output: int) -> Any:
    """``_first_expression``, read from the output's node tree instead of its JSON text: every
    string as the engine holds it, whatever characters it has.

    A string node holds the string's characters as the engine computes with them: the input's
    as given, unescaped (built by ``sprintf``, ``substring``, ``split``: the same), and between a
    pair of double quotes when built by ``concat``, ``lower``, ``replace`` (an input string that
    begins and ends with a quote was given with one more pair, ``_quoted``). So a string is read
    as its node's text, without that one pair of quotes: exact for every string a rule takes
    from the input and puts into its result, whole or concatenated (a finding's message, a
    value). Never unescaped: the engine keeps a policy's own literals and the data document
    escaped (``"a\\"b"`` is held as ``a\\"b``), and a concatenation can mix both forms, so a
    result string with an escape sequence of the policy's own keeps its backslash here (rules
    keep escapes out of what they report).

    Also an ``ok`` output can hold an error (a builtin's, e.g. ``trim`` on an input with ``\\"``):
    the node tree is only read below a ``Results`` node (anything else aborts the process).
    """
    top = _native.regoOutputNode(output)
    kind = _native.regoNodeType(top) if top else _UNDEFINED
    if kind == _UNDEFINED:
        return Undefined
    if kind != _RESULTS:
        raise RegoEvalError(_errormsg(_output_text(output)))
    if not _native.regoNodeSize(top):
        return Undefined
    terms = _native.regoOutputExpressionsAtIndex(output, 0)
    if not terms or not _native.regoNodeSize(terms):
        return Undefined
    return _node_value(_native.regoNodeGet(terms, 0), 1)


def _node_value(node: int, depth: int) -> Any:
    if not node:
        raise RegoEvalError("unreadable result: a missing node")
    kind = _native.regoNodeType(node)
    if kind in (_TERM, _SCALAR):
        return _node_value(_native.regoNodeGet(node, 0), depth)
    if kind in (_ARRAY, _SET, _OBJECT):
        if depth > _MAX_RESULT_DEPTH:
            raise RegoEvalError(f"unreadable result: nested deeper than {_MAX_RESULT_DEPTH}")
        children = [_native.regoNodeGet(node, i) for i in range(_native.regoNodeSize(node))]
        if kind != _OBJECT:
            return [_node_value(child, depth + 1) for child in children]
        out: dict[str, Any] = {}
        for item in children:
            if _native.regoNodeType(item) != _OBJECT_ITEM or _native.regoNodeSize(item) != 2:
                raise RegoEvalError("unreadable result: a malformed object item")
            key = _node_value(_native.regoNodeGet(item, 0), depth + 1)
            out[key if isinstance(key, str) else json.dumps(key)] = _node_value(
                _native.regoNodeGet(item, 1), depth + 1)
        return out
    if kind == _TRUE:
        return True
    if kind == _FALSE:
        return False
    if kind == _NULL:
        return None
    if kind not in (_STRING, _INT, _FLOAT):
        raise RegoEvalError(f"unreadable result: a node of kind {kind}")
    text = str(regopy.rego_shared.rego_node_value(node))
    if kind == _INT:
        return int(text)
    if kind == _FLOAT:
        return float(text)
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] == '"' else text


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("duplicate key in the result")
    return out


def _quoted(raw: bytes) -> bytes:
    """regopy reads a string enclosed in double quotes as a JSON string literal and strips that
    pair of quotes (``"x"`` would reach the policy as ``x``); one more pair keeps it exact."""
    if len(raw) >= 2 and raw[0] == raw[-1] == 0x22:
        return b'"' + raw + b'"'
    return raw


def _output_text(output: int) -> str:
    try:
        return str(regopy.rego_shared.rego_output_string(output))
    except regopy.RegoError:
        raise RegoEvalError("cannot read the evaluation output") from None


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
