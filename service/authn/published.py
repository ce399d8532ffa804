"""Token signing keys shared through the store, so any replica verifies any replica's tokens.

Each replica signs with the newest key of its own ring (``keyring.KeyRing``, in its state dir; the
private key never leaves it) and publishes the public half of every key in its ring to the store
(``store.base.PublishedKeyOps``), with the window in which that key verifies. Every worker reads
the published keys back in the background (every ``SYNC_INTERVAL_S``) and, when a token names a
key it has not seen yet, once more at once (at most every ``LOOKUP_INTERVAL_S``, so forged key ids
cannot turn into a store read each). The JWKS endpoint and ``authn/status`` list them all.

What a published key is trusted for: the kid must be the RFC 7638 thumbprint of the key (a row
whose kid does not match is ignored), and the token must still pass every other check (issuer,
audience, lifetime, and a live session in the same store). A replica that stops cleanly retires
its active key (it verifies for ``retain_s`` more, as after a rotation).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .. import clock
from ..background import background
from ..store.base import PublishedKey, Store, StoreError
from .keyring import ALG, KeyRing, load_public_key, public_jwk, thumbprint

__all__ = ["LOOKUP_INTERVAL_S", "SYNC_INTERVAL_S", "PublishedKeyRing"]

log = logging.getLogger("controlplane.authn")

#: How often each worker publishes its ring (when it changed) and reads every replica's keys.
SYNC_INTERVAL_S = 1.0
#: The least time between two reads caused by tokens naming a key not seen yet.
LOOKUP_INTERVAL_S = 0.25


class PublishedKeyRing(KeyRing):
    """This replica's ring, plus the public keys every other replica published to the store."""

    def __init__(self, directory: Path, *, retain_s: float) -> None:
        super().__init__(directory, retain_s=retain_s)
        self._store: Callable[[], Store] | None = None
        # kid -> (public key, end of its window or None while it signs on its replica)
        self._published: dict[str, tuple[Ed25519PublicKey, float | None, float]] = {}
        self._published_state: tuple[tuple[str, float | None], ...] | None = None
        self._last_lookup = 0.0
        self._lookup_lock = asyncio.Lock()

    def attach(self, store: Callable[[], Store]) -> None:
        """Publish to and read from ``store()`` (raises ``StoreUnavailable`` while there is none)."""
        self._store = store

    # -- verification ---------------------------------------------------------------------------

    def verification_key(self, kid: str, now: float) -> Ed25519PublicKey | None:
        local = super().verification_key(kid, now)
        if local is not None or self._is_local(kid):
            return local
        published = self._published.get(kid)
        if published is None:
            return None
        key, verify_until, _ = published
        if verify_until is not None and now > verify_until:
            return None
        return key

    def kids(self, now: float) -> list[str]:
        """This replica's keys (its active one first), then the other replicas', newest first."""
        local = super().kids(now)
        seen = set(local)
        others = sorted(
            ((kid, created) for kid, (_, until, created) in self._published.items()
             if kid not in seen and (until is None or now <= until)),
            key=lambda item: -item[1],
        )
        return local + [kid for kid, _ in others]

    def jwks(self, now: float) -> dict[str, list[dict[str, str]]]:
        keys = []
        for kid in self.kids(now):
            entry = self._entries.get(kid)
            public = entry.key.public_key if entry is not None else self._published[kid][0]
            keys.append({**public_jwk(public), "kid": kid, "alg": ALG, "use": "sig"})
        return {"keys": keys}

    # -- the store --------------------------------------------------------------------------------

    async def sync(self, now: float) -> None:
        """Publish this ring when it changed since the last time, then read every published key.
        Raises ``StoreError`` when the store cannot be reached (the keys known so far stay)."""
        store = self._require()
        state = self._local_state()
        if state != self._published_state:
            await store.publish_signing_keys(self._local_keys(now), now)
            self._published_state = state
        self._take(await store.published_signing_keys(now))

    async def look_up(self, now: float) -> bool:
        """Read the published keys again for a token naming a key not seen yet; True if the set
        changed. Reads at most once per ``LOOKUP_INTERVAL_S`` (a burst of forged kids waits for
        one read, then is answered from memory)."""
        async with self._lookup_lock:
            if time.monotonic() - self._last_lookup < LOOKUP_INTERVAL_S:
                return False
            before = set(self._published)
            try:
                self._take(await self._require().published_signing_keys(now))
            except StoreError:
                return False
            finally:
                self._last_lookup = time.monotonic()
            return set(self._published) != before

    async def retire(self, now: float) -> None:
        """On a clean stop: publish the active key as retired (it verifies ``retain_s`` more)."""
        store = self._require()
        keys = [
            k if k.verify_until is not None else
            PublishedKey(k.kid, k.public_key, k.created_at, now + self.retain_s)
            for k in self._local_keys(now)
        ]
        await store.publish_signing_keys(keys, now)
        self._published_state = None

    @contextlib.asynccontextmanager
    async def publishing(self, interval_s: float = SYNC_INTERVAL_S) -> AsyncIterator[None]:
        """Sync now (a store that is away is tried again each interval), then every
        ``interval_s`` while open; retire the active key on a clean exit."""
        await self._sync_logged()

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval_s)
                await self._sync_logged()

        try:
            async with background(loop()):
                yield
        finally:
            try:
                await self.retire(clock.now())
            except StoreError:
                log.warning("could not retire the signing key in the store (it stays listed)")

    # -- internals ------------------------------------------------------------------------------

    def _require(self) -> Store:
        if self._store is None:
            raise StoreError("the key ring has no store attached")
        return self._store()

    async def _sync_logged(self) -> None:
        try:
            await self.sync(clock.now())
        except StoreError as exc:
            log.debug("signing keys not synced with the store: %s", exc)
        except Exception:
            log.exception("signing key sync failed")

    def _is_local(self, kid: str) -> bool:
        # A key of this ring past its window is refused here, not looked up among the others.
        return kid in self._entries

    def _local_state(self) -> tuple[tuple[str, float | None], ...]:
        return tuple((d["kid"], d["verify_until"]) for d in self.describe(0.0))

    def _local_keys(self, now: float) -> list[PublishedKey]:
        self.describe(now)  # picks up a rotation or prune made by another process
        return [
            PublishedKey(kid, public_jwk(entry.key.public_key)["x"], entry.key.created_at,
                         entry.verify_until)
            for kid, entry in self._entries.items()
        ]

    def _take(self, rows: list[PublishedKey]) -> None:
        published: dict[str, tuple[Ed25519PublicKey, float | None, float]] = {}
        for row in rows:
            try:
                key = load_public_key({"kty": "OKP", "crv": "Ed25519", "x": row.public_key})
            except (ValueError, TypeError):
                log.warning("published signing key %s is not an Ed25519 key: ignored", row.kid[:64])
                continue
            if thumbprint(key) != row.kid:
                log.warning("published signing key %s does not match its key id: ignored",
                            row.kid[:64])
                continue
            published[row.kid] = (key, row.verify_until, row.created_at)
        self._published = published
