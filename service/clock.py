"""Time: one clock for the service, and the one wire format for timestamps (RFC 3339, UTC, ms)."""

from __future__ import annotations

import datetime as _dt
import time

__all__ = ["iso", "now"]


def now() -> float:
    """Unix seconds. Stores never read the clock; requests read it once and pass it down."""
    return time.time()


def iso(ts: float | None) -> str | None:
    """``2026-11-22T05:07:14.123Z`` (None stays None)."""
    if ts is None:
        return None
    stamp = _dt.datetime.fromtimestamp(ts, _dt.UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")
