"""The typed keys of builtin types (aiohttp ``AppKey``/``RequestKey``) that no component owns.

A key whose value is a component's type is defined beside that type (aiohttp's guidance), e.g.
``STORE`` in ``storelink``, ``ENGINE`` in ``authz.engine``, ``CONFIG`` in ``config``: a module
that reads a key imports the component it reads anyway, and this module imports no component
(it once imported every type, which made type-only import cycles). Each app key is set by the
one startup context that opens its value (listed in order in ``app.py``); handlers and the chain
read them, nothing else sets them.
"""

from __future__ import annotations

from aiohttp import web

__all__ = ["AUTHN_ERROR", "CORRELATION_ID", "STARTED_AT"]

#: When this process started (Unix seconds), for system/info's uptime.
STARTED_AT = web.AppKey("started_at", float)

#: The request's correlation id (the caller's, or a new one), in logs, problems and audit.
CORRELATION_ID = web.RequestKey("correlation_id", str)
#: The stable code of a presented token that failed verification (for the chain's 401).
AUTHN_ERROR = web.RequestKey("authn_error", str)
