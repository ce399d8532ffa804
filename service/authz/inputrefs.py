"""Which parts of the input a policy revision can read: the decision cache's key.

Once per revision, ``analyse`` reads the revision's modules and collects every path of ``input``
they may read. The decision cache then keys on the input projected onto those paths
(``cache_key``), so values the policy never looks at (a per-request resource id, a session id)
do not fragment the cache.

The analysis works on tokens, not on a full parse, and is conservative: a use it cannot prove
static makes it key on a larger part of the input, up to the whole input (``analyse`` returns
``None``: today's full-input key). Soundness is what matters (a path missed would let two inputs
the policy tells apart share one cached decision); ``tests/authz/test_inputrefs.py`` checks it
with a property test against the shipped policy and deliberately tricky ones.

How ``input`` may flow, and what each way costs:

* ``input.a.b`` / ``input["a"].b``: the static path ``a.b`` (its whole subtree is keyed);
* ``input.a[x]``, ``input.a[0]``, ``input.a`` used as a value, passed to a built-in, unified,
  iterated (``some v in input.a``): the whole subtree of the static prefix ``a``;
* ``object.get(input.a, "k", default)`` with a string literal key: the path ``a.k``;
* ``input`` (or an alias of it) passed whole as an argument to a function defined in the
  revision: the function's parameter becomes an alias of that path (by name, in every module:
  an over-approximation), and its uses are analysed the same way, to a fixpoint;
* ``import input.a as x`` / ``import input.a``: ``x`` (or ``a``) is an alias of ``input.a``;
* ``input`` used whole anywhere else (``walk(input)``, ``json.marshal(input)``, ``input[x]``,
  ``x := input``), ``with input ...``, a template string, or a token the lexer does not know:
  the whole input.

The key always holds ``action`` and ``env`` (the engine's production rule reads them after the
policy) and, when a path may reach the facts the engine projects into ``input.principal``
(``roles``, ``groups``, ``grants``: functions of the subject and the action), the subject id.
A path that stops early keys on where and why it stopped (a missing member, or a value that is
not an object, by JSON type), which is all a static path can observe there.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from service.authz import regolex
from service.authz.input import PROJECTED_PRINCIPAL_FIELDS

__all__ = ["ENGINE_PATHS", "InputRefs", "Path", "analyse", "cache_key", "compile_key", "key_paths",
           "whole_key"]

Path = tuple[str, ...]
"""A path into the input document (``("principal", "kind")``)."""

#: Paths the engine itself reads from the input after the policy (the production rule).
ENGINE_PATHS: tuple[Path, ...] = (("action",), ("env",))
_SUBJECT: Path = ("principal", "subject_id")

_MAX_ROUNDS = 64

#: Keywords that continue an expression onto the next line (so that line starts no rule).
_CONTINUING = frozenset({"if", "else", "contains", "in", "as", "with", "some", "every", "not",
                         "default", "import", "package"})
_OPENERS = {"(": ")", "[": "]", "{": "}"}


class _Unsupported(Exception):
    """Something the analysis does not understand: key on the whole input."""


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str  # ident, string, number, op, nl
    text: str


@dataclass(frozen=True, slots=True)
class InputRefs:
    """The input paths a revision may read (``None``: it may read anything)."""

    paths: tuple[Path, ...] | None

    @property
    def whole_input(self) -> bool:
        return self.paths is None

    def describe(self) -> dict[str, Any]:
        """For ``authz/status``: how the cache keys (never the policy text)."""
        if self.paths is None:
            return {"keyed_on": "whole_input", "paths": None}
        return {"keyed_on": "referenced_paths", "paths": [".".join(p) for p in self.paths]}


# ------------------------------------------------------------------------------------ the tokens


def _tokens(source: str) -> list[_Tok]:
    """The lexer's tokens (``regolex``, the tools' too) as the analysis reads them: a raw
    string becomes the string literal it is, a template string or an unknown character ends
    the analysis (key on the whole input)."""
    out: list[_Tok] = []
    for tok in regolex.tokenize(source):
        if tok.kind == "comment":
            continue
        if tok.kind == "template":
            raise _Unsupported("template string")
        if tok.kind == "other":
            raise _Unsupported(f"unexpected character {tok.text!r}")
        if tok.kind == "raw":
            # A raw string is a literal like any other; newlines inside it are not statements.
            out.append(_Tok("string", json.dumps(tok.text[1:-1])))
            continue
        out.append(_Tok("nl" if tok.kind == "newline" else tok.kind, tok.text))
    return out


def _literal(tok: _Tok) -> str | None:
    if tok.kind != "string":
        return None
    try:
        value = json.loads(tok.text)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


# ------------------------------------------------------------------------------- module structure


@dataclass
class _Module:
    package: str  # "a.b" of ``package a.b``
    toks: list[_Tok]  # without newlines
    starts: list[bool]  # toks[i] begins a line at bracket depth 0
    parent: list[int]  # index of the innermost open bracket around toks[i] (-1: none)
    skip: list[bool]  # a declaration, not a use: function head parameters, import paths
    closing: dict[int, int]  # index of an opening bracket -> index of its closing one


def _structure(raw: list[_Tok]) -> _Module:
    toks: list[_Tok] = []
    starts: list[bool] = []
    parent: list[int] = []
    stack: list[int] = []
    closing: dict[int, int] = {}
    line_start = True
    for tok in raw:
        if tok.kind == "nl":
            line_start = True
            continue
        if tok.kind == "op" and tok.text in (")", "]", "}"):
            if not stack or _OPENERS[toks[stack[-1]].text] != tok.text:
                raise _Unsupported("unbalanced brackets")
            closing[stack.pop()] = len(toks)
        previous = toks[-1] if toks else None
        continuing = previous is not None and (
            (previous.kind == "op" and previous.text not in (")", "]", "}"))
            or (previous.kind == "ident" and previous.text in _CONTINUING)
        )
        starts.append(line_start and not stack and not continuing)
        parent.append(stack[-1] if stack else -1)
        toks.append(tok)
        if tok.kind == "op" and tok.text in _OPENERS:
            stack.append(len(toks) - 1)
        line_start = False
    if stack:
        raise _Unsupported("unbalanced brackets")
    package = ""
    for i, tok in enumerate(toks):
        if starts[i] and tok.kind == "ident" and tok.text == "package":
            package = ".".join(_dotted_after(toks, i + 1))
            break
    return _Module(package, toks, starts, parent, [False] * len(toks), closing)


def _dotted_after(toks: list[_Tok], i: int) -> list[str]:
    names: list[str] = []
    while i < len(toks) and toks[i].kind == "ident":
        names.append(toks[i].text)
        if i + 1 < len(toks) and toks[i + 1].kind == "op" and toks[i + 1].text == ".":
            i += 2
        else:
            break
    return names


def _dotted_before(m: _Module, end: int) -> list[str]:
    """The dotted name ending at ``toks[end]`` (``object.get`` -> ["object", "get"])."""
    names: list[str] = []
    i = end
    while i >= 0 and m.toks[i].kind == "ident":
        names.insert(0, m.toks[i].text)
        if i >= 1 and m.toks[i - 1].kind == "op" and m.toks[i - 1].text == ".":
            i -= 2
        else:
            break
    return names


Functions = dict[tuple[str, str], list[list[str | None]]]


def _functions(m: _Module, into: Functions) -> None:
    """Record every function head (name -> parameter lists; None for a pattern) and mark the
    parameter lists as declarations."""
    i = 0
    n = len(m.toks)
    while i < n:
        if not m.starts[i]:
            i += 1
            continue
        j = i + 1 if m.toks[i].kind == "ident" and m.toks[i].text == "default" else i
        # A (possibly dotted) name, then '(' at depth 0: a function head if a definition follows.
        k = j
        while k + 2 < n and m.toks[k].kind == "ident" and m.toks[k + 1].text == "." \
                and m.toks[k + 2].kind == "ident":
            k += 2
        if m.toks[j].kind == "ident" and k + 1 < n and m.toks[k + 1].text == "(" \
                and m.toks[k + 1].kind == "op":
            close = m.closing[k + 1]
            after = m.toks[close + 1] if close + 1 < n else None
            if after is not None and ((after.text in (":=", "=", "{") and after.kind == "op")
                                      or (after.kind == "ident" and after.text == "if")):
                params: list[str | None] = []
                current: list[_Tok] = []
                for t in range(k + 2, close):
                    m.skip[t] = True
                    if m.toks[t].kind == "ident" and m.toks[t].text == "input":
                        raise _Unsupported("input in a function head")
                    if m.parent[t] == k + 1 and m.toks[t].text == "," and m.toks[t].kind == "op":
                        params.append(_param(current))
                        current = []
                    else:
                        current.append(m.toks[t])
                if current:
                    params.append(_param(current))
                into.setdefault((m.package, m.toks[k].text), []).append(params)
                i = close + 1
                continue
        i += 1


def _param(toks: Sequence[_Tok]) -> str | None:
    return toks[0].text if len(toks) == 1 and toks[0].kind == "ident" else None


def _imports(m: _Module, taints: dict[str, set[Path]]) -> None:
    """``import input...`` statements: the alias they bind; their tokens are declarations."""
    n = len(m.toks)
    for i, tok in enumerate(m.toks):
        if not (m.starts[i] and tok.kind == "ident" and tok.text == "import"):
            continue
        if i + 1 >= n or m.toks[i + 1].text != "input" or m.toks[i + 1].kind != "ident":
            continue
        path, end = _chain(m, i + 2)
        for t in range(i, end):
            m.skip[t] = True
        if end + 1 < n and m.toks[end].kind == "ident" and m.toks[end].text == "as":
            alias = m.toks[end + 1].text
            m.skip[end] = m.skip[end + 1] = True
        else:
            alias = path[-1] if path else "input"
        taints.setdefault(alias, set()).add(path)


def _chain(m: _Module, j: int) -> tuple[Path, int]:
    """The static path starting at ``toks[j]`` (``.a``, ``["a"]`` ...) and where it ends."""
    path: list[str] = []
    n = len(m.toks)
    while j < n:
        tok = m.toks[j]
        if tok.kind == "op" and tok.text == "." and j + 1 < n and m.toks[j + 1].kind == "ident":
            path.append(m.toks[j + 1].text)
            j += 2
        elif tok.kind == "op" and tok.text == "[" and j + 2 < n and m.toks[j + 2].text == "]" \
                and (key := _literal(m.toks[j + 1])) is not None:
            path.append(key)
            j += 3
        else:
            break
    return tuple(path), j


# ------------------------------------------------------------------------------------- analysis


def analyse(sources: Iterable[str]) -> InputRefs:
    """The input paths the modules (their source texts) may read; ``InputRefs(None)`` when the
    analysis cannot bound them. A function of the texts alone, remembered for the last few
    revisions: every load of the same revision (each worker start, each reload of unchanged
    sources) would otherwise tokenise and walk every module again."""
    return _analysed(tuple(sources))


@functools.lru_cache(maxsize=8)
def _analysed(sources: tuple[str, ...]) -> InputRefs:
    try:
        return InputRefs(_analyse(list(sources)))
    except _Unsupported:
        return InputRefs(None)


def _analyse(sources: list[str]) -> tuple[Path, ...] | None:
    modules = [_structure(_tokens(s)) for s in sources]
    functions: Functions = {}
    taints: dict[str, set[Path]] = {"input": {()}}
    for m in modules:
        _functions(m, functions)
        _imports(m, taints)
    refs: set[Path] = set()
    for _ in range(_MAX_ROUNDS):
        before = (sum(len(v) for v in taints.values()), len(taints), len(refs))
        for m in modules:
            _uses(m, functions, taints, refs)
            if () in refs:
                return None
        if (sum(len(v) for v in taints.values()), len(taints), len(refs)) == before:
            break
    else:
        return None
    return tuple(sorted(p for p in refs if not any(p[: len(q)] == q for q in refs if q != p)))


def _uses(m: _Module, functions: Functions, taints: dict[str, set[Path]], refs: set[Path]) -> None:
    toks = m.toks
    n = len(toks)
    for i, tok in enumerate(toks):
        if tok.kind != "ident" or m.skip[i] or tok.text not in taints:
            continue
        previous = toks[i - 1] if i else None
        if previous is not None and previous.kind == "op" and previous.text == ".":
            continue  # a member named like the alias (x.input), not the alias itself
        if previous is not None and previous.kind == "ident" and previous.text == "with":
            raise _Unsupported("with input")
        path, end = _chain(m, i + 1)
        prefixes = list(taints[tok.text])
        whole = [p + path for p in prefixes]
        after = toks[end] if end < n else None
        is_arg = (previous is not None and previous.kind == "op" and previous.text in ("(", ",")
                  and after is not None and after.kind == "op" and after.text in (",", ")")
                  and m.parent[i] >= 0 and toks[m.parent[i]].text == "(")
        if not is_arg:
            refs.update(whole)
            continue
        open_at = m.parent[i]
        name = _dotted_before(m, open_at - 1) if open_at >= 1 else []
        if not name:
            refs.update(whole)  # a parenthesised expression, not a call
            continue
        position = sum(1 for t in range(open_at + 1, i)
                       if m.parent[t] == open_at and toks[t].kind == "op" and toks[t].text == ",")
        if name == ["object", "get"] and position == 0 and end + 1 < n:
            key = _literal(toks[end + 1])
            following = toks[end + 2] if end + 2 < n else None
            if key is not None and following is not None and following.text in (",", ")"):
                refs.update((*p, key) for p in whole)
                continue
            refs.update(whole)
            continue
        # A function of this package by its name, or of any package by its full data path;
        # anything else is a built-in (or a call the analysis does not resolve).
        if len(name) == 1:
            target = (m.package, name[0])
        elif name[0] == "data":
            target = (".".join(name[1:-1]), name[-1])
        else:
            target = ("", "")
        if target not in functions:
            refs.update(whole)
            continue
        for params in functions[target]:
            param = params[position] if position < len(params) else None
            if param is None:
                refs.update(whole)
            elif param != "_":
                taints.setdefault(param, set()).update(whole)


# --------------------------------------------------------------------------------------- the key

_MISSING = object()


def key_paths(paths: Sequence[Path]) -> tuple[Path, ...]:
    """The paths the cache key holds for a revision reading ``paths``."""
    keyed = set(paths) | set(ENGINE_PATHS)
    if any(p[:1] == ("principal",) and (len(p) == 1 or p[1] in PROJECTED_PRINCIPAL_FIELDS)
           for p in paths):
        keyed.add(_SUBJECT)
    return tuple(sorted(p for p in keyed if not any(p[: len(q)] == q for q in keyed if q != p)))


def cache_key(paths: Sequence[Path], doc: Mapping[str, Any]) -> tuple[Any, ...]:
    """The input ``doc`` (stripped: what the policy is given before projection) projected onto
    ``paths`` (from ``key_paths``): per path, its value tagged with its JSON type (a scalar as
    itself, an object or array as its canonical JSON text), or where and why the path stops;
    ``TypeError``/``ValueError`` if a value there is not JSON.

    A tuple, not one JSON text of it all: most keyed values are strings, and a tuple of them
    costs no encoding. The tags keep apart what Python's equality would merge and JSON keeps
    apart (``true`` and ``1``, ``1`` and ``1.0``, ``0.0`` and ``-0.0``)."""
    parts: list[Any] = []
    for path in paths:
        node: Any = doc
        stop: tuple[Any, ...] | None = None
        for depth, name in enumerate(path):
            if type(node) is dict or isinstance(node, Mapping):
                node = node.get(name, _MISSING)
                if node is _MISSING:
                    stop = ("at", depth, "absent")
                    break
            else:
                stop = ("at", depth, _json_type(node))
                break
        parts.append(stop if stop is not None else _keyed(node))
    return tuple(parts)


def compile_key(paths: Sequence[Path]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """``cache_key`` for ``paths`` (from ``key_paths``: none a prefix of another) as one
    function, compiled once per revision: straight-line code that looks each shared prefix up
    once (``principal`` once for its four paths) instead of walking every path from the root.
    The same tuple as ``cache_key(paths, doc)`` for every ``doc``, and the same errors
    (tests/authz/test_inputrefs.py holds them equal)."""
    if any(a != b and a[: len(b)] == b for a in paths for b in paths):
        raise ValueError("a key path is a prefix of another")
    lines = ["def key(doc):", "    parts = []", "    append = parts.append", "    n0 = doc"]
    _emit(lines, list(paths), 0, "    ")
    lines.append("    return tuple(parts)")
    namespace: dict[str, Any] = {"_MISSING": _MISSING, "_keyed": _keyed, "_json_type": _json_type,
                                 "Mapping": Mapping}
    exec("\n".join(lines), namespace)  # noqa: S102  # our own text: names are repr()'d literals
    key: Callable[[Mapping[str, Any]], tuple[Any, ...]] = namespace["key"]
    return key


def _emit(lines: list[str], paths: list[Path], depth: int, pad: str) -> None:
    """Code appending the parts of ``paths`` (all sharing their first ``depth`` names, in key
    order) from ``n<depth>``, the value those names lead to."""
    node, child = f"n{depth}", f"n{depth + 1}"
    lines.append(f"{pad}if type({node}) is dict or isinstance({node}, Mapping):")
    inner = pad + "    "
    groups: list[tuple[str, list[Path]]] = []
    for path in paths:  # sorted: the paths under one name are consecutive
        if groups and groups[-1][0] == path[depth]:
            groups[-1][1].append(path)
        else:
            groups.append((path[depth], [path]))
    for name, under in groups:
        lines.append(f"{inner}{child} = {node}.get({name!r}, _MISSING)")
        lines.append(f"{inner}if {child} is _MISSING:")
        lines.extend(f"{inner}    append(('at', {depth}, 'absent'))" for _ in under)
        lines.append(f"{inner}else:")
        if len(under) == 1 and len(under[0]) == depth + 1:
            lines.append(f"{inner}    append(_keyed({child}))")
        else:
            _emit(lines, under, depth + 1, inner + "    ")
    lines.append(f"{pad}else:")
    lines.append(f"{pad}    stop = ('at', {depth}, _json_type({node}))")
    lines.extend(f"{pad}    append(stop)" for _ in paths)


def whole_key(doc: Mapping[str, Any]) -> str:
    """The cache key of a revision whose input paths are unknown (``key_paths`` is None): the
    whole stripped input as canonical JSON; ``TypeError``/``ValueError`` if it is not JSON."""
    return _KEY_ENCODER(doc)


def _keyed(value: Any) -> tuple[str, Any]:
    kind = type(value)
    if kind is str:
        return ("s", value)
    if kind is bool:
        return ("b", value)
    if kind is int:
        return ("i", value)
    if value is None:
        return ("n", None)
    if kind is float:
        if not math.isfinite(value):
            raise ValueError("not a JSON number")
        return ("f", repr(value))
    return ("j", _KEY_ENCODER(value))


#: ``json.dumps`` with arguments builds an encoder per call; keys are made per decision.
_KEY_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False).encode


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    raise TypeError(f"not a JSON value: {type(value).__name__}")
