"""Shadow evaluation: a candidate revision decides alongside the live one, off the request path
and off the serving process's CPU.

``policies.candidate_dir`` names the candidate. It is loaded the way the live revision is (read,
vetted in a child process: compile, probe, its own ``*_test.rego``), and reloaded when its files
change, but in the shadow process (``authz.shadowproc``): one child interpreter per serving
process, at a lower CPU priority, that holds the candidate engine and decides. A candidate that
fails vetting, or that errors, never touches serving: it only shows in ``authz/status``.

The chain's decision observer (``decide.observe``) calls ``submit`` with the input and the live
decision: sampled by ``shadow_sample_rate``, appended to a bounded queue (dropped and counted
when full), and nothing else on the request path. A sender thread takes the queue in batches
(every ``SEND_INTERVAL_S``), serialises each batch once (JSON, over a pipe: the inputs are never
written anywhere) and reads the process's verdict; a different ``decision`` counts in
``controlplane_policy_shadow_divergence_total{live,candidate}`` here, and the shadow process
logs it with both results (``policy.shadow_divergence``, JSON on the same stderr: formatting and
scrubbing a log line costs more CPU than the whole hand-off, so it stays off the worker). The
process uses spare CPU only: at saturation it falls behind, the queue fills and drops (counted),
and the live path is not slowed. If it dies it is started again (with backoff, counted
in ``process.restarts``) and reloads the candidate; it ends with this component (``close``), and
by itself at end of input if this process dies.

``policies.candidate_revision`` names a published (inactive) revision of the store instead: no
directory is read; ``authz.reload.CandidateRevision`` fetches and verifies it like an active
revision and hands it to ``install`` (or its refusal to ``reject``), which the shadow process
vets and loads.
"""

from __future__ import annotations

import json
import logging
import random
import select
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from service.authz.decision import Decision
from service.authz.shadowproc import read_frame, write_frame
from service.authz.source import Snapshot

__all__ = ["SHADOW", "Shadow"]

log = logging.getLogger("controlplane.authz.shadow")

#: Inputs per frame sent to the shadow process (one ``json.dumps`` each).
BATCH = 256
#: How often the sender takes what the queue holds (sooner when a whole batch is waiting). The
#: request path only appends: waking a thread per request costs the worker more CPU than the
#: batch's encoding, so the sender wakes on its own, and a frame carries many inputs.
SEND_INTERVAL_S = 0.05
#: Loading a candidate (vetting in a child, compiling) and deciding a batch: past these the
#: shadow process is taken for hung, ended and started again.
LOAD_TIMEOUT_S = 300.0
DECIDE_TIMEOUT_S = 120.0
#: Restart backoff: doubled after each loss, from the first to the last value; a process that
#: lived ``STABLE_S`` starts the sequence again.
BACKOFF_S = (0.5, 30.0)
STABLE_S = 60.0
#: How often a request to the process is retried over restarts before it is given up.
ATTEMPTS = 3


class _Gone(Exception):
    """The shadow process ended, stopped answering, or this component is closing."""


class _NotSent(_Gone):
    """The shadow process ended before it read the request: it was not received."""


