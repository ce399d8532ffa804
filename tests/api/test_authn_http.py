"""AuthN over HTTP: login paths, generic failures, step-up, revocation across app instances."""

from __future__ import annotations

import base64
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from service.app import create_app
from service.config import CONFIG
from tests.auth import assertion, bearer, login, otp, step_up
from tests.problems import assert_problem


def claims(token: str) -> dict:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


@pytest.mark.parametrize("subject", ["alice", "bob", "carol", "ci-bot", "agent-7"])
async def test_every_dev_identity_logs_in(client, subject):
    token = await login(client, subject)
    me = await (await client.get("/api/v1/authn/sessions/current", headers=bearer(token))).json()
    assert me["subject_id"] == subject
    assert me["kind"] == {"ci-bot": "service", "agent-7": "agent"}.get(subject, "human")
    assert set(me) == {"subject_id", "kind", "session_id", "auth_time", "authn_method", "step_up",
                       "roles", "groups"}
    # The roles and reviewer groups the serving policy data gives them (never from the token).
    assert me["roles"] == {"alice": ["operator"], "bob": ["approver"], "carol": ["viewer"],
                           "ci-bot": ["ci"], "agent-7": ["agent"]}[subject]
    assert me["groups"] == {"bob": ["sre-approvers"], "alice": ["payments-team"]}.get(subject, [])


async def test_tokens_carry_no_authorization_state(client):
    for subject in ("alice", "ci-bot"):
        token = await login(client, subject)
        if subject == "alice":
            token = await step_up(client, token, "alice")
        body = claims(token)
        assert not {"roles", "role", "groups", "grants", "scope", "permissions"} & set(body)
        assert {"iss", "aud", "sub", "sid", "kind", "iat", "nbf", "exp", "jti", "auth_time"} <= set(body)
        assert body["exp"] - body["iat"] <= 900


async def test_wrong_password_and_unknown_user_are_answered_identically(client):
    wrong = await client.post("/api/v1/authn/sessions",
                              json={"subject_id": "alice", "password": "nope"})
    unknown = await client.post("/api/v1/authn/sessions",
                                json={"subject_id": "mallory", "password": "nope"})
    a = await assert_problem(wrong, 401, "invalid_credentials")
    b = await assert_problem(unknown, 401, "invalid_credentials")
    assert (a["title"], a["detail"]) == (b["title"], b["detail"])


async def test_repeated_failures_are_throttled(client):
    for _ in range(5):
        await client.post("/api/v1/authn/sessions", json={"subject_id": "carol", "password": "x"})
    response = await client.post("/api/v1/authn/sessions",
                                 json={"subject_id": "carol", "password": "carol-dev-password"})
    await assert_problem(response, 429, "login_throttled")
    assert int(response.headers["Retry-After"]) > 0


async def test_replayed_assertion_is_rejected(client):
    signed = assertion("ci-bot")
    first = await client.post("/api/v1/authn/sessions", json={"assertion": signed})
    assert first.status == 201
    again = await client.post("/api/v1/authn/sessions", json={"assertion": signed})
    await assert_problem(again, 401, "invalid_credentials")


async def test_step_up_once_per_code_and_not_for_services(client):
    alice = await login(client, "alice")
    code = otp("alice", client.server.app)
    first = await client.post("/api/v1/authn/step-up", json={"otp": code}, headers=bearer(alice))
    assert first.status == 201
    stepped = (await first.json())["access_token"]
    assert {"acr", "amr"} <= set(claims(stepped))
    replay = await client.post("/api/v1/authn/step-up", json={"otp": code}, headers=bearer(alice))
    await assert_problem(replay, 401, "otp_invalid")
    wrong = await client.post("/api/v1/authn/step-up", json={"otp": "000000"},
                              headers=bearer(alice))
    assert wrong.status in (401, 429)
    bot = await login(client, "ci-bot")
    response = await client.post("/api/v1/authn/step-up", json={"otp": "123456"},
                                 headers=bearer(bot))
    await assert_problem(response, 403, "step_up_not_available")
    me = await (await client.get("/api/v1/authn/sessions/current", headers=bearer(stepped))).json()
    assert me["step_up"]["verified"] is True


async def test_step_up_body_is_validated(client):
    alice = await login(client, "alice")
    response = await client.post("/api/v1/authn/step-up", json={"otp": "12ab56"},
                                 headers=bearer(alice))
    await assert_problem(response, 422, "schema_validation_failed")


async def test_revocation_reaches_a_second_app_instance_at_once(client):
    """Two app instances share one store (as two workers would): logout on one is seen by both."""
    second_app = create_app(client.server.app[CONFIG])
    async with TestClient(TestServer(second_app)) as other:
        token = await login(client, "alice")
        assert (await other.get("/api/v1/authn/sessions/current", headers=bearer(token))).status == 200
        logout = await client.delete("/api/v1/authn/sessions/current", headers=bearer(token))
        assert logout.status == 204
        for instance in (client, other):
            response = await instance.get("/api/v1/authn/sessions/current", headers=bearer(token))
            await assert_problem(response, 401, "session_revoked")


async def test_jwks_publishes_public_keys_only(client):
    response = await client.get("/api/v1/authn/jwks.json")
    assert response.status == 200
    keys = (await response.json())["keys"]
    assert keys and all(k["kty"] == "OKP" and k["crv"] == "Ed25519" and "d" not in k for k in keys)
    token = await login(client, "carol")
    header = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    assert header["alg"] == "EdDSA" and header["kid"] in {k["kid"] for k in keys}


async def test_authn_status_reveals_no_tokens_or_sessions(client):
    token = await login(client, "alice")
    status = await (await client.get("/api/v1/authn/status")).json()
    assert status["status"] == "ready"
    text = json.dumps(status)
    assert token not in text and "alice" not in text and "session" not in text.replace(
        "session_ttl", "")


@pytest.mark.parametrize(
    "token",
    [
        pytest.param("e30.e30.", id="alg-missing"),
        pytest.param("x" * 100_000, id="oversized"),
        pytest.param("a.b", id="two-parts"),
    ],
)
async def test_bad_tokens_are_401_problems(client, token):
    response = await client.get("/api/v1/authn/sessions/current", headers=bearer(token))
    assert response.status == 401
    body = await assert_problem(response, 401, (await response.json(content_type=None))["code"])
    assert body["code"].startswith("token_")
