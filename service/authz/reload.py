"""Hot reload of the policy revision: poll the files (or follow the store), reload on SIGHUP.

A changed revision is compiled and vetted off the event loop and swapped in atomically by the
engine; a revision that fails keeps the last good one serving (the engine reports the error).
With ``policies.source: store`` (``StoreFollower``) the revision is the fleet's active one,
published signed in the store; every process of every replica converges on it. With
``policies.candidate_revision`` (``CandidateRevision``) a published, inactive revision is the
shadow candidate, read and verified the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from .. import sighup
from ..background import background
from ..clock import iso
from ..config import PolicyStoreConfig
from ..repeats import log_failure
from ..store.base import PolicyActivation, Store, StoreError
from .activations import ActivationRefused, verify_activation
from .engine import PolicyEngine
from .revisions import Bundle, BundleError, SignatureError, materialize, verify
from .shadow import Shadow
from .source import Snapshot

__all__ = [
    "CHANNEL",
    "POLICY_FOLLOWER",
    "CandidateRevision",
    "RevisionRefused",
    "StoreFollower",
    "fetch_revision",
    "following",
    "materialize_revision",
    "reloading",
    "shadowing",
]

log = logging.getLogger("controlplane.authz")


@contextlib.asynccontextmanager
async def reloading(engine: PolicyEngine, interval_s: float) -> AsyncIterator[None]:
    """While open: poll every ``interval_s`` (0 turns polling off) and reload on SIGHUP."""

    async def poll() -> None:
        try:
            if engine.poll_changes():
                await asyncio.to_thread(engine.reload)
        except Exception as exc:
            _reload_failed(exc)

    async with sighup.watching(poll, lambda: _reload(engine), interval_s):
        yield


async def _reload(engine: PolicyEngine) -> None:
    try:
        await asyncio.to_thread(engine.reload)
    except Exception as exc:
        _reload_failed(exc)


def _reload_failed(exc: Exception) -> None:
    """A poll or reload that raised (a revision that is merely bad is rejected, not raised).
    It fails the same way every poll until someone acts: one line per cause per interval,
    without a traceback when the file system refused (a path that cannot be resolved, the
    descriptor limit)."""
    log_failure(log, "policy reload failed", exc, event="policy.reload_failed",
                expected=(OSError,))


# ---- policies.source: store ------------------------------------------------------------------

#: The PostgreSQL channel migration 0007's trigger notifies on every activation.
CHANNEL = "controlplane_policy"


class RevisionRefused(Exception):
    """A published revision that must not be loaded: missing, malformed or badly signed."""


async def fetch_revision(store: Store, revision_id: str,
                         trusted: Mapping[str, Any]) -> Snapshot:
    """The engine snapshot of published revision ``revision_id``, only if a trusted key signed
    exactly its content (``RevisionRefused`` otherwise; ``StoreError`` if the store fails).

    What a store-following process loads, and what a candidate revision (shadow evaluation,
    replay) is read with: ``engine.install(snapshot)``, or
    ``revisions.materialize(Bundle.from_doc(record.bundle), directory)`` for a directory."""
    record = await store.get_policy_revision(revision_id)
    if record is None:
        raise RevisionRefused("the revision is not in the store")
    try:
        bundle = Bundle.from_doc(record.bundle)
        verify(bundle, record.signature, trusted, revision=record.id)
        snapshot = await asyncio.to_thread(bundle.snapshot)
    except SignatureError as exc:
        raise RevisionRefused(f"signature: {exc.reason}: {exc}") from None
    except BundleError as exc:
        raise RevisionRefused(f"bundle: {exc}") from None
    if snapshot.revision != record.id:
        raise RevisionRefused("bundle: its content is not the revision it is stored as")
    return snapshot


async def materialize_revision(store: Store, revision_id: str, trusted: Mapping[str, Any],
                               directory: Path) -> Snapshot:
    """``fetch_revision``, and its files written into ``directory`` (a policies directory, e.g.
    for ``policies.candidate_dir``); returns the verified snapshot."""
    snapshot = await fetch_revision(store, revision_id, trusted)
    record = await store.get_policy_revision(revision_id)
    if record is None:  # removed between the two reads: revisions are never removed
        raise RevisionRefused("the revision is not in the store")
    bundle = Bundle.from_doc(record.bundle)
    if bundle.digest != record.digest or record.id != snapshot.revision:
        raise RevisionRefused("bundle: the stored revision changed while it was read")
    await asyncio.to_thread(materialize, bundle, directory)
    return snapshot


class StoreFollower:
    """Keeps this process on the fleet's active revision (``policies.source: store``).

    Each ``sync`` reads the latest activation and follows it only if a trusted activation key
    signed exactly that row and its seq is above the last one this process accepted
    (``activations.verify_activation``): a row written in the database alone, a signature
    copied onto another row, or an older signed activation replayed is refused (logged once,
    ``policy.activation_refused``; ``activation_listeners`` see its reason) and the revision
    of the last accepted activation keeps serving. When an accepted activation names another
    revision than the engine serves, the revision is read, its signature verified against the
    trusted keys, and only then vetted and swapped in by the engine. A revision that fails any
    step is refused (logged once, ``policy.revision_refused``) and the last good revision keeps
    serving; the process reports ``degraded`` at once for a refusal of either kind, and when it
    has not run the active revision for ``convergence_s`` for any other reason (the store
    cannot be read, loading is stuck).
    """

    def __init__(self, engine: PolicyEngine, store: Callable[[], Store | None],
                 config: PolicyStoreConfig, trusted: Mapping[str, Any],
                 *, trust_error: str | None = None,
                 activation_keys: Mapping[str, Any] | None = None) -> None:
        self._engine = engine
        self._store = store
        self._config = config
        self._trusted = trusted
        self._trust_error = trust_error
        #: the last activation accepted (signed by a trusted activation key, in sequence)
        self._active: PolicyActivation | None = None
        self._activation_keys: Mapping[str, Any] = activation_keys or {}
        #: the latest activation row when it was refused: (seq, revision, reason, error)
        self._activation_refused: tuple[int, str, str, str] | None = None
        #: revision id -> why it was refused (content and keys do not change: never re-vetted)
        self._refused: dict[str, str] = {}
        self._error: str | None = None
        #: monotonic time since which this process is not known to run the active revision
        self._behind_since: float | None = None
        self._synced_at: float | None = None
        #: the engine rejected (vetting) the last revision it was given: its status says so
        self._engine_rejected = False
        #: the directory's revision, once loaded after an activation of directory mode
        self._directory: str | None = None
        self._lock = asyncio.Lock()
        self.wake = asyncio.Event()
        self.listening = False
        #: called with (active revision id or None, whether this process runs it) after a sync
        self.listeners: list[Callable[[str | None, bool], None]] = []
        #: called with the reason of each activation refused (once per refused row)
        self.activation_listeners: list[Callable[[str], None]] = []

    @property
    def active(self) -> PolicyActivation | None:
        return self._active

    @property
    def converged(self) -> bool:
        active = self._active
        if active is not None and active.revision_id == "":  # directory mode again
            return self._directory is not None and self._directory == self._engine.revision
        return active is not None and active.revision_id == self._engine.revision

    @property
    def accepted_seq(self) -> int:
        """The seq of the last activation this process accepted (0: none): the next one
        must be above it."""
        return self._active.seq if self._active else 0

    @property
    def load_ok(self) -> bool:
        """The policy this process should run is loaded and serving: the accepted activation's
        revision (the directory's before any), and no later activation or revision refused."""
        if self._activation_refused is not None or self._engine.revision is None:
            return False
        active = self._active
        if active is None:
            return not self._engine_rejected
        return self.converged and active.revision_id not in self._refused

    async def sync(self) -> None:
        """Read the active revision and run it if this process does not yet. Never raises."""
        async with self._lock:
            try:
                await self._sync()
            except Exception as exc:
                log_failure(log, "policy store sync failed", exc, event="policy.sync_failed",
                            expected=(StoreError,))
                self._behind(None)
            for listener in self.listeners:
                listener(self._active.revision_id if self._active else None, self.converged)

    async def _sync(self) -> None:
        store = self._store()
        if store is None:
            self._behind("the store is unreachable: the active revision cannot be read")
            return
        try:
            latest = await store.active_policy()
        except StoreError:
            self._behind("the store is unreachable: the active revision cannot be read")
            return
        self._synced_at = time.time()
        if latest is not None and latest != self._active:
            try:
                verify_activation(latest, self._activation_keys,
                                  after_seq=self._active.seq if self._active else None)
            except ActivationRefused as exc:
                self._refuse_activation(latest, exc)
                return
        self._activation_refused = None
        active = self._active = latest
        if active is None:
            # Nothing published and activated yet: the local policies.dir serves (bootstrap).
            self._caught_up()
            return
        if active.revision_id == "":
            await self._run_directory(active)
            return
        self._directory = None
        if active.revision_id == self._engine.revision:
            if self._engine_rejected:
                # The engine still reports the revision it rejected; the fleet has moved back
                # to the one it serves: confirm it (same id, so nothing is vetted again).
                with contextlib.suppress(StoreError, RevisionRefused):  # retried next sync
                    snapshot = await fetch_revision(store, active.revision_id, self._trusted)
                    await asyncio.to_thread(self._engine.install, snapshot)
                    self._engine_rejected = False
            self._caught_up()
            return
        refused = self._refused.get(active.revision_id)
        if refused is not None:
            self._behind(refused)
            return
        try:
            if self._trust_error is not None:
                raise SignatureError("untrusted_key", self._trust_error)
            snapshot = await fetch_revision(store, active.revision_id, self._trusted)
        except StoreError:
            self._behind("the store is unreachable: the active revision cannot be read")
            return
        except RevisionRefused as exc:
            self._refuse(active.revision_id, str(exc))
            return
        except SignatureError as exc:
            self._refuse(active.revision_id, f"signature: {exc.reason}: {exc}")
            return
        result = await asyncio.to_thread(self._engine.install, snapshot)
        if not result.ok or self._engine.revision != snapshot.revision:
            self._engine_rejected = not result.ok
            self._refuse(snapshot.revision, result.error or "the engine did not load it")
            return
        log.info("policy revision %s of the store is running", snapshot.revision,
                 extra={"fields": {"event": "policy.store_revision_running",
                                   "revision": snapshot.revision, "seq": active.seq}})
        self._caught_up()

    async def _run_directory(self, active: PolicyActivation) -> None:
        """A rollback to directory mode: run this process's policies.dir (read again)."""
        if self.converged:
            self._caught_up()
            return
        result = await asyncio.to_thread(self._engine.reload)
        if not result.ok:
            self._engine_rejected = True
            self._behind(f"directory mode: the policies directory is rejected: {result.error}")
            return
        self._engine_rejected = False
        self._directory = self._engine.revision
        log.info("policy directory mode (activation seq %s): running %s", active.seq,
                 self._engine.revision,
                 extra={"fields": {"event": "policy.store_directory_running",
                                   "revision": self._engine.revision, "seq": active.seq}})
        self._caught_up()

    def _refuse_activation(self, latest: PolicyActivation, exc: ActivationRefused) -> None:
        refused = (latest.seq, latest.revision_id, exc.reason, str(exc))
        if refused != self._activation_refused:
            log.error("policy activation seq %s (revision %s) refused: %s; still serving %s",
                      latest.seq, latest.revision_id, exc, self._engine.revision,
                      extra={"fields": {"event": "policy.activation_refused",
                                        "seq": latest.seq, "revision": latest.revision_id,
                                        "reason": exc.reason,
                                        "serving_revision": self._engine.revision}})
            for listener in self.activation_listeners:
                listener(exc.reason)
        self._activation_refused = refused
        error = f"activation seq {latest.seq} refused: {exc.reason}: {exc}"
        self._behind(error)
        self._error = error

    def _caught_up(self) -> None:
        self._error = None
        self._behind_since = None

    def _behind(self, error: str | None) -> None:
        if error is not None:
            self._error = error
        if self._behind_since is None:
            self._behind_since = time.monotonic()

    def _refuse(self, revision: str, error: str) -> None:
        self._refused[revision] = error
        log.error("policy revision %s refused: %s; still serving %s", revision, error,
                  self._engine.revision,
                  extra={"fields": {"event": "policy.revision_refused", "revision": revision,
                                    "serving_revision": self._engine.revision}})
        self._behind(error)
        self._error = error

    def status(self) -> dict[str, Any]:
        """The ``distribution`` member of ``authz/status``, and whether it degrades it."""
        active = self._active
        behind_s = (None if self._behind_since is None
                    else round(time.monotonic() - self._behind_since, 3))
        refused = ((active is not None and active.revision_id in self._refused)
                   or self._activation_refused is not None)
        late = behind_s is not None and behind_s > self._config.convergence_s
        bad = self._activation_refused
        return {
            "source": "store",
            # None: no store revision (nothing activated yet, or rolled back to directory mode)
            "active_revision": active.revision_id or None if active else None,
            "directory_mode": active is None or active.revision_id == "",
            "active_seq": active.seq if active else None,
            "activated_at": iso(active.activated_at) if active else None,
            "activated_by": active.activated_by if active else None,
            "running_active": self.converged if active else None,
            "behind_s": behind_s,
            "convergence_s": self._config.convergence_s,
            "listening": self.listening,
            "last_sync_at": iso(self._synced_at) if self._synced_at else None,
            "error": self._error if (refused or late or self._error) else None,
            "refused_activation": None if bad is None else {
                "seq": bad[0], "revision": bad[1], "reason": bad[2]},
            "degraded": refused or late,
        }


#: With ``policies.source: store``: what keeps this process on the fleet's active revision.
POLICY_FOLLOWER: web.AppKey[StoreFollower | None] = web.AppKey("policy_follower")


@contextlib.asynccontextmanager
async def following(follower: StoreFollower, store: Callable[[], Store | None],
                    interval_s: float) -> AsyncIterator[None]:
    """While open: sync at once, then every ``interval_s``, at each PostgreSQL NOTIFY on
    ``CHANNEL`` (a LISTEN connection, re-opened when it drops) and at SIGHUP."""
    await follower.sync()
    listener: Any = None
    warned = False

    async def listen() -> Any:
        nonlocal warned
        target = store()
        open_listener = getattr(target, "listen", None)
        if open_listener is None:
            return None
        try:
            opened = await open_listener(CHANNEL, lambda _payload: follower.wake.set())
        except Exception as exc:  # polling carries on; the next round tries again
            if not warned:  # once per outage, not once per poll
                log.warning("policy store: cannot LISTEN for activations (%s); polling only",
                            type(exc).__name__)
            warned = True
            return None
        warned = False
        return opened

    async def loop() -> None:
        nonlocal listener
        while True:
            if listener is None or not listener.alive:
                if listener is not None:
                    await listener.close()  # never raises
                listener = await listen()
                follower.listening = listener is not None
                if listener is not None:
                    await follower.sync()  # a change between the last sync and LISTEN
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):
                    await follower.wake.wait()
            follower.wake.clear()
            await follower.sync()

    try:
        async with background(loop()):
            with sighup.on_sighup(follower.wake.set):
                yield
    finally:
        if listener is not None:
            await listener.close()


