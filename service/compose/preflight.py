"""The compose preflight: evaluate normalized Compose fields against the rule matrix; the report.

Framework-free: the HTTP handler and ``cpctl compose check`` both call ``evaluate()``, so their
reports are identical for the same input.

Rules are Rego modules in ``policies/compose/``, one per file, each in its own package
``controlplane.compose.rules.<file stem>`` defining ``meta`` (id, title, severity, rationale,
remediation), a set ``findings`` of ``{service, message, path | pointer[, severity]}`` (``path``:
the keys and indexes below the service; the preflight makes it a JSON pointer, which costs
nothing here and ~0.1 ms a finding in regopy), or the same compact,
``[service, path | pointer, message(, severity)]`` (what the shipped rules emit: ~40% of an
object's cost in regopy; ``_expanded`` makes it the object), and optionally a set
``not_applicable`` of service names. Modules in other packages (``lib.rego``) are helpers.

All rules are compiled into one bundle with generated entrypoints: one per group of
``GROUP_RULES`` rules (``controlplane/compose/groups/g<j>``) and one per rule
(``controlplane/compose/cells/<rule>``). A report converts its input and sets it once, then
queries each group against it (``Bundle.query_each``): measured ~30% cheaper than one generated
entrypoint gathering every rule (regopy builds a large result slowly) and ~6% cheaper than one
query per rule (each query has a fixed cost). A broken rule must not take the others down: a
module that fails to compile is left out of the bundle (found by compiling each rule alone, only
when the whole bundle fails), and when a group's query fails, its rules are queried one by one,
so only the failing rule errs. Either way that rule's cells say ``error`` and the report does
not pass.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.lru import LRU
from service.rego import (
    Bundle,
    Module,
    RegoCompileError,
    RegoEvalError,
    Undefined,
    compile_bundle,
)

if TYPE_CHECKING:  # imported when first needed: the CLI's start does not pay for the config
    from service.config import Environments

__all__ = [
    "CHUNK_SERVICES",
    "EVALUATION_BUDGET_S",
    "MAX_ITEMS",
    "MAX_SERVICES",
    "POLICY_DIR",
    "RESULTS",
    "WALL_FACTOR",
    "ComposeTooLarge",
    "EvaluationBudgetExceeded",
    "Rule",
    "RuleSet",
    "cached_report",
    "check_budget",
    "evaluate",
    "evaluate_input",
    "evaluate_json",
    "remember_report",
    "report_input",
    "report_key",
    "waiver_states",
]

#: The repository's compose policies (``policies/compose``).
POLICY_DIR = Path(__file__).resolve().parents[2] / "policies" / "compose"

#: Cell results, most severe first (a cell with several findings shows the most severe).
RESULTS = ("error", "fail", "warn", "info", "n/a", "pass")
SEVERITIES = ("fail", "warn", "info")
_RANK = {name: index for index, name in enumerate(RESULTS)}

GROUPS_ENTRYPOINT = "controlplane/compose/groups"
_RULE_PACKAGE = re.compile(r"^\s*package\s+controlplane\.compose\.rules\.([A-Za-z0-9_]+)\s*$", re.M)
_ANY_PACKAGE = re.compile(r"^\s*package\s+(\S+)", re.M)
_STEM = re.compile(r"^[a-z][a-z0-9_]*$")
_META_KEYS = ("id", "title", "severity", "rationale", "remediation")


@dataclass(frozen=True)
class Rule:
    """One rule of the matrix; ``error`` is set when the rule cannot be evaluated at all."""

    id: str
    package: str
    title: str = ""
    severity: str = "fail"
    rationale: str = ""
    remediation: str = ""
    error: str | None = None

    def describe(self) -> dict[str, str]:
        return {"id": self.id, "title": self.title, "severity": self.severity,
                "rationale": self.rationale, "remediation": self.remediation}


@dataclass
class RuleSet:
    """The compiled compose rules of one content revision of ``policies/compose``."""

    revision: str
    rules: tuple[Rule, ...]
    bundle: Bundle | None
    #: Why modules could not be compiled (module name -> message); for status surfaces and tests.
    load_errors: dict[str, str] = field(default_factory=dict)
    #: The compiled rules' packages as queried together (``controlplane/compose/groups/g<j>``).
    groups: tuple[tuple[str, ...], ...] = ()
    #: Reports of this revision by (fields hash, env, production, strict): see ``evaluate``.
    #: A hit is the stored report itself (no copy: a copy of a 10-service report costs more
    #: than the rest of a hit), so callers treat reports as read-only; the endpoint sends
    #: the cached JSON text and the CLI renders them.
    reports: LRU[str, _Entry] = field(default_factory=lambda: LRU(REPORT_CACHE_ENTRIES))
    #: Every rule's output for one service, by (the service's name and fields, the document's
    #: top-level definitions, env, production, strict, built images): see ``_rule_outputs``.
    services: LRU[str, dict[str, Any]] = field(
        default_factory=lambda: LRU(SERVICE_CACHE_ENTRIES))
    #: The module texts by name: what an evaluator process compiles the same revision from.
    sources: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, directory: Path = POLICY_DIR, *, bundle_cache: Path | None = None) -> RuleSet:
        """Read ``directory/*.rego`` (not ``*_test.rego``); compile once per content revision.

        ``bundle_cache``: a directory where the compiled bundle is kept for the next process
        (``service.rego.compile_bundle``): a short-lived process (``cpctl compose check``)
        then loads it instead of compiling (~5 ms against ~0.1-0.2 s)."""
        directory = Path(directory).resolve()
        sources = {
            path.name: path.read_text(encoding="utf-8")
            for path in sorted(directory.glob("*.rego"))
            if not path.name.endswith("_test.rego")
        }
        return cls.from_sources(sources, cache_key=directory, bundle_cache=bundle_cache)

    @classmethod
    def from_sources(cls, sources: Mapping[str, str], *, cache_key: Path | None = None,
                     bundle_cache: Path | None = None) -> RuleSet:
        """Build a rule set from ``{module name: Rego text}`` (cached by revision)."""
        revision = _revision(sources)
        key = (cache_key or Path("<memory>"), revision)
        with _CACHE_LOCK:
            cached = _CACHE.get(key)
            if cached is not None:
                return cached
        ruleset = _compile(sources, revision, bundle_cache)
        with _CACHE_LOCK:
            _CACHE[key] = ruleset
        return ruleset


_CACHE: dict[tuple[Path, str], RuleSet] = {}
_CACHE_LOCK = threading.Lock()


def _revision(sources: Mapping[str, str]) -> str:
    digest = hashlib.sha256()
    for name in sorted(sources):
        digest.update(name.encode() + b"\0" + sources[name].encode() + b"\0")
    return "sha256:" + digest.hexdigest()


# --- compiling -------------------------------------------------------------------------------

def _rule_stem(name: str) -> str:
    return name.rsplit("/", 1)[-1].removesuffix(".rego")


def _compile(sources: Mapping[str, str], revision: str, cache: Path | None = None) -> RuleSet:
    helpers: list[Module] = []
    rule_modules: dict[str, Module] = {}  # package suffix -> module
    errors: dict[str, str] = {}
    broken: dict[str, str] = {}  # package suffix -> error
    for name, text in sources.items():
        match = _RULE_PACKAGE.search(text)
        stem = _rule_stem(name)
        if match is None:
            other = _ANY_PACKAGE.search(text)
            if other is not None and not other.group(1).startswith("controlplane.compose.rules"):
                helpers.append(Module(name, text))
                continue
            broken[stem] = "no 'package controlplane.compose.rules.<name>' declaration"
            continue
        package = match.group(1)
        if package != stem or not _STEM.match(stem):
            broken[stem] = f"package must be controlplane.compose.rules.{stem} (file {name})"
            continue
        if not _DEFINES_FINDINGS.search(text):
            broken[stem] = "the module defines no 'findings'"
            continue
        rule_modules[package] = Module(name, text)
    errors.update({f"{k}.rego": v for k, v in broken.items()})

    bundle, good = None, dict(rule_modules)
    try:
        bundle = _build(helpers, good, cache)
    except RegoCompileError:
        # Find the culprits by compiling each rule alone with the helpers.
        for package, module in rule_modules.items():
            try:
                _build(helpers, {package: module})
            except RegoCompileError as exc:
                broken[package] = f"compile error: {exc}"
                errors[module.name] = str(exc)
                del good[package]
        try:
            bundle = _build(helpers, good) if good else None
        except RegoCompileError as exc:  # the helpers themselves are broken
            for package in good:
                broken[package] = f"compile error: {exc}"
            errors["<helpers>"] = str(exc)
            bundle, good = None, {}

    rules = []
    for package in sorted({*good, *broken}):
        if package in broken:
            rules.append(Rule(id=package.replace("_", "-"), package=package, error=broken[package]))
            continue
        rules.append(_rule_from_meta(bundle, package))
    return RuleSet(revision=revision, rules=tuple(rules), bundle=bundle, load_errors=errors,
                   groups=_groups(good) if bundle is not None else (), sources=dict(sources))


def _build(helpers: list[Module], rules: Mapping[str, Module],
           cache: Path | None = None) -> Bundle:
    generated = _generated_modules(rules)
    entrypoints = [f"{GROUPS_ENTRYPOINT}/g{j}" for j in range(len(_groups(rules)))]
    for package in sorted(rules):
        entrypoints += [f"controlplane/compose/cells/{package}",
                        f"controlplane/compose/rules/{package}/meta"]
    return compile_bundle([*helpers, *rules.values(), *generated], {}, entrypoints, cache=cache)


def _groups(rules: Mapping[str, Any]) -> tuple[tuple[str, ...], ...]:
    """The rules' packages, ``GROUP_RULES`` at a time in name order: one query each."""
    packages = sorted(rules)
    return tuple(tuple(packages[i:i + GROUP_RULES]) for i in range(0, len(packages), GROUP_RULES))


_DEFINES_NOT_APPLICABLE = re.compile(r"^not_applicable\s*(:=|=|contains\b|if\b|\{)", re.M)
_DEFINES_FINDINGS = re.compile(r"^findings\s*(:=|=|contains\b|if\b|\{)", re.M)


def _generated_modules(rules: Mapping[str, Module]) -> list[Module]:
    """The entrypoints the preflight queries: per group of ``GROUP_RULES`` rules
    (``groups/g<j>``) an array of each rule's ``[findings, not_applicable]``, and per rule
    (``cells/<pkg>``) its ``{"findings", "not_applicable"}``, queried only when its group's
    query failed.

    Both name the rule's ``findings`` (and ``not_applicable`` when the module defines it)
    directly: going through the whole package (``object.get(data...<pkg>, ...)``) evaluates
    every rule of the package, and cost ~20% more."""
    def refs(package: str) -> tuple[str, str]:
        ref = f"data.controlplane.compose.rules.{package}"
        defines = _DEFINES_NOT_APPLICABLE.search(rules[package].source)
        return f"{ref}.findings", f"{ref}.not_applicable" if defines else "[]"

    cells = ["package controlplane.compose.cells", "", "import rego.v1", ""]
    for package in sorted(rules):
        found, na = refs(package)
        cells.append(f'{package} := {{"findings": {found}, "not_applicable": {na}}}')
    groups = ["package controlplane.compose.groups", "", "import rego.v1", ""]
    for j, group in enumerate(_groups(rules)):
        pairs = ", ".join("[{}, {}]".format(*refs(package)) for package in group)
        groups.append(f"g{j} := [{pairs}]")
    return [Module("<generated>/cells.rego", "\n".join(cells) + "\n"),
            Module("<generated>/groups.rego", "\n".join(groups) + "\n")]


def _rule_from_meta(bundle: Bundle | None, package: str) -> Rule:
    rule_id = package.replace("_", "-")
    if bundle is None:
        return Rule(id=rule_id, package=package, error="bundle not compiled")
    try:
        meta = bundle.query(f"controlplane/compose/rules/{package}/meta", {})
    except RegoEvalError as exc:
        return Rule(id=rule_id, package=package, error=f"meta: {exc}")
    if not isinstance(meta, dict) or any(not isinstance(meta.get(k), str) for k in _META_KEYS):
        return Rule(id=rule_id, package=package,
                    error=f"meta must be an object with string {', '.join(_META_KEYS)}")
    if meta["id"] != rule_id:
        return Rule(id=rule_id, package=package, error=f"meta.id must be {rule_id!r}")
    if meta["severity"] not in SEVERITIES:
        return Rule(id=rule_id, package=package, error="meta.severity must be fail, warn or info")
    return Rule(id=rule_id, package=package, title=meta["title"], severity=meta["severity"],
                rationale=meta["rationale"], remediation=meta["remediation"])


# --- the size and time budgets ----------------------------------------------------------------
#
# No compose document may stall the evaluation. Three things keep it bounded:
# - cost is linear: every rule builds arrays (regopy's sets are quadratic), and a port range is
#   one entry, not one per port (service.compose.normalize);
# - size is bounded, checked before any evaluation: at most MAX_SERVICES services and MAX_ITEMS
#   entries in all the services' lists and maps (ports, volumes, environment, cap_add, ...) and
#   the top-level definitions (volumes, networks, secrets, configs);
# - time is bounded: the services are evaluated CHUNK_SERVICES at a time (every rule speaks about
#   one service, with the top-level definitions for context), the budget is checked between
#   chunks and a report over it raises ``EvaluationBudgetExceeded``. A regopy query cannot be
#   interrupted, so a chunk is the unit: small enough (~0.04 CPU-s for 20 services with
#   findings from most rules) that the budget is kept within a fraction of a second, and the bundle's
#   lock is released between chunks so other reports of the worker interleave instead of
#   waiting for the whole large one.
# The budget is CPU time of the evaluating thread (EVALUATION_BUDGET_S: the same document gets
# the same answer on an idle and on a busy host), with a wall-clock backstop
# (WALL_FACTOR times the CPU budget) so that no report holds a request for long on an overloaded host either.
# Measured: ~2 ms of CPU per service with findings from most rules (test_budget.busy_service),
# so 500 such services take ~1 CPU-s; a document at the size budget with heavier services may
# still be refused. Constants, not configuration: the bound must hold at any setting.
#
# Where an uncached report's CPU goes (bench/compose_bench.py --rules, the bench's 10-service
# file, CPU minimum on a quiet 2-core box, 2026-11: ~13.6 ms, ~20 ms before the changes named
# here): converting the input and calling the engine at all ~1.1 ms (the constant-policy floor,
# mostly _push's one ctypes call per input node, each distinct string encoded once; done once
# per chunk, then ~0.1 ms a query against the input already set, one per group of rules); the
# rules ~9.3 ms over that floor, ~0.05-0.1 ms for a one-comparison rule, more with per-entry
# string work (secret-env ~2.4 ms, ~100 us a variable: regex.match compiles its pattern on
# every call, so cheap literal tests decide first; sensitive-mounts ~1 ms); the Python around
# the query (cells, sorting, pointers, expanding compact findings) ~0.5-1 ms. What made the
# rules cheaper (policies/compose/README.md, engine notes): a reference (``svc.restart``)
# instead of ``object.get`` wherever the default does not decide (~2.5 ms), binding a service
# instead of testing it (``_ := input.fields.services[name]``, ~0.3 ms a rule), compact
# findings (a finding object ~17 us, the same data as an array ~8 us; ``_expanded``), prefilters
# before costly patterns. A JSON pointer built in Rego cost ~0.1 ms a finding: rules give a
# ``path`` and ``_path_pointer`` builds it here. A cached report costs ~0.07-0.13 ms (the cache
# key's hash).

#: Most services one document may have (a real project has a few dozen).
MAX_SERVICES = 1000
#: Most entries in all services' lists and maps together (a port range counts once).
MAX_ITEMS = 10_000
#: Rules per query (measured on the bench's file: 3 at a time ~6% cheaper than one query per
#: rule, while all 26 in one query cost ~35% more: regopy builds a large result slowly).
GROUP_RULES = 3
#: Services per input set on the bundle; the deadline is checked between chunks.
CHUNK_SERVICES = 20
#: CPU seconds (of the evaluating thread) one report may take before it is abandoned.
EVALUATION_BUDGET_S = 10.0
#: Wall-clock seconds one report may take, as a multiple of its CPU budget (60 s), however
#: busy the host is.
WALL_FACTOR = 6.0  # a 2-core host shared 5 ways runs a 10 CPU-s report in ~50 s
#: Reports kept per rule-set revision (least recently used first out).
REPORT_CACHE_ENTRIES = 512
#: Services' rule outputs kept per rule-set revision (a few KiB each).
SERVICE_CACHE_ENTRIES = 4096


class EvaluationBudgetExceeded(RuntimeError):
    """The report was not finished within its time budget; nothing of it is returned."""

    def __init__(self, budget: str, done: int, total: int) -> None:
        self.budget, self.done, self.total = budget, done, total
        self.message = (f"evaluation stopped at its budget of {budget} ({done} of {total} "
                        "services evaluated): split the file")
        super().__init__(self.message)


class ComposeTooLarge(ValueError):
    """A document over the size budget: ``pointer`` names where the budget ran out."""

    def __init__(self, message: str, pointer: str = "/fields") -> None:
        super().__init__(message)
        self.message = message
        self.pointer = pointer


def check_budget(fields: Mapping[str, Any]) -> None:
    """Raise ``ComposeTooLarge`` when ``fields`` is over ``MAX_SERVICES`` or ``MAX_ITEMS``."""
    services = fields.get("services") or {}
    if not isinstance(services, Mapping):
        return
    if len(services) > MAX_SERVICES:
        raise ComposeTooLarge(f"{len(services)} services: at most {MAX_SERVICES} are evaluated",
                              "/fields/services")
    items = 0
    for kind in ("volumes", "networks", "secrets", "configs"):
        definitions = fields.get(kind)
        if isinstance(definitions, Mapping):
            items += len(definitions)
    for service in [*services.values(), {}]:
        if items > MAX_ITEMS:
            raise ComposeTooLarge(f"over {MAX_ITEMS} list and map entries in the services and "
                                  "top-level definitions: split the file", "/fields/services")
        if not isinstance(service, Mapping):
            continue
        for value in service.values():
            if isinstance(value, (list, Mapping)):
                items += len(value)


# --- evaluating ------------------------------------------------------------------------------

@functools.cache
def _default_environments() -> Environments:
    """The configuration's default environments (offline, without a configuration)."""
    from service.config import Environments  # see TYPE_CHECKING above

    return Environments.from_raw(Environments.DEFAULTS)


def evaluate(
    fields: Mapping[str, Any],
    *,
    strict: bool = False,
    env: str | None = None,
    rules: RuleSet,
    environments: Environments | None = None,
    budget_s: float | None = EVALUATION_BUDGET_S,
    cache: bool = True,
    dotenv: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Evaluate every rule for every service of ``fields`` into the report.

    ``dotenv`` is the variables of the ``.env`` file beside the compose file (the CLI's, offline
    only: the server has no such file), given to the rules as ``input.dotenv``; secret-env
    reports a secret literal there at ``/.env/<name>``.

    Whether ``env`` is production is the configuration's answer (``environments``, the
    service's; the configuration's defaults offline), given to the rules as
    ``input.production``: the rules keep no list of their own.

    ``fields`` must already satisfy ``schemas/compose-import.schema.json``. Rule failures never
    raise: the rule's cells say ``error`` and ``passed`` is false. A document over the size
    budget raises ``ComposeTooLarge`` before anything is evaluated; one whose evaluation takes
    more than ``budget_s`` CPU seconds (or ``WALL_FACTOR`` times that in wall-clock time)
    raises ``EvaluationBudgetExceeded`` (``None``: no limit).

    Reports are cached per rule-set revision by (fields, env, production, strict): a hit
    returns the stored report without evaluating anything, so a report must not be changed by
    its caller (``cache=False`` evaluates and stores nothing).
    """
    return _report(fields, strict=strict, env=env, rules=rules, environments=environments,
                   budget_s=budget_s, cache=cache, dotenv=dotenv).report


def evaluate_json(
    fields: Mapping[str, Any],
    *,
    strict: bool = False,
    env: str | None = None,
    rules: RuleSet,
    environments: Environments | None = None,
    budget_s: float | None = EVALUATION_BUDGET_S,
) -> tuple[dict[str, Any], str]:
    """``evaluate`` and the report as JSON text (``json.dumps``, as a JSON response sends it);
    the text is cached with the report, so a hit serialises nothing (a 10-service report's
    text costs ~1 ms to build)."""
    entry = _report(fields, strict=strict, env=env, rules=rules, environments=environments,
                    budget_s=budget_s, cache=True)
    if entry.text is None:
        entry.text = json.dumps(entry.report)  # the same text from every thread that races here
    return entry.report, entry.text


def _report(
    fields: Mapping[str, Any],
    *,
    strict: bool,
    env: str | None,
    rules: RuleSet,
    environments: Environments | None,
    budget_s: float | None,
    cache: bool,
    dotenv: Mapping[str, str] | None = None,
) -> _Entry:
    check_budget(fields)
    input_doc = report_input(strict=strict, env=env, environments=environments, fields=fields)
    if dotenv:
        input_doc["dotenv"] = dict(dotenv)
    key = None
    if cache:
        key = report_key(fields, input_doc, rules)
        hit = rules.reports.get(key)
        if hit is not None:
            return hit
    entry = _Entry(evaluate_input(fields, input_doc, rules=rules, budget_s=budget_s,
                                  cache=cache))
    if key is not None:
        rules.reports.put(key, entry)
    return entry


# The steps of ``evaluate_json`` for a caller that evaluates elsewhere (service.compose.evaluator:
# the cache stays with the caller, the evaluation runs in a child process).

def report_input(*, strict: bool, env: str | None,
                 environments: Environments | None,
                 fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The rules' input beside the fields: ``strict``, ``env`` with ``production``, and with
    ``fields`` that hold waivers, ``waiver_states`` (``waiver_states``)."""
    input_doc: dict[str, Any] = {"strict": strict}
    if env is not None:
        input_doc["env"] = env
        envs = environments if environments is not None else _default_environments()
        input_doc["production"] = envs.is_production(env)
    states = waiver_states(fields) if fields is not None else {}
    if states:
        input_doc["waiver_states"] = states
    return input_doc


#: The top-level extension of a compose file that holds its waivers.
WAIVERS = "x-controlplane-waivers"


def waiver_states(fields: Mapping[str, Any], now: datetime | None = None) -> dict[str, str]:
    """``{index: "expired" | "invalid"}`` for the waivers of ``fields`` whose ``expires`` has
    passed or is not an RFC 3339 date or date-time (the waivers rule reports them; the input
    changes only when a waiver expires, so cached reports stay valid until then). A date
    expires at its end (UTC); a date-time without an offset is read as UTC."""
    now = now or datetime.now(UTC)
    states: dict[str, str] = {}
    for index, waiver in enumerate(fields.get(WAIVERS) or []):
        expires = waiver.get("expires") if isinstance(waiver, Mapping) else None
        if not isinstance(expires, str):
            continue
        end = _expiry(expires)
        if end is None:
            states[str(index)] = "invalid"
        elif end <= now:
            states[str(index)] = "expired"
    return states


def _expiry(text: str) -> datetime | None:
    try:
        if len(text) == 10:
            return datetime.combine(date.fromisoformat(text), datetime.min.time(),
                                    tzinfo=UTC) + timedelta(days=1)
        moment = datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def report_key(fields: Mapping[str, Any], input_doc: Mapping[str, Any], rules: RuleSet) -> str:
    """The report cache's key of ``fields`` with ``input_doc`` under ``rules``."""
    return _cache_key(fields, input_doc, rules.revision)


def cached_report(rules: RuleSet, key: str) -> tuple[dict[str, Any], str] | None:
    """The cached report and its JSON text under ``key``, or ``None``."""
    entry = rules.reports.get(key)
    if entry is None:
        return None
    if entry.text is None:
        entry.text = json.dumps(entry.report)
    return entry.report, entry.text


def remember_report(rules: RuleSet, key: str, report: dict[str, Any], text: str) -> None:
    """Cache a report evaluated elsewhere (``text`` is ``json.dumps(report)``)."""
    rules.reports.put(key, _Entry(report, text))


def evaluate_input(
    fields: Mapping[str, Any],
    input_doc: dict[str, Any],
    *,
    rules: RuleSet,
    budget_s: float | None,
    cache: bool = True,
) -> dict[str, Any]:
    """The report of ``fields`` with ``input_doc`` (``report_input``), not looked up in or
    stored to the report cache (``cache``: whether the per-service outputs are)."""
    return _evaluate(fields, input_doc, strict=bool(input_doc["strict"]),
                     env=input_doc.get("env"), rules=rules, budget_s=budget_s, cache=cache)


def _cache_key(fields: Mapping[str, Any], input_doc: Mapping[str, Any], revision: str) -> str:
    text = json.dumps([revision, input_doc, fields], sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class _Entry:
    """A cached report and, once a caller asked for it, its JSON text."""

    report: dict[str, Any]
    text: str | None = None


def _evaluate(
    fields: Mapping[str, Any],
    input_doc: dict[str, Any],
    *,
    strict: bool,
    env: str | None,
    rules: RuleSet,
    budget_s: float | None,
    cache: bool,
) -> dict[str, Any]:
    services = list((fields.get("services") or {}).keys())
    outputs = _rule_outputs(rules, fields, input_doc, services, _Budget.start(budget_s),
                            cache=cache)

    matrix: list[dict[str, Any]] = []
    findings: list[dict[str, Any]] = []
    counts = dict.fromkeys(RESULTS, 0)
    waivers = _active_waivers(fields, outputs.get("waivers"), services)
    waived = 0
    for rule in rules.rules:
        output = outputs.get(rule.package)
        if output is None and rule.error is None and rules.bundle is not None:
            output = "rule output is undefined"  # fail closed: never a silent pass
        error = rule.error or (output if isinstance(output, str) else None)
        per_service: dict[str, list[dict[str, Any]]] = {}
        not_applicable: set[str] = set()
        if error is None and isinstance(output, dict):
            per_service, not_applicable, error = _read_output(rule, output, services)
        for service in services:
            cell, cell_findings = _cell(rule, service, error, per_service.get(service, []),
                                        service in not_applicable,
                                        waivers.get((rule.id, service)))
            waived += sum(1 for finding in cell_findings if finding.get("waived"))
            counts[cell["result"]] += 1
            matrix.append(cell)
            findings.extend(cell_findings)

    # Cells are listed service by service, rules in id order, as the table reads them.
    order = {name: index for index, name in enumerate(services)}
    matrix.sort(key=lambda c: order[c["service"]])
    findings.sort(key=lambda f: (order[f["service"]], f["rule"]))
    passed = counts["fail"] == 0 and counts["error"] == 0 and not (strict and counts["warn"])
    return {
        "passed": passed,
        "strict": strict,
        "env": env,
        "summary": {"services": len(services), "rules": len(rules.rules), "cells": len(matrix),
                    "fail": counts["fail"], "warn": counts["warn"], "info": counts["info"],
                    "pass": counts["pass"], "n/a": counts["n/a"], "error": counts["error"],
                    "waived": waived},
        "rules": [rule.describe() for rule in rules.rules],
        "matrix": matrix,
        "findings": findings,
        "policy_revision": rules.revision,
    }


def _rule_outputs(
    rules: RuleSet,
    fields: Mapping[str, Any],
    input_doc: dict[str, Any],
    services: list[str],
    budget: _Budget | None,
    *,
    cache: bool = True,
) -> dict[str, Any]:
    """``{package: {"findings", "not_applicable"} | error text}`` for every compiled rule.

    The services are evaluated ``CHUNK_SERVICES`` at a time, each chunk with the document's
    top-level definitions; the deadline is checked between chunks.

    A rule speaks about one service at a time, given the document's top-level definitions, the
    built images, env, production and strict (the chunks already rely on it: a rule never sees
    the services of other chunks). So each service's outputs are cached under a digest of
    exactly that: a file that changed in one service (a CI re-check after an image bump)
    evaluates that service only. A chunk in which a rule failed, or returned something that
    cannot be split by service, is not cached (its error might belong to one of its services)."""
    if rules.bundle is None:
        return {}
    all_services = fields.get("services") or {}
    top = {k: v for k, v in fields.items() if k != "services"}
    # What a rule may need to know about other services than its chunk's: the images that
    # services of this file build (image-pinning has nothing to pin for them).
    input_doc = {**input_doc, "built_images": {
        svc["image"]: True for svc in all_services.values()
        if isinstance(svc, Mapping) and svc.get("build") is not None
        and isinstance(svc.get("image"), str) and svc["image"]}}
    merged: dict[str, Any] = {}
    keys: dict[str, str] = {}
    missing = services
    if cache and services:
        context = _digest([rules.revision, input_doc, top])
        keys = {name: _digest([context, name, all_services[name]]) for name in services}
        missing = []
        for name in services:
            hit = rules.services.get(keys[name])
            if hit is None:
                missing.append(name)
            else:
                _merge(merged, hit)
    chunks = [missing[i:i + CHUNK_SERVICES] for i in range(0, len(missing), CHUNK_SERVICES)]
    if not services:
        chunks = [[]]  # no services: the rules still run once (an error still shows)
    for done, chunk in enumerate(chunks):
        if budget is not None and done:
            budget.check(done * CHUNK_SERVICES, len(missing))
        part = {**top, "services": {name: all_services[name] for name in chunk}}
        outputs = _chunk_outputs(rules, {**input_doc, "fields": part})
        _merge(merged, outputs)
        if keys:
            for name, outputs_of in (_by_service(outputs, chunk) or {}).items():
                rules.services.put(keys[name], outputs_of)
    if budget is not None:
        budget.check(len(missing), len(missing))
    return merged


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _merge(merged: dict[str, Any], outputs: Mapping[str, Any]) -> None:
    """Add one chunk's (or one cached service's) rule outputs to ``merged``; a rule that failed
    anywhere stays failed."""
    for package, value in outputs.items():
        previous = merged.get(package)
        if isinstance(previous, str):
            continue  # the rule already failed on an earlier chunk
        if not isinstance(value, dict) or previous is None:
            merged[package] = value
            continue
        merged[package] = {key: _concat(previous.get(key), value.get(key))
                           for key in ("findings", "not_applicable")}


def _by_service(outputs: Mapping[str, Any], chunk: list[str]
                ) -> dict[str, dict[str, Any]] | None:
    """One chunk's rule outputs split by service, or None when they cannot be: a rule failed
    (its error might be one service's), or an output is malformed (``_read_output`` reports
    that, uncached)."""
    split: dict[str, dict[str, Any]] = {name: {} for name in chunk}
    for package, value in outputs.items():
        if not isinstance(value, dict):
            return None
        found, not_applicable = value.get("findings"), value.get("not_applicable")
        if not isinstance(found, list) or not isinstance(not_applicable, list):
            return None
        for name in chunk:
            split[name][package] = {"findings": [], "not_applicable": []}
        for item in found:
            if not isinstance(item, dict) or item.get("service") not in split:
                return None
            split[item["service"]][package]["findings"].append(item)
        for name in not_applicable:
            if name in split:  # others name no cell of this document: never read
                split[name][package]["not_applicable"].append(name)
    return split


@dataclass(frozen=True)
class _Budget:
    """CPU seconds of this thread and a wall-clock backstop, from the start of a report."""

    cpu_s: float
    cpu_at: float
    wall_at: float

    @classmethod
    def start(cls, cpu_s: float | None) -> _Budget | None:
        if cpu_s is None:
            return None
        return cls(cpu_s, time.thread_time() + cpu_s, time.monotonic() + WALL_FACTOR * cpu_s)

    def check(self, done: int, total: int) -> None:
        if time.thread_time() > self.cpu_at:
            raise EvaluationBudgetExceeded(f"{self.cpu_s:g} CPU-s", done, total)
        if time.monotonic() > self.wall_at:
            raise EvaluationBudgetExceeded(f"{WALL_FACTOR * self.cpu_s:g} s", done, total)


def _concat(first: Any, second: Any) -> Any:
    """Two chunks' arrays joined; anything malformed is kept as is for ``_read_output``."""
    first, second = ([] if v is None else v for v in (first, second))
    if isinstance(first, list) and isinstance(second, list):
        return first + second
    return second if not isinstance(second, list) else first


def _chunk_outputs(rules: RuleSet, input_doc: dict[str, Any]) -> dict[str, Any]:
    """Every rule's cells for one chunk: the input converted and set once, then one query per
    group of rules; the rules of a group whose query failed are queried one by one, so a rule
    that fails errors only its own cells."""
    assert rules.bundle is not None
    live = {rule.package for rule in rules.rules if rule.error is None}
    outputs: dict[str, Any] = {}
    retry: list[str] = []
    try:
        values = rules.bundle.query_each(
            [f"{GROUPS_ENTRYPOINT}/g{j}" for j in range(len(rules.groups))], input_doc)
    except RegoEvalError as exc:  # the input itself was refused: every rule errs
        return {package: f"evaluation error: {exc}" for package in live}
    for group, value in zip(rules.groups, values, strict=True):
        if not (isinstance(value, list) and len(value) == len(group)
                and all(isinstance(pair, list) and len(pair) == 2 for pair in value)):
            retry.extend(group)  # an error, or a rule's undefined value, made the group's
            continue
        for package, (found, not_applicable) in zip(group, value, strict=True):
            outputs[package] = {"findings": _expanded(found), "not_applicable": not_applicable}
    if retry:
        try:
            alone = rules.bundle.query_each(
                [f"controlplane/compose/cells/{package}" for package in retry], input_doc)
        except RegoEvalError as exc:
            alone = [exc] * len(retry)
        for package, value in zip(retry, alone, strict=True):
            if isinstance(value, RegoEvalError):
                value = f"evaluation error: {value}"
            elif isinstance(value, dict) and "findings" in value:
                value = {**value, "findings": _expanded(value["findings"])}
            outputs[package] = value if value is not Undefined else "rule output is undefined"
    return {package: value for package, value in outputs.items() if package in live}


def _expanded(found: Any) -> Any:
    """A rule's findings with each compact one, ``[service, path | pointer, message]`` or
    ``[service, path | pointer, message, severity]`` (a ``path`` is an array, a ``pointer`` a
    string), as the object it stands for; objects, and anything malformed (for
    ``_read_output`` to refuse), as they are. The shipped rules emit compact findings: regopy
    builds an array of four for ~40% of an object's cost."""
    if not isinstance(found, list):
        return found
    return [_finding_object(item) if type(item) is list else item for item in found]


def _finding_object(item: list[Any]) -> Any:
    if len(item) not in (3, 4):
        return item
    place = "pointer" if isinstance(item[1], str) else "path"
    finding = {"service": item[0], place: item[1], "message": item[2]}
    if len(item) == 4:
        finding["severity"] = item[3]
    return finding


def _read_output(
    rule: Rule, output: dict[str, Any], services: list[str]
) -> tuple[dict[str, list[dict[str, Any]]], set[str], str | None]:
    """Check a rule's output shape; a malformed output makes the whole rule an error."""
    per_service: dict[str, list[dict[str, Any]]] = {}
    raw_findings = output.get("findings")
    raw_na = output.get("not_applicable")
    if not isinstance(raw_findings, list) or not isinstance(raw_na, list):
        return {}, set(), "findings and not_applicable must be sets or arrays"
    known = set(services)
    seen: set[tuple[str, str, str, str]] = set()
    for item in raw_findings:
        if (not isinstance(item, dict) or item.get("service") not in known
                or not isinstance(item.get("message"), str)
                or not isinstance(item.get("pointer", ""), str)
                or item.get("severity", rule.severity) not in SEVERITIES):
            return {}, set(), "malformed finding (needs service, message, pointer, severity)"
        if "path" in item:
            # A copy: the rule's output may be a cached service's, shared between reports.
            pointer = _path_pointer(item["service"], item["path"])
            if pointer is None:
                return {}, set(), "malformed finding (path must be an array of keys and indexes)"
            item = {**{k: v for k, v in item.items() if k != "path"}, "pointer": pointer}
        # Rules build arrays (linear in regopy, where sets are quadratic): drop repeats here.
        key = (item["service"], item.get("pointer", ""), item["message"],
               item.get("severity", rule.severity))
        if key in seen:
            continue
        seen.add(key)
        per_service.setdefault(item["service"], []).append(item)
    for items in per_service.values():  # sets come back in engine order; make it stable
        items.sort(key=lambda f: (f.get("pointer", ""), f["message"]))
    return per_service, {s for s in raw_na if isinstance(s, str)}, None


def _escape(token: str) -> str:
    """One RFC 6901 reference token."""
    return token.replace("~", "~0").replace("/", "~1")


def _path_pointer(service: str, path: Any) -> str | None:
    """The JSON pointer of a finding's ``path`` below its service (keys and array indexes),
    or ``None`` when ``path`` is not an array of strings and non-negative integers."""
    if not isinstance(path, list):
        return None
    tokens = ["", "services", _escape(service)]
    for token in path:
        if isinstance(token, str):
            tokens.append(_escape(token))
        elif type(token) is int and token >= 0:
            tokens.append(str(token))
        else:
            return None
    return "/".join(tokens)


def _active_waivers(fields: Mapping[str, Any], output: Any, services: list[str]
                    ) -> dict[tuple[str, str], dict[str, str]]:
    """``{(rule, service): waiver}`` of the waivers that lift findings: those the waivers rule
    found nothing wrong with (a reason, not expired, a rule that may be waived here). Without
    the waivers rule's output (the rule is missing or failed) no waiver lifts anything; the
    waivers rule itself cannot be waived."""
    listed = fields.get(WAIVERS) or []
    if not listed or not isinstance(output, dict) or not isinstance(output.get("findings"), list):
        return {}
    faulty = {item.get("pointer") for item in output["findings"] if isinstance(item, dict)}
    known = set(services)
    active: dict[tuple[str, str], dict[str, str]] = {}
    for index, waiver in enumerate(listed):
        if (isinstance(waiver, Mapping) and waiver.get("service") in known
                and waiver.get("rule") != "waivers" and f"/{WAIVERS}/{index}" not in faulty):
            active.setdefault((waiver["rule"], waiver["service"]), dict(waiver))
    return active


def _cell(
    rule: Rule, service: str, error: str | None, items: list[dict[str, Any]], not_applicable: bool,
    waiver: dict[str, str] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    base_pointer = "/services/" + _escape(service)
    cell: dict[str, Any]
    if error is not None:  # an error is never waived
        cell = {"service": service, "rule": rule.id, "result": "error", "message": error}
        return cell, [_finding(rule, service, "error", error, base_pointer)]
    if not items:
        result = "n/a" if not_applicable else "pass"
        return {"service": service, "rule": rule.id, "result": result,
                "message": "not applicable" if not_applicable else ""}, []
    severities = [item.get("severity", rule.severity) for item in items]
    cell_findings = [
        _finding(rule, service, severity, item["message"], item.get("pointer") or base_pointer)
        for item, severity in zip(items, severities, strict=True)
    ]
    if waiver is not None:
        # Waived findings stay in the report, marked, and no longer decide the cell.
        note = {k: waiver[k] for k in ("reason", "expires") if k in waiver}
        for finding in cell_findings:
            finding["waived"] = True
            finding["waiver"] = note
        cell = {"service": service, "rule": rule.id, "result": "pass",
                "message": "waived: " + waiver.get("reason", ""), "waived": True}
        return cell, cell_findings
    result = min(severities, key=_RANK.__getitem__)
    cell = {"service": service, "rule": rule.id, "result": result,
            "message": "; ".join(item["message"] for item in items)}
    return cell, cell_findings


def _finding(rule: Rule, service: str, severity: str, message: str, pointer: str) -> dict[str, Any]:
    return {"service": service, "rule": rule.id, "severity": severity, "title": rule.title,
            "message": message, "pointer": pointer, "rationale": rule.rationale,
            "remediation": rule.remediation}
