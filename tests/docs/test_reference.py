"""docs/reference/ is what ``python -m service.reference`` makes of its sources, and it leaves
nothing of them out: each source item (operation, config key, command and option, metric,
problem code) is found on its page by a reading of the source that does not go through the
generator's own walk."""

from __future__ import annotations

import argparse
import functools
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import generate_latest

from service import config, errors, reference
from service.cli.main import build_parser
from service.middleware.metrics import EXPORTED, Metrics, ScrapeGauges


@functools.cache
def pages() -> dict[str, str]:
    return reference.render()


@pytest.mark.parametrize("name", sorted(reference.PAGES))
def test_the_committed_page_is_current(name: str) -> None:
    path = reference.REFERENCE_DIR / name
    committed = path.read_text(encoding="utf-8") if path.exists() else None
    assert committed == pages()[name], f"docs/reference/{name} is stale: run make docs"


def test_the_index_lists_every_page() -> None:
    index = pages()["README.md"]
    for name in reference.PAGES:
        if name != "README.md":
            assert f"]({name})" in index
    assert "make docs" in index


def test_check_names_a_stale_page_and_fails(tmp_path: Any, monkeypatch: Any,
                                            capsys: Any) -> None:
    for name, text in pages().items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    (tmp_path / "cli.md").write_text("edited by hand\n", encoding="utf-8")
    monkeypatch.setattr(reference, "REFERENCE_DIR", tmp_path)
    monkeypatch.setattr(reference, "render", pages)
    assert reference.main(["--check"]) == 1
    assert "docs/reference/cli.md is stale: run make docs" in capsys.readouterr().err
    assert (tmp_path / "cli.md").read_text(encoding="utf-8") == "edited by hand\n"
    assert reference.main([]) == 0
    assert reference.main(["--check"]) == 0
    assert (tmp_path / "cli.md").read_text(encoding="utf-8") == pages()["cli.md"]


# ---- every source item is on its page ---------------------------------------------------------


def test_every_operation_is_on_the_http_page_with_its_summary() -> None:
    document = reference.openapi_document()
    page = pages()["http-api.md"]
    count = 0
    for path, item in document["paths"].items():
        for method, op in item.items():
            if method not in ("get", "put", "post", "patch", "delete"):
                continue
            count += 1
            assert op.get("summary"), f"{method.upper()} {path} has no summary in openapi.yaml"
            heading = f"### `{method.upper()} {path}`\n\n{op['summary'].strip()}\n"
            assert heading in page, heading
            section = page.split(heading, 1)[1].split("\n### ", 1)[0]
            for content in op.get("requestBody", {}).get("content", {}).values():
                ref = content.get("schema", {}).get("$ref")
                if ref:
                    assert f"- Request body: `{ref}`" in section, (method, path, ref)
    assert page.count("\n### `") == count


