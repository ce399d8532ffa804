"""audit.record: sealing the stored text (the fast path) gives the definition's hash, and the
definition's verification does not take a stored text's word for it."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import rfc8785
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from service import canonical
from service.audit.record import seal, verify
from service.limits import JSONValueRefused
from service.store.base import AUDIT_GENESIS_HASH, AuditRecord
from service.store.sql.core import dump_json

_TEXT = st.text(alphabet=st.characters(min_codepoint=1, max_codepoint=0x10FFFF,
                                       blacklist_categories=("Cs",)), max_size=6)
_SCALARS = st.one_of(st.none(), st.booleans(), _TEXT,
                     st.integers(min_value=-(2**60), max_value=2**60),
                     st.floats(allow_nan=False, allow_infinity=False))
_ENTRY = st.dictionaries(_TEXT, st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(_TEXT, inner, max_size=4)), max_leaves=12),
    max_size=6)


def _definition(seq: int, prev_hash: str, entry: dict) -> str:
    doc = {"seq": seq, "prev_hash": prev_hash, "entry": entry}
    return "sha256:" + hashlib.sha256(rfc8785.dumps(doc)).hexdigest()


@settings(max_examples=300, deadline=None)
@given(_ENTRY, st.integers(min_value=1, max_value=2**53 - 1))
@example({"at": 1764201600.25, "n": 1.0, "tiny": 1e-7, "huge": 1e21}, 7)  # JCS writes these
@example({"\U0001f600": 1, "\ue000": 2}, 3)  # UTF-16 key order differs from code points
@example({"big": 2**53}, 2)  # beyond JCS's integers: refused either way
def test_sealing_the_stored_text_is_sealing_the_entry(entry, seq):
    try:
        text = dump_json(entry)
    except JSONValueRefused:
        assume(False)
    stored = json.loads(text)  # what the store reads back
    prev = "sha256:" + "ab" * 32
    try:
        expected = _definition(seq, prev, stored)
    except Exception as exc:  # what JCS cannot express is refused by both
        try:
            seal(seq, prev, stored, text)
        except Exception as mine:
            assert type(mine) is type(exc)
            return
        raise AssertionError("seal accepted what RFC 8785 refuses") from None
    fast = text if canonical.is_canonical(stored, text) else None  # as the store passes it
    assert seal(seq, prev, stored, fast) == expected == seal(seq, prev, stored)


def test_the_definition_does_not_take_a_non_canonical_stored_text_at_its_word():
    """A record edited into a non-canonical text, its hash taken over those bytes: the tip's
    fast check accepts the bytes (see ``verify``), ``cpctl audit verify`` reports it."""
    text = '{"status":200, "outcome":"executed"}'  # whitespace, keys unsorted
    entry = json.loads(text)
    forged = seal(1, AUDIT_GENESIS_HASH, entry, text)
    record = AuditRecord(seq=1, prev_hash=AUDIT_GENESIS_HASH, hash=forged, entry=entry, text=text)
    assert verify([record], stored_text=True) == (1, None)
    checked, broken = verify([record])
    assert checked == 0 and broken is not None and broken.reason == "hash_mismatch"
    canonical_text = dump_json(entry)
    honest = AuditRecord(seq=1, prev_hash=AUDIT_GENESIS_HASH, entry=entry, text=canonical_text,
                         hash=_definition(1, AUDIT_GENESIS_HASH, entry))
    assert verify([honest]) == verify([honest], stored_text=True) == (1, None)


def test_the_tips_check_reads_only_the_stored_text():
    """The tip vouches for records read without decoding them (``entry`` empty): a canonical
    text verifies by its bytes, an honest non-canonical one (``1.0``: JCS writes ``1``) by its
    decoded entry, and an edited one does not verify."""
    prev = "sha256:" + "cd" * 32
    canonical_text = dump_json({"outcome": "executed", "status": 200})
    honest = '{"n":1.0}'  # what dump_json writes for 1.0; its RFC 8785 form is {"n":1}
    records = [
        AuditRecord(seq=5, prev_hash=prev, entry={}, text=canonical_text,
                    hash=_definition(5, prev, json.loads(canonical_text))),
    ]
    records.append(AuditRecord(seq=6, prev_hash=records[0].hash, entry={}, text=honest,
                               hash=_definition(6, records[0].hash, {"n": 1.0})))
    assert verify(records, start=(4, prev), stored_text=True) == (2, None)
    for edited in ('{"n":2.0}', '{"m":1.0}', "not json"):
        changed = [records[0], dataclasses.replace(records[1], text=edited)]
        checked, broken = verify(changed, start=(4, prev), stored_text=True)
        assert checked == 1 and broken is not None and (broken.seq, broken.reason) == (6, "hash_mismatch")
