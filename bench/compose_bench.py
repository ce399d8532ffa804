"""Compose preflight benchmark: evaluation latency in-process and compose import over HTTP.

Run: python bench/compose_bench.py [--reps N] [--requests N] [--no-http]

In-process, on the bench's 10-service file (``http_bench.compose_fields(10)``, env prod):
- ``uncached``: ``evaluate(..., cache=False)``, the whole report (per chunk of 20 services the
  input converted and set once, then each group of three rules queried against it);
- ``constant``: one query of a constant entrypoint of the same bundle with the same input
  document, i.e. what converting the input and calling the engine costs at all (the floor);
- ``cached``: ``evaluate`` when the report is in the cache;
- ``one_changed``: ``evaluate`` of the file with one service's image changed each run (a new
  report; the other nine services' rule outputs come from the per-service cache);
- ``normalize``: ``normalize_files`` of examples/compose/risky.compose.yaml (what the CLI and
  the bench's own files cost before any evaluation);
- ``trivial``: as many rules as the shipped set, each one comparison per service (a field no
  service has), evaluated both ways a report could be (input set once and each rule's entrypoint
  queried; one entrypoint gathering them all), the cheaper kept: what any rule set of that size
  costs in regopy before a rule does real work, i.e. how close to the constant query a report
  can get at all;
- ``isolated``: what the server's handler awaits, on an event loop: an uncached report (a new
  file each run: the bench's file under a new project name) through ``EvaluatorPool`` (one
  evaluator process, started and warmed first) against the same through ``asyncio.to_thread``
  of ``evaluate_json`` (the handler before evaluator processes), and a cached report through the
  pool (answered in this process). Wall-clock p50 (the child's CPU is not this process's);
- per rule (``--rules``): each rule's own entrypoint (``cells/<rule>``) alone, less the constant
  query: what each rule adds to the uncached report (the minimum of the runs: the least noisy
  figure on a shared box).
Wall-clock p50 of ``--reps`` runs each, and their CPU time (this process), on a shared box:
read the ratios.

Over HTTP (``cpctl serve --workers 2``, SQLite): POST /api/v1/compose/import with a mix of 80%
one repeated file and 20% files never seen before, 16 connections, twice: the new files are the
same services under a new project name (context of every service, so each costs a full
evaluation: the target's measure), then the repeated file with one service's image bumped (a CI
re-check: the other services' rule outputs are reused).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _harness as h
import http_bench

from service.compose.normalize import normalize_files
from service.compose.preflight import RuleSet, evaluate
from service.rego import Module, compile_bundle

API = "/api/v1"
TARGETS = {"uncached_p50_ms": 15.0, "uncached_over_constant": 2.0, "cached_p50_ms": 1.0,
           "http_rps": 200.0}


def _timed(fn: Any, reps: int) -> dict[str, float]:
    walls, cpus = [], []
    for _ in range(reps):
        w, c = time.perf_counter(), time.process_time()
        fn()
        cpus.append((time.process_time() - c) * 1000)
        walls.append((time.perf_counter() - w) * 1000)
    return {"p50_ms": statistics.median(walls), "cpu_p50_ms": statistics.median(cpus),
            "cpu_min_ms": min(cpus),
            "p99_ms": sorted(walls)[min(len(walls) - 1, int(len(walls) * 0.99))]}


def per_rule(reps: int) -> list[tuple[str, float]]:
    """[(rule, CPU ms its entrypoint adds to the constant query)], most costly first."""
    rules = RuleSet.load()
    assert rules.bundle is not None
    bundle = rules.bundle
    input_doc = {"fields": http_bench.compose_fields(10), "strict": False, "env": "prod",
                 "production": True, "built_images": {}}
    meta = f"controlplane/compose/rules/{rules.rules[0].package}/meta"
    floor = _timed(lambda: bundle.query(meta, input_doc), reps)["cpu_min_ms"]
    costs = []
    for rule in rules.rules:
        entry = f"controlplane/compose/cells/{rule.package}"
        costs.append((rule.id, _timed(lambda e=entry: bundle.query(e, input_doc), reps)["cpu_min_ms"]
                       - floor))
    return sorted(costs, key=lambda c: -c[1])


def in_process(reps: int) -> dict[str, Any]:
    rules = RuleSet.load()
    fields = http_bench.compose_fields(10)
    input_doc = {"fields": fields, "strict": False, "env": "prod", "production": True,
                 "built_images": {}}
    meta = f"controlplane/compose/rules/{rules.rules[0].package}/meta"
    assert rules.bundle is not None
    evaluate(fields, env="prod", rules=rules)  # warm: compiled, cached once
    bumps = itertools.count(10**6)  # image tags no other run of this process used
    return {
        "rules": len(rules.rules),
        "uncached": _timed(lambda: evaluate(fields, env="prod", rules=rules, cache=False), reps),
        "constant": _timed(lambda: rules.bundle.query(meta, input_doc), reps),  # type: ignore[union-attr]
        "cached": _timed(lambda: evaluate(fields, env="prod", rules=rules), reps * 10),
        "trivial": trivial(len(rules.rules), input_doc, reps),
        "one_changed": _timed(lambda: evaluate(
            _one_service_bumped(fields, next(bumps)), env="prod", rules=rules), reps),
        "normalize": _timed(lambda: normalize_files([RISKY], environ={}), reps),
    }


def isolated(reps: int) -> dict[str, dict[str, float]]:
    """The handler's await of a report: in an evaluator process or in a thread, and cached."""
    import asyncio

    from service.compose.evaluator import EvaluatorPool
    from service.compose.preflight import evaluate_json

    rules = RuleSet.load()
    fields = http_bench.compose_fields(10)
    names = itertools.count()

    async def run() -> dict[str, dict[str, float]]:
        pool = EvaluatorPool(size=1)

        async def in_child(doc: dict[str, Any]) -> None:
            await pool.evaluate_json(doc, strict=False, env="prod", rules=rules,
                                     environments=None, budget_s=10.0)

        async def in_thread(doc: dict[str, Any]) -> None:
            await asyncio.to_thread(evaluate_json, doc, env="prod", rules=rules, budget_s=10.0)

        def cpu() -> float:  # this process and the evaluator, seconds
            return time.process_time() + h.cpu_seconds(pool.pids())

        async def timed(call: Any, new_file: bool, walls: list[float]) -> float:
            doc = _renamed(fields, next(names)) if new_file else fields
            c, started = cpu(), time.perf_counter()
            await call(doc)
            walls.append((time.perf_counter() - started) * 1000)
            return cpu() - c

        def summary(walls: list[float], cpu_s: float) -> dict[str, float]:
            return {"p50_ms": statistics.median(walls), "cpu_ms": cpu_s * 1000 / len(walls),
                    "p99_ms": sorted(walls)[min(len(walls) - 1, int(len(walls) * 0.99))]}

        try:
            for _ in range(3):  # started, rules compiled, warm
                await timed(in_child, True, [])
                await timed(in_thread, True, [])
            # Alternated, so that both see the same load of a shared box.
            child: list[float] = []
            thread: list[float] = []
            child_cpu = thread_cpu = 0.0
            for _ in range(reps):
                child_cpu += await timed(in_child, True, child)
                thread_cpu += await timed(in_thread, True, thread)
            cached: list[float] = []
            cached_cpu = sum([await timed(in_child, False, cached) for _ in range(reps * 10)])
            return {"child": summary(child, child_cpu), "thread": summary(thread, thread_cpu),
                    "cached": summary(cached, cached_cpu)}
        finally:
            await pool.close()

    return asyncio.run(run())


