"""``cpctl policy eval``: decide one input document as the service would, and explain it."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

import yaml

from service import rego, schemas
from service.authz.engine import PolicyEngine
from service.authz.input import validate_input
from service.authz.regotest import DECISION_ENTRYPOINT, EXPLAIN_ENTRYPOINT, Capture
from service.authz.source import Snapshot, read_snapshot
from service.policytools import coverage

from .common import dir_flags, guard, header, offline_engine, subcommand


def add(sub: Any) -> None:
    """Add the ``eval`` subcommand(s) under ``policy``."""
    p = subcommand(sub, "eval", "decide one input document exactly as the service would", """
        cpctl policy eval --input examples/decisions/installer/operator-prod.yaml
        cat input.json | cpctl policy eval --input - --format flat
        cpctl policy eval --input case.yaml --explain --fail-on deny
    """)
    p.add_argument("--input", required=True,
                   help="input JSON or YAML file, a decision case file, or - for stdin")
    dir_flags(p)
    p.add_argument("--explain", action="store_true",
                   help="show the projected input and the rules that were satisfied")
    p.add_argument("--fail-on", choices=("deny", "require_approval"), default=None,
                   help="exit 1 on this decision (require_approval also fails on deny)")
    p.add_argument("--format", choices=("json", "flat"), default="json")
    p.set_defaults(handler=_eval)


@guard
def _eval(args: argparse.Namespace, out: TextIO) -> int:
    doc = _read_input(args.input, args.err if args.format != "json" else out)
    if doc is None:
        return 2
    if isinstance(doc, dict) and "input" in doc and "expect" in doc:
        doc = doc["input"]  # a decision case file: evaluate its input
    try:
        validate_input(doc)
    except schemas.ValidationFailed as exc:
        for v in exc.violations:
            print(f"error: input{v.pointer}: {v.message}", file=out)
        return 2
    policies, data = header(args, out, text_mode=False)
    engine = offline_engine(policies, data, vet_tests=False)
    decision = engine.decide(doc)
    result: dict[str, Any] = decision.to_dict()
    if args.explain:
        result["explain"] = explain(engine, doc, result)
    if args.format == "flat":
        for key in ("decision", "reasons", "revision", "decision_id"):
            value = result.get(key)
            shown = ",".join(value) if isinstance(value, list) else value
            print(f"{key}={shown}", file=out)
        for key, value in sorted((result.get("approval") or {}).items()):
            print(f"approval.{key}={json.dumps(value)}", file=out)
        if args.explain:
            for line in result["explain"]["satisfied"]:
                print(f"satisfied={line}", file=out)
            for reason, where in result["explain"]["reasons"].items():
                print(f"reason.{reason}={','.join(where)}", file=out)
    else:
        print(json.dumps(result, indent=2, sort_keys=True), file=out)
    if args.fail_on == "deny" and decision.decision == "deny":
        return 1
    if args.fail_on == "require_approval" and decision.decision != "allow":
        return 1
    return 0


def _read_input(source: str, out: TextIO) -> Any:
    name = "stdin" if source == "-" else source
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"error: cannot read {name}: {exc.__class__.__name__}", file=out)
        return None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or "not valid JSON or YAML"
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        print(f"error: {name}{where}: {problem}", file=out)
        return None


def explain(engine: PolicyEngine, doc: Any, result: dict[str, Any]) -> dict[str, Any]:
    """Derived by the engine, not by an ``explain`` rule: the policy is evaluated once more,
    instrumented (coverage.py), to list the rule clauses this decision satisfied, and each
    reason is traced to the satisfied rules whose source names it."""
    projected = engine.project(doc)
    snapshot = _current_snapshot(engine)
    inst = coverage.instrument(snapshot)
    from service.authz.projection import build_projection

    data = build_projection(snapshot.data, engine.environments).rego_data
    saved = os.dup(1)
    try:
        hit, _ = coverage.hits_of_decisions(
            inst, data, [projected], DECISION_ENTRYPOINT, lambda: Capture(saved)
        )
    finally:
        os.close(saved)
    clauses = sorted(
        {(p.file, p.line, p.rule) for i, p in enumerate(inst.points)
         if i in hit and p.kind == "clause"}
    )
    sources = {m.name: m.source for m in snapshot.modules}
    reasons: dict[str, list[str]] = {}
    for reason in result.get("reasons", []):
        needles = [f'"{reason}"']
        if ":" in reason:
            needles.append(f'"{reason.split(":", 1)[0]}"')
        where = []
        for file, line, rule in clauses:
            text = _rule_text(sources.get(file, ""), rule, line)
            if any(n in text for n in needles):
                where.append(f"{file}:{line} {rule}")
        reasons[reason] = where or ["(enforced by the service, not the policy)"]
    out: dict[str, Any] = {
        "input": projected,
        "satisfied": [f"{f}:{ln} {r}" for f, ln, r in clauses],
        "reasons": reasons,
    }
    own = _policy_explain(snapshot, data, projected)
    if own is not None:
        out["explain"] = own
    return out


def _current_snapshot(engine: PolicyEngine) -> Snapshot:
    return read_snapshot(engine.policies_dir, engine.data_dir)


def _rule_text(source: str, rule: str, line: int) -> str:
    """The text of the rule statement ``rule`` that holds the clause at ``line``."""
    from service.authz import regosrc

    info = regosrc.parse_module("m", source)
    candidates = [r for r in info.rules if r.name == rule and r.line <= line]
    return max(candidates, key=lambda r: r.line).text if candidates else ""


def _policy_explain(snapshot: Snapshot, data: Any, projected: Any) -> Any:
    """The policy's own ``explain`` value when it defines one (shown as well, never needed)."""
    try:
        bundle = rego.compile_bundle(snapshot.modules, data, [EXPLAIN_ENTRYPOINT])
        value = bundle.query(EXPLAIN_ENTRYPOINT, projected)
    except (rego.RegoCompileError, rego.RegoEvalError):
        return None
    return None if value is rego.Undefined else value
