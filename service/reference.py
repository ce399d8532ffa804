"""The reference pages of ``docs/reference/``, generated from what they describe.

Each page is a pure function of its source: the HTTP API of ``schemas/openapi.yaml``, the
configuration of ``schemas/config.schema.json`` (with ``config.DEFAULTS`` and the
``CONTROLPLANE_*`` variable ``config.environment_variable`` names), the commands of
``cpctl``'s parser (``cli.main.build_parser``), the metrics the service registers and the
problems of ``service/errors.py``. A description missing from a page is added to its source,
never here, so the page cannot drift from what the service does. The output is deterministic
(sorted, no timestamps, no machine paths): ``--check`` (and ``tests/docs``) compares it with the
committed files.

    python -m service.reference          # write docs/reference/*.md (``make docs``)
    python -m service.reference --check  # exit 1 naming every stale page
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = ["PAGES", "REFERENCE_DIR", "config_keys", "config_schema", "main", "metric_families",
           "openapi_document", "operations", "problem_classes", "render", "responses"]

_REPO = Path(__file__).resolve().parent.parent
REFERENCE_DIR = _REPO / "docs" / "reference"
_METHODS = ("get", "put", "post", "patch", "delete", "head", "options")


def _header(title: str, source: str) -> list[str]:
    return [f"# {title}", "",
            f"Generated from {source} by `python -m service.reference` (`make docs`); do not edit.",
            ""]


def _cell(value: object) -> str:
    """One Markdown table cell: one line, pipes escaped."""
    text = " ".join(str(value).split()).replace("|", "\\|")
    # Outside code spans, "<name>" would be read as an HTML tag.
    parts = text.split("`")
    parts[::2] = [part.replace("<", "&lt;") for part in parts[::2]]
    return "`".join(parts) if text else "—"


def _code(value: object) -> str:
    return f"`{value}`"


def _table(head: Sequence[str], rows: Iterable[Sequence[object]]
           ) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


# ---- HTTP API (schemas/openapi.yaml) ----------------------------------------------------------


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The description as written (request bodies still name their files); read once, since
    two pages use it, and with libyaml when present (the pure-Python reader takes ~0.6 s)."""
    from .api.openapi import DESCRIPTION_PATH

    text = DESCRIPTION_PATH.read_text(encoding="utf-8")
    if yaml.__with_libyaml__:
        return yaml.load(text, Loader=yaml.CSafeLoader)  # type: ignore[no-any-return]
    return yaml.safe_load(text)  # type: ignore[no-any-return]


