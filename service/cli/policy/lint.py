"""``cpctl policy lint``: compile every module and run the static checks."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, TextIO

from service.policytools.lint import Problem, lint

from .common import dir_flags, guard, header, junit, read_policies, report_flags, subcommand


def add(sub: Any) -> None:
    """Add the ``lint`` subcommand(s) under ``policy``."""
    p = subcommand(sub, "lint", "compile every module and run the static checks", """
        cpctl policy lint
        cpctl policy lint ./policies --format github
    """)
    p.add_argument("dir", nargs="?", type=Path, default=None,
                   help="policies directory (same as --policies)")
    dir_flags(p)
    report_flags(p)
    p.set_defaults(handler=_lint)


@guard
def _lint(args: argparse.Namespace, out: TextIO) -> int:
    policies, data = header(args, out, args.format == "text")
    snapshot = read_policies(policies, data)
    problems = lint(snapshot)
    count = len(snapshot.all_modules)
    if args.format == "json":
        print(json.dumps({"policies": str(policies), "modules": count,
                          "problems": [p.to_json() for p in problems]}, indent=2), file=out)
    elif args.format == "junit":
        by_file: dict[str, list[Problem]] = {}
        for p in problems:
            by_file.setdefault(p.file, []).append(p)
        rows = [(m.name, m.name not in by_file, "\n".join(str(p) for p in by_file.get(m.name, [])),
                 0.0, "") for m in snapshot.all_modules]
        rows += [(f, False, "\n".join(str(p) for p in ps), 0.0, "")
                 for f, ps in by_file.items() if f not in {m.name for m in snapshot.all_modules}]
        print(junit("policy-lint", rows), file=out)
    elif args.format == "github":
        for p in problems:
            print(f"::error file={policies / p.file},line={p.line},col={p.col},"
                  f"title={p.code}::{p.message}", file=out)
        print(f"{count} modules, {len(problems)} problem(s)", file=out)
    else:
        for p in problems:
            print(str(p), file=out)
        print(f"{count} modules, {len(problems)} problem(s)", file=out)
    return 1 if problems else 0
