"""``cpctl approval request | wait | list | show | review | revoke``: approval tickets over the
HTTP API.

``request`` computes the bindings locally: the command (a command line, or an argv array) is
sent with its hash, computed here too, and so is the resource hash, so the server refuses the
ticket if the two sides canonicalise either differently. The nonce is printed once, with the
exact headers that present the ticket, and kept in ``tickets.json`` beside the credentials
(0600) for ``cpctl installer run --ticket``. ``--wait`` (and ``wait``) follow the ticket's event
stream until it is settled: exit 0 approved, 1 rejected, revoked or already consumed,
2 expired, 3 the wait itself failed (refused, unreachable, session ended).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..approvals.binding import resource_hash
from ..approvals.command import command_hash, is_command, masked
from ..approvals.summary import resource_summary
from . import client as http
from .client import EXIT_OK, ClientError, ConnectionFailed, UsageError, guarded

__all__ = [
    "EXIT_WAIT_FAILED",
    "WAIT_EXIT",
    "parse_command",
    "parse_json_value",
    "parse_resource",
    "register",
    "request_ticket",
    "run",
    "show_progress",
    "wait_for_ticket",
]

STATES = ("pending", "approved", "rejected", "expired", "revoked", "consumed")
#: A ticket in one of these states changes no more for a waiter (the server's stream ends there).
SETTLED = frozenset({"approved", "rejected", "expired", "revoked", "consumed"})
#: ``--wait``'s exit code per settled state, and when the wait itself failed.
WAIT_EXIT = {"approved": 0, "rejected": 1, "revoked": 1, "consumed": 1, "expired": 2}
EXIT_WAIT_FAILED = 3


def register(sub: Any) -> None:
    """Add ``approval`` and its subcommands to ``cpctl``'s subparsers."""
    parser = sub.add_parser("approval", help="request, list, review and revoke approval tickets")
    commands = parser.add_subparsers(dest="approval_command", metavar="SUBCOMMAND")
    commands.required = True
    conn = http.connection_parent()
    out = argparse.ArgumentParser(add_help=False)
    out.add_argument("--json", action="store_true", help="print the server's JSON answer")

    rq = commands.add_parser("request", parents=[conn, out], help="request a ticket (prints its nonce once)")
    rq.add_argument("--env", required=True, help="environment, e.g. prod")
    rq.add_argument("--action", required=True,
                    help="the action the ticket authorizes, e.g. installer.run.execute")
    rq.add_argument("--resource", required=True, help=RESOURCE_HELP)
    rq.add_argument("--subject", help="who will run the action (default: the logged-in subject)")
    rq.add_argument("--command", dest="command_line", metavar="COMMAND", help=COMMAND_HELP)
    rq.add_argument("--reason", help="why (shown to reviewers)")
    rq.add_argument("--ttl", type=int, metavar="SECONDS",
                    help="use-by time after approval (capped by policy)")
    rq.add_argument("--wait", action="store_true",
                    help="then wait until the ticket is settled: exit 0 approved, 1 rejected "
                         "(or revoked, consumed), 2 expired, 3 the wait failed")
    rq.set_defaults(func=request)

    wt = commands.add_parser("wait", parents=[conn, out],
                             help="wait until a ticket is settled (exit codes as request --wait)")
    wt.add_argument("id", metavar="ID")
    wt.set_defaults(func=wait)

    ls = commands.add_parser("list", parents=[conn, out], help="list tickets, newest first")
    ls.add_argument("--state", choices=STATES)
    ls.add_argument("--env")
    ls.add_argument("--subject")
    ls.add_argument("--limit", type=int, default=50, help="at most this many (1-200; default 50)")
    ls.add_argument("--cursor", help="continue after a previous page (printed at its end)")
    ls.set_defaults(func=guarded(list_tickets))

    sh = commands.add_parser("show", parents=[conn, out], help="one ticket with its reviews")
    sh.add_argument("id", metavar="ID")
    sh.set_defaults(func=guarded(show))

    rv = commands.add_parser("review", parents=[conn, out], help="approve or reject a ticket")
    rv.add_argument("id", metavar="ID")
    decision = rv.add_mutually_exclusive_group(required=True)
    decision.add_argument("--approve", dest="decision", action="store_const", const="approve")
    decision.add_argument("--reject", dest="decision", action="store_const", const="reject")
    rv.add_argument("--reason", help="recorded with the review")
    rv.set_defaults(func=guarded(review))

    rk = commands.add_parser("revoke", parents=[conn, out], help="revoke a pending or approved ticket")
    rk.add_argument("id", metavar="ID")
    rk.set_defaults(func=guarded(revoke))


