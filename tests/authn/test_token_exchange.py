"""RFC 8693 token exchange against a real issuer on loopback (its own keys, discovery and JWKS)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import os
import sys
import time
from typing import Any

import pytest
from joserfc import jwt

from service.authn import stepup
from service.authn.principal import Principal
from service.config import CONFIG
from service.storelink import STORE
from tests.conftest import REPO
from tests.store import pg

from .issuer import TestIssuer, running_issuer, stranger_key

AUD = "https://cp.example.test"
GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"
JWT_TYPE = "urn:ietf:params:oauth:token-type:jwt"


def federation(issuer_url: str, **github: Any) -> dict[str, Any]:
    return {"authn": {
        "oidc": {"allow_http_loopback": True},
        "workload": {"issuers": [
            {"name": "github", "issuer": issuer_url, "audience": AUD,
             "subject": "ci:github:{repository}", "kind": "service", "max_token_age_s": 120,
             "conditions": {"repository": "org/repo", "ref": ["refs/heads/main"],
                            "environment": "prod"}, **github},
            {"name": "cluster", "issuer": issuer_url + "/k8s", "jwks_uri": issuer_url + "/jwks",
             "audience": AUD, "subject": "k8s:{sub}", "kind": "agent", "algorithms": ["ES256"],
             "conditions": {"sub": "system:serviceaccount:deploy:runner"}},
        ]},
    }}


@pytest.fixture
async def issuer():
    async with running_issuer() as running:
        yield running


@pytest.fixture
async def client(make_client, issuer):
    return await make_client(federation(issuer.url))


async def exchange(client, token: str, **form: str):
    data = {"grant_type": GRANT, "subject_token": token, "subject_token_type": JWT_TYPE, **form}
    return await client.post("/api/v1/authn/token-exchange", data=data)


async def refused(response, code: str = "invalid_grant", status: int = 400) -> dict[str, Any]:
    body = await response.json()
    assert response.status == status, body
    assert response.content_type == "application/problem+json"
    assert body["code"] == code and body["error"] == code
    return body


async def whoami(client, token: str) -> dict[str, Any]:
    response = await client.get("/api/v1/authn/sessions/current",
                                headers={"Authorization": f"Bearer {token}"})
    assert response.status == 200
    return await response.json()


async def test_github_token_becomes_a_service_principal_once(client, issuer):
    token = issuer.github(AUD)
    response = await exchange(client, token)
    body = await response.json()
    assert response.status == 200, body
    assert body["issued_token_type"] == "urn:ietf:params:oauth:token-type:access_token"
    assert response.headers["Cache-Control"] == "no-store"
    me = await whoami(client, body["access_token"])
    assert (me["subject_id"], me["kind"], me["authn_method"]) == (
        "ci:github:org/repo", "service", "token_exchange")
    # The same foreign token again: refused (jti replay cache in the store).
    await refused(await exchange(client, token))


P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def malleated(token: str) -> str:
    """The same ES256 token with its signature's ``s`` replaced by ``n - s``: still valid."""
    signing_input, _, signature = token.rpartition(".")
    raw = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
    r, s = raw[:32], int.from_bytes(raw[32:], "big")
    return signing_input + "." + b64url(r + (P256_ORDER - s).to_bytes(32, "big"))


