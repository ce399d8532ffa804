"""Reading Compose sources: YAML with Compose's YAML 1.2 scalars, ``.env`` files, interpolation.

Compose parses YAML with a YAML 1.2 loader, so PyYAML's YAML 1.1 implicit types would silently
change what a file means: an unquoted ``2222:22`` port is the sexagesimal integer 133342,
``user: 0:0`` is 0, ``restart: no`` is ``False``, ``on:`` keys are booleans and dates become
``datetime`` objects. ``ComposeLoader`` keeps PyYAML's anchors, aliases and ``<<`` merge keys but
resolves plain scalars with the YAML 1.2 core schema only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

__all__ = [
    "ComposeLoader",
    "Interpolator",
    "NormalizeError",
    "Override",
    "Reset",
    "load_yaml",
    "parse_dotenv",
]


class NormalizeError(Exception):
    """A Compose source cannot be read or normalized; the message names file and location."""


class Reset:
    """The ``!reset`` tag: in a merge, remove the value inherited from earlier files."""

    def __repr__(self) -> str:
        return "!reset"


@dataclass
class Override:
    """The ``!override`` tag: in a merge, replace (not merge) the earlier value."""

    value: Any = field(default=None)


def _loader_base() -> type:
    """SafeLoader's parts with libyaml's scanner and parser when PyYAML has them: the scanner
    is most of the cost of reading a file in Python (~4x). The composer stays PyYAML's Python
    one: libyaml's composer recurses in C and crashes the process on a deeply nested document,
    where Python's raises RecursionError."""
    try:
        from yaml._yaml import CParser
    except ImportError:  # PyYAML built without libyaml
        return yaml.SafeLoader

    class CSafeParserLoader(Composer, CParser, SafeConstructor, Resolver):
        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

    return CSafeParserLoader


class ComposeLoader(_loader_base()):  # type: ignore[misc]
    """SafeLoader with YAML 1.2 core-schema scalars (the resolvers are replaced, not extended)."""


# Start from an empty table: SafeLoader's table is shared class state and must not be mutated.
ComposeLoader.yaml_implicit_resolvers = {}
_RESOLVERS: list[tuple[str, str, str]] = [
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    (
        "tag:yaml.org,2002:float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        "-+0123456789.",
    ),
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", "~nN\0"),
    ("tag:yaml.org,2002:merge", r"^(?:<<)$", "<"),
]
for _tag, _pattern, _first in _RESOLVERS:
    ComposeLoader.add_implicit_resolver(_tag, re.compile(_pattern), [*_first, ""])


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    sign = -1 if text.startswith("-") else 1
    digits = text.lstrip("+-")
    if digits.startswith("0x"):
        return sign * int(digits[2:], 16)
    if digits.startswith("0o"):
        return sign * int(digits[2:], 8)
    # Compose's Go YAML decoder parses with base 0, so a leading zero means octal (file modes).
    if len(digits) > 1 and digits.startswith("0") and set(digits) <= set("01234567"):
        return sign * int(digits, 8)
    return sign * int(digits, 10)


def _construct_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float | str:
    text = str(loader.construct_scalar(node))
    lowered = text.lower()
    if lowered.endswith("inf") or lowered.endswith("nan"):
        return text  # not representable in JSON; keep the text
    return float(text)


def _construct_reset(loader: yaml.SafeLoader, node: yaml.Node) -> Reset:
    return Reset()


def _construct_override(loader: yaml.SafeLoader, node: yaml.Node) -> Override:
    if isinstance(node, yaml.MappingNode):
        return Override(loader.construct_mapping(node, deep=True))
    if isinstance(node, yaml.SequenceNode):
        return Override(loader.construct_sequence(node, deep=True))
    return Override(loader.construct_scalar(node))  # type: ignore[arg-type]


ComposeLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
ComposeLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)
ComposeLoader.add_constructor("!reset", _construct_reset)
ComposeLoader.add_constructor("!override", _construct_override)


def load_yaml(text: str, name: str = "<compose>") -> Any:
    """Parse one Compose YAML document (anchors and merge keys resolved)."""
    try:
        return yaml.load(text, Loader=ComposeLoader)  # noqa: S506 - ComposeLoader is a SafeLoader
    except yaml.YAMLError as exc:
        raise NormalizeError(f"{name}: invalid YAML: {exc}") from None


# --- .env files ------------------------------------------------------------------------------

_DOTENV_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.\-]*)\s*(?:=(.*))?$")


