"""Compose reports evaluated in child processes, so a native crash takes a child, not the worker.

The rules run in regopy, a native library: a caller-supplied document that makes it crash
(SIGSEGV, an abort) would end the serving worker with every request it holds. So a worker's
``POST /api/v1/compose/import`` evaluates in a small pool of evaluator processes
(``python -m service.compose.evaluator``, at most ``POOL_SIZE`` per worker, started on first use)
that speak length-prefixed JSON over their stdin/stdout:

    request  {"revision", "sources" (first time this child meets the revision, else null),
              "fields", "input" (preflight.report_input), "budget_s"}
    answer   {"text": <the report's JSON text>} | {"budget": ..., "done": ..., "total": ...}
             | {"error": <message>}

The report cache stays in the worker (a cached report needs no child); a child keeps the
compiled rules of the revisions it was sent, and its per-service output cache. A child that dies
mid-request, or answers something that is not the protocol, fails only that request
(``EvaluationFailed``: 422 ``evaluation_failed``), is counted and logged once, and is replaced on
the next request. A child still evaluating after the report's wall-clock bound
(``preflight.WALL_FACTOR`` times its CPU budget: the child checks the CPU budget itself between
chunks, but cannot interrupt a chunk) is killed, and the request gets
``EvaluationBudgetExceeded``. A child whose request was cancelled (the client went away) is
stopped too: its late answer could not be told apart from the next request's.

Measured (bench/compose_bench.py, the "handler's await" table; two runs on a shared 2-core box at
load ~5, where the report itself took ~45-90 ms): a report through a child costs -0.4 to +1.5 ms
of wall-clock time (p50) and +0.5 to +2.1 ms of CPU (worker and child together) over the thread
it replaced, for the bench's 10-service file (the document's JSON both ways, the report's JSON
text back); a cached report never reaches a child (~0.15 ms).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from aiohttp import web

from service.compose import preflight
from service.compose.preflight import EvaluationBudgetExceeded, RuleSet
from service.config import Environments

__all__ = [
    "COMPOSE_EVALUATOR",
    "COMPOSE_RULES",
    "FAILURE_REASONS",
    "POOL_SIZE",
    "EvaluationFailed",
    "EvaluatorPool",
    "main",
]

log = logging.getLogger("controlplane.compose")

#: Evaluator processes per worker: two, so that a small check is not queued behind a large
#: one (each child evaluates one report at a time).
POOL_SIZE = 2
#: Seconds a new child may take to start and compile the rules before it counts as failed.
START_TIMEOUT_S = 120.0
#: Stack of the child's evaluating thread: regopy's regular expressions recurse per byte (see
#: policies/compose/lib.rego, ``max_match``); 64 MiB is 8x the usual default.
STACK_BYTES = 64 * 1024 * 1024
#: Why a request's evaluation failed, as counted (``controlplane_compose_evaluator_failures_total``).
FAILURE_REASONS = ("crashed", "timeout", "protocol", "unavailable")
#: Answers up to this size are decoded on the event loop; larger ones in a thread.
_LOOP_DECODE_BYTES = 64 * 1024
_HEADER = 4  # bytes of a message's length, big-endian
_REPO = Path(__file__).resolve().parents[2]


class EvaluationFailed(RuntimeError):
    """The evaluator process died, or broke the protocol, while evaluating a document."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.message = ("the compose rules could not be evaluated for this document "
                        "(the evaluator stopped); nothing was reported")
        super().__init__(self.message)


@dataclass(eq=False)  # kept in sets: by identity
class _Child:
    proc: asyncio.subprocess.Process
    revisions: set[str] = field(default_factory=set)
    busy: bool = False


