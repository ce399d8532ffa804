"""Stage 5 of the chain (Audit): exactly one sealed record per run, on every exit path.

``recording(...)`` is an async context manager around a whole run. The chain tells it what it
learns as the run goes (target, decision, presented ticket, consumption); ``executed(outcome,
tx)`` appends the record of a run that executed, inside the run's transaction when it has one,
so a mutation, its ticket consumption and its record commit together. Any exception that leaves
the block becomes a problem, and the record of the run that did not execute is written outside
any transaction (the transaction rolled back). A record that cannot be written answers 503; for
a mutation that means it did not happen. The JSON-lines mirror is written after commit.
Where the store stages records (PostgreSQL, ``AuditLog.stage``), the run's transaction stages
its record instead, and after COMMIT the answer waits until it is sealed into the chain.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal, overload

from .. import clock
from ..authn.principal import Principal
from ..authz.actions import Action
from ..authz.decision import Decision
from ..errors import Problem, ServiceUnavailable, to_problem
from ..repeats import cause_of, log_repeated
from ..run import Outcome, Target
from ..store.base import AuditRecord, StoreError, StoreUnavailable, Tx
from .log import AuditLog

__all__ = ["Recording", "recording", "settle_committed"]

log = logging.getLogger("controlplane.chain")
#: Ticket events, logged once each after the run that caused them committed.
ticket_log = logging.getLogger("controlplane.approvals")

#: How long the answer of a run the store failed waits for the record of that failure.
FAILURE_RECORD_WAIT_S = 0.5


class Recording:
    """The audit entry of one run, filled in stage by stage."""

    def __init__(self, audit: AuditLog, entry: dict[str, Any]) -> None:
        self._audit = audit
        self.entry = entry
        self._record: AuditRecord | None = None
        self._staged: int | None = None  # the staging id, when the run's transaction staged it
        #: The ticket events of this run, set once it committed (``approval.ticket_*``).
        self.ticket_events: tuple[str, ...] = ()

    def target(self, target: Target, action: Action) -> None:
        self.entry.update(env=target.env, resource_hash=target.hash,
                          resource_kind=action.resource_kind)

    def decided(self, decision: Decision) -> None:
        self.entry["decision"] = {
            "result": decision.decision,
            "reasons": list(decision.reasons),
            "decision_id": decision.decision_id,
        }
        self.entry["policy_revision"] = decision.revision

    def ticket(self, ticket_id: str | None) -> None:
        """The ticket the request presented (recorded whether or not it is redeemed)."""
        if ticket_id is not None:
            self.entry["ticket_id"] = ticket_id

    def consumed(self) -> None:
        self.entry["ticket_consumed"] = True

    async def executed(self, outcome: Outcome, tx: Tx | None) -> None:
        """Append the record of a run that executed (in ``tx`` when given: it commits with it)."""
        self.entry.update(outcome.audit, outcome="executed", status=outcome.status)
        if tx is not None and self._audit.stages:
            self._staged = await _append(self._audit, self.entry, tx, stage=True)
        else:
            self._record = await _append(self._audit, self.entry, tx)

    async def _failed(self, problem: Problem, wait_s: float | None) -> None:
        self.entry.update(outcome=_outcome_name(problem), status=problem.status,
                          error=problem.instance_code)
        self.entry.pop("ticket_consumed", None)  # rolled back with the transaction
        self._staged = None  # so was a staged record
        self._record = await _append(self._audit, self.entry, None, wait_s)


@asynccontextmanager
async def recording(
    audit: AuditLog,
    principal: Principal,
    action: Action,
    *,
    correlation_id: str,
    method: str,
    path: str,
    now: float,
) -> AsyncIterator[Recording]:
    """Record one run: yields the ``Recording``; on an exception, records the refusal or failure
    and raises it as a ``Problem``; in every case mirrors the committed record."""
    rec = Recording(audit, {
        "at": clock.iso(now),
        "correlation_id": correlation_id,
        "principal": _principal_entry(principal),
        "action": action.name,
        "method": method,
        "path": path,
    })
    try:
        yield rec
    except Exception as exc:
        problem = to_problem(exc)
        if isinstance(exc, StoreUnavailable):
            # An outage fails every run alike: expected, one line per interval with the count.
            log_repeated(log, logging.ERROR, ("store.unavailable", "chain", str(exc)),
                         "chain run failed: %s", exc,
                         fields={"event": "store.unavailable", "during": "chain"})
        elif problem.status >= 500 and not isinstance(exc, Problem):
            # The cause stays in our log under the correlation id; the client sees only the id.
            log_repeated(log, logging.ERROR, ("chain.failed", *cause_of(exc)), "chain run failed",
                         fields={"event": "chain.failed"}, exc_info=exc)
        # A run the store failed has already spent its store deadline: the record of its
        # failure is queued, but the answer waits for it only briefly.
        store_failed = isinstance(exc, StoreUnavailable)
        await rec._failed(problem, FAILURE_RECORD_WAIT_S if store_failed else None)
        await _mirror(audit, rec)
        raise problem from None
    if rec._record is None and rec._staged is None:
        # A run that left the block without executing or failing is a bug in the chain: refuse
        # it rather than answer without a record.
        raise ServiceUnavailable("the run was not recorded; nothing was executed",
                                 code="audit_unavailable")
    rec.ticket_events = _log_ticket_events(rec.entry)  # committed: its ticket events happened
    if rec._staged is not None:
        await settle_committed(audit, rec._staged, rec.entry)  # the sealer mirrors it
    else:
        await _mirror(audit, rec)


async def settle_committed(audit: AuditLog, staged: int, entry: dict[str, Any]) -> None:
    """Wait for the staged record of a committed change to be sealed into the chain. The change
    and its record are committed either way: if sealing fails or is late, the answer stands and
    a sweep seals the record (``AuditLog.sweep``)."""
    try:
        await audit.settle(staged)
    except StoreError as exc:
        log.warning("audit record committed but not sealed yet; a sweep will seal it",
                    extra={"fields": {"event": "audit.seal_deferred", "error": type(exc).__name__,
                                      "action": entry.get("action")}})


async def _mirror(audit: AuditLog, rec: Recording) -> None:
    if rec._record is not None:
        await audit.mirror(rec._record)


#: A committed run's ``ticket_event`` (and the ticket's new state) -> the logged event.
_TICKET_EVENTS = {
    ("created", "pending"): "approval.ticket_requested",
    ("review_approve", "approved"): "approval.ticket_approved",
    ("review_reject", "rejected"): "approval.ticket_rejected",
    ("revoked", "revoked"): "approval.ticket_revoked",
}


def _log_ticket_events(entry: dict[str, Any]) -> tuple[str, ...]:
    """One structured line per ticket event of a committed run (requested, approved, rejected,
    reviewed with quorum still pending, revoked, consumed); ticket ids, never nonces. Returns the
    events logged."""
    ticket_id = entry.get("ticket_id")
    if ticket_id is None:
        return ()
    events: list[str] = []
    common = {"ticket_id": ticket_id, "env": entry.get("env"),
              "principal": entry["principal"]["subject_id"]}
    kind = entry.get("ticket_event")
    if kind is not None:
        state = entry.get("ticket_state", "pending" if kind == "created" else kind)
        event = _TICKET_EVENTS.get((kind, state), "approval.ticket_reviewed"
                                   if str(kind).startswith("review_") else f"approval.ticket_{kind}")
        fields = {"event": event, **common, "state": state}
        for key in ("ticket_action", "ticket_subject", "review_group"):
            if key in entry:
                fields[key] = entry[key]
        ticket_log.info("approval ticket event %s", event, extra={"fields": fields})
        events.append(event)
    if entry.get("ticket_consumed"):
        ticket_log.info("approval ticket consumed", extra={"fields": {
            "event": "approval.ticket_consumed", **common, "action": entry.get("action")}})
        events.append("approval.ticket_consumed")
    return tuple(events)


def _principal_entry(principal: Principal) -> dict[str, Any]:
    if not principal.is_authenticated:
        return {"subject_id": None, "kind": "anonymous", "session_id": None}
    return {"subject_id": principal.subject_id, "kind": principal.kind,
            "session_id": principal.session_id}


def _outcome_name(problem: Problem) -> str:
    if problem.status == 401:
        return "unauthenticated" if problem.instance_code != "step_up_required" else "step_up_required"
    if problem.instance_code == "approval_required":
        return "approval_required"
    if problem.instance_code == "denied":
        return "denied"
    if problem.status in (403, 409):
        return "rejected"
    if problem.status >= 500:
        return "failed"
    return "invalid"


def _write_failed(msg: str, exc: StoreError, entry: dict[str, Any]) -> None:
    # Each failed write is counted by the metric; the log says it once per interval, counted
    # (an outage fails every run's record alike).
    action = entry.get("action")
    log_repeated(log, logging.ERROR, ("audit.write_failed", type(exc).__name__, action), msg,
                 fields={"event": "audit.write_failed", "error": type(exc).__name__,
                         "action": action})


@overload
async def _append(audit: AuditLog, entry: dict[str, Any], tx: Tx, *,
                  stage: Literal[True]) -> int: ...
@overload
async def _append(audit: AuditLog, entry: dict[str, Any], tx: Tx | None,
                  wait_s: float | None = None) -> AuditRecord: ...
async def _append(audit: AuditLog, entry: dict[str, Any], tx: Tx | None,
                  wait_s: float | None = None, *, stage: bool = False) -> AuditRecord | int:
    """Append (or, with ``stage``, stage in ``tx``) the run's record; if it cannot be written,
    the run fails (a mutation rolls back).

    The store being unavailable is answered as such (503 ``store_unavailable``); any other
    failure to write the record is 503 ``audit_unavailable``. ``wait_s`` bounds the wait for a
    group-committed record (the commit itself goes on: ``append`` shields it).
    """
    try:
        if stage and tx is not None:
            return await audit.stage(entry, tx)
        if wait_s is None:
            return await audit.append(entry, tx)
        try:
            async with asyncio.timeout(wait_s):
                return await audit.append(entry, tx)
        except TimeoutError:
            raise StoreUnavailable("audit record not committed in time") from None
    except StoreUnavailable as exc:
        audit.append_failed()
        _write_failed("audit record could not be written: store unavailable", exc, entry)
        raise to_problem(exc) from None
    except StoreError as exc:
        audit.append_failed()
        _write_failed("audit record could not be written", exc, entry)
        raise ServiceUnavailable("the audit log is unavailable; nothing was executed",
                                 code="audit_unavailable") from None
