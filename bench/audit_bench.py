"""The audit chain's global section on PostgreSQL: hold time per run, round trips, write ceiling.

Run: python bench/audit_bench.py [--quick] [--runs N] [--json FILE] [--markdown FILE]

The chain's global section is whatever holds the single ``audit_head`` row lock. Two write
paths, measured in the same run on one PostgreSQL:

* before: each run appends its record in its own transaction under the lock, held from the
  locking ``UPDATE`` to the run's COMMIT (``Tx.append_audit``);
* now: each run stages its record in its transaction (no global lock) and, after COMMIT, waits
  while its worker's sealer chains all waiting records in one locked transaction
  (``AuditLog.stage`` / ``settle``): one section per batch.

1, 2 and 4 writer processes (spawned: each its own interpreter, pool and sealer), each with
``CONCURRENCY`` runs in flight. Every transaction is timed at the driver: a transaction that
touches ``audit_head`` is a global section, timed from the start of that statement (its lock
wait included) to the end of COMMIT; ``hold`` leaves the wait out (from the end of that
statement). Reported per run: round trips (statements + BEGIN + COMMIT, over all its
transactions), section time (wait + hold) and hold. The cluster's write ceiling is
runs / (sum of holds): the lock can be held by one transaction at a time, whatever the number of
replicas. Runs/s and p99 are what this (2-core, shared) machine gives, with the writers, the
database and the sealers on the same cores. Each run's transaction holds only the audit
write, so these are bounds for the audit section of a chain run. PostgreSQL:
$CONTROLPLANE_BENCH_PG_DSN, fresh schema, dropped afterwards. Nothing here asserts timings.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import time
import traceback
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _harness as h
import asyncpg.transaction

from service.audit.log import AuditLog
from service.audit.record import seal
from service.store import StoreError, open_store
from service.store.postgres import PostgresStore

VARIANTS = {"lock until each run's COMMIT (before)": "direct",
            "staged, sealed in batches (now)": "staged"}
#: Runs each writer process keeps in flight (a replica serving concurrent requests).
CONCURRENCY = 32


class _Timing:
    """Per transaction: statements, and for global sections (start, lock taken, end)."""

    def __init__(self) -> None:
        self.transactions = 0
        self.statements = 0
        self.sections: list[tuple[float, float, float]] = []
        self.lost = 0  # optimistic seals that lost the race


#: When each task's last COMMIT answered (the end of a locked section: the pool's reset of
#: the connection afterwards is not part of it).
_committed: dict[Any, float] = {}


def _patch_commit() -> None:
    original = asyncpg.transaction.Transaction.commit

    async def commit(self: Any) -> None:
        await original(self)
        _committed[asyncio.current_task()] = time.perf_counter()

    asyncpg.transaction.Transaction.commit = commit  # type: ignore[method-assign]


def _instrument(store: PostgresStore, timing: _Timing) -> None:
    original = store._transaction

    @asynccontextmanager
    async def timed(*, write: bool, single: bool = False) -> Any:
        autocommit = single  # no transaction: each statement commits on its own
        marks: dict[str, float] = {}
        async with original(write=write, single=single) as conn:
            for name in ("execute", "executemany", "fetchone", "fetchall"):
                method = getattr(conn, name)

                async def call(sql: str, *a: Any, _m: Any = method) -> Any:
                    timing.statements += 1
                    # Where the head's row lock is taken (a statement that only reads it
                    # takes none); outside a transaction it is released with the statement.
                    first = "UPDATE audit_head" in sql and "start" not in marks
                    if first:
                        marks["start"] = time.perf_counter()
                    try:
                        result = await _m(sql, *a)
                    finally:
                        if first:
                            marks["locked"] = marks["end"] = time.perf_counter()
                    if first and result is not None and "moved" in result and not result["moved"]:
                        del marks["start"]  # a lost swap: it updated no row, so held no lock
                        timing.lost += 1
                    return result

                setattr(conn, name, call)
            yield conn
        if not autocommit:
            timing.transactions += 1  # BEGIN and COMMIT: two more round trips
            marks["end"] = _committed.get(asyncio.current_task(), 0.0)
        if "start" in marks:
            # Outside a transaction the lock's wait and hold are one statement: all of it counts.
            locked = marks["start"] if autocommit else marks["locked"]
            timing.sections.append((marks["start"], locked, marks["end"]))

    store._transaction = timed  # type: ignore[method-assign]


async def _writer(
    schema: str, variant: str, runs: int, concurrency: int, barrier: Any
) -> dict[str, Any]:
    store = await open_store(h.PG_DSN, schema=schema)  # a pool of 10: the runs + the sealer
    assert isinstance(store, PostgresStore)
    log = AuditLog(store)

    failed = 0

    async def run(i: int) -> float | None:
        nonlocal failed
        entry = {"kind": "bench", "i": i, "at": time.time(), "decision": "allow"}
        t0 = time.perf_counter()
        try:
            async with store.transaction() as tx:
                if variant == "direct":
                    await log.append(entry, tx)
                    staged = None
                else:
                    staged = await log.stage(entry, tx)
            if staged is not None:
                await log.settle(staged)
        except StoreError:  # past the store's deadline (5 s): the run would have answered 503
            failed += 1
            return None
        return time.perf_counter() - t0

    async def lane(lane_no: int, count: int) -> list[float | None]:
        return [await run(lane_no * count + i) for i in range(count)]

    try:
        await asyncio.gather(*(lane(k, 3) for k in range(concurrency)))  # warm the pool
        _patch_commit()
        timing = _Timing()
        _instrument(store, timing)
        await asyncio.to_thread(barrier.wait, 60)
        cpu0, t0 = time.process_time(), time.perf_counter()
        done = await asyncio.gather(*(lane(k, runs // concurrency) for k in range(concurrency)))
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        await store.close()
    return {"latencies": [x for d in done for x in d if x is not None], "failed": failed,
            "elapsed": elapsed, "cpu": cpu,
            "transactions": timing.transactions, "statements": timing.statements,
            "sections": timing.sections, "lost": timing.lost}


def _process(
    schema: str, variant: str, runs: int, concurrency: int, barrier: Any, queue: Any
) -> None:
    try:
        queue.put(asyncio.run(_writer(schema, variant, runs, concurrency, barrier)))
    except BaseException:
        queue.put({"error": traceback.format_exc()})


def _spawn(
    schema: str, variant: str, processes: int, runs: int, concurrency: int
) -> list[dict[str, Any]]:
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_process, args=(schema, variant, runs, concurrency, barrier, queue))
             for _ in range(processes)]
    for p in procs:
        p.start()
    try:
        results = [queue.get(timeout=300) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError("a writer process failed:\n" + errors[0])
    return results


def _summary(results: list[dict[str, Any]], processes: int) -> dict[str, Any]:
    lat = sorted(x for r in results for x in r["latencies"])
    runs = len(lat)
    sections = [s for r in results for s in r["sections"]]
    holds = [end - locked for _, locked, end in sections]
    waits_and_holds = [end - start for start, _, end in sections]
    elapsed = max(r["elapsed"] for r in results)
    return {
        "processes": processes, "runs": runs, "runs_per_s": runs / elapsed,
        "failed": sum(r["failed"] for r in results),
        "p50_ms": lat[runs // 2] * 1000, "p99_ms": lat[min(runs - 1, int(runs * 0.99))] * 1000,
        "round_trips_per_run": sum(r["statements"] + 2 * r["transactions"] for r in results) / runs,
        "sections_per_run": len(sections) / runs,
        "sections": len(sections), "runs_per_section": runs / max(1, len(sections)),
        "lost_swaps_per_run": sum(r["lost"] for r in results) / runs,
        "section_ms_per_run": sum(waits_and_holds) / runs * 1000,
        "hold_ms_per_run": sum(holds) / runs * 1000,
        "hold_ms_per_section_p50": statistics.median(holds) * 1000 if holds else 0.0,
        "ceiling_runs_per_s": runs / sum(holds) if holds else float("inf"),
        "lock_busy": sum(holds) / elapsed,
        "cpu_ms_per_run": sum(r["cpu"] for r in results) / runs * 1000,
    }


#: Batch sizes of the sealing statement timed alone.
BATCHES = (1, 8, 32, 128)


async def _holds(schema: str, repeats: int) -> dict[str, Any]:
    """The hold per run with nothing else running (one coroutine, no lock wait): a run's own
    locked append, and one optimistic sealing statement per batch of ``BATCHES`` runs."""
    store = await open_store(h.PG_DSN, schema=schema)
    assert isinstance(store, PostgresStore)
    log = AuditLog(store)
    out: dict[str, Any] = {}
    try:
        for i in range(5):  # warm the pool and the statement cache
            async with store.transaction() as tx:
                await log.append({"warm": i}, tx)
        _patch_commit()
        timing = _Timing()
        _instrument(store, timing)
        for i in range(repeats):
            async with store.transaction() as tx:
                await log.append({"kind": "bench", "i": i}, tx)
        out["direct"] = statistics.median(end - locked for _, locked, end in timing.sections)
        for batch in BATCHES:
            holds = []
            for r in range(max(3, repeats // 4)):
                ids = [await store.stage_audit({"kind": "bench", "i": i, "r": r}, time.time())
                       for i in range(batch)]
                timing.sections.clear()
                assert len(await store.seal_audit(seal, ids)) == batch
                (section,) = timing.sections
                holds.append(section[2] - section[1])
            out[f"staged_{batch}"] = statistics.median(holds) / batch
    finally:
        await store.close()
    return out


def measure(runs: int, concurrency: int = CONCURRENCY) -> dict[str, Any]:
    schema = f"bench_audit_{int(time.time())}"
    out: dict[str, Any] = {"concurrency_per_process": concurrency, "variants": {}}
    try:
        asyncio.run(_migrate(schema))
        out["hold_per_run_alone_s"] = asyncio.run(_holds(schema, max(20, runs // 8)))
        for label, variant in VARIANTS.items():
            out["variants"][label] = [_summary(_spawn(schema, variant, n, runs, concurrency), n)
                                      for n in (1, 2, 4)]
    finally:
        h.pg_drop_schema(schema)
    return out


async def _migrate(schema: str) -> None:
    store = await open_store(h.PG_DSN, schema=schema)
    await store.close()


def markdown(doc: dict[str, Any]) -> str:
    out = ["## Audit section on PostgreSQL (`bench/audit_bench.py`)", ""]
    if "skipped" in doc:
        return "\n".join([*out, f"Skipped: {doc['skipped']}", ""])
    out += [f"Writer processes x {doc['concurrency_per_process']} runs in flight each; per run: "
            "round trips, time in the global section (lock wait + hold) and hold alone; the "
            "ceiling is runs / (sum of holds).", "",
            "| write path | processes | round trips/run | runs/section | lost swaps/run | "
            "section ms/run | hold ms/run | ceiling runs/s | runs/s here | p99 ms | "
            "past 5 s | CPU ms/run |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, rows in doc["variants"].items():
        for r in rows:
            out.append(f"| {label} | {r['processes']} | {r['round_trips_per_run']:.2f} | "
                       f"{r['runs_per_section']:.1f} | {r['lost_swaps_per_run']:.2f} | "
                       f"{r['section_ms_per_run']:.3f} | "
                       f"{r['hold_ms_per_run']:.3f} | {r['ceiling_runs_per_s']:,.0f} | "
                       f"{r['runs_per_s']:,.0f} | {r['p99_ms']:.1f} | {r['failed']} | "
                       f"{r['cpu_ms_per_run']:.2f} |")
    before, now = (rows[-1] for rows in doc["variants"].values())
    out += ["", f"Measured ceiling at 4 processes: "
            f"{now['ceiling_runs_per_s'] / before['ceiling_runs_per_s']:.1f}x the "
            "lock-until-COMMIT path (client-side timings: on a loaded machine they include the "
            "event loop's delays, and a lost optimistic seal is timed with its wait).", "",
            "Hold per run with nothing else running (one coroutine: no lock wait, no scheduling "
            "delay), and the ceiling it gives:", "",
            "| write path | hold ms/run | ceiling runs/s | x before |", "|---|---:|---:|---:|"]
    holds = doc["hold_per_run_alone_s"]
    for key, hold in holds.items():
        label = ("lock until the run's COMMIT" if key == "direct"
                 else f"one sealing statement per {key.split('_')[1]} runs")
        out.append(f"| {label} | {hold * 1000:.3f} | {1 / hold:,.0f} | "
                   f"{holds['direct'] / hold:.1f} |")
    out += ["", "The section is global, so replicas add no audit write throughput beyond the "
            "ceiling; runs/s here is bounded by this machine's cores.", ""]
    return "\n".join(out)


def options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--runs", type=int, help="runs per writer process")
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY,
                        help="runs in flight per writer process")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    opts = parser.parse_args(argv)
    opts.runs = opts.runs or (160 if opts.quick else 800)
    return opts


def run(opts: argparse.Namespace) -> dict[str, Any]:
    reason = "disabled with --no-postgres" if opts.no_postgres else h.pg_available()
    if reason is not None:
        return {"skipped": reason}
    return measure(opts.runs, opts.concurrency)


def main(argv: list[str] | None = None) -> int:
    opts = options(argv)
    doc = run(opts)
    return h.report(doc, markdown(doc), opts.json, opts.markdown)


if __name__ == "__main__":
    raise SystemExit(main())
