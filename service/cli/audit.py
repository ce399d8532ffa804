"""``cpctl audit verify | checkpoint | tail | keys``: check the audit chain, keep an anchor of it,
read its newest records, manage the audit signing keys.

``verify`` opens the store named by the service's own configuration (the same ``--config`` file
and ``CONTROLPLANE_*`` variables as ``cpctl serve``) and walks the whole chain against every
signed checkpoint (public keys from ``audit.keys_dir``, or ``--keys`` JWKS) and every
``--anchor`` file, so it needs no running service and no token, and trusts nothing the service
would say about itself. An anchor file may be the JSON-lines mirror (``audit.jsonl_path``):
then every record it holds is compared with the stored one as well, which catches a record
rewritten before any checkpoint signed it, and every checkpoint it shows must still be stored.
Exit codes: 0 the chain is intact and signed to its end; 1 it was changed (the first
contradiction is named; the records after the verified head are unverifiable), including
checkpoints an anchor shows were deleted; 2 it cannot be checked (no store, no keys, unreadable
anchor); 3 it is intact, but its newest records are not covered by a signed checkpoint yet
(named: normal while the service runs, for up to ``audit.checkpoint_records`` records /
``checkpoint_interval_s``; without an anchor this is also all that deleting every checkpoint
leaves to see: keep the mirror or an anchor off the host).
``checkpoint --out FILE`` writes the newest checkpoint that verifies, to keep elsewhere as an
anchor. ``tail`` reads the same store, or the HTTP API (``--server``; ``audit.read``, admins in
the shipped policy).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .. import clock
from .. import config as config_mod
from ..audit.checkpoint import Verification, read_anchors, to_doc
from ..audit.keys import AuditKeyError, AuditKeys, load_jwks
from ..store import StoreError, open_store
from ..store.base import AuditCheckpoint, AuditRecord, Store
from . import client as http
from .client import EXIT_ERROR, EXIT_OK, EXIT_UNAVAILABLE, guarded

__all__ = ["register", "run"]

_PAGE = 500
#: The chain is intact but its newest records are not covered by a signed checkpoint yet.
EXIT_UNANCHORED = 3


def register(sub: Any) -> None:
    """Add ``audit`` and its subcommands to ``cpctl``'s subparsers."""
    parser = sub.add_parser("audit", help="verify the audit hash chain; read its newest records")
    commands = parser.add_subparsers(dest="audit_command", metavar="SUBCOMMAND")
    commands.required = True

    ve = commands.add_parser(
        "verify", help="walk the whole chain against its signed checkpoints (and anchors); "
                       "exit 1 if it was changed, 3 if its newest records are not signed yet")
    _config_arg(ve)
    _keys_arg(ve)
    ve.add_argument("--anchor", metavar="FILE", action="append", default=[],
                    help="a checkpoint kept outside the database (JSON, or JSON lines such as "
                         "the mirror); the chain must still contain it, and every record of a "
                         "mirror with the same hash (repeatable)")
    ve.add_argument("--json", action="store_true", help="print the result as one JSON object")
    ve.set_defaults(func=guarded(verify))

    cp = commands.add_parser(
        "checkpoint", help="verify, then write the newest signed checkpoint as an anchor file")
    _config_arg(cp)
    _keys_arg(cp)
    cp.add_argument("--out", metavar="FILE", required=True,
                    help="where to write the anchor ('-': standard output)")
    cp.set_defaults(func=guarded(checkpoint))

    ks = commands.add_parser("keys", help="the audit signing keys (rotate, list)")
    key_actions = ks.add_subparsers(dest="audit_keys_command", metavar="ACTION")
    key_actions.required = True
    for name, func, text in (
        ("rotate", keys_rotate, "make a new signing key; the old one keeps only its public key"),
        ("list", keys_list, "print every audit public key as a JWK Set (for --keys)"),
    ):
        p = key_actions.add_parser(name, help=text)
        _config_arg(p)
        p.set_defaults(func=guarded(func))

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


