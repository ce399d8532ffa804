"""OpenID Connect sign-in against a real OpenID provider process on loopback (node-oidc-provider).

The test plays the browser: it follows redirects and submits the provider's login form.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from http.cookies import SimpleCookie
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from joserfc import jwt
from joserfc.jwk import ECKey

from service import clock
from service.app import create_app
from service.authn.errors import (
    AlgorithmNotAllowed,
    AudienceMismatch,
    InvalidToken,
    IssuerMismatch,
    SignatureInvalid,
    TokenExpired,
    UnknownKey,
)
from service.authn.federation import FEDERATION
from service.authn.federation.oidc import SignInRefused, check_id_token
from service.authn.federation.remote import RemoteKeys
from service.authn.federation.verify import verify_foreign
from service.storelink import STORE
from tests.auth import bearer, login, step_up
from tests.conftest import REPO
from tests.servers import EdgeTestServer, free_port

from .issuer import stranger_key
from .openid_provider import (
    CLIENT_ID,
    CLIENT_SECRET,
    Browser,
    TamperingProxy,
    openid_provider,
    query_of,
    url,
)

ACCOUNTS = {
    "alice": {"email": "alice@example.com", "email_verified": True, "groups": ["sre", "staff"]},
    "bob": {"email": "bob@example.com", "email_verified": True, "groups": ["staff"]},
    "mallory": {"email": "mallory@evil.test", "email_verified": True, "groups": ["sre"]},
    # Partner accounts whose names are those of local people or of subjects in policy data.
    "partner-bob": {"preferred_username": "bob", "email": "bob@partner.test",
                    "email_verified": True, "groups": ["sre"]},
    "partner-erin": {"preferred_username": "erin", "email": "erin@partner.test",
                     "email_verified": True, "groups": []},
    "partner-frank": {"preferred_username": "frank", "email": "frank@partner.test",
                      "email_verified": True, "groups": []},
    # E-mail addresses that must not decide who signs in.
    "unverified": {"email": "carol@example.com", "groups": []},
    "verified-string": {"email": "dan@example.com", "email_verified": "false", "groups": []},
    "two-ats": {"email": "x@evil.example@example.com", "email_verified": True, "groups": []},
    # Names that are not plain text.
    "crlf": {"preferred_username": "eve\r\nadmin", "email_verified": True, "groups": []},
    "nul": {"preferred_username": "eve\u0000", "email_verified": True, "groups": []},
    "rlo": {"preferred_username": "eve\u202egpj.exe", "email_verified": True, "groups": []},
    "surrogate": {"preferred_username": "eve\ud800", "email_verified": True, "groups": []},
}


#: The private_key_jwt client's key; its public half is registered at the provider under its
#: RFC 7638 thumbprint, the kid the service puts on its assertions.
CLIENT_KEY = ECKey.generate_key("P-256", parameters={"use": "sig"})
CLIENT_KEY.ensure_kid()


@pytest.fixture(scope="module")
def issuer(ports, tmp_path_factory):
    app_port, op_port = ports
    base = f"http://127.0.0.1:{app_port}/api/v1/authn/oidc"
    keyed = {"client_id": "controlplane-keyed", "token_endpoint_auth_method": "private_key_jwt",
             "redirect_uris": [f"{base}/keyed/callback"],
             "jwks": {"keys": [CLIENT_KEY.as_dict(private=False)]}}
    with openid_provider(op_port, [f"{base}/test/callback", f"{base}/strict/callback",
                                   f"{base}/partner/callback"], ACCOUNTS,
                         tmp_path_factory.mktemp("op"), extra_clients=[keyed]) as url:
        yield url


def providers(issuer: str) -> list[dict[str, Any]]:
    common = {"issuer": issuer, "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET,
              "scopes": ["openid", "email", "profile", "groups"], "subject_claim": "email",
              "allowed_domains": ["example.com"]}
    return [
        {"name": "test", "display_name": "Test IdP", **common},
        {"name": "strict", **common,
         "step_up": {"acr_values": "urn:example:mfa", "required_acr": ["urn:example:mfa"]}},
    ]


@pytest.fixture
async def app_client(aiohttp_client, make_config, ports, issuer, tmp_path):
    app_port, _ = ports
    key_file = tmp_path / "client-key.pem"
    key_file.write_bytes(CLIENT_KEY.as_pem(private=True))
    keyed = {**providers(issuer)[0], "name": "keyed", "client_id": "controlplane-keyed",
             "client_auth": "private_key_jwt", "private_key_file": str(key_file)}
    del keyed["client_secret"]
    config = make_config({"authn": {"oidc": {
        "allow_http_loopback": True, "redirect_base_url": f"http://127.0.0.1:{app_port}",
        "providers": [*providers(issuer), keyed]}}})
    return await aiohttp_client(EdgeTestServer(create_app(config), port=app_port))


async def sign_in(client, browser: Browser, login: str = "alice", provider: str = "test"):
    return await browser.go(url(client, f"/api/v1/authn/oidc/{provider}/login"), login=login)


async def whoami(browser: Browser, client, token: str) -> dict[str, Any]:
    async with browser.http.get(url(client, "/api/v1/authn/sessions/current"),
                                headers={"Authorization": f"Bearer {token}"}) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def test_providers_are_listed_for_a_sign_in_page(app_client):
    response = await app_client.get("/api/v1/authn/oidc/providers")
    body = await response.json()
    assert body["providers"][0] == {"name": "test", "display_name": "Test IdP",
                                    "login_url": "/api/v1/authn/oidc/test/login"}
    assert "secret" not in json.dumps(body)


async def test_browser_sign_in_opens_an_oidc_session(app_client, browser):
    status, _, body = await sign_in(app_client, browser)
    assert status == 201, body
    me = await whoami(browser, app_client, body["access_token"])
    # Namespaced by the provider: never the local "alice", nor another provider's person.
    assert me["subject_id"] == "test:alice@example.com"
    assert (me["kind"], me["authn_method"]) == ("human", "oidc")
    assert me["step_up"]["verified"] is False
    store = app_client.app[STORE].require()
    facts = await store.get_federated_session(body["session_id"])
    assert facts is not None and facts.groups == ("sre", "staff") and facts.provider == "test"
    seen = await store.list_federated_subjects()
    assert [(s.subject_id, s.source) for s in seen] == [("test:alice@example.com", "oidc:test")]
    # The groups are on the server-side session only, never in our token.
    payload = body["access_token"].split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert "groups" not in claims and "sre" not in json.dumps(claims)


async def test_private_key_jwt_client_authentication(app_client, browser):
    """The provider authenticates us by an RFC 7523 assertion signed with our key: no secret."""
    status, _, body = await sign_in(app_client, browser, provider="keyed")
    assert status == 201, body
    me = await whoami(browser, app_client, body["access_token"])
    assert (me["subject_id"], me["authn_method"]) == ("keyed:alice@example.com", "oidc")


async def test_step_up_by_reauthentication_at_the_idp(app_client, browser):
    _, _, signed_in = await sign_in(app_client, browser)
    bearer = {"Authorization": f"Bearer {signed_in['access_token']}"}
    async with browser.http.post(url(app_client, "/api/v1/authn/oidc/test/step-up"),
                                 headers=bearer) as resp:
        assert resp.status == 201, await resp.text()
        authorization_url = (await resp.json())["authorization_url"]
    params = query_of(authorization_url)
    assert (params["prompt"], params["max_age"]) == ("login", "0")
    # The provider asks for the password again although its session is live.
    status, _, stepped = await browser.go(authorization_url, login="alice")
    assert status == 201, stepped
    assert browser.logins == 2
    me = await whoami(browser, app_client, stepped["access_token"])
    assert me["step_up"]["verified"] is True and me["authn_method"] == "oidc"
    assert stepped["session_id"] == signed_in["session_id"]


async def test_step_up_as_another_person_is_refused(app_client, browser):
    _, _, signed_in = await sign_in(app_client, browser)
    bearer = {"Authorization": f"Bearer {signed_in['access_token']}"}
    async with browser.http.post(url(app_client, "/api/v1/authn/oidc/test/step-up"),
                                 headers=bearer) as resp:
        authorization_url = (await resp.json())["authorization_url"]
    status, at, body = await browser.go(authorization_url, login="bob")
    assert isinstance(body, dict), (status, at, body[:3000])
    assert (status, body["code"]) == (401, "step_up_mismatch"), (at, body)


async def test_step_up_weaker_than_configured_is_refused(app_client, browser):
    status, _, signed_in = await sign_in(app_client, browser, provider="strict")
    assert status == 201
    bearer = {"Authorization": f"Bearer {signed_in['access_token']}"}
    async with browser.http.post(url(app_client, "/api/v1/authn/oidc/strict/step-up"),
                                 headers=bearer) as resp:
        authorization_url = (await resp.json())["authorization_url"]
    assert query_of(authorization_url)["acr_values"] == "urn:example:mfa"
    status, _, body = await browser.go(authorization_url, login="alice")
    # The provider's password form does not reach the configured acr: no step-up recorded.
    assert (status, body["code"]) == (401, "step_up_insufficient")
    session = await app_client.app[STORE].require().get_session(signed_in["session_id"])
    assert session is not None and session.step_up_at is None


async def nothing_created(client) -> None:
    store = client.app[STORE].require()
    assert await store.list_federated_subjects() == []


async def test_wrong_state_is_refused(app_client, browser):
    callback = url(app_client, "/api/v1/authn/oidc/test/callback")
    _, at, _ = await browser.go(url(app_client, "/api/v1/authn/oidc/test/login"), login="alice",
                                stop_at=callback)
    forged = at.replace("state=", "state=x")
    status, _, body = await browser.go(forged)
    assert (status, body["code"]) == (401, "state_invalid")
    # The real state still works once; then it is gone.
    status, _, body = await browser.go(at)
    assert status == 201
    status, _, body = await browser.go(at)
    assert (status, body["code"]) == (401, "state_invalid")


async def test_replayed_code_is_refused(app_client, browser):
    callback = url(app_client, "/api/v1/authn/oidc/test/callback")
    _, first, _ = await browser.go(url(app_client, "/api/v1/authn/oidc/test/login"), login="alice",
                                   stop_at=callback)
    assert (await browser.go(first))[0] == 201
    # A new sign-in's state with the already redeemed code: the provider refuses the code.
    _, second, _ = await browser.go(url(app_client, "/api/v1/authn/oidc/test/login"),
                                    login="alice", stop_at=callback)
    replay = callback + "?" + "&".join(
        [f"code={query_of(first)['code']}", f"state={query_of(second)['state']}"])
    status, _, body = await browser.go(replay)
    assert (status, body["code"]) == (401, "code_rejected")


async def test_a_callback_in_another_browser_is_refused(app_client, browser):
    callback = url(app_client, "/api/v1/authn/oidc/test/callback")
    _, at, _ = await browser.go(url(app_client, "/api/v1/authn/oidc/test/login"), login="alice",
                                stop_at=callback)
    other = Browser()
    try:
        status, _, body = await other.go(at)
    finally:
        await other.close()
    assert (status, body["code"]) == (401, "state_invalid")
    await nothing_created(app_client)


async def test_a_disallowed_domain_is_refused(app_client, browser):
    status, _, body = await sign_in(app_client, browser, login="mallory")
    assert (status, body["code"]) == (401, "subject_not_allowed")
    assert "mallory" not in json.dumps(body)
    await nothing_created(app_client)


async def test_unknown_provider_is_404(app_client):
    response = await app_client.get("/api/v1/authn/oidc/nope/login", allow_redirects=False)
    assert (response.status, (await response.json())["code"]) == (404, "provider_unknown")


async def test_cli_redirect_must_be_loopback(app_client):
    response = await app_client.get(
        "/api/v1/authn/oidc/test/login",
        params={"cli_redirect": "http://evil.test/cb", "cli_challenge": "x" * 43},
        allow_redirects=False)
    assert (response.status, (await response.json())["code"]) == (400, "invalid_request")


# --------------------------------------------------- ID token checks on the provider's real token


async def real_id_token(client, browser: Browser) -> tuple[str, str]:
    """An ID token the provider really issued for a sign-in started by our service, and the
    nonce our service sent: the test redeems the code itself, with the stored verifier."""
    callback = url(client, "/api/v1/authn/oidc/test/callback")
    _, at, _ = await browser.go(url(client, "/api/v1/authn/oidc/test/login"), login="alice",
                                stop_at=callback)
    params = query_of(at)
    record = await client.app[STORE].require().take_oidc_login(
        hashlib.sha256(params["state"].encode()).hexdigest(), time.time())
    issuer = client.app[FEDERATION].oidc.config.providers[0].issuer
    async with aiohttp.ClientSession() as http:
        basic = base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()
        async with http.post(issuer + "/token", headers={"Authorization": f"Basic {basic}"},
                             data={"grant_type": "authorization_code", "code": params["code"],
                                   "redirect_uri": record.redirect_uri,
                                   "code_verifier": record.code_verifier}) as resp:
            assert resp.status == 200, await resp.text()
            return (await resp.json())["id_token"], record.nonce


def b64(value: Any) -> str:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


async def test_id_token_attacks_are_refused(app_client, browser):
    token, nonce = await real_id_token(app_client, browser)
    oidc = app_client.app[FEDERATION].oidc
    provider = oidc.config.providers[0]
    keys = RemoteKeys(oidc.fetcher, provider.issuer)
    now = time.time()

    async def verify(value: str, **overrides: Any) -> dict[str, Any]:
        args: dict[str, Any] = {"algorithms": provider.algorithms, "issuer": provider.issuer,
                                "audience": CLIENT_ID, "now": now, "leeway_s": 30}
        args.update(overrides)
        return await verify_foreign(value, keys, **args)

    claims = await verify(token)
    assert check_id_token(claims, provider, nonce)["sub"] == "alice"
    with pytest.raises(SignInRefused) as wrong_nonce:
        check_id_token(claims, provider, "another-nonce")
    assert wrong_nonce.value.code == "token_nonce_mismatch"
    expectations: list[tuple[type[InvalidToken], str, dict[str, Any]]] = [
        (AudienceMismatch, token, {"audience": "another-client"}),
        (TokenExpired, token, {"now": now + 3600}),
        (IssuerMismatch, token, {"issuer": "http://127.0.0.1:1"}),
    ]
    _, body, _ = token.split(".")
    expectations.append((AlgorithmNotAllowed, b64({"alg": "none"}) + "." + body + ".", {}))
    # HS256 keyed with the provider's published RSA key (key confusion), forged by hand.
    jwks = await oidc.fetcher.get_json(provider.issuer + "/jwks")
    rsa = next(k for k in jwks["keys"] if k["kty"] == "RSA")
    signing_input = b64({"alg": "HS256", "kid": rsa["kid"]}) + "." + body
    mac = hmac.new(json.dumps(rsa).encode(), signing_input.encode(), hashlib.sha256).digest()
    expectations.append((AlgorithmNotAllowed, signing_input + "." + b64(mac), {}))
    # A token signed by a key the provider never published, under its kid and under a new one.
    rogue = stranger_key()
    payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    expectations.append((SignatureInvalid, jwt.encode({"alg": "RS256", "kid": rsa["kid"]},
                                                      payload, rogue), {}))
    expectations.append((UnknownKey, jwt.encode({"alg": "RS256", "kid": "op-rsa-9"}, payload,
                                                rogue), {}))
    jwks_url = provider.issuer + "/jwks"
    for error, value, overrides in expectations:
        before = oidc.fetcher.fetches.get(jwks_url, 0)
        with pytest.raises(error):
            await verify(value, **overrides)
        if error is UnknownKey:
            assert oidc.fetcher.fetches[jwks_url] == before + 1  # one refetch, then refused


# ---------------------------------- the chain story (docs/concepts/identity.md) for an SSO sign-in


@pytest.fixture
async def group_client(aiohttp_client, make_config, ports, issuer, tmp_path):
    """The app with policy data that binds the group ``sre`` of provider ``test`` to the operator
    role."""
    policies = tmp_path / "policies"
    shutil.copytree(REPO / "policies", policies)
    with (policies / "data" / "bindings.yaml").open("a") as data:
        data.write("\ngroup_bindings:\n  test:sre: {roles: [operator]}\n")
    app_port, _ = ports
    config = make_config({
        "policies": {"dir": str(policies)},
        "authn": {"oidc": {"allow_http_loopback": True,
                           "redirect_base_url": f"http://127.0.0.1:{app_port}",
                           "providers": providers(issuer)}}})
    return await aiohttp_client(EdgeTestServer(create_app(config), port=app_port))


async def test_the_chain_story_for_an_sso_user(group_client, browser):
    client = group_client
    _, _, signed_in = await sign_in(client, browser)
    alice = signed_in["access_token"]
    me = await whoami(browser, client, alice)
    assert me["idp_groups"] == ["test:sre", "test:staff"]
    action = {"task_id": "release-sso", "action": "installer.run.execute", "env": "prod",
              "resource": {"app": "web", "version": "1.2.3"}}
    # The operator role comes from the IdP group through policy data: the action needs approval
    # (and, for production, a fresh step-up first: the RFC 9470 challenge, as with TOTP).
    response = await client.post("/api/v1/installer/actions", json=action, headers=bearer(alice))
    assert (response.status, (await response.json())["code"]) == (401, "step_up_required")
    assert "insufficient_user_authentication" in response.headers["WWW-Authenticate"]
    # test:bob@example.com is only in "test:staff", which binds nothing: denied.
    other = Browser()
    try:
        _, _, bob_sso = await sign_in(client, other, login="bob")
    finally:
        await other.close()
    response = await client.post("/api/v1/installer/actions", json=action,
                                 headers=bearer(bob_sso["access_token"]))
    assert (response.status, (await response.json())["code"]) == (403, "denied")

    # Step-up by re-authentication at the IdP.
    async with browser.http.post(url(client, "/api/v1/authn/oidc/test/step-up"),
                                 headers=bearer(alice)) as resp:
        authorization_url = (await resp.json())["authorization_url"]
    status, _, stepped = await browser.go(authorization_url, login="alice")
    assert status == 201, stepped
    alice = stepped["access_token"]
    response = await client.post("/api/v1/installer/actions", json=action, headers=bearer(alice))
    assert (response.status, (await response.json())["code"]) == (403, "approval_required")

    response = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "test:alice@example.com", "env": "prod", "action": "installer.run.execute",
        "resource": action["resource"], "reason": "release 1.2.3"})
    assert response.status == 201, await response.text()
    ticket = await response.json()
    bob = await step_up(client, await login(client, "bob"), "bob")
    response = await client.post(f"/api/v1/approvals/{ticket['id']}/reviews", headers=bearer(bob),
                                 json={"decision": "approve", "reason": "CHG-42"})
    assert response.status in (200, 201), await response.text()
    with_ticket = bearer(alice, **{"Approval-Ticket": ticket["id"],
                                   "Approval-Nonce": ticket["nonce"]})
    response = await client.post("/api/v1/installer/actions", json=action, headers=with_ticket)
    assert response.status == 202, await response.text()
    response = await client.post("/api/v1/installer/actions", json=action, headers=with_ticket)
    assert (response.status, (await response.json())["code"]) == (409, "ticket_consumed")


# ----------------------------------- federated subjects are scoped to the provider that asserted them


def partner(issuer: str, **overrides: Any) -> dict[str, Any]:
    """A partner's provider: anyone it vouches for may sign in; the name is preferred_username."""
    return {"name": "partner", "issuer": issuer, "client_id": CLIENT_ID,
            "client_secret": CLIENT_SECRET, "scopes": ["openid", "email", "profile", "groups"],
            "subject_claim": "preferred_username", **overrides}


