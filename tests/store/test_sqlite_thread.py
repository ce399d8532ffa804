"""The SQLite writer's thread (``store.sqlite._Thread``): calls in order, answered on the loop; a
call whose caller left before the thread took it never runs (the write batch relies on it: a
BEGIN given up while another process held the lock must not run later); a runner nobody
stopped ends its thread once it is collected."""

from __future__ import annotations

import asyncio
import gc
import threading

import pytest

from service.store.sqlite import _Thread


async def test_calls_run_in_order_and_answer_with_their_result_or_exception() -> None:
    runner = _Thread()
    try:
        seen: list[int] = []
        calls = [runner.call(lambda i=i: seen.append(i) or i) for i in range(5)]
        assert await asyncio.gather(*calls) == [0, 1, 2, 3, 4]
        assert seen == [0, 1, 2, 3, 4]

        def boom() -> None:
            raise ValueError("refused")

        with pytest.raises(ValueError, match="refused"):
            await runner.call(boom)
        assert runner.taken == 6
    finally:
        runner.stop()


async def test_a_call_cancelled_before_the_thread_takes_it_never_runs() -> None:
    runner = _Thread()
    try:
        release, ran = threading.Event(), []
        busy = runner.call(lambda: release.wait(10))
        queued = runner.call(lambda: ran.append("queued"))
        await asyncio.sleep(0.05)  # the thread is inside the first call
        queued.cancel()
        release.set()
        assert await busy is True
        after = runner.call(lambda: ran.append("after"))
        await after
        assert ran == ["after"]  # the cancelled one was skipped, the next one ran
        assert runner.taken == 3  # a skipped call is taken off the queue all the same
    finally:
        runner.stop()


async def test_a_call_cancelled_while_it_runs_finishes_and_its_answer_is_dropped() -> None:
    runner = _Thread()
    try:
        started, release, ran = threading.Event(), threading.Event(), []

        def slow() -> str:
            started.set()
            release.wait(10)
            ran.append("slow")
            return "late"

        running = runner.call(slow)
        await asyncio.to_thread(started.wait, 10)
        running.cancel()
        release.set()
        assert await runner.call(lambda: "next") == "next"
        assert ran == ["slow"] and running.cancelled()
    finally:
        runner.stop()


async def test_a_runner_nobody_stopped_ends_its_thread_once_collected() -> None:
    runner = _Thread()
    assert await runner.call(lambda: 1) == 1
    thread = runner._thread
    del runner
    gc.collect()
    await asyncio.to_thread(thread.join, 10)
    assert not thread.is_alive()