def _keys_arg(parser: Any) -> None:
    parser.add_argument("--keys", metavar="FILE",
                        help="audit public keys as a JWK Set (cpctl audit keys list) instead of "
                             "the configuration's audit.keys_dir")


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
    located = _verification(args)
    if isinstance(located, int):
        return located
    result, keys_note, _ = located
    if args.json:
        print(json.dumps(_result_doc(result), sort_keys=True))
    else:
        _print_result(result)
    if keys_note and any(p.reason == "unknown_key" for p in result.problems):
        return _fail(keys_note, EXIT_UNAVAILABLE)
    if result.status == "broken":
        return EXIT_ERROR
    return EXIT_UNANCHORED if result.status == "unanchored" else EXIT_OK


def checkpoint(args: argparse.Namespace) -> int:
    """Verify, then write the newest checkpoint that verified: an anchor to keep elsewhere."""
    located = _verification(args, anchors=False)
    if isinstance(located, int):
        return located
    result, keys_note, newest = located
    if keys_note and any(p.reason == "unknown_key" for p in result.problems):
        return _fail(keys_note, EXIT_UNAVAILABLE)
    if result.status == "broken":
        _print_result(result, out=sys.stderr)
        return _fail("the chain does not verify: no anchor written", EXIT_ERROR)
    if newest is None:
        return _fail("no signed checkpoint yet (the service writes one every "
                     "audit.checkpoint_records records or checkpoint_interval_s seconds)",
                     EXIT_UNANCHORED)
    text = json.dumps(to_doc(newest), sort_keys=True) + "\n"
    if args.out == "-":
        sys.stdout.write(text)
    else:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(f"anchor written to {args.out}: seq {newest.seq} {newest.head_hash} "
              f"(signed by {newest.kid})")
    return EXIT_OK


def _verification(
    args: argparse.Namespace, *, anchors: bool = True
) -> tuple[Verification, str | None, AuditCheckpoint | None] | int:
    """Run the verification the arguments ask for: (the result, a note when there are no keys,
    the newest stored checkpoint that verified); an exit code when it cannot run."""
    store_url, schema = _store_location(args)
    if store_url is None:
        return EXIT_UNAVAILABLE
    config = _config(args)
    assert config is not None  # _store_location loaded it already
    keys_note = None
    try:
        if args.keys:
            with open(args.keys, encoding="utf-8") as fh:
                keys = load_jwks(fh.read())
        else:
            try:
                keys = AuditKeys.load(config.audit.keys_dir).public_keys()
            except AuditKeyError as exc:
                if config.audit.keys_dir.exists():
                    raise
                keys, keys_note = {}, f"{exc} (--keys FILE, or --config with the service's state_dir)"
    except (OSError, AuditKeyError) as exc:
        return _fail(f"cannot read the audit keys: {exc}", EXIT_UNAVAILABLE)
    kept: list[AuditCheckpoint] = []
    mirrored: list[AuditRecord] = []
    for path in args.anchor if anchors else ():
        try:
            with open(path, encoding="utf-8") as fh:
                checkpoints, records = read_anchors(fh.read())
        except (OSError, ValueError) as exc:
            return _fail(f"cannot read the anchor {path}: {exc}", EXIT_UNAVAILABLE)
        kept.extend(checkpoints)
        mirrored.extend(records)
    try:
        result, newest = asyncio.run(_verify(store_url, schema, keys, kept, mirrored))
    except StoreError as exc:
        return _fail(f"cannot open the store: {exc}", EXIT_UNAVAILABLE)
    return result, keys_note, newest


