"""``cpctl audit verify | tail``: check the audit hash chain, and read its newest records.

``verify`` opens the store named by the service's own configuration (the same ``--config`` file
and ``CONTROLPLANE_*`` variables as ``cpctl serve``) and walks the whole chain, so it needs no
running service and no token, and trusts nothing the service would say about itself. ``tail``
reads the same store, or the HTTP API (``--server``; ``audit.read``, admins in the shipped policy).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .. import config as config_mod
from ..audit.record import Break
from ..store import StoreError, open_store
from ..store.base import AuditRecord, Store
from . import client as http
from .client import EXIT_ERROR, EXIT_OK, EXIT_UNAVAILABLE, guarded

__all__ = ["register", "run"]

# Variables the CLI reads itself; they are not service configuration keys.
_CLI_VARIABLES = frozenset({"CONTROLPLANE_CREDENTIALS", "CONTROLPLANE_URL", "CONTROLPLANE_TOKEN"})
_PAGE = 500


def register(sub: Any) -> None:
    """Add ``audit`` and its subcommands to ``cpctl``'s subparsers."""
    parser = sub.add_parser("audit", help="verify the audit hash chain; read its newest records")
    commands = parser.add_subparsers(dest="audit_command", metavar="SUBCOMMAND")
    commands.required = True

    ve = commands.add_parser("verify", help="walk the whole chain in the store; exit 1 at the first break")
    _config_arg(ve)
    ve.add_argument("--json", action="store_true", help="print the result as one JSON object")
    ve.set_defaults(func=guarded(verify))

    ta = commands.add_parser("tail", help="print the newest records as JSON lines")
    ta.add_argument("-n", "--lines", type=int, default=10, metavar="N",
                    help="how many of the newest records (default 10; 0 with -f: only new ones)")
    ta.add_argument("-f", "--follow", action="store_true", help="keep printing new records (Ctrl-C stops)")
    source = ta.add_mutually_exclusive_group()
    _config_arg(source)
    source.add_argument("--server", metavar="URL",
                        help="read over HTTP from this service instead of opening the store")
    ta.add_argument("--token",
                    help="bearer token for --server (env CONTROLPLANE_TOKEN; default: the stored one)")
    ta.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)
    ta.add_argument("--max-seconds", type=float, default=None, help=argparse.SUPPRESS)
    ta.set_defaults(func=guarded(tail))


def _config_arg(parser: Any) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help="the service's YAML configuration (env CONTROLPLANE_CONFIG; default: built-in)")


def run(argv: Sequence[str]) -> int:
    """Run ``audit`` with ``argv`` (the words after ``cpctl audit``); the exit code."""
    parser = argparse.ArgumentParser(prog="cpctl")
    register(parser.add_subparsers(dest="command", required=True))
    try:
        args = parser.parse_args(["audit", *argv])
    except SystemExit as exc:
        return int(exc.code or 0)
    return int(args.func(args))


# -- verify ------------------------------------------------------------------------------------


def verify(args: argparse.Namespace) -> int:
    store_url, schema = _store_location(args)
    if store_url is None:
        return EXIT_UNAVAILABLE
    try:
        checked, broken, head = asyncio.run(_verify(store_url, schema))
    except StoreError as exc:
        return _fail(f"cannot open the store: {exc}", EXIT_UNAVAILABLE)
    if args.json:
        print(json.dumps({
            "ok": broken is None,
            "verified": checked,
            "head_seq": head,
            "break": None if broken is None else {"seq": broken.seq, "reason": broken.reason},
        }, sort_keys=True))
    elif broken is None:
        # An empty chain verifies trivially; say so, in case this is not the service's store.
        empty = " (the log is empty: is this the service's store?)" if checked == 0 else ""
        print(f"audit chain ok: {checked} records verified (head seq {head}){empty}")
    else:
        print(f"audit chain broken at {broken}; {checked} records verified before it")
    return EXIT_OK if broken is None else EXIT_ERROR


async def _verify(url: str, schema: str | None) -> tuple[int, Break | None, int]:
    from ..audit.log import AuditLog

    store = await open_store(url, schema=schema)
    try:
        head_seq, _ = await store.audit_head()
        checked, broken = await AuditLog(store).verify()
        return checked, broken, max(head_seq, checked)
    finally:
        await store.close()


