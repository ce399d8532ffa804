"""``cpctl policy lint``: compile errors (in a child process) and static checks regopy lacks.

regopy compiles unbound variables, references to data that does not exist and rules that can
never be defined without a word (they are just undefined at run time), and it can abort the
process on some forms. So the compile runs in a child interpreter (an abort is reported, never
fatal), and the static checks read the source (``regosrc``):

- ``unsafe-var``: a variable read in a rule that nothing binds (``input.x == truee``);
- ``unknown-ref``: ``data.a.b`` that is neither in the data files nor a rule of a package;
- ``never-defined``: a body with ``false``, a comparison of two different constants, or one
  reference compared equal to two different constants;
- ``with``: ``with`` forms regopy 1.5 mishandles and the test runner cannot rewrite;
- ``undefined-function``: a call to a function that is neither a rule of the policy nor a
  built-in of the engine (regopy compiles it; every evaluation that reaches it then fails with
  "function not found"). The engine is asked which names are built-ins in the child process.

Each problem is reported once, with file:line:col.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from service import rego
from service.authz import regolex, regosrc
from service.authz.projection import build_projection
from service.authz.regotest import DECISION_ENTRYPOINT, exit_reason, prepare, with_input
from service.authz.source import Snapshot, SourceError, locate_errors

__all__ = ["GATING", "Problem", "lint", "static_problems"]

#: Problems ``cpctl policy test`` refuses to run with (exit 2): they make rules silently
#: undefined, so the tests would report failures (or passes) about something else.
GATING = ("unsafe-var", "undefined-function")

_KEYWORDS = {
    "not", "some", "every", "in", "if", "else", "with", "as", "default", "contains", "import",
    "package", "true", "false", "null", "input", "data", "_",
}
_LITERALS = {"number", "string", "raw"}


@dataclass(frozen=True)
class Problem:
    file: str
    line: int
    col: int
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.code}: {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "col": self.col, "code": self.code,
                "message": self.message}


def lint(snapshot: Snapshot, timeout: float = 60.0) -> list[Problem]:
    """Every problem found: the compile (in a child) first, then the static checks."""
    problems, builtins = _compile_in_child(snapshot, timeout)
    return sorted([*problems, *static_problems(snapshot, builtins)],
                  key=lambda p: (p.file, p.line, p.col))


def static_problems(snapshot: Snapshot, builtins: set[str] | None = None) -> list[Problem]:
    """The static checks alone (no compile). ``builtins``: the called names the engine knows
    (from the lint child); None skips the undefined-function check."""
    problems: list[Problem] = []
    try:
        data: Mapping[str, Any] = build_projection(snapshot.data).rego_data
    except SourceError as exc:
        return [Problem("data", 0, 0, "data", str(exc))]
    infos = [regosrc.parse_module(m.name, m.source) for m in snapshot.all_modules]
    rules_by_package = _rules_by_package(infos)
    seen: set[tuple[str, int, int, str]] = set()
    for info in infos:
        for problem in [
            *_unsafe_vars(info, rules_by_package.get(info.package, set())),
            *_unknown_refs(info, data, rules_by_package),
            *_never_defined(info),
            *_with_forms(info),
            *(_undefined_calls(info, rules_by_package, builtins) if builtins is not None else ()),
        ]:
            key = (problem.file, problem.line, problem.col, problem.code)
            if key not in seen:
                seen.add(key)
                problems.append(problem)
    return sorted(problems, key=lambda p: (p.file, p.line, p.col))


def _compile_in_child(snapshot: Snapshot, timeout: float) -> tuple[list[Problem], set[str] | None]:
    """Compile problems, and which called names are built-ins (None: the child could not say)."""
    try:
        proc = subprocess.run(  # our own interpreter and module
            [sys.executable, "-m", "service.policytools.lint"], input=snapshot.to_json(),
            capture_output=True, text=True, timeout=timeout, check=False,
        )
    except subprocess.TimeoutExpired:
        return [Problem("-", 0, 0, "compile", f"compiling timed out after {timeout:.0f}s")], None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@lint@@ ")]
    if proc.returncode != 0 or not lines:
        return [Problem("-", 0, 0, "compile",
                        f"the policy engine aborted ({exit_reason(proc.returncode)}) compiling the "
                        "modules; the static checks below still ran")], None
    answer = json.loads(lines[-1][len("@@lint@@ ") :])
    message = answer["error"]
    builtins = set(answer.get("builtins", []))
    if not message:
        return [], builtins
    sources = {m.name: m.source for m in snapshot.all_modules}
    located = locate_errors(message, sources)
    if not located:
        return [Problem("-", 0, 0, "compile", message[:500])], builtins
    return [Problem(x.file, x.line, x.column, "compile", x.message) for x in located], builtins


def called_names(snapshot: Snapshot) -> set[str]:
    """Every name called as a function that no module defines (built-in candidates)."""
    infos = [regosrc.parse_module(m.name, m.source) for m in snapshot.all_modules]
    rules_by_package = _rules_by_package(infos)
    return {name for info in infos for name, _ in _calls(info, rules_by_package)}


def _child() -> int:
    snapshot = Snapshot.from_json(sys.stdin.read())
    error = ""
    try:
        data = build_projection(snapshot.data).rego_data
        # as the test runner compiles it: tests' `with input as V` clauses rewritten
        prepared, _ = prepare(snapshot)
        rego.compile_bundle(prepared.all_modules, data, [DECISION_ENTRYPOINT])
    except rego.RegoCompileError as exc:
        error = str(exc)
    except SourceError:
        error = ""  # reported by the parent's data check
    builtins = sorted(rego.builtins_among(called_names(snapshot)))
    print("@@lint@@ " + json.dumps({"error": error, "builtins": builtins}), flush=True)
    return 0


# ---- static checks -------------------------------------------------------------------------


def _rules_by_package(infos: list[regosrc.ModuleInfo]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for info in infos:
        out.setdefault(info.package, set()).update(r.name.split(".")[0] for r in info.rules)
    return out


#: Called like functions but not built-ins of regopy's ``is_builtin``.
_CALL_KEYWORDS = {"print"}


def _calls(info: regosrc.ModuleInfo, rules_by_package: dict[str, set[str]]
           ) -> list[tuple[str, regolex.Token]]:
    """(name, token) of each call in ``info`` to a function no module of the policy defines:
    a bare name that is not a rule of the package, ``alias.f`` / ``data.pkg.f`` whose package
    has no rule ``f``, or any other dotted name (``regex.match``: a built-in, or nothing)."""
    own = rules_by_package.get(info.package, set())
    out: list[tuple[str, regolex.Token]] = []
    for rule in info.rules:
        toks = [t for t in rule.tokens if t.kind != "newline"]
        for k, t in enumerate(toks):
            if t.kind != "ident" or k == 0 or toks[k - 1].text == ".":
                continue
            chain = [t.text]
            j = k
            while j + 2 < len(toks) and toks[j + 1].text == "." and toks[j + 2].kind == "ident":
                chain.append(toks[j + 2].text)
                j += 2
            if j + 1 >= len(toks) or toks[j + 1].text != "(":
                continue
            head = chain[0]
            if head in info.imports and info.imports[head].startswith("data."):
                chain = info.imports[head].split(".") + chain[1:]
                head = "data"
            if head == "data":
                package = ".".join(chain[1:-1])
                if chain[-1] in rules_by_package.get(package, set()):
                    continue
            elif len(chain) == 1 and (head in own or head in _CALL_KEYWORDS):
                continue
            elif head in ("input", "future", "rego"):
                continue
            out.append((".".join(chain), t))
    return out


def _undefined_calls(info: regosrc.ModuleInfo, rules_by_package: dict[str, set[str]],
                     builtins: set[str]) -> list[Problem]:
    out = []
    for name, t in _calls(info, rules_by_package):
        if name.startswith("data."):
            # a package of the policy without that rule (an unknown package is an unknown-ref)
            undefined = name[len("data."):].rsplit(".", 1)[0] in rules_by_package
        else:
            undefined = name not in builtins
        if undefined:
            out.append(Problem(
                info.name, t.line, t.col, "undefined-function",
                f"`{name}` is neither a function of the policy nor a built-in: every evaluation "
                "that reaches this call fails with \"function not found\" (a typo?)"))
    return out


def _unsafe_vars(info: regosrc.ModuleInfo, package_rules: set[str]) -> list[Problem]:
    known = _KEYWORDS | package_rules | set(info.imports)
    out: list[Problem] = []
    for rule in info.rules:
        toks = [t for t in rule.tokens if t.kind != "newline"]
        bound = set(rule.args)
        for k, t in enumerate(toks):
            if t.kind != "ident":
                continue
            nxt = toks[k + 1].text if k + 1 < len(toks) else ""
            prev = toks[k - 1].text if k > 0 else ""
            if nxt in (":=", "="):
                bound.add(t.text)
            if prev in ("=",) and t.text not in known:
                bound.add(t.text)
            if prev in ("some", "every", ",") and _in_decl(toks, k):
                bound.add(t.text)
            if _inside_brackets(toks, k):
                bound.add(t.text)
            if prev == "contains" or (nxt == "|" and prev in ("[", "{")):
                bound.add(t.text)
        reported: set[str] = set()
        for k, t in enumerate(toks):
            if t.kind != "ident" or t.text in known or t.text in bound or t.text in reported:
                continue
            prev = toks[k - 1].text if k > 0 else ""
            if prev == "." or k == 0 or (rule.is_default and k == 1):
                continue
            j = k
            while j + 2 < len(toks) and toks[j + 1].text == "." and toks[j + 2].kind == "ident":
                j += 2
            if j + 1 < len(toks) and toks[j + 1].text == "(":
                continue  # a function call: the compiler checks those
            if j + 1 < len(toks) and toks[j + 1].text == ":" and prev in ("{", ","):
                continue  # an object key written bare
            reported.add(t.text)
            out.append(Problem(info.name, t.line, t.col, "unsafe-var",
                               f"`{t.text}` is not bound: not an argument, assigned, iterated, "
                               "a rule of the package or an import (a typo?)"))
    return out


def _in_decl(toks: list[regolex.Token], k: int) -> bool:
    """Token ``k`` is in the name list of a ``some``/``every`` declaration."""
    j = k
    while j > 0 and toks[j - 1].text == "," and j - 2 >= 0 and toks[j - 2].kind == "ident":
        j -= 2
    return j > 0 and toks[j - 1].text in ("some", "every")


def _inside_brackets(toks: list[regolex.Token], k: int) -> bool:
    """Token ``k`` is the whole index of a ref (``x[i]``): Rego binds ``i`` by iteration."""
    return (
        0 < k < len(toks) - 1 and toks[k - 1].text == "[" and toks[k + 1].text == "]"
        and k >= 2 and (toks[k - 2].kind == "ident" or toks[k - 2].text in ("]", ")"))
    )


def _unknown_refs(
    info: regosrc.ModuleInfo, data: Mapping[str, Any], rules_by_package: dict[str, set[str]]
) -> list[Problem]:
    out: list[Problem] = []
    for rule in info.rules:
        toks = [t for t in rule.tokens if t.kind != "newline"]
        aliases = {a: p for a, p in info.imports.items() if p.startswith("data.")}
        for k, t in enumerate(toks):
            if t.kind != "ident" or (k > 0 and toks[k - 1].text == "."):
                continue
            if t.text == "data":
                path: list[str] = []
            elif t.text in aliases:
                path = aliases[t.text].split(".")[1:]
            else:
                continue
            j = k
            while j + 2 < len(toks) and toks[j + 1].text == "." and toks[j + 2].kind == "ident":
                path.append(toks[j + 2].text)
                j += 2
            problem = _check_path(path, data, rules_by_package)
            if problem:
                out.append(Problem(info.name, t.line, t.col, "unknown-ref", problem))
    return out


def _check_path(
    path: list[str], data: Mapping[str, Any], rules_by_package: dict[str, set[str]]
) -> str | None:
    if not path:
        return None
    dotted = ".".join(path)
    for package, rules in rules_by_package.items():
        parts = package.split(".")
        if path[: len(parts)] == parts:
            rest = path[len(parts) :]
            if rest and rest[0] not in rules:
                return f"data.{dotted}: package {package} has no rule `{rest[0]}`"
            return None
        if parts[: len(path)] == path:
            return None  # a prefix of a package path
    node: Any = data
    for k, segment in enumerate(path):
        if not isinstance(node, Mapping):
            return None  # past the data the files define; the policy indexes a value
        if segment not in node:
            where = "data." + ".".join(path[:k]) if k else "data"
            return (f"data.{dotted}: {where} has no key `{segment}` in the data files "
                    "and no package defines it")
        node = node[segment]
    return None


def _never_defined(info: regosrc.ModuleInfo) -> list[Problem]:
    out: list[Problem] = []
    for rule in info.rules:
        for body in rule.bodies:
            equal: dict[str, tuple[str, regosrc.Expr]] = {}
            for expr in body.exprs:
                toks = [t for t in expr.tokens if t.kind != "newline"]
                reason = None
                if len(toks) == 1 and toks[0].text == "false":
                    reason = "its body has `false`"
                cmp = regosrc.comparison(expr)
                if cmp is not None and cmp[1] == "==":
                    lhs, _, rhs = cmp
                    if _literal(lhs) and _literal(rhs) and _norm(lhs) != _norm(rhs):
                        reason = f"`{expr.text}` compares two different constants"
                    for ref, const in ((lhs, rhs), (rhs, lhs)):
                        if _literal(const) and not _literal(ref):
                            prev = equal.get(ref)
                            if prev is not None and _norm(prev[0]) != _norm(const):
                                reason = (f"`{ref}` must equal both {prev[0]} (line "
                                          f"{prev[1].line}) and {const}")
                            equal.setdefault(ref, (const, expr))
                if reason:
                    out.append(Problem(info.name, expr.line, expr.col, "never-defined",
                                       f"rule `{rule.name}` can never be defined here: {reason}"))
                    break
    return out


def _literal(text: str) -> bool:
    toks = regolex.tokenize(text.strip())
    if len(toks) == 2 and toks[0].text == "-" and toks[1].kind == "number":
        toks = toks[1:]  # a negative number: ``-`` is an operator to the lexer
    return len(toks) == 1 and (
        toks[0].kind in _LITERALS or toks[0].text in ("true", "false", "null")
    )


def _norm(text: str) -> Any:
    try:
        return json.dumps(json.loads(text.strip()))
    except ValueError:
        return text.strip()


def _with_forms(info: regosrc.ModuleInfo) -> list[Problem]:
    out: list[Problem] = []
    for rule in info.rules:
        rewritable = rule.name.startswith("test_") and with_input(rule) is not None
        for body in rule.bodies:
            for expr in body.exprs:
                _, pairs = regosrc.with_clauses(expr)
                for target, _value in pairs:
                    if target == "input" and rewritable:
                        continue
                    if target == "input":
                        msg = ("`with input as` here is evaluated as written and aborts regopy "
                               "1.5 over rules that depend on other rules; give every `with "
                               "input` of a test_ rule the same value (a value, or variables "
                               "the test binds before its first `with`), and the runner "
                               "evaluates it safely")
                    else:
                        msg = (f"`with {target} as` is evaluated as written: regopy 1.5 leaves "
                               "rules that depend on a replaced rule undefined; pass the value "
                               "to a function instead")
                    out.append(Problem(info.name, expr.line, expr.col, "with", msg))
    return out


if __name__ == "__main__":
    raise SystemExit(_child())