# ---- policies.candidate_revision -------------------------------------------------------------

#: Why a candidate revision is waited for (not refused): it may be published, or readable, later.
_NOT_PUBLISHED = "the revision is not in the store"
_UNREACHABLE = "the store is unreachable: the candidate revision cannot be read"


class CandidateRevision:
    """Keeps a ``Shadow`` on a published, inactive revision (``policies.candidate_revision``).

    The revision is read with ``fetch_revision``, so it is verified against the trusted keys
    exactly like an active revision, then vetted by a fresh candidate engine. One that fails
    either is rejected (``authz/status`` ``shadow``: ``rejected`` and the reason) and never
    retried: a revision's content and the keys do not change while the process runs. One that
    cannot be read yet (store unreachable, not published yet) stays ``loading`` and is retried.
    Nothing here touches the live engine: serving never depends on the candidate.

    ``reread``: the configured candidate revision now (the config file read again at SIGHUP);
    a different id switches the candidate, none turns shadow evaluation ``off``.
    """

    def __init__(self, shadow: Shadow, store: Callable[[], Store | None],
                 trusted: Mapping[str, Any], revision: str, *,
                 trust_error: str | None = None,
                 reread: Callable[[], str | None] | None = None) -> None:
        self._shadow = shadow
        self._store = store
        self._trusted = trusted
        self._trust_error = trust_error
        self.reread = reread
        self._refused: dict[str, str] = {}
        self._lock = asyncio.Lock()
        shadow.want(revision)

    @property
    def done(self) -> bool:
        """The candidate is loaded, refused or off: nothing left to retry."""
        return self._shadow.state != "loading"

    async def sync(self) -> None:
        """Load the wanted revision into the shadow if it is not loaded yet. Never raises."""
        async with self._lock:
            try:
                await self._sync()
            except Exception as exc:
                log_failure(log, "shadow candidate revision sync failed", exc,
                            event="policy.candidate_sync_failed", expected=(StoreError,))

    async def _sync(self) -> None:
        revision = self._shadow.wanted
        if revision is None or self.done:
            return
        refused = self._refused.get(revision)
        if refused is not None:
            self._shadow.reject(refused)
            return
        store = self._store()
        if store is None:
            self._shadow.waiting(_UNREACHABLE)
            return
        try:
            if self._trust_error is not None:
                raise RevisionRefused(f"signature: untrusted_key: {self._trust_error}")
            snapshot = await fetch_revision(store, revision, self._trusted)
        except StoreError:
            self._shadow.waiting(_UNREACHABLE)
            return
        except RevisionRefused as exc:
            if str(exc) == _NOT_PUBLISHED:
                self._shadow.waiting(_NOT_PUBLISHED)
                return
            self._refuse(revision, str(exc))
            return
        if self._shadow.wanted != revision:  # switched (SIGHUP) while it was read
            return
        if not await asyncio.to_thread(self._shadow.install, snapshot):
            self._refused[revision] = self._shadow.error or "rejected"

    def _refuse(self, revision: str, error: str) -> None:
        self._refused[revision] = error
        if self._shadow.wanted == revision:
            self._shadow.reject(error)

    async def reload(self) -> None:
        """SIGHUP: read the configured candidate revision again; follow a change. Never raises."""
        if self.reread is not None:
            try:
                wanted = await asyncio.to_thread(self.reread)
            except Exception as exc:  # a broken file keeps the current candidate
                log.error("shadow candidate: the configuration cannot be read again (%s); "
                          "keeping candidate %s", exc, self._shadow.wanted)
                return
            async with self._lock:  # never while a revision is being installed
                self._switch(wanted)
        await self.sync()

    def _switch(self, wanted: str | None) -> None:
        if wanted != self._shadow.wanted:
            log.info("shadow candidate revision: %s -> %s", self._shadow.wanted, wanted,
                     extra={"fields": {"event": "policy.shadow_candidate_changed",
                                       "revision": wanted}})
            self._shadow.want(wanted)


@contextlib.asynccontextmanager
async def shadowing(candidate: CandidateRevision, interval_s: float) -> AsyncIterator[None]:
    """While open: load the candidate revision at once, in the background (serving never waits
    for a candidate: its inputs are skipped until it loads), retry every ``interval_s`` while it
    cannot be read, and re-read the configuration at SIGHUP."""
    async def poll() -> None:
        if not candidate.done:
            await candidate.sync()

    async with background(candidate.sync()), sighup.watching(poll, candidate.reload, interval_s):
        yield
