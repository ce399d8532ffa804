"""``cpctl serve``: run the service, in one process or as N workers sharing one port."""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import time
from typing import Any

from aiohttp import web

from .. import config as config_mod
from .. import logs

log = logging.getLogger("controlplane.serve")


def register(sub: Any) -> None:
    parser = sub.add_parser("serve", help="run the control plane HTTP service")
    parser.add_argument("--config", help="YAML configuration file (default: built-in defaults)")
    parser.add_argument("--host", help="bind address (default 127.0.0.1; env CONTROLPLANE_HOST)")
    parser.add_argument("--port", type=int, help="port (default 8700; env CONTROLPLANE_PORT)")
    parser.add_argument("--workers", type=int, help="worker processes sharing the port (SO_REUSEPORT)")
    parser.set_defaults(func=run)


def load_config(args: argparse.Namespace) -> config_mod.Config:
    overrides: dict[str, Any] = {}
    for key in ("host", "port", "workers"):
        value = getattr(args, key, None)
        if value is not None:
            overrides.setdefault("server", {})[key] = value
    return config_mod.load_from_process(args.config, overrides=overrides)


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args)
    except config_mod.ConfigError as exc:
        print(f"cpctl serve: {exc}", file=sys.stderr)
        return 2
    logs.configure(config.logging.level, config.logging.mask_fields)
    config.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if config.mode != "embedded" and config.store.backend == "sqlite":
        log.warning("production mode with the embedded SQLite store: single machine only")
    if config.server.workers == 1:
        return serve_worker(config, reuse_port=False)
    return supervise(config)


def serve_worker(config: config_mod.Config, *, reuse_port: bool) -> int:
    """Serve until SIGINT/SIGTERM, then shut down gracefully: stop accepting, end live
    streams, give open requests ``server.shutdown_timeout_s``, close the components."""
    logs.configure(config.logging.level, config.logging.mask_fields)
    log.info(
        "serving",
        extra={"fields": {"host": config.server.host, "port": config.server.port,
                          "pid": os.getpid(), "mode": config.runtime_mode}},
    )
    asyncio.run(_serve(config, reuse_port=reuse_port))
    return 0


async def _serve(config: config_mod.Config, *, reuse_port: bool) -> None:
    # web.run_app, with the edge's runner (service/edge.py): aiohttp's protocol answers bad
    # request heads itself, and only a runner can give it another protocol class.
    from ..app import create_app  # imported here so the supervisor stays light
    from ..edge import EdgeRunner

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    runner = EdgeRunner(
        # Only a supervisor's workers share a port, and they share their metrics too.
        create_app(config, shared_metrics=reuse_port),
        shutdown_timeout=config.server.shutdown_timeout_s,
        access_log=logging.getLogger("controlplane.access") if config.logging.access_log else None,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.server.host, config.server.port, reuse_port=reuse_port)
        await site.start()
        await stop.wait()
    finally:
        await runner.cleanup()


def _worker_entry(config: config_mod.Config) -> None:
    # A worker dies with its parent's signal handling reset: SIGINT/SIGTERM stop it gracefully.
    raise SystemExit(serve_worker(config, reuse_port=True))


def supervise(config: config_mod.Config) -> int:
    """Start ``workers`` processes on one port (SO_REUSEPORT); restart crashed ones; stop on signal."""
    if not hasattr(socket, "SO_REUSEPORT"):
        print("cpctl serve: --workers > 1 needs SO_REUSEPORT (Linux, BSD, macOS)", file=sys.stderr)
        return 2
    ctx = multiprocessing.get_context("spawn")
    stopping = False
    # Workers share their metrics through files (prometheus-client multiprocess mode), so that
    # /metrics answered by any worker counts every worker's requests. Fresh at every start.
    metrics_dir = config.state_dir / "metrics"
    shutil.rmtree(metrics_dir, ignore_errors=True)
    metrics_dir.mkdir(mode=0o700, parents=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)

    def stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)

    def start() -> Any:
        proc = ctx.Process(target=_worker_entry, args=(config,), daemon=False)
        proc.start()
        return proc

    workers = [start() for _ in range(config.server.workers)]
    log.info("supervising", extra={"fields": {"workers": [p.pid for p in workers]}})
    while not stopping:
        time.sleep(0.2)
        for i, proc in enumerate(workers):
            if not proc.is_alive() and not stopping:
                log.error("worker exited; restarting",
                          extra={"fields": {"pid": proc.pid, "exitcode": proc.exitcode}})
                _forget_worker_metrics(proc.pid)
                workers[i] = start()
    for proc in workers:
        if proc.is_alive() and proc.pid is not None:
            os.kill(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + config.server.shutdown_timeout_s + 5
    for proc in workers:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join()
    return 0


def _forget_worker_metrics(pid: int | None) -> None:
    """Drop a dead worker's live gauges (its counters stay: they happened)."""
    if pid is None:
        return
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]  # untyped upstream