async def _verify(
    url: str, schema: str | None, keys: dict[str, Ed25519PublicKey],
    anchors: list[AuditCheckpoint], mirrored: list[AuditRecord],
) -> tuple[Verification, AuditCheckpoint | None]:
    from ..audit.log import AuditLog

    store = await open_store(url, schema=schema)
    try:
        log = AuditLog(store)
        result = await log.verify_signed(keys, anchors, mirrored)
        # The newest stored checkpoint at or before the verified head: every one of them was
        # found signed and matching (else the result is broken and nobody asks).
        newest = None
        async for cp in log.checkpoints():
            if cp.seq > result.verified_seq:
                break
            newest = cp
        return result, newest
    finally:
        await store.close()


def _result_doc(result: Verification) -> dict[str, Any]:
    broken, gap = result.broken, result.unverifiable
    return {
        "ok": result.status == "ok",
        "status": result.status,
        "verified": result.records,
        "head_seq": result.end_seq,
        "verified_head": (None if result.verified_hash is None
                          else {"seq": result.verified_seq, "hash": result.verified_hash}),
        "unverifiable": None if gap is None else {"first": gap[0], "last": gap[1]},
        "checkpoints": result.checkpoints,
        "anchors": result.anchors,
        "mirrored": result.mirrored,
        "break": None if broken is None else {"seq": broken.seq, "reason": broken.reason},
        "problems": [{"seq": p.seq, "reason": p.reason, "detail": p.detail}
                     for p in sorted(result.problems, key=lambda p: p.seq)],
    }


def _print_result(result: Verification, out: Any = None) -> None:
    out = out or sys.stdout
    signed = ("none" if result.verified_hash is None
              else f"seq {result.verified_seq} {result.verified_hash}")
    counts = f"{result.checkpoints} checkpoints" + (
        f", {result.anchors} anchors" if result.anchors else "")
    gap = result.unverifiable
    span = None if gap is None else (f"record {gap[0]}" if gap[0] == gap[1]
                                     else f"records {gap[0]}..{gap[1]}")
    if result.status == "ok":
        # An empty chain verifies trivially; say so, in case this is not the service's store.
        empty = " (the log is empty: is this the service's store?)" if result.records == 0 else ""
        print(f"audit chain ok: {result.records} records verified (head seq {result.end_seq}); "
              f"signed head: {signed} ({counts}){empty}", file=out)
    elif result.status == "unanchored":
        print(f"audit chain intact: {result.records} records verified (head seq "
              f"{result.end_seq}); signed head: {signed} ({counts}); {span} not covered by a "
              "signed checkpoint yet: unverifiable", file=out)
    else:
        print(f"audit chain broken at {result.broken}; {result.records} records verified "
              f"before it; verified head: {signed}; {span} unverifiable", file=out)
        for problem in sorted(result.problems, key=lambda p: p.seq)[1:]:
            print(f"  also: {problem}", file=out)


# -- keys --------------------------------------------------------------------------------------


def keys_rotate(args: argparse.Namespace) -> int:
    config = _config(args)
    if config is None:
        return EXIT_UNAVAILABLE
    keys = AuditKeys.open(config.audit.keys_dir, now=clock.now())
    kid = keys.rotate(clock.now())
    print(json.dumps({"active_kid": kid, **keys.jwks()}, sort_keys=True))
    return EXIT_OK


def keys_list(args: argparse.Namespace) -> int:
    config = _config(args)
    if config is None:
        return EXIT_UNAVAILABLE
    try:
        keys = AuditKeys.load(config.audit.keys_dir)
    except AuditKeyError as exc:
        return _fail(str(exc), EXIT_UNAVAILABLE)
    print(json.dumps(keys.jwks(), sort_keys=True))
    return EXIT_OK


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


def _config(args: argparse.Namespace) -> config_mod.Config | None:
    """The service's configuration (None: reported)."""
    try:
        return config_mod.load_from_process(args.config)
    except config_mod.ConfigError as exc:
        _fail(str(exc), EXIT_UNAVAILABLE)
        return None


def _store_location(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The store URL and PostgreSQL schema from the service's configuration (None: reported)."""
    config = _config(args)
    if config is None:
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
