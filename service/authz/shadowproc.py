"""The shadow evaluation process: a candidate revision deciding in its own interpreter.

``authz.shadow.Shadow`` starts ``python -m service.authz.shadowproc`` (one per serving process)
and speaks to it over its stdin/stdout: frames of a 4-byte big-endian length and a JSON object,
one request, one reply, in order. The process lowers its own CPU priority first (``SCHED_IDLE``
where Linux has it, and ``nice`` +10):
it only uses CPU the serving processes leave, and under saturation it falls behind (the parent's
bounded queue then drops and counts) instead of slowing the live path.

Requests (``op``) and replies (every reply carries ``state``, ``error`` and ``revision``, the
candidate this process holds):

- ``init`` ``{candidate_dir, environments, mask_fields}``: build the candidate engine; with a
  directory, load (read, vet in a child, compile) it.
- ``poll``: with a directory, reload it if its files changed.
- ``install`` ``{snapshot}``: vet and load a published revision (a fresh engine: a rejected one
  leaves no earlier candidate deciding in its name).
- ``decide`` ``{revision, items: [[input, live decision], ...]}``: decide each input with the
  candidate, if it is still ``revision`` (else all are ``skipped``); the reply counts
  ``evaluated``, ``errors`` and lists ``divergences`` as ``[index, candidate's decision value]``.
  This process logs each divergence (``policy.shadow_divergence``: both results, the subject,
  action, env and correlation id; never the input), as JSON on stderr like the serving process.

The inputs are never written anywhere by this process. It exits at end of input (the parent
closed the pipe, or died).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import struct
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from service import logs
from service.authz.engine import DEFAULT_ENVIRONMENTS, PolicyEngine
from service.authz.source import Snapshot

__all__ = ["NICE", "read_frame", "write_frame"]

log = logging.getLogger("controlplane.authz.shadow")

#: How much lower the candidate's CPU priority is than the serving processes' (``nice``).
NICE = 10

_HEADER = struct.Struct(">I")


def read_frame(fd: int) -> Any:
    """One frame's JSON value from ``fd`` (blocking); None at end of input."""
    header = _read_exactly(fd, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    body = _read_exactly(fd, size)
    if body is None:
        return None
    return json.loads(body)


def write_frame(fd: int, body: bytes) -> None:
    """Write ``body`` (JSON text) as one frame to ``fd``."""
    data = memoryview(_HEADER.pack(len(body)) + body)
    while data:
        data = data[os.write(fd, data):]


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks: list[bytes] = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


class Candidate:
    """The candidate engine of this process, and what loading it said."""

    def __init__(self) -> None:
        self.candidate_dir: Path | None = None
        self.environments: Mapping[str, bool] = DEFAULT_ENVIRONMENTS
        self.engine = self._engine()
        self.state = "loading"
        self.error: str | None = None

    def _engine(self) -> PolicyEngine:
        # Without a directory the engine only ever installs snapshots: its path is never read.
        engine = PolicyEngine(self.candidate_dir or Path("."), self.environments)
        engine.log_decisions = False
        return engine

    def handle(self, request: Mapping[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        reply: dict[str, Any] = {}
        if op == "init":
            directory = request.get("candidate_dir")
            self.candidate_dir = Path(directory) if directory else None
            self.environments = dict(request.get("environments") or {})
            logs.configure("WARNING", request.get("mask_fields") or ())
            self.engine = self._engine()
            if self.candidate_dir is not None:
                self._load()
        elif op == "poll":
            if self.candidate_dir is not None and self.engine.poll_changes():
                self._load()
        elif op == "install":
            engine = self._engine()
            snapshot = Snapshot.from_json(str(request["snapshot"]))
            result = engine.install(snapshot)
            if result.ok and engine.revision == snapshot.revision:
                self.engine, self.state, self.error = engine, "ready", None
            else:
                self.state, self.error = "rejected", result.error or "the engine did not load it"
        elif op == "decide":
            reply = self._decide(request.get("revision"), request.get("items") or [])
        else:
            raise ValueError(f"unknown request {op!r}")
        reply.update(state=self.state, error=self.error, revision=self.engine.revision)
        return reply

    def _load(self) -> None:
        result = self.engine.reload()
        if result.ok:
            self.state, self.error = "ready", None
        else:
            # Rejected; an earlier good candidate of this directory (if any) keeps deciding.
            self.state = "rejected" if self.engine.revision is None else "ready"
            self.error = result.error

    def _decide(self, revision: Any, items: list[Any]) -> dict[str, Any]:
        engine = self.engine
        if revision is None or engine.revision != revision:
            return {"evaluated": 0, "errors": 0, "skipped": len(items), "divergences": []}
        evaluated = errors = 0
        divergences: list[list[Any]] = []
        for index, (input_doc, live) in enumerate(items):
            try:
                candidate = engine.decide(input_doc)
            except Exception:
                errors += 1
                log.exception("shadow evaluation failed")
                continue
            evaluated += 1
            if candidate.decision != live.get("decision"):
                divergences.append([index, candidate.decision])
                _log_divergence(input_doc, live, candidate.to_dict())
        return {"evaluated": evaluated, "errors": errors, "skipped": 0,
                "divergences": divergences}


def _log_divergence(input_doc: Mapping[str, Any], live: Mapping[str, Any],
                    candidate: Mapping[str, Any]) -> None:
    principal = input_doc.get("principal")
    context = input_doc.get("context")
    log.warning(
        "shadow divergence: live %s, candidate %s", live.get("decision"), candidate["decision"],
        extra={"fields": {
            "event": "policy.shadow_divergence",
            "correlation_id": context.get("correlation_id")
            if isinstance(context, Mapping) else None,
            "subject": principal.get("subject_id") if isinstance(principal, Mapping) else None,
            "action": input_doc.get("action"), "env": input_doc.get("env"),
            "live": dict(live), "candidate": dict(candidate),
        }},
    )


def lower_priority() -> None:
    """Background work: yield the CPU to the serving processes.

    ``SCHED_IDLE`` (Linux) runs the process only on CPU time nobody else wants: measured at 50%
    of saturation on 2 cores, ``nice`` +10 alone still took its ~10% share of a core from a
    busy worker and the live path's p99 rose. The nice value is lowered as well (what other
    systems honour, and what ``ps`` shows)."""
    try:
        os.nice(NICE)
    except OSError:
        log.warning("shadow evaluation: the process priority could not be lowered")
    idle = getattr(os, "SCHED_IDLE", None)
    if idle is not None:
        try:
            os.sched_setscheduler(0, idle, os.sched_param(0))
        except OSError:
            log.warning("shadow evaluation: the idle scheduling class could not be set")


def main() -> int:
    # The frames own the original stdout; anything else printed goes to stderr (the server log).
    out = os.dup(1)
    os.dup2(2, 1)
    logs.configure("WARNING")  # JSON lines on stderr, scrubbed, as the serving process's
    # A terminal's Ctrl-C or hangup reaches the whole process group: the serving process decides
    # when this one ends (end of input), and reloads come from it too.
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    lower_priority()
    candidate = Candidate()
    while True:
        request = read_frame(0)
        if request is None:
            return 0
        try:
            reply = candidate.handle(request)
        except Exception as exc:  # answered, counted by the parent; this process goes on
            log.exception("shadow request failed")
            reply = {"failed": exc.__class__.__name__, "state": candidate.state,
                     "error": candidate.error, "revision": candidate.engine.revision}
        write_frame(out, json.dumps(reply, default=str).encode())


if __name__ == "__main__":
    sys.exit(main())
