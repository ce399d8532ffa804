"""``cpctl installer run``: the protected installer action, end to end, in one command.

It answers the chain's questions itself (``protected.Protected``, shared with ``cpctl policy
publish | activate | rollback``), in the order the server asks them:

1. ``401 step_up_required``: step up with ``--otp`` (once) or a no-echo prompt;
2. ``403 approval_required``: request a ticket bound to exactly the bindings the answer names
   (``--ticket ID`` uses an existing one instead), then follow the ticket's event stream until
   it is settled;
3. ``409 ticket_not_approved`` (a ``--ticket`` still pending): wait for it the same way;
4. ``202``: the run intent is recorded. Then it follows the task's step events until the task
   ends (``--no-follow``: it stops here).

The ticket, its nonce and the command hash travel as headers this command sets; the nonce comes
from ``tickets.json`` (kept by ``approval request``) and is never printed. Exit 0 when the task
succeeded (or was accepted, with ``--no-follow``), 1 when it failed or anything was refused
(ticket rejected, expired or revoked included), 2 when the server cannot be reached, 4 when the
task did not end within ``--timeout`` (the executor contract: ``service/cli/task.py``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from . import client as http
from .approval import COMMAND_HELP, RESOURCE_HELP, parse_command, parse_resource
from .client import EXIT_ERROR, EXIT_OK, UsageError, guarded
from .protected import Protected
from .task import EXIT_TIMEOUT, NO_EXECUTOR_AFTER_S, TaskTimedOut, follow_task

__all__ = ["register", "run"]

ACTION = "installer.run.execute"


def register(sub: Any) -> None:
    """Add ``installer`` and its subcommands to ``cpctl``'s subparsers."""
    parser = sub.add_parser("installer", help="run installer actions end to end")
    commands = parser.add_subparsers(dest="installer_command", metavar="SUBCOMMAND")
    commands.required = True
    rn = commands.add_parser(
        "run", parents=[http.connection_parent()],
        help="run the installer action: step up, get a ticket approved, run, follow the task",
    )
    rn.add_argument("--task-id", required=True, help="the task the run belongs to")
    rn.add_argument("--env", required=True, help="environment, e.g. prod")
    rn.add_argument("--resource", required=True, help=RESOURCE_HELP)
    rn.add_argument("--command", dest="command_line", metavar="COMMAND", help=COMMAND_HELP)
    rn.add_argument("--ticket", metavar="ID",
                    help="present this ticket (requested earlier with `cpctl approval request`) "
                         "instead of requesting one")
    rn.add_argument("--otp", metavar="CODE",
                    help="one-time code for the step-up (prompted for when needed and absent)")
    rn.add_argument("--reason", help="why, for the ticket's reviewers")
    rn.add_argument("--no-follow", action="store_true",
                    help="stop once the run is accepted instead of following the task's events")
    rn.add_argument("--json", action="store_true",
                    help="print the accepted run and each step event as JSON lines")
    rn.add_argument("--timeout", type=_seconds, metavar="S",
                    help=f"stop following after S seconds if the task has not ended (exit "
                         f"{EXIT_TIMEOUT}; the task itself goes on)")
    rn.add_argument("--no-executor-after", type=_seconds, metavar="S", default=NO_EXECUTOR_AFTER_S,
                    help="say so when no executor has reported on the task within S seconds "
                         f"(default {NO_EXECUTOR_AFTER_S:g})")
    rn.set_defaults(func=guarded(run_installer))


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= 7 * 24 * 3600:
        raise argparse.ArgumentTypeError("seconds must be more than 0 and at most a week")
    return value


def run(argv: Sequence[str]) -> int:
    """Run ``installer`` with ``argv`` (the words after ``cpctl installer``); the exit code."""
    parser = argparse.ArgumentParser(prog="cpctl")
    register(parser.add_subparsers(dest="command", required=True))
    try:
        args = parser.parse_args(["installer", *argv])
    except SystemExit as exc:
        return int(exc.code or 0)
    return int(args.func(args))


