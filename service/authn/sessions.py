"""The authenticator: logins, bearer-token authentication, step-up and revocation over the store.

Every failed login is one ``InvalidCredentials`` whatever the cause (unknown subject, wrong
password, disabled identity, bad or replayed assertion). A request costs one signature check (or a
cache hit) and one indexed session read; the session is never cached, so revocation is seen at
once by every worker and replica that shares the store.

Throttling (per-source lockout plus a progressive per-subject delay, as mainstream IdPs do).
Before a password, assertion or OTP code is verified, the attempt reserves one failure on each of
its keys in the store, all or none, each with one conditional upsert: parallel attempts on any
worker or replica are counted one by one, so at most the budget is ever evaluated. A success
gives the reservation back; a failure keeps it. The keys of a password login:

* ``(subject, client address)``: ``max_failures`` per window, then a lockout of that source for
  that subject until the window (opened by its first failure) ends;
* client address: ``max_failures_per_addr`` per window across subjects (spraying), a lockout;
  a success releases only its own reservation, so it cannot launder others' failures;
* subject, from every address: never a lockout, only a slowdown. From ``subject_delay_after``
  failures in a window on, each failure makes the subject's next attempt wait
  ``subject_delay_base_s``, doubling per failure up to ``subject_delay_max_s`` (429 with
  Retry-After meanwhile). So an address with no failures for the subject waits at most
  ``subject_delay_max_s``, and a correct password resets the subject's count.

Assertions are throttled per client address only (a forged assertion cannot guess a key, and
counting per claimed subject would let anyone lock a service out); OTP codes per subject
(``max_failures``: only a holder of the subject's session can guess them). Every failed login,
OTP failure, replay and throttle decision is one structured ``controlplane.authn`` log event
with the subject, the client address and the reason, never the secret. An attempt cancelled
between reserving and verifying keeps its reservation (fail closed).
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from aiohttp import web

from ..config import AuthnConfig
from ..store.base import Conflict, NotFound, SessionRecord, Store, ThrottleRule
from . import assertions, passwords, renewal, totp
from .errors import (
    InvalidCredentials,
    InvalidToken,
    OtpInvalid,
    SessionInactive,
    SessionRevoked,
    StepUpUnavailable,
    SubjectDisabled,
    Throttled,
    UnknownKey,
)
from .identities import Identity, IdentityDirectory
from .identities import load as load_identities
from .keyring import ALG, KeyRing
from .principal import KINDS, Principal
from .published import PublishedKeyRing
from .stepup import (
    ACR_STEP_UP,
    AMR_STEP_UP,
    FEDERATED_METHODS,
    METHOD_ASSERTION,
    METHOD_OIDC,
)
from .tokens import AccessTokens

__all__ = ["AUTHENTICATOR", "UNREAD", "Authenticator", "Bearer", "IssuedToken", "create_authenticator"]

METHOD_PASSWORD = "password"  # noqa: S105 - a method name, not a secret
STEP_UP_METHOD = "totp"
#: Expired sessions are kept this long (a day) for whoever investigates an incident, then purged.
#: No token outlives its session, and a missing session is refused like an expired one.
SESSION_RETENTION_S = 86400.0
_MAX_SUBJECT = 256

log = logging.getLogger("controlplane.authn")


class Bearer(NamedTuple):
    """A bearer access token whose signature and claims verified, its session not checked yet
    (``Authenticator.verify_bearer``; ``session_principal`` checks it)."""

    subject: str
    kind: str
    session_id: str
    #: Issued after the session's step-up (``acr``).
    stepped: bool


def _principal(subject: str, kind: str, session: SessionRecord, stepped: bool,
               groups: tuple[str, ...]) -> Principal:
    """The principal of ``session``, checked live and its subject's (``session_principal``)."""
    return Principal(
        subject_id=subject,
        kind=kind,  # type: ignore[arg-type]  # one of KINDS (``_own``)
        session_id=session.id,
        auth_time=session.auth_time,
        authn_method=session.authn_method,
        step_up_at=session.step_up_at if stepped else None,
        idp_groups=groups,
    )


#: ``session_principal``'s ``found`` when the caller read no session row: it reads it.
UNREAD: Any = object()


def _bearer_of(claims: Mapping[str, Any]) -> Bearer:
    # Step-up counts only on a token issued after it: an older token of the same session
    # (perhaps copied before the step-up) stays un-stepped.
    stepped = "acr" in claims and claims["acr"] == ACR_STEP_UP
    return Bearer(claims["sub"], claims["kind"], claims["sid"], stepped)


