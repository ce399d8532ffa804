"""Per-decision latency of the shipped policy, small vs large data, against a dict-lookup floor.

Run: python bench/decision_bench.py [--decisions N] [--reps R]

Measures PolicyEngine.decide (input strip + projection + native input set + evaluation + strict
parsing + invariants; the decision cache disabled) for the shipped data and for generated data with
5,000 subjects and 500 roles, plus the cached path and a plain Python dict lookup of the same
decision (the floor). Reports the median over repetitions of each repetition's p50/p90.

The "engine floor" line runs the same decide() path with a policy that returns a constant
decision: what every decision pays before any policy logic runs (input strip and projection,
native input conversion and set, the query itself, result parsing, invariants). Decision p50
minus that floor is the cost of the shipped policy's logic in regopy.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from service.authz.engine import PolicyEngine  # noqa: E402

SUBJECTS = [
    ("alice", "human"),
    ("carol", "human"),
    ("bob", "human"),
    ("ci-bot", "service"),
    ("agent-7", "agent"),
]
ACTIONS = [
    "installer.run.execute",
    "databases.list",
    "approvals.review",
    "tasks.report",
    "audit.read",
]
ENVS = ["dev", "staging", "prod"]


def inputs() -> list[dict]:
    out = []
    for subject, kind in SUBJECTS:
        for action in ACTIONS:
            for env in ENVS:
                out.append(
                    {
                        "principal": {
                            "subject_id": subject,
                            "kind": kind,
                            "session_id": "s-" + subject,
                            "auth_time": 1767225600,
                            "authn_method": "password",
                            "step_up": {"verified": True, "at": 1767225900.0, "age_s": 40},
                        },
                        "action": action,
                        "resource": {
                            "id": "r1",
                            "kind": "installer-run",
                            "hash": "sha256:" + "ab" * 32,
                            "owner": "alice",
                        },
                        "env": env,
                        "context": {
                            "correlation_id": "c",
                            "method": "POST",
                            "path": "/api/v1/x",
                            "command_hash": None,
                            "time": "2026-01-01T00:00:00Z",
                        },
                    }
                )
    return out


def large_policies(root: Path, subjects: int, roles: int) -> Path:
    """The shipped policy with generated roles/bindings; the shipped subjects keep their roles."""
    shutil.copytree(REPO / "policies", root, ignore=shutil.ignore_patterns("compose"))
    shipped_roles = yaml.safe_load((REPO / "policies/data/roles.yaml").read_text())["roles"]
    shipped_bind = yaml.safe_load((REPO / "policies/data/bindings.yaml").read_text())
    all_roles = dict(shipped_roles)
    for i in range(roles):
        all_roles[f"team-{i}"] = {
            "inherits": ["viewer"],
            "grants": [
                {"actions": ["installer.run.execute"], "envs": [ENVS[i % 3]], "kinds": ["human"]}
            ],
        }
    bindings = dict(shipped_bind["bindings"])
    for i in range(subjects):
        bindings[f"user-{i}"] = {"roles": [f"team-{i % roles}", f"team-{(i * 7) % roles}"]}
    groups = {
        g: list(m) + [f"user-{i}" for i in range(0, subjects, 50)]
        for g, m in shipped_bind["groups"].items()
    }
    (root / "data/roles.yaml").write_text(yaml.safe_dump({"roles": all_roles}))
    (root / "data/bindings.yaml").write_text(
        yaml.safe_dump({"bindings": bindings, "groups": groups})
    )
    return root


CONSTANT_POLICY = (
    "package controlplane.authz\n\nimport rego.v1\n\n"
    'decision := {"decision": "allow", "reasons": ["constant"], "approval": {}}\n'
)


def constant_policies(root: Path) -> Path:
    """The shipped data with a one-line constant policy (and no tests): the engine floor."""
    shutil.copytree(REPO / "policies", root, ignore=shutil.ignore_patterns("compose", "*.rego"))
    (root / "authz.rego").write_text(CONSTANT_POLICY)
    return root


APP_ONLY_POLICY = (
    "package controlplane.authz\n\nimport rego.v1\n\n"
    'decision := {"decision": "allow", "reasons": ["app"], "approval": {}} if {\n'
    '    input.resource.value.app == "web"\n'
    '} else := {"decision": "deny", "reasons": ["other_app"], "approval": {}}\n'
)


def resource_hit_rate(root: Path, runs: int = 200) -> float:
    """The decision cache's hit rate over ``runs`` installer runs of one app, each with its own
    version and task id, under a policy that reads only ``input.resource.value.app``."""
    shutil.copytree(REPO / "policies", root, ignore=shutil.ignore_patterns("compose", "*.rego"))
    (root / "authz.rego").write_text(APP_ONLY_POLICY)
    engine = PolicyEngine(root)
    result = engine.load()
    assert result.ok, result.error
    base = inputs()[0]
    for n in range(runs):
        doc = dict(base, resource={"id": f"task-{n}", "kind": "installer_run",
                                   "hash": "sha256:" + "ab" * 32,
                                   "value": {"app": "web", "version": f"1.{n}.0"}})
        engine.decide(doc)
    rate: float = engine.status()["cache"]["hit_rate"]
    print(f"decision cache, {runs} installer runs of one app with {runs} distinct versions "
          f"(policy reads input.resource.value.app only): hit rate {rate:.1%} (target >= 95%)")
    return rate


def measure(fn, docs, decisions: int) -> list[float]:
    """Per-call latencies in microseconds over ``decisions`` calls cycling through ``docs``."""
    out = []
    n = len(docs)
    for i in range(decisions):
        d = docs[i % n]
        t0 = time.perf_counter_ns()
        fn(d)
        out.append((time.perf_counter_ns() - t0) / 1000)
    return out


def summarize(samples_per_rep: list[list[float]]) -> tuple[float, float]:
    p50 = statistics.median(statistics.median(s) for s in samples_per_rep)
    p90 = statistics.median(statistics.quantiles(s, n=10)[8] for s in samples_per_rep)
    return p50, p90


def run(
    label: str, policies: Path, docs: list[dict], decisions: int, reps: int
) -> dict[str, float]:
    engine = PolicyEngine(policies, cache_size=0)
    t0 = time.perf_counter()
    result = engine.load()
    load_s = time.perf_counter() - t0
    assert result.ok, result.error
    floor_table = {
        (d["principal"]["subject_id"], d["action"], d["env"]): engine.decide(d) for d in docs
    }

    def floor(d: dict) -> object:
        return floor_table[(d["principal"]["subject_id"], d["action"], d["env"])]

    cached = PolicyEngine(policies, cache_size=100_000)
    cached.load()
    for d in docs:
        cached.decide(d)
    measure(engine.decide, docs, 500)  # warm-up
    uncached = [measure(engine.decide, docs, decisions) for _ in range(reps)]
    hits = [measure(cached.decide, docs, decisions) for _ in range(reps)]
    floors = [measure(floor, docs, decisions) for _ in range(reps)]
    (u50, u90), (c50, c90), (f50, _) = summarize(uncached), summarize(hits), summarize(floors)
    print(
        f"{label:<34} load {load_s * 1000:7.1f} ms | decide p50 {u50:7.1f} us p90 {u90:7.1f} us"
        f" | cached p50 {c50:6.1f} us p90 {c90:6.1f} us | dict floor p50 {f50:5.2f} us"
        f" | decide/floor {u50 / f50:6.0f}x"
    )
    return {"p50": u50, "p90": u90, "cached_p50": c50, "floor": f50}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--decisions", type=int, default=3000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--subjects", type=int, default=5000)
    parser.add_argument("--roles", type=int, default=500)
    args = parser.parse_args()
    docs = inputs()
    print(
        f"{len(docs)} distinct inputs, {args.decisions} x {args.reps} reps (median of reps)"
    )
    small = run(
        "shipped data (7 subjects, 6 roles)", REPO / "policies", docs, args.decisions, args.reps
    )
    with tempfile.TemporaryDirectory() as tmp:
        floor = run(
            "engine floor (constant policy)",
            constant_policies(Path(tmp) / "constant"),
            docs,
            args.decisions,
            args.reps,
        )
        root = large_policies(Path(tmp) / "policies", args.subjects, args.roles)
        large = run(
            f"large data ({args.subjects} subjects, {args.roles} roles)",
            root,
            docs,
            args.decisions,
            args.reps,
        )
    print(
        f"shipped policy logic (decide p50 - engine floor p50): {small['p50'] - floor['p50']:.1f} us;"
        f" engine floor {floor['p50']:.1f} us"
    )
    with tempfile.TemporaryDirectory() as tmp:
        resource_hit_rate(Path(tmp) / "app-only")
    print(
        f"large/small p50 ratio: {large['p50'] / small['p50']:.2f} (target <= 1.5); "
        f"p50 target 100 us: small {'met' if small['p50'] <= 100 else 'NOT met'}, "
        f"large {'met' if large['p50'] <= 100 else 'NOT met'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
