"""Runs ``test_*`` rules of ``*_test.rego`` modules, in-process or in child processes.

regopy is native code that can abort the interpreter (``with input as`` over rules that depend on
other rules segfaults regopy 1.5). So tests run in a child process that reports each test as it
starts and ends (``python -m service.authz.regotest`` reads a job as JSON on stdin); when the
engine aborts, the test that started without ending is the culprit: it fails, named with its
file:line and the reason, and a new child runs the tests after it. One crash fails one test.

``with input as V`` is made to work: such a test is evaluated with its ``with input`` clauses
removed and the interpreter's input set to ``V`` (evaluated first, in the test's package), which is
what ``with input as`` means when every clause of the test gives the same ``V``. Other ``with``
forms are evaluated as written (see policies/README.md for what regopy does with them).

A failing test is explained: the runner evaluates growing prefixes of its body to find the first
expression that was false or undefined, and shows the variables bound before it and, for a
comparison, both sides; ``print()`` output of each test is captured.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from service import rego
from service.authz import regolex, regosrc
from service.authz.projection import build_projection
from service.authz.source import Snapshot, SourceError, locate_errors

__all__ = [
    "DECISION_ENTRYPOINT",
    "EXPLAIN_ENTRYPOINT",
    "Capture",
    "TestCase",
    "TestReport",
    "TestResult",
    "discover",
    "exit_reason",
    "run_tests",
    "run_tests_isolated",
    "vet",
    "with_input",
]

DECISION_ENTRYPOINT = "controlplane/authz/decision"
EXPLAIN_ENTRYPOINT = "controlplane/authz/explain"

log = logging.getLogger(__name__)

_MARKER = "@@regotest@@ "
_HELPER = "__cpctl_"

# A probe the vetting child evaluates once, so a revision that crashes at evaluation is rejected
# before a worker loads it (its value is not checked: the policy may decide anything).
_PROBE = {
    "principal": {
        "subject_id": "probe",
        "kind": "human",
        "roles": [],
        "groups": [],
        "grants": [],
        "step_up": {"verified": False, "at": None, "age_s": None},
    },
    "action": "databases.list",
    "resource": {"id": "probe", "kind": "probe"},
    "env": "dev",
    "context": {},
}


@dataclass(frozen=True)
class TestCase:
    """One test rule: its file, package and name (``entrypoint`` is the bundle path)."""

    __test__ = False  # not a pytest class
    file: str
    package: str
    name: str
    line: int = 0

    @property
    def entrypoint(self) -> str:
        return "/".join([*self.package.split("."), self.name])


@dataclass(frozen=True)
class TestResult:
    """One test's outcome. On failure: ``error`` (one line), and where known the failing
    ``expression`` with its ``location`` (file:line:col) and ``values`` (name, JSON text)."""

    __test__ = False
    file: str
    name: str
    passed: bool
    error: str = ""
    line: int = 0
    location: str = ""
    expression: str = ""
    values: tuple[tuple[str, str], ...] = ()
    output: str = ""
    duration_ms: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file, "name": self.name, "passed": self.passed, "error": self.error,
            "line": self.line, "location": self.location, "expression": self.expression,
            "values": [list(v) for v in self.values], "output": self.output,
            "duration_ms": self.duration_ms,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> TestResult:
        return cls(**{**doc, "values": tuple((str(a), str(b)) for a, b in doc.get("values", ()))})


@dataclass(frozen=True)
class TestReport:
    """All results, or ``error`` when the revision did not compile / the child crashed."""

    __test__ = False
    results: tuple[TestResult, ...]
    error: str = ""
    covered: tuple[str, ...] = field(default=())  # coverage marks (see coverage.py)

    @property
    def ok(self) -> bool:
        return not self.error and all(r.passed for r in self.results)

    @property
    def failed(self) -> tuple[TestResult, ...]:
        return tuple(r for r in self.results if not r.passed)

    def summary(self) -> str:
        if self.error:
            return self.error
        bad = self.failed
        if not bad:
            return f"{len(self.results)} passed"
        names = ", ".join(f"{r.file}:{r.line}:{r.name}" for r in bad[:5])
        return f"{len(bad)} of {len(self.results)} policy tests failed: {names}"


def discover(snapshot: Snapshot) -> list[TestCase]:
    """Every ``test_*`` rule (not function) in the snapshot's ``*_test.rego`` modules."""
    cases: list[TestCase] = []
    for module in snapshot.test_modules:
        info = regosrc.parse_module(module.name, module.source)
        if not info.package:
            continue
        seen: set[str] = set()
        for rule in info.rules:
            if rule.name.startswith("test_") and not rule.is_function and rule.name not in seen:
                seen.add(rule.name)  # a rule may have several bodies (incremental definition)
                cases.append(TestCase(module.name, info.package, rule.name, rule.line))
    return cases


