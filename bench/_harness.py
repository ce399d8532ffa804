"""Shared pieces of the benchmarks: machine description, processes, logins, load generators.

Everything here talks to 127.0.0.1 only. Load is bounded twice: by a duration and by a request
count. ``wrk`` is used when it is on PATH, otherwise an aiohttp-client generator (slower, and it
shares the CPU with the server, so its numbers are a lower bound).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402
import asyncpg  # noqa: E402
import yaml  # noqa: E402

from service.authn import totp  # noqa: E402

PG_DSN = os.environ.get("CONTROLPLANE_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
PASSWORDS = {"alice": "alice-dev-password", "bob": "bob-dev-password", "carol": "carol-dev-password"}


# ------------------------------------------------------------------------------ the machine


def machine() -> dict[str, str]:
    """nproc, CPU model, memory, kernel, Python/aiohttp/SQLite versions, load generator."""
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    try:
        nproc = subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        nproc = str(os.cpu_count())
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "nproc": nproc,
        "cpu": cpu,
        "memory": mem,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "aiohttp": aiohttp.__version__,
        "sqlite": sqlite3.sqlite_version,
        "load_generator": wrk_version() or "aiohttp-client generator (wrk not found)",
    }


def wrk_version() -> str | None:
    path = shutil.which("wrk")
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout + out.stderr).strip().splitlines()
    return text[0].split(" Copyright")[0] if text else "wrk"


def pyspy() -> str | None:
    """The py-spy executable (next to this interpreter or on PATH), if installed."""
    local = Path(sys.executable).with_name("py-spy")
    if local.exists():
        return str(local)
    return shutil.which("py-spy")


# ------------------------------------------------------------------------------ processes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:  # noqa: S310 (loopback)
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} not ready after {timeout}s")
        time.sleep(0.1)


# --- the processes a benchmark starts, and their reaping ------------------------------------
#
# Every server is started by ``spawn``: in a process group of its own (its workers join it), told
# by the kernel to stop (SIGTERM) when the benchmark process dies however it dies
# (``PR_SET_PDEATHSIG``), and recorded until ``_stop`` has seen its whole group go. A benchmark
# that is interrupted (Ctrl-C, SIGTERM, SIGHUP: each raises SystemExit here, so every ``finally``
# runs) or exits stops what is still recorded (``reap``, at exit): an aborted run leaves no
# server, worker or reference peer behind. A benchmark killed outright (SIGKILL: nothing runs)
# stops its servers' leaders through PR_SET_PDEATHSIG, but a leader that does not stop its
# workers on SIGTERM leaves them: each group is also recorded in a file (``_RECORDS``), and the
# next benchmark stops the groups of an owner that is gone (``_reap_orphans``).

_STARTED: set[int] = set()  # process-group ids (the leader's pid) of the processes started here
_PR_SET_PDEATHSIG = 1
_RECORDS = Path(tempfile.gettempdir()) / f"controlplane-bench-{os.getuid()}"


def _stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command (field 3 on: state, ppid, pgrp, session, ...)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def _identity(pid: int) -> str | None:
    """A process's pid and start time: a reused pid is another identity."""
    fields = _stat(pid)
    return None if fields is None else f"{pid}:{fields[19]}"


def _record(pgid: int) -> None:
    with contextlib.suppress(OSError):
        _RECORDS.mkdir(mode=0o700, exist_ok=True)
        (_RECORDS / str(pgid)).write_text(f"{_identity(os.getpid())}\n{_identity(pgid)}\n")


def _unrecord(pgid: int) -> None:
    with contextlib.suppress(OSError):
        (_RECORDS / str(pgid)).unlink()


