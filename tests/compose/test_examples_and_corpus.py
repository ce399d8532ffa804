"""examples/compose give their expected reports; every real-world corpus file normalizes,
validates against the request schema and evaluates without error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.compose.normalize import normalize_files
from service.compose.preflight import RuleSet, evaluate
from service.schemas import validate
from tests.compose import corpus_table
from tests.compose.support import CORPUS, EXAMPLES

SCHEMA = "compose-import.schema.json"
EXPECTED = sorted(EXAMPLES.glob("*.expected.json"))


def test_enough_examples() -> None:
    assert len(list(EXAMPLES.glob("*.compose.yaml"))) >= 6
    assert len(EXPECTED) >= 6


@pytest.mark.parametrize("expected_path", EXPECTED, ids=lambda p: p.name.split(".")[0])
def test_example_report(expected_path: Path, rules: RuleSet) -> None:
    want = json.loads(expected_path.read_text())
    env_file = EXAMPLES / want["env_file"] if want.get("env_file") else Path("/dev/null")
    fields = normalize_files([EXAMPLES / f for f in want["files"]], environ={}, env_file=env_file)
    validate(SCHEMA, {"fields": fields, "strict": want["strict"]})
    report = evaluate(fields, strict=want["strict"], env=want["env"], rules=rules)
    got_cells = {s: {c["rule"]: c["result"] for c in report["matrix"] if c["service"] == s}
                 for s in fields["services"]}
    assert got_cells == want["cells"]
    assert report["passed"] is want["passed"]
    assert {k: report["summary"][k] for k in want["summary"]} == want["summary"]


def test_every_example_compose_file_alone(rules: RuleSet) -> None:
    for path in sorted(EXAMPLES.glob("*.yaml")):
        env_file = EXAMPLES / "interpolation.env"  # harmless for the files that do not need it
        fields = normalize_files([path], environ={}, env_file=env_file)
        validate(SCHEMA, {"fields": fields})
        report = evaluate(fields, rules=rules)
        assert report["summary"]["error"] == 0, path.name


CORPUS_FILES = sorted(CORPUS.glob("*.yaml")) if CORPUS.is_dir() else []


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"compose corpus not present at {CORPUS}")
def test_corpus_is_complete() -> None:
    assert len(CORPUS_FILES) == 74


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"compose corpus not present at {CORPUS}")
@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: p.stem)
def test_corpus_file(path: Path, rules: RuleSet) -> None:
    dotenv = CORPUS / "dotenv" / f"{path.stem}.env"
    fields = normalize_files([path], environ={},
                             env_file=dotenv if dotenv.is_file() else Path("/dev/null"))
    for env in (None, "prod"):
        body = {"fields": fields, "strict": True, **({"env": env} if env else {})}
        validate(SCHEMA, body)
        report = evaluate(fields, strict=True, env=env, rules=rules)
        assert report["summary"]["error"] == 0
        assert report["summary"]["services"] == len(fields["services"]) > 0
        json.dumps(report, allow_nan=False)


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"compose corpus not present at {CORPUS}")
def test_corpus_findings_table(rules: RuleSet) -> None:
    """The committed per-rule finding counts (fail/warn/info, env prod) of every corpus file:
    precision changes show up as a reviewed diff of tests/compose/corpus_findings.json
    (regenerate with ``python -m tests.compose.corpus_table``)."""
    want = json.loads(corpus_table.TABLE.read_text(encoding="utf-8"))
    got = corpus_table.build(rules)
    changed = {name: {"stored": want.get(name), "now": got.get(name)}
               for name in sorted({*want, *got}) if want.get(name) != got.get(name)}
    assert not changed, json.dumps(changed, indent=1)


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"compose corpus not present at {CORPUS}")
def test_corpus_noise_classes_are_gone(rules: RuleSet) -> None:
    """On the real files: a secret finding only for a literal in the file (a value without a
    variable reference, or a reference's default) or in its .env (at /.env/<name>); no "needs
    root" for a low port; application-data binds below a home or /usr pass; some files pass
    prod (the hygiene rules warn there, strict fails them)."""
    passed_prod = 0
    for path in CORPUS_FILES:
        fields = corpus_table.fields_of(path)
        report = evaluate(fields, env="prod", rules=rules, dotenv=corpus_table.dotenv_of(path))
        passed_prod += report["passed"]
        assert not evaluate(fields, env="prod", strict=True, rules=rules,
                            dotenv=corpus_table.dotenv_of(path))["passed"]
        for finding in report["findings"]:
            assert "needs root" not in finding["message"]
            if finding["rule"] == "secret-env" and not finding["pointer"].startswith("/.env/"):
                key = finding["pointer"].rsplit("/", 1)[1]
                value = fields["services"][finding["service"]]["environment"][key]
                assert "${" not in value or ":-" in value, (path.name, key, value)
            if finding["rule"] == "sensitive-mounts":
                assert "minecraft_data" not in finding["message"]
                assert "/usr/share/appdata" not in finding["message"]
    assert passed_prod >= 20
