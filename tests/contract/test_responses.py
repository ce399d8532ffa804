"""Answers the fuzzer reaches only by luck, made on purpose through the checked client.

Every response below also passes tests/contract_hooks.py (status, content type, headers, body
against schemas/openapi.yaml); the assertions here pin the headers the description requires.
"""

from __future__ import annotations

from service.api.openapi import description
from tests.auth import bearer, login
from tests.contract_hooks import check_response
from tests.problems import assert_problem


async def test_login_throttle_is_a_described_429_with_retry_after(client):
    for _ in range(5):
        response = await client.post("/api/v1/authn/sessions",
                                     json={"subject_id": "carol", "password": "wrong"})
        await assert_problem(response, 401, "invalid_credentials")
        assert response.headers["WWW-Authenticate"].startswith("Bearer ")
    throttled = await client.post("/api/v1/authn/sessions",
                                  json={"subject_id": "carol", "password": "carol-dev-password"})
    await assert_problem(throttled, 429, "login_throttled")
    assert int(throttled.headers["Retry-After"]) >= 1


async def test_step_up_required_is_a_described_401_with_a_challenge(client):
    alice = await login(client, "alice")
    response = await client.post("/api/v1/installer/actions", headers=bearer(alice), json={
        "task_id": "t-1", "action": "installer.run.execute", "resource": "web", "env": "prod"})
    await assert_problem(response, 401, "step_up_required")
    assert 'error="insufficient_user_authentication"' in response.headers["WWW-Authenticate"]


async def test_wrong_method_is_a_described_405_with_allow(client):
    response = await client.put("/api/v1/approvals")
    await assert_problem(response, 405, "method_not_allowed")
    assert set(response.headers["Allow"].split(", ")) >= {"GET", "POST"}


async def test_legacy_shell_is_a_described_410(client):
    response = await client.post("/api/v1/aidb/query", json={"sql": "select 1"})
    await assert_problem(response, 410, "legacy_only")
    assert response.headers["Deprecation"].startswith("@") and "successor-version" in response.headers["Link"]


async def test_resource_outside_i_json_is_422_not_500(client):
    """Found by the fuzzer: RFC 8785 cannot hash integers beyond 2**53 - 1 (was a 500). The body
    reader now refuses them in every body (service/limits.py), with where."""
    alice = await login(client, "alice")
    response = await client.post("/api/v1/installer/actions", headers=bearer(alice), json={
        "task_id": "t-1", "action": "installer.run.execute", "resource": {"n": 2**60}, "env": "dev"})
    body = await assert_problem(response, 422, "invalid_number")
    assert body["errors"][0]["pointer"] == "/resource/n"


async def test_foreign_cursor_is_422_not_500(client):
    """Found by the fuzzer: a cursor the store cannot decode was a 500."""
    bob = await login(client, "bob")
    response = await client.get("/api/v1/approvals?cursor=s0j:Xbed", headers=bearer(bob))
    await assert_problem(response, 422, "invalid_query")


async def test_event_stream_carries_the_correlation_id(client):
    """Found by the response checks: the SSE response was prepared before the correlation
    middleware could add X-Correlation-ID."""
    alice = await login(client, "alice")
    await client.post("/api/v1/installer/actions", headers=bearer(alice), json={
        "task_id": "t-2", "action": "installer.run.execute", "resource": "web", "env": "dev"})
    response = await client.get("/api/v1/tasks/t-2/events",
                                headers=bearer(alice, Accept="text/event-stream",
                                               **{"X-Correlation-ID": "sse-1"}))
    assert response.status == 200
    assert response.headers["X-Correlation-ID"] == "sse-1"
    response.close()


def test_the_checker_rejects_what_the_description_does_not_say():
    headers = {"X-Correlation-ID": "c-1", "Content-Type": "application/json"}
    assert check_response("GET", "/healthz", 200, headers, "application/json", b'{"status":"ok"}') == []
    assert check_response("GET", "/healthz", 200, headers, "application/json", b'{"status":"up"}')
    assert check_response("GET", "/healthz", 201, headers, "application/json", b'{"status":"ok"}')
    assert check_response("GET", "/healthz", 200, {}, "application/json", b'{"status":"ok"}')
    assert check_response("GET", "/api/v1/system/info", 404, headers, "text/plain", b"nope")
    # Private routes a test adds are for the parity test to judge, not this checker.
    assert check_response("POST", "/api/v1/_probe", 200, {}, "text/plain", b"") == []
    assert "paths" in description()
