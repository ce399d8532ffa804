"""``cpctl serve``: run the service, in one process or as N workers sharing one socket.

The socket is bound once, before anything else starts: a port already in use is a startup
failure (a supervisor's workers accept on its socket; two instances never share a port).
Startup failures (bind, state dir, identities, a ``required`` store) are one structured fatal
log line and exit 2; ``serving`` is logged after the bind, with the bound address."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import gc
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from .. import config as config_mod
from .. import logs
from ..repeats import REPEATS, cause_of, log_repeated

log = logging.getLogger("controlplane.serve")


def register(sub: Any) -> None:
    parser = sub.add_parser("serve", help="run the control plane HTTP service")
    parser.add_argument("--config", help="YAML configuration file (default: built-in defaults)")
    parser.add_argument("--host", help="bind address (default 127.0.0.1; env CONTROLPLANE_HOST)")
    parser.add_argument("--port", type=int, help="port (default 8700; env CONTROLPLANE_PORT)")
    parser.add_argument("--workers", type=int, help="worker processes sharing the one socket")
    parser.set_defaults(func=run)


def load_config(args: argparse.Namespace) -> config_mod.Config:
    overrides: dict[str, Any] = {}
    for key in ("host", "port", "workers"):
        value = getattr(args, key, None)
        if value is not None:
            overrides.setdefault("server", {})[key] = value
    return config_mod.load_from_process(args.config, overrides=overrides)


class StartupError(Exception):
    """The service cannot start as configured: one fatal log line, exit 2 (never a traceback)."""


#: Exit status of a startup failure (a worker's too: its supervisor then stops, exit 2).
EXIT_STARTUP = 2


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args)
    except config_mod.ConfigError as exc:
        print(f"cpctl serve: {exc}", file=sys.stderr)
        return 2
    logs.configure(config.logging.level, config.logging.mask_fields)
    try:
        _prepare_state_dir(config.state_dir)
        _check_identities(config)
        # One listening socket, bound here once: the workers of this supervisor share it, and
        # a second instance on the same port fails here (no SO_REUSEPORT: never split traffic).
        sock = _bind(config.server.host, config.server.port)
    except StartupError as exc:
        return _fatal(exc)
    if config.mode != "embedded" and config.store.backend == "sqlite":
        log.warning("production mode with the embedded SQLite store: single machine only")
    try:
        if config.server.workers == 1:
            _set_title("controlplane")
            return serve_worker(config, sock, worker=None)
        return supervise(config, sock)
    finally:
        sock.close()


def _fatal(exc: BaseException) -> int:
    log.critical("startup failed: %s", exc,
                 extra={"fields": {"event": "startup.failed", "error": str(exc), "pid": os.getpid()}})
    return EXIT_STARTUP


def _prepare_state_dir(state_dir: Path) -> None:
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Writable for this process (permissions, read-only mounts, root or not): prove it.
        probe = state_dir / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise StartupError(
            f"state dir {state_dir} is not writable: {exc.strerror or exc}") from exc


def _check_identities(config: config_mod.Config) -> None:
    from ..authn.identities import IdentitiesError, load

    try:
        load(config.authn.identities)
    except IdentitiesError as exc:
        raise StartupError(str(exc)) from exc


def _bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        family = infos[0][0]
        return socket.create_server((host, port), family=family, backlog=1024)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise StartupError(f"cannot bind {host}:{port}: address already in use "
                               "(another instance serves this port)") from exc
        raise StartupError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from exc


def _bound(sock: socket.socket) -> tuple[str, int]:
    host, port = sock.getsockname()[:2]
    return str(host), int(port)


def _log_serving(config: config_mod.Config, sock: socket.socket) -> None:
    host, port = _bound(sock)
    log.info("serving", extra={"fields": {
        "host": host, "port": port, "address": f"{host}:{port}", "pid": os.getpid(),
        "workers": config.server.workers, "mode": config.runtime_mode}})


def _set_title(title: str) -> None:
    # setproctitle: the title `ps`, `top` and /proc/PID/cmdline show (prctl(PR_SET_NAME) alone
    # would cut it to 15 bytes and leave the command line as it was).
    import setproctitle

    setproctitle.setproctitle(title)


#: The youngest generation's collection threshold in a serving worker (CPython's default 700).
YOUNG_GC_THRESHOLD = 10_000


def serve_worker(config: config_mod.Config, sock: socket.socket, *, worker: int | None,
                 supervisor: int | None = None) -> int:
    """Serve on ``sock`` (``worker``: this is the supervisor's worker number N, else the only
    process) until SIGINT/SIGTERM, then shut down gracefully: stop accepting, end
    live streams, give open requests ``server.shutdown_timeout_s``, close the components. A
    component that cannot start (identities, store ``required``, ...) is one fatal log line
    and exit 2."""
    logs.configure(config.logging.level, config.logging.mask_fields)
    # Until the reloaders put their handler on the loop (service.sighup), a SIGHUP (the
    # supervisor forwards the operator's) must not end the process with its default action.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with asyncio.Runner(loop_factory=event_loop_factory(config.server.event_loop)) as runner:
            runner.run(_serve(config, sock, worker=worker, supervisor=supervisor))
    except StartupError as exc:
        return _fatal(exc)
    return 0


def event_loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The workers' event loop (``server.event_loop``): uvloop's when it is installed and not
    refused (``asyncio``), else asyncio's own (None). uvloop measured faster for the service:
    a production chain run on PostgreSQL costs less CPU in the worker (bench/http_bench.py)."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise StartupError("server.event_loop is uvloop, and uvloop is not installed") from None
        return None
    return uvloop.new_event_loop


async def _serve(config: config_mod.Config, sock: socket.socket, *, worker: int | None,
                 supervisor: int | None = None) -> None:
    # web.run_app, with the edge's runner (service/edge.py): aiohttp's protocol answers bad
    # request heads itself, and only a runner can give it another protocol class.
    from ..app import create_app  # imported here so the supervisor stays light
    from ..edge import EdgeRunner

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(_loop_exception)
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    runner = EdgeRunner(
        # Only a supervisor's workers share a socket, and they share their metrics too.
        create_app(config, shared_metrics=worker is not None),
        shutdown_timeout=config.server.shutdown_timeout_s,
        access_log=logging.getLogger("controlplane.access") if config.logging.access_log else None,
    )
    try:
        await runner.setup()  # the components open here (app.py: cleanup_ctx)
    except Exception as exc:
        await runner.cleanup()
        raise StartupError(f"{exc.__class__.__name__}: {exc}") from exc
    try:
        site = web.SockSite(runner, sock)
        await site.start()
        # Everything alive now (the app, its components, the policy bundle, the modules) lives
        # as long as the process: out of the collector's way, so that its periodic passes over
        # the old generations do not walk it again and again (gc.freeze; measured on the
        # authorized read: ~5% of its CPU).
        gc.collect()
        gc.freeze()
        # The youngest generation is collected after 700 more container objects were made
        # than freed. Under load the requests in flight hold about that many (64 in flight:
        # ~1,300), so it ran every few dozen requests and each pass walked them all, alive,
        # ~4 us of every authorized read's CPU; none of them is garbage. Its threshold is
        # raised above what requests in flight hold, the older ones are left as they are.
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(YOUNG_GC_THRESHOLD, older, oldest)
        if worker is None:
            _log_serving(config, sock)
        else:  # the supervisor said "serving" once, when it bound the socket
            log.info("worker ready", extra={"fields": {"worker": worker, "pid": os.getpid()}})
        watch = (asyncio.create_task(_watch_supervisor(supervisor, stop))
                 if supervisor is not None else None)
        await stop.wait()
        if watch is not None:
            watch.cancel()
        # Stop accepting, end live streams, give open requests the grace period, close.
        log.info("draining", extra={"fields": {
            "event": "server.draining", "pid": os.getpid(),
            "grace_s": config.server.shutdown_timeout_s}})
    finally:
        await runner.cleanup()
        REPEATS.flush()  # the counts of repeated failures not said yet
    log.info("stopped", extra={"fields": {"event": "server.stopped", "pid": os.getpid()}})


#: accept() errors that asyncio's accept loop reports and retries by itself (a second later):
#: out of descriptors (the process's or the system's), of buffers, of memory.
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def _loop_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The event loop's exception handler: what asyncio reports with no one to raise it to.

    accept() out of resources is expected under load (the descriptor limit reached by open
    connections) and asyncio reports every failed call, hundreds a second: one event per
    errno per interval with the count (``service.repeats``), no traceback. Anything else is
    unexpected: asyncio's message and context with the traceback, rate-limited per cause."""
    exc = context.get("exception")
    message = str(context.get("message") or "unhandled exception in the event loop")
    if (isinstance(exc, OSError) and exc.errno in _OUT_OF_RESOURCES
            and "accept" in message):
        name = errno.errorcode.get(exc.errno, str(exc.errno))
        log_repeated(log, logging.ERROR, ("server.accept_failed", name),
                     "cannot accept connections: %s (asyncio retries every second)",
                     exc.strerror, fields={"event": "server.accept_failed", "errno": name})
        return
    details = "".join(f"\n{key}: {value!r}" for key, value in context.items()
                      if key not in ("message", "exception"))
    cause = ("loop.exception", message, *(cause_of(exc) if exc is not None else ()))
    log_repeated(logging.getLogger("asyncio"), logging.ERROR, cause, "%s%s", message, details,
                 fields={"event": "loop.exception"}, exc_info=exc)


