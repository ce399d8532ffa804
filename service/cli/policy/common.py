"""What every ``cpctl policy`` verb shares: the policies directory it resolves (and says it
used), the revision it reads or loads as the service would, the flags, and JUnit output."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO
from xml.sax.saxutils import escape, quoteattr

from service.authz.engine import PolicyEngine
from service.authz.source import Snapshot, SourceError, read_snapshot
from service.cli import policydir

FORMATS = ("text", "json", "junit", "github")


def subcommand(sub: Any, name: str, help_text: str, examples: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help_text, description=help_text,
        epilog="examples:\n" + textwrap.indent(textwrap.dedent(examples).strip(), "  "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def dir_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policies", type=Path, default=None, metavar="DIR",
                   help="policies directory (default: policies.dir of the configuration, "
                   "./policies unless configured)")
    p.add_argument("--data", type=Path, default=None, metavar="DIR",
                   help="data directory (default: POLICIES/data)")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="configuration file to read policies.dir from")


def report_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=FORMATS, default="text",
                   help="text, json, junit (XML) or github (workflow annotations)")


def coverage_flags(p: argparse.ArgumentParser, *, cases_help: str | None) -> None:
    p.add_argument("--coverage", action="store_true",
                   help="measure which rule clauses and lines were exercised")
    if cases_help:
        p.add_argument("--cases", type=Path, default=None, metavar="DIR", help=cases_help)
    p.add_argument("--coverage-out", type=Path, default=None, metavar="FILE",
                   help="write the coverage report to this file")
    p.add_argument("--coverage-format", choices=("json", "lcov", "cobertura"), default=None,
                   help="format of --coverage-out (default from its suffix, else json)")
    p.add_argument("--fail-under", type=float, default=None, metavar="PCT",
                   help="exit 1 when rule clause coverage is below PCT")


class Fatal(Exception):
    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def resolve_dirs(args: argparse.Namespace) -> tuple[Path, Path | None, str]:
    """(policies dir, data dir, where it came from), as ``cpctl serve`` resolves it."""
    explicit = getattr(args, "dir", None) or args.policies
    if getattr(args, "dir", None) is not None and args.policies is not None:
        if Path(args.dir).resolve() != Path(args.policies).resolve():
            raise Fatal("give the policies directory once (DIR or --policies)")
    try:
        policies, how = policydir.resolve(explicit, args.config)
    except policydir.PolicyDirError as exc:
        raise Fatal(str(exc)) from None
    return policies, args.data, how


def header(args: argparse.Namespace, out: TextIO, text_mode: bool) -> tuple[Path, Path | None]:
    policies, data, how = resolve_dirs(args)
    line = f"policies: {policies} ({how})"
    print(line, file=out if text_mode else args.err)
    return policies, data


def read_policies(policies: Path, data: Path | None) -> Snapshot:
    try:
        return read_snapshot(policies, data)
    except SourceError as exc:
        raise Fatal(f"error: {exc}", 1) from None


def guard(handler: Callable[[argparse.Namespace, TextIO], int]) -> Callable[..., int]:
    def run_handler(args: argparse.Namespace, out: TextIO) -> int:
        try:
            return handler(args, out)
        except Fatal as exc:
            message = str(exc)
            print(message if message.startswith("error") else f"error: {message}", file=out)
            return exc.code

    return run_handler


def offline_engine(policies: Path, data: Path | None, *, vet_tests: bool) -> PolicyEngine:
    """The engine as the service builds it. ``vet_tests``: vet the revision fully (its tests
    too, in a child process, as a live revision is); else compile and probe it in this process,
    which evaluates in-process anyway (``test``/``check`` run and report the tests)."""
    engine = PolicyEngine(policies, data_dir=data, vet_tests=vet_tests,
                          vet_in_subprocess=vet_tests)
    result = engine.load()
    if not result.ok:
        raise Fatal(f"error: policy revision rejected: {result.error}", 1)
    return engine


def junit(suite: str, rows: list[tuple[str, bool, str, float, str]], error: str = "") -> str:
    failures = sum(1 for r in rows if not r[1])
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           f'<testsuites name="{suite}" tests="{len(rows)}" failures="{failures}" '
           f'errors="{1 if error else 0}">',
           f'  <testsuite name="{suite}" tests="{len(rows)}" failures="{failures}" '
           f'errors="{1 if error else 0}">']
    if error:
        out.append(f'    <testcase name="revision" classname="{suite}">'
                   f"<error message={quoteattr(error[:200])}>{escape(error)}</error></testcase>")
    for name, passed, text, seconds, output in rows:
        body = "" if passed else (
            f"<failure message={quoteattr(text.splitlines()[0][:200] if text else 'failed')}>"
            f"{escape(text)}</failure>"
        )
        if output.strip():
            body += f"<system-out>{escape(output)}</system-out>"
        out.append(f'    <testcase name={quoteattr(name)} classname="{suite}" '
                   f'time="{seconds:.4f}">{body}</testcase>')
    out += ["  </testsuite>", "</testsuites>"]
    return "\n".join(out)
