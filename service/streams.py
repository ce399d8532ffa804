"""Live streams (server-sent events): how many may be open, and their end on shutdown.

Every open stream costs a connection and a store poll several times a second, so streams are
capped per principal (subject) and per worker (``server.streams``); one more is a 429
``too_many_streams``. A slot is taken in the handler's Execute step (so the refusal is
audited like any other answer) and given back when the request's handling task ends, however
it ends. On shutdown (``on_shutdown``, before aiohttp waits out the grace period for open
requests) every stream is told to stop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from aiohttp import web

from . import clock
from .appkeys import AUTHENTICATOR, CORRELATION_ID, STREAMS
from .authn.errors import AuthnError
from .config import StreamsConfig
from .errors import TooManyStreams
from .middleware.authn import bearer_token
from .middleware.headers import apply_security_headers
from .store.base import StoreError

__all__ = ["Slot", "StreamSlots", "event_stream_response", "session_alive", "setup_streams"]

log = logging.getLogger("controlplane.streams")

#: Seconds a refused client is asked to wait (streams end on their own within minutes).
RETRY_AFTER_S = 10


class Slot:
    """One open stream's place; ``release`` is idempotent."""

    __slots__ = ("_released", "_slots", "subject")

    def __init__(self, slots: StreamSlots, subject: str):
        self._slots, self.subject, self._released = slots, subject, False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._slots._release(self.subject)


class StreamSlots:
    """Open streams of this worker, per subject and in total."""

    def __init__(self, config: StreamsConfig):
        self.config = config
        self._per_subject: Counter[str] = Counter()
        self._total = 0
        self.stopping = False

    @property
    def total(self) -> int:
        return self._total

    def open_for(self, subject: str) -> int:
        return self._per_subject[subject]

    def acquire(self, subject: str) -> Slot:
        """Take a slot for ``subject``, held until the current task (the request's handling)
        ends; raises ``TooManyStreams`` over either cap."""
        if self._per_subject[subject] >= self.config.max_per_principal:
            raise TooManyStreams(RETRY_AFTER_S, f"at most {self.config.max_per_principal} live "
                                 "streams per principal; close one or retry later")
        if self._total >= self.config.max_total:
            raise TooManyStreams(RETRY_AFTER_S, "this server has as many live streams open as "
                                 "it serves; retry later")
        self._per_subject[subject] += 1
        self._total += 1
        slot = Slot(self, subject)
        task = asyncio.current_task()
        if task is not None:
            task.add_done_callback(lambda _task: slot.release())
        return slot

    def _release(self, subject: str) -> None:
        self._total -= 1
        self._per_subject[subject] -= 1
        if self._per_subject[subject] <= 0:
            del self._per_subject[subject]

    async def stop(self, _app: web.Application) -> None:
        """``on_shutdown``: every open stream ends at its next poll."""
        self.stopping = True


def setup_streams(app: web.Application, config: StreamsConfig) -> None:
    """STREAMS, and its stop on shutdown."""
    slots = StreamSlots(config)
    app[STREAMS] = slots
    app.on_shutdown.append(slots.stop)


def event_stream_response(request: web.Request) -> web.StreamResponse:
    """A ``text/event-stream`` response with the security and correlation headers set.

    The stream prepares it itself, so the middlewares cannot add their headers afterwards.
    """
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "X-Accel-Buffering": "no",
                                           "X-Correlation-ID": request[CORRELATION_ID]})
    apply_security_headers(request, response)
    return response


async def session_alive(request: web.Request) -> bool:
    """The stream's bearer token still authenticates (its session not logged out or expired)."""
    token = bearer_token(request)
    if token is None:
        return False
    try:
        await request.app[AUTHENTICATOR].authenticate_bearer(token, clock.now())
    except AuthnError:
        return False
    except StoreError:
        log.warning("event stream ended: its session cannot be checked (store unavailable)")
        return False
    return True
