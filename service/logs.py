"""Structured JSON logs on stderr, with the request's correlation id and secrets masked.

Every record becomes one JSON object per line: ``ts``, ``level``, ``logger``, ``msg``, the
correlation id of the request being served (a context variable set by the correlation
middleware) and any ``extra={"fields": {...}}`` the caller attached. Field names that look like
secrets (token, password, secret, otp, nonce, dsn, authorization, ...) are masked whatever
the caller passes, and configured names can be added (``logging.mask_fields``).

Text is scrubbed too, in every string the formatter writes (the message, the traceback in
``exc``, stack info, every field value): credentials in URLs, ``Authorization``/``Cookie``
header values, ``Bearer`` tokens, JWS compact tokens (``eyJ...``), ``name=value`` or
``name: value`` pairs whose name is a secret field name, and a command line's secret options
with their values (``--password VALUE``, ``--api-key 'VALUE'``); a quoted value is masked
whole. Library loggers that may log request data (aiohttp's) also get a filter that scrubs
their records in place, so that no handler (a test's log capture included) ever sees the
clear text.

A record may name its correlation id itself (``extra={"correlation_id": ...}``): the access
log (``service.accesslog``, one ``controlplane.access`` line per request) and the edge do,
because they log outside the middleware's context. Domain events carry a stable ``event``
field (``http.request``, ``approval.ticket_requested``, ``store.unavailable``, ...).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import re
import sys
import traceback
from collections.abc import Iterable
from typing import Any

from . import clock, jsontext
from .redaction import SECRET_BY_NAME, SECRET_WORDS, is_secret_field

__all__ = ["ScrubFilter", "configure", "correlation_id_var", "install_scrubbing", "mask", "scrub",
           "scrub_new"]

correlation_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "correlation_id", default=None
)

MASK = "***"

# URLs with credentials (scheme://user:pass@host) are masked wherever they appear in text.
_URL_CREDENTIALS = re.compile(r"([a-z][a-z0-9+.-]*://)([^/@\s:]+):([^/@\s]+)@", re.IGNORECASE)
# Header lines whose whole value is a credential: everything up to the end of the line or of
# the quoted string holding it (a header line in an exception message is a bytes repr, in
# which a CR, LF or NUL is spelled \r, \n or \x00 and does not end the value).
_CREDENTIAL_HEADER = re.compile(
    r"\b((?:proxy-)?authorization|(?:set-)?cookie)(\s*[\"']?\s*[:=]\s*[\"']?)[^\n\"']*",
    re.IGNORECASE,
)
# An HTTP authentication scheme followed by its credentials, anywhere.
_SCHEME_CREDENTIALS = re.compile(r"\b(bearer|basic|digest)\s+[^\s\"',;]+", re.IGNORECASE)
# JWS/JWE compact serialisations: a base64url JSON header ("eyJ") and at least one more part.
_JOSE = re.compile(r"\beyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_.-]*")
# A value: quoted (to its closing quote on the same line, or to the end of the line when it
# has none: a quoted secret is masked whole, spaces included) or a bare run of characters.
_VALUE = r"(?P<value>\"(?:[^\"\\\n]|\\.)*\"?|'(?:[^'\\\n]|\\.)*'?|[^\s\"'&,;)}\]]+)"
# name=value / name: value / "name": "value" where the name is a secret field name.
_NAMED_VALUE = re.compile(r"(?P<name>[A-Za-z][A-Za-z0-9_.-]*)(?P<sep>[\"']?\s*[:=]\s*)" + _VALUE)
# A command line's secret option and its value, space-separated: --password VALUE, --api-key VALUE.
_FLAG_VALUE = re.compile(r"(?<![\w-])(?P<name>--?[A-Za-z][A-Za-z0-9_.-]*)(?P<sep>[ \t]+)" + _VALUE)


def _named(match: re.Match[str]) -> str:
    """A secret name's value masked, its quotes kept (``name=value`` and ``--name value``)."""
    value = match["value"]
    if not is_secret_field(match["name"].lstrip("-")) or value.strip("\"'") == MASK:
        return match[0]
    quote = value[0] if value[0] in "\"'" else ""
    return f"{match['name']}{match['sep']}{quote}{MASK}{quote}"