def refusal_reasons(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [getattr(r, "fields", {}).get("reason", "") for r in caplog.records
            if getattr(r, "fields", {}).get("event") == "authn.federation_refused"]


async def test_a_malleated_signature_does_not_make_a_token_new(client, issuer, caplog):
    """Without ``jti`` the one-use key is the signed content, not the signature's encoding:
    an ES256 signature with ``s`` flipped to ``n - s`` (valid too) is the same token again."""
    caplog.set_level(logging.INFO, "controlplane.authn")
    now = int(time.time())
    token = issuer.mint({"iss": issuer.url + "/k8s", "aud": [AUD], "iat": now, "nbf": now,
                         "exp": now + 600, "sub": "system:serviceaccount:deploy:runner"},
                        alg="ES256")
    twin = malleated(token)
    assert twin != token and jwt.decode(twin, issuer.ec).claims == jwt.decode(token, issuer.ec).claims
    assert (await exchange(client, token)).status == 200
    first_replay = await refused(await exchange(client, token))
    second = await refused(await exchange(client, twin))
    del first_replay["correlation_id"], second["correlation_id"]
    assert second == first_replay
    assert refusal_reasons(caplog) == ["token_replayed", "token_replayed"]


async def test_an_exchanged_token_never_outlives_the_subject_token(client, issuer):
    """Lifetime = min(configured token ttl, what the subject token has left)."""
    now = int(time.time())
    token = issuer.github(AUD, iat=now, nbf=now, exp=now + 45)
    response = await exchange(client, token)
    body = await response.json()
    assert response.status == 200, body
    assert body["expires_in"] <= 45
    payload = body["access_token"].split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims["exp"] <= now + 45
    session = await client.app[STORE].require().get_session(body["session_id"])
    assert session is not None and session.expires_at <= now + 45
    # A subject token with longer to live gets the configured ttl, no more.
    long_lived = await (await exchange(client, issuer.github(AUD, exp=now + 3000))).json()
    assert 45 < long_lived["expires_in"] <= client.app[CONFIG].authn.token_ttl_s


async def test_a_workload_subject_never_becomes_a_local_identity(make_client, issuer, caplog):
    """A template that fills to a local identity's name (here ``{workflow}`` = ``alice``)."""
    caplog.set_level(logging.INFO, "controlplane.authn")
    client = await make_client(federation(issuer.url, subject="{workflow}"))
    await refused(await exchange(client, issuer.github(AUD, workflow="alice")))
    assert refusal_reasons(caplog) == ["subject_collision"]
    response = await exchange(client, issuer.github(AUD, workflow="deploy"))
    assert response.status == 200, await response.text()


DEPLOY_WORKFLOW = "org/repo/.github/workflows/deploy.yaml@refs/heads/main"


async def test_the_documented_github_conditions_refuse_a_pull_request_target_job(
    make_client, issuer
):
    """A ``pull_request_target`` job runs on the base branch (``ref: refs/heads/main``) with
    the repository's secrets: binding ``event_name`` and ``job_workflow_ref`` (docs/howto/ci.md:
    CI without keys) keeps it from the identity of a push to main."""
    client = await make_client(federation(issuer.url, conditions={
        "repository": "org/repo", "ref": "refs/heads/main", "environment": "prod",
        "event_name": "push", "job_workflow_ref": DEPLOY_WORKFLOW}))
    push = {"event_name": "push", "job_workflow_ref": DEPLOY_WORKFLOW}
    assert (await exchange(client, issuer.github(AUD, **push))).status == 200
    await refused(await exchange(client, issuer.github(
        AUD, **{**push, "event_name": "pull_request_target"})))
    await refused(await exchange(client, issuer.github(AUD, **{
        **push, "job_workflow_ref": "org/repo/.github/workflows/pr.yaml@refs/heads/main"})))


async def test_status_names_the_issuers_only(client):
    body = await (await client.get("/api/v1/authn/status")).json()
    assert body["federation"] == {"oidc_providers": [], "workload_issuers": ["github", "cluster"]}


async def test_kubernetes_token_becomes_an_agent(client, issuer):
    token = issuer.kubernetes(AUD, iss=issuer.url + "/k8s")
    response = await exchange(client, token)
    assert response.status == 200, await response.text()
    me = await whoami(client, (await response.json())["access_token"])
    assert (me["subject_id"], me["kind"]) == ("k8s:system:serviceaccount:deploy:runner", "agent")


@pytest.mark.parametrize("claims", [
    {"repository": "org/other"},            # another repository
    {"ref": "refs/heads/feature"},          # another branch
    {"environment": None},                  # a condition's claim missing
    {"aud": "https://someone-else.test"},   # minted for another audience
    {"iat": int(time.time()) - 600},        # stale: older than max_token_age_s
    {"exp": int(time.time()) - 120},        # expired
    {"iss": "http://127.0.0.1:1/unknown"},  # an issuer nobody configured
], ids=["repository", "branch", "missing-claim", "audience", "stale", "expired", "issuer"])
async def test_tokens_that_do_not_match_are_refused(client, issuer, claims):
    await refused(await exchange(client, issuer.github(AUD, **claims)))


async def test_algorithm_attacks_are_refused(client, issuer):
    now = int(time.time())
    claims = {"iss": issuer.url, "aud": AUD, "sub": "x", "repository": "org/repo",
              "ref": "refs/heads/main", "environment": "prod", "iat": now, "exp": now + 60,
              "jti": "alg-attack"}
    b64 = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()  # noqa: E731
    none = b64({"alg": "none", "typ": "JWT"}) + "." + b64(claims) + "."
    await refused(await exchange(client, none))
    # HS256 "signed" with the issuer's public key as the shared secret (key confusion).
    # joserfc refuses to make such a key, so the forgery is done by hand.
    public_pem = issuer.rsa.as_pem(private=False)
    signing_input = b64({"alg": "HS256", "kid": "rsa-1"}) + "." + b64(claims)
    mac = hmac.new(public_pem, signing_input.encode(), hashlib.sha256).digest()
    hs = signing_input + "." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()
    await refused(await exchange(client, hs))
    # An embedded key (RFC 8725 §3.10) and a signature by a key the issuer never published.
    await refused(await exchange(client, issuer.mint(claims, header={"jwk": issuer.jwks()["keys"][0]})))
    await refused(await exchange(client, issuer.mint(claims, key=stranger_key())))


async def test_unknown_kid_refetches_once_then_refuses(client, issuer: TestIssuer):
    await exchange(client, issuer.github(AUD))  # warms the cache
    fetched = issuer.jwks_fetches
    rogue = stranger_key()
    rogue_claims = {"kid": "rotated-2"}
    token = issuer.mint({"iss": issuer.url, "aud": AUD}, key=rogue, header=rogue_claims)
    await refused(await exchange(client, token))
    assert issuer.jwks_fetches == fetched + 1
    await refused(await exchange(client, issuer.mint({"iss": issuer.url, "aud": AUD}, key=rogue,
                                                       header={"kid": "rotated-3"})))
    assert issuer.jwks_fetches == fetched + 1  # rate-limited: no second refetch
    # A key rotated in for real is found by that one refetch.
    assert issuer.published


async def test_a_rotated_key_is_picked_up_by_the_refetch(make_client, issuer: TestIssuer):
    client = await make_client(federation(issuer.url))
    assert (await exchange(client, issuer.github(AUD))).status == 200
    new = stranger_key()
    new_kid = "rsa-2"
    from joserfc.jwk import RSAKey

    rotated = RSAKey.import_key(new.as_dict(private=True), parameters={"kid": new_kid, "use": "sig"})
    issuer.published.append(rotated)
    token = issuer.github(AUD)
    token = issuer.mint(jwt.decode(token, issuer.rsa).claims, key=rotated)
    response = await exchange(client, token)
    assert response.status == 200, await response.text()


@pytest.mark.parametrize("form, code", [
    ({"grant_type": "password"}, "unsupported_grant_type"),
    ({"subject_token_type": "urn:ietf:params:oauth:token-type:saml2"}, "invalid_request"),
    ({"actor_token": "x"}, "invalid_request"),
    ({"requested_token_type": "urn:ietf:params:oauth:token-type:refresh_token"}, "invalid_request"),
])
async def test_malformed_requests_get_rfc6749_codes(client, issuer, form, code):
    await refused(await exchange(client, issuer.github(AUD), **form), code)


async def test_json_body_is_an_invalid_request(client, issuer):
    response = await client.post("/api/v1/authn/token-exchange",
                                 json={"grant_type": GRANT, "subject_token": issuer.github(AUD)})
    await refused(response, "invalid_request")


def test_a_fresh_exchange_stands_in_for_step_up():
    now = 1_000_000.0
    fresh = Principal("ci:github:org/repo", "service", "s", now - 10, "token_exchange")
    stepup.require_fresh(fresh, now, 300)
    stale = Principal("ci:github:org/repo", "service", "s", now - 400, "token_exchange")
    with pytest.raises(stepup.StepUpRequired):
        stepup.require_fresh(stale, now, 300)


@pytest.mark.postgres
async def test_two_replicas_on_postgresql_accept_a_token_once(make_client, issuer):
    async with pg.temp_schema("cp_exchange") as (dsn, schema):
        overrides = federation(issuer.url)
        overrides["store"] = {"backend": "postgres", "postgres": {"dsn": dsn, "schema": schema}}
        replicas = [await make_client(overrides), await make_client(overrides)]
        try:
            for _ in range(3):
                token = issuer.github(AUD)
                answers = await asyncio.gather(*(exchange(r, token) for r in replicas * 2))
                assert sorted(a.status for a in answers) == [200, 400, 400, 400]
        finally:
            for replica in replicas:
                await replica.close()


async def test_cpctl_login_token_file(client, issuer, tmp_path):
    """A CI job: `cpctl login --token-file PATH` (or CONTROLPLANE_TOKEN_FILE) exchanges its token."""
    token_file = tmp_path / "oidc-token"
    token_file.write_text(issuer.github(AUD) + "\n")
    server = str(client.make_url("")).rstrip("/")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    environ.update({"CONTROLPLANE_CREDENTIALS": str(tmp_path / "credentials.json"),
                    "CONTROLPLANE_TOKEN_FILE": str(token_file)})

    async def cpctl(*argv: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "service", *argv, cwd=REPO, env=environ,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        return proc.returncode or 0, out.decode(), err.decode()

    code, out, err = await cpctl("login", "--server", server)
    assert code == 0, err
    assert "as ci:github:org/repo through a workload token" in out
    stored = json.loads((tmp_path / "credentials.json").read_text())["servers"][server]
    me = await whoami(client, stored["access_token"])
    assert (me["subject_id"], me["authn_method"]) == ("ci:github:org/repo", "token_exchange")
    # The same token file again: the exchange refuses a replayed token.
    code, _, err = await cpctl("login", "--server", server, "--token-file", str(token_file))
    assert code != 0 and "invalid_grant" in err
    # `cpctl identities list` shows the federated subject the store has seen.
    environ["CONTROLPLANE_STATE_DIR"] = str(tmp_path / "state")
    code, out, err = await cpctl("identities", "list", "--json")
    assert code == 0, err
    rows = {r["subject_id"]: r for r in json.loads(out)["identities"]}
    assert rows["ci:github:org/repo"]["source"] == "workload:github"
    assert rows["alice"]["source"] == "file"
