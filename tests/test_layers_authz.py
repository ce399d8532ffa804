"""Serving and authoring tools, kept apart: ``service.authz`` (what decides requests) never
imports ``service.policytools`` (lint, coverage, replay, cases, change reports), and there is one
Rego lexer.

Every import node counts here, inside functions and ``TYPE_CHECKING`` blocks too: a tool pulled
into the serving process by a lazy import is still a tool on the decision path.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVICE = ROOT / "service"


def _imported(source: str, path: Path) -> set[str]:
    """The absolute names of everything ``source`` (the text of module ``path``) imports,
    anywhere in it."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            names.add(target)
            names.update(f"{target}.{alias.name}" for alias in node.names)
    return names


def _tools(names: set[str]) -> list[str]:
    return sorted(n for n in names
                  if n == "service.policytools" or n.startswith("service.policytools."))


def test_serving_never_imports_the_policy_tools() -> None:
    offenders = {}
    for path in sorted((SERVICE / "authz").rglob("*.py")):
        found = _tools(_imported(path.read_text(encoding="utf-8"), path))
        if found:
            offenders[str(path.relative_to(ROOT))] = found
    assert offenders == {}


def test_the_check_finds_relative_and_lazy_imports() -> None:
    source = ("from typing import TYPE_CHECKING\n"
              "if TYPE_CHECKING:\n    from service.policytools.change import report\n"
              "def f():\n    from ..policytools import lint\n    import service.policytools.cases\n")
    found = _tools(_imported(source, SERVICE / "authz" / "probe.py"))
    assert found == ["service.policytools", "service.policytools.cases",
                     "service.policytools.change", "service.policytools.change.report",
                     "service.policytools.lint"]


def test_one_rego_lexer() -> None:
    """Only ``authz.regolex`` turns Rego text into tokens: a second lexer is how the cache key
    and the tools came to read the same policy differently."""
    lexers = sorted(str(p.relative_to(ROOT)) for p in SERVICE.rglob("*.py")
                    if "(?P<raw>" in p.read_text(encoding="utf-8"))
    assert lexers == ["service/authz/regolex.py"]
