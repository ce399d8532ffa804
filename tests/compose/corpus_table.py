"""The per-rule regression table of the real-world corpus: for every corpus file, how many
findings each rule raises (``tests/compose/corpus_findings.json``).

Precision changes must be visible in review: ``test_corpus_findings_table`` fails on any
difference, and ``python -m tests.compose.corpus_table`` rewrites the table so the change shows
up as a diff of the committed file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from service.compose.normalize import normalize_files
from service.compose.preflight import RuleSet, evaluate
from service.compose.source import read_dotenv
from tests.compose.support import CORPUS

TABLE = Path(__file__).with_name("corpus_findings.json")


def corpus_files() -> list[Path]:
    return sorted(CORPUS.glob("*.yaml")) if CORPUS.is_dir() else []


def fields_of(path: Path) -> dict[str, Any]:
    dotenv = CORPUS / "dotenv" / f"{path.stem}.env"
    return normalize_files([path], environ={},
                           env_file=dotenv if dotenv.is_file() else Path("/dev/null"))


def counts(report: dict[str, Any]) -> dict[str, str]:
    """``{rule: "<fail>/<warn>/<info>"}`` for the rules with findings (finding counts)."""
    table: dict[str, list[int]] = {}
    for finding in report["findings"]:
        row = table.setdefault(finding["rule"], [0, 0, 0])
        row[("fail", "warn", "info", "error").index(finding["severity"]) % 3] += 1
    return {rule: "/".join(map(str, row)) for rule, row in sorted(table.items())}


def dotenv_of(path: Path) -> dict[str, str] | None:
    """The variables of the corpus file's ``.env`` (as ``cpctl compose check`` gives them to the
    rules: secret-env reports a secret committed there)."""
    dotenv = CORPUS / "dotenv" / f"{path.stem}.env"
    return read_dotenv(dotenv) if dotenv.is_file() else None


def build(rules: RuleSet) -> dict[str, dict[str, str]]:
    """Findings per rule (fail/warn/info counts) of every corpus file, evaluated for ``prod``."""
    return {path.name: counts(evaluate(fields_of(path), env="prod", rules=rules,
                                       dotenv=dotenv_of(path)))
            for path in corpus_files()}


def main() -> int:
    table = build(RuleSet.load())
    TABLE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {TABLE} ({len(table)} files)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
