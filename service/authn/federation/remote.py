"""Discovery documents and JWKS of foreign issuers, fetched strictly and cached.

Every fetch has a deadline and a size cap, follows no redirect, and needs HTTPS unless the
issuer is on loopback and loopback HTTP is allowed (development and tests). A fetched document
is cached for its ``Cache-Control: max-age`` (clamped to ``[MIN_TTL_S, MAX_TTL_S]``; ``DEFAULT_TTL_S``
without one) and revalidated with its ``ETag``. A token whose ``kid`` is not in the cached set
makes one refetch, at most once per ``REFETCH_INTERVAL_S`` per issuer (a flood of unknown kids
cannot turn into a flood of fetches); after that the kid is refused.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

__all__ = [
    "DEFAULT_TTL_S",
    "MAX_DOCUMENT_BYTES",
    "FetchError",
    "Fetcher",
    "RemoteKeys",
    "check_url",
]

MAX_DOCUMENT_BYTES = 256 * 1024
DEFAULT_TTL_S = 300.0
MIN_TTL_S = 30.0
MAX_TTL_S = 86400.0
REFETCH_INTERVAL_S = 30.0
FETCH_TIMEOUT_S = 5.0
_MAX_AGE = re.compile(r"(?:^|,)\s*max-age\s*=\s*(\d+)", re.IGNORECASE)


class FetchError(Exception):
    """A document could not be fetched or is not acceptable; the message names the URL's host and
    the reason, never a body."""


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_url(url: str, *, allow_http_loopback: bool) -> None:
    """Raise ``FetchError`` unless ``url`` is HTTPS (or loopback HTTP when allowed)."""
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return
    if parts.scheme == "http" and allow_http_loopback and is_loopback(parts.hostname):
        return
    raise FetchError(f"{url!r}: HTTPS is required (loopback HTTP only in development)")


@dataclass
class _Cached:
    value: Any
    etag: str | None
    fresh_until: float


def _ttl(cache_control: str | None) -> float:
    if cache_control:
        lowered = cache_control.lower()
        if "no-store" in lowered or "no-cache" in lowered:
            return MIN_TTL_S
        match = _MAX_AGE.search(cache_control)
        if match:
            return min(MAX_TTL_S, max(MIN_TTL_S, float(match.group(1))))
    return DEFAULT_TTL_S


@dataclass
class Fetcher:
    """JSON documents over HTTP(S) with the rules above; one per application (shares a session)."""

    allow_http_loopback: bool = False
    timeout_s: float = FETCH_TIMEOUT_S
    clock: Callable[[], float] = time.monotonic
    _session: aiohttp.ClientSession | None = None
    _cache: dict[str, _Cached] = field(default_factory=dict)
    #: Documents fetched from the network (not served from the cache), per URL: for status/tests.
    fetches: dict[str, int] = field(default_factory=dict)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                headers={"Accept": "application/json"},
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get_json(self, url: str, *, force: bool = False) -> Any:
        """The JSON document at ``url`` (cached; ``force`` revalidates now)."""
        check_url(url, allow_http_loopback=self.allow_http_loopback)
        now = self.clock()
        cached = self._cache.get(url)
        if cached is not None and not force and cached.fresh_until > now:
            return cached.value
        headers = {"If-None-Match": cached.etag} if cached is not None and cached.etag else {}
        host = urlsplit(url).hostname
        self.fetches[url] = self.fetches.get(url, 0) + 1
        try:
            async with self._client().get(url, headers=headers, allow_redirects=False) as resp:
                if resp.status == 304 and cached is not None:
                    cached.fresh_until = now + _ttl(resp.headers.get("Cache-Control"))
                    return cached.value
                if resp.status != 200:
                    raise FetchError(f"{host}: HTTP {resp.status}")
                if (resp.content_length or 0) > MAX_DOCUMENT_BYTES:
                    raise FetchError(f"{host}: document over {MAX_DOCUMENT_BYTES} bytes")
                body = await resp.content.read(MAX_DOCUMENT_BYTES + 1)
                if len(body) > MAX_DOCUMENT_BYTES:
                    raise FetchError(f"{host}: document over {MAX_DOCUMENT_BYTES} bytes")
                try:
                    value = json.loads(body)
                except ValueError:
                    raise FetchError(f"{host}: not JSON") from None
                self._cache[url] = _Cached(
                    value, resp.headers.get("ETag"), now + _ttl(resp.headers.get("Cache-Control"))
                )
                return value
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise FetchError(f"{host}: {type(exc).__name__}") from None

    async def get_json_bearer(self, url: str, token: str) -> Any:
        """GET a JSON document with a bearer token (userinfo); never cached."""
        check_url(url, allow_http_loopback=self.allow_http_loopback)
        host = urlsplit(url).hostname
        headers = {"Authorization": f"Bearer {token}"}
        try:
            async with self._client().get(url, headers=headers, allow_redirects=False) as resp:
                if resp.status != 200 or "json" not in resp.content_type:
                    raise FetchError(f"{host}: HTTP {resp.status} {resp.content_type}")
                body = await resp.content.read(MAX_DOCUMENT_BYTES + 1)
                if len(body) > MAX_DOCUMENT_BYTES:
                    raise FetchError(f"{host}: document over {MAX_DOCUMENT_BYTES} bytes")
                try:
                    return json.loads(body)
                except ValueError:
                    raise FetchError(f"{host}: not JSON") from None
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise FetchError(f"{host}: {type(exc).__name__}") from None

    async def post_form(
        self, url: str, form: Mapping[str, str], *, auth: tuple[str, str] | None = None
    ) -> tuple[int, Any]:
        """POST a form and read a JSON answer (an OAuth token endpoint): ``(status, document)``."""
        check_url(url, allow_http_loopback=self.allow_http_loopback)
        host = urlsplit(url).hostname
        headers = {}
        if auth is not None:
            # RFC 6749 §2.3.1: client_secret_basic, each part form-urlencoded first.
            pair = f"{quote(auth[0], safe='')}:{quote(auth[1], safe='')}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
        try:
            async with self._client().post(
                url, data=dict(form), headers=headers, allow_redirects=False
            ) as resp:
                body = await resp.content.read(MAX_DOCUMENT_BYTES + 1)
                if len(body) > MAX_DOCUMENT_BYTES:
                    raise FetchError(f"{host}: answer over {MAX_DOCUMENT_BYTES} bytes")
                try:
                    return resp.status, json.loads(body)
                except ValueError:
                    raise FetchError(f"{host}: HTTP {resp.status}, not JSON") from None
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise FetchError(f"{host}: {type(exc).__name__}") from None


@dataclass
class RemoteKeys:
    """One issuer's signing keys: from ``jwks_uri``, or from its discovery document."""

    fetcher: Fetcher
    issuer: str
    jwks_uri: str | None = None
    _last_refetch: float = -1e18
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def discovery(self) -> Mapping[str, Any]:
        url = self.issuer.rstrip("/") + "/.well-known/openid-configuration"
        doc = await self.fetcher.get_json(url)
        if not isinstance(doc, Mapping) or doc.get("issuer") != self.issuer:
            # OpenID Connect Discovery §4.3: the document's issuer must be the one asked for.
            raise FetchError(f"{urlsplit(url).hostname}: discovery issuer does not match")
        return doc

    async def _jwks_url(self) -> str:
        if self.jwks_uri:
            return self.jwks_uri
        uri = (await self.discovery()).get("jwks_uri")
        if not isinstance(uri, str):
            raise FetchError(f"{urlsplit(self.issuer).hostname}: discovery has no jwks_uri")
        return uri

    async def key_set(self, *, refetch: bool = False) -> KeySet:
        url = await self._jwks_url()
        doc = await self.fetcher.get_json(url, force=refetch)
        return _key_set(doc, url)

    async def key_for(self, kid: str | None) -> KeySet:
        """The key set, refetched once (rate-limited) when it lacks ``kid``."""
        keys = await self.key_set()
        if kid is None or _has_kid(keys, kid):
            return keys
        async with self._lock:
            now = self.fetcher.clock()
            if now - self._last_refetch < REFETCH_INTERVAL_S:
                return await self.key_set()
            self._last_refetch = now
            return await self.key_set(refetch=True)


def _has_kid(keys: KeySet, kid: str) -> bool:
    return any(k.kid == kid for k in keys.keys)


def _key_set(doc: Any, url: str) -> KeySet:
    host = urlsplit(url).hostname
    if not isinstance(doc, Mapping) or not isinstance(doc.get("keys"), list):
        raise FetchError(f"{host}: not a JWK set")
    usable = [
        k
        for k in doc["keys"]
        if isinstance(k, dict)
        and k.get("kty") in ("RSA", "EC", "OKP")  # public signature keys only: never "oct"
        and k.get("use", "sig") == "sig"
        and "d" not in k
    ]
    try:
        return KeySet.import_key_set({"keys": usable})
    except (JoseError, ValueError, TypeError):
        raise FetchError(f"{host}: a key of the set cannot be read") from None
