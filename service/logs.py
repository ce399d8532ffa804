"""Structured JSON logs on stderr, with the request's correlation id and secrets masked.

Every record becomes one JSON object per line: ``ts``, ``level``, ``logger``, ``msg``, the
correlation id of the request being served (a context variable set by the correlation
middleware) and any ``extra={"fields": {...}}`` the caller attached. Field names that look like
secrets (token, password, secret, otp, nonce, dsn, authorization, ...) are masked whatever
the caller passes, and configured names can be added (``logging.mask_fields``).
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import time
from collections.abc import Iterable
from typing import Any

from .redaction import is_secret_field

__all__ = ["configure", "correlation_id_var", "mask"]

correlation_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "correlation_id", default=None
)

# URLs with credentials (scheme://user:pass@host) are masked wherever they appear in text.
_URL_CREDENTIALS = re.compile(r"([a-z][a-z0-9+.-]*://)([^/@\s:]+):([^/@\s]+)@", re.IGNORECASE)
MASK = "***"


def mask(value: Any, extra_names: Iterable[str] = ()) -> Any:
    """Copy ``value`` with every secret-looking field replaced by ``***``."""
    names = {n.lower() for n in extra_names}
    return _mask(value, names)


def _mask(value: Any, names: set[str]) -> Any:
    if isinstance(value, dict):
        return {
            k: (MASK if (is_secret_field(k) or str(k).lower() in names) else _mask(v, names))
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_mask(v, names) for v in value]
    if isinstance(value, str):
        return _URL_CREDENTIALS.sub(r"\1\2:***@", value)
    return value


class JSONFormatter(logging.Formatter):
    """One JSON object per line."""

    def __init__(self, mask_fields: Iterable[str] = ()):
        super().__init__()
        self._names = {n.lower() for n in mask_fields}

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": _URL_CREDENTIALS.sub(r"\1\2:***@", record.getMessage()),
        }
        cid = getattr(record, "correlation_id", None) or correlation_id_var.get()
        if cid:
            doc["correlation_id"] = cid
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            doc.update(_mask(fields, self._names))
        if record.exc_info:
            # Stack traces stay in the process's own log, never in a response.
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def configure(level: str = "INFO", mask_fields: Iterable[str] = ()) -> None:
    """Send every log record to stderr as JSON (idempotent)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_controlplane", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter(mask_fields))
    handler._controlplane = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