class _Derived(NamedTuple):
    """A bearer token's last check (``Authenticator.authenticate_bearer_now``), kept with its
    verified claims: the session record and identities entry it passed with, and the principal
    it gave."""

    session: SessionRecord
    identity: Identity | None
    principal: Principal


class IssuedToken(NamedTuple):
    access_token: str
    expires_in: int
    session_id: str
    #: A person's renewal credential (``renewal.py``); None for services and agents.
    refresh_token: str | None = None


class Authenticator:
    """Framework-free AuthN over a ``Store``; the HTTP layer maps its ``AuthnError``s to 401/429."""

    def __init__(
        self,
        store: Store | Callable[[], Store],
        identities: IdentityDirectory,
        keys: KeyRing,
        settings: AuthnConfig,
    ) -> None:
        # A callable resolves the store per call (the service's link, which raises
        # StoreUnavailable while the store is not connected); tests pass a store.
        self._store = store if callable(store) else (lambda: store)
        self.identities = identities
        #: Why the last reload of the identities file failed (the last good set still serves).
        self.identities_error: str | None = None
        # Subjects whose sessions are still to be revoked (disabled or removed at a reload).
        self._revoke_pending: set[str] = set()
        self.keys = keys
        self.settings = settings
        #: Told the reason of each failed login, step-up or throttled attempt (the app wires
        #: its metrics); reasons are codes, never a subject, address or secret.
        self.failed: Callable[[str], None] = _nothing
        self.tokens = AccessTokens(
            keys,
            issuer=settings.issuer,
            audience=settings.audience,
            ttl_s=settings.token_ttl_s,
            clock_skew_s=settings.clock_skew_s,
            cache_size=settings.token_cache_size,
        )

    @property
    def store(self) -> Store:
        return self._store()

    # -- logins --------------------------------------------------------------------------------

    async def login_password(
        self, subject_id: str, password: str, client_addr: str | None, now: float
    ) -> IssuedToken:
        """Password login of a human; raises ``InvalidCredentials`` or ``Throttled``."""
        subject = subject_id[:_MAX_SUBJECT] if isinstance(subject_id, str) else ""
        settings = self.settings
        window = float(settings.failure_window_s)
        source = ThrottleRule(
            f"login:source:{subject}|{client_addr or '-'}", window, settings.max_failures
        )
        subject_rule = ThrottleRule(
            f"login:subject:{subject}",
            window,
            delay_after=settings.subject_delay_after,
            delay_base_s=settings.subject_delay_base_s,
            delay_max_s=settings.subject_delay_max_s,
        )
        rules = [source, subject_rule]
        if client_addr:
            rules.append(
                ThrottleRule(f"login:addr:{client_addr}", window, settings.max_failures_per_addr)
            )
        context = {"kind": "login", "method": METHOD_PASSWORD, "subject": subject}
        await self._reserve(rules, now, client_addr, context)
        identity = self.identities.get(subject)
        reason = "bad_password"
        if identity is None:
            reason = "unknown_subject"
        elif identity.disabled:
            identity, reason = None, "subject_disabled"
        elif identity.kind != "human":
            identity, reason = None, "not_a_human"
        encoded = identity.password_hash if identity is not None else None
        # Unknown or disabled subjects verify a dummy hash of equal cost: same time, same answer.
        # scrypt blocks for tens of milliseconds, so it runs off the event loop.
        ok = await asyncio.to_thread(
            passwords.verify_password,
            password if isinstance(password, str) else "",
            encoded or self.identities.dummy_password_hash,
        )
        if identity is None or encoded is None or not ok:
            self.failed(reason)
            _log_failure("authn.login_failed", "login failed", reason, client_addr, context)
            raise InvalidCredentials(reason)
        # The source and the subject start afresh; the address only gets its reservation back
        # (a valid login must not launder an address's failures on other subjects).
        await self.store.clear_failures(source.key)
        await self.store.clear_failures(subject_rule.key)
        if client_addr:
            await self.store.release_failure(rules[2].key, now)
        return await self._open_session(identity.subject_id, "human", METHOD_PASSWORD, now)

    async def login_assertion(
        self, assertion: str, client_addr: str | None, now: float
    ) -> IssuedToken:
        """Assertion login of a service or agent; raises ``InvalidCredentials`` or ``Throttled``.

        Throttled per client address only: a forged assertion cannot guess a key, and counting
        per claimed subject would let anyone lock a service out.
        """
        rules = []
        if client_addr:
            rules.append(
                ThrottleRule(
                    f"login:addr:{client_addr}",
                    float(self.settings.failure_window_s),
                    self.settings.max_failures_per_addr,
                )
            )
        context: dict[str, Any] = {"kind": "login", "method": METHOD_ASSERTION, "subject": None}
        await self._reserve(rules, now, client_addr, context)
        try:
            verified = assertions.verify(
                assertion,
                audience=self.settings.issuer,
                public_key_for=self.identities.public_key_for,
                now=now,
                clock_skew_s=self.settings.clock_skew_s,
            )
        except InvalidToken as exc:
            self.failed(exc.code)
            _log_failure("authn.login_failed", "login failed", exc.code, client_addr, context)
            raise InvalidCredentials(exc.code) from exc
        context["subject"] = verified.subject_id
        # The jti is remembered until the assertion could no longer pass the exp check.
        fresh = await self.store.claim_once(
            "assertion_jti",
            f"{verified.subject_id}:{verified.jti}",
            verified.expires_at + self.settings.clock_skew_s,
            now,
        )
        identity = self.identities.active(verified.subject_id)
        if not fresh or identity is None:
            reason = "token_replayed" if not fresh else "unknown_subject"
            self.failed(reason)
            _log_failure("authn.login_failed", "login failed", reason, client_addr, context)
            raise InvalidCredentials(reason)
        for rule in rules:
            await self.store.release_failure(rule.key, now)
        return await self._open_session(identity.subject_id, identity.kind, METHOD_ASSERTION, now)

    # -- per request ---------------------------------------------------------------------------

    async def authenticate_bearer(self, token: str, now: float) -> Principal:
        """The principal of a bearer access token; raises an ``InvalidToken`` subclass."""
        try:  # (no coroutine on the common path: the key is known)
            bearer = self._bearer(token, now)
        except UnknownKey:
            bearer = await self._bearer_published(token, now)
        return await self.session_principal(bearer.subject, bearer.kind, bearer.session_id,
                                            stepped=bearer.stepped, now=now)

    def authenticate_bearer_now(self, token: str, now: float
                                ) -> Principal | Awaitable[Principal] | None:
        """``authenticate_bearer`` as far as it goes without waiting: the principal where
        nothing needs a wait (the token's key is known, the store reads the session row at once:
        ``Store.session_now``); for a session opened through a federation, whose groups are read
        apart, what is left to await (``session_principal`` of the row read and checked here);
        None where the row cannot be read at once (await ``authenticate_bearer``). Raises what
        it raises."""
        try:
            verified = self.tokens.verified(token, now)
        except UnknownKey:
            return None
        last: _Derived | None = verified.derived
        found = None
        if last is not None:
            # The token's last check holds while its session row is the very record it was
            # (the store's copy is replaced after any commit: ``Store.session_now``), the
            # session has not expired and the subject's entry in the identities file is the
            # one it was (a reload replaces it): the same checks would give the same principal.
            found = self.store.session_now(last.session.id)
            if found is None:
                return None
            if (found[0] is last.session and now < last.session.expires_at
                    and self.identities.get(last.principal.subject_id) is last.identity):
                return last.principal
        bearer = _bearer_of(verified.claims)
        identity = self._identity(bearer.subject, bearer.kind)
        if found is None:  # (the token's session: the row read above when there was one)
            found = self.store.session_now(bearer.session_id)
            if found is None:
                return None
        session = self._active(bearer.session_id, now, found[0])
        self._own(identity, bearer.subject, bearer.kind, session)
        if session.authn_method == METHOD_OIDC:
            return self.session_principal(bearer.subject, bearer.kind, bearer.session_id,
                                          stepped=bearer.stepped, now=now, found=session)
        principal = _principal(bearer.subject, bearer.kind, session, bearer.stepped, ())
        verified.derived = _Derived(session, identity, principal)
        return principal

    async def verify_bearer(self, token: str, now: float) -> Bearer:
        """A bearer access token's signature and claims, checked; not its session (that is
        ``session_principal``). Raises an ``InvalidToken`` subclass."""
        try:
            return self._bearer(token, now)
        except UnknownKey:
            return await self._bearer_published(token, now)

    async def _bearer_published(self, token: str, now: float) -> Bearer:
        """``_bearer`` of a token whose key this worker did not know: perhaps a key another
        replica published since this worker last read them."""
        if not isinstance(self.keys, PublishedKeyRing) or not await self.keys.look_up(now):
            raise UnknownKey()
        return self._bearer(token, now)

    def _bearer(self, token: str, now: float) -> Bearer:
        return _bearer_of(self.tokens.verify(token, now))

    async def session_principal(
        self, subject: str, kind: str, session_id: str, *, stepped: bool, now: float,
        found: SessionRecord | None = UNREAD,
    ) -> Principal:
        """The principal of a verified credential naming ``session_id`` (a bearer token, or the
        console's session cookie): the identity must be active with that kind and the session
        live and its own. ``stepped``: the credential was issued after the session's step-up.
        ``found``: the session row as the caller read it just now (``Store.get_run_read``), or
        None when it read none; read here when not given. Raises an ``InvalidToken`` subclass."""
        identity = self._identity(subject, kind)
        session = await self._active_session(session_id, now, found)
        self._own(identity, subject, kind, session)
        groups: tuple[str, ...] = ()
        if session.authn_method == METHOD_OIDC:
            # (also for a person an explicit link signed in as a local subject)
            facts = await self.store.get_federated_session(session.id)
            if facts is not None:
                # A group belongs to the provider that asserted it: ``corp:sre``.
                groups = tuple(f"{facts.provider}:{g}" for g in facts.groups)
        return _principal(subject, kind, session, stepped, groups)

    def _identity(self, subject: str, kind: str) -> Identity | None:
        """The identities file's entry of ``subject``; raises ``SubjectDisabled`` for one
        disabled or of another kind."""
        identity = self.identities.get(subject)
        if identity is not None and (identity.disabled or identity.kind != kind):
            raise SubjectDisabled()
        return identity

    @staticmethod
    def _own(identity: Identity | None, subject: str, kind: str, session: SessionRecord) -> None:
        """Raises unless the live ``session`` belongs to ``subject`` (of ``kind``, with
        ``identity``, its entry in the identities file) who presented a credential naming it."""
        if session.subject_id != subject or session.kind != kind:
            raise SessionInactive()
        if kind not in KINDS:  # tokens and sessions only carry these; anything else fails closed
            raise SessionInactive()
        # Federated subjects need no entry in the identities file (just-in-time); anyone
        # else without one is refused.
        if identity is None and session.authn_method not in FEDERATED_METHODS:
            raise SubjectDisabled()

    async def step_up(
        self, principal: Principal, otp: str, now: float, client_addr: str | None = None
    ) -> IssuedToken:
        """Verify a TOTP code once, record the step-up on the session, return a stepped-up token."""
        identity = (
            self.identities.active(principal.subject_id) if principal.is_authenticated else None
        )
        if principal.kind != "human" or identity is None or identity.totp_secret is None:
            raise StepUpUnavailable()
        counter = f"otp:subject:{principal.subject_id}"
        context = {"kind": "otp", "subject": principal.subject_id}
        # Six digits are guessable without a limit: the same failure budget as passwords.
        rule = ThrottleRule(
            counter, float(self.settings.failure_window_s), self.settings.max_failures
        )
        await self._reserve([rule], now, client_addr, context)
        step = totp.verify(identity.totp_secret, otp, now)
        fresh = False
        if step is not None:
            # RFC 6238 §5.2: a code is accepted once; the claim outlives its acceptance window.
            valid_until = (step + totp.TOLERANCE_STEPS + 1) * totp.STEP_S
            fresh = await self.store.claim_once(
                "totp",
                f"{principal.subject_id}:{step}",
                valid_until + self.settings.clock_skew_s,
                now,
            )
        if step is None or not fresh:
            reason = "otp_wrong" if step is None else "otp_replayed"
            self.failed(reason)
            _log_failure("authn.otp_failed", "step-up failed", reason, client_addr, context)
            raise OtpInvalid()
        try:
            session = await self.store.record_step_up(principal.session_id, now, STEP_UP_METHOD)
        except NotFound:
            raise SessionInactive() from None
        except Conflict as exc:
            raise (
                SessionRevoked() if exc.reason == "session_revoked" else SessionInactive()
            ) from None
        await self.store.clear_failures(counter)
        return self._issue(session, now, stepped_up=True)

    async def refresh(self, principal: Principal, now: float) -> IssuedToken:
        """A new access token for the principal's still-active session (keeps its step-up)."""
        session = await self._active_session(principal.session_id, now)
        return self._issue(session, now, stepped_up=principal.step_up_at is not None)

    async def renew(self, refresh_token: str, now: float) -> IssuedToken:
        """A new access token for the live session a renewal credential names (``renewal.py``):
        refused (an ``InvalidToken`` subclass) once that session is logged out, revoked or
        expired, or its identity disabled; stepped up only when the credential was issued so,
        and never a new step-up."""
        def check() -> renewal.Renewal:
            return renewal.verify(
                self.keys, refresh_token, issuer=self.settings.issuer,
                audience=self.settings.audience, max_lifetime_s=self.settings.session_ttl_s,
                skew_s=self.settings.clock_skew_s, now=now)

        try:
            found = check()
        except UnknownKey:
            if not isinstance(self.keys, PublishedKeyRing) or not await self.keys.look_up(now):
                raise
            found = check()
        # The session and its identity as a request with this session's token would find them.
        await self.session_principal(found.subject_id, found.kind, found.session_id,
                                     stepped=found.stepped, now=now)
        return await self.token_for_session(found.session_id, now, stepped_up=found.stepped)

    async def revoke(self, principal: Principal, now: float) -> bool:
        """End the principal's session: its tokens fail from now on. False if already ended."""
        if not principal.is_authenticated:
            return False
        return await self.store.revoke_session(principal.session_id, now)

    async def purge(self, now: float) -> tuple[int, int, int]:
        """Forget one-time claims past their expiry, login failures older than the throttling
        window and sessions expired more than ``SESSION_RETENTION_S`` ago; returns the counts."""
        return await self.store.purge_expired(
            now, now - self.settings.failure_window_s, now - SESSION_RETENTION_S
        )

    # -- identities reload ---------------------------------------------------------------------

    def replace_identities(self, directory: IdentityDirectory) -> list[str]:
        """Swap in a new identity directory at once; the subjects that were active and are not
        any more (disabled, removed, or changed kind) are queued for ``revoke_dropped``."""
        old, self.identities = self.identities, directory
        self.identities_error = None
        dropped = sorted(
            i.subject_id
            for i in old
            if not i.disabled
            and ((new := directory.active(i.subject_id)) is None or new.kind != i.kind)
        )
        self._revoke_pending.update(dropped)
        return dropped

    async def revoke_dropped(self, now: float) -> int:
        """Revoke every live session of the queued subjects; the count. Raises ``StoreError``
        with the rest still queued (their tokens are refused meanwhile all the same:
        ``authenticate_bearer`` checks the identity on every request)."""
        revoked = 0
        for subject in sorted(self._revoke_pending):
            revoked += await self.store.revoke_subject_sessions(subject, now)
            self._revoke_pending.discard(subject)
        return revoked

    @property
    def revocations_pending(self) -> bool:
        return bool(self._revoke_pending)

    # -- status --------------------------------------------------------------------------------

    def status(self, now: float) -> dict[str, Any]:
        """Configuration-level status: never tokens, sessions or secrets."""
        kids = self.keys.kids(now)
        status: dict[str, Any] = {
            "issuer": self.settings.issuer,
            "audience": self.settings.audience,
            "signing_keys": [
                {"kid": kid, "alg": ALG, "active": i == 0} for i, kid in enumerate(kids)
            ],
            "token_ttl_s": self.settings.token_ttl_s,
            "session_ttl_s": self.settings.session_ttl_s,
            "step_up_window_s": self.settings.step_up_window_s,
            "clock_skew_s": self.settings.clock_skew_s,
            "identities": self.identities.counts(),
        }
        if self.identities_error is not None:
            # The health reporter's "ready" is overridden: the last good set serves meanwhile.
            status["status"] = "degraded"
            status["detail"] = (
                f"identities reload failed, last good set serving: {self.identities_error}"
            )
        return status

    def jwks(self, now: float) -> dict[str, Any]:
        return self.keys.jwks(now)

    # -- internals -----------------------------------------------------------------------------

    async def _reserve(
        self,
        rules: list[ThrottleRule],
        now: float,
        client_addr: str | None,
        context: dict[str, Any],
    ) -> None:
        """Reserve one failure on every rule's key, or log the refusal and raise ``Throttled``."""
        verdict = await self.store.reserve_attempt(rules, now)
        if verdict.granted:
            return
        # No wait outlasts a window (workers' clocks may differ by a fraction of a second).
        wait = min(verdict.retry_at - now, self.settings.failure_window_s)
        retry_after = max(1, math.ceil(wait))
        reasons = sorted({_refusal(key) for key in verdict.refused})
        self.failed("throttled")
        log.warning(
            "authentication throttled",
            extra={
                "fields": {
                    **context,
                    "event": "authn.throttled",
                    "client_addr": client_addr,
                    "reason": reasons[0] if len(reasons) == 1 else ",".join(reasons),
                    "retry_after_s": retry_after,
                    "failures": max(verdict.failures.values(), default=0),
                }
            },
        )
        raise Throttled(retry_after_s=retry_after)

    async def _active_session(self, session_id: str, now: float,
                              found: SessionRecord | None = UNREAD) -> SessionRecord:
        return self._active(session_id, now, await self.store.get_session(session_id)
                            if found is UNREAD else found)

    @staticmethod
    def _active(session_id: str, now: float, session: SessionRecord | None) -> SessionRecord:
        """``session``, the row read for ``session_id``, when it is live at ``now``."""
        if session is None or session.id != session_id:
            raise SessionInactive()
        if session.revoked_at is not None:
            raise SessionRevoked()
        if session.expires_at <= now:
            raise SessionInactive()
        return session

    async def open_federated_session(
        self, subject_id: str, kind: str, method: str, now: float, not_after: float | None = None
    ) -> IssuedToken:
        """A session for a subject a federation verified (OIDC sign-in, token exchange); it
        (and every token of it) ends by ``not_after`` when given (what the foreign credential
        had left)."""
        return await self._open_session(subject_id, kind, method, now, not_after)

    async def token_for_session(self, session_id: str, now: float, *, stepped_up: bool) -> IssuedToken:
        """A new access token for a still-active session (a federation handoff redeems one)."""
        session = await self._active_session(session_id, now)
        return self._issue(session, now, stepped_up=stepped_up and session.step_up_at is not None)

    async def _open_session(
        self, subject_id: str, kind: str, method: str, now: float, not_after: float | None = None
    ) -> IssuedToken:
        # Keyholders can sign a new assertion at any time: their session lives as long as one token.
        ttl: float = self.settings.session_ttl_s if kind == "human" else self.settings.token_ttl_s
        if not_after is not None:
            ttl = min(ttl, max(0.0, not_after - now))
        session = SessionRecord(
            id=secrets.token_urlsafe(24),
            subject_id=subject_id,
            kind=kind,
            authn_method=method,
            auth_time=now,
            created_at=now,
            expires_at=now + ttl,
        )
        await self.store.create_session(session)
        return self._issue(session, now, stepped_up=False)

    def _issue(self, session: SessionRecord, now: float, *, stepped_up: bool) -> IssuedToken:
        token, expires_in = self.tokens.issue(
            subject_id=session.subject_id,
            kind=session.kind,
            session_id=session.id,
            auth_time=session.auth_time,
            now=now,
            not_after=session.expires_at,
            acr=ACR_STEP_UP if stepped_up else None,
            amr=list(AMR_STEP_UP) if stepped_up else None,
        )
        refresh = None
        if session.kind == "human":
            # A person's session outlives its tokens: the CLI renews them (``renewal.py``).
            refresh = renewal.issue(
                self.keys, issuer=self.settings.issuer, audience=self.settings.audience,
                subject_id=session.subject_id, kind=session.kind, session_id=session.id,
                session_expires_at=session.expires_at, now=now, stepped=stepped_up)
        return IssuedToken(token, expires_in, session.id, refresh)