# Every pattern above needs one of these substrings to match at all (a URL with credentials its
# "://", a named value a secret word of its name, an API or private key the word "key"): text
# without any of them has nothing to scrub, which is most text, so it is returned unread by the
# six patterns (a property test holds the two paths equal: tests/test_logs.py). The patterns
# ignore case, so the text is case-folded first (a search with IGNORECASE costs ~8x more).
_MAY_HOLD_SECRET = re.compile("|".join(sorted(
    {"://", "authorization", "cookie", "bearer", "basic", "digest", "eyj", "key", *SECRET_WORDS},
    key=len, reverse=True)))


# Cheaper still, and first: every pattern also needs a separator (a named value or header its
# ":" or "=", a URL its "://", a scheme's credentials whitespace, a JWS its "."). Ids, names,
# routes and results have none.
_SEPARATOR = re.compile(r"[\s:=.]")


def scrub(text: str) -> str:
    """``text`` with every credential-looking substring replaced by ``***``."""
    if text in _CLEAN:
        return text
    if _SEPARATOR.search(text) is None or _MAY_HOLD_SECRET.search(text.casefold()) is None:
        _remember_clean(text)
        return text
    return _scrub_patterns(text)


def scrub_new(text: str) -> str:
    """``scrub`` for a text that does not repeat (a request's correlation id): the same answer,
    without looking it up among, or adding it to, the texts remembered clean."""
    if _SEPARATOR.search(text) is None:
        return text
    return scrub(text)


# Log lines repeat their values (actions, routes, envs, subjects, revisions): the short texts
# found clean are remembered, so a repeat costs one set lookup. Only clean texts: nothing
# that held a credential is ever kept. Bounded: emptied when full.
_CLEAN: set[str] = set()
_CLEAN_MAX_ENTRIES = 8192
_CLEAN_MAX_LENGTH = 256


def _remember_clean(text: str) -> None:
    if len(text) <= _CLEAN_MAX_LENGTH:
        if len(_CLEAN) >= _CLEAN_MAX_ENTRIES:
            _CLEAN.clear()
        _CLEAN.add(text)


def _scrub_patterns(text: str) -> str:
    text = _URL_CREDENTIALS.sub(r"\1\2:***@", text)
    text = _CREDENTIAL_HEADER.sub(r"\1\2" + MASK, text)
    text = _SCHEME_CREDENTIALS.sub(r"\1 " + MASK, text)
    text = _JOSE.sub(MASK, text)
    text = _FLAG_VALUE.sub(_named, text)
    return _NAMED_VALUE.sub(_named, text)


def mask(value: Any, extra_names: Iterable[str] = ()) -> Any:
    """Copy ``value`` with every secret-looking field replaced by ``***``."""
    names = {n.lower() for n in extra_names}
    return _mask(value, names)


def _mask(value: Any, names: set[str]) -> Any:
    if isinstance(value, dict):
        masked: dict[Any, Any] = {}
        for k, v in value.items():
            secret = SECRET_BY_NAME.get(k)
            if secret is None:
                secret = is_secret_field(k)
            if secret or (names and str(k).lower() in names):
                masked[k] = MASK
            elif type(v) is str:  # the common leaves, without a call each
                masked[k] = v if v in _CLEAN else scrub(v)
            elif v is None or type(v) is int or type(v) is bool or type(v) is float:
                masked[k] = v
            else:
                masked[k] = _mask(v, names)
        return masked
    if isinstance(value, (list, tuple)):
        return [_mask(v, names) for v in value]
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, (bytes, bytearray)):
        return scrub(repr(bytes(value)))
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return scrub(str(value))


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # a caller's bad format string must not lose the line
        return f"{record.msg!s} {record.args!r}"


def _traceback(record: logging.LogRecord) -> str | None:
    if record.exc_text:
        return record.exc_text
    if record.exc_info and record.exc_info[0] is not None:
        return "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
    return None