# ---- evaluation (in the child, or in-process for the service's own test suite) ----------------


@dataclass
class _Job:
    snapshot: Snapshot
    cases: list[TestCase]
    explain: bool = True
    probe: bool = False  # vet: also compile the policy alone and evaluate one probe decision
    extra_modules: tuple[rego.Module, ...] = ()  # e.g. instrumentation (coverage.py)
    exclude: frozenset[str] = frozenset()  # test entrypoints blanked out before compiling


def run_tests(snapshot: Snapshot, only: str | None = None) -> TestReport:
    """Compile all modules with the revision's Rego data and evaluate each test rule."""
    cases = [c for c in discover(snapshot) if only is None or c.entrypoint == only]
    results: list[TestResult] = []
    error = ""
    for kind, value in _evaluate(_Job(snapshot, cases)):
        if kind == "result":
            results.append(value)
        elif kind == "error":
            error = value
    return TestReport(tuple(results), error)


def vet(snapshot: Snapshot) -> TestReport:
    """What a new revision must pass before it serves: compile, one probe decision, all tests."""
    results: list[TestResult] = []
    for kind, value in _evaluate(_Job(snapshot, discover(snapshot), explain=False, probe=True)):
        if kind == "error":
            return TestReport((), value)
        if kind == "result":
            results.append(value)
    return TestReport(tuple(results))


def prepare(
    snapshot: Snapshot, exclude: frozenset[str] = frozenset()
) -> tuple[Snapshot, dict[str, str]]:
    """The snapshot the runner compiles: tests whose ``with`` clauses are all ``with input as V``
    lose those clauses and gain a helper rule ``V`` (appended; line numbers are kept), and the
    ``exclude``d tests are blanked out. Returns it and test entrypoint -> helper entrypoint."""
    helpers: dict[str, str] = {}
    modules: list[rego.Module] = []
    for module in snapshot.test_modules:
        info = regosrc.parse_module(module.name, module.source)
        source = module.source
        extra: list[str] = []
        for rule in sorted(info.rules, key=lambda r: r.start, reverse=True):
            if not rule.name.startswith("test_") or rule.is_function:
                continue
            ep = "/".join([*info.package.split("."), rule.name])
            if ep in exclude:
                source = source[: rule.start] + _blank(source[rule.start : rule.end]) + (
                    source[rule.end :])
                continue
            value = with_input(rule)
            if value is None:
                continue
            source = _strip_with(source, rule)
            helper = f"{_HELPER}with_input_{rule.name}"
            if helper not in helpers.values():
                extra.append(_helper_rule(helper, rule, value))
            helpers[ep] = "/".join([*info.package.split("."), helper])
        if extra:
            source = source.rstrip("\n") + "\n\n" + "\n".join(sorted(set(extra))) + "\n"
        modules.append(rego.Module(module.name, source))
    prepared = Snapshot(snapshot.modules, tuple(modules), snapshot.data, snapshot.data_files,
                        snapshot.revision)
    return prepared, helpers


def _blank(text: str) -> str:
    return "\n" * text.count("\n")


