"""The identity directory: who may authenticate, loaded from ``authn.identities`` (YAML).

Humans log in with a password (scrypt) and step up with TOTP; services and agents sign
assertions with an Ed25519 key. Roles are not here: they live in policy data (DESIGN §1 rule 2).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .. import schemas
from . import passwords, totp
from .keyring import load_public_key
from .principal import KINDS, Kind

__all__ = ["SCHEMA", "IdentitiesError", "Identity", "IdentityDirectory", "load", "parse"]

SCHEMA = "identities.schema.json"


class IdentitiesError(ValueError):
    """The identities file cannot be used; the message names the entry, never a secret."""


@dataclass(frozen=True, slots=True)
class Identity:
    subject_id: str
    kind: Kind
    display_name: str = ""
    password_hash: str | None = None
    totp_secret: str | None = None
    public_key: Ed25519PublicKey | None = None
    disabled: bool = False

    def __repr__(self) -> str:  # secrets stay out of logs and tracebacks
        return f"Identity({self.subject_id!r}, kind={self.kind!r}, disabled={self.disabled})"


class IdentityDirectory:
    """Identities by subject id, plus the dummy hash verified for unknown or disabled subjects."""

    def __init__(self, identities: list[Identity]) -> None:
        self._by_subject = {i.subject_id: i for i in identities}
        # Same scrypt cost as the real hashes, so a failed login takes as long either way.
        first = next((i.password_hash for i in identities if i.password_hash), None)
        self.dummy_password_hash = passwords.dummy_hash(first)

    def get(self, subject_id: str) -> Identity | None:
        return self._by_subject.get(subject_id)

    def active(self, subject_id: str) -> Identity | None:
        """The identity if it exists and is not disabled."""
        identity = self._by_subject.get(subject_id)
        return None if identity is None or identity.disabled else identity

    def public_key_for(self, subject_id: str) -> Ed25519PublicKey | None:
        """The key of an enabled service or agent (used to verify its assertions)."""
        identity = self.active(subject_id)
        if identity is None or identity.kind == "human":
            return None
        return identity.public_key

    def counts(self) -> dict[str, int]:
        """Enabled identities by kind (for status surfaces), plus ``disabled``."""
        counts: dict[str, int] = dict.fromkeys(KINDS, 0)
        counts["disabled"] = 0
        for identity in self._by_subject.values():
            counts["disabled" if identity.disabled else identity.kind] += 1
        return counts

    def __iter__(self) -> Iterator[Identity]:
        return iter(self._by_subject.values())

    def __len__(self) -> int:
        return len(self._by_subject)


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The safe loader (libyaml's where PyYAML has it: identities load at every start and
    reload) refusing duplicate mapping keys (a silently shadowed entry is a trap)."""


def _mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    keys = [loader.construct_object(k, deep=True) for k, _ in node.value]
    duplicates = [k for k, n in collections.Counter(map(str, keys)).items() if n > 1]
    if duplicates:
        raise IdentitiesError(f"duplicate key {duplicates[0]!r} at line {node.start_mark.line + 1}")
    mapping: dict[Any, Any] = loader.construct_mapping(node, deep=True)
    return mapping


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def parse(document: Any) -> IdentityDirectory:
    """Validate a document against ``schemas/identities.schema.json``; build the directory."""
    try:
        schemas.validate(SCHEMA, document)
    except schemas.ValidationFailed as exc:
        where = ", ".join(v.pointer or "/" for v in exc.violations[:5])
        raise IdentitiesError(f"identities do not match {SCHEMA} at {where}") from exc
    seen: set[str] = set()
    identities = []
    for index, entry in enumerate(document["identities"]):
        subject = entry["subject_id"]
        if subject in seen:
            raise IdentitiesError(f"/identities/{index}: duplicate subject_id {subject!r}")
        seen.add(subject)
        identities.append(_identity(index, entry))
    return IdentityDirectory(identities)


def _identity(index: int, entry: Mapping[str, Any]) -> Identity:
    where = f"/identities/{index} ({entry['subject_id']})"
    common = {
        "subject_id": entry["subject_id"],
        "kind": entry["kind"],
        "display_name": entry.get("display_name", ""),
        "disabled": bool(entry.get("disabled", False)),
    }
    if entry["kind"] == "human":
        try:
            passwords.parse_hash(entry["password_hash"])
        except passwords.InvalidHash as exc:
            raise IdentitiesError(f"{where}: password_hash: {exc}") from None
        secret = entry.get("totp_secret")
        if secret is not None:
            try:
                totp.decode_secret(secret)
            except totp.InvalidSecret as exc:
                raise IdentitiesError(f"{where}: totp_secret: {exc}") from None
        return Identity(**common, password_hash=entry["password_hash"], totp_secret=secret)
    try:
        key = load_public_key(entry["public_key"])
    except ValueError as exc:
        raise IdentitiesError(f"{where}: public_key: {exc}") from None
    return Identity(**common, public_key=key)


def load_document(path: Path) -> Any:
    """The YAML document at ``path`` (duplicate keys refused), not yet validated."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise IdentitiesError(f"cannot read identities file {path}: {exc.strerror}") from exc
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise IdentitiesError(f"identities file {path} is not valid YAML") from exc


def load(path: Path) -> IdentityDirectory:
    """Load and validate the identities file at ``path``."""
    return parse(load_document(path))
