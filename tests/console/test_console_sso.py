""""Sign in with <provider>" on the console, against the real OpenID provider process the OIDC
tests use (node-oidc-provider on loopback). The test plays the browser: it follows redirects
and submits the provider's login form, then keeps the cookies it was given."""

from __future__ import annotations

import base64
import json
import re
import shutil
from html import unescape
from http.cookies import SimpleCookie
from urllib.parse import urljoin

import pytest

from service import clock
from service.app import create_app
from service.storelink import STORE
from tests.authn.openid_provider import CLIENT_ID, CLIENT_SECRET, Browser, openid_provider, url
from tests.servers import REPO, EdgeTestServer

ACCOUNTS = {"alice": {"email": "alice@example.com", "email_verified": True, "groups": ["sre"]}}
SSO_LINK = re.compile(r'<a class="button sso" href="([^"]+)">Sign in with ([^<]+)</a>')


@pytest.fixture(scope="module")
def issuer(ports, tmp_path_factory):
    app_port, op_port = ports
    callback = f"http://127.0.0.1:{app_port}/api/v1/authn/oidc/test/callback"
    with openid_provider(op_port, [callback], ACCOUNTS, tmp_path_factory.mktemp("op")) as url:
        yield url


@pytest.fixture
async def app_client(aiohttp_client, make_config, ports, issuer, tmp_path):
    # The group ``sre`` of provider ``test`` gives the operator role (policy data, never the
    # token).
    policies = tmp_path / "policies"
    shutil.copytree(REPO / "policies", policies)
    with (policies / "data" / "bindings.yaml").open("a") as data:
        data.write("\ngroup_bindings:\n  test:sre: {roles: [operator]}\n")
    app_port, _ = ports
    config = make_config({"policies": {"dir": str(policies)}, "authn": {"oidc": {
        "allow_http_loopback": True, "redirect_base_url": f"http://127.0.0.1:{app_port}",
        "providers": [{"name": "test", "display_name": "Test IdP", "issuer": issuer,
                       "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET,
                       "scopes": ["openid", "email", "groups"], "subject_claim": "email",
                       "allowed_domains": ["example.com"]}]}}})
    return await aiohttp_client(EdgeTestServer(create_app(config), port=app_port))


async def sso_link(browser: Browser, client, next_path: str = "/console/") -> str:
    """The "Sign in with Test IdP" link of the console's sign-in page."""
    async with browser.http.get(url(client, "/console/login?next=" + next_path)) as resp:
        assert resp.status == 200
        links = SSO_LINK.findall(await resp.text())
    assert [label for _, label in links] == ["Test IdP"], links
    return unescape(links[0][0])


def callback_prefix(client) -> str:
    return url(client, "/api/v1/authn/oidc/test/callback")


async def test_console_sign_in_through_the_provider_ends_in_a_console_session(app_client, browser):
    link = await sso_link(browser, app_client, "/console/requests")
    assert link == "/api/v1/authn/oidc/test/login?next=%2Fconsole%2Frequests"
    # The provider's flow, up to its redirect back to us (the provider's login form filled in).
    status, at, _ = await browser.go(url(app_client, link), login="alice",
                                     stop_at=callback_prefix(app_client))
    assert status == 0 and at.startswith(callback_prefix(app_client)), at
    assert browser.logins == 1
    async with browser.http.get(at, allow_redirects=False) as resp:
        assert resp.status == 200 and resp.content_type == "text/html"
        page = await resp.text()
        headers = resp.headers
        set_cookies = resp.headers.getall("Set-Cookie")
    # No token page: a console page that moves on to where the sign-in started.
    assert "access_token" not in page and "eyJ" not in page
    assert "test:alice@example.com" in page and headers["Refresh"] == "0; url=/console/requests"
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    jar = SimpleCookie()
    for header in set_cookies:
        jar.load(header)
    cookie = jar["cp_console"]
    assert cookie["httponly"] is True and cookie["samesite"] == "Strict"
    assert cookie["path"] == "/console" and not cookie["secure"]
    # Bound to the store session the sign-in opened (an OIDC one, with the IdP's groups).
    payload = cookie.value.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims["sub"] == "test:alice@example.com" and "groups" not in claims
    store = app_client.app[STORE].require()
    facts = await store.get_federated_session(claims["sid"])
    assert facts is not None and facts.provider == "test" and facts.groups == ("sre",)

    # The browser follows the page on to the console, signed in.
    async with browser.http.get(urljoin(at, "/console/requests"), allow_redirects=False) as resp:
        assert resp.status == 200, await resp.text()
        assert "test:alice@example.com" in await resp.text()
    # Ending the store session (a logout anywhere) ends the console session at once.
    assert await store.revoke_session(claims["sid"], clock.now())
    async with browser.http.get(url(app_client, "/console/"), allow_redirects=False) as resp:
        assert resp.status == 303 and resp.headers["Location"].startswith("/console/login")


async def test_an_api_sign_in_after_a_console_one_still_gets_its_token(app_client, browser):
    """The console marker is bound to the sign-in that set it: a later API sign-in in the same
    browser (a new browser secret) answers with its token, not a console session."""
    link = await sso_link(browser, app_client)
    await browser.go(url(app_client, link), login="alice", stop_at=callback_prefix(app_client))
    status, _, body = await browser.go(url(app_client, "/api/v1/authn/oidc/test/login"),
                                       login="alice")
    assert status == 201 and isinstance(body, dict) and body["access_token"], body
    assert not any(c.key == "cp_console" for c in browser.http.cookie_jar)


async def test_a_refused_console_sign_in_returns_to_the_sign_in_page(app_client, browser):
    """Refused at the callback (here: the provider reports an error): the console's sign-in
    page names why and offers the buttons again; no JSON problem page, no session."""
    link = await sso_link(browser, app_client)
    _, at, _ = await browser.go(url(app_client, link), login="alice",
                                stop_at=callback_prefix(app_client))
    async with browser.http.get(at + "&error=access_denied", allow_redirects=False) as resp:
        assert resp.status == 303, await resp.text()
        location = resp.headers["Location"]
    assert location == "/console/login?next=%2Fconsole%2F&sso_error=idp_refused"
    async with browser.http.get(urljoin(at, location), allow_redirects=False) as resp:
        page = await resp.text()
    assert resp.status == 200 and 'data-code="idp_refused"' in page
    assert "The sign-in provider did not sign you in." in page and SSO_LINK.search(page)
    assert not any(c.key == "cp_console" for c in browser.http.cookie_jar)
    # The page explains only the codes it knows; anything else put in the URL shows nothing.
    async with browser.http.get(url(app_client, "/console/login?sso_error=<b>x</b>")) as resp:
        assert 'role="alert"' not in await resp.text()


async def test_next_must_be_a_console_path(app_client):
    for next_path in ("https://evil.example/", "/console//evil.example", "/api/v1/approvals"):
        response = await app_client.get("/api/v1/authn/oidc/test/login",
                                        params={"next": next_path}, allow_redirects=False)
        assert response.status == 400, next_path
        assert (await response.json())["code"] == "invalid_request"