@pytest.fixture
def federated_app(aiohttp_client, make_config, ports, issuer, tmp_path):
    """``make(partner_overrides, group_bindings)``: the app with the test and partner providers
    and the repository's policies (plus ``group_bindings`` when given)."""
    app_port, _ = ports

    async def make(group_bindings: str = "", **overrides: Any):
        policies = tmp_path / "policies"
        shutil.copytree(REPO / "policies", policies)
        if group_bindings:
            with (policies / "data" / "bindings.yaml").open("a") as data:
                data.write("\ngroup_bindings:\n" + group_bindings)
        config = make_config({
            "policies": {"dir": str(policies)},
            "authn": {"oidc": {"allow_http_loopback": True,
                               "redirect_base_url": f"http://127.0.0.1:{app_port}",
                               "providers": [providers(issuer)[0], partner(issuer, **overrides)]}}})
        return await aiohttp_client(EdgeTestServer(create_app(config), port=app_port))

    return make


async def refused_sign_in(client, login: str, provider: str = "partner") -> tuple[int, str]:
    """A sign-in in a fresh browser: the status and the problem's code."""
    other = Browser()
    try:
        status, _, body = await sign_in(client, other, login=login, provider=provider)
    finally:
        await other.close()
    assert isinstance(body, dict), (status, body)
    return status, body.get("code", "")


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.fields["reason"] for r in caplog.records  # type: ignore[attr-defined]
            if getattr(r, "fields", {}).get("event") == "authn.federation_refused"]