#: How often a worker checks that its supervisor is still there.
SUPERVISOR_CHECK_S = 1.0


async def _watch_supervisor(supervisor: int, stop: asyncio.Event) -> None:
    """A worker whose supervisor is gone (killed outright, so it could not stop its workers)
    drains and stops, instead of serving on unsupervised and holding the port."""
    while not stop.is_set():
        await asyncio.sleep(SUPERVISOR_CHECK_S)
        if os.getppid() != supervisor:
            log.error("the supervisor is gone: stopping", extra={"fields": {
                "event": "server.orphaned", "pid": os.getpid(), "supervisor": supervisor}})
            stop.set()


def _worker_entry(config: config_mod.Config, sock: socket.socket, index: int,
                  supervisor: int) -> None:
    # A worker dies with its parent's signal handling reset: SIGINT/SIGTERM stop it gracefully.
    _set_title(f"controlplane worker {index}/{config.server.workers}")
    raise SystemExit(serve_worker(config, sock, worker=index, supervisor=supervisor))


def supervise(config: config_mod.Config, sock: socket.socket) -> int:
    """Start ``workers`` processes accepting on ``sock``; restart crashed ones; stop on signal.
    A worker that cannot start (exit 2, its fatal line logged) stops them all: exit 2."""
    ctx = multiprocessing.get_context("spawn")
    stopping = False
    _set_title(f"controlplane supervisor ({config.server.workers} workers)")
    # Workers share their metrics through files (prometheus-client multiprocess mode), so that
    # /metrics answered by any worker counts every worker's requests. Fresh at every start.
    metrics_dir = config.state_dir / "metrics"
    try:
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(mode=0o700, parents=True)
    except OSError as exc:
        return _fatal(StartupError(f"cannot create {metrics_dir}: {exc.strerror or exc}"))
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)

    def stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    def reload(signum: int, _frame: Any) -> None:
        # SIGHUP is the reload signal (policies, identities, the shadow candidate): each worker
        # reloads on its own loop. Left at its default action it would end the supervisor, and
        # with it the service.
        for proc in workers:
            if proc.is_alive() and proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGHUP)
        log.info("SIGHUP forwarded to the workers",
                 extra={"fields": {"event": "serve.sighup", "workers": len(workers)}})

    workers: list[Any] = []
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, reload)

    def start(index: int) -> Any:
        # The socket travels to the spawned child as a duplicated descriptor.
        proc = ctx.Process(target=_worker_entry, args=(config, sock, index, os.getpid()),
                           daemon=False)
        proc.start()
        return proc

    workers.extend(start(i + 1) for i in range(config.server.workers))
    _log_serving(config, sock)
    log.info("supervising", extra={"fields": {"workers": [p.pid for p in workers]}})
    status = 0
    while not stopping:
        time.sleep(0.2)
        for i, proc in enumerate(workers):
            if proc.is_alive() or stopping:
                continue
            if proc.exitcode == EXIT_STARTUP:
                # The worker said why (one fatal line); restarting would only repeat it.
                stopping, status = True, EXIT_STARTUP
                break
            log.error("worker exited; restarting",
                      extra={"fields": {"pid": proc.pid, "exitcode": proc.exitcode}})
            _forget_worker_metrics(proc.pid)
            workers[i] = start(i + 1)
    for proc in workers:
        if proc.is_alive() and proc.pid is not None:
            os.kill(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + config.server.shutdown_timeout_s + 5
    for proc in workers:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join()
    return status


def _forget_worker_metrics(pid: int | None) -> None:
    """Drop a dead worker's live gauges (its counters stay: they happened)."""
    if pid is None:
        return
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]  # untyped upstream
