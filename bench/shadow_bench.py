"""Shadow evaluation under load: the live path's latency with and without a candidate revision,
and the divergence metric against the number of requests that diverge.

Run: python bench/shadow_bench.py [--fixed-rounds R] [--fixed-seconds S] [--load F]
     [--requests N] [--rounds R] [--connections C] [--quick]

The candidate is the shipped policies with one role binding revoked (carol loses ``viewer``).
The load is ``GET /api/v1/storage/objects`` alternating carol (allowed live, denied by the
candidate: diverges) and alice (allowed by both). Rounds alternate shadow off / on, each a fresh
``cpctl serve`` (1 worker, SQLite). First closed-loop saturation rounds (``--connections``
clients back to back: the shadow process falls behind and its queue drops), then fixed-rate
rounds: open loop at ``--load`` times the shadow-off saturation rate of this run, latency from
each request's scheduled send time. After each shadow round the bench waits for the candidate's
queue to drain and compares ``controlplane_policy_shadow_divergence_total{live="allow",
candidate="deny"}`` with the number of carol requests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import shutil
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h
import aiohttp

BENCH = Path(__file__).resolve().parent
PATH = "/api/v1/storage/objects"


def options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=3000,
                        help="requests per saturation round")
    parser.add_argument("--rounds", type=int, default=1, help="saturation off/on pairs")
    parser.add_argument("--connections", type=int, default=8, help="saturation rounds")
    parser.add_argument("--fixed-rounds", type=int, default=5, help="fixed-rate off/on pairs")
    parser.add_argument("--fixed-seconds", type=float, default=12.0,
                        help="length of a fixed-rate round")
    parser.add_argument("--load", type=float, default=0.5,
                        help="fixed rate as a fraction of the shadow-off saturation rate")
    parser.add_argument("--quick", action="store_true", help="1 short pair of each")
    parser.add_argument("--no-postgres", action="store_true", help="accepted; SQLite only")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.rounds, args.fixed_rounds, args.fixed_seconds = 1000, 1, 1, 8.0
    return args


def _candidate(root: Path) -> Path:
    shutil.copytree(h.REPO / "policies", root, ignore=shutil.ignore_patterns("compose"))
    bindings = root / "data" / "bindings.yaml"
    bindings.write_text(bindings.read_text().replace("  carol: {roles: [viewer]}\n",
                                                     "  carol: {roles: []}\n"))
    return root


async def _tokens(base: str) -> dict[str, str]:
    ids = h.Identities(base)
    async with aiohttp.ClientSession() as session:
        return {s: await ids.login(session, s) for s in ("carol", "alice")}


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 (loopback)
        return response.read().decode()


def _divergence(base: str) -> float:
    total = 0.0
    for line in _get(base + "/metrics").splitlines():
        if line.startswith("controlplane_policy_shadow_divergence_total{") and \
                'live="allow"' in line and 'candidate="deny"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def _drain(base: str, expected: int, timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    shadow: dict[str, Any] = {}
    while time.monotonic() < deadline:
        shadow = json.loads(_get(base + "/api/v1/authz/status")).get("shadow", {})
        done = shadow.get("evaluated", 0) + shadow.get("dropped", 0)
        if shadow.get("state") != "loading" and shadow.get("queued") == 0 and done >= expected:
            return shadow
        time.sleep(0.2)
    return shadow


@contextlib.contextmanager
def _server(tmp: Path, k: int, candidate: Path | None) -> Iterator[tuple[h.Server, list[h.Request]]]:
    """A fresh 1-worker server (shadowing ``candidate`` if given, default queue size) and the
    round's request mix: carol, alice, carol, ..."""
    env = {"CONTROLPLANE_POLICIES__CANDIDATE_DIR": str(candidate)} if candidate else {}
    with h.service(tmp / f"state-{k}", workers=1, env=env) as server:
        if candidate is not None:
            _drain(server.base, 0)  # the candidate loaded (vetted) before the load
            time.sleep(1.0)
        tokens = asyncio.run(_tokens(server.base))
        mix = [h.Request("GET", PATH, {"Authorization": f"Bearer {tokens[s]}"})
               for s in ("carol", "alice")]
        yield server, mix


def _shadow_row(server: h.Server, sent: int, diverging: int) -> dict[str, Any]:
    status = _drain(server.base, sent)
    return {"diverging_requests": diverging, "divergence_metric": _divergence(server.base),
            "evaluated": status.get("evaluated"), "dropped": status.get("dropped"),
            "errors_shadow": status.get("errors"), "candidate": status.get("revision")}


