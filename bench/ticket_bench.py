"""Ticket throughput: create -> approve -> consume, per store backend, at the store level and over
HTTP, with a bare single-row INSERT + UPDATE on the same backend measured in the same run.

Run: python bench/ticket_bench.py [--quick] [--tickets N] [--json FILE] [--markdown FILE]

Store level: ``service.store.open_store``; ``new_ticket`` (create_ticket), ``decide_review`` +
``add_review`` (approve), ``consume_ticket`` — three transactions per ticket, like the service —
at concurrency 1 and 8 (asyncio tasks sharing the store's pool). Baseline: INSERT a row, commit,
UPDATE it, commit (SQLite: WAL, synchronous=FULL, like the store; PostgreSQL: asyncpg, default
durability). HTTP: the service with 1 worker; per ticket POST /approvals (alice), POST
/approvals/{id}/reviews (bob), POST /installer/actions with the ticket (alice), 16 tickets in
flight. PostgreSQL uses fresh schemas in $CONTROLPLANE_BENCH_PG_DSN, dropped afterwards.
Nothing here asserts anything about timings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h
import aiohttp

from service.approvals.tickets import decide_review, new_ticket, requirements
from service.store import open_store

RESOURCE = {"app": "web", "version": "1.2.3"}
ACTION = "installer.run.execute"


async def store_lifecycles(url: str, schema: str | None, n: int, concurrency: int) -> dict[str, Any]:
    store = await open_store(url, schema=schema)
    req = requirements({"quorum": 1, "reviewer_roles": ["approver"]}, default_ttl_s=900,
                       default_pending_ttl_s=86400)
    phases: dict[str, list[float]] = {"create": [], "approve": [], "consume": []}
    try:
        async def one(i: int) -> None:
            now = time.time()
            t0 = time.perf_counter()
            ticket, _nonce = new_ticket(subject_id="alice", env="prod", resource=RESOURCE,
                                        action=ACTION, command_hash=None, reason="bench",
                                        requested_by="alice", req=req, now=now)
            await store.create_ticket(ticket)
            t1 = time.perf_counter()
            outcome = decide_review(ticket, reviewer="bob", reviewer_kind="human",
                                    reviewer_roles=["approver"], reviewer_groups=["sre-approvers"],
                                    decision="approve", reason="bench", now=now)
            await store.add_review(ticket.id, outcome.review, outcome.new_state,
                                   outcome.approved_expires_at, now)
            t2 = time.perf_counter()
            await store.consume_ticket(ticket.id, nonce_hash=ticket.nonce_hash, subject_id="alice",
                                       env="prod", action=ACTION,
                                       resource_hash=ticket.resource_hash, command_hash=None,
                                       now=now, correlation_id=f"bench-{i}")
            t3 = time.perf_counter()
            phases["create"].append(t1 - t0)
            phases["approve"].append(t2 - t1)
            phases["consume"].append(t3 - t2)

        for i in range(min(20, n)):  # warm-up
            await one(-i - 1)
        for v in phases.values():
            v.clear()
        queue = list(range(n))

        async def worker() -> None:
            while queue:
                await one(queue.pop())

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    finally:
        await store.close()
    return {"per_s": n / elapsed,
            **{f"{k}_p50_ms": statistics.median(v) * 1e3 for k, v in phases.items()}}


def sqlite_baseline(path: Path, n: int) -> float:
    """INSERT one row + commit, UPDATE it + commit; ``n`` times. Pairs per second."""
    db = sqlite3.connect(str(path), isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = FULL")
    db.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, state TEXT, body TEXT)")
    body = json.dumps({"resource": RESOURCE, "reason": "bench"})
    t0 = time.perf_counter()
    for i in range(n):
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO t (id, state, body) VALUES (?, 'pending', ?)", (i, body))
        db.execute("COMMIT")
        db.execute("BEGIN IMMEDIATE")
        db.execute("UPDATE t SET state = 'approved' WHERE id = ? AND state = 'pending'", (i,))
        db.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    db.close()
    return n / elapsed


async def pg_baseline(schema: str, n: int) -> float:
    import asyncpg

    conn = await asyncpg.connect(h.PG_DSN)
    try:
        await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        await conn.execute(f'CREATE TABLE "{schema}".t (id int PRIMARY KEY, state text, body jsonb)')
        body = json.dumps({"resource": RESOURCE, "reason": "bench"})
        # schema: generated here (bench_tb_base_<pid>), never user input
        ins = f'INSERT INTO "{schema}".t (id, state, body) VALUES ($1, \'pending\', $2)'  # noqa: S608
        upd = (f'UPDATE "{schema}".t SET state = \'approved\' '  # noqa: S608
               "WHERE id = $1 AND state = 'pending'")
        t0 = time.perf_counter()
        for i in range(n):
            await conn.execute(ins, i, body)  # each its own (autocommit) transaction
            await conn.execute(upd, i)
        return n / (time.perf_counter() - t0)
    finally:
        await conn.close()


async def http_lifecycles(base: str, n: int, concurrency: int = 16) -> dict[str, Any]:
    ids = h.Identities(base)
    timeout = aiohttp.ClientTimeout(total=30)
    latencies: list[float] = []
    failures: dict[str, int] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency),
                                     timeout=timeout) as session:
        alice = await ids.stepped_up(session, "alice", fresh_for=120)
        bob = await ids.stepped_up(session, "bob", fresh_for=120)
        create = h.dumps({"subject_id": "alice", "env": "prod", "action": ACTION,
                          "resource": RESOURCE, "reason": "bench"})
        review = h.dumps({"decision": "approve", "reason": "bench"})
        js = {"Content-Type": "application/json"}

        async def one(i: int) -> None:
            t0 = time.perf_counter()
            async with session.post(base + "/api/v1/approvals", data=create,
                                    headers={"Authorization": f"Bearer {alice}", **js}) as r:
                doc = await r.json()
            if r.status != 201:
                failures[f"create {r.status}"] = failures.get(f"create {r.status}", 0) + 1
                return
            async with session.post(f"{base}/api/v1/approvals/{doc['id']}/reviews", data=review,
                                    headers={"Authorization": f"Bearer {bob}", **js}) as r:
                await r.read()
            if r.status not in (200, 201):
                failures[f"review {r.status}"] = failures.get(f"review {r.status}", 0) + 1
                return
            body = h.dumps({"task_id": f"tb-{i}", "action": ACTION, "env": "prod",
                            "resource": RESOURCE})
            async with session.post(base + "/api/v1/installer/actions", data=body, headers={
                    "Authorization": f"Bearer {alice}", "Approval-Ticket": doc["id"],
                    "Approval-Nonce": doc["nonce"], **js}) as r:
                await r.read()
            if r.status != 202:
                failures[f"consume {r.status}"] = failures.get(f"consume {r.status}", 0) + 1
                return
            latencies.append(time.perf_counter() - t0)

        queue = list(range(n))

        async def worker() -> None:
            while queue:
                await one(queue.pop())

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    latencies.sort()
    return {"per_s": len(latencies) / elapsed,
            "p50_ms": latencies[len(latencies) // 2] * 1e3 if latencies else float("nan"),
            "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3 if latencies else float("nan"),
            "failures": failures}


def run(opts: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    backends = ["sqlite"]
    reason = h.pg_available() if not opts.no_postgres else "disabled with --no-postgres"
    if reason is None:
        backends.append("postgres")
    else:
        notes.append(f"PostgreSQL skipped: {reason}")

    def log(msg: str) -> None:
        print(f"[ticket_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    with h.temp_dir("cp-ticket-bench-") as tmp_s:
        tmp = Path(tmp_s)
        for backend in backends:
            tag = f"{os.getpid()}"
            if backend == "sqlite":
                base_rate = sqlite_baseline(tmp / "baseline.db", opts.tickets)
            else:
                schema = f"bench_tb_base_{tag}"
                try:
                    base_rate = asyncio.run(pg_baseline(schema, opts.tickets))
                finally:
                    h.pg_drop_schema(schema)
            rows.append({"backend": backend, "level": "baseline (INSERT+UPDATE, 2 commits)",
                         "concurrency": 1, "per_s": base_rate})
            log(f"{backend} baseline {base_rate:,.0f}/s")
            for conc in (1, 8):
                if backend == "sqlite":
                    url, schema_ = f"sqlite:///{tmp}/store-{conc}.db", None
                else:
                    url, schema_ = h.PG_DSN, f"bench_tb_{tag}_{conc}"
                try:
                    res = asyncio.run(store_lifecycles(url, schema_, opts.tickets, conc))
                finally:
                    if schema_:
                        h.pg_drop_schema(schema_)
                rows.append({"backend": backend, "level": "store (3 transactions)",
                             "concurrency": conc, **res})
                log(f"{backend} store c={conc} {res['per_s']:,.0f}/s")
            env: dict[str, str] = {}
            schema_ = None
            if backend == "postgres":
                schema_ = f"bench_tb_http_{tag}"
                env = {"CONTROLPLANE_STORE__BACKEND": "postgres",
                       "CONTROLPLANE_STORE__POSTGRES__DSN": h.PG_DSN,
                       "CONTROLPLANE_STORE__POSTGRES__SCHEMA": schema_}
            state = tmp / f"state-{backend}"
            state.mkdir(mode=0o700)
            try:
                with h.service(state, workers=1, env=env) as server:
                    res = asyncio.run(http_lifecycles(server.base, opts.http_tickets))
            finally:
                if schema_:
                    h.pg_drop_schema(schema_)
            rows.append({"backend": backend, "level": "HTTP (3 requests, 1 worker)",
                         "concurrency": 16, **res})
            log(f"{backend} http {res['per_s']:,.0f}/s")
    return {"rows": rows, "notes": notes, "tickets": opts.tickets,
            "http_tickets": opts.http_tickets}


def markdown(doc: dict[str, Any]) -> str:
    out = ["## Ticket throughput (`bench/ticket_bench.py`)", "",
           f"create -> approve -> consume, {doc['tickets']:,} tickets per store run, "
           f"{doc['http_tickets']:,} over HTTP. x baseline: lifecycles/s over the bare "
           "INSERT+UPDATE pairs/s on the same backend.", "",
           "| store | level | concurrency | lifecycles/s | x baseline | create p50 ms | "
           "approve p50 ms | consume p50 ms | HTTP p50 / p99 ms |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    base = {r["backend"]: r["per_s"] for r in doc["rows"] if r["level"].startswith("baseline")}

    def f(v: Any) -> str:
        return f"{v:.2f}" if isinstance(v, float) else "-"

    for r in doc["rows"]:
        ratio = f"{r['per_s'] / base[r['backend']]:.1%}" if base.get(r["backend"]) else "-"
        http = (f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f}" if "p99_ms" in r else "-")
        out.append(f"| {r['backend']} | {r['level']} | {r['concurrency']} | {r['per_s']:,.0f} | "
                   f"{ratio} | {f(r.get('create_p50_ms'))} | {f(r.get('approve_p50_ms'))} | "
                   f"{f(r.get('consume_p50_ms'))} | {http} |")
        if r.get("failures"):
            out.append(f"|  | failures: {r['failures']} | | | | | | | |")
    if doc["notes"]:
        out += ["", "Notes:", ""] + [f"- {n}" for n in doc["notes"]]
    return "\n".join(out) + "\n"


def options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tickets", type=int)
    parser.add_argument("--http-tickets", type=int)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    opts = parser.parse_args(argv)
    opts.tickets = opts.tickets or (200 if opts.quick else 1500)
    opts.http_tickets = opts.http_tickets or (100 if opts.quick else 600)
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = options(argv)
    doc = run(opts)
    return h.report(doc, markdown(doc), opts.json, opts.markdown)


if __name__ == "__main__":
    raise SystemExit(main())
