"""HTTP load benchmark: the service (1 and 2 workers; SQLite and PostgreSQL) against a bare aiohttp
JSON app measured in the same run, on loopback.

Run: python bench/http_bench.py [--quick] [--json FILE] [--markdown FILE] [--no-profile]
     (``make bench`` runs it through bench/run.py, which writes bench/RESULTS.md)

Scenarios, each at 16 and 64 connections:
  info     GET /api/v1/system/info (public, no chain)
  status   GET /api/v1/authn/status and /api/v1/authz/status, alternating (public, no chain)
  read     GET /api/v1/databases with carol's token (AuthN + AuthZ + audit record)
  compose  POST /api/v1/compose/import, a 10-service file, alice's token
  chain    POST /api/v1/installer/actions in prod, each request with its own fresh approved
           ticket (pre-created: alice, stepped up, requests; bob, stepped up, approves), i.e.
           AuthN + AuthZ + step-up + ticket check + consume + task event + audit in one commit.
Time-bound runs stop after --duration seconds or --max-requests requests; chain runs after their
tickets are used (or --duration x 4). wrk is used when installed, else an aiohttp-client generator.
PostgreSQL runs use a fresh schema in $CONTROLPLANE_BENCH_PG_DSN (default
postgresql://postgres@127.0.0.1:5432/test), dropped afterwards; they are skipped (and say so)
when the server is unreachable. With py-spy installed, one worker of the SQLite 2-worker service
is profiled under the read and chain loads. Nothing here asserts anything about timings.

Each service run also reads /metrics before and after: the store transactions it cost (every
worker's, per request; the status scenarios should cost only the background checks') and the
decision cache hit rate over its decisions (the chain target is >= 95% with a distinct task id
per request).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h
import aiohttp
from prometheus_client.parser import text_string_to_metric_families

API = "/api/v1"
RESOURCE = {"app": "web", "version": "1.2.3"}
CONNECTIONS = (16, 64)
SCENARIOS = ("info", "status", "read", "compose", "chain")


# ------------------------------------------------------------------------------ request bodies


def compose_fields(n: int = 10) -> dict[str, Any]:
    """``n`` normalized services built from examples/compose (hardened and risky alternately)."""
    from service.compose.normalize import normalize_files

    examples = h.REPO / "examples/compose"
    good = normalize_files([examples / "good.compose.yaml"], environ={})
    risky = normalize_files([examples / "risky.compose.yaml"], environ={})
    templates = list(good["services"].values()) + list(risky["services"].values())
    fields = {k: v for k, v in good.items() if k != "services"}
    for key in ("secrets", "volumes", "networks", "configs"):
        merged = {**risky.get(key, {}), **good.get(key, {})}
        if merged:
            fields[key] = merged
    fields["name"] = "bench"
    fields["services"] = {f"svc-{i}": templates[i % len(templates)] for i in range(n)}
    return fields


def installer_body(task_id: str) -> str:
    return h.dumps({"task_id": task_id, "action": "installer.run.execute", "env": "prod",
                    "resource": RESOURCE})


# ------------------------------------------------------------------------------ tickets


async def make_tickets(base: str, ids: h.Identities, n: int, *, concurrency: int = 32,
                       prefix: str = "t") -> tuple[list[tuple[str, str]], dict[str, float]]:
    """``n`` approved prod tickets for alice's installer action: alice (stepped up) requests,
    bob (stepped up) approves. Returns [(id, nonce)] and the create/approve rates."""
    timeout = aiohttp.ClientTimeout(total=30)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        alice = await ids.stepped_up(session, "alice", fresh_for=120)
        bob = await ids.stepped_up(session, "bob", fresh_for=120)
        create = h.dumps({"subject_id": "alice", "env": "prod", "action": "installer.run.execute",
                          "resource": RESOURCE, "reason": "bench"})
        review = h.dumps({"decision": "approve", "reason": "bench"})
        tickets: list[tuple[str, str]] = []
        failures: Counter[str] = Counter()

        async def pool(jobs: list[Any], fn: Any) -> float:
            queue = list(reversed(jobs))

            async def worker() -> None:
                while queue:
                    await fn(queue.pop())

            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return time.perf_counter() - t0

        async def create_one(_: int) -> None:
            async with session.post(base + API + "/approvals", data=create, headers={
                    "Authorization": f"Bearer {alice}", "Content-Type": "application/json"}) as r:
                doc = await r.json()
                if r.status != 201:
                    failures[f"create {r.status} {doc.get('code')}"] += 1
                    return
                tickets.append((doc["id"], doc["nonce"]))

        approved: list[tuple[str, str]] = []

        async def approve_one(ticket: tuple[str, str]) -> None:
            async with session.post(f"{base}{API}/approvals/{ticket[0]}/reviews", data=review,
                                    headers={"Authorization": f"Bearer {bob}",
                                             "Content-Type": "application/json"}) as r:
                if r.status not in (200, 201):
                    failures[f"review {r.status} {(await r.json()).get('code')}"] += 1
                    return
                approved.append(ticket)

        t_create = await pool(list(range(n)), create_one)
        t_approve = await pool(list(tickets), approve_one)
    if failures:
        raise RuntimeError(f"ticket preparation failed: {dict(failures)}")
    return approved, {"create_per_s": n / t_create, "approve_per_s": len(tickets) / t_approve}


# ------------------------------------------------------------------------------ profiling


def profile_summary(raw: Path, top: int = 12) -> dict[str, Any]:
    """Self and inclusive shares per function of py-spy's raw (collapsed) stacks, for the
    event-loop thread and for every other thread (the SQLite executor, to_thread pools)."""
    per_thread: dict[str, Counter[str]] = defaultdict(Counter)
    inclusive: dict[str, Counter[str]] = defaultdict(Counter)
    totals: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        frames = stack.split(";")
        names = [f for f in frames if not f.startswith(("process ", "thread "))]
        # py-spy --threads: the first frame is "thread (tid): name"; group threads by name
        # (MainThread runs the event loop; store-sqlite_N the store; asyncio_N to_thread).
        head = frames[0]
        tname = head.split(": ", 1)[1] if head.startswith("thread ") and ": " in head else "?"
        tname = tname.rstrip("0123456789").rstrip("_") or tname
        kind = "event loop (MainThread)" if tname == "MainThread" else f"{tname} threads"
        totals[kind] += count
        if names:
            per_thread[kind][_func(names[-1])] += count
        for fn in {_func(f) for f in names}:
            inclusive[kind][fn] += count
    out: dict[str, Any] = {"samples": dict(totals)}
    grand = sum(totals.values()) or 1
    for kind, counter in per_thread.items():
        total = totals[kind] or 1
        out[kind] = {
            "share_of_all": totals[kind] / grand,
            "self": [(fn, c / total) for fn, c in counter.most_common(top)],
            "inclusive": [(fn, c / total) for fn, c in inclusive[kind].most_common(top * 4)
                          if not _boring(fn)][:top],
        }
    return out


def _func(frame: str) -> str:
    # "name (path/to/file.py:123)" -> "name (path/to/file.py)"; keep paths repo-relative.
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("/site-packages/", "/lib/python3"):
        if marker in where:
            where = where.split(marker, 1)[1]
            break
    where = where.replace(str(h.REPO) + "/", "")
    return f"{name} ({where})" if where else name


def _boring(fn: str) -> bool:
    return any(s in fn for s in (
        "run_forever", "_run_once", "_run (asyncio/events", "<module>", "run_app", "run_until",
        "serve_worker", "_worker_entry", "_bootstrap", "main (", "run (", "_main (", "spawn_main",
        "start_request", "_handle_request", "data_received", "_run_module", "run_module",
        "_run_code", "_worker (concurrent", "_bootstrap_inner", "run (threading", "_handle (",
        "_launch", "_Popen", "__init__ (multiprocessing", "func (cli/", "runner.run",
        "_on_request", "<listcomp>", "start (multiprocessing", "wait (threading",
    ))


def record_profile(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    exe = h.pyspy()
    if exe is None:
        return None
    return subprocess.Popen(
        [exe, "record", "-p", str(pid), "-d", str(max(1, int(seconds))), "-r", "250",
         "--nonblocking", "--threads", "--format", "raw", "-o", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


# ------------------------------------------------------------------------------ one target


class Bench:
    def __init__(self, opts: argparse.Namespace, tmp: Path):
        self.opts = opts
        self.tmp = tmp
        self.use_wrk = h.wrk_version() is not None and not opts.no_wrk
        self.rows: list[dict[str, Any]] = []
        self.tickets: list[dict[str, Any]] = []
        self.profiles: dict[str, Any] = {}
        self.notes: list[str] = []
        self.references: list[dict[str, Any]] = []
        self.rounds: list[dict[str, dict[str, Any]]] = []
        self.last: dict[str, Any] = {}

    def log(self, msg: str) -> None:
        print(f"[http_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    def measure(self, label: dict[str, Any], base: str, req: h.Request | list[h.Request],
                conns: int, *, warmup: bool = True, duration: float | None = None,
                max_requests: int | None = None, server: h.Server | None = None,
                keep: bool = True) -> h.Result:
        duration = duration or self.opts.duration
        max_requests = max_requests or self.opts.max_requests
        if warmup and isinstance(req, h.Request):
            h.drive(base, req, connections=conns, duration=self.opts.warmup,
                    max_requests=max_requests, tmp=self.tmp, use_wrk=self.use_wrk)
        pids = server.worker_pids() if server is not None else []
        counters0 = service_counters(base) if label.get("target") == "service" else None
        # The database's own CPU (its local server processes), for the PostgreSQL rows.
        db0 = h.postgres_cpu() if label.get("backend") == "postgres" else None
        # ... and the backends serving this service's workers alone (pg_stat_activity rows
        # whose client port is one of the workers' sockets): other users of the server excluded.
        own0 = h.own_backends_cpu(pids) if db0 is not None and pids else None
        cpu0, t0 = h.cpu_seconds(pids), time.monotonic()
        result = h.drive(base, req, connections=conns, duration=duration,
                         max_requests=max_requests, tmp=self.tmp, use_wrk=self.use_wrk)
        # Server CPU over the run: in cores (2.0 = both cores of a 2-core box busy), over the
        # time the requests took (a count-bound wrk run idles after its list until -d ends),
        # and per request.
        cpu = h.cpu_seconds(pids) - cpu0 if pids else None
        db_cpu = h.postgres_cpu_since(db0) if db0 is not None else None
        own_cpu = h.own_backends_cpu_since(pids, own0) if own0 is not None else None
        active = min(time.monotonic() - t0, result.seconds or float("inf"))
        cores = cpu / active if cpu is not None and active > 0 else None
        row = {"server_cores": cores,
               "cpu_ms_per_req": 1000 * cpu / result.requests if cpu and result.requests else None,
               **label, "conns": conns, "rps": result.rps, "p50_ms": result.p50_ms,
               "p99_ms": result.p99_ms, "requests": result.requests, "errors": result.errors,
               "seconds": result.seconds, "generator": result.generator,
               "db_cpu_ms_per_req": 1000 * db_cpu / result.requests
               if db_cpu is not None and result.requests else None,
               "own_db_cpu_ms_per_req": 1000 * own_cpu / result.requests
               if own_cpu is not None and result.requests else None}
        if counters0 is not None:
            counters1 = service_counters(base)
            # Store transactions over the run (every worker's), less the closing /metrics
            # scrape's own reads; the background status check and key sync run once a second.
            tx = counters1["store_tx"] - counters0["store_tx"] - counters1["scrape_tx"]
            hits = counters1["decisions_cached"] - counters0["decisions_cached"]
            misses = counters1["decisions_uncached"] - counters0["decisions_uncached"]
            trips = counters1["store_trips"] - counters0["store_trips"]
            row.update({"store_tx": tx, "store_tx_per_req": tx / max(1, result.requests),
                        "store_trips_per_req": trips / max(1, result.requests)
                        if label.get("backend") == "postgres" else None,
                        "decisions": hits + misses,
                        "decision_hit_rate": hits / (hits + misses) if hits + misses else None})
        if keep:
            self.rows.append(row)
        self.last = row
        self.log(f"{label} c={conns}: {result.rps:,.0f} req/s p50 {result.p50_ms:.2f} ms "
                 f"p99 {result.p99_ms:.2f} ms ({result.requests} req, {result.errors} errors)")
        return result

    def baseline(self, workers: int) -> None:
        with h.baseline(workers, self.tmp) as server:
            for conns in CONNECTIONS:
                self.measure({"target": "baseline", "backend": "-", "workers": workers,
                              "scenario": "info"}, server.base,
                             h.Request("GET", API + "/system/info"), conns, server=server)

    def peer(self, workers: int) -> None:
        """The reference peer's authorized read (``peer_read.py``), same run as the service's."""
        if "read" not in self.opts.scenarios or not h.PEER_READ.exists():
            return
        # As it is run by default, and with uvloop and batched log writes (the service has
        # both): the comparison is made against the better of the two.
        for target, extra in (("peer", ()), ("peer+uvloop", ("--uvloop", "--log", "batched"))):
            try:
                with h.peer(workers, self.tmp, *extra) as (server, token):
                    for conns in CONNECTIONS:
                        self.measure({"target": target, "backend": "sqlite", "workers": workers,
                                      "scenario": "read"}, server.base,
                                     _read_request(token),
                                     conns, server=server)
            except Exception as exc:  # a reference that cannot run is a note, not a failure
                self.notes.append(f"peer_read.py {' '.join(extra)} could not run: "
                                  f"{type(exc).__name__}: {exc}")

    def read_rounds(self, rounds: int, conns: int = 64) -> None:
        """The authorized read against the bare app and the peer, in rounds: the three servers
        (2 workers each, SQLite) started once and kept up, idle but for the one driven, then in
        each round the three driven back to back, in alternating order (bare, peer, project;
        then project, peer, bare), the ratios taken within a round and their median reported.
        This machine's speed drifts from minute to minute (the same row of two runs differed by
        up to 25%), so ratios of rows measured minutes apart mislead; three measured within
        seconds of each other, in both orders, do not."""
        if "read" not in self.opts.scenarios or not h.PEER_READ.exists() or rounds < 1:
            return
        with contextlib.ExitStack() as stack:
            try:
                peer, token = stack.enter_context(
                    h.peer(2, self.tmp, "--uvloop", "--log", "batched"))
            except Exception as exc:  # a reference that cannot run is a note, not a failure
                self.notes.append(f"read rounds: peer_read.py could not run: "
                                  f"{type(exc).__name__}: {exc}")
                return
            bare = stack.enter_context(h.baseline(2, self.tmp))
            state = self.tmp / "state-rounds"
            state.mkdir(mode=0o700)
            project = stack.enter_context(h.service(state, workers=2))
            targets = [
                ("bare", {"target": "baseline", "backend": "-", "scenario": "info"}, bare,
                 h.Request("GET", API + "/system/info")),
                ("peer", {"target": "peer+uvloop", "scenario": "read"}, peer,
                 _read_request(token)),
                ("project", {"target": "service", "scenario": "read"}, project,
                 _read_request(asyncio.run(_login(h.Identities(project.base), "carol")))),
            ]
            for _, _, server, req in targets:  # warm each once: caches filled, connections made
                h.drive(server.base, req, connections=conns, duration=self.opts.warmup,
                        max_requests=self.opts.max_requests, tmp=self.tmp, use_wrk=self.use_wrk)
            for i in range(rounds):
                got: dict[str, dict[str, Any]] = {}
                label = {"backend": "sqlite", "workers": 2, "round": i + 1}
                for name, extra, server, req in (targets if i % 2 == 0 else targets[::-1]):
                    self.measure({**label, **extra}, server.base, req, conns, server=server,
                                 keep=False, warmup=False)
                    got[name] = self.last
                self.rounds.append(got)

    def service(self, backend: str, workers: int) -> None:
        env: dict[str, str] = {}
        schema = None
        if backend == "postgres":
            schema = f"bench_http_{os.getpid()}_{workers}"
            env = {"CONTROLPLANE_STORE__BACKEND": "postgres",
                   "CONTROLPLANE_STORE__POSTGRES__DSN": h.PG_DSN,
                   "CONTROLPLANE_STORE__POSTGRES__SCHEMA": schema}
        state = self.tmp / f"state-{backend}-{workers}"
        state.mkdir(mode=0o700)
        try:
            with h.service(state, workers=workers, env=env) as server:
                self._scenarios(server, backend, workers)
        finally:
            if schema is not None:
                h.pg_drop_schema(schema)

    def _scenarios(self, server: h.Server, backend: str, workers: int) -> None:
        base = server.base
        ids = h.Identities(base)

        async def logins() -> None:
            async with aiohttp.ClientSession() as session:
                for subject in ("alice", "bob", "carol"):
                    await ids.login(session, subject)

        asyncio.run(logins())
        label = {"target": "service", "backend": backend, "workers": workers}
        json_headers = {"Content-Type": "application/json"}
        requests = {
            "info": h.Request("GET", API + "/system/info"),
            "status": [h.Request("GET", API + "/authn/status"),
                       h.Request("GET", API + "/authz/status")] * 20_000,
            "read": _read_request(ids.tokens['carol']),
            "compose": h.Request("POST", API + "/compose/import",
                                 {"Authorization": f"Bearer {ids.tokens['alice']}", **json_headers},
                                 h.dumps({"env": "prod", "fields": compose_fields(10)})),
        }
        profile = (not self.opts.no_profile and backend == self.opts.profile_store and workers == 2
                   and h.pyspy() is not None)
        for name in ("info", "status", "read", "compose"):
            if name not in self.opts.scenarios:
                continue
            for conns in CONNECTIONS:
                self.measure({**label, "scenario": name}, base, requests[name], conns,
                             server=server)
            if profile:
                self._profile(server, name, lambda n=name: h.drive(
                    base, requests[n], connections=64, duration=self.opts.profile_s,
                    max_requests=self.opts.max_requests, tmp=self.tmp, use_wrk=self.use_wrk))
        if "chain" not in self.opts.scenarios:
            return
        for conns in CONNECTIONS:
            batch = self._chain_requests(base, ids, backend, workers, conns)
            # The tickets' own background work (sealing their records, delivering their
            # outbox events) is theirs: the chain's figures start once it is done.
            h.settle(server.worker_pids())
            self.measure({**label, "scenario": "chain"}, base, batch, conns, warmup=False,
                         duration=self.opts.duration * 4, max_requests=len(batch),
                         server=server)
        if backend == "postgres" and workers == 2:
            self._reference_chain()
        if profile:
            batch = self._chain_requests(base, ids, backend, workers, 64, record=False)
            self._profile(server, "chain", lambda: h.drive(
                base, batch, connections=64, duration=self.opts.profile_s * 2,
                max_requests=len(batch), tmp=self.tmp, use_wrk=self.use_wrk))

    def _chain_requests(self, base: str, ids: h.Identities, backend: str, workers: int,
                        conns: int, *, record: bool = True) -> list[h.Request]:
        n = self.opts.tickets
        tickets, rates = asyncio.run(make_tickets(base, ids, n))
        if record:
            self.tickets.append({"backend": backend, "workers": workers, "tickets": n, **rates})
            self.log(f"{n} tickets: create {rates['create_per_s']:,.0f}/s, "
                     f"approve {rates['approve_per_s']:,.0f}/s")
        # The chain run must finish inside alice's step-up window (300 s).
        alice = ids.stepped["alice"][0]
        tag = f"{backend}-{workers}-{conns}-{time.monotonic_ns()}"
        return [h.Request("POST", API + "/installer/actions", {
            "Authorization": f"Bearer {alice}", "Content-Type": "application/json",
            "Approval-Ticket": tid, "Approval-Nonce": nonce,
        }, installer_body(f"bench-{tag}-{i}")) for i, (tid, nonce) in enumerate(tickets)]

    def _reference_chain(self) -> None:
        """The reference's production run without HTTP (``../shared/reference/pg_chain.py``,
        one server-side function call per run), measured right after the service's chain."""
        script = h.REPO.parent / "shared" / "reference" / "pg_chain.py"
        if not script.exists():
            script = Path("/work/shared/reference/pg_chain.py")
        if not script.exists():
            self.notes.append("reference pg_chain.py not found: no reference row")
            return
        runs = min(self.opts.tickets * 2, 4000)
        proc = h.run_reaped(
            [sys.executable, str(script), "--dsn", h.PG_DSN, "--mode", "func", "--runs",
             str(runs), "--procs", "2", "--conc", "16"],
            timeout=600, cwd=h.REPO,
            env={**os.environ, "CP_REPO": str(h.REPO)})
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode or not lines:
            self.notes.append("reference pg_chain.py failed: " + proc.stderr.strip()[-300:])
            return
        ref = json.loads(lines[-1])
        backend, client = ref.get("pg_backend_cpu_ms_per_run"), ref.get("client_cpu_ms_per_run")
        if backend is not None and client and backend < 0.1 * client:
            # Its backends are found by their process titles; a run where that match missed
            # them reads ~0 (seen: 0.001 ms beside 0.22 ms of client CPU). Not a figure.
            self.notes.append(f"reference pg_chain.py: its own-backend CPU read {backend} ms a "
                              f"run beside {client} ms of client CPU, so its backends were not "
                              "found; not shown")
            ref["pg_backend_cpu_ms_per_run"] = None
        self.references.append(ref)
        self.log(f"reference pg_chain func: {ref}")

    def _profile(self, server: h.Server, name: str, load: Any) -> None:
        pid = server.worker_pids()[0]
        raw = self.tmp / f"profile-{name}.txt"
        proc = record_profile(pid, self.opts.profile_s, raw)
        if proc is None:
            return
        time.sleep(0.3)
        result = load()
        _, err = proc.communicate(timeout=self.opts.profile_s + 60)
        if proc.returncode != 0 or not raw.exists():
            self.notes.append(f"py-spy failed for {name}: {err.decode(errors='replace')[-200:]}")
            return
        self.profiles[name] = {"rps_during_profile": result.rps, **profile_summary(raw)}
        if self.opts.profile_dir:
            dest = Path(self.opts.profile_dir)
            dest.mkdir(parents=True, exist_ok=True)
            (dest / raw.name).write_bytes(raw.read_bytes())
        self.log(f"profiled {name} on worker {pid}")


