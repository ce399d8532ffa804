"""The authorized read's CPU in-process: the service's app against the reference peer's, no HTTP.

Run: python bench/read_inproc.py [--rounds R] [--reads N] [--profile] [--opcodes]

Each target is the real application (``create_app``, started as ``cpctl serve`` starts it, on
its default event loop, with its logging, GC settings and audit checkpoints; the peer
``peer_read.py`` as its own workers run it with ``--uvloop --log batched``), in a process of its
own, handed ``GET /api/v1/databases`` requests 64 at a time through ``Application._handle``:
routing, middleware, the whole chain, the audit record committed on the store's thread, the
response object, and the service's access line, which aiohttp's protocol asks its access logger
for once a response is written (the peer writes its one line from its handler). Not the HTTP
parsing and writing, which is aiohttp's for both (the HTTP rows of ``http_bench.py`` hold
it). CPU is the process's, all threads, per read; the targets alternate round by round and
the medians are reported with their ratio.

Why: on this shared machine the HTTP figures of one target move by 10-25% between bursts a few
seconds apart; these move by a few percent, so a change of a few microseconds a read shows here
(``--profile``: cProfile of the service's event loop thread, by own time) before it can over
HTTP.

``--parts``: what each part of the service's read costs, as the read without it (the part
knocked out in the process, everything else as served) against the whole read, in the same
rounds: ``authn`` (token, session row, principal: the principal of the first read is given to
every later one), ``authz`` (the cached decision: the first read's decision is given again),
``audit`` (the record's preparation, its group commit and mirror: answered at once, nothing
written). A knock-out is a measurement only: the reads it serves are not what the service does.

``--opcodes``: the bytecode instructions each target's event loop thread executes per read,
counted (``sys.settrace`` with opcode events, over a few hundred reads after the warm-up), not
timed: the same figure on a quiet or a busy machine, where the CPU figures move 10-25% between
runs. Both targets run the same harness (the request's clone, ``asyncio.gather``: about 230 of
them). Python code only: what C code a bytecode calls (a multidict, orjson, SQLite) counts one.

``--against CHECKOUT``: this checkout's service against another checkout's (the commit before a
change, in a worktree), both processes running at the same time every round: two processes that
share a minute of a shared machine see the same noise, so their ratio moves 2-4% between rounds
where rounds taken in turn move 10-25%. For judging a change of a few percent. Each checkout is
measured by its own ``--child service`` (a checkout from before the access line was measured
here, bb73ac3, leaves it out).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h  # noqa: E402

IN_FLIGHT = 64
WARMUP_READS = 3200


class _Transport:
    """A connection's transport as a request reads it (peer and local addresses)."""

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8080)}.get(
            name, default)

    def is_closing(self) -> bool:
        return False


class _Protocol:
    max_field_size = max_line_length = 8190
    max_headers = 128
    ssl_context = None
    peername = ("127.0.0.1", 40000)
    sockname = ("127.0.0.1", 8080)

    def __init__(self) -> None:
        self.transport = _Transport()


class _Writer:
    transport = None


def _request(app: Any, token: str) -> Any:
    """A request as aiohttp's protocol makes one, with plain objects for the connection (the
    test utilities' mocks would cost more than some of what is measured)."""
    from aiohttp.test_utils import make_mocked_request

    protocol = _Protocol()
    return make_mocked_request("GET", "/api/v1/databases",
                               headers={"Authorization": f"Bearer {token}"}, app=app,
                               protocol=protocol, transport=protocol.transport, writer=_Writer())


#: Reads whose bytecodes ``--opcodes`` counts (after the warm-up); every read of the harness is
#: the same, so a few hundred give the figure exactly.
COUNTED_READS = 640


async def _count_opcodes(run_reads: Callable[[], Awaitable[None]], reads: int
                         ) -> dict[str, Any]:
    """``run_reads`` (``reads`` reads) with every bytecode this thread executes counted, per
    function: the total and the top functions, per read."""
    counts: dict[tuple[str, int, str], int] = {}

    def per_opcode(frame: Any, event: str, arg: Any) -> Any:
        if event == "opcode":
            code = frame.f_code
            key = (code.co_filename, code.co_firstlineno, code.co_name)
            counts[key] = counts.get(key, 0) + 1
        return per_opcode

    def per_call(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes, frame.f_trace_lines = True, False
        return per_opcode

    sys.settrace(per_call)
    try:
        await run_reads()
    finally:
        sys.settrace(None)
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:OPCODES_TOP]
    return {"opcodes_per_read": sum(counts.values()) / reads,
            "opcodes_top": [(_where(*key), n / reads) for key, n in top]}


#: Functions ``--opcodes`` names, the most executed first.
OPCODES_TOP = 25