async def test_a_partner_account_named_bob_is_not_the_local_bob(federated_app, browser):
    """The partner's ``bob`` signs in as ``partner:bob``: not the local approver bob, so its
    review of alice's production ticket is denied; the partner's ``erin`` is not the admin
    policy data binds to ``erin``, and cannot read the audit log."""
    client = await federated_app()
    status, _, signed_in = await sign_in(client, browser, login="partner-bob", provider="partner")
    assert status == 201, signed_in
    partner_bob = signed_in["access_token"]
    assert (await whoami(browser, client, partner_bob))["subject_id"] == "partner:bob"
    alice = await login(client, "alice")
    response = await client.post("/api/v1/approvals", headers=bearer(alice), json={
        "subject_id": "alice", "env": "prod", "action": "installer.run.execute",
        "resource": {"app": "web", "version": "9.9.9"}, "reason": "release"})
    assert response.status == 201, await response.text()
    ticket = await response.json()
    # The partner steps up at its own IdP (no assurance configured) and tries to approve.
    async with browser.http.post(url(client, "/api/v1/authn/oidc/partner/step-up"),
                                 headers=bearer(partner_bob)) as resp:
        authorization_url = (await resp.json())["authorization_url"]
    status, _, stepped = await browser.go(authorization_url, login="partner-bob")
    assert status == 201, stepped
    response = await client.post(f"/api/v1/approvals/{ticket['id']}/reviews",
                                 headers=bearer(stepped["access_token"]),
                                 json={"decision": "approve", "reason": "looks fine"})
    assert (response.status, (await response.json())["code"]) == (403, "denied")
    ticket_now = await (await client.get(f"/api/v1/approvals/{ticket['id']}",
                                         headers=bearer(alice))).json()
    assert ticket_now["state"] == "pending"

    other = Browser()
    try:
        status, _, erin = await sign_in(client, other, login="partner-erin", provider="partner")
    finally:
        await other.close()
    assert status == 201, erin
    assert (await whoami(browser, client, erin["access_token"]))["subject_id"] == "partner:erin"
    response = await client.get("/api/v1/audit/records", headers=bearer(erin["access_token"]))
    assert (response.status, (await response.json())["code"]) == (403, "denied")


