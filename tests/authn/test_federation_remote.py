"""Fetching issuers' documents: HTTPS rule, size cap, no redirects, Cache-Control and ETag; and
the federation configuration's own checks."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from service.authn.federation.remote import MAX_DOCUMENT_BYTES, Fetcher, FetchError, check_url
from service.config import ConfigError, load
from tests.conftest import REPO


@pytest.fixture
async def site():
    hits: dict[str, int] = {}

    async def doc(request: web.Request) -> web.Response:
        hits["doc"] = hits.get("doc", 0) + 1
        if request.headers.get("If-None-Match") == '"v1"':
            return web.Response(status=304, headers={"ETag": '"v1"'})
        return web.json_response({"keys": []}, headers={"ETag": '"v1"', "Cache-Control": "max-age=60"})

    async def big(request: web.Request) -> web.Response:
        return web.Response(body=b"[" + b"0," * MAX_DOCUMENT_BYTES + b"0]",
                            content_type="application/json")

    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPFound("/doc")

    app = web.Application()
    app.router.add_get("/doc", doc)
    app.router.add_get("/big", big)
    app.router.add_get("/moved", moved)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield str(server.make_url("")).rstrip("/"), hits
    await server.close()


async def test_cache_control_and_etag(site):
    base, hits = site
    now = [0.0]
    fetcher = Fetcher(allow_http_loopback=True, clock=lambda: now[0])
    try:
        assert await fetcher.get_json(base + "/doc") == {"keys": []}
        assert await fetcher.get_json(base + "/doc") == {"keys": []}
        assert hits["doc"] == 1  # fresh for max-age
        now[0] = 61.0
        assert await fetcher.get_json(base + "/doc") == {"keys": []}  # revalidated: 304
        assert hits["doc"] == 2
        with pytest.raises(FetchError, match="over"):
            await fetcher.get_json(base + "/big")
        with pytest.raises(FetchError, match="HTTP 302"):
            await fetcher.get_json(base + "/moved")
    finally:
        await fetcher.close()


def test_https_is_required_except_for_allowed_loopback():
    check_url("https://idp.example.com/jwks", allow_http_loopback=False)
    check_url("http://127.0.0.1:9/jwks", allow_http_loopback=True)
    for url, allowed in [("http://idp.example.com/jwks", True), ("http://127.0.0.1:9/", False),
                         ("file:///etc/passwd", True)]:
        with pytest.raises(FetchError):
            check_url(url, allow_http_loopback=allowed)


def _config(authn: dict) -> object:
    return load(None, {}, base_dir=REPO, overrides={"authn": authn})


def test_configuration_refuses_weak_or_open_settings():
    issuer = {"name": "gh", "issuer": "https://token.example", "audience": "a", "subject": "ci:{sub}",
              "conditions": {"repository": "org/repo"}}
    assert _config({"workload": {"issuers": [issuer]}}).federation.workload_issuers[0].conditions
    with pytest.raises(ConfigError):  # HMAC: a public key must never double as a shared secret
        _config({"workload": {"issuers": [{**issuer, "algorithms": ["HS256"]}]}})
    with pytest.raises(ConfigError):
        _config({"workload": {"issuers": [{**issuer, "algorithms": ["none"]}]}})
    with pytest.raises(ConfigError):  # any workload of the issuer would do
        _config({"workload": {"issuers": [{**issuer, "conditions": {}}]}})
    with pytest.raises(ConfigError):
        _config({"workload": {"issuers": [issuer, issuer]}})
    provider = {"name": "corp", "issuer": "https://idp.example", "client_id": "c",
                "client_secret": "s3cret-value"}
    config = _config({"oidc": {"providers": [provider]}})
    assert "s3cret-value" not in repr(config.federation)
