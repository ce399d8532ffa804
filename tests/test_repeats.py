"""The per-cause rate limit of log lines (service/repeats.py), with a clock the test moves."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from service.repeats import Repeats, cause_of, log_failure

LOGGER = logging.getLogger("controlplane.test.repeats")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, dict[str, Any], bool]]:
    return [(r.getMessage(), dict(r.fields), r.exc_info is not None)  # type: ignore[attr-defined]
            for r in caplog.records if r.name == LOGGER.name]


def boom() -> ValueError:
    try:
        raise ValueError("boom")
    except ValueError as exc:
        return exc


def test_the_first_occurrence_then_one_counted_line_per_interval(caplog):
    """Without an event loop (a worker thread): the first occurrence is logged with its
    traceback; the next one after the interval says how many there were, without one."""
    caplog.set_level(logging.INFO, LOGGER.name)
    clock = Clock()
    repeats = Repeats(10.0, clock=clock)
    exc = boom()
    logged = [repeats.log(LOGGER, logging.ERROR, "c", "failed: %s", "x",
                          fields={"event": "e"}, exc_info=exc) for _ in range(500)]
    assert logged.count(True) == 1 and logged[0]
    clock.now += 10.0
    assert repeats.log(LOGGER, logging.ERROR, "c", "failed: %s", "x", fields={"event": "e"},
                       exc_info=exc)
    assert lines(caplog) == [
        ("failed: x", {"event": "e", "count": 1}, True),
        ("failed: x (x500 in the last 10 s)", {"event": "e", "count": 500,
                                              "repeat_interval_s": 10.0}, False),
    ]
    # Quiet for an interval: the next occurrence is a first one again.
    clock.now += 30.0
    assert repeats.log(LOGGER, logging.ERROR, "c", "failed: %s", "x", exc_info=exc)
    assert lines(caplog)[-1] == ("failed: x", {"count": 1}, True)


def test_causes_are_counted_apart(caplog):
    caplog.set_level(logging.INFO, LOGGER.name)
    repeats = Repeats(10.0, clock=Clock())
    for _ in range(3):
        repeats.log(LOGGER, logging.WARNING, ("a", 1), "a")
        repeats.log(LOGGER, logging.WARNING, ("b", 1), "b")
    assert [m for m, _, _ in lines(caplog)] == ["a", "b"]


async def test_on_the_event_loop_a_timer_says_the_count_when_the_interval_ends(caplog):
    caplog.set_level(logging.INFO, LOGGER.name)
    repeats = Repeats(0.2)
    for _ in range(50):
        repeats.log(LOGGER, logging.ERROR, "c", "accept failed", fields={"event": "e"})
    assert len(lines(caplog)) == 1
    for _ in range(100):  # generous: the timer fires 0.2 s after the first occurrence
        await asyncio.sleep(0.05)
        if len(lines(caplog)) == 2:
            break
    assert lines(caplog)[1][1]["count"] == 49  # the flood stopped: its count is still said


def test_occurrences_from_threads_are_all_counted(caplog):
    caplog.set_level(logging.INFO, LOGGER.name)
    clock = Clock()
    repeats = Repeats(10.0, clock=clock)

    def flood() -> None:
        for _ in range(1000):
            repeats.log(LOGGER, logging.ERROR, "c", "x")

    threads = [threading.Thread(target=flood) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    clock.now += 10.0
    repeats.log(LOGGER, logging.ERROR, "c", "x")
    assert [f["count"] for _, f, _ in lines(caplog)] == [1, 4000]


def test_flush_says_every_pending_count():
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("controlplane.test.repeats.flush")
    logger.addHandler(handler := Keep())
    try:
        repeats = Repeats(10.0, clock=Clock())
        for _ in range(7):
            repeats.log(logger, logging.ERROR, "c", "x")
        repeats.flush()
        repeats.flush()  # nothing more to say
    finally:
        logger.removeHandler(handler)
    assert [r.fields["count"] for r in records] == [1, 6]  # type: ignore[attr-defined]


def test_the_cause_of_an_exception_is_its_type_and_where_it_was_raised():
    kind, site = cause_of(boom())
    raised_at = boom.__code__.co_firstlineno + 2  # the raise statement
    assert kind == "builtins.ValueError" and site == f"{__file__}:{raised_at}"
    assert cause_of(boom()) == cause_of(boom())  # one bug, one cause


def test_an_expected_failure_has_no_traceback_and_an_unexpected_one_keeps_it(caplog):
    caplog.set_level(logging.INFO, LOGGER.name)
    emfile = OSError(24, "Too many open files", "/etc/policies")
    for _ in range(3):
        log_failure(LOGGER, "reload failed", emfile, event="reload.failed", expected=(OSError,))
        log_failure(LOGGER, "reload failed", boom(), event="reload.failed", expected=(OSError,))
    assert lines(caplog) == [
        ("reload failed: Too many open files",
         {"event": "reload.failed", "error": "OSError", "errno": "EMFILE", "count": 1}, False),
        ("reload failed", {"event": "reload.failed", "error": "ValueError", "count": 1}, True),
    ]