#: Logins, bearer tokens, step-up (identities and signing keys loaded at startup).
AUTHENTICATOR: web.AppKey[Authenticator] = web.AppKey("authenticator")


def _refusal(key: str) -> str:
    """The throttle decision a refusing key stands for, as logged."""
    kind = key.split(":", 2)[:2]
    return {
        ("login", "source"): "source_locked",
        ("login", "addr"): "address_locked",
        ("login", "subject"): "subject_delayed",
        ("otp", "subject"): "otp_locked",
    }.get((kind[0], kind[-1]), "throttled")


def _nothing(reason: str) -> None:
    pass


def _log_failure(
    event: str, message: str, reason: str, client_addr: str | None, context: dict[str, Any]
) -> None:
    """One structured event per failed attempt: who, from where, why; never the secret."""
    log.warning(
        message,
        extra={
            "fields": {**context, "event": event, "client_addr": client_addr, "reason": reason}
        },
    )


def create_authenticator(
    store: Store,
    *,
    identities_path: Path,
    keys_dir: Path,
    settings: AuthnConfig,
    now: float,
) -> Authenticator:
    """Load the identities file and open (or create) the key ring; blocking, call at startup."""
    directory = load_identities(identities_path)
    keys = KeyRing.open(keys_dir, retain_s=settings.key_retain_s, now=now)
    return Authenticator(store, directory, keys, settings)
