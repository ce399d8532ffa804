"""The real OpenID provider for the sign-in tests: node-oidc-provider as a process on loopback.

Installed from the npm registry by ``npm ci`` from ``tests/authn/oidc_op/package-lock.json`` on
first use (then kept in ``node_modules``, git-ignored). Without node/npm the tests skip with the
reason, except under ``CI=true``, where they fail.

``Browser`` plays the person: it follows redirects with its own cookie jar and submits the
provider's login form, as a browser would.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from html import unescape
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urljoin, urlsplit

import aiohttp
import pytest

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
    if not (OP_DIR / "node_modules" / "oidc-provider").is_dir():
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=OP_DIR, capture_output=True, text=True, timeout=300, check=False,
        )
        if done.returncode != 0:
            _unavailable(f"npm ci for the test OpenID provider failed: {done.stderr[-500:]}")
    return node


@contextmanager
def openid_provider(
    port: int, redirect_uris: list[str], accounts: dict[str, dict[str, Any]], tmp: Path
) -> Iterator[str]:
    """Run the provider on ``127.0.0.1:port``; yield its issuer URL."""
    node = ensure_installed()
    config = tmp / f"op-{port}.json"
    config.write_text(json.dumps({
        "port": port,
        "clients": [{"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET,
                     "redirect_uris": redirect_uris}],
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


_INPUT = re.compile(r'<input[^>]*type="hidden"[^>]*name="([^"]*)"[^>]*value="([^"]*)"',
                    re.IGNORECASE)
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
        """Follow ``url`` through redirects, signing in as ``login`` when the provider shows its
        form. Stops at a URL starting with ``stop_at`` (not requested), or at a final answer:
        ``(status, url, body)`` (the body is JSON when the answer is JSON)."""
        for _ in range(20):
            if stop_at is not None and url.startswith(stop_at):
                return 0, url, None
            async with self.http.request(method, url, allow_redirects=False,
                                         headers=headers) as resp:
                method, headers = "GET", None
                if resp.status in (301, 302, 303, 307):
                    url = urljoin(url, resp.headers["Location"])
                    continue
                text = await resp.text()
                form = _FORM.search(text)
                if resp.status == 200 and form and 'name="login"' in text:
                    if login is None:
                        return resp.status, url, text
                    self.logins += 1
                    action = urljoin(url, unescape(form.group(1)))
                    async with self.http.post(action, allow_redirects=False, data={
                        "prompt": "login", "login": login, "password": "any-password",
                    }) as posted:
                        assert posted.status in (302, 303), await posted.text()
                        url = urljoin(action, posted.headers["Location"])
                    continue
                if resp.status == 200 and form:
                    # A self-submitting page (the provider's form_post and confirmation pages):
                    # a browser runs its script, which posts the hidden inputs.
                    fields = {unescape(n): unescape(v) for n, v in _INPUT.findall(text)}
                    url, method = urljoin(url, unescape(form.group(1))), "POST"
                    data: dict[str, str] | None = fields
                    async with self.http.post(url, data=data, allow_redirects=False) as posted:
                        if posted.status in (301, 302, 303, 307):
                            url, method = urljoin(url, posted.headers["Location"]), "GET"
                            continue
                        body = await posted.text()
                        if "json" in posted.content_type:
                            return posted.status, url, json.loads(body)
                        return posted.status, url, body
                if "json" in resp.content_type:
                    return resp.status, url, json.loads(text)
                return resp.status, url, text
        raise AssertionError("too many redirects")


def query_of(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
