"""A small example executor: it closes the task loop of ``cpctl installer run``.

The control plane records run intents; it executes nothing. This process plays the executor
(the contract is in ``service/cli/task.py`` and docs/howto/ci.md, "Executors"):

1. it logs in as a service principal with its key (``ci-bot`` in ``examples/``: the ``ci`` role
   grants ``tasks.report`` to service principals), and again whenever its token is refused;
2. it polls ``GET /api/v1/tasks?state=pending`` every ``--interval`` seconds;
3. it claims each pending task with a ``started`` event (the first report wins; another
   executor's gets ``409 task_claimed`` or ``task_state_conflict`` and leaves the task alone);
4. it "runs" the step (this example only reads the run intent and says what it would do;
   replace ``execute`` with the real work) and reports ``succeeded`` or ``failed``.

Run it beside a server (from the repository root)::

    python examples/executor/executor.py --server http://127.0.0.1:8700 \\
        --subject ci-bot --key examples/keys/ci-bot.pem

It stops on Ctrl-C or SIGTERM. Do not run it against anything but a development server: it
reports every pending task as succeeded.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

# Run as a script from a checkout: the control plane's own client is the one thing it imports.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from service.cli.client import Client, ClientError, ConnectionFailed, UsageError
from service.cli.session import DEFAULT_AUDIENCE, key_assertion

STEP = "example-executor"


def log(text: str) -> None:
    print(f"executor: {text}", file=sys.stderr, flush=True)


class Executor:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.api = Client(args.server.rstrip("/"))

    def login(self) -> None:
        body = {"assertion": key_assertion(self.args.key, self.args.subject, self.args.audience)}
        answer = self.api.post("/api/v1/authn/sessions", body, auth=False)
        self.api.token = answer["access_token"]
        log(f"logged in to {self.api.base_url} as {self.args.subject}")

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """One request; logs in again once when the token was refused (expired)."""
        for attempt in (1, 2):
            try:
                return self.api.get(path) if method == "GET" else self.api.post(path, body)
            except ClientError as exc:
                if exc.status != 401 or attempt == 2:
                    raise
                self.login()
        return None

    def intent(self, task_id: str) -> dict[str, Any]:
        page = self.call("GET", f"/api/v1/tasks/{quote(task_id, safe='')}/events")
        for event in page.get("items", []):
            if event.get("kind") == "installer.run.requested":
                return dict(event)
        return {}

    def execute(self, task_id: str, intent: dict[str, Any]) -> dict[str, Any]:
        """The work. This example does nothing but say what it was asked to do."""
        log(f"task {task_id}: would run {intent.get('action')} in {intent.get('env')} "
            f"(resource {intent.get('resource_hash')})")
        return {"executor": STEP, "dry_run": True}

    def handle(self, task_id: str) -> None:
        events = f"/api/v1/tasks/{quote(task_id, safe='')}/events"
        try:
            self.call("POST", events, {"kind": "started", "step": STEP, "message": "claimed"})
        except ClientError as exc:
            if exc.code in ("task_claimed", "task_state_conflict"):
                return  # another executor claimed it first
            raise
        log(f"task {task_id}: claimed")
        try:
            result = self.execute(task_id, self.intent(task_id))
        except Exception as exc:  # the work failed: say so, and keep serving other tasks
            self.call("POST", events, {"kind": "failed", "step": STEP,
                                       "message": f"{type(exc).__name__}"})
            log(f"task {task_id}: failed")
            return
        self.call("POST", events, {"kind": "succeeded", "step": STEP, "result": result})
        log(f"task {task_id}: succeeded")

    def serve(self, stop: list[bool]) -> None:
        self.login()
        while not stop:
            try:
                page = self.call("GET", "/api/v1/tasks?state=pending&limit=50")
                for task in page.get("items", []):
                    self.handle(str(task["id"]))
            except (ClientError, ConnectionFailed) as exc:
                log(f"{exc}; trying again")  # a restart, a moment's refusal: keep polling
            time.sleep(self.args.interval)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="http://127.0.0.1:8700")  # `make run`
    parser.add_argument("--subject", default="ci-bot")
    parser.add_argument("--key", type=Path, default=Path("examples/keys/ci-bot.pem"))
    parser.add_argument("--audience", default=DEFAULT_AUDIENCE)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between polls")
    args = parser.parse_args(argv)
    stop: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    try:
        Executor(args).serve(stop)
    except KeyboardInterrupt:
        pass
    except (UsageError, ClientError, ConnectionFailed) as exc:  # a bad --key, --server or login
        log(f"cannot serve: {exc}")
        return 2 if isinstance(exc, ConnectionFailed) else 1
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
