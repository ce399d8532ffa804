"""Repeated log events: the first of each cause is logged, then one summary per interval.

A failure that repeats (accept() out of descriptors hundreds of times a second, every request
failed by a store outage, a policy reload failing every poll) is one cause. ``Repeats.log``
logs its first occurrence as it comes (a traceback included, when the caller gives one); the
occurrences that follow within ``interval_s`` are counted, not logged, and one summary line
says how many there were (``count``) once the interval is over: from a timer on the event loop
when the occurrence came from one, else with the next occurrence after the interval. A cause
that stops repeating costs nothing more, and after a quiet interval its next occurrence is
logged as a first one again.

Every line carries ``count``: how many occurrences it stands for (1 for a first occurrence).
A summary carries no traceback: the cause's first line had it. Which failures are expected
(logged without a traceback) and which are not is the caller's call; ``cause_of`` names an
unexpected exception's cause by its type and the place it was raised.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import threading
import time
import traceback
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["INTERVAL_S", "REPEATS", "Repeats", "cause_of", "log_failure", "log_repeated"]

#: At most one line per cause in this many seconds (after its first).
INTERVAL_S = 10.0
#: Causes remembered at once; the oldest is forgotten first.
MAX_CAUSES = 1024

ExcInfo = BaseException | bool | None


@dataclass
class _Line:
    logger: logging.Logger
    level: int
    msg: str
    args: tuple[Any, ...]
    fields: dict[str, Any]


@dataclass
class _Cause:
    started: float  # when the current interval began (its first line was logged)
    suppressed: int = 0
    last: _Line | None = None  # the last occurrence not logged: what the summary says
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class Repeats:
    """Per-cause rate limit of log lines (see the module docstring)."""

    def __init__(self, interval_s: float = INTERVAL_S, *, max_causes: int = MAX_CAUSES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._max_causes = max_causes
        self._clock = clock
        self._causes: dict[Hashable, _Cause] = {}
        # Occurrences come from the event loop and from worker threads (policy reloads).
        self._lock = threading.Lock()

    def log(self, logger: logging.Logger, level: int, cause: Hashable, msg: str, *args: Any,
            fields: Mapping[str, Any] | None = None, exc_info: ExcInfo = None) -> bool:
        """Log this occurrence of ``cause`` now if it is the first of an interval (True), else
        count it for the cause's next summary (False)."""
        line = _Line(logger, level, msg, args, dict(fields or {}))
        now = self._clock()
        with self._lock:
            state = self._causes.get(cause)
            if state is None or (state.suppressed == 0 and now - state.started >= self.interval_s):
                self._remember(cause, _Cause(now))
                summary = None
            elif now - state.started >= self.interval_s:
                # No timer said it yet (no event loop here): this occurrence carries the count.
                summary = state.suppressed + 1
                self._restart(state, now)
            else:
                state.suppressed += 1
                state.last = line
                if state.timer is None:
                    state.timer = self._schedule(cause, state.started + self.interval_s - now)
                return False
        if summary is None:
            _emit(line, 1, exc_info)
        else:
            _emit(line, summary, None, self.interval_s)
        return True

    def flush(self) -> None:
        """Log the pending summary of every cause now (at shutdown)."""
        for cause in list(self._causes):
            self._flush(cause)

    def clear(self) -> None:
        """Forget every cause, pending counts included (a test's fresh start)."""
        with self._lock:
            for state in self._causes.values():
                if state.timer is not None:
                    state.timer.cancel()
            self._causes.clear()

    def _remember(self, cause: Hashable, state: _Cause) -> None:
        old = self._causes.pop(cause, None)
        if old is not None and old.timer is not None:
            old.timer.cancel()
        self._causes[cause] = state
        while len(self._causes) > self._max_causes:
            oldest = next(iter(self._causes))
            forgotten = self._causes.pop(oldest)
            if forgotten.timer is not None:
                forgotten.timer.cancel()

    def _restart(self, state: _Cause, now: float) -> None:
        state.started, state.suppressed, state.last = now, 0, None
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None

    def _schedule(self, cause: Hashable, delay_s: float) -> asyncio.TimerHandle | None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a thread without a loop: the next occurrence says the count
            return None
        return loop.call_later(max(0.0, delay_s), self._flush, cause)

    def _flush(self, cause: Hashable) -> None:
        with self._lock:
            state = self._causes.get(cause)
            if state is None or state.suppressed == 0 or state.last is None:
                return
            count, line = state.suppressed, state.last
            state.timer = None  # this is the timer's call (or shutdown's)
            self._restart(state, self._clock())
        _emit(line, count, None, self.interval_s)


def _emit(line: _Line, count: int, exc_info: ExcInfo, interval_s: float | None = None) -> None:
    fields = {**line.fields, "count": count}
    msg = line.msg
    if interval_s is not None:
        # A summary: how often the cause occurred since its last line, without a traceback.
        fields["repeat_interval_s"] = interval_s
        msg = f"{msg} (x{count} in the last {interval_s:g} s)"
    line.logger.log(line.level, msg, *line.args, exc_info=exc_info, extra={"fields": fields})


def cause_of(exc: BaseException) -> tuple[str, str]:
    """An exception's cause: its type and where it was raised (file:line of the innermost
    frame), so that one bug is one cause whatever its message says."""
    frames = traceback.extract_tb(exc.__traceback__)
    site = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
    return f"{type(exc).__module__}.{type(exc).__qualname__}", site


#: The process's rate limit, shared by every logger that uses it.
REPEATS = Repeats()


def log_repeated(logger: logging.Logger, level: int, cause: Hashable, msg: str, *args: Any,
                 fields: Mapping[str, Any] | None = None, exc_info: ExcInfo = None) -> bool:
    """``REPEATS.log``: the process-wide per-cause rate limit."""
    return REPEATS.log(logger, level, cause, msg, *args, fields=fields, exc_info=exc_info)


def log_failure(logger: logging.Logger, msg: str, exc: BaseException, *, event: str,
                expected: tuple[type[BaseException], ...] = (), level: int = logging.ERROR,
                fields: Mapping[str, Any] | None = None) -> bool:
    """One failure of something that runs again and again (a poll, a background round, a
    request): an ``expected`` one (an outage, the file system refusing) is one line with its
    reason and no traceback, anything else keeps its traceback; both once per cause per
    interval (``log_repeated``). Fields: ``event``, ``error`` (the exception's type), ``errno``
    for an ``OSError``."""
    doc: dict[str, Any] = {"event": event, "error": type(exc).__name__, **(fields or {})}
    if not isinstance(exc, expected):
        return log_repeated(logger, level, (event, *cause_of(exc)), msg, fields=doc,
                            exc_info=exc)
    reason = str(exc)
    if isinstance(exc, OSError):
        # strerror only: the exception's text names the file, which the cause does not need.
        doc["errno"] = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        reason = exc.strerror or type(exc).__name__
    return log_repeated(logger, level, (event, type(exc).__name__, doc.get("errno"), reason),
                        msg + ": %s", reason, fields=doc)