def _evaluate(
    job: _Job, capture: Callable[[], Capture] | None = None
) -> Iterator[tuple[str, Any]]:
    """Yields ``("start", entrypoint)``, ``("result", TestResult)``, ``("error", text)``."""
    try:
        data = build_projection(job.snapshot.data).rego_data
    except SourceError as exc:
        yield "error", f"data: {exc}"
        return
    if job.probe:
        try:
            bundle = rego.compile_bundle(job.snapshot.modules, data, [DECISION_ENTRYPOINT])
            bundle.query(DECISION_ENTRYPOINT, _PROBE)
        except rego.RegoCompileError as exc:
            yield "error", "compile: " + _located(str(exc), job.snapshot)
            return
        except rego.RegoEvalError:
            pass  # evaluation errors fail closed at decision time; only compile errors reject
    cases = [c for c in job.cases if c.entrypoint not in job.exclude]
    if not cases:
        return
    snapshot, helpers = prepare(job.snapshot, job.exclude)
    modules = (*snapshot.all_modules, *job.extra_modules)
    entrypoints = [c.entrypoint for c in cases]
    entrypoints += sorted({helpers[e] for e in entrypoints if e in helpers})
    try:
        bundle = rego.compile_bundle(modules, data, entrypoints)
    except rego.RegoCompileError as exc:
        yield "error", "compile: " + _located(str(exc), snapshot)
        return
    infos = {m.name: regosrc.parse_module(m.name, m.source) for m in snapshot.test_modules}
    for case in cases:
        yield "start", case.entrypoint
        rule = _rule(infos.get(case.file), case.name)
        started = time.perf_counter()
        cap = capture() if capture else None
        input_doc: Any = {}
        error = ""
        try:
            if case.entrypoint in helpers:
                input_doc = bundle.query(helpers[case.entrypoint], {})
                if not isinstance(input_doc, dict):
                    error = f"with input as ...: the value is {_show(input_doc)}, not an object"
            value = bundle.query(case.entrypoint, input_doc) if not error else None
            if not error and value is not True:
                error = f"result: {_show(value)}"
        except rego.RegoEvalError as exc:
            value, error = None, f"error: {exc}"
        output = cap.read() if cap else ""
        elapsed = (time.perf_counter() - started) * 1000
        result = TestResult(case.file, case.name, value is True, error, case.line, output=output,
                            duration_ms=round(elapsed, 3))
        if not result.passed and job.explain and rule is not None and isinstance(
            input_doc, dict
        ) and not _has_with(rule):
            quiet = capture() if capture else None
            try:
                result = _explained(result, snapshot, modules, data, infos[case.file], rule,
                                    input_doc)
            except Exception:  # an explanation is best effort: the failure stands without it
                log.debug("cannot explain %s", case.entrypoint, exc_info=True)
            finally:
                if quiet:
                    quiet.read()
        yield "result", result


def _rule(info: regosrc.ModuleInfo | None, name: str) -> regosrc.Rule | None:
    if info is None:
        return None
    for rule in info.rules:
        if rule.name == name and rule.bodies:
            return rule
    return None


def _has_with(rule: regosrc.Rule) -> bool:
    return any(regosrc.with_clauses(e)[1] for b in rule.bodies for e in b.exprs)


def with_input(rule: regosrc.Rule) -> str | None:
    """The ``V`` of a test whose ``with`` clauses are all ``with input as V`` (same V), when
    ``V`` does not use the test's own variables, or uses only variables bound before the first
    ``with`` (``v := {...}`` then ``... with input as v``): ``_helper_rule`` computes it."""
    values: set[str] = set()
    bound: set[str] = set()
    for body in rule.bodies:
        for expr in body.exprs:
            bound.update(regosrc.bound_names(expr))
            _, pairs = regosrc.with_clauses(expr)
            for target, value in pairs:
                if target != "input" or not value:
                    return None
                values.add(value)
    if len(values) != 1:
        return None
    value = values.pop()
    used = {t.text for t in regolex.tokenize(value) if t.kind == "ident"}
    if not used & bound:
        return value
    prefix = _before_with(rule)
    if prefix is None:
        return None
    before = {n for e in prefix for n in regosrc.bound_names(e)}
    return value if used & bound <= before else None


def _before_with(rule: regosrc.Rule) -> list[regosrc.Expr] | None:
    """The expressions of a one-body test before its first ``with`` (None: several bodies)."""
    if len(rule.bodies) != 1:
        return None
    prefix = []
    for expr in rule.bodies[0].exprs:
        if regosrc.with_clauses(expr)[1]:
            break
        prefix.append(expr)
    return prefix


