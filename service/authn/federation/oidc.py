"""OpenID Connect sign-in of people: authorization code + PKCE, and step-up at the IdP.

``start`` makes a pending request: ``state``, ``nonce`` and the PKCE (S256) verifier are kept
server-side (``oidc_logins``, keyed by the state's hash, short-lived) and bound to the browser
by a random cookie whose hash the row holds. ``callback`` takes the row once (a second use of
the state or of the code finds nothing), checks the cookie, redeems the code at the token
endpoint with the verifier, and verifies the ID token strictly (``verify.verify_foreign``:
issuer, audience, algorithm allow-list, signature against the provider's JWKS, expiry) plus the
nonce and ``azp``. The allow-lists (domains, groups) decide who may sign in at all. The subject
is the provider's template filled from the claims, by default ``<provider>:{<subject_claim>}``
(``corp:alice@example.com``): a local subject_id has no colon, so a federated person never
becomes a local one or another provider's. A template without that prefix is refused when it
fills to a local identity, a subject named in the serving policy data, or anything with a colon;
only an explicit per-provider link (``links``: the verified ``sub``, or a verified ``email`` ->
a local subject) signs a person in as a local subject. An e-mail counts (for the subject, a link
or the domain) only with ``email_verified: true`` and as one plain addr-spec; every claim that
becomes part of the subject, and every group, must be plain text (``subjects.py``). Then **our**
session opens (``authn_method: oidc``) and the IdP groups are recorded on it server-side, never
in a token; the principal carries them as ``<provider>:<group>``.

Step-up asks the IdP for a fresh login (``prompt=login``, ``max_age=0``, ``acr_values``); it is
accepted when the same IdP subject comes back with an ``auth_time`` newer than the request and
within ``max_auth_age_s``, and ``acr``/``amr`` meet the provider's configured strength. It
records the same step-up on the session as a TOTP code does, and refreshes the groups.

A CLI (RFC 8252) passes a loopback ``cli_redirect`` and a PKCE ``cli_challenge`` when it starts:
the callback then redirects the browser to the CLI's port with a one-time handoff code, which
only the holder of the CLI's verifier can redeem for the token (``redeem_handoff``). A CLI on
a machine without a browser uses the device authorization grant (RFC 8628) instead, when the
provider offers it: ``start_device`` returns the provider's user code and URL and a handle the
CLI polls ``poll_device`` with; the service polls the provider with its own client credentials.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import import_key

from ...config import FederationConfig, OidcProvider
from ...store.base import Conflict, FederatedSession, HandoffRecord, NotFound, OidcLoginRecord
from ..errors import InvalidToken
from ..identities import IdentityDirectory
from ..sessions import Authenticator, IssuedToken
from ..stepup import METHOD_OIDC
from .remote import Fetcher, FetchError, RemoteKeys, is_loopback
from .subjects import fill, is_plain, parse_email
from .verify import verify_foreign

__all__ = ["BROWSER_COOKIE", "CallbackResult", "OidcSignIn", "ProviderUnavailable", "SignInRefused"]

#: The cookie that binds a pending sign-in to the browser that started it.
BROWSER_COOKIE = "cp_oidc_browser"
HANDOFF_TTL_S = 60.0
_MAX_GROUPS = 256

log = logging.getLogger("controlplane.authn")


class SignInRefused(Exception):
    """The sign-in is refused; ``code`` is stable and safe to show, ``reason`` is for logs."""

    def __init__(self, code: str, detail: str, reason: str | None = None) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.reason = reason or code


class ProviderUnavailable(Exception):
    """The provider's discovery, keys or token endpoint cannot be reached (retry later)."""


@dataclass(frozen=True)
class CallbackResult:
    issued: IssuedToken | None  # the token (browser flow), or None when handed off to a CLI
    redirect: str | None  # the CLI's loopback URL with the handoff code
    subject_id: str
    purpose: str
    #: The callback came back to the browser that started the request (its binding cookie).
    browser_bound: bool = False


