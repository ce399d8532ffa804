"""``cpctl``: the command-line entry point (one module per command group)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .. import __version__
from . import (
    approval,
    audit,
    compose,
    identities,
    installer,
    keyring,
    notifications,
    policy,
    revisions,
    serve,
    session,
)
from .protected import option_values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cpctl", description="Platform control plane: serve it, and work with it offline."
    )
    parser.add_argument("--version", action="version", version=f"cpctl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in (serve, session, approval, installer, audit, notifications, policy, compose,
                   identities, keyring):
        module.register(sub)
    revisions.extend(sub.choices["policy"])  # publish, activate, rollback, revisions, keygen
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``cpctl`` with ``argv``; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(option_values(list(argv) if argv is not None else sys.argv[1:]))
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