def _round(tmp: Path, k: int, candidate: Path | None, pairs: int,
           load: Callable[[str, list[h.Request]], dict[str, Any]]) -> dict[str, Any]:
    """One round on a fresh server: ``load`` sends ``pairs`` carol/alice pairs and describes
    the live path; then the shadow's counts (after its queue drained) and the CPU each used."""
    with _server(tmp, k, candidate) as (server, mix):
        reqs = mix * pairs
        workers = server.worker_pids()
        cpu0, shadow0 = h.cpu_seconds(workers), h.cpu_seconds(server.shadow_pids())
        loop0 = h.cpu_seconds(workers, main_thread=True)
        row = {"shadow": candidate is not None, **load(server.base, reqs)}
        # the worker's CPU for the load alone (the drain below polls it), and its event loop's
        row["server_cpu_s"] = round(h.cpu_seconds(workers) - cpu0, 2)
        row["loop_cpu_s"] = round(h.cpu_seconds(workers, main_thread=True) - loop0, 2)
        if candidate is not None:
            row.update(_shadow_row(server, len(reqs), pairs))
        row["shadow_cpu_s"] = round(h.cpu_seconds(server.shadow_pids()) - shadow0, 2)
        return row


def _saturation(tmp: Path, k: int, candidate: Path | None, args: argparse.Namespace
                ) -> dict[str, Any]:
    """Closed loop: ``connections`` clients back to back, as fast as the worker answers."""
    def load(base: str, reqs: list[h.Request]) -> dict[str, Any]:
        result = h.py_run(base, reqs, connections=args.connections, duration=600,
                          max_requests=len(reqs))
        return {"mode": "saturation", "requests": result.requests, "rps": result.rps,
                "p50_ms": result.p50_ms, "p99_ms": result.p99_ms, "errors": result.errors}

    return _round(tmp, k, candidate, args.requests // 2, load)


def _fixed(tmp: Path, k: int, candidate: Path | None, rate: float,
           args: argparse.Namespace) -> dict[str, Any]:
    """Open loop at ``rate`` req/s (below saturation), latency from the scheduled send time."""
    def load(base: str, reqs: list[h.Request]) -> dict[str, Any]:
        result = h.fixed_rate_run(base, reqs, rate=rate)
        return {"mode": "fixed", "requests": result.requests, "rate": round(rate, 1),
                "rps": result.rps, "p50_ms": result.p50_ms, "p99_ms": result.p99_ms,
                "max_ms": result.max_ms, "errors": result.errors,
                "late_ms_p99": result.late_ms_p99}

    return _round(tmp, k, candidate, max(1, int(rate * args.fixed_seconds) // 2), load)


def run(args: argparse.Namespace) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    with h.temp_dir("shadow-bench-") as tmp_name:
        tmp = Path(tmp_name)
        candidate = _candidate(tmp / "candidate")
        k = 0
        for k in range(args.rounds * 2):
            rounds.append(_saturation(tmp, k, candidate if k % 2 else None, args))
            print(json.dumps(rounds[-1]), flush=True)
        off = [r["rps"] for r in rounds if not r["shadow"]]
        saturation = sum(off) / len(off) if off else 0.0
        rate = args.load * saturation
        for j in range(args.fixed_rounds * 2 if rate > 0 else 0):
            rounds.append(_fixed(tmp, k + 1 + j, candidate if j % 2 else None, rate, args))
            print(json.dumps(rounds[-1]), flush=True)
    return {"machine": h.machine(), "rounds": rounds, "connections": args.connections,
            "saturation_rps": saturation, "load": args.load, "rate": rate,
            "fixed_seconds": args.fixed_seconds}


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows) if rows else float("nan")


def permutation_p(off: list[float], on: list[float]) -> float:
    """Two-sided exact permutation test of the difference of means: the share of all ways to
    split the pooled rounds into groups of these sizes whose difference is at least as large as
    the observed one. Few rounds, no assumption about the distribution of a round's p99."""
    pooled = off + on
    observed = abs(sum(on) / len(on) - sum(off) / len(off))
    total = sum(pooled)
    hits = count = 0
    for picked in itertools.combinations(range(len(pooled)), len(on)):
        on_sum = sum(pooled[i] for i in picked)
        diff = abs(on_sum / len(on) - (total - on_sum) / len(off))
        hits += diff >= observed - 1e-12
        count += 1
    return hits / count


def verdict(off: list[dict[str, Any]], on: list[dict[str, Any]], key: str) -> str:
    """The shadow-on rounds' ``key`` against the shadow-off rounds': difference and test."""
    a, b = [r[key] for r in off], [r[key] for r in on]
    diff = _mean(on, key) - _mean(off, key)
    p = permutation_p(a, b)
    finding = ("no difference detectable at the 5% level" if p >= 0.05
               else "shadow on differs at the 5% level")
    return (f"off {_mean(off, key):.2f} ms (rounds {min(a):.2f}-{max(a):.2f}), on "
            f"{_mean(on, key):.2f} ms (rounds {min(b):.2f}-{max(b):.2f}): {diff:+.2f} ms, "
            f"permutation p = {p:.2f}, {finding}")


def _per_request_us(rows: list[dict[str, Any]], key: str) -> float:
    return sum(r[key] for r in rows) / max(sum(r["requests"] for r in rows), 1) * 1e6


def _shadow_cells(r: dict[str, Any]) -> str:
    if not r["shadow"]:
        return "- | - | - | - | - |"
    return (f"{r['diverging_requests']} | {r['divergence_metric']:.0f} | {r['evaluated']} | "
            f"{r['dropped']} | {r['shadow_cpu_s']} |")


def markdown(doc: dict[str, Any]) -> str:
    saturated = [r for r in doc["rounds"] if r["mode"] == "saturation"]
    fixed = [r for r in doc["rounds"] if r["mode"] == "fixed"]
    lines = [
        "## Shadow evaluation (`bench/shadow_bench.py`)", "",
        "`GET /api/v1/storage/objects` alternating carol (the candidate revokes her only role: "
        "every one of her requests diverges, allow -> deny) and alice (no divergence); 1 worker, "
        "SQLite, the aiohttp-client generator on the same box. Rounds alternate shadow off / on "
        "(`policies.candidate_dir`, default `shadow_queue_size` 1000), each a fresh server. The "
        "candidate decides in the shadow process (a child of the worker in the SCHED_IDLE class, nice +10): "
        "`server CPU` is the worker's (all its threads), `event loop CPU` its main thread's, "
        "`shadow CPU` the shadow process's.", "",
        f"**Fixed rate (open loop)**: {doc['load']:.0%} of this run's shadow-off saturation rate "
        f"({doc['saturation_rps']:.0f} req/s) = {doc['rate']:.0f} req/s for "
        f"{doc['fixed_seconds']:.0f} s per round; each request is sent at its scheduled time "
        "and its latency counts from that time (no coordinated omission; `late p99` is the "
        "generator's own lag, included in the latency).", "",
        "| round | shadow | requests | req/s | p50 ms | p99 ms | max ms | late p99 ms | errors | "
        "server CPU s | event loop CPU s | diverging | metric | evaluated | dropped | "
        "shadow CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k, r in enumerate(fixed, 1):
        lines.append(
            f"| {k} | {'on' if r['shadow'] else 'off'} | {r['requests']} | {r['rps']:.0f} | "
            f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['max_ms']:.1f} | "
            f"{r['late_ms_p99']:.2f} | {r['errors']} | {r['server_cpu_s']} | "
            f"{r['loop_cpu_s']} | " + _shadow_cells(r))
    off, on = [r for r in fixed if not r["shadow"]], [r for r in fixed if r["shadow"]]
    if off and on:
        lines += [
            "", "Fixed rate, shadow off against on (means over the rounds; an exact permutation "
            "test over the rounds, two-sided):", "",
            f"- live p99: {verdict(off, on, 'p99_ms')}",
            f"- live p50: {verdict(off, on, 'p50_ms')}",
            f"- worker CPU a request: off {_per_request_us(off, 'server_cpu_s'):.0f} us, on "
            f"{_per_request_us(on, 'server_cpu_s'):.0f} us; its event loop (the thread serving "
            f"requests): off {_per_request_us(off, 'loop_cpu_s'):.0f} us, on "
            f"{_per_request_us(on, 'loop_cpu_s'):.0f} us; the shadow process "
            f"{_per_request_us(on, 'shadow_cpu_s'):.0f} us (CPU clock ticks of 10 ms: read "
            "differences under ~30 us as noise)."]
    lines += [
        "", f"**Saturation (closed loop)**: {doc['connections']} connections back to back: the "
        "worker is the bottleneck, the shadow process gets only the CPU left over; when that is "
        "not enough it falls behind and its bounded queue drops (counted in `dropped`).", "",
        "| round | shadow | requests | req/s | p50 ms | p99 ms | errors | server CPU s | "
        "diverging | metric | evaluated | dropped | shadow CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k, r in enumerate(saturated, 1):
        lines.append(
            f"| {k} | {'on' if r['shadow'] else 'off'} | {r['requests']} | {r['rps']:.0f} | "
            f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['errors']} | {r['server_cpu_s']} | "
            + _shadow_cells(r))
    lines += ["", "The metric column is `controlplane_policy_shadow_divergence_total"
              "{live=\"allow\",candidate=\"deny\"}` after the queue drained; `diverging` is the "
              "number of carol requests sent; with nothing dropped they must be equal, and with "
              "drops the metric counts the diverging requests among the `evaluated` ones."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    document = run(options())
    print(markdown(document))
