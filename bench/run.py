"""``make bench``: run every benchmark and write bench/RESULTS.md.

Run: python bench/run.py [--quick] [--no-postgres] [--no-profile] [--kics DIR] [--out FILE]

1. bench/http_bench.py    HTTP load: service vs a bare aiohttp app, SQLite/PostgreSQL, 1/2 workers
   bench/read_inproc.py   the authorized read's CPU in-process, service vs the reference peer
                          (no HTTP; steadier than the HTTP rows), what each part of the
                          service's read costs (AuthN, AuthZ, audit), a cProfile of the service
2. bench/ticket_bench.py  ticket create -> approve -> consume, store level and HTTP
3. bench/decision_bench.py  per-decision policy latency (its own output, included verbatim)
4. bench/shadow_bench.py  live-path latency with and without shadow evaluation (fixed rate and
                          saturation), divergence metric
5. bench/audit_bench.py   the audit chain's global section on PostgreSQL: hold time, ceiling
6. bench/compose_bench.py   compose preflight: report latency against its floor (the
   constant-policy query), cached, compose import over HTTP with 80% repeated / 20% new files,
   and the CLI processes (`cpctl --version`, `cpctl compose check`) against their floor (a
   Python + PyYAML process loading the same file) (its own output, verbatim)
7. bench/compose_external.py  only with --kics DIR (or $CONTROLPLANE_BENCH_KICS): the compose
   rules against KICS's docker-compose query fixtures, held out (third-party data the
   repository does not ship: DIR is a local copy of its assets/queries/dockerCompose)

The harness stops every process a benchmark started, when the run is interrupted too (Ctrl-C,
SIGTERM, SIGHUP); a run killed outright is cleaned up by the next one (bench/_harness.py).

Benchmarks are never tests: nothing here fails on a slow number. A benchmark that cannot run
(PostgreSQL unreachable, wrk or py-spy missing) is skipped or falls back, and RESULTS.md says so.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h
import audit_bench
import http_bench
import shadow_bench
import ticket_bench

BENCH = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run (about 2 minutes)")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--kics", default=os.environ.get("CONTROLPLANE_BENCH_KICS") or None,
                        metavar="DIR", help="KICS docker-compose query fixtures: also run "
                        "bench/compose_external.py (default: $CONTROLPLANE_BENCH_KICS)")
    parser.add_argument("--out", default=str(BENCH / "RESULTS.md"))
    args = parser.parse_args(argv)
    common = [*(["--quick"] if args.quick else []),
              *(["--no-postgres"] if args.no_postgres else [])]
    started = time.monotonic()

    http_args = [*common, *(["--no-profile"] if args.no_profile else [])]
    http_doc = http_bench.run(http_bench.options(http_args))
    http_md = http_bench.markdown(http_doc)
    print(http_md, flush=True)

    inproc_args = ["--rounds", "2", "--reads", "6400"] if args.quick else []
    inproc = h.run_reaped([sys.executable, str(BENCH / "read_inproc.py"), *inproc_args,
                           "--parts", "--opcodes", *([] if args.no_profile else ["--profile"])],
                          timeout=1200, cwd=h.REPO)
    inproc_md = (inproc.stdout if inproc.returncode == 0 else "\n".join([
        "## Authorized read in-process (`bench/read_inproc.py`)", "", "```",
        (inproc.stdout + inproc.stderr).strip()[-4000:], "```", ""]))
    print(inproc_md, flush=True)

    ticket_doc = ticket_bench.run(ticket_bench.options(common))
    ticket_md = ticket_bench.markdown(ticket_doc)
    print(ticket_md, flush=True)

    decision_args = ["--decisions", "500", "--reps", "2"] if args.quick else []
    decision = h.run_reaped([sys.executable, str(BENCH / "decision_bench.py"), *decision_args],
                            timeout=600, cwd=h.REPO)
    decision_md = "\n".join([
        "## Policy decisions (`bench/decision_bench.py`)", "", "```",
        (decision.stdout + (decision.stderr if decision.returncode else "")).strip(), "```", ""])
    print(decision_md, flush=True)

    shadow_md = shadow_bench.markdown(shadow_bench.run(shadow_bench.options(common)))
    print(shadow_md, flush=True)
    audit_md = audit_bench.markdown(audit_bench.run(audit_bench.options(common)))
    print(audit_md, flush=True)
    compose_args = ["--reps", "10", "--requests", "300"] if args.quick else []
    compose = h.run_reaped([sys.executable, str(BENCH / "compose_bench.py"), *compose_args],
                           timeout=1200, cwd=h.REPO)
    compose_md = (compose.stdout if compose.returncode == 0 else "\n".join([
        "## Compose preflight (`bench/compose_bench.py`)", "", "```",
        (compose.stdout + compose.stderr).strip()[-4000:], "```", ""]))
    print(compose_md, flush=True)
    external_md = ""
    if args.kics:
        external = h.run_reaped([sys.executable, str(BENCH / "compose_external.py"),
                                 "--fixtures", args.kics, "--markdown"], timeout=600, cwd=h.REPO)
        external_md = (external.stdout if external.returncode == 0 else "\n".join([
            "## Compose rules against KICS fixtures (`bench/compose_external.py`)", "", "```",
            (external.stdout + external.stderr).strip()[-4000:], "```", ""]))
        print(external_md, flush=True)

    m = http_doc["machine"]
    invocation = "make bench" + (f" ARGS={shlex.quote(' '.join(argv or []))}" if argv else "")
    header = [
        "# Benchmark results", "",
        f"Generated by `bench/run.py` on {m['date']} in {time.monotonic() - started:.0f} s"
        + (" (`--quick` smoke run)" if args.quick else "") + ".", "",
        "## Machine", "",
        f"- nproc: {m['nproc']}; CPU: {m['cpu']}; memory: {m['memory']}; kernel {m['kernel']}",
        f"- Python {m['python']}, aiohttp {m['aiohttp']}, SQLite {m['sqlite']}"
        + (f", PostgreSQL {m['postgresql']}" if "postgresql" in m else ""),
        f"- load generator: {m['load_generator']}; profiler: "
        + ("py-spy" if h.pyspy() else "none (py-spy not installed)"),
        "- everything on one box: the load generator and the server share the cores, on loopback",
        "", "## Reproduce", "", "```sh",
        "apt-get install -y wrk                # optional: else an aiohttp-client generator",
        ".venv/bin/pip install py-spy          # optional: else no profile",
        "make bench                            # this file (about 13-15 minutes)",
        ".venv/bin/python bench/run.py --quick # smoke run",
        ".venv/bin/python bench/http_bench.py --help; .venv/bin/python bench/ticket_bench.py --help",
        ".venv/bin/python bench/read_inproc.py --profile  # the read's CPU in-process (~1 min)",
        "```", "",
        f"This run: `{invocation}`. PostgreSQL: `$CONTROLPLANE_BENCH_PG_DSN` (default "
        "`postgresql://postgres@127.0.0.1:5432/test`), a fresh schema per service, dropped after.",
        "",
    ]
    out = Path(args.out)
    kept = _hand_written(out.read_text() if out.exists() else "")
    out.write_text("\n".join(header) + "\n" + http_md + "\n" + inproc_md + "\n" + ticket_md
                   + "\n" + audit_md + "\n" + decision_md + "\n" + shadow_md + "\n"
                   + compose_md + (("\n" + external_md) if external_md else "") + kept)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


#: The section written by hand from a run's profiles, which a regeneration keeps (last in the file).
HAND_WRITTEN = "## What limits each number now"
STALE = ("> Kept by `bench/run.py` from the previous RESULTS.md: written for an earlier run, so "
         "re-read it against the figures above (and delete this line once it is).")


def _hand_written(previous: str) -> str:
    """The hand-written section of the previous results (from its heading to the end), marked as
    written for an earlier run; empty when there is none."""
    start = previous.find("\n" + HAND_WRITTEN + "\n")
    if start < 0:
        return ""
    lines = previous[start + 1:].rstrip("\n").split("\n")
    body = [line for line in lines[1:] if line != STALE]
    while body and not body[0].strip():
        body.pop(0)
    return "\n\n" + "\n".join([HAND_WRITTEN, "", STALE, "", *body]) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
