"""Stage 3 of the chain (Approval): redeem a presented ticket for a ``require_approval`` run.

In order: an approval repository must exist (else 503, fail closed); the principal must hold a
fresh strong authentication when the environment is production or the policy asks for it (else
401 with the RFC 9470 challenge); a ticket must be presented (else 403 ``approval_required``
naming the bindings to request); it must exist, its nonce and bindings must match this request
(else 403 ``ticket_binding_mismatch``), and it must be approved and unexpired (else 409).
``check`` does all of that before any transaction opens; ``consume`` is the single conditional
UPDATE inside the run's transaction, which stays the authority: of concurrent redemptions on any
number of processes or replicas exactly one wins.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from multidict import istr

from ..authn import stepup
from ..authn.principal import Principal
from ..authz.actions import Action
from ..authz.decision import Decision
from ..config import Config
from ..errors import (
    ApprovalRepositoryUnavailable,
    ApprovalRequired,
    BadRequest,
    Conflict,
    TicketBindingMismatch,
)
from ..run import Target
from ..store.base import RunRead, Store, TaskRead, TicketRecord, Tx
from .binding import HASH_PATTERN, Binding, hash_nonce, mismatched

__all__ = [
    "COMMAND_HASH_HEADER",
    "NONCE_HEADER",
    "TICKET_HEADER",
    "Redemption",
    "check",
    "command_hash",
    "consume",
    "presented_ticket_id",
]

# ``istr``: a case-insensitive multidict looks a plain ``str`` name up by folding its case first,
# every time (these are looked up on every request).
TICKET_HEADER = istr("Approval-Ticket")
NONCE_HEADER = istr("Approval-Nonce")
COMMAND_HASH_HEADER = istr("Command-Hash")
_TICKET_ID = re.compile(r"tkt_[0-9a-f]{32}")
_NONCE = re.compile(r"[A-Za-z0-9_-]{16,128}")
_STATE_CODES = {"consumed": "ticket_consumed", "pending": "ticket_not_approved"}


def command_hash(headers: Mapping[str, str]) -> str | None:
    """The request's ``Command-Hash`` (part of the policy input); 400 when malformed."""
    value = headers.get(COMMAND_HASH_HEADER)
    if value is not None and not HASH_PATTERN.fullmatch(value):
        raise BadRequest("Command-Hash must be sha256:<64 lowercase hex>", code="invalid_command_hash")
    return value


def presented_ticket_id(headers: Mapping[str, str]) -> str | None:
    """The ``Approval-Ticket`` id when it is well-formed (for the audit record), else None."""
    value = headers.get(TICKET_HEADER)
    return value if value is not None and _TICKET_ID.fullmatch(value) else None


@dataclass(frozen=True, slots=True)
class Redemption:
    """A ticket that passed every check, and the binding this request presented for it."""

    ticket: TicketRecord
    binding: Binding
    #: The task named by the run's target id, as the ticket's read found it (for the run's
    #: transaction: ``Store.run_transaction``), or None when the target names none.
    task: TaskRead | None = None


async def check(
    config: Config,
    store: Store,
    principal: Principal,
    action: Action,
    target: Target,
    decision: Decision,
    headers: Mapping[str, str],
    now: float,
    read: RunRead | None = None,
) -> Redemption:
    """The ticket this request may redeem, checked up to (not including) consumption.
    ``read``: the ticket and task as the chain's AuthN read them with the session
    (``middleware.authn.confirm``), taken instead of reading them again."""
    if not config.approvals.enabled:
        raise ApprovalRepositoryUnavailable(
            "this action needs an approval ticket and no approval repository is configured"
        )
    if config.is_production(target.env) or decision.approval.get("step_up") is True:
        stepup.require_fresh(principal, now, config.authn.step_up_window_s)
    offered_command = command_hash(headers)
    ticket_id, nonce = headers.get(TICKET_HEADER), headers.get(NONCE_HEADER)
    if ticket_id is None and nonce is None:
        raise ApprovalRequired(
            "this action needs an approved ticket; request one with POST /api/v1/approvals",
            reasons=list(decision.reasons),
            bindings={
                "subject_id": principal.subject_id,
                "env": target.env,
                "action": action.name,
                "resource": target.resource,
                "resource_hash": target.hash,
                "command_hash_required": principal.kind != "human" or offered_command is not None,
                "command_hash": offered_command,
            },
            approval=dict(decision.approval),
            request_with="POST /api/v1/approvals",
            present_with=[TICKET_HEADER, NONCE_HEADER, COMMAND_HASH_HEADER],
        )
    if not ticket_id or not nonce or not _TICKET_ID.fullmatch(ticket_id) or not _NONCE.fullmatch(nonce):
        raise BadRequest(
            "Approval-Ticket and Approval-Nonce must both be present and well-formed",
            code="invalid_ticket_headers",
        )
    bound = Binding(
        nonce_hash=hash_nonce(nonce),
        subject_id=principal.subject_id,
        env=target.env,
        action=action.name,
        resource_hash=target.hash,
        command_hash=offered_command,
    )
    # The run's target may be a task it writes (an installer run's): read with the ticket, in
    # the same statement, so the run's transaction need not read it again.
    task = None
    if read is not None and _read_for(read, ticket_id, target.id):
        ticket, task = read.ticket, read.task
    elif target.id is None:
        ticket = await store.get_ticket(ticket_id)
    else:
        ticket, task = await store.get_ticket_and_task(ticket_id, target.id)
    fields = mismatched(ticket, bound) if ticket is not None else ("nonce_hash",)
    if "nonce_hash" in fields:
        # An unknown id and a wrong nonce look the same: ticket ids are not an oracle.
        raise TicketBindingMismatch("the ticket does not exist or the nonce does not match",
                                    fields=["nonce"])
    if fields:
        raise TicketBindingMismatch("the ticket is bound to another " + ", ".join(fields),
                                    fields=list(fields))
    assert ticket is not None
    if ticket.state != "approved":
        raise Conflict(f"the ticket is {ticket.state}",
                       code=_STATE_CODES.get(ticket.state, f"ticket_{ticket.state}"),
                       state=ticket.state)
    if ticket.expires_at is not None and ticket.expires_at <= now:
        raise Conflict("the ticket's approval has expired", code="ticket_expired", state="approved")
    return Redemption(ticket, bound, task)


def _read_for(read: RunRead, ticket_id: str, task_id: str | None) -> bool:
    """Whether ``read`` is of this ticket and task (it was read by the same headers and target:
    checked, not assumed)."""
    if read.ticket_id != ticket_id:
        return False
    return read.task is None if task_id is None else (read.task is not None
                                                      and read.task.id == task_id)


async def consume(tx: Tx, redemption: Redemption, now: float, correlation_id: str) -> TicketRecord:
    """Consume the ticket inside ``tx``: the store's one conditional UPDATE decides."""
    ticket, bound = redemption.ticket, redemption.binding
    return await tx.consume_ticket(
        ticket.id, nonce_hash=bound.nonce_hash, subject_id=bound.subject_id, env=bound.env,
        action=bound.action, resource_hash=bound.resource_hash,
        command_hash=bound.command_hash, now=now, correlation_id=correlation_id,
    )
