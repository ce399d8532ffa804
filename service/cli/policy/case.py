"""``cpctl policy case new``: scaffold a decision case from the current policy's decision."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, TextIO

import yaml

from service import config as config_mod
from service import limits, schemas
from service.approvals.binding import resource_hash
from service.authz import actions
from service.authz.input import validate_input
from service.policytools.cases import SCHEMA_HEADER

from .common import Fatal, dir_flags, guard, header, offline_engine, read_policies, subcommand


def add(sub: Any) -> None:
    """Add the ``case`` and ``case new`` subcommand(s) under ``policy``."""
    p = subcommand(sub, "case", "scaffold decision cases", """
        cpctl policy case new --subject alice --action installer.run.execute --env prod
        cpctl policy case new --subject bob --action approvals.review --env prod \\
            --owner alice --out examples/decisions/approvals/bob-reviews.yaml
    """)
    case_sub = p.add_subparsers(dest="case_command", required=True, metavar="SUBCOMMAND")
    q = subcommand(case_sub, "new", "write a decision case with the boilerplate filled in", """
        cpctl policy case new --subject alice --action installer.run.execute --env prod
        cpctl policy case new --subject alice --action installer.run.execute --env staging \\
            --resource '{"app": "payments", "version": "2.4.0-rc.1"}'
    """)
    q.add_argument("--subject", required=True, help="subject_id (kind from the identities file)")
    q.add_argument("--action", required=True, help="a catalogue action, e.g. storage.list")
    q.add_argument("--env", required=True, help="an environment of the policy data")
    q.add_argument("--kind", choices=("human", "service", "agent"), default=None,
                   help="principal kind when the subject is not in the identities file")
    q.add_argument("--owner", default=None, help="resource owner (ticket actions)")
    q.add_argument("--resource-id", default="r-1")
    q.add_argument("--resource", default=None, metavar="JSON",
                   help="the request's resource as sent (input.resource.value; its hash is "
                   "input.resource.hash), e.g. '{\"app\": \"web\", \"version\": \"1.2.3\"}'")
    q.add_argument("--note", default=None, help="what the case shows (default: generated)")
    q.add_argument("--out", type=Path, default=None, help="write here (default: stdout)")
    dir_flags(q)
    q.set_defaults(handler=_case_new)


@guard
def _case_new(args: argparse.Namespace, out: TextIO) -> int:
    action = actions.ACTIONS.get(args.action)
    if action is None:
        close = [a for a in sorted(actions.ACTIONS) if a.split(".")[0] == args.action.split(".")[0]]
        raise Fatal(f"unknown action {args.action!r}"
                     + (f"; actions of that area: {', '.join(close)}" if close else ""))
    policies, data = header(args, out, text_mode=False)
    engine = offline_engine(policies, data, vet_tests=False)
    snapshot = read_policies(policies, data)
    envs = snapshot.data.get("environments") or {}
    if isinstance(envs, dict) and envs and args.env not in envs:
        raise Fatal(f"env {args.env!r} is not in the policy data (environments: "
                     f"{', '.join(sorted(envs))})")
    kind = args.kind or _identity_kind(args, args.subject)
    if kind is None:
        raise Fatal(f"subject {args.subject!r} is not in the identities file; give --kind")
    method = {"human": "password+totp", "service": "client_credentials", "agent": "delegated"}
    resource: dict[str, Any] = {"id": args.resource_id, "kind": action.resource_kind}
    if args.owner:
        resource["owner"] = args.owner
    if action.mutating:
        resource["hash"] = "sha256:" + "ab" * 32
    if args.resource is not None:
        resource["value"] = _resource_value(args.resource)
        resource["hash"] = resource_hash(resource["value"])
    doc = {
        "principal": {
            "subject_id": args.subject, "kind": kind, "session_id": f"sess-{args.subject}",
            "auth_time": 1767225600, "authn_method": method[kind],
            "step_up": {"verified": True, "at": 1767225900.0, "age_s": 40},
        },
        "action": action.name,
        "resource": resource,
        "env": args.env,
        "context": {
            "correlation_id": f"case-{args.subject}-{args.env}",
            "method": "POST" if action.mutating else "GET", "path": "/api/v1/example",
            "command_hash": None, "time": "2026-01-01T00:05:00Z",
        },
    }
    try:
        validate_input(doc)
    except schemas.ValidationFailed as exc:
        raise Fatal("; ".join(f"input{v.pointer}: {v.message}" for v in exc.violations)) from None
    decision = engine.decide(doc)
    facts = engine.facts(args.subject, action.name)
    note = args.note or (
        f"{args.subject} ({kind}; roles {', '.join(facts['roles']) or 'none'}) "
        f"{action.name} in {args.env}: {decision.decision} under revision {engine.revision}"
    )
    case = {"note": note, "input": doc,
            "expect": {"decision": decision.decision, "reasons": list(decision.reasons)}}
    text = SCHEMA_HEADER + "\n" + "# expect: the current policy's decision; edit it to what the " \
        "policy should decide\n" + yaml.safe_dump(case, sort_keys=False)
    schemas.validate("policy-case.schema.json", case)
    if args.out is None:
        out.write(text)
        return 0
    if args.out.exists():
        raise Fatal(f"{args.out} exists; not overwriting it")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} (expect {decision.decision} {list(decision.reasons)})", file=out)
    return 0


def _resource_value(text: str) -> Any:
    """``--resource``: one JSON value, within the bounds the service reads request bodies by."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise Fatal(f"--resource: not JSON: {exc}") from None
    try:
        limits.check_json(value)
        limits.check_size(len(json.dumps(value, separators=(",", ":")).encode()))
    except limits.JSONValueRefused as exc:
        raise Fatal(f"--resource{exc.pointer}: {exc.message}") from None
    return value


def _identity_kind(args: argparse.Namespace, subject: str) -> str | None:
    try:
        cfg = config_mod.load_from_process(args.config)
        doc = yaml.safe_load(cfg.authn.identities.read_text(encoding="utf-8"))
    except (config_mod.ConfigError, OSError, yaml.YAMLError):
        return None
    for entry in (doc or {}).get("identities", []) if isinstance(doc, dict) else []:
        if isinstance(entry, dict) and entry.get("subject_id") == subject:
            kind = entry.get("kind")
            return kind if isinstance(kind, str) else None
    return None
