"""Tasks: execution state that follows from append-only step events.

A task is not an approval: nothing here reads or changes tickets. State follows from events:
``pending -> running -> succeeded | failed``. Intent events (``installer.run.requested``) are
recorded without changing state: they take no task or deploy authority.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..clock import iso as _iso
from ..store.base import EventRecord, TaskRecord

__all__ = ["REPORT_KINDS", "EventView", "IllegalTransition", "TaskClaimed", "next_state",
           "task_view"]

INTENT_KIND = "installer.run.requested"
REPORT_KINDS = ("started", "progress", "succeeded", "failed")
TERMINAL = frozenset({"succeeded", "failed"})


class IllegalTransition(Exception):
    """The reported event does not follow from the task's current state."""

    def __init__(self, state: str, kind: str):
        super().__init__(f"a task in state {state!r} cannot take a {kind!r} event")
        self.state = state
        self.kind = kind


class TaskClaimed(Exception):
    """Another executor claimed the task with its first report: only it reports on the task."""

    def __init__(self, task_id: str, claimed_by: str):
        super().__init__(f"task {task_id!r} is claimed by {claimed_by!r}: only that executor "
                         "reports on it")
        self.task_id = task_id
        self.claimed_by = claimed_by


@dataclass(frozen=True)
class Change:
    state: str | None
    progress: int | None
    result: Any


def next_state(task: TaskRecord, reporter: str, kind: str, progress: int | None,
               result: Any) -> Change:
    """The task change ``reporter``'s report makes; ``TaskClaimed`` when another executor
    claimed the task, ``IllegalTransition`` when the report does not follow from its state.
    The store applies the change only while the claim still holds (two executors racing for a
    pending task: one claims it, the other gets ``task_claimed``)."""
    if task.claimed_by is not None and task.claimed_by != reporter:
        raise TaskClaimed(task.id, task.claimed_by)
    if task.state in TERMINAL:
        raise IllegalTransition(task.state, kind)
    if kind == "started":
        if task.state != "pending":
            raise IllegalTransition(task.state, kind)
        return Change("running", 0, None)
    if kind == "progress":
        # A progress report on a pending task means the executor started without saying so.
        return Change("running", progress, None)
    if kind == "succeeded":
        return Change("succeeded", 100, result)
    if kind == "failed":
        return Change("failed", None, result)
    raise IllegalTransition(task.state, kind)


@dataclass(frozen=True)
class EventView:
    """The wire form of a step event."""

    record: EventRecord

    def as_dict(self) -> dict[str, Any]:
        r = self.record
        return {"task_id": r.task_id, "seq": r.seq, "kind": r.kind, "at": _iso(r.at),
                "actor": r.actor, **(r.data if isinstance(r.data, dict) else {"data": r.data})}


def task_view(task: TaskRecord) -> dict[str, Any]:
    return {
        "id": task.id,
        "state": task.state,
        "progress": task.progress,
        "result": task.result,
        "created_by": task.created_by,
        "created_at": _iso(task.created_at),
        "updated_at": _iso(task.updated_at),
        "last_seq": task.last_seq,
        "claimed_by": task.claimed_by,
    }
