"""Shadow evaluation under load: the live path's latency with and without a candidate revision,
and the divergence metric against the number of requests that diverge.

Run: python bench/shadow_bench.py [--requests N] [--rounds R] [--connections C] [--quick]

The candidate is the shipped policies with one role binding revoked (carol loses ``viewer``).
The load is ``GET /api/v1/storage/objects`` alternating carol (allowed live, denied by the
candidate: diverges) and alice (allowed by both). Rounds alternate shadow off / on, each a fresh
``cpctl serve`` (1 worker, SQLite). After each shadow round the bench waits for the candidate's
queue to drain and compares ``controlplane_policy_shadow_divergence_total{live="allow",
candidate="deny"}`` with the number of carol requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h
import aiohttp

BENCH = Path(__file__).resolve().parent
PATH = "/api/v1/storage/objects"


def options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=4000, help="requests per round")
    parser.add_argument("--rounds", type=int, default=2, help="off/on pairs")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="1 pair of 1000 requests")
    parser.add_argument("--no-postgres", action="store_true", help="accepted; SQLite only")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.rounds = 1000, 1
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


def run(args: argparse.Namespace) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    with h.temp_dir("shadow-bench-") as tmp_name:
        tmp = Path(tmp_name)
        candidate = _candidate(tmp / "candidate")
        for k in range(args.rounds * 2):
            shadow_on = k % 2 == 1
            env = {"CONTROLPLANE_POLICIES__CANDIDATE_DIR": str(candidate),
                   "CONTROLPLANE_POLICIES__SHADOW_QUEUE_SIZE": "1000000"} if shadow_on else {}
            with h.service(tmp / f"state-{k}", workers=1, env=env) as server:
                if shadow_on:
                    _drain(server.base, 0)  # the candidate loaded (vetted) before the load
                    time.sleep(1.0)
                tokens = asyncio.run(_tokens(server.base))
                reqs = [h.Request("GET", PATH, {"Authorization": f"Bearer {tokens[s]}"})
                        for _ in range(args.requests // 2) for s in ("carol", "alice")]
                cpu0 = h.cpu_seconds(server.worker_pids())
                result = h.py_run(server.base, reqs, connections=args.connections,
                                  duration=600, max_requests=len(reqs))
                row: dict[str, Any] = {
                    "shadow": shadow_on, "requests": result.requests, "rps": result.rps,
                    "p50_ms": result.p50_ms, "p99_ms": result.p99_ms, "errors": result.errors,
                }
                if shadow_on:
                    status = _drain(server.base, len(reqs))
                    row.update(
                        diverging_requests=args.requests // 2,
                        divergence_metric=_divergence(server.base),
                        evaluated=status.get("evaluated"), dropped=status.get("dropped"),
                        candidate=status.get("revision"),
                    )
                row["server_cpu_s"] = round(h.cpu_seconds(server.worker_pids()) - cpu0, 2)
                rounds.append(row)
                print(json.dumps(row), flush=True)
    return {"machine": h.machine(), "rounds": rounds, "connections": args.connections}


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        "## Shadow evaluation (`bench/shadow_bench.py`)", "",
        "`GET /api/v1/storage/objects` alternating carol (the candidate revokes her only role: "
        "every one of her requests diverges, allow -> deny) and alice (no divergence); 1 worker, "
        f"SQLite, {doc['connections']} connections, the aiohttp-client generator on the same box. "
        "Rounds alternate shadow off / on (`policies.candidate_dir`), each a fresh server.", "",
        "| round | shadow | requests | req/s | p50 ms | p99 ms | errors | server CPU s | "
        "diverging | metric | evaluated | dropped |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k, r in enumerate(doc["rounds"], 1):
        lines.append(
            f"| {k} | {'on' if r['shadow'] else 'off'} | {r['requests']} | {r['rps']:.0f} | "
            f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['errors']} | {r['server_cpu_s']} | "
            + (f"{r['diverging_requests']} | {r['divergence_metric']:.0f} | {r['evaluated']} | "
               f"{r['dropped']} |" if r["shadow"] else "- | - | - | - |")
        )
    off = [r for r in doc["rounds"] if not r["shadow"]]
    on = [r for r in doc["rounds"] if r["shadow"]]
    if off and on:
        def mean(rows: list[dict[str, Any]], key: str) -> float:
            return sum(r[key] for r in rows) / len(rows)

        lines += ["", f"Mean p99: off {mean(off, 'p99_ms'):.2f} ms, on {mean(on, 'p99_ms'):.2f} "
                  f"ms; mean p50: off {mean(off, 'p50_ms'):.2f} ms, on {mean(on, 'p50_ms'):.2f} ms. "
                  "The metric column is `controlplane_policy_shadow_divergence_total"
                  "{live=\"allow\",candidate=\"deny\"}` after the queue drained; `diverging` is "
                  "the number of carol requests sent."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    document = run(options())
    print(markdown(document))
