"""Property: whatever the policy answers, no production mutation executes without a consumed,
bound, approved ticket and a fresh step-up; and every chain run writes exactly one audit record.

The policy's output for the installer action is drawn by Hypothesis (any of the three decisions,
any reasons, any approval object), so the chain's own enforcement is what is being tested; the
store, the tokens, the tickets and the HTTP stack are the real ones.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.approvals.binding import resource_hash
from service.approvals.command import command_hash
from service.authz.decision import Decision
from service.authz.engine import ENGINE
from service.storelink import STORE
from tests.auth import bearer, login, step_up

RESOURCE = {"app": "web", "version": "3.0.0"}
OTHER = {"app": "web", "version": "6.6.6"}

decisions = st.builds(
    lambda value, reasons, approval: Decision(
        value, tuple(reasons) or ("drawn",),
        MappingProxyType(approval if value == "require_approval" else {}), "drawn-revision"),
    st.sampled_from(["allow", "deny", "require_approval"]),
    st.lists(st.sampled_from(["role:operator", "no_grant", "x", "prod"]), max_size=3),
    st.fixed_dictionaries({}, optional={"quorum": st.integers(1, 3),
                                        "step_up": st.booleans(), "ttl_s": st.integers(30, 900)}),
)
scenarios = st.fixed_dictionaries({
    "decision": decisions,
    "caller": st.sampled_from(["alice-stepped", "alice-plain", "carol", "agent-7", "ci-bot"]),
    "env": st.sampled_from(["dev", "staging", "prod"]),
    "ticket": st.sampled_from(["none", "approved", "approved-other-resource", "wrong-nonce",
                               "pending", "consumed", "only-id"]),
    "body_resource": st.sampled_from(["same", "other"]),
    "command": st.sampled_from([None, "deploy web"]),
})


class World:
    """Tokens and ticket factories for one app; built once per test, used by every example."""

    def __init__(self, client: Any):
        self.client = client
        self.tokens: dict[str, str] = {}
        self.n = 0

    async def setup(self) -> None:
        alice = await login(self.client, "alice")
        self.tokens["alice-plain"] = alice
        self.tokens["alice-stepped"] = await step_up(self.client, await login(self.client, "alice"),
                                                     "alice")
        self.tokens["bob"] = await step_up(self.client, await login(self.client, "bob"), "bob")
        for subject in ("carol", "agent-7", "ci-bot"):
            self.tokens[subject] = await login(self.client, subject)

    async def ticket(self, kind: str, env: str, command: str | None) -> dict[str, Any] | None:
        if kind == "none":
            return None
        body: dict[str, Any] = {
            "subject_id": "alice", "env": env, "action": "installer.run.execute",
            "resource": OTHER if kind == "approved-other-resource" else RESOURCE,
        }
        if command:
            body["command_hash"] = command_hash(command)
        # A ticket is only issued where the policy asks for one: ask for one in every env here,
        # so that tickets exist for whatever decision the run itself draws.
        engine = self.client.server.app[ENGINE]
        real_decide = engine.decide

        def needs_ticket(doc: dict[str, Any], **kwargs: Any) -> Decision:
            if doc["action"] == "installer.run.execute":
                return Decision("require_approval", ("test",), MappingProxyType({}), "test")
            return real_decide(doc, **kwargs)

        engine.decide = needs_ticket  # type: ignore[method-assign]
        try:
            response = await self.client.post("/api/v1/approvals", json=body,
                                              headers=bearer(self.tokens["alice-stepped"]))
        finally:
            engine.decide = real_decide  # type: ignore[method-assign]
        assert response.status == 201, await response.text()
        ticket = await response.json()
        if kind != "pending":
            review = await self.client.post(f"/api/v1/approvals/{ticket['id']}/reviews",
                                            json={"decision": "approve"},
                                            headers=bearer(self.tokens["bob"]))
            assert review.status == 200, await review.text()
        if kind == "consumed":
            store = self.client.server.app[STORE].require()
            stored = await store.get_ticket(ticket["id"])
            await store.consume_ticket(
                stored.id, nonce_hash=stored.nonce_hash, subject_id="alice", env=env,
                action="installer.run.execute", resource_hash=stored.resource_hash,
                command_hash=stored.command_hash, now=stored.approved_at + 1, correlation_id="pre")
        if kind == "wrong-nonce":
            ticket["nonce"] = "W" * 43
        return ticket


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(scenario=scenarios)
async def test_no_prod_mutation_without_consumed_bound_ticket_and_step_up(client, scenario):
    world = getattr(client, "_world", None)
    if world is None:
        world = client._world = World(client)
        await world.setup()
    engine = client.server.app[ENGINE]
    real_decide = engine.decide
    drawn: Decision = scenario["decision"]

    def decide(doc: dict[str, Any], **kwargs: Any) -> Decision:
        return drawn if doc["action"] == "installer.run.execute" else real_decide(doc, **kwargs)

    env = scenario["env"]
    ticket = await world.ticket(scenario["ticket"], env, scenario["command"])
    world.n += 1
    task_id = f"prop-{world.n}"
    headers = bearer(world.tokens[scenario["caller"]])
    if ticket is not None:
        headers["Approval-Ticket"] = ticket["id"]
        if scenario["ticket"] != "only-id":
            headers["Approval-Nonce"] = ticket["nonce"]
    if scenario["command"]:
        headers["Command-Hash"] = command_hash(scenario["command"])
    body = {"task_id": task_id, "action": "installer.run.execute", "env": env,
            "resource": RESOURCE if scenario["body_resource"] == "same" else OTHER}

    store = client.server.app[STORE].require()
    head_before, _ = await store.audit_head()
    engine.decide = decide  # type: ignore[method-assign]
    try:
        response = await client.post("/api/v1/installer/actions", json=body, headers=headers)
    finally:
        engine.decide = real_decide  # type: ignore[method-assign]
    head_after, _ = await store.audit_head()
    assert response.status != 500, await response.text()

    # Every run: exactly one audit record, and it is this run's.
    assert head_after == head_before + 1
    record = (await store.audit_range(head_before, 1))[0]
    assert record.entry["correlation_id"] == response.headers["X-Correlation-ID"]

    executed = response.status == 202
    assert executed == (record.entry["outcome"] == "executed")
    task = await store.get_task(task_id)
    assert (task is not None) == executed
    if drawn.decision == "deny":
        assert not executed
    if executed and env == "prod":
        # Hard rule 1: the presented ticket was approved, bound to exactly this request, and is
        # now consumed by this request; and the caller had a fresh step-up.
        assert ticket is not None and scenario["ticket"] in ("approved", "approved-other-resource")
        stored = await store.get_ticket(ticket["id"])
        assert stored.state == "consumed"
        assert stored.consumed_correlation_id == response.headers["X-Correlation-ID"]
        assert stored.subject_id == "alice" and stored.env == "prod"
        assert stored.resource_hash == resource_hash(body["resource"])
        assert stored.command_hash in (None, headers.get("Command-Hash"))
        assert scenario["caller"] == "alice-stepped"
        assert record.entry["ticket_id"] == ticket["id"] and record.entry["ticket_consumed"]
    if not executed and ticket is not None and scenario["ticket"] in (
            "approved", "approved-other-resource"):
        # A refused run consumes nothing.
        assert (await store.get_ticket(ticket["id"])).state == "approved"
