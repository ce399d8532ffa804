"""``POST /api/v1/authn/token/renew`` through the running app: a person's renewal credential
buys new access tokens of the same live session, and nothing else."""

from __future__ import annotations

from typing import Any

from tests.auth import PASSWORDS, assertion, bearer, otp


async def renew(client, refresh_token: Any) -> tuple[int, dict[str, Any]]:
    response = await client.post("/api/v1/authn/token/renew", json={"refresh_token": refresh_token})
    return response.status, await response.json()


async def me(client, token: str) -> dict[str, Any]:
    response = await client.get("/api/v1/authn/sessions/current", headers=bearer(token))
    assert response.status == 200, await response.text()
    return dict(await response.json())


async def test_renewal_keeps_the_session_and_never_refreshes_a_step_up(client):
    response = await client.post("/api/v1/authn/sessions",
                                 json={"subject_id": "alice", "password": PASSWORDS["alice"]})
    login = await response.json()
    assert login["refresh_token"]
    status, renewed = await renew(client, login["refresh_token"])
    assert status == 201, renewed
    assert renewed["session_id"] == login["session_id"]
    assert renewed["access_token"] != login["access_token"]
    assert (await me(client, renewed["access_token"]))["step_up"]["verified"] is False

    # The credential is no access token, and an access token is no renewal credential.
    response = await client.get("/api/v1/authn/sessions/current",
                                headers=bearer(login["refresh_token"]))
    assert (response.status, (await response.json())["code"]) == (401, "token_type_mismatch")
    assert (await renew(client, login["access_token"]))[0] == 401

    # After a step-up: renewals carry the step-up as it was (the same time), a renewal with the
    # credential issued before it does not.
    response = await client.post("/api/v1/authn/step-up", headers=bearer(login["access_token"]),
                                 json={"otp": otp("alice", client.server.app)})
    stepped = await response.json()
    at = (await me(client, stepped["access_token"]))["step_up"]["at"]
    status, again = await renew(client, stepped["refresh_token"])
    assert status == 201
    step = (await me(client, again["access_token"]))["step_up"]
    assert step["verified"] is True and step["at"] == at
    status, old = await renew(client, login["refresh_token"])
    assert status == 201 and (await me(client, old["access_token"]))["step_up"]["verified"] is False

    # A logout ends every renewal at once.
    response = await client.delete("/api/v1/authn/sessions/current",
                                   headers=bearer(again["access_token"]))
    assert response.status == 204
    for credential in (login["refresh_token"], stepped["refresh_token"]):
        status, problem = await renew(client, credential)
        assert (status, problem["code"]) == (401, "session_revoked"), problem


async def test_services_get_no_renewal_and_bad_input_is_a_problem(client):
    response = await client.post("/api/v1/authn/sessions", json={"assertion": assertion("ci-bot")})
    assert response.status == 201 and "refresh_token" not in await response.json()
    for bad, expected in (("x.y.z", 401), ("", 422), (7, 422), ("a" * 9000, 422)):
        status, problem = await renew(client, bad)
        assert status == expected and problem["code"], (bad, problem)
    response = await client.post("/api/v1/authn/token/renew", json={})
    assert response.status == 422
