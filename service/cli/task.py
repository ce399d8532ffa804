"""``cpctl task``: the executor's side of the task loop, and following a task with bounds.

The executor contract
---------------------
The control plane records run *intents* (``installer.run.requested``); it executes nothing.
An executor is a separate process that carries the run out and reports its steps:

* **Who may report**: a principal granted ``tasks.report``. In the shipped policy data only the
  ``ci`` role has it, for ``service`` principals (``ci-bot`` in ``examples/``); a service logs in
  with its key (``cpctl login ci-bot --key examples/keys/ci-bot.pem``). Humans and agents cannot
  report, so nobody can mark their own run as done by hand.
* **Steps and states**: ``started`` (``pending -> running``), ``progress`` (0-100),
  ``succeeded`` or ``failed`` (terminal, with an optional ``result`` object). An event may name
  the step it is about (``step``, e.g. ``helm-upgrade``) and carry a ``message``. Nothing is
  accepted after a terminal event (``409 task_state_conflict``).
* **Claiming a run**: the first report on a pending task (``started``, or ``progress``) claims
  it for the reporting principal (``claimed_by`` in the task). From then on only that executor
  reports on it: another one's report of any kind gets ``409 task_claimed`` and changes nothing.
  The claim is taken on the task's row, so of two executors racing for a pending task exactly
  one claims it. ``started`` is accepted only while the task is ``pending`` (``409
  task_state_conflict``).

``cpctl task report TASK --status started|succeeded|failed`` sends one such event.
``follow_task`` is what ``cpctl installer run`` uses once a run is accepted: it says when no
executor has reported within a time, and gives up after ``--timeout`` with ``EXIT_TIMEOUT``.
"""

from __future__ import annotations

import argparse
import json
import queue
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from . import client as http
from .client import EXIT_OK, ClientError, ConnectionFailed, UsageError, guarded

__all__ = ["EXIT_TIMEOUT", "NO_EXECUTOR_AFTER_S", "TaskTimedOut", "follow_task", "register"]

#: ``installer run --timeout``: the task did not end in time (distinct from 0 succeeded,
#: 1 failed or refused, 2 server unreachable, 3 refused by the server as a usage error).
EXIT_TIMEOUT = 4
#: Default of ``installer run --no-executor-after``: seconds without any executor's report
#: before the command says that nothing seems to execute the task.
NO_EXECUTOR_AFTER_S = 60.0

STATUSES = ("started", "succeeded", "failed")


class TaskTimedOut(Exception):
    """The task did not end within the time the caller allowed."""


def report_kind(event: Any) -> bool:
    """Whether ``event`` (a step event's wire form) is an executor's report."""
    return isinstance(event, dict) and event.get("kind") in ("started", "progress", "succeeded",
                                                              "failed")


def follow_task(api: http.Client, task_id: str, *, last_event_id: str | None,
                on_event: Callable[[Any], None], timeout: float | None,
                no_executor_after: float | None, warn: Callable[[str], None]) -> None:
    """Feed the task's step events to ``on_event`` until the task ends.

    ``warn`` is called once when no executor has reported within ``no_executor_after`` seconds;
    ``TaskTimedOut`` is raised when the task has not ended within ``timeout`` seconds. The
    stream is read on a helper thread so that both bounds hold while the stream is quiet.
    """
    path = f"/api/v1/tasks/{quote(task_id, safe='')}/events"
    inbox: queue.Queue[tuple[str, Any]] = queue.Queue()

    def seen(event: http.ServerEvent) -> bool:
        if event.event != "end":
            inbox.put(("event", event.json()))
            return False
        inbox.put(("end", event.json()))
        return True

    def reader() -> None:
        try:
            api.follow(path, seen, last_event_id=last_event_id)
        except (ClientError, ConnectionFailed, UsageError) as exc:
            inbox.put(("error", exc))

    threading.Thread(target=reader, name=f"follow-{task_id}", daemon=True).start()
    start = time.monotonic()
    reported, warned = False, False
    while True:
        now = time.monotonic()
        waits = [1.0]
        if timeout is not None:
            waits.append(start + timeout - now)
        if not reported and not warned and no_executor_after is not None:
            waits.append(start + no_executor_after - now)
        try:
            what, item = inbox.get(timeout=max(0.0, min(waits)))
        except queue.Empty:
            now = time.monotonic()
            if timeout is not None and now - start >= timeout:
                raise TaskTimedOut(f"task {task_id} did not end within {timeout:g} s") from None
            if (not reported and not warned and no_executor_after is not None
                    and now - start >= no_executor_after):
                warned = True
                warn(f"no executor has reported on task {task_id} for {no_executor_after:g} s: "
                     "is one running? (see examples/executor/; `cpctl task report` reports by "
                     "hand)")
            continue
        if what == "error":
            raise item
        if what == "end":
            if isinstance(item, dict) and item.get("reason") == "session_ended":
                raise UsageError("the session ended while following the task; log in again and "
                                 f"see `GET /api/v1/tasks/{task_id}/events`")
            return
        reported = reported or report_kind(item)
        on_event(item)


# ------------------------------------------------------------------------------ cpctl task


def register(sub: Any) -> None:
    """Add ``task`` and its subcommands to ``cpctl``'s subparsers."""
    parser = sub.add_parser("task", help="report a task's steps (executors)")
    commands = parser.add_subparsers(dest="task_command", metavar="SUBCOMMAND")
    commands.required = True
    rp = commands.add_parser(
        "report", parents=[http.connection_parent()],
        help="report a step of a task you execute (needs tasks.report: service principals "
             "with the ci role)",
        description="Report one step event of TASK. The first report on a pending task claims "
                    "it: another executor's report answers 409 task_claimed, a report on an "
                    "ended task (or a second started) 409 task_state_conflict.",
    )
    rp.add_argument("task_id", metavar="TASK", help="the task id")
    rp.add_argument("--step", help="the step this report is about, e.g. helm-upgrade")
    rp.add_argument("--status", required=True, choices=STATUSES,
                    help="started claims the task; succeeded and failed end it")
    rp.add_argument("--message", help="a line for the people following the task")
    rp.add_argument("--result", metavar="JSON", help="a JSON object recorded with succeeded/failed")
    rp.add_argument("--json", action="store_true", help="print the recorded event as JSON")
    rp.set_defaults(func=guarded(report))


def report(args: argparse.Namespace) -> int:
    """``task report``."""
    body: dict[str, Any] = {"kind": args.status}
    if args.step is not None:
        body["step"] = args.step
    if args.message is not None:
        body["message"] = args.message
    if args.result is not None:
        if args.status == "started":
            raise UsageError("--result goes with --status succeeded or failed")
        try:
            result = json.loads(args.result)
        except ValueError:
            raise UsageError("--result is not JSON") from None
        if not isinstance(result, dict):
            raise UsageError("--result must be a JSON object")
        body["result"] = result
    api = http.client_for(args)
    event = api.post(f"/api/v1/tasks/{quote(args.task_id, safe='')}/events", body)
    if args.json:
        print(json.dumps(event, sort_keys=True), flush=True)
    else:
        seq = event.get("seq") if isinstance(event, dict) else None
        print(f"task {args.task_id}: {args.status} recorded (#{seq})", flush=True)
    return EXIT_OK