def operations(document: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(METHOD, path, operation) of every operation, sorted by path then method."""
    found = [(method.upper(), path, op) for path, item in document["paths"].items()
             for method, op in item.items() if method in _METHODS]
    return sorted(found, key=lambda o: (o[1], _METHODS.index(o[0].lower())))


def _codes(document: Mapping[str, Any], schema: Any) -> set[str]:
    """The problem ``code`` values a response schema allows (const, enum, any/all/oneOf)."""
    schema = _resolve_in(document, schema)
    found: set[str] = set()
    if not isinstance(schema, Mapping):
        return found
    for key in ("allOf", "anyOf", "oneOf"):
        for sub in schema.get(key, ()):
            found |= _codes(document, sub)
    code = (schema.get("properties") or {}).get("code")
    if code is not None:
        found |= _values(document, code)
    return found


def _values(document: Mapping[str, Any], schema: Any) -> set[str]:
    schema = _resolve_in(document, schema)
    if not isinstance(schema, Mapping):
        return set()
    found = set(schema.get("enum", ()))
    if "const" in schema:
        found.add(schema["const"])
    for key in ("allOf", "anyOf", "oneOf"):
        for sub in schema.get(key, ()):
            found |= _values(document, sub)
    return {str(v) for v in found}


def _resolve_in(document: Mapping[str, Any], node: Any) -> Any:
    """Follow local ``#/...`` references within ``document``."""
    while isinstance(node, Mapping) and str(node.get("$ref", "")).startswith("#/"):
        target: Any = document
        for part in node["$ref"][2:].split("/"):
            target = target[part]
        node = target
    return node


def responses(document: Mapping[str, Any], op: Mapping[str, Any]
              ) -> list[tuple[str, str, list[str]]]:
    """(status, description, sorted problem codes) of every response an operation lists."""
    rows = []
    for status, response in sorted(op.get("responses", {}).items(), key=lambda r: str(r[0])):
        response = _resolve_in(document, response)
        codes: set[str] = set()
        for media in (response.get("content") or {}).values():
            codes |= _codes(document, media.get("schema"))
        rows.append((str(status), response.get("description", ""), sorted(codes)))
    return rows


def _request_body(op: Mapping[str, Any]) -> str | None:
    body = op.get("requestBody")
    if body is None:
        return None
    parts = []
    for media, content in sorted((body.get("content") or {}).items()):
        schema = content.get("schema") or {}
        ref = schema.get("$ref")
        if ref:
            parts.append(f"`{ref.rsplit('/', 1)[-1]}` ({media})")
        elif schema.get("properties"):
            required = set(schema.get("required", ()))
            fields = ", ".join(f"`{name}`" + (" (required)" if name in required else "")
                               for name in schema["properties"])
            parts.append(f"{media} with the fields {fields}")
        else:
            parts.append(f"any {media} document")
    return ", ".join(parts)


def _auth(document: Mapping[str, Any], op: Mapping[str, Any]) -> str:
    security = op.get("security", document.get("security"))
    if not security:
        return "none (public)"
    schemes = sorted({name for requirement in security for name in requirement})
    return ", ".join(schemes) + " (the chain: AuthN, AuthZ, Approval, Execute, Audit)"


def http_api() -> str:
    document = openapi_document()
    lines = _header("HTTP API", "`schemas/openapi.yaml`")
    lines += [document["info"].get("description", "").strip(), ""]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for method, path, op in operations(document):
        by_tag.setdefault((op.get("tags") or ["other"])[0], []).append((method, path, op))
    for tag in sorted(by_tag):
        lines += [f"## {tag}", ""]
        for method, path, op in by_tag[tag]:
            lines += [f"### `{method} {path}`", "", op.get("summary", "").strip(), ""]
            if op.get("description"):
                lines += [op["description"].strip(), ""]
            lines += [f"- Operation id: `{op.get('operationId', '')}`",
                      f"- Auth: {_auth(document, op)}"]
            body = _request_body(op)
            if body:
                lines.append(f"- Request body: {body}")
            params = [_resolve_in(document, p) for p in op.get("parameters", ())]
            if params:
                lines.append("- Parameters: " + ", ".join(
                    f"`{p['name']}` ({p['in']}{', required' if p.get('required') else ''})"
                    for p in params))
            lines.append("")
            lines += _table(("status", "meaning", "problem codes"), [
                (status, text, ", ".join(_code(c) for c in codes))
                for status, text, codes in responses(document, op)])
    return "\n".join(lines)


# ---- configuration (schemas/config.schema.json) -----------------------------------------------


def config_schema() -> dict[str, Any]:
    from .schemas import SCHEMA_DIR

    schema: dict[str, Any] = json.loads(
        (SCHEMA_DIR / "config.schema.json").read_text(encoding="utf-8"))
    return schema


def _type(schema: Mapping[str, Any]) -> str:
    if "enum" in schema:
        return "one of " + ", ".join(_code(json.dumps(v)) for v in schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array":
        items = schema.get("items") or {}
        return f"array of {_type(items)}" if items else "array"
    if kind is None and "oneOf" in schema:
        return " or ".join(_type(s) for s in schema["oneOf"])
    bounds = [f"{word} {schema[key]}" for key, word in _BOUNDS if key in schema]
    return " ".join([str(kind or "any"), *bounds])


_BOUNDS = (("minimum", "from"), ("exclusiveMinimum", "over"), ("maximum", "up to"),
           ("exclusiveMaximum", "under"))


def config_keys(schema: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any], bool]]:
    """(key path, its schema, whether a variable can set it) of every key, depth first in the
    schema's order. ``[]`` stands for any item of a list, ``<name>`` for any key of a map; keys
    under them (and lists and maps themselves: structured values) are set in the file only."""
    out: list[tuple[str, Mapping[str, Any], bool]] = []

    def deref(node: Mapping[str, Any]) -> Mapping[str, Any]:
        ref = node.get("$ref")
        if ref and ref.startswith("#/$defs/"):
            merged = {**schema["$defs"][ref.removeprefix("#/$defs/")]}
            merged.update({k: v for k, v in node.items() if k != "$ref"})
            return merged
        return node

    def walk(node: Mapping[str, Any], path: str, settable: bool) -> None:
        for key, child in (node.get("properties") or {}).items():
            child = deref(child)
            at = f"{path}.{key}" if path else key
            scalar = child.get("type") not in ("object", "array") and "properties" not in child
            out.append((at, child, settable and scalar))
            descend(child, at, settable)

    def descend(child: Mapping[str, Any], at: str, settable: bool) -> None:
        if "properties" in child:
            walk(child, at, settable)
        extra = child.get("additionalProperties")
        if isinstance(extra, Mapping):
            extra = deref(extra)
            if "properties" in extra:
                walk(extra, f"{at}.<name>", False)
        items = child.get("items")
        if isinstance(items, Mapping):
            items = deref(items)
            if "properties" in items:
                walk(items, f"{at}[]", False)

    walk(schema, "", True)
    return out


