"""A workload token issuer on loopback for the tests: its own keys, discovery and JWKS over HTTP.

Shaped like the CI and cluster issuers the token exchange accepts: GitHub Actions (RS256,
``repository``/``ref``/``environment`` claims) and Kubernetes service accounts (ES256,
``sub: system:serviceaccount:<ns>:<name>``). It counts JWKS fetches (to prove the unknown-kid
refetch is bounded) and answers ``If-None-Match`` with 304.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer
from joserfc import jwt
from joserfc.jwk import ECKey, KeySet, RSAKey


class TestIssuer:
    __test__ = False

    def __init__(self) -> None:
        self.rsa = RSAKey.generate_key(2048, parameters={"kid": "rsa-1", "use": "sig"})
        self.ec = ECKey.generate_key("P-256", parameters={"kid": "ec-1", "use": "sig"})
        self.published = [self.rsa, self.ec]
        self.jwks_fetches = 0
        self.url = ""

    def jwks(self) -> dict[str, Any]:
        return {"keys": [k.as_dict(private=False) for k in self.published]}

    def mint(self, claims: dict[str, Any], *, key: Any = None, alg: str = "RS256",
             header: dict[str, Any] | None = None) -> str:
        key = key or (self.ec if alg.startswith("ES") else self.rsa)
        head = {"alg": alg, "kid": key.kid, "typ": "JWT", **(header or {})}
        return jwt.encode(head, claims, key, algorithms=[alg])

    def github(self, audience: str, **overrides: Any) -> str:
        now = int(time.time())
        claims = {
            "iss": self.url, "aud": audience, "sub": "repo:org/repo:environment:prod",
            "repository": "org/repo", "repository_owner": "org", "ref": "refs/heads/main",
            "environment": "prod", "workflow": "deploy", "run_id": "42",
            "jti": str(uuid.uuid4()), "iat": now, "nbf": now, "exp": now + 300,
        }
        claims.update(overrides)
        return self.mint({k: v for k, v in claims.items() if v is not None})

    def kubernetes(self, audience: str, **overrides: Any) -> str:
        now = int(time.time())
        claims = {
            "iss": self.url, "aud": [audience], "sub": "system:serviceaccount:deploy:runner",
            "kubernetes.io": {"namespace": "deploy"}, "jti": str(uuid.uuid4()),
            "iat": now, "nbf": now, "exp": now + 600,
        }
        claims.update(overrides)
        return self.mint(claims, alg="ES256")

    def app(self) -> web.Application:
        app = web.Application()

        async def discovery(request: web.Request) -> web.Response:
            return web.json_response({"issuer": self.url, "jwks_uri": self.url + "/jwks"})

        async def jwks(request: web.Request) -> web.Response:
            self.jwks_fetches += 1
            etag = '"' + ",".join(str(k.kid) for k in self.published) + '"'
            if request.headers.get("If-None-Match") == etag:
                return web.Response(status=304, headers={"ETag": etag})
            return web.json_response(self.jwks(), headers={"ETag": etag,
                                                             "Cache-Control": "max-age=300"})

        app.router.add_get("/.well-known/openid-configuration", discovery)
        app.router.add_get("/jwks", jwks)
        return app


@asynccontextmanager
async def running_issuer() -> AsyncIterator[TestIssuer]:
    issuer = TestIssuer()
    server = TestServer(issuer.app(), host="127.0.0.1")
    await server.start_server()
    issuer.url = str(server.make_url("")).rstrip("/")
    try:
        yield issuer
    finally:
        await server.close()


def stranger_key() -> RSAKey:
    """A key the issuer never published."""
    return RSAKey.generate_key(2048, parameters={"kid": "rsa-1"})


__all__ = ["KeySet", "TestIssuer", "running_issuer", "stranger_key"]
