"""The service's request layers as ONE middleware: correlation, deadline, metrics, headers,
problems and authn, outermost first, each layer's code in its own module.

Six middlewares cost six coroutines and frames on every request, around a handler that may
do little more (measured on the authorized read, wrk, 2 workers: the stack of frames was a few
percent of its CPU). Here each layer is a step of one function, in the order the layers had:

- correlation (``correlation``): the caller's well-formed ``X-Correlation-ID`` or a new one,
  on the request, the logging context and the response;
- deadline (``service.deadline``): every store call of the request comes out of one budget;
- metrics (``metrics``): in flight while it runs, then counted under its route template with
  its final status (a problem's included; a raised redirect's own status);
- headers (``headers``): ``Server: controlplane``, security headers and ``no-store`` on every
  response not prepared by its handler (problem responses and raised redirects included;
  streams set them before preparing), with no ``on_response_prepare`` receiver (a coroutine
  on every response);
- problems (``problems``): the only catch-all; every exception of authn or the handler becomes
  a problem+json answer (redirects pass through);
- authn (``authn``): who is calling, attached before the handler runs.

``setup_correlation``, ``setup_deadline``, ``setup_headers`` and ``setup_problems`` install
one layer alone, for applications (and the tests of each layer) that want only it.
"""

from __future__ import annotations

import time

from aiohttp import web
from aiohttp.typedefs import Handler

from .. import deadline
from ..appkeys import CORRELATION_ID
from ..config import CONFIG
from ..logs import correlation_id_var
from . import authn, headers, metrics, problems
from .correlation import HEADER, correlation_id_for

__all__ = ["setup_layers"]


def setup_layers(app: web.Application, *, multiprocess: bool = False) -> None:
    """Install the request layers (before any other middleware: they are the outermost)."""
    counted = metrics.install_metrics(app, multiprocess=multiprocess)
    tally = counted.tally
    timeout_s = app[CONFIG].store.timeout_s  # the request's store deadline (the app's config)

    @web.middleware
    async def request_layers(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Correlation, deadline, metrics, headers, problems and authn around ``handler``."""
        cid = correlation_id_for(request.headers.get(HEADER))
        request[CORRELATION_ID] = cid
        token = correlation_id_var.set(cid)
        started = time.perf_counter()
        tally.in_flight += 1
        status = 500
        budget = deadline.begin(timeout_s)
        try:
            try:
                pending = authn.identify_now(request)
                if pending is not None:
                    await pending
                response = await handler(request)
            except web.HTTPException as exc:
                if exc.status < 400:  # redirects and the like are not errors
                    headers.apply_security_headers(request, exc)
                    raise
                response = problems.answer(request, exc)
            except Exception as exc:
                response = problems.answer(request, exc)
            finally:
                deadline.end(budget)
            if not response.prepared:  # streamed responses set their headers before preparing
                headers.apply_security_headers(request, response)
                response.headers[HEADER] = cid
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            tally.in_flight -= 1
            metrics.observe_request(counted, request, status, started)
            correlation_id_var.reset(token)

    app.middlewares.append(request_layers)
