"""``AuditRecord.of`` makes the record ``AuditRecord(...)`` makes, without its ``__init__``."""

from __future__ import annotations

import dataclasses

import pytest

from service.store.base import AuditRecord


@pytest.mark.parametrize("text", [None, '{"n":1}'])
def test_of_is_the_dataclass_record_field_for_field(text: str | None) -> None:
    made = AuditRecord(seq=7, prev_hash="sha256:" + "0" * 64, hash="sha256:" + "1" * 64,
                       entry={"n": 1}, text=text)
    fast = AuditRecord.of(7, "sha256:" + "0" * 64, "sha256:" + "1" * 64, {"n": 1}, text)
    assert type(fast) is AuditRecord
    assert fast == made and repr(fast) == repr(made)
    assert list(vars(fast).items()) == list(vars(made).items())  # the same fields, in order
    assert [f.name for f in dataclasses.fields(AuditRecord)] == list(vars(fast))
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.seq = 8  # type: ignore[misc]
    assert dataclasses.replace(fast, seq=8).seq == 8