class EvaluatorPool:
    """Up to ``size`` evaluator processes, started on first use and replaced when they die."""

    def __init__(self, size: int = POOL_SIZE, *,
                 on_failure: Callable[[str], None] | None = None) -> None:
        self._size = size
        self._slots = asyncio.Semaphore(size)
        self._idle: list[_Child] = []
        self._children: set[_Child] = set()
        self._reaping: set[asyncio.Task[Any]] = set()
        self._on_failure = on_failure
        self._closed = False

    def pids(self, *, busy: bool | None = None) -> list[int]:
        """The live children's process ids (``busy``: only those evaluating, or idle)."""
        return [c.proc.pid for c in self._children
                if c.proc.returncode is None and (busy is None or c.busy == busy)]

    async def evaluate_json(
        self,
        fields: Mapping[str, Any],
        *,
        strict: bool,
        env: str | None,
        rules: RuleSet,
        environments: Environments | None,
        budget_s: float,
    ) -> tuple[dict[str, Any], str]:
        """``preflight.evaluate_json`` with the evaluation in a child: the report and its text.

        Raises ``EvaluationBudgetExceeded`` (over the CPU budget, or the child over the wall-clock
        bound and killed) or ``EvaluationFailed``."""
        input_doc = preflight.report_input(strict=strict, env=env, environments=environments,
                                           fields=fields)

        def look_up() -> tuple[str, tuple[dict[str, Any], str] | None]:
            key = preflight.report_key(fields, input_doc, rules)
            return key, preflight.cached_report(rules, key)

        # Hashing (and later encoding) a large document is work for a thread, not the loop.
        key, hit = await asyncio.to_thread(look_up)
        if hit is not None:
            return hit
        services = len(fields.get("services") or {})
        async with self._slots:
            child = await self._take(rules)
            answer = await self._ask(child, rules, {
                "revision": rules.revision, "fields": fields, "input": input_doc,
                "budget_s": budget_s}, preflight.WALL_FACTOR * budget_s, services)
        if "budget" in answer:
            raise EvaluationBudgetExceeded(str(answer["budget"]), int(answer["done"]),
                                           int(answer["total"]))
        text = answer.get("text")
        if not isinstance(text, str):
            raise self._failed("protocol", f"unexpected answer {sorted(answer)}")
        try:
            report = (json.loads(text) if len(text) <= _LOOP_DECODE_BYTES
                      else await asyncio.to_thread(json.loads, text))
        except ValueError:
            raise self._failed("protocol", "an answer that is not JSON") from None
        if not isinstance(report, dict):
            raise self._failed("protocol", "an answer that is not a report")
        preflight.remember_report(rules, key, report, text)
        return report, text

    async def close(self) -> None:
        """Stop every child (stdin closed: it exits; killed if it does not within 5 s)."""
        self._closed = True
        for child in list(self._children):
            self._stop(child, kill=False)
        if self._reaping:
            await asyncio.gather(*self._reaping, return_exceptions=True)

    # --- children ------------------------------------------------------------------------------

    async def _take(self, rules: RuleSet) -> _Child:
        """An idle live child, or a new one (the caller holds a slot)."""
        if self._closed:
            raise self._failed("unavailable", "the evaluator pool is closed")
        while self._idle:
            child = self._idle.pop()
            if child.proc.returncode is None:
                return child
            self._children.discard(child)
        try:
            # Our own interpreter and module; ``-m`` from this checkout finds this code.
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "service.compose.evaluator",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=_REPO)
        except OSError as exc:
            raise self._failed("unavailable", f"cannot start: {exc.strerror}") from None
        child = _Child(proc)
        self._children.add(child)
        return child

    async def _ask(self, child: _Child, rules: RuleSet, request: dict[str, Any],
                   wall_s: float, services: int) -> dict[str, Any]:
        """Send one request, read its answer; the child goes back to the pool only after a
        complete exchange."""
        first = rules.revision not in child.revisions
        request["sources"] = dict(rules.sources) if first else None
        # A new revision is compiled first, within the start-up allowance.
        timeout = wall_s + (START_TIMEOUT_S if first else 0.0)
        child.busy, done = True, False
        try:
            data = await asyncio.to_thread(_encode, request)
            async with asyncio.timeout(timeout):
                answer = await _exchange(child.proc, data)
            done = True
        except TimeoutError:
            self._stop(child, kill=True)
            self._count("timeout", f"still evaluating after {timeout:g} s: killed")
            raise EvaluationBudgetExceeded(f"{wall_s:g} s", 0, services) from None
        except (asyncio.IncompleteReadError, ConnectionError, BrokenPipeError):
            code = await self._reap(child)
            raise self._failed("crashed", f"exited with {_describe(code)}") from None
        finally:
            child.busy = False
            if not done and child.proc.returncode is None:
                self._stop(child, kill=True)  # cancelled mid-exchange
        if not isinstance(answer, dict) or "error" in answer:
            detail = answer.get("error") if isinstance(answer, dict) else None
            self._stop(child, kill=True)
            raise self._failed("protocol", f"answered {str(detail)[:200]!r}")
        child.revisions = {rules.revision}  # a child keeps one revision (the worker's)
        if not self._closed:
            self._idle.append(child)
        return answer

    def _failed(self, reason: str, detail: str) -> EvaluationFailed:
        self._count(reason, detail)
        return EvaluationFailed(reason)

    def _count(self, reason: str, detail: str) -> None:
        log.error("compose evaluator failed (%s): %s", reason, detail,
                  extra={"fields": {"event": "compose.evaluator_failed", "reason": reason}})
        if self._on_failure is not None:
            self._on_failure(reason)

    async def _reap(self, child: _Child) -> int | None:
        """The exit status of a child whose pipes closed (killed if it lingers)."""
        self._children.discard(child)
        try:
            async with asyncio.timeout(5.0):
                return await child.proc.wait()
        except TimeoutError:
            child.proc.kill()
            return await child.proc.wait()

    def _stop(self, child: _Child, *, kill: bool) -> None:
        """Stop ``child`` in the background (its exit is awaited by ``close``)."""
        self._children.discard(child)
        if child in self._idle:
            self._idle.remove(child)

        async def stop() -> None:
            proc = child.proc
            if proc.returncode is None:
                if kill:
                    proc.kill()
                elif proc.stdin is not None:
                    proc.stdin.close()
            try:
                async with asyncio.timeout(5.0):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()

        task = asyncio.get_running_loop().create_task(stop())
        self._reaping.add(task)
        task.add_done_callback(self._reaping.discard)


