"""Hostile JSON input through every JSON endpoint of the real app (issue 13, items 1, 2 and 8).

Every body below is valid JSON (or so deep that no parser should be asked to hold it); each is
answered with a 422 and a stable code, never a 5xx, never a traceback in the logs, and nothing
is stored. The bounds live in ``service/limits.py``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service import schemas
from service.app import create_app
from service.approvals.binding import resource_hash
from service.chain import Outcome, Target, Write, protected
from service.limits import MAX_JSON_DEPTH, MAX_JSON_VALUE_BYTES
from service.storelink import STORE
from tests.auth import bearer, login, step_up
from tests.problems import assert_problem
from tests.store import pg
from tests.tickets import approved_ticket, audit_entries, ticket_headers

REPO = Path(__file__).resolve().parent.parent
HOSTILE = "@@HOSTILE@@"

# Raw JSON text of each hostile value, with the code that refuses it.
VALUES: dict[str, tuple[str, str]] = {
    "nesting-1000": ("[" * 1000 + "]" * 1000, "too_deep"),
    "objects-970": ('{"a":' * 970 + "1" + "}" * 970, "too_deep"),
    "integer-5000-digits": ("1" * 5000, "invalid_number"),
    "negative-integer-5000-digits": ("-" + "9" * 5000, "invalid_number"),
    "integer-beyond-i-json": (str(2**53), "invalid_number"),
    "float-overflow": ("1e400", "invalid_number"),
    "lone-high-surrogate": ('"a\\ud800b"', "invalid_string"),
    "lone-low-surrogate": ('"\\udc00"', "invalid_string"),
    "nul": ('"a\\u0000b"', "invalid_string"),
    "nul-in-key": ('{"a\\u0000": 1}', "invalid_string"),
    "surrogate-in-key": ('{"\\udfff": 1}', "invalid_string"),
    "too-large": (json.dumps("x" * (MAX_JSON_VALUE_BYTES + 1)), "too_large"),
}


class World:
    """The tokens and records the endpoints need, made once per app."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.tokens: dict[str, str] = {}
        self.ticket_id = ""

    async def setup(self) -> None:
        client = self.client
        self.tokens["alice"] = await login(client, "alice")
        self.tokens["bob"] = await step_up(client, await login(client, "bob"), "bob")
        self.tokens["ci-bot"] = await login(client, "ci-bot")
        started = await client.post("/api/v1/installer/actions", headers=bearer(self.tokens["alice"]),
                                    json={"task_id": "hostile-task", "action": "installer.run.execute",
                                          "resource": "web", "env": "dev"})
        assert started.status == 202, await started.text()
        created = await client.post("/api/v1/approvals", headers=bearer(self.tokens["alice"]), json={
            "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
            "resource": {"app": "web"}})
        assert created.status == 201, await created.text()
        self.ticket_id = (await created.json())["id"]

    async def snapshot(self) -> Any:
        """What the store holds that a request could add to: tickets, tasks, events."""
        store = self.client.server.app[STORE].require()
        tickets, _ = await store.list_tickets(limit=500)
        events = await store.list_events("hostile-task", 0, 1000)
        tasks = [await store.get_task(t) for t in ("hostile-task", "hostile-new")]
        return ([(t.id, t.state, len(t.reviews)) for t in tickets], [e.seq for e in events],
                [t.id for t in tasks if t is not None])


# (name, path, who, body template): the template's HOSTILE string is replaced by the raw value.
ENDPOINTS: list[tuple[str, Callable[[World], str], str | None, dict[str, Any]]] = [
    ("login", lambda w: "/api/v1/authn/sessions", None,
     {"subject_id": "alice", "password": HOSTILE}),
    ("step-up", lambda w: "/api/v1/authn/step-up", "alice", {"otp": HOSTILE}),
    ("installer", lambda w: "/api/v1/installer/actions", "alice",
     {"task_id": "hostile-new", "action": "installer.run.execute", "resource": {"x": HOSTILE},
      "env": "dev"}),
    ("compose", lambda w: "/api/v1/compose/import", "alice",
     {"fields": {"services": {}, "x-hostile": HOSTILE}, "env": "dev"}),
    ("approval-create", lambda w: "/api/v1/approvals", "alice",
     {"subject_id": "alice", "env": "prod", "action": "installer.run.execute",
      "resource": {"x": HOSTILE}, "reason": "hostile"}),
    ("approval-review", lambda w: f"/api/v1/approvals/{w.ticket_id}/reviews", "bob",
     {"decision": "approve", "reason": HOSTILE}),
    ("task-event", lambda w: "/api/v1/tasks/hostile-task/events", "ci-bot",
     {"kind": "progress", "progress": 1, "result": {"x": HOSTILE}}),
]


