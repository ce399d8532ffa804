"""SIGHUP: one signal handler per event loop, many reloaders (policies, identities).

``loop.add_signal_handler`` keeps one handler per signal, so each reloader registers a callback
here instead; a SIGHUP calls every callback registered on the running loop, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator

__all__ = ["on_sighup"]

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


def _dispatch(loop: asyncio.AbstractEventLoop) -> None:
    for callback in list(_callbacks.get(loop, ())):
        callback()