def _reap_orphans() -> None:
    """Stop the groups recorded by a benchmark process that is gone (killed outright): every
    process still in such a group, whose session it leads (``start_new_session``)."""
    with contextlib.suppress(OSError):
        for record in _RECORDS.iterdir():
            try:
                owner = record.read_text().split("\n")[0]
                pgid = int(record.name)
            except (OSError, ValueError):
                continue
            if _identity(int(owner.split(":")[0])) == owner:
                continue  # its benchmark still runs
            members = [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()
                       and (_stat(int(d.name)) or ["", "", "", ""])[2:4] == [str(pgid)] * 2]
            if members:
                _signal_group(pgid, signal.SIGKILL)
            _unrecord(pgid)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def spawn(command: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen`` of a process this benchmark must not leave behind (see above)."""
    proc = subprocess.Popen(list(command), start_new_session=True, preexec_fn=_die_with_parent,
                            **kwargs)
    _STARTED.add(proc.pid)
    _record(proc.pid)
    return proc


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to the group; whether any of it was still there."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # the id is reused by someone else's group: not ours any more
        return False
    return True


def _stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        # a worker that outlived its leader is still in the leader's group
        _signal_group(proc.pid, signal.SIGKILL)
        _STARTED.discard(proc.pid)
        _unrecord(proc.pid)


def run_reaped(command: Sequence[str], *, timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(command, capture_output=True, text=True)`` through ``spawn``: the
    command's whole process group is stopped when it ends, times out (``TimeoutExpired``, as
    ``run``) or this process is interrupted, so its own children do not outlive it."""
    proc: Any = spawn(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        _stop([proc])
    return subprocess.CompletedProcess(list(command), proc.returncode, out, err)


def reap() -> None:
    """Stop every process group ``spawn`` started that is still there (SIGTERM, then SIGKILL
    after 5 s)."""
    groups = [pgid for pgid in list(_STARTED) if _signal_group(pgid, signal.SIGTERM)]
    deadline = time.monotonic() + 5.0
    while groups and time.monotonic() < deadline:
        time.sleep(0.1)
        groups = [pgid for pgid in groups if _signal_group(pgid, 0)]
    for pgid in groups:
        _signal_group(pgid, signal.SIGKILL)
    for pgid in _STARTED:
        _unrecord(pgid)
    _STARTED.clear()


def _exit_on_signal(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


_reap_orphans()
atexit.register(reap)
if threading.current_thread() is threading.main_thread():
    for _sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(_sig, _exit_on_signal)


@dataclass
class Server:
    base: str
    procs: list[subprocess.Popen[bytes]]
    log_path: Path

    def worker_pids(self) -> list[int]:
        """The processes that serve requests (the supervisor's children when there is one)."""
        pids: list[int] = []
        for proc in self.procs:
            kids = _children(proc.pid)
            # spawn-context workers; ignore multiprocessing's resource tracker, and the shadow
            # evaluation and policy vetting children of a single in-process worker
            kids = [k for k in kids if not any(
                helper in _cmdline(k) for helper in ("resource_tracker", *_HELPERS))]
            pids.extend(kids or [proc.pid])
        return pids

    def shadow_pids(self) -> list[int]:
        """The shadow evaluation processes (``service.authz.shadowproc``), one per worker."""
        return [k for pid in {p.pid for p in self.procs} | set(self.worker_pids())
                for k in _children(pid) if "service.authz.shadowproc" in _cmdline(k)]


#: Children of a serving process that do not serve.
_HELPERS = ("service.authz.shadowproc", "service.authz.regotest")


def _children(pid: int) -> list[int]:
    """Children started by any thread of ``pid`` (a worker's helper threads start some)."""
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                kids += [int(p) for p in (task / "children").read_text().split()]
    return kids


def cpu_seconds(pids: Sequence[int], *, main_thread: bool = False) -> float:
    """User + system CPU seconds used so far by ``pids`` (all their threads; with
    ``main_thread``, only each process's main thread, the one running its event loop)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        stat = f"/proc/{pid}/task/{pid}/stat" if main_thread else f"/proc/{pid}/stat"
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def settle(pids: Sequence[int], *, busy: float = 0.05, window_s: float = 0.25,
           timeout_s: float = 15.0) -> float:
    """Wait until ``pids`` use under ``busy`` of a core over ``window_s`` (their background
    work after a load is done), at most ``timeout_s``; returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        before = cpu_seconds(pids)
        time.sleep(window_s)
        if cpu_seconds(pids) - before < busy * window_s:
            break
    return time.monotonic() - started


def postgres_pids() -> list[int]:
    """The local PostgreSQL server's processes (postmaster, backends, its helpers)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() == "postgres":
                    pids.append(int(entry.name))
    return pids


def postgres_cpu() -> dict[int, float]:
    """CPU seconds so far of each local PostgreSQL process."""
    return {pid: cpu_seconds([pid]) for pid in postgres_pids()}


def postgres_cpu_since(before: Mapping[int, float]) -> float | None:
    """CPU seconds the local PostgreSQL used since ``before`` (``postgres_cpu()``): processes
    that started meanwhile (new connections) count whole; ones that ended are lost. None when
    no local server runs."""
    now = postgres_cpu()
    if not now and not before:
        return None
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in now.items())


def _local_ports(pids: Sequence[int]) -> set[int]:
    """The local TCP ports of the sockets ``pids`` hold (their connections to the database)."""
    inodes: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    if link.startswith("socket:["):
                        inodes.add(link[8:-1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if len(cols) > 9 and cols[9] in inodes:
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def own_backends(pids: Sequence[int], dsn: str = PG_DSN) -> list[int]:
    """The PostgreSQL backends serving ``pids`` (``pg_stat_activity`` rows whose client port is
    one of their sockets): the database's CPU for them alone, not every postgres process."""
    ports = _local_ports(pids)
    if not ports:
        return []

    async def query() -> list[int]:
        conn = await asyncpg.connect(dsn, timeout=5)
        try:
            rows = await conn.fetch("SELECT pid, client_port FROM pg_stat_activity "
                                    "WHERE client_port IS NOT NULL")
        finally:
            await conn.close()
        return [int(r["pid"]) for r in rows if r["client_port"] in ports]

    try:
        return asyncio.run(query())
    except Exception:
        return []


def own_backends_cpu(pids: Sequence[int]) -> dict[int, float]:
    """CPU seconds so far of each backend serving ``pids``."""
    return {pid: cpu_seconds([pid]) for pid in own_backends(pids)}


def own_backends_cpu_since(pids: Sequence[int], before: Mapping[int, float]) -> float:
    """CPU seconds the backends serving ``pids`` used since ``before``: backends that started
    meanwhile (the pool grew) count whole; ones that ended are lost."""
    now = own_backends_cpu(pids)
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in now.items())


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@contextlib.contextmanager
def service(state_dir: Path, *, workers: int, env: Mapping[str, str] | None = None) -> Iterator[Server]:
    """``cpctl serve`` on a free loopback port with its own state dir; stopped afterwards."""
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    environ.update({"CONTROLPLANE_STATE_DIR": str(state_dir), **(env or {})})
    log_path = state_dir.parent / f"{state_dir.name}.log"
    with open(log_path, "ab") as log:
        proc = spawn(
            [sys.executable, "-m", "service", "serve", "--host", "127.0.0.1", "--port", str(port),
             "--workers", str(workers)],
            cwd=REPO, env=environ, stdout=subprocess.DEVNULL, stderr=log,
        )
    server = Server(f"http://127.0.0.1:{port}", [proc], log_path)
    try:
        wait_ready(server.base + "/readyz")
        if workers > 1:
            # Each worker loads the policy bundle on its own; give the others time to listen too.
            _wait_workers(server, workers)
        yield server
    finally:
        _stop(server.procs)


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(cols[9])
    return inodes


def _listens(pid: int, inodes: set[str]) -> bool:
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                link = os.readlink(fd)
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return True
    return False


def _wait_workers(server: Server, workers: int, timeout: float = 60.0) -> None:
    """Until ``workers`` processes each hold a listening socket on the port (SO_REUSEPORT
    spreads connections only over sockets that exist when they arrive)."""
    port = int(server.base.rsplit(":", 1)[1])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = server.worker_pids()
        inodes = _listening_inodes(port)
        if len(pids) >= workers and sum(_listens(p, inodes) for p in pids) >= workers:
            return
        time.sleep(0.1)
    raise TimeoutError(f"{workers} workers not listening after {timeout}s")


@contextlib.contextmanager
def baseline(workers: int, tmp: Path) -> Iterator[Server]:
    """``bench/baseline_app.py`` as ``workers`` processes sharing one port."""
    port = free_port()
    log_path = tmp / f"baseline-{workers}.log"
    procs = []
    with open(log_path, "ab") as log:
        for _ in range(workers):
            procs.append(spawn(
                [sys.executable, str(REPO / "bench/baseline_app.py"), "--port", str(port),
                 *(["--reuse-port"] if workers > 1 else [])],
                cwd=REPO, stdout=subprocess.DEVNULL, stderr=log,
            ))
    server = Server(f"http://127.0.0.1:{port}", procs, log_path)
    try:
        wait_ready(server.base + "/healthz")
        _wait_workers(server, workers)
        yield server
    finally:
        _stop(procs)


#: The reference peer of the authorized read (a measuring stick, never imported).
PEER_READ = Path(os.environ.get("CONTROLPLANE_BENCH_PEER",
                                str(REPO.parent / "shared" / "reference" / "peer_read.py")))


def peer_init(state: Path) -> str:
    """``peer_read.py --init``: its state (key, database, a session) made in ``state``; the
    token it printed."""
    return subprocess.run([sys.executable, str(PEER_READ), "--init", str(state)], cwd=REPO,
                          capture_output=True, text=True, check=True, timeout=120,
                          ).stdout.strip().splitlines()[-1]


@contextlib.contextmanager
def peer(workers: int, tmp: Path, *extra: str) -> Iterator[tuple[Server, str]]:
    """``peer_read.py`` serving GET /api/v1/databases on ``workers`` processes, and its token."""
    state = tmp / f"peer-{workers}-{time.monotonic_ns()}"
    token = peer_init(state)
    port = free_port()
    log_path = tmp / f"peer-{workers}.log"
    with open(log_path, "ab") as log:
        proc = spawn(
            [sys.executable, str(PEER_READ), "--serve", str(state), "--port", str(port),
             "--workers", str(workers), "--repo", str(REPO), *extra],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
    server = Server(f"http://127.0.0.1:{port}", [proc], log_path)
    try:
        wait_ready(server.base + "/healthz")
        _wait_workers(server, workers)
        yield server, token
    finally:
        _stop([proc])


# ------------------------------------------------------------------------------ PostgreSQL


def pg_available(dsn: str = PG_DSN) -> str | None:
    """None when the server answers, else the reason it does not."""
    try:
        import asyncpg
    except ImportError:
        return "asyncpg is not installed"

    async def probe() -> None:
        conn = await asyncpg.connect(dsn, timeout=3)
        await conn.close()

    try:
        asyncio.run(probe())
    except Exception as exc:
        return f"{type(exc).__name__}"
    return None


def pg_drop_schema(schema: str, dsn: str = PG_DSN) -> None:
    import asyncpg

    if not re.fullmatch(r"[a-z_][a-z0-9_]*", schema):
        raise ValueError("bad schema name")

    async def drop() -> None:
        conn = await asyncpg.connect(dsn, timeout=5)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(drop())


def pg_version(dsn: str = PG_DSN) -> str | None:
    try:
        import asyncpg

        async def version() -> str:
            conn = await asyncpg.connect(dsn, timeout=3)
            try:
                return str(await conn.fetchval("SHOW server_version"))
            finally:
                await conn.close()

        return asyncio.run(version())
    except Exception:
        return None


# ------------------------------------------------------------------------------ identities


def totp_secrets() -> dict[str, str]:
    doc = yaml.safe_load((REPO / "examples/identities.yaml").read_text())
    return {i["subject_id"]: i["totp_secret"] for i in doc["identities"] if i.get("totp_secret")}


class Identities:
    """Logs in once per server (logins are throttled on failure and cost an scrypt each) and
    steps up with a TOTP code of a step not used yet against this server's store."""

    def __init__(self, base: str):
        self.base = base
        self.tokens: dict[str, str] = {}
        self.stepped: dict[str, tuple[str, float]] = {}
        self._used: dict[str, set[int]] = {}
        self._secrets = totp_secrets()

    async def login(self, session: aiohttp.ClientSession, subject: str) -> str:
        if subject not in self.tokens:
            async with session.post(self.base + "/api/v1/authn/sessions",
                                    json={"subject_id": subject, "password": PASSWORDS[subject]}) as r:
                doc = await r.json()
                if r.status != 201:
                    raise RuntimeError(f"login {subject}: {r.status} {doc.get('code')}")
            self.tokens[subject] = doc["access_token"]
        return self.tokens[subject]

    async def stepped_up(self, session: aiohttp.ClientSession, subject: str,
                         fresh_for: float) -> str:
        """A stepped-up token that stays fresh for at least ``fresh_for`` more seconds
        (the service's step-up window is 300 s)."""
        have = self.stepped.get(subject)
        if have is not None and time.time() - have[1] + fresh_for < 290:
            return have[0]
        token = await self.login(session, subject)
        used = self._used.setdefault(subject, set())
        now = time.time()
        for offset in (0, 30, -30):
            step = int((now + offset) // 30)
            if step in used:
                continue
            used.add(step)
            code = totp.code_at(self._secrets[subject], now + offset)
            async with session.post(self.base + "/api/v1/authn/step-up", json={"otp": code},
                                    headers={"Authorization": f"Bearer {token}"}) as r:
                doc = await r.json()
                if r.status == 201:
                    self.stepped[subject] = (doc["access_token"], time.time())
                    return doc["access_token"]
        raise RuntimeError(f"step-up {subject} failed (no unused TOTP step left)")


# ------------------------------------------------------------------------------ load


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    body: str | None = None


@dataclass
class Result:
    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int  # non-2xx answers + socket errors
    generator: str
    statuses: dict[str, int] = field(default_factory=dict)


def _lua_str(s: str) -> str:
    level = "=" * 4
    while f"]{level}]" in s:
        level += "="
    return f"[{level}[{s}]{level}]"


# Every wrk thread gets an id and a clock. A thread that runs out of its share (the request cap,
# or its slice of a request list) writes its start and stop wall-clock times and stops: wrk's own
# "N requests in D s" always uses the full -d duration, which is wrong for count-bounded runs.
_WRK_COMMON = """
local counter = 0
function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
end
local function now()
  local p = io.popen("date +%s.%N")
  local t = p:read("*l")
  p:close()
  return t
end
function mark_stop()
  local f = io.open(stamp_prefix .. tostring(tid), "w")
  f:write(started .. " " .. now() .. "\\n")
  f:close()
  wrk.thread:stop()
end
"""

_WRK_STATIC = _WRK_COMMON + """
wrk.method = {method}
wrk.path = {path}
wrk.body = {body}
{headers}
stamp_prefix = {stamp}
local max_requests = {max_requests}
local sent = 0
local req = nil
function request()
  if sent == 0 then
    started = now()
    req = wrk.format()
  end
  sent = sent + 1
  if sent == max_requests then mark_stop() end
  return req
end
"""

# One line per request: method \\t path \\t body (- for none) \\t header:value \\t ... Each wrk thread takes
# every n-th line; when its share runs out it stops (the last one may be sent twice: rejected).
_WRK_LINES = _WRK_COMMON + """
function init(args)
  local nthreads = tonumber(args[2])
  stamp_prefix = args[3]
  lines = {}
  local i = 0
  for line in io.lines(args[1]) do
    if i % nthreads == tid then table.insert(lines, line) end
    i = i + 1
  end
  idx = 0
end
local function split(s)
  local out = {}
  for part in string.gmatch(s, "([^\\t]+)") do table.insert(out, part) end
  return out
end
function request()
  if idx == 0 then started = now() end
  idx = idx + 1
  if idx >= #lines then
    if idx == #lines then mark_stop() end
    idx = #lines
  end
  local f = split(lines[idx])
  local headers = {}
  for k = 4, #f do
    local name, value = string.match(f[k], "^([^:]+):%s*(.*)$")
    headers[name] = value
  end
  local body = f[3]
  if body == "-" then body = nil end
  return wrk.format(f[1], f[2], headers, body)
end
"""

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if not m:
        return float("nan")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _parse_wrk(out: str) -> Result:
    lat = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", out, re.M))
    m = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)", out)
    requests = int(m.group(1)) if m else 0
    seconds = _ms(m.group(2) + m.group(3)) / 1e3 if m else float("nan")
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    errors = (int(non2xx.group(1)) if non2xx else 0) + (
        sum(int(x) for x in sock.groups()) if sock else 0)
    return Result(requests, seconds, float(rps.group(1)) if rps else 0.0,
                  _ms(lat.get("50", "nan")), _ms(lat.get("99", "nan")), errors, "wrk")


def wrk_run(base: str, req: Request | list[Request], *, connections: int, duration: float,
            max_requests: int, tmp: Path, threads: int = 2) -> Result:
    """Drive ``base`` with wrk: one fixed request, or a list consumed once each (then stop)."""
    threads = max(1, min(threads, connections))
    if isinstance(req, list):
        threads = max(1, min(threads, len(req)))
    tag = f"wrk-{os.getpid()}-{time.monotonic_ns()}"
    script = tmp / f"{tag}.lua"
    stamp = str(tmp / f"{tag}.stamp.")
    args: list[str] = []
    if isinstance(req, Request):
        headers = "\n".join(f"wrk.headers[ {_lua_str(k)} ] = {_lua_str(v)}"
                            for k, v in req.headers.items())
        script.write_text(_WRK_STATIC.format(
            method=_lua_str(req.method), path=_lua_str(req.path),
            body=_lua_str(req.body) if req.body is not None else "nil", headers=headers,
            stamp=_lua_str(stamp), max_requests=max(1, max_requests // threads)))
    else:
        lines = tmp / f"{tag}.lines"
        with open(lines, "w") as f:
            for r in req:
                # "-" for no body: the Lua split drops empty fields.
                fields = [r.method, r.path, r.body or "-",
                          *(f"{k}: {v}" for k, v in r.headers.items())]
                assert all("\t" not in x and "\n" not in x for x in fields)
                f.write("\t".join(fields) + "\n")
        script.write_text(_WRK_LINES)
        args = ["--", str(lines), str(threads), stamp]
    cmd = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{max(1, round(duration))}s",
           "--latency", "--timeout", "10s", "-s", str(script), base, *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60)
    if out.returncode != 0 or out.stderr.strip():
        # wrk reports a Lua error on stderr and then runs its default request: never count that.
        raise RuntimeError(f"wrk failed: {out.stderr.strip()[:300]}")
    result = _parse_wrk(out.stdout)
    stamps = []
    for i in range(threads):
        with contextlib.suppress(OSError, ValueError):
            a, b = Path(f"{stamp}{i}").read_text().split()
            stamps.append((float(a), float(b)))
    if len(stamps) == threads:
        # Every thread ran out of requests before -d: the run lasted until the last one stopped.
        elapsed = max(b for _, b in stamps) - min(a for a, _ in stamps)
        if elapsed > 0:
            result.seconds = elapsed
            result.rps = result.requests / elapsed
    return result


async def _py_run(base: str, next_request: Callable[[], Request | None], *, connections: int,
                  duration: float, max_requests: int) -> Result:
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    errors = 0
    issued = 0
    deadline = time.perf_counter() + duration
    connector = aiohttp.TCPConnector(limit=connections, force_close=False)
    timeout = aiohttp.ClientTimeout(total=10)

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal issued, errors
        while issued < max_requests and time.perf_counter() < deadline:
            req = next_request()
            if req is None:
                return
            issued += 1
            t0 = time.perf_counter()
            try:
                async with session.request(req.method, base + req.path, headers=req.headers,
                                           data=req.body) as r:
                    await r.read()
                    status = r.status
            except (TimeoutError, aiohttp.ClientError):
                errors += 1
                continue
            latencies.append(time.perf_counter() - t0)
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            if not 200 <= status < 400:
                errors += 1

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(connections)))
        elapsed = time.perf_counter() - t0
    latencies.sort()

    def pct(p: float) -> float:
        if not latencies:
            return float("nan")
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1e3

    done = len(latencies)
    return Result(done, elapsed, done / elapsed if elapsed else 0.0, pct(0.50), pct(0.99), errors,
                  "python", statuses)


def py_run(base: str, req: Request | list[Request], *, connections: int, duration: float,
           max_requests: int) -> Result:
    """The fallback generator: ``connections`` keep-alive clients in one asyncio loop."""
    if isinstance(req, Request):
        def next_request() -> Request | None:
            return req  # type: ignore[return-value]
    else:
        pending = list(reversed(req))

        def next_request() -> Request | None:
            return pending.pop() if pending else None
    return asyncio.run(_py_run(base, next_request, connections=connections, duration=duration,
                               max_requests=max_requests))


@dataclass
class FixedRateResult:
    """An open-loop run: requests sent at scheduled times, latency from the scheduled time."""

    requests: int
    seconds: float
    rate: float  # asked for, req/s
    rps: float  # answered, req/s
    p50_ms: float
    p99_ms: float
    max_ms: float
    errors: int
    late_ms_p99: float  # how late the generator itself sent (its own lag, included above)


async def _fixed_rate(base: str, reqs: Sequence[Request], rate: float) -> FixedRateResult:
    latencies: list[float] = []
    lateness: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=0, force_close=False)  # never queue client-side
    timeout = aiohttp.ClientTimeout(total=30)

    async def one(session: aiohttp.ClientSession, req: Request, due: float) -> None:
        nonlocal errors
        try:
            async with session.request(req.method, base + req.path, headers=req.headers,
                                       data=req.body) as r:
                await r.read()
                ok = 200 <= r.status < 400
        except (TimeoutError, aiohttp.ClientError):
            ok = False
        latencies.append(time.perf_counter() - due)
        errors += not ok

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks: list[asyncio.Task[None]] = []
        t0 = time.perf_counter() + 0.05
        for k, req in enumerate(reqs):
            due = t0 + k / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            lateness.append(max(0.0, time.perf_counter() - due))
            tasks.append(asyncio.create_task(one(session, req, due)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - t0
    latencies.sort()
    lateness.sort()

    def pct(values: list[float], p: float) -> float:
        return values[min(len(values) - 1, int(p * len(values)))] * 1e3 if values else float("nan")

    return FixedRateResult(len(latencies), elapsed, rate, len(latencies) / elapsed,
                           pct(latencies, 0.50), pct(latencies, 0.99),
                           latencies[-1] * 1e3 if latencies else float("nan"), errors,
                           pct(lateness, 0.99))


def fixed_rate_run(base: str, reqs: Sequence[Request], *, rate: float) -> FixedRateResult:
    """Open loop, free of coordinated omission: request k is sent at ``k / rate`` s whether or
    not earlier ones were answered, and its latency counts from that scheduled time (a slow
    server, or a generator that fell behind, shows as latency, not as fewer samples)."""
    return asyncio.run(_fixed_rate(base, reqs, rate))


def drive(base: str, req: Request | list[Request], *, connections: int, duration: float,
          max_requests: int, tmp: Path, use_wrk: bool) -> Result:
    if use_wrk:
        return wrk_run(base, req, connections=connections, duration=duration,
                       max_requests=max_requests, tmp=tmp)
    return py_run(base, req, connections=connections, duration=duration,
                  max_requests=max_requests)


def temp_dir(prefix: str) -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix=prefix)


def report(doc: Any, text: str, json_path: str | None, markdown_path: str | None) -> int:
    """A benchmark's results: the document to ``json_path`` and the Markdown section to
    ``markdown_path`` when asked, the section printed; the exit status of its ``main``."""
    if json_path:
        Path(json_path).write_text(json.dumps(doc, indent=2, default=str))
    if markdown_path:
        Path(markdown_path).write_text(text)
    print(text)
    return 0


def dumps(doc: Any) -> str:
    return json.dumps(doc, separators=(",", ":"))