def render(template: dict[str, Any], raw_value: str) -> bytes:
    return json.dumps(template).replace(json.dumps(HOSTILE), raw_value).encode()


def assert_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    for record in caplog.records:
        assert record.exc_info is None, record.getMessage()
        assert record.levelno < logging.ERROR, record.getMessage()
    assert "Traceback" not in caplog.text


@pytest.fixture
async def world(client: Any) -> World:
    w = World(client)
    await w.setup()
    return w


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=[e[0] for e in ENDPOINTS])
async def test_every_json_endpoint_refuses_hostile_values(world, endpoint, caplog):
    _name, path, who, template = endpoint
    caplog.set_level(logging.DEBUG)
    before = await world.snapshot()
    headers = {"Content-Type": "application/json"}
    if who is not None:
        headers.update(bearer(world.tokens[who]))
    bodies = [(v, code, render(template, raw)) for v, (raw, code) in VALUES.items()]
    # The whole body as the hostile value (where the value is one the body may be).
    bodies.append(("body-nesting-1000", "too_deep", b"[" * 1000 + b"]" * 1000))
    for value, code, raw in bodies:
        response = await world.client.post(path(world), data=raw, headers=headers)
        assert response.status < 500, (value, await response.text())
        body = await assert_problem(response, 422, code)
        assert body["errors"], body
        if code != "too_deep":  # nesting is refused before parsing: the pointer is the document
            assert body["errors"][0]["pointer"].startswith("/"), (value, body)
        assert HOSTILE not in await response.text()
    assert await world.snapshot() == before
    assert_no_traceback(caplog)


async def test_a_deep_resource_is_refused_and_approval_reads_keep_working(world, caplog):
    """Item 1: a ~970-level resource was accepted (201) and then broke every approval read."""
    caplog.set_level(logging.DEBUG)
    alice, bob = world.tokens["alice"], world.tokens["bob"]
    deep = render({"subject_id": "alice", "env": "prod", "action": "installer.run.execute",
                   "resource": HOSTILE}, VALUES["objects-970"][0])
    refused = await world.client.post("/api/v1/approvals", data=deep,
                                      headers=bearer(alice, **{"Content-Type": "application/json"}))
    await assert_problem(refused, 422, "too_deep")
    for path in ("/api/v1/approvals", "/api/v1/approvals?state=pending",
                 f"/api/v1/approvals/{world.ticket_id}"):
        response = await world.client.get(path, headers=bearer(bob))
        assert response.status == 200, await response.text()
    assert_no_traceback(caplog)


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"a": value}
    return value


async def test_the_deepest_accepted_resource_can_be_stored_read_and_reviewed(world):
    """The body as a whole may nest MAX_JSON_DEPTH levels; one more is refused."""
    alice, bob = world.tokens["alice"], world.tokens["bob"]
    body = {"subject_id": "alice", "env": "prod", "action": "installer.run.execute",
            "resource": nested(MAX_JSON_DEPTH - 1)}
    created = await world.client.post("/api/v1/approvals", json=body, headers=bearer(alice))
    assert created.status == 201, await created.text()
    ticket = await created.json()
    assert ticket["resource_hash"] == resource_hash(body["resource"])
    for path in ("/api/v1/approvals", f"/api/v1/approvals/{ticket['id']}"):
        response = await world.client.get(path, headers=bearer(bob))
        assert response.status == 200, await response.text()
    review = await world.client.post(f"/api/v1/approvals/{ticket['id']}/reviews",
                                     json={"decision": "reject"}, headers=bearer(bob))
    assert review.status == 200, await review.text()
    body["resource"] = nested(MAX_JSON_DEPTH)
    refused = await world.client.post("/api/v1/approvals", json=body, headers=bearer(alice))
    await assert_problem(refused, 422, "too_deep")


# ----------------------------------------------------------------------- ids and control chars

CONTROL = ["\n", "\r", "\r\n", "\x00", "\t", "\x0b", "\x0c", "\x1b", "\x7f", "\u2028", "\x85"]


