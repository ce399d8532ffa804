"""The decision log with inputs: one JSON line per AuthZ decision, the material for replay.

Each record holds what re-evaluating the decision needs and what reading it later needs:
``ts``, ``decision_id``, ``correlation_id``, ``revision``, the policy ``input`` as the chain
built it (before projection: roles and grants are policy data, so a replay against a candidate
revision sees the candidate's bindings), and the ``result`` (``decision``, ``reasons``,
``approval``). Fields whose name is secret (``service.redaction``) are masked wherever they
nest in the input, so the log never holds a credential.

Writing is off the request path: ``record`` appends to a bounded queue (O(1); when the queue is
full the record is dropped and counted, never blocking a decision) and one writer thread
serialises, writes and rotates the file (``path``, ``path.1`` ... ``path.N``) under a lock file
(``path.lock``) that the workers of one server share.

``logging.mask_fields`` (which may mask the subject in the structured decision log lines) does
not apply here: a replay needs the subject to project its roles. That is why this log is off
by default and lives where the operator puts it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from service.authz.decision import Decision
from service.clock import iso
from service.redaction import is_secret_field

__all__ = ["DECISION_LOG", "MASK", "DecisionLog", "mask_input", "read_records"]

log = logging.getLogger("controlplane.authz")

MASK = "***"


def mask_input(value: Any) -> Any:
    """A copy of ``value`` with every secret-named field (at any depth) replaced by ``MASK``."""
    if isinstance(value, Mapping):
        return {
            str(k): (MASK if is_secret_field(k) and v is not None else mask_input(v))
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [mask_input(v) for v in value]
    return value


def record_of(input_doc: Mapping[str, Any], decision: Decision, ts: float) -> dict[str, Any]:
    context = input_doc.get("context")
    correlation = context.get("correlation_id") if isinstance(context, Mapping) else None
    return {
        "ts": iso(ts),
        "decision_id": decision.decision_id,
        "correlation_id": correlation,
        "revision": decision.revision,
        "input": mask_input(input_doc),
        "result": {
            "decision": decision.decision,
            "reasons": list(decision.reasons),
            "approval": decision.to_dict()["approval"],
        },
    }


class DecisionLog:
    """A rotated JSON-lines file written by one background thread."""

    def __init__(
        self, path: Path, *, max_bytes: int = 50_000_000, backups: int = 5, queue_size: int = 10_000
    ) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self.queue_size = queue_size
        self._queue: deque[dict[str, Any]] = deque()
        self._wake = threading.Condition()
        self._closed = False
        self.written = 0
        self.dropped = 0
        self.errors = 0
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="decision-log", daemon=True)
        self._thread.start()

    def record(self, input_doc: Mapping[str, Any], decision: Decision) -> None:
        """Queue one decision; never blocks and never raises into the decision path."""
        if self._closed:
            return
        if len(self._queue) >= self.queue_size:
            self.dropped += 1
            return
        self._queue.append({"input": input_doc, "decision": decision, "ts": time.time()})
        with self._wake:
            self._wake.notify()

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued, then stop the writer."""
        self._closed = True
        with self._wake:
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def status(self) -> dict[str, Any]:
        return {"written": self.written, "dropped": self.dropped,
                "errors": self.errors, "queued": len(self._queue)}

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._closed:
                    self._wake.wait(1.0)
            batch = []
            while self._queue:
                batch.append(self._queue.popleft())
            if batch:
                self._write(batch)
            if self._closed and not self._queue:
                return

    def _write(self, batch: list[dict[str, Any]]) -> None:
        lines = []
        for item in batch:
            try:
                rec = record_of(item["input"], item["decision"], item["ts"])
                lines.append(json.dumps(rec, sort_keys=True, separators=(",", ":"), default=str))
            except (TypeError, ValueError):
                self.errors += 1
        if not lines:
            return
        data = ("\n".join(lines) + "\n").encode("utf-8")
        try:
            # Workers of one server (``--workers N``) share the file: a lock next to it makes
            # rotate-then-append one step across processes.
            with self.path.with_name(self.path.name + ".lock").open("a") as lock:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
                self._rotate_if_needed(len(data))
                with self.path.open("ab") as fh:
                    fh.write(data)
            self.written += len(lines)
        except OSError:
            self.errors += len(lines)
            log.exception("decision log: cannot write %s", self.path)

    def _rotate_if_needed(self, incoming: int) -> None:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return
        if size + incoming <= self.max_bytes:
            return
        if self.backups <= 0:
            self.path.unlink()
            return
        for n in range(self.backups - 1, 0, -1):
            src = self.path.with_name(f"{self.path.name}.{n}")
            if src.exists():
                src.replace(self.path.with_name(f"{self.path.name}.{n + 1}"))
        self.path.replace(self.path.with_name(f"{self.path.name}.1"))


#: Set by ``_decision_observers`` only when configured (``decision_log.path``,
#: ``policies.candidate_dir`` or ``.candidate_revision``).
DECISION_LOG: web.AppKey[DecisionLog] = web.AppKey("decision_log")


def read_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) of a decision log file, the rotated ones first when ``path`` is
    the live file and its backups exist; unreadable lines are skipped by the caller's choice
    (they raise ``ValueError`` naming the line)."""
    files = sorted(
        (p for p in path.parent.glob(path.name + ".*") if p.suffix.lstrip(".").isdigit()),
        key=lambda p: -int(p.suffix.lstrip(".")),
    )
    for file in [*files, path]:
        with contextlib.ExitStack() as stack:
            fh = stack.enter_context(file.open(encoding="utf-8"))
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    doc = json.loads(line)
                except ValueError:
                    raise ValueError(f"{file}:{lineno}: not a JSON line") from None
                if not isinstance(doc, dict):
                    raise ValueError(f"{file}:{lineno}: not a JSON object")
                yield lineno, doc
