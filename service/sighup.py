"""SIGHUP: one signal handler per event loop, many reloaders (policies, identities).

``loop.add_signal_handler`` keeps one handler per signal, so each reloader registers a callback
here instead; a SIGHUP calls every callback registered on the running loop, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any

__all__ = ["on_sighup", "watching"]

_callbacks: dict[asyncio.AbstractEventLoop, list[Callable[[], None]]] = {}


@contextlib.contextmanager
def on_sighup(callback: Callable[[], None]) -> Iterator[None]:
    """While open, ``callback`` runs on the running loop at each SIGHUP (where signals work)."""
    loop = asyncio.get_running_loop()
    callbacks = _callbacks.setdefault(loop, [])
    if not callbacks:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGHUP, _dispatch, loop)
    callbacks.append(callback)
    try:
        yield
    finally:
        callbacks.remove(callback)
        if not callbacks:
            del _callbacks[loop]
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signal.SIGHUP)


@contextlib.asynccontextmanager
async def watching(
    poll: Callable[[], Coroutine[Any, Any, None]],
    reload: Callable[[], Coroutine[Any, Any, None]],
    interval_s: float,
) -> AsyncIterator[None]:
    """While open: ``poll()`` every ``interval_s`` (0 turns polling off) and ``reload()`` at each
    SIGHUP; both run as tasks of this context, cancelled when it closes. Each must handle (log)
    its own errors: an exception ends that poll loop or reload task."""
    tasks: set[asyncio.Task[None]] = set()

    async def poll_loop() -> None:
        while True:
            await asyncio.sleep(interval_s)
            await poll()

    if interval_s > 0:
        tasks.add(asyncio.create_task(poll_loop()))

    def on_signal() -> None:
        task = asyncio.create_task(reload())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    try:
        with on_sighup(on_signal):
            yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _dispatch(loop: asyncio.AbstractEventLoop) -> None:
    for callback in list(_callbacks.get(loop, ())):
        callback()