def _anchored_patterns() -> list[tuple[str, str]]:
    """(schema file, pattern) for every pattern anchored at both ends, in every schema."""
    found: list[tuple[str, str]] = []

    def walk(node: Any, name: str) -> None:
        if isinstance(node, dict):
            pattern = node.get("pattern")
            if isinstance(pattern, str) and pattern.startswith("^") and pattern.endswith("$"):
                found.append((name, pattern))
            for value in node.values():
                walk(value, name)
        elif isinstance(node, list):
            for value in node:
                walk(value, name)

    for path in sorted((REPO / "schemas").glob("*.json")):
        walk(json.loads(path.read_text()), path.name)
    return found


PATTERNS = _anchored_patterns()


def test_the_id_patterns_are_found():
    names = {p for _, p in PATTERNS}
    assert "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$" in names  # task_id
    assert "^sha256:[0-9a-f]{64}$" in names
    assert len(PATTERNS) >= 15


@pytest.mark.parametrize(("schema", "pattern"), PATTERNS, ids=[f"{s}:{p}" for s, p in PATTERNS])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_anchored_pattern_in_any_schema_accepts_a_control_character(schema, pattern, data):
    """Item 2: ``$`` matched before a final newline; the service's validator must not."""
    check = schemas.validator(schema).evolve(schema={"type": "string", "pattern": pattern})
    good = data.draw(st.from_regex(re.compile(pattern, re.ASCII), fullmatch=True)
                     .filter(lambda s: not any(c in s for c in CONTROL)), label="valid")
    assert check.is_valid(good), good
    control = data.draw(st.sampled_from(CONTROL), label="control")
    where = data.draw(st.sampled_from(["end", "start", "middle"]), label="where")
    bad = {"end": good + control, "start": control + good,
           "middle": good[:1] + control + good[1:]}[where]
    assert not check.is_valid(bad), repr(bad)


async def test_a_task_id_ending_in_a_newline_is_refused_and_consumes_nothing(client):
    """Item 2: a production task_id ending in a newline consumed the ticket and dropped the
    connection while building the Location header."""
    alice = await step_up(client, await login(client, "alice"), "alice")
    ticket = await approved_ticket(client, alice, resource={"app": "web"})
    response = await client.post("/api/v1/installer/actions", headers=ticket_headers(alice, ticket),
                                 json={"task_id": "t-1\n", "action": "installer.run.execute",
                                       "resource": {"app": "web"}, "env": "prod"})
    body = await assert_problem(response, 422, "schema_validation_failed")
    assert body["errors"][0]["pointer"] == "/task_id"
    store = client.server.app[STORE].require()
    assert (await store.get_ticket(ticket["id"])).state == "approved"
    assert await store.get_task("t-1\n") is None and await store.get_task("t-1") is None


async def _bad_location(run: Write) -> Outcome:
    await run.tx.ensure_task("probe-task", run.principal.subject_id, run.now)
    return Outcome(202, {"ok": True}, headers={"Location": "/api/v1/tasks/x\nSet-Cookie: a=b"})


async def _probe_target(request: web.Request, body: Any) -> Target:
    return Target(resource=body["resource"], env=body["env"], id=body["task_id"])


async def test_an_outcome_whose_headers_cannot_be_built_fails_before_commit(
        aiohttp_client, make_config, caplog):
    """Item 2: everything that can fail while building the answer fails before the commit: the
    ticket stays unconsumed, nothing is written, one audit record says "failed"."""
    app = create_app(make_config())
    handler = protected("installer.run.execute", target=_probe_target,
                        body="installer-action.schema.json")(_bad_location)
    app.router.add_post("/api/v1/_probe_location", handler)
    client = await aiohttp_client(app)
    alice = await step_up(client, await login(client, "alice"), "alice")
    ticket = await approved_ticket(client, alice, resource={"app": "web"})
    response = await client.post(
        "/api/v1/_probe_location", headers=ticket_headers(alice, ticket, **{"X-Correlation-ID": "probe-1"}),
        json={"task_id": "t-1", "action": "installer.run.execute", "resource": {"app": "web"},
              "env": "prod"})
    await assert_problem(response, 500, "internal_error")
    store = client.server.app[STORE].require()
    assert (await store.get_ticket(ticket["id"])).state == "approved"
    assert await store.get_task("probe-task") is None
    records = [e for e in await audit_entries(client) if e.get("correlation_id") == "probe-1"]
    assert len(records) == 1 and records[0]["outcome"] == "failed", records
    assert "ticket_consumed" not in records[0]


