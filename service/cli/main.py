"""``cpctl``: the command-line entry point (one module per command group)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .. import __version__
from .options import option_values


def build_parser() -> argparse.ArgumentParser:
    # Imported here, not at the top: ``cpctl --version`` and ``cpctl compose`` (_light_parser)
    # need none of them, and together with aiohttp they cost ~0.5-0.7 s to import.
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
        task,
    )

    parser = argparse.ArgumentParser(
        prog="cpctl", description="Platform control plane: serve it, and work with it offline."
    )
    parser.add_argument("--version", action="version", version=f"cpctl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in (serve, session, approval, installer, audit, notifications, policy, compose,
                   identities, keyring, task):
        module.register(sub)
    revisions.extend(sub.choices["policy"])  # publish, activate, rollback, revisions, keygen
    return parser


def _light_parser(argv: list[str]) -> argparse.ArgumentParser | None:
    """A parser for the calls that need none of the other command groups (and no aiohttp):
    ``--version`` and ``compose ...``; ``None`` for everything else."""
    if argv[:1] != ["--version"] and argv[:1] != ["compose"]:
        return None
    parser = argparse.ArgumentParser(prog="cpctl")
    parser.add_argument("--version", action="version", version=f"cpctl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    if argv[:1] == ["compose"]:
        from . import compose  # its own imports are light: no aiohttp, no other group

        compose.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``cpctl`` with ``argv``; returns the process exit code."""
    arguments = option_values(list(argv) if argv is not None else sys.argv[1:])
    parser = _light_parser(arguments) or build_parser()
    args = parser.parse_args(arguments)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
