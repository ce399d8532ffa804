"""Renderings of a preflight report: a readable matrix table, JUnit XML and SARIF 2.1.0 for CI.

Every renderer takes the report exactly as ``preflight.evaluate()`` (or the endpoint) returns it,
so offline and ``--server`` runs print the same thing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from xml.etree import ElementTree as ET

__all__ = ["render", "to_json", "to_junit", "to_sarif", "to_table"]

_SYMBOL = {"pass": "ok", "fail": "FAIL", "warn": "warn", "info": "info", "n/a": "-",
           "error": "ERR"}
_SARIF_LEVEL = {"fail": "error", "error": "error", "warn": "warning", "info": "note"}


def render(report: dict[str, Any], fmt: str, *, files: Sequence[str] = ()) -> str:
    """Render ``report`` as ``table``, ``json``, ``junit`` or ``sarif``."""
    if fmt == "json":
        return to_json(report)
    if fmt == "junit":
        return to_junit(report, files=files)
    if fmt == "sarif":
        return to_sarif(report, files=files)
    return to_table(report)


def to_json(report: dict[str, Any]) -> str:
    """The report itself, unchanged (the CLI's json output is exactly ``evaluate()``'s report)."""
    return json.dumps(report, indent=2, ensure_ascii=False) + "\n"


def to_table(report: dict[str, Any]) -> str:
    """Services down, rules across (numbered, with a legend), then the findings and a verdict."""
    rules = [rule["id"] for rule in report.get("rules", [])]
    cells = {(c["service"], c["rule"]): c["result"] for c in report["matrix"]}
    services = list(dict.fromkeys(c["service"] for c in report["matrix"]))
    width = max([len("service"), *(len(s) for s in services)])
    lines = ["rules: " + "  ".join(f"{i + 1}={rule}" for i, rule in enumerate(rules)), ""]
    header = "service".ljust(width) + " " + " ".join(f"{i + 1:>4}" for i in range(len(rules)))
    lines += [header, "-" * len(header)]
    for service in services:
        row = " ".join(f"{_SYMBOL[cells.get((service, rule), 'n/a')]:>4}" for rule in rules)
        lines.append(service.ljust(width) + " " + row)
    if report["findings"]:
        lines += ["", "findings:"]
        for finding in report["findings"]:
            lines.append(f"  {finding['severity'].upper():5} {finding['service']} "
                         f"[{finding['rule']}] {finding['message']}  ({finding['pointer']})")
    summary = report["summary"]
    verdict = "PASSED" if report["passed"] else "NOT PASSED"
    lines += ["", f"{verdict}: {summary['services']} services x {summary['rules']} rules: "
              f"{summary['fail']} fail, {summary['warn']} warn, {summary['info']} info, "
              f"{summary['pass']} pass, {summary.get('n/a', 0)} n/a, "
              f"{summary.get('error', 0)} error"
              f"{' (strict: warnings fail)' if report['strict'] else ''}; "
              f"policy {report['policy_revision'][:19]}"]
    return "\n".join(lines) + "\n"


def to_junit(report: dict[str, Any], *, files: Sequence[str] = ()) -> str:
    """One testsuite per service, one testcase per rule; fail/error cells (and warn when strict)
    are failures, n/a cells are skipped, warn and info cells pass with their message as output."""
    by_cell: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for finding in report["findings"]:
        by_cell.setdefault((finding["service"], finding["rule"]), []).append(finding)
    root = ET.Element("testsuites", name="compose preflight" + (f": {' '.join(files)}" if files
                                                               else ""))
    suites: dict[str, ET.Element] = {}
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for cell in report["matrix"]:
        service = cell["service"]
        suite = suites.get(service)
        if suite is None:
            suite = suites[service] = ET.SubElement(root, "testsuite", name=service)
            suite.attrib.update({k: "0" for k in totals})
        case = ET.SubElement(suite, "testcase", classname=f"compose.{service}", name=cell["rule"])
        result = cell["result"]
        details = "\n".join(f"{f['message']} ({f['pointer']})\nremediation: {f['remediation']}"
                            for f in by_cell.get((service, cell["rule"]), []))
        kind = None
        if result == "error":
            kind = "errors"
            ET.SubElement(case, "error", message=cell["message"], type="error").text = details
        elif result == "fail" or (result == "warn" and report["strict"]):
            kind = "failures"
            ET.SubElement(case, "failure", message=cell["message"], type=result).text = details
        elif result == "n/a":
            kind = "skipped"
            ET.SubElement(case, "skipped", message="not applicable")
        elif result in ("warn", "info"):
            ET.SubElement(case, "system-out").text = f"{result}: {details}"
        for counter in ("tests", kind):
            if counter:
                suite.set(counter, str(int(suite.get(counter, "0")) + 1))
                totals[counter] += 1
    root.attrib.update({k: str(v) for k, v in totals.items()})
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def to_sarif(report: dict[str, Any], *, files: Sequence[str] = ()) -> str:
    """SARIF 2.1.0: rules as reportingDescriptors, every finding as a result located in the
    (last given) compose file, with the JSON pointer into the normalized fields as logical
    location."""
    rules = report.get("rules", [])
    index = {rule["id"]: i for i, rule in enumerate(rules)}
    uri = files[-1] if files else "compose.yaml"
    results = []
    for finding in report["findings"]:
        result: dict[str, Any] = {
            "ruleId": finding["rule"],
            "level": _SARIF_LEVEL.get(finding["severity"], "note"),
            "message": {"text": f"{finding['service']}: {finding['message']}"},
            "locations": [{
                "physicalLocation": {"artifactLocation": {"uri": uri},
                                     "region": {"startLine": int(finding.get("line", 1))}},
                "logicalLocations": [{"fullyQualifiedName": finding["pointer"],
                                      "kind": "object"}],
            }],
            "partialFingerprints": {"composePointer/v1": f"{finding['rule']}:{finding['pointer']}"},
        }
        if finding["rule"] in index:
            result["ruleIndex"] = index[finding["rule"]]
        results.append(result)
    sarif = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "cpctl compose check",
                "rules": [{
                    "id": rule["id"],
                    "name": rule["id"].replace("-", " ").title().replace(" ", ""),
                    "shortDescription": {"text": rule["title"] or rule["id"]},
                    "fullDescription": {"text": rule["rationale"] or rule["id"]},
                    "help": {"text": rule["remediation"] or rule["id"]},
                    "defaultConfiguration": {"level": _SARIF_LEVEL.get(rule["severity"], "note")},
                } for rule in rules],
            }},
            "results": results,
            "properties": {"passed": report["passed"], "strict": report["strict"],
                           "policy_revision": report["policy_revision"]},
        }],
    }
    return json.dumps(sarif, indent=2, ensure_ascii=False) + "\n"