def _helper_rule(helper: str, rule: regosrc.Rule, value: str) -> str:
    """The rule whose value is the test's input: ``V``, or for a ``V`` built from the test's
    variables, ``V`` after the expressions that bind them (the test's own prefix, re-run with
    an empty input: what a test's expressions without ``with`` see under the runner)."""
    used = {t.text for t in regolex.tokenize(value) if t.kind == "ident"}
    prefix = _before_with(rule) or []
    if not used & {n for e in prefix for n in regosrc.bound_names(e)}:
        return f"{helper} := {value}"
    body = "\n".join(e.text for e in prefix)
    return f"{helper} := {value} if {{\n{body}\n}}"


def _strip_with(source: str, rule: regosrc.Rule) -> str:
    """The module source with the rule's ``with`` clauses removed (line numbers kept)."""
    out = source
    exprs = [e for b in rule.bodies for e in b.exprs]
    for expr in sorted(exprs, key=lambda e: e.start, reverse=True):
        base, pairs = regosrc.with_clauses(expr)
        if pairs:
            out = out[: expr.start] + base + _blank(expr.text[len(base) :]) + out[expr.end :]
    return out


def _helper_module(info: regosrc.ModuleInfo, rules: list[str]) -> rego.Module:
    """A module in the test's package, with its imports, holding ``rules``."""
    imports = [
        f"import {path} as {alias}" for alias, path in info.imports.items()
        if not path.startswith(("rego.", "future."))
    ]
    text = "\n".join([f"package {info.package}", "import rego.v1", *imports, *rules]) + "\n"
    return rego.Module(f"{_HELPER}{info.name}", text)


def _explained(
    result: TestResult,
    snapshot: Snapshot,
    modules: Sequence[rego.Module],
    data: Any,
    info: regosrc.ModuleInfo,
    rule: regosrc.Rule,
    input_doc: dict[str, Any],
) -> TestResult:
    """Find the first expression of the (first) body that is false or undefined."""
    body = rule.bodies[0]
    texts = [e.text for e in body.exprs]
    bound: list[str] = []
    rules: list[str] = []
    names: list[str] = []
    for k, expr in enumerate(body.exprs):
        prefix = "\n".join(texts[: k + 1])
        for n in regosrc.bound_names(expr):
            if n not in bound:
                bound.append(n)
        obj = ", ".join(f'"{n}": {n}' for n in bound)
        rules.append(f"{_HELPER}p{k} := {{{obj}}} if {{\n{prefix}\n}}")
        names.append(f"{_HELPER}p{k}")
    pkg = info.package.split(".")
    helper = _helper_module(info, rules)
    bundle = rego.compile_bundle([*modules, helper], data, ["/".join([*pkg, n]) for n in names])
    previous: Any = {}
    for k, expr in enumerate(body.exprs):
        value = bundle.query("/".join([*pkg, names[k]]), input_doc)
        if value is rego.Undefined:
            shown = _values(previous, modules, data, info, texts, k, expr, input_doc)
            where = f"{info.name}:{expr.line}:{expr.col}"
            return TestResult(
                result.file, result.name, False,
                f"{where}: expression is false or undefined: {_one_line(texts[k])}",
                result.line, where, texts[k], shown, result.output, result.duration_ms,
            )
        previous = value
    return result


def _values(
    bound: Any,
    modules: Sequence[rego.Module],
    data: Any,
    info: regosrc.ModuleInfo,
    texts: list[str],
    k: int,
    expr: regosrc.Expr,
    input_doc: dict[str, Any],
) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    if isinstance(bound, dict):
        used = {t.text for t in expr.tokens if t.kind == "ident"}
        for name, value in bound.items():
            if name in used:
                out.append((name, _show(value)))
    sides: list[tuple[str, str]] = []
    text = texts[k]
    cmp = None if text.startswith("not ") else regosrc.comparison(expr)
    if cmp is not None:
        sides = [("lhs", cmp[0]), ("rhs", cmp[2])]
    elif text.startswith("not "):
        sides = [("negated expression", text[4:].strip())]
    elif regosrc.bound_names(expr):
        sides = []
    else:
        sides = [("value", text)]
    prefix = "\n".join(texts[:k]) or "true"
    pkg = info.package.split(".")
    for label, term in sides:
        helper = _helper_module(
            info, [f"{_HELPER}side := {{\"v\": ({term})}} if {{\n{prefix}\n}}"]
        )
        ep = "/".join([*pkg, f"{_HELPER}side"])
        try:
            got = rego.compile_bundle([*modules, helper], data, [ep]).query(ep, input_doc)
        except (rego.RegoCompileError, rego.RegoEvalError):
            continue
        shown = "undefined" if got is rego.Undefined else _show(got.get("v"))
        out.append((f"{label}: {_one_line(term)[:80]}", shown))
    return tuple(out)