# ------------------------------------------------------------------------------ report


def _read_request(token: str) -> h.Request:
    """The authorized read, as every target of the ``read`` scenario is sent it."""
    return h.Request("GET", API + "/databases", {"Authorization": f"Bearer {token}"})


async def _login(ids: h.Identities, subject: str) -> str:
    async with aiohttp.ClientSession() as session:
        return await ids.login(session, subject)


def run(opts: argparse.Namespace) -> dict[str, Any]:
    with h.temp_dir("cp-http-bench-") as tmp_s:
        tmp = Path(tmp_s)
        bench = Bench(opts, tmp)
        backends = ["sqlite"]
        pg_reason = h.pg_available() if not opts.no_postgres else "disabled with --no-postgres"
        if pg_reason is None:
            backends.append("postgres")
        else:
            bench.notes.append(f"PostgreSQL skipped: {pg_reason}")
        if not bench.use_wrk:
            bench.notes.append("wrk not found: the aiohttp-client generator shares the CPU with "
                               "the server, so these numbers are lower bounds")
        started = time.monotonic()
        if 2 in opts.workers:
            bench.log(f"authorized read in {opts.rounds} rounds: bare, peer, project")
            bench.read_rounds(opts.rounds)
        for workers in opts.workers:
            bench.log(f"baseline, {workers} worker(s)")
            bench.baseline(workers)
            bench.log(f"peer, {workers} worker(s)")
            bench.peer(workers)
        for backend in backends:
            for workers in opts.workers:
                bench.log(f"service, {backend}, {workers} worker(s)")
                bench.service(backend, workers)
        elapsed = time.monotonic() - started
    machine = h.machine()
    if "postgres" in backends:
        machine["postgresql"] = h.pg_version() or "?"
    return {"machine": machine, "rows": bench.rows, "tickets": bench.tickets,
            "profiles": bench.profiles, "profile_store": opts.profile_store,
            "notes": bench.notes, "references": bench.references, "elapsed_s": elapsed,
            "read_rounds": bench.rounds,
            "options": {"duration_s": opts.duration, "warmup_s": opts.warmup,
                        "max_requests": opts.max_requests, "tickets": opts.tickets,
                        "quick": opts.quick}}


