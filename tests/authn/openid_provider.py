"""The real OpenID provider for the sign-in tests: node-oidc-provider as a process on loopback.

Installed from the npm registry by ``npm ci`` from ``tests/authn/oidc_op/package-lock.json`` on
first use (then kept in ``node_modules``, git-ignored). Without node/npm the tests skip with the
reason, except under ``CI=true``, where they fail.

``Browser`` plays the person: it follows redirects with its own cookie jar and submits the
provider's login form, as a browser would.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from html import unescape
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urljoin, urlsplit

import aiohttp
import pytest
from aiohttp import web

from tests.servers import free_port

OP_DIR = Path(__file__).resolve().parent / "oidc_op"
CLIENT_ID = "controlplane"
CLIENT_SECRET = "op-test-client-secret"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def ensure_installed() -> str:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        _unavailable("node and npm are needed to run the test OpenID provider")
    assert node is not None and npm is not None
    # Test workers (pytest-xdist) share the directory: one installs, the others wait.
    with open(OP_DIR / ".install-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (OP_DIR / "node_modules" / "oidc-provider" / "package.json").is_file():
            done = subprocess.run(
                [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=OP_DIR, capture_output=True, text=True, timeout=300, check=False,
            )
            if done.returncode != 0:
                _unavailable(f"npm ci for the test OpenID provider failed: {done.stderr[-500:]}")
    return node


@contextmanager
def openid_provider(
    port: int, redirect_uris: list[str], accounts: dict[str, dict[str, Any]], tmp: Path,
    issuer: str | None = None,
    extra_clients: list[dict[str, Any]] | None = None,
    conform: bool = False,
) -> Iterator[str]:
    """Run the provider on ``127.0.0.1:port`` (its issuer URL ``issuer`` when it sits behind a
    proxy); yield its issuer URL."""
    node = ensure_installed()
    config = tmp / f"op-{port}.json"
    config.write_text(json.dumps({
        "port": port,
        **({"issuer": issuer} if issuer else {}),
        "conform": conform,
        "clients": [{"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET,
                     "redirect_uris": redirect_uris}, *(extra_clients or [])],
        "accounts": accounts,
    }))
    log = open(tmp / f"op-{port}.log", "w+")
    proc = subprocess.Popen([node, str(OP_DIR / "provider.mjs"), str(config)], cwd=OP_DIR,
                            stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 20
        line = proc.stdout.readline()
        if not line.startswith("ready ") or time.monotonic() > deadline:
            log.seek(0)
            raise RuntimeError(f"the test OpenID provider did not start: {line!r} {log.read()[-1000:]}")
        yield line.split(" ", 1)[1].strip()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        log.close()


_INPUT = re.compile(r"<input\b[^>]*>", re.IGNORECASE)
_ATTR = re.compile(r'([a-z_-]+)="([^"]*)"', re.IGNORECASE)
_FORM = re.compile(r'<form(?=[^>]*method="post")[^>]*action="([^"]+)"', re.IGNORECASE)


class Browser:
    """A person's browser: a cookie jar, redirects followed, the provider's login form filled."""

    def __init__(self) -> None:
        self.http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
        self.logins = 0

    async def close(self) -> None:
        await self.http.close()

    async def go(
        self, url: str, *, login: str | None = None, stop_at: str | None = None,
        method: str = "GET", headers: dict[str, str] | None = None,
    ) -> tuple[int, str, Any]:
        """Follow ``url`` through redirects and self-submitting forms, signing in as ``login``
        when the provider shows its login form. Stops at a URL starting with ``stop_at`` (not
        requested), or at a final answer: ``(status, url, body)`` (JSON bodies parsed)."""
        data: dict[str, str] | None = None
        for _ in range(30):
            if stop_at is not None and url.startswith(stop_at):
                return 0, url, None
            async with self.http.request(method, url, data=data, headers=headers,
                                         allow_redirects=False) as resp:
                method, data, headers = "GET", None, None
                if resp.status in (301, 302, 303, 307):
                    url = urljoin(url, resp.headers["Location"])
                    continue
                text = await resp.text()
                if "json" in resp.content_type:
                    return resp.status, url, json.loads(text)
                form = _FORM.search(text)
                if resp.status != 200 or not form:
                    return resp.status, url, text
                fields = _fields(text[form.start():])
                if "password" in text and 'name="login"' in text:
                    if login is None:
                        return resp.status, url, text
                    self.logins += 1
                    fields.update({"login": login, "password": "any-password"})
                # A form the person submits as shown (the provider's confirmation, form_post
                # and login pages): its inputs, posted to its action.
                url, method, data = urljoin(url, unescape(form.group(1))), "POST", fields
        raise AssertionError("too many redirects")


def _fields(html: str) -> dict[str, str]:
    """``name -> value`` of the first form's inputs that carry both."""
    fields: dict[str, str] = {}
    for tag in _INPUT.findall(html[: html.find("</form>") + 1 or None]):
        attrs = dict(_ATTR.findall(tag))
        if "name" in attrs and "value" in attrs:
            fields[unescape(attrs["name"])] = unescape(attrs["value"])
    return fields


def query_of(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


class TamperingProxy:
    """A reverse proxy in front of the provider that can rewrite the token endpoint's answer:
    to show that a forged or substituted ID token, arriving exactly where a real one would, is
    refused by the sign-in callback. Counts JWKS fetches."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.tamper: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        self.jwks_fetches = 0
        self.id_tokens: list[str] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/jwks":
            self.jwks_fetches += 1
        # The Host header goes through: the provider builds its URLs from it (the front's).
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() not in ("content-length", "transfer-encoding")}
        body = await request.read()
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
            async with http.request(request.method, self.upstream + request.path_qs,
                                    headers=headers, data=body or None,
                                    allow_redirects=False) as resp:
                content = await resp.read()
                out = {k: v for k, v in resp.headers.items() if k.lower() not in
                       ("content-length", "transfer-encoding", "content-encoding", "connection")}
                if request.path == "/token" and resp.status == 200:
                    answer = json.loads(content)
                    self.id_tokens.append(answer["id_token"])
                    if self.tamper is not None:
                        answer = self.tamper(answer)
                    content = json.dumps(answer).encode()
                response = web.Response(status=resp.status, body=content)
                for key, value in resp.headers.items():
                    if key.lower() == "set-cookie":
                        response.headers.add(key, value)
                for key, value in out.items():
                    if key.lower() != "set-cookie":
                        response.headers[key] = value
                return response

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app


# -- what a test of signing in through the provider needs (imported as fixtures by such tests)


@pytest.fixture(scope="module")
def ports() -> tuple[int, int]:
    """The service's and the provider's loopback ports (the redirect URIs name the first)."""
    return free_port(), free_port()


@pytest.fixture
async def browser() -> Any:
    b = Browser()
    yield b
    await b.close()


def url(client: Any, path: str) -> str:
    """``path`` on the test client's server, as a browser would follow it."""
    return str(client.make_url(path))