class _Run:
    """One ``installer run``: the request (``protected.Protected`` answers the chain) and the
    task it starts."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.resource = parse_resource(args.resource)
        self.command = parse_command(args.command_line) if args.command_line is not None else None
        self.api = http.client_for(args)
        self.body = {"task_id": args.task_id, "action": ACTION, "env": args.env,
                     "resource": self.resource}
        self.protected = Protected(
            self.api, prog="cpctl installer run", what="the run", resource=self.resource,
            command=self.command, reason=args.reason, ticket=args.ticket, otp=args.otp,
            quiet=args.json)

    def submit(self) -> dict[str, Any]:
        """POST the action until it is accepted; the 202 answer."""
        answer = self.protected.send(
            lambda headers: self.api.post("/api/v1/installer/actions", self.body,
                                          headers=headers))
        if not isinstance(answer, dict) or not isinstance(answer.get("event"), dict):
            raise UsageError("the server accepted the run with an unexpected answer")
        return dict(answer)

    # -- after acceptance: the task's events ---------------------------------------------------

    def follow(self, accepted: dict[str, Any]) -> int:
        """Print the task's step events after the accepted one until the task ends; 0 when it
        succeeded, 1 when it failed, ``EXIT_TIMEOUT`` when it did not end within ``--timeout``
        (a warning first when no executor reported within ``--no-executor-after``)."""
        task_id = str(accepted.get("task_id") or self.args.task_id)
        try:
            # Resumed after a drop from the last event seen (the stream's ids are event seqs).
            follow_task(self.api, task_id,
                        last_event_id=str(accepted["event"].get("seq", "")) or None,
                        on_event=self.show_event, timeout=self.args.timeout,
                        no_executor_after=self.args.no_executor_after, warn=self.protected.say)
        except TaskTimedOut as exc:
            self.protected.say(f"{exc}; it goes on without this command (follow it with "
                     f"`GET /api/v1/tasks/{task_id}/events`)")
            return EXIT_TIMEOUT
        return self.finished(task_id)

    def finished(self, task_id: str) -> int:
        task = self.api.get(f"/api/v1/tasks/{quote(task_id, safe='')}")
        state = task.get("state") if isinstance(task, dict) else None
        if self.args.json:
            print(json.dumps({"task": task}, sort_keys=True), flush=True)
        else:
            result = task.get("result") if isinstance(task, dict) else None
            print(f"task {task_id} {state}" + (f": {json.dumps(result)}" if result else ""), flush=True)
        return EXIT_OK if state == "succeeded" else EXIT_ERROR

    def show_event(self, event: Any) -> None:
        if self.args.json:
            print(json.dumps({"event": event}, sort_keys=True), flush=True)
            return
        if not isinstance(event, dict):
            return
        extra = [f"[{event['step']}]"] if event.get("step") else []
        if event.get("progress") is not None:
            extra.append(f"{event['progress']}%")
        if event.get("message"):
            extra.append(str(event["message"]))
        if event.get("result") is not None:
            extra.append(json.dumps(event["result"]))
        print(f"#{event.get('seq')} {event.get('at')} {event.get('kind')} by {event.get('actor')}"
              + (": " + " ".join(extra) if extra else ""), flush=True)


def run_installer(args: argparse.Namespace) -> int:
    """``installer run``."""
    job = _Run(args)
    accepted = job.submit()
    if args.json:
        print(json.dumps({"accepted": accepted}, sort_keys=True), flush=True)
    else:
        ticket = accepted["event"].get("ticket_id")
        print(f"run accepted: task {accepted.get('task_id')}"
              + (f", ticket {ticket} consumed" if ticket else ""), flush=True)
        job.show_event(accepted["event"])
    if args.no_follow:
        return EXIT_OK
    return job.follow(accepted)