def _one_line(text: str) -> str:
    return " ".join(text.split())


# ---- the child process -----------------------------------------------------------------------


class Capture:
    """Redirects file descriptor 1 (where the native library's ``print`` writes) to a
    temporary file until ``read``, which puts ``out_fd`` (a duplicate of the real fd 1) back."""

    _libc = ctypes.CDLL(None)

    def __init__(self, out_fd: int) -> None:
        self._out_fd = out_fd
        sys.stdout.flush()
        self._libc.fflush(None)
        self._file = tempfile.TemporaryFile()
        os.dup2(self._file.fileno(), 1)

    def read(self) -> str:
        self._libc.fflush(None)
        os.dup2(self._out_fd, 1)
        self._file.seek(0)
        text = self._file.read().decode("utf-8", "replace")
        self._file.close()
        return text[:1_000_000]


def _child() -> int:
    job_doc = json.loads(sys.stdin.read())
    snapshot = Snapshot.from_json(json.dumps(job_doc["snapshot"]))
    wanted = job_doc.get("only")
    cases = [c for c in discover(snapshot) if wanted is None or c.entrypoint in wanted]
    extra = tuple(rego.Module(n, s) for n, s in job_doc.get("extra_modules", ()))
    job = _Job(snapshot, cases, job_doc.get("explain", True), job_doc.get("probe", False), extra,
               frozenset(job_doc.get("exclude", ())))
    out_fd = os.dup(1)
    os.dup2(2, 1)  # stray native output (compile diagnostics) goes to stderr, not the protocol
    stray_fd = os.dup(1)  # where fd 1 goes back to after each captured test

    def emit(doc: dict[str, Any]) -> None:
        os.write(out_fd, (_MARKER + json.dumps(doc) + "\n").encode())

    for kind, value in _evaluate(job, lambda: Capture(stray_fd)):
        if kind == "result":
            emit({"result": value.to_json()})
        elif kind == "start":
            emit({"start": value})
        else:
            emit({"error": value})
    emit({"done": True})
    return 0


def run_tests_isolated(
    snapshot: Snapshot,
    *,
    mode: str = "test",
    only: str | Sequence[str] | None = None,
    timeout: float = 60.0,
    explain: bool = True,
    extra_modules: Sequence[rego.Module] = (),
) -> TestReport:
    """``run_tests`` (mode ``test``) or ``vet`` (mode ``vet``) in child interpreters.

    A test during which the engine aborts fails alone (named, with the reason); the other tests
    run in a fresh child and report their own results. When the engine aborts while compiling,
    the tests that still carry ``with`` clauses are set aside, the rest run, and each of those
    runs alone so that the one the engine cannot compile is named."""
    cases = discover(snapshot)
    if only is not None:
        wanted = {only} if isinstance(only, str) else set(only)
        cases = [c for c in cases if c.entrypoint in wanted]
    by_ep = {c.entrypoint: c for c in cases}
    deadline = time.monotonic() + timeout
    runner = _Runner(snapshot, mode, explain and mode != "vet", extra_modules, deadline)
    results, error, compile_crash = runner.run([c.entrypoint for c in cases], frozenset())
    if error or not compile_crash:
        return TestReport(tuple(results), error)
    prepared, _ = prepare(snapshot)
    infos = {m.name: regosrc.parse_module(m.name, m.source) for m in prepared.test_modules}
    suspects = {
        c.entrypoint for c in cases
        if (rule := _rule(infos.get(c.file), c.name)) is not None and _has_with(rule)
    }
    pending = [ep for ep in by_ep if ep not in {_result_ep(r, by_ep) for r in results}]
    if not suspects & set(pending):
        return TestReport(tuple(results), compile_crash)
    rest = [ep for ep in pending if ep not in suspects]
    more, error, crash = runner.run(rest, frozenset(suspects))
    results += more
    if error or crash:
        return TestReport(tuple(results), error or crash)
    for ep in sorted(suspects & set(pending)):
        others = frozenset(suspects - {ep})
        one, error, crash = runner.run([ep], others)
        if crash:
            results.append(_crashed(snapshot, by_ep[ep], crash.split("(")[1].split(")")[0],
                                    compiling=True))
        else:
            results += one
    order = {ep: k for k, ep in enumerate(by_ep)}
    results.sort(key=lambda r: order.get(_result_ep(r, by_ep), 0))
    return TestReport(tuple(results))


