"""``service.schema_accept.accepts``, which ``service.schemas.validate`` asks before jsonschema,
says "valid" only where jsonschema finds no violation, for every request body schema: real
bodies as they are and mutated at random (every JSON type, edge strings for the patterns and
lengths, unknown keys, keys dropped). And it does say "valid" for the real bodies of the chain's
hot routes, so that they skip jsonschema's walk."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from service.schema_accept import SCHEMA_DIR, accepts
from service.schemas import validator
from tests.documents import places

HASH = "sha256:" + "a" * 64
#: Real bodies per schema (the fast path must take every one of them).
BODIES: dict[str, list[dict[str, Any]]] = {
    "installer-action.schema.json": [
        {"task_id": "t-1", "action": "installer.run.execute", "resource": {"app": "web"},
         "env": "prod"},
        {"task_id": "T.9:x", "action": "installer.run.execute", "resource": "web@1.2.3",
         "env": "dev", "correlation_id": "c-1"},
    ],
    "approval-request.schema.json": [
        {"subject_id": "alice", "env": "prod", "action": "installer.run.execute",
         "resource": {"app": "web", "version": "1.2.3"}},
        {"subject_id": "ci@corp", "env": "prod", "action": "installer.run.execute",
         "resource": "web", "resource_hash": HASH, "command": ["deploy", "--now"],
         "command_hash": HASH, "reason": "release", "ttl_s": 600},
        {"subject_id": "bob", "env": "staging", "action": "databases.list",
         "resource": {"collection": "databases"}, "command": "ls -l", "command_hash": None},
    ],
    "approval-review.schema.json": [{"decision": "approve"},
                                    {"decision": "reject", "reason": "no"}],
    "task-event.schema.json": [{"kind": "progress", "step": "pull", "progress": 40},
                               {"kind": "succeeded", "result": {"digest": HASH}}],
    "authn-step-up.schema.json": [{"otp": "123456"}],
}
HOSTILE: list[Any] = [
    None, True, False, 0, 1, -1, 29, 30, 86400, 86401, 1.0, 1.5, float("nan"), "", "x",
    "x" * 1001, "x" * 2001, "1\n", "123456\n", "١٢٣٤٥٦", "installer.run.execute\n",
    "installer.run.executE", "approve", "sha256:" + "A" * 64, HASH + "\n", "prod", "Prod",
    "a" * 33, [], ["a"], ["a"] * 1025, [None], [1], {}, {"a": 1}, {f"k{i}": i for i in range(65)},
]
KEYS = ["unknown", "env", "resource", "command", "ttl_s", "decision", "x-extra", ""]


def _valid(schema: str, doc: Any) -> bool:
    return not any(True for _ in validator(schema).iter_errors(doc))


def _mutate(doc: Any, rnd: random.Random) -> Any:
    doc = copy.deepcopy(doc)
    for _ in range(rnd.randint(1, 3)):
        found = places(doc)
        how = rnd.random()
        if how < 0.6 and found:
            *parent_path, key = rnd.choice(found)
            parent = doc
            for part in parent_path:
                parent = parent[part]
            if how < 0.15 and isinstance(parent, dict):
                del parent[key]
            else:
                parent[key] = copy.deepcopy(rnd.choice(HOSTILE))
        elif isinstance(doc, dict):
            doc[rnd.choice(KEYS)] = copy.deepcopy(rnd.choice(HOSTILE))
    return doc


@pytest.mark.parametrize("schema", sorted(BODIES))
def test_the_real_bodies_take_the_fast_path(schema: str) -> None:
    for body in BODIES[schema]:
        assert _valid(schema, body), body
        assert accepts(schema, body), body


@pytest.mark.parametrize("schema", sorted(p.name for p in SCHEMA_DIR.glob("*.schema.json")))
def test_accepts_only_what_jsonschema_accepts(schema: str) -> None:
    rnd = random.Random(schema)
    bases = BODIES.get(schema) or [{}]
    fast = 0
    for _ in range(400):
        doc = _mutate(rnd.choice(bases), rnd)
        if accepts(schema, doc):
            fast += 1
            assert _valid(schema, doc), doc
    for value in HOSTILE:
        if accepts(schema, value):
            assert _valid(schema, value), value
    if schema in BODIES:  # mutations that keep a body valid are still taken fast
        assert fast > 0


@pytest.mark.parametrize(("schema", "doc"), [
    ("task-event.schema.json", {"kind": "progress"}),  # if/then: progress needs its number
    ("installer-action.schema.json", {"task_id": "t", "action": "installer.run.executE",
                                      "resource": "r", "env": "dev"}),  # const
    ("installer-action.schema.json", {"task_id": "t", "action": "installer.run.execute",
                                      "resource": {}, "env": "dev"}),  # oneOf: no branch
    ("approval-request.schema.json", {"subject_id": "a", "env": "dev", "action": "a.b",
                                      "resource": "r", "command": []}),  # minItems
    ("policy-publish.schema.json", {"bundle": {"format": "controlplane-policy-bundle/1",
                                               "modules": {}, "data": {}},
                                    "signature": "x"}),  # minProperties
])
def test_what_the_new_keywords_refuse_is_refused(schema: str, doc: dict[str, Any]) -> None:
    assert not _valid(schema, doc)
    assert not accepts(schema, doc)
