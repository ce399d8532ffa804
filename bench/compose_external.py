"""The compose preflight rules against an external scanner's own test fixtures (held out).

Run: python bench/compose_external.py --fixtures DIR [--json OUT] [--markdown]

``DIR`` holds KICS's (Checkmarx/kics) docker-compose query fixtures, one folder per query as in
its ``assets/queries/dockerCompose/<query>/``: ``metadata.json``, ``test/positive*.yaml``,
``test/negative*.yaml`` and ``test/positive_expected_result.json`` (the lines KICS expects a
finding at). They are third-party data: the repository neither ships nor depends on them, and
the rules are never tuned on them (a held-out measurement: a rule changed to pass a fixture
would make the number meaningless).

``MAPPING`` says, for every KICS query, which of our rules means the same thing (a rule id, or
a rule id and the pointer suffix of one of its findings, when one rule reports several things:
resource-limits reports the memory and the CPU limit apart), or why none does. A query is
mapped only where the two mean the same thing; a query whose intent differs (a CIS number we do
not require, a cross-service property) is "not covered" and stays out of the totals.

Each fixture file goes through ``cpctl compose check FILE --env prod --strict --format json``
(``service.cli.compose.run``: the same normalization, schema check, size budget and
``evaluate()`` as the command, offline, with the repository's rules). ``prod`` and ``--strict``
are the hardened baseline, the closest to a scanner that reports every finding whatever its
severity; no rule's findings depend on ``strict`` (it only decides the verdict), and a finding
counts at any severity (fail, warn, info), since the question is whether the rule sees the
thing at all, not how loudly it reports it. The environment is empty (no shell variable
interpolates into a fixture).

Scoring, file by file:
- a positive file is a true positive when a mapped rule has a finding in it, else a false
  negative (a file the command refuses, exit 2, is a false negative and is listed as refused);
- a negative file where a mapped rule has a finding is a false positive, one without a true
  negative, one the command refuses neither (counted apart, as refused);
- line level: of the positive files KICS lists expected lines for, those where a mapped rule's
  finding is located (``service.compose.locate``, as the table and SARIF report it) at one of
  those lines. The fixtures' expected-result files are not always of the same revision as the
  YAML beside them, and KICS points at a different node than we do (the service key against
  the missing setting's parent), so the line figure is indicative; the file figure is the
  measure.
Precision and recall are over the covered queries' files.

Exit status: 0 when the fixtures were read and scored (whatever the numbers: a benchmark never
fails on a figure), 2 when the fixtures directory is missing or holds no query.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.cli.compose import run as compose_cli
from service.compose.locate import Locator

#: KICS query folder -> (KICS query id, our rules as (rule id, pointer suffix or ""), or a
#: one-line reason why none of our rules means the same thing). Built from each query's
#: metadata.json description and policies/compose/README.md's catalogue.
MAPPING: dict[str, tuple[str, tuple[tuple[str, str], ...] | str]] = {
    "cgroup_not_default": ("4d9f44c6-2f4a-4317-9bb5-267adbea0232", (("cgroup", ""),)),
    "container_capabilities_unrestricted": (
        "ce76b7d0-9e77-464d-b86f-c5c48e03e22d", (("capabilities", ""), ("cap-drop-all", ""))),
    "container_traffic_not_bound_to_host_interface": (
        "451d79dc-0588-476a-ad03-3c7f0320abb3", (("published-ports", ""),)),
    "cpus_not_limited": (
        "6b610c50-99fb-4ef0-a5f3-e312fd945bc3",
        (("resource-limits", "/deploy/resources/limits/cpus"),)),
    "default_seccomp_profile_disabled": (
        "404fde2c-bc4b-4371-9747-7054132ac953", (("security-opt", ""),)),
    "docker_socket_mounted_in_container": (
        "d6355c88-1e8d-49e9-b2f2-f8a1ca12c75b", (("sensitive-mounts", ""),)),
    "healthcheck_not_set": ("698ed579-b239-4f8f-a388-baa4bcb13ef8", (("healthcheck", ""),)),
    "host_namespace_is_shared": ("4f31dd9f-2cc3-4751-9b53-67e4af83dac0", (("host-pid", ""),)),
    "memory_not_limited": (
        "bb9ac4f7-e13b-423d-a010-c74a1bfbe492",
        (("resource-limits", "/deploy/resources/limits/memory"),)),
    "networks_not_set": ("ce14a68b-1668-41a0-ab7d-facd9f784742", (("default-network", ""),)),
    "no_new_privileges_not_set": (
        "27fcc7d6-c49b-46e0-98f1-6c082a6a2750", (("no-new-privileges", ""),)),
    "pids_limit_not_set": ("221e0658-cb2a-44e3-b08a-db96a341d6fa", (("pids-limit", ""),)),
    "privileged_containers_enabled": (
        "ae5b6871-7f45-42e0-bb4c-ab300c4d2026", (("privileged", ""),)),
    "privileged_ports_mapped_in_container": (
        "bc2908f3-f73c-40a9-8793-c1b7d5544f79",
        "not covered: KICS flags container-side ports < 1024 (7000:80) and 80/443, which "
        "privileged-ports deliberately leaves alone (unprivileged_port_start=0 since Docker 20.10)"),
    "restart_policy_on_failure_not_set_to_5": (
        "2fc99041-ddad-49d5-853f-e35e70a48391",
        "not covered: KICS requires exactly 5 attempts (on-failure:10 is its finding); "
        "restart-max-attempts asks for some maximum"),
    "security_opt_not_set": (
        "610e266e-6c12-4bca-9925-1ed0cd29742b", (("security-opt-missing", ""),)),
    "shared_host_ipc_namespace": ("baa3890f-bed7-46f5-ab8f-1da8fc91c729", (("host-ipc", ""),)),
    "shared_host_network_namespace": (
        "071a71ff-f868-47a4-ac0b-3c59e4ab5443", (("host-network", ""),)),
    "shared_host_user_namespace": (
        "8af7162d-6c98-482f-868e-0d33fb675ca8", (("host-userns", ""),)),
    "shared_volumes_between_containers": (
        "8c978947-0ff6-485c-b0c2-0bfca6026466",
        "not covered: a property of two services (one volume in both); our rules speak about "
        "one service at a time"),
    "volume_has_sensitive_host_directory": (
        "1c1325ff-831d-43a1-973e-839ae57dfcc0", (("sensitive-mounts", ""),)),
    "volume_mounted_in_multiple_containers": (
        "baa452f0-1f21-4a25-ace5-844e7a5f410d", (("bind-propagation", ""),)),
}

#: The arguments after ``cpctl compose check FILE`` (see the module docstring).
CHECK_ARGS = ["--env", "prod", "--strict", "--format", "json"]


@dataclass
class FileResult:
    name: str
    positive: bool
    fired: bool
    refused: str = ""
    lines: list[int] = field(default_factory=list)  # our mapped findings' lines
    expected: list[int] = field(default_factory=list)  # KICS's expected lines (positives)

    @property
    def line_hit(self) -> bool:
        return bool(set(self.lines) & set(self.expected))


@dataclass
class QueryResult:
    query: str
    kics_id: str
    name: str
    rules: list[str]
    reason: str
    files: list[FileResult] = field(default_factory=list)

    @property
    def covered(self) -> bool:
        return not self.reason

    def count(self, kind: str) -> int:
        if kind == "tp":
            return sum(1 for f in self.files if f.positive and f.fired)
        if kind == "fn":
            return sum(1 for f in self.files if f.positive and not f.fired)
        if kind == "fp":
            return sum(1 for f in self.files if not f.positive and f.fired)
        if kind == "tn":  # judged and passed: a refused negative is no true negative
            return sum(1 for f in self.files if not f.positive and not f.fired and not f.refused)
        if kind == "refused":
            return sum(1 for f in self.files if f.refused)
        if kind == "line_expected":
            return sum(1 for f in self.files if f.positive and f.expected)
        if kind == "line_tp":
            return sum(1 for f in self.files if f.positive and f.expected and f.line_hit)
        raise ValueError(kind)


def check_file(path: Path, cache_home: str) -> tuple[dict[str, Any] | None, str]:
    """``cpctl compose check path --env prod --strict --format json``: (report, "") or (None,
    the command's message) when it refused the file (exit 2) or failed (exit 3)."""
    out, err = io.StringIO(), io.StringIO()
    code = compose_cli(["check", str(path), *CHECK_ARGS], stdout=out, stderr=err,
                       environ={"XDG_CACHE_HOME": cache_home})
    if code not in (0, 1):
        return None, f"exit {code}: " + " ".join(err.getvalue().split())[:160]
    report: dict[str, Any] = json.loads(out.getvalue())
    return report, ""


def _matches(finding: dict[str, Any], rules: tuple[tuple[str, str], ...]) -> bool:
    return any(finding.get("rule") == rule and finding.get("pointer", "").endswith(suffix)
               for rule, suffix in rules)


def score_query(folder: Path, cache_home: str) -> QueryResult:
    meta = json.loads((folder / "metadata.json").read_text(encoding="utf-8"))
    kics_id, target = MAPPING.get(folder.name, (meta.get("id", ""), "not covered: not mapped"))
    rules = target if isinstance(target, tuple) else ()
    result = QueryResult(folder.name, kics_id, meta.get("queryName", folder.name),
                         [rule + (f" ({suffix.rsplit('/', 1)[-1]})" if suffix else "")
                          for rule, suffix in rules],
                         target if isinstance(target, str) else "")
    if not rules:
        return result
    tests = folder / "test"
    expected: dict[str, list[int]] = {}
    expected_file = tests / "positive_expected_result.json"
    if expected_file.is_file():
        for item in json.loads(expected_file.read_text(encoding="utf-8")):
            expected.setdefault(item.get("filename", ""), []).append(int(item.get("line", 0)))
    for path in sorted(tests.glob("*.y*ml"), key=lambda p: (len(p.name), p.name)):
        positive = path.name.startswith("positive")
        if not positive and not path.name.startswith("negative"):
            continue
        report, refused = check_file(path, cache_home)
        found = [f for f in (report or {}).get("findings", []) if _matches(f, rules)]
        locator = Locator([path]) if found else None
        lines = []
        for finding in found:
            location = locator.find(finding["pointer"]) if locator else None
            if location is not None:
                lines.append(location.line)
        result.files.append(FileResult(path.name, positive, bool(found), refused, sorted(lines),
                                       sorted(expected.get(path.name, [])) if positive else []))
    return result


def fixtures_digest(root: Path) -> str:
    """sha256 over the fixture files' relative paths and bytes: which fixtures a result is of."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def run(fixtures: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="compose-external-") as cache_home:
        results = [score_query(folder, cache_home)
                   for folder in sorted(p for p in fixtures.iterdir()
                                        if (p / "metadata.json").is_file())]
    covered = [r for r in results if r.covered]
    totals = {k: sum(r.count(k) for r in covered)
              for k in ("tp", "fn", "fp", "tn", "refused", "line_expected", "line_tp")}
    tp, fn, fp = totals["tp"], totals["fn"], totals["fp"]
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "fixtures": str(fixtures),
        "fixtures_sha256": fixtures_digest(fixtures),
        "mode": "cpctl compose check FILE " + " ".join(CHECK_ARGS),
        "queries": len(results),
        "covered": len(covered),
        "totals": {**totals,
                   "precision": round(tp / (tp + fp), 4) if tp + fp else None,
                   "recall": round(tp / (tp + fn), 4) if tp + fn else None,
                   "line_recall": (round(totals["line_tp"] / totals["line_expected"], 4)
                                   if totals["line_expected"] else None)},
        "results": [{
            "query": r.query, "kics_id": r.kics_id, "name": r.name, "rules": r.rules,
            "covered": r.covered, "reason": r.reason,
            **{k: r.count(k) for k in ("tp", "fn", "fp", "tn", "refused", "line_expected", "line_tp")},
            "files": [{"file": f.name, "positive": f.positive, "fired": f.fired,
                       "refused": f.refused, "lines": f.lines, "expected_lines": f.expected}
                      for f in r.files],
        } for r in results],
    }


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def text(doc: dict[str, Any]) -> str:
    rows = [f"{'KICS query':<46} {'our rule(s)':<34} {'TP':>3} {'FN':>3} {'FP':>3} {'TN':>3} "
            f"{'ref':>3} {'line':>5}"]
    for r in doc["results"]:
        if not r["covered"]:
            rows.append(f"{r['query']:<46} {r['reason']}")
            continue
        rows.append(f"{r['query']:<46} {', '.join(r['rules']):<34} {r['tp']:>3} {r['fn']:>3} "
                    f"{r['fp']:>3} {r['tn']:>3} {r['refused']:>3} {r['line_tp']:>2}/{r['line_expected']:<2}")
    t = doc["totals"]
    rows += ["", f"covered queries: {doc['covered']} of {doc['queries']}",
             f"files: TP {t['tp']}  FN {t['fn']}  FP {t['fp']}  TN {t['tn']}  "
             f"refused {t['refused']}",
             f"precision {_ratio(t['precision'])}  recall {_ratio(t['recall'])}  "
             f"(line level: {t['line_tp']} of {t['line_expected']} positive files with "
             f"expected lines, {_ratio(t['line_recall'])})"]
    misses = [(r["query"], f) for r in doc["results"] if r["covered"] for f in r["files"]
              if f["positive"] != f["fired"] or f["refused"]]
    if misses:
        rows += ["", "misses and refusals (FN: positive not reported; FP: negative reported; "
                 "ref: negative the command refused):"]
        rows += [f"  {('FN' if f['positive'] else 'FP') if f['positive'] != f['fired'] else 'ref'}"
                 f" {query}/{f['file']}" + (f" (refused: {f['refused']})" if f["refused"] else "")
                 for query, f in misses]
    return "\n".join(rows) + "\n"


def markdown(doc: dict[str, Any]) -> str:
    t = doc["totals"]
    lines = ["## Compose rules against KICS fixtures (`bench/compose_external.py`)", "",
             f"{doc['date']}; mode `{doc['mode']}`; fixtures sha256 "
             f"`{doc['fixtures_sha256'][:16]}`", "",
             "| KICS query | our rule(s) | TP | FN | FP | TN | refused | line |",
             "|---|---|---|---|---|---|---|---|"]
    for r in doc["results"]:
        if r["covered"]:
            lines.append(f"| {r['query']} | {', '.join(r['rules'])} | {r['tp']} | {r['fn']} | "
                         f"{r['fp']} | {r['tn']} | {r['refused']} | {r['line_tp']}/{r['line_expected']} |")
        else:
            lines.append(f"| {r['query']} | {r['reason']} | | | | | | |")
    lines += ["", f"Covered {doc['covered']} of {doc['queries']} queries: precision "
              f"{_ratio(t['precision'])}, recall {_ratio(t['recall'])} ({t['tp']} TP, {t['fn']} FN, "
              f"{t['fp']} FP, {t['tn']} TN, {t['refused']} refused files); line level {t['line_tp']} of "
              f"{t['line_expected']}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fixtures", type=Path, required=True,
                        help="KICS's assets/queries/dockerCompose folders, one per query")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the result as JSON")
    parser.add_argument("--markdown", action="store_true",
                        help="print a RESULTS.md section instead of the text table")
    args = parser.parse_args(argv)
    folders = ([p for p in args.fixtures.iterdir() if (p / "metadata.json").is_file()]
               if args.fixtures.is_dir() else [])
    if not folders:
        print(f"compose_external: no KICS query fixtures in {args.fixtures} (expected "
              "<query>/metadata.json and <query>/test/*.yaml, as in Checkmarx/kics "
              "assets/queries/dockerCompose)", file=sys.stderr)
        return 2
    doc = run(args.fixtures)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(markdown(doc) if args.markdown else text(doc), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