async def test_a_name_outside_the_namespace_that_collides_is_refused(federated_app, caplog):
    """A template without the provider's prefix: a name that is a local identity (bob) or a
    subject of policy data (erin, no local account) is refused with one log event; a link on
    the verified ``sub`` is the one way to become a local subject; other names pass as they
    are."""
    caplog.set_level(logging.INFO, "controlplane.authn")
    client = await federated_app(subject="{preferred_username}",
                                 links={"partner-frank": "carol"})
    assert await refused_sign_in(client, "partner-bob") == (401, "subject_collision")
    assert await refused_sign_in(client, "partner-erin") == (401, "subject_collision")
    assert refusals(caplog) == ["subject_collision", "subject_collision"]
    assert await client.app[STORE].require().list_federated_subjects() == []
    # The linked partner account signs in as the local subject it was linked to.
    browser = Browser()
    try:
        status, _, body = await sign_in(client, browser, login="partner-frank", provider="partner")
        assert status == 201, body
        assert (await whoami(browser, client, body["access_token"]))["subject_id"] == "carol"
    finally:
        await browser.close()


@pytest.mark.parametrize("login, code", [
    ("unverified", "subject_not_allowed"),       # email_verified absent
    ("verified-string", "subject_not_allowed"),  # email_verified: "false" (a string)
    ("two-ats", "subject_invalid"),              # x@evil.example@example.com
])
async def test_an_email_counts_only_verified_and_well_formed(app_client, login, code):
    assert await refused_sign_in(app_client, login, provider="test") == (401, code)
    await nothing_created(app_client)


