"""The wire format for timestamps: ``clock.iso`` writes what datetime's isoformat writes."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

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


SERVICE = Path(__file__).resolve().parent.parent / "service"

#: What formats a time as text, anywhere but ``clock.iso``.
_FORMATTERS = re.compile(
    r"(?<!from)isoformat\(|strftime\(|gmtime\(|localtime\(|ctime\(|formatdate\(|format_datetime\("
    r"|fromtimestamp\(|utcfromtimestamp\(")

#: Formatting that is not a time the service stamps, each with why: (file, line's text).
_NOT_A_TIMESTAMP = {
    # A waiver's ``expires`` as the compose file wrote it (a YAML date may have no time of
    # day): the user's value kept as text for the preflight to parse, not a time we write.
    ("compose/normalize.py", "raw = raw.isoformat()"),
}


def test_clock_iso_is_the_only_time_formatter() -> None:
    """A second formatter drifts (the engine's status wrote whole seconds and ``+00:00`` while
    everything else wrote milliseconds and ``Z``): every time written as text goes through
    ``clock.iso``."""
    found = set()
    for path in SERVICE.rglob("*.py"):
        name = str(path.relative_to(SERVICE))
        if name == "clock.py":
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if _FORMATTERS.search(line):
                found.add((name, line.strip()))
    assert found >= _NOT_A_TIMESTAMP, "the allow-list names a line that is gone"
    assert found == _NOT_A_TIMESTAMP, sorted(found - _NOT_A_TIMESTAMP)


def test_the_scan_sees_a_formatter() -> None:
    assert _FORMATTERS.search('datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")')
    assert _FORMATTERS.search('time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(value))')
    assert not _FORMATTERS.search("datetime.fromisoformat(text)")
