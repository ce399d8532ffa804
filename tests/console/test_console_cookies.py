"""The console's cookies over HTTPS carry the ``__Host-`` prefix (``Secure``, ``Path=/``, no
``Domain``), so a sibling subdomain cannot plant one the console would accept; over plain HTTP
(local development) they keep their plain names. HTTPS here is a TLS-terminating proxy's
``X-Forwarded-Proto: https``; the client sends cookies by hand, as a browser would."""

from __future__ import annotations

import re
from http.cookies import SimpleCookie

import aiohttp

from service import clock
from service import consolesession as cookies
from service.authn.sessions import AUTHENTICATOR
from tests.auth import PASSWORDS

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
HTTPS = {"X-Forwarded-Proto": "https"}


def set_cookies(response: aiohttp.ClientResponse) -> SimpleCookie:
    jar = SimpleCookie()
    for header in response.headers.getall("Set-Cookie", []):
        jar.load(header)
    return jar


async def sign_in(http: aiohttp.ClientSession, base: str, subject: str,
                  headers: dict[str, str]) -> tuple[aiohttp.ClientResponse, SimpleCookie]:
    async with http.get(base + "/console/login", headers=headers) as form:
        page, pre = await form.text(), set_cookies(form)
    token = CSRF.search(page)
    assert token is not None
    name = next(k for k in pre if k.endswith("cp_console_login"))
    async with http.post(base + "/console/login", allow_redirects=False,
                         headers={**headers, "Cookie": f"{name}={pre[name].value}"},
                         data={"csrf": token.group(1), "subject_id": subject,
                               "password": PASSWORDS[subject], "next": "/console/"}) as resp:
        return resp, set_cookies(resp)


async def test_console_cookies_use_the_host_prefix_over_https(client):
    base = str(client.make_url("")).rstrip("/")
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        async with http.get(base + "/console/login", headers=HTTPS) as resp:
            login_cookie = set_cookies(resp)
        assert list(login_cookie) == ["__Host-cp_console_login"]
        response, jar = await sign_in(http, base, "bob", HTTPS)
        assert response.status == 303
        cookie = jar["__Host-cp_console"]
        assert cookie["secure"] is True and cookie["path"] == "/" and not cookie["domain"]
        assert cookie["httponly"] is True and cookie["samesite"] == "Strict"
        assert "cp_console" not in jar
        async with http.get(base + "/console/", allow_redirects=False, headers={
                **HTTPS, "Cookie": f"__Host-cp_console={cookie.value}"}) as resp:
            assert resp.status == 200 and "bob" in await resp.text()

        # A cookie without the prefix (what a sibling subdomain can set for the parent domain:
        # here a valid console cookie for someone else's session) is not read over HTTPS.
        authenticator = client.app[AUTHENTICATOR]
        issued = await authenticator.login_password("alice", PASSWORDS["alice"], None, clock.now())
        principal = await authenticator.authenticate_bearer(issued.access_token, clock.now())
        planted, _ = cookies.issue(authenticator, principal, expires_at=clock.now() + 600,
                                   now=clock.now())
        async with http.get(base + "/console/", allow_redirects=False,
                            headers={**HTTPS, "Cookie": f"cp_console={planted}"}) as resp:
            assert resp.status == 303 and resp.headers["Location"].startswith("/console/login")

        # Sign-out clears the prefixed cookie.
        async with http.get(base + "/console/", headers={
                **HTTPS, "Cookie": f"__Host-cp_console={cookie.value}"}) as resp:
            csrf = CSRF.search(await resp.text())
        assert csrf is not None
        async with http.post(base + "/console/logout", allow_redirects=False,
                             headers={**HTTPS, "Cookie": f"__Host-cp_console={cookie.value}"},
                             data={"csrf": csrf.group(1)}) as resp:
            cleared = set_cookies(resp)["__Host-cp_console"]
        assert cleared.value == "" and cleared["path"] == "/" and cleared["secure"] is True


async def test_plain_http_keeps_plain_cookie_names_for_development(client):
    base = str(client.make_url("")).rstrip("/")
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        response, jar = await sign_in(http, base, "bob", {})
        assert response.status == 303
        cookie = jar["cp_console"]
        assert not cookie["secure"] and cookie["path"] == "/console"
        assert not any(name.startswith("__Host-") for name in jar)