def _problem_codes(node: Any) -> Iterator[str]:
    """Every string under a ``code`` property anywhere in the description."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "code" and isinstance(value, dict):
                yield from _strings(value)
            yield from _problem_codes(value)
    elif isinstance(node, list):
        for value in node:
            yield from _problem_codes(value)


def _strings(node: Any) -> Iterator[str]:
    document = reference.openapi_document()
    if isinstance(node, dict):
        if "$ref" in node:
            target: Any = document
            for part in node["$ref"][2:].split("/"):
                target = target[part]
            yield from _strings(target)
        if "const" in node:
            yield str(node["const"])
        yield from (str(v) for v in node.get("enum", ()))
        for key in ("anyOf", "oneOf", "allOf"):
            for sub in node.get(key, ()):
                yield from _strings(sub)


def test_every_problem_code_is_on_the_errors_page() -> None:
    page = pages()["errors.md"]
    classes = [getattr(errors, name) for name in errors.__all__]
    problems = [c for c in classes if isinstance(c, type) and issubclass(c, errors.Problem)
                and c is not errors.Problem]
    assert len(problems) > 25
    for cls in problems:
        row = f"| `{cls.code}` | {cls.status} | {cls.title} | `{cls.__name__}` |"
        assert row in page, row
        assert f"{row} — |" not in page, f"errors.{cls.__name__} has no docstring"
    listed = set(_problem_codes(reference.openapi_document()["components"]))
    assert {"store_unavailable", "login_throttled", "invalid_credentials"} <= listed
    for code in listed:
        assert f"| `{code}` |" in page, code


def test_every_metric_the_service_exposes_is_on_the_metrics_page() -> None:
    page = pages()["metrics.md"]
    exposition = (generate_latest(Metrics.create().registry)
                  + generate_latest(ScrapeGauges.create().registry)).decode()
    families = re.findall(r"^# TYPE (\S+) (\S+)$", exposition, re.M)
    assert len(families) >= len(EXPORTED)
    for name, kind in families:  # as exposed: a counter's family name ends in _total
        base = name.removesuffix("_created")
        if base != name:  # the creation time prometheus-client adds to counters and histograms
            assert f"| `{base}_total` | counter |" in page or f"| `{base}` | histogram |" in page
            continue
        assert f"| `{name}` | {kind} |" in page, name
    for name in EXPORTED:
        assert f"| `{name}` |" in page, name


def _property_paths(node: Any, schema: dict[str, Any], at: str) -> Iterator[str]:
    """Every key path of the config schema, read from the schema itself."""
    if "$ref" in node:
        node = {**schema["$defs"][node["$ref"].split("/")[-1]], **node}
    for key, child in node.get("properties", {}).items():
        path = f"{at}.{key}" if at else key
        yield path
        yield from _property_paths(child, schema, path)
    if isinstance(node.get("items"), dict):
        yield from _property_paths(node["items"], schema, at + "[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _property_paths(node["additionalProperties"], schema, at + ".<name>")


def _rows(page: str) -> dict[str, list[str]]:
    return {cells[0].strip("`"): cells
            for line in page.splitlines() if line.startswith("| `")
            for cells in [[c.strip() for c in line.strip("|").split(" | ")]]}


def test_every_config_key_is_on_the_page_described_with_its_default_and_variable() -> None:
    schema = reference.config_schema()
    rows = _rows(pages()["configuration.md"])
    paths = list(_property_paths(schema, schema, ""))
    assert len(paths) > 100
    for path in paths:
        assert path in rows, path
        assert rows[path][4] != "—", f"{path} has no description in config.schema.json"
    assert set(rows) == set(paths)

    def leaves(node: dict[str, Any], at: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
        for key, value in node.items():
            if isinstance(value, dict) and (*at, key) != ("environments",):
                yield from leaves(value, (*at, key))
            else:
                yield (*at, key), value

    for path, default in leaves(config.DEFAULTS, ()):
        row = rows[".".join(path)]
        assert row[2] == f"`{json.dumps(default)}`", path
        if isinstance(default, (list, dict)):
            assert row[3] == "file only", path
            continue
        variable = row[3].strip("`")
        # The variable the page names is the one the loader reads for that key.
        names: dict[str, str] = {}
        config._from_environ({variable: "1"}, names)
        assert names == {"/" + "/".join(path): variable}, path


def _subcommands(parser: argparse.ArgumentParser, name: str
                 ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                yield f"{name} {sub}", subparser
                yield from _subcommands(subparser, f"{name} {sub}")


def test_every_command_and_option_of_cpctl_is_on_the_cli_page() -> None:
    page = pages()["cli.md"]
    sections = dict(re.findall(r"^## `([^`]+)`\n(.*?)(?=^## |\Z)", page, re.M | re.S))
    commands = list(_subcommands(build_parser(), "cpctl"))
    assert len(commands) > 40
    for command, parser in commands:
        assert command in sections, command
        shown = parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue  # every command has -h, --help
            if action.help == argparse.SUPPRESS:
                assert not any(option in sections[command] for option in action.option_strings)
                continue
            for option in action.option_strings:
                if option in shown:
                    assert f"`{option}" in sections[command] or f", {option}" in (
                        sections[command]), f"{command} {option}"
            if action.help and action.help != argparse.SUPPRESS and "%(" not in action.help:
                assert " ".join(action.help.split()) in " ".join(sections[command].split()), (
                    f"{command}: {action.help}")