def trivial(count: int, input_doc: dict[str, Any], reps: int) -> dict[str, float]:
    """``count`` one-comparison rules over the same input, the cheaper of the two evaluations."""
    modules = [Module(f"t{i}.rego", f"""package t{i}
import rego.v1
findings := [{{"service": name, "path": ["x{i}"], "message": "m"}} |
	some name
	svc := input.fields.services[name]
	svc.x{i} == true
]
""") for i in range(count)]
    each = [f"t{i}/findings" for i in range(count)]
    gathered = "package all\nall := [" + ", ".join(f"data.t{i}.findings" for i in range(count))
    bundle = compile_bundle([*modules, Module("all.rego", gathered + "]\n")], {},
                            [*each, "all/all"])
    runs = [_timed(lambda: bundle.query_each(each, input_doc), reps),
            _timed(lambda: bundle.query("all/all", input_doc), reps)]
    return min(runs, key=lambda r: r["cpu_p50_ms"])


RISKY = h.REPO / "examples/compose/risky.compose.yaml"


def _renamed(fields: dict[str, Any], i: int) -> dict[str, Any]:
    """A new file: the same services under a new project name. The project name is context of
    every service, so nothing of an earlier report is reused: a full evaluation (the target's
    measure)."""
    return {**fields, "name": f"bench-new-{i}"}