def _where(filename: str, line: int, name: str) -> str:
    for marker in ("/site-packages/", "/lib/python3."):
        if marker in filename:
            filename = filename.split(marker, 1)[1]
            if marker == "/lib/python3.":
                filename = filename.split("/", 1)[-1]
            break
    filename = filename.replace(f"{REPO}/", "").replace(f"{REPO.parent}/", "../")
    if filename == "<string>":  # dataclasses' generated methods share one name
        return f"<dataclass {name}>"
    return f"{filename}:{line}({name})"


async def _measure(app: Any, token: str, reads: int, profile: bool,
                   access: Any = None, opcodes: bool = False) -> dict[str, Any]:
    template = _request(app, token)
    loop = asyncio.get_running_loop()

    async def one() -> None:
        started = loop.time()
        request = template.clone()
        response = await app._handle(request)
        if response.status != 200:
            raise RuntimeError(f"the read answered {response.status}")
        if access is not None:  # as aiohttp's protocol does once the response is written
            access.log(request, response, loop.time() - started)

    async def batch(n: int) -> None:
        for _ in range(n // IN_FLIGHT):
            await asyncio.gather(*[one() for _ in range(IN_FLIGHT)])

    await batch(WARMUP_READS)
    if opcodes:
        return await _count_opcodes(lambda: batch(COUNTED_READS), COUNTED_READS)
    n = reads // IN_FLIGHT * IN_FLIGHT
    started = time.process_time()
    await batch(n)
    result: dict[str, Any] = {"us_per_read": 1e6 * (time.process_time() - started) / n}
    if profile:
        import cProfile
        import io
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        await batch(n)
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
        result["profile"] = out.getvalue().replace(f"{REPO}/", "")
    return result


#: The parts ``--parts`` knocks out, and what each is.
PARTS = {
    "authn": "AuthN: token, session row, principal (middleware.authn.identify_now)",
    "authz": "AuthZ: the cached decision (chain.decide_run)",
    "audit": "Audit: the record's preparation, group commit and mirror (AuditLog.append)",
}


def _knock_out(part: str) -> None:
    """Replace ``part`` of the read with an answer given at once (the first read's, for AuthN
    and AuthZ): for ``--parts`` only."""
    if part == "authn":
        from service.authn.principal import PRINCIPAL
        from service.middleware import authn

        identify_now = authn.identify_now
        first: list[Any] = []

        def given(request: Any) -> None:
            if not first:
                if identify_now(request) is not None:
                    raise RuntimeError("the read's caller was not identified at once")
                first.append(request[PRINCIPAL])
            request[PRINCIPAL] = first[0]

        authn.identify_now = given
    elif part == "authz":
        from service import chain

        decide_run = chain.decide_run
        decided: list[Any] = []

        def again(*args: Any, **kwargs: Any) -> Any:
            if not decided:
                decided.append(decide_run(*args, **kwargs))
            return decided[0]

        chain.decide_run = again  # type: ignore[assignment]
    elif part == "audit":
        from service.audit.log import AuditLog
        from service.store.base import AuditRecord

        record = AuditRecord(1, "sha256:" + "0" * 64, "sha256:" + "1" * 64, {})

        async def appended(self: Any, entry: Any, tx: Any = None, known: Any = None) -> AuditRecord:
            return record

        AuditLog.append = appended  # type: ignore[method-assign]
        AuditLog.mirror_soon = lambda self, records, told=False: None  # type: ignore[method-assign]
    else:
        raise ValueError(f"unknown part {part!r}")


def _freeze_gc() -> None:
    """As a serving worker does once started (``service/cli/serve.py``)."""
    from service.cli.serve import YOUNG_GC_THRESHOLD

    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GC_THRESHOLD, older, oldest)


async def _service(reads: int, profile: bool, opcodes: bool = False) -> dict[str, Any]:
    from aiohttp import web

    from service import clock, logs
    from service import config as config_mod
    from service.app import create_app
    from service.authn.sessions import AUTHENTICATOR

    config = config_mod.load_from_process(None, overrides={})
    logs.configure(config.logging.level, config.logging.mask_fields)
    runner = web.AppRunner(create_app(config))
    await runner.setup()
    try:
        app = runner.app
        issued = await app[AUTHENTICATOR].login_password(
            "carol", h.PASSWORDS["carol"], "127.0.0.1", clock.now())
        _freeze_gc()
        access = None
        if config.logging.access_log:  # the access logger ``cpctl serve`` gives aiohttp
            import logging

            from service.accesslog import AccessLogger

            access = AccessLogger(logging.getLogger("controlplane.access"), "")
        return await _measure(app, issued.access_token, reads, profile, access, opcodes)
    finally:
        await runner.cleanup()


