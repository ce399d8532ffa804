"""Audit records: canonical JSON (RFC 8785) and the SHA-256 hash chain over it.

``hash = sha256:hex(SHA-256(JCS({"seq", "prev_hash", "entry"})))``. Each record names the hash of
the one before it (the first names 64 zeros), so changing, removing or reordering any stored
record breaks every link after it; ``verify`` finds the first broken one.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from .. import canonical, jsontext
from ..limits import MAX_JSON_DEPTH, MAX_JSON_INTEGER, MAX_JSON_VALUE_BYTES, text_size
from ..redaction import SECRET_BY_NAME, is_secret_field
from ..store.base import AUDIT_GENESIS_HASH, AuditRecord, CheckedEntry

__all__ = ["Break", "prepare", "scrub", "seal", "verify"]



def seal(seq: int, prev_hash: str, entry: dict[str, Any], text: str | None = None) -> str:
    """The hash of record ``seq`` holding ``entry`` after ``prev_hash`` (the store's ``Seal``).

    ``text``: the entry's RFC 8785 form, where the caller has it: the store's text of the
    entry (``store.sql.dump_json``) when ``canonical.is_canonical`` says it is that form (every
    record the service writes, bar exotic floats and code points). The canonical document is
    then that text with the two other members around it (the keys sort as entry, prev_hash,
    seq), so the entry is not encoded again: the same bytes, hence the same hash, at a fraction
    of the cost (the appending worker seals each record once, and every other worker verifies
    it once).
    """
    if text is not None and type(seq) is int and -_MAX_SEQ <= seq <= _MAX_SEQ:
        prev = _json_string(prev_hash)
        if prev is not None:
            doc = f'{{"entry":{text},"prev_hash":{prev},"seq":{seq}}}'
            return "sha256:" + hashlib.sha256(doc.encode("utf-8")).hexdigest()
    full: dict[str, Any] = {"seq": seq, "prev_hash": prev_hash, "entry": entry}
    return "sha256:" + hashlib.sha256(canonical.dumps(full)).hexdigest()


#: ``seal``'s entry where it hashes the text it is given (it reads the entry only without one).
_NOT_READ: dict[str, Any] = {}


def _decoded(text: str) -> Any:
    """A stored text's entry; a text that is not JSON seals as itself (it cannot verify)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _json_string(value: Any) -> str | None:
    """``value``'s canonical JSON text when it is a string of printable ASCII (a hash: no escape
    to write), else None."""
    if type(value) is str and value.isascii() and value.isprintable() and '"' not in value \
            and "\\" not in value:
        return f'"{value}"'
    return None


#: JCS writes integers up to 2**53 - 1 as such (``canonical``).
_MAX_SEQ = 2**53 - 1


def scrub(entry: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``entry`` without credential-bearing keys, at any depth."""
    scrubbed: dict[str, Any] = _scrub(entry)
    return scrubbed


def _scrub(value: Any) -> Any:
    if isinstance(value, dict):
        # Never stored, whatever a caller passes: audit is read by many, and a token, password,
        # OTP or nonce in it would be a credential leak.
        out = {}
        for k, v in value.items():
            secret = SECRET_BY_NAME.get(k)
            if secret is None:
                secret = is_secret_field(k)
            if not secret:
                kind = type(v)  # the common leaves, without a call each
                leaf = kind is str or kind is int or v is None or kind is bool or kind is float
                out[k] = v if leaf else _scrub(v)
        return out
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value


def prepare(entry: dict[str, Any], known: AbstractSet[str] = frozenset()) -> dict[str, Any]:
    """``scrub(entry)``, with its stored text made and checked in the same walk where the entry
    holds only JSON's own types (a ``CheckedEntry``: the store takes its text and canonical
    flag instead of walking the entry twice more, for its bounds and for the canonical check).

    The one walk decides exactly what ``store.sql.dump_json`` and ``canonical.is_canonical``
    would of the scrubbed copy; anything else (another type, a value out of bounds, a text
    that is not plain UTF-8 or too large) gets the plain ``scrub``, so the store checks it, and
    refuses it, as before (``tests/audit/test_prepare.py`` holds the two equal).

    ``known``: top-level members whose values the caller made itself of what the walk would
    pass as they are and call plain (the chain's own members, ``audit.recording.OWN``):
    strings, booleans, None, integers within ``MAX_JSON_INTEGER``, and dicts and lists of them
    no deeper than ``MAX_JSON_DEPTH``, no secret-named key at any depth, no float. They are
    copied, not walked (their strings are still checked in the text, as every other string
    is); every other member is walked. On the authorized read every member is the chain's,
    and the walk was two thirds of this function."""
    try:
        walked = entry.keys() - known if known else None
        if walked is None:
            copy, plain = _checked_copy(entry, 1)
        elif walked:
            copy, plain = _checked_members(entry, walked)
        else:
            copy, plain = dict(entry), True
    except _Unusual:
        return scrub(entry)
    text = jsontext.compact_sorted(copy)
    size = text_size(text)
    if size is None or size > MAX_JSON_VALUE_BYTES:
        return scrub(entry)
    checked = CheckedEntry(copy)
    checked.text = text
    checked.canonical = plain and canonical.below_surrogates(text)
    return checked


class _Unusual(Exception):
    """Not for ``prepare``'s walk: the general path decides."""


def _checked_copy(value: dict[str, Any], depth: int) -> tuple[dict[str, Any], bool]:
    """``_scrub(value)`` of a dict of JSON's own types within ``service.limits`` (else
    ``_Unusual``), and whether all of it is canonical's plain kind (``canonical._plain``)."""
    if depth > MAX_JSON_DEPTH:
        raise _Unusual
    out: dict[str, Any] = {}
    plain = True
    for k, v in value.items():
        if type(k) is not str:
            raise _Unusual
        secret = SECRET_BY_NAME.get(k)
        if secret is None:
            secret = is_secret_field(k)
        if secret:
            continue
        kind = type(v)
        if kind is str or v is None or kind is bool:
            out[k] = v
        elif kind is int:
            if not -MAX_JSON_INTEGER <= v <= MAX_JSON_INTEGER:
                raise _Unusual
            out[k] = v
        elif kind is dict:
            out[k], fits = _checked_copy(v, depth + 1)
            plain = plain and fits
        else:
            out[k], fits = _checked_item(v, depth + 1)
            plain = plain and fits
    return out, plain


def _checked_members(entry: dict[str, Any], walked: AbstractSet[Any]) -> tuple[dict[str, Any], bool]:
    """``_checked_copy(entry, 1)`` where only the members ``walked`` are checked (``prepare``'s
    ``known``: the others are taken as they are), in ``entry``'s order."""
    out: dict[str, Any] = {}
    plain = True
    for k, v in entry.items():
        if k in walked:
            checked, fits = _checked_copy({k: v}, 1)
            out.update(checked)
            plain = plain and fits
        else:
            out[k] = v
    return out, plain


def _checked_item(value: Any, depth: int) -> tuple[Any, bool]:
    """``_checked_copy`` for a value that is not a dict key's common leaf."""
    kind = type(value)
    if kind is str or value is None or kind is bool:
        return value, True
    if kind is int:
        if not -MAX_JSON_INTEGER <= value <= MAX_JSON_INTEGER:
            raise _Unusual
        return value, True
    if kind is float:
        if not math.isfinite(value):
            raise _Unusual
        return value, canonical.float_fits(value)
    if kind is dict:
        return _checked_copy(value, depth)
    if kind is list:
        if depth > MAX_JSON_DEPTH:
            raise _Unusual
        items, plain = [], True
        for item in value:
            copied, fits = _checked_item(item, depth + 1)
            items.append(copied)
            plain = plain and fits
        return items, plain
    raise _Unusual


@dataclass(frozen=True)
class Break:
    """The first record whose link or hash does not verify."""

    seq: int
    # Of the chain: hash_mismatch | prev_hash_mismatch | seq_gap | missing | head_mismatch;
    # unsealed (acknowledged records staged long ago and still not chained: ``audit.log``).
    # Against signed checkpoints and anchors (``audit.checkpoint``): checkpoint_mismatch,
    # checkpoint_beyond_end, bad_signature, unknown_key, anchor_mismatch, anchor_beyond_end,
    # anchor_bad_signature, anchor_unknown_key, checkpoint_missing (an anchor shows a signed
    # checkpoint no longer stored); against the mirror's records: mirror_mismatch,
    # mirror_beyond_end.
    reason: str
    detail: str = ""

    def __str__(self) -> str:
        text = f"record {self.seq}: {self.reason}"
        return f"{text} ({self.detail})" if self.detail else text


def verify(
    records: Iterable[AuditRecord], *, start: tuple[int, str] = (0, AUDIT_GENESIS_HASH),
    stored_text: bool = False,
) -> tuple[int, Break | None]:
    """Walk ``records`` (ascending seq) from ``start``; return (records checked, first break).

    ``stored_text``: hash each record's stored text as it is (``seal``), without decoding or
    encoding its entry; only a record whose hash differs is decoded from that text and sealed
    by the definition (an honest record whose stored text is not its entry's RFC 8785 form:
    exotic floats or code points). A text edited into a non-canonical form of some entry, with
    its hash taken over those bytes, then verifies; by the definition (the default, ``cpctl
    audit verify``) it does not. Only for the worker's tip (``audit.tip``), where that changes
    nothing: whoever can write such a record past the newest signature can write a canonical one
    too, and a signed record's bytes cannot be changed without changing its hash. So the tip
    reads records without decoding them (``store.sql.audit``: their ``entry`` is left empty)."""
    expected_seq, prev = start[0] + 1, start[1]
    checked = 0
    for record in records:
        if record.seq != expected_seq:
            return checked, Break(expected_seq, "seq_gap")
        if record.prev_hash != prev:
            return checked, Break(record.seq, "prev_hash_mismatch")
        text = record.text if stored_text else None
        if text is None:
            if seal(record.seq, record.prev_hash, record.entry) != record.hash:
                return checked, Break(record.seq, "hash_mismatch")
        elif seal(record.seq, record.prev_hash, _NOT_READ, text) != record.hash and seal(
                record.seq, record.prev_hash, _decoded(text)) != record.hash:
            return checked, Break(record.seq, "hash_mismatch")
        checked += 1
        prev = record.hash
        expected_seq += 1
    return checked, None