def _one_service_bumped(fields: dict[str, Any], i: int) -> dict[str, Any]:
    """A new file as a CI re-check sees one: one service's image tag bumped (a different service
    each time), the rest as before."""
    services = dict(fields["services"])
    name = list(services)[i % len(services)]
    services[name] = {**services[name], "image": f"registry.example/app:{i}"}
    return {**fields, "services": services}


NEW_FILES = {"renamed": _renamed, "one service bumped": _one_service_bumped}


def over_http(requests: int, connections: int = 16, new_file: str = "renamed") -> dict[str, Any]:
    import asyncio

    import aiohttp

    fields = http_bench.compose_fields(10)
    with h.temp_dir("compose-bench-") as tmp:
        state = Path(tmp) / "state"
        state.mkdir(mode=0o700)
        with h.service(state, workers=2) as server:
            ids = h.Identities(server.base)

            async def login() -> str:
                async with aiohttp.ClientSession() as session:
                    return await ids.login(session, "alice")

            token = asyncio.run(login())
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            repeated = h.dumps({"env": "prod", "fields": fields})
            batch = []
            for i in range(requests):
                body = repeated if i % 5 else h.dumps(
                    {"env": "prod", "fields": NEW_FILES[new_file](fields, i)})
                batch.append(h.Request("POST", API + "/compose/import", headers, body))
            warm = h.Request("POST", API + "/compose/import", headers, repeated)
            h.drive(server.base, warm, connections=4, duration=1.0, max_requests=20,
                    tmp=Path(tmp), use_wrk=False)
            cpu0 = h.cpu_seconds(server.worker_pids())
            result = h.drive(server.base, batch, connections=connections, duration=120.0,
                             max_requests=len(batch), tmp=Path(tmp), use_wrk=False)
            cpu = h.cpu_seconds(server.worker_pids()) - cpu0
    return {"requests": result.requests, "rps": result.rps, "p50_ms": result.p50_ms,
            "p99_ms": result.p99_ms, "errors": result.errors, "server_cpu_s": cpu,
            "seconds": result.seconds, "connections": connections, "new_file": new_file}


CLI_TARGETS = {"version_p50_s": 0.15, "check_p50_s": 0.35}


def cli_start(reps: int = 10) -> dict[str, float]:
    """Wall-clock medians of ``reps`` processes each: ``cpctl --version``, ``cpctl compose
    check`` of the bench's 10-service file (written as YAML), the same without the compiled-rules
    cache (``CONTROLPLANE_BUNDLE_CACHE=0``: a first run), and the floor, a Python process that
    imports PyYAML and loads the same file. The commands take turns, so all see the same load.

    As installed: one warm-up run each writes the bytecode (``PYTHONDONTWRITEBYTECODE`` is
    dropped: pip compiles an installed package's, and PyYAML's, the floor's, is compiled) and
    the rules cache."""
    import os
    import subprocess
    import tempfile

    import yaml

    environ = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONDONTWRITEBYTECODE", "CONTROLPLANE_BUNDLE_CACHE")}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "compose.yaml"
        path.write_text(yaml.safe_dump(http_bench.compose_fields(10)), encoding="utf-8")
        check = [sys.executable, "-m", "service", "compose", "check", str(path),
                 "--env-file", "/dev/null"]
        commands = {
            "version": ([sys.executable, "-m", "service", "--version"], environ),
            "check": (check, environ),
            "check_uncached": (check, {**environ, "CONTROLPLANE_BUNDLE_CACHE": "0"}),
            "floor": ([sys.executable, "-c",
                       "import sys, yaml; yaml.safe_load(open(sys.argv[1], encoding='utf-8'))",
                       str(path)], environ),
        }
        walls: dict[str, list[float]] = {name: [] for name in commands}
        for rep in range(reps + 1):
            for name, (command, env) in commands.items():
                start = time.perf_counter()
                subprocess.run(command, cwd=h.REPO, env=env, capture_output=True, check=False)
                if rep:  # the first round is the warm-up
                    walls[name].append(time.perf_counter() - start)
        out: dict[str, float] = {f"{name}_p50_s": statistics.median(w) for name, w in walls.items()}
        out["reps"] = reps
        return out