# ------------------------------------------------------------------------- the real PostgreSQL

@pytest.fixture
async def pg_client(make_client):
    async with pg.temp_schema("cp_hostile") as (dsn, schema):
        client = await make_client({"store": {"backend": "postgres",
                                              "postgres": {"dsn": dsn, "schema": schema}}})
        yield client
        await client.close()


async def test_nul_is_refused_before_postgresql_sees_it(pg_client, caplog):
    """Item 8: U+0000 in a stored value was a 500 from PostgreSQL (jsonb has no NUL)."""
    caplog.set_level(logging.DEBUG)
    world = World(pg_client)
    await world.setup()
    before = await world.snapshot()
    for _name, path, who, template in ENDPOINTS:
        for value in ("nul", "nul-in-key", "lone-high-surrogate"):
            headers = bearer(world.tokens[who]) if who else {}
            response = await pg_client.post(path(world), data=render(template, VALUES[value][0]),
                                            headers={**headers, "Content-Type": "application/json"})
            await assert_problem(response, 422, "invalid_string")
    assert await world.snapshot() == before
    assert_no_traceback(caplog)


async def test_the_store_itself_refuses_what_it_cannot_keep(pg_client):
    """The store's JSON serialiser enforces the same bounds (for values that did not come
    through the body reader): a refusal, not a driver error."""
    from service import limits
    from service.store.sql.core import dump_json

    for bad, refused in ((["a\0b"], limits.InvalidString), (["\ud800"], limits.InvalidString),
                         (nested(MAX_JSON_DEPTH + 1), limits.TooDeep), ([2**60], limits.InvalidNumber),
                         ("x" * (MAX_JSON_VALUE_BYTES + 1), limits.TooLarge)):
        with pytest.raises(refused):
            dump_json(bad)
        with pytest.raises(refused):
            resource_hash(bad)
    # On PostgreSQL the serialiser runs as asyncpg's jsonb codec: its refusal still surfaces as
    # the refusal (a 422 if it ever got this far), never as a store failure; nothing is written.
    store = pg_client.server.app[STORE].require()
    with pytest.raises(limits.InvalidString):
        async with store.transaction() as tx:
            await tx.ensure_task("pg-nul", "alice", 1.0)
            await tx.append_event("pg-nul", "progress", "alice", {"m": "a\0b"}, 1.0)
    assert await store.get_task("pg-nul") is None


_ANY_TEXT = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF,
                                           blacklist_categories=()), max_size=6)
_ANY_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), _ANY_TEXT, st.integers(min_value=-(2**64), max_value=2**64),
              st.floats(allow_nan=True, allow_infinity=True)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(_ANY_TEXT, inner, max_size=4)), max_leaves=20)


@settings(max_examples=400, deadline=None)
@given(_ANY_JSON)
def test_the_store_serialiser_checks_strings_on_its_text_as_the_walk_does(value):
    """dump_json leaves strings to the text it made (an escaped U+0000, no UTF-8 form) and walks
    them only then: it refuses exactly what the whole walk refuses and writes the same text
    otherwise (a value with one fault: the same refusal; with several, either one's). The
    text may spell a float below 1e-4 positionally (service.jsontext: ``1e-7`` for ``1e-07``),
    never another value."""
    from service import limits
    from service.store.sql.core import dump_json

    def walked(v):
        limits.check_json(v)
        text = json.dumps(v, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
        limits.check_size(len(text.encode("utf-8")))
        return text

    def outcome(fn, v):
        try:
            return fn(v)
        except limits.JSONValueRefused as exc:
            return type(exc)

    mine, theirs = outcome(dump_json, value), outcome(walked, value)
    if isinstance(mine, str) and isinstance(theirs, str) and mine != theirs:
        assert json.loads(mine) == json.loads(theirs)
        assert re.sub(r"[-+0-9.e]", "", mine) == re.sub(r"[-+0-9.e]", "", theirs)  # numbers only
    else:
        assert mine == theirs or (isinstance(mine, type) and isinstance(theirs, type))
    for v in ({"k\0": 1}, ["a\\u0000"], {"x": ["\ud800"]}, nested(MAX_JSON_DEPTH + 1)):
        assert outcome(dump_json, v) == outcome(walked, v)
