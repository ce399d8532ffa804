"""Shadow evaluation: a candidate revision decides alongside the live one, off the request path.

``policies.candidate_dir`` names the candidate. It is loaded the way the live revision is
(read, vetted in a child process: compile, probe, its own ``*_test.rego``), in this component's
own thread, and reloaded when its files change; a candidate that fails vetting, or that errors,
never touches serving: it only shows in ``authz/status``.

The chain's decision observer (``decide.observe``) calls ``submit`` with the input and the live
decision: sampled by ``shadow_sample_rate``, appended to a bounded queue (dropped and counted
when full), and nothing else on the request path. The worker thread decides each queued input
with the candidate engine and compares; a different ``decision`` counts in
``controlplane_policy_shadow_divergence_total{live,candidate}`` and is logged with both results.

``policies.candidate_revision`` names a published (inactive) revision of the store instead: no
directory is read; ``authz.reload.CandidateRevision`` fetches and verifies it like an active
revision and hands it to ``install`` (or its refusal to ``reject``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from service.authz.decision import Decision
from service.authz.engine import PolicyEngine
from service.authz.source import Snapshot

__all__ = ["Shadow"]

log = logging.getLogger("controlplane.authz.shadow")


class Shadow:
    def __init__(
        self,
        candidate_dir: Path | None,
        environments: Mapping[str, bool],
        *,
        sample_rate: float = 1.0,
        queue_size: int = 1000,
        poll_interval_s: float = 2.0,
        on_divergence: Callable[[str, str], None] | None = None,
    ) -> None:
        #: None: the candidate is a published revision, given to ``install`` (never a directory)
        self.candidate_dir = Path(candidate_dir) if candidate_dir is not None else None
        self.environments = environments
        self.engine = self._engine()
        self.sample_rate = sample_rate
        self.queue_size = queue_size
        self.poll_interval_s = poll_interval_s
        self.on_divergence = on_divergence
        self._queue: deque[tuple[Mapping[str, Any], Decision]] = deque()
        self._wake = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._random = random.Random()  # sampling, not security
        self.counts: Counter[str] = Counter()
        self.divergences: Counter[tuple[str, str]] = Counter()
        self._state = "loading"
        self._error: str | None = None
        self._wanted: str | None = None

    def _engine(self) -> PolicyEngine:
        # Without a directory the engine only ever installs snapshots: its path is never read.
        engine = PolicyEngine(self.candidate_dir or Path("."), self.environments)
        engine.log_decisions = False
        return engine

    # ---- a published revision as the candidate (policies.candidate_revision) ---------------

    @property
    def state(self) -> str:
        """``loading``, ``ready``, ``rejected`` or ``off``; ``error`` says why when not ready."""
        return self._state

    @property
    def error(self) -> str | None:
        return self._error

    @property
    def wanted(self) -> str | None:
        """The published revision this shadow is asked to evaluate (None: a directory's)."""
        return self._wanted

    def want(self, revision: str | None) -> None:
        """Another published revision is the candidate: nothing is compared until it loads."""
        if revision == self._wanted:
            return
        self._wanted = revision
        self.engine = self._engine()
        self._state, self._error = ("loading", None) if revision else ("off", None)

    def install(self, snapshot: Snapshot) -> bool:
        """Vet and load a verified published revision as the candidate (a fresh engine: a
        rejected one leaves no earlier candidate deciding in its name). Blocking."""
        if snapshot.revision != self._wanted:
            return False  # asked for another revision meanwhile
        engine = self._engine()
        result = engine.install(snapshot)
        if not result.ok or engine.revision != snapshot.revision:
            self.reject(result.error or "the engine did not load it")
            return False
        self.engine = engine
        self._state, self._error = "ready", None
        log.info("shadow candidate revision %s loaded", snapshot.revision,
                 extra={"fields": {"event": "policy.shadow_candidate_loaded",
                                   "revision": snapshot.revision}})
        return True

    def reject(self, error: str) -> None:
        """The candidate revision is refused (unverifiable, unreadable, fails vetting): it is
        reported, and inputs are skipped (counted) until another candidate loads."""
        self.engine = self._engine()
        self._state, self._error = "rejected", error
        log.warning("shadow candidate revision %s rejected: %s", self._wanted, error,
                    extra={"fields": {"event": "policy.shadow_candidate_rejected",
                                      "revision": self._wanted}})

    def waiting(self, error: str) -> None:
        """The candidate revision cannot be read yet (store unreachable, not published): still
        loading, with the reason; retried."""
        if self._state == "loading":
            self._error = error

    # ---- the request path: O(1), never raises --------------------------------------------

    def submit(self, input_doc: Mapping[str, Any], decision: Decision) -> None:
        if self._stop:
            return
        if self.sample_rate < 1.0 and self._random.random() >= self.sample_rate:
            self.counts["sampled_out"] += 1
            return
        if len(self._queue) >= self.queue_size:
            self.counts["dropped"] += 1
            return
        self._queue.append((input_doc, decision))
        with self._wake:
            self._wake.notify()

    # ---- the worker ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="policy-shadow", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        self._stop = True
        with self._wake:
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """True once the queue is empty and the candidate is loaded (tests, benchmarks)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._state != "loading" and not self._queue and not self.counts["busy"]:
                return True
            time.sleep(0.01)
        return False

    def _load(self) -> None:
        result = self.engine.reload()
        if result.ok:
            self._state, self._error = "ready", None
        else:
            # A broken candidate never affects serving: it is reported, and inputs are dropped
            # (counted) until a good candidate loads.
            self._state = "rejected" if self.engine.revision is None else "ready"
            self._error = result.error
            log.warning("shadow candidate rejected: %s", result.error,
                        extra={"fields": {"event": "policy.shadow_candidate_rejected",
                                          "candidate_dir": str(self.candidate_dir)}})

    def _run(self) -> None:
        # The candidate is background work: lower this thread's CPU priority (Linux: a thread is
        # a task with its own nice value) so that it yields the cores to the serving path.
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        if self.candidate_dir is not None:
            try:
                self._load()
            except Exception as exc:
                self._state, self._error = "rejected", exc.__class__.__name__
                log.exception("shadow candidate failed to load")
        next_poll = time.monotonic() + self.poll_interval_s
        while not self._stop:
            with self._wake:
                if not self._queue:
                    self._wake.wait(min(1.0, self.poll_interval_s))
            if self.candidate_dir is not None and time.monotonic() >= next_poll:
                next_poll = time.monotonic() + self.poll_interval_s
                try:
                    if self.engine.poll_changes():
                        self._load()
                except Exception:
                    log.exception("shadow candidate reload failed")
            while self._queue and not self._stop:
                input_doc, live = self._queue.popleft()
                self.counts["busy"] = 1
                try:
                    self._compare(input_doc, live)
                except Exception:
                    self.counts["errors"] += 1
                    log.exception("shadow evaluation failed")
                finally:
                    self.counts["busy"] = 0
                # Hand the GIL back between items: the event loop thread never waits a whole
                # switch interval behind a burst of shadow evaluations.
                time.sleep(0)

    def _compare(self, input_doc: Mapping[str, Any], live: Decision) -> None:
        engine = self.engine  # one candidate per comparison, whatever ``install`` swaps in
        if engine.revision is None:
            self.counts["skipped"] += 1
            return
        candidate = engine.decide(input_doc)
        self.counts["evaluated"] += 1
        if candidate.decision == live.decision:
            return
        self.divergences[(live.decision, candidate.decision)] += 1
        if self.on_divergence is not None:
            self.on_divergence(live.decision, candidate.decision)
        principal = input_doc.get("principal")
        context = input_doc.get("context")
        log.warning(
            "shadow divergence: live %s, candidate %s", live.decision, candidate.decision,
            extra={"fields": {
                "event": "policy.shadow_divergence",
                "correlation_id": context.get("correlation_id")
                if isinstance(context, Mapping) else None,
                "subject": principal.get("subject_id") if isinstance(principal, Mapping) else None,
                "action": input_doc.get("action"), "env": input_doc.get("env"),
                "live": live.to_dict(), "candidate": candidate.to_dict(),
            }},
        )

    def status(self) -> dict[str, Any]:
        """For ``authz/status`` (public): the candidate's revision and the counts; no inputs, no
        paths, and a rejection's error as its one-line summary."""
        return {
            "state": self._state,
            "error": self._error,
            "source": "dir" if self.candidate_dir is not None else "store",
            "candidate_revision": self._wanted,
            "revision": self.engine.revision,
            "sample_rate": self.sample_rate,
            "evaluated": self.counts["evaluated"],
            "diverged": sum(self.divergences.values()),
            "divergences": {f"{a}->{b}": n for (a, b), n in sorted(self.divergences.items())},
            "queued": len(self._queue),
            "dropped": self.counts["dropped"],
            "sampled_out": self.counts["sampled_out"],
            "errors": self.counts["errors"],
            "skipped": self.counts["skipped"],
        }