def _sha256(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def pkce_challenge(verifier: str) -> str:
    """RFC 7636 S256."""
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def check_cli_redirect(url: str) -> None:
    """RFC 8252 §7.3: only a loopback IP literal over plain HTTP, any port."""
    parts = urlsplit(url)
    if (
        parts.scheme != "http"
        or parts.hostname not in ("127.0.0.1", "::1")
        or not is_loopback(parts.hostname)
        or parts.fragment
    ):
        raise SignInRefused("invalid_request", "cli_redirect must be http://127.0.0.1:<port>/...")


class OidcSignIn:
    def __init__(
        self,
        config: FederationConfig,
        fetcher: Fetcher,
        leeway_s: float,
        session_ttl_s: float,
        policy_names: Callable[[str], bool] | None = None,
    ) -> None:
        self.config = config
        #: Is this subject named in the serving policy data (bindings, groups)? Without an
        #: answer every name counts as bound (fail closed).
        self.policy_names: Callable[[str], bool] = policy_names or (lambda _name: True)
        self.fetcher = fetcher
        self.leeway_s = leeway_s
        self.session_ttl_s = session_ttl_s
        self._keys = {p.name: RemoteKeys(fetcher, p.issuer) for p in config.providers}
        #: private_key_jwt clients: provider -> (our signing key, its algorithm); read at start.
        self._client_keys = {
            p.name: client_key(p.private_key_file)
            for p in config.providers
            if p.client_auth == "private_key_jwt" and p.private_key_file is not None
        }

    @property
    def enabled(self) -> bool:
        return bool(self.config.providers)

    def listing(self) -> list[dict[str, str]]:
        """The providers a sign-in page offers (name, label, login URL); no secret, no issuer
        internals. A console renders one "Sign in with <display_name>" button per entry."""
        return [
            {
                "name": p.name,
                "display_name": p.display_name,
                "login_url": f"/api/v1/authn/oidc/{p.name}/login",
            }
            for p in self.config.providers
        ]

    def provider(self, name: str) -> OidcProvider:
        provider = self.config.provider(name)
        if provider is None:
            raise SignInRefused("provider_unknown", "no such sign-in provider")
        return provider

    def redirect_uri(self, provider: OidcProvider) -> str:
        return f"{self.config.redirect_base_url}/api/v1/authn/oidc/{provider.name}/callback"

    async def _discovery(self, provider: OidcProvider) -> Mapping[str, Any]:
        try:
            return await self._keys[provider.name].discovery()
        except FetchError as exc:
            log.warning("oidc provider unavailable", extra={"fields": {
                "event": "authn.provider_unavailable", "provider": provider.name,
                "reason": str(exc)}})
            raise ProviderUnavailable(provider.name) from None

    async def start(
        self,
        store: Any,
        name: str,
        now: float,
        *,
        purpose: str = "login",
        session_id: str | None = None,
        cli_redirect: str | None = None,
        cli_challenge: str | None = None,
    ) -> tuple[str, str]:
        """``(authorization URL, browser secret for the binding cookie)``."""
        provider = self.provider(name)
        if cli_redirect is not None:
            check_cli_redirect(cli_redirect)
            if not cli_challenge or len(cli_challenge) != 43:
                raise SignInRefused("invalid_request", "a cli_redirect needs an S256 cli_challenge")
        discovery = await self._discovery(provider)
        endpoint = discovery.get("authorization_endpoint")
        if not isinstance(endpoint, str):
            raise ProviderUnavailable(provider.name)
        state, nonce = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        verifier, browser = secrets.token_urlsafe(48), secrets.token_urlsafe(32)
        redirect_uri = self.redirect_uri(provider)
        await store.put_oidc_login(OidcLoginRecord(
            state_hash=_sha256(state), provider=provider.name, purpose=purpose, nonce=nonce,
            code_verifier=verifier, browser_hash=_sha256(browser), session_id=session_id,
            redirect_uri=redirect_uri, cli_redirect=cli_redirect, cli_challenge=cli_challenge,
            created_at=now, expires_at=now + self.config.login_ttl_s,
        ))  # fmt: skip
        params = {
            "response_type": "code",
            "client_id": provider.client_id,
            "redirect_uri": redirect_uri,
            "scope": " ".join(provider.scopes),
            "state": state,
            "nonce": nonce,
            "code_challenge": pkce_challenge(verifier),
            "code_challenge_method": "S256",
        }
        if purpose == "step_up":
            params["prompt"] = "login"
            params["max_age"] = "0"
            if provider.step_up.acr_values:
                params["acr_values"] = provider.step_up.acr_values
        separator = "&" if "?" in endpoint else "?"
        return endpoint + separator + urlencode(params), browser

    async def callback(
        self,
        authenticator: Authenticator,
        name: str,
        query: Mapping[str, str],
        browser_secret: str | None,
        now: float,
    ) -> CallbackResult:
        provider = self.provider(name)
        state = query.get("state")
        if not state or len(state) > 200:
            raise SignInRefused("state_invalid", "the sign-in state is missing")
        store = authenticator.store
        record = await store.take_oidc_login(_sha256(state), now)
        if record is None or record.provider != provider.name or record.purpose == "device":
            raise SignInRefused("state_invalid", "the sign-in state is unknown, used or expired")
        # A sign-in is bound to the browser that started it (no login CSRF); a step-up to the
        # session it was asked for (the IdP must return that session's person, checked below).
        bound = browser_secret is not None and record.browser_hash is not None and hmac.compare_digest(
            _sha256(browser_secret), record.browser_hash
        )
        if not bound and record.purpose != "step_up":
            raise SignInRefused("state_invalid", "the sign-in was started by another browser",
                                "browser_mismatch")
        if "error" in query:
            raise SignInRefused("idp_refused", "the identity provider refused the sign-in",
                                f"idp_error:{str(query.get('error'))[:64]}")
        code = query.get("code")
        if not code:
            raise SignInRefused("invalid_request", "the authorization code is missing")
        answer = await self._token_request(provider, {
            "grant_type": "authorization_code", "code": code, "redirect_uri": record.redirect_uri,
            "code_verifier": record.code_verifier})
        if answer[0] != 200:
            raise SignInRefused("code_rejected", "the identity provider did not accept the code",
                                f"token_endpoint:{answer[0]}:{answer[1][:64]}")
        claims = await self._id_token(provider, answer[2], record.nonce, now)
        claims = await self._with_userinfo(provider, claims, answer[2].get("access_token"))
        subject, issued = await self._finish(authenticator, provider, record, claims, now)
        if record.cli_redirect is None or record.cli_challenge is None:
            return CallbackResult(issued, None, subject, record.purpose, bound)
        handoff = secrets.token_urlsafe(32)
        await store.put_handoff(HandoffRecord(
            _sha256(handoff), record.cli_challenge, issued.session_id,
            record.purpose == "step_up", now + HANDOFF_TTL_S))  # fmt: skip
        separator = "&" if "?" in record.cli_redirect else "?"
        return CallbackResult(
            None, record.cli_redirect + separator + urlencode({"code": handoff}), subject,
            record.purpose,
        )

    async def redeem_handoff(
        self, authenticator: Authenticator, code: str, verifier: str, now: float
    ) -> IssuedToken:
        record = await authenticator.store.take_handoff(_sha256(code), now)
        if record is None or not hmac.compare_digest(pkce_challenge(verifier), record.challenge):
            raise SignInRefused("invalid_grant", "the handoff code is unknown, used or expired, "
                                "or the verifier does not match")
        return await authenticator.token_for_session(
            record.session_id, now, stepped_up=record.stepped_up
        )

    # -- internals -----------------------------------------------------------------------------

    async def start_device(self, store: Any, name: str, now: float) -> dict[str, Any]:
        """RFC 8628 for a CLI without a browser on its machine: the provider's user code and
        verification URL, and a handle the CLI polls ``poll_device`` with (kept hashed)."""
        provider = self.provider(name)
        discovery = await self._discovery(provider)
        endpoint = discovery.get("device_authorization_endpoint")
        if not isinstance(endpoint, str):
            raise SignInRefused("invalid_request",
                                "this provider does not offer the device authorization grant")
        form, auth = self._client_auth(provider)
        try:
            status, answer = await self.fetcher.post_form(
                endpoint, {**form, "client_id": provider.client_id,
                           "scope": " ".join(provider.scopes)}, auth=auth)
        except FetchError:
            raise ProviderUnavailable(provider.name) from None
        fields = ("device_code", "user_code", "verification_uri")
        if status != 200 or not isinstance(answer, dict) or not all(
            isinstance(answer.get(f), str) for f in fields
        ):
            raise ProviderUnavailable(provider.name)
        expires_in = min(float(answer.get("expires_in") or 600), float(self.config.login_ttl_s))
        handle = secrets.token_urlsafe(32)
        await store.put_oidc_login(OidcLoginRecord(
            state_hash=_sha256(handle), provider=provider.name, purpose="device", nonce="",
            code_verifier=answer["device_code"], browser_hash=None, session_id=None,
            redirect_uri="", cli_redirect=None, cli_challenge=None, created_at=now,
            expires_at=now + expires_in,
        ))  # fmt: skip
        out = {
            "device_request": handle,
            "user_code": answer["user_code"],
            "verification_uri": answer["verification_uri"],
            "expires_in": int(expires_in),
            "interval": max(1, int(answer.get("interval") or 5)),
        }
        if isinstance(answer.get("verification_uri_complete"), str):
            out["verification_uri_complete"] = answer["verification_uri_complete"]
        return out

    async def poll_device(
        self, authenticator: Authenticator, name: str, handle: str, now: float
    ) -> IssuedToken:
        """One poll of a device authorization: the session's token once the person approved;
        ``SignInRefused`` with ``authorization_pending``/``slow_down`` (poll again later),
        ``expired_token`` or ``access_denied`` otherwise."""
        provider = self.provider(name)
        store = authenticator.store
        record = await store.take_oidc_login(_sha256(handle), now)
        if record is None or record.provider != provider.name or record.purpose != "device":
            raise SignInRefused("expired_token", "the device authorization is unknown or expired")
        status, error, answer = await self._token_request(provider, {
            "grant_type": "urn:ietf:params:oauth:grant-type:device_code",
            "device_code": record.code_verifier})
        if status != 200:
            if error in ("authorization_pending", "slow_down"):
                await store.put_oidc_login(record)  # still pending: the same handle polls again
                raise SignInRefused(error, "the person has not approved the sign-in yet")
            code = "access_denied" if error == "access_denied" else "expired_token"
            raise SignInRefused(code, "the device authorization ended without a sign-in",
                                f"device:{status}:{error[:64]}")
        claims = await self._id_token(provider, answer, None, now)
        claims = await self._with_userinfo(provider, claims, answer.get("access_token"))
        _, issued = await self._finish(authenticator, provider, record, claims, now)
        return issued

    async def _with_userinfo(
        self, provider: OidcProvider, claims: dict[str, Any], access_token: Any
    ) -> dict[str, Any]:
        """The groups from the userinfo endpoint when the ID token lacks the groups claim
        (providers that conform to OIDC Core 5.4 keep scope claims out of the ID token). The
        answer must be about the same ``sub`` (5.3.4); only the groups claim is taken from it."""
        name = provider.groups_claim
        if not name or name in claims or not isinstance(access_token, str):
            return claims
        endpoint = (await self._discovery(provider)).get("userinfo_endpoint")
        if not isinstance(endpoint, str):
            return claims
        try:
            info = await self.fetcher.get_json_bearer(endpoint, access_token)
        except FetchError:
            raise ProviderUnavailable(provider.name) from None
        if not isinstance(info, dict) or info.get("sub") != claims.get("sub"):
            raise SignInRefused("token_claims_invalid",
                                "the userinfo answer is not about the signed-in person")
        if name not in info:
            return claims
        return {**claims, name: info[name]}

    async def _finish(
        self,
        authenticator: Authenticator,
        provider: OidcProvider,
        record: OidcLoginRecord,
        claims: dict[str, Any],
        now: float,
    ) -> tuple[str, IssuedToken]:
        """Admit the person and open (or step up) our session; the subject and token."""
        store = authenticator.store
        subject, groups = self._admit(provider, claims, authenticator.identities)
        if record.purpose == "step_up":
            issued = await self._step_up(authenticator, provider, record, claims, groups, now)
        else:
            issued = await authenticator.open_federated_session(subject, "human", METHOD_OIDC, now)
            await store.put_federated_session(FederatedSession(
                issued.session_id, provider.name, str(claims["sub"]), groups, now))
        await store.record_federated_subject(subject, "human", f"oidc:{provider.name}", now)
        return subject, issued

    async def _token_request(
        self, provider: OidcProvider, form: dict[str, str]
    ) -> tuple[int, str, dict[str, Any]]:
        """POST the provider's token endpoint with the client's authentication: status, error,
        answer."""
        discovery = await self._discovery(provider)
        endpoint = discovery.get("token_endpoint")
        if not isinstance(endpoint, str):
            raise ProviderUnavailable(provider.name)
        extra, auth = self._client_auth(provider)
        try:
            status, answer = await self.fetcher.post_form(endpoint, {**form, **extra}, auth=auth)
        except FetchError:
            raise ProviderUnavailable(provider.name) from None
        if not isinstance(answer, dict):
            return (status if status != 200 else 502), "not_an_object", {}
        error = answer.get("error")
        return status, str(error) if error is not None else "", answer

    async def _id_token(
        self, provider: OidcProvider, answer: dict[str, Any], nonce: str | None, now: float
    ) -> dict[str, Any]:
        token = answer.get("id_token")
        if not isinstance(token, str):
            raise SignInRefused("code_rejected", "the identity provider returned no ID token")
        try:
            claims = await verify_foreign(
                token, self._keys[provider.name], algorithms=provider.algorithms,
                issuer=provider.issuer, audience=provider.client_id, now=now,
                leeway_s=self.leeway_s,
            )  # fmt: skip
        except InvalidToken as exc:
            raise SignInRefused(exc.code, "the ID token is not acceptable: " + exc.message) from None
        except FetchError:
            raise ProviderUnavailable(provider.name) from None
        return check_id_token(claims, provider, nonce)

    def _client_auth(
        self, provider: OidcProvider
    ) -> tuple[dict[str, str], tuple[str, str] | None]:
        """Form fields and Basic credentials that authenticate us to the provider: the secret
        (client_secret_basic), or a fresh RFC 7523 assertion signed with our key
        (private_key_jwt; ``aud`` is the issuer identifier, never an endpoint URL)."""
        key = self._client_keys.get(provider.name)
        if key is None:
            assert provider.client_secret is not None  # the configuration requires it
            return {}, (provider.client_id, provider.client_secret.reveal())
        now = int(time.time())
        assertion = jwt.encode(
            {"alg": key[1], "kid": key[0].kid, "typ": "JWT"},
            {"iss": provider.client_id, "sub": provider.client_id, "aud": provider.issuer,
             "jti": secrets.token_urlsafe(24), "iat": now, "exp": now + 60},
            key[0], algorithms=[key[1]],
        )  # fmt: skip
        return {
            "client_id": provider.client_id,
            "client_assertion_type": "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
            "client_assertion": assertion,
        }, None

    def _admit(
        self, provider: OidcProvider, claims: Mapping[str, Any], identities: IdentityDirectory
    ) -> tuple[str, tuple[str, ...]]:
        """Who the person becomes (``subject_id``) and their IdP groups; ``SignInRefused``
        when the claims do not name them safely (see the module docstring)."""
        if not is_plain(claims.get("sub"), 1024):
            # The IdP's subject is kept on the session (step-up must return the same person).
            raise SignInRefused("subject_invalid", "the ID token has no usable subject claim")
        email: tuple[str, str] | None = None
        if provider.uses_email:
            # An e-mail decides the subject, a link or the domain: only a verified one does.
            if claims.get("email_verified") is not True:
                raise SignInRefused("subject_not_allowed", "the e-mail address is not verified",
                                    "email_unverified")
            email = parse_email(claims.get("email"))
            if email is None:
                raise SignInRefused("subject_invalid", "the e-mail address is not an address",
                                    "email_invalid")
        groups = _groups(claims.get(provider.groups_claim) if provider.groups_claim else None)
        if provider.allowed_domains and (email is None or email[1] not in provider.allowed_domains):
            raise SignInRefused("subject_not_allowed", "this account may not sign in here",
                                "domain_not_allowed")
        if provider.allowed_groups and not set(groups) & set(provider.allowed_groups):
            raise SignInRefused("subject_not_allowed", "this account may not sign in here",
                                "group_not_allowed")
        link_value = claims.get(provider.link_claim)
        local = provider.linked(link_value) if isinstance(link_value, str) else None
        if local is not None:
            identity = identities.get(local)
            if identity is not None and (identity.disabled or identity.kind != "human"):
                raise SignInRefused("subject_not_allowed", "this account may not sign in here",
                                    "link_target_disabled")
            return local, groups
        subject = fill(provider.subject, claims)
        if subject is None:
            raise SignInRefused("subject_invalid", "the ID token has no usable subject claim")
        if not provider.namespaced and (
            ":" in subject or identities.get(subject) is not None or self.policy_names(subject)
        ):
            # Outside the provider's namespace the name could be someone else's: a local
            # identity, a subject policy data binds, or another namespace. Only a link says so.
            raise SignInRefused("subject_collision", "this account's name belongs to another "
                                "subject; an administrator must link the account explicitly",
                                "subject_collision")
        return subject, groups

    async def _step_up(
        self,
        authenticator: Authenticator,
        provider: OidcProvider,
        record: OidcLoginRecord,
        claims: Mapping[str, Any],
        groups: tuple[str, ...],
        now: float,
    ) -> IssuedToken:
        store = authenticator.store
        session_id = record.session_id or ""
        facts = await store.get_federated_session(session_id)
        if facts is None or facts.provider != provider.name or facts.foreign_sub != claims["sub"]:
            raise SignInRefused("step_up_mismatch", "the step-up was done by another account")
        rule = provider.step_up
        auth_time = claims.get("auth_time")
        if (
            not isinstance(auth_time, (int, float))
            or auth_time + self.leeway_s < record.created_at
            or now - auth_time > rule.max_auth_age_s + self.leeway_s
        ):
            raise SignInRefused("step_up_insufficient", "the identity provider did not re-authenticate")
        amr = claims.get("amr")
        amr_values = set(amr) if isinstance(amr, list) else set()
        if (rule.required_acr and claims.get("acr") not in rule.required_acr) or not set(
            rule.required_amr
        ) <= amr_values:
            raise SignInRefused("step_up_insufficient",
                                "the re-authentication does not meet the required strength")
        try:
            await store.record_step_up(session_id, now, METHOD_OIDC)
        except (NotFound, Conflict):
            raise SignInRefused("session_inactive", "the session has ended") from None
        await store.put_federated_session(
            FederatedSession(session_id, provider.name, str(claims["sub"]), groups, now))
        return await authenticator.token_for_session(session_id, now, stepped_up=True)


def client_key(path: Path) -> tuple[Any, str]:
    """Our private_key_jwt signing key from a PEM file, and the algorithm its type implies."""
    try:
        pem = path.read_bytes()
        loaded = serialization.load_pem_private_key(pem, password=None)
        kty, alg = (("RSA", "RS256") if isinstance(loaded, rsa.RSAPrivateKey)
                    else ("EC", "ES256") if isinstance(loaded, ec.EllipticCurvePrivateKey)
                    else ("OKP", "EdDSA") if isinstance(loaded, ed25519.Ed25519PrivateKey)
                    else ("", ""))
        if not kty:
            raise ValueError("not an RSA, EC or Ed25519 key")
        key = import_key(pem, kty, parameters={"use": "sig"})  # type: ignore[call-overload]
    except (OSError, ValueError, TypeError, JoseError) as exc:
        raise ValueError(f"cannot read the client key {path}: {type(exc).__name__}") from None
    key.ensure_kid()
    return key, alg


def check_id_token(
    claims: dict[str, Any], provider: OidcProvider, nonce: str | None
) -> dict[str, Any]:
    """OIDC Core §3.1.3.7 beyond the generic checks: the nonce (``None``: the device grant,
    which has none, and then the token must carry none), and ``azp`` with several audiences."""
    got = claims.get("nonce")
    if nonce is None:
        if got is not None:
            raise SignInRefused("token_nonce_mismatch", "the ID token is not acceptable: a nonce "
                                "nobody asked for")
    elif not isinstance(got, str) or not hmac.compare_digest(got.encode(), nonce.encode()):
        raise SignInRefused("token_nonce_mismatch", "the ID token is not acceptable: wrong nonce")
    aud = claims.get("aud")
    azp = claims.get("azp")
    if (isinstance(aud, list) and len(aud) > 1 and azp is None) or (
        azp is not None and azp != provider.client_id
    ):
        raise SignInRefused("token_audience_mismatch",
                            "the ID token is not acceptable: authorized party mismatch")
    return claims


def _groups(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > _MAX_GROUPS:
        raise SignInRefused("token_claims_invalid", "the groups claim is not a list of names")
    if not all(is_plain(g, 256) for g in value):
        raise SignInRefused("token_claims_invalid", "the groups claim is not a list of names")
    return tuple(sorted(set(value)))
