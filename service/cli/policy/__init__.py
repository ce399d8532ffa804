"""``cpctl policy``: evaluate, test, check, lint, cover and replay policies offline, as the
service decides.

Every subcommand (and ``publish``) finds its policies directory with ``policydir.resolve``: an
explicit ``--policies DIR`` (or the positional DIR of ``test``/``lint``), else ``./policies`` of
the working directory, else ``policies.dir`` of the configuration (``--config``,
``CONTROLPLANE_CONFIG``, ``CONTROLPLANE_POLICIES__DIR``), else an error naming both; and it says
which directory it used.

One module per verb (``evaluate``, ``check`` for test and check, ``lint``, ``case``,
``replay``), what they share in ``common``; the revision verbs (``publish`` ...)
live in ``cli.revisions``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from . import case, check, evaluate, lint, replay

__all__ = ["register", "run"]


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``policy`` and its subcommands to a ``cpctl`` subparsers object."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "policy", help="offline policy tooling",
        description="Offline policy tooling: decide, test, check, lint, cover, replay.",
    )
    sub = parser.add_subparsers(dest="policy_command", required=True, metavar="SUBCOMMAND")
    # ``cpctl`` calls ``args.func(args)``; every subcommand writes to ``handler``'s stream.
    parser.set_defaults(func=_to_stdout)

    for verb in (evaluate, check, lint, case, replay):
        verb.add(sub)
    return parser


def run(argv: Sequence[str], out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Parse ``argv`` (without the leading ``policy``) and run it; returns the exit code."""
    parser = argparse.ArgumentParser(prog="cpctl")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["policy", *argv])
    args.err = err or sys.stderr
    return int(args.handler(args, out or sys.stdout))


def _to_stdout(args: argparse.Namespace) -> int:
    args.err = sys.stderr
    return int(args.handler(args, sys.stdout))
