"""RFC 8693 token exchange: a workload's own short-lived OIDC token for our access token.

CI systems and clusters mint tokens for their jobs (GitHub Actions, GitLab, Kubernetes service
accounts). An issuer is accepted only as configured (``authn.workload.issuers[]``): its keys,
its algorithms, the audience it must have minted the token for, a maximum age, and conditions
on claims (``repository``, ``ref``, ``environment``, ``sub``, ...) that every token must meet.
The subject it becomes is the issuer's template filled from the claims
(``ci:github:{repository}``). Each foreign token is accepted once: its ``jti`` (or, without
one, the hash of its signing input, never of its signature) is claimed in the store's one-time
claims, which every worker and replica shares, until the token could no longer pass the
freshness check.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...config import FederationConfig, WorkloadIssuer
from ..errors import ClaimsInvalid, InvalidToken, IssuerMismatch, TokenExpired, TokenReplayed
from ..sessions import Authenticator, IssuedToken
from ..stepup import METHOD_TOKEN_EXCHANGE
from .remote import Fetcher, FetchError, RemoteKeys
from .subjects import fill
from .verify import peek, verify_foreign

__all__ = [
    "GRANT_TYPE",
    "JWT_TOKEN_TYPE",
    "ExchangeRefused",
    "IssuerUnavailable",
    "WorkloadExchange",
]

GRANT_TYPE = "urn:ietf:params:oauth:grant-type:token-exchange"
JWT_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:jwt"  # noqa: S105
ID_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:id_token"  # noqa: S105
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"  # noqa: S105

log = logging.getLogger("controlplane.authn")


class ExchangeRefused(Exception):
    """The subject token is not acceptable: RFC 6749 ``invalid_grant``; ``reason`` is for logs."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class IssuerUnavailable(Exception):
    """The issuer's keys could not be fetched (retry later); never the token's fault."""


@dataclass(frozen=True)
class _Issuer:
    config: WorkloadIssuer
    keys: RemoteKeys


def subject_for(template: str, claims: Mapping[str, Any]) -> str:
    """Fill ``template`` from plain string claims; anything else refuses the token."""
    subject = fill(template, claims)
    if subject is None:
        raise ClaimsInvalid()
    return subject


def one_use_key(token: str, claims: Mapping[str, Any]) -> str:
    """What makes a verified token "the same token": its ``jti``, or without one the hash of
    its signing input (header and claims as signed). Never the signature: an ECDSA signature
    has a twin (``s`` -> ``n - s``) that verifies as well, so a key over the whole compact
    string would let the twin pass as a new token."""
    jti = claims.get("jti")
    if isinstance(jti, str):
        return jti
    signing_input = token.rpartition(".")[0]
    return "sha256:" + hashlib.sha256(signing_input.encode("ascii")).hexdigest()


def unmet_conditions(issuer: WorkloadIssuer, claims: Mapping[str, Any]) -> list[str]:
    """The names of the conditions ``claims`` do not meet (exact string match, any of a list)."""
    return [
        claim
        for claim, accepted in issuer.conditions
        if not isinstance(claims.get(claim), str) or claims[claim] not in accepted
    ]


class WorkloadExchange:
    """Verifies workload tokens of the configured issuers and opens service/agent sessions."""

    def __init__(self, config: FederationConfig, fetcher: Fetcher, leeway_s: float) -> None:
        self.fetcher = fetcher
        self.leeway_s = leeway_s
        self._issuers = {
            i.issuer: _Issuer(i, RemoteKeys(fetcher, i.issuer, i.jwks_uri))
            for i in config.workload_issuers
        }

    @property
    def enabled(self) -> bool:
        return bool(self._issuers)

    async def verify(self, token: str, now: float) -> tuple[WorkloadIssuer, dict[str, Any], str]:
        """The issuer, verified claims and mapped subject; raises ``ExchangeRefused``."""
        try:
            _, unverified = peek(token)
        except InvalidToken as exc:
            raise ExchangeRefused(exc.code) from None
        entry = self._issuers.get(unverified.get("iss"))  # type: ignore[arg-type]
        if entry is None:
            raise ExchangeRefused(IssuerMismatch.code)
        issuer = entry.config
        try:
            claims = await verify_foreign(
                token, entry.keys, algorithms=issuer.algorithms, issuer=issuer.issuer,
                audience=issuer.audience, now=now, leeway_s=self.leeway_s,
                max_age_s=issuer.max_token_age_s,
            )  # fmt: skip
            unmet = unmet_conditions(issuer, claims)
            if unmet:
                raise ExchangeRefused("conditions_unmet:" + ",".join(unmet))
            subject = subject_for(issuer.subject, claims)
        except InvalidToken as exc:
            raise ExchangeRefused(exc.code) from None
        except FetchError as exc:
            log.warning(
                "workload issuer keys unavailable",
                extra={"fields": {"event": "authn.issuer_unavailable", "issuer": issuer.name,
                                  "reason": str(exc)}},
            )
            raise IssuerUnavailable(issuer.name) from None
        return issuer, claims, subject

    async def exchange(
        self, authenticator: Authenticator, token: str, now: float
    ) -> tuple[IssuedToken, str, str]:
        """Our access token for a fresh, unused workload token: ``(issued, subject, kind)``."""
        issuer, claims, subject = await self.verify(token, now)
        # Never longer than the subject token had to live (nor than the configured ttl): a
        # token inside the clock-skew leeway past its expiry has nothing left to give.
        if float(claims["exp"]) <= now:
            raise ExchangeRefused(TokenExpired.code)
        if authenticator.identities.get(subject) is not None:
            # A template that fills to a local identity's name must not become that identity.
            raise ExchangeRefused("subject_collision")
        once_key = one_use_key(token, claims)
        # Remembered until the token could no longer pass: its expiry, and its maximum age.
        until = min(float(claims["exp"]), float(claims["iat"]) + issuer.max_token_age_s)
        fresh = await authenticator.store.claim_once(
            "workload_jti", f"{issuer.issuer}|{once_key}", until + self.leeway_s, now
        )
        if not fresh:
            raise ExchangeRefused(TokenReplayed.code)
        issued = await authenticator.open_federated_session(
            subject, issuer.kind, METHOD_TOKEN_EXCHANGE, now, not_after=float(claims["exp"])
        )
        await authenticator.store.record_federated_subject(
            subject, issuer.kind, f"workload:{issuer.name}", now
        )
        return issued, subject, issuer.kind
