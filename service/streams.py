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
from collections.abc import Awaitable, Callable

from aiohttp import web

from . import clock, deadline
from .appkeys import CORRELATION_ID
from .authn.errors import AuthnError
from .authn.sessions import AUTHENTICATOR
from .config import StreamsConfig
from .errors import TooManyStreams
from .middleware.authn import bearer_token
from .middleware.headers import apply_security_headers
from .store.base import StoreError

__all__ = [
    "SESSION_ENDED",
    "STREAMS",
    "Slot",
    "StreamSlots",
    "StreamWrite",
    "event_stream_response",
    "pump",
    "session_alive",
    "setup_streams",
]

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


#: Open live streams (SSE), capped per principal and per worker; told to stop on shutdown.
STREAMS: web.AppKey[StreamSlots] = web.AppKey("streams")


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


#: Writes one event (or comment) to an open stream.
StreamWrite = Callable[[bytes], Awaitable[None]]
#: The ``event: end`` data of a stream whose session was logged out or expired.
SESSION_ENDED = b'{"reason":"session_ended"}'


async def pump(
    request: web.Request,
    response: web.StreamResponse,
    poll: Callable[[StreamWrite], Awaitable[bytes | None]],
    *,
    label: str,
    poll_s: float,
    max_s: float,
    alive: Callable[[], Awaitable[bool]] | None = None,
) -> web.StreamResponse:
    """Prepare ``response`` and keep it fed until the stream should end: the one loop of every
    live stream (tickets, tasks, the console's pages).

    Every ``poll_s``, ``poll(write)`` re-reads the store, writes what changed, and returns None
    to go on or the data of the closing ``event: end``. Reading the store each time is what lets
    a change made through any worker or replica show. The stream also ends when ``alive()``
    (default: the bearer token's session, ``session_alive``) says the session ended
    (``event: end`` with ``SESSION_ENDED``), and just closes after ``max_s``, when the client is
    gone, the store fails (logged) or the server shuts down: an ``EventSource`` reconnects by
    itself. A comment line keeps a quiet stream open every ``heartbeat_s``. A client that goes
    away is normal: nothing is logged above debug."""
    with deadline.unbounded():  # each poll has its own store deadline, for minutes on end
        return await _pump(request, response, poll, label=label, poll_s=poll_s, max_s=max_s,
                           alive=alive)


async def _pump(
    request: web.Request,
    response: web.StreamResponse,
    poll: Callable[[StreamWrite], Awaitable[bytes | None]],
    *,
    label: str,
    poll_s: float,
    max_s: float,
    alive: Callable[[], Awaitable[bool]] | None,
) -> web.StreamResponse:
    slots = request.app[STREAMS]
    heartbeat_s, check_s = slots.config.heartbeat_s, slots.config.session_check_s
    loop = asyncio.get_running_loop()
    last_beat = loop.time()

    async def write(data: bytes) -> None:
        nonlocal last_beat
        await response.write(data)
        last_beat = loop.time()

    try:
        await response.prepare(request)
        started = last_check = loop.time()
        end: bytes | None = None
        while end is None and not slots.stopping:
            now = loop.time()
            if now - started >= max_s or request.transport is None or (
                    request.transport.is_closing()):
                break
            if now - last_check >= check_s:
                last_check = now
                if not await (alive() if alive is not None else session_alive(request)):
                    end = SESSION_ENDED
                    break
            try:
                end = await poll(write)
            except StoreError:
                log.warning("%s ended: store unavailable", label)
                break
            if end is None:
                if loop.time() - last_beat >= heartbeat_s:
                    await write(b": heartbeat\n\n")
                await asyncio.sleep(poll_s)
        if end is not None:
            await response.write(b"event: end\ndata: " + end + b"\n\n")
        await response.write_eof()
    except ConnectionError:  # aiohttp's ClientConnectionResetError included
        log.debug("%s: the client went away", label)
    return response
