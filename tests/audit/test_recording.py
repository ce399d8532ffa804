"""Stage 5 of the chain on its own (``service.audit.recording``), on each real store backend:
exactly one sealed record per run, on success (a read's record group-committed, a mutation's in
its transaction, or staged and sealed where the store stages) and on every kind of failure, each
with its outcome name, status and code; a record that cannot be written answers 503 and leaves
no record of an execution behind."""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from service import clock
from service.audit.log import AuditLog
from service.audit.recording import Recording, begin
from service.authn.errors import StepUpRequired, Unauthenticated
from service.authn.principal import ANONYMOUS, Principal
from service.authz import actions
from service.authz.decision import Decision
from service.errors import (
    ApprovalRequired,
    BadRequest,
    Conflict,
    PolicyDenied,
    Problem,
    TicketBindingMismatch,
)
from service.run import Outcome, Target
from service.store import Store, open_store
from service.store.base import StoreUnavailable

NOW = 1_800_000_000.0
ALICE = Principal(subject_id="alice", kind="human", session_id="s-alice", auth_time=NOW - 600,
                  authn_method="password", step_up_at=NOW - 60)
INSTALL = actions.get("installer.run.execute")
LIST = actions.get("databases.list")
TARGET = Target({"app": "web", "version": "1.2.3"}, "prod")
ALLOW = Decision("allow", ("granted",), revision="rev-1", decision_id="d-1")


@contextlib.asynccontextmanager
async def run_of(audit: AuditLog, action: actions.Action = INSTALL, principal: Principal = ALICE,
                 cid: str = "corr-1") -> AsyncIterator[Recording]:
    """One run's stage 5 as ``chain.run`` drives it: ``begin``, the stages, then ``refused``
    for a run that raised (its problem raised in its place) or ``close`` for one that returned."""
    rec = begin(audit, principal, action, correlation_id=cid, method="POST", path="/api/v1/x",
                now=NOW)
    try:
        yield rec
    except Exception as exc:
        raise await rec.refused(exc) from None
    after = rec.close()
    if after is not None:
        await after


async def records(store: Store) -> list[dict[str, Any]]:
    return [r.entry for r in await store.audit_range(0, 100)]


@pytest.fixture
def audit(store: Store, tmp_path: Path) -> AuditLog:
    return AuditLog(store, tmp_path / "audit.jsonl")


def mirrored(audit: AuditLog) -> list[dict[str, Any]]:
    assert audit.jsonl_path is not None
    if not audit.jsonl_path.exists():
        return []
    return [json.loads(line) for line in audit.jsonl_path.read_text().splitlines()]


async def test_a_read_that_executed_is_one_record_with_what_each_stage_learned(audit, store):
    async with run_of(audit, LIST) as rec:
        rec.target(TARGET, LIST)
        rec.decided(ALLOW)
        await rec.executed(Outcome(200, {"items": []}, audit={"count": 0}), None)
    [entry] = await records(store)
    assert entry["outcome"] == "executed" and entry["status"] == 200 and entry["count"] == 0
    assert entry["action"] == LIST.name and entry["correlation_id"] == "corr-1"
    assert entry["at"] == clock.iso(NOW)
    assert entry["principal"] == {"subject_id": "alice", "kind": "human", "session_id": "s-alice"}
    assert (entry["env"], entry["resource_hash"]) == ("prod", TARGET.hash)
    assert entry["decision"] == {"result": "allow", "reasons": ["granted"], "decision_id": "d-1"}
    assert entry["policy_revision"] == "rev-1"
    assert [m["correlation_id"] for m in mirrored(audit)] == ["corr-1"]


async def test_a_mutation_commits_its_record_with_its_transaction(audit, store):
    async with run_of(audit) as rec:
        rec.target(TARGET, INSTALL)
        rec.decided(ALLOW)
        rec.ticket("tkt_" + "1" * 32)
        async with store.run_transaction(None) as tx:
            rec.consumed()
            await rec.executed(Outcome(202, {"ok": True}), tx)
    [entry] = await records(store)
    assert (entry["outcome"], entry["status"]) == ("executed", 202)
    assert entry["ticket_id"] == "tkt_" + "1" * 32 and entry["ticket_consumed"] is True
    assert rec.ticket_events == ("approval.ticket_consumed",)
    assert [m["outcome"] for m in mirrored(audit)] == ["executed"]