def run(argv: Sequence[str]) -> int:
    """Run ``approval`` with ``argv`` (the words after ``cpctl approval``); the exit code."""
    parser = argparse.ArgumentParser(prog="cpctl")
    register(parser.add_subparsers(dest="command", required=True))
    try:
        args = parser.parse_args(["approval", *argv])
    except SystemExit as exc:
        return int(exc.code or 0)
    return int(args.func(args))


RESOURCE_HELP = ("what it is for: a JSON object (e.g. '{\"app\":\"web\"}'), @FILE holding one, "
                 "or a plain string; input that starts like JSON must be valid JSON")
COMMAND_HELP = ("the exact command line the ticket binds (sent with its sha256 and shown to "
                "reviewers), or an argv JSON array such as '[\"helm\",\"upgrade\",\"web\"]'")


def parse_json_value(option: str, text: str) -> Any:
    """``text`` as the user meant it: JSON when it starts like JSON (``{``, ``[`` or ``"``),
    which must then parse (``UsageError`` naming line and column), else the text itself.
    ``@FILE`` reads the value from FILE (``@-``: standard input)."""
    if text.startswith("@"):
        text = _read_at(option, text[1:])
    head = text.lstrip()[:1]
    if head not in ("{", "[", '"'):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{option}: invalid JSON at line {exc.lineno} column {exc.colno}: "
                         f"{exc.msg}") from None
    except ValueError as exc:  # RecursionError and the like: nested too deep
        raise UsageError(f"{option}: invalid JSON: {exc}") from None


def parse_resource(text: str, option: str = "--resource") -> Any:
    """A resource: a JSON object or a string (see ``parse_json_value``)."""
    value = parse_json_value(option, text)
    if isinstance(value, str) and value:
        return value
    if isinstance(value, dict) and value:
        return value
    raise UsageError(f"{option}: a resource is a non-empty JSON object or string, not "
                     f"{_json_kind(value)}")


def parse_command(text: str, option: str = "--command") -> str | list[str]:
    """A command: the exact command line, or an argv JSON array of strings."""
    value = parse_json_value(option, text)
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value and all(isinstance(a, str) for a in value):
        return value
    raise UsageError(f"{option}: a command is a command line or a non-empty JSON array of "
                     f"strings, not {_json_kind(value)}")


def _json_kind(value: Any) -> str:
    if isinstance(value, (str, list, dict)) and not value:
        return "an empty " + ("string" if isinstance(value, str) else
                              "array" if isinstance(value, list) else "object")
    if isinstance(value, list):
        return "an array with non-string items"
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