async def _peer(state: Path, token: str, reads: int, opcodes: bool = False) -> dict[str, Any]:
    import logging

    from aiohttp import web

    spec = importlib.util.spec_from_file_location("peer_read", h.PEER_READ)
    assert spec is not None and spec.loader is not None
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    handler = peer.Batched()  # as its workers run with --log batched
    handler.setFormatter(peer.JsonLines())
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)
    runner = web.AppRunner(peer.make_app(state, REPO))
    await runner.setup()
    try:
        _freeze_gc()
        return await _measure(runner.app, token, reads, False, opcodes=opcodes)
    finally:
        await runner.cleanup()


def _child(args: argparse.Namespace) -> int:
    """One target, one round, in this process: its figures as JSON on stdout."""
    import uvloop

    run: Callable[[], Awaitable[dict[str, Any]]]
    if args.knock_out:
        _knock_out(args.knock_out)
    if args.child == "service":
        def run() -> Awaitable[dict[str, Any]]:
            return _service(args.reads, args.profile, args.opcodes)
    else:
        def run() -> Awaitable[dict[str, Any]]:
            return _peer(Path(args.state), args.token, args.reads, args.opcodes)
    result = uvloop.run(run())
    print(json.dumps(result))
    return 0


def _round(target: str, reads: int, tmp: Path, peer: tuple[Path, str] | None,
           profile: bool = False, knock_out: str | None = None,
           opcodes: bool = False) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", target, "--reads", str(reads),
               *(["--knock-out", knock_out] if knock_out else []),
               *(["--opcodes"] if opcodes else [])]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    if target == "service":
        state = Path(tempfile.mkdtemp(prefix="state-", dir=tmp))
        state.chmod(0o700)
        environ["CONTROLPLANE_STATE_DIR"] = str(state)
        command += ["--profile"] if profile else []
    else:
        assert peer is not None
        command += ["--state", str(peer[0]), "--token", peer[1]]
    done = h.run_reaped(command, timeout=600, cwd=REPO, env=environ)
    if done.returncode != 0:
        raise RuntimeError(f"{target}: exit {done.returncode}: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def run(rounds: int, reads: int, *, profile: bool = False, parts: bool = False,
        opcodes: bool = False) -> dict[str, Any]:
    """``rounds`` alternated rounds of each target (with ``parts``, of the service without each
    part too); the medians and their ratio."""
    with h.temp_dir("read-inproc-") as tmp_name:
        tmp = Path(tmp_name)
        peer = None
        if h.PEER_READ.exists():
            state = tmp / "peer"
            peer = (state, h.peer_init(state))
        figures: dict[str, list[float]] = {"service": [], **({"peer": []} if peer else {})}
        without = {f"service without {part}": part for part in (PARTS if parts else ())}
        order = [*figures, *without]
        figures.update({name: [] for name in without})
        for i in range(rounds):
            for name in (order if i % 2 == 0 else order[::-1]):
                target = "service" if name in without else name
                figures[name].append(_round(target, reads, tmp, peer,
                                            knock_out=without.get(name))["us_per_read"])
        doc: dict[str, Any] = {"rounds": rounds, "reads": reads, "in_flight": IN_FLIGHT,
                               "us_per_read": figures,
                               "median": {k: statistics.median(v) for k, v in figures.items()}}
        if peer:
            doc["ratio"] = doc["median"]["service"] / doc["median"]["peer"]
        if parts:
            doc["parts"] = {part: doc["median"]["service"] - doc["median"][name]
                            for name, part in without.items()}
        if profile:
            doc["profile"] = _round("service", reads, tmp, None, profile=True)["profile"]
        if opcodes:
            doc["opcodes"] = {name: _round(name, reads, tmp, peer, opcodes=True)
                              for name in ("service", *(["peer"] if peer else []))}
        return doc


