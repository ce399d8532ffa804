"""The principal: the only identity shape the rest of the service sees (DESIGN §4 ``principal``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web

#: Kinds of authenticated principals; ``anonymous`` belongs to ``ANONYMOUS`` alone.
Kind = Literal["human", "service", "agent"]
KINDS: tuple[Kind, ...] = ("human", "service", "agent")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling, derived from a verified token and its live session. No roles, no grants."""

    subject_id: str
    kind: Kind | Literal["anonymous"]
    session_id: str
    auth_time: float
    authn_method: str
    step_up_at: float | None = None
    #: IdP groups recorded on the session at OIDC sign-in or step-up (never in a token); the
    #: engine binds them to roles through ``group_bindings`` in policy data.
    idp_groups: tuple[str, ...] = ()

    @property
    def is_authenticated(self) -> bool:
        return self.kind != "anonymous"

    def step_up_verified(self, now: float, step_up_window_s: float) -> bool:
        """True when the principal stepped up within the last ``step_up_window_s`` seconds."""
        if not self.is_authenticated or self.step_up_at is None:
            return False
        return now - self.step_up_at <= step_up_window_s

    def to_input(self, now: float, step_up_window_s: float) -> dict[str, Any]:
        """The ``principal`` member of the policy input document (DESIGN §4), exactly these keys."""
        at = self.step_up_at if self.is_authenticated else None
        # Clocks of two workers may differ slightly; an age is never negative.
        # Whole seconds, as the policy input schema says: policies reason about seconds, and a
        # stable value within a second lets the decision cache serve repeated calls.
        age = None if at is None else int(max(0.0, now - at))
        doc: dict[str, Any] = {
            "subject_id": self.subject_id,
            "kind": self.kind,
            "session_id": self.session_id,
            "auth_time": self.auth_time,
            "authn_method": self.authn_method,
            "step_up": {
                "verified": self.step_up_verified(now, step_up_window_s),
                "at": at,
                "age_s": age,
            },
        }
        if self.authn_method == "oidc":
            # Sessions opened through OpenID Connect carry the IdP groups recorded at sign-in.
            doc["idp_groups"] = list(self.idp_groups)
        return doc


#: Who is calling: a Principal, or ANONYMOUS. Set by the authn middleware on every request.
PRINCIPAL = web.RequestKey("principal", Principal)


#: The caller presented no credentials (or none that verified); AuthN never rejects by itself.
ANONYMOUS = Principal(
    subject_id="", kind="anonymous", session_id="", auth_time=0.0, authn_method="none"
)
