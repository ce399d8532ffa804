"""The one Rego lexer: the decision cache key (``inputrefs``) and the authoring tools
(``regosrc``: lint, coverage, the test runner's rewriting) read the same tokens.

Two lexers used to disagree (a form feed, a template string), so the tools and the key could see
different rules in the same text; the key's reading decides which cached decision a request
gets, so there is exactly one reading. It follows the compiler where that matters: ``-`` is
always an operator (``3-1``), a form feed or vertical tab is whitespace, a template string
(``$"...{input.x}..."``, ``$`...```) is one ``template`` token (its interpolations are code the
key cannot bound), and a character the lexer does not know is an ``other`` token (the key gives
up on it; the tools skip it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Token", "tokenize"]

_TOKEN = re.compile(
    r"""
    (?P<comment>\#[^\n]*)
  | (?P<template>\$"(?:[^"\\\n]|\\.)*"|\$`[^`]*`)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<raw>`[^`]*`)
  | (?P<newline>\n)
  | (?P<space>[ \t\r\f\v]+)
  | (?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>:=|==|!=|<=|>=|[{}()\[\];,.:=<>+\-*/%&|!])
    """,
    re.X,
)


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # comment | template | string | raw | newline | number | ident | op | other
    text: str
    start: int  # offset in the module source
    line: int  # 1-based
    col: int  # 1-based


def tokenize(source: str) -> list[Token]:
    """Every token but whitespace, with its offset, line and column; a character no token
    starts with becomes an ``other`` token of its own."""
    out: list[Token] = []
    pos, line, line_start = 0, 1, 0
    n = len(source)
    while pos < n:
        m = _TOKEN.match(source, pos)
        if m is None:
            out.append(Token("other", source[pos], pos, line, pos - line_start + 1))
            pos += 1
            continue
        kind = m.lastgroup or "other"
        text = m.group()
        if kind != "space":
            out.append(Token(kind, text, pos, line, pos - line_start + 1))
        newlines = text.count("\n")
        if newlines:
            line += newlines
            line_start = pos + text.rfind("\n") + 1
        pos = m.end()
    return out
