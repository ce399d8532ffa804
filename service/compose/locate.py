"""Where a finding is in the compose files: a JSON pointer into the normalized fields -> the
file, line and column of the key (or list entry) it names in the YAML the user wrote.

The normalized fields are not the source (short syntax became long, ``mem_limit`` moved into
``deploy.resources``, several files were merged), so a pointer is followed through the YAML node
tree as far as the source has it:

- a mapping key is looked up directly, then in ``<<`` merge keys (anchors keep the position of
  the anchored text, which is where the setting is written);
- a list index selects the entry; in the list form of ``environment``/``labels``/... a key
  selects the ``KEY=value`` (or bare ``KEY``) entry;
- where the source stops (a setting that is missing, or that was spelled differently) the
  deepest node found is the location: the service for "no memory limit", the port entry for
  ``/ports/0/target``.

With several files (``-f a.yaml -f b.yaml``) each file is searched and the one that gets
deepest wins: on a tie the later file when it has the whole pointer (it overrides the earlier
ones), the earlier file when the setting is missing everywhere (where the service is
defined); an index into a list several files contribute to counts through their entries in
order. Nothing is interpolated or evaluated: this only reads positions, so it cannot fail on a
file that normalized.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from .source import ComposeLoader

__all__ = ["Location", "Locator"]

_DOTENV_KEY = re.compile(r"^\s*(export\s+)?([A-Za-z_][A-Za-z0-9_.-]*)\s*=")


@dataclass(frozen=True)
class Location:
    """1-based line and column of the node in ``file`` (as given on the command line)."""

    file: str
    line: int
    column: int


class Locator:
    """Compose files parsed once into YAML node trees; ``find(pointer)`` for each finding."""

    def __init__(self, files: Sequence[str | Path], *, dotenv: str | Path | None = None) -> None:
        self._roots: list[tuple[str, yaml.Node]] = []
        #: ``/.env/<name>`` pointers (secret-env's findings in the ``.env`` file): the line
        #: that sets ``name`` in ``dotenv``.
        self._dotenv: dict[str, Location] = {}
        if dotenv is not None:
            try:
                lines = Path(dotenv).read_text(encoding="utf-8").splitlines()
            except (OSError, UnicodeDecodeError):
                lines = []
            for number, line in enumerate(lines, 1):
                match = _DOTENV_KEY.match(line)
                if match is not None:  # the last assignment wins, as when the file is read
                    self._dotenv[match.group(2)] = Location(str(dotenv), number,
                                                            match.start(2) + 1)
        for name in files:
            try:
                text = Path(name).read_text(encoding="utf-8")
                root = yaml.compose(text, Loader=ComposeLoader)  # ComposeLoader is a SafeLoader
            except (OSError, UnicodeDecodeError, yaml.YAMLError):
                continue  # positions are a convenience: an unreadable file has none
            if root is not None:
                self._roots.append((str(name), root))

    def find(self, pointer: str) -> Location | None:
        """The location of ``pointer`` (RFC 6901, into the normalized fields), or ``None``."""
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:]]
        if len(tokens) == 2 and tokens[0] == ".env":
            return self._dotenv.get(tokens[1])
        if len(self._roots) > 1:
            merged = _merged_entry(self._roots, tokens)
            if merged is not None:
                return merged
        best: tuple[int, Location] | None = None
        for name, root in self._roots:
            depth, node, _ = _walk(root, tokens)
            if depth == 0 or node is None:
                continue
            # The whole pointer: the last file that sets it wins (it overrides the others).
            # Part of it (the setting is missing): the first file that gets as deep, which is
            # where the service is defined rather than where an override touches it.
            better = depth >= best[0] if best and depth == len(tokens) else (
                best is None or depth > best[0])
            if better:
                best = (depth, _location(name, node))
        return best[1] if best else None


def _location(name: str, node: yaml.Node) -> Location:
    return Location(name, node.start_mark.line + 1, node.start_mark.column + 1)


def _merged_entry(roots: list[tuple[str, yaml.Node]], tokens: list[str]) -> Location | None:
    """An index into a list that several files contribute to (``ports``, ``volumes``, ...):
    the merged list is the files' entries in order (Compose appends; an entry that replaces an
    earlier one with the same key shifts the count, which this does not model), so index ``i``
    past the first file's entries is an entry of a later file."""
    for depth, token in enumerate(tokens):
        if not token.isdigit():
            continue
        lists = []
        for name, root in roots:
            reached, _, stop = _walk(root, tokens[:depth])
            if reached == depth and isinstance(stop, yaml.SequenceNode):
                lists.append((name, stop))
        if len(lists) < 2:
            continue
        index = int(token)
        for name, sequence in lists:
            if index < len(sequence.value):
                item = sequence.value[index]
                rest, node, _ = _walk(item, tokens[depth + 1:])
                return _location(name, node if rest and node is not None else item)
            index -= len(sequence.value)
        return None
    return None


def _walk(root: yaml.Node, tokens: list[str]) -> tuple[int, yaml.Node | None, yaml.Node]:
    """How many tokens the source has, the node the last of them names, and the node the walk
    stopped in."""
    node: yaml.Node = root
    found: yaml.Node | None = None
    depth = 0
    for token in tokens:
        step = _child(node, token)
        if step is None:
            break
        found, node = step
        depth += 1
    return depth, found, node


def _child(node: yaml.Node, token: str) -> tuple[yaml.Node, yaml.Node] | None:
    """(the node to report, the node to descend into) for one pointer token."""
    if isinstance(node, yaml.MappingNode):
        return _key(node, token, set())
    if isinstance(node, yaml.SequenceNode):
        if token.isdigit():
            index = int(token)
            if index < len(node.value):
                item = node.value[index]
                return item, item
            return None
        for item in node.value:  # environment: [KEY=value] / labels: [key=value] / [KEY]
            if isinstance(item, yaml.ScalarNode) and isinstance(item.value, str):
                if item.value == token or item.value.startswith(token + "="):
                    return item, item
    return None


def _key(node: yaml.MappingNode, token: str, seen: set[int]) -> tuple[yaml.Node, yaml.Node] | None:
    if id(node) in seen:  # an alias cycle cannot happen in YAML, but never loop
        return None
    seen.add(id(node))
    merges: list[yaml.Node] = []
    for key, value in node.value:
        if not isinstance(key, yaml.ScalarNode):
            continue
        if key.tag == "tag:yaml.org,2002:merge" or key.value == "<<":
            merges.append(value)
        elif str(key.value) == token:
            return key, value
    for merged in merges:
        sources = merged.value if isinstance(merged, yaml.SequenceNode) else [merged]
        for source in sources:
            if isinstance(source, yaml.MappingNode):
                hit = _key(source, token, seen)
                if hit is not None:
                    return hit
    return None