class ScrubFilter(logging.Filter):
    """Rewrite a record in place: its message and traceback text scrubbed (``scrub``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "_scrubbed", False):
            return True
        record.msg, record.args = scrub(_message(record)), ()
        tb = _traceback(record)
        if tb is not None:
            # Formatters use exc_text when it is set, instead of formatting exc_info again.
            record.exc_text = scrub(tb)
        if record.stack_info:
            record.stack_info = scrub(record.stack_info)
        record._scrubbed = True
        return True


#: Loggers of libraries that may put request data (header lines, URLs) into a record.
SCRUBBED_LOGGERS = ("aiohttp.server", "aiohttp.access", "aiohttp.web", "aiohttp.internal",
                    "aiohttp.client", "asyncio")
_FILTER = ScrubFilter()


def install_scrubbing() -> None:
    """Add the scrubbing filter to the library loggers (idempotent)."""
    for name in SCRUBBED_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


class JSONFormatter(logging.Formatter):
    """One JSON object per line; every string in it scrubbed."""

    def __init__(self, mask_fields: Iterable[str] = ()):
        super().__init__()
        self._names = {n.lower() for n in mask_fields}
        #: The field names masked besides the secret ones (lower case).
        self.masks = frozenset(self._names)

    def format(self, record: logging.LogRecord) -> str:
        cid = getattr(record, "correlation_id", None) or correlation_id_var.get()
        doc = self._doc(record.created, record.levelname, record.name, _message(record), cid,
                        getattr(record, "fields", None))
        tb = _traceback(record)
        if tb is not None:
            # Stack traces stay in the process's own log, never in a response.
            doc["exc"] = scrub(tb)
        if record.stack_info:
            doc["stack"] = scrub(record.stack_info)
        return _ENCODE(doc)

    def _doc(self, created: float, level: str, logger: str, msg: str, cid: Any,
             fields: Any) -> dict[str, Any]:
        doc: dict[str, Any] = {"ts": clock.iso(created), "level": level, "logger": logger,
                               "msg": scrub(msg)}
        if cid:
            doc["correlation_id"] = scrub(str(cid))
        if isinstance(fields, dict):
            doc.update(_mask(fields, self._names))
        return doc


def direct_handler(logger: logging.Logger, level: int) -> BatchedStreamHandler | None:
    """The one handler a record of ``logger`` at ``level`` would reach, when it is this module's
    (``configure``) and nothing on the way filters or handles it otherwise: a caller on the hot
    path (the access log) may then format its line with that handler's formatter and queue it
    (``BatchedStreamHandler.queue``), skipping the record's creation and dispatch, which cost
    more than the line (measured: ~half of an access line). None: log the record as usual."""
    if not logger.isEnabledFor(level):
        return None
    found: BatchedStreamHandler | None = None
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        for handler in current.handlers:
            if (found is not None or type(handler) is not BatchedStreamHandler
                    or handler.filters or level < handler.level
                    or type(handler.formatter) is not JSONFormatter):
                return None
            found = handler
        if not current.propagate:
            break
        current = current.parent
    return found


#: Compact lines; what JSON has no type for is written as its scrubbed text.
_ENCODE = jsontext.encoder_with_default(lambda v: scrub(str(v)))

#: ``JSONFormatter``'s encoding of a line's document, for a caller that made the document
#: itself, every string in it scrubbed (the access log).
encode_line = _ENCODE


class BatchedStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes the lines of one event-loop turn together.

    A record logged on a thread running an event loop is formatted at once and queued; the
    queue is written in one ``write`` (and flushed) by a callback at the end of the loop's
    current turn, so the lines of a request (its decision and its access line) cost one write
    instead of one each, and every line is out before the loop waits for I/O again. Anywhere
    else (no running loop: a thread, startup, shutdown) the queue and the record are written
    at once. ``flush`` (also ``logging.shutdown``) writes what is queued.
    """

    def __init__(self, stream: Any = None) -> None:
        super().__init__(stream)
        self._queued: list[str] = []
        self._loop: Any = None  # the loop a flush is scheduled on

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        self._queue(line)  # under the handler's lock (``Handler.handle``)

    def queue(self, line: str) -> None:
        """Write a line formatted by this handler's formatter as ``emit`` writes a record's."""
        with self.lock:  # type: ignore[union-attr]
            self._queue(line)

    def _queue(self, line: str) -> None:
        self._queued.append(line)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        if self._loop is not loop:
            self._loop = loop
            loop.call_soon(self.flush)

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._loop = None
            if self._queued:
                lines, self._queued = self._queued, []
                try:
                    self.stream.write("\n".join(lines) + "\n")
                except Exception:
                    self.handleError(logging.makeLogRecord({"msg": "log write failed"}))
            super().flush()


def configure(level: str = "INFO", mask_fields: Iterable[str] = ()) -> None:
    """Send every log record to stderr as JSON (idempotent)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_controlplane", False):
            root.removeHandler(handler)
    handler = BatchedStreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter(mask_fields))
    handler._controlplane = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    # The formatter writes none of the record's caller, thread or process attributes: skip
    # finding them for every record (the logging HOWTO's "Optimization"; findCaller walks the
    # stack, ~15% of an access line).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    root.setLevel(level)
    install_scrubbing()