def cli_markdown(cli: dict[str, float]) -> list[str]:
    def met(key: str) -> str:
        return "yes" if cli[key] <= CLI_TARGETS[key] else "no"

    return [
        f"CLI processes (wall-clock median of {cli['reps']:g} each, taking turns; the bench's "
        "10-service file as YAML; bytecode compiled, as installed):", "",
        "| measure | p50 s | floor / target | met |", "|---|---:|---|---|",
        f"| Python + PyYAML loading the file (the floor) | {cli['floor_p50_s']:.3f} | - | - |",
        f"| `cpctl --version` | {cli['version_p50_s']:.3f} | <= "
        f"{CLI_TARGETS['version_p50_s']:g} s | {met('version_p50_s')} |",
        f"| `cpctl compose check` | {cli['check_p50_s']:.3f} | <= "
        f"{CLI_TARGETS['check_p50_s']:g} s ({cli['check_p50_s'] / cli['floor_p50_s']:.1f}x "
        f"the floor) | {met('check_p50_s')} |",
        f"| `cpctl compose check`, rules compiled (first run: no rules cache) | "
        f"{cli['check_uncached_p50_s']:.3f} | "
        f"({cli['check_uncached_p50_s'] / cli['floor_p50_s']:.1f}x the floor) | - |", ""]