def _default(path: str) -> str:
    from .config import DEFAULTS

    node: Any = DEFAULTS
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return ""
        node = node[part]
    return _code(json.dumps(node))


def configuration() -> str:
    from .config import environment_variable

    schema = config_schema()
    lines = _header("Configuration", "`schemas/config.schema.json` and `service/config.py`")
    lines += [
        "Defaults < YAML file (`cpctl serve --config FILE` or `CONTROLPLANE_CONFIG`) < "
        "`CONTROLPLANE_*` environment variables < command-line flags. A variable's value is "
        "read as a YAML scalar (`8701` is an integer, `true` a boolean); lists and mappings "
        "are set in the file only. A key the schema does not know is an error at start-up.",
        "",
    ]
    rows = []
    for path, node, settable in config_keys(schema):
        if "properties" in node:  # a section: its keys have their own rows
            rows.append((_code(path), "section", "", "", node.get("description", "")))
            continue
        variable = _code(environment_variable(tuple(path.split(".")))) if settable else "file only"
        rows.append((_code(path), _type(node), _default(path), variable,
                     node.get("description", "")))
    lines += _table(("key", "type", "default", "environment", "description"), rows)
    return "\n".join(lines)


# ---- cpctl (service/cli/main.py build_parser) -------------------------------------------------


def _commands(parser: argparse.ArgumentParser, name: str
              ) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(full command, its help, its parser) of ``parser`` and every subcommand, depth first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            seen: set[int] = set()
            for sub, subparser in sorted(action.choices.items()):
                if id(subparser) in seen:
                    continue
                seen.add(id(subparser))
                full = f"{name} {sub}"
                yield full, helps.get(sub, ""), subparser
                yield from _commands(subparser, full)


def _shown_default(value: object) -> str:
    if isinstance(value, Path):
        try:
            return _code(value.resolve().relative_to(_REPO))
        except ValueError:
            return ""  # a machine path
    if isinstance(value, bool) or value in (None, "", [], (), argparse.SUPPRESS):
        return ""
    return _code(value) if isinstance(value, (int, float, str)) else ""


def _option_rows(parser: argparse.ArgumentParser) -> list[tuple[str, str, str, str]]:
    rows = []
    for action in parser._actions:
        if (action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction)
                or isinstance(action, argparse._HelpAction)):
            continue
        metavar = action.metavar if isinstance(action.metavar, str) else None
        names = ", ".join(action.option_strings) or metavar or action.dest
        choices = "{" + ",".join(map(str, action.choices)) + "}" if action.choices else None
        if action.option_strings and action.nargs != 0:
            names += " " + (metavar or choices or action.dest.upper())
        elif not action.option_strings and choices and not metavar:
            names = choices
        text = action.help or ""
        if "%(" in text:
            text = text % {**vars(action), "prog": parser.prog}
        required = "yes" if (action.required or not action.option_strings) else ""
        rows.append((_code(names), required, _shown_default(action.default), text))
    return rows


def _prose(text: str | None) -> list[str]:
    """A description or epilog: one line is a paragraph; more are kept as written (aligned
    lists of exit codes, examples) in a code block."""
    if not text:
        return []
    text = inspect.cleandoc(text)
    return [text, ""] if "\n" not in text else ["```text", text, "```", ""]


def _same(text: str) -> str:
    """A command's help and description often say one thing twice (capitalised, with a
    full stop): shown once."""
    return " ".join(text.split()).rstrip(".").lower()


def cli() -> str:
    from .cli.main import build_parser

    parser = build_parser()
    lines = _header("cpctl", "the argparse parsers of `cpctl` (`service/cli/main.py`)")
    lines += [parser.description or "", ""]
    lines += _table(("option", "required", "default", "help"), _option_rows(parser))
    for full, help_text, sub in _commands(parser, "cpctl"):
        lines += [f"## `{full}`", ""]
        if help_text:
            lines += [help_text, ""]
        if sub.description and _same(sub.description) != _same(help_text):
            lines += _prose(sub.description)
        rows = _option_rows(sub)
        if rows:
            lines += _table(("option", "required", "default", "help"), rows)
        lines += _prose(sub.epilog)
    return "\n".join(lines)


# ---- metrics (service/middleware/metrics.py) --------------------------------------------------


def metric_families() -> list[tuple[str, str, tuple[str, ...], str]]:
    """(exposed name, type, labels, help) of every metric the service registers, by name."""
    from prometheus_client.metrics import MetricWrapperBase

    from .middleware.metrics import Metrics, ScrapeGauges

    metrics = Metrics.create()
    gauges = ScrapeGauges.create()
    instruments = [v for v in (*vars(metrics).values(), *vars(gauges).values())
                   if isinstance(v, MetricWrapperBase)]
    found = []
    for instrument in instruments:
        (family,) = instrument.describe()
        name = family.name + ("_total" if family.type == "counter" else "")
        # The label names are not part of prometheus-client's public surface; _labelnames is
        # where every version keeps them.
        found.append((name, family.type, tuple(instrument._labelnames), family.documentation))
    return sorted(found)


