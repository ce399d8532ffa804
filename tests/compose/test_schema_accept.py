"""``service.schema_accept.accepts`` never says "valid" where jsonschema (``service.schemas``)
finds a violation, and says it for every real request body (else the CLI pays jsonschema's
import for nothing): the examples' and the corpus's normalized fields, as they are and
mutated at random (wrong types, unknown and ``x-`` keys, values a pattern or a length refuses,
an ECMA-262 ``$`` / ``\\d`` case)."""

from __future__ import annotations

import copy
import functools
import random
from pathlib import Path
from typing import Any

import pytest

from service.compose.normalize import normalize_files
from service.schema_accept import accepts
from service.schemas import validator
from tests.compose.support import CORPUS, EXAMPLES
from tests.documents import places

SCHEMA = "compose-import.schema.json"
#: Replacement values: every JSON type, edge strings for the schema's patterns and lengths.
HOSTILE: list[Any] = [
    None, True, False, 0, 1, -1, 1.0, 1.5, 70000, float("nan"), float("inf"), "", "x", "x" * 5000,
    "1\n", "١٢", "80-",
    "on-failure:x", "10s\n", "x-y", "RWM", [], [1], ["a"], [None], {}, {"a": 1}, {"x-a": {}},
]
KEYS = ["x-ext", "unknown", "image", "ports", "1", "", "UPPER", "with space", "x-"]


@functools.cache
def bodies() -> list[dict[str, Any]]:
    env_files = {path: EXAMPLES / "interpolation.env" for path in sorted(EXAMPLES.glob("*.yaml"))}
    for path in sorted(CORPUS.glob("*.yaml")) if CORPUS.is_dir() else []:
        dotenv = CORPUS / "dotenv" / f"{path.stem}.env"
        env_files[path] = dotenv if dotenv.is_file() else Path("/dev/null")
    return [{"fields": normalize_files([path], environ={}, env_file=env_file), "strict": False,
             "env": "prod"} for path, env_file in env_files.items()]


def valid(body: Any) -> bool:
    """jsonschema's own answer (``schemas.validate`` asks ``accepts`` first: not a judge of it)."""
    return not any(True for _ in validator(SCHEMA).iter_errors(body))


def mutated(body: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    doc = copy.deepcopy(body)
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(places(doc))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        if isinstance(parent, dict) and rng.random() < 0.3:
            parent[rng.choice(KEYS)] = rng.choice(HOSTILE)  # a key beside it
        else:
            parent[path[-1]] = copy.deepcopy(rng.choice(HOSTILE))
    return doc


def test_every_real_body_is_accepted() -> None:
    for body in bodies():
        assert valid(body)
        assert accepts(SCHEMA, body), sorted(body["fields"]["services"])


@pytest.mark.parametrize("seed", range(2))
def test_accepts_only_what_jsonschema_accepts(seed: int) -> None:
    rng = random.Random(seed)
    accepted = refused = 0
    for body in bodies():
        for _ in range(8):
            doc = mutated(body, rng)
            if accepts(SCHEMA, doc):
                assert valid(doc), doc
                accepted += 1
            elif not valid(doc):
                refused += 1
    # both answers were exercised: valid mutations taken fast, invalid ones left to jsonschema
    assert accepted > 20 and refused > 200, (accepted, refused)


@pytest.mark.parametrize("body", [
    {"fields": {"services": {}}, "strict": 1},
    {"fields": {"services": {}}, "env": "prod\n"},  # ECMA-262 "$": end of input only
    {"fields": {"services": {"a": {"ports": [{"target": 80, "published": "١٢"}]}}}},
    {"fields": {"services": {"a": {"x-ext": 1}}}},
    {"fields": {"services": {}, "networks": {"n": {"x-a": 1}}}},
    {"fields": {"services": {"a b": {}}}},
    {"fields": {"services": {}}, "other": 1},
    {"fields": {}},
])
def test_refused_bodies_are_left_to_jsonschema(body: dict[str, Any]) -> None:
    assert not valid(body)
    assert not accepts(SCHEMA, body)


def test_unknown_keywords_are_never_taken_as_valid(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import service.schema_accept as sa

    (tmp_path / "t.json").write_text('{"type": "object", "unevaluatedProperties": false}')
    monkeypatch.setattr(sa, "SCHEMA_DIR", tmp_path)
    sa._schema.cache_clear()
    try:
        assert not accepts("t.json", {})
    finally:
        sa._schema.cache_clear()
