"""Renderings of a preflight report: a readable matrix table, JUnit XML and SARIF 2.1.0 for CI.

Every renderer takes the report exactly as ``preflight.evaluate()`` (or the endpoint) returns it,
so offline and ``--server`` runs print the same thing.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from .locate import Location, Locator

if TYPE_CHECKING:  # imported by to_junit: the other formats do not pay for it
    from xml.etree import ElementTree as ET

__all__ = ["render", "to_json", "to_junit", "to_sarif", "to_table"]

_SYMBOL = {"pass": "ok", "fail": "FAIL", "warn": "warn", "info": "info", "n/a": "-",
           "error": "ERR"}
_SARIF_LEVEL = {"fail": "error", "error": "error", "warn": "warning", "info": "note"}
#: ANSI SGR colours of the table's results (only with ``color=True``: a TTY without NO_COLOR).
_COLOUR = {"fail": "1;31", "error": "1;35", "warn": "33", "info": "36", "pass": "32",
           "n/a": "2", "PASSED": "1;32", "NOT PASSED": "1;31"}
#: Widest service column of the table; longer names are cut with "~".
_SERVICE_WIDTH = 16


@functools.cache
def _not_xml_char() -> re.Pattern[str]:
    """Characters outside XML 1.0's ``Char`` production (control characters but tab, newline
    and carriage return; surrogates; U+FFFE, U+FFFF): no XML parser accepts them, even escaped.
    Compiled on first use (~10 ms: only JUnit needs it)."""
    return re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def render(
    report: dict[str, Any], fmt: str, *, files: Sequence[str] = (), color: bool = False,
    dotenv: str | None = None,
) -> str:
    """Render ``report`` as ``table``, ``json``, ``junit`` or ``sarif``; ``files`` are the
    compose files the report is about (for locations), ``dotenv`` the ``.env`` file its
    ``/.env/<name>`` pointers are in, ``color`` colours the table."""
    if fmt == "json":
        return to_json(report)
    if fmt == "junit":
        return to_junit(report, files=files)
    if fmt == "sarif":
        return to_sarif(report, files=files, dotenv=dotenv)
    return to_table(report, files=files, color=color, dotenv=dotenv)


def to_json(report: dict[str, Any]) -> str:
    """The report itself, unchanged (the CLI's json output is exactly ``evaluate()``'s report)."""
    return json.dumps(report, indent=2, ensure_ascii=False) + "\n"


def _paint(text: str, key: str, color: bool) -> str:
    code = _COLOUR.get(key)
    return f"\x1b[{code}m{text}\x1b[0m" if color and code else text


def _short(name: str, width: int) -> str:
    return name if len(name) <= width else name[: width - 1] + "~"


def to_table(report: dict[str, Any], *, files: Sequence[str] = (), color: bool = False,
             dotenv: str | None = None) -> str:
    """Rules down (by id), services across (by name), then the findings, each at its file and
    line when ``files`` are given, and the verdict. Control characters of the compose file's
    values are shown as ``\\xNN``: a value must not move the cursor or colour a terminal."""
    rules = [rule["id"] for rule in report.get("rules", [])]
    cells = {(c["service"], c["rule"]): c["result"] for c in report["matrix"]}
    services = list(dict.fromkeys(_visible(c["service"]) for c in report["matrix"]))
    cells = {(_visible(service), rule): result for (service, rule), result in cells.items()}
    waived = {(_visible(c["service"]), c["rule"]) for c in report["matrix"] if c.get("waived")}
    rule_width = max([len("rule"), *(len(r) for r in rules)])
    widths = [max(4, len(_short(s, _SERVICE_WIDTH))) for s in services]
    header = "rule".ljust(rule_width) + "".join(
        "  " + _short(s, _SERVICE_WIDTH).ljust(w) for s, w in zip(services, widths, strict=True))
    lines = [header.rstrip(), "-" * len(header.rstrip())]
    for rule in rules:
        row = rule.ljust(rule_width)
        for service, width in zip(services, widths, strict=True):
            result = cells.get((service, rule), "n/a")
            symbol = "wvd" if (service, rule) in waived else _SYMBOL[result]
            row += "  " + _paint(symbol.ljust(width), result, color)
        lines.append(row.rstrip())
    if report["findings"]:
        locator = Locator(files, dotenv=dotenv) if files else None
        lines += ["", "findings:"]
        for finding in report["findings"]:
            where = _where(locator, finding["pointer"])
            severity = _paint(f"{finding['severity'].upper():5}", finding["severity"], color)
            waiver = (f" [waived: {finding['waiver'].get('reason', '')}]"
                      if finding.get("waived") else "")
            text = _visible(f"{finding['service']} [{finding['rule']}] {finding['message']}  "
                            f"({where or finding['pointer']}){waiver}")
            lines.append(f"  {severity} {text}")
    summary = report["summary"]
    verdict = "PASSED" if report["passed"] else "NOT PASSED"
    lines += ["", f"{_paint(verdict, verdict, color)}: {summary['services']} services x "
              f"{summary['rules']} rules: "
              f"{summary['fail']} fail, {summary['warn']} warn, {summary['info']} info, "
              f"{summary['pass']} pass, {summary.get('n/a', 0)} n/a, "
              f"{summary.get('error', 0)} error"
              f"{', ' + str(summary['waived']) + ' waived' if summary.get('waived') else ''}"
              f"{' (strict: warnings fail)' if report['strict'] else ''}; "
              f"policy {report['policy_revision'][:19]}"]
    return "\n".join(lines) + "\n"


#: Control characters (C0, DEL, C1): shown as ``\\xNN`` in the table.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _visible(text: str) -> str:
    """``text`` with its control characters written as ``\\xNN``."""
    return _CONTROL.sub(_xml_char, text) if _CONTROL.search(text) else text


def _where(locator: Locator | None, pointer: str) -> str:
    location = locator.find(pointer) if locator is not None else None
    return f"{location.file}:{location.line}:{location.column}" if location else ""


def to_junit(report: dict[str, Any], *, files: Sequence[str] = ()) -> str:
    """One testsuite per service, one testcase per rule; fail/error cells (and warn when strict)
    are failures, n/a cells and waived ones are skipped, warn and info cells pass with their
    message as output."""
    from xml.etree import ElementTree as ET

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
        if cell.get("waived"):
            kind = "skipped"  # a waived finding: accepted, with its reason
            ET.SubElement(case, "skipped", message=cell["message"]).text = details
        elif result == "error":
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
    _xml_chars(root)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _xml_char(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _xml_text(text: str) -> str:
    """``text`` with every character XML 1.0 cannot hold written as ``\\xNN`` / ``\\uNNNN``."""
    return _not_xml_char().sub(_xml_char, text)


def _xml_chars(root: ET.Element) -> None:
    """Make every text and attribute under ``root`` XML 1.0 (a report quotes the compose file's
    values, which may hold any character)."""
    for element in root.iter():
        if element.text:
            element.text = _xml_text(element.text)
        if element.tail:
            element.tail = _xml_text(element.tail)
        element.attrib = {_xml_text(k): _xml_text(v) for k, v in element.attrib.items()}


#: The ``uriBaseId`` of the artifacts below the working directory (``originalUriBaseIds``).
SRCROOT = "SRCROOT"


def _artifact(name: str, base: str) -> dict[str, str]:
    """The ``artifactLocation`` of ``name``: a percent-encoded URI relative to ``SRCROOT`` (the
    working directory ``base``, where CI runs and code-scanning UIs resolve paths) when the file
    is below it, else an absolute ``file:`` URI."""
    absolute = os.path.abspath(name)
    relative = os.path.relpath(absolute, base)
    if relative != ".." and not relative.startswith("../") and not os.path.isabs(relative):
        return {"uri": quote(PurePath(relative).as_posix(), safe="/"), "uriBaseId": SRCROOT}
    return {"uri": Path(absolute).as_uri()}


def to_sarif(report: dict[str, Any], *, files: Sequence[str] = (),
             dotenv: str | None = None, base: str | None = None) -> str:
    """SARIF 2.1.0: rules as reportingDescriptors, every finding as a result located at the
    line and column of the key it is about, in the file that sets it (``service.compose.locate``;
    the last given file, line 1, when the source has no trace of it), with the JSON pointer into
    the normalized fields as logical location. Artifact URIs are percent-encoded, relative to
    ``SRCROOT`` = ``base`` (default: the working directory) when the file is below it."""
    base = os.path.abspath(base if base is not None else os.getcwd())
    rules = report.get("rules", [])
    index = {rule["id"]: i for i, rule in enumerate(rules)}
    fallback = Location(files[-1] if files else "compose.yaml", 1, 1)
    locator = Locator(files, dotenv=dotenv) if files else None
    results = []
    for finding in report["findings"]:
        location = (locator.find(finding["pointer"]) if locator else None) or fallback
        result: dict[str, Any] = {
            "ruleId": finding["rule"],
            "level": _SARIF_LEVEL.get(finding["severity"], "note"),
            "message": {"text": f"{finding['service']}: {finding['message']}"},
            "locations": [{
                "physicalLocation": {"artifactLocation": _artifact(location.file, base),
                                     "region": {"startLine": location.line,
                                                "startColumn": location.column}},
                "logicalLocations": [{"fullyQualifiedName": finding["pointer"],
                                      "kind": "object"}],
            }],
            "partialFingerprints": {"composePointer/v1": f"{finding['rule']}:{finding['pointer']}"},
        }
        if finding["rule"] in index:
            result["ruleIndex"] = index[finding["rule"]]
        if finding.get("waived"):  # x-controlplane-waivers: a suppression in the source
            result["suppressions"] = [{"kind": "inSource", "status": "accepted",
                                       "justification": finding["waiver"].get("reason", "")}]
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
            "originalUriBaseIds": {SRCROOT: {"uri": Path(base).as_uri().rstrip("/") + "/"}},
            "results": results,
            "properties": {"passed": report["passed"], "strict": report["strict"],
                           "policy_revision": report["policy_revision"]},
        }],
    }
    return json.dumps(sarif, indent=2, ensure_ascii=False) + "\n"