def _result_ep(result: TestResult, by_ep: dict[str, TestCase]) -> str:
    for ep, case in by_ep.items():
        if case.file == result.file and case.name == result.name:
            return ep
    return ""


@dataclass
class _Runner:
    snapshot: Snapshot
    mode: str
    explain: bool
    extra_modules: Sequence[rego.Module]
    deadline: float

    def run(
        self, todo: list[str], exclude: frozenset[str]
    ) -> tuple[list[TestResult], str, str]:
        """(results, error, compile-phase crash) for the ``todo`` tests; one child per crash."""
        results: list[TestResult] = []
        remaining = list(todo)
        probe = self.mode == "vet"
        by_ep = {c.entrypoint: c for c in discover(self.snapshot)}
        while True:
            job = {
                "snapshot": json.loads(self.snapshot.to_json()), "only": remaining,
                "explain": self.explain, "probe": probe, "exclude": sorted(exclude),
                "extra_modules": [[m.name, m.source] for m in self.extra_modules],
            }
            try:
                proc = subprocess.run(  # our own interpreter and module
                    [sys.executable, "-m", "service.authz.regotest"],
                    input=json.dumps(job), capture_output=True, text=True,
                    timeout=max(1.0, self.deadline - time.monotonic()), check=False,
                )
            except subprocess.TimeoutExpired:
                return results, "policy tests timed out", ""
            started: str | None = None
            done = False
            for line in proc.stdout.splitlines():
                if not line.startswith(_MARKER):
                    continue
                doc = json.loads(line[len(_MARKER) :])
                if "start" in doc:
                    started = doc["start"]
                elif "result" in doc:
                    results.append(TestResult.from_json(doc["result"]))
                    if started in remaining:
                        remaining.remove(started)
                    started = None
                elif "error" in doc:
                    return results, doc["error"], ""
                elif "done" in doc:
                    done = True
            if done and proc.returncode == 0:
                return results, "", ""
            reason = exit_reason(proc.returncode)
            if started is None:  # before any test: compiling, or the probe decision
                return results, "", (
                    f"policy engine crashed ({reason}) while {self.mode}ing the revision"
                )
            results.append(_crashed(self.snapshot, by_ep[started], reason))
            remaining.remove(started)
            probe = False  # the probe passed: a test had started
            if not remaining:
                return results, "", ""


def _crashed(
    snapshot: Snapshot, case: TestCase, reason: str, *, compiling: bool = False
) -> TestResult:
    source = next((m.source for m in snapshot.test_modules if m.name == case.file), "")
    rule = _rule(regosrc.parse_module(case.file, source), case.name)
    where, culprit = f"{case.file}:{case.line}", ""
    if rule is not None:
        for body in rule.bodies:
            for expr in body.exprs:
                _, pairs = regosrc.with_clauses(expr)
                if pairs:
                    where = f"{case.file}:{expr.line}:{expr.col}"
                    culprit = f" on `with {pairs[0][0]} as ...` here"
                    break
            if culprit:
                break
    return TestResult(
        case.file, case.name, False,
        f"{where}: the engine aborted ({reason}) "
        f"{'compiling this test' if compiling else 'evaluating this test'}{culprit}; "
        "the other tests ran in a new process",
        case.line, where,
    )


def exit_reason(code: int) -> str:
    """How a child process ended, for a message: ``exit 3``, ``SIGSEGV``."""
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit {code}"


def _located(message: str, snapshot: Snapshot) -> str:
    locs = locate_errors(message, {m.name: m.source for m in snapshot.all_modules})
    return "; ".join(str(loc) for loc in locs) if locs else message[:500]


def _show(value: Any) -> str:
    return "undefined" if value is rego.Undefined else json.dumps(value, sort_keys=True)[:200]




if __name__ == "__main__":
    raise SystemExit(_child())
