"""The wire format for timestamps: ``clock.iso`` writes what datetime's isoformat writes."""

from __future__ import annotations

import datetime as dt

from hypothesis import example, given
from hypothesis import strategies as st

from service import clock


def _datetime_iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


@given(st.floats(min_value=-1e9, max_value=253_402_300_799.0, allow_nan=False))
@example(0.0)
@example(1_795_000_000.9999995)  # rounds up into the next second
@example(1_795_000_000.0009995)  # half-even at the microsecond
@example(-0.0000004)  # before the epoch: datetime's path
@example(253_402_300_799.999)  # the last representable millisecond
def test_iso_is_datetimes_isoformat(ts: float) -> None:
    assert clock.iso(ts) == _datetime_iso(ts)


@given(st.integers(min_value=1_700_000_000, max_value=1_900_000_000),
       st.integers(min_value=0, max_value=999_999))
def test_iso_of_current_times(seconds: int, micros: int) -> None:
    ts = seconds + micros / 1e6
    assert clock.iso(ts) == _datetime_iso(ts)


def test_none_stays_none_and_the_shape_is_rfc3339_utc_ms() -> None:
    assert clock.iso(None) is None
    assert clock.iso(1_795_000_000.5) == "2026-11-18T11:06:40.500Z"
