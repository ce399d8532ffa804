"""Reading Compose sources: YAML with Compose's YAML 1.2 scalars, ``.env`` files, interpolation.

Compose parses YAML with a YAML 1.2 loader, so PyYAML's YAML 1.1 implicit types would silently
change what a file means: an unquoted ``2222:22`` port is the sexagesimal integer 133342,
``user: 0:0`` is 0, ``restart: no`` is ``False``, ``on:`` keys are booleans and dates become
``datetime`` objects. ``ComposeLoader`` keeps PyYAML's anchors, aliases and ``<<`` merge keys but
resolves plain scalars with the YAML 1.2 core schema only.

Reading is bounded before anything is expanded (``ComposeLoader``'s composer counts as it
goes): a document may hold at most ``MAX_YAML_NODES`` nodes, an alias counting the size of
the node it refers to (a few hundred bytes of nested aliases, "billion laughs", would
otherwise expand to gigabytes in the normalizer), and nest at most ``MAX_YAML_DEPTH``
collections deep (aliases included); an alias inside its own anchor (a recursive structure)
is refused. Variable defaults nest at most ``MAX_INTERPOLATION_DEPTH`` deep, and variables put at
most ``MAX_INTERPOLATED_CHARS`` characters into a run's documents. Each refusal is a one-line
``NormalizeError`` naming the file (and line and column, or the value's path).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.error import Mark
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from service.limits import MAX_JSON_DEPTH, MAX_JSON_VALUE_BYTES

__all__ = [
    "MAX_INTERPOLATED_CHARS",
    "MAX_INTERPOLATION_DEPTH",
    "MAX_YAML_DEPTH",
    "MAX_YAML_NODES",
    "ComposeLoader",
    "Interpolator",
    "NormalizeError",
    "Override",
    "Reset",
    "load_yaml",
    "parse_dotenv",
    "read_source",
]

#: Most nodes (scalars, sequences, mappings; keys included) one YAML document may expand to, an
#: alias counting the size of the node it refers to. Every node of the normalized fields takes
#: at least two bytes of their JSON (a one-character scalar and a separator), so a document
#: over this could never be sent as ``fields`` within ``MAX_JSON_VALUE_BYTES`` (256 KiB); a
#: real compose file has a few hundred to a few thousand nodes.
MAX_YAML_NODES = MAX_JSON_VALUE_BYTES // 2
#: Deepest nesting of sequences/mappings in a YAML document (the top-level mapping is 1): one
#: less than ``MAX_JSON_DEPTH``, so the request body ``{"fields": ...}`` stays within it.
MAX_YAML_DEPTH = MAX_JSON_DEPTH - 1
#: Deepest nesting of ``${VAR:-${OTHER:-...}}`` defaults.
MAX_INTERPOLATION_DEPTH = MAX_JSON_DEPTH
#: Most characters variables may put into one run's documents (or into one ``.env`` value):
#: what one value may take as JSON (``MAX_JSON_VALUE_BYTES``). A ``.env`` line of ten ``${A}``
#: per line, nine lines deep, would otherwise be a gigabyte, and a compose file that refers to
#: one large variable a hundred thousand times as many copies of it.
MAX_INTERPOLATED_CHARS = MAX_JSON_VALUE_BYTES


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


class YAMLRefused(yaml.YAMLError):
    """A document over the composer's bounds (``MAX_YAML_NODES``, ``MAX_YAML_DEPTH``) or with a
    recursive alias; raised while composing, before anything is constructed or expanded."""

    def __init__(self, problem: str, mark: Mark | None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = mark


class BoundedComposer(Composer):
    """PyYAML's composer, counting the document's expanded size and depth as it composes.

    An alias is not copied when composed (it is the anchored node itself), which is why
    a tiny document can stand for an enormous one: each anchored node's expanded size and
    height are measured once, when it is composed, and an alias adds them to the running totals.
    """

    # the parser's (PyYAML's or libyaml's), mixed in beside
    peek_event: Callable[[], Any]
    check_event: Callable[..., bool]

    def __init__(self) -> None:
        super().__init__()
        self._measures: dict[str, tuple[int, int]] = {}  # anchor -> (expanded size, height)
        self._open: set[str] = set()  # anchors whose node is being composed
        self._nodes = 0  # expanded nodes of the document so far
        self._level = 0  # collections open around the current node
        self._deepest = 0  # the deepest level reached (within the anchored node measured)

    def compose_document(self) -> Any:
        self._measures, self._open = {}, set()
        self._nodes = self._level = self._deepest = 0
        return super().compose_document()

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            if event.anchor in self._open:
                raise YAMLRefused(f"alias *{event.anchor} is inside its own anchor (a recursive "
                                  "structure)", event.start_mark)
            node = super().compose_node(parent, index)  # an unknown anchor raises here
            size, height = self._measures[event.anchor]
            self._count(size, event.start_mark)
            self._reach(self._level + height, event.start_mark)
            return node
        event = self.peek_event()
        anchor = event.anchor
        self._count(1, event.start_mark)
        if anchor is None or anchor in self._measures:  # a duplicate anchor raises in super()
            return super().compose_node(parent, index)
        start, outer = self._nodes - 1, self._deepest
        self._deepest = self._level
        self._open.add(anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._open.discard(anchor)
        self._measures[anchor] = (self._nodes - start, self._deepest - self._level)
        self._deepest = max(outer, self._deepest)
        return node

    def compose_sequence_node(self, anchor: Any) -> Any:
        self._enter()
        try:
            return super().compose_sequence_node(anchor)
        finally:
            self._level -= 1

    def compose_mapping_node(self, anchor: Any) -> Any:
        self._enter()
        try:
            return super().compose_mapping_node(anchor)
        finally:
            self._level -= 1

    def _enter(self) -> None:
        self._level += 1
        self._reach(self._level, self.peek_event().start_mark)

    def _count(self, nodes: int, mark: Mark) -> None:
        self._nodes += nodes
        if self._nodes > MAX_YAML_NODES:
            raise YAMLRefused(f"the document expands to over {MAX_YAML_NODES} YAML nodes "
                              "(aliases counted at the size of what they refer to): refused "
                              "before expanding it", mark)

    def _reach(self, depth: int, mark: Mark) -> None:
        self._deepest = max(self._deepest, depth)
        if depth > MAX_YAML_DEPTH:
            raise YAMLRefused(f"nested too deep: over {MAX_YAML_DEPTH} levels of sequences and "
                              "mappings (aliases included)", mark)


class _PySafeLoader(Reader, Scanner, Parser, BoundedComposer, SafeConstructor, Resolver):
    """``yaml.SafeLoader`` with the bounded composer (PyYAML built without libyaml)."""

    def __init__(self, stream: str) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        BoundedComposer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)


def _loader_base() -> type:
    """SafeLoader's parts with libyaml's scanner and parser when PyYAML has them: the scanner
    is most of the cost of reading a file in Python (~4x). The composer stays PyYAML's Python
    one: libyaml's composer recurses in C and crashes the process on a deeply nested document,
    and the Python one is where the document's size and depth are bounded (``BoundedComposer``)."""
    try:
        from yaml._yaml import CParser
    except ImportError:  # PyYAML built without libyaml
        return _PySafeLoader

    class CSafeParserLoader(BoundedComposer, CParser, SafeConstructor, Resolver):
        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            BoundedComposer.__init__(self)
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
    """Parse one Compose YAML document (anchors and merge keys resolved); a document that is
    not YAML, or is over ``MAX_YAML_NODES`` / ``MAX_YAML_DEPTH``, is a one-line
    ``NormalizeError`` naming the line and column."""
    try:
        return yaml.load(text, Loader=ComposeLoader)  # noqa: S506 - ComposeLoader is a SafeLoader
    except YAMLRefused as exc:
        raise NormalizeError(f"{_at(name, exc.problem_mark)}: {exc.problem}") from None
    except yaml.MarkedYAMLError as exc:
        problem = " ".join(str(exc.problem or exc.context or "not YAML").split())
        raise NormalizeError(f"{_at(name, exc.problem_mark)}: invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise NormalizeError(f"{name}: invalid YAML: {' '.join(str(exc).split())}") from None


def _at(name: str, mark: Mark | None) -> str:
    return f"{name}:{mark.line + 1}:{mark.column + 1}" if mark is not None else name


def read_source(path: Path, what: str = "compose file") -> str:
    """The text of a UTF-8 source file; unreadable or not UTF-8 is a one-line
    ``NormalizeError`` (naming the first invalid byte and its offset)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise NormalizeError(f"{path}: cannot read {what}: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NormalizeError(f"{path}: {what} is not UTF-8: byte 0x{data[exc.start]:02x} at "
                             f"offset {exc.start}") from None


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
    text = read_source(path, "env file")
    try:
        return parse_dotenv(text, environ)
    except NormalizeError as exc:  # its message names the variable: add the file
        raise NormalizeError(f"{path}: {exc}") from None


# --- interpolation ---------------------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Interpolator:
    """Compose variable interpolation: ``$$``, ``$VAR``, ``${VAR}``, ``${VAR:-d}``, ``${VAR-d}``,
    ``${VAR:?e}``, ``${VAR?e}``, ``${VAR:+r}``, ``${VAR+r}``; defaults may nest."""

    def __init__(self, variables: Mapping[str, str]):
        self.variables = variables
        #: Characters variables may still put into the document (``MAX_INTERPOLATED_CHARS``).
        self.budget = MAX_INTERPOLATED_CHARS
        #: Variables referenced without a value and without a default (Compose warns, uses "").
        self.missing: set[str] = set()

    def substitute(self, text: str, where: str = "") -> str:
        value, _ = self._parse(text, 0, where, stop=None)
        return value

    def _parse(
        self, text: str, pos: int, where: str, stop: str | None, depth: int = 0
    ) -> tuple[str, int]:
        if depth > MAX_INTERPOLATION_DEPTH:
            raise NormalizeError(f"{where}: variable defaults nested over "
                                 f"{MAX_INTERPOLATION_DEPTH} deep")
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
                value, pos = self._braced(text, pos + 2, where, depth)
                out.append(value)
            else:
                match = _NAME.match(text, pos + 1)
                if match is None:
                    out.append("$")  # a lone "$" stays literal
                    pos += 1
                else:
                    out.append(self._lookup(match.group(0), where))
                    pos = match.end()
        if stop is not None:
            raise NormalizeError(f"{where}: unterminated '${{' in {text!r}")
        return "".join(out), pos

    def _braced(self, text: str, pos: int, where: str, depth: int) -> tuple[str, int]:
        match = _NAME.match(text, pos)
        if match is None:
            raise NormalizeError(f"{where}: invalid interpolation format in {text!r}")
        name = match.group(0)
        pos = match.end()
        if pos < len(text) and text[pos] == "}":
            return self._lookup(name, where), pos + 1
        operator = ""
        for candidate in (":-", ":?", ":+", "-", "?", "+"):
            if text.startswith(candidate, pos):
                operator = candidate
                break
        if not operator:
            raise NormalizeError(f"{where}: invalid interpolation format in {text!r}")
        arg, end = self._parse(text, pos + len(operator), where, stop="}", depth=depth + 1)
        pos = end + 1
        is_set = name in self.variables
        is_nonempty = is_set and self.variables[name] != ""
        present = is_nonempty if operator.startswith(":") else is_set
        kind = operator[-1]
        if kind == "-":
            return (self._value(name, where) if present else arg), pos
        if kind == "+":
            return (arg if present else ""), pos
        if not present:  # "?": required
            message = arg or f"variable {name} is required"
            raise NormalizeError(f"{where}: required variable {name} is missing a value: {message}")
        return self._value(name, where), pos

    def _lookup(self, name: str, where: str) -> str:
        if name in self.variables:
            return self._value(name, where)
        self.missing.add(name)
        return ""

    def _value(self, name: str, where: str) -> str:
        value = self.variables[name]
        self.budget -= len(value)
        if self.budget < 0:
            raise NormalizeError(f"{where}: variables expand to over {MAX_INTERPOLATED_CHARS} "
                                 "characters: refused before expanding further")
        return value

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