def against(rounds: int, reads: int, other: Path) -> dict[str, Any]:
    """``--against``: this checkout's service against ``other``'s (another checkout of the
    project), both started at the same time every round, so that both see the same minute of
    a shared machine: the per-round ratio moves a few percent where rounds taken one after the
    other move 10-25%. For judging a change of a few percent; not run by ``make bench``."""
    checkouts = {"this": REPO, "other": other.resolve()}
    with h.temp_dir("read-inproc-ab-") as tmp_name:
        tmp = Path(tmp_name)
        figures: dict[str, list[float]] = {name: [] for name in checkouts}
        for _ in range(rounds):
            running = {}
            for name, checkout in checkouts.items():
                state = Path(tempfile.mkdtemp(prefix="state-", dir=tmp))
                state.chmod(0o700)
                environ = {k: v for k, v in os.environ.items()
                           if not k.startswith("CONTROLPLANE_")}
                environ["CONTROLPLANE_STATE_DIR"] = str(state)
                running[name] = h.spawn(
                    [sys.executable, str(checkout / "bench" / "read_inproc.py"), "--child",
                     "service", "--reads", str(reads)],
                    cwd=checkout, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for name, proc in running.items():
                out, err = proc.communicate(timeout=600)
                if proc.returncode != 0:
                    raise RuntimeError(f"{name}: exit {proc.returncode}: {err.decode()[-2000:]}")
                figures[name].append(json.loads(out.decode().strip().splitlines()[-1])
                                     ["us_per_read"])
        ratios = [a / b for a, b in zip(figures["this"], figures["other"], strict=True)]
        return {"rounds": rounds, "reads": reads, "other": str(checkouts["other"]),
                "us_per_read": figures,
                "median": {k: statistics.median(v) for k, v in figures.items()},
                "ratio": statistics.median(ratios), "ratios": ratios}


def markdown_against(doc: dict[str, Any]) -> str:
    lines = ["## Authorized read in-process, this checkout against another", "",
             f"The service's read ({doc['reads']:,} a round), this checkout's and "
             f"`{doc['other']}`'s at the same time, {doc['rounds']} rounds:", "",
             "| checkout | CPU us/read (median) | rounds |", "|---|---:|---|"]
    for name, values in doc["us_per_read"].items():
        lines.append(f"| {name} | {doc['median'][name]:.1f} | "
                     + ", ".join(f"{v:.1f}" for v in values) + " |")
    lines += ["", f"This / other, the median of the rounds' ratios: **{doc['ratio']:.3f}** "
              f"({min(doc['ratios']):.3f}-{max(doc['ratios']):.3f})."]
    return "\n".join(lines) + "\n"


def markdown(doc: dict[str, Any]) -> str:
    lines = ["## Authorized read in-process (`bench/read_inproc.py`)", "",
             f"`GET /api/v1/databases` handed to each application {doc['in_flight']} at a time, "
             f"{doc['reads']:,} reads a round, {doc['rounds']} rounds alternated, each round a "
             "fresh process; CPU of all its threads per read, no HTTP parsing or writing. "
             "Medians.", "",
             "| target | CPU us/read (median) | rounds |", "|---|---:|---|"]
    for target, values in doc["us_per_read"].items():
        lines.append(f"| {target} | {doc['median'][target]:.1f} | "
                     + ", ".join(f"{v:.1f}" for v in values) + " |")
    if "ratio" in doc:
        lines += ["", f"Service / peer: **{doc['ratio']:.2f}x**."]
    if "parts" in doc:
        lines += ["", "What each part of the service's read costs: the read against the read "
                  "with the part knocked out (answered at once), medians of the same rounds:", "",
                  "| part | CPU us/read |", "|---|---:|"]
        lines += [f"| {PARTS[part]} | {cost:.1f} |" for part, cost in doc["parts"].items()]
    if "opcodes" in doc:
        counted = doc["opcodes"]
        lines += ["", f"Bytecodes executed on the event loop's thread per read, counted over "
                  f"{COUNTED_READS} reads (not timed: the same on a busy machine; the harness's "
                  "own are in both):", "",
                  "| target | bytecodes/read |", "|---|---:|"]
        lines += [f"| {name} | {figures['opcodes_per_read']:,.0f} |"
                  for name, figures in counted.items()]
        if "peer" in counted:
            lines += ["", "Service / peer: **"
                      f"{counted['service']['opcodes_per_read'] / counted['peer']['opcodes_per_read']:.2f}x**"
                      " the bytecodes."]
        lines += ["", f"The service's {OPCODES_TOP} functions executing the most of them "
                  "(their own bytecodes per read):", "", "```"]
        lines += [f"{n:8.1f}  {where}" for where, n in counted["service"]["opcodes_top"]]
        lines += ["```"]
    if "profile" in doc:
        lines += ["", "cProfile of the service's event loop thread (own time):", "", "```",
                  doc["profile"].strip(), "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--reads", type=int, default=25_600)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--opcodes", action="store_true",
                        help="also count each target's bytecodes per read (see the module)")
    parser.add_argument("--parts", action="store_true",
                        help="also the service with each part knocked out (see the module)")
    parser.add_argument("--against", metavar="CHECKOUT",
                        help="measure this checkout's service against another checkout's, "
                        "both running at the same time each round (see ``against``)")
    parser.add_argument("--json", help="write the results document here")
    parser.add_argument("--markdown", help="write the Markdown section here")
    parser.add_argument("--child", choices=("service", "peer"), help=argparse.SUPPRESS)
    parser.add_argument("--knock-out", choices=tuple(PARTS), help=argparse.SUPPRESS)
    parser.add_argument("--state", help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args)
    if args.against:
        doc = against(args.rounds, args.reads, Path(args.against))
        section = markdown_against(doc)
    else:
        doc = run(args.rounds, args.reads, profile=args.profile, parts=args.parts,
                  opcodes=args.opcodes)
        section = markdown(doc)
    return h.report(doc, section, args.json, args.markdown)


if __name__ == "__main__":
    raise SystemExit(main())