@pytest.mark.parametrize("login", ["crlf", "nul", "rlo", "surrogate"])
async def test_a_subject_that_is_not_plain_text_is_refused(federated_app, login):
    client = await federated_app()
    assert await refused_sign_in(client, login) == (401, "subject_invalid")
    await nothing_created(client)


async def test_groups_bind_roles_only_for_the_provider_that_asserted_them(federated_app, browser):
    """``group_bindings`` names ``test:sre``: the partner's ``sre`` is another group."""
    client = await federated_app(group_bindings="  test:sre: {roles: [operator]}\n")
    action = {"task_id": "groups", "action": "installer.run.execute", "env": "dev",
              "resource": {"app": "web"}}
    _, _, alice = await sign_in(client, browser)
    assert (await whoami(browser, client, alice["access_token"]))["idp_groups"] == [
        "test:sre", "test:staff"]
    response = await client.post("/api/v1/installer/actions", json=action,
                                 headers=bearer(alice["access_token"]))
    assert response.status == 202, await response.text()
    other = Browser()
    try:
        _, _, bob = await sign_in(client, other, login="partner-bob", provider="partner")
        assert (await whoami(other, client, bob["access_token"]))["idp_groups"] == ["partner:sre"]
    finally:
        await other.close()
    response = await client.post("/api/v1/installer/actions", json={**action, "task_id": "g2"},
                                 headers=bearer(bob["access_token"]))
    assert (response.status, (await response.json())["code"]) == (403, "denied")


