"""The baseline of the HTTP benchmark: a bare aiohttp app answering a fixed JSON body.

Run: python bench/baseline_app.py --port P [--reuse-port]

One process per invocation; ``http_bench`` starts N of them on one port (SO_REUSEPORT) to compare
with N service workers. No middleware, no access log: the floor aiohttp itself sets on this box.
"""

from __future__ import annotations

import argparse

from aiohttp import web

BODY = {"service": "baseline", "version": "0", "status": "ready"}


async def info(request: web.Request) -> web.Response:
    return web.json_response(BODY)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--reuse-port", action="store_true")
    args = parser.parse_args()
    app = web.Application()
    app.router.add_get("/api/v1/system/info", info)
    app.router.add_get("/healthz", healthz)
    web.run_app(app, host="127.0.0.1", port=args.port, reuse_port=args.reuse_port or None,
                access_log=None, print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
