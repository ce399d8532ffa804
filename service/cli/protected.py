"""Request -> wait -> present: how every protected ``cpctl`` command answers the chain.

One implementation for ``installer run`` and ``policy publish | activate | rollback``. A command
hands ``Protected.send`` the call that makes its request (given the headers to present); the
chain's answers are taken in the order the server gives them:

1. ``401 step_up_required``: step up with ``--otp`` (once) or a no-echo prompt;
2. ``403 approval_required``: request the ticket the answer names (its bindings, resource and
   command hash), keep its nonce in ``tickets.json``, then follow the ticket's event stream
   until it is settled; ``--ticket ID`` presents an existing ticket instead;
3. ``409 ticket_not_approved`` (a ``--ticket`` still pending): wait for it the same way;
4. anything else is the answer. A consumed ticket's kept nonce is forgotten.

The ticket id, its nonce (from ``tickets.json``, or ``--nonce``) and the command hash travel as
headers set here; the nonce is never printed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ..approvals.command import Command, command_hash
from . import client as http
from .approval import request_ticket, show_progress, wait_for_ticket
from .client import ClientError, UsageError
from .session import prompt_otp, step_up_session

__all__ = ["Protected"]

#: Every answer moves the request one step on (step-up, ticket, wait); more rounds than this
#: means the server keeps asking the same question, and the command stops instead of looping.
MAX_ROUNDS = 6


class Protected:
    """One protected request of a ``cpctl`` command and what it gathered on the way.

    ``prog``: the command's name in messages (``cpctl policy publish``); ``what``: what does
    not happen when a ticket is refused (``the run``). ``resource``: the request's resource,
    when the server's ``approval_required`` answer does not name it. ``command``: the command
    bound to the ticket (its hash is presented). ``ticket``/``nonce``: present this ticket;
    without ``nonce`` the one kept when it was requested with ``cpctl`` is used.
    """

    def __init__(self, api: http.Client, *, prog: str, what: str,
                 resource: Any = None, command: Command | None = None,
                 reason: str | None = None, ticket: str | None = None,
                 nonce: str | None = None, otp: str | None = None,
                 quiet: bool = False) -> None:
        self.api, self.prog, self.what = api, prog, what
        self.resource, self.command, self.reason = resource, command, reason
        self.command_hash = command_hash(command) if command is not None else None
        self.otp, self.quiet = otp, quiet
        self.ticket_id, self.nonce = ticket, nonce
        if ticket is not None and nonce is None:
            self.nonce = http.TicketNonces().get(api.base_url, ticket)
            if self.nonce is None:
                raise UsageError(f"no nonce kept for ticket {ticket} on {api.base_url} "
                                 "(only tickets requested with cpctl from this account have "
                                 "one; pass --nonce)")
        elif nonce is not None and ticket is None:
            raise UsageError("--nonce goes with --ticket")

    def headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        if self.ticket_id is not None and self.nonce is not None:
            headers.update({"Approval-Ticket": self.ticket_id, "Approval-Nonce": self.nonce})
        if self.command_hash is not None:
            headers["Command-Hash"] = self.command_hash
        return headers

    def say(self, text: str) -> None:
        print(f"{self.prog}: {text}", file=sys.stderr, flush=True)

    def send(self, call: Callable[[dict[str, str]], Any]) -> Any:
        """``call(headers)`` until the chain lets it through; its answer."""
        for _round in range(MAX_ROUNDS):
            try:
                answer = call(self.headers())
            except ClientError as exc:
                if exc.code == "step_up_required":
                    self.step_up()
                elif exc.code == "approval_required" and self.ticket_id is None:
                    self.request_ticket(exc)
                    self.wait_approved()
                elif exc.code == "ticket_not_approved" and self.ticket_id is not None:
                    self.wait_approved()
                else:
                    raise
                continue
            if self.ticket_id is not None:
                http.TicketNonces().forget(self.api.base_url, self.ticket_id)  # used up
            return answer
        raise UsageError(f"the server keeps refusing {self.what} the same way; stopping")

    def step_up(self) -> None:
        keep = f" (with --ticket {self.ticket_id} to keep the ticket)" if self.ticket_id else ""
        principal = self.api.get("/api/v1/authn/sessions/current")
        if isinstance(principal, dict) and principal.get("kind") != "human":
            # Services and agents have no one-time codes: a fresh key login stands in.
            raise UsageError("this needs a fresh authentication: log in again with the key "
                             "(`cpctl login SUBJECT --key PEM`) and run again" + keep)
        if isinstance(principal, dict) and principal.get("authn_method") == "oidc":
            # Signed in through single sign-on: no one-time code, the provider confirms.
            raise UsageError("this needs a fresh step-up at your sign-in provider: run "
                             "`cpctl step-up --sso` and run again" + keep)
        code, self.otp = self.otp, None  # a one-time code works once
        if code is None:
            if not sys.stdin.isatty():
                raise UsageError("this needs a fresh step-up: run again with --otp CODE (a "
                                 "code not used yet)" + keep)
            self.say("a fresh step-up is needed")
            code = prompt_otp()
        step_up_session(self.api, code)
        self.say("stepped up")

    def request_ticket(self, refusal: ClientError) -> None:
        """Request the ticket the ``approval_required`` answer describes, bound to exactly its
        bindings (and this request's command)."""
        bindings = refusal.body.get("bindings")
        if not isinstance(bindings, dict) or not all(
                isinstance(bindings.get(k), str)
                for k in ("subject_id", "env", "action", "resource_hash")):
            raise UsageError("the server asked for an approval without naming the bindings")
        if bindings.get("command_hash_required") and self.command is None:
            raise UsageError("this action needs the command it will run bound to the ticket: "
                             "pass --command")
        if bindings.get("command_hash") not in (None, self.command_hash):
            raise UsageError("the server bound another command hash than this request's")
        resource = bindings.get("resource", self.resource)
        if resource is None:
            raise UsageError("the server asked for an approval without naming the resource")
        reasons = f" ({', '.join(refusal.reasons)})" if refusal.reasons else ""
        self.say(f"approval required{reasons}; requesting a ticket for {bindings['action']} "
                 f"on {bindings['env']}")
        ticket = request_ticket(
            self.api, subject=bindings["subject_id"], env=bindings["env"],
            action=bindings["action"], resource=resource, command=self.command,
            reason=self.reason, expect_resource_hash=bindings["resource_hash"],
        )
        self.ticket_id, self.nonce = ticket["id"], ticket["nonce"]
        self.say(f"ticket {self.ticket_id} requested; waiting for reviewers (Ctrl-C stops "
                 f"waiting; run again with --ticket {self.ticket_id} to resume)")

    def wait_approved(self) -> None:
        assert self.ticket_id is not None
        ticket = wait_for_ticket(self.api, self.ticket_id,
                                 on_change=None if self.quiet else show_progress)
        state = ticket.get("state")
        if state != "approved":
            if state in ("rejected", "expired", "revoked", "consumed"):
                http.TicketNonces().forget(self.api.base_url, self.ticket_id)
            raise UsageError(f"ticket {self.ticket_id} is {state}: {self.what} will not happen")
        self.say(f"ticket {self.ticket_id} approved; running")