#: The processes that evaluate compose reports (``service.compose.evaluator``).
COMPOSE_EVALUATOR: web.AppKey[EvaluatorPool] = web.AppKey("compose_evaluator")
#: The compose preflight rule set (``preflight.RuleSet``). Kept here, with the server's other
#: compose key, rather than beside its type: ``preflight`` is what ``cpctl compose check``
#: imports, and it must not load aiohttp.
COMPOSE_RULES: web.AppKey[RuleSet] = web.AppKey("compose_rules")


def _encode(message: Mapping[str, Any]) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return len(data).to_bytes(_HEADER, "big") + data


async def _exchange(proc: asyncio.subprocess.Process, data: bytes) -> Any:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(data)
    await proc.stdin.drain()
    size = int.from_bytes(await proc.stdout.readexactly(_HEADER), "big")
    return json.loads(await proc.stdout.readexactly(size))


def _describe(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"status {code}"


# --- the child ------------------------------------------------------------------------------------

def main() -> None:
    """The evaluator process: answer requests on stdin until it closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker stops it (a terminal's ^C too)
    threading.stack_size(STACK_BYTES)
    thread = threading.Thread(target=_serve, args=(sys.stdin.buffer, sys.stdout.buffer),
                              name="compose-evaluator")
    thread.start()
    thread.join()


def _serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    rulesets: dict[str, RuleSet] = {}
    while True:
        head = requests.read(_HEADER)
        if len(head) < _HEADER:
            return  # the worker closed the pipe
        body = requests.read(int.from_bytes(head, "big"))
        answers.write(_encode(_answer(body, rulesets)))
        answers.flush()


def _answer(body: bytes, rulesets: dict[str, RuleSet]) -> dict[str, Any]:
    try:
        request = json.loads(body)
        revision = request["revision"]
        rules = rulesets.get(revision)
        if rules is None:
            if not isinstance(request.get("sources"), dict):
                return {"error": "unknown revision"}
            rules = RuleSet.from_sources(request["sources"])
            if rules.revision != revision:
                return {"error": "the sources are not the revision"}
            rulesets.clear()  # one revision at a time: the worker serves one
            rulesets[revision] = rules
        report = preflight.evaluate_input(request["fields"], request["input"], rules=rules,
                                          budget_s=request["budget_s"])
    except EvaluationBudgetExceeded as exc:
        return {"budget": exc.budget, "done": exc.done, "total": exc.total}
    except (ValueError, KeyError, TypeError) as exc:
        return {"error": f"{type(exc).__name__}"}
    return {"text": json.dumps(report)}


if __name__ == "__main__":
    main()
