"""Identity federation: OpenID Connect sign-in for people, RFC 8693 token exchange for workloads.

    remote.py    discovery documents and JWKS: HTTPS, deadlines, size caps, ETag/Cache-Control
    verify.py    foreign JWTs verified with joserfc (algorithm allow-list per issuer), claims
    workload.py  token exchange: issuer conditions, subject templates, one use per token (jti)
    oidc.py      authorization code + PKCE sign-in, IdP step-up, the CLI loopback handoff
    subjects.py  plain-text claims, e-mail addresses, subject templates

The identity library only authenticates; roles stay in policy data (``bindings`` of the
namespaced subjects, ``group_bindings`` of ``<provider>:<group>``).
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from .oidc import OidcSignIn
from .remote import Fetcher
from .workload import WorkloadExchange

__all__ = ["FEDERATION", "Federation"]


@dataclass
class Federation:
    """What the app holds (``FEDERATION``): one fetcher shared by both halves."""

    fetcher: Fetcher
    oidc: OidcSignIn
    workload: WorkloadExchange

    def status(self) -> dict[str, list[str]]:
        """Configuration-level facts for the authn status surface: names only."""
        return {
            "oidc_providers": [p.name for p in self.oidc.config.providers],
            "workload_issuers": [i.name for i in self.oidc.config.workload_issuers],
        }

    async def close(self) -> None:
        await self.fetcher.close()


#: Identity federation: OIDC sign-in of people, RFC 8693 token exchange of workloads.
FEDERATION: web.AppKey[Federation] = web.AppKey("federation")
