"""The only catch-all: every exception becomes an RFC 9457 problem, never a stack trace."""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from ..appkeys import CORRELATION_ID
from ..errors import InternalError, problem_response, to_problem
from ..repeats import cause_of, log_repeated

log = logging.getLogger("controlplane.http")


def answer(request: web.Request, exc: Exception) -> web.Response:
    """The problem+json answer to ``exc`` (a ``Problem``, an aiohttp HTTP error of status 400 or
    more, anything unexpected); an unexpected one is logged with its trace, never sent."""
    problem = to_problem(exc)
    if isinstance(problem, InternalError) and not isinstance(exc, web.HTTPException):
        # The trace goes to our log with the correlation id; the client sees only the id.
        # A bug that every request meets is one trace, then one count per interval.
        log_repeated(log, logging.ERROR, ("http.unhandled", *cause_of(exc)),
                     "unhandled error on %s %s", request.method, request.rel_url.path,
                     fields={"event": "http.unhandled"}, exc_info=exc)
    return problem_response(problem, request.get(CORRELATION_ID))


def setup_problems(app: web.Application) -> None:
    """Install the problems middleware (inside metrics and headers, which see its responses)."""

    @web.middleware
    async def problems_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Turn ``Problem``, aiohttp HTTP errors and unexpected exceptions into problem+json."""
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise  # redirects and the like are not errors
            return answer(request, exc)
        except Exception as exc:
            return answer(request, exc)

    app.middlewares.append(problems_middleware)