# -- tail --------------------------------------------------------------------------------------


def tail(args: argparse.Namespace) -> int:
    if args.lines < 0:
        return _fail("-n must be 0 or more", EXIT_ERROR)
    deadline = None if args.max_seconds is None else time.monotonic() + args.max_seconds
    try:
        if args.server is not None:
            return _tail_http(args, deadline)
        store_url, schema = _store_location(args)
        if store_url is None:
            return EXIT_UNAVAILABLE
        try:
            return asyncio.run(_tail_store(store_url, schema, args, deadline))
        except StoreError as exc:
            return _fail(f"cannot read the store: {exc}", EXIT_UNAVAILABLE)
    except KeyboardInterrupt:
        # Ctrl-C is how -f ends: a normal stop.
        return EXIT_OK


async def _tail_store(url: str, schema: str | None, args: argparse.Namespace, deadline: float | None) -> int:
    store = await open_store(url, schema=schema)
    try:
        head, _ = await store.audit_head()
        after = max(0, head - args.lines)
        after = await _print_store_range(store, after)
        while args.follow and not _past(deadline):
            await asyncio.sleep(_pause(args.interval, deadline))
            after = await _print_store_range(store, after)
        return EXIT_OK
    finally:
        await store.close()


async def _print_store_range(store: Store, after: int) -> int:
    while True:
        batch = await store.audit_range(after_seq=after, limit=_PAGE)
        for record in batch:
            _emit(_line(record))
            after = record.seq
        if len(batch) < _PAGE:
            return after


def _tail_http(args: argparse.Namespace, deadline: float | None) -> int:
    api = http.client_for(args)
    # The API pages forwards only, so the newest N are found by reading through to the end.
    newest: collections.deque[dict[str, Any]] = collections.deque(maxlen=args.lines or None)
    after = 0
    for item in _http_pages(api, 0):
        after = int(item["seq"])
        if args.lines:
            newest.append(item)
    for item in newest:
        _emit(item)
    while args.follow and not _past(deadline):
        time.sleep(_pause(args.interval, deadline))
        for item in _http_pages(api, after):
            _emit(item)
            after = int(item["seq"])
    return EXIT_OK


def _http_pages(api: http.Client, after: int) -> Iterator[dict[str, Any]]:
    while True:
        page = api.get("/api/v1/audit/records", {"after_seq": after, "limit": 1000})
        items = page.get("items") if isinstance(page, dict) else None
        if not isinstance(items, list):
            raise http.UsageError("the server answered with an unexpected audit page")
        for item in items:
            yield item
            after = int(item["seq"])
        if not items or page.get("next_after_seq") is None:
            return


# -- helpers -----------------------------------------------------------------------------------


def _store_location(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The store URL and PostgreSQL schema from the service's configuration (None: reported)."""
    path = args.config or os.environ.get("CONTROLPLANE_CONFIG")
    try:
        config = config_mod.load(path, _config_environ(os.environ))
    except config_mod.ConfigError as exc:
        _fail(str(exc), EXIT_UNAVAILABLE)
        return None, None
    url = config.store.url
    if url is None:
        _fail("the configuration has no store (store.backend is none)", EXIT_UNAVAILABLE)
        return None, None
    if config.store.backend == "sqlite":
        # Opening a missing file would create an empty store and call it verified.
        db = config.store.sqlite_path
        if not db.exists():
            _fail(f"no store at {db} (is --config / CONTROLPLANE_STATE_DIR the service's?)", EXIT_UNAVAILABLE)
            return None, None
        return url.reveal(), None
    return url.reveal(), config.store.postgres_schema


def _config_environ(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k not in _CLI_VARIABLES}


def _line(record: AuditRecord) -> dict[str, Any]:
    # The same shape as the JSON-lines sink and the HTTP API.
    return {"seq": record.seq, "prev_hash": record.prev_hash, "hash": record.hash, **record.entry}


def _emit(item: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(item, separators=(",", ":"), sort_keys=False) + "\n")
    sys.stdout.flush()


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def _pause(interval: float, deadline: float | None) -> float:
    if deadline is None:
        return interval
    return max(0.0, min(interval, deadline - time.monotonic()))


def _fail(message: str, code: int) -> int:
    print(f"cpctl audit: {message}", file=sys.stderr)
    return code
