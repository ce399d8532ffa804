"""A policy revision's source: the Rego modules and data files of a policies directory."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from service.rego import Module

__all__ = [
    "DATA_SUFFIXES",
    "Snapshot",
    "SourceError",
    "SourceLocation",
    "fingerprint",
    "locate_errors",
    "read_snapshot",
]

#: Data file suffixes read from ``<policies>/data/`` (YAML or JSON; one document per file).
DATA_SUFFIXES = (".yaml", ".yml", ".json")
#: The safe loader, in C where PyYAML has libyaml: the same documents and errors, and policy data
#: is parsed on every load and reload (the pure-Python parser was most of a revision's load).
_SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class SourceError(Exception):
    """The policies directory cannot be read: unreadable file, bad YAML/JSON, conflicting keys."""


@dataclass(frozen=True)
class Snapshot:
    """Everything one revision is built from, read at one moment, with its content hash."""

    modules: tuple[Module, ...]  # policy modules (not *_test.rego)
    test_modules: tuple[Module, ...]  # *_test.rego
    data: Mapping[str, Any]  # top-level keys of all data files, merged
    data_files: tuple[str, ...]
    revision: str = field(default="")

    @property
    def all_modules(self) -> tuple[Module, ...]:
        return self.modules + self.test_modules

    def to_json(self) -> str:
        """Serialised for the vetting subprocess (same content, same revision)."""
        return json.dumps(
            {
                "modules": [[m.name, m.source] for m in self.modules],
                "test_modules": [[m.name, m.source] for m in self.test_modules],
                "data": self.data,
                "data_files": list(self.data_files),
                "revision": self.revision,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Snapshot:
        doc = json.loads(text)
        return cls(
            modules=tuple(Module(n, s) for n, s in doc["modules"]),
            test_modules=tuple(Module(n, s) for n, s in doc["test_modules"]),
            data=doc["data"],
            data_files=tuple(doc["data_files"]),
            revision=doc["revision"],
        )


def _policy_files(policies_dir: Path) -> list[Path]:
    # Only the top level: policies/compose/ (and any other subdirectory) belongs to other engines.
    return sorted(p for p in policies_dir.glob("*.rego") if p.is_file())


def _data_files(data_dir: Path) -> list[Path]:
    if not data_dir.is_dir():
        return []
    return sorted(p for p in data_dir.iterdir() if p.is_file() and p.suffix in DATA_SUFFIXES)


def fingerprint(
    policies_dir: Path, data_dir: Path | None = None
) -> tuple[tuple[str, int, int], ...]:
    """(name, mtime_ns, size) of every file a revision reads: cheap change detection for polling."""
    data_dir = data_dir if data_dir is not None else policies_dir / "data"
    out = []
    for path in [*_policy_files(policies_dir), *_data_files(data_dir)]:
        try:
            st = path.stat()
        except OSError:
            continue  # removed between listing and stat: the next scan sees the new state
        out.append((str(path), st.st_mtime_ns, st.st_size))
    return tuple(out)


def read_snapshot(policies_dir: Path, data_dir: Path | None = None) -> Snapshot:
    """Read every ``*.rego`` in ``policies_dir`` and every data file in ``data_dir`` ."""
    data_dir = data_dir if data_dir is not None else policies_dir / "data"
    if not policies_dir.is_dir():
        raise SourceError(f"policies directory not found: {policies_dir}")
    modules: list[Module] = []
    tests: list[Module] = []
    digest = hashlib.sha256()
    for path in _policy_files(policies_dir):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SourceError(f"{path.name}: cannot read: {exc.__class__.__name__}") from None
        module = Module(path.name, text)
        (tests if path.name.endswith("_test.rego") else modules).append(module)
        _hash_part(digest, b"module", path.name, text.encode())
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    names: list[str] = []
    for path in _data_files(data_dir):
        try:
            raw = path.read_bytes()
            doc = json.loads(raw) if path.suffix == ".json" else yaml.load(raw, Loader=_SAFE_LOADER)  # noqa: S506 - safe
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise SourceError(f"data/{path.name}: cannot parse: {_short(exc)}") from None
        if doc is None:
            doc = {}
        if not isinstance(doc, dict):
            raise SourceError(f"data/{path.name}: top level must be a mapping")
        for key, value in doc.items():
            # Two files defining the same top-level key would make the result depend on file
            # order; refuse instead of guessing.
            if key in merged:
                raise SourceError(
                    f"data/{path.name}: key {key!r} already defined in data/{origin[key]}"
                )
            merged[key] = value
            origin[key] = path.name
        names.append(path.name)
        _hash_part(digest, b"data", path.name, raw)
    if not modules:
        raise SourceError(f"no policy modules (*.rego) in {policies_dir}")
    return Snapshot(
        tuple(modules), tuple(tests), merged, tuple(names), "sha256:" + digest.hexdigest()[:16]
    )


def _hash_part(digest: Any, kind: bytes, name: str, content: bytes) -> None:
    # Length-prefixed parts: no two different file sets can produce the same byte stream.
    for part in (kind, name.encode(), content):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


@dataclass(frozen=True)
class SourceLocation:
    """A compile error located in a module: file, 1-based line and column, message."""

    file: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.message}"


_ERROR = re.compile(r"\(error (\d+):")
_MSG = re.compile(r"\(errormsg (\d+):")


def locate_errors(message: str, modules: Mapping[str, str]) -> list[SourceLocation]:
    """Turn regopy's ``(error 6:b.rego|16|1 (errormsg 16:...))`` s-expressions into line/column.

    Strings in the s-expression are length-prefixed (``6:b.rego``); ``|16|1`` is a byte offset and
    length into that module's source, converted here against the source text.
    """
    out: list[SourceLocation] = []
    pos = 0
    while (m := _ERROR.search(message, pos)) is not None:
        n = int(m.group(1))
        name = message[m.end() : m.end() + n]
        rest = message[m.end() + n :]
        loc = re.match(r"\|(\d+)\|(\d+)", rest)
        offset = int(loc.group(1)) if loc else 0
        mm = _MSG.search(message, m.end() + n)
        text = "compile error"
        if mm is not None:
            k = int(mm.group(1))
            text = message[mm.end() : mm.end() + k]
        pos = mm.end() if mm else m.end() + n
        source = modules.get(name)
        if source is None:
            out.append(SourceLocation(name or "?", 0, 0, text))
            continue
        prefix = source.encode("utf-8")[:offset].decode("utf-8", errors="ignore")
        line = prefix.count("\n") + 1
        column = len(prefix) - (prefix.rfind("\n") + 1) + 1
        out.append(SourceLocation(name, line, column, text))
    return out