def markdown(doc: dict[str, Any]) -> str:
    ip = doc["in_process"]
    ratio = ip["uncached"]["p50_ms"] / ip["constant"]["p50_ms"]
    cpu_ratio = ip["uncached"]["cpu_p50_ms"] / max(ip["constant"]["cpu_p50_ms"], 1e-6)
    lines = [
        "## Compose preflight (`bench/compose_bench.py`)", "",
        f"The bench's 10-service file (`http_bench.compose_fields(10)`), env prod, "
        f"{ip['rules']} rules; in-process, {doc['reps']} runs each (cached: {doc['reps'] * 10}).",
        "", "| measure | p50 ms | p99 ms | CPU p50 ms | floor | met |", "|---|---:|---:|---:|---|---|",
        f"| uncached report | {ip['uncached']['p50_ms']:.1f} | {ip['uncached']['p99_ms']:.1f} | "
        f"{ip['uncached']['cpu_p50_ms']:.1f} | <= {TARGETS['uncached_p50_ms']:g} ms | "
        f"{'yes' if ip['uncached']['p50_ms'] <= TARGETS['uncached_p50_ms'] else 'no'} |",
        f"| constant-policy query, same input | {ip['constant']['p50_ms']:.1f} | "
        f"{ip['constant']['p99_ms']:.1f} | {ip['constant']['cpu_p50_ms']:.1f} | - | - |",
        f"| uncached / constant | {ratio:.1f}x | | {cpu_ratio:.1f}x | <= "
        f"{TARGETS['uncached_over_constant']:g}x | "
        f"{'yes' if ratio <= TARGETS['uncached_over_constant'] else 'no'} |",
        f"| {ip['rules']} one-comparison rules, same input | {ip['trivial']['p50_ms']:.1f} | "
        f"{ip['trivial']['p99_ms']:.1f} | {ip['trivial']['cpu_p50_ms']:.1f} | - | - |",
        f"| {ip['rules']} one-comparison rules / constant | "
        f"{ip['trivial']['p50_ms'] / ip['constant']['p50_ms']:.1f}x | | "
        f"{ip['trivial']['cpu_p50_ms'] / max(ip['constant']['cpu_p50_ms'], 1e-6):.1f}x | - | - |",
        f"| one service of the 10 changed (the others' outputs cached) | "
        f"{ip['one_changed']['p50_ms']:.1f} | {ip['one_changed']['p99_ms']:.1f} | "
        f"{ip['one_changed']['cpu_p50_ms']:.1f} | - | - |",
        f"| cached report | {ip['cached']['p50_ms']:.3f} | {ip['cached']['p99_ms']:.3f} | "
        f"{ip['cached']['cpu_p50_ms']:.3f} | <= {TARGETS['cached_p50_ms']:g} ms | "
        f"{'yes' if ip['cached']['p50_ms'] <= TARGETS['cached_p50_ms'] else 'no'} |",
        f"| normalize risky.compose.yaml | {ip['normalize']['p50_ms']:.2f} | "
        f"{ip['normalize']['p99_ms']:.2f} | {ip['normalize']['cpu_p50_ms']:.2f} | - | - |", ""]
    iso = doc.get("isolated")
    if iso:
        extra = iso["child"]["p50_ms"] - iso["thread"]["p50_ms"]
        lines += [
            "The handler's await of a report, on an event loop (new files: the bench's file "
            "under a new project name, a full evaluation each), wall-clock:", "",
            "| measure | p50 ms | p99 ms | CPU ms (worker + evaluator, mean) |",
            "|---|---:|---:|---:|",
            f"| uncached report in an evaluator process (served) | {iso['child']['p50_ms']:.1f} | "
            f"{iso['child']['p99_ms']:.1f} | {iso['child']['cpu_ms']:.1f} |",
            f"| uncached report in a thread of the worker (before) | "
            f"{iso['thread']['p50_ms']:.1f} | {iso['thread']['p99_ms']:.1f} | "
            f"{iso['thread']['cpu_ms']:.1f} |",
            f"| isolation overhead | {extra:+.1f} "
            f"({extra / max(iso['thread']['p50_ms'], 1e-6):+.0%}) | | "
            f"{iso['child']['cpu_ms'] - iso['thread']['cpu_ms']:+.1f} |",
            f"| cached report through the pool (no child) | {iso['cached']['p50_ms']:.3f} | "
            f"{iso['cached']['p99_ms']:.3f} | {iso['cached']['cpu_ms']:.3f} |", ""]
    if doc.get("rules"):
        lines += ["CPU each rule adds to the constant query (its own entrypoint alone, minimum of "
                  f"{doc['reps']} runs):", "", "| rule | CPU ms |", "|---|---:|"]
        lines += [f"| {rule} | {ms:.2f} |" for rule, ms in doc["rules"]]
        lines += [f"| all rules | {sum(ms for _, ms in doc['rules']):.1f} |", ""]
    if doc.get("cli"):
        lines += cli_markdown(doc["cli"])
    runs = doc.get("http") or []
    if runs:
        lines += [
            f"HTTP, `cpctl serve --workers 2` (SQLite), {runs[0]['connections']} connections, "
            f"{runs[0]['requests']} requests: 80% one repeated file, 20% new files (Python "
            "generator on the same box). New files `renamed`: the same services under a new "
            "project name, context of every service, so a full evaluation each (the target's "
            "measure); `one service bumped`: one service's image tag changed, as a CI re-check "
            "sees a file (the other services' rule outputs are reused).", "",
            "| new files | req/s | p50 ms | p99 ms | errors | server CPU s | floor | met |",
            "|---|---:|---:|---:|---:|---:|---|---|"]
        for http in runs:
            met = http["rps"] >= TARGETS["http_rps"]
            lines.append(
                f"| {http['new_file']} | {http['rps']:,.0f} | {http['p50_ms']:.1f} | "
                f"{http['p99_ms']:.1f} | {http['errors']} | {http['server_cpu_s']:.1f} | "
                f">= {TARGETS['http_rps']:g} req/s | {'yes' if met else 'no'} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=60)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--no-http", action="store_true")
    parser.add_argument("--rules", action="store_true", help="a per-rule CPU table")
    parser.add_argument("--cli-only", action="store_true",
                        help="only the CLI processes against their floor")
    args = parser.parse_args(argv)
    if args.cli_only:
        print("\n".join(["## Compose CLI start (`bench/compose_bench.py --cli-only`)", "",
                         *cli_markdown(cli_start())]))
        return 0
    doc: dict[str, Any] = {"reps": args.reps, "in_process": in_process(args.reps),
                           "isolated": isolated(args.reps), "cli": cli_start()}
    if args.rules:
        doc["rules"] = per_rule(args.reps)
    if not args.no_http:
        doc["http"] = [over_http(args.requests, new_file=kind) for kind in NEW_FILES]
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
