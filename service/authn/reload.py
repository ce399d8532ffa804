"""Hot reload of the identities file: poll it, and reload at once on SIGHUP.

A changed file (``cpctl identities add-user``, or an edit) is loaded off the event loop and
swapped in atomically (``Authenticator.replace_identities``); the sessions of subjects that were
disabled or removed are revoked. A file that fails to load keeps the last good set serving: the
authn status reports ``degraded`` with the error until a good file is loaded. Each change of
state is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import weakref
from collections.abc import AsyncIterator
from pathlib import Path

from .. import clock, sighup
from ..repeats import log_failure
from ..store.base import StoreError
from . import identities
from .identities import IdentitiesError, IdentityDirectory
from .sessions import Authenticator

__all__ = ["POLL_INTERVAL_S", "IdentityFile", "reloading"]

#: How often the identities file is looked at (one ``stat``).
POLL_INTERVAL_S = 1.0

log = logging.getLogger("controlplane.authn")

_Stamp = tuple[int, int, int] | None


def _stamp(path: Path) -> _Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class IdentityFile:
    """The identities file and the version of it last read (good or not)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: _Stamp = None

    def load(self) -> IdentityDirectory:
        """Load it (blocking); the version read is remembered even when it fails to load."""
        self._stamp = _stamp(self.path)
        return identities.load(self.path)

    def changed(self) -> bool:
        return _stamp(self.path) != self._stamp


async def reload_once(authenticator: Authenticator, source: IdentityFile) -> bool:
    """Load the file and swap it in, then revoke the dropped subjects' sessions; False if the
    file could not be loaded (the last good set keeps serving)."""
    try:
        directory = await asyncio.to_thread(source.load)
    except IdentitiesError as exc:
        if authenticator.identities_error != str(exc):
            log.error("identities reload failed, keeping the last good set: %s", exc,
                      extra={"fields": {"event": "authn.identities_reload_failed"}})
        authenticator.identities_error = str(exc)
        return False
    dropped = authenticator.replace_identities(directory)
    log.info("identities reloaded: %d identities", len(directory),
             extra={"fields": {"event": "authn.identities_reloaded", "dropped": dropped}})
    await _revoke(authenticator)
    return True


async def _revoke(authenticator: Authenticator) -> None:
    """Revoke what is queued; a failure is logged once, until a revocation succeeds again."""
    if not authenticator.revocations_pending:
        return
    try:
        count = await authenticator.revoke_dropped(clock.now())
    except StoreError:
        if authenticator not in _failing:
            _failing.add(authenticator)
            log.warning("revoking the sessions of disabled or removed identities failed; "
                        "retrying (their tokens are refused meanwhile)",
                        extra={"fields": {"event": "authn.sessions_revoke_failed"}})
        return
    _failing.discard(authenticator)
    log.info("revoked %d sessions of disabled or removed identities", count,
             extra={"fields": {"event": "authn.sessions_revoked", "sessions": count}})


#: Authenticators whose last revocation attempt failed (so the next failure is not logged).
_failing: weakref.WeakSet[Authenticator] = weakref.WeakSet()


@contextlib.asynccontextmanager
async def reloading(
    authenticator: Authenticator, source: IdentityFile, interval_s: float | None = None
) -> AsyncIterator[None]:
    """While open: poll every ``interval_s`` (``POLL_INTERVAL_S`` by default; 0 turns polling
    off) and reload on SIGHUP."""
    if interval_s is None:
        interval_s = POLL_INTERVAL_S

    async def poll() -> None:
        if source.changed():
            await _guarded(authenticator, source)
        else:
            await _revoke(authenticator)  # retries a revocation the store refused

    async with sighup.watching(poll, lambda: _guarded(authenticator, source), interval_s):
        yield


async def _guarded(authenticator: Authenticator, source: IdentityFile) -> None:
    try:
        await reload_once(authenticator, source)
    except Exception as exc:
        log_failure(log, "identities reload failed", exc, event="identities.reload_failed",
                    expected=(OSError,))