def parse_dotenv(text: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Parse a Compose ``.env`` file; values may interpolate earlier keys and ``environ``."""
    result: dict[str, str] = {}
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _DOTENV_LINE.match(line)
        if match is None:
            continue  # Compose rejects these; a preflight reads on rather than fail the whole file
        key, raw = match.group(1), (match.group(2) or "").strip()
        if raw[:1] in ("'", '"'):
            quote = raw[0]
            body = raw[1:]
            # Quoted values may span lines until the closing quote.
            while not _closed(body, quote) and index < len(lines):
                body += "\n" + lines[index]
                index += 1
            end = _closing_index(body, quote)
            value = body[:end] if end >= 0 else body
            if quote == '"':
                value = _unescape(value)
                value = Interpolator({**(environ or {}), **result}).substitute(value, key)
            result[key] = value
            continue
        # Unquoted: an inline comment starts at " #".
        value = re.split(r"\s+#", raw, maxsplit=1)[0].strip()
        result[key] = Interpolator({**(environ or {}), **result}).substitute(value, key)
    return result


def _closing_index(body: str, quote: str) -> int:
    i = 0
    while i < len(body):
        if body[i] == "\\" and quote == '"':
            i += 2
            continue
        if body[i] == quote:
            return i
        i += 1
    return -1


def _closed(body: str, quote: str) -> bool:
    return _closing_index(body, quote) >= 0


def _unescape(value: str) -> str:
    return (
        value.replace("\\n", "\n").replace("\\t", "\t").replace('\\"', '"').replace("\\\\", "\\")
    )


def read_dotenv(path: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Read and parse a ``.env`` file."""
    try:
        return parse_dotenv(path.read_text(encoding="utf-8"), environ)
    except OSError as exc:
        raise NormalizeError(f"{path}: cannot read env file: {exc.strerror}") from None


# --- interpolation ---------------------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Interpolator:
    """Compose variable interpolation: ``$$``, ``$VAR``, ``${VAR}``, ``${VAR:-d}``, ``${VAR-d}``,
    ``${VAR:?e}``, ``${VAR?e}``, ``${VAR:+r}``, ``${VAR+r}``; defaults may nest."""

    def __init__(self, variables: Mapping[str, str]):
        self.variables = variables
        #: Variables referenced without a value and without a default (Compose warns, uses "").
        self.missing: set[str] = set()

    def substitute(self, text: str, where: str = "") -> str:
        value, _ = self._parse(text, 0, where, stop=None)
        return value

    def _parse(self, text: str, pos: int, where: str, stop: str | None) -> tuple[str, int]:
        out: list[str] = []
        while pos < len(text):
            char = text[pos]
            if stop is not None and char == "}":
                return "".join(out), pos
            if char != "$":
                out.append(char)
                pos += 1
                continue
            nxt = text[pos + 1 : pos + 2]
            if nxt == "$":
                out.append("$")
                pos += 2
            elif nxt == "{":
                value, pos = self._braced(text, pos + 2, where)
                out.append(value)
            else:
                match = _NAME.match(text, pos + 1)
                if match is None:
                    out.append("$")  # a lone "$" stays literal
                    pos += 1
                else:
                    out.append(self._lookup(match.group(0)))
                    pos = match.end()
        if stop is not None:
            raise NormalizeError(f"{where}: unterminated '${{' in {text!r}")
        return "".join(out), pos

    def _braced(self, text: str, pos: int, where: str) -> tuple[str, int]:
        match = _NAME.match(text, pos)
        if match is None:
            raise NormalizeError(f"{where}: invalid interpolation format in {text!r}")
        name = match.group(0)
        pos = match.end()
        if pos < len(text) and text[pos] == "}":
            return self._lookup(name), pos + 1
        operator = ""
        for candidate in (":-", ":?", ":+", "-", "?", "+"):
            if text.startswith(candidate, pos):
                operator = candidate
                break
        if not operator:
            raise NormalizeError(f"{where}: invalid interpolation format in {text!r}")
        arg, end = self._parse(text, pos + len(operator), where, stop="}")
        pos = end + 1
        is_set = name in self.variables
        is_nonempty = is_set and self.variables[name] != ""
        present = is_nonempty if operator.startswith(":") else is_set
        kind = operator[-1]
        if kind == "-":
            return (self.variables[name] if present else arg), pos
        if kind == "+":
            return (arg if present else ""), pos
        if not present:  # "?": required
            message = arg or f"variable {name} is required"
            raise NormalizeError(f"{where}: required variable {name} is missing a value: {message}")
        return self.variables[name], pos

    def _lookup(self, name: str) -> str:
        if name in self.variables:
            return self.variables[name]
        self.missing.add(name)
        return ""

    def walk(self, value: Any, where: str = "") -> Any:
        """Interpolate every string value (not keys) of a parsed document."""
        if isinstance(value, str):
            return self.substitute(value, where)
        if isinstance(value, dict):
            return {k: self.walk(v, f"{where}/{k}") for k, v in value.items()}
        if isinstance(value, list):
            return [self.walk(v, f"{where}/{i}") for i, v in enumerate(value)]
        if isinstance(value, Override):
            return Override(self.walk(value.value, where))
        return value