FAILURES = [
    pytest.param(Unauthenticated(), "unauthenticated", 401, "unauthenticated", id="no-principal"),
    pytest.param(Unauthenticated("token_expired"), "unauthenticated", 401, "token_expired",
                 id="expired-token"),
    pytest.param(StepUpRequired('Bearer error="insufficient_user_authentication"'),
                 "step_up_required", 401, "step_up_required", id="step-up"),
    pytest.param(PolicyDenied("no", reasons=["no_grant"]), "denied", 403, "denied", id="denied"),
    pytest.param(ApprovalRequired("ticket"), "approval_required", 403, "approval_required",
                 id="approval-required"),
    pytest.param(TicketBindingMismatch("other", fields=["env"]), "rejected", 403,
                 "ticket_binding_mismatch", id="mismatch"),
    pytest.param(Conflict("consumed", code="ticket_consumed"), "rejected", 409, "ticket_consumed",
                 id="replayed"),
    pytest.param(BadRequest("bad", code="invalid_ticket_headers"), "invalid", 400,
                 "invalid_ticket_headers", id="malformed"),
    pytest.param(RuntimeError("bug"), "failed", 500, "internal_error", id="unexpected"),
    pytest.param(StoreUnavailable("store down"), "failed", 503, "store_unavailable",
                 id="store-unavailable"),
]


@pytest.mark.parametrize(("error", "outcome", "status", "code"), FAILURES)
async def test_each_failure_is_one_record_naming_it_and_is_answered_as_a_problem(
        audit, store, caplog, error, outcome, status, code):
    with caplog.at_level(logging.ERROR, logger="controlplane.chain"), \
            pytest.raises(Problem) as answered:
        async with run_of(audit) as rec:
            rec.target(TARGET, INSTALL)
            raise error
    assert (answered.value.status, answered.value.instance_code) == (status, code)
    [entry] = await records(store)
    assert (entry["outcome"], entry["status"], entry["error"]) == (outcome, status, code)
    assert entry["env"] == "prod" and "ticket_consumed" not in entry
    assert [m["error"] for m in mirrored(audit)] == [code]
    if isinstance(error, RuntimeError):  # the cause stays in our log, not in the answer
        assert "bug" not in answered.value.detail
        assert any(r.exc_info for r in caplog.records)


async def test_an_anonymous_refusal_is_recorded_with_no_subject(audit, store):
    with pytest.raises(Problem):
        async with run_of(audit, principal=ANONYMOUS):
            raise Unauthenticated()
    [entry] = await records(store)
    assert entry["principal"] == {"subject_id": None, "kind": "anonymous", "session_id": None}


async def test_a_mutation_that_failed_after_consuming_is_one_record_of_the_failure(audit, store):
    # Executed in the transaction, then the transaction failed: its record rolled back with it,
    # and the one record is that of the failure (the consumption rolled back too).
    with pytest.raises(Problem) as answered:
        async with run_of(audit) as rec:
            rec.target(TARGET, INSTALL)
            rec.decided(ALLOW)
            rec.ticket("tkt_" + "2" * 32)
            async with store.run_transaction(None) as tx:
                rec.consumed()
                await rec.executed(Outcome(202, {"ok": True}), tx)
                raise RuntimeError("the response could not be built")
    assert answered.value.status == 500
    [entry] = await records(store)
    assert (entry["outcome"], entry["status"]) == ("failed", 500)
    assert "ticket_consumed" not in entry and entry["ticket_id"] == "tkt_" + "2" * 32
    assert rec.ticket_events == ()


async def test_a_run_that_neither_executed_nor_failed_is_refused(audit, store):
    with pytest.raises(Problem) as answered:
        async with run_of(audit) as rec:
            rec.target(TARGET, INSTALL)
    assert (answered.value.status, answered.value.instance_code) == (503, "audit_unavailable")
    assert await records(store) == []


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[tuple[Store, Path]]:
    path = tmp_path / "cp.db"
    opened = await open_store(f"sqlite:///{path}")
    try:
        yield opened, path
    finally:
        await opened.close()


@pytest.mark.parametrize("mutation", [False, True], ids=["read", "mutation"])
async def test_a_record_that_cannot_be_written_is_503_and_nothing_executed(sqlite_store, tmp_path,
                                                                           mutation):
    store, path = sqlite_store
    audit = AuditLog(store, tmp_path / "audit.jsonl")
    failed: list[int] = []
    audit.append_failed = lambda: failed.append(1)
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TRIGGER no_audit BEFORE INSERT ON audit_log "
                     "BEGIN SELECT RAISE(ABORT, 'audit disk full'); END")
    with pytest.raises(Problem) as answered:
        async with run_of(audit, INSTALL if mutation else LIST) as rec:
            rec.target(TARGET, INSTALL)
            if mutation:
                async with store.run_transaction(None) as tx:
                    await tx.ensure_task("task-1", "alice", NOW)
                    await rec.executed(Outcome(202, {}), tx)
            else:
                await rec.executed(Outcome(200, {}), None)
    assert (answered.value.status, answered.value.instance_code) == (503, "audit_unavailable")
    assert "disk full" not in answered.value.detail
    assert failed  # counted (the metric)
    assert await records(store) == [] and mirrored(audit) == []
    assert await store.get_task("task-1") is None  # the mutation rolled back with its record
