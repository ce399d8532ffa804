"""Time: one clock for the service, and the one wire format for timestamps (RFC 3339, UTC, ms)."""

from __future__ import annotations

import datetime as _dt
import functools
import math
import time
from collections.abc import Callable
from typing import overload

__all__ = ["iso", "now"]

# The last second representable by the wire format (9999-12-31T23:59:59Z); beyond it, and
# before the epoch, iso takes datetime's path (which also refuses what it cannot represent).
_LAST_SECOND = 253_402_300_799


#: Unix seconds. Stores never read the clock; requests read it once and pass it down.
#: ``time.time`` itself, not a function that calls it: a frame fewer, a few times a request.
now: Callable[[], float] = time.time


@overload
def iso(ts: float) -> str: ...
@overload
def iso(ts: None) -> None: ...
@overload
def iso(ts: float | None) -> str | None: ...


def iso(ts: float | None) -> str | None:
    """``2026-11-22T05:07:14.123Z`` (None stays None): the one formatter of a time as text, for
    the API, the logs, the decision log and the CLI alike (``tests/test_clock.py`` refuses another).

    The same text as ``datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")``
    with ``Z`` for ``+00:00`` (a property test holds them equal): the microseconds are rounded
    half-even as datetime rounds them, the milliseconds truncated as isoformat truncates them,
    and the whole second is formatted once per second (``_second``), each millisecond's text
    once (``_MILLIS``); a request stamps several records and log lines, so this was ~3% of an
    authorized read's event-loop time."""
    if ts is None:
        return None
    frac, whole = math.modf(ts)
    micros = round(frac * 1e6)
    if micros >= 1_000_000:
        whole += 1.0
        micros -= 1_000_000
    elif micros < 0:
        whole -= 1.0
        micros += 1_000_000
    if not 0 <= whole <= _LAST_SECOND:
        stamp = _dt.datetime.fromtimestamp(ts, _dt.UTC).isoformat(timespec="milliseconds")
        return stamp.replace("+00:00", "Z")
    return _second(int(whole)) + _MILLIS[micros // 1000]


#: ``.000Z`` .. ``.999Z``: a time's milliseconds as text, formatted once (the format spec was
#: half of ``iso``'s cost, which a request pays twice: 1.57 -> 0.96 us).
_MILLIS = tuple(f".{ms:03d}Z" for ms in range(1000))


@functools.lru_cache(maxsize=8)
def _second(epoch: int) -> str:
    """``YYYY-MM-DDTHH:MM:SS`` (UTC) of a whole second: formatted once per second."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch))
