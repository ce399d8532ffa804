"""The audit chain's global section on PostgreSQL: hold time per append and the write ceiling.

Run: python bench/audit_bench.py [--quick] [--appends N] [--json FILE] [--markdown FILE]

Every chain run appends its record under the single ``audit_head`` row lock, held from the
``UPDATE ... RETURNING`` that reserves the seq to COMMIT. This measures, on one PostgreSQL, in the
same run, the append as it was (three statements in the locked section: reserve, insert, new head
hash) and as it is (two: reserve, then insert + head hash in one statement):

* hold: with one writer (nothing to wait for), the time from the reserving UPDATE to the end of
  COMMIT (plus the pool's connection reset: an upper bound), i.e. how long the lock is held per
  run; the cluster's write ceiling is 1 / hold, however many replicas there are;
* statements in the locked section and round trips per append (BEGIN .. COMMIT);
* 1, 2 and 4 "replicas" (separate stores, each with its own pool, 4 writers each) appending at
  once: appends/s and p50/p99 latency, which show the serialisation.

Each append is its own transaction holding only the append, so these are upper bounds for what
the audit section allows a chain run. PostgreSQL: $CONTROLPLANE_BENCH_PG_DSN, fresh schema,
dropped afterwards. Nothing here asserts anything about timings.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h

from service.audit.record import seal
from service.store import open_store
from service.store.postgres import PostgresStore

VARIANTS = {"three statements (before)": False, "two statements (now)": True}


class _Counting:
    """Counts the statements a store's connections run (a round trip each)."""

    statements = 0


def _count(store: PostgresStore) -> None:
    original = store._transaction

    def counted(*, write: bool) -> Any:
        cm = original(write=write)

        class Wrapper:
            async def __aenter__(self) -> Any:
                conn = await cm.__aenter__()
                for name in ("execute", "executemany", "fetchone", "fetchall"):
                    method = getattr(conn, name)

                    async def call(*a: Any, _m: Any = method) -> Any:
                        _Counting.statements += 1
                        return await _m(*a)

                    setattr(conn, name, call)
                return conn

            async def __aexit__(self, *exc: Any) -> Any:
                return await cm.__aexit__(*exc)

        return Wrapper()

    store._transaction = counted  # type: ignore[method-assign]


async def _stores(schema: str, n: int, cte: bool) -> list[PostgresStore]:
    stores = []
    for _ in range(n):
        store = await open_store(h.PG_DSN, schema=schema)
        assert isinstance(store, PostgresStore)
        store.dialect = dataclasses.replace(store.dialect, writes_in_cte=cte)
        stores.append(store)
    return stores


async def _append(store: PostgresStore, i: int) -> float:
    entry = {"kind": "bench", "i": i, "at": time.time(), "decision": "allow"}
    async with store.transaction() as tx:
        # From the reserving UPDATE (where the lock is taken) to the end of COMMIT, plus the
        # pool's reset of the connection on release (one more round trip): an upper bound.
        t0 = time.perf_counter()
        await tx.append_audit(entry, seal)
    return time.perf_counter() - t0


async def measure(appends: int) -> dict[str, Any]:
    schema = f"bench_audit_{int(time.time())}"
    out: dict[str, Any] = {"variants": {}}
    try:
        for label, cte in VARIANTS.items():
            row: dict[str, Any] = {}
            # Hold time and round trips: one writer, nothing to wait for.
            (single,) = await _stores(schema, 1, cte)
            _count(single)
            try:
                for i in range(20):
                    await _append(single, i)
                _Counting.statements = 0
                times = [await _append(single, i) for i in range(appends)]
                statements = _Counting.statements / appends
            finally:
                await single.close()
            hold = statistics.median(times)
            row.update({"hold_ms": hold * 1000, "statements_in_lock": statements,
                        # BEGIN and COMMIT are round trips too (asyncpg's transaction).
                        "round_trips": statements + 2, "ceiling_per_s": 1 / hold})
            curve = []
            for replicas in (1, 2, 4):
                stores = await _stores(schema, replicas, cte)
                try:
                    per_writer = max(1, appends // (replicas * 4))
                    started = time.perf_counter()

                    async def writer(store: PostgresStore, count: int) -> list[float]:
                        return [await _append(store, i) for i in range(count)]

                    done = await asyncio.gather(*(writer(s, per_writer) for s in stores
                                                  for _ in range(4)))
                    elapsed = time.perf_counter() - started
                finally:
                    for s in stores:
                        await s.close()
                lat = sorted(x for d in done for x in d)
                curve.append({"replicas": replicas, "writers": replicas * 4,
                              "appends_per_s": len(lat) / elapsed,
                              "p50_ms": lat[len(lat) // 2] * 1000,
                              "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000})
            row["curve"] = curve
            out["variants"][label] = row
    finally:
        await asyncio.to_thread(h.pg_drop_schema, schema)
    return out


def markdown(doc: dict[str, Any]) -> str:
    out = ["## Audit section on PostgreSQL (`bench/audit_bench.py`)", ""]
    if "skipped" in doc:
        return "\n".join([*out, f"Skipped: {doc['skipped']}", ""])
    out += ["| append | statements in the lock | round trips | hold ms (1 writer) | "
            "ceiling appends/s | 1 replica /s (p99 ms) | 2 replicas /s (p99 ms) | "
            "4 replicas /s (p99 ms) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label, r in doc["variants"].items():
        curve = " | ".join(f"{c['appends_per_s']:,.0f} ({c['p99_ms']:.1f})" for c in r["curve"])
        out.append(f"| {label} | {r['statements_in_lock']:.0f} (+COMMIT) | "
                   f"{r['round_trips']:.0f} | {r['hold_ms']:.2f} | {r['ceiling_per_s']:,.0f} | "
                   f"{curve} |")
    out += ["", "The ceiling is the whole cluster's: the section is global, so replicas add no "
            "audit write throughput; shortening the hold is what raises it.", ""]
    return "\n".join(out)


def options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--appends", type=int)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    opts = parser.parse_args(argv)
    opts.appends = opts.appends or (200 if opts.quick else 1000)
    return opts


def run(opts: argparse.Namespace) -> dict[str, Any]:
    reason = "disabled with --no-postgres" if opts.no_postgres else h.pg_available()
    if reason is not None:
        return {"skipped": reason}
    return asyncio.run(measure(opts.appends))


def main(argv: list[str] | None = None) -> int:
    opts = options(argv)
    doc = run(opts)
    text = markdown(doc)
    if opts.json:
        Path(opts.json).write_text(json.dumps(doc, indent=2))
    if opts.markdown:
        Path(opts.markdown).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
