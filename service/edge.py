"""The HTTP edge: what happens on a connection before any middleware runs.

aiohttp parses request heads in its protocol (``web_protocol.RequestHandler``) and, by default,
answers a head it cannot parse with a plain-text 400 that quotes the offending header line (a
bearer token included), logs that line with a traceback at ERROR, and names Python's and
aiohttp's versions in ``Server``. It bounds each header field and the number of fields, not
their sum, and waits for a head as long as the keep-alive timer allows. Here:

- A head the parser refuses (CR, LF or NUL inside a field, a bad request line, a field longer
  than ``MAX_HEADER_FIELD_BYTES``, more than ``server.max_header_fields`` fields) is answered
  with an ``application/problem+json`` (400 ``bad_request``, or 431
  ``header_fields_too_large``) that echoes nothing of the request, with ``Server:
  controlplane``, the security headers and a fresh correlation id; it is logged as one WARNING
  line naming the error's class (never its text: it quotes the header line) and that id.
- A head is bounded in bytes (``server.max_header_bytes``, request line and fields): past it
  the connection is answered 431 and closed without reading on.
- A connection that has not sent a complete head ``server.header_timeout_s`` seconds after
  connecting, or after its previous response, is closed. That is aiohttp's keep-alive timer
  (it runs from the connection's start and from each response, and closes a connection still
  waiting for a head), set to that value in ``create_app``'s ``handler_args``; so the same
  value is also the idle keep-alive timeout. It works with any runner.

The first two need aiohttp's protocol subclassed, which aiohttp lets only a runner do:
``cpctl serve`` serves through ``EdgeRunner``, and so do the tests of this behaviour.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, BadHttpMethod, LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from .accesslog import ACCESS_LOGGER, AccessLogger
from .config import CONFIG
from .errors import (
    PROBLEM_CONTENT_TYPE,
    BadRequest,
    InternalError,
    Problem,
    RequestHeaderFieldsTooLarge,
    problem_response,
)
from .middleware.correlation import HEADER as CORRELATION_HEADER
from .middleware.headers import edge_headers
from .repeats import cause_of, log_repeated

__all__ = ["EdgeRequestHandler", "EdgeRunner", "EdgeServer"]

log = logging.getLogger("controlplane.edge")

#: One header field (name and value) may be this long: an oversized bearer token still reaches
#: the token verifier (which caps tokens at 8 KiB) and gets its 401 problem. The sum of all
#: fields is bounded by ``server.max_header_bytes``.
MAX_HEADER_FIELD_BYTES = 128 * 1024
#: After a refused head: how long, and how many more bytes, the connection is read and
#: discarded before it is closed. Closing a socket with unread data resets the connection,
#: and the reset can make the client lose the 431 it was sent; lingering briefly lets the
#: answer arrive (nginx's lingering close), within a small bound.
LINGER_S = 1.0
LINGER_BYTES = 1024 * 1024


def _problem(status: int, exc: BaseException | None) -> Problem:
    if status >= 500:
        return InternalError("an unexpected error occurred; quote the correlation id when "
                             "reporting it")
    if isinstance(exc, LineTooLong) or (
        isinstance(exc, BadHttpMessage) and "too many headers" in exc.message.lower()
    ):
        return RequestHeaderFieldsTooLarge("the request line or header fields exceed the "
                                           "server's limits")
    return BadRequest("the request is not well-formed HTTP/1.1")


def _raw_response(problem: Problem, correlation_id: str) -> bytes:
    """A whole HTTP/1.1 response with a problem body, for a connection about to be closed."""
    body = json.dumps(problem.body(correlation_id)).encode()
    headers = {
        "Content-Type": PROBLEM_CONTENT_TYPE,
        "Content-Length": str(len(body)),
        "Connection": "close",
        CORRELATION_HEADER: correlation_id,
        **edge_headers(),
    }
    head = f"HTTP/1.1 {problem.status} {HTTPStatus(problem.status).phrase}\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in headers.items()
    )
    return head.encode("ascii") + b"\r\n" + body


class EdgeRequestHandler(RequestHandler):
    """aiohttp's protocol with problem answers to bad heads and a bound on a head's bytes."""

    __slots__ = ("_discard", "_head_bytes", "_max_head_bytes")

    def __init__(self, manager: web.Server, *, max_head_bytes: int, **kwargs: Any):
        super().__init__(manager, **kwargs)
        self._max_head_bytes = max_head_bytes
        self._head_bytes = 0
        self._discard: int | None = None  # bytes still to read and drop before closing

    def data_received(self, data: bytes) -> None:
        if self._discard is not None:
            self._discard -= len(data)
            if self._discard < 0:
                self.force_close()
            return
        waiter = self._waiter
        if (waiter is not None and not waiter.done() and self._payload_parser is None
                and not self._upgraded and not self._force_close and not self._close):
            # Waiting for a request head: everything received now belongs to it. (Bytes that
            # arrive while a request is handled are its body, or a pipelined head that the
            # parser's per-field and field-count limits still bound.)
            self._head_bytes += len(data)
            if self._head_bytes > self._max_head_bytes:
                self._refuse_head()
                return
        super().data_received(data)
        if self._waiter is None or self._waiter.done():
            self._head_bytes = 0  # a head is complete (or none is being waited for)

    def _refuse_head(self) -> None:
        cid = str(uuid.uuid4())
        log.warning("request head over %d bytes from %s: answered 431, connection closed",
                    self._max_head_bytes, self._peer(), extra={"correlation_id": cid})
        transport = self.transport
        if transport is None:
            return
        raw = _raw_response(RequestHeaderFieldsTooLarge(
            f"the request head exceeds {self._max_head_bytes} bytes"), cid)
        transport.write(raw)
        if isinstance(self.access_logger, AccessLogger):
            self.access_logger.log_refused(431, cid, len(raw))
        if not transport.can_write_eof():
            self.force_close()
            return
        transport.write_eof()  # the answer, then FIN; what the client still sends is dropped
        self._discard = LINGER_BYTES
        self._loop.call_later(LINGER_S, self.force_close)

    def _peer(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        return str(peer[0]) if isinstance(peer, (tuple, list)) and peer else "unknown"

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A problem+json instead of aiohttp's text (which quotes the header line)."""
        cid = str(uuid.uuid4())
        problem = _problem(status, exc)
        fields = {"correlation_id": cid}
        if status >= 500:
            # A handler or a middleware outside ``problems`` raised: a bug, with its traceback
            # (scrubbed like every log line).
            log_repeated(log, logging.ERROR,
                         ("http.unhandled", *(cause_of(exc) if exc is not None else ("?", "?"))),
                         "unhandled error while serving a request", exc_info=exc,
                         fields={"event": "http.unhandled", "correlation_id": cid})
        elif isinstance(exc, BadHttpMethod) and self._request_count == 1:
            # Not HTTP at all (TLS on this port, a scanner): common, and no one's mistake here.
            log.debug("not an HTTP request from %s", request.remote, extra=fields)
        else:
            log.warning("unparseable request head from %s answered %d %s (%s)", request.remote,
                        problem.status, problem.instance_code, type(exc).__name__, extra=fields)
        if request.writer.output_size > 0:
            raise ConnectionError("a response was already sent; cannot send the error")
        response = problem_response(problem, cid)
        response.headers.update(edge_headers())
        response.headers[CORRELATION_HEADER] = cid
        response.force_close()
        return response


class EdgeServer(web.Server):
    """aiohttp's connection factory, making ``EdgeRequestHandler`` protocols."""

    def __init__(self, *args: Any, max_head_bytes: int, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.max_head_bytes = max_head_bytes

    def __call__(self) -> RequestHandler:
        return EdgeRequestHandler(self, loop=self._loop, max_head_bytes=self.max_head_bytes,
                                  **self._kwargs)


class EdgeRunner(web.AppRunner):
    """``web.AppRunner`` whose server is an ``EdgeServer`` (limits from the app's CONFIG),
    logging one structured ``controlplane.access`` line per request (``service.accesslog``)
    unless given ``access_log=None``."""

    def __init__(self, app: web.Application, **kwargs: Any):
        kwargs.setdefault("access_log_class", AccessLogger)
        kwargs.setdefault("access_log", logging.getLogger(ACCESS_LOGGER))
        super().__init__(app, **kwargs)

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()  # starts the app; kwargs include handler_args
        return EdgeServer(
            server.request_handler,
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            loop=asyncio.get_running_loop(),
            max_head_bytes=self.app[CONFIG].server.max_header_bytes,
            **server._kwargs,
        )
