"""A fault-injecting TCP proxy between the service and PostgreSQL, for store-fault tests.

``FaultProxy(upstream_host, upstream_port)`` listens on 127.0.0.1 (a random port) and forwards
every connection to the upstream server (loopback only). Faults:

* ``stall()`` / ``flow()``: stop forwarding in both directions on every connection, new ones
  included, without closing anything (a network stall); ``flow()`` resumes.
* ``reset_after_commit(marker)``: the next transaction whose client bytes contain ``marker``
  has its ``COMMIT`` forwarded and the server's answer (``CommandComplete`` + ``ReadyForQuery``)
  passed back to the client; then that connection forwards nothing more and both sides are
  closed abruptly (RST): the transaction is committed and the client knows it, but whatever the
  client sends next on that connection (asyncpg resets a pooled connection on release) fails.
* ``lose_commit_answer(marker, delivered=True)``: the next transaction whose client bytes
  contain ``marker`` has its ``COMMIT`` forwarded (``delivered``) or not, and the server's answer
  never reaches the client: both sides are closed abruptly once the server answered (or at once,
  when the COMMIT was not forwarded). The client cannot know whether the transaction committed;
  with ``delivered`` it did, without it the server rolls it back.
* ``lose_answer(marker, delivered=True)``: the same for the next client message that contains
  ``marker`` itself (a statement that commits on its own, such as one call of a function).
* ``refuse()``: reset every new connection at once (the server is down).
* ``reset_all()``: close every open connection abruptly.

``with_proxy(dsn)`` rewrites a DSN to go through the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

__all__ = ["FaultProxy", "proxied", "with_proxy"]

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
# PostgreSQL's ReadyForQuery message: 'Z', length 5, status byte.
_READY = b"Z\x00\x00\x00\x05"


class _Pair:
    """One proxied connection: client <-> upstream."""

    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.client = client
        self.server = server
        self.txn = b""  # client bytes since the last BEGIN (bounded)
        self.commit_armed = False  # a marked transaction sent COMMIT: reset after its answer
        self.answer_lost = False  # the server's answers are dropped; reset after COMMIT's
        self.doomed = False  # forwards nothing more

    def abort(self) -> None:
        for writer in (self.client, self.server):
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    # Linger 0: close sends RST instead of FIN.
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        if upstream_host not in _LOOPBACK:
            raise ValueError("the fault proxy only forwards to a loopback server")
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._pairs: set[_Pair] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._marker: bytes | None = None
        # What a marked transaction's COMMIT meets: "reset" after its answer, or its answer
        # "lost" (COMMIT forwarded) / "unsent" (COMMIT not forwarded).
        self._fault = "reset"
        self._on_marker = False  # the marked message itself meets the fault, not a COMMIT
        self._refusing = False
        #: Connections reset after a COMMIT so far.
        self.resets = 0
        #: COMMITs whose answer never reached the client so far.
        self.lost_answers = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        self._flowing.set()
        if self._server is not None:
            self._server.close()
        for pair in list(self._pairs):
            pair.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    # -- faults
    def stall(self) -> None:
        self._flowing.clear()

    def flow(self) -> None:
        self._flowing.set()

    def reset_after_commit(self, marker: bytes) -> None:
        self._marker, self._fault, self._on_marker = marker, "reset", False

    def lose_commit_answer(self, marker: bytes, *, delivered: bool = True) -> None:
        self._marker, self._fault = marker, "lost" if delivered else "unsent"
        self._on_marker = False

    def lose_answer(self, marker: bytes, *, delivered: bool = True) -> None:
        self.lose_commit_answer(marker, delivered=delivered)
        self._on_marker = True

    def refuse(self) -> None:
        """Reset every new connection at once (the server is down)."""
        self._refusing = True

    def reset_all(self) -> None:
        for pair in list(self._pairs):
            pair.doomed = True
            pair.abort()

    # -- forwarding
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            _Pair(writer, writer).abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        pair = _Pair(writer, up_writer)
        self._pairs.add(pair)
        tasks = [asyncio.create_task(self._pump(pair, reader, up_writer, upstream=True)),
                 asyncio.create_task(self._pump(pair, up_reader, writer, upstream=False))]
        self._tasks.update(tasks)
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self._tasks.difference_update(tasks)
            self._pairs.discard(pair)
            for w in (writer, up_writer):
                w.transport.abort()

    async def _pump(self, pair: _Pair, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter, *, upstream: bool) -> None:
        while True:
            data = await reader.read(65536)
            if not data:
                writer.transport.abort()
                return
            await self._flowing.wait()
            if pair.doomed:
                return
            if upstream:
                fault = self._watch_client(pair, data)
                if fault == "unsent":
                    self.lost_answers += 1
                    pair.doomed = True
                    pair.abort()
                    return
                pair.answer_lost = fault == "lost"
            elif pair.answer_lost:
                if _READY in data:  # the server answered the COMMIT: the client never hears it
                    self.lost_answers += 1
                    pair.doomed = True
                    pair.abort()
                    return
                continue
            writer.write(data)
            await writer.drain()
            if not upstream and pair.commit_armed and _READY in data:
                # The client has the COMMIT's answer; give it a moment to read it, forward
                # nothing more, then reset both sides.
                pair.doomed = True
                self.resets += 1
                await asyncio.sleep(0.05)
                pair.abort()
                return

    def _watch_client(self, pair: _Pair, data: bytes) -> str | None:
        """The fault this client data meets, once it is a marked transaction's COMMIT."""
        if self._marker is None:
            return None
        if self._on_marker:
            if self._marker not in data:
                return None
            self._marker = None  # one shot
            return self._fault
        if b"BEGIN" in data:
            pair.txn = b""
        pair.txn = (pair.txn + data)[-65536:]
        if b"COMMIT" in data and self._marker in pair.txn:
            self._marker = None  # one shot
            if self._fault == "reset":
                pair.commit_armed = True
                return None
            return self._fault
        return None


def with_proxy(dsn: str, port: int) -> str:
    parts = urlsplit(dsn)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


@asynccontextmanager
async def proxied(dsn: str) -> AsyncIterator[tuple[FaultProxy, str]]:
    """A started proxy in front of ``dsn``'s server and the DSN that goes through it."""
    parts = urlsplit(dsn)
    proxy = FaultProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    await proxy.start()
    try:
        yield proxy, with_proxy(dsn, proxy.port)
    finally:
        await proxy.close()