async def test_a_bare_group_binding_is_a_clear_error_at_start_up(federated_app, caplog):
    """``group_bindings: {sre: ...}`` would bind every provider's ``sre``: the revision is
    refused at start-up, the log says how to write it, and the service is not ready."""
    caplog.set_level(logging.ERROR, "controlplane")
    client = await federated_app(group_bindings="  sre: {roles: [operator]}\n")
    rejected = [r.getMessage() for r in caplog.records if "policy revision rejected" in r.getMessage()]
    assert len(rejected) == 1 and "a bare group name binds nothing" in rejected[0]
    assert "'corp:sre'" in rejected[0]
    assert (await client.get("/readyz")).status == 503


# ------------------------------------------------------------------ cpctl login --sso (loopback)


async def cpctl(*argv: str, env: dict[str, str]) -> asyncio.subprocess.Process:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "service", *argv, cwd=REPO, env={**environ, **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def printed_url(proc: asyncio.subprocess.Process) -> str:
    assert proc.stderr is not None
    seen = []
    while True:
        line = (await asyncio.wait_for(proc.stderr.readline(), 20)).decode()
        assert line, f"cpctl ended without printing the sign-in URL: {''.join(seen)}"
        seen.append(line)
        if line.startswith("http"):
            return line.strip()


async def test_cpctl_login_sso_completes_through_the_loopback_redirect(app_client, browser, tmp_path):
    env = {"CONTROLPLANE_CREDENTIALS": str(tmp_path / "credentials.json")}
    server = str(app_client.make_url("")).rstrip("/")
    proc = await cpctl("login", "--sso", "--provider", "test", "--no-browser", "--server", server,
                       env=env)
    sign_in_url = await printed_url(proc)
    assert "cli_redirect=http%3A%2F%2F127.0.0.1%3A" in sign_in_url
    # The test is the person's browser: the provider's form, then the CLI's loopback page.
    status, landed, page = await browser.go(sign_in_url, login="alice")
    assert status == 200 and landed.startswith("http://127.0.0.1:") and "Signed in" in page
    out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, err.decode()
    assert "as test:alice@example.com through single sign-on (test)" in out.decode()
    stored = json.loads((tmp_path / "credentials.json").read_text())["servers"][server]
    assert stored["subject_id"] == "test:alice@example.com"
    me = await whoami(browser, app_client, stored["access_token"])
    assert me["authn_method"] == "oidc"
    # The handoff code cannot be redeemed a second time, nor without the CLI's verifier.
    code = query_of(landed)["code"]
    response = await app_client.post("/api/v1/authn/oidc/handoff",
                                     json={"code": code, "code_verifier": "v" * 43})
    assert (response.status, (await response.json())["code"]) == (400, "invalid_grant")

    # cpctl step-up --sso: a fresh login at the provider, and the stored token is stepped up.
    proc = await cpctl("step-up", "--sso", "--provider", "test", "--no-browser", "--server",
                       server, env=env)
    status, _, page = await browser.go(await printed_url(proc), login="alice")
    assert status == 200 and "Signed in" in page
    _, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, err.decode()
    stored = json.loads((tmp_path / "credentials.json").read_text())["servers"][server]
    assert (await whoami(browser, app_client, stored["access_token"]))["step_up"]["verified"]


async def test_sign_in_cookies_use_the_host_prefix_when_served_over_https(
        aiohttp_client, make_config, issuer):
    """Behind HTTPS (``redirect_base_url``) the browser binding and the console marker are
    ``__Host-`` cookies (Secure, Path=/, no Domain): a sibling subdomain cannot plant its own
    binding to sign someone in as itself. (Over plain HTTP, as in the other tests here, the
    plain names on the sign-in paths: the development exception.)"""
    config = make_config({"authn": {"oidc": {
        "allow_http_loopback": True, "redirect_base_url": "https://cp.example.test",
        "providers": providers(issuer)[:1]}}})
    client = await aiohttp_client(EdgeTestServer(create_app(config)))
    response = await client.get("/api/v1/authn/oidc/test/login", allow_redirects=False,
                                params={"next": "/console/"})
    assert response.status == 302, await response.text()
    jar = SimpleCookie()
    for header in response.headers.getall("Set-Cookie"):
        jar.load(header)
    assert sorted(jar) == ["__Host-cp_oidc_browser", "__Host-cp_oidc_console"]
    for cookie in jar.values():
        assert cookie["secure"] is True and cookie["path"] == "/" and not cookie["domain"]


async def test_cpctl_whoami_and_hints_for_an_sso_user(group_client, browser, tmp_path):
    """``cpctl whoami`` shows the roles and groups the policy sees, the IdP-derived ones
    included; an SSO user who must step up is pointed to ``cpctl step-up --sso``, not to a
    one-time code they do not have."""
    env = {"CONTROLPLANE_CREDENTIALS": str(tmp_path / "credentials.json")}
    server = str(group_client.make_url("")).rstrip("/")
    proc = await cpctl("login", "--sso", "--provider", "test", "--no-browser", "--server", server,
                       env=env)
    status, _, _ = await browser.go(await printed_url(proc), login="alice")
    _, err = await asyncio.wait_for(proc.communicate(), 20)
    assert status == 200 and proc.returncode == 0, err.decode()

    proc = await cpctl("whoami", "--server", server, env=env)
    out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert "roles:      operator" in lines, lines
    assert "idp groups: test:sre, test:staff" in lines, lines
    proc = await cpctl("whoami", "--json", "--server", server, env=env)
    out, _ = await asyncio.wait_for(proc.communicate(), 20)
    me = json.loads(out)
    assert me["roles"] == ["operator"] and me["groups"] == []
    assert me["idp_groups"] == ["test:sre", "test:staff"]

    # A production run needs a fresh step-up: at the provider, for this person.
    proc = await cpctl("installer", "run", "--server", server, "--env", "prod", "--task-id", "t-1",
                       "--resource", '{"app": "web"}', env=env)
    _, err = await asyncio.wait_for(proc.communicate(), 20)
    text = err.decode()
    assert proc.returncode == 1 and "cpctl step-up --sso" in text, text
    assert "--otp" not in text and "one-time code" not in text, text

    # Once the session is ended, the hint is a sign-in through the provider, not a password.
    stored = json.loads((tmp_path / "credentials.json").read_text())["servers"][server]
    assert stored["authn_method"] == "oidc"
    assert await group_client.app[STORE].require().revoke_session(stored["session_id"],
                                                                 clock.now())
    proc = await cpctl("whoami", "--server", server, env=env)
    _, err = await asyncio.wait_for(proc.communicate(), 20)
    text = err.decode()
    assert proc.returncode == 1 and "401 session_revoked" in text, text
    assert "hint: the session was ended; run `cpctl login --sso`" in text, text


# ------------------------------------------------------------- device authorization (RFC 8628)


async def test_device_authorization_grant(app_client, browser):
    response = await app_client.post("/api/v1/authn/oidc/test/device")
    assert response.status == 201, await response.text()
    started = await response.json()
    poll = {"device_request": started["device_request"]}
    response = await app_client.post("/api/v1/authn/oidc/test/device/token", json=poll)
    assert (response.status, (await response.json())["code"]) == (400, "authorization_pending")
    # The person confirms the code on any device and signs in at the provider.
    status, _, page = await browser.go(started["verification_uri_complete"], login="alice")
    assert status == 200 and "Sign-in Success" in page, page
    response = await app_client.post("/api/v1/authn/oidc/test/device/token", json=poll)
    assert response.status == 201, await response.text()
    me = await whoami(browser, app_client, (await response.json())["access_token"])
    assert (me["subject_id"], me["authn_method"]) == ("test:alice@example.com", "oidc")
    # The handle is spent.
    response = await app_client.post("/api/v1/authn/oidc/test/device/token", json=poll)
    assert (response.status, (await response.json())["code"]) == (400, "expired_token")
    # A device sign-in is refused like any other for a disallowed domain.
    response = await app_client.post("/api/v1/authn/oidc/test/device")
    started = await response.json()
    other = Browser()
    try:
        await other.go(started["verification_uri_complete"], login="mallory")
    finally:
        await other.close()
    response = await app_client.post("/api/v1/authn/oidc/test/device/token",
                                     json={"device_request": started["device_request"]})
    assert (response.status, (await response.json())["code"]) == (401, "subject_not_allowed")


# ------------------------------- forged ID tokens where the real one arrives (a tampering proxy)


@pytest.fixture(scope="module")
def proxy_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def proxied_issuer(ports, proxy_port, tmp_path_factory):
    """A second provider whose issuer URL is the proxy in front of it; it keeps scope claims
    (email, groups) out of the ID token (OIDC Core 5.4), so they come from userinfo."""
    app_port, _ = ports
    front, port = f"http://127.0.0.1:{proxy_port}", free_port()
    with openid_provider(port, [f"http://127.0.0.1:{app_port}/api/v1/authn/oidc/test/callback"],
                         ACCOUNTS, tmp_path_factory.mktemp("op-proxied"), issuer=front,
                         conform=True) as issuer:
        yield issuer, f"http://127.0.0.1:{port}"


@pytest.fixture
async def proxy(proxied_issuer, proxy_port):
    front = TamperingProxy(proxied_issuer[1])
    server = TestServer(front.app(), host="127.0.0.1", port=proxy_port)
    await server.start_server()
    yield front
    await server.close()


@pytest.fixture
async def proxied_client(aiohttp_client, make_config, ports, proxied_issuer, proxy):
    app_port, _ = ports
    # The conforming provider's ID token carries only sub: the subject is the IdP's sub here.
    provider = {**providers(proxied_issuer[0])[0], "subject_claim": "sub", "allowed_domains": []}
    config = make_config({"authn": {"oidc": {
        "allow_http_loopback": True, "redirect_base_url": f"http://127.0.0.1:{app_port}",
        "providers": [provider]}}})
    return await aiohttp_client(EdgeTestServer(create_app(config), port=app_port))


async def test_groups_from_userinfo_when_the_id_token_has_none(proxied_client, proxy, browser):
    status, _, body = await sign_in(proxied_client, browser)
    assert status == 201, body
    payload = proxy.id_tokens[-1].split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert "groups" not in claims  # the provider kept them for userinfo
    facts = await proxied_client.app[STORE].require().get_federated_session(body["session_id"])
    assert facts is not None and facts.groups == ("sre", "staff")


def _forge(kind: str, proxy: TamperingProxy) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def tamper(answer: dict[str, Any]) -> dict[str, Any]:
        head, body, _ = answer["id_token"].split(".")
        header = json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))
        payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        if kind == "alg-none":
            forged = b64({"alg": "none"}) + "." + body + "."
        elif kind == "hs256-with-public-key":
            signing_input = b64({"alg": "HS256", "kid": header["kid"]}) + "." + body
            public = json.dumps(PROVIDER_PUBLIC_KEYS[0]).encode()
            forged = signing_input + "." + b64(hmac.new(public, signing_input.encode(),
                                                        hashlib.sha256).digest())
        elif kind == "unknown-kid":
            forged = jwt.encode({"alg": "RS256", "kid": "op-rsa-9"}, payload, stranger_key())
        elif kind == "unpublished-key":
            forged = jwt.encode({"alg": "RS256", "kid": header["kid"]}, payload, stranger_key())
        else:  # "substituted": a real ID token of an earlier sign-in (another nonce)
            forged = proxy.id_tokens[0]
        return {**answer, "id_token": forged}

    return tamper