class _Call:
    """A request to the shadow process made from another thread (``install``)."""

    def __init__(self, request: dict[str, Any]) -> None:
        self.request = request
        self.reply: dict[str, Any] | None = None
        self.attempts = 0
        self.done = threading.Event()


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
        mask_fields: Iterable[str] = (),
    ) -> None:
        #: None: the candidate is a published revision, given to ``install`` (never a directory)
        self.candidate_dir = Path(candidate_dir).resolve() if candidate_dir is not None else None
        self.environments = environments
        self.sample_rate = sample_rate
        self.queue_size = queue_size
        self.poll_interval_s = poll_interval_s
        self.on_divergence = on_divergence
        #: ``logging.mask_fields``: the shadow process logs the divergences
        self.mask_fields = tuple(mask_fields)
        self._queue: deque[tuple[Mapping[str, Any], Decision]] = deque()
        self._calls: deque[_Call] = deque()
        self._wake = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._random = random.Random()  # sampling, not security
        self.counts: Counter[str] = Counter()
        self.divergences: Counter[tuple[str, str]] = Counter()
        self._state = "loading"
        self._error: str | None = None
        self._wanted: str | None = None
        #: The candidate the shadow process holds and compares with (None: inputs are skipped).
        self._revision: str | None = None
        #: The installed published revision: installed again in a restarted process.
        self._snapshot: Snapshot | None = None
        self._inflight = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._process_state = "starting"
        self._started_at = 0.0
        self._next_start = 0.0
        self._backoff = BACKOFF_S[0]
        self._next_poll = 0.0

    # ---- the candidate ---------------------------------------------------------------------

    @property
    def state(self) -> str:
        """``loading``, ``ready``, ``rejected`` or ``off``; ``error`` says why when not ready."""
        return self._state

    @property
    def error(self) -> str | None:
        return self._error

    @property
    def revision(self) -> str | None:
        """The candidate revision being compared (None: none is loaded)."""
        return self._revision

    @property
    def wanted(self) -> str | None:
        """The published revision this shadow is asked to evaluate (None: a directory's)."""
        return self._wanted

    @property
    def pid(self) -> int | None:
        """The shadow process's id while it runs."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def want(self, revision: str | None) -> None:
        """Another published revision is the candidate: nothing is compared until it loads."""
        if revision == self._wanted:
            return
        self._wanted = revision
        self._snapshot, self._revision = None, None
        self._state, self._error = ("loading", None) if revision else ("off", None)

    def install(self, snapshot: Snapshot) -> bool:
        """Vet and load a verified published revision as the candidate, in the shadow process
        (a fresh engine: a rejected one leaves no earlier candidate deciding in its name).
        Blocking: waits for the process's answer."""
        if snapshot.revision != self._wanted:
            return False  # asked for another revision meanwhile
        reply = self._call({"op": "install", "snapshot": snapshot.to_json()})
        if snapshot.revision != self._wanted:
            return False
        if reply is None:
            self.reject("the shadow process ended while loading it")
            return False
        if reply.get("revision") != snapshot.revision or reply.get("state") != "ready":
            self.reject(str(reply.get("error") or reply.get("failed")
                            or "the engine did not load it"))
            return False
        self._snapshot, self._revision = snapshot, snapshot.revision
        self._state, self._error = "ready", None
        log.info("shadow candidate revision %s loaded", snapshot.revision,
                 extra={"fields": {"event": "policy.shadow_candidate_loaded",
                                   "revision": snapshot.revision}})
        return True

    def reject(self, error: str) -> None:
        """The candidate revision is refused (unverifiable, unreadable, fails vetting): it is
        reported, and inputs are skipped (counted) until another candidate loads."""
        self._snapshot, self._revision = None, None
        self._state, self._error = "rejected", error
        log.warning("shadow candidate revision %s rejected: %s", self._wanted, error,
                    extra={"fields": {"event": "policy.shadow_candidate_rejected",
                                      "revision": self._wanted}})

    def waiting(self, error: str) -> None:
        """The candidate revision cannot be read yet (store unreachable, not published): still
        loading, with the reason; retried."""
        if self._state == "loading":
            self._error = error

    def recheck(self) -> None:
        """SIGHUP: look at the candidate directory now (reloaded if its files changed)."""
        self._next_poll = 0.0
        with self._wake:
            self._wake.notify()

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
        self._queue.append((input_doc, decision))  # the sender takes it (SEND_INTERVAL_S)

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="policy-shadow", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop sending, end the shadow process (end of input, then killed) and wait for it."""
        self._stop = True
        with self._wake:
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)
        self._end_process(grace=0.0)  # the thread did not get to it in time
        self._process_state = "stopped"

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """True once the queue is empty and the candidate is loaded (tests, benchmarks)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (self._state != "loading" and not self._queue and not self._inflight
                    and not self._calls and self._process_state == "running"):
                return True
            time.sleep(0.01)
        return False

    # ---- the sender thread -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop:
                try:
                    if self._proc is None or self._proc.poll() is not None:
                        self._restart()
                    else:
                        self._serve()
                except _Gone as exc:
                    if not self._stop:
                        self._lost(str(exc))
                except Exception as exc:  # never let shadow evaluation stop for good
                    log.exception("shadow evaluation failed")
                    self.counts["errors"] += 1
                    self._lost(exc.__class__.__name__)
        finally:
            self._end_process(grace=2.0)
            while self._calls:
                self._calls.popleft().done.set()

    def _restart(self) -> None:
        if self._proc is not None:  # it ended by itself
            self._lost(f"it exited ({self._proc.returncode})")
            return
        wait = self._next_start - time.monotonic()
        if wait > 0:
            with self._wake:
                self._wake.wait(wait)
            return
        if self._process_state != "starting":
            self.counts["restarts"] += 1
        try:
            self._proc = subprocess.Popen(  # our own interpreter and module
                [sys.executable, "-m", "service.authz.shadowproc"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
            )
        except OSError as exc:
            raise _Gone(f"it could not be started ({exc})") from exc
        self._started_at = time.monotonic()
        init = {"op": "init", "environments": dict(self.environments),
                "candidate_dir": str(self.candidate_dir) if self.candidate_dir else None,
                "mask_fields": list(self.mask_fields)}
        self._candidate(self._request(json.dumps(init).encode(), LOAD_TIMEOUT_S))
        snapshot = self._snapshot
        if snapshot is not None:  # the published revision this process held before
            reply = self._request(json.dumps({"op": "install", "snapshot": snapshot.to_json()})
                                  .encode(), LOAD_TIMEOUT_S)
            if reply.get("revision") != snapshot.revision and snapshot is self._snapshot:
                self.reject(str(reply.get("error") or "the engine did not load it"))
        self._process_state = "running"
        self._next_poll = time.monotonic() + self.poll_interval_s

    def _lost(self, why: str) -> None:
        """The shadow process is gone (or hung): end it; start another after the backoff."""
        self._end_process(grace=0.0)
        if time.monotonic() - self._started_at > STABLE_S:
            self._backoff = BACKOFF_S[0]
        self._next_start = time.monotonic() + self._backoff
        log.warning("shadow process lost: %s; starting another in %.1f s", why, self._backoff,
                    extra={"fields": {"event": "policy.shadow_process_lost"}})
        self._backoff = min(self._backoff * 2, BACKOFF_S[1])
        self._process_state = "restarting"
        if self.candidate_dir is not None:
            self._revision = None  # a restarted process loads the directory again

    def _end_process(self, grace: float) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()  # end of input: the process exits by itself
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def _serve(self) -> None:
        while self._calls:
            call = self._calls[0]
            call.attempts += 1
            try:
                call.reply = self._request(json.dumps(call.request).encode(), LOAD_TIMEOUT_S)
            except _Gone:
                if call.attempts >= ATTEMPTS:  # else asked again of the next process
                    self._calls.popleft()
                    call.done.set()
                raise
            self._calls.popleft()
            call.done.set()
        with self._wake:
            if len(self._queue) < BATCH and not self._calls and not self._stop:
                self._wake.wait(min(SEND_INTERVAL_S, self.poll_interval_s))
        if self.candidate_dir is not None and time.monotonic() >= self._next_poll:
            self._next_poll = time.monotonic() + self.poll_interval_s
            self._candidate(self._request(b'{"op":"poll"}', LOAD_TIMEOUT_S))
        while self._queue and not self._stop and not self._calls:
            self._decide()

    def _call(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """``request`` answered by the shadow process (None: it could not be)."""
        if self._stop or self._thread is None:
            return None
        call = _Call(request)
        self._calls.append(call)
        with self._wake:
            self._wake.notify()
        call.done.wait(LOAD_TIMEOUT_S * (ATTEMPTS + 1))
        return call.reply

    def _request(self, body: bytes, timeout: float) -> dict[str, Any]:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise _Gone("not running")
        try:
            write_frame(proc.stdin.fileno(), body)
        except OSError as exc:
            raise _NotSent(f"it stopped reading ({exc.__class__.__name__})") from exc
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while not select.select([fd], [], [], 0.2)[0]:
            if self._stop:
                raise _Gone("closing")
            if time.monotonic() > deadline:
                raise _Gone(f"no answer within {timeout:.0f} s")
        try:
            reply = read_frame(fd)
        except (OSError, ValueError) as exc:
            raise _Gone(f"unreadable answer ({exc.__class__.__name__})") from exc
        if not isinstance(reply, dict):
            raise _Gone("it ended")
        return reply

    def _candidate(self, reply: Mapping[str, Any]) -> None:
        """A directory's candidate as the shadow process loaded it (published revisions are
        ``install``'s)."""
        if self.candidate_dir is None:
            return
        state, error = str(reply.get("state")), reply.get("error")
        if error and (state, error) != (self._state, self._error):
            # A broken candidate never affects serving: it is reported, and inputs are skipped
            # (counted) until a good candidate loads.
            log.warning("shadow candidate rejected: %s", error,
                        extra={"fields": {"event": "policy.shadow_candidate_rejected",
                                          "candidate_dir": str(self.candidate_dir)}})
        self._revision = reply.get("revision")
        self._state, self._error = state, error if isinstance(error, str) else None

    def _decide(self) -> None:
        items = [self._queue.popleft() for _ in range(min(BATCH, len(self._queue)))]
        revision = self._revision
        if revision is None:
            self.counts["skipped"] += len(items)
            return
        try:
            body = json.dumps({"op": "decide", "revision": revision,
                               "items": [[doc, live.to_dict()] for doc, live in items]},
                              separators=(",", ":"), default=str).encode()
        except (TypeError, ValueError):
            self.counts["errors"] += len(items)
            log.exception("shadow inputs could not be serialised")
            return
        self._inflight = len(items)
        try:
            reply = self._request(body, DECIDE_TIMEOUT_S)
        except _NotSent:
            # The process was gone before it read the batch (killed while idle): the batch goes
            # back to the front of the queue for the next process, within the queue's bound.
            room = max(0, self.queue_size - len(self._queue))
            self.counts["dropped"] += len(items) - min(room, len(items))
            self._queue.extendleft(reversed(items[:room]))
            raise
        except _Gone:
            self.counts["errors"] += len(items)  # lost with the process
            raise
        finally:
            self._inflight = 0
        self._candidate(reply)
        if "failed" in reply:
            self.counts["errors"] += len(items)
            return
        for key in ("evaluated", "errors", "skipped"):
            self.counts[key] += int(reply.get(key) or 0)
        for index, candidate in reply.get("divergences") or ():
            live = items[index][1].decision
            self.divergences[(live, str(candidate))] += 1
            if self.on_divergence is not None:
                self.on_divergence(live, str(candidate))

    def status(self) -> dict[str, Any]:
        """For ``authz/status`` (public): the candidate's revision and the counts; no inputs, no
        paths, and a rejection's error as its one-line summary."""
        return {
            "state": self._state,
            "error": self._error,
            "source": "dir" if self.candidate_dir is not None else "store",
            "candidate_revision": self._wanted,
            "revision": self._revision,
            "sample_rate": self.sample_rate,
            "evaluated": self.counts["evaluated"],
            "diverged": sum(self.divergences.values()),
            "divergences": {f"{a}->{b}": n for (a, b), n in sorted(self.divergences.items())},
            "queued": len(self._queue) + self._inflight,
            "dropped": self.counts["dropped"],
            "sampled_out": self.counts["sampled_out"],
            "errors": self.counts["errors"],
            "skipped": self.counts["skipped"],
            "process": {"state": self._process_state, "restarts": self.counts["restarts"]},
        }


SHADOW: web.AppKey[Shadow] = web.AppKey("shadow")
