"""``Tip.advance`` moves the tip once per call, to where moving it record by record would: the
tip, and the heads it keeps vouched for, are those of the walk it replaced, for any records,
vouched heads and starting tip (generated), forged links included."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from service.audit.tip import Tip
from service.store.base import AuditRecord

HASHES = st.sampled_from(["h0", "h1", "h2", "h3"])  # few: links and forgeries both happen


def _record_by_record(tip: Tip, records: list[AuditRecord]) -> None:
    """The walk ``advance`` replaced: each record that links moves the tip at once."""
    for record in records:
        known = tip._known
        if known is None or record.seq <= known[0]:
            continue
        if (record.seq == known[0] + 1 and record.prev_hash == known[1]) or (
                tip._vouched.get(record.seq - 1) == record.prev_hash):
            tip._move((record.seq, record.hash))


def _tip(known: tuple[int, str] | None, vouched: dict[int, str]) -> Tip:
    tip = Tip(lambda _: None)
    if known is not None:
        tip.start(known)
    tip._vouched = dict(vouched)
    return tip


@settings(max_examples=400, deadline=None)
@given(known=st.none() | st.tuples(st.integers(0, 6), HASHES),
       vouched=st.dictionaries(st.integers(0, 12), HASHES, max_size=5),
       records=st.lists(st.builds(lambda seq, prev, digest: AuditRecord(seq, prev, digest, {}),
                                  st.integers(0, 12), HASHES, HASHES), max_size=8))
# A head vouched for at a seq the walk has just moved to, under another hash: once moved there,
# the walk forgot it, and a record linking onto it does not move the tip.
@example(known=(0, "h0"), vouched={1: "h2"},
         records=[AuditRecord(1, "h0", "h1", {}), AuditRecord(2, "h2", "h3", {})])
def test_the_tip_moves_as_the_record_by_record_walk_moved_it(known, vouched, records):
    records = sorted(records, key=lambda r: r.seq)  # a worker's commits come in chain order
    walked, advanced = _tip(known, vouched), _tip(known, vouched)
    _record_by_record(walked, records)
    advanced.advance(records)
    assert (advanced._known, advanced._vouched) == (walked._known, walked._vouched)


def test_a_batch_moves_the_tip_to_its_last_record_and_a_forged_link_stops_it():
    tip = _tip((3, "a"), {})
    tip.advance([AuditRecord(4, "a", "b", {}), AuditRecord(5, "b", "c", {}),
                 AuditRecord(6, "x", "d", {}), AuditRecord(7, "d", "e", {})])
    assert tip.known == (5, "c")
    vouched = _tip((3, "a"), {5: "v"})  # a head verified inside a transaction
    vouched.advance([AuditRecord(6, "v", "w", {}), AuditRecord(7, "w", "z", {})])
    assert vouched.known == (7, "z") and vouched._vouched == {}