def _baseline_cpu(rows: list[dict[str, Any]], workers: int, conns: int) -> float | None:
    for r in rows:
        if r["target"] == "baseline" and r["workers"] == workers and r["conns"] == conns:
            return r.get("cpu_ms_per_req")  # type: ignore[no-any-return]
    return None


def _baseline_rps(rows: list[dict[str, Any]], workers: int, conns: int) -> float | None:
    for r in rows:
        if r["target"] == "baseline" and r["workers"] == workers and r["conns"] == conns:
            return float(r["rps"])
    return None


def markdown(doc: dict[str, Any]) -> str:
    rows = doc["rows"]
    out = ["## HTTP load (`bench/http_bench.py`)", ""]
    o = doc["options"]
    gen = rows[0]["generator"] if rows else "?"
    out.append(f"Generator: {gen}; time-bound runs {o['duration_s']} s after a {o['warmup_s']} s "
               f"warm-up (cap {o['max_requests']:,} requests); chain runs: {o['tickets']:,} "
               f"fresh approved tickets each, one request per ticket, measured once the "
               f"service is idle after preparing them. Ratio: req/s over the "
               f"bare aiohttp app's at the same workers and connections. Server CPU: cores the server "
               f"processes used while the requests ran (this box has {doc['machine']['nproc']}; the "
               f"generator uses the rest) and their CPU time per request; DB CPU: the local "
               f"PostgreSQL server processes' CPU time per request. Round trips: the service's "
               f"own count (`controlplane_store_round_trips_total`: statements, BEGIN, COMMIT, "
               f"ROLLBACK) per request, background work included. Wall time "
               f"{doc['elapsed_s']:.0f} s.")
    out.append("")
    out.append("| target | store | workers | scenario | conns | req/s | p50 ms | p99 ms | "
               "requests | errors | x baseline | server CPU | CPU ms/req | DB CPU ms/req | "
               "own DB CPU ms/req | "
               "store tx/req | round trips/req | decision cache hits |")
    out.append("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
               "---:|---:|")
    order = {s: i for i, s in enumerate(("info", *SCENARIOS))}
    rows_sorted = sorted(rows, key=lambda r: (r["target"] != "baseline",
                                              not r["target"].startswith("peer"),
                                              r["backend"],
                                              order.get(r["scenario"], 9), r["workers"],
                                              r["conns"]))
    for r in rows_sorted:
        base = _baseline_rps(rows, r["workers"], r["conns"])
        ratio = f"{r['rps'] / base:.1%}" if base else "-"
        cores = f"{r['server_cores']:.2f}" if r.get("server_cores") is not None else "-"
        out.append(f"| {r['target']} | {r['backend']} | {r['workers']} | {r['scenario']} | "
                   f"{r['conns']} | {r['rps']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                   f"{r['requests']:,} | {r['errors']} | {ratio} | {cores} | "
                   + (f"{r['cpu_ms_per_req']:.2f}" if r.get("cpu_ms_per_req") else "-") + " | "
                   + (f"{r['db_cpu_ms_per_req']:.2f}"
                      if r.get("db_cpu_ms_per_req") is not None else "-")
                   + " | "
                   + (f"{r['own_db_cpu_ms_per_req']:.2f}"
                      if r.get("own_db_cpu_ms_per_req") is not None else "-")
                   + " | "
                   + (f"{r['store_tx_per_req']:.3f} ({r['store_tx']:,.0f})"
                      if r.get("store_tx") is not None else "-") + " | "
                   + (f"{r['store_trips_per_req']:.2f}"
                      if r.get("store_trips_per_req") is not None else "-") + " | "
                   + (f"{r['decision_hit_rate']:.1%} of {int(r['decisions']):,}"
                      if r.get("decision_hit_rate") is not None else "-") + " |")
    for ref in doc.get("references", []):
        out += ["", "Reference beside it (`../shared/reference/pg_chain.py --mode func`, no HTTP: "
                "the run's writes as one function call, 2 processes), same run:", "",
                "| runs | runs/s | p50 ms | p99 ms | client CPU ms/run | own backends CPU ms/run |"
                " total ms/run |", "|---:|---:|---:|---:|---:|---:|---:|",
                f"| {ref['runs']:,} | {ref['runs_per_s']:,} | {ref['p50_ms']} | {ref['p99_ms']} | "
                f"{ref['client_cpu_ms_per_run']} | "
                + (f"{ref['pg_backend_cpu_ms_per_run']} | "
                   f"{ref['client_cpu_ms_per_run'] + ref['pg_backend_cpu_ms_per_run']:.2f} |"
                   if ref.get("pg_backend_cpu_ms_per_run") is not None else "- | - |")]
    if doc["tickets"]:
        out += ["", "Ticket preparation over HTTP (32 concurrent clients, Python generator):", "",
                "| store | workers | tickets | create/s | approve/s |", "|---|---:|---:|---:|---:|"]
        for t in doc["tickets"]:
            out.append(f"| {t['backend']} | {t['workers']} | {t['tickets']:,} | "
                       f"{t['create_per_s']:,.0f} | {t['approve_per_s']:,.0f} |")
    out += ["", "### Targets (2 workers)", ""]
    out += read_rounds(doc.get("read_rounds") or [])
    out += targets(rows, doc.get("references", []))
    if doc["profiles"]:
        store = {"sqlite": "SQLite", "postgres": "PostgreSQL"}[doc.get("profile_store", "sqlite")]
        out += ["", f"### Profile (py-spy, one worker of the {store} 2-worker service, 64 conns)",
                ""]
        for name, prof in doc["profiles"].items():
            out.append(f"**{name}** ({prof['rps_during_profile']:,.0f} req/s while sampled; "
                       f"samples: {prof['samples']})")
            out.append("")
            for kind, p in prof.items():
                if not isinstance(p, dict) or "self" not in p:
                    continue
                out.append(f"- {kind} ({p['share_of_all']:.0%} of samples) — inclusive: "
                           + "; ".join(f"`{fn}` {s:.0%}" for fn, s in p["inclusive"][:10]))
                out.append("  — self: " + "; ".join(f"`{fn}` {s:.0%}" for fn, s in p["self"][:8]))
            out.append("")
    if doc["notes"]:
        out += ["", "Notes:", ""] + [f"- {n}" for n in doc["notes"]]
    return "\n".join(out) + "\n"