PROVIDER_PUBLIC_KEYS: list[dict[str, Any]] = []


@pytest.mark.parametrize("kind, code", [
    ("alg-none", "token_alg_not_allowed"),
    ("hs256-with-public-key", "token_alg_not_allowed"),
    ("unknown-kid", "token_unknown_kid"),
    ("unpublished-key", "token_signature_invalid"),
    ("substituted", "token_nonce_mismatch"),
])
async def test_forged_id_tokens_are_refused_at_the_callback(proxied_client, proxy, browser, kind,
                                                            code):
    client = proxied_client
    store = client.app[STORE].require()
    if kind == "substituted":
        assert (await sign_in(client, browser))[0] == 201  # the token to replay later
    before = await store.list_federated_subjects()
    if not PROVIDER_PUBLIC_KEYS:
        async with browser.http.get(proxy.upstream + "/jwks") as resp:
            PROVIDER_PUBLIC_KEYS.extend(k for k in (await resp.json())["keys"] if k["kty"] == "RSA")
    fetched = proxy.jwks_fetches
    proxy.tamper = _forge(kind, proxy)
    status, _, body = await sign_in(client, browser)
    assert isinstance(body, dict) and (status, body.get("code")) == (401, code), (status, body)
    assert await store.list_federated_subjects() == before  # nothing created
    if kind == "unknown-kid":
        # The cached set lacked the kid: exactly one refetch (plus the first fetch), then refused.
        assert proxy.jwks_fetches - fetched == 2
