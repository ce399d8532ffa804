"""A structural reading of Rego source text: rules, their bodies and each body's expressions.

regopy exposes no syntax tree, so the offline tooling (failure explanations, ``with input``
rewriting, lint, coverage instrumentation) reads the source itself. This is not a full parser:
it reads the tokens of ``regolex`` (the lexer the decision cache key uses too), splits a module into top-level
statements, and a rule into its head and bodies (``if { ... }``, ``if expr``, ``else``), and a
body into expressions (newline or ``;`` at bracket depth 0, unless the line ends in an operator).
Anything it cannot read is left alone: the engine's compiler stays the judge of validity.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from service.authz.regolex import Token, tokenize

__all__ = [
    "Body",
    "Expr",
    "ModuleInfo",
    "Rule",
    "parse_module",
]

_CONTINUES = {
    ":=", "==", "!=", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "%", "&", "|", ",",
    ".", "in", "with", "as", "not", "some", "every", ":", "if", "else",
}
_OPEN = {"{": "}", "(": ")", "[": "]"}


@dataclass(frozen=True)
class Expr:
    """One body expression: its source text and where it starts and ends (offsets)."""

    text: str
    line: int
    col: int
    start: int
    end: int
    tokens: tuple[Token, ...] = field(repr=False, default=())


@dataclass(frozen=True)
class Body:
    """A rule body. ``braced``: ``{ ... }`` (``open``/``close`` are the brace offsets), else a
    single ``if expr`` (``open`` = ``close`` = -1). ``head_end``: where the value/head part that
    owns this body ends (insertion point for a body-less head)."""

    exprs: tuple[Expr, ...]
    line: int
    braced: bool
    open: int
    close: int


@dataclass(frozen=True)
class Rule:
    """A top-level rule (or function) statement: name, whether it takes arguments, its bodies.

    ``bodyless``: the head has no body at all (``x := 1``, ``f(a) := g(a)``); ``end`` is then
    the offset where a body could be appended. ``default`` rules are marked and have no body.
    """

    name: str
    line: int
    col: int
    start: int
    end: int
    text: str
    is_function: bool
    is_default: bool
    args: tuple[str, ...]
    bodies: tuple[Body, ...]
    tokens: tuple[Token, ...] = field(repr=False, default=())

    @property
    def bodyless(self) -> bool:
        return not self.bodies and not self.is_default


@dataclass(frozen=True)
class ModuleInfo:
    name: str
    package: str
    imports: dict[str, str]  # alias -> imported path (``data.controlplane.authz``)
    rules: tuple[Rule, ...]

    def rule_names(self) -> set[str]:
        return {r.name for r in self.rules}


def _code(tokens: list[Token]) -> list[Token]:
    return [t for t in tokens if t.kind != "comment"]


def _statements(tokens: list[Token], source: str) -> list[list[Token]]:
    """Top-level statements: a statement starts at an identifier in the margin (column 1, or
    after nothing but form feeds and vertical tabs) at bracket depth 0."""
    stmts: list[list[Token]] = []
    depth = 0
    current: list[Token] = []
    for t in tokens:
        if t.kind == "newline":
            current.append(t)
            continue
        margin = not source[t.start - t.col + 1 : t.start].strip("\f\v")
        if depth == 0 and margin and t.kind == "ident" and current:
            stmts.append(current)
            current = []
        current.append(t)
        if t.kind == "op":
            if t.text in _OPEN:
                depth += 1
            elif t.text in ("}", ")", "]"):
                depth = max(0, depth - 1)
    if current:
        stmts.append(current)
    return stmts


def _match(tokens: list[Token], i: int) -> int:
    """Index of the bracket closing the one at ``tokens[i]`` (or the last index)."""
    depth = 0
    for j in range(i, len(tokens)):
        t = tokens[j]
        if t.kind == "op" and t.text in _OPEN:
            depth += 1
        elif t.kind == "op" and t.text in ("}", ")", "]"):
            depth -= 1
            if depth == 0:
                return j
    return len(tokens) - 1


def split_exprs(tokens: list[Token], source: str) -> list[Expr]:
    """Split body tokens (without the braces) into expressions."""
    exprs: list[Expr] = []
    current: list[Token] = []
    depth = 0

    def flush() -> None:
        items = [t for t in current if t.kind != "newline"]
        if items:
            start, last = items[0], items[-1]
            end = last.start + len(last.text)
            exprs.append(
                Expr(source[start.start : end], start.line, start.col, start.start, end,
                     tuple(items))
            )
        current.clear()

    for t in tokens:
        if t.kind == "comment":
            continue
        if depth == 0 and (t.kind == "newline" or (t.kind == "op" and t.text == ";")):
            items = [x for x in current if x.kind != "newline"]
            if items and items[-1].text in _CONTINUES and t.kind == "newline":
                current.append(t)
                continue
            flush()
            continue
        if t.kind == "op" and t.text in _OPEN:
            depth += 1
        elif t.kind == "op" and t.text in ("}", ")", "]"):
            depth -= 1
        current.append(t)
    flush()
    return exprs


def _bodies(tokens: list[Token], source: str) -> list[Body]:
    """The bodies of one rule statement (code tokens, no newlines needed)."""
    bodies: list[Body] = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t.kind == "op" and t.text in _OPEN:
            j = _match(tokens, i)
            i = j + 1
            continue
        if t.kind == "ident" and t.text == "if":
            nxt = i + 1
            while nxt < len(tokens) and tokens[nxt].kind == "newline":
                nxt += 1
            if nxt < len(tokens) and tokens[nxt].text == "{":
                close = _match(tokens, nxt)
                inner = tokens[nxt + 1 : close]
                bodies.append(Body(tuple(split_exprs(inner, source)), tokens[nxt].line, True,
                                   tokens[nxt].start, tokens[close].start))
                i = close + 1
                continue
            # single expression: up to a depth-0 ``else`` or the end of the statement
            j = nxt
            while j < len(tokens):
                if tokens[j].kind == "ident" and tokens[j].text == "else":
                    break
                if tokens[j].kind == "op" and tokens[j].text in _OPEN:
                    j = _match(tokens, j) + 1
                    continue
                j += 1
            inner = [x for x in tokens[nxt:j] if x.kind != "newline"]
            exprs = split_exprs(inner, source)
            if exprs:
                joined = Expr(source[exprs[0].start : exprs[-1].end], exprs[0].line,
                              exprs[0].col, exprs[0].start, exprs[-1].end,
                              tuple(x for e in exprs for x in e.tokens))
                bodies.append(Body((joined,), exprs[0].line, False, -1, -1))
            i = j
            continue
        i += 1
    return bodies


def parse_module(name: str, source: str) -> ModuleInfo:
    """Package, imports and top-level rules of one module."""
    tokens = tokenize(source)
    package = ""
    imports: dict[str, str] = {}
    rules: list[Rule] = []
    for stmt in _statements(tokens, source):
        code = [t for t in _code(stmt) if t.kind != "newline"]
        if not code:
            continue
        head = code[0].text
        if head == "package":
            package = "".join(t.text for t in code[1:])
            continue
        if head == "import":
            path_tokens: list[str] = []
            alias = None
            k = 1
            while k < len(code):
                if code[k].text == "as" and k + 1 < len(code):
                    alias = code[k + 1].text
                    break
                path_tokens.append(code[k].text)
                k += 1
            path = "".join(path_tokens)
            if path.startswith(("data.", "input")) or path == "data":
                imports[alias or path.rsplit(".", 1)[-1]] = path
            continue
        is_default = head == "default"
        first = code[1] if is_default and len(code) > 1 else code[0]
        if first.kind != "ident":
            continue
        nm = first.text
        idx = code.index(first) + 1
        while (idx + 1 < len(code) and code[idx].text == "." and code[idx + 1].kind == "ident"):
            nm += "." + code[idx + 1].text
            idx += 2
        is_function = idx < len(code) and code[idx].text == "("
        args: tuple[str, ...] = ()
        if is_function:
            close = _match(code, idx)
            args = tuple(t.text for t in code[idx + 1 : close] if t.kind == "ident")
        stmt_code = [t for t in stmt if t.kind != "comment"]
        last = code[-1]
        end = last.start + len(last.text)
        bodies = [] if is_default else _bodies(stmt_code, source)
        rules.append(
            Rule(nm, first.line, first.col, code[0].start, end, source[code[0].start : end],
                 is_function, is_default, args, tuple(bodies), tuple(code))
        )
    return ModuleInfo(name, package, imports, tuple(rules))


def bound_names(expr: Expr) -> list[str]:
    """Variables an expression binds at its top level: ``x := ...``, ``some x, y in ...``,
    ``some x``, ``x = ...`` (unification with a variable on the left)."""
    toks = [t for t in expr.tokens if t.kind != "newline"]
    if not toks:
        return []
    if toks[0].text == "some":
        names = []
        for t in toks[1:]:
            if t.kind == "ident" and t.text == "in":
                break
            if t.kind == "ident":
                names.append(t.text)
        return [n for n in names if n != "_"]
    if len(toks) > 1 and toks[0].kind == "ident" and toks[1].text in (":=", "="):
        return [toks[0].text] if toks[0].text != "_" else []
    return []


_COMPARE = ("==", "!=", "<=", ">=", "<", ">")


def comparison(expr: Expr) -> tuple[str, str, str] | None:
    """``(lhs, op, rhs)`` for a top-level comparison expression (``a.b == "x"``), else None."""
    depth = 0
    toks = list(expr.tokens)
    for k, t in enumerate(toks):
        if t.kind == "op" and t.text in _OPEN:
            depth += 1
        elif t.kind == "op" and t.text in ("}", ")", "]"):
            depth -= 1
        elif depth == 0 and t.kind == "ident" and t.text == "with":
            return None
        elif depth == 0 and t.kind == "op" and t.text in _COMPARE and 0 < k < len(toks) - 1:
            lhs = expr.text[: t.start - expr.start].strip()
            rhs = expr.text[t.start - expr.start + len(t.text) :].strip()
            return lhs, t.text, rhs
    return None


def with_clauses(expr: Expr) -> tuple[str, list[tuple[str, str]]]:
    """Split ``e with a as b with c as d`` into ``(e, [(a, b), (c, d)])`` (depth-0 ``with``)."""
    depth = 0
    cuts: list[int] = []
    for t in expr.tokens:
        if t.kind == "op" and t.text in _OPEN:
            depth += 1
        elif t.kind == "op" and t.text in ("}", ")", "]"):
            depth -= 1
        elif depth == 0 and t.kind == "ident" and t.text == "with":
            cuts.append(t.start - expr.start)
    if not cuts:
        return expr.text, []
    base = expr.text[: cuts[0]].strip()
    pairs: list[tuple[str, str]] = []
    for a, b in zip(cuts, [*cuts[1:], len(expr.text)], strict=True):
        part = expr.text[a + len("with") : b].strip()
        m = re.match(r"([\w.\[\]\"]+)\s+as\s+(.*)\Z", part, re.S)
        if m:
            pairs.append((m.group(1), m.group(2).strip()))
        else:
            pairs.append((part, ""))
    return base, pairs
