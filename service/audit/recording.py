"""Stage 5 of the chain (Audit): exactly one sealed record per run, on every exit path.

``begin(...)`` starts the ``Recording`` of a whole run. The chain tells it what it learns as
the run goes (target, decision, presented ticket, consumption); ``executed(outcome, tx)``
appends the record of a run that executed, inside the run's transaction when it has one, so a
mutation, its ticket consumption and its record commit together. Any exception the run raises
goes to ``refused(exc)``, which writes the record of the run that did not execute outside any
transaction (the transaction rolled back) and returns the problem it is answered with; a run
that returned ends with ``close()``. A record that cannot be written answers 503; for
a mutation that means it did not happen. The JSON-lines mirror is written after commit.
Where the store stages records (PostgreSQL, ``AuditLog.stage``), the run's transaction stages
its record instead, and after COMMIT the answer waits until it is sealed into the chain.

A run whose COMMIT went unanswered (``StoreOutcomeUnknown``) may have executed: it is answered
503 ``outcome_unknown`` with the ids to check, and no record is written then. The worker's
resolver (``resolution.py``) asks the store, once it answers, whether the transaction committed:
if it did, the run's own record (committed with it) is its one record and the outcome's
``if_unanswered`` runs; if not, the record of the failed run is written then.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from collections.abc import Set as AbstractSet
from typing import Any, Literal, NoReturn, overload

from .. import clock
from ..authn.principal import Principal
from ..authz.actions import Action
from ..authz.decision import Decision
from ..errors import OutcomeUnknown, Problem, ServiceUnavailable, to_problem
from ..repeats import cause_of, log_repeated
from ..run import Outcome, Target
from ..store.base import (
    AuditRecord,
    Conflict,
    NotFound,
    StoreError,
    StoreOutcomeUnknown,
    StoreUnavailable,
    Tx,
)
from .log import AuditLog
from .resolution import Unresolved

__all__ = ["Recording", "begin", "settle_committed"]

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
        self._outcome: Outcome | None = None  # what the run executed, until it committed
        self._told = False  # the tip and the checkpointer know its record (``close``)

    def principal(self, principal: Principal) -> None:
        """Who the run is for, once its session was checked in the chain (``chain.run``)."""
        self.entry["principal"] = _principal_entry(principal)

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
        self._outcome = outcome
        # The Execute step's members (and a status that is not a plain one) are walked.
        known = OWN if not outcome.audit else OWN.difference(outcome.audit)
        if not (type(outcome.status) is int and 100 <= outcome.status <= 999):
            known = known - {"status"}
        if tx is not None and self._audit.stages:
            self._staged = await _append(self._audit, self.entry, tx, stage=True, known=known)
            return
        try:  # ``_append``'s common case, without its coroutine (every read)
            self._record = await self._audit.append(self.entry, tx, known)
        except StoreError as exc:
            _not_written(self._audit, self.entry, exc, stage=False)
        self._told = tx is None  # its group commit told the tip and the checkpointer

    async def refused(self, exc: Exception) -> Problem:
        """The run raised ``exc``: its record written as a refusal or failure (see
        ``_refused``), the problem it is answered with returned."""
        return await _refused(self._audit, self, exc)

    def close(self) -> Awaitable[None] | None:
        """The run returned without raising: its ticket events logged and its record
        mirrored; returns what is left to await (the settling of a staged record, the sink's
        write), None when nothing is. Raises ``ServiceUnavailable`` for a run that was never
        recorded (a bug in the chain: refused rather than answered without a record)."""
        if self._record is None and self._staged is None:
            raise ServiceUnavailable("the run was not recorded; nothing was executed",
                                     code="audit_unavailable")
        if "ticket_id" in self.entry:  # committed: its ticket events happened
            self.ticket_events = _log_ticket_events(self.entry)
        if self._staged is not None:
            return settle_committed(self._audit, self._staged, self.entry)  # the sealer mirrors
        assert self._record is not None
        return self._audit.mirror_soon((self._record,), told=self._told)

    async def _failed(self, problem: Problem, wait_s: float | None) -> None:
        self.entry.update(outcome=_outcome_name(problem), status=problem.status,
                          error=problem.instance_code)
        self.entry.pop("ticket_consumed", None)  # rolled back with the transaction
        self._staged = None  # so was a staged record
        self._record = await _append(self._audit, self.entry, None, wait_s)


#: The members the chain itself writes into a run's entry, each from a typed source: strings
#: (the time, the correlation id, the request's method and path, the target's env and hash,
#: the catalogue's names, the decision's id, reasons and revision, a ticket id from a checked
#: header), the principal's three members, a boolean and an HTTP status. ``record.prepare``
#: copies them without walking them (``known``); what the Execute step adds is walked.
OWN = frozenset({"at", "correlation_id", "principal", "action", "method", "path", "env",
                 "resource_hash", "resource_kind", "decision", "policy_revision", "ticket_id",
                 "ticket_consumed", "outcome", "status"})


def begin(audit: AuditLog, principal: Principal, action: Action, *, correlation_id: str,
          method: str, path: str, now: float) -> Recording:
    """The ``Recording`` of one run, before its first stage."""
    return Recording(audit, {
        "at": clock.iso(now),
        "correlation_id": correlation_id,
        "principal": _principal_entry(principal),
        "action": action.name,
        "method": method,
        "path": path,
    })


async def _refused(audit: AuditLog, rec: Recording, exc: Exception) -> Problem:
    """The problem a run that raised ``exc`` is answered with, once its record is written."""
    entry = rec.entry
    if isinstance(exc, StoreOutcomeUnknown):
        # COMMIT went unanswered: the run may have executed. No record now (its own may have
        # committed with it); the resolver records the outcome once the store tells it.
        log.error("chain run outcome unknown: COMMIT went unanswered", extra={"fields": {
            "event": "chain.outcome_unknown", "correlation_id": entry["correlation_id"],
            "action": entry["action"], "error": str(exc)}})
        audit.resolver.add(Unresolved(entry["correlation_id"], entry["action"],
                                      _resolution(audit, rec, exc)))
        return _unknown_problem(entry)
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
    # The record of the failure comes out of what remains of the request's store deadline
    # (``service.deadline``); a run the store failed waits for it only briefly (the record
    # stays queued and commits once the store answers).
    store_failed = isinstance(exc, StoreUnavailable)
    await rec._failed(problem, FAILURE_RECORD_WAIT_S if store_failed else None)
    await _mirror(audit, rec)
    return problem


#: The ids of a run's entry an unknown outcome is answered with, and where each is checked.
_CHECKS = (("task_id", "/api/v1/tasks/{}"), ("ticket_id", "/api/v1/approvals/{}"))


def _unknown_problem(entry: dict[str, Any]) -> OutcomeUnknown:
    """503 ``outcome_unknown`` with the ids of what the run touched and where to check them."""
    ids = {key: entry[key] for key, _ in _CHECKS if isinstance(entry.get(key), str)}
    check = [path.format(ids[key]) for key, path in _CHECKS if key in ids]
    detail = ("the store did not confirm the outcome: the action may have been executed. "
              "Check " + (" and ".join(check) if check else "its result") + " before repeating it")
    if entry.get("ticket_event") == "created":
        # Its nonce was in the lost answer: if the ticket was created, the service withdraws it.
        detail = ("the store did not confirm whether the ticket was created; if it was, it is "
                  "revoked as soon as the store answers (its nonce was never delivered): "
                  "request a new ticket")
    return OutcomeUnknown(detail, **ids, check=check)


def _resolution(audit: AuditLog, rec: Recording, exc: StoreOutcomeUnknown
                ) -> Callable[[], Awaitable[bool]]:
    """The resolver's attempt for ``rec``'s run: True once its outcome is known and recorded."""
    committed_of = exc.committed
    outcome, rec._outcome = rec._outcome, None
    known: list[bool] = []  # the answer, once had (so a retry only finishes the recording)

    async def attempt() -> bool:
        if not known:
            if committed_of is None:  # not a run that staged its record: nothing to ask
                log.error("unknown outcome cannot be resolved: the transaction was not named",
                          extra={"fields": {"event": "chain.outcome_unresolved",
                                            "correlation_id": rec.entry["correlation_id"],
                                            "action": rec.entry["action"]}})
                return True
            committed = await committed_of()
            if committed is None:
                return False  # the server has not seen the transaction end yet
            known.append(committed)
            if committed:
                rec.ticket_events = _log_ticket_events(rec.entry)
        if known[0]:
            if rec._staged is None and exc.staged_of is not None:
                rec._staged = await exc.staged_of()  # its id was in the lost answer
            if rec._staged is not None:
                await settle_committed(audit, rec._staged, rec.entry)
                rec._staged = None
            if outcome is not None and outcome.if_unanswered is not None:
                await outcome.if_unanswered()
        else:
            await rec._failed(_unknown_problem(rec.entry), None)
            await _mirror(audit, rec)
        log.info("unknown outcome resolved", extra={"fields": {
            "event": "chain.outcome_resolved", "correlation_id": rec.entry["correlation_id"],
            "action": rec.entry["action"], "committed": known[0]}})
        return True

    return attempt


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
                  stage: Literal[True], known: AbstractSet[str] = ...) -> int: ...
@overload
async def _append(audit: AuditLog, entry: dict[str, Any], tx: Tx | None,
                  wait_s: float | None = None, *, known: AbstractSet[str] = ...) -> AuditRecord: ...
async def _append(audit: AuditLog, entry: dict[str, Any], tx: Tx | None,
                  wait_s: float | None = None, *, stage: bool = False,
                  known: AbstractSet[str] = frozenset()) -> AuditRecord | int:
    """Append (or, with ``stage``, stage in ``tx``) the run's record; if it cannot be written,
    the run fails (a mutation rolls back).

    The store being unavailable is answered as such (503 ``store_unavailable``); any other
    failure to write the record is 503 ``audit_unavailable``. ``wait_s`` bounds the wait for a
    group-committed record (the commit itself goes on: ``append`` shields it).
    """
    try:
        if stage and tx is not None:
            return await audit.stage(entry, tx, known)
        if wait_s is None:
            return await audit.append(entry, tx, known)
        try:
            async with asyncio.timeout(wait_s):
                return await audit.append(entry, tx)
        except TimeoutError:
            raise StoreUnavailable("audit record not committed in time") from None
    except StoreError as exc:
        _not_written(audit, entry, exc, stage=stage)


def _not_written(audit: AuditLog, entry: dict[str, Any], exc: StoreError, *,
                 stage: bool) -> NoReturn:
    """Raise what a run whose record ``exc`` kept from being written is answered with
    (``_append``)."""
    if isinstance(exc, StoreUnavailable):
        unknown = isinstance(exc, StoreOutcomeUnknown)
        if unknown and stage:
            # The run's writes went in one call with its staged record (``store.pgrun``): the
            # run's own outcome is unknown, not only its record's.
            raise exc
        audit.append_failed()
        _write_failed("audit record could not be written: store unavailable", exc, entry)
        # An unanswered commit of this record alone (a group commit, outside the run's
        # transaction) leaves the run itself with nothing executed.
        raise to_problem(StoreUnavailable("audit record not confirmed") if unknown else exc) from None
    if stage and isinstance(exc, (Conflict, NotFound)):
        # Staged with the run's writes in one call (``store.pgrun``): the call also consumed
        # the ticket, and a ticket another run consumed first (or a task event seq taken)
        # refuses the whole call. That is the run's answer (409), not a record that could
        # not be written: nothing was written, and the refusal is recorded like any other.
        raise to_problem(exc) from None
    audit.append_failed()
    _write_failed("audit record could not be written", exc, entry)
    raise ServiceUnavailable("the audit log is unavailable; nothing was executed",
                             code="audit_unavailable") from None