def read_rounds(rounds: list[dict[str, dict[str, Any]]]) -> list[str]:
    """The headline: the read's ratio to bare and its CPU per read against the peer's, taken
    within each round (``Bench.read_rounds``), and the median over the rounds."""
    usable = [r for r in rounds if all(r.get(k, {}).get("rps") for k in ("bare", "peer",
                                                                          "project"))]
    if not usable:
        return []
    out = [f"Authorized read (GET /api/v1/databases, SQLite, 2 workers, 64 conns) in "
           f"{len(usable)} rounds of bare, peer+uvloop and project back to back (the three "
           f"servers kept up; order reversed every other round):", "",
           "| round | bare req/s | peer req/s | project req/s | peer/bare | project/bare | "
           "CPU ms/read bare | peer | project | project/peer CPU |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    ratios, peer_ratios, cpu_ratios = [], [], []
    for i, r in enumerate(usable, 1):
        bare, peer, proj = r["bare"], r["peer"], r["project"]
        ratio, peer_ratio = proj["rps"] / bare["rps"], peer["rps"] / bare["rps"]
        cpus = [x.get("cpu_ms_per_req") for x in (bare, peer, proj)]
        cpu_ratio = cpus[2] / cpus[1] if cpus[1] and cpus[2] else None
        ratios.append(ratio)
        peer_ratios.append(peer_ratio)
        if cpu_ratio is not None:
            cpu_ratios.append(cpu_ratio)
        out.append(f"| {i} | {bare['rps']:,.0f} | {peer['rps']:,.0f} | {proj['rps']:,.0f} | "
                   f"{peer_ratio:.1%} | {ratio:.1%} | "
                   + " | ".join(f"{c:.3f}" if c else "-" for c in cpus)
                   + (f" | {cpu_ratio:.2f}x |" if cpu_ratio is not None else " | - |"))
    med, peer_med = statistics.median(ratios), statistics.median(peer_ratios)
    out += ["", f"- authorized read vs the reference peer, median of {len(usable)} rounds: "
                f"project {med:.1%} of bare, peer {peer_med:.1%} — "
                f"{'holds' if med >= peer_med else 'does NOT hold'}"
                + (f"; CPU per read {statistics.median(cpu_ratios):.2f}x the peer's (target "
                   f"<= 1.2x) — "
                   f"{'holds' if statistics.median(cpu_ratios) <= 1.2 else 'does NOT hold'}"
                   if cpu_ratios else "")]
    return out


#: The reference's function mode measured 0.32 + 0.32 ms a run when the PostgreSQL CPU target
#: (1.8 ms) was set: the target is this many times the reference, on whatever machine runs it.
PG_TARGET_X_REFERENCE = 1.8 / 0.64


def targets(rows: list[dict[str, Any]], references: Sequence[dict[str, Any]]) -> list[str]:
    # The reference's CPU a run, measured in the same run (None without its backends' share).
    ref_cpu = next((r["client_cpu_ms_per_run"] + r["pg_backend_cpu_ms_per_run"]
                    for r in references if r.get("pg_backend_cpu_ms_per_run") is not None),
                   None)
    out = []
    for r in rows:
        if r["target"] == "service" and r["workers"] == 2 and r["scenario"] == "read":
            base = _baseline_rps(rows, 2, r["conns"])
            peers = [p for p in rows if p["target"] in ("peer", "peer+uvloop")
                     and p["workers"] == 2 and p["conns"] == r["conns"]]
            if base and peers:
                p = max(peers, key=lambda p: p["rps"])  # the better of the peer's two runs
                cpu, pcpu, bcpu = (r.get("cpu_ms_per_req"), p.get("cpu_ms_per_req"),
                                   _baseline_cpu(rows, 2, r["conns"]))
                out.append(f"- authorized read vs the reference peer, same run ({r['backend']}, "
                           f"{r['conns']} conns): bare {base:,.0f} req/s; {p['target']} "
                           f"{p['rps']:,.0f} "
                           f"({p['rps'] / base:.1%} of bare); project {r['rps']:,.0f} "
                           f"({r['rps'] / base:.1%}) — "
                           f"{'holds' if r['rps'] >= p['rps'] else 'does NOT hold'}"
                           + (f"; CPU per read: bare {bcpu:.3f} ms, peer {pcpu:.3f} ms, project "
                              f"{cpu:.3f} ms ({cpu / pcpu:.2f}x the peer, {cpu / bcpu:.1f}x bare)"
                              if cpu and pcpu and bcpu else ""))
            if base:
                ok = r["rps"] >= 0.30 * base
                out.append(f"- authorized read >= 30% of baseline ({r['backend']}, {r['conns']} "
                           f"conns): {r['rps'] / base:.1%} — {'holds' if ok else 'does NOT hold'}")
    for r in rows:
        if r["target"] == "service" and r["workers"] == 2 and r["scenario"] == "chain":
            p99 = 25 if r["backend"] == "sqlite" else 50
            ok = r["rps"] >= 1000 and r["p99_ms"] < p99 and r["errors"] == 0
            out.append(f"- prod chain >= 1,000/s, p99 < {p99} ms ({r['backend']}, {r['conns']} "
                       f"conns): {r['rps']:,.0f}/s, p99 {r['p99_ms']:.1f} ms, {r['errors']} "
                       f"errors — {'holds' if ok else 'does NOT hold'}")
            trips, db = r.get("store_trips_per_req"), r.get("db_cpu_ms_per_req")
            if trips is not None:
                # Where the CPU of a run goes, and how much of the box 1,000 runs/s would take.
                cpu = (r.get("cpu_ms_per_req") or 0.0) + (db or 0.0)
                out.append(f"- round trips per chain run ({r['backend']}, {r['conns']} conns): "
                           f"{trips:.2f}; CPU per run: service {r.get('cpu_ms_per_req') or 0:.2f} "
                           f"ms + database {db or 0:.2f} ms = {cpu:.2f} ms, so 1,000 runs/s "
                           f"would need {cpu:.2f} cores before the load generator's share")
            own = r.get("own_db_cpu_ms_per_req")
            if own is not None:
                cpu = (r.get("cpu_ms_per_req") or 0.0) + own
                out.append(f"- CPU per chain run, the service's processes plus its own "
                           f"PostgreSQL backends ({r['backend']}, {r['conns']} conns): "
                           f"{r.get('cpu_ms_per_req') or 0:.2f} + {own:.2f} = {cpu:.2f} ms "
                           f"(target <= 1.8 ms) — {'holds' if cpu <= 1.8 else 'does NOT hold'}"
                           + (f"; {cpu / ref_cpu:.1f}x the reference's function mode in this "
                              f"run ({ref_cpu:.2f} ms; the target was "
                              f"{PG_TARGET_X_REFERENCE:.1f}x it when set)" if ref_cpu else ""))
            rate = r.get("decision_hit_rate")
            if rate is not None:
                out.append(f"- decision cache hits >= 95% on the chain ({r['backend']}, "
                           f"{r['conns']} conns, a distinct task id per request): {rate:.1%} "
                           f"— {'holds' if rate >= 0.95 else 'does NOT hold'}")
    for r in rows:
        if r["target"] == "service" and r["workers"] == 2 and r["scenario"] in ("info", "status") \
                and r.get("store_tx") is not None:
            out.append(f"- {r['scenario']} without a store round trip per call ({r['backend']}, "
                       f"{r['conns']} conns): {r['rps']:,.0f} req/s, {r['store_tx']:,.0f} store "
                       f"transactions for {r['requests']:,} requests (the background checks')")
    return out or ["- (no 2-worker runs)"]


def service_counters(base: str) -> dict[str, float]:
    """Store transactions and decisions so far (summed over workers), from /metrics."""
    import urllib.request

    with urllib.request.urlopen(base + "/metrics", timeout=30) as response:  # noqa: S310 (loopback)
        text = response.read().decode()
    out = {"store_tx": 0.0, "store_trips": 0.0, "decisions_cached": 0.0,
           "decisions_uncached": 0.0, "scrape_tx": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "controlplane_store_transactions_total":
                out["store_tx"] += sample.value
            elif sample.name == "controlplane_store_round_trips_total":
                out["store_trips"] += sample.value
            elif sample.name == "controlplane_decisions_total":
                key = "decisions_cached" if sample.labels.get("cached") == "true" \
                    else "decisions_uncached"
                out[key] += sample.value
    # The scrape's own reads (pending approvals, audit head), counted before it rendered.
    out["scrape_tx"] = 2.0
    return out


def options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--duration", type=float, help="seconds per time-bound run (default 5)")
    parser.add_argument("--warmup", type=float, help="warm-up seconds before each run (default 1)")
    parser.add_argument("--max-requests", type=int, default=500_000, help="cap per run")
    parser.add_argument("--tickets", type=int, help="tickets per chain run (default 2000)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--no-wrk", action="store_true", help="use the aiohttp-client generator")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--profile-s", type=float, default=6.0)
    parser.add_argument("--profile-store", choices=("sqlite", "postgres"), default="sqlite",
                        help="which 2-worker service is profiled (default sqlite)")
    parser.add_argument("--profile-dir", help="keep py-spy's raw stacks here")
    parser.add_argument("--rounds", type=int, help="rounds of the bare/peer/project read "
                        "comparison (default 6; 1 with --quick)")
    parser.add_argument("--json", help="write the results document here")
    parser.add_argument("--markdown", help="write the Markdown section here")
    opts = parser.parse_args(argv)
    opts.duration = opts.duration or (1.5 if opts.quick else 5.0)
    opts.warmup = opts.warmup or (0.5 if opts.quick else 1.0)
    opts.tickets = opts.tickets or (300 if opts.quick else 2000)
    opts.rounds = opts.rounds if opts.rounds is not None else (1 if opts.quick else 6)
    if opts.quick:
        opts.no_profile = True
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = options(argv)
    doc = run(opts)
    return h.report(doc, markdown(doc), opts.json, opts.markdown)


if __name__ == "__main__":
    raise SystemExit(main())
