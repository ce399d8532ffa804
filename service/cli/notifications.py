"""``cpctl notifications list [--failed] | retry ID``: the notification outbox, for operators.

Like ``cpctl audit verify``, these open the store named by the service's own configuration (the
same ``--config`` file and ``CONTROLPLANE_*`` variables as ``cpctl serve``): no running service
and no token. ``list`` shows the newest events, with ``--failed`` only the dead ones and those
whose last attempt failed (still being retried), each with its per-sink attempts; ``retry``
makes a dead event due again, with a fresh ``notifications.max_age_s`` window (sinks that
already accepted it are not sent it again). Exit codes: 0 done, 1 refused (unknown id, not
dead), 2 no store.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from .. import clock
from .. import config as config_mod
from ..store import StoreError, open_store
from ..store.base import Conflict, DeliveryRecord, NotFound, OutboxEvent, Store
from .client import EXIT_ERROR, EXIT_OK, EXIT_UNAVAILABLE, guarded

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add ``notifications`` and its subcommands to ``cpctl``'s subparsers."""
    parser = sub.add_parser("notifications", help="the approval notification outbox: list "
                                                  "events, retry dead ones")
    commands = parser.add_subparsers(dest="notifications_command", metavar="SUBCOMMAND")
    commands.required = True

    ls = commands.add_parser("list", help="the newest outbox events and their delivery state")
    _config_arg(ls)
    ls.add_argument("--failed", action="store_true",
                    help="only dead events and those whose last attempt failed")
    ls.add_argument("-n", "--limit", type=int, default=50, metavar="N",
                    help="at most N events (default 50, at most 500)")
    ls.add_argument("--json", action="store_true", help="print one JSON object")
    ls.set_defaults(func=guarded(list_events))

    rt = commands.add_parser("retry", help="make a dead event due again (fresh max-age window)")
    _config_arg(rt)
    rt.add_argument("id", metavar="ID", help="the event id (a UUID, as `list` shows)")
    rt.add_argument("--json", action="store_true", help="print the event as JSON")
    rt.set_defaults(func=guarded(retry))


def _config_arg(parser: Any) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help="the service's YAML configuration (env CONTROLPLANE_CONFIG; "
                             "default: built-in)")


def list_events(args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= 500:
        return _fail("--limit must be 1..500", EXIT_ERROR)
    return _with_store(args, lambda store: _list(store, args))


def retry(args: argparse.Namespace) -> int:
    return _with_store(args, lambda store: _retry(store, args))


async def _list(store: Store, args: argparse.Namespace) -> int:
    events = await store.list_outbox(failed=args.failed, limit=args.limit)
    docs = [_doc(e, await store.outbox_deliveries(e.id)) for e in events]
    if args.json:
        print(json.dumps({"items": docs}, sort_keys=True))
        return EXIT_OK
    if not docs:
        print("no failed notification events" if args.failed else "no notification events")
        return EXIT_OK
    for doc in docs:
        when = doc["finished_at"] if doc["state"] != "pending" else f"next {doc['next_attempt_at']}"
        print(f"{doc['id']}  {doc['type']:<19} {doc['ticket_id']}  {doc['env']:<8} "
              f"{doc['state']:<9} attempts={doc['attempts']}  {when}")
        for d in doc["deliveries"]:
            status = d["last_status"] if d["last_status"] is not None else "-"
            error = f"  {d['last_error']}" if d["last_error"] else ""
            print(f"    {d['sink']}: {d['state']} (attempts {d['attempts']}, last {status}){error}")
    return EXIT_OK


async def _retry(store: Store, args: argparse.Namespace) -> int:
    try:
        event = await store.retry_outbox(args.id, clock.now())
    except NotFound:
        return _fail(f"no notification event {args.id}", EXIT_ERROR)
    except Conflict as exc:
        return _fail(f"event {args.id} is {exc.current_state}, not dead: nothing to retry",
                     EXIT_ERROR)
    doc = _doc(event, await store.outbox_deliveries(event.id))
    if args.json:
        print(json.dumps(doc, sort_keys=True))
    else:
        print(f"{event.id} ({event.type}, {event.ticket_id}) is due again")
    return EXIT_OK


def _doc(event: OutboxEvent, deliveries: list[DeliveryRecord]) -> dict[str, Any]:
    return {
        "id": event.id, "seq": event.seq, "type": event.type, "ticket_id": event.ticket_id,
        "env": event.env, "at": clock.iso(event.at), "state": event.state,
        "attempts": event.attempts, "next_attempt_at": clock.iso(event.next_attempt_at),
        "window_start": clock.iso(event.window_start), "last_error": event.last_error,
        "finished_at": clock.iso(event.finished_at),
        "deliveries": [{"sink": d.sink, "state": d.state, "attempts": d.attempts,
                        "last_status": d.last_status, "last_error": d.last_error,
                        "at": clock.iso(d.at)} for d in deliveries],
    }


def _with_store(args: argparse.Namespace, work: Any) -> int:
    try:
        config = config_mod.load_from_process(args.config)
    except config_mod.ConfigError as exc:
        return _fail(str(exc), EXIT_UNAVAILABLE)
    url = config.store.url
    if url is None:
        return _fail("the configuration has no store (store.backend is none)", EXIT_UNAVAILABLE)
    if config.store.backend == "sqlite" and not config.store.sqlite_path.exists():
        # Opening a missing file would create an empty store and report an empty outbox.
        return _fail(f"no store at {config.store.sqlite_path} (is --config / "
                     "CONTROLPLANE_STATE_DIR the service's?)", EXIT_UNAVAILABLE)

    async def run() -> int:
        store = await open_store(url.reveal(), schema=config.store.postgres_schema)
        try:
            code: int = await work(store)
            return code
        finally:
            await store.close()

    try:
        return asyncio.run(run())
    except StoreError as exc:
        return _fail(f"store unavailable: {exc}", EXIT_UNAVAILABLE)


def _fail(message: str, code: int) -> int:
    print(f"cpctl notifications: {message}", file=sys.stderr)
    return code
