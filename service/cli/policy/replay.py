"""``cpctl policy replay``: re-decide recorded decisions with a candidate revision."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, TextIO

from .common import Fatal, dir_flags, guard, header, junit, offline_engine, subcommand


def add(sub: Any) -> None:
    """Add the ``replay`` subcommand(s) under ``policy``."""
    p = subcommand(sub, "replay", "re-decide recorded decisions with a candidate revision", """
        cpctl policy replay --log .state/decisions.jsonl --policies ./candidate
        cpctl policy replay --log decisions.jsonl --since 2026-01-01T00:00:00Z \\
            --policies ./candidate --expect rollout-expect.yaml --format junit
        cpctl policy replay --cases examples/decisions --audit audit.jsonl --policies ./candidate
    """)
    p.add_argument("--log", type=Path, action="append", default=[], metavar="FILE",
                   help="decision log file (JSON lines; its rotated files are read too)")
    p.add_argument("--cases", type=Path, action="append", default=[], metavar="PATH",
                   help="decision case file or directory")
    p.add_argument("--audit", type=Path, action="append", default=[], metavar="FILE",
                   help="audit records as JSON lines (approximate inputs)")
    p.add_argument("--since", default=None, metavar="TIME",
                   help="only records at or after this time (ISO 8601, e.g. 2026-01-01T00:00:00Z)")
    p.add_argument("--expect", type=Path, default=None, metavar="FILE",
                   help="YAML file listing the intended changes; any other change fails")
    p.add_argument("--examples", type=int, default=3, help="examples shown per group")
    p.add_argument("--format", choices=("text", "json", "junit"), default="text")
    dir_flags(p)
    p.set_defaults(handler=_replay)


@guard
def _replay(args: argparse.Namespace, out: TextIO) -> int:
    from datetime import UTC, datetime

    from service.policytools import replay as rp

    if not (args.log or args.cases or args.audit):
        raise Fatal("give at least one of --log, --cases, --audit")
    since = None
    if args.since:
        try:
            since = datetime.fromisoformat(args.since.replace("Z", "+00:00"))
        except ValueError:
            raise Fatal(f"--since: not an ISO 8601 time: {args.since!r}") from None
        if since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
    policies, data = header(args, out, args.format == "text")
    try:
        records: list[rp.Recorded] = []
        for path in args.log:
            records += rp.from_log(path, since)
        for path in args.cases:
            records += rp.from_cases(path)
        for path in args.audit:
            records += rp.from_audit(path, since)
        expectations = rp.load_expectations(args.expect) if args.expect else []
    except rp.ReplayError as exc:
        raise Fatal(str(exc)) from None
    # The candidate is vetted like a live revision (compiled, probed, its own tests run).
    engine = offline_engine(policies, data, vet_tests=True)
    report = rp.replay(records, engine.decide, expectations)
    if args.format == "json":
        print(json.dumps({"candidate": str(policies), "revision": engine.revision,
                          **report.to_json(args.examples)}, indent=2), file=out)
    elif args.format == "junit":
        rows = [(f"{c.transition} {c.recorded.source} {c.recorded.ref}", c not in
                 report.unexpected, json.dumps(c.to_json()), 0.0, "") for c in report.changes]
        rows += [(f"count {m}", False, m, 0.0, "") for m in report.count_mismatches]
        if not rows:
            rows = [("no decision changes", True, "", 0.0, "")]
        print(junit("policy-replay", rows), file=out)
    else:
        print(f"candidate revision {engine.revision}: {report.total} decisions replayed, "
              f"{len(report.changes)} would change, {report.reasons_only} change reasons only",
              file=out)

        def line(c: rp.Change, unexpected: bool) -> str:
            r = c.recorded
            return (f"{r.source} {r.ref} {r.subject} {r.input.get('action')} "
                    f"{r.input.get('env')}: {c.transition} {list(r.reasons)} -> "
                    f"{list(c.reasons)}{'' if r.exact else ' (approximate input)'}"
                    f"{'  UNEXPECTED' if unexpected else ''}")

        if report.unexpected:
            # What fails the run comes first, every one of them (not --examples per group).
            print(f"{len(report.unexpected)} change(s) not listed in "
                  f"{args.expect or 'an --expect file'}:", file=out)
            for c in report.unexpected:
                print(f"  {line(c, True)}", file=out)
        for transition, changes in report.groups().items():
            print(f"  {transition}: {len(changes)}", file=out)
            for c in changes[: args.examples]:
                print(f"    {line(c, c in report.unexpected)}", file=out)
        for m in report.count_mismatches:
            print(f"  expected count differs: {m}", file=out)
        if report.unexpected:
            print(f"{len(report.unexpected)} change(s) not listed in "
                  f"{args.expect or 'an --expect file'}", file=out)
    return 0 if report.ok else 1
