"""``cpctl approval request | list | show | review | revoke``: approval tickets over the HTTP API.

``request`` computes the bindings locally: the command line is hashed here and only its hash is
sent (the server never sees the command), and the resource hash is sent too, so the server
refuses the ticket if the two sides canonicalise the resource differently. The nonce is printed
once, with the exact headers that present the ticket on the request that runs the action.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from ..approvals.binding import command_hash, resource_hash
from . import client as http
from .client import EXIT_OK, UsageError, guarded

__all__ = ["parse_resource", "register", "run"]

STATES = ("pending", "approved", "rejected", "expired", "revoked", "consumed")


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
    rq.add_argument("--resource", required=True,
                    help='what it is for: a JSON object (e.g. \'{"kind":"db","id":"db-1"}\') or a string')
    rq.add_argument("--subject", help="who will run the action (default: the logged-in subject)")
    rq.add_argument("--command", dest="command_line", metavar="COMMAND",
                    help="the exact command line to bind; only its sha256 is sent")
    rq.add_argument("--reason", help="why (shown to reviewers)")
    rq.add_argument("--ttl", type=int, metavar="SECONDS",
                    help="use-by time after approval (capped by policy)")
    rq.set_defaults(func=guarded(request))

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


def parse_resource(text: str) -> Any:
    """A JSON object when ``text`` parses as one; otherwise ``text`` itself, as a string."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


# -- handlers ----------------------------------------------------------------------------------


def request(args: argparse.Namespace) -> int:
    api = http.client_for(args)
    resource = parse_resource(args.resource)
    subject = args.subject or _me(api)
    body: dict[str, Any] = {
        "subject_id": subject,
        "env": args.env,
        "action": args.action,
        "resource": resource,
        "resource_hash": resource_hash(resource),
    }
    if args.command_line is not None:
        body["command"] = args.command_line  # shown to approvers; the hash binds it
        body["command_hash"] = command_hash(args.command_line)
    if args.reason is not None:
        body["reason"] = args.reason
    if args.ttl is not None:
        body["ttl_s"] = args.ttl
    ticket = api.post("/api/v1/approvals", body)
    _check_ticket(ticket)
    if ticket.get("resource_hash") != body["resource_hash"] or (
        "command_hash" in body and ticket.get("command_hash") != body["command_hash"]
    ):
        # The server bound something other than what we asked for: do not hand out its nonce.
        raise UsageError(f"ticket {ticket['id']} is bound to different hashes than requested; revoke it")
    if args.json:
        _print_json(ticket)
        return EXIT_OK
    print(_describe(ticket))
    nonce = ticket.get("nonce")
    if nonce:
        print()
        print("Nonce (shown only this once; it redeems the ticket, so keep it secret):")
        print(f"  {nonce}")
        print()
        print("Once approved, present these headers on the request that runs the action:")
        for name, value in presentation_headers(ticket, nonce):
            print(f"  {name}: {value}")
    return EXIT_OK


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
            _short(_resource_text(t.get("resource")), 40),
        ))
    print(_table(rows))
    if page.get("next_cursor"):
        print(f"(more: --cursor {page['next_cursor']})")
    return EXIT_OK


def show(args: argparse.Namespace) -> int:
    ticket = http.client_for(args).get(f"/api/v1/approvals/{_id(args.id)}")
    return _print_ticket(args, ticket)


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


def _resource_text(resource: Any) -> str:
    if isinstance(resource, str):
        return resource
    return json.dumps(resource, sort_keys=True, separators=(",", ":"))


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    )
