"""The access log: one structured ``controlplane.access`` line per request.

aiohttp calls the runner's access logger once per response it finishes, after the middlewares
(and with them the correlation id's context variable) are done; so every field is read from
the request and the response, never from the logging context:

- ``correlation_id``: the id the correlation middleware attached to the request (the caller's
  well-formed ``X-Correlation-ID`` or a fresh one), else the one on the response (the edge's
  answers to unparseable heads make their own);
- ``method``, ``route`` (the matched route's template, ``/api/v1/tickets/{ticket_id}``, never
  the path with its values; ``null`` when no route matched), ``status``, ``duration_ms``,
  ``bytes`` (what was written for the response, head included);
- ``principal`` and ``principal_kind`` when the caller was authenticated.

A head the edge refuses before aiohttp parses it (over ``server.max_header_bytes``) has no
request; ``EdgeRequestHandler`` logs its line through ``log_refused``.
"""

from __future__ import annotations

import logging
from time import time as wall_time
from typing import Any

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_request import BaseRequest, Request
from aiohttp.web_response import StreamResponse

from . import clock
from .appkeys import CORRELATION_ID
from .authn.principal import PRINCIPAL
from .logs import MASK, JSONFormatter, direct_handler, encode_line, scrub, scrub_new
from .middleware.correlation import HEADER as CORRELATION_HEADER

__all__ = ["ACCESS_LOGGER", "AccessLogger", "access_fields"]

#: The logger every access line goes to.
ACCESS_LOGGER = "controlplane.access"


def _route(request: BaseRequest) -> str | None:
    if not isinstance(request, Request):
        return None  # the edge's answer to an unparseable head: no route was matched
    try:
        resource = request.match_info.route.resource
    except Exception:  # no match info at all
        return None
    return resource.canonical if resource is not None else None


def access_fields(request: BaseRequest, response: StreamResponse, seconds: float) -> dict[str, Any]:
    """The fields of the access line of ``request`` answered with ``response``."""
    cid = request.get(CORRELATION_ID) or response.headers.get(CORRELATION_HEADER)
    fields: dict[str, Any] = {
        "event": "http.request",
        "correlation_id": cid,
        "method": request.method,
        "route": _route(request),
        "status": response.status,
        "duration_ms": round(seconds * 1000, 3),
        "bytes": response.body_length,
    }
    principal = request.get(PRINCIPAL)
    if principal is not None and principal.is_authenticated:
        fields["principal"] = principal.subject_id
        fields["principal_kind"] = principal.kind
    return fields


#: The fields of an access line a ``logging.mask_fields`` setting may mask (``_line``).
_LINE_FIELDS = frozenset({"event", "correlation_id", "method", "route", "status", "duration_ms",
                          "bytes", "principal", "principal_kind"})
#: The members of a line that differ from request to request (besides ``ts``): a template's
#: copy takes them when none of them is masked (``_line``).
_VARYING = frozenset({"correlation_id", "duration_ms", "bytes"})


def _doc(logger: str, request: BaseRequest, response: StreamResponse, seconds: float,
         masks: frozenset[str], cid: Any, route: str | None) -> dict[str, Any]:
    """The document ``JSONFormatter.line`` writes for ``access_fields`` of this request, made
    without the fields' dict and the walk that masks it: the same members in the same order,
    each string scrubbed (those the caller controls: the correlation id, the method, the
    principal), the fields the formatter's ``masks`` name masked, the rest as they are
    (``tests/test_accesslog.py`` holds the two equal)."""
    method, status = request.method, response.status
    cid = scrub(str(cid)) if isinstance(cid, str) else cid
    doc: dict[str, Any] = {"ts": clock.iso(wall_time()), "level": "INFO", "logger": logger,
                           "msg": scrub(f"{method} {route or '-'} {status}")}
    if cid:
        doc["correlation_id"] = cid
    doc["event"] = "http.request"
    doc["correlation_id"] = cid
    doc["method"] = scrub(method)
    doc["route"] = None if route is None else scrub(route)
    doc["status"] = status
    doc["duration_ms"] = round(seconds * 1000, 3)
    doc["bytes"] = response.body_length
    principal = request.get(PRINCIPAL)
    if principal is not None and principal.is_authenticated:
        doc["principal"] = scrub(principal.subject_id)
        doc["principal_kind"] = scrub(principal.kind)
    if not masks.isdisjoint(_LINE_FIELDS):  # (none of them is secret by its name)
        for name in masks & _LINE_FIELDS & doc.keys():
            doc[name] = MASK
    return doc


#: (logger, method, route, status, masks, subject, kind) -> the document of an access line with
#: those members (``_doc``), its varying ones still to fill in: lines repeat all but those, so
#: the rest is made, scrubbed and masked once (bounded: emptied when full).
_TEMPLATES: dict[tuple[Any, ...], dict[str, Any]] = {}
_TEMPLATES_MAX = 1024


def _line(logger: str, request: BaseRequest, response: StreamResponse, seconds: float,
          masks: frozenset[str]) -> str:
    """The line ``JSONFormatter.line`` writes for ``access_fields`` of this request
    (``_doc``): from its template, with this request's time, correlation id, duration and
    bytes, where the line has an id and none of those is masked (every request the service
    answers has one); else made whole."""
    cid = request.get(CORRELATION_ID) or response.headers.get(CORRELATION_HEADER)
    route = _route(request)
    if type(cid) is not str or not cid or not masks.isdisjoint(_VARYING):
        return encode_line(_doc(logger, request, response, seconds, masks, cid, route))
    principal = request.get(PRINCIPAL)
    key = (logger, request.method, route, response.status, masks,
           None if principal is None else principal.subject_id,
           None if principal is None else principal.kind)
    template = _TEMPLATES.get(key)
    if template is None:
        if len(_TEMPLATES) >= _TEMPLATES_MAX:
            _TEMPLATES.clear()
        template = _TEMPLATES[key] = _doc(logger, request, response, seconds, masks, cid, route)
    doc = template.copy()  # (its members' order is the line's: a copy's updates keep it)
    doc["ts"] = clock.iso(wall_time())
    doc["correlation_id"] = scrub_new(cid)
    doc["duration_ms"] = round(seconds * 1000, 3)
    doc["bytes"] = response.body_length
    return encode_line(doc)


class AccessLogger(AbstractAccessLogger):
    """aiohttp's access logger, writing one structured record per request (the format string
    aiohttp passes is ignored)."""

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        handler = direct_handler(self.logger, logging.INFO)
        if handler is not None:  # the line as the record would give it, without the record
            formatter: JSONFormatter = handler.formatter  # type: ignore[assignment]
            masks = formatter.masks  # (direct_handler found this type: no cast() call)
            try:
                line = _line(self.logger.name, request, response, time, masks)
            except Exception:  # an access line must never break a response
                self.logger.exception("could not build the access line")
                return
            handler.queue(line)
            return
        try:
            fields = access_fields(request, response, time)
        except Exception:  # an access line must never break a response
            self.logger.exception("could not build the access line")
            return
        self.logger.info(
            "%s %s %d", fields["method"], fields["route"] or "-", fields["status"],
            extra={"correlation_id": fields["correlation_id"], "fields": fields},
        )

    def log_refused(self, status: int, correlation_id: str, written: int) -> None:
        """The line of a request head refused before it was parsed (no method, no route)."""
        fields = {"event": "http.request", "correlation_id": correlation_id, "method": None,
                  "route": None, "status": status, "duration_ms": None, "bytes": written}
        self.logger.info("- - %d", status, extra={"correlation_id": correlation_id,
                                                  "fields": fields})