def _read_at(option: str, name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    try:
        return Path(name).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{option}: cannot read {name}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{option}: {name} is not UTF-8 text") from None


# -- handlers ----------------------------------------------------------------------------------


def request(args: argparse.Namespace) -> int:
    """``approval request``: create the ticket; with ``--wait``, then wait for its outcome."""
    if not args.wait:
        return guarded(_request)(args)
    return _waiting(args, lambda: _request(args))


def _request(args: argparse.Namespace) -> int:
    resource = parse_resource(args.resource)
    command = parse_command(args.command_line) if args.command_line is not None else None
    api = http.client_for(args)
    ticket = request_ticket(
        api, subject=args.subject or _me(api), env=args.env, action=args.action,
        resource=resource, command=command, reason=args.reason, ttl_s=args.ttl,
    )
    nonce = str(ticket.get("nonce") or "")
    if args.wait:
        if not args.json:
            print(_describe(ticket))
            print(f"\nNonce kept in {http.TicketNonces().path} "
                  f"(`cpctl installer run --ticket {ticket['id']}` presents it).", file=sys.stderr)
        final = wait_for_ticket(api, ticket["id"], on_change=None if args.json else show_progress)
        return _settled(args, final, nonce)
    if args.json:
        _print_json(ticket)
        return EXIT_OK
    print(_describe(ticket))
    if nonce:
        print()
        print("Nonce (shown only this once; it redeems the ticket, so keep it secret):")
        print(f"  {nonce}")
        print()
        print("Once approved, present these headers on the request that runs the action:")
        for name, value in presentation_headers(ticket, nonce):
            print(f"  {name}: {value}")
        print()
        print(f"(kept in {http.TicketNonces().path}: `cpctl installer run --ticket {ticket['id']}` "
              "presents it for you)")
    return EXIT_OK


def wait(args: argparse.Namespace) -> int:
    """``approval wait ID``: the same wait as ``request --wait``, for an existing ticket."""

    def follow() -> int:
        api = http.client_for(args)
        final = wait_for_ticket(api, args.id, on_change=None if args.json else show_progress)
        return _settled(args, final, None)

    return _waiting(args, follow)


def request_ticket(
    api: http.Client,
    *,
    subject: str,
    env: str,
    action: str,
    resource: Any,
    command: str | list[str] | None,
    reason: str | None = None,
    ttl_s: int | None = None,
    expect_resource_hash: str | None = None,
) -> dict[str, Any]:
    """Create a ticket bound to exactly these values; keep its nonce in ``TicketNonces``.

    Refuses a ticket the server bound to other hashes than the ones computed here (its nonce
    is not handed out then). A server that does not take the command text yet (older than
    this CLI) gets its hash alone.
    """
    body: dict[str, Any] = {
        "subject_id": subject,
        "env": env,
        "action": action,
        "resource": resource,
        "resource_hash": resource_hash(resource),
    }
    if expect_resource_hash is not None and body["resource_hash"] != expect_resource_hash:
        raise UsageError("the resource hashes to another value here than on the server; "
                         "not requesting a ticket that could never match")
    if command is not None:
        body["command"] = command
        body["command_hash"] = command_hash(command)
    if reason is not None:
        body["reason"] = reason
    if ttl_s is not None:
        body["ttl_s"] = ttl_s
    try:
        ticket = api.post("/api/v1/approvals", body)
    except ClientError as exc:
        if command is None or not _refuses_command_text(exc):
            raise
        print("cpctl: note: this server does not take the command text; only its hash was sent",
              file=sys.stderr)
        del body["command"]
        ticket = api.post("/api/v1/approvals", body)
    _check_ticket(ticket)
    if ticket.get("resource_hash") != body["resource_hash"] or (
        "command_hash" in body and ticket.get("command_hash") != body["command_hash"]
    ):
        # The server bound something other than what we asked for: do not hand out its nonce.
        raise UsageError(f"ticket {ticket['id']} is bound to different hashes than requested; revoke it")
    if isinstance(ticket.get("nonce"), str):
        http.TicketNonces().put(api.base_url, ticket["id"], ticket["nonce"])
    return dict(ticket)


def _refuses_command_text(exc: ClientError) -> bool:
    """A 422 that names the ``command`` member as not allowed (a server without it)."""
    if exc.status != 422 or exc.code != "schema_validation_failed":
        return False
    errors = exc.body.get("errors")
    return isinstance(errors, list) and any(
        isinstance(e, dict) and (e.get("pointer") == "/command" or (
            e.get("pointer") in ("", "/") and _NAMES_COMMAND.search(str(e.get("message", "")))))
        for e in errors
    )


# "unknown property: command", "'command' was unexpected": the member itself, not command_hash.
_NAMES_COMMAND = re.compile(r"(?:^|[\s'\":])command(?:$|[\s'\"])")


def wait_for_ticket(
    api: http.Client,
    ticket_id: str,
    *,
    on_change: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Follow ``GET /api/v1/approvals/{id}/events`` until the ticket is settled; the ticket then.

    No polling: the server pushes each change. A stream that drops or is refused for a moment
    is reopened (``Client.follow``); the first event of every stream is the current ticket, so
    nothing is missed.
    """
    last: dict[str, Any] | None = None

    def seen(event: http.ServerEvent) -> bool:
        nonlocal last
        if event.event == "ticket":
            ticket = event.json()
            _check_ticket(ticket)
            if ticket != last and on_change is not None:
                on_change(ticket)
            last = ticket
            return ticket.get("state") in SETTLED
        if event.event == "end":
            end = event.json()
            reason = end.get("reason") if isinstance(end, dict) else None
            if reason == "session_ended":
                raise UsageError("the session ended while waiting; run `cpctl login SUBJECT`, "
                                 f"then `cpctl approval wait {ticket_id}`")
            if reason == "ticket_not_found":
                raise ClientError(404, "ticket_not_found", "the ticket is gone")
        return False

    api.follow(f"/api/v1/approvals/{_id(ticket_id)}/events", seen)
    assert last is not None  # follow returns only once seen() said the ticket is settled
    return dict(last)


def _waiting(args: argparse.Namespace, body: Callable[[], int]) -> int:
    """Run a waiting command: its own exit code, or ``EXIT_WAIT_FAILED`` with the error shown
    as any command shows it (so 1 and 2 keep meaning rejected and expired)."""
    try:
        return body()
    except (ClientError, ConnectionFailed, UsageError) as exc:
        http.report_error(args, exc)
    return EXIT_WAIT_FAILED


def show_progress(ticket: dict[str, Any]) -> None:
    """A waiting line on stderr for each change of the ticket."""
    reviews = ticket.get("reviews") or []
    approvals = sum(1 for r in reviews if isinstance(r, dict) and r.get("decision") == "approve")
    last = reviews[-1] if reviews and isinstance(reviews[-1], dict) else None
    said = f"; {last.get('reviewer')}: {last.get('decision')}" if last else ""
    print(f"ticket {ticket.get('id')}: {ticket.get('state')} ({approvals}/{ticket.get('quorum')} "
          f"approvals{said})", file=sys.stderr, flush=True)


def _settled(args: argparse.Namespace, ticket: dict[str, Any], nonce: str | None) -> int:
    """Print the settled ticket; its exit code."""
    state = str(ticket.get("state"))
    if args.json:
        _print_json({**ticket, "nonce": nonce} if nonce else ticket)
    else:
        print(f"ticket {ticket.get('id')} is {state}")
    if state == "approved" and not args.json and ticket.get("expires_at"):
        print(f"use it before {ticket['expires_at']}", file=sys.stderr)
    return WAIT_EXIT.get(state, EXIT_WAIT_FAILED)


def presentation_headers(ticket: dict[str, Any], nonce: str) -> list[tuple[str, str]]:
    """The headers that present ``ticket`` (DESIGN §3: ticket id, nonce, command hash if bound)."""
    headers = [("Approval-Ticket", str(ticket["id"])), ("Approval-Nonce", nonce)]
    if ticket.get("command_hash"):
        headers.append(("Command-Hash", str(ticket["command_hash"])))
    return headers


def list_tickets(args: argparse.Namespace) -> int:
    api = http.client_for(args)
    page = api.get("/api/v1/approvals", {
        "state": args.state, "env": args.env, "subject_id": args.subject,
        "limit": args.limit, "cursor": args.cursor,
    })
    if not isinstance(page, dict) or not isinstance(page.get("items"), list):
        raise UsageError("the server answered with an unexpected ticket list")
    if args.json:
        _print_json(page)
        return EXIT_OK
    rows: list[tuple[str, ...]] = [("ID", "STATE", "ENV", "ACTION", "SUBJECT", "BY", "CREATED", "RESOURCE")]
    for t in page["items"]:
        rows.append((
            str(t.get("id")), str(t.get("state")), str(t.get("env")), str(t.get("action")),
            str(t.get("subject_id")), str(t.get("requested_by")), str(t.get("created_at")),
            _short(_summary(t), 40),
        ))
    print(_table(rows))
    if page.get("next_cursor"):
        print(f"(more: --cursor {page['next_cursor']})")
    return EXIT_OK


def show(args: argparse.Namespace) -> int:
    api = http.client_for(args)
    ticket = api.get(f"/api/v1/approvals/{_id(args.id)}")
    if not isinstance(ticket, dict) or ticket.get("action") not in POLICY_ACTIONS:
        return _print_ticket(args, ticket)
    # A policy change: what the reviewers are asked to approve, and its impact. The server may
    # have none to show (a candidate no trusted key signed): the ticket is shown all the same.
    try:
        change = api.get(f"/api/v1/approvals/{_id(args.id)}/change")
    except ClientError as exc:
        if exc.code != "no_policy_change":
            raise
        return _print_ticket(args, ticket)
    if args.json:
        _check_ticket(ticket)
        _print_json({**ticket, "change": change})
        return EXIT_OK
    _print_ticket(args, ticket)
    print(describe_change(change))
    return EXIT_OK


#: Tickets whose change ``show`` renders (``policytools.change.ACTIONS``).
POLICY_ACTIONS = ("policy.publish", "policy.activate")


def describe_change(c: dict[str, Any]) -> str:
    """The policy change of a ticket, as a reviewer reads it."""
    diff, impact = c.get("diff") or {}, c.get("impact") or {}
    vetting = c.get("vetting") or {}
    passed = {True: "passed", False: "failed", None: "not vetted yet"}.get(vetting.get("passed"))
    lines = [
        "policy change:",
        f"  revision:   {c.get('revision') or 'the policies directory (directory mode)'}"
        + (f" ({c.get('source')})" if c.get("source") else ""),
        f"  author:     {c.get('author') or '-'}",
        f"  message:    {c.get('message') or '-'}",
        f"  vetting:    {passed} ({vetting.get('by')})",
        f"  against:    {c.get('against')}",
        f"  diff:       {len(diff.get('files') or [])} files, +{diff.get('added', 0)} "
        f"-{diff.get('removed', 0)} lines",
    ]
    for f in diff.get("files") or []:
        lines.append(f"    {f['status']:8} {f['file']} (+{f['added']} -{f['removed']})")
    lines.append(f"  impact:     {c.get('impact_summary')}")
    for transition, group in (impact.get("groups") or {}).items():
        for e in group.get("examples") or []:
            lines.append(f"    {transition}: {e.get('subject')} {e.get('action')} on "
                         f"{e.get('env')} ({e.get('ts')})")
    return "\n".join(lines)


def review(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"decision": args.decision}
    if args.reason is not None:
        body["reason"] = args.reason
    ticket = http.client_for(args).post(f"/api/v1/approvals/{_id(args.id)}/reviews", body)
    return _print_ticket(args, ticket)


def revoke(args: argparse.Namespace) -> int:
    ticket = http.client_for(args).post(f"/api/v1/approvals/{_id(args.id)}/revoke", {})
    return _print_ticket(args, ticket)


# -- helpers -----------------------------------------------------------------------------------


def _me(api: http.Client) -> str:
    principal = api.get("/api/v1/authn/sessions/current")
    subject = principal.get("subject_id") if isinstance(principal, dict) else None
    if not isinstance(subject, str):
        raise UsageError("cannot tell who is logged in; pass --subject")
    return subject


def _id(value: str) -> str:
    return quote(value, safe="")


def _check_ticket(ticket: Any) -> None:
    if not isinstance(ticket, dict) or not isinstance(ticket.get("id"), str):
        raise UsageError("the server answered with an unexpected ticket document")


def _print_ticket(args: argparse.Namespace, ticket: Any) -> int:
    _check_ticket(ticket)
    if args.json:
        _print_json(ticket)
    else:
        print(_describe(ticket))
    return EXIT_OK


def _print_json(doc: Any) -> None:
    json.dump(doc, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


def _describe(t: dict[str, Any]) -> str:
    fields = [
        ("ticket", t.get("id")),
        ("state", t.get("state")),
        ("subject", t.get("subject_id")),
        ("requested by", t.get("requested_by")),
        ("env", t.get("env")),
        ("action", t.get("action")),
        ("resource", _resource_text(t.get("resource"))),
        ("resource hash", t.get("resource_hash")),
        ("command", _command_text(t.get("command"))),
        ("command hash", t.get("command_hash") or "-"),
        ("reason", t.get("reason") or "-"),
        ("quorum", t.get("quorum")),
        ("created", t.get("created_at")),
        ("pending until", t.get("pending_until")),
    ]
    for label, key in (("approved", "approved_at"), ("expires", "expires_at"),
                       ("consumed", "consumed_at"), ("closed", "closed_at"), ("closed by", "closed_by")):
        if t.get(key):
            fields.append((label, t[key]))
    width = max(len(label) for label, _ in fields) + 1
    lines = [f"{label + ':':<{width}} {value}" for label, value in fields]
    reviews = t.get("reviews") or []
    lines.append(f"{'reviews:':<{width}} {len(reviews)}")
    for r in reviews:
        group = f" [{r.get('group')}]" if r.get("group") else ""
        reason = f" - {r.get('reason')}" if r.get("reason") else ""
        lines.append(f"  {r.get('at')} {r.get('reviewer')}{group}: {r.get('decision')}{reason}")
    return "\n".join(lines)


def _summary(ticket: dict[str, Any]) -> str:
    """The server's one-line summary of the ticket's resource (computed here for an older one)."""
    summary = ticket.get("resource_summary")
    return summary if isinstance(summary, str) else resource_summary(ticket.get("resource"))


def _resource_text(resource: Any) -> str:
    if isinstance(resource, str):
        return resource
    return json.dumps(resource, sort_keys=True, separators=(",", ":"))


def _command_text(command: Any) -> str:
    if command is None:
        return "-"
    if is_command(command):
        command = masked(command)  # as the server shows it; an older server did not
    if isinstance(command, str):
        return command
    return json.dumps(command)  # an argv array, shown as the array it is


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    )