def metrics_page() -> str:
    lines = _header("Metrics", "the instruments of `service/middleware/metrics.py`")
    lines += [
        "`GET /metrics` (public) exposes them in the Prometheus text format; with several "
        "workers the values are summed over the workers. A histogram is exposed as "
        "`<name>_bucket`, `<name>_sum` and `<name>_count`. Run as one process, the service also "
        "exposes the creation time of each counter and histogram series as `<name>_created` "
        "(a counter's name without `_total`). No label carries a subject, token or resource "
        "value.",
        "",
    ]
    lines += _table(("metric", "type", "labels", "help"), [
        (_code(name), kind, ", ".join(_code(label) for label in labels), text)
        for name, kind, labels, text in metric_families()])
    return "\n".join(lines)


# ---- errors (service/errors.py) ---------------------------------------------------------------


def problem_classes() -> list[type[Any]]:
    """Every problem class of ``service/errors.py`` (not their base), by status then code."""
    from . import errors

    found: list[type[Any]] = []
    pending: list[type[Any]] = list(errors.Problem.__subclasses__())
    while pending:
        cls = pending.pop()
        if cls.__module__ == errors.__name__:
            found.append(cls)
        pending.extend(cls.__subclasses__())
    return sorted(found, key=lambda c: (c.status, c.code, c.__name__))


def operation_codes(document: Mapping[str, Any]) -> dict[str, set[str]]:
    """Problem code -> the statuses operations list it under."""
    codes: dict[str, set[str]] = {}
    for _, _, op in operations(document):
        for status, _, found in responses(document, op):
            for code in found:
                codes.setdefault(code, set()).add(status)
    return codes


def errors_page() -> str:
    lines = _header("Errors", "`service/errors.py` and `schemas/openapi.yaml`")
    lines += [
        "Every error is RFC 9457 `application/problem+json` with `type` "
        "(`urn:controlplane:problem:<code>`), `title`, `status`, `detail`, `code` and "
        "`correlation_id`. `code` is the stable machine value to branch on.",
        "",
        "## Problem classes",
        "",
    ]
    classes = problem_classes()
    lines += _table(("code", "status", "title", "class", "meaning"), [
        (_code(c.code), c.status, c.title, _code(c.__name__),
         inspect.cleandoc(c.__doc__ or "").split("\n\n")[0].replace("``", "`"))
        for c in classes])
    own = {c.code for c in classes}
    codes = operation_codes(openapi_document())
    lines += [
        "## Other codes operations answer",
        "",
        "A problem class may answer with a more specific `code` (`store_unavailable` is a 503 "
        "`ServiceUnavailable`); these are the codes the operations of `schemas/openapi.yaml` "
        "list beyond the classes' own (see `http-api.md` for which operation answers which).",
        "",
    ]
    lines += _table(("code", "statuses"), [
        (_code(code), ", ".join(sorted(statuses)))
        for code, statuses in sorted(codes.items()) if code not in own])
    return "\n".join(lines)


# ---- the pages --------------------------------------------------------------------------------


def index() -> str:
    lines = [
        "# Reference", "",
        "Every page here is generated from the source it describes by `python -m "
        "service.reference`; regenerate them with `make docs` after changing a source (the "
        "test suite fails while a page is stale). Do not edit them by hand: change the source.",
        "",
    ]
    lines += [f"- [{name}]({name}): generated from {source}"
              for name, (source, _) in sorted(PAGES.items()) if name != "README.md"]
    return "\n".join(lines) + "\n"


PAGES: dict[str, tuple[str, Callable[[], str]]] = {
    "README.md": ("the list of pages", index),
    "http-api.md": ("`schemas/openapi.yaml`", http_api),
    "configuration.md": ("`schemas/config.schema.json`, `service/config.py`", configuration),
    "cli.md": ("the argparse parsers of `service/cli/`", cli),
    "metrics.md": ("`service/middleware/metrics.py`", metrics_page),
    "errors.md": ("`service/errors.py`, `schemas/openapi.yaml`", errors_page),
}


def render() -> dict[str, str]:
    """File name -> the page's text, as ``make docs`` writes it."""
    return {name: build().rstrip("\n") + "\n" for name, (_, build) in sorted(PAGES.items())}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m service.reference",
        description="Write docs/reference/ from its sources (or check it is current).")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming every page that differs")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = REFERENCE_DIR / name
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(name)
        else:
            REFERENCE_DIR.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote docs/reference/{name}")
    for name in stale:
        print(f"docs/reference/{name} is stale: run make docs", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
