"""The policy engine: compiled revisions of policies/, hot reload, atomic swap, cache.

A revision is the content of ``policies/*.rego`` + ``policies/data/*`` (not ``policies/compose/``).
It is read once, vetted (compile + probe decision + its own ``*_test.rego``) in a child process,
compiled once into a regopy bundle, and then swapped in with one attribute assignment; a revision
that fails any step is rejected and the previous one keeps serving. ``decide`` is synchronous and
cheap (tens of microseconds): call it on the event loop. ``reload`` blocks (child process,
compilation): run it off the loop, e.g. ``await asyncio.to_thread(engine.reload)``.

Invariants enforced here whatever the policy says:
- an error, an undefined result or a malformed decision -> deny ``policy_error``;
- an ``allow`` of a ticketed (mutating) action in a production env -> ``require_approval``;
- unknown actions are denied before evaluation; unknown envs count as production.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import itertools
import logging
import secrets
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from aiohttp import web

from service import rego
from service.authz import actions, inputrefs
from service.authz.decision import (
    POLICY_ERROR,
    Decision,
    MalformedDecision,
    deny,
    enforce_production_rule,
    parse_decision,
)
from service.authz.input import strip
from service.authz.projection import Projection, build_projection
from service.authz.regotest import (
    DECISION_ENTRYPOINT,
    EXPLAIN_ENTRYPOINT,
    TestReport,
    run_tests_isolated,
    vet,
)
from service.authz.source import Snapshot, SourceError, fingerprint, read_snapshot
from service.clock import iso
from service.config import Environments

__all__ = [
    "DEFAULT_ENVIRONMENTS",
    "ENGINE",
    "LOG_FIELDS",
    "LoadResult",
    "PolicyEngine",
    "default_policies_dir",
]

decision_log = logging.getLogger("controlplane.decisions")
log = logging.getLogger(__name__)


#: Set while the chain decides (``decide.decide_run``): the run's audit record holds that
#: decision (id, result, reasons, revision, correlation id, principal, action, env, resource
#: hash), so no ``controlplane.decisions`` line repeats it.
AUDITED: contextvars.ContextVar[bool] = contextvars.ContextVar("audited_decision", default=False)

def _again(cached: Decision, decision_id: str) -> Decision:
    """A cached decision given again: the same answer under a decision id of its own.

    ``Decision(cached.decision, ..., decision_id, True)``, filled in directly: every cached
    decision makes one, and a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__`` (~2x the cost; ``tests/authz/test_decide.py`` holds the two equal)."""
    again = object.__new__(Decision)
    again.__dict__.update(cached.__dict__, decision_id=decision_id, cached=True)
    return again


#: env -> is production. Envs missing from the mapping are treated as production (fail safe).
DEFAULT_ENVIRONMENTS: Mapping[str, bool] = MappingProxyType(
    {"dev": False, "staging": False, "prod": True}
)

#: Structured fields of every decision log record: the JSON log line's ``decision`` object
#: (``extra={"fields": {"decision": {...}}}``); maskable.
LOG_FIELDS = (
    "decision_id",
    "revision",
    "action",
    "env",
    "resource_hash",
    "subject",
    "kind",
    "result",
    "reasons",
    "duration_us",
    "cached",
    "correlation_id",
)


@dataclass(frozen=True)
class LoadResult:
    """Outcome of ``load``/``reload``: ``changed`` is False when the content was already serving."""

    ok: bool
    revision: str | None
    changed: bool = False
    error: str | None = None


@dataclass
class _Revision:
    id: str
    bundle: rego.Bundle
    projection: Projection
    snapshot: Snapshot
    loaded_at: float
    cache: OrderedDict[str | tuple[Any, ...], Decision] = field(default_factory=OrderedDict)
    cache_lock: threading.Lock = field(default_factory=threading.Lock)
    #: Decisions of this revision by the facts their caller built the input from (``decide``'s
    #: ``facts``, ``recall``), oldest first: a caller that has them needs no input document.
    recalled: dict[tuple[Any, ...], Decision] = field(default_factory=dict)
    explain_bundle: rego.Bundle | None = None
    #: The input paths this revision may read (``inputrefs``); None: it may read all of it.
    refs: inputrefs.InputRefs = field(default_factory=lambda: inputrefs.InputRefs(None))
    #: What the decision cache keys on (``inputrefs.key_paths``); None: the whole input.
    key_paths: tuple[inputrefs.Path, ...] | None = None
    #: ``inputrefs.cache_key`` over ``key_paths``, compiled once (``inputrefs.compile_key``).
    key_of: Callable[[Mapping[str, Any]], tuple[Any, ...]] | None = None


class PolicyEngine:
    """Decides ``allow | deny | require_approval`` for input documents; one per worker process."""

    def __init__(
        self,
        policies_dir: Path,
        environments: Mapping[str, bool] = DEFAULT_ENVIRONMENTS,
        mask_fields: Iterable[str] = (),
        *,
        data_dir: Path | None = None,
        cache_size: int = 10_000,
        vet_in_subprocess: bool = True,
        vet_tests: bool = True,
    ) -> None:
        self.policies_dir = Path(policies_dir)
        self.data_dir = Path(data_dir) if data_dir is not None else self.policies_dir / "data"
        self.environments = (
            environments if isinstance(environments, Environments) else Environments(environments)
        )
        self.mask_fields = frozenset(mask_fields)
        unknown = self.mask_fields - set(LOG_FIELDS)
        if unknown:
            raise ValueError(f"unknown decision log field(s) to mask: {sorted(unknown)}")
        self.cache_size = cache_size
        self.vet_in_subprocess = vet_in_subprocess
        #: False for offline tooling that reports unit tests itself (``cpctl policy check``):
        #: the revision is still compiled and probed, its ``*_test.rego`` are not run.
        self.vet_tests = vet_tests
        #: False for a shadow (candidate) engine: its decisions are not the service's, so they
        #: stay out of the decision log.
        self.log_decisions = True
        self._current: _Revision | None = None
        self._reload_lock = threading.Lock()
        self._seen: tuple[tuple[str, int, int], ...] | None = None
        self._last_reload: dict[str, Any] | None = None
        self._counts: Counter[str] = Counter()
        #: Reload outcomes: ``ok`` (a revision swapped in, or the serving one confirmed after a
        #: rejection) and ``rejected``; status() reports them, listeners see each one.
        self._reloads: Counter[str] = Counter()
        self.reload_listeners: list[Callable[[LoadResult], None]] = []
        # decision ids: random per-process prefix + counter (unique, and cheaper than uuid4).
        self._id_prefix = secrets.token_hex(4)
        self._ids = itertools.count(1)

    # ---- loading -------------------------------------------------------------------------

    @property
    def revision(self) -> str | None:
        current = self._current
        return current.id if current else None

    def load(self) -> LoadResult:
        """Load the policies directory (startup); same as ``reload``."""
        return self.reload()

    def vet_revision(self, snapshot: Snapshot) -> TestReport:
        """The vetting ``reload`` runs before a revision may serve, alone (nothing is swapped).
        Blocking."""
        return run_tests_isolated(snapshot, mode="vet") if self.vet_in_subprocess else vet(snapshot)

    def install(self, snapshot: Snapshot) -> LoadResult:
        """Vet, compile and swap in a revision read elsewhere (a published revision from the
        store), exactly as ``reload`` does with the directory's. Blocking."""
        return self.reload(snapshot)

    def reload(self, snapshot: Snapshot | None = None) -> LoadResult:
        """Read, vet and compile the directory's content (or ``snapshot``); swap it in if it
        passes. Blocking."""
        with self._reload_lock:
            if snapshot is None:
                self._seen = fingerprint(self.policies_dir, self.data_dir)
                try:
                    snapshot = read_snapshot(self.policies_dir, self.data_dir)
                except SourceError as exc:
                    return self._failed("source", str(exc))
            current = self._current
            if current is not None and current.id == snapshot.revision:
                return self._succeeded(current.id, changed=False)
            try:
                projection = build_projection(snapshot.data, self.environments)
            except SourceError as exc:
                return self._failed("data", str(exc))
            vetted = snapshot if self.vet_tests else replace(snapshot, test_modules=())
            report = (
                run_tests_isolated(vetted, mode="vet")
                if self.vet_in_subprocess
                else vet(vetted)
            )
            if not report.ok:
                return self._failed("tests" if not report.error else "compile", report.summary())
            try:
                bundle = rego.compile_bundle(
                    snapshot.modules, projection.rego_data, [DECISION_ENTRYPOINT]
                )
            except rego.RegoCompileError as exc:
                return self._failed("compile", str(exc))
            # One attribute assignment: a concurrent decide() sees the old or the new revision,
            # never a mix. The old revision's cache goes with it (invalidation on reload).
            # The cache keys on the parts of the input this revision can read (once per revision).
            refs = inputrefs.analyse(m.source for m in snapshot.modules)
            keyed = None if refs.paths is None else inputrefs.key_paths(refs.paths)
            self._current = _Revision(
                snapshot.revision, bundle, projection, snapshot, time.time(), refs=refs,
                key_paths=keyed, key_of=None if keyed is None else inputrefs.compile_key(keyed),
            )
            return self._succeeded(snapshot.revision, changed=True)

    def poll_changes(self) -> bool:
        """True when policy or data files changed (mtime, size, set) since the last load attempt."""
        return fingerprint(self.policies_dir, self.data_dir) != self._seen

    def _succeeded(self, revision: str, *, changed: bool) -> LoadResult:
        recovered = self._last_reload is not None and not self._last_reload["ok"]
        self._last_reload = {"ok": True, "at": time.time(), "error": None}
        if changed:
            log.info("policy revision %s activated", revision,
                     extra={"fields": {"event": "policy.revision_activated",
                                       "revision": revision}})
        return self._outcome(LoadResult(True, revision, changed), counted=changed or recovered)

    def _failed(self, kind: str, detail: str) -> LoadResult:
        # Full detail goes to the log (one structured event); the status surface gets a summary
        # without data values.
        log.error(
            "policy revision rejected (%s): %s; still serving %s", kind, detail, self.revision,
            extra={"fields": {"event": "policy.revision_rejected", "stage": kind,
                              "serving_revision": self.revision}},
        )
        if detail.startswith(f"{kind}: "):
            detail = detail[len(kind) + 2 :]  # the vetting report already names the stage
        summary = (
            f"{kind}: {detail}"[:300]
            if kind in ("compile", "tests", "source")
            else (f"{kind}: invalid policy data (see server log)")
        )
        self._last_reload = {"ok": False, "at": time.time(), "error": summary}
        return self._outcome(LoadResult(False, self.revision, False, summary), counted=True)

    def _outcome(self, result: LoadResult, *, counted: bool) -> LoadResult:
        if counted:
            self._reloads["ok" if result.ok else "rejected"] += 1
            for listener in self.reload_listeners:
                try:
                    listener(result)
                except Exception:
                    log.exception("policy reload listener failed")
        return result

    # ---- deciding ------------------------------------------------------------------------

    def project(self, input_doc: Mapping[str, Any]) -> dict[str, Any]:
        """The document the policy evaluates: stripped, plus the subject's policy-data facts."""
        current = self._current
        if current is None:
            raise RuntimeError("no policy revision loaded")
        return _project(current.projection, strip(input_doc))

    def facts(
        self, subject_id: str, action: str, idp_groups: Sequence[str] = ()
    ) -> dict[str, Any]:
        """The subject's roles, groups and grants for ``action``, exactly as the policy sees them
        in the serving revision (empty with no revision: nothing is granted). Never from tokens;
        ``idp_groups`` are the IdP groups recorded on the caller's OIDC session."""
        current = self._current
        if current is None:
            return {"roles": [], "groups": [], "grants": []}
        return current.projection.facts(subject_id, action, idp_groups)

    def names_subject(self, subject_id: str) -> bool:
        """Does the serving revision's policy data name ``subject_id`` (in ``bindings`` or a
        ``groups`` member list)? True with no revision loaded: nobody can tell, so fail closed."""
        current = self._current
        return current is None or subject_id in current.projection.subjects

    def decide(self, input_doc: Mapping[str, Any], *, stripped: bool = False,
               facts: tuple[Any, ...] | None = None) -> Decision:
        """One decision; never raises for a bad policy or input (fails closed to deny).

        ``stripped``: ``input_doc`` holds nothing ``input.strip`` removes (the chain's input,
        built so): it is what the policy sees as it is, and not copied again.
        ``facts``: a hashable key for everything ``input_doc`` was built from, in the caller's
        own terms (``decide.decide_run``): a decision the cache would keep is also kept under
        it, so ``recall(facts)`` answers the same question again without the input."""
        started = time.perf_counter_ns()
        decision_id = self._new_id()
        current = self._current
        revision = current.id if current else ""
        error: str | None = None
        try:
            decision, error = self._evaluate(current, input_doc, decision_id, stripped, facts)
        except Exception as exc:  # fail closed on anything unexpected, never propagate
            decision = deny(POLICY_ERROR, revision, decision_id)
            error = exc.__class__.__name__
        duration_us = (time.perf_counter_ns() - started) // 1000
        self._counts[decision.decision] += 1
        if error is not None:
            self._counts["policy_error"] += 1
            log.warning(
                "policy_error decision_id=%s correlation_id=%s revision=%s: %s",
                decision_id,
                _context(input_doc).get("correlation_id"),
                revision,
                error,
            )
        if self.log_decisions and not AUDITED.get() and decision_log.isEnabledFor(logging.INFO):
            self._log(input_doc, decision, duration_us)
        return decision

    def recall(self, facts: tuple[Any, ...]) -> Decision | None:
        """The decision the serving revision made for ``facts`` (``decide``'s), with an id of
        its own and counted as a cache hit; None when it made none (or it was evicted)."""
        current = self._current
        hit = current.recalled.get(facts) if current is not None else None
        if hit is None:
            return None
        counts = self._counts
        counts["cache_hit"] += 1
        counts[hit.decision] += 1
        return _again(hit, self._new_id())

    def _new_id(self) -> str:
        return f"{self._id_prefix}-{next(self._ids):x}"

    def _evaluate(
        self, current: _Revision | None, input_doc: Any, decision_id: str, stripped: bool = False,
        facts: tuple[Any, ...] | None = None,
    ) -> tuple[Decision, str | None]:
        # ``input_doc`` is typed Any on purpose: callers outside the service (the CLI, tests)
        # pass whatever they read, and anything that is not an object fails closed here.
        if current is None:
            return deny(POLICY_ERROR, "", decision_id), "no policy revision loaded"
        if not isinstance(input_doc, Mapping):
            return deny(POLICY_ERROR, current.id, decision_id), "input is not an object"
        action = actions.ACTIONS.get(input_doc.get("action"))  # type: ignore[arg-type]
        if action is None:
            # The catalogue is code-owned: an action it does not know is never allowed.
            return deny("unknown_action", current.id, decision_id), None
        policy_input = input_doc if stripped and type(input_doc) is dict else strip(input_doc)
        key: str | tuple[Any, ...] | None = None
        if self.cache_size:
            # not JSON: no key; regopy will refuse it below, and errors are never cached
            with contextlib.suppress(TypeError, ValueError):
                key = (
                    inputrefs.whole_key(policy_input)
                    if current.key_of is None
                    else current.key_of(policy_input)
                )
        if key is not None:
            with current.cache_lock:
                hit = current.cache.get(key)
                if hit is not None:
                    current.cache.move_to_end(key)
            if hit is not None:
                self._counts["cache_hit"] += 1
                if facts is not None:
                    self._recall_as(current, facts, hit)
                return _again(hit, decision_id), None
            self._counts["cache_miss"] += 1
        projected = _project(current.projection, policy_input)
        try:
            raw = current.bundle.query(DECISION_ENTRYPOINT, projected)
        except rego.RegoEvalError as exc:
            return deny(POLICY_ERROR, current.id, decision_id), f"evaluation: {exc}"
        if raw is rego.Undefined:
            return deny(POLICY_ERROR, current.id, decision_id), "decision is undefined"
        try:
            decision = parse_decision(raw, current.id, decision_id)
        except MalformedDecision as exc:
            return deny(POLICY_ERROR, current.id, decision_id), f"malformed decision: {exc}"
        decision = self._enforce(decision, action, str(input_doc.get("env")))
        if key is not None:
            with current.cache_lock:
                current.cache[key] = decision
                if len(current.cache) > self.cache_size:
                    current.cache.popitem(last=False)
            if facts is not None:
                self._recall_as(current, facts, decision)
        return decision, None

    def _recall_as(self, current: _Revision, facts: tuple[Any, ...], decision: Decision) -> None:
        """Keep ``decision`` (one the cache keeps) for ``recall(facts)``, within the cache's
        size (the oldest goes first)."""
        with current.cache_lock:
            recalled = current.recalled
            recalled[facts] = decision
            if len(recalled) > self.cache_size:
                del recalled[next(iter(recalled))]

    def _enforce(self, decision: Decision, action: actions.Action, env: str) -> Decision:
        upgraded = enforce_production_rule(
            decision, ticketed=action.needs_ticket_in_production,
            production=self.environments.is_production(env),
        )
        if upgraded is not decision:
            self._counts["upgraded"] += 1
        return upgraded

    def explain(self, input_doc: Mapping[str, Any]) -> dict[str, Any]:
        """Offline aid: the projected input and the policy's ``explain`` value (if it has one)."""
        current = self._current
        if current is None:
            raise RuntimeError("no policy revision loaded")
        projected = _project(current.projection, strip(input_doc))
        if current.explain_bundle is None:
            current.explain_bundle = rego.compile_bundle(
                current.snapshot.modules, current.projection.rego_data, [EXPLAIN_ENTRYPOINT]
            )
        try:
            trace = current.explain_bundle.query(EXPLAIN_ENTRYPOINT, projected)
        except rego.RegoEvalError as exc:
            trace = {"error": str(exc)}
        return {"input": projected, "explain": None if trace is rego.Undefined else trace}

    def _log(self, input_doc: Mapping[str, Any], decision: Decision, duration_us: int) -> None:
        doc = input_doc if isinstance(input_doc, Mapping) else {}
        principal: Mapping[str, Any] = _mapping(doc.get("principal"))
        resource: Mapping[str, Any] = _mapping(doc.get("resource"))
        fields = {
            "decision_id": decision.decision_id,
            "revision": decision.revision,
            "action": doc.get("action"),
            "env": doc.get("env"),
            "resource_hash": resource.get("hash"),
            "subject": principal.get("subject_id"),
            "kind": principal.get("kind"),
            "result": decision.decision,
            "reasons": list(decision.reasons),
            "duration_us": duration_us,
            "cached": decision.cached,
            "correlation_id": _context(doc).get("correlation_id"),
        }
        for name in self.mask_fields:
            fields[name] = _mask(fields[name])
        decision_log.info(
            "decision %s %s",
            fields["result"],
            fields["decision_id"],
            extra={"fields": {"decision": fields}},
        )

    # ---- status --------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """``GET /api/v1/authz/status``: no policy text, data tables or per-subject decisions.

        ``serving``: a revision is active (what readiness asks: decisions are correct). The
        status is ``degraded`` when none is, or when the latest revision was rejected (its
        error, ``stage: file:line:col: message``, in ``error`` and ``last_reload``) while the
        last good one keeps serving."""
        current = self._current
        last = self._last_reload
        if last is None:
            state = "placeholder"
        elif current is None or not last["ok"]:
            state = "degraded"
        else:
            state = "ready"
        counts = self._counts
        hits, misses = counts["cache_hit"], counts["cache_miss"]
        out: dict[str, Any] = {"status": state, "serving": current is not None}
        if last is not None and not last["ok"]:
            out["error"] = last["error"]
            out["detail"] = (
                "the latest policy revision was rejected; the previous revision keeps serving"
                if current is not None else "no policy revision could be loaded"
            )
        return {
            **out,
            "revision": current.id if current else None,
            "module_count": len(current.snapshot.modules) if current else 0,
            "test_module_count": len(current.snapshot.test_modules) if current else 0,
            "loaded_at": iso(current.loaded_at) if current else None,
            "last_reload": None if last is None else {**last, "at": iso(last["at"])},
            "reloads": {k: self._reloads[k] for k in ("ok", "rejected")},
            "decisions": {
                k: counts[k]
                for k in ("allow", "deny", "require_approval", "policy_error", "upgraded")
            },
            "cache": {
                "hits": hits,
                "misses": misses,
                "hit_rate": round(hits / (hits + misses), 4) if hits + misses else 0.0,
                "size": len(current.cache) if current else 0,
                "capacity": self.cache_size,
                **(current.refs.describe() if current else {}),
            },
        }


#: The policy engine (compiled revision, hot reload).
ENGINE: web.AppKey[PolicyEngine] = web.AppKey("engine")


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _project(projection: Projection, stripped: dict[str, Any]) -> dict[str, Any]:
    principal = stripped.get("principal")
    if not isinstance(principal, Mapping) or not isinstance(principal.get("subject_id"), str):
        return stripped  # the policy sees no facts; a malformed principal is the policy's to deny
    out = dict(stripped)
    idp = principal.get("idp_groups")
    idp_groups = [g for g in idp if isinstance(g, str)] if isinstance(idp, list) else []
    out["principal"] = {
        **principal,
        **projection.facts(principal["subject_id"], str(stripped.get("action")), idp_groups),
    }
    return out


def _context(doc: Any) -> Mapping[str, Any]:
    context = doc.get("context") if isinstance(doc, Mapping) else None
    return context if isinstance(context, Mapping) else {}


def _mask(value: Any) -> Any:
    # A short digest keeps records correlatable without revealing the value.
    if value is None:
        return None
    return "masked:" + hashlib.sha256(str(value).encode()).hexdigest()[:12]


def default_policies_dir() -> Path:
    """The repository's ``policies/`` (what ``cpctl serve`` uses when nothing is configured)."""
    return Path(__file__).resolve().parents[2] / "policies"
